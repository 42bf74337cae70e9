#include "events/event_metrics.h"

#include <chrono>
#include <cmath>
#include <string>

#include "events/event_pipeline.h"
#include "events/nats_bus.h"
#include "events/replica_sync.h"
#include "events/salt_attribution.h"
#include "events/zmq_source.h"
#include "fleet/worker_registry.h"

namespace kvroute {

using metrics::Samples;
using metrics::Type;

namespace {

// Counters of an array indexed by an enum, from index 1 (0 is "none"), one
// series per value labelled with its name.
template <class Array, class Name>
auto by_reason(const Array& counts, Name name) {
  return [&counts, name](Samples& s) {
    for (size_t i = 1; i < counts.size(); ++i) s.add({name(i)}, counts[i].load());
  };
}

// Messages, rejections, heartbeats, workers, the bus connection, the queue.
void register_ingest_metrics(metrics::Registry& r, const EventPipelineStats& st, const NatsBus* bus) {
  r.counter_fn("kvroute_events_messages_total", "kv_events messages received", [&st] { return st.messages_total.load(); });
  r.collect(Type::Counter, "kvroute_events_rejected_total", "kv_events messages rejected, by reason", {"reason"},
            by_reason(st.rejected_total, [](size_t i) { return to_string(static_cast<DecodeError>(i)); }));
  r.counter_fn("kvroute_events_queue_dropped_total", "kv_events messages dropped on a full writer queue",
               [&st] { return st.queue_dropped_total.load(); });
  r.collect(Type::Counter, "kvroute_events_heartbeats_total", "worker heartbeats accepted, or rejected", {"result"},
            [&st](Samples& s) {
              s.add({"accepted"}, st.heartbeats_total.load());
              s.add({"rejected"}, st.heartbeats_rejected_total.load());
            });
  r.counter_fn("kvroute_events_block_size_mismatch_total", "heartbeats announcing another block size",
               [&st] { return st.block_size_mismatch_total.load(); });
  r.counter_fn("kvroute_events_workers_expired_total", "workers removed after missing heartbeats",
               [&st] { return st.workers_expired_total.load(); });
  r.counter_fn("kvroute_events_expiry_held_total",
               "heartbeat expiry ticks skipped because NATS was down (heartbeat-only workers kept)",
               [&st] { return st.expiry_held_ticks_total.load(); });
  r.counter_fn("kvroute_events_nats_reconnects_total", "NATS reconnections",
               [bus] { return bus ? bus->reconnects() : uint64_t{0}; });
  r.gauge_fn("kvroute_events_nats_connected", "1 when the NATS connection is up (0 without NATS)",
             [bus] { return bus && bus->connected() ? 1 : 0; });
  r.counter_fn("kvroute_events_unknown_worker_events_total", "kv events dropped: their worker is not known",
               [&st] { return st.unknown_worker_events_total.load(); });
  r.collect(Type::Counter, "kvroute_events_heartbeats_rejected_total", "heartbeats rejected, by reason", {"reason"},
            by_reason(st.heartbeats_rejected_by_reason, [](size_t i) { return EventPipelineStats::heartbeat_reason(i); }));
  r.collect(Type::Counter, "kvroute_events_resync_chunks_total", "resync chunk requests sent, and repeated",
            {"result"}, [&st](Samples& s) {
              s.add({"sent"}, st.resync_chunks_total.load());
              s.add({"retried"}, st.resync_chunk_retries_total.load());
            });
  r.counter_fn("kvroute_events_queue_dropped_bytes_total", "bytes of kv_events messages dropped on a full queue",
               [&st] { return st.queue_dropped_bytes_total.load(); });
  r.counter_fn("kvroute_events_queue_worker_dropped_total",
               "kv_events messages dropped because their worker filled its share of the queue "
               "(events.queue_worker_share)",
               [&st] { return st.queue_worker_dropped_total.load(); });
  r.gauge_fn("kvroute_events_queue_bytes", "bytes of decoded events waiting for the index writer",
             [&st] { return st.queued_bytes.load(); });
}

// What the pipeline told the index: events applied, resyncs, index ages.
void register_applied_metrics(metrics::Registry& r, const EventPipeline& pipeline) {
  const EventPipelineStats& st = pipeline.stats();
  r.collect(Type::Counter, "kvroute_indexer_events_total", "index events applied, by type and result",
            {"type", "result"}, [&st](Samples& s) {
              static constexpr std::string_view kTypes[] = {"stored", "removed", "cleared"};
              for (size_t t = 0; t < st.applied_total.size(); ++t)
                for (size_t i = 0; i < st.applied_total[t].size(); ++i)
                  s.add({kTypes[t], to_string(static_cast<ApplyResult>(i))}, st.applied_total[t][i].load());
            });
  r.collect(Type::Counter, "kvroute_indexer_resyncs_total", "resyncs by result", {"result"}, [&st](Samples& s) {
    s.add({"requested"}, st.resync_requests_total.load());
    s.add({"failed"}, st.resync_failures_total.load());
    s.add({"applied"}, st.resync_applied_total.load());
  });
  r.collect(Type::Gauge, "kvroute_indexer_worker_index_age_seconds",
            "time since the index last heard from a worker (an event or a dump)", {"worker"},
            [&pipeline](Samples& s) {
              for (const auto& [w, age] : pipeline.index_ages())
                s.add({std::to_string(w.value)}, std::round(std::chrono::duration<double>(age).count() * 1e3) / 1e3);
            });
}

}  // namespace

void register_pipeline_metrics(metrics::Registry& r, const EventPipeline& pipeline, const NatsBus* bus,
                               const WorkerRegistry& registry, bool allow_any_worker_url) {
  register_ingest_metrics(r, pipeline.stats(), bus);
  register_applied_metrics(r, pipeline);
  r.gauge_fn("kvroute_events_worker_url_allow_any",
             "1 when events.worker_url_allow is '*' (any URL may join by heartbeat)",
             [allow_any_worker_url] { return allow_any_worker_url ? 1 : 0; });
  r.gauge_fn("kvroute_events_bus_workers", "workers known by heartbeat only (limit events.max_bus_workers)",
             [&registry] { return registry.bus_workers(); });
}

void register_zmq_metrics(metrics::Registry& r, const ZmqSourceStats& z) {
  auto counter = [&r](std::string name, std::string help, const std::atomic<uint64_t>& v) {
    r.counter_fn(std::move(name), std::move(help), [&v] { return v.load(); });
  };
  counter("kvroute_events_zmq_frames_total", "ZMQ KV event frames received", z.frames_total);
  counter("kvroute_events_zmq_bad_frames_total", "ZMQ frames with a wrong shape", z.bad_frames_total);
  r.collect(Type::Counter, "kvroute_events_zmq_rejected_total", "ZMQ payloads that did not decode, by reason",
            {"reason"}, by_reason(z.rejected_total, [](size_t i) { return to_string(static_cast<DecodeError>(i)); }));
  r.collect(Type::Counter, "kvroute_events_zmq_skipped_total", "ZMQ events not indexed, by reason", {"reason"},
            by_reason(z.skipped_total, [](size_t i) {
              static constexpr std::string_view kSkips[] = {"none", "unknown_type", "block_size_mismatch",
                                                            "token_count", "not_full_attention"};
              return kSkips[i];
            }));
  counter("kvroute_events_zmq_blocks_stored_total", "blocks stored by ZMQ events", z.blocks_stored_total);
  counter("kvroute_events_zmq_gaps_total", "ZMQ sequence gaps seen", z.gaps_total);
  counter("kvroute_events_zmq_replay_requests_total", "replay requests sent", z.replay_requests_total);
  counter("kvroute_events_zmq_replay_timeouts_total", "replay requests that timed out", z.replay_timeouts_total);
  counter("kvroute_events_zmq_unrecoverable_total", "gaps replay could not cover (owner partial)",
          z.unrecoverable_total);
  counter("kvroute_events_zmq_restarts_total", "engine restarts seen (sequence went backwards)", z.restarts_total);
  counter("kvroute_events_zmq_sink_refused_total", "batches dropped on a full writer queue", z.sink_refused_total);
  counter("kvroute_events_zmq_disconnects_total",
          "KV event connections lost (disconnect, frame over the size limit, failed handshake): owner partial until "
          "replayed",
          z.disconnects_total);
  counter("kvroute_events_zmq_sockets_reopened_total", "SUB / replay sockets closed and made anew",
          z.sockets_reopened_total);
  counter("kvroute_events_zmq_held_dropped_total", "frames dropped over zmq.max_held_bytes (replayed later)",
          z.held_dropped_total);
  counter("kvroute_events_zmq_held_dropped_bytes_total", "payload bytes of those frames", z.held_dropped_bytes_total);
  r.gauge_fn("kvroute_events_zmq_held_bytes", "payload bytes of frames held awaiting order or a replay",
             [&z] { return z.held_bytes.load(); });
  r.gauge_fn("kvroute_events_zmq_publishers", "ZMQ publishers subscribed", [&z] { return z.publishers.load(); });
  r.gauge_fn("kvroute_indexer_partial_owners", "cache owners whose index is known incomplete",
             [&z] { return z.partial_owners.load(); });
}

void register_salt_metrics(metrics::Registry& r, const SaltAttribution& salts) {
  r.collect(Type::Counter, "kvroute_events_salt_roots_total",
            "root blocks of ZMQ events by how their cache_salt was decided", {"how"}, [&salts](Samples& s) {
              for (size_t i = 0; i < SaltAttribution::kNumHow; ++i) {
                const auto how = static_cast<SaltAttribution::How>(i);
                s.add({to_string(how)}, salts.resolved_total(how));
              }
            });
  r.gauge_fn("kvroute_events_salt_blind_workers",
             "workers sent salted requests whose KV events never carried a salt",
             [&salts] { return salts.salt_blind_workers(); });
}

void register_replica_metrics(metrics::Registry& r, const ReplicaSync& replicas) {
  const ReplicaSyncStats& rs = replicas.stats();
  r.gauge_fn("kvroute_events_replica_peers", "other router replicas whose in-flight requests count",
             [&rs] { return rs.peers.load(); });
  r.collect(Type::Counter, "kvroute_events_replica_snapshots_total", "in-flight snapshots by direction",
            {"direction"}, [&rs](Samples& s) {
              s.add({"published"}, rs.published_total.load());
              s.add({"received"}, rs.received_total.load());
              s.add({"rejected"}, rs.rejected_total.load());
            });
}

}  // namespace kvroute
