#include "events/zmq_source.h"

#include <doctest/doctest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>

#include "mocker/vllm_publisher.h"
#include "tests/support/zmq_fleet.h"

using namespace kvroute;
using namespace kvroute::testing;

namespace {

constexpr uint32_t kBs = 4;
const CacheOwner kOwner{WorkerId{7}, 0};

ZmqConfig fast_config() {
  ZmqConfig c;
  c.replay_min_interval_ms = 20;
  c.replay_timeout_ms = 1000;
  c.replay_max_backoff_ms = 200;
  return c;
}

struct Rig {
  SinkIndex sink;
  ZmqEventSource src;
  explicit Rig(ZmqConfig cfg = fast_config())
      : src(cfg, kBs, [this](std::vector<KvEvent>&& e) { return sink.apply(std::move(e)); }) {
    src.start();
  }
  // True once the source's index answers every chain as `ref` does.
  bool matches(const RadixIndexer& ref, uint64_t chains, uint64_t generation = 0, CacheOwner owner = kOwner) {
    const auto c = synthetic_chains(chains, kBs, generation);
    std::lock_guard lk(sink.mu);
    return overlaps(sink.index, c, owner) == overlaps(ref, c, owner) &&
           sink.index.stats().entries == ref.stats().entries;
  }
};

std::unique_ptr<mocker::VllmPublisher> publisher(VllmEncoding enc, bool replay, size_t buffer_steps = 10000,
                                                 std::string endpoint = "tcp://127.0.0.1:0",
                                                 std::string replay_endpoint = "tcp://127.0.0.1:0") {
  mocker::VllmPublisherOptions o;
  o.endpoint = endpoint;
  o.replay_endpoint = replay ? replay_endpoint : "";
  o.encoding = enc;
  o.buffer_steps = buffer_steps;
  auto p = std::make_unique<mocker::VllmPublisher>(o);
  std::string err;
  REQUIRE_MESSAGE(p->bind(&err), err);
  p->start();
  return p;
}

void publish(mocker::VllmPublisher& p, uint64_t from, uint64_t to, uint64_t generation = 0) {
  for (uint64_t i = from; i < to; ++i) p.publish(synthetic_batch(i, kBs, generation));
  REQUIRE(eventually([&] { return p.published() == to; }));
}

}  // namespace

TEST_CASE("a late subscriber replays from 0 before trusting live frames, then follows live (both encodings)") {
  for (auto enc : {VllmEncoding::Positional, VllmEncoding::TaggedMap}) {
    auto pub = publisher(enc, true);
    publish(*pub, 0, 5);  // before the router knows the worker
    Rig rig;
    REQUIRE(rig.src.add_worker(kOwner.worker, {pub->endpoint(), pub->replay_endpoint(), 1}));
    RadixIndexer ref;
    apply_reference(ref, kOwner, 0, 5, kBs);
    CHECK(eventually([&] { return rig.matches(ref, 5); }));
    publish(*pub, 5, 9);
    apply_reference(ref, kOwner, 5, 9, kBs);
    CHECK(eventually([&] { return rig.matches(ref, 9); }));
    CHECK_FALSE(rig.src.is_partial(kOwner));
    CHECK(rig.src.stats().replay_requests_total >= 1);
    CHECK(rig.src.stats().restarts_total == 0);
    CHECK(rig.src.stats().rejected_total[static_cast<size_t>(DecodeError::Json)] == 0);
  }
}

TEST_CASE("a frame lost on the PUB socket is filled by a replay; the owner stays complete") {
  auto pub = publisher(VllmEncoding::TaggedMap, true);
  Rig rig;
  REQUIRE(rig.src.add_worker(kOwner.worker, {pub->endpoint(), pub->replay_endpoint(), 1}));
  RadixIndexer ref;
  // Keep publishing until live frames arrive (the SUB connects asynchronously).
  uint64_t n = 0;
  REQUIRE(eventually([&] {
    publish(*pub, n, n + 1);
    ++n;
    return rig.src.stats().frames_total > 0;
  }));
  apply_reference(ref, kOwner, 0, n, kBs);
  REQUIRE(eventually([&] { return rig.matches(ref, n); }));
  const uint64_t gaps = rig.src.stats().gaps_total;
  pub->drop_next_live(2);
  publish(*pub, n, n + 4);
  apply_reference(ref, kOwner, n, n + 4, kBs);
  CHECK(eventually([&] { return rig.matches(ref, n + 4); }));
  CHECK(pub->dropped_live() == 2);
  CHECK(rig.src.stats().gaps_total > gaps);
  CHECK_FALSE(rig.src.is_partial(kOwner));
  CHECK(rig.src.stats().restarts_total == 0);  // a gap's replay compares the last applied batch: the same
}

