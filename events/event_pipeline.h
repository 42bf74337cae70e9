// The event pipeline: NATS -> decode -> bounded queue -> the single index
// writer thread -> index. Also feeds worker heartbeats into the registry and
// expires silent workers (from the registry and from the index).
//
// Threads (see README "Threading model"):
//   libnats dispatcher (one per subscription) - decodes messages, pushes to the
//       queue (kv_events) or updates the registry (workers); never touches the index.
//   "kvroute-indexw" (the writer thread) - the only thread that mutates the
//       index: applies each worker's queued events in arrival order (so one
//       worker's events stay in order), the workers' queues round-robin one
//       message at a time; applies resync dumps, removes expired workers,
//       refreshes the per-worker block limits.
//   "kvroute-resync" (events.resync_concurrency threads) - ask workers for a
//       full dump over NATS request/reply (`{prefix}.kv_resync.{worker_id}`),
//       chunk by chunk under the server's max payload, when the index may have
//       lost their events (a gap, first sight of a worker, a NATS reconnect),
//       rate-limited per worker with backoff; queue the dump for the writer.
// All public member functions are thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <functional>
#include <variant>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "config/config.h"
#include "events/nats_bus.h"
#include "events/wire.h"
#include "indexer/indexer.h"
#include "common/url_allow_list.h"
#include "fleet/worker_registry.h"

namespace kvroute {

struct EventPipelineStats {
  std::atomic<uint64_t> messages_total{0};        // kv_events messages received
  std::atomic<uint64_t> events_queued_total{0};   // decoded events accepted into the queue
  std::atomic<uint64_t> queue_dropped_total{0};   // messages dropped because the queue was full
  std::array<std::atomic<uint64_t>, 7> rejected_total{};  // by DecodeError (index = enum value)
  // By event type (stored, removed, cleared = the KvEvent variant index) and ApplyResult.
  std::array<std::array<std::atomic<uint64_t>, kNumApplyResults>, 3> applied_total{};
  std::atomic<uint64_t> heartbeats_total{0};
  std::atomic<uint64_t> heartbeats_rejected_total{0};
  std::atomic<uint64_t> block_size_mismatch_total{0};  // heartbeats announcing another block size
  std::atomic<uint64_t> workers_expired_total{0};
  std::atomic<uint64_t> expiry_held_ticks_total{0};  // expiry ticks skipped while NATS was down
  std::atomic<uint64_t> resync_requests_total{0};   // NATS requests sent
  std::atomic<uint64_t> resync_failures_total{0};   // no answer in time, or a bad dump
  std::atomic<uint64_t> resync_applied_total{0};    // dumps applied
  // Chunked resyncs, unknown workers, queue bytes.
  std::atomic<uint64_t> resync_chunks_total{0};          // chunk requests sent (a dump is one or more)
  std::atomic<uint64_t> resync_chunk_retries_total{0};   // chunk requests repeated (lost or bad reply)
  std::atomic<uint64_t> unknown_worker_events_total{0};  // events dropped: the worker is not known
  std::atomic<uint64_t> queued_bytes{0};                 // gauge: bytes of decoded events queued
  std::atomic<uint64_t> queue_dropped_bytes_total{0};    // of the dropped messages
  std::atomic<uint64_t> queue_worker_dropped_total{0};   // messages dropped: their worker's share was full
  // Heartbeat rejections by reason: DecodeError values 1..6, then the
  // pipeline's own (a missing URL; and the trust rules: a URL outside
  // events.worker_url_allow, a known worker's URL changed by a heartbeat,
  // events.max_bus_workers reached).
  static constexpr size_t kHeartbeatMissingUrl = 7;
  static constexpr size_t kHeartbeatUrlNotAllowed = 8;
  static constexpr size_t kHeartbeatUrlChanged = 9;
  static constexpr size_t kHeartbeatTooManyWorkers = 10;
  std::array<std::atomic<uint64_t>, 11> heartbeats_rejected_by_reason{};
  static std::string_view heartbeat_reason(size_t i);
};

class EventPipeline {
 public:
  // `index` is the one handle to what the writer thread feeds: events,
  // removals, block limits, and resync dumps, resync marks and worker
  // instances (the daemon's is the merged index in front of the event
  // sequencer, which acts on the last three; a plain index ignores them).
  EventPipeline(const EventsConfig& events, uint32_t block_size, Indexer& index, WorkerRegistry& registry,
                const Clock& clock);
  ~EventPipeline();

  // Starts the writer thread and subscribes on `bus`. False + error on failure.
  bool start(NatsBus& bus, std::string* error);
  // Starts only the writer thread (tests feed on_*_message directly).
  void start_writer();
  // Stops the writer thread (subscriptions end with the bus).
  void stop();

  // Entry points used by the NATS handlers; public so tests can feed bytes.
  void on_kv_message(std::string_view data);
  void on_heartbeat_message(std::string_view data);
  // Any thread (ZmqEventSource's sink): queues already decoded index events
  // for the writer thread, as one message. False (counted in
  // queue_dropped_total, nothing queued) when the queue is full.
  bool enqueue_events(std::vector<KvEvent>&& events);

