#include "indexer/event_sequencer.h"

#include <doctest/doctest.h>

#include "indexer/approx_indexer.h"
#include "indexer/radix_indexer.h"

#include <atomic>
#include <thread>

using namespace kvroute;
using namespace std::chrono_literals;

namespace {
CacheOwner ow(uint64_t w) { return CacheOwner{WorkerId{w}, 0}; }
KvEvent st(uint64_t id, std::optional<uint64_t> parent, uint64_t block, uint64_t content, uint64_t worker = 1) {
  KvEvent e;
  e.owner = ow(worker);
  e.event_id = id;
  KvStored s;
  if (parent) s.parent = SequenceHash{*parent};
  s.blocks.push_back({SequenceHash{block}, LocalBlockHash{content}});
  e.data = s;
  return e;
}
uint32_t overlap(const Indexer& idx, std::vector<uint64_t> contents, uint64_t worker = 1) {
  std::vector<LocalBlockHash> q;
  for (auto c : contents) q.push_back(LocalBlockHash{c});
  for (auto& o : idx.find_matches(q).owners)
    if (o.owner == ow(worker)) return o.blocks;
  return 0;
}
}  // namespace

TEST_CASE("in-order events apply; duplicates are ignored") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  std::vector<CacheOwner> resyncs;
  seq.set_resync_callback([&](CacheOwner o) { resyncs.push_back(o); });
  seq.apply(st(1, {}, 10, 1));
  seq.apply(st(2, 10, 11, 2));
  seq.apply(st(2, 10, 11, 2));
  CHECK(overlap(seq, {1, 2}) == 2);
  CHECK(seq.counters().duplicates == 1);
  CHECK(resyncs.empty());
}

TEST_CASE("a gap makes the owner stale until its dump arrives; buffered events replay after it") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  std::vector<CacheOwner> resyncs;
  seq.set_resync_callback([&](CacheOwner o) { resyncs.push_back(o); });
  seq.apply(st(1, {}, 10, 1));
  seq.apply(st(2, 10, 11, 2));
  // Events 3 and 4 are lost; 5 arrives.
  seq.apply(st(5, 11, 14, 5));
  REQUIRE(resyncs.size() == 1);
  CHECK(resyncs[0] == ow(1));
  CHECK(seq.is_stale(ow(1)));
  CHECK(seq.counters().gaps == 1);
  CHECK(overlap(seq, {1, 2}) == 0);    // unknown: scored as zero
  CHECK(overlap(radix, {1, 2}) == 2);  // (still in the structure underneath)
  seq.apply(st(6, 14, 15, 6));         // arrives while waiting: buffered

  // The worker's dump reflects its state after event 4: blocks 1,2,3,4.
  std::vector<KvEvent> dump = {st(0, {}, 10, 1), st(0, 10, 11, 2), st(0, 11, 12, 3), st(0, 12, 13, 4)};
  for (auto& e : dump) e.event_id.reset();
  seq.apply_resync(ow(1), 4, dump);
  CHECK_FALSE(seq.is_stale(ow(1)));
  CHECK(seq.counters().resyncs_completed == 1);
  CHECK(seq.counters().stale_owners == 0);
  // 5 hangs under block 11 (content 2) -> prefix 1,2,5,6; the dump's chain 1,2,3,4.
  CHECK(overlap(seq, {1, 2, 3, 4}) == 4);
  CHECK(overlap(seq, {1, 2, 5, 6}) == 4);
  seq.apply(st(7, 15, 16, 7));
  CHECK(overlap(seq, {1, 2, 5, 6, 7}) == 5);
  CHECK(resyncs.size() == 1);
}

TEST_CASE("a dump older than buffered gaps asks again") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  int resyncs = 0;
  seq.set_resync_callback([&](CacheOwner) { ++resyncs; });
  seq.apply(st(1, {}, 10, 1));
  seq.apply(st(4, {}, 20, 9));  // gap
  seq.apply(st(7, {}, 30, 8));  // buffered
  seq.apply_resync(ow(1), 4, {});
  CHECK(resyncs == 2);  // 5 and 6 are still missing
  CHECK(seq.is_stale(ow(1)));
  seq.apply_resync(ow(1), 6, {});
  CHECK_FALSE(seq.is_stale(ow(1)));
  CHECK(overlap(seq, {8}) == 1);  // event 7 replayed
}

