// The goodput ceiling: rates at which no routing policy can keep the goodput
// SLO's TTFT part (TTFT p99 <= S = slo_ttft_ms) on the simulator's own engine
// model (mocker/engine.h, a roofline profile of mocker/profile.h), whatever
// it routes where. Necessary conditions; a rate failing one is ruled out for
// every router:
//
// 1. The TTFT floor (sim/floor.h): a request's TTFT is at least its causal
//    floor, so the requests whose floor exceeds S miss it under any router.
//    More of them than the percentile lets miss (allowed_misses) rule the
//    rate out; fewer still spend that allowance.
// 2. Work in windows. Each request has a minimal cost: the prefill of the
//    tokens no earlier arrival had (one infinite shared cache; at least the
//    last token or block, as the engine counts hits) after its cached
//    context, chunked as cheaply as the step budget allows, plus its
//    output - 1 decodes, each reading its context; no step charges less
//    (min_token_ms). For a window of arrivals [t1, t2]: a request meeting the
//    SLO has its first token by its arrival + S, so it was admitted by then,
//    and at t2 + S at most workers x max_seqs admitted requests are still
//    running (an engine runs at most max_seqs); every other one has
//    finished. None of its steps starts before its arrival, so the window's
//    requests that meet the SLO need at least their minimal work in
//    [t1, t2 + S], on workers x (t2 - t1 + S) engine-ms, less the decodes of
//    those still running (the dearest dropped). What is over has to go by
//    excluding requests, the dearest first: need(window). Windows whose
//    spans [t1, t2 + S] do not overlap share no step and no request, so their
//    needs add up; floor misses + the most needing set of disjoint windows
//    over the allowance rules the rate out.
//    Decodes are priced twice: at min_token_ms, as any token, and by the
//    steps they need. A step runs at most max_seqs decodes per engine, so
//    the window's D decodes need at least D / max_seqs steps, each paying the
//    bare step time, which lies above a line intercept + slope x T (StepLine).
//    Each line with slope >= the chunking condition's (ceiling_supported)
//    gives another pricing: prefill tokens at slope, decodes at slope +
//    intercept / max_seqs. A window needs at least the most exclusions any
//    pricing needs.
// 3. KV capacity (the whole run's window; MinimalWork::recompute_ms): a
//    reused block not held somewhere between its two readers is recomputed.
// Not used (no guarantee in the model): the ITL SLO (1 % of a run's gaps may
// exceed it, one per request, so it forces no decode into a window), which
// engine holds what (a router may place every request where its prefix is),
// queueing behind other requests' steps (a router may avoid it).
//
// Threading: plain functions; no shared state.
#pragma once

#include <cstdint>
#include <vector>

#include "mocker/engine.h"
#include "sim/workload.h"

