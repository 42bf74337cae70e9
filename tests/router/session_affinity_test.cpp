#include "router/session_affinity.h"

#include <doctest/doctest.h>

using namespace kvroute;

namespace {

// A routed request over `n` workers, the scheduler having chosen `chosen`;
// worker i's predicted TTFT is ttft[i].
RouteResult routed(const std::vector<double>& ttft, size_t chosen) {
  RouteResult r;
  r.ok = true;
  r.isl_tokens = 1000;
  r.request_blocks = 63;
  for (size_t i = 0; i < ttft.size(); ++i) {
    auto info = std::make_shared<WorkerAnnouncement>();
    info->id = WorkerId{i + 1};
    info->url = "http://w" + std::to_string(i + 1);
    WorkerView v;
    v.info = info;
    r.workers.push_back(v);
    Candidate c;
    c.owner.worker = info->id;
    c.overlap_blocks = static_cast<uint32_t>(i * 10);
    r.candidates.push_back(c);
    WorkerScore s;
    s.predicted_ttft_ms = ttft[i];
    r.decision.scores.push_back(s);
  }
  r.decision.chosen = chosen;
  RouteTarget& t = r.ranked.emplace_back();
  t.worker = r.candidates[chosen].owner.worker;
  t.url = r.workers[chosen].info->url;
  t.prefill_tokens = 1000;
  return r;
}

}  // namespace

TEST_CASE("a session stays on its worker while that worker is not overloaded") {
  SessionAffinity s;
  auto first = routed({100, 100, 100}, 0);
  CHECK_FALSE(s.apply("conv-1", 16, first));
  CHECK(first.ranked.front().worker == WorkerId{1});
  // Next turn: the scheduler prefers worker 3; worker 1 is within 1.5x + 50 ms.
  auto second = routed({140, 100, 80}, 2);
  CHECK(s.apply("conv-1", 16, second));
  CHECK(second.ranked.front().worker == WorkerId{1});
  CHECK(second.ranked.front().url == "http://w1");
  CHECK(*second.decision.chosen == 0);
  CHECK(second.ranked.size() == 2);  // the scheduler's choice stays as the failover
  CHECK(second.ranked[1].worker == WorkerId{3});
  // Overloaded: 1.5 x 80 + 50 = 170 < 400 ms: the session moves to the scheduler's choice.
  auto third = routed({400, 100, 80}, 2);
  CHECK_FALSE(s.apply("conv-1", 16, third));
  CHECK(third.ranked.front().worker == WorkerId{3});
  // ... and stays there afterwards.
  auto fourth = routed({100, 100, 120}, 0);
  CHECK(s.apply("conv-1", 16, fourth));
  CHECK(fourth.ranked.front().worker == WorkerId{3});
  CHECK(fourth.ranked.front().cached_tokens == 320);  // 20 blocks of 16
}

TEST_CASE("an excluded worker, an empty session or a failed route are not kept") {
  SessionAffinity s;
  auto a = routed({100, 100}, 0);
  s.apply("c", 16, a);
  auto b = routed({100, 100}, 1);
  b.decision.scores[0].excluded = Exclusion::NoFreeSlot;
  CHECK_FALSE(s.apply("c", 16, b));
  CHECK(b.ranked.front().worker == WorkerId{2});
  auto c = routed({100, 100}, 1);
  CHECK_FALSE(s.apply("", 16, c));
  CHECK(s.size() == 1);
  RouteResult failed;
  CHECK_FALSE(s.apply("d", 16, failed));
  CHECK(s.size() == 1);
}

TEST_CASE("at most max_sessions sessions are remembered, least recently used dropped") {
  SessionAffinity s(2);
  for (const char* id : {"a", "b", "c"}) {
    auto r = routed({100, 100}, 0);
    s.apply(id, 16, r);
  }
  CHECK(s.size() == 2);
  // "a" was dropped: its next request follows the scheduler (worker 2).
  auto r = routed({100, 100}, 1);
  CHECK_FALSE(s.apply("a", 16, r));
  // "c" is remembered on worker 1.
  auto q = routed({100, 100}, 1);
  CHECK(s.apply("c", 16, q));
}
