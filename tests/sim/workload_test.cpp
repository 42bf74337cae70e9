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
