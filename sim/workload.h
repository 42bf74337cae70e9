// kvroute-sim workloads: the Mooncake trace and generators the router
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
  // Time since the session's first request, or the start of the team of
  // sessions it belongs to (0 without a session): the tool pauses and turns
  // before this one. A rate multiplier compresses when
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

// Long-context agents (coding agents): sessions on one of a few 8k-16k-token
// system prompts with tool schemas, a task with the files read first (2k-8k
// tokens), then turns whose prompt is the whole conversation so far, growing
// by the answer (32-2000 tokens) and a tool result (0.5k-16k tokens: file
// contents, test logs) until it passes the session's target of 64k-120k
// tokens (never beyond kMaxContextTokens). The next turn arrives after the
// answer (kMsPerOutputToken a token) and a tool pause, log-uniform in
// [kMinToolPauseMs, kMaxToolPauseMs]. Sessions start as a Poisson process,
// 20 s apart on average.
std::vector<SimRequest> long_agent_workload(uint64_t seed, size_t requests);
// Teams of kMinTeam-kMaxTeam agents over one long shared context: the team's
// system prompt (4k-8k tokens) and one repository or document (24k-64k
// tokens), the same blocks for every agent of the team; each agent (its own
// session) adds its role and task (0.3k-2k tokens) and runs 4-20 turns of its
// own growing tail (answers, tool results of 0.3k-6k tokens, tool pauses as
// above), joining within 10 s of the team's start. Teams start as a Poisson
// process, 30 s apart on average; session_offset_ms counts from the team's start.
std::vector<SimRequest> team_workload(uint64_t seed, size_t requests);

inline constexpr double kMinToolPauseMs = 1000, kMaxToolPauseMs = 120000;
inline constexpr double kMsPerOutputToken = 20;  // an answer's time before its tool runs
inline constexpr uint32_t kMaxContextTokens = 131072;
inline constexpr uint32_t kMinTeam = 3, kMaxTeam = 8;

// Named workloads: trace (the file), agentic, api, bursts, long_agents, team. Exits on an unknown name.
std::vector<SimRequest> make_workload(const std::string& name, const std::string& trace_path, uint64_t seed,
                                      size_t limit);

// The seed of a generated workload's training draw: another draw of the same
// generator, so that what a tune fits on is never what the tables report
// (they use the seed itself). kvroute-sim's train slices (load_slice, pd-tune).
uint64_t train_seed(uint64_t seed);

// Time split: requests arriving before `fraction` of the span (train) and the
// rest (test), the test slice shifted to start at 0.
void time_split(const std::vector<SimRequest>& all, double fraction, std::vector<SimRequest>& train,
                std::vector<SimRequest>& test);

// The request's prefix identities (each full block's id chained with the
// ones before it) over its full blocks: what the simulator counts as hits.
std::vector<uint64_t> prefix_chains(const SimRequest& r);

// The hit rate of one infinite cache over the same blocks (an upper bound).
double ideal_hit_rate(const std::vector<SimRequest>& w);

// The block of id h hashes as LocalBlockHash(mix(h)).
uint64_t mix(uint64_t x);

}  // namespace kvroute::sim