TEST_CASE("without a replay socket a late join is partial; what arrives is applied") {
  auto pub = publisher(VllmEncoding::Positional, false);
  publish(*pub, 0, 3);  // never seen by the router
  Rig rig;
  REQUIRE(rig.src.add_worker(kOwner.worker, {pub->endpoint(), "", 1}));
  uint64_t n = 3;
  REQUIRE(eventually([&] {
    publish(*pub, n, n + 1);
    ++n;
    return rig.src.stats().frames_total > 0;
  }));
  CHECK(eventually([&] { return rig.src.is_partial(kOwner); }));
  CHECK(rig.src.stats().partial_owners == 1);
  // The last batch's prompt is indexed (3 blocks).
  const auto chains = synthetic_chains(n, kBs);
  CHECK(eventually([&] {  // the last frame may still be on its way
    std::lock_guard lk(rig.sink.mu);
    return overlaps(rig.sink.index, {chains.back()}, kOwner) == std::vector<uint32_t>{3};
  }));
  std::lock_guard lk(rig.sink.mu);
  CHECK(overlaps(rig.sink.index, {chains.front()}, kOwner) == std::vector<uint32_t>{0});
}

TEST_CASE("an engine buffer that no longer starts at 0 makes the owner partial; the buffered tail is applied") {
  auto pub = publisher(VllmEncoding::Positional, true, /*buffer_steps=*/2);
  publish(*pub, 0, 6);
  Rig rig;
  REQUIRE(rig.src.add_worker(kOwner.worker, {pub->endpoint(), pub->replay_endpoint(), 1}));
  CHECK(eventually([&] { return rig.src.is_partial(kOwner); }));
  const auto chains = synthetic_chains(6, kBs);
  CHECK(eventually([&] {
    std::lock_guard lk(rig.sink.mu);
    return overlaps(rig.sink.index, chains, kOwner) == std::vector<uint32_t>{0, 0, 0, 0, 3, 3};
  }));
}

TEST_CASE("seq going backwards is an engine restart: its old blocks are dropped") {
  Rig rig;
  auto a = publisher(VllmEncoding::Positional, true);
  const std::string ep = a->endpoint(), rep = a->replay_endpoint();
  REQUIRE(rig.src.add_worker(kOwner.worker, {ep, rep, 1}));
  uint64_t n = 0;
  REQUIRE(eventually([&] {
    publish(*a, n, n + 1);
    ++n;
    return rig.src.stats().frames_total > 0;
  }));
  publish(*a, n, n + 5);  // live seq now well above what the new engine will send
  n += 5;
  RadixIndexer ref_a;
  apply_reference(ref_a, kOwner, 0, n, kBs);
  REQUIRE(eventually([&] { return rig.matches(ref_a, n); }));
  a.reset();  // the engine dies...
  auto b = publisher(VllmEncoding::Positional, true, 10000, ep, rep);  // ...and comes back on the same ports
  RadixIndexer ref_b;
  uint64_t m = 0;
  // The new engine publishes on (as it serves traffic) until the router has
  // noticed: by seq going back, or (frames lost while the SUB reconnected) by
  // a different batch at the last seq applied.
  REQUIRE(eventually([&] {
    publish(*b, m, m + 1, /*generation=*/1), ++m;
    return rig.src.stats().restarts_total > 0;
  }));
  apply_reference(ref_b, kOwner, 0, m, kBs, /*generation=*/1);
  CHECK(eventually([&] { return rig.matches(ref_b, m, /*generation=*/1); }));  // entries equal: nothing of a left
  CHECK_FALSE(rig.src.is_partial(kOwner));
}

TEST_CASE("remove_worker drops the worker's blocks; dp ranks are port + rank") {
  Rig rig;
  // Two ranks: rank 1 must be at port + 1.
  std::unique_ptr<mocker::VllmPublisher> r0, r1;
  for (int attempt = 0; attempt < 20 && !r1; ++attempt) {
    r0 = publisher(VllmEncoding::Positional, false);
    const std::string ep = r0->endpoint();
    const std::string ep1 = offset_endpoint_port(ep, 1);
    mocker::VllmPublisherOptions o;
    o.endpoint = ep1;
    o.dp_rank = 1;
    auto p = std::make_unique<mocker::VllmPublisher>(o);
    if (p->bind(nullptr)) r1 = std::move(p), r1->start();
  }
  REQUIRE(r1);
  REQUIRE(rig.src.add_worker(kOwner.worker, {r0->endpoint(), "", 2}));
  const CacheOwner rank1{kOwner.worker, 1};
  uint64_t n = 0;
  REQUIRE(eventually([&] {
    publish(*r0, n, n + 1);
    r1->publish(synthetic_batch(n, kBs, 1));
    ++n;
    // The batch published one round (>= 5 ms) earlier, not the one just
    // sent (the router may not have read it yet); its prompt is whole until
    // the next batch removes a block of it.
    if (n < 2) return false;
    std::lock_guard lk(rig.sink.mu);
    return overlaps(rig.sink.index, synthetic_chains(n, kBs, 1), rank1)[n - 2] == 3 &&
           overlaps(rig.sink.index, synthetic_chains(n, kBs), kOwner)[n - 2] == 3;
  }));
  CHECK(rig.sink.entries() > 0);
  rig.src.remove_worker(kOwner.worker);
  CHECK(eventually([&] { return rig.sink.entries() == 0; }));
  CHECK(eventually([&] { return rig.src.stats().publishers == 0; }));
}

