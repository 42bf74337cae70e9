// Test events over "documents", shared by the index and scheduler tests:
// owner `who` stores document d's first n blocks (content d * 1000 + i + 1) as
// one chain from the root. Engine block ids are unique per owner (dp_rank < 8).
#pragma once

#include <cstdint>

#include "indexer/kv_event.h"

namespace kvroute::testing {

inline SequenceHash doc_block_id(CacheOwner who, uint64_t d, uint32_t i) {
  return SequenceHash{(who.worker.value * 8 + who.dp_rank) * 1000000ull + d * 1000 + i + 1};
}

inline KvEvent store_doc(CacheOwner who, uint64_t d, uint32_t n, StorageTier tier) {
  KvEvent e;
  e.owner = who;
  e.tier = tier;
  KvStored s;
  for (uint32_t i = 0; i < n; ++i) s.blocks.push_back({doc_block_id(who, d, i), LocalBlockHash{d * 1000 + i + 1}});
  e.data = s;
  return e;
}

// Removes block i of document d from `who`'s cache.
inline KvEvent remove_doc_block(CacheOwner who, uint64_t d, uint32_t i) {
  KvEvent e;
  e.owner = who;
  KvRemoved r;
  r.block_hashes.push_back(doc_block_id(who, d, i));
  e.data = r;
  return e;
}

}  // namespace kvroute::testing