TEST_CASE("after a resync, late events already in the dump are ignored, not a restart") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  int resyncs = 0;
  seq.set_resync_callback([&](CacheOwner) { ++resyncs; });
  seq.apply(st(1, {}, 10, 1));
  seq.apply(st(5, {}, 20, 9));  // gap: 2..4 lost
  REQUIRE(resyncs == 1);
  // The dump covers events up to 5 (block 20 came with event 5).
  std::vector<KvEvent> dump = {st(0, {}, 10, 1), st(0, 10, 11, 2), st(0, {}, 20, 9)};
  for (auto& e : dump) e.event_id.reset();
  seq.apply_resync(ow(1), 5, dump);
  CHECK(overlap(seq, {1, 2}) == 2);
  CHECK(overlap(seq, {9}) == 1);
  CHECK(seq.counters().resyncs_completed == 1);
  seq.apply(st(3, {}, 30, 3));  // a late redelivery of an event the dump covers
  CHECK(seq.counters().restarts == 0);
  CHECK(seq.counters().duplicates == 1);
  CHECK(overlap(seq, {1, 2}) == 2);  // nothing dropped
  CHECK(overlap(seq, {3}) == 0);     // nothing applied
  seq.apply(st(6, 11, 12, 4));       // the expected next id
  CHECK(overlap(seq, {1, 2, 4}) == 3);
  seq.apply(st(1, {}, 40, 5));  // now a backwards id is a restart again
  CHECK(seq.counters().restarts == 1);
  CHECK(overlap(seq, {1, 2}) == 0);
  CHECK(overlap(seq, {5}) == 1);
  CHECK(resyncs == 1);
}

TEST_CASE("counters: applied events by type and result") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  seq.apply(st(1, {}, 10, 1));
  seq.apply(st(2, 99, 11, 2));  // unknown parent
  KvEvent rm;
  rm.owner = ow(1);
  rm.event_id = 3;
  rm.data = KvRemoved{{SequenceHash{10}, SequenceHash{12345}}};
  seq.apply(rm);
  KvEvent cl;
  cl.owner = ow(1);
  cl.event_id = 4;
  cl.data = KvCleared{};
  seq.apply(cl);
  const auto& c = seq.counters();
  CHECK(c.applied[0][static_cast<size_t>(ApplyResult::Applied)] == 1);
  CHECK(c.applied[0][static_cast<size_t>(ApplyResult::UnknownParent)] == 1);
  CHECK(c.applied[1][static_cast<size_t>(ApplyResult::UnknownBlock)] == 1);
  CHECK(c.applied[2][static_cast<size_t>(ApplyResult::Applied)] == 1);
  CHECK(std::string_view(SequencerCounters::kEventTypes[2]) == "cleared");
}

TEST_CASE("an event id going backwards means a restart: old blocks are dropped") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  seq.apply(st(1, {}, 10, 1));
  seq.apply(st(2, 10, 11, 2));
  seq.apply(st(1, {}, 50, 7));
  CHECK(seq.counters().restarts == 1);
  CHECK(overlap(seq, {1, 2}) == 0);
  CHECK(overlap(seq, {7}) == 1);
}

TEST_CASE("first sight of an owner mid-stream triggers a resync; remove_worker forgets it") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  int resyncs = 0;
  seq.set_resync_callback([&](CacheOwner) { ++resyncs; });
  seq.apply(st(40, {}, 10, 1, 2));
  CHECK(resyncs == 1);
  CHECK(seq.is_stale(ow(2)));
  seq.remove_worker(WorkerId{2});
  CHECK_FALSE(seq.is_stale(ow(2)));
  CHECK(seq.counters().stale_owners == 0);
  seq.apply(st(1, {}, 10, 1, 2));
  CHECK(overlap(seq, {1}, 2) == 1);
  // Events without ids are applied untracked.
  KvEvent e = st(0, {}, 77, 3, 3);
  e.event_id.reset();
  seq.apply(e);
  CHECK(overlap(seq, {3}, 3) == 1);
}