TEST_CASE("add_worker refuses endpoints ZMQ cannot use") {
  Rig rig;
  std::string err;
  CHECK_FALSE(rig.src.add_worker(WorkerId{1}, {"http://x:1", "", 1}, &err));
  CHECK(err.find("tcp://") != std::string::npos);
  CHECK_FALSE(rig.src.add_worker(WorkerId{1}, {"tcp://127.0.0.1:5557", "tcp://h", 1}, &err));
  CHECK_FALSE(rig.src.add_worker(WorkerId{1}, {"tcp://127.0.0.1:5557", "", 0}, &err));
}

TEST_CASE("a worker added before its engine is up is complete once the engine starts") {
  std::string ep, rep;
  {
    auto probe = publisher(VllmEncoding::Positional, true);  // two free ports, released at once
    ep = probe->endpoint();
    rep = probe->replay_endpoint();
  }
  Rig rig;
  REQUIRE(rig.src.add_worker(kOwner.worker, {ep, rep, 1}));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // replay attempts find nobody (not a race: any wait works)
  auto pub = publisher(VllmEncoding::Positional, true, 10000, ep, rep);
  publish(*pub, 0, 4);
  RadixIndexer ref;
  apply_reference(ref, kOwner, 0, 4, kBs);
  CHECK(eventually([&] { return rig.matches(ref, 4); }));
  CHECK_FALSE(rig.src.is_partial(kOwner));
}

TEST_CASE("an engine restarted while idle is noticed on reconnect: its old blocks are dropped with no new traffic") {
  Rig rig;
  auto a = publisher(VllmEncoding::Positional, true);
  const std::string ep = a->endpoint(), rep = a->replay_endpoint();
  REQUIRE(rig.src.add_worker(kOwner.worker, {ep, rep, 1}));
  publish(*a, 0, 3);
  RadixIndexer ref_a;
  apply_reference(ref_a, kOwner, 0, 3, kBs);
  REQUIRE(eventually([&] { return rig.matches(ref_a, 3); }));
  a.reset();
  auto b = publisher(VllmEncoding::Positional, true, 10000, ep, rep);  // back, idle: publishes nothing
  CHECK(eventually([&] { return rig.sink.entries() == 0; }));
  CHECK(rig.src.stats().restarts_total == 1);
  CHECK_FALSE(rig.src.is_partial(kOwner));
  // Its first batches are then applied as usual.
  publish(*b, 0, 2, /*generation=*/1);
  RadixIndexer ref_b;
  apply_reference(ref_b, kOwner, 0, 2, kBs, 1);
  CHECK(eventually([&] { return rig.matches(ref_b, 2, 1); }));
  CHECK(rig.src.stats().restarts_total == 1);
}

TEST_CASE("events of another block size are skipped, counted and said in the log, with the setting to change") {
  // The sink is added before the source's thread starts and taken out after
  // it stops: a logger's sinks are not changed while another thread logs.
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  uint64_t entries = 0;
  {
    auto pub = publisher(VllmEncoding::Positional, true);
    Rig rig;
    REQUIRE(rig.src.add_worker(kOwner.worker, {pub->endpoint(), pub->replay_endpoint(), 1}));
    // The engine runs blocks of 8 tokens; the router indexes blocks of kBs = 4.
    pub->publish(synthetic_batch(0, 2 * kBs));
    const auto mismatched = [&] {
      return rig.src.stats().skipped_total[static_cast<size_t>(VllmSkip::BlockSizeMismatch)].load();
    };
    CHECK(eventually([&] { return mismatched() > 0; }));
    // An offloading connector's copies of another block size are named as such.
    VllmEventBatch copies;
    VllmBlockStored c;
    c.block_hashes = {SequenceHash{1}};
    c.block_size = 3 * kBs;
    c.medium = "CPU";
    copies.events.push_back(c);
    pub->publish(copies);
    CHECK(eventually([&] { return mismatched() > 1; }));
    std::lock_guard lk(rig.sink.mu);
    entries = rig.sink.index.stats().entries;
  }
  spdlog::default_logger()->flush();
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::find(sinks.begin(), sinks.end(), sink));
  CHECK(entries == 0);
  const std::string text = log.str();
  CHECK(text.find("worker 7 rank 0: 1 KV events skipped: block_size 8, not indexer.block_size 4") != std::string::npos);
  CHECK(text.find("--block-size") != std::string::npos);
  CHECK(text.find("copies in medium CPU of block_size 12, not indexer.block_size 4") != std::string::npos);
}
