// The global prefix index interface: who caches which prefix.
//
// Threading: exactly one writer thread calls the mutating functions (apply,
// remove_worker, clear_owner); any number of request threads call
// find_matches() and stats() concurrently with it. Implementations document
// how readers avoid waiting behind long write batches (indexer/README.md).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "common/types.h"
#include "indexer/kv_event.h"

namespace kvroute {

// Outcome of applying one event. Each value maps one-to-one to the label
// `result` of kvroute_indexer_events_total.
enum class ApplyResult : uint8_t {
  Applied,        // the event changed (or confirmed) the index
  UnknownParent,  // stored event whose parent block this owner does not hold; rejected
  UnknownBlock,   // removed event naming a block the owner does not hold; ignored
  TooLarge,       // more blocks in one event than the index accepts; rejected
  OverLimit,      // stored event past its worker's block limit: the blocks before it applied, the rest refused
  ReservedOwner,  // the event names an owner id reserved for shared pools (indexer/pool_index.h); rejected
};
inline constexpr size_t kNumApplyResults = 6;

constexpr std::string_view to_string(ApplyResult r) {
  switch (r) {
    case ApplyResult::Applied: return "applied";
    case ApplyResult::UnknownParent: return "unknown_parent";
    case ApplyResult::UnknownBlock: return "unknown_block";
    case ApplyResult::TooLarge: return "too_large";
    case ApplyResult::OverLimit: return "over_limit";
    case ApplyResult::ReservedOwner: return "reserved_owner";
  }
  return "applied";
}

// How far one owner's cache matches a request, from the first block on.
struct OwnerOverlap {
  CacheOwner owner;
  uint32_t blocks = 0;                               // matched prefix length in blocks
  std::array<uint32_t, kNumStorageTiers> by_tier{};  // of `blocks`, how many per tier
  // An in-flight prefix (RoutingService::inflight_owners): the prompt's
  // leading blocks the router's requests on this worker hold, still being
  // computed there (part of its pending prefill). 0 for the index's owners.
  uint32_t inflight_blocks = 0;
};

struct OverlapScores {
  std::vector<OwnerOverlap> owners;  // only owners with blocks > 0, any order
  // The longest overlap any owner has (0: none).
  uint32_t longest() const {
    uint32_t blocks = 0;
    for (const auto& o : owners) blocks = std::max(blocks, o.blocks);
    return blocks;
  }
};

// What the event sequencer (indexer/event_sequencer.h) tells the index below
// it about one owner's event stream, for an index whose state several owners
// write (PoolIndex: a shared pool takes each member's gaps and resyncs as its
// own). In the order they happen to an owner.
enum class StreamNotice : uint8_t {
  DumpRequested,  // a dump was asked for while the owner is trusted: its events keep applying
  Gap,            // events were lost: the owner is stale until its dump; its events are held
  Restarted,      // the owner's worker restarted: its blocks were dropped, an awaited dump forgotten
  DumpBegins,     // its dump follows (clear_owner, then the dump's events through apply)
  DumpApplied,    // the dump was applied; its held or remembered events are replayed next
  ReplayDone,     // the replay ended (the owner is trusted again, or a Gap came first)
};

// A set of cache owners the index shares between every node held by exactly
// these owners in this tier (interned). Immutable once published; `serial`
// is unique in the process and never reused, so a reader may cache what it
// derives from a set (the scheduler's slot bitmaps) under its serial.
struct OwnerSet {
  uint64_t serial = 0;
  StorageTier tier = StorageTier::Device;  // every member's tier
  std::vector<CacheOwner> owners;           // each once, in no particular order
};

// find_matches' answer as nested owner sets, for callers whose cost must not
// grow with the number of owners sharing a prefix (the scheduler's fast
// path). Each layer's set is a subset of the previous layer's; an owner's
// overlap is that of the deepest layer holding it, or its entry in `extra`
// when that is longer. An index without layers lists every owner in `extra`.
struct MatchLayers {
  struct Layer {
    uint32_t blocks = 0;                                // every member matched this many blocks...
    std::array<uint32_t, kNumStorageTiers> by_tier{};  // ...in these tiers (all members alike)
    std::shared_ptr<const OwnerSet> set;
  };
  std::vector<Layer> layers;
  std::vector<OwnerOverlap> extra;  // blocks > 0, any order
  void clear() {
    layers.clear();
    extra.clear();
  }
  // Every owner with its overlap, one entry each (what find_matches returns).
  OverlapScores expand() const;
  // The longest overlap any owner has (0: none): expand().longest() without the expansion.
  uint32_t longest() const {
    uint32_t blocks = 0;
    for (const auto& l : layers) blocks = std::max(blocks, l.blocks);
    for (const auto& o : extra) blocks = std::max(blocks, o.blocks);
    return blocks;
  }
};

struct IndexStats {
  uint64_t blocks = 0;   // distinct nodes (block under a given prefix)
  uint64_t entries = 0;  // (block, owner) pairs
  uint64_t bytes = 0;    // memory held by the index, best estimate
};

class Indexer {
 public:
  virtual ~Indexer() = default;

