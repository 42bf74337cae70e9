// kvroute-sim's generated workloads (sim/workload.h) have the shapes their
// descriptions promise.
#include "sim/workload.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>

using namespace kvroute::sim;

TEST_CASE("agentic: a session's prompt grows, each turn extending the previous one, after a tool wait") {
  const auto w = agentic_workload(1, 3000);
  REQUIRE(w.size() == 3000);
  CHECK(std::is_sorted(w.begin(), w.end(), [](const SimRequest& a, const SimRequest& b) { return a.t_ms < b.t_ms; }));
  std::map<uint64_t, const SimRequest*> last;
  size_t turns = 0;
  for (const auto& r : w) {
    REQUIRE(r.session != 0);
    if (auto it = last.find(r.session); it != last.end()) {
      const SimRequest& prev = *it->second;
      CHECK(r.input_tokens > prev.input_tokens + prev.output_tokens);  // output + a tool result
      CHECK(r.t_ms - prev.t_ms >= 1000);                               // the tool ran at least a second
      REQUIRE(r.ids.size() >= prev.ids.size());
      CHECK(std::equal(prev.ids.begin(), prev.ids.end(), r.ids.begin()));  // the same prefix
      ++turns;
    }
    last[r.session] = &r;
  }
  CHECK(turns > 2000);  // mostly follow-up turns
  CHECK(ideal_hit_rate(w) > 0.8);
}

TEST_CASE("api: single-turn calls share per-tenant system prompts with Zipf popularity") {
  const auto w = api_workload(1, 5000);
  std::map<uint64_t, size_t> first_block;  // system prompt's first block -> calls
  for (const auto& r : w) {
    CHECK(r.session == 0);
    REQUIRE(!r.ids.empty());
    ++first_block[r.ids.front()];
  }
  std::vector<size_t> counts;
  for (const auto& [b, n] : first_block) counts.push_back(n);
  std::sort(counts.rbegin(), counts.rend());
  REQUIRE(counts.size() > 50);                   // many tenants
  CHECK(counts[0] > 5 * counts[counts.size() / 2]);  // a few are much more popular
}

TEST_CASE("bursts: many requests sharing a long document within half a second") {
  const auto w = burst_workload(1, 4000);
  std::map<uint64_t, std::vector<double>> by_prefix;
  for (const auto& r : w)
    if (r.ids.size() >= 16) by_prefix[r.ids.front()].push_back(r.t_ms);
  size_t bursts = 0;
  for (const auto& [b, t] : by_prefix)
    if (t.size() >= 16 && *std::max_element(t.begin(), t.end()) - *std::min_element(t.begin(), t.end()) <= 500) ++bursts;
  CHECK(bursts >= 3);
}

TEST_CASE("the time split is disjoint, complete, and the test slice starts at 0") {
  const auto w = api_workload(2, 1000);
  std::vector<SimRequest> train, test;
  time_split(w, 0.5, train, test);
  CHECK(train.size() + test.size() == w.size());
  REQUIRE(!train.empty());
  REQUIRE(!test.empty());
  CHECK(test.front().t_ms == 0);
  CHECK(train.back().t_ms < w[train.size()].t_ms);
}

TEST_CASE("the same seed gives the same workload") {
  const auto a = agentic_workload(5, 500), b = agentic_workload(5, 500), c = agentic_workload(6, 500);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].t_ms == b[i].t_ms);
    CHECK(a[i].ids == b[i].ids);
  }
  CHECK(a[0].t_ms != c[0].t_ms);
}

namespace {

// Per session, its requests in order.
std::map<uint64_t, std::vector<const SimRequest*>> by_session(const std::vector<SimRequest>& w) {
  std::map<uint64_t, std::vector<const SimRequest*>> s;
  for (const auto& r : w) s[r.session].push_back(&r);
  return s;
}

// Each turn's prompt extends the previous one's blocks, and arrives after the
// previous answer and a tool pause within [1 s, 120 s].
void check_turns(const std::vector<const SimRequest*>& turns) {
  for (size_t i = 1; i < turns.size(); ++i) {
    const SimRequest& prev = *turns[i - 1];
    const SimRequest& r = *turns[i];
    REQUIRE(r.ids.size() >= prev.ids.size());
    CHECK(std::equal(prev.ids.begin(), prev.ids.end(), r.ids.begin()));
    CHECK(r.input_tokens > prev.input_tokens + prev.output_tokens);
    const double pause = (r.t_ms - prev.t_ms) - prev.output_tokens * kMsPerOutputToken;
    CHECK(pause >= kMinToolPauseMs - 1e-6);
    CHECK(pause <= kMaxToolPauseMs + 1e-6);
    CHECK(r.session_offset_ms - prev.session_offset_ms == doctest::Approx(r.t_ms - prev.t_ms));
  }
}

}  // namespace

