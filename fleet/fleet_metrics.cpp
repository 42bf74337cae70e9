#include "fleet/fleet_metrics.h"

#include <array>
#include <map>
#include <string>
#include <utility>

#include "fleet/known_workers.h"
#include "fleet/scraper.h"
#include "fleet/worker_registry.h"

namespace kvroute {

using metrics::Samples;
using metrics::Type;

void register_fleet_metrics(metrics::Registry& r, const KnownWorkers& fleet, const WorkerRegistry& registry) {
  const ScraperStats& sc = fleet.scrape_stats();
  const KnownWorkerStats& st = fleet.stats();
  // counters
  r.collect(Type::Counter, "kvroute_fleet_scrapes_total", "worker /metrics scrapes by result", {"result"},
            [&sc](Samples& s) {
              s.add({"ok"}, sc.scrapes_ok.load());
              s.add({"failed"}, sc.scrapes_failed.load());
            });
  r.collect(Type::Counter, "kvroute_fleet_dns_lookups_total", "discovery.dns lookups by result", {"result"},
            [&st](Samples& s) {
              s.add({"ok"}, st.dns_lookups_ok.load());
              s.add({"not_found"}, st.dns_lookups_not_found.load());
              s.add({"failed"}, st.dns_lookups_failed.load());
            });
  r.collect(Type::Counter, "kvroute_fleet_worker_changes_total", "router-known workers added and removed",
            {"change"}, [&st](Samples& s) {
              s.add({"added"}, st.workers_added.load());
              s.add({"removed"}, st.workers_removed.load());
            });
  r.collect(Type::Counter, "kvroute_fleet_health_failures_total", "failures observed talking to workers, by signal",
            {"signal"}, [&registry](Samples& s) {
              const auto failures = registry.failure_counts();
              for (size_t i = 0; i < failures.size(); ++i)
                s.add({to_string(static_cast<HealthSignal>(i))}, failures[i]);
            });
  // gauges: every (source, health) pair, zeros included
  r.collect(Type::Gauge, "kvroute_fleet_workers", "workers known, by source and health", {"source", "health"},
            [&registry](Samples& s) {
              std::map<std::pair<std::string_view, std::string_view>, int> by;
              for (const auto& w : registry.all()) by[{to_string(w.info->source), to_string(w.health)}] += 1;
              for (auto src : {WorkerSource::Heartbeat, WorkerSource::Static, WorkerSource::Dns, WorkerSource::Admin})
                for (auto h : {HealthState::Ok, HealthState::Down, HealthState::Ejected})
                  s.add({to_string(src), to_string(h)}, by[{to_string(src), to_string(h)}]);
            });
  // Every role, zeros included: a disaggregated fleet missing one side shows.
  r.collect(Type::Gauge, "kvroute_fleet_role_workers", "workers known, by role (both, prefill, decode)", {"role"},
            [&registry](Samples& s) {
              std::array<int, 3> by{};
              for (const auto& w : registry.all()) by[static_cast<size_t>(w.info->role)] += 1;
              for (auto role : {WorkerRole::Both, WorkerRole::Prefill, WorkerRole::Decode})
                s.add({to_string(role)}, by[static_cast<size_t>(role)]);
            });
}

void register_worker_load_metrics(metrics::Registry& r, const WorkerRegistry& registry) {
  auto ratio = [](const WorkerLoad& l) {
    return l.kv_total_blocks ? double(l.kv_active_blocks) / double(l.kv_total_blocks) : 0.0;
  };
  r.gauge_fn("kvroute_scheduler_ttft_mape_ratio",
             "Mean absolute percentage error of the predicted TTFT (per-worker online model)",
             [&registry] { return registry.ttft_stats().mape(); });  // scheduler/ttft_model.h
  r.gauge_fn("kvroute_scheduler_workers", "Workers known", [&registry] { return registry.size(); });
  r.collect(Type::Gauge, "kvroute_scheduler_worker_kv_usage_ratio", "KV usage per worker, as reported and as predicted",
            {"worker", "source"}, [&registry, ratio](Samples& s) {
              for (const auto& w : registry.all()) {
                const auto id = std::to_string(w.info->id.value);
                s.add({id, "reported"}, ratio(w.info->load));
                s.add({id, "predicted"}, ratio(w.predicted));
              }
            });
  r.collect(Type::Gauge, "kvroute_scheduler_worker_evicted_blocks",
            "KV blocks each worker's events reported evicted from its device lately, faded with "
            "scheduler.eviction_seconds (the cost's eviction term)",
            {"worker"}, [&registry](Samples& s) {
              for (const auto& w : registry.all()) s.add({std::to_string(w.info->id.value)}, w.evicted_blocks);
            });
  r.collect(Type::Gauge, "kvroute_scheduler_worker_active_requests",
            "Active requests per worker, as reported and as predicted", {"worker", "source"},
            [&registry](Samples& s) {
              for (const auto& w : registry.all()) {
                const auto id = std::to_string(w.info->id.value);
                s.add({id, "reported"}, w.info->load.request_active_slots);
                s.add({id, "predicted"}, w.predicted.request_active_slots);
              }
            });
}

}  // namespace kvroute
