#include "scheduler/worker_registry.h"

#include <doctest/doctest.h>

using namespace kvroute;
using namespace std::chrono_literals;

namespace {
WorkerAnnouncement ann(uint64_t id, std::string model = "m", uint32_t active = 0) {
  WorkerAnnouncement a;
  a.id = WorkerId{id};
  a.url = "http://127.0.0.1:" + std::to_string(9000 + id);
  a.model = std::move(model);
  a.load.request_active_slots = active;
  a.load.request_total_slots = 10;
  a.load.kv_total_blocks = 100;
  return a;
}
}  // namespace

TEST_CASE("heartbeats register workers; silent ones expire after the ttl") {
  ManualClock clock;
  WorkerRegistry r(clock);
  CHECK(r.on_heartbeat(ann(1)));
  CHECK_FALSE(r.on_heartbeat(ann(1)));
  clock.advance(1s);
  r.on_heartbeat(ann(2, "other"));
  CHECK(r.candidates("m").size() == 1);
  CHECK(r.candidates("").size() == 2);
  CHECK(r.models() == std::vector<std::string>{"m", "other"});

  clock.advance(1500ms);  // worker 1 silent 2.5 s, worker 2 1.5 s
  auto dead = r.expire(2s);
  REQUIRE(dead.size() == 1);
  CHECK(dead[0] == WorkerId{1});
  CHECK(r.candidates("m").empty());
}

TEST_CASE("workers seen only in events are not routable but are expired") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.touch(WorkerId{5});
  CHECK(r.candidates("").empty());
  CHECK(r.size() == 1);
  clock.advance(3s);
  CHECK(r.expire(2s) == std::vector<WorkerId>{WorkerId{5}});
}

TEST_CASE("in-flight requests raise predicted load until released") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 1));
  {
    InflightGuard a(r, WorkerId{1}, 7, 100);
    InflightGuard b(r, WorkerId{1}, 3, 40);
    auto v = r.candidates("m").at(0);
    CHECK(v.inflight_requests == 2);
    CHECK(v.predicted.request_active_slots == 2);  // max(reported 1, own 2)
    CHECK(v.predicted.kv_active_blocks == 10);
    CHECK(v.pending_prefill_tokens == 140);
    a.first_byte();  // prefill of `a` is over; its blocks stay
    v = r.candidates("m").at(0);
    CHECK(v.pending_prefill_tokens == 40);
    CHECK(v.predicted.kv_active_blocks == 10);
  }
  auto v = r.candidates("m").at(0);
  CHECK(v.inflight_requests == 0);
  CHECK(v.predicted.request_active_slots == 1);
  CHECK(v.predicted.kv_active_blocks == 0);
  CHECK(v.pending_prefill_tokens == 0);
  // Releasing after the worker expired is harmless.
  InflightGuard g(r, WorkerId{1}, 4, 4);
  clock.advance(10s);
  r.expire(1s);
  g.release();
  CHECK(r.size() == 0);
}

TEST_CASE("draining survives heartbeats and is reported") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1));
  CHECK(r.set_draining(WorkerId{1}, true));
  r.on_heartbeat(ann(1));
  CHECK(r.candidates("m").at(0).draining);
  CHECK_FALSE(r.set_draining(WorkerId{2}, true));
}

TEST_CASE("candidates into a reused vector replace its contents") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1));
  r.on_heartbeat(ann(2, "other"));
  r.on_heartbeat(ann(3, "m", 4));
  r.begin_request(WorkerId{3}, 7, 5);
  std::vector<WorkerView> out;
  r.candidates("", out);
  CHECK(out.size() == 3);
  r.candidates("m", out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].info->id == WorkerId{1});
  CHECK(out[1].info->id == WorkerId{3});
  CHECK(out[1].inflight_requests == 1);
  CHECK(out[1].inflight_blocks == 7);
  CHECK(out[1].pending_prefill_tokens == 5);
  CHECK(out[1].predicted.request_active_slots == 4);
  CHECK(out[1].predicted.kv_active_blocks == 7);
  r.candidates("none", out);
  CHECK(out.empty());
}