TEST_CASE("approximate mode: predicted blocks expire after the ttl and are bounded") {
  ManualClock clock;
  ApproxIndexer approx(clock, 120s, 1000);
  const std::vector<LocalBlockHash> a = {LocalBlockHash{1}, LocalBlockHash{2}, LocalBlockHash{3}};
  approx.record(ow(1), a, clock.now());
  CHECK(overlap(approx, {1, 2, 3}) == 3);
  CHECK(overlap(approx, {1, 2, 9}) == 2);
  clock.advance(100s);
  approx.record(ow(1), std::span(a).first(1), clock.now());  // block 1 refreshed
  clock.advance(30s);
  approx.expire(clock.now());
  CHECK(overlap(approx, {1, 2, 3}) == 1);
  clock.advance(200s);
  approx.expire(clock.now());
  CHECK(overlap(approx, {1}) == 0);
  CHECK(approx.stats().entries == 0);

  ApproxIndexer small(clock, 120s, 4);
  for (uint64_t i = 0; i < 10; ++i) {
    const std::vector<LocalBlockHash> b = {LocalBlockHash{100 + i}, LocalBlockHash{200 + i}};
    small.record(ow(i), b, clock.now());
  }
  CHECK(small.stats().entries <= 4);
  CHECK(overlap(small, {109, 209}, 9) == 2);  // the newest survive
  CHECK(overlap(small, {100, 200}, 0) == 0);
  small.remove_worker(WorkerId{9});
  CHECK(overlap(small, {109, 209}, 9) == 0);
}

TEST_CASE("approximate mode: lookups never serve an expired prediction; eviction drops tails first") {
  ManualClock clock;
  ApproxIndexer approx(clock);  // defaults: 120 s, 1 M entries
  const std::vector<LocalBlockHash> a = {LocalBlockHash{1}, LocalBlockHash{2}, LocalBlockHash{3}};
  approx.record(ow(1), a, clock.now());
  clock.advance(119s);
  CHECK(overlap(approx, {1, 2, 3}) == 3);
  clock.advance(2s);  // past the default ttl; no record() or expire() call in between
  CHECK(overlap(approx, {1, 2, 3}) == 0);
  CHECK(approx.stats().entries == 0);

  ApproxIndexer small(clock, 120s, 3);
  const std::vector<LocalBlockHash> four = {LocalBlockHash{1}, LocalBlockHash{2}, LocalBlockHash{3}, LocalBlockHash{4}};
  small.record(ow(1), four, clock.now());
  CHECK(small.stats().entries == 3);
  CHECK(overlap(small, {1, 2, 3, 4}) == 3);  // the head of the prefix survives

  // Routing the same prefix again and again keeps memory bounded.
  for (int i = 0; i < 1000; ++i) {
    clock.advance(1ms);
    small.record(ow(1), std::span(four).first(2), clock.now());
  }
  CHECK(small.stats().entries <= 3);
  CHECK(overlap(small, {1, 2}) == 2);
}

TEST_CASE("approximate mode: concurrent record, lookups with expiry, and worker removal") {
  ApproxIndexer approx(SteadyClock::instance(), 2ms, 5000);
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    const std::vector<LocalBlockHash> q = {LocalBlockHash{1}, LocalBlockHash{2}, LocalBlockHash{3}};
    while (!stop)
      for (const auto& o : approx.find_matches(q).owners) CHECK(o.blocks <= 3);
  });
  for (uint64_t i = 0; i < 20000; ++i) {
    const std::vector<LocalBlockHash> b = {LocalBlockHash{1}, LocalBlockHash{2}, LocalBlockHash{3 + i % 5}};
    approx.record(ow(i % 16), b, SteadyClock::instance().now());
    if (i % 1000 == 999) approx.remove_worker(WorkerId{i % 16});
  }
  stop = true;
  reader.join();
  CHECK(approx.stats().entries <= 5000);
}

TEST_CASE("find_match_layers leaves stale owners out, as find_matches does") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  seq.set_resync_callback([](CacheOwner) {});
  for (uint64_t w = 1; w <= 20; ++w) {
    seq.apply(st(1, {}, 10, 1, w));
    seq.apply(st(2, 10, 11, 2, w));
  }
  const std::vector<LocalBlockHash> q{LocalBlockHash{1}, LocalBlockHash{2}};
  MatchLayers m;
  seq.find_match_layers(q, m);
  REQUIRE(m.layers.size() == 1);  // one shared set of 20 owners
  CHECK(m.layers[0].set->owners.size() == 20);
  seq.apply(st(5, 11, 14, 5, 3));  // worker 3 misses events 3-4: stale
  REQUIRE(seq.is_stale(ow(3)));
  seq.find_match_layers(q, m);
  const auto all = m.expand().owners;
  CHECK(all.size() == 19);
  for (const auto& o : all) {
    CHECK(o.owner != ow(3));
    CHECK(o.blocks == 2);
  }
  CHECK(seq.find_matches(q).owners.size() == 19);
}
