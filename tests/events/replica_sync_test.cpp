// Replicas share in-flight load: two ReplicaSync instances over a
// real nats-server (started here on a free port), each with its own registry.
#include "events/replica_sync.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "tests/support/nats_server.h"

using namespace kvroute;
using kvroute::testing::NatsServer;
using namespace std::chrono_literals;

namespace {

template <class F>
bool wait_until(F f, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return f();
}

WorkerView view_of(const WorkerRegistry& r, uint64_t id) {
  for (const auto& v : r.all())
    if (v.info->id == WorkerId{id}) return v;
  FAIL("worker not known");
  return {};
}

// A connection to `server` named `name`; fails the test if it cannot connect.
std::unique_ptr<NatsBus> connect(const NatsServer& server, const char* name) {
  std::string err;
  auto bus = NatsBus::connect(server.url(), name, 5s, &err);
  REQUIRE_MESSAGE(bus, err);
  return bus;
}

void announce(WorkerRegistry& r) {
  for (uint64_t id : {1, 2}) {
    WorkerAnnouncement a;
    a.id = WorkerId{id};
    a.url = "http://127.0.0.1:9";
    a.model = "m";
    r.on_heartbeat(a);
  }
}

}  // namespace

TEST_CASE("replica snapshots: round trip and malformed input") {
  ReplicaSnapshot s{0xfeedull, 7, 1000, {{WorkerId{3}, 2, 40, 500}, {WorkerId{9}, 1, 0, 0}}};
  ReplicaSnapshot back;
  REQUIRE(decode_replica_snapshot(encode_replica_snapshot(s), back));
  CHECK(back.replica == 0xfeedull);
  CHECK(back.seq == 7u);
  CHECK(back.workers == s.workers);
  CHECK_FALSE(decode_replica_snapshot("{", back));
  CHECK_FALSE(decode_replica_snapshot(R"({"replica":1,"seq":1,"ttl_ms":0,"w":[]})", back));
  CHECK_FALSE(decode_replica_snapshot(R"({"replica":1,"seq":1,"ttl_ms":10,"w":[[1,2,3]]})", back));
  CHECK_FALSE(decode_replica_snapshot(R"({"replica":1,"seq":1,"ttl_ms":10,"w":[[1,-2,3,4]]})", back));
}

TEST_CASE("replica snapshots: parked KV in an optional list, merged with the in-flight counts") {
  // Worker 3 in flight and parked, 9 in flight only, 5 parked only.
  ReplicaSnapshot s{1, 2, 1000, {{WorkerId{3}, 2, 40, 500, 70}, {WorkerId{9}, 1, 0, 0, 0}, {WorkerId{5}, 0, 0, 0, 12}}};
  const std::string json = encode_replica_snapshot(s);
  CHECK(json.find(R"("w":[[3,2,40,500],[9,1,0,0],[5,0,0,0]])") != std::string::npos);  // what an older replica reads
  CHECK(json.find(R"("p":[[3,70],[5,12]])") != std::string::npos);
  ReplicaSnapshot back;
  REQUIRE(decode_replica_snapshot(json, back));
  CHECK(back.workers == s.workers);
  // From a replica that predates it: nothing parked.
  REQUIRE(decode_replica_snapshot(R"({"replica":1,"seq":1,"ttl_ms":10,"w":[[1,2,3,4]]})", back));
  REQUIRE(back.workers.size() == 1);
  CHECK(back.workers[0].parked_blocks == 0);
  // Malformed: refused whole.
  for (const char* bad : {R"({"replica":1,"seq":1,"ttl_ms":10,"w":[],"p":{}})",
                          R"({"replica":1,"seq":1,"ttl_ms":10,"w":[],"p":[[1]]})",
                          R"({"replica":1,"seq":1,"ttl_ms":10,"w":[],"p":[[1,-3]]})",
                          R"({"replica":1,"seq":1,"ttl_ms":10,"w":[],"p":[[1,1.5]]})",
                          R"({"replica":1,"seq":1,"ttl_ms":10,"w":[],"p":[[1,1099511627777]]})",
                          R"({"replica":1,"seq":1,"ttl_ms":10,"w":[],"p":[[1,2],[1,3]]})"}) {
    CAPTURE(bad);
    CHECK_FALSE(decode_replica_snapshot(bad, back));
  }
}

