// The decision for one request in a disaggregated (prefill/decode) fleet:
// which worker decodes, whether the prompt is prefilled elsewhere at all, and
// which prefill worker computes it (scheduler/README.md, "Disaggregated
// fleets"). Pure code with no I/O, like schedule(); the proxy sends the legs.
//
// Order (llm-d's: decode first, then decide, then prefill;
// llm-d-inference-scheduler pkg/epp/framework/plugins/scheduling/profilehandler/disagg/
// disagg_profile_handler.go @520af47):
//   1. decode worker: schedule()'s cost over the decode side (role decode or
//      both) — load, slots, queue and its own cached prefix (blocks it holds
//      are not transferred) — among the workers with KV headroom for the
//      request's uncached blocks, with pd.decode_alpha (when set) as the
//      weight of KV load against the prefill term;
//   2. disaggregate or not: with policy conditional, the request runs whole on
//      the decode worker when the tokens it lacks are fewer than
//      pd.min_uncached_tokens (llm-d prefix_based_pd_decider.go: disaggregate
//      ⇔ input − cached ≥ nonCachedTokens; Dynamo lib/kv-router/src/
//      conditional_disagg.rs @088ca50 isl_bounding bypasses on the effective
//      ISL after the decode worker's overlap) or when the prefill pool is busy
//      (Dynamo's prefill_load policy: every prefill worker over a busy
//      threshold, or the best one's queued prefill ≥ pd.prefill_busy_tokens),
//      or when its predicted TTFT there (its TTFT model, which prices its
//      running decodes) is at most pd.aggregate_time_ratio × the split's
//      (the best prefill worker's predicted TTFT + the KV transfer of the
//      tokens the decode worker lacks); none of these runs it whole while the
//      decode worker is busy (KV usage with the request's blocks above
//      pd.decode_busy_kv_usage: Dynamo's decode gate, an AND veto over the
//      bypass, lib/kv-router/src/conditional_disagg.rs @088ca50
//      ConditionalDisaggDecisionInput::decode_chosen_worker_busy);
//   3. prefill worker: the lowest predicted time to first token over role
//      prefill (its cached prefix, its queued prefill tokens and requests,
//      its fitted TTFT model: scheduler/ttft_model.h) — Dynamo's prefill
//      router prices max(0, prefill_blocks − overlap) + queued blocks
//      (lib/kv-router/src/scheduling/selector/default.rs @07a6c9c).
// Every term is kept for explain.
//
// Thread-safe: no shared state; randomness injected (one draw per side).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "config/config.h"
#include "scheduler/scheduler.h"

namespace kvroute {

struct PdRequest {
  uint32_t isl_tokens = 0;      // prompt tokens
  uint32_t block_size = 16;     // tokens per KV block
  // KV blocks of the request's prompt (the router's RouteResult::request_blocks: its output is not
  // known at dispatch, so neither the headroom nor the decode gate counts it); 0 = unknown
  uint64_t request_blocks = 0;
  // False for n > 1 or a multi-prompt batch: one KV handoff feeds one decode
  // request (vLLM returns only the first prompt's kv_transfer_params; SMG
  // pd_router.rs runs n > 1 decode-only), so such a request is never split.
  bool single_consumer = true;
};

// Why the request is or is not split. Maps one-to-one to a metric label.
enum class PdReason : uint8_t {
  Disaggregated,      ///< split: a prefill worker computes the prompt, the decode worker pulls its KV
  PolicyNever,        ///< pd.policy never: aggregated on the decode side
  NoDecodeWorker,     ///< no worker of the decode side (role decode or both); nothing chosen
  AggregatedWorker,   ///< the best decode-side worker has role both: it serves the request whole
  FewUncachedTokens,  ///< conditional: the decode worker lacks fewer than pd.min_uncached_tokens
  NoPrefillWorker,    ///< the model has no prefill worker that is not drained
  PrefillPoolBusy,    ///< conditional: every prefill worker busy, or the best one's queue ≥ pd.prefill_busy_tokens
  MultipleConsumers,  ///< n > 1 or several prompts: one KV handoff cannot feed them
  AggregatedFaster,   ///< conditional: predicted TTFT whole on the decode worker ≤ pd.aggregate_time_ratio × split
};
std::string_view to_string(PdReason r);

// One decode-side candidate's terms.
struct PdDecodeTerms {
  size_t candidate = 0;           // index into the candidates
  double cached_tokens = 0;       // of the prompt, on this worker (tier-weighted, the engines' hit rule)
  double uncached_tokens = 0;     // isl − cached: what a prefill worker computes and this one pulls
  // Free blocks − the request's blocks it does not hold; −1 when unknown (the
  // worker reports no KV total, or the request's size is unknown).
  int64_t kv_headroom_blocks = 0;
  bool lacks_headroom = false;    // left out: another decode-side worker has room
  WorkerScore score;              // schedule()'s terms and cost
};

// One prefill candidate's terms (cost = predicted_ttft_ms; lowest wins).
struct PdPrefillTerms {
  size_t candidate = 0;
  Exclusion excluded = Exclusion::None;
  double cached_tokens = 0;
  double new_tokens = 0;            // prompt tokens it computes
  uint64_t queued_tokens = 0;       // router's in-flight prefill on it
  uint32_t queued_requests = 0;
  double predicted_ttft_ms = 0;     // its TTFT model: new tokens behind its queue
};

struct PdDecision {
  bool disaggregate = false;
  PdReason reason = PdReason::NoDecodeWorker;
  std::optional<size_t> decode;        // index into candidates; nullopt = nobody on the decode side
  std::optional<size_t> prefill;       // set when disaggregate
  std::vector<size_t> decode_ranking;  // failover order, best first (indices into candidates)
  std::vector<size_t> prefill_ranking; // eligible prefill workers by cost (empty unless disaggregate)
  double decode_uncached_tokens = 0;   // of the chosen decode worker
  bool decode_all_busy = false;        // every decode-side worker busy: ranked among the busy ones
  bool prefill_all_busy = false;       // policy always: every prefill worker busy, ranked among the busy ones
  std::vector<PdDecodeTerms> decode_terms;    // every decode-side candidate
  std::vector<PdPrefillTerms> prefill_terms;  // every prefill candidate
  double decode_alpha = 0;             // schedule()'s alpha over the decode side
  // The decode worker's KV usage were it to run the request whole (its active
  // blocks + the request's blocks it does not hold, over its total); −1 unknown.
  double decode_kv_usage = -1;
  // Over pd.decode_busy_kv_usage: the request is not run whole there for few
  // uncached tokens, a busy prefill pool or a faster prediction (split instead).
  bool decode_busy = false;
  // Conditional, once a prefill worker is ranked: predicted TTFT whole on the
  // decode worker, and split (best prefill worker + transfer_ms).
  double predicted_aggregated_ms = 0;
  double predicted_split_ms = 0;
  double transfer_ms = 0;              // the decode worker's uncached tokens × pd.transfer_ms_per_1k_tokens / 1000
};

// Decides for one request over all the model's candidates (each with its
// Candidate::role). `sched` gives the decode side's cost and both sides' busy
// thresholds; a decode side that is all busy is ranked without the limits
// unless sched.reject_when_busy (then decode is nullopt, reason
// NoDecodeWorker, decode_all_busy true).
PdDecision decide_pd(const std::vector<Candidate>& candidates, const PdRequest& request,
                     const SchedulerConfig& sched, const PdConfig& pd, Random& random);

}  // namespace kvroute
