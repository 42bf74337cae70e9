// kvroute-mocker's NATS side against a real nats-server (started here on a
// free loopback port): KV events with ids and gaps, heartbeats, resync dumps.
#include "mocker/server.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "events/nats_bus.h"
#include "events/wire.h"
#include "indexer/radix_indexer.h"
#include "tests/mocker/http_client.h"

#include "tests/support/nats_server.h"

using namespace kvroute;
using kvroute::testing::NatsServer;
using namespace kvroute::mocker;

namespace {

template <class F>
bool wait_until(F f, int ms = 5000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return f();
}

struct Inbox {
  std::mutex mu;
  std::vector<std::string> events, heartbeats;
  size_t n_events() {
    std::lock_guard lk(mu);
    return events.size();
  }
};

}  // namespace

TEST_CASE("NATS: KV events (with a dropped one), heartbeats, and a resync dump consistent with the events") {
  NatsServer nats;
  REQUIRE_MESSAGE(nats.ok(), "nats-server not found (scripts/setup.sh installs it)");
  std::string err;
  std::unique_ptr<NatsBus> worker_bus, observer;
  REQUIRE(wait_until([&] { return (worker_bus = NatsBus::connect(nats.url(), "mocker-test", std::chrono::milliseconds(200), &err)) != nullptr; }));
  observer = NatsBus::connect(nats.url(), "observer", std::chrono::seconds(5), &err);
  REQUIRE_MESSAGE(observer, err);
  Inbox inbox;
  REQUIRE(observer->subscribe("kvtest.kv_events", [&](const NatsMessage& m) {
    std::lock_guard lk(inbox.mu);
    inbox.events.emplace_back(m.data);
  }, &err));
  REQUIRE(observer->subscribe("kvtest.workers", [&](const NatsMessage& m) {
    std::lock_guard lk(inbox.mu);
    inbox.heartbeats.emplace_back(m.data);
  }, &err));
  observer->flush(std::chrono::seconds(2));

  MockerOptions o;
  o.worker_id = 7;
  o.model = "tiny";
  o.subject_prefix = "kvtest";
  o.heartbeat_ms = 50;
  o.speedup = 200;
  o.engine.tier = StorageTier::HostPinned;
  o.engine.kv_blocks = 1000;
  MockerServer server(o, worker_bus.get());
  REQUIRE_MESSAGE(server.listen(&err), err);
  REQUIRE_MESSAGE(server.start_nats(&err), err);
  struct Running {  // stops the io thread on every exit path
    MockerServer& s;
    std::thread t;
    ~Running() {
      s.stop();
      t.join();
    }
  } running{server, std::thread([&] { server.run(); })};
  const uint16_t port = server.port();

  // Heartbeats: identity and load.
  REQUIRE(wait_until([&] {
    std::lock_guard lk(inbox.mu);
    return !inbox.heartbeats.empty();
  }));
  {
    std::lock_guard lk(inbox.mu);
    WorkerHeartbeat hb;
    REQUIRE(decode_heartbeat(inbox.heartbeats.front(), hb) == DecodeError::None);
    CHECK(hb.worker_id == WorkerId{7});
    CHECK(hb.url == "http://127.0.0.1:" + std::to_string(port));
    CHECK(hb.model == "tiny");
    CHECK(hb.block_size == 16);
    CHECK(hb.dp_size == 1);
    CHECK(hb.load.kv_total_blocks == 1000);
    CHECK(hb.load.request_total_slots == 256);
  }

  // Event 1 is dropped (its id is consumed), event 2 is published.
  REQUIRE(testing::http_request(port, "POST", "/mocker/drop_events", R"({"count":1})").status == 200);
  const std::string a(200, 'a'), b(200, 'b');
  REQUIRE(testing::http_request(port, "POST", "/v1/completions",
                                R"({"model":"tiny","prompt":")" + a + R"(","max_tokens":2})").status == 200);
  REQUIRE(testing::http_request(port, "POST", "/v1/completions",
                                R"({"model":"tiny","prompt":")" + b + R"(","max_tokens":2})").status == 200);
  REQUIRE(wait_until([&] { return inbox.n_events() == 1; }));
  std::vector<KvEvent> published;
  {
    std::lock_guard lk(inbox.mu);
    REQUIRE(decode_kv_events(inbox.events[0], DecodeLimits{}, published) == DecodeError::None);
  }
  REQUIRE(published.size() == 1);
  CHECK(published[0].event_id == 2u);
  CHECK(published[0].owner == CacheOwner{WorkerId{7}, 0});
  CHECK(published[0].tier == StorageTier::HostPinned);
  CHECK(std::get<KvStored>(published[0].data).blocks.size() == 200 / 4 / 16);

  // The resync dump holds both prompts' blocks, as of event 2.
  auto reply = observer->request("kvtest.kv_resync.7", "{}", std::chrono::seconds(3));
  REQUIRE(reply.has_value());
  ResyncDump dump;
  REQUIRE(decode_resync_dump(*reply, DecodeLimits{}, dump) == DecodeError::None);
  CHECK(dump.owner == CacheOwner{WorkerId{7}, 0});
  CHECK(dump.last_event_id == 2);
  RadixIndexer idx;
  for (const auto& e : dump.events) CHECK(idx.apply(e) == ApplyResult::Applied);
  CHECK(idx.stats().entries == 2 * (200 / 4 / 16));
  CHECK(dump.events.front().tier == StorageTier::HostPinned);

  auto stats = testing::http_request(port, "GET", "/mocker/stats").body;
  CHECK(stats.find(R"("events_published":1,"events_dropped":1)") != std::string::npos);
  CHECK(stats.find(R"("kv_cached_blocks":6)") != std::string::npos);

}