TEST_CASE("two replicas count each other's in-flight requests; a silent one stops counting after its ttl") {
  NatsServer server;
  REQUIRE_MESSAGE(server.ok(), "nats-server not found (scripts/setup.sh installs it)");
  std::string err;
  auto bus_a = connect(server, "a");
  auto bus_b = connect(server, "b");
  SteadyClock& clock = SteadyClock::instance();
  WorkerRegistry ra(clock), rb(clock);
  announce(ra);
  announce(rb);
  ReplicaSync a(*bus_a, ra, clock, "t", 5ms, 300ms), b(*bus_b, rb, clock, "t", 5ms, 300ms);
  REQUIRE(a.start(&err));
  REQUIRE(b.start(&err));

  for (int i = 0; i < 3; ++i) rb.begin_request(WorkerId{1}, 10, 100);  // routed on b
  REQUIRE(wait_until([&] { return view_of(ra, 1).inflight_requests == 3; }));
  auto v = view_of(ra, 1);
  CHECK(v.remote_requests == 3);
  CHECK(v.inflight_blocks == 30);
  CHECK(v.pending_prefill_tokens == 300);
  CHECK(v.predicted.request_active_slots >= 3);
  rb.first_byte(WorkerId{1}, 100);  // first byte on b: its prefill is over
  REQUIRE(wait_until([&] { return view_of(ra, 1).pending_prefill_tokens == 200; }));

  ra.begin_request(WorkerId{2}, 5, 50);  // routed on a
  REQUIRE(wait_until([&] { return view_of(rb, 2).remote_requests == 1; }));
  // Nobody counts twice: b's own view of worker 1 is its 3 requests, no echo from a.
  std::this_thread::sleep_for(50ms);
  CHECK(view_of(rb, 1).inflight_requests == 3);
  CHECK(view_of(rb, 1).remote_requests == 0);
  CHECK(view_of(ra, 2).inflight_requests == 1);

  rb.end_request(WorkerId{1}, 10, 0);  // finished on b
  REQUIRE(wait_until([&] { return view_of(ra, 1).inflight_requests == 2; }));

  // The parked KV: b's answered prompt parks on worker 1 for both routers.
  ra.set_parked_kv_seconds(3600);
  rb.set_parked_kv_seconds(3600);
  {
    InflightGuard answered(rb, WorkerId{1}, 25, 400);
    answered.first_byte();
  }
  REQUIRE(wait_until([&] { return view_of(ra, 1).remote_parked_blocks > 24; }));
  CHECK(view_of(ra, 1).parked_blocks == doctest::Approx(view_of(ra, 1).remote_parked_blocks));
  CHECK(view_of(ra, 1).remote_parked_blocks <= 25);
  CHECK(view_of(rb, 1).remote_parked_blocks == 0);  // b's own, not echoed back to it

  b.stop();  // b vanishes (its requests still "in flight" from a's view)
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(wait_until([&] { return view_of(ra, 1).inflight_requests == 0; }, 3000ms));
  CHECK(view_of(ra, 1).parked_blocks == 0);  // its parked KV no longer counts either
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took >= 250ms);  // not before its ttl (300 ms, minus the last keep-alive's age)
  CHECK(a.stats().replicas_expired_total == 1);
  CHECK(a.stats().peers == 0);
  a.stop();
}

TEST_CASE("a flood of made-up replicas is bounded: the ones counted keep counting") {
  NatsServer server;
  REQUIRE_MESSAGE(server.ok(), "nats-server not found (scripts/setup.sh installs it)");
  std::string err;
  auto bus_a = connect(server, "a");
  auto bus_x = connect(server, "x");
  SteadyClock& clock = SteadyClock::instance();
  WorkerRegistry ra(clock);
  announce(ra);
  ReplicaSync a(*bus_a, ra, clock, "t", 5ms, 3600000ms);
  REQUIRE(a.start(&err));
  // 1,100 replicas, each claiming one request in flight on worker 1. The
  // first is sent until it arrives: the subscription is then in place.
  auto claim = [&](uint64_t r) {
    return bus_x->publish("t.replicas.inflight", encode_replica_snapshot({r, 1, 3600000, {{WorkerId{1}, 1, 1, 0}}}));
  };
  REQUIRE(wait_until([&] { return claim(1) && a.stats().received_total > 0; }));
  for (uint64_t r = 2; r <= 1100; ++r) REQUIRE(claim(r));
  REQUIRE(wait_until([&] { return a.stats().rejected_total == 76; }, 10000ms));
  CHECK(a.stats().peers == 1024);
  CHECK(a.stats().rejected_total == 76);
  CHECK(view_of(ra, 1).remote_requests == 1024);
  // A counted replica's next snapshot is still taken.
  REQUIRE(bus_x->publish("t.replicas.inflight", encode_replica_snapshot({1, 2, 3600000, {{WorkerId{1}, 5, 1, 0}}})));
  REQUIRE(wait_until([&] { return view_of(ra, 1).remote_requests == 1028; }));
  a.stop();
}
