// router/flow/flow_queue.h: order by band, weighted fairness among tenants,
// the bounds (count, bytes, per band) and whom they shed, and the wake-ups
// (a trial per event, chained after an admission). No clock, no sleeps: a
// waiter's wake() records what it was told.
#include "router/flow/flow_queue.h"

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

using namespace kvroute::flow;

namespace {

// Waiters whose wake() records the calls, and helpers to play the HTTP
// side's part (a Try is answered with trial_done()).
struct Harness {
  FlowQueue q;
  QueueLimits limits{.max_count = 100, .max_bytes = 0, .band_max = {}};
  std::vector<std::pair<std::string, Wake>> log;  // (name, wake) in call order
  std::map<std::string, std::shared_ptr<Waiter>> by_name;

  std::shared_ptr<Waiter> make(const std::string& name, uint32_t band, uint32_t tenant = 0, uint32_t weight = 1,
                               uint64_t bytes = 0, const std::string& model = "m") {
    auto w = std::make_shared<Waiter>();
    w->model = model;
    w->band = band;
    w->tenant = tenant;
    w->weight = weight;
    w->bytes = bytes;
    w->wake = [this, name](Wake k) { log.emplace_back(name, k); };
    by_name[name] = w;
    return w;
  }
  Enter add(const std::string& name, uint32_t band, uint32_t tenant = 0, uint32_t weight = 1, uint64_t bytes = 0,
            const std::string& model = "m") {
    return q.enter(make(name, band, tenant, weight, bytes, model), limits);
  }
  // The name of the waiter offered the last Try.
  std::string last_try() const {
    for (auto it = log.rbegin(); it != log.rend(); ++it)
      if (it->second == Wake::Try) return it->first;
    return "";
  }
  // Frees `slots` slots one event at a time and returns who got them, in
  // order: each Try is admitted while slots remain.
  std::vector<std::string> admit(int slots) {
    std::vector<std::string> order;
    for (int i = 0; i < slots; ++i) {
      const size_t before = log.size();
      q.notify();
      if (log.size() == before) break;
      const std::string name = last_try();
      order.push_back(name);
      // The admission chains to the next head; leave that trial unanswered
      // by failing it (no slot for it in this step).
      const size_t mark = log.size();
      q.trial_done(*by_name[name], true);
      if (log.size() > mark) q.trial_done(*by_name[last_try()], false);
    }
    return order;
  }
};

}  // namespace

TEST_CASE("flow queue: a higher band is offered a freed slot first; FIFO within a band") {
  Harness h;
  REQUIRE(h.add("low1", 1) == Enter::Queued);
  REQUIRE(h.add("high1", 0) == Enter::Queued);
  REQUIRE(h.add("low2", 1) == Enter::Queued);
  REQUIRE(h.add("high2", 0) == Enter::Queued);
  CHECK(h.admit(4) == std::vector<std::string>{"high1", "high2", "low1", "low2"});
  CHECK(h.q.empty());
}

TEST_CASE("flow queue: tenants of one band share freed slots by weight") {
  Harness h;
  // Tenant 0 (weight 3) and tenant 1 (weight 1), each with plenty waiting.
  for (int i = 0; i < 40; ++i) {
    REQUIRE(h.add("a" + std::to_string(i), 0, 0, 3) == Enter::Queued);
    REQUIRE(h.add("b" + std::to_string(i), 0, 1, 1) == Enter::Queued);
  }
  const auto order = h.admit(40);
  REQUIRE(order.size() == 40);
  int a = 0;
  for (const auto& n : order) a += n[0] == 'a';
  CHECK(a == 30);  // 3:1
  // FIFO within each tenant.
  int next_a = 0, next_b = 0;
  for (const auto& n : order) {
    if (n[0] == 'a') CHECK(n == "a" + std::to_string(next_a++));
    else CHECK(n == "b" + std::to_string(next_b++));
  }
}

