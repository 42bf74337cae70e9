// The fast global prefix index: a radix tree keyed by local block hashes,
// each node holding the cache owners that hold it (and in which tier).
//
// Threading: one writer thread (apply, remove_worker, clear_owner), any
// number of reader threads (find_matches, stats) concurrently. A
// std::shared_mutex guards the tree; the writer holds it exclusively for at
// most kMaxBlocksPerLock blocks at a time (long events are applied in
// chunks), so a reader waits at most one chunk. See indexer/README.md.
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "indexer/flat_map.h"
#include "indexer/indexer.h"

namespace kvroute {

class RadixIndexer final : public Indexer {
 public:
  // Largest number of blocks applied under one exclusive lock.
  static constexpr size_t kMaxBlocksPerLock = 256;
  // Largest stored/removed event accepted (blocks); larger is TooLarge.
  static constexpr size_t kMaxBlocksPerEvent = 1 << 20;

  RadixIndexer();
  ~RadixIndexer() override;

  ApplyResult apply(const KvEvent& event) override;
  void remove_worker(WorkerId worker) override;
  void clear_owner(CacheOwner owner) override;
  OverlapScores find_matches(std::span<const LocalBlockHash> blocks) const override;
  IndexStats stats() const override;

 private:
  // An owner entry in a node: dense owner id (24 bits) | tier (8 bits).
  using Entry = uint32_t;
  static uint32_t entry_owner(Entry e) { return e >> 8; }
  static StorageTier entry_tier(Entry e) { return static_cast<StorageTier>(e & 0xff); }

  struct Node {
    LocalBlockHash hash;
    Node* parent = nullptr;
    // Children: inline vector while small, a hash map beyond.
    std::vector<Node*> small_children;
    std::unique_ptr<FlatMap64<Node*>> big_children;
    std::vector<Entry> owners;  // sorted by owner id
    Node* child(LocalBlockHash h) const;
    size_t child_count() const;
  };
  struct OwnerState {
    CacheOwner owner;
    FlatMap64<Node*> blocks;  // block_hash -> node
    // Nodes this owner reaches through more than one block_hash (an engine
    // that names the same content under the same parent twice): node -> extra
    // references. Empty for well-behaved engines.
    FlatMap64<uint32_t> aliases;
  };
  // Drops one reference of `id` on `n`; true when it was the last.
  bool unref(OwnerState& os, uint32_t id, Node* n);

  uint32_t intern(CacheOwner o);
  Node* add_child(Node* parent, LocalBlockHash h);
  void add_owner(Node* n, uint32_t owner, StorageTier tier);
  bool drop_owner(Node* n, uint32_t owner);  // true if the owner was there
  // Frees n and then its ancestors while they hold no owner and no child;
  // records freed nodes in `freed` if given.
  void prune(Node* n, std::vector<Node*>* freed = nullptr);
  void clear_owner_locked(uint32_t id);

  mutable std::shared_mutex mu_;
  Node root_;
  std::unordered_map<CacheOwner, uint32_t> owner_ids_;
  std::vector<std::unique_ptr<OwnerState>> owners_;  // by dense id; null = free
  std::vector<uint32_t> free_ids_;
  uint64_t nodes_ = 0;
  uint64_t entries_ = 0;
};

}  // namespace kvroute
