// Worker selection: the cost function (scheduler/README.md).
// Pure code with no I/O: "a router only decides which worker you should use;
// it doesn't send you there". Thread-safe (no shared state; randomness injected).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/load.h"
#include "common/types.h"
#include "config/config.h"
#include "scheduler/ttft_model.h"

namespace kvroute {

struct Candidate {
  CacheOwner owner;
  WorkerLoad load;  // as the scheduler sees it: reported, raised by in-flight work (fleet/worker_registry.h)
  uint32_t overlap_blocks = 0;  // cached prefix length on this owner (all tiers)
  // Of overlap_blocks, how many per storage tier. If all zero, every
  // overlapping block counts as a device hit.
  std::array<uint32_t, kNumStorageTiers> overlap_by_tier{};
  uint64_t pending_prefill_tokens = 0;  // router's in-flight prefill on this worker
  // Of it, this request's own prompt prefix (OwnerOverlap::inflight_blocks, in tokens).
  uint64_t inflight_prefix_tokens = 0;
  // The wait for a request slot, as tokens of queue (scheduler.slot_wait_tokens
  // per request beyond the worker's slots, this one included; WorkerRegistry).
  // Priced with pending_prefill_tokens in priced_pending().
  uint64_t slot_wait_tokens = 0;
  bool draining = false;                // an operator asked for no new requests
  // KV blocks the router expects back on this worker: prompts it answered
  // there, fading (scheduler.parked_kv_seconds; WorkerRegistry). Priced
  // with the active KV in load_ratio, never in the busy_kv_usage test.
  double parked_blocks = 0;
  // KV blocks the worker evicted from its device lately, fading
  // (scheduler.eviction_seconds; WorkerRegistry). Priced in eviction_term().
  double evicted_blocks = 0;
  // For scheduler.cost = predicted_ttft (scheduler/ttft_model.h):
  uint32_t pending_prefill_requests = 0;  // router's in-flight requests not yet answered
  TtftCoefficients ttft;                  // the worker's fitted TTFT model
  // Its part in a disaggregated fleet; only scheduler/pd_decision.h reads it
  // (schedule() ranks whatever it is given).
  WorkerRole role = WorkerRole::Both;
};

// Why a candidate was not eligible. Maps one-to-one to a metric label.
enum class Exclusion : uint8_t {
  None,
  NoFreeSlot,   // request slot usage >= scheduler.busy_slot_usage (1.0 = full)
  NoFreeBlock,  // KV usage >= scheduler.busy_kv_usage (1.0 = full)
  TooManyWaiting,  // num_requests_waiting >= scheduler.busy_waiting_requests
  Draining,     // drained by an operator
};
std::string_view to_string(Exclusion e);

// Every term of one candidate's cost, for explain and metrics.
struct WorkerScore {
  Exclusion excluded = Exclusion::None;
  double cached_tokens = 0;   // tier-weighted tokens this worker saves
  double load_ratio = 0;      // (kv_active + parked) / kv_total
  double load_deviation = 0;  // load_ratio - mean
  double prefill_ratio = 0;   // (new_tokens + priced_pending()) / isl_tokens
  double slot_ratio = 0;      // active / total slots
  double queue_ratio = 0;     // waiting / max waiting
  double eviction_share = 0;  // evicted_blocks / kv_total, at most 1 (eviction_term())
  double predicted_ttft_ms = 0;  // the worker's TTFT model for this request (both costs)
  double cost = 0;
};

struct Decision {
  std::optional<size_t> chosen;   // index into the candidates; nullopt = nobody eligible
  std::vector<size_t> ranking;    // eligible candidates by cost, best first (random among equals);
                                  // only the best `rank_limit` when one was given
  std::vector<WorkerScore> scores;  // parallel to candidates
  double alpha = 0;
  double load_mean = 0;
  double load_std = 0;
  bool sampled = false;  // chosen by softmax sampling (temperature > 0), not argmin

