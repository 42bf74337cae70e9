// What the status page (/ui) shows, kept by the daemon:
// - StatusHistory: fleet totals once a second, the last 15 minutes in a ring
//   buffer (requests/s, hit rate, decision latency p50/p99, events/s, index
//   size, workers, in flight) for the page's charts and totals.
// - DecisionLog: counts every routing decision, times it, and keeps the
//   latest ones (at most one per `min_gap`) with their explain.
// - StatusReport: both, plus the per-worker table, as JSON for the admin API.
//
// Threading: DecisionLog::on_routed runs on the HTTP io threads (the request
// path: one striped counter, one histogram observation, one relaxed atomic
// load, except for a kept decision); StatusHistory samples on its own thread
// `kvroute-status`; everything else is called from io threads (admin API).
// All classes are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/metrics.h"
#include "config/config_store.h"
#include "router/routing.h"
#include "fleet/worker_registry.h"

namespace kvroute {

// Cumulative counters and current gauges of the whole fleet, read once a second.
struct StatusCounters {
  uint64_t routed = 0;          // routing decisions that chose a worker
  uint64_t prompt_tokens = 0;   // of routed requests
  uint64_t cached_tokens = 0;   // of those, found cached on the chosen worker
  uint64_t events = 0;          // KV event messages received
  std::vector<uint64_t> decision_buckets;  // decision time histogram (not cumulative per bucket)
  uint64_t index_blocks = 0;
  uint64_t index_entries = 0;
  uint64_t workers = 0;
  int64_t inflight = 0;
};

// One second of the fleet (rates over the sampling period). NaN = no data.
struct StatusSample {
  double unix_time = 0;
  double seconds = 0;           // length of the period
  double requests_per_s = 0;
  double hit_rate = NAN;        // cached / prompt tokens routed in the period
  double decision_p50_us = NAN;
  double decision_p99_us = NAN;
  double events_per_s = 0;
  uint64_t index_blocks = 0;
  uint64_t index_entries = 0;
  uint64_t workers = 0;
  int64_t inflight = 0;
  // Period deltas kept for window totals.
  uint64_t routed = 0, prompt_tokens = 0, cached_tokens = 0, events = 0;
  std::vector<uint64_t> decision_buckets;
};

// The bounds of the decision time histogram (seconds), shared by DecisionLog
// and the quantiles of StatusHistory.
const std::vector<double>& decision_time_bounds();
using metrics::histogram_quantile;  // common/metrics.h

class StatusHistory {
 public:
  // `read` is called from the sampler thread (or sample()'s caller).
  explicit StatusHistory(std::function<StatusCounters()> read, size_t capacity = 900);
  ~StatusHistory();
  StatusHistory(const StatusHistory&) = delete;
  StatusHistory& operator=(const StatusHistory&) = delete;

  // Starts the sampler thread: one sample() per `period`. stop() (or the
  // destructor) joins it.
  void start(std::chrono::milliseconds period = std::chrono::seconds(1));
  void stop();
  // Reads the counters and appends the sample of the period since the last
  // call (the first call only sets the baseline). `unix_time` in seconds.
  void sample(double unix_time);

  std::vector<StatusSample> samples() const;
  // Totals over the last `window` samples (rates: sum / seconds).
  StatusSample window(size_t samples) const;
  // {"period_s":..,"t":[..],"requests_per_s":[..],...} (NaN as null).
  std::string json() const;

 private:
  std::function<StatusCounters()> read_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<StatusSample> ring_;
  std::optional<StatusCounters> last_;
  double last_time_ = 0;
  std::thread thread_;
  std::condition_variable cv_;
  bool stop_ = false;
};

class DecisionLog {
 public:
  explicit DecisionLog(size_t capacity = 40, std::chrono::milliseconds min_gap = std::chrono::milliseconds(200));

  // IO threads, after each routing decision that chose a worker.
  void on_routed(const ParsedRequest& request, const RouteResult& route, const SchedulerConfig& cfg,
                 uint32_t block_size);

  uint64_t routed() const { return routed_.value(); }
  // Per-bucket counts of the decision time (tokenize + hash + find_matches + score).
  std::vector<uint64_t> decision_buckets() const;
  // Newest first: [{"id","unix_time","model","isl_tokens","chosen","cached_tokens","reason"}].
  std::string list_json() const;
  // The kept decision's explain (router/explain.h), or nullopt if it left the ring.
  std::optional<std::string> explain(uint64_t id) const;

 private:
  struct Entry {
    uint64_t id;
    double unix_time;
    std::string summary;  // list_json's object
    std::string explain;
  };
  const size_t capacity_;
  const int64_t min_gap_ns_;
  metrics::Counter routed_;
  metrics::Histogram decision_time_;
  std::atomic<int64_t> next_keep_ns_{0};
  mutable std::mutex mu_;
  std::deque<Entry> ring_;
  uint64_t next_id_ = 1;
};

// Per-worker facts the registry does not hold, supplied by the daemon.
struct StatusSources {
  std::function<std::vector<std::pair<WorkerId, uint64_t>>()> index_entries;  // per worker, any order
  std::function<bool(CacheOwner)> partial_index;  // events lost, index incomplete until a resync
  // Prompt and cached tokens routed to a worker since start.
  std::function<std::pair<uint64_t, uint64_t>(WorkerId)> worker_tokens;
  // A worker whose last load report is older than this is "stale" (its load
  // is a guess); empty = never.
  std::function<Nanos(const WorkerAnnouncement&)> stale_after;
  // Sent salted requests while its KV events carry no cache_salt
  // (events/salt_attribution.h); empty = never.
  std::function<bool(WorkerId)> salt_blind;
  // Flow control's view (router/flow/flow_control.h status_json(): the queue
  // by band and tenant, each tenant's limits and outcomes); empty = omitted.
  std::function<std::string()> flow_json;
  // The shared pools (indexer.kv_pools): a JSON array, one object per pool
  // (name, medium, workers, weight, blocks, hits, hit_tokens); empty = omitted.
  std::function<std::string()> pools_json;
  // A disaggregated fleet's counters (kvroute_pd_*): a JSON object with
  // "requests" (by outcome), "prefill_legs" (by result), "prefill_failures",
  // "releases", "transfers_left", "client_gone"; shown with the workers'
  // roles when a worker has role prefill or decode. Empty = omitted.
  std::function<std::string()> pd_json;
};

// The one state the status page shows for a worker, the most pressing first:
// ejected, down (health), draining, partial_index (events lost, the index is
// incomplete until a resync), stale (load report late), ok.
std::string_view worker_state(const WorkerView& w, bool partial_index, Nanos stale_after);

class StatusReport {
 public:
  StatusReport(const WorkerRegistry& registry, StatusSources sources, StatusHistory& history, DecisionLog& decisions)
      : registry_(registry), sources_(std::move(sources)), history_(history), decisions_(decisions) {}

  // {"unix_time","totals":{...last 10 s},"workers":[...]} for GET /admin/status,
  // plus "pd" ({"roles":{"prefill":n,"decode":n,"both":n}, the pd_json
  // counters}) when a worker has role prefill or decode.
  std::string status_json(double unix_time) const;
  std::string history_json() const { return history_.json(); }
  const DecisionLog& decisions() const { return decisions_; }

 private:
  std::string workers_json() const;
  std::string pd_json() const;  // empty when no worker has a PD role

  const WorkerRegistry& registry_;
  StatusSources sources_;
  StatusHistory& history_;
  DecisionLog& decisions_;
};

}  // namespace kvroute