TEST_CASE("long_agents: contexts grow past 64k tokens, with tool pauses of 1-120 s between turns") {
  const auto w = long_agent_workload(1, 6000);
  REQUIRE(w.size() == 6000);
  CHECK(std::is_sorted(w.begin(), w.end(), [](const SimRequest& a, const SimRequest& b) { return a.t_ms < b.t_ms; }));
  size_t ended = 0, pauses = 0;
  double shortest = 1e300, longest = 0;
  for (const auto& [session, turns] : by_session(w)) {
    REQUIRE(session != 0);
    CHECK(turns.front()->session_offset_ms == 0);
    check_turns(turns);
    for (size_t i = 1; i < turns.size(); ++i) {
      const double pause = (turns[i]->t_ms - turns[i - 1]->t_ms) - turns[i - 1]->output_tokens * kMsPerOutputToken;
      shortest = std::min(shortest, pause), longest = std::max(longest, pause), ++pauses;
    }
    for (const auto* r : turns) CHECK(r->input_tokens <= kMaxContextTokens);
    // A session whose next turn would have come before the workload's end has
    // ended: its context passed 64k tokens.
    const SimRequest& last = *turns.back();
    if (last.t_ms + last.output_tokens * kMsPerOutputToken + kMaxToolPauseMs < w.back().t_ms) {
      CHECK(last.input_tokens > 65536);
      ++ended;
    }
  }
  CHECK(ended > 50);
  CHECK(pauses > 4000);
  CHECK(shortest < 2000);   // the pauses span their range
  CHECK(longest > 100000);
}

TEST_CASE("team: several agents share one long context, each with its own growing tail") {
  const auto w = team_workload(1, 6000);
  REQUIRE(w.size() == 6000);
  const auto sessions = by_session(w);
  // Teammates: sessions whose first prompts share at least 24k tokens of blocks.
  std::map<std::vector<uint64_t>, std::vector<uint64_t>> teams;  // shared prefix -> sessions
  std::map<uint64_t, const SimRequest*> first;
  for (const auto& [session, turns] : sessions) {
    check_turns(turns);
    first[session] = turns.front();
  }
  size_t teamed = 0, whole_teams = 0;
  for (const auto& [session, r] : first) {
    // Its team: the sessions whose first prompt has the same 56 first blocks (system prompt and repository).
    size_t mates = 0;
    for (const auto& [other, o] : first) {
      if (other == session) continue;
      size_t common = 0;
      while (common < r->ids.size() && common < o->ids.size() && r->ids[common] == o->ids[common]) ++common;
      if (common >= 56) {
        ++mates;
        // The shared context ends where their own tails begin: the next blocks differ.
        if (common < r->ids.size() && common < o->ids.size()) CHECK(r->ids[common] != o->ids[common]);
        CHECK(std::abs(r->t_ms - o->t_ms) <= 10000);  // joined within 10 s of the team's start
      }
    }
    teamed += mates > 0;
    if (mates == 0) CHECK(r->t_ms > w.back().t_ms - 10000);  // its teammates would join after the cut
    whole_teams += mates + 1 >= kMinTeam && mates + 1 <= kMaxTeam;
  }
  // Sessions cut at the workload's edges may have fewer teammates in it.
  CHECK(teamed + 3 >= first.size());
  CHECK(whole_teams >= first.size() * 9 / 10);
  CHECK(ideal_hit_rate(w) > 0.85);
}

TEST_CASE("the named workloads include the long-context agents and the teams") {
  CHECK(make_workload("long_agents", "", 3, 100).size() == 100);
  CHECK(make_workload("team", "", 3, 100).size() == 100);
}
