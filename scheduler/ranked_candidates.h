// The fast path of worker selection: the workers of one model kept pre-ranked
// by the request-independent part of their cost, so a decision reads only the
// workers that can win instead of scoring every worker.
//
// The cost (scheduler.h, ranking_cost) splits into
//   load part    = alpha·load_ratio_w + gamma·slot_ratio_w + delta·queue_ratio_w   (request-independent)
//   pending term = (1 - alpha)·priced_pending(pending_w, own_w, cached_w) / isl, pending_w the
//                  worker's queue as the cost prices it (CandidateState::queued_tokens())
//                = (1 - alpha)·(pending_prefill_weight·pending_w + excess_w) / isl, where
//                  excess_w >= 0 (scheduler.h: the queue past what the request saves there, in
//                  full) depends on the request
//   depth term   = (1 - alpha)·(isl - cached)/isl      (depends only on the matched depth: uncached tokens)
//   eviction     = eviction_term((isl - cached)/isl, eviction_share_w) >= 0 (scheduler.h; depends on the
//                  request and the worker)
// key_w(alpha) = load part + the pending term without its excess, priced at
// a typical prompt length isl_ref (a request with another isl corrects the
// bound by at most |1/isl - 1/isl_ref|·(1 - alpha)·weight·max pending; the
// excess and the eviction term only add to a cost, so the key stays a lower bound).
// The ranking keeps one ordered set per alpha (balanced, imbalanced) by key,
// updated in O(log W) when a worker's load changes (heartbeat, in-flight
// begin / first byte / end, drain). A decision groups the request's owners
// (find_match_layers) by cached tokens (the depth, weighted by tier): a
// small group is scored member by member; a large group, and the workers that
// hold none of the prompt, are read from the ranked set in key order, and the
// walk stops when key + the smallest depth term still to be read exceeds the
// rank_limit-th best cost found: no worker past that point can enter the
// ranking. Owners come as the index's nested layers (one shared set per
// depth) plus owners listed one by one: a small layer or a listed owner is
// marked per member; a large layer is read through a bitmap of its members'
// slots, made once per set (cached by the set's serial, dropped when a worker
// joins) and tested only for the workers the walk reads. A decision
// costs O(small-layer members + listed owners) marks + O(W/64) words per
// large layer + O(workers walked) exact costs: not O(owners), not O(workers).
//
// The result is exactly schedule()'s (reference) ranking prefix: the same cost
// doubles (ranking_cost), the same tie keys (tie_key by worker id from one
// draw), the same best-dp-rank rule. tests/scheduler/ranked_candidates_test.cpp
// checks it on random fleets. Only alpha (std vs balance_threshold·mean) is
// computed from running sums (recomputed exactly every kExactEvery updates);
// it can differ from the reference only when std is within rounding of the
// threshold.
//
// Supported: scheduler.cost = weighted, temperature 0 (argmin ranking) with
// rank_limit > 0 and pending_prefill_weight >= 0 (supports()); otherwise
// (predicted_ttft: per-worker TTFT models) callers use schedule().
//
// Threading: not thread-safe; the owner (WorkerRegistry) serialises every call
// under its mutex. decide() uses per-thread scratch, so concurrent owners on
// different threads are fine.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "common/clock.h"
#include "common/types.h"
#include "indexer/flat_map.h"
#include "indexer/indexer.h"
#include "scheduler/scheduler.h"

