// The fleet's hit-rate bound: the most prompt blocks any router can take from
// the cache when the fleet holds `capacity_blocks` (workers x blocks each) at
// a time, against the causal floor's hit rate, which has one infinite cache.
//
// The argument. Whatever the routing, the blocks a request finds cached are in
// the union of the engines' caches when it is admitted. That union never
// holds more than the fleet's capacity, and a block enters it only when some
// request computes it (aggregated engines, no tiers). Served in arrival order,
// the union is one demand-paged cache of the fleet's capacity over the
// workload's block sequence, and Belady's MIN (evict the block needed
// farthest ahead, or do not keep a block never needed again) takes the most
// hits any such cache can. A block counts as a hit here even when a block
// before it in the same prompt missed (an engine's prefix hit cannot), and
// the same block held on two engines counts once (a fleet spends capacity on
// each copy): both make the bound higher, never lower.
// The order is the arrivals' (`rate` as the simulator compresses them), as for
// the floors (sim/floor.h): the simulated router dispatches on arrival and
// each engine admits FIFO, so every engine serves its requests in arrival
// order. `kvroute-sim targets --check` fails if a policy's hit rate exceeds
// the bound.
//
// pooled_lru: the same cache evicting the least recently used block (an
// engine's rule) with prefix hits, as if the fleet were one engine: what
// routing could reach with the engines' own eviction and no duplication. A
// reference, not a bound (a router's placement can beat LRU's choices).
//
// Threading: plain functions; no shared state.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/workload.h"

namespace kvroute::sim {

struct HitBound {
  uint64_t capacity_blocks = 0;
  double optimal = 0;     // Belady's MIN: no router's hit rate above it
  double pooled_lru = 0;  // one LRU cache of the whole capacity, prefix hits
};

// Hit rates over `w` (in arrival order) counted as the simulator and the
// floors count them: hit blocks over the prompts' full blocks.
HitBound hit_bound(const std::vector<SimRequest>& w, uint64_t capacity_blocks);

}  // namespace kvroute::sim