namespace kvroute::sim {

// The cheapest a token can be on the profile: min over step sizes T in
// [1, budget] of (the step's time for T tokens with no attention and no KV
// read) / T. Every step's time is at least this per token it carries
// (prefill chunk tokens and decodes alike) plus its attention and KV reads.
double min_token_ms(const mocker::EngineProfile& p, uint32_t budget);

// The least engine time computing prompt tokens [from, to) can take, from
// `from` tokens of context, whatever the steps hold besides: token_ms a
// token plus each chunk's attention and prefix read, chunked as cheaply as
// the budget allows (the remainder first, then full chunks: attn_cached >=
// attn_new makes fewer, larger chunks cheaper; a shorter context first reads
// less). Requires a roofline profile (ceiling_supported).
double min_prefill_ms(const mocker::EngineProfile& p, uint32_t budget, double token_ms, uint32_t from, uint32_t to);
// The least engine time of a request's output - 1 decodes after a prompt of
// `input` tokens: token_ms each plus its KV read (input + tokens so far).
double min_decode_ms(const mocker::EngineProfile& p, double token_ms, uint32_t input, uint32_t output);
// The bounds hold on roofline profiles with attn_cached >= attn_new >= 0,
// non-negative reads and token_ms >= (attn_cached - attn_new) x budget +
// prefix_read (the fitted ones): then a chunk that recomputes tokens before
// the new ones costs at least what charging the new ones alone at their own
// context gives (the recomputed tokens cost token_ms each, more than the
// cheaper in-chunk attention saves). False for the rest (dynamo-mocker).
bool ceiling_supported(const mocker::EngineProfile& p, uint32_t budget);
// The chunking condition's least token price: (attn_cached - attn_new) x
// budget + prefix_read, what a recomputed token may save at most.
double least_token_price(const mocker::EngineProfile& p, uint32_t budget);

// A line under the bare step time (bare_step_ms: weight read and linear
// layers, no attention, no KV read): every step of T in [1, budget] tokens
// takes at least intercept + slope x T. For a slope, the highest such
// intercept: min over T of bare(T) - slope x T.
struct StepLine {
  double slope = 0, intercept = 0;
};
StepLine step_line(const mocker::EngineProfile& p, uint32_t budget, double slope);
// The lines the ceiling prices decodes by: slopes from least_token_price
// up to min_token_ms, those with a positive intercept.
std::vector<StepLine> step_lines(const mocker::EngineProfile& p, uint32_t budget);

struct RequestWork {
  double arrival_ms = 0;
  double prefill_ms = 0;  // min_prefill_ms of the tokens no earlier arrival had
  double decode_ms = 0;   // min_decode_ms
  uint32_t prefill_tokens = 0;  // the tokens prefill_ms computes (each priced at MinimalWork::token_ms)
  uint32_t decode_tokens = 0;   // output - 1: the decodes decode_ms prices
  double reuse_ms = 0;    // what recomputing the cached blocks it reuses would cost at least (recompute_block_ms)
  bool floor_miss = false;  // its causal floor exceeds the TTFT SLO
};
struct CeilingOptions {
  uint32_t workers = 8;
  uint32_t max_seqs = 64;  // the engines' running sequences (mocker::EngineConfig::max_seqs)
  uint64_t kv_blocks = 0;  // per worker (mocker::EngineConfig::kv_blocks); 0 = infinite, no recompute bound
  double slo_ttft_ms = 2000;
  double percentile = 0.99;
};
// The least a block at `position` (in blocks) costs to compute again: its
// tokens at token_ms less what they may pay for the new tokens sharing their
// chunk (the condition of ceiling_supported), plus attention over every token
// before each at attn_new.
double recompute_block_ms(const mocker::EngineProfile& p, uint32_t budget, double token_ms, uint32_t position);
struct MinimalWork {
  std::vector<RequestWork> requests;  // at_rate order: by arrival
  // The KV bound: the least recomputation the fleet's KV capacity forces over
  // the run (0 without kv_blocks). A request meeting the SLO reuses a block
  // without recomputing it only if some engine held it from the previous
  // such request's arrival + S to its own arrival; at every instant the fleet
  // holds at most workers x kv_blocks distinct blocks. Relaxed to the
  // block-time summed over the run (t_first .. t_last + S), the cheapest
  // recomputation is a fractional knapsack: keep the reuse gaps of highest
  // recompute cost per block-ms. Excluding a request lowers it by at most
  // its reuse_ms (its gaps merge into longer ones of no more value).
  double recompute_ms = 0;
  double token_ms = 0;           // min_token_ms: the price of prefill_ms's and decode_ms's tokens
  std::vector<StepLine> lines;   // step_lines: the decode pricings (none: min_token_ms alone)
};
MinimalWork minimal_work(const std::vector<SimRequest>& w, double rate, const mocker::EngineConfig& ec,
                         const CeilingOptions& o);

// The whole run's minimal work (every request, recomputation included) over
// the fleet's time from the first arrival to the last + S: how full the
// cheapest schedule keeps the fleet on average.
double run_load(const MinimalWork& work, const CeilingOptions& o);

// How many requests may miss the TTFT SLO with the p-th percentile still
// within it, as sim/simulate.cpp's percentile() picks it (index floor(p n)).
size_t allowed_misses(size_t n, double p = 0.99);

struct WindowNeed {
  double start_ms = 0, end_ms = 0;  // arrivals [start, end]; the work runs in [start, end + S]
  size_t requests = 0;
  double work_ms = 0;      // their minimal work under the pricing needing the most exclusions, floor misses
                           // left out (the whole run, at min_token_ms: + recompute_ms)
  double capacity_ms = 0;  // workers x (end - start + S)
  size_t need = 0;         // requests to exclude beyond the still-running ones to fit
};
struct WorkBound {
  size_t allowed = 0;      // allowed_misses
  size_t floor_misses = 0;  // requests whose floor exceeds the SLO
  size_t need = 0;          // summed over the most needing set of disjoint windows
  std::vector<WindowNeed> windows;  // that set
  bool ruled_out() const { return floor_misses + need > allowed; }
};
WorkBound work_bound(const MinimalWork& work, const CeilingOptions& o);

// Both conditions at `rate`.
WorkBound check_rate(const std::vector<SimRequest>& w, double rate, const mocker::EngineConfig& ec,
                     const CeilingOptions& o);

struct Ceiling {
  double rate = 0;       // the highest rate tried that no condition rules out (0: none down to x1/64)
  double ruled_out = 0;  // the lowest rate tried that one rules out (0: none up to x256)
  WorkBound at, beyond;  // the conditions there
};
// The boundary by the rate search goodput uses (bisect_rate, `steps` halvings
// of the bracket), assuming as goodput does that a rate ruled out rules out
// every higher one.
Ceiling find_ceiling(const std::vector<SimRequest>& w, const mocker::EngineConfig& ec, const CeilingOptions& o,
                     int steps);

}  // namespace kvroute::sim