namespace kvroute {

// What the ranking knows of one worker (the registry's predicted view).
struct CandidateState {
  WorkerLoad load;  // predicted: reported, raised by the router's own in-flight work
  uint64_t pending_prefill_tokens = 0;
  bool draining = false;
  double parked_blocks = 0;  // KV the router expects back (Candidate::parked_blocks)
  uint64_t slot_wait_tokens = 0;  // Candidate::slot_wait_tokens
  double evicted_blocks = 0;  // KV the worker evicted lately (Candidate::evicted_blocks)
  // The queue ahead of a request as the cost prices it (priced_pending()).
  uint64_t queued_tokens() const { return pending_prefill_tokens + slot_wait_tokens; }
};

// One ranked worker of a fast decision, with every term (as WorkerScore).
struct RankedPick {
  WorkerId worker;
  uint32_t dp_rank = 0;
  uint32_t overlap_blocks = 0;
  std::array<uint32_t, kNumStorageTiers> overlap_by_tier{};
  uint32_t inflight_blocks = 0;  // OwnerOverlap::inflight_blocks of the overlap it was scored by
  CandidateState state;
  WorkerScore score;
};

struct RankedDecision {
  std::vector<RankedPick> ranked;  // best first, at most rank_limit; empty = nobody eligible
  double alpha = 0, load_mean = 0, load_std = 0;
  uint32_t eligible = 0;           // eligible workers of the ranking
  uint32_t best_overlap_blocks = 0;  // longest overlap among eligible owners
  uint32_t scored = 0;             // exact costs computed (the decision's work)
  uint32_t groups = 0;             // distinct cached depths among eligible owners
  void reset();
};

class RankedCandidates {
 public:
  // An update count after which running sums are recomputed exactly.
  static constexpr uint32_t kExactEvery = 4096;
  // A depth group with at most this many members is scored member by member.
  static constexpr uint32_t kSmallGroup = 16;

  // Whether decide() gives schedule()'s ranking under `cfg`.
  static bool supports(const SchedulerConfig& cfg, size_t rank_limit);

  // Adds or updates a worker. O(log W); O(W log W) when the ranking's largest
  // num_requests_waiting changes (every key's queue term changes).
  void upsert(WorkerId id, const CandidateState& s);
  // Removes a worker; false if it was not there.
  bool erase(WorkerId id);
  size_t size() const { return live_; }
  // The eligible workers' mean load_ratio (KV load with the parked KV) under
  // `cfg`'s thresholds, from the running sums decide() reads alpha by; 0
  // when nobody is eligible. Rebuilds first if cfg changed, as decide().
  double load_mean(const SchedulerConfig& cfg);
  // How many workers are eligible under `cfg` (the count load_mean() divides by).
  size_t eligible(const SchedulerConfig& cfg);
  bool contains(WorkerId id) const { return index_.find(id.value) != nullptr; }
  // The share of the request slots taken over the workers not draining that
  // report slots: Σ active / Σ total of their predicted loads (exact integer
  // sums; above 1 when the router has more in flight than slots). 0 when
  // none reports.
  double slot_usage() const;
  // Whether the fleet counts as full for scheduler.busy_slot_fleet_usage =
  // `threshold` (>= 1: never): from slot_usage() >= threshold until it falls
  // below threshold - kSlotsFullBand. The band keeps a fleet hovering at the
  // threshold from switching the slot test, and with it every worker's
  // eligibility (a rebuild), on each request.
  bool slots_full(double threshold);
  static constexpr double kSlotsFullBand = 0.02;

  // The rank_limit best workers for a request of `isl_tokens` whose overlaps
  // are `match` (MatchLayers' rule; several dp ranks per worker allowed, the
  // best counts; owners not in the ranking are ignored). Requires
  // supports(cfg, rank_limit). Rebuilds first if cfg's weights or thresholds
  // changed since the last call.
  void decide(const MatchLayers& match, uint32_t isl_tokens, uint32_t block_size, const SchedulerConfig& cfg,
              Random& random, size_t rank_limit, RankedDecision& out);
  // The same with every owner listed (find_matches' answer).
  void decide(std::span<const OwnerOverlap> owners, uint32_t isl_tokens, uint32_t block_size,
              const SchedulerConfig& cfg, Random& random, size_t rank_limit, RankedDecision& out);
  // Sets whose slot bitmaps are kept (each W/8 bytes).
  static constexpr size_t kMaxCachedSets = 64;

