#include "sim/workload.h"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <unordered_set>

namespace kvroute::sim {

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

const std::vector<SimRequest>& at_rate(const std::vector<SimRequest>& w, double rate,
                                       std::vector<SimRequest>& storage) {
  if (rate == 1 || std::none_of(w.begin(), w.end(), [](const SimRequest& r) { return r.session_offset_ms != 0; }))
    return w;
  storage = w;
  for (auto& r : storage) r.t_ms += r.session_offset_ms * (rate - 1);  // (t - off) / rate + off, times rate
  std::stable_sort(storage.begin(), storage.end(),
                   [](const SimRequest& a, const SimRequest& b) { return a.t_ms < b.t_ms; });
  return storage;
}

std::vector<SimRequest> load_trace(const std::string& path, size_t limit) {
  std::vector<SimRequest> out;
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "kvroute-sim: cannot read --trace %s\n", path.c_str());
    std::exit(2);
  }
  simdjson::dom::parser parser;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line) && out.size() < limit) {
    ++lineno;
    auto doc = parser.parse(line);
    SimRequest r;
    uint64_t ts = 0, il = 0, ol = 0;
    simdjson::dom::array ids;
    if (doc.error() || doc["timestamp"].get_uint64().get(ts) || doc["input_length"].get_uint64().get(il) ||
        doc["output_length"].get_uint64().get(ol) || doc["hash_ids"].get_array().get(ids)) {
      std::fprintf(stderr, "kvroute-sim: %s:%zu: not a trace line (timestamp, input_length, output_length, hash_ids)\n",
                   path.c_str(), lineno);
      std::exit(2);
    }
    r.t_ms = static_cast<double>(ts);
    r.input_tokens = static_cast<uint32_t>(std::max<uint64_t>(il, 1));
    r.output_tokens = static_cast<uint32_t>(std::max<uint64_t>(ol, 1));
    for (auto v : ids) r.ids.push_back(v.get_uint64().value_unsafe());
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

// Ids of fresh content blocks: unique across a workload.
struct IdSource {
  uint64_t next = 1;
  std::vector<uint64_t> take(size_t n) {
    std::vector<uint64_t> v(n);
    for (auto& x : v) x = next++;
    return v;
  }
};

// Zipf(s) over ranks 0..n-1 by inversion of the cumulative weights.
class Zipf {
 public:
  Zipf(size_t n, double s) : cdf_(n) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i) cdf_[i] = sum += 1.0 / std::pow(double(i + 1), s);
    for (auto& c : cdf_) c /= sum;
  }
  size_t operator()(std::mt19937_64& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return std::min<size_t>(cdf_.size() - 1, std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
};

uint32_t uniform(std::mt19937_64& rng, uint32_t lo, uint32_t hi) {
  return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
}

// A request whose prompt is `prefix` (whole blocks of shared content)
// followed by `own` tokens of its own.
SimRequest request_on(double t, const std::vector<uint64_t>& prefix, uint32_t own, uint32_t output, IdSource& ids) {
  SimRequest r;
  r.t_ms = t;
  r.input_tokens = static_cast<uint32_t>(prefix.size()) * kBlock + std::max<uint32_t>(own, 1);
  r.output_tokens = std::max<uint32_t>(output, 1);
  r.ids = prefix;
  const auto mine = ids.take((own + kBlock - 1) / kBlock);
  r.ids.insert(r.ids.end(), mine.begin(), mine.end());
  return r;
}

struct Tenant {
  std::vector<std::vector<uint64_t>> variants;  // system prompt (+ few-shot) block ids
};

std::vector<Tenant> make_tenants(size_t n, std::mt19937_64& rng, IdSource& ids) {
  std::vector<Tenant> tenants(n);
  std::lognormal_distribution<double> sys_tokens(std::log(4000.0), 0.7);
  for (auto& t : tenants) {
    const auto base = ids.take(std::clamp<uint32_t>(static_cast<uint32_t>(sys_tokens(rng) / kBlock), 2, 32));
    const uint32_t n_var = uniform(rng, 1, 4);
    for (uint32_t v = 0; v < n_var; ++v) {
      auto p = base;
      const auto shots = ids.take(uniform(rng, 0, 4));  // few-shot examples of this variant
      p.insert(p.end(), shots.begin(), shots.end());
      t.variants.push_back(std::move(p));
    }
  }
  return tenants;
}

// One single-turn API call of a Zipf-chosen tenant at time t.
SimRequest api_call(double t, const std::vector<Tenant>& tenants, const Zipf& zipf, std::mt19937_64& rng,
                    IdSource& ids) {
  const auto& tenant = tenants[zipf(rng)];
  const auto& prefix = tenant.variants[uniform(rng, 0, static_cast<uint32_t>(tenant.variants.size() - 1))];
  std::lognormal_distribution<double> own(std::log(400.0), 1.0), out(std::log(180.0), 0.8);
  return request_on(t, prefix, std::clamp<uint32_t>(static_cast<uint32_t>(own(rng)), 50, 3000),
                    std::clamp<uint32_t>(static_cast<uint32_t>(out(rng)), 8, 1500), ids);
}

// One turn of a session: the complete blocks of the grown `tail` join `context` (fresh ids, kept for
// later turns), the prompt is the whole context and what is left of the tail, the answer is drawn from
// `output` clamped to [min_output, 2000] tokens. Empty when the prompt passes `max_context` tokens (the
// context window is full: the session ends). The answer is drawn either way, so the draws that follow do
// not depend on the cap.
std::optional<SimRequest> session_turn(std::vector<uint64_t>& context, uint32_t& tail, double t, double group_start,
                                       uint64_t session, uint32_t min_output, uint32_t max_context,
                                       std::lognormal_distribution<double>& output, std::mt19937_64& rng,
                                       IdSource& ids) {
  while (tail >= kBlock) {
    context.push_back(ids.take(1)[0]);
    tail -= kBlock;
  }
  SimRequest r;
  r.t_ms = t;
  r.input_tokens = static_cast<uint32_t>(context.size()) * kBlock + std::max<uint32_t>(tail, 1);
  r.output_tokens = std::clamp<uint32_t>(static_cast<uint32_t>(output(rng)), min_output, 2000);
  r.ids = context;
  r.session = session;
  r.session_offset_ms = t - group_start;
  if (r.input_tokens > max_context) return std::nullopt;
  return r;
}

void sort_by_time(std::vector<SimRequest>& w, size_t requests) {
  std::stable_sort(w.begin(), w.end(), [](const SimRequest& a, const SimRequest& b) { return a.t_ms < b.t_ms; });
  if (w.size() > requests) w.resize(requests);
}

}  // namespace

