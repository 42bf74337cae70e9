// A simulated inference engine: paged KV cache with prefix reuse and LRU
// eviction, continuous batching, and step times from a prefill polynomial and
// a decode model. Pure: no I/O, no clock — time is "engine milliseconds"
// passed in by the caller, so kvroute-mocker drives it in real time and a
// discrete-event simulator in virtual time. Deterministic: the same calls
// give the same outputs and events.
//
// Threading: not thread-safe; one owner thread (kvroute-mocker's io thread).
//
// Step model (one engine iteration, vLLM V1's scheduler; mocker/README.md has the full text):
//   A token budget per step (max_batched_tokens). Running requests first, in
//   admission order: a decoding one takes 1 token, one still prefilling takes
//   min(its remaining prompt tokens, the budget left). Then waiting requests
//   are admitted in queue order while a sequence slot is free (max_seqs), budget is left
//   and their KV blocks can be allocated (evicting unreferenced cached blocks,
//   least recently used first), each taking min(its uncached prompt tokens,
//   the budget left): a long prompt is prefilled in chunks over several steps.
//   The head of the queue that does not fit blocks the ones behind it. Queue
//   order: arrival (fcfs), or (priority, arrival) with the priority policy
//   (lower first; vLLM's --scheduling-policy priority).
//   A request joins no step that starts before the time it was added at (a
//   caller may add it past the end of a step it has not advanced through).
//     step_ms = cfg.profile.step_ms(the step's chunks and decodes)   (mocker/profile.h)
//   At the end of the step each chunk's completed prompt blocks are announced
//   (stored); a request whose last chunk ran produces its first token, each
//   decoding request one more token.
//
// KV blocks: a request's complete prompt blocks are hashed (indexer/block_hash.h:
// local = hash_block, id = sequence_hash(parent, local)) and shared between
// requests; the partial last block and room for max_tokens generated tokens
// are reserved as private blocks at admission (no preemption). A finished or
// cancelled request drops its references; unreferenced blocks stay cached and
// are evicted least recently used first, the tail of a prompt before its head
// (as vLLM frees blocks in reverse), so the cache is always prefix-closed.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/load.h"
#include "common/types.h"
#include "indexer/block_hash.h"
#include "indexer/kv_event.h"
#include "mocker/profile.h"

namespace kvroute::mocker {

// The waiting queue's order (vLLM's --scheduling-policy, vllm/v1/core/sched/
// request_queue.py): fcfs = arrival; priority = (priority, arrival), lower
// priority values first, as vLLM's PriorityRequestQueue orders its heap. The
// mocker reserves a request's blocks at admission, so there is no preemption
// and the policy only orders admission (vLLM's priority policy also preempts
// the lowest-priority running request when a running one cannot allocate KV).
enum class SchedulingPolicy : uint8_t { Fcfs, Priority };

struct EngineConfig {
  uint32_t block_size = 16;            // tokens per KV block, > 0
  uint64_t kv_blocks = 16384;          // KV capacity in blocks, > 0
  uint32_t max_seqs = 256;             // running sequences (request slots), > 0
  // Token budget per step (decodes + prefill chunks), > 0. 8192 is vLLM's
  // max_num_batched_tokens for its OpenAI server on a GPU of >= 70 GiB that is
  // not an A100, e.g. an H100 (vllm/engine/arg_utils.py,
  // EngineArgs.get_batch_defaults, commit 99d7eb5; V1 always chunks prefill).
  uint32_t max_batched_tokens = 8192;
  // Step times (mocker/profile.h). Its KV capacity is not applied here:
  // callers set kv_blocks (kvroute-mocker and kvroute-sim default it to
  // profile.kv_blocks(block_size)).
  EngineProfile profile = *find_profile(kDefaultProfile);
  CacheOwner owner;                    // stamped on every event
  StorageTier tier = StorageTier::Device;
  // Keep each cached block's token ids and namespace (block_info()): the
  // vLLM mode sends them in BlockStored. Off = hashes only (NATS, simulator).
  bool keep_tokens = false;
  SchedulingPolicy policy = SchedulingPolicy::Fcfs;
};

// What a request does in a prefill/decode disaggregated fleet (mocker/README.md "PD").
struct PdOptions {
  // Prefill side: when the request finishes, its complete prompt blocks stay
  // referenced (held for the decode worker's pull, never evicted) until
  // release_held(id); its private blocks are freed as usual.
  bool hold = false;
  // Decode side: this many leading complete prompt blocks arrive from the
  // prefill worker: at admission they become computed without prefill work
  // and are announced (stored) at once, as vLLM caches pulled blocks when
  // their transfer completes.
  uint32_t imported_blocks = 0;
  // Decode side, the whole prompt (the simulator's PD fleets,
  // add_request_hashed): the prompt's KV arrives entire, so every prompt
  // token but the last counts as computed at admission (stored events for the
  // blocks not cached here) and one step computes the last, yielding the
  // first token.
  bool kv_transferred = false;
};

struct EngineOutput {
  enum class Kind : uint8_t {
    FirstToken,  // prefill done, first token produced
    Token,       // one more token produced
    Finished,    // max_tokens produced; follows the request's last token in the same step
  };
  uint64_t request = 0;
  Kind kind = Kind::Token;
  double time_ms = 0;          // engine time the step ended
  uint32_t cached_tokens = 0;  // FirstToken: prompt tokens served from the cache
  uint32_t prompt_tokens = 0;  // FirstToken
  // FirstToken: engine ms from add_request to the start of the step that
  // first scheduled it (the step in progress when it arrived, and its wait in
  // the waiting queue).
  double queued_ms = 0;
};

class Engine {
 public:
  // `on_event` receives every stored/removed event, synchronously from inside
  // add_request/advance_to, with event ids 1, 2, 3, ...
  Engine(EngineConfig cfg, std::function<void(const KvEvent&)> on_event);
  // A what-if copy: the same cache, queues and step in progress, announcing
  // no events. What it is given and advances to leaves this engine as it was
  // (the simulator's oracle policy asks it when a request would get its first
  // token here).
  Engine fork() const;

