// Fuzz target: the index writer (indexer/radix_indexer.h) under events a
// hostile worker chooses. The bytes are a program of operations on one
// RadixIndexer with small per-worker block limits: stored chains (under the
// root, under a block the owner holds, or under one it does not), removals,
// clears, worker removals and lookups, with ids drawn from adversarial
// distributions: a tiny range (block id reuse, aliases, the same content
// under several ids), ids crafted to share one slot of an unkeyed
// multiplicative hash, and raw 64-bit values.
// Contract checked beyond ASan/UBSan:
//   - no worker holds more block ids than its limit;
//   - a lookup reports owners with 1..query length blocks, each at most once;
//   - once every worker is removed, the index is empty (no blocks, no
//     entries, no capped owner) and reports no more memory than a fresh one.
// One index serves every input, as the daemon's one index lives through
// every worker's churn: each input must leave it empty (checked above), so
// what one input hands the next is only what an emptied index keeps (free
// node lists, table capacities, the first arena chunk), and that reuse is
// itself under test. It also spares each input the arena's first chunk
// (65,536 nodes) being mapped and poisoned afresh, which was most of the
// target's own time under ASan. The price: a crash that depends on free
// lists an earlier input left may not reproduce from its saved input alone
// (rerun the corpus in order with -runs to find it).
// Time per input is bounded: at most 256 operations of at most 64 blocks.
#include <set>
#include <string>

#include "indexer/radix_indexer.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | byte();
    return v;
  }
};

uint64_t crafted(uint64_t v) {
  constexpr uint64_t g = 0x9E3779B97F4A7C15ull;
  uint64_t inv = g;
  for (int i = 0; i < 6; ++i) inv *= 2 - g * inv;
  v = (v & 0xffffffffull) + 1;
  return ((v << 32) | v) * inv;
}

// An id in the distribution `mode` picks.
uint64_t pick(Reader& r, uint8_t mode) {
  switch (mode & 3) {
    case 0: return r.byte() & 15;            // tiny range: reuse and aliases
    case 1: return crafted(r.byte());        // one slot of the unkeyed hash
    case 2: return 1000 + (r.byte() & 63);   // a small dense range
    default: return r.u64();                 // anything
  }
}

constexpr uint32_t kWorkers = 3;
constexpr uint64_t kLimit = 200;  // per worker (all ranks), worker 0 has the ceiling

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  static RadixIndexer idx;
  static const uint64_t empty_bytes = idx.stats().bytes;
  idx.set_block_limits({{WorkerId{1}, kLimit}, {WorkerId{2}, kLimit / 2}}, 2 * kLimit);
  for (int op = 0; op < 256 && r.n; ++op) {
    const uint8_t code = r.byte();
    const CacheOwner owner{WorkerId{(code >> 3) % kWorkers}, static_cast<uint32_t>((code >> 5) & 1)};
    KvEvent e;
    e.owner = owner;
    e.tier = static_cast<StorageTier>((code >> 6) & 3);
    switch (code & 7) {
      case 0:
      case 1:
      case 2: {  // stored chain
        const uint8_t shape = r.byte();
        KvStored s;
        if (shape & 0x80) s.parent = SequenceHash{pick(r, shape >> 2)};
        const size_t n = 1 + (r.byte() & 63);
        for (size_t i = 0; i < n && r.n; ++i)
          s.blocks.push_back({SequenceHash{pick(r, shape)}, LocalBlockHash{pick(r, shape >> 4)}});
        e.data = std::move(s);
        idx.apply(e);
        break;
      }
      case 3:
      case 4: {  // removed
        const uint8_t shape = r.byte();
        KvRemoved rm;
        const size_t n = 1 + (r.byte() & 31);
        for (size_t i = 0; i < n && r.n; ++i) rm.block_hashes.push_back(SequenceHash{pick(r, shape)});
        e.data = std::move(rm);
        idx.apply(e);
        break;
      }
      case 5:
        e.data = KvCleared{};
        idx.apply(e);
        break;
      case 6:
        idx.remove_worker(owner.worker);
        break;
      default: {  // lookup
        const uint8_t shape = r.byte();
        std::vector<LocalBlockHash> q;
        const size_t n = 1 + (r.byte() & 15);
        for (size_t i = 0; i < n && r.n; ++i) q.push_back(LocalBlockHash{pick(r, shape)});
        const auto m = idx.find_matches(q);
        std::set<CacheOwner> seen;
        for (const auto& o : m.owners) {
          FUZZ_CHECK(o.blocks >= 1 && o.blocks <= q.size());
          FUZZ_CHECK(seen.insert(o.owner).second);
        }
        break;
      }
    }
    for (const auto& [w, held] : idx.entries_by_worker()) {
      const uint64_t limit = w.value == 1 ? kLimit : w.value == 2 ? kLimit / 2 : 2 * kLimit;
      FUZZ_CHECK(held <= limit);
    }
  }
  for (uint32_t w = 0; w < kWorkers; ++w) idx.remove_worker(WorkerId{w});
  const auto s = idx.stats();
  FUZZ_CHECK(s.blocks == 0);
  FUZZ_CHECK(s.entries == 0);
  FUZZ_CHECK(idx.capped_owners() == 0);
  FUZZ_CHECK(s.bytes <= empty_bytes + 64 * 1024);  // tables' capacities, not the arena
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  std::vector<std::string> seeds;
  // A chain, a child under it, an alias, a removal, a lookup, a clear.
  seeds.push_back(std::string("\x00\x00\x05\x01\x01\x02\x02\x03\x03\x04\x04\x05\x05", 13));
  seeds.push_back(std::string("\x08\x81\x01\x03\x06\x07\x07\x08\x03\x00\x01\x01\x07\x00\x02\x01\x02", 17));
  seeds.push_back(std::string("\x00\x05\x3f", 3) + std::string(130, '\x07'));  // crafted ids
  seeds.push_back(std::string("\x10\x00\x3f", 3) + std::string(130, '\x01') + std::string("\x15\x06", 2));
  return seeds;
}
