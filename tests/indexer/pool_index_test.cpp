// Shared KV pools in front of the index: a block a member stores with the
// pool's medium counts for every member; eviction, clears and members leaving
// act on the pool as the README says; hostile claims never reach it.
#include "indexer/pool_index.h"

#include <doctest/doctest.h>

#include "indexer/event_sequencer.h"
#include "indexer/radix_indexer.h"

using namespace kvroute;

namespace {

CacheOwner ow(uint64_t w, uint32_t r = 0) { return CacheOwner{WorkerId{w}, r}; }

KvEvent stored(uint64_t worker, uint64_t first_id, size_t n, std::optional<uint64_t> parent = std::nullopt,
               std::string medium = {}, uint64_t content = 1) {
  KvEvent e;
  e.owner = ow(worker);
  e.medium = std::move(medium);
  if (!e.medium.empty()) e.tier = StorageTier::External;  // what the decoders map an unknown medium to
  KvStored s;
  if (parent) s.parent = SequenceHash{*parent};
  for (size_t i = 0; i < n; ++i)
    s.blocks.push_back({SequenceHash{first_id + i}, LocalBlockHash{content + (first_id - 100) % 1000 + i}});
  e.data = s;
  return e;
}

KvEvent removed(uint64_t worker, std::vector<uint64_t> ids, std::string medium = {}) {
  KvEvent e;
  e.owner = ow(worker);
  e.medium = std::move(medium);
  KvRemoved r;
  for (auto id : ids) r.block_hashes.push_back(SequenceHash{id});
  e.data = r;
  return e;
}

KvEvent cleared(uint64_t worker, std::string medium = {}) {
  KvEvent e;
  e.owner = ow(worker);
  e.medium = std::move(medium);
  e.data = KvCleared{};
  return e;
}

// Content hashes of blocks 100.. of `stored(.., 100, ..)` above.
std::vector<LocalBlockHash> prompt(size_t n) {
  std::vector<LocalBlockHash> q;
  for (size_t i = 0; i < n; ++i) q.push_back(LocalBlockHash{1 + i});
  return q;
}

const OwnerOverlap* find(const OverlapScores& s, CacheOwner o) {
  for (const auto& x : s.owners)
    if (x.owner == o) return &x;
  return nullptr;
}

std::vector<PoolSpec> one_pool() { return {PoolSpec{"shared", "LMCache", {WorkerId{1}, WorkerId{2}}, 0}}; }

constexpr size_t kPool0 = kNumBaseTiers;  // by_tier index of pool 0

}  // namespace

TEST_CASE("a block a member stores in the pool counts for every member, in the pool's tier") {
  RadixIndexer radix;
  PoolIndex idx(radix, one_pool());
  REQUIRE(idx.apply(stored(1, 100, 4, std::nullopt, "lmcache")) == ApplyResult::Applied);  // case-insensitive
  const auto s = idx.find_matches(prompt(4));
  for (uint64_t w : {1, 2}) {
    const OwnerOverlap* o = find(s, ow(w));
    REQUIRE(o != nullptr);
    CHECK(o->blocks == 4);
    CHECK(o->by_tier[kPool0] == 4);
    CHECK(o->by_tier[0] == 0);
  }
  // The pool itself is never listed; a worker outside the pool gets nothing.
  CHECK(find(s, PoolIndex::pool_owner(0)) == nullptr);
  CHECK(s.owners.size() == 2);
  CHECK(idx.counters().events == 1);
}

TEST_CASE("a member's own prefix comes first, the pool continues it; a longer own prefix is kept") {
  RadixIndexer radix;
  PoolIndex idx(radix, one_pool());
  idx.apply(stored(1, 100, 6, std::nullopt, "LMCache"));  // pool: blocks 0..5
  idx.apply(stored(2, 100, 2));                            // worker 2: blocks 0..1 on its device
  const auto s = idx.find_matches(prompt(8));
  const OwnerOverlap* two = find(s, ow(2));
  REQUIRE(two != nullptr);
  CHECK(two->blocks == 6);
  CHECK(two->by_tier[0] == 2);
  CHECK(two->by_tier[kPool0] == 4);
  // Worker 1 holds 8 on its device: the pool adds nothing.
  idx.apply(stored(1, 100, 8));
  const OwnerOverlap* one = find(idx.find_matches(prompt(8)), ow(1));
  REQUIRE(one != nullptr);
  CHECK(one->blocks == 8);
  CHECK(one->by_tier[kPool0] == 0);
}