std::vector<SimRequest> agentic_workload(uint64_t seed, size_t requests) {
  std::mt19937_64 rng(mix(seed ^ 0xA6E27));
  IdSource ids;
  // A few agent kinds, each with a long system prompt and tool schemas.
  std::vector<std::vector<uint64_t>> agents;
  for (int a = 0; a < 6; ++a) agents.push_back(ids.take(uniform(rng, 6, 20)));
  std::exponential_distribution<double> session_gap(1.0 / 3000.0);  // ms between session starts
  std::lognormal_distribution<double> tool_wait(std::log(6000.0), 1.2);
  std::lognormal_distribution<double> tool_result(std::log(1200.0), 0.9), output(std::log(250.0), 0.7);
  std::vector<SimRequest> w;
  double start = 0;
  uint64_t session = 0;
  while (w.size() < requests + requests / 4) {
    start += session_gap(rng);
    ++session;
    const auto& sys = agents[uniform(rng, 0, static_cast<uint32_t>(agents.size() - 1))];
    // The conversation: system prompt, then the user's task, then turns.
    std::vector<uint64_t> context = sys;
    uint32_t tail = uniform(rng, 100, 1500);  // tokens beyond the last whole block of context
    double t = start;
    const uint32_t turns = uniform(rng, 4, 40);
    for (uint32_t k = 0; k < turns; ++k) {
      const auto turn = session_turn(context, tail, t, start, session, 16, 120000, output, rng, ids);
      if (!turn) break;  // the context window is full: the session ends
      const SimRequest& r = w.emplace_back(*turn);
      // Next turn: the prompt grows by this output and a tool result, after the tool ran.
      tail += r.output_tokens + std::clamp<uint32_t>(static_cast<uint32_t>(tool_result(rng)), 300, 6000);
      t += std::clamp(tool_wait(rng), 1000.0, 300000.0) + 2000.0;  // tool time plus the turn itself
    }
  }
  sort_by_time(w, requests);
  return w;
}

