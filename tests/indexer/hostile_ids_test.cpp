// Workers choose the ids the index is keyed by (engine block ids, content
// hashes) and how many blocks they store: neither may turn the index against
// the other workers.
#include "indexer/flat_map.h"

#include <doctest/doctest.h>

#include <random>

#include "indexer/radix_indexer.h"

using namespace kvroute;

namespace {

// Ids that all land in slot 0 of a table hashed the way FlatMap64 did before
// it was keyed (h = id * 0x9E3779B97F4A7C15, slot = (h ^ h >> 32) & mask), at
// every capacity: h's two halves are equal. (An attacker's precomputation.)
std::vector<uint64_t> crafted_ids(size_t n) {
  const uint64_t g = 0x9E3779B97F4A7C15ull;
  uint64_t inv = g;  // Newton's iteration for g^-1 mod 2^64
  for (int i = 0; i < 6; ++i) inv *= 2 - g * inv;
  std::vector<uint64_t> ids;
  for (uint64_t v = 1; ids.size() < n; ++v) ids.push_back(((v << 32) | v) * inv);
  return ids;
}

CacheOwner ow(uint64_t w, uint32_t r = 0) { return CacheOwner{WorkerId{w}, r}; }

KvEvent chain(CacheOwner o, uint64_t first_id, size_t n, std::optional<uint64_t> parent = std::nullopt,
              uint64_t content = 1) {
  KvEvent e;
  e.owner = o;
  KvStored s;
  if (parent) s.parent = SequenceHash{*parent};
  for (size_t i = 0; i < n; ++i) s.blocks.push_back({SequenceHash{first_id + i}, LocalBlockHash{content + i}});
  e.data = s;
  return e;
}

KvEvent cleared(CacheOwner o) {
  KvEvent e;
  e.owner = o;
  e.data = KvCleared{};
  return e;
}

}  // namespace

TEST_CASE("ids crafted against an unkeyed hash spread over the keyed table") {
  const auto ids = crafted_ids(20000);
  FlatMap64<uint32_t> m;
  for (uint64_t id : ids) m.put(id, 1);
  size_t longest = 0;
  for (uint64_t id : ids) longest = std::max(longest, m.probe_length(id));
  // Random keys at load <= 0.75 have probe runs of a few dozen at most; the
  // unkeyed hash put all 20,000 in one run.
  CHECK(longest < 200);
  CHECK(m.size() == ids.size());
}

TEST_CASE("grown / shrunk copies hold the same entries") {
  FlatMap64<uint32_t> m;
  for (uint32_t i = 0; i < 5000; ++i) m.put(i * 7919ull, i);
  auto g = m.grown();
  CHECK(g.capacity() == 2 * m.capacity());
  for (uint32_t i = 0; i < 5000; ++i) REQUIRE(*g.find(i * 7919ull) == i);
  for (uint32_t i = 0; i < 4900; ++i) g.erase_no_shrink(i * 7919ull);
  CHECK(g.wants_shrink());
  auto s = g.shrunk();
  CHECK(!s.wants_shrink());
  CHECK(s.size() == 100);
  for (uint32_t i = 4900; i < 5000; ++i) REQUIRE(*s.find(i * 7919ull) == i);
}