TEST_CASE("a chain one member stored continues under another member's block; eviction by any member removes it for all") {
  RadixIndexer radix;
  PoolIndex idx(radix, one_pool());
  idx.apply(stored(1, 100, 2, std::nullopt, "LMCache"));
  // Worker 2 loaded blocks 0..1 from the pool and stores 2..3 after them.
  REQUIRE(idx.apply(stored(2, 102, 2, 101, "LMCache")) == ApplyResult::Applied);
  CHECK(find(idx.find_matches(prompt(4)), ow(1))->blocks == 4);
  // Worker 2 evicts block 1 from the pool: both members now hold 1 block.
  REQUIRE(idx.apply(removed(2, {101}, "LMCache")) == ApplyResult::Applied);
  const auto s = idx.find_matches(prompt(4));
  CHECK(find(s, ow(1))->blocks == 1);
  CHECK(find(s, ow(2))->blocks == 1);
}

TEST_CASE("a member's clear, restart or resync drops its own blocks only; a clear with the pool's medium empties the pool") {
  RadixIndexer radix;
  PoolIndex pools(radix, one_pool());
  EventSequencer seq(pools);
  seq.apply(stored(1, 100, 3, std::nullopt, "LMCache"));
  seq.apply(stored(2, 200, 1));  // worker 2's own device block (another prompt)
  seq.apply(cleared(1));         // worker 1's device cache reset
  CHECK(find(seq.find_matches(prompt(3)), ow(2))->blocks == 3);
  seq.apply_resync(ow(1), 0, {});  // worker 1 resyncs with an empty dump
  CHECK(find(seq.find_matches(prompt(3)), ow(2))->blocks == 3);
  seq.apply(cleared(2, "lmcache"));  // the pool flushed
  CHECK(seq.find_matches(prompt(3)).owners.empty());
  CHECK(pools.counters().emptied == 1);
}

TEST_CASE("the pool is emptied when the last member that published leaves, not before") {
  RadixIndexer radix;
  PoolIndex idx(radix, one_pool());
  idx.apply(stored(1, 100, 3, std::nullopt, "LMCache"));
  idx.apply(stored(2, 200, 1));
  idx.remove_worker(WorkerId{1});
  // Worker 2 still mounts it: the blocks stay (worker 1 is gone from the answer).
  auto s = idx.find_matches(prompt(3));
  REQUIRE(find(s, ow(2)) != nullptr);
  CHECK(find(s, ow(2))->blocks == 3);
  idx.remove_worker(WorkerId{2});
  CHECK(idx.find_matches(prompt(3)).owners.empty());
  // A member's later store starts an empty pool again.
  idx.apply(stored(2, 100, 1, std::nullopt, "LMCache"));
  CHECK(find(idx.find_matches(prompt(3)), ow(1))->blocks == 1);
}

TEST_CASE("hostile: a worker claiming a pool it does not mount keeps the blocks its own; pool ids are refused") {
  RadixIndexer radix;
  PoolIndex idx(radix, one_pool());
  REQUIRE(idx.apply(stored(9, 100, 3, std::nullopt, "LMCache")) == ApplyResult::Applied);
  const auto s = idx.find_matches(prompt(3));
  REQUIRE(s.owners.size() == 1);
  CHECK(s.owners[0].owner == ow(9));
  CHECK(s.owners[0].by_tier[static_cast<size_t>(StorageTier::External)] == 3);
  CHECK(idx.counters().claims_refused == 1);
  // An event naming a pool's owner id (or its removal) never touches the pool.
  idx.apply(stored(1, 100, 3, std::nullopt, "LMCache"));
  KvEvent forged = cleared(0);
  forged.owner = PoolIndex::pool_owner(0);
  CHECK(idx.apply(forged) == ApplyResult::ReservedOwner);
  KvEvent forged_store = stored(0, 500, 1);
  forged_store.owner = CacheOwner{PoolIndex::pool_owner(0).worker, 0};
  CHECK(idx.apply(forged_store) == ApplyResult::ReservedOwner);
  idx.remove_worker(PoolIndex::pool_owner(0).worker);
  idx.clear_owner(PoolIndex::pool_owner(0));
  CHECK(find(idx.find_matches(prompt(3)), ow(2))->blocks == 3);
  CHECK(idx.counters().reserved_refused == 2);
}

