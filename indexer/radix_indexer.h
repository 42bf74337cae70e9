// The fast global prefix index: a radix tree keyed by local block hashes,
// each node holding the cache owners that hold it (and in which tier).
//
// Threading: one writer thread (apply, remove_worker, clear_owner), any
// number of reader threads (find_matches, stats) concurrently. A
// std::shared_mutex guards the tree; the writer holds it exclusively for at
// most kMaxBlocksPerLock blocks or kMaxHold at a time (long events, clears
// and worker removals are applied in chunks) and lets queued readers in
// between, so a reader waits at most one chunk. See indexer/README.md.
//
// Memory layout (why it is small): nodes are 28-byte records in a chunked
// arena addressed by 32-bit ids (stable addresses, free list). A node holds
// one owner entry inline (owner id 23 bits | tier 8 bits); two or more go to a
// sorted owner list that is interned: nodes with the same owners (in the same
// tiers) share one refcounted, immutable list, so a prefix held by 1,024
// workers costs one list, and find_matches compares two levels' owner sets by
// list id in O(1). Children are an intrusive sibling list while a node
// has at most kSmallChildren of them, an open-addressing map beyond. Each
// owner maps its engine block ids to node ids in an open-addressing map
// (12 bytes per slot). Cache owners are interned into dense ids.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "indexer/flat_map.h"
#include "indexer/indexer.h"

namespace kvroute {

class RadixIndexer final : public Indexer {
 public:
  // Largest number of blocks applied under one exclusive lock...
  static constexpr size_t kMaxBlocksPerLock = 256;
  // ...and longest hold of it (checked every 8 blocks): a block on a node
  // shared by 1,024 owners costs ~1 us, so the count alone is not a bound.
  static constexpr std::chrono::nanoseconds kMaxHold = std::chrono::microseconds(20);
  // Between two holds the writer waits (up to this long) until the readers
  // that queued behind it got the lock, so it cannot re-take it first.
  static constexpr std::chrono::nanoseconds kMaxReaderWait = std::chrono::microseconds(200);
  // Largest stored/removed event accepted (blocks); larger is TooLarge.
  static constexpr size_t kMaxBlocksPerEvent = 1 << 20;
  // Distinct cache owners the index can hold at once (dense ids are 23 bits).
  static constexpr uint32_t kMaxOwners = 1u << 23;

  RadixIndexer();
  ~RadixIndexer() override;
  RadixIndexer(const RadixIndexer&) = delete;
  RadixIndexer& operator=(const RadixIndexer&) = delete;

  ApplyResult apply(const KvEvent& event) override;
  void remove_worker(WorkerId worker) override;
  void clear_owner(CacheOwner owner) override;
  OverlapScores find_matches(std::span<const LocalBlockHash> blocks) const override;
  // Layers while the owner sets along the path are nested interned lists in
  // one tier each (the common case: O(blocks) plus O(|smaller set| log) per
  // change of set, whatever the number of owners); once one owner is left it
  // is followed alone into `extra`. Sets that are not nested, or lists with
  // mixed tiers, fall back to find_matches (all owners in `extra`).
  void find_match_layers(std::span<const LocalBlockHash> blocks, MatchLayers& out) const override;
  IndexStats stats() const override;
  // Any thread. Index entries held by each worker (all dp ranks summed),
  // sorted by worker id; O(owners). For the status page (router/status.h).
  std::vector<std::pair<WorkerId, uint64_t>> entries_by_worker() const;

 private:
  using NodeId = uint32_t;
  // An owner entry: dense owner id (23 bits) << 8 | tier (8 bits). The top
  // bit is never set, so a node's owner word can tag a list index with it.
  using Entry = uint32_t;
  static uint32_t entry_owner(Entry e) { return e >> 8; }
  static StorageTier entry_tier(Entry e) { return static_cast<StorageTier>(e & 0xff); }

  static constexpr NodeId kRoot = 0;
  static constexpr NodeId kNone = ~0u;
  static constexpr uint32_t kNoOwner = ~0u;        // owner word: nobody
  static constexpr uint32_t kListBit = 1u << 31;   // owner word: index into lists_
  static constexpr uint32_t kSmallChildren = 8;    // sibling list up to this many
  static constexpr uint32_t kChunkBits = 16;       // nodes per arena chunk: 65,536

  struct Node {
    uint32_t hash_lo, hash_hi;  // LocalBlockHash, split to keep the record 4-aligned
    NodeId parent;
    // nchildren <= kSmallChildren: first child of a sibling list;
    // otherwise the index of this node's map in child_maps_.
    uint32_t children;
    NodeId next_sibling;  // next in the parent's list; next free node when free
    uint32_t owners;      // kNoOwner, one Entry, or kListBit | index in lists_
    uint32_t nchildren;
    uint64_t hash() const { return (uint64_t{hash_hi} << 32) | hash_lo; }
  };
  static_assert(sizeof(Node) == 28);

