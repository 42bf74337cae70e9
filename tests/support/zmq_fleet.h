// Test helpers for ZMQ KV events: deterministic vLLM batches, an index fed by
// a ZmqEventSource sink, a reference index fed directly, and their comparison.
// Header-only; each test thread owns its objects (the sink locks its index).
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "events/vllm_wire.h"
#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"

namespace kvroute::testing {

// Polls `pred` until it holds or `timeout` passes; returns its last value.
inline bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// Batch i of a synthetic engine: a new 3-block prompt (root chain), and from
// i >= 2 the removal of the last block of prompt i - 2. Hashes are unique per
// (generation, i) so two engine incarnations never share ids.
inline VllmEventBatch synthetic_batch(uint64_t i, uint32_t block_size, uint64_t generation = 0) {
  VllmEventBatch b;
  b.ts = static_cast<double>(i);
  VllmBlockStored s;
  const uint64_t base = (generation << 40) + i * 16 + 1;
  for (uint64_t k = 0; k < 3; ++k) s.block_hashes.push_back(SequenceHash{base + k});
  for (uint32_t t = 0; t < 3 * block_size; ++t) s.token_ids.push_back(static_cast<TokenId>(generation * 1000003 + i * 131 + t));
  s.block_size = block_size;
  s.medium = "GPU";
  b.events.push_back(std::move(s));
  if (i >= 2) b.events.push_back(VllmBlockRemoved{{SequenceHash{(generation << 40) + (i - 2) * 16 + 3}}, "GPU", {}});
  return b;
}

// Local hash chains of the prompts of batches [0, n) (for find_matches).
inline std::vector<std::vector<LocalBlockHash>> synthetic_chains(uint64_t n, uint32_t block_size, uint64_t generation = 0) {
  std::vector<std::vector<LocalBlockHash>> out;
  for (uint64_t i = 0; i < n; ++i) {
    auto b = synthetic_batch(i, block_size, generation);
    out.push_back(hash_blocks(std::get<VllmBlockStored>(b.events[0]).token_ids, block_size));
  }
  return out;
}

// An index behind a sink, safe to read from the test thread.
struct SinkIndex {
  std::mutex mu;
  RadixIndexer index;
  uint64_t batches = 0;
  bool apply(std::vector<KvEvent>&& evs) {
    std::lock_guard lk(mu);
    for (const auto& e : evs) index.apply(e);
    ++batches;
    return true;
  }
  uint64_t entries() {
    std::lock_guard lk(mu);
    return index.stats().entries;
  }
};

// Per chain: the owner's matched prefix length in `idx` (0 = none).
inline std::vector<uint32_t> overlaps(const Indexer& idx, const std::vector<std::vector<LocalBlockHash>>& chains,
                                      CacheOwner owner) {
  std::vector<uint32_t> out;
  for (const auto& c : chains) {
    uint32_t n = 0;
    for (const auto& o : idx.find_matches(c).owners)
      if (o.owner == owner) n = o.blocks;
    out.push_back(n);
  }
  return out;
}

// What an index fed batches [from, to) of `generation` directly holds.
inline void apply_reference(RadixIndexer& ref, CacheOwner owner, uint64_t from, uint64_t to, uint32_t block_size,
                            uint64_t generation = 0) {
  for (uint64_t i = from; i < to; ++i) {
    std::vector<KvEvent> evs;
    to_kv_events(synthetic_batch(i, block_size, generation), owner, block_size, evs);
    for (const auto& e : evs) ref.apply(e);
  }
}

}  // namespace kvroute::testing
