// find_match_layers: the same answer as find_matches (MatchLayers::expand),
// in nested layers where the owner sets along the path allow it.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "indexer/radix_indexer.h"
#include "tests/indexer/doc_events.h"

using namespace kvroute;
using kvroute::testing::remove_doc_block;
using kvroute::testing::store_doc;

namespace {

std::vector<LocalBlockHash> doc_request(uint64_t d, uint32_t n, uint64_t diverge_at) {
  std::vector<LocalBlockHash> v;
  for (uint32_t i = 0; i < n; ++i) v.push_back(LocalBlockHash{i == diverge_at ? 999999999ull : d * 1000 + i + 1});
  return v;
}

std::vector<OwnerOverlap> sorted(std::vector<OwnerOverlap> v) {
  std::sort(v.begin(), v.end(), [](const OwnerOverlap& a, const OwnerOverlap& b) { return a.owner < b.owner; });
  return v;
}

}  // namespace

TEST_CASE("find_match_layers expands to find_matches; layers are nested, one tier each") {
  std::mt19937_64 rng(424242);
  auto pick = [&](uint64_t n) { return rng() % n; };
  int layered = 0, fell_back = 0, with_large = 0, queries = 0;
  for (int trial = 0; trial < 40; ++trial) {
    RadixIndexer idx;
    const uint32_t owners = 2 + static_cast<uint32_t>(pick(60));
    const uint64_t docs = 1 + pick(4);
    const bool some_host = pick(3) == 0;
    std::vector<CacheOwner> who;
    for (uint32_t k = 0; k < owners; ++k) who.push_back(CacheOwner{WorkerId{1 + k / 2}, k % 2});
    for (int step = 0; step < 400; ++step) {
      const uint32_t k = static_cast<uint32_t>(pick(owners));
      const uint64_t d = pick(docs);
      const uint64_t op = pick(100);
      if (op < 70) {
        const StorageTier tier = some_host && pick(8) == 0 ? StorageTier::HostPinned : StorageTier::Device;
        idx.apply(store_doc(who[k], d, 1 + static_cast<uint32_t>(pick(40)), tier));
      } else if (op < 95) {
        idx.apply(remove_doc_block(who[k], d, static_cast<uint32_t>(pick(40))));  // may break nesting
      } else {
        idx.clear_owner(who[k]);
      }
      if (step % 10 != 0) continue;
      const auto q = doc_request(pick(docs), 1 + static_cast<uint32_t>(pick(48)), pick(3) == 0 ? pick(48) : ~0ull);
      MatchLayers m;
      idx.find_match_layers(q, m);
      const auto want = sorted(idx.find_matches(q).owners);
      const auto got = sorted(m.expand().owners);
      ++queries;
      // The longest overlap, both ways: it is what the in-flight prefix must exceed.
      uint32_t longest = 0;
      for (const auto& o : want) longest = std::max(longest, o.blocks);
      CHECK(m.longest() == longest);
      CHECK(idx.find_matches(q).longest() == longest);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i].owner == want[i].owner);
        CHECK(got[i].blocks == want[i].blocks);
        CHECK(got[i].by_tier == want[i].by_tier);
      }
      for (size_t l = 0; l < m.layers.size(); ++l) {
        const auto& layer = m.layers[l];
        uint32_t tier_sum = 0;
        for (uint32_t t : layer.by_tier) tier_sum += t;
        CHECK(tier_sum == layer.blocks);
        with_large += layer.set->owners.size() > 16;
        if (l == 0) continue;
        CHECK(layer.blocks > m.layers[l - 1].blocks);
        const auto& outer = m.layers[l - 1].set->owners;
        for (const CacheOwner& c : layer.set->owners)
          CHECK(std::find(outer.begin(), outer.end(), c) != outer.end());
      }
      if (!m.layers.empty()) ++layered;
      else if (m.extra.size() > 1) ++fell_back;
    }
  }
  CHECK(queries == 1600);
  // Both ways are exercised: shared sets in layers, and broken nesting /
  // mixed tiers falling back to one entry per owner.
  CHECK(layered > 300);
  CHECK(with_large > 100);
  CHECK(fell_back > 20);
}

TEST_CASE("a set's serial is never reused; a reader keeps the set alive after the index drops it") {
  RadixIndexer idx;
  const CacheOwner a{WorkerId{1}, 0}, b{WorkerId{2}, 0};
  idx.apply(store_doc(a, 1, 4, StorageTier::Device));
  idx.apply(store_doc(b, 1, 4, StorageTier::Device));
  MatchLayers m;
  idx.find_match_layers(doc_request(1, 4, ~0ull), m);
  REQUIRE(m.layers.size() == 1);
  CHECK(m.layers[0].blocks == 4);
  CHECK(m.layers[0].set->owners.size() == 2);
  const auto kept = m.layers[0].set;
  const uint64_t serial = kept->serial;
  idx.clear_owner(b);  // the list {a, b} is freed in the index
  idx.apply(store_doc(b, 1, 4, StorageTier::Device));  // and made again
  CHECK(kept->owners.size() == 2);
  idx.find_match_layers(doc_request(1, 4, ~0ull), m);
  REQUIRE(m.layers.size() == 1);
  CHECK(m.layers[0].set->serial != serial);
}