  // Queues a request (prompt token ids, tokens to generate >= 1). Returns
  // false (and queues nothing) if the prompt is empty, max_tokens is 0, the
  // id is in use, or it could never fit in the KV cache.
  // `ns` (LoRA adapter, cache_salt) enters the block hashes as vLLM keys its
  // prefix cache (indexer/block_hash.h): two namespaces share no block.
  // `read_cache` false: the request computes its whole prompt (vLLM skips
  // reading the prefix cache for prompt_logprobs requests); its blocks are
  // still shared and stored.
  // `priority`: vLLM's request priority (lower first); orders the waiting
  // queue under SchedulingPolicy::Priority, ignored under Fcfs.
  bool add_request(uint64_t id, std::span<const TokenId> prompt, uint32_t max_tokens, double now_ms,
                   const HashNamespace& ns = {}, bool read_cache = true, PdOptions pd = {}, int64_t priority = 0);
  // The ids of a prompt's complete blocks, as add_request() hashes them.
  std::vector<SequenceHash> prompt_blocks(std::span<const TokenId> prompt, const HashNamespace& ns = {}) const;
  // How many leading blocks of `blocks` are computed in the cache now.
  uint32_t cached_prefix(std::span<const SequenceHash> blocks) const;
  // Prefill side (PdOptions::hold): the prompt blocks a finished request
  // holds (nullptr: none held under this id), and their release (they stay
  // cached, unreferenced). False if nothing is held under `id`.
  const std::vector<SequenceHash>* held(uint64_t id) const;
  bool release_held(uint64_t id);
  // Requests holding blocks, and the blocks they reference (a block shared by
  // two holds counts twice, as vLLM's per-request block lists do).
  uint64_t held_requests() const { return held_.size(); }
  uint64_t held_blocks() const { return held_block_refs_; }
  // The same with the prompt given as its complete blocks' local hashes (as a
  // trace replay has them) and its length in tokens (>= blocks·block_size).
  // `kv_transferred`: the prompt's KV arrives from a prefill engine (a
  // disaggregated decode leg): at admission every prompt block counts as
  // computed (stored events for the ones not cached here) and only the last
  // prompt token is computed, in one step that produces the first token.
  bool add_request_hashed(uint64_t id, uint32_t prompt_tokens, std::span<const LocalBlockHash> blocks,
                          uint32_t max_tokens, double now_ms, bool kv_transferred = false);
  // Blocks a request of this size needs (prompt blocks + room to generate).
  uint64_t blocks_needed(uint64_t prompt_tokens, uint32_t max_tokens) const;
  // Drops a request wherever it is (its outputs stop at once); its computed
  // blocks stay cached, unreferenced. False if the id is unknown.
  bool cancel(uint64_t id);

  // When the step in progress ends (nullopt: idle, nothing to do).
  std::optional<double> next_event_time() const { return step_end_; }
  // Completes every step that ends at or before `now_ms` (each next step
  // starts when the previous one ends), returning their outputs in order.
  std::vector<EngineOutput> advance_to(double now_ms);

  // running requests / max_seqs, waiting requests, blocks referenced by
  // running requests (shared + private) / kv_blocks.
  WorkerLoad load() const;
  // A cached block's tokens and namespace (keep_tokens only; nullptr for an
  // unknown block or without keep_tokens). Valid until the next engine call.
  struct BlockInfo {
    std::vector<TokenId> tokens;
    std::string lora_name;
    std::string cache_salt;  // set on a request's first block only
  };
  const BlockInfo* block_info(SequenceHash block) const;
  // Prefix cache lookups, as vLLM counts them: prompt tokens queried and hit.
  uint64_t prefix_queries_tokens() const { return prefix_queries_; }
  uint64_t prefix_hits_tokens() const { return prefix_hits_; }
  // Blocks in the cache that were announced as stored and not removed: what
  // an index fed with this engine's events holds for it.
  uint64_t cached_blocks() const { return stored_blocks_; }
  uint64_t last_event_id() const { return event_id_; }
  // The cache contents as stored events (parents before children, no event
  // ids), consistent with last_event_id(): applying them to an empty index
  // gives what applying events 1..last_event_id() gives.
  std::vector<KvEvent> dump() const;
  // Announces an event about blocks outside this engine's cache (the
  // mocker's offload tiers: mocker/kv_pool.h) in its event sequence: the next
  // event id and the owner are stamped, `ev`'s tier and medium kept. Calls
  // the event callback synchronously (which may announce again).
  void announce(KvEvent ev);
  // Called with the blocks about to be evicted from the cache, before their
  // removed event (which takes the next event id after whatever the hook
  // announces): a tier below keeps its copies of them announced first, so
  // that an index never sees them leave the worker (mocker/kv_pool.h).
  // Forks do not call it.
  void set_eviction_hook(std::function<void(const KvRemoved&)> hook) { on_evicting_ = std::move(hook); }
  // One prompt's prefill of `new_tokens` after `cached` ones, alone in one step.
  double prefill_ms(double new_tokens, double cached = 0) const;
  const EngineConfig& config() const { return cfg_; }

