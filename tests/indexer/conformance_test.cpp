// One conformance suite over every Indexer implementation (Dynamo's
// parametrised indexer tests): the fast radix tree and the naive reference.
#include "indexer/indexer.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <thread>

#include "indexer/naive_indexer.h"
#include "indexer/radix_indexer.h"

using namespace kvroute;

namespace {

CacheOwner ow(uint64_t w, uint32_t r = 0) { return CacheOwner{WorkerId{w}, r}; }

// Block i of a chain: engine id = base + i, content hash = content[i].
KvEvent stored(CacheOwner o, std::optional<uint64_t> parent, std::vector<std::pair<uint64_t, uint64_t>> blocks,
               StorageTier tier = StorageTier::Device) {
  KvEvent e;
  e.owner = o;
  e.tier = tier;
  KvStored s;
  if (parent) s.parent = SequenceHash{*parent};
  for (auto [id, content] : blocks) s.blocks.push_back({SequenceHash{id}, LocalBlockHash{content}});
  e.data = s;
  return e;
}
KvEvent removed(CacheOwner o, std::vector<uint64_t> ids, StorageTier tier = StorageTier::Device) {
  KvEvent e;
  e.owner = o;
  e.tier = tier;
  KvRemoved r;
  for (auto id : ids) r.block_hashes.push_back(SequenceHash{id});
  e.data = r;
  return e;
}
KvEvent cleared(CacheOwner o) {
  KvEvent e;
  e.owner = o;
  e.data = KvCleared{};
  return e;
}
std::vector<LocalBlockHash> req(std::vector<uint64_t> contents) {
  std::vector<LocalBlockHash> v;
  for (auto c : contents) v.push_back(LocalBlockHash{c});
  return v;
}
// owner -> matched blocks
std::map<CacheOwner, uint32_t> overlap(const Indexer& idx, std::vector<uint64_t> contents) {
  std::map<CacheOwner, uint32_t> m;
  for (const auto& o : idx.find_matches(req(contents)).owners) m[o.owner] = o.blocks;
  return m;
}

}  // namespace

#define INDEXERS RadixIndexer, NaiveIndexer

TEST_CASE_TEMPLATE("store a chain and match prefixes", T, INDEXERS) {
  T idx;
  CHECK(idx.apply(stored(ow(1), {}, {{100, 1}, {101, 2}, {102, 3}})) == ApplyResult::Applied);
  CHECK(overlap(idx, {1, 2, 3}) == std::map<CacheOwner, uint32_t>{{ow(1), 3}});
  CHECK(overlap(idx, {1, 2, 9}) == std::map<CacheOwner, uint32_t>{{ow(1), 2}});
  CHECK(overlap(idx, {1, 2, 3, 4, 5}) == std::map<CacheOwner, uint32_t>{{ow(1), 3}});
  CHECK(overlap(idx, {2, 3}).empty());  // same content under another prefix is another block
  CHECK(overlap(idx, {}).empty());
  CHECK(idx.stats().blocks == 3);
  CHECK(idx.stats().entries == 3);
}

TEST_CASE_TEMPLATE("parent linking extends a chain; unknown parent is rejected", T, INDEXERS) {
  T idx;
  idx.apply(stored(ow(1), {}, {{100, 1}, {101, 2}}));
  CHECK(idx.apply(stored(ow(1), 101, {{102, 3}})) == ApplyResult::Applied);
  CHECK(overlap(idx, {1, 2, 3}) == std::map<CacheOwner, uint32_t>{{ow(1), 3}});
  CHECK(idx.apply(stored(ow(1), 999, {{103, 4}})) == ApplyResult::UnknownParent);
  CHECK(idx.apply(stored(ow(2), 101, {{103, 4}})) == ApplyResult::UnknownParent);  // parent is owner 1's
  CHECK(idx.stats().entries == 3);
}

