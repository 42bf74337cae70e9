// The reference index: the design Dynamo started from. Each node is a hash
// map of children plus a hash map of owners; one mutex. find_matches is
// Dynamo v1's (lib/kv-router/src/radix_tree.rs): one score map updated in
// place while walking. Obviously correct, simple, large: the conformance
// suite and the benchmark compare against it.
// Thread-safe (one mutex for everything).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "indexer/indexer.h"

namespace kvroute {

class NaiveIndexer final : public Indexer {
 public:
  ApplyResult apply(const KvEvent& event) override;
  void remove_worker(WorkerId worker) override;
  void clear_owner(CacheOwner owner) override;
  OverlapScores find_matches(std::span<const LocalBlockHash> blocks) const override;
  IndexStats stats() const override;
  void take_removed(std::vector<std::pair<WorkerId, uint64_t>>& out) override;

 private:
  struct Node {
    Node* parent = nullptr;
    LocalBlockHash hash;
    std::unordered_map<LocalBlockHash, std::unique_ptr<Node>> children;
    // owner -> (the tiers it holds this node in, as a bit mask; the number
    // of the owner's block ids naming this node). It counts in the best.
    std::unordered_map<CacheOwner, std::pair<uint8_t, int>> owners;
  };
  void remove_block(CacheOwner owner, SequenceHash h);
  void unref(Node* n, CacheOwner owner);  // drops one of the owner's references to n
  void prune(Node* n);
  void clear_locked(CacheOwner owner);

  mutable std::mutex mu_;
  Node root_;
  std::unordered_map<CacheOwner, std::unordered_map<SequenceHash, Node*>> lookup_;
  std::map<WorkerId, uint64_t> removed_;  // since take_removed
};

}  // namespace kvroute