  // Back to a default-constructed Decision, keeping the vectors' capacity.
  void reset();
};

// The pieces of the cost shared by schedule() (every candidate) and
// RankedCandidates::decide() (the fast path, scheduler/ranked_candidates.h), so both
// compute bit-identical costs and the same ranking.

// Why `c` may not take a request (None = eligible).
Exclusion exclusion_of(const WorkerLoad& load, bool draining, const SchedulerConfig& cfg);
// `cfg` with its busy thresholds lifted: exclusion_of() then excludes only
// drained workers. For ranking the busy workers when every worker is busy and
// requests are not rejected for it (scheduler.reject_when_busy false).
SchedulerConfig without_busy_limits(const SchedulerConfig& cfg);
// `cfg` with only its slot test lifted (busy_slot_usage): for a fleet whose
// slots are nearly all taken (scheduler.busy_slot_fleet_usage).
SchedulerConfig without_slot_limit(const SchedulerConfig& cfg);
// The KV load the cost prices: active blocks and the parked blocks the
// router expects back, over the worker's total (0 when it reports none).
inline double kv_load_ratio(const WorkerLoad& l, double parked_blocks) {
  return l.kv_total_blocks ? (static_cast<double>(l.kv_active_blocks) + parked_blocks) / static_cast<double>(l.kv_total_blocks)
                           : 0.0;
}
// Σ_tier overlap_by_tier · tier_weight (all device when by_tier is all zero);
// a shared pool's tier weighs cfg.tier_weight_pool[p] (its load cost).
double tier_weighted_blocks(uint32_t overlap_blocks, const std::array<uint32_t, kNumStorageTiers>& by_tier,
                            const SchedulerConfig& cfg);
// The random tie-break key of a worker in one decision: `draw` is the
// decision's one draw from the injected Random. Keyed by worker id (not by a
// candidate's position), so a scorer that reads only some workers gives every
// worker the key the full scorer gives it. splitmix64 finalizer.
inline uint64_t tie_key(uint64_t draw, WorkerId worker) {
  uint64_t z = draw ^ (worker.value * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// The worker's TTFT model's prediction (ms) for a request with `new_tokens`
// uncached tokens on candidate `c` (WorkerScore::predicted_ttft_ms; the cost
// under scheduler.cost = predicted_ttft).
double predicted_ttft_ms(const Candidate& c, double new_tokens);
// The eligible workers' KV load reads uneven, so alpha is
// scheduler.alpha_imbalanced: its spread (standard deviation of load_ratio)
// over scheduler.balance_threshold × its mean. Decision::load_std/load_mean.
inline bool load_uneven(double load_std, double load_mean, const SchedulerConfig& cfg) {
  return load_std > cfg.balance_threshold * load_mean;
}
// The pending prefill (tokens) the cost adds to a request's new tokens on a
// worker with `pending` tokens of prefill in flight, `own` of them the
// request's own prefix, and `cached` tokens of the prompt cached there:
// pending_prefill_weight x pending, and with scheduler.pending_prefill_excess
// the excess over pending_prefill_excess_tokens + pending_prefill_excess_cached
// x cached + own at the rest of weight 1 (config.h). Non-decreasing in
// `pending`; non-increasing in `own` and `cached`, by at most
// (1 - pending_prefill_weight) x (own + pending_prefill_excess_cached x cached).
inline double priced_pending(double pending, double own, double cached, const SchedulerConfig& cfg) {
  double priced = cfg.pending_prefill_weight * pending;
  if (cfg.pending_prefill_excess && cfg.pending_prefill_weight < 1) {
    const double tolerated = cfg.pending_prefill_excess_tokens + cfg.pending_prefill_excess_cached * cached + own;
    if (pending > tolerated) priced += (1 - cfg.pending_prefill_weight) * (pending - tolerated);
  }
  return priced;
}
// How fast a worker's cache turns over: its recent evictions over its KV
// capacity, at most 1 (0 when it reports no capacity). A worker that
// reports removals it never made (or floods them) only turns work away from
// itself, by at most eviction_weight.
inline double eviction_share(double evicted_blocks, uint64_t kv_total_blocks) {
  return kv_total_blocks ? std::min(1.0, std::max(0.0, evicted_blocks) / static_cast<double>(kv_total_blocks)) : 0.0;
}
// The eviction term of the cost: the blocks a request computes on a worker
// push cached prompts out at the rate the worker already evicts, so it is
// priced by the request's uncached share of its prompt (`new_ratio`, 0-1)
// times the worker's eviction_share. Never negative: the fast path's keys
// (ranked_candidates.h) stay lower bounds of the cost.
inline double eviction_term(double new_ratio, double share, const SchedulerConfig& cfg) {
  return cfg.eviction_weight > 0 ? cfg.eviction_weight * new_ratio * share : 0.0;
}
// The cost a ranking orders by: the weighted cost (scheduler/README.md) without its -alpha·mean
// term, which is the same for every candidate of one decision (so the order
// is the same, and it does not depend on how the mean was summed), and
// without the eviction term (eviction_term(), added by both scorers).
// WorkerScore::cost = ranking_cost + eviction_term - alpha·mean.
inline double ranking_cost(double alpha, double load_ratio, double prefill_ratio, double slot_ratio,
                           double queue_ratio, const SchedulerConfig& cfg) {
  return alpha * load_ratio + (1 - alpha) * prefill_ratio + cfg.gamma * slot_ratio + cfg.delta * queue_ratio;
}

// Scores `candidates` for a request of `isl_tokens` prompt tokens. O(candidates):
// the reference scorer, used for explain (rank all), softmax sampling, and
// wherever no RankedCandidates exists; the fast path must agree with it
// (tests/scheduler/ranked_candidates_test.cpp).
// `block_size` converts overlap blocks to tokens. `rank_limit` > 0 ranks only
// that many (a partial sort: routing needs the failover order of a few
// workers, explain wants all); every candidate is scored either way.
Decision schedule(const std::vector<Candidate>& candidates, uint32_t isl_tokens, uint32_t block_size,
                  const SchedulerConfig& cfg, Random& random, size_t rank_limit = 0);
// The same into `out` (replaced; its vectors' capacity is reused: no
// allocation per decision once they have grown).
void schedule(const std::vector<Candidate>& candidates, uint32_t isl_tokens, uint32_t block_size,
              const SchedulerConfig& cfg, Random& random, size_t rank_limit, Decision& out);

}  // namespace kvroute