 private:
  struct Block {
    LocalBlockHash local;
    SequenceHash parent;
    bool has_parent = false;
    bool computed = false;                  // stored event sent
    bool available = false;                 // computed, or being computed in the current step
    uint32_t depth = 0;                     // position in its prompt
    uint32_t refs = 0;                      // running requests using it
    std::list<SequenceHash>::iterator lru;  // valid when refs == 0
    std::shared_ptr<BlockInfo> info;        // keep_tokens only
  };
  struct Request {
    uint64_t id = 0;
    uint32_t prompt_tokens = 0;
    uint32_t max_tokens = 0;
    uint32_t generated = 0;
    double arrival_ms = 0;  // when it was added: no step that starts earlier admits it
    std::vector<LocalBlockHash> locals;  // complete prompt blocks
    std::vector<SequenceHash> blocks;    // their ids (prefix chain)
    uint64_t private_blocks = 0;         // partial prompt block + room to generate
    uint32_t cached_tokens = 0;
    uint32_t computed = 0;   // prompt tokens in the KV cache (cached + prefilled chunks)
    uint32_t scheduled = 0;  // tokens in the step in progress (a chunk, or 1 to decode)
    uint32_t announced = 0;  // prompt blocks checked for announcement
    bool read_cache = true;
    PdOptions pd;
    int64_t priority = 0;       // SchedulingPolicy::Priority's key (lower first)
    double scheduled_ms = -1;   // engine time of the step that first scheduled it
    bool running = false;
    bool prefilled = false;
    std::vector<std::shared_ptr<BlockInfo>> infos;  // keep_tokens only: per complete block
  };

  Engine(const Engine&);  // fork()
  bool add_request_impl(uint64_t id, uint32_t prompt_tokens, std::span<const LocalBlockHash> blocks,
                        uint32_t max_tokens, double now_ms, std::vector<std::shared_ptr<BlockInfo>> infos,
                        bool read_cache = true, PdOptions pd = {}, int64_t priority = 0);
  bool enqueue(Request r, double now_ms);
  uint32_t cached_prefix_blocks(const Request& r) const;
  // Prompt tokens served from the cache, as vLLM counts them
  // (common/prefix_cache.h): whole blocks, at most prompt_tokens - 1.
  uint32_t cached_tokens(const Request& r) const;
  bool try_admit(Request& r);  // allocates blocks; false if they do not fit now
  void release(Request& r);
  void release_shared(std::span<const SequenceHash> blocks);
  // Marks r's imported blocks computed and announces them (admission).
  void import_blocks(Request& r);
  void start_step(double now_ms);
  // Schedules `n` prompt tokens of `r` in this step (its next chunk).
  void schedule_chunk(Request& r, uint32_t n, StepShape& shape);
  // Announces r's prompt blocks completed by its chunks so far.
  void announce_computed(Request& r);
  void emit(KvEvent ev);
  uint64_t used_blocks() const { return blocks_.size() + private_blocks_; }

  EngineConfig cfg_;
  std::function<void(const KvEvent&)> on_event_;
  std::function<void(const KvRemoved&)> on_evicting_;  // set_eviction_hook; empty in forks
  std::unordered_map<SequenceHash, Block> blocks_;  // shared blocks, computed or being computed
  std::list<SequenceHash> lru_;                     // unreferenced blocks, eviction order first
  uint64_t private_blocks_ = 0;                     // unhashed blocks reserved by running requests
  uint64_t stored_blocks_ = 0;                      // computed blocks in blocks_
  std::unordered_map<uint64_t, Request> requests_;  // waiting and running
  std::deque<uint64_t> waiting_;                    // in admission order (cfg_.policy)
  std::vector<uint64_t> running_;                   // admission order
  std::optional<double> step_end_;
  uint64_t event_id_ = 0;
  uint64_t prefix_queries_ = 0, prefix_hits_ = 0;
  std::unordered_map<uint64_t, std::vector<SequenceHash>> held_;  // finished requests holding their blocks
  uint64_t held_block_refs_ = 0;
};

}  // namespace kvroute::mocker