TEST_CASE("flow queue: a tenant that was idle does not bank credit") {
  Harness h;
  for (int i = 0; i < 10; ++i) REQUIRE(h.add("a" + std::to_string(i), 0, 0) == Enter::Queued);
  REQUIRE(h.admit(6).size() == 6);  // tenant 0 alone: its virtual time runs ahead
  for (int i = 0; i < 10; ++i) REQUIRE(h.add("b" + std::to_string(i), 0, 1) == Enter::Queued);
  // From now on both alternate instead of tenant 1 taking six in a row.
  const auto order = h.admit(6);
  int b = 0;
  for (const auto& n : order) b += n[0] == 'b';
  CHECK(b == 3);
}

TEST_CASE("flow queue: one trial per model; an event during a trial is not lost") {
  Harness h;
  REQUIRE(h.add("x", 0) == Enter::Queued);
  REQUIRE(h.add("y", 0) == Enter::Queued);
  h.q.notify();
  REQUIRE(h.log.size() == 1);
  CHECK(h.log[0] == std::pair<std::string, Wake>{"x", Wake::Try});
  h.q.notify();  // during x's trial: noted, nobody else woken
  CHECK(h.log.size() == 1);
  h.q.trial_done(*h.by_name["x"], false);  // x still busy: the noted event tries again (x is still the head)
  REQUIRE(h.log.size() == 2);
  CHECK(h.log[1].first == "x");
  h.q.trial_done(*h.by_name["x"], false);  // no event meanwhile: the chain ends
  CHECK(h.log.size() == 2);
}

TEST_CASE("flow queue: an admission chains to the next head; models are independent") {
  Harness h;
  REQUIRE(h.add("m1", 0, 0, 1, 0, "m") == Enter::Queued);
  REQUIRE(h.add("m2", 0, 0, 1, 0, "m") == Enter::Queued);
  REQUIRE(h.add("n1", 0, 0, 1, 0, "n") == Enter::Queued);
  h.q.notify("m");
  REQUIRE(h.log.size() == 1);
  h.q.trial_done(*h.by_name["m1"], true);
  REQUIRE(h.log.size() == 2);
  CHECK(h.log[1] == std::pair<std::string, Wake>{"m2", Wake::Try});  // chained, not n1
  h.q.notify();  // n has no trial yet: n1 gets one; m's trial is in progress
  REQUIRE(h.log.size() == 3);
  CHECK(h.log[2].first == "n1");
}

TEST_CASE("flow queue: leaving during a trial passes a pending event to the next head") {
  Harness h;
  REQUIRE(h.add("x", 0) == Enter::Queued);
  REQUIRE(h.add("y", 0) == Enter::Queued);
  h.q.notify();
  h.q.notify();  // noted during x's trial
  CHECK(h.q.leave(*h.by_name["x"]));  // x's deadline
  REQUIRE(h.log.size() == 2);
  CHECK(h.log[1] == std::pair<std::string, Wake>{"y", Wake::Try});
  CHECK_FALSE(h.q.leave(*h.by_name["x"]));  // already gone
}

TEST_CASE("flow queue: full, a newcomer sheds the newest waiter of the lowest band; else it is refused") {
  Harness h;
  h.limits.max_count = 3;
  REQUIRE(h.add("low1", 1) == Enter::Queued);
  REQUIRE(h.add("low2", 1) == Enter::Queued);
  REQUIRE(h.add("high1", 0) == Enter::Queued);
  CHECK(h.add("low3", 1) == Enter::Full);  // nobody below it
  CHECK(h.log.empty());
  REQUIRE(h.add("high2", 0) == Enter::Queued);
  REQUIRE(h.log.size() == 1);
  CHECK(h.log[0] == std::pair<std::string, Wake>{"low2", Wake::Shed});
  CHECK_FALSE(h.q.leave(*h.by_name["low2"]));  // the queue already removed it
  REQUIRE(h.add("high3", 0) == Enter::Queued);  // sheds low1
  CHECK(h.log.back() == std::pair<std::string, Wake>{"low1", Wake::Shed});
  CHECK(h.add("high4", 0) == Enter::Full);  // only its own band left, one tenant
  CHECK(h.q.snapshot().count == 3);
}

