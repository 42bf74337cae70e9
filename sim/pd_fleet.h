// kvroute-sim's disaggregated fleets: x prefill engines and y decode engines
// (mocker/engine.h, one engine profile for both) in virtual time, routed by a
// PD policy (sim/pd_policies.h) on the production index (RadixIndexer fed by
// every engine's KV events), the engines' load reports every report_ms and
// the router's own in-flight bookkeeping.
//
// A request either runs aggregated on a decode engine, as on an aggregated
// fleet, or is disaggregated:
//   1. prefill leg: the prompt on the prefill engine with one output token
//      (its cached prefix there counts; its blocks stay cached there);
//   2. transfer: when the prefill's first token is out, the KV of the prompt
//      tokens the decode engine does not hold (its cached prefix, at that
//      moment, as the index sees it) moves over that engine's link:
//        transfer_ms = tokens × kv_bytes_per_token × 8 / (link_gbps × 1e9) × 1000
//      one transfer at a time per decode engine (FIFO on its ingress link);
//   3. decode leg: the request is queued on the decode engine with its KV
//      (Engine::add_request_hashed with kv_transferred): at admission its
//      prompt blocks are cached there (announced as stored), one step computes
//      the last prompt token and yields the first token, then it decodes.
// TTFT = the decode engine's first token − arrival (queue + prefill + transfer
// + queue and first step on the decode engine); inter-token latency from the
// decode engine's steps. The client never sees the prefill engine's token.
//
// Simplified (sim/README.md): the decode engine is chosen at arrival; the
// decode engine reserves no KV during the transfer (it allocates at
// admission); the prefill engine's blocks are unreferenced once its step ends
// (vLLM holds them until the pull); links are per decode engine with no
// shared fabric, no per-transfer setup time, no failures.
//
// Threading: simulate_pd() is self-contained; callers may run several at once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/pd_policies.h"
#include "sim/simulate.h"
#include "sim/workload.h"

namespace kvroute::sim {

struct PdOptions {
  SimOptions sim;           // the engines (profile, kv_blocks, max_seqs, budget), rate, report_ms, seed
  uint32_t prefill = 2, decode = 2;
  double link_gbps = 400;          // per decode engine (one 400 Gb/s NIC per GPU)
  double kv_bytes_per_token = 0;   // 0: the profile's (131,072 for h100-llama3-8b), else 131,072
  uint32_t llmd_non_cached_tokens = 16;  // llm-d's prefix-based PD decider (pd-epp-config.yaml)
};

// dynamo_pd, llmd_pd (sim/pd_policies.h), kvroute_pd (decide_pd, its pd.* keys from sim.sets).
const std::vector<std::string>& pd_policies();

struct PdResult {
  std::string policy;
  double ttft_p50 = 0, ttft_p99 = 0, itl_p50 = 0, itl_p99 = 0, e2e_p50 = 0, e2e_p99 = 0;
  size_t completed = 0, rejected = 0, disaggregated = 0;
  double hit_rate = 0;            // prompt tokens served from the computing engine's cache / prompt tokens
  double transfer_ms_mean = 0;    // per disaggregated request, link wait included
  double transferred_share = 0;   // KV tokens moved / prompt tokens of disaggregated requests
  std::vector<double> ttft_ms;    // every request's, in the order of their first tokens
};

double kv_bytes_per_token(const PdOptions& o);

// The generated workloads where disaggregation matters: API traffic
// (api_workload, sim/workload.h: Zipf tenants' system prompts of 1k-16k
// tokens plus 50-3k of their own) with its outputs redrawn and its arrivals
// spread (x1 loads an 8-engine fleet moderately):
//   long_prompt   outputs log-normal, median 40 tokens (8-256): prefill-heavy
//   long_output   outputs log-normal, median 900 tokens (200-4000): decode-heavy, arrivals 4x apart
// Exits on another name.
std::vector<SimRequest> pd_workload(const std::string& name, uint64_t seed, size_t requests);

PdResult simulate_pd(const std::vector<SimRequest>& w, const PdOptions& o, const std::string& policy);

}  // namespace kvroute::sim
