// A fake Indexer for tests of code that feeds the index: records every call.
// Thread-safe (the event pipeline applies from its writer thread).
#pragma once

#include <mutex>
#include <vector>

#include "indexer/indexer.h"

namespace kvroute::testing {

class RecordingIndexer final : public Indexer {
 public:
  ApplyResult apply(const KvEvent& e) override {
    std::lock_guard lk(mu);
    applied.push_back(e);
    return ApplyResult::Applied;
  }
  void remove_worker(WorkerId w) override {
    std::lock_guard lk(mu);
    removed_workers.push_back(w);
  }
  void clear_owner(CacheOwner o) override {
    std::lock_guard lk(mu);
    cleared_owners.push_back(o);
  }
  OverlapScores find_matches(std::span<const LocalBlockHash>) const override { return {}; }
  IndexStats stats() const override { return {}; }

  mutable std::mutex mu;
  std::vector<KvEvent> applied;
  std::vector<WorkerId> removed_workers;
  std::vector<CacheOwner> cleared_owners;
};

}  // namespace kvroute::testing