TEST_CASE("hostile: a flood of pool events stops at the pool's block limit; the members' own limits hold") {
  RadixIndexer radix;
  std::vector<PoolSpec> pools = one_pool();
  pools[0].max_blocks = 1000;
  PoolIndex idx(radix, pools);
  // A forged limit for the pool's id from a worker table is dropped; the pool's own applies.
  idx.set_block_limits({{WorkerId{2}, 50}, {PoolIndex::pool_owner(0).worker, 1ull << 30}}, 1ull << 22);
  for (uint64_t k = 0; k < 50; ++k) idx.apply(stored(1, 10000 + k * 100, 100, std::nullopt, "LMCache", k * 1000));
  CHECK(radix.is_capped(PoolIndex::pool_owner(0)));
  CHECK(radix.blocks_refused() == 4000);
  // Worker 2's own device blocks are bounded by its own limit, not the pool's.
  idx.apply(stored(2, 100, 80));
  CHECK(radix.is_capped(ow(2)));
  CHECK(radix.blocks_refused() == 4000 + 30);
}

TEST_CASE("find_match_layers gives find_matches' answer when a pool holds part of the prompt") {
  RadixIndexer radix;
  std::vector<PoolSpec> pools = one_pool();
  for (uint64_t w = 10; w < 40; ++w) pools[0].members.push_back(WorkerId{w});
  PoolIndex idx(radix, pools);
  for (uint64_t w = 10; w < 40; ++w) idx.apply(stored(w, 100, 2));  // a shared 2-block prefix on 30 devices
  idx.apply(stored(1, 100, 5, std::nullopt, "LMCache"));
  MatchLayers layers;
  idx.find_match_layers(prompt(6), layers);
  auto a = layers.expand().owners, b = idx.find_matches(prompt(6)).owners;
  auto by_owner = [](const OwnerOverlap& x, const OwnerOverlap& y) { return x.owner < y.owner; };
  std::sort(a.begin(), a.end(), by_owner);
  std::sort(b.begin(), b.end(), by_owner);
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == 32);
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].owner == b[i].owner);
    CHECK(a[i].blocks == b[i].blocks);
    CHECK(a[i].by_tier == b[i].by_tier);
  }
  const auto* m = find(idx.find_matches(prompt(6)), ow(15));
  REQUIRE(m != nullptr);
  CHECK(m->blocks == 5);
  CHECK(m->by_tier[0] == 2);
  CHECK(m->by_tier[kPool0] == 3);
}

namespace {

KvEvent numbered(KvEvent e, uint64_t id) {
  e.event_id = id;
  return e;
}

// Owners matching prompt `q` through find_match_layers, as find_matches lists them.
std::vector<OwnerOverlap> layered(const Indexer& idx, const std::vector<LocalBlockHash>& q) {
  MatchLayers layers;
  idx.find_match_layers(q, layers);
  return layers.expand().owners;
}

}  // namespace

