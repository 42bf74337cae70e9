// A simulated inference engine: paged KV cache with prefix reuse and LRU
// eviction, continuous batching, and step times from a prefill polynomial and
// a decode model. Pure: no I/O, no clock — time is "engine milliseconds"
// passed in by the caller, so kvroute-mocker drives it in real time and a
// discrete-event simulator in virtual time. Deterministic. Not thread-safe
// (one owner thread).
//
// Step model (one engine iteration):
//   admit waiting requests FIFO while a sequence slot is free, their new
//   (uncached) prompt tokens fit in max_batched_tokens (the first always
//   fits: no chunked prefill), and their KV blocks can be allocated (evicting
//   unreferenced cached blocks LRU);
//   step_ms = prefill_ms(t) [if t > 0] + decode_ms [if any request decodes]
//     prefill_ms(t) = prefill_a·t² + prefill_b·t + prefill_c, t = new tokens in the step
//     decode_ms     = decode_base_ms + decode_kv_ms · (KV blocks in use / capacity)
//   at the end of the step, admitted requests produce their first token (and
//   their new prompt blocks are "stored"), decoding requests one more token.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/types.h"
#include "indexer/kv_event.h"

namespace kvroute::mocker {

struct EngineConfig {
  uint32_t block_size = 16;
  uint64_t kv_blocks = 16384;         // KV capacity in blocks
  uint32_t max_seqs = 256;            // running sequences (request slots)
  uint32_t max_batched_tokens = 8192; // new prefill tokens per step
  // Dynamo mocker's prefill polynomial (ms, t = new tokens in the step).
  double prefill_a = 4.209989e-7;
  double prefill_b = 1.518344e-2;
  double prefill_c = 16.50142;
  double decode_base_ms = 8.0;        // decode step with an empty cache
  double decode_kv_ms = 12.0;         // extra decode time at a full cache
  CacheOwner owner;                   // whose events these are
  StorageTier tier = StorageTier::Device;
};

struct EngineOutput {
  enum class Kind { FirstToken, Token, Finished };
  uint64_t request = 0;
  Kind kind = Kind::Token;
  uint32_t cached_tokens = 0;  // FirstToken: prompt tokens served from the cache
  uint32_t prompt_tokens = 0;  // FirstToken
};

struct EngineLoad {
  uint32_t request_active_slots = 0;
  uint32_t request_total_slots = 0;
  uint32_t num_requests_waiting = 0;
  uint64_t kv_active_blocks = 0;  // blocks referenced by running requests
  uint64_t kv_total_blocks = 0;
};

class Engine {
 public:
  // `on_event` receives every stored/removed event, with event ids 1, 2, ...
  Engine(EngineConfig cfg, std::function<void(const KvEvent&)> on_event);

  // Queues a request (prompt token ids, tokens to generate >= 1). False if
  // it could never fit in the KV cache (the caller rejects it).
  bool add_request(uint64_t id, std::vector<TokenId> prompt, uint32_t max_tokens, double now_ms);
  // Blocks a request of this size needs (prompt blocks + room to generate).
  uint64_t blocks_needed(size_t prompt_tokens, uint32_t max_tokens) const;
  // Drops a request wherever it is; its blocks stay cached (unreferenced).
  bool cancel(uint64_t id);

  // When the step in progress ends (nullopt: idle).
  std::optional<double> next_event_time() const { return step_end_; }
  // Completes every step that ends at or before `now_ms`, starting new ones,
  // and returns their outputs in order.
  std::vector<EngineOutput> advance_to(double now_ms);

  EngineLoad load() const;
  size_t cached_blocks() const { return blocks_.size(); }
  uint64_t last_event_id() const { return event_id_; }
  // The cache contents as stored events (parents first), without event ids,
  // consistent with last_event_id().
  std::vector<KvEvent> dump() const;
  double prefill_ms(double tokens) const;
  double decode_ms() const;
  const EngineConfig& config() const { return cfg_; }

 private:
  struct Block {
    LocalBlockHash local;
    SequenceHash parent;
    bool has_parent = false;
    uint32_t depth = 0;
    uint32_t refs = 0;
    bool computed = false;                  // stored event sent
    std::list<SequenceHash>::iterator lru;  // valid when refs == 0
  };
  struct Request {
    uint64_t id;
    std::vector<TokenId> prompt;
    uint32_t max_tokens;
    uint32_t generated = 0;
    std::vector<SequenceHash> blocks;  // its hashed prompt blocks
    uint64_t extra_blocks = 0;         // partial prompt block + generated tokens
    uint32_t cached_tokens = 0;
    bool prefilled = false;
  };

  bool try_admit(Request& r);  // allocates blocks; false if they do not fit
  void release(Request& r);
  void start_step(double now_ms);
  void emit(KvEvent ev);

  EngineConfig cfg_;
  std::function<void(const KvEvent&)> on_event_;
  std::unordered_map<uint64_t, Block> blocks_;  // key: SequenceHash value
  std::list<SequenceHash> lru_;                 // unreferenced blocks, oldest first
  uint64_t anon_blocks_ = 0;                    // unhashed blocks in use
  std::deque<Request> waiting_;
  std::vector<Request> running_;
  std::vector<uint64_t> step_admitted_;         // requests prefilling in the current step
  std::vector<uint64_t> step_decoding_;         // requests decoding in the current step
  std::optional<double> step_end_;
  uint64_t event_id_ = 0;
};

}  // namespace kvroute::mocker