TEST_CASE_TEMPLATE("owners share nodes and diverge mid-prefix", T, INDEXERS) {
  T idx;
  idx.apply(stored(ow(1), {}, {{10, 1}, {11, 2}, {12, 3}}));
  idx.apply(stored(ow(2), {}, {{20, 1}, {21, 2}, {22, 7}}));
  idx.apply(stored(ow(3), {}, {{30, 1}}));
  CHECK(overlap(idx, {1, 2, 3}) == std::map<CacheOwner, uint32_t>{{ow(1), 3}, {ow(2), 2}, {ow(3), 1}});
  CHECK(overlap(idx, {1, 2, 7}) == std::map<CacheOwner, uint32_t>{{ow(1), 2}, {ow(2), 3}, {ow(3), 1}});
  CHECK(idx.stats().blocks == 4);  // 1, 2, 3, 7
  CHECK(idx.stats().entries == 7);
}

TEST_CASE_TEMPLATE("an owner missing a middle block matches only up to it", T, INDEXERS) {
  T idx;
  idx.apply(stored(ow(1), {}, {{10, 1}, {11, 2}, {12, 3}}));
  CHECK(idx.apply(removed(ow(1), {11})) == ApplyResult::Applied);
  CHECK(overlap(idx, {1, 2, 3}) == std::map<CacheOwner, uint32_t>{{ow(1), 1}});
  CHECK(idx.stats().entries == 2);
  CHECK(idx.stats().blocks == 3);  // the interior node stays: block 3 hangs below it
}

TEST_CASE_TEMPLATE("removing a block removes nothing another owner holds", T, INDEXERS) {
  T idx;
  idx.apply(stored(ow(1), {}, {{10, 1}, {11, 2}}));
  idx.apply(stored(ow(2), {}, {{20, 1}, {21, 2}}));
  idx.apply(removed(ow(1), {10, 11}));
  CHECK(overlap(idx, {1, 2}) == std::map<CacheOwner, uint32_t>{{ow(2), 2}});
  CHECK(idx.stats().blocks == 2);
  // Removing a block the owner does not hold is reported, harmlessly.
  CHECK(idx.apply(removed(ow(1), {10})) == ApplyResult::UnknownBlock);
  CHECK(idx.apply(removed(ow(9), {1})) == ApplyResult::UnknownBlock);
  CHECK(overlap(idx, {1, 2}) == std::map<CacheOwner, uint32_t>{{ow(2), 2}});
}

TEST_CASE_TEMPLATE("nodes nobody holds are freed", T, INDEXERS) {
  T idx;
  idx.apply(stored(ow(1), {}, {{10, 1}, {11, 2}, {12, 3}}));
  idx.apply(removed(ow(1), {12, 11, 10}));
  CHECK(idx.stats().blocks == 0);
  CHECK(idx.stats().entries == 0);
  idx.apply(stored(ow(1), {}, {{10, 1}, {11, 2}, {12, 3}}));
  idx.apply(removed(ow(1), {10}));  // root side first: the rest stays reachable only for lookups
  idx.apply(removed(ow(1), {11, 12}));
  CHECK(idx.stats().blocks == 0);
}

TEST_CASE_TEMPLATE("cleared drops one owner; remove_worker drops every dp rank", T, INDEXERS) {
  T idx;
  idx.apply(stored(ow(1, 0), {}, {{10, 1}, {11, 2}}));
  idx.apply(stored(ow(1, 1), {}, {{10, 1}, {11, 2}}));
  idx.apply(stored(ow(2), {}, {{20, 1}}));
  CHECK(overlap(idx, {1, 2}) == std::map<CacheOwner, uint32_t>{{ow(1, 0), 2}, {ow(1, 1), 2}, {ow(2), 1}});
  CHECK(idx.apply(cleared(ow(1, 1))) == ApplyResult::Applied);
  CHECK(overlap(idx, {1, 2}) == std::map<CacheOwner, uint32_t>{{ow(1, 0), 2}, {ow(2), 1}});
  idx.apply(stored(ow(1, 1), {}, {{10, 1}}));
  idx.remove_worker(WorkerId{1});
  CHECK(overlap(idx, {1, 2}) == std::map<CacheOwner, uint32_t>{{ow(2), 1}});
  CHECK(idx.stats().entries == 1);
  CHECK(idx.stats().blocks == 1);
  idx.clear_owner(ow(2));
  CHECK(idx.stats().blocks == 0);
}

