// The events module's Prometheus metrics, read at scrape time from the stats
// its parts keep (metrics::Registry::collect()): the ingest pipeline (and the
// index counts it keeps: applied events, resyncs, index ages), the NATS bus,
// the ZMQ source (and its partial owners), tenant attribution and replica
// sync. Names: kvroute_events_* (kvroute_indexer_* for what the index is
// told). Each part must outlive the registry's renders.
#pragma once

#include "common/metrics.h"

namespace kvroute {

class EventPipeline;
class NatsBus;
class SaltAttribution;
class ReplicaSync;
class WorkerRegistry;
struct ZmqSourceStats;

// The pipeline's counters and gauges; `bus` may be null (no NATS: reconnects
// 0, connected 0). `allow_any_worker_url`: events.worker_url_allow is '*'.
void register_pipeline_metrics(metrics::Registry& r, const EventPipeline& pipeline, const NatsBus* bus,
                               const WorkerRegistry& registry, bool allow_any_worker_url);
void register_zmq_metrics(metrics::Registry& r, const ZmqSourceStats& z);
void register_salt_metrics(metrics::Registry& r, const SaltAttribution& s);
void register_replica_metrics(metrics::Registry& r, const ReplicaSync& replicas);

}  // namespace kvroute