  // Any thread (typically the writer, from the sequencer's gap callback):
  // asks `owner`'s worker for a full dump; retried until it arrives or the
  // worker expires. Duplicate requests for an owner already pending are merged.
  void request_resync(CacheOwner owner);
  // Asks every known event-publishing worker (each dp rank) for a dump: after
  // a NATS reconnect, its events may have been lost. Any thread.
  void resync_all();
  // Time since the index last heard from `worker` (an event or a dump);
  // nullopt if never. Any thread.
  std::optional<Nanos> index_age(WorkerId worker) const;
  std::vector<std::pair<WorkerId, Nanos>> index_ages() const;

  // Any thread: drops every block of `worker` on the writer thread, in order
  // with the events queued before (a router-known worker left the fleet).
  void enqueue_remove_worker(WorkerId worker);

  // Per-worker block limits, refreshed on the writer thread every expiry tick
  // (<= 250 ms) from the registry: a worker that declares its KV capacity
  // (scrape: vLLM num_gpu_blocks, SGLang max_total_num_tokens / page size;
  // heartbeat: kv_total_blocks) may hold ceil(capacity x slack) blocks, at
  // most `ceiling`; the others `ceiling` (indexer.max_blocks_per_worker,
  // indexer.capacity_slack). Set before start().
  void set_block_limit_policy(uint64_t ceiling, double slack) {
    block_ceiling_ = ceiling;
    capacity_slack_ = slack;
  }

  // Blocks until every event queued before the call has been applied (tests, shutdown).
  void drain();

  const EventPipelineStats& stats() const { return stats_; }

 private:
  void writer_loop();
  void refresh_block_limits();  // writer thread
  void resync_loop();
  struct ResyncBegin { CacheOwner owner; };
  struct InstanceSeen { WorkerId worker; uint64_t instance; };
  struct RemoveWorker {
    WorkerId worker;
  };
  using QueueItem = std::variant<std::vector<KvEvent>, ResyncDump, RemoveWorker, ResyncBegin, InstanceSeen>;
  // Bounded queue and the writer's control items.
  bool push_item(QueueItem item);   // false: queue full (counted by the caller)
  void apply_control(QueueItem& item);            // writer: dumps, resync marks, instances
  bool fetch_dump(CacheOwner owner, ResyncDump& out, std::string& why);  // resync thread
  bool take_resync(std::unique_lock<std::mutex>& lk, CacheOwner& owner);  // resync thread, mu_ held
  void finish_resync(CacheOwner owner, bool ok);
  void note_heard(WorkerId worker);
  bool drop_unknown_workers(std::vector<KvEvent>& events);
  void note_instance(WorkerId worker, uint64_t instance, bool joined, uint32_t dp_size, bool publishes);
  void reject_heartbeat(size_t reason, WorkerId worker, std::string_view url);
  static size_t item_bytes(const QueueItem& item);
  static WorkerId item_worker(const QueueItem& item);

  const EventsConfig cfg_;
  const UrlAllowList url_allow_;  // events.worker_url_allow (validated with the config)
  const uint32_t block_size_;
  Indexer& index_;
  WorkerRegistry& registry_;
  const Clock& clock_;
  DecodeLimits limits_;
  EventPipelineStats stats_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable drained_cv_;
  // One queue per worker (an entry per NATS message, ZMQ batch, dump or
  // control item of that worker, in arrival order), served round-robin one
  // entry at a time: a worker with a deep backlog delays another worker's
  // next entry by at most one of its own entries. Guarded by mu_.
  struct WorkerQueue {
    std::deque<std::pair<uint64_t, QueueItem>> items;  // (push number, item)
    uint64_t bytes = 0;        // item_bytes of its event batches
    uint64_t batches = 0;      // its event batches
  };
  std::unordered_map<WorkerId, WorkerQueue> queues_;
  std::deque<WorkerId> ready_;         // workers with queued items, in turn order
  size_t queued_items_ = 0;            // event batches queued, all workers
  std::set<uint64_t> outstanding_;     // push numbers not yet applied, for drain()
  uint64_t pushed_ = 0;                // push numbers handed out
  bool stop_ = false;
  std::thread writer_;
  std::vector<std::pair<WorkerId, uint64_t>> removed_;  // writer thread: hand_evictions' scratch

  NatsBus* bus_ = nullptr;
  std::condition_variable resync_cv_;
  std::vector<CacheOwner> resync_pending_;  // guarded by mu_
  // Block limits, queue bytes, resync pacing, workers' last sign of life and instances.
  uint64_t block_ceiling_ = 0;  // 0: no limits set (the index's default ceiling)
  double capacity_slack_ = 2.0;
  uint64_t queued_bytes_ = 0;  // guarded by mu_
  struct ResyncPace {
    TimePoint next_allowed{};
    Nanos backoff{};
  };
  std::map<CacheOwner, ResyncPace> resync_pace_;  // guarded by mu_
  std::set<CacheOwner> resync_active_;            // guarded by mu_
  std::vector<std::thread> resync_threads_;
  mutable std::mutex heard_mu_;
  std::unordered_map<WorkerId, TimePoint> heard_;  // last event or dump, guarded by heard_mu_
  std::mutex instance_mu_;
  std::unordered_map<WorkerId, uint64_t> instances_;  // last announced by heartbeats, guarded by instance_mu_
};

}  // namespace kvroute
