// KV cache tiers below the engines' device memory, as the simulator models
// them: a host tier per worker and a pool shared by every worker (both
// optional), each with a capacity in 512-token blocks, a load bandwidth and an
// eviction policy: LRU, or the workload-aware policy of "KVCache Cache in the
// Wild: Characterizing and Optimizing KVCache Cache at a Large Cloud Provider"
// (Jiahao Wang, Jinbo Han, Xingda Wei, Sijie Shen, Dingyan Zhang, Chenguang
// Fang, Rong Chen, Wenyuan Yu, Haibo Chen; USENIX ATC 2025), §4.2.
//
// Movement (sim/simulate.cpp applies it): a block the engine evicts from the
// device is demoted to the worker's host tier (without one, to the pool); a
// block the host tier evicts is demoted to the pool; the pool's evictions are
// gone for everybody. A request's prefix found below the device (host first,
// then the pool, block by block, after the device's own prefix) is loaded at
// the tier's bandwidth instead of recomputed and stays in the tier it came
// from (a copy), as vLLM's CPU offloading keeps offloaded blocks
// (vllm/v1/kv_offload/lru_manager.py) and SGLang HiCache keeps host and
// storage copies (python/sglang/srt/mem_cache/hiradix_cache.py).
//
// Threading: plain values; not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "sim/workload.h"

namespace kvroute::sim {

enum class Eviction : uint8_t {
  Lru,            // least recently stored or loaded first
  WorkloadAware,  // the paper's (reuse probability by category and age, then offset)
};
const char* to_string(Eviction e);
bool parse_eviction(const std::string& s, Eviction& out);

// Request categories (the paper's "workloads": request type and turn): the
// trace carries no type, so a request's category is its turn estimated from
// the prefixes it extends: 1 + the earlier requests whose last prompt block
// lies on this prompt's block chain, bucketed 1, 2, 3-5, 6 and more. Known
// when the request arrives, as the paper's gateway knows a request's type.
inline constexpr size_t kCategories = 4;
std::vector<uint8_t> request_categories(const std::vector<SimRequest>& w);

// One category's reuse: the fraction of block accesses followed by another
// access to the same block (`p_reuse`), the mean time to that next access
// (an exponential fit, as the paper fits its reuse-time CDFs) and the
// lifetime past which a block counts as dead (the 99th percentile of the
// reuse times: the paper moderates the fitted probability by the expected
// lifetime, KV blocks living briefly).
struct ReuseProfile {
  double p_reuse = 0, mean_ms = 1, life_ms = 0;
  // P(the block is accessed again | idle for `idle_ms`):
  //   0 past life_ms, else q / (q + 1 - p_reuse) with q = p_reuse · exp(-idle_ms / mean_ms).
  double reuse_probability(double idle_ms) const;
};
using ReuseProfiles = std::array<ReuseProfile, kCategories>;

// Fits each category's profile on a workload's requests (in arrival order),
// from every block access and the next access to the same block id.
ReuseProfiles fit_reuse_profiles(const std::vector<SimRequest>& w);

// One tier's contents. Blocks are keyed by their sequence hash's value.
class TierCache {
 public:
  struct Block {
    uint64_t hash = 0;
    uint8_t category = 0;  // of the request that last used it
    uint32_t depth = 0;    // position in its prompt (the paper's offset)
    double last_ms = 0;    // its last use by a request
  };
  // `profiles` must outlive the cache when `e` is WorkloadAware.
  TierCache(uint64_t capacity_blocks, Eviction e, const ReuseProfiles* profiles = nullptr);

  uint64_t capacity() const { return capacity_; }
  size_t size() const { return blocks_.size(); }
  bool contains(uint64_t hash) const { return blocks_.count(hash) != 0; }
  // Stores (or refreshes) `b` at `now_ms`; blocks evicted to make room are
  // appended to `evicted`, in eviction order.
  void put(const Block& b, double now_ms, std::vector<Block>& evicted);
  // A load from this tier: refreshes the block's recency and use.
  void touch(uint64_t hash, double now_ms, uint8_t category);
  // The next block eviction would pick at `now_ms` (the cache must not be empty).
  Block victim(double now_ms) const;

 private:
  struct Entry {
    Block block;
    std::pair<double, uint64_t> key;  // order in its queue: (time, insertion sequence)
  };
  // LRU: one queue by time stored or loaded. Workload-aware: one queue per
  // category by last use; eviction compares the queues' heads only (the
  // paper's O(W) optimisation: within a category the reuse probability falls
  // with age, so the oldest is the least likely).
  size_t queue_of(const Block& b) const { return eviction_ == Eviction::Lru ? 0 : b.category; }
  void insert(const Block& b, double order_ms);
  void erase(std::unordered_map<uint64_t, Entry>::iterator it);

  uint64_t capacity_;
  Eviction eviction_;
  const ReuseProfiles* profiles_;
  uint64_t seq_ = 0;
  std::unordered_map<uint64_t, Entry> blocks_;
  std::array<std::set<std::pair<std::pair<double, uint64_t>, uint64_t>>, kCategories> queues_;
};

// A load's duration: tokens × bytes per token ÷ bandwidth (GB/s = 10^9 bytes/s), in ms.
double load_ms(uint64_t tokens, double kv_bytes_per_token, double gbytes_per_s);

// A shared pool's bandwidth, shared by the loads in flight (processor
// sharing: n loads each move at min(link, total ÷ n) bytes per ms), each
// worker's own link carrying one load at a time (a worker's next load waits
// for its previous one). Loads finish in virtual time; the simulation asks
// next_done() as one more event and finish() at that time.
class SharedBandwidth {
 public:
  // Bytes per ms: the pool's in total, and one worker's link.
  SharedBandwidth(double total_bytes_per_ms, double link_bytes_per_ms, uint32_t workers);
  // A load of `bytes` for request `id` on worker `w`, asked at `now` (no
  // earlier than any previous call's time).
  void start(uint32_t w, size_t id, double bytes, double now);
  // When the next load in flight ends; infinity when none is.
  double next_done() const;
  // At next_done(): the load that ends (its request id); the worker's next
  // queued load starts.
  size_t finish(double now);
  size_t in_flight() const { return active_.size(); }

 private:
  struct Transfer {
    uint32_t worker = 0;
    size_t id = 0;
    double remaining = 0;  // bytes
  };
  double rate() const;  // bytes per ms of each load in flight
  void advance(double now);

  double total_, link_, last_ = 0;
  std::vector<Transfer> active_;
  std::vector<std::vector<Transfer>> queued_;  // per worker, FIFO
  std::vector<uint8_t> busy_;                  // per worker: a load in flight
};

}  // namespace kvroute::sim