  struct OwnerState {
    CacheOwner owner;
    FlatMap64<NodeId> blocks;  // block_hash -> node
    // Nodes this owner reaches through more than one block_hash (an engine
    // that names the same content under the same parent twice): node id ->
    // extra references. Empty for well-behaved engines.
    FlatMap64<uint32_t> aliases;
  };

  Node& node(NodeId id) { return chunks_[id >> kChunkBits][id & ((1u << kChunkBits) - 1)]; }
  const Node& node(NodeId id) const { return chunks_[id >> kChunkBits][id & ((1u << kChunkBits) - 1)]; }
  std::span<const Entry> owners_of(const Node& n) const;
  // The entry of `owner` on node n, or kNoOwner.
  Entry entry_of(const Node& n, uint32_t owner) const;
  // find_match_layers under the read lock; false = fall back to find_matches.
  bool walk_layers(std::span<const LocalBlockHash> blocks, MatchLayers& out) const;
  // One owner followed from level `from` (node n) on; `tiers`: its blocks per
  // tier before `from`. Appends its overlap to out.extra.
  void walk_single(std::span<const LocalBlockHash> blocks, size_t from, NodeId n, uint32_t owner,
                   std::array<uint32_t, kNumStorageTiers> tiers, MatchLayers& out) const;

  NodeId alloc_node();
  void free_node(NodeId id);
  NodeId child(NodeId parent, uint64_t h) const;
  NodeId add_child(NodeId parent, uint64_t h);
  void unlink_child(NodeId parent, NodeId c);

  uint32_t intern(CacheOwner o);
  void release_owner_id(uint32_t id);
  bool holds(const Node& n, uint32_t owner) const;
  void add_owner(Node& n, uint32_t owner, StorageTier tier);
  bool drop_owner(Node& n, uint32_t owner);  // true if the owner was there
  // Drops one reference of owner `id` on node `n`; true when it was the last.
  bool unref(OwnerState& os, uint32_t id, NodeId n);
  // Frees n and then its ancestors while they hold no owner and no child;
  // records freed nodes in `freed` if given.
  void prune(NodeId n, std::vector<NodeId>* freed = nullptr);
  void clear_owner_impl(uint32_t id);

  // The writer's exclusive hold on mu_, handed over to queued readers
  // between chunks of work. Writer thread only.
  class WriteLock {
   public:
    explicit WriteLock(const RadixIndexer& idx);
    void step();  // one unit of work (a block) done
   private:
    void lock();
    void handoff();
    const RadixIndexer& idx_;
    std::unique_lock<std::shared_mutex> lk_;
    uint32_t ops_ = 0;
    std::chrono::steady_clock::time_point since_;
  };
  void lock_for_read() const;  // mu_ shared, announced in readers_waiting_
  // Readers about to take mu_ (incremented before, decremented after).
  mutable std::atomic<uint32_t> readers_waiting_{0};
  // The writer is about to take mu_: new readers wait (no writer starvation).
  mutable std::atomic<bool> writer_waiting_{false};

  mutable std::shared_mutex mu_;
  std::vector<std::unique_ptr<Node[]>> chunks_;
  uint32_t fresh_ = 0;        // next never-used node id
  NodeId free_head_ = kNone;  // free list through next_sibling
  // A list's content, shared with readers of find_match_layers (who may keep
  // it past the lock): never modified once made.
  struct ListBody : OwnerSet {
    std::vector<Entry> entries;  // sorted by owner id; `owners` in the same order
    bool one_tier = true;        // every entry in OwnerSet::tier
  };
  struct OwnerList {
    std::shared_ptr<const ListBody> body;  // null = free slot
    uint64_t hash = 0;                     // XXH3 of the entries
    uint32_t refs = 0;                     // nodes pointing here
    bool interned = false;                 // reachable from list_index_ (false only on a hash collision)
  };
  // Owner word for `v` (sorted): nobody, one inline entry, or an interned list
  // (one reference taken).
  uint32_t owner_word_for(const std::vector<Entry>& v);
  void release_word(uint32_t word);  // drops the reference of a list word
  std::vector<OwnerList> lists_;
  std::vector<uint32_t> free_lists_;
  FlatMap64<uint32_t> list_index_;  // content hash -> list id
  uint64_t list_heap_bytes_ = 0;    // the lists' bodies, in bytes (list_bytes)
  // Heap bytes of one list body of n entries (make_shared: one allocation).
  static uint64_t list_bytes(size_t n) { return sizeof(ListBody) + 16 + n * (sizeof(Entry) + sizeof(CacheOwner)); }
  std::vector<Entry> scratch_;      // writer's buffer for a node's next owner set
  std::vector<std::unique_ptr<FlatMap64<NodeId>>> child_maps_;  // big fan-out nodes
  std::vector<uint32_t> free_child_maps_;

  std::unordered_map<CacheOwner, uint32_t> owner_ids_;
  std::vector<std::unique_ptr<OwnerState>> owners_;  // by dense id; null = free
  std::vector<uint32_t> free_ids_;
  uint64_t nodes_ = 0;  // live nodes, root excluded
  uint64_t entries_ = 0;
};

}  // namespace kvroute