TEST_CASE("a pool removal lost in a member's gap: the pool reads as none until that member's dump replaces it") {
  RadixIndexer radix;
  PoolIndex pools(radix, one_pool());
  EventSequencer seq(pools);
  seq.apply(numbered(stored(1, 100, 3, std::nullopt, "LMCache"), 1));
  // Event 2 (worker 1 evicts block 102 from the pool) is lost; event 3 shows the gap.
  seq.apply(numbered(stored(1, 500, 1, std::nullopt, {}, 700), 3));
  REQUIRE(seq.is_stale(ow(1)));
  CHECK(pools.is_stale(0));
  // Like a stale worker's, the pool's hits count as none meanwhile, for every member.
  CHECK(find(seq.find_matches(prompt(3)), ow(2)) == nullptr);
  CHECK(layered(seq, prompt(3)).empty());
  // The dump, taken after event 2, lists the pool as worker 1 sees it: 100, 101.
  seq.apply_resync(ow(1), 2, {stored(1, 100, 2, std::nullopt, "LMCache")});
  CHECK_FALSE(pools.is_stale(0));
  CHECK_FALSE(seq.is_stale(ow(1)));
  for (uint64_t w : {1, 2}) {
    const OwnerOverlap* o = find(seq.find_matches(prompt(3)), ow(w));
    REQUIRE(o != nullptr);
    CHECK(o->blocks == 2);
    CHECK(o->by_tier[kPool0] == 2);
  }
  CHECK(pools.counters().resyncs == 1);
}

TEST_CASE("pool events arriving while a member's dump is awaited are replayed after the dump, in arrival order") {
  RadixIndexer radix;
  PoolIndex pools(radix, one_pool());
  EventSequencer seq(pools);
  seq.apply(numbered(stored(1, 100, 4, std::nullopt, "LMCache"), 1));
  // Worker 1 loses event 2; its event 3 (a pool block 900, another prompt) is held for the replay.
  seq.apply(numbered(stored(1, 900, 1, std::nullopt, "LMCache", 5000), 3));
  REQUIRE(seq.is_stale(ow(1)));
  // Then worker 2 evicts block 103 and that block 900 from the pool.
  seq.apply(removed(2, {103, 900}, "LMCache"));
  // Worker 1's dump was taken before worker 2's eviction reached it: 100..103.
  seq.apply_resync(ow(1), 2, {stored(1, 100, 4, std::nullopt, "LMCache")});
  // The eviction that arrived after the request is not undone by the dump...
  const OwnerOverlap* two = find(seq.find_matches(prompt(4)), ow(2));
  REQUIRE(two != nullptr);
  CHECK(two->blocks == 3);
  // ...nor by replaying worker 1's held store after it (it came before the eviction).
  std::vector<LocalBlockHash> other{LocalBlockHash{5000 + 800}};
  CHECK(seq.find_matches(other).owners.empty());
  // Worker 1's sequence goes on from event 3.
  seq.apply(numbered(removed(1, {102}, "LMCache"), 4));
  CHECK(find(seq.find_matches(prompt(4)), ow(2))->blocks == 2);
  CHECK_FALSE(pools.is_stale(0));
}

TEST_CASE("a dump asked for while trusted keeps the pool readable and undoes no eviction that came meanwhile") {
  RadixIndexer radix;
  PoolIndex pools(radix, one_pool());
  EventSequencer seq(pools);
  seq.apply(numbered(stored(1, 100, 3, std::nullopt, "LMCache"), 1));
  seq.begin_resync(ow(1));  // e.g. after a NATS reconnect
  CHECK_FALSE(pools.is_stale(0));
  CHECK(find(seq.find_matches(prompt(3)), ow(2))->blocks == 3);
  seq.apply(removed(2, {102}, "LMCache"));
  // The dump, taken before the eviction reached worker 1, still lists 102.
  seq.apply_resync(ow(1), 1, {stored(1, 100, 3, std::nullopt, "LMCache")});
  CHECK(find(seq.find_matches(prompt(3)), ow(2))->blocks == 2);
}