TEST_CASE_TEMPLATE("storage tiers are reported per owner", T, INDEXERS) {
  T idx;
  idx.apply(stored(ow(1), {}, {{10, 1}, {11, 2}}, StorageTier::Device));
  idx.apply(stored(ow(1), 11, {{12, 3}}, StorageTier::HostPinned));
  idx.apply(stored(ow(2), {}, {{20, 1}}, StorageTier::Disk));
  auto r = idx.find_matches(req({1, 2, 3}));
  std::map<CacheOwner, OwnerOverlap> m;
  for (auto& o : r.owners) m[o.owner] = o;
  CHECK(m[ow(1)].blocks == 3);
  CHECK(m[ow(1)].by_tier == std::array<uint32_t, kNumStorageTiers>{2, 1, 0, 0});
  CHECK(m[ow(2)].by_tier == std::array<uint32_t, kNumStorageTiers>{0, 0, 1, 0});
  // Storing again in another tier keeps a copy there too; the best tier counts
  // (idempotent otherwise), and a removal from it leaves the other.
  idx.apply(stored(ow(2), {}, {{20, 1}}, StorageTier::External));
  idx.apply(stored(ow(2), {}, {{20, 1}}, StorageTier::External));
  auto tiers_of_2 = [&] {
    for (auto& o : idx.find_matches(req({1})).owners)
      if (o.owner == ow(2)) return o.by_tier;
    return std::array<uint32_t, kNumStorageTiers>{};
  };
  CHECK(tiers_of_2() == std::array<uint32_t, kNumStorageTiers>{0, 0, 1, 0});
  idx.apply(removed(ow(2), {20}, StorageTier::Disk));
  CHECK(tiers_of_2() == std::array<uint32_t, kNumStorageTiers>{0, 0, 0, 1});
  CHECK(idx.stats().entries == 4);
}

TEST_CASE_TEMPLATE("a removal takes a block out of the tier it names only; take_removed counts what left", T, INDEXERS) {
  T idx;
  idx.apply(stored(ow(1), {}, {{10, 1}, {11, 2}, {12, 3}}));
  idx.apply(stored(ow(2), {}, {{20, 1}}));
  // Copied to the host before the device lets it go: it stays cached there.
  idx.apply(stored(ow(1), 11, {{12, 3}}, StorageTier::HostPinned));
  for (const auto& o : idx.find_matches(req({1, 2, 3})).owners)
    if (o.owner == ow(1)) CHECK(o.by_tier == std::array<uint32_t, kNumStorageTiers>{3, 0, 0, 0});  // on the device still
  CHECK(idx.apply(removed(ow(1), {12, 11})) == ApplyResult::Applied);
  CHECK(overlap(idx, {1, 2, 3}) == std::map<CacheOwner, uint32_t>{{ow(1), 1}, {ow(2), 1}});
  // A removal from the host of a block on the device leaves it there.
  CHECK(idx.apply(removed(ow(2), {20}, StorageTier::HostPinned)) == ApplyResult::Applied);
  CHECK(overlap(idx, {1})[ow(2)] == 1);
  CHECK(idx.apply(removed(ow(1), {12, 99}, StorageTier::HostPinned)) == ApplyResult::UnknownBlock);
  std::vector<std::pair<WorkerId, uint64_t>> out;
  idx.take_removed(out);
  std::sort(out.begin(), out.end());
  CHECK(out == std::vector<std::pair<WorkerId, uint64_t>>{{WorkerId{1}, 2}});  // 11, then 12: not 20, not 99
  out.clear();
  idx.take_removed(out);
  CHECK(out.empty());  // taken once
  idx.apply(cleared(ow(1)));
  idx.take_removed(out);
  CHECK(out.empty());  // a clear is no eviction
  CHECK(idx.stats().entries == 1);
}

