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
// (12 bytes per slot), and the nodes it holds in several tiers at once to
// their tier masks (9 bytes per slot). Cache owners are interned into dense ids.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <span>
#include <unordered_map>
#include <unordered_set>
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
  // Writer thread. The most blocks each listed worker may hold (all its dp
  // ranks together; 0 = no limit of its own), and the ceiling for every
  // worker (also the limit of workers not listed). Blocks of a stored event
  // beyond its worker's limit are refused (ApplyResult::OverLimit, counted in
  // blocks_refused()) and its owner is capped (partial) until it is cleared.
  void set_block_limits(const std::vector<std::pair<WorkerId, uint64_t>>& limits, uint64_t ceiling) override;
  // Any thread: the owner had blocks refused since it was last empty.
  bool is_capped(CacheOwner owner) const;
  uint64_t capped_owners() const { return capped_count_.load(std::memory_order_relaxed); }
  uint64_t blocks_refused() const { return blocks_refused_.load(std::memory_order_relaxed); }
  // Default ceiling of blocks per worker before set_block_limits is called.
  static constexpr uint64_t kDefaultBlockLimit = uint64_t{1} << 22;
  // Writer thread (Indexer::take_removed).
  void take_removed(std::vector<std::pair<WorkerId, uint64_t>>& out) override;
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

  // Blocks held per worker (all its owners), against its limit. Writer only.
  struct WorkerQuota {
    uint64_t blocks = 0;
    uint64_t limit = 0;   // 0: default_block_limit_
    uint32_t owners = 0;  // OwnerStates pointing here
  };
  struct OwnerState {
    CacheOwner owner;
    WorkerQuota* quota = nullptr;  // in quotas_ (node-based: the address is stable)
    FlatMap64<NodeId> blocks;  // block_hash -> node
    // Nodes this owner reaches through more than one block_hash (an engine
    // that names the same content under the same parent twice): node id ->
    // extra references. Empty for well-behaved engines.
    FlatMap64<uint32_t> aliases;
    // Nodes held in more than one tier at once (an engine's copy on the
    // host of a block still on its device): node id -> the tiers' bit mask;
    // the node's entry carries the best of them. Empty for engines that
    // keep one copy of a block.
    FlatMap64<uint8_t> tiers;
  };
  // The tiers `os` (dense id `id`) holds node `n` in.
  uint8_t tiers_of(const OwnerState& os, uint32_t id, NodeId n) const;
  // `os` now holds node `n` in the tiers of `mask` (not 0): the entry gets
  // the best of them.
  void set_tiers(OwnerState& os, uint32_t id, NodeId n, uint8_t mask);

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
  // The owner's dense id, or kNone if it holds nothing. Writer thread only:
  // owner_ids_ changes on it alone, so it reads without the lock.
  uint32_t known_id(CacheOwner o) const;
  // Frees the owner's dense id; returns its state so that the caller can
  // destroy it (its maps may be large) after the exclusive hold.
  std::unique_ptr<OwnerState> release_owner_id(uint32_t id);
  bool holds(const Node& n, uint32_t owner) const;
  void add_owner(Node& n, uint32_t owner, StorageTier tier);
  bool drop_owner(Node& n, uint32_t owner);  // true if the owner was there
  // Drops one reference of owner `id` on node `n`; true when it was the last.
  bool unref(OwnerState& os, uint32_t id, NodeId n);
  // Frees n and then its ancestors while they hold no owner and no child;
  // records freed nodes in `freed` if given.
  void prune(NodeId n, std::vector<NodeId>* freed = nullptr);
  void clear_owner_impl(uint32_t id);
  ApplyResult apply_stored(const KvEvent& event, const KvStored& st);
  ApplyResult apply_copies(const KvEvent& event, const KvStored& st);  // st.copies
  void refuse_over_limit(CacheOwner owner, uint64_t blocks);

  // The writer's exclusive hold on mu_, handed over to queued readers
  // between chunks of work. Writer thread only.
  class WriteLock {
   public:
    explicit WriteLock(const RadixIndexer& idx);
    ~WriteLock();
    WriteLock(const WriteLock&) = delete;
    WriteLock& operator=(const WriteLock&) = delete;
    void step();  // one unit of work (a block) done
    // Runs f() with the lock released (readers go on meanwhile; only this
    // thread mutates, so everything the caller holds stays valid), then
    // takes it again.
    template <class F>
    void unlocked(F&& f) {
      lk_.unlock();
      f();
      lock();
    }

   private:
    void lock();
    void handoff();
    const RadixIndexer& idx_;
    std::unique_lock<std::shared_mutex> lk_;
    uint32_t ops_ = 0;
    std::chrono::steady_clock::time_point since_;
  };
  // The writer's current hold, if any (set by WriteLock): lets helpers deep
  // in a mutation do expensive work outside it. Writer thread only.
  mutable WriteLock* held_ = nullptr;
  // Maps at least this big (slots) are grown and shrunk outside the
  // exclusive hold: a rehash of 4,096 slots costs ~20 us, the hold budget.
  static constexpr size_t kRehashOutsideLock = 4096;
  // Grows `m` if one more put() would: the bigger copy is built with the
  // lock released (readers may read `m` meanwhile; both only read), swapped
  // in under it, and the old table freed outside it again.
  template <class V>
  void make_room(FlatMap64<V>& m);
  // Shrinks `m` the same way when it has become sparse.
  template <class V>
  void shrink_if_sparse(FlatMap64<V>& m);
  void lock_for_read() const;  // mu_ shared, announced in readers_waiting_
  // Readers about to take mu_ (incremented before, decremented after).
  mutable std::atomic<uint32_t> readers_waiting_{0};
  // The writer is about to take mu_: new readers wait (no writer starvation).
  mutable std::atomic<bool> writer_waiting_{false};

  mutable std::shared_mutex mu_;
  // Arena chunks; null = given back (every node of it free). Per chunk: live
  // nodes, the next never-used slot, its free list (through next_sibling).
  struct ChunkState {
    uint32_t live = 0;
    uint32_t fresh = 0;
    NodeId free_head = kNone;
  };
  std::vector<std::unique_ptr<Node[]>> chunks_;
  std::vector<ChunkState> chunk_state_;
  std::set<uint32_t> open_chunks_;  // chunks with a free slot (allocated or not), lowest first
  uint64_t live_chunks_ = 0;        // chunks_ entries not null
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

  std::unordered_map<WorkerId, WorkerQuota> quotas_;  // writer only
  // Blocks removed events took out, per worker, since take_removed (writer
  // only; emptied by each take, which the event pipeline does per batch).
  std::unordered_map<WorkerId, uint64_t> removed_;
  uint64_t default_block_limit_ = kDefaultBlockLimit;
  mutable std::mutex capped_mu_;
  std::unordered_set<CacheOwner> capped_;  // guarded by capped_mu_
  std::atomic<uint64_t> capped_count_{0};
  std::atomic<uint64_t> blocks_refused_{0};
  std::unordered_map<CacheOwner, uint32_t> owner_ids_;
  std::vector<std::unique_ptr<OwnerState>> owners_;  // by dense id; null = free
  std::vector<uint32_t> free_ids_;
  uint64_t nodes_ = 0;  // live nodes, root excluded
  uint64_t entries_ = 0;
};

}  // namespace kvroute