TEST_CASE("a member leaving or restarting with its dump owed after a gap empties the pool") {
  for (const bool restart : {false, true}) {
    CAPTURE(restart);
    RadixIndexer radix;
    PoolIndex pools(radix, one_pool());
    EventSequencer seq(pools);
    seq.apply(stored(2, 200, 1));  // worker 2 publishes too: the pool is not emptied for want of members
    KvEvent first = numbered(stored(1, 100, 3, std::nullopt, "LMCache"), 1);
    first.instance = 7;
    seq.apply(first);
    KvEvent after_gap = numbered(stored(1, 500, 1, std::nullopt, {}, 700), 3);
    after_gap.instance = 7;
    seq.apply(after_gap);
    REQUIRE(pools.is_stale(0));
    const uint64_t emptied = pools.counters().emptied;
    if (restart)
      seq.on_instance(WorkerId{1}, 8);
    else
      seq.remove_worker(WorkerId{1});
    // Its lost events may have evicted anything: the pool holds nothing it cannot vouch for.
    CHECK_FALSE(pools.is_stale(0));
    CHECK(pools.counters().emptied == emptied + 1);
    CHECK(seq.find_matches(prompt(3)).owners.empty());
    // Worker 2's later stores fill it again.
    seq.apply(stored(2, 100, 1, std::nullopt, "LMCache"));
    CHECK(find(seq.find_matches(prompt(3)), ow(2))->blocks == 1);
  }
}

TEST_CASE("hostile: a flood of pool events while a dump is awaited is bounded; the dump then empties the pool") {
  RadixIndexer radix;
  PoolIndex pools(radix, one_pool());
  EventSequencer seq(pools);
  seq.apply(numbered(stored(1, 100, 3, std::nullopt, "LMCache"), 1));
  seq.apply(numbered(stored(1, 500, 1, std::nullopt, {}, 700), 3));  // a gap
  REQUIRE(pools.is_stale(0));
  for (uint64_t k = 0; k <= PoolIndex::kMaxLogEvents; ++k) seq.apply(removed(2, {100 + k % 3}, "LMCache"));
  const uint64_t emptied = pools.counters().emptied;
  seq.apply_resync(ow(1), 2, {stored(1, 100, 3, std::nullopt, "LMCache")});
  CHECK(pools.counters().emptied == emptied + 1);
  CHECK(pools.counters().resyncs == 0);
  CHECK(seq.find_matches(prompt(3)).owners.empty());
  CHECK_FALSE(pools.is_stale(0));
}

TEST_CASE("every dp rank of a member can load the pool: each rank's own prefix is continued by it") {
  RadixIndexer radix;
  PoolIndex idx(radix, one_pool());
  idx.apply(stored(1, 100, 6, std::nullopt, "LMCache"));  // the pool: 6 blocks
  KvEvent on_rank1 = stored(2, 100, 2);                     // worker 2's dp rank 1: 2 blocks on its device
  on_rank1.owner = ow(2, 1);
  idx.apply(on_rank1);
  const auto s = idx.find_matches(prompt(8));
  const OwnerOverlap* rank1 = find(s, ow(2, 1));
  REQUIRE(rank1 != nullptr);
  CHECK(rank1->blocks == 6);
  CHECK(rank1->by_tier[0] == 2);
  CHECK(rank1->by_tier[kPool0] == 4);
  // Worker 2's rank 1 is its best: no pool-only entry on rank 0 competes with it.
  CHECK(find(s, ow(2, 0)) == nullptr);
  // Worker 1 holds nothing itself: one pool-only entry (any rank loads it alike).
  const OwnerOverlap* one = find(s, ow(1, 0));
  REQUIRE(one != nullptr);
  CHECK(one->by_tier[kPool0] == 6);
  CHECK(s.owners.size() == 2);
  auto a = layered(idx, prompt(8));
  CHECK(a.size() == 2);
  for (const auto& o : a) CHECK(o.blocks == 6);
}

TEST_CASE("a dump that was asked for and lists none of the pool leaves it empty; one nobody asked for replaces nothing") {
  RadixIndexer radix;
  PoolIndex pools(radix, one_pool());
  EventSequencer seq(pools);
  seq.apply(numbered(stored(1, 100, 3, std::nullopt, "LMCache"), 1));
  seq.apply_resync(ow(1), 1, {});  // not asked for: the pool keeps its blocks
  CHECK(find(seq.find_matches(prompt(3)), ow(2))->blocks == 3);
  seq.apply(numbered(stored(1, 500, 1, std::nullopt, {}, 700), 3));  // a gap
  seq.apply_resync(ow(1), 2, {stored(1, 500, 1, std::nullopt, {}, 700)});  // its own block only
  CHECK(seq.find_matches(prompt(3)).owners.empty());
  CHECK_FALSE(pools.is_stale(0));
}
