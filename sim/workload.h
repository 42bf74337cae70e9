// kvroute-sim workloads: the Mooncake trace and three generators the router
// was never tuned on. A request is Mooncake-shaped: arrival time, prompt and
// output lengths, and the ids of its 512-token prompt blocks (equal ids =
// equal content; a block's id depends on everything before it, as a prefix
// hash does), plus a session id (0 = none) for session affinity.
//
// Threading: plain functions and values; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvroute::sim {

constexpr uint32_t kBlock = 512;  // tokens per KV block in every workload

struct SimRequest {
  double t_ms = 0;
  uint32_t input_tokens = 1, output_tokens = 1;
  std::vector<uint64_t> ids;  // prompt block ids, first block first
  uint64_t session = 0;       // conversation id (0 = none)
  // Time since the session's first request (0 without a session): the tool
  // runs and the turns before this one. A rate multiplier compresses when
  // sessions start, not how long a tool runs (at_rate).
  double session_offset_ms = 0;
};

// The workload at arrival-rate multiplier `rate`, as every simulator run,
// floor and load figure takes it: request i arrives at
// (t_ms - session_offset_ms) / rate + session_offset_ms, so x2 starts sessions
// twice as often and keeps each session's tool pauses. Returned with t_ms
// scaled back by `rate` (t_ms / rate is the arrival, as for a workload
// without sessions) and sorted by it; `w` itself when no request has an
// offset (nothing moves), else a copy in `storage`.
const std::vector<SimRequest>& at_rate(const std::vector<SimRequest>& w, double rate,
                                       std::vector<SimRequest>& storage);

// The Mooncake trace (JSONL: timestamp ms, input_length, output_length,
// hash_ids); exits with a clear message on a bad line.
std::vector<SimRequest> load_trace(const std::string& path, size_t limit);

// Agentic sessions: agents with one of a few long tool-laden system prompts
// run sessions of 4-40 turns; each turn's prompt is the whole conversation so
// far, which grows by the model's output plus a tool result (0.3k-6k tokens);
// between turns a tool runs for seconds to minutes (log-normal, median 6 s,
// 1-300 s). Sessions start as a Poisson process.
std::vector<SimRequest> agentic_workload(uint64_t seed, size_t requests);
// API traffic: single-turn calls from tenants of Zipf(1.1) popularity; each
// tenant's calls share its system prompt (1k-16k tokens, a few few-shot
// variants) and add 50-3k tokens of their own. Poisson arrivals.
std::vector<SimRequest> api_workload(uint64_t seed, size_t requests);
// Bursts: API traffic at a low base rate plus batch jobs every ~20 s: 16-96
// requests within ~0.5 s that share one long document (8k-24k tokens) and
// differ in a short question.
std::vector<SimRequest> burst_workload(uint64_t seed, size_t requests);

// Named workloads: trace (the file), agentic, api, bursts. Exits on an unknown name.
std::vector<SimRequest> make_workload(const std::string& name, const std::string& trace_path, uint64_t seed,
                                      size_t limit);

// Time split: requests arriving before `fraction` of the span (train) and the
// rest (test), the test slice shifted to start at 0.
void time_split(const std::vector<SimRequest>& all, double fraction, std::vector<SimRequest>& train,
                std::vector<SimRequest>& test);

// The hit rate of one infinite cache over the same blocks (an upper bound).
double ideal_hit_rate(const std::vector<SimRequest>& w);

// The block of id h hashes as LocalBlockHash(mix(h)).
uint64_t mix(uint64_t x);

}  // namespace kvroute::sim
