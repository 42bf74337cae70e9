// A sequencer that cannot be turned against the fleet.
#include <doctest/doctest.h>

#include "indexer/event_sequencer.h"
#include "indexer/radix_indexer.h"

using namespace kvroute;

namespace {
CacheOwner ow(uint64_t w) { return CacheOwner{WorkerId{w}, 0}; }
KvEvent st(uint64_t id, std::optional<uint64_t> parent, uint64_t block, uint64_t content, uint64_t instance = 0,
           uint64_t worker = 1) {
  KvEvent e;
  e.owner = ow(worker);
  e.event_id = id;
  e.instance = instance;
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
std::vector<KvEvent> dump_of(std::vector<KvEvent> evs) {
  for (auto& e : evs) e.event_id.reset();
  return evs;
}
}  // namespace

TEST_CASE("an absurd event id is one gap, handled by one dump, then the worker is trusted again") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  int resyncs = 0;
  seq.set_resync_callback([&](CacheOwner) { ++resyncs; });
  seq.apply(st(1, {}, 10, 1, 7));
  seq.apply(st(2, 10, 11, 2, 7));
  seq.apply(st(~0ull, {}, 99, 99, 7));  // hostile: 2^64-1
  CHECK(resyncs == 1);
  CHECK(seq.is_stale(ow(1)));
  seq.apply(st(3, 11, 12, 3, 7));  // the real stream goes on, buffered
  // The dump (taken after event 2) says the worker is at 2.
  seq.apply_resync(ow(1), 2, dump_of({st(0, {}, 10, 1), st(0, 10, 11, 2)}), 7);
  CHECK_FALSE(seq.is_stale(ow(1)));
  CHECK(resyncs == 1);                     // no second dump for the absurd id
  CHECK(seq.counters().discarded == 1);    // it was dropped and counted
  CHECK(overlap(seq, {1, 2, 3}) == 3);     // event 3 was replayed
  CHECK(overlap(seq, {99}) == 0);
  seq.apply(st(4, 12, 13, 4, 7));
  CHECK(overlap(seq, {1, 2, 3, 4}) == 4);
  CHECK(resyncs == 1);
}

TEST_CASE("a plausible hole after a dump asks once more, and only once in a row") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  int resyncs = 0;
  seq.set_resync_callback([&](CacheOwner) { ++resyncs; });
  seq.apply(st(1, {}, 10, 1, 7));
  seq.apply(st(50, {}, 20, 5, 7));  // forged: plausible-looking id
  REQUIRE(resyncs == 1);
  seq.apply_resync(ow(1), 1, dump_of({st(0, {}, 10, 1)}), 7);
  CHECK(resyncs == 2);  // could have been real losses: one more dump
  seq.apply_resync(ow(1), 1, dump_of({st(0, {}, 10, 1)}), 7);
  CHECK(resyncs == 2);  // still a hole: dropped, not asked again
  CHECK_FALSE(seq.is_stale(ow(1)));
  CHECK(seq.counters().discarded == 1);
  CHECK(overlap(seq, {5}) == 0);
}

TEST_CASE("a restarted worker whose old instance published exactly one event is a restart, not a duplicate") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  seq.apply(st(1, {}, 10, 1, /*instance=*/100));
  CHECK(overlap(seq, {1}) == 1);
  seq.apply(st(1, {}, 30, 3, /*instance=*/200));  // new process, its first event
  CHECK(seq.counters().restarts == 1);
  CHECK(seq.counters().duplicates == 0);
  CHECK(overlap(seq, {1}) == 0);  // the old instance's block is gone
  CHECK(overlap(seq, {3}) == 1);
}

TEST_CASE("with instance ids, a lower event id is a late duplicate, not a restart") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  seq.apply(st(1, {}, 10, 1, 100));
  seq.apply(st(2, 10, 11, 2, 100));
  seq.apply(st(3, 11, 12, 3, 100));
  seq.apply(st(2, 10, 11, 2, 100));  // redelivered late
  CHECK(seq.counters().restarts == 0);
  CHECK(seq.counters().duplicates == 1);
  CHECK(overlap(seq, {1, 2, 3}) == 3);
}

TEST_CASE("a heartbeat announcing a new instance drops the worker's blocks before any event") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  CHECK_FALSE(seq.on_instance(WorkerId{1}, 100));  // first sight: nothing to drop
  seq.apply(st(1, {}, 10, 1, 100));
  seq.apply(st(2, 10, 11, 2, 100));
  CHECK_FALSE(seq.on_instance(WorkerId{1}, 100));  // same process
  CHECK(overlap(seq, {1, 2}) == 2);
  CHECK(seq.on_instance(WorkerId{1}, 200));  // restarted
  CHECK(overlap(seq, {1, 2}) == 0);
  seq.apply(st(1, {}, 40, 4, 200));  // the new process starts at 1
  CHECK(overlap(seq, {4}) == 1);
  CHECK(seq.counters().gaps == 0);
}

TEST_CASE("begin_resync: a trusted owner keeps applying; events after the dump's point are replayed") {
  RadixIndexer radix;
  EventSequencer seq(radix);
  int resyncs = 0;
  seq.set_resync_callback([&](CacheOwner) { ++resyncs; });
  seq.apply(st(1, {}, 10, 1, 5));
  seq.begin_resync(ow(1));  // e.g. after a NATS reconnect
  seq.apply(st(2, 10, 11, 2, 5));
  seq.apply(st(3, 11, 12, 3, 5));
  CHECK_FALSE(seq.is_stale(ow(1)));
  CHECK(overlap(seq, {1, 2, 3}) == 3);  // affinity kept meanwhile
  // The dump was taken after event 2 (it lacks event 3's block): 3 is replayed.
  seq.apply_resync(ow(1), 2, dump_of({st(0, {}, 10, 1), st(0, 10, 11, 2)}), 5);
  CHECK(overlap(seq, {1, 2, 3}) == 3);
  CHECK(resyncs == 0);
  // A gap while a dump is already on its way asks for nothing more.
  seq.begin_resync(ow(1));
  seq.apply(st(9, {}, 90, 9, 5));
  CHECK(resyncs == 0);
  CHECK(seq.is_stale(ow(1)));
  seq.apply_resync(ow(1), 8, dump_of({st(0, {}, 10, 1)}), 5);
  CHECK_FALSE(seq.is_stale(ow(1)));
  CHECK(overlap(seq, {9}) == 1);
}
