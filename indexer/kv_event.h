// In-memory KV cache events: what the index consumes. Decoded from the NATS
// wire format by events/ (see events/wire.h); kept separate from the wire structs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/types.h"

namespace kvroute {

// Two names of a storage medium are the same medium: engines spell them in
// either case (ASCII only).
inline bool same_medium(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

struct StoredBlock {
  SequenceHash block_hash;    // engine's id of the block
  LocalBlockHash tokens_hash; // content hash (block_hash.h)
};

// Blocks stored as a chain: blocks[0]'s parent is `parent` (absent = root),
// blocks[i]'s parent is blocks[i-1].
struct KvStored {
  std::optional<SequenceHash> parent;
  std::vector<StoredBlock> blocks;
  // Copies of blocks the owner already holds, named by their engine ids
  // only (vLLM's offloading connector announces its CPU copies without
  // tokens or parent): `parent` and each block's tokens_hash are unused; the
  // index adds the event's tier to the blocks it knows and ignores the rest.
  bool copies = false;
};

struct KvRemoved {
  std::vector<SequenceHash> block_hashes;
};

// The owner dropped every block (vLLM AllBlocksCleared).
struct KvCleared {};

struct KvEvent {
  CacheOwner owner;
  // Increases by one per owner; absent for sources that do not number events.
  std::optional<uint64_t> event_id;
  StorageTier tier = StorageTier::Device;
  std::variant<KvStored, KvRemoved, KvCleared> data;
  // The publishing process's instance id (changes when the worker restarts);
  // 0 = not announced (older publishers). The sequencer detects restarts by it.
  uint64_t instance = 0;
  // The storage medium as the engine named it (vLLM's `medium`, the NATS
  // event's `medium`), at most kMaxMediumBytes (decoders drop longer names:
  // no pool's medium is that long); empty = none named. Matched against the
  // media of `kv_pools` (indexer/pool_index.h); `tier` is what it maps to
  // otherwise.
  std::string medium;
};

// `medium` if a pool could be named by it, else empty (kept within SSO: no
// allocation per event).
inline std::string_view bounded_medium(std::string_view medium) {
  return medium.size() <= kMaxMediumBytes ? medium : std::string_view{};
}

}  // namespace kvroute