TEST_CASE_TEMPLATE("copies named by id only add a tier to the blocks the owner holds", T, INDEXERS) {
  T idx;
  idx.apply(stored(ow(1), {}, {{10, 1}, {11, 2}}));
  KvEvent copy = stored(ow(1), {}, {{11, 0}, {10, 0}, {77, 0}}, StorageTier::HostPinned);
  std::get<KvStored>(copy.data).copies = true;
  CHECK(idx.apply(copy) == ApplyResult::UnknownBlock);  // 77 is not held: ignored
  KvEvent stranger = copy;
  stranger.owner = ow(2);
  CHECK(idx.apply(stranger) == ApplyResult::UnknownBlock);  // holds nothing: nothing copied
  CHECK(idx.stats().entries == 2);
  for (const auto& o : idx.find_matches(req({1, 2})).owners)
    CHECK(o.by_tier == std::array<uint32_t, kNumStorageTiers>{2, 0, 0, 0});  // counted on the device
  // The device lets them go: both stay cached, on the host.
  idx.apply(removed(ow(1), {11, 10}));
  auto r = idx.find_matches(req({1, 2}));
  REQUIRE(r.owners.size() == 1);
  CHECK(r.owners[0].by_tier == std::array<uint32_t, kNumStorageTiers>{0, 2, 0, 0});
  std::vector<std::pair<WorkerId, uint64_t>> out;
  idx.take_removed(out);
  CHECK(out.empty());
}

TEST_CASE_TEMPLATE("re-applying the same events changes nothing", T, INDEXERS) {
  T idx;
  for (int i = 0; i < 3; ++i) {
    idx.apply(stored(ow(1), {}, {{10, 1}, {11, 2}}));
    idx.apply(stored(ow(1), 11, {{12, 3}}));
  }
  CHECK(idx.stats().entries == 3);
  CHECK(idx.stats().blocks == 3);
  CHECK(overlap(idx, {1, 2, 3}) == std::map<CacheOwner, uint32_t>{{ow(1), 3}});
}

TEST_CASE_TEMPLATE("a block id reused for other content moves", T, INDEXERS) {
  T idx;
  idx.apply(stored(ow(1), {}, {{10, 1}}));
  idx.apply(stored(ow(1), {}, {{10, 5}}));
  CHECK(overlap(idx, {1}).empty());
  CHECK(overlap(idx, {5}) == std::map<CacheOwner, uint32_t>{{ow(1), 1}});
  CHECK(idx.stats().entries == 1);
  CHECK(idx.stats().blocks == 1);
}

