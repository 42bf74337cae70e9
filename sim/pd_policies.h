// kvroute-sim's PD policies: for one request on a disaggregated fleet (a
// prefill pool and a decode pool, sim/pd_fleet.h), whether to disaggregate
// and on which engines. Each follows one router's source, as cited below
// (docs/design/pd-protocols.md §4 has the formulas with their commits), on the
// inputs a router has: the index's overlaps (fed by the engines' KV events),
// the scraped load reports and the router's own in-flight bookkeeping.
//
//   dynamo_pd   ai-dynamo/dynamo, prefill router + decode router + conditional
//               disaggregation (policy isl_bounding, its defaults):
//     prefill:  lib/kv-router/src/scheduling/selector/default.rs worker_logit,
//               lowest wins: prefill_load_scale(1.0) × max(0, raw prefill blocks −
//               overlap_score_credit(1.0) × overlap blocks) + decode blocks (0: the
//               prefill router does not track active blocks), raw prefill blocks =
//               (tracked in-flight prefill tokens + this prompt) / block
//     decode:   the same logit with the decode router's forced config
//               (derive_decode_router_config: overlap credit 0, no prefill
//               tracking): the worker's potential active blocks (load only)
//     disagg:   lib/kv-router/src/conditional_disagg.rs and
//               lib/llm/src/kv_router/prefill_router/conditional_bypass.rs: peek the
//               decode worker, eff_isl = prompt − its overlap blocks × block; run
//               aggregated there ⇔ eff_isl < 2048 and eff_isl / prompt < 0.7
//   llmd_pd     llm-d/llm-d-inference-scheduler, DisaggProfileHandler
//               (pkg/epp/framework/plugins/scheduling/profilehandler/disagg/):
//               the decode profile first (prefix-cache-scorer 2 + queue-scorer 1,
//               max-score picker, deploy/config/pd-epp-config.yaml), then
//               prefix_based_pd_decider.go on the chosen decode endpoint:
//               disaggregate ⇔ prompt ≥ nonCachedTokens and prompt − its cached
//               prefix ≥ nonCachedTokens (16 in pd-epp-config.yaml; the code's
//               default 0 disables disaggregation), then the prefill profile
//               (the same scorers over the prefill pool). Prompt lengths are tokens
//               here (llm-d estimates them as characters / 4).
//   kvroute_pd  the router's own decision, scheduler/pd_decision.h decide_pd()
//               on the production registry's candidates (sim/pd_fleet.cpp), with
//               the pd.* config keys (--set): not here.
//
// Threading: plain functions on values.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/load.h"
#include "mocker/profile.h"

namespace kvroute::sim {

// One engine as the router sees it when a request arrives.
struct PdEngineView {
  uint32_t overlap_blocks = 0;           // its cached prefix of the request (the index)
  uint32_t inflight_requests = 0;        // the router's: dispatched to it, not finished there
  uint64_t inflight_prefill_tokens = 0;  // the router's: uncached prompt tokens sent, first token not seen
  double dynamo_active_blocks = 0;       // Dynamo's potential active blocks with this request (ActiveSequences)
  WorkerLoad scraped;                    // the last load report
};

struct PdInput {
  uint32_t prompt_tokens = 1;
  uint32_t request_blocks = 0;  // complete prompt blocks
  uint32_t block_size = 512;
  std::vector<PdEngineView> prefill, decode;  // at least one of each
};

struct PdChoice {
  bool disaggregate = false;
  size_t prefill = 0;  // into PdInput::prefill (meaningful when disaggregate)
  size_t decode = 0;   // into PdInput::decode: the aggregated engine, or the decode leg's
};

// Time to move `tokens` tokens of KV at `gbps` gigabits per second, in ms.
double transfer_ms(uint64_t tokens, double kv_bytes_per_token, double gbps);

PdChoice pd_dynamo(const PdInput& in, std::mt19937_64& rng);
PdChoice pd_llmd(const PdInput& in, std::mt19937_64& rng, uint32_t non_cached_tokens = 16);

}  // namespace kvroute::sim
