#pragma once
// After each batch of KV events, the blocks the index's removals took out of
// each worker's cache go to the worker table as evictions
// (Indexer::take_removed, WorkerRegistry::add_evicted). The daemon's event
// pipeline and the simulator both do it through this one step.
#include <cstdint>
#include <utility>
#include <vector>

#include "common/types.h"
#include "fleet/worker_registry.h"
#include "indexer/indexer.h"

namespace kvroute {

// `scratch` is the caller's buffer, reused across batches.
inline void hand_evictions(Indexer& index, WorkerRegistry& registry,
                           std::vector<std::pair<WorkerId, uint64_t>>& scratch) {
  scratch.clear();
  index.take_removed(scratch);
  for (const auto& [worker, blocks] : scratch) registry.add_evicted(worker, blocks);
}

}  // namespace kvroute