TEST_CASE_TEMPLATE("a prefix held by many owners: per-owner changes stay per owner", T, INDEXERS) {
  T idx;
  // 20 owners store the same 10-block chain (engine ids differ per owner).
  for (uint64_t w = 0; w < 20; ++w) {
    std::vector<std::pair<uint64_t, uint64_t>> blocks;
    for (uint64_t i = 0; i < 10; ++i) blocks.push_back({w * 100 + i, 500 + i});
    idx.apply(stored(ow(w), {}, blocks));
  }
  CHECK(idx.stats().blocks == 10);
  CHECK(idx.stats().entries == 200);
  // Owner 5 moves blocks 3..9 to the host tier (stored there, then removed
  // from the device); owner 7 loses block 6.
  std::vector<std::pair<uint64_t, uint64_t>> host;
  std::vector<uint64_t> moved;
  for (uint64_t i = 3; i < 10; ++i) host.push_back({500 + i, 500 + i}), moved.push_back(500 + i);
  idx.apply(stored(ow(5), 502, host, StorageTier::HostPinned));
  idx.apply(removed(ow(5), moved));
  idx.apply(removed(ow(7), {706}));
  std::vector<uint64_t> q;
  for (uint64_t i = 0; i < 10; ++i) q.push_back(500 + i);
  const auto r = idx.find_matches(req(q));
  REQUIRE(r.owners.size() == 20);
  for (const auto& o : r.owners) {
    const uint64_t w = o.owner.worker.value;
    if (w == 7) {
      CHECK(o.blocks == 6);
      CHECK(o.by_tier[0] == 6);
    } else if (w == 5) {
      CHECK(o.blocks == 10);
      CHECK(o.by_tier[0] == 3);
      CHECK(o.by_tier[1] == 7);
    } else {
      CHECK(o.blocks == 10);
      CHECK(o.by_tier[0] == 10);
    }
  }
  for (uint64_t w = 0; w < 20; ++w) idx.remove_worker(WorkerId{w});
  CHECK(idx.stats().blocks == 0);
  CHECK(idx.stats().entries == 0);
  CHECK(idx.find_matches(req(q)).owners.empty());
}

TEST_CASE_TEMPLATE("many children at one node (root fan-out)", T, INDEXERS) {
  T idx;
  for (uint64_t i = 0; i < 500; ++i) idx.apply(stored(ow(i % 7), {}, {{1000 + i, 50000 + i}}));
  for (uint64_t i = 0; i < 500; i += 37) CHECK(overlap(idx, {50000 + i}) == std::map<CacheOwner, uint32_t>{{ow(i % 7), 1}});
  for (uint64_t i = 0; i < 500; ++i) idx.apply(removed(ow(i % 7), {1000 + i}));
  CHECK(idx.stats().blocks == 0);
}