std::vector<SimRequest> api_workload(uint64_t seed, size_t requests) {
  std::mt19937_64 rng(mix(seed ^ 0xA91));
  IdSource ids;
  const auto tenants = make_tenants(400, rng, ids);
  const Zipf zipf(tenants.size(), 1.1);
  std::exponential_distribution<double> gap(1.0 / 45.0);  // ms between calls
  std::vector<SimRequest> w;
  double t = 0;
  while (w.size() < requests) w.push_back(api_call(t += gap(rng), tenants, zipf, rng, ids));
  return w;
}

std::vector<SimRequest> burst_workload(uint64_t seed, size_t requests) {
  std::mt19937_64 rng(mix(seed ^ 0xB0257));
  IdSource ids;
  const auto tenants = make_tenants(200, rng, ids);
  const Zipf zipf(tenants.size(), 1.1);
  std::exponential_distribution<double> gap(1.0 / 400.0), burst_gap(1.0 / 20000.0);
  std::lognormal_distribution<double> question(std::log(120.0), 0.6), answer(std::log(150.0), 0.7);
  std::vector<SimRequest> w;
  double t = 0, next_burst = burst_gap(rng);
  while (w.size() < requests + requests / 4) {
    t += gap(rng);
    w.push_back(api_call(t, tenants, zipf, rng, ids));
    while (next_burst < t) {
      const auto doc = ids.take(uniform(rng, 16, 48));  // 8k-24k tokens
      const uint32_t n = uniform(rng, 16, 96);
      for (uint32_t i = 0; i < n; ++i)
        w.push_back(request_on(next_burst + std::uniform_real_distribution<double>(0, 500)(rng), doc,
                               std::clamp<uint32_t>(static_cast<uint32_t>(question(rng)), 20, 800),
                               std::clamp<uint32_t>(static_cast<uint32_t>(answer(rng)), 8, 800), ids));
      next_burst += burst_gap(rng);
    }
  }
  sort_by_time(w, requests);
  return w;
}

namespace {

// A tool pause: log-uniform in [1 s, 120 s] (a file read, a test run, a build).
double tool_pause(std::mt19937_64& rng) {
  return std::exp(std::uniform_real_distribution<double>(std::log(kMinToolPauseMs), std::log(kMaxToolPauseMs))(rng));
}

// One agent's session on `context` (its blocks so far; `tail` tokens beyond
// them): turns until its prompt passes `target` tokens or `turns` turns are
// done (0 = no turn limit), from time `t`, the session's group having started
// at `group_start`. Each turn's prompt is the whole conversation; the next
// arrives after this turn's answer (kMsPerOutputToken a token) and a tool
// pause, and adds the answer and the tool's result.
void agent_session(std::vector<SimRequest>& w, std::vector<uint64_t> context, uint32_t tail, double t,
                   double group_start, uint64_t session, uint32_t target, uint32_t turns, uint32_t result_lo,
                   uint32_t result_hi, double result_median, std::mt19937_64& rng, IdSource& ids) {
  std::lognormal_distribution<double> result(std::log(result_median), 0.9), output(std::log(300.0), 0.8);
  for (uint32_t k = 0; turns == 0 || k < turns; ++k) {
    const auto turn = session_turn(context, tail, t, group_start, session, 32, kMaxContextTokens, output, rng, ids);
    if (!turn) return;  // the context window is full
    const SimRequest& r = w.emplace_back(*turn);
    if (r.input_tokens > target) return;  // the task is done
    tail += r.output_tokens + std::clamp<uint32_t>(static_cast<uint32_t>(result(rng)), result_lo, result_hi);
    t += r.output_tokens * kMsPerOutputToken + tool_pause(rng);
  }
}

}  // namespace

std::vector<SimRequest> long_agent_workload(uint64_t seed, size_t requests) {
  std::mt19937_64 rng(mix(seed ^ 0x10A6E));
  IdSource ids;
  // Coding agents: a few long system prompts with tool schemas (8k-16k tokens).
  std::vector<std::vector<uint64_t>> agents;
  for (int a = 0; a < 4; ++a) agents.push_back(ids.take(uniform(rng, 16, 32)));
  std::exponential_distribution<double> session_gap(1.0 / 20000.0);  // ms between session starts
  std::vector<SimRequest> w;
  double start = 0;
  uint64_t session = 0;
  while (w.size() < requests + requests / 4) {
    start += session_gap(rng);
    const auto& sys = agents[uniform(rng, 0, static_cast<uint32_t>(agents.size() - 1))];
    // The task and the files read first (2k-8k tokens); the session runs until its context passes
    // its target, 64k-120k tokens, with tool results (file contents, test logs) of 0.5k-16k tokens.
    agent_session(w, sys, uniform(rng, 2000, 8000), start, start, ++session, uniform(rng, 65536, 120000), 0, 500,
                  16000, 3000, rng, ids);
  }
  sort_by_time(w, requests);
  return w;
}