TEST_CASE("flow queue: within a band, a tenant over its weighted share gives way to one under it") {
  Harness h;
  h.limits.max_count = 10;
  // The big tenant (0, weight 1) fills the queue.
  for (int i = 0; i < 10; ++i) REQUIRE(h.add("big" + std::to_string(i), 0, 0, 1) == Enter::Queued);
  // The small tenant (1, weight 1) still gets in, up to its share (5 of 10).
  for (int i = 0; i < 5; ++i) REQUIRE(h.add("small" + std::to_string(i), 0, 1, 1) == Enter::Queued);
  CHECK(h.add("small5", 0, 1, 1) == Enter::Full);  // would put it over the big tenant's share
  CHECK(h.add("big10", 0, 0, 1) == Enter::Full);   // the big tenant never sheds itself
  const auto snap = h.q.snapshot();
  CHECK(snap.by_tenant.at(0) == 5);
  CHECK(snap.by_tenant.at(1) == 5);
  // The newest of the big tenant went first.
  CHECK(h.log.front() == std::pair<std::string, Wake>{"big9", Wake::Shed});
}

TEST_CASE("flow queue: the byte bound and the per-band bound") {
  Harness h;
  h.limits.max_bytes = 1000;
  REQUIRE(h.add("a", 1, 0, 1, 600) == Enter::Queued);
  CHECK(h.add("b", 1, 0, 1, 600) == Enter::Full);      // same band, same tenant
  CHECK(h.add("huge", 0, 0, 1, 2000) == Enter::Full);  // larger than the whole bound: sheds nobody
  CHECK(h.log.empty());
  REQUIRE(h.add("c", 0, 0, 1, 600) == Enter::Queued);  // a higher band sheds a
  CHECK(h.log.back() == std::pair<std::string, Wake>{"a", Wake::Shed});
  CHECK(h.q.snapshot().bytes == 600);

  Harness g;
  g.limits.band_max = {0, 2};  // band 1 holds at most 2
  REQUIRE(g.add("l1", 1) == Enter::Queued);
  REQUIRE(g.add("l2", 1) == Enter::Queued);
  CHECK(g.add("l3", 1) == Enter::Full);
  REQUIRE(g.add("h1", 0) == Enter::Queued);  // band 0 is not bounded by band 1's bound
  CHECK(g.log.empty());
}

TEST_CASE("flow queue: stop wakes every waiter and refuses newcomers") {
  Harness h;
  REQUIRE(h.add("x", 0) == Enter::Queued);
  REQUIRE(h.add("y", 1) == Enter::Queued);
  h.q.stop_all();
  CHECK(h.log.size() == 2);
  for (const auto& [name, wake] : h.log) CHECK(wake == Wake::Stop);
  CHECK(h.add("z", 0) == Enter::Full);
  CHECK(h.q.empty());
}

// A waiter whose trial another thread takes (take() returns true, as the
// HTTP side's Handover does on the io thread that freed a slot): its wake()
// is not called for that trial, and it stays in the queue, unshed and
// unstopped, until handover_done() reports the outcome.
TEST_CASE("flow queue: a trial handed over to the freeing thread; the waiter keeps its place until the outcome") {
  Harness h;
  h.limits.max_count = 2;
  auto x = h.make("x", 1);
  int taken = 0;
  x->take = [&taken] { return ++taken, true; };
  REQUIRE(h.q.enter(x, h.limits) == Enter::Queued);
  REQUIRE(h.add("y", 1) == Enter::Queued);
  h.q.notify();
  CHECK(taken == 1);
  CHECK(h.log.empty());  // no wake-up: the freeing thread runs the trial
  CHECK(x->state == Waiter::State::Handed);
  h.q.notify();  // noted: one trial per model
  CHECK(taken == 1);
  // A higher band arriving at a full queue sheds y, never x (its trial runs).
  REQUIRE(h.add("hi", 0) == Enter::Queued);
  CHECK(h.log == std::vector<std::pair<std::string, Wake>>{{"y", Wake::Shed}});
  CHECK(h.add("hi2", 0) == Enter::Full);
  // The trial routed x: it is told so, leaves, and the next head (the event
  // noted meanwhile, or the chain) gets a trial.
  CHECK(h.q.handover_done(*x, true) == Wake::Admitted);
  CHECK(h.log.back() == std::pair<std::string, Wake>{"hi", Wake::Try});
  CHECK(h.q.snapshot().count == 1);
}