namespace {
// Random events from 12 owners (6 workers x 2 dp ranks) over block contents
// 1..`alphabet`; a small alphabet shares many nodes between owners, a large
// one gives nodes more than 8 children (the radix child map) and frees them.
void differential(uint64_t alphabet, uint64_t seed) {
  RadixIndexer fast;
  NaiveIndexer ref;
  std::mt19937_64 rng(seed);
  // Per owner, the chains it holds (engine ids) so removals and parents are realistic.
  std::map<CacheOwner, std::vector<uint64_t>> held;
  std::map<CacheOwner, KvEvent> last_store;  // stored again in another tier: a copy there
  uint64_t next_id = 1;
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  for (int step = 0; step < 20000; ++step) {
    const CacheOwner o = ow(1 + pick(6), static_cast<uint32_t>(pick(2)));
    const int op = static_cast<int>(pick(100));
    KvEvent ev;
    if (op < 8 && last_store.count(o)) {
      ev = last_store[o];
      ev.tier = static_cast<StorageTier>(pick(4));
      CHECK(fast.apply(ev) == ref.apply(ev));
    } else if (op < 11) {
      // Copies of held blocks named by id only (and now and then one not held).
      auto& h = held[o];
      std::vector<std::pair<uint64_t, uint64_t>> ids;
      for (size_t i = 0, n = 1 + pick(4); i < n && !h.empty(); ++i) ids.push_back({h[pick(h.size())], 0});
      if (pick(5) == 0) ids.push_back({123456789, 0});
      ev = stored(o, {}, ids, static_cast<StorageTier>(pick(4)));
      std::get<KvStored>(ev.data).copies = true;
      CHECK(fast.apply(ev) == ref.apply(ev));
    } else if (op < 60) {
      std::optional<uint64_t> parent;
      auto& h = held[o];
      if (!h.empty() && pick(3) > 0) parent = h[pick(h.size())];
      if (pick(20) == 0) parent = 999999999;  // unknown
      std::vector<std::pair<uint64_t, uint64_t>> blocks;
      const size_t n = 1 + pick(6);
      for (size_t i = 0; i < n; ++i) blocks.push_back({next_id++, 1 + pick(alphabet)});
      ev = stored(o, parent, blocks, static_cast<StorageTier>(pick(4)));
      if (fast.apply(ev) == ApplyResult::Applied)
        for (auto& b : blocks) h.push_back(b.first);
      ref.apply(ev);
      last_store[o] = ev;
    } else if (op < 90) {
      auto& h = held[o];
      std::vector<uint64_t> ids;
      for (size_t i = 0, n = 1 + pick(4); i < n && !h.empty(); ++i) {
        const size_t k = pick(h.size());
        ids.push_back(h[k]);
        h.erase(h.begin() + static_cast<long>(k));
      }
      if (pick(10) == 0) ids.push_back(123456789);
      // Mostly the device; a block held in another tier stays (then forgotten here).
      ev = removed(o, ids, pick(4) == 0 ? static_cast<StorageTier>(pick(4)) : StorageTier::Device);
      CHECK(fast.apply(ev) == ref.apply(ev));
    } else if (op < 95) {
      held[o].clear();
      fast.apply(cleared(o));
      ref.apply(cleared(o));
    } else {
      const WorkerId w{1 + pick(6)};
      for (auto& [k, v] : held)
        if (k.worker == w) v.clear();
      fast.remove_worker(w);
      ref.remove_worker(w);
    }
    if (step % 50 == 0) {
      std::vector<uint64_t> q;
      for (size_t i = 0, n = 1 + pick(8); i < n; ++i) q.push_back(1 + pick(alphabet));
      auto a = fast.find_matches(req(q)).owners, b = ref.find_matches(req(q)).owners;
      auto key = [](const OwnerOverlap& x, const OwnerOverlap& y) { return x.owner < y.owner; };
      std::sort(a.begin(), a.end(), key);
      std::sort(b.begin(), b.end(), key);
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        CHECK(a[i].owner == b[i].owner);
        CHECK(a[i].blocks == b[i].blocks);
        CHECK(a[i].by_tier == b[i].by_tier);
      }
      CHECK(fast.stats().entries == ref.stats().entries);
      CHECK(fast.stats().blocks == ref.stats().blocks);
      std::vector<std::pair<WorkerId, uint64_t>> ra, rb;
      fast.take_removed(ra);
      ref.take_removed(rb);
      std::sort(ra.begin(), ra.end());
      CHECK(ra == rb);  // the naive index's are sorted by worker
    }
  }
  // Drop everyone: both indexes end empty (every node freed).
  for (uint64_t w = 1; w <= 6; ++w) {
    fast.remove_worker(WorkerId{w});
    ref.remove_worker(WorkerId{w});
  }
  CHECK(fast.stats().blocks == 0);
  CHECK(fast.stats().entries == 0);
  CHECK(ref.stats().blocks == 0);
}
}  // namespace

TEST_CASE("randomised differential test: radix == naive over thousands of events") {
  SUBCASE("4 contents: shared nodes, owner lists") { differential(4, 20261123); }
  SUBCASE("24 contents: wide nodes, child maps") { differential(24, 7); }
}

TEST_CASE("readers run concurrently with the writer") {
  RadixIndexer idx;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> lookups{0};
  std::thread reader([&] {
    while (!stop) {
      auto r = idx.find_matches(req({1, 2, 3, 4}));
      for (auto& o : r.owners) CHECK(o.blocks <= 4);
      lookups++;
    }
  });
  for (uint64_t i = 0; i < 20000; ++i) {
    const uint64_t w = i % 50;
    idx.apply(stored(ow(w), {}, {{i * 4, 1}, {i * 4 + 1, 2}, {i * 4 + 2, 3}, {i * 4 + 3, 4}}));
    if (i % 3 == 0) idx.apply(cleared(ow(w)));
  }
  stop = true;
  reader.join();
  CHECK(lookups > 0);
}