std::vector<SimRequest> team_workload(uint64_t seed, size_t requests) {
  std::mt19937_64 rng(mix(seed ^ 0x7EA3));
  IdSource ids;
  std::vector<std::vector<uint64_t>> kinds;  // the team's system prompt (4k-8k tokens)
  for (int a = 0; a < 4; ++a) kinds.push_back(ids.take(uniform(rng, 8, 16)));
  std::exponential_distribution<double> team_gap(1.0 / 30000.0);  // ms between team starts
  std::vector<SimRequest> w;
  double start = 0;
  uint64_t session = 0;
  while (w.size() < requests + requests / 4) {
    start += team_gap(rng);
    // The shared context: the team's system prompt, then one repository or document (24k-64k tokens).
    auto shared = kinds[uniform(rng, 0, static_cast<uint32_t>(kinds.size() - 1))];
    const auto repo = ids.take(uniform(rng, 48, 128));
    shared.insert(shared.end(), repo.begin(), repo.end());
    const uint32_t agents = uniform(rng, kMinTeam, kMaxTeam);
    for (uint32_t i = 0; i < agents; ++i) {
      // Each agent: its role and task (0.3k-2k tokens of its own), joining within 10 s of the team's
      // start, then 4-20 turns of its own tail (tool results 0.3k-6k tokens).
      const double join = start + std::uniform_real_distribution<double>(0, 10000)(rng);
      agent_session(w, shared, uniform(rng, 300, 2000), join, start, ++session, kMaxContextTokens,
                    uniform(rng, 4, 20), 300, 6000, 1200, rng, ids);
    }
  }
  sort_by_time(w, requests);
  return w;
}

std::vector<SimRequest> make_workload(const std::string& name, const std::string& trace_path, uint64_t seed,
                                      size_t limit) {
  const size_t n = limit == SIZE_MAX ? 12000 : limit;
  if (name == "trace") return load_trace(trace_path, limit);
  if (name == "agentic") return agentic_workload(seed, n);
  if (name == "api") return api_workload(seed, n);
  if (name == "bursts") return burst_workload(seed, n);
  if (name == "long_agents") return long_agent_workload(seed, n);
  if (name == "team") return team_workload(seed, n);
  std::fprintf(stderr, "kvroute-sim: unknown --workload '%s' (trace, agentic, api, bursts, long_agents, team)\n",
               name.c_str());
  std::exit(2);
}

uint64_t train_seed(uint64_t seed) { return mix(seed ^ 0x7EA1u); }

void time_split(const std::vector<SimRequest>& all, double fraction, std::vector<SimRequest>& train,
                std::vector<SimRequest>& test) {
  train.clear();
  test.clear();
  if (all.empty()) return;
  const double t0 = all.front().t_ms, cut = t0 + (all.back().t_ms - t0) * fraction;
  for (const auto& r : all) (r.t_ms < cut ? train : test).push_back(r);
  if (test.empty()) return;
  const double base = test.front().t_ms;
  for (auto& r : test) r.t_ms -= base;
}

std::vector<uint64_t> prefix_chains(const SimRequest& r) {
  const uint32_t full = std::min<uint32_t>(static_cast<uint32_t>(r.ids.size()), r.input_tokens / kBlock);
  std::vector<uint64_t> c(full);
  uint64_t chain = 0;
  for (uint32_t i = 0; i < full; ++i) c[i] = chain = mix(chain ^ mix(r.ids[i]));
  return c;
}

double ideal_hit_rate(const std::vector<SimRequest>& w) {
  std::unordered_set<uint64_t> seen;  // prefix identities
  uint64_t total = 0, hits = 0;
  for (const auto& r : w)
    for (uint64_t c : prefix_chains(r)) {
      ++total;
      hits += !seen.insert(c).second;
    }
  return total ? double(hits) / double(total) : 0;
}

}  // namespace kvroute::sim