  // Writer thread only. The event's event_id is not interpreted here (see
  // indexer/event_sequencer.h for ordering, gaps and restarts).
  virtual ApplyResult apply(const KvEvent& event) = 0;
  // Writer thread only. Drops every block of every dp rank of `worker`.
  virtual void remove_worker(WorkerId worker) = 0;
  // Writer thread only. Drops every block of one owner.
  virtual void clear_owner(CacheOwner owner) = 0;

  // Any thread. Walks `blocks` (a request's local block hashes, in order) from
  // the root and reports, per owner, the length of its cached prefix.
  virtual OverlapScores find_matches(std::span<const LocalBlockHash> blocks) const = 0;
  // Any thread. The same answer as find_matches, in layers where the index
  // can (`out` is overwritten). Default: every owner in `extra`.
  virtual void find_match_layers(std::span<const LocalBlockHash> blocks, MatchLayers& out) const {
    out.layers.clear();
    out.extra = find_matches(blocks).owners;
  }
  // Any thread.
  virtual IndexStats stats() const = 0;
  // Writer thread: per-worker block limits (RadixIndexer::set_block_limits);
  // an index without limits ignores them.
  virtual void set_block_limits(const std::vector<std::pair<WorkerId, uint64_t>>& /*limits*/,
                                uint64_t /*ceiling*/) {}

  // Writer thread: an owner's resync and its worker's restarts, acted on by
  // the event sequencer (indexer/event_sequencer.h, which documents each); an
  // index that tracks no event sequence ignores them.
  virtual void apply_resync(CacheOwner /*owner*/, uint64_t /*last_event_id*/, const std::vector<KvEvent>& /*dump*/,
                            uint64_t /*instance*/ = 0) {}
  virtual void begin_resync(CacheOwner /*owner*/) {}
  // True when the worker restarted and its blocks were dropped.
  virtual bool on_instance(WorkerId /*worker*/, uint64_t /*instance*/) { return false; }
  // Writer thread, from the event sequencer to the index below it: a change of
  // `owner`'s stream, and each event of a stale owner it holds back until the
  // dump (applied later, in the replay). An index of per-owner state ignores
  // both (the sequencer already keeps each owner exact).
  virtual void on_stream(CacheOwner /*owner*/, StreamNotice /*notice*/) {}
  virtual void on_event_held(const KvEvent& /*event*/) {}
  // Writer thread: the blocks that removed events took out of each worker's
  // cache since the last call, appended to `out` as (worker, blocks), then
  // forgotten. A block counts when its last tier goes (a removal from one
  // tier of a block also held in another takes nothing out: it is still
  // cached); clears are not counted. An index that keeps no per-owner blocks reports
  // nothing.
  virtual void take_removed(std::vector<std::pair<WorkerId, uint64_t>>& /*out*/) {}
};

}  // namespace kvroute
