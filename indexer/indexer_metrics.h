// The index's Prometheus metrics, read at scrape time from the counters and
// stats its parts keep (metrics::Registry::collect()): the event sequencer
// (gaps, duplicates, restarts, stale owners), the exact index (refused blocks,
// capped owners, size) and the approximate index (size). Names:
// kvroute_indexer_*. Each part must outlive the registry's renders; stats()
// of both indexes must be callable from the scraping thread.
#pragma once

#include "common/metrics.h"

namespace kvroute {

class EventSequencer;
class RadixIndexer;
class ApproxIndexer;
class PoolIndex;

void register_index_metrics(metrics::Registry& r, const EventSequencer& sequencer, const RadixIndexer& exact,
                            const ApproxIndexer& approx);
// The shared pools' (indexer.kv_pools): kvroute_indexer_pool_*; blocks held
// per pool from `exact`'s per-owner counts at scrape time.
void register_pool_metrics(metrics::Registry& r, const PoolIndex& pools, const RadixIndexer& exact);

}  // namespace kvroute
