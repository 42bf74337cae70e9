// Engine floors: each request's TTFT with one infinite cache and nothing
// queued, from the simulated engine's step model (mocker/engine.h): the
// prefill of its uncached tokens on the engine profile, chunked by the step
// budget (max_batched_tokens) as the engine chunks it. No decode step is added: a
// request admitted to an idle engine has its first token at the end of its
// prefill. The percentiles of a floor are lower bounds on the same
// percentiles of any router's TTFTs (every request's TTFT is at least its
// floor, so every order statistic is too).
//
// acausal_floor: a block counts as cached for a request as soon as any earlier
// request had it, even if that request's prefill has not finished (the old
// floor; too low in bursts, where 16-96 requests want a document nobody has
// computed yet).
// causal_floor: a block is available only from the end of the chunk that
// completes it in the earliest-finishing request that computes it (its
// arrival, or the end of its wait, + its own chunks up to that one). Each request takes the best of computing its whole prompt itself
// or waiting for an available prefix and then computing its suffix. Requests
// are taken in arrival order; `rate` compresses the arrivals as the simulator
// does (at_rate, sim/workload.h: sessions start `rate` times as often, their
// tool pauses kept).
// Why this is a lower bound for the engine: the router dispatches on arrival
// and each engine admits FIFO, so a request never uses blocks computed by a
// later arrival's step; a request admitted in step s (>= its arrival) pays
// prefill(t) with t at least its tokens not computed before s, which is the
// floor's "wait for the available prefix, compute the rest" option (blocks
// computed in the same step by others count in t; prefill is monotone). With
// chunks: a request gets at most the budget per step and a step holding more
// work takes at least as long; splitting a chunk in two never costs less on
// the fitted profiles (the second pays w0 again, which exceeds what the knee
// gives back, and attention across the split at attn_cached >= attn_new).
//
// Threading: plain functions; no shared state.
#pragma once

#include <vector>

#include "mocker/engine.h"
#include "sim/workload.h"

namespace kvroute::sim {

struct FloorResult {
  std::vector<double> ttft_ms;  // per request, in arrival order (causal) or the workload's (acausal)
  double hit_rate = 0;          // prompt blocks taken from the cache in the floor's own schedule
  size_t waited = 0;            // requests whose floor waits for a prefix someone else is computing
};

// Decode interference, stated apart from the floors (the floors have none:
// a request alone on an idle engine). Not a bound on any one request's TTFT:
// a router may place a request where nothing decodes. For the fleet as a
// whole it is unavoidable on average: by Little's law the fleet carries at
// least D = (sum over requests of (output tokens - 1) decode steps of batch 1
// at their mean context) / the workload's arrival span decoding requests at
// a time (decodes batched with others only take longer), so a prefill step
// shares its engine with D / workers decodes on average, which add to its time.
struct DecodeInterference {
  double decodes_per_engine = 0;  // D / workers, time average
  double mean_context = 0;        // KV tokens a decode reads, weighted by decode time
  double added_ms_512 = 0;        // what they add to a step holding a fresh 512-token chunk
  double added_ms_budget = 0;     // ... a fresh chunk of the whole step budget (max_batched_tokens)
};
DecodeInterference decode_interference(const std::vector<SimRequest>& w, double rate, const mocker::EngineConfig& ec,
                                       uint32_t workers);

FloorResult acausal_floor(const std::vector<SimRequest>& w, const mocker::EngineConfig& ec = {});
FloorResult causal_floor(const std::vector<SimRequest>& w, double rate, const mocker::EngineConfig& ec = {});

}  // namespace kvroute::sim
