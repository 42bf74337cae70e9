// The index the daemon routes with: the exact index (fed by KV events, behind
// the event sequencer) merged with the approximate one (predicted from routing
// decisions for workers that publish no events). Writes go to the exact
// index; removing a worker removes it from both. An owner present in both
// reports the longer overlap.
//
// Threading: as Indexer (one writer thread, concurrent readers).
#pragma once

#include <algorithm>
#include <unordered_map>

#include "indexer/approx_indexer.h"
#include "indexer/indexer.h"

namespace kvroute {

class MergedIndex final : public Indexer {
 public:
  MergedIndex(Indexer& exact, ApproxIndexer& approx) : exact_(exact), approx_(approx) {}

  ApplyResult apply(const KvEvent& event) override { return exact_.apply(event); }
  void remove_worker(WorkerId worker) override {
    exact_.remove_worker(worker);
    approx_.remove_worker(worker);
  }
  void clear_owner(CacheOwner owner) override {
    exact_.clear_owner(owner);
    approx_.clear_owner(owner);
  }
  OverlapScores find_matches(std::span<const LocalBlockHash> blocks) const override {
    OverlapScores out = exact_.find_matches(blocks);
    OverlapScores predicted = approx_.find_matches(blocks);
    if (predicted.owners.empty()) return out;
    std::unordered_map<CacheOwner, size_t> at;
    for (size_t i = 0; i < out.owners.size(); ++i) at[out.owners[i].owner] = i;
    for (auto& p : predicted.owners) {
      auto it = at.find(p.owner);
      if (it == at.end()) out.owners.push_back(p);
      else if (p.blocks > out.owners[it->second].blocks) out.owners[it->second] = p;
    }
    return out;
  }
  // The exact index's layers; the predicted owners join `extra` (an owner in
  // both counts with its longer overlap, as above).
  void find_match_layers(std::span<const LocalBlockHash> blocks, MatchLayers& out) const override {
    exact_.find_match_layers(blocks, out);
    const OverlapScores predicted = approx_.find_matches(blocks);
    out.extra.insert(out.extra.end(), predicted.owners.begin(), predicted.owners.end());
  }
  IndexStats stats() const override { return exact_.stats(); }
  // Resyncs and restarts concern the exact index's event sequence.
  void apply_resync(CacheOwner owner, uint64_t last_event_id, const std::vector<KvEvent>& dump,
                    uint64_t instance = 0) override {
    exact_.apply_resync(owner, last_event_id, dump, instance);
  }
  void begin_resync(CacheOwner owner) override { exact_.begin_resync(owner); }
  bool on_instance(WorkerId worker, uint64_t instance) override { return exact_.on_instance(worker, instance); }
  void set_block_limits(const std::vector<std::pair<WorkerId, uint64_t>>& limits, uint64_t ceiling) override {
    exact_.set_block_limits(limits, ceiling);
  }
  void take_removed(std::vector<std::pair<WorkerId, uint64_t>>& out) override { exact_.take_removed(out); }

 private:
  Indexer& exact_;
  ApproxIndexer& approx_;
};

}  // namespace kvroute
