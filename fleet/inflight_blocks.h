// One worker's in-flight prompt blocks: each block of the prompts the
// routers have sent it and not yet seen end, keyed by its hash chained with
// its prefix's (inflight_chain()), with the number of requests holding it.
// Its size is the distinct blocks those requests hold on the worker
// (scheduler.inflight_kv distinct; fleet/README.md).
//
// Thread-safe, with its own lock: a long prompt's thousands of keys are
// counted without holding the worker table's lock (WorkerRegistry), which
// every routing decision takes.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "common/types.h"
#include "indexer/flat_map.h"

namespace kvroute {

// The prompt's complete blocks as in-flight accounting keys them: each
// block's hash chained with its prefix's (a block means the same KV only
// after the same prefix), as the index does (indexer/block_hash.h).
std::vector<uint64_t> inflight_chain(std::span<const LocalBlockHash> prompt);

class InflightBlocks {
 public:
  // Adds one request's chain: returns how many of its keys were new to the
  // worker, or nullopt (nothing added) when the distinct keys would pass
  // `limit` (the caller then counts the request's blocks as its own).
  std::optional<uint64_t> add(std::span<const uint64_t> chain, uint64_t limit);
  // Removes a chain add() took: returns how many keys no request holds any
  // more.
  uint64_t remove(std::span<const uint64_t> chain);
  // How many leading keys of `chain` some in-flight request holds (the
  // prefix of the prompt the worker is computing or holds for them), when
  // more than `beyond`; else 0. Keys are added and removed a whole chain at
  // a time, so the held keys of a chain are a prefix of it: one probe, and
  // a binary search past `beyond` when it is held. nullopt when the lock is
  // busy (a long chain being counted): the caller does not wait for it.
  std::optional<uint32_t> try_held_prefix(std::span<const uint64_t> chain, uint32_t beyond = 0);

 private:
  std::mutex mu_;
  // Keyed with a per-process secret (flat_map.h): prompts crafted to share
  // slots cannot be found. Never shrunk while requests come and go (a
  // worker with one request at a time would rehash on every one): the last
  // chain out drops it.
  FlatMap64<uint32_t> refs_;
  size_t chains_ = 0;  // chains added and not removed
};

}  // namespace kvroute