TEST_CASE("a worker's blocks stop at its limit; the owner is capped, the others are not touched") {
  RadixIndexer idx;
  idx.set_block_limits({{WorkerId{1}, 100}}, 1000);
  CHECK(idx.apply(chain(ow(2), 1, 50)) == ApplyResult::Applied);
  CHECK(idx.apply(chain(ow(1), 1000, 80)) == ApplyResult::Applied);
  CHECK(idx.apply(chain(ow(1, 1), 2000, 30)) == ApplyResult::OverLimit);  // ranks share the worker's limit
  CHECK(idx.stats().entries == 50 + 100);
  CHECK(idx.blocks_refused() == 10);
  CHECK(idx.is_capped(ow(1, 1)));
  CHECK(!idx.is_capped(ow(1)));
  CHECK(!idx.is_capped(ow(2)));
  CHECK(idx.capped_owners() == 1);
  // Storing a block id it already holds is not growth.
  CHECK(idx.apply(chain(ow(1), 1000, 80)) == ApplyResult::Applied);
  // The unlisted worker gets the ceiling.
  CHECK(idx.apply(chain(ow(3), 5000, 1200)) == ApplyResult::OverLimit);
  CHECK(idx.blocks_refused() == 10 + 200);
  // A clear makes the owner whole (empty) again and frees its share.
  idx.apply(cleared(ow(1, 1)));
  CHECK(!idx.is_capped(ow(1, 1)));
  CHECK(idx.apply(chain(ow(1, 1), 3000, 20)) == ApplyResult::Applied);
  CHECK(idx.stats().entries == 50 + 100 + 1000);
}

TEST_CASE("memory is given back after a clear") {
  RadixIndexer idx;
  const uint64_t empty = idx.stats().bytes;
  for (uint64_t e = 0; e < 400; ++e) idx.apply(chain(ow(1), e * 1000 + 1, 500, std::nullopt, e * 1000 + 1));
  const auto full = idx.stats();
  CHECK(full.blocks == 200000);
  idx.apply(chain(ow(2), 1, 10));
  idx.remove_worker(WorkerId{1});
  const auto after = idx.stats();
  CHECK(after.entries == 10);
  INFO("bytes: empty " << empty << ", full " << full.bytes << ", after clear " << after.bytes);
  // The arena chunks of the cleared nodes are freed, not kept and counted.
  CHECK(after.bytes < empty + 200 * 1024);
  CHECK(full.bytes > after.bytes + 8 * 1024 * 1024);
}

TEST_CASE("a block id moved onto an unowned interior node whose only child it named") {
  RadixIndexer idx;
  // A(h1) -> B(h2); A removed: the h1 node is unowned but has a child.
  CHECK(idx.apply(chain(ow(1), 1, 2)) == ApplyResult::Applied);
  KvEvent rm;
  rm.owner = ow(1);
  rm.data = KvRemoved{{SequenceHash{1}}};
  CHECK(idx.apply(rm) == ApplyResult::Applied);
  // B now names content h1 at the root: pruning B's old node frees the h1
  // node, which must be made again, not used freed.
  CHECK(idx.apply(chain(ow(1), 2, 1, std::nullopt, 1)) == ApplyResult::Applied);
  const std::vector<LocalBlockHash> q{LocalBlockHash{1}};
  const auto m = idx.find_matches(q);
  REQUIRE(m.owners.size() == 1);
  CHECK(m.owners[0].blocks == 1);
  CHECK(idx.stats().blocks == 1);
  CHECK(idx.apply(chain(ow(1), 3, 1, 2, 2)) == ApplyResult::Applied);  // and it still grows under it
  CHECK(idx.stats().blocks == 2);
}

TEST_CASE("a crafted-id flood against one worker's block map leaves it consistent") {
  RadixIndexer idx;
  const auto ids = crafted_ids(50000);
  for (size_t i = 0; i < ids.size(); i += 250) {
    KvEvent e;
    e.owner = ow(9);
    KvStored s;
    for (size_t k = i; k < i + 250; ++k) s.blocks.push_back({SequenceHash{ids[k]}, LocalBlockHash{ids[k] ^ 0x5555}});
    e.data = s;
    REQUIRE(idx.apply(e) == ApplyResult::Applied);
  }
  CHECK(idx.stats().entries == ids.size());
  KvEvent rm;
  rm.owner = ow(9);
  KvRemoved r;
  for (size_t k = 0; k < ids.size(); k += 2) r.block_hashes.push_back(SequenceHash{ids[k]});
  rm.data = r;
  CHECK(idx.apply(rm) == ApplyResult::Applied);
  CHECK(idx.stats().entries == ids.size() / 2);
}
