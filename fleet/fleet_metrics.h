// The fleet's Prometheus metrics, read at scrape time (metrics::
// Registry::collect()) from what the fleet and the worker registry keep:
// scrapes, DNS lookups, workers added and removed, health signals, workers by
// source and health (kvroute_fleet_*), and each worker's load as reported and
// as predicted, the worker count and the TTFT model's error
// (kvroute_scheduler_*, the names the scheduler's dashboards use). Each part
// must outlive the registry's renders.
#pragma once

#include "common/metrics.h"

namespace kvroute {

class KnownWorkers;
class WorkerRegistry;

void register_fleet_metrics(metrics::Registry& r, const KnownWorkers& fleet, const WorkerRegistry& registry);
// Per-worker series are rendered for the workers known at scrape time only:
// a worker that left has none.
void register_worker_load_metrics(metrics::Registry& r, const WorkerRegistry& registry);

}  // namespace kvroute
