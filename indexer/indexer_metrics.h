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

void register_index_metrics(metrics::Registry& r, const EventSequencer& sequencer, const RadixIndexer& exact,
                            const ApproxIndexer& approx);

}  // namespace kvroute