 private:
  class Pass;  // one decision's phases (ranked_candidates.cpp)
  // The slots of one large layer's set: a bitmap, and the lowest dp rank per
  // slot where it is not 0.
  struct SetSlots {
    std::vector<uint64_t> bits;
    FlatMap64<uint32_t> rank;
  };
  const SetSlots& slots_of(const OwnerSet& set);
  void forget_sets();  // a worker joined: every cached bitmap is void
  void decide_impl(std::span<const MatchLayers::Layer> layers, std::span<const OwnerOverlap> extra,
                   uint32_t isl_tokens, uint32_t block_size, const SchedulerConfig& cfg, Random& random,
                   size_t rank_limit, RankedDecision& out);

  struct Key {
    double key;
    uint32_t slot;
    bool operator<(const Key& o) const { return key != o.key ? key < o.key : slot < o.slot; }
  };
  using Order = std::set<Key>;
  struct Slot {
    WorkerId id;
    CandidateState st;
    bool live = false;
    bool eligible = false;
    double load_ratio = 0, slot_ratio = 0;
    std::array<Order::iterator, 2> at{};  // in order_[0] (balanced), order_[1] (imbalanced)
  };
  // The weights and thresholds keys and eligibility were computed with.
  struct Params {
    double alpha[2] = {0, 0}, gamma = 0, delta = 0, ppw = 0, busy_kv = 0, busy_slot = 0;
    uint32_t busy_waiting = 0;
    bool operator==(const Params&) const = default;
  };
  static Params params_of(const SchedulerConfig& cfg);
  void use(const SchedulerConfig& cfg);  // rebuilds when cfg's weights or thresholds changed

  double key_of(const Slot& s, int a) const;
  void add_eligible(uint32_t slot);     // aggregates + orders
  void remove_eligible(uint32_t slot);  // aggregates + orders
  void add_waiting(uint32_t w);
  void remove_waiting(uint32_t w);
  // Recomputes eligibility, sums and both orders from the slots. O(W log W).
  void rebuild();
  void exact_sums();
  void count_slots(const CandidateState& st, bool add);  // into slots_taken_ / slots_total_

  std::vector<Slot> slots_;
  std::vector<uint8_t> eligible_flag_;  // slots_[i].eligible, packed (read per owner)
  std::vector<uint64_t> eligible_bits_; // the same as a bitmap (counted per large layer)
  std::deque<SetSlots> sets_;           // cached bitmaps (a deque: references stay valid)
  FlatMap64<uint32_t> set_at_;          // OwnerSet serial -> index in sets_
  std::vector<uint32_t> free_;
  FlatMap64<uint32_t> index_;  // worker id -> slot
  uint32_t live_ = 0;
  Params params_ = params_of(SchedulerConfig{});
  SchedulerConfig cfg_{};  // the config params_ came from (eligibility)
  std::array<Order, 2> order_;
  // Over eligible workers: count, Σ load_ratio, Σ load_ratio², waiting counts.
  uint32_t eligible_ = 0;
  double sum_lr_ = 0, sum_lr2_ = 0;
  std::map<uint32_t, uint32_t> waiting_;  // num_requests_waiting -> eligible workers with it
  uint32_t max_waiting_ = 0;
  bool keys_stale_ = false;
  // The key prices pending prefill at isl_ref_ (a power of two near the
  // prompts' running mean isl_mean_); pending_max_ bounds every eligible
  // worker's pending tokens (exact at rebuild, raised on updates).
  double isl_ref_ = 2048, isl_mean_ = 0;
  uint64_t pending_max_ = 0;  // max_waiting_ changed: rebuild at the end of the update
  uint64_t slots_taken_ = 0, slots_total_ = 0;  // slot_usage()'s sums
  bool slots_full_ = false;                      // slots_full()'s state
  uint32_t updates_ = 0;
};

}  // namespace kvroute