TEST_CASE("flow queue: a waiter that gives up or is stopped during a handed-over trial is told when it ends") {
  Harness h;
  auto x = h.make("x", 0);
  x->take = [] { return true; };
  REQUIRE(h.q.enter(x, h.limits) == Enter::Queued);
  REQUIRE(h.add("y", 0) == Enter::Queued);
  h.q.notify();
  REQUIRE(x->state == Waiter::State::Handed);
  // Its deadline: it may not leave yet (the other thread is routing it).
  CHECK_FALSE(h.q.leave(*x));
  CHECK(h.q.snapshot().count == 2);
  h.q.notify();  // an event during the trial
  // The trial failed: it leaves now, and the event goes to y.
  CHECK(h.q.handover_done(*x, false) == Wake::Left);
  CHECK(h.q.snapshot().count == 1);
  CHECK(h.log.back() == std::pair<std::string, Wake>{"y", Wake::Try});
  h.q.trial_done(*h.by_name["y"], false);

  // A failed trial of a waiter that did not give up: it keeps its place, told nothing.
  auto z = h.make("z", 0);
  z->take = [] { return true; };
  REQUIRE(h.q.enter(z, h.limits) == Enter::Queued);
  h.q.notify();  // y is the head
  h.q.trial_done(*h.by_name["y"], true);  // admitted: chains to z, taken
  REQUIRE(z->state == Waiter::State::Handed);
  const size_t before = h.log.size();
  CHECK_FALSE(h.q.handover_done(*z, false).has_value());
  CHECK(z->state == Waiter::State::Queued);
  CHECK(h.log.size() == before);

  // Stopped during its trial: stop_all() does not wake it (its coroutine
  // must not leave while another thread writes its route); the outcome does.
  h.q.notify();
  REQUIRE(z->state == Waiter::State::Handed);
  h.q.stop_all();
  CHECK(h.log.size() == before);
  CHECK_FALSE(h.q.empty());
  CHECK(h.q.handover_done(*z, false) == Wake::Stop);
  CHECK(h.q.empty());
}

TEST_CASE("oldest entry: the earliest entry time among the waiters a request of a band would wait behind") {
  Harness h;
  CHECK_FALSE(h.q.oldest_entry("m", 1).has_value());
  // The caller's clock: entries 50 (normal, tenant 0), 20 (normal, tenant 1),
  // 70 (high), 10 (another model).
  const auto add_at = [&](const std::string& name, uint32_t band, uint32_t tenant, int64_t at,
                          const std::string& model = "m") {
    auto w = h.make(name, band, tenant, 1, 0, model);
    w->entered = at;
    REQUIRE(h.q.enter(w, h.limits) == Enter::Queued);
  };
  add_at("n0", 1, 0, 50);
  add_at("n1", 1, 1, 20);
  add_at("h", 0, 0, 70);
  add_at("other", 1, 0, 10, "other-model");
  CHECK(h.q.oldest_entry("m", 1) == 20);  // every band of m
  CHECK(h.q.oldest_entry("m", 0) == 70);  // the high band only
  CHECK(h.q.oldest_entry("other-model", 1) == 10);
  CHECK_FALSE(h.q.oldest_entry("none", 1).has_value());
  // The oldest leaves: the next one is reported.
  CHECK(h.q.leave(*h.by_name["n1"]));
  CHECK(h.q.oldest_entry("m", 1) == 50);
}
