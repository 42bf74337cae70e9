// The workers the router knows itself: the config's static list, DNS names
// (every A/AAAA record one worker, re-resolved periodically) and workers
// added through the admin API. Keeps the WorkerRegistry, the scraper and the
// KV event subscriptions (through hooks) in step with that set; adding or
// removing a worker is never a restart (SIGHUP, PUT /admin/config, admin API).
// NATS-heartbeat workers are not managed here (events/event_pipeline.h).
//
// Threads:
//   "kvroute-fleet" - one io_context: reconciliation, the scraper
//                     (fleet/scraper.h), hooks. Hooks run here.
//   "kvroute-dns"   - resolves discovery.dns names (blocking c-ares calls)
//                     every dns_interval_ms and posts the answers to the
//                     fleet thread.
// Public member functions are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "config/config.h"
#include "fleet/scraper.h"
#include "fleet/worker_registry.h"

namespace kvroute {

struct KnownWorkerHooks {
  // A router-known worker appeared, or its KV event endpoints changed (then
  // `removed` ran first). Subscribe to its events here.
  std::function<void(const WorkerAnnouncement&)> added;
  // A router-known worker left the set: unsubscribe and drop its blocks.
  std::function<void(WorkerId)> removed;
  // A worker that was down (refused / failed scrapes) answers again: it may
  // have restarted with an empty cache; re-sync its KV events.
  std::function<void(const WorkerAnnouncement&)> recovered;
};

struct KnownWorkerStats {
  std::atomic<uint64_t> dns_lookups_ok{0};
  std::atomic<uint64_t> dns_lookups_not_found{0};
  std::atomic<uint64_t> dns_lookups_failed{0};  // timeouts, SERVFAIL: the last answer is kept
  std::atomic<uint64_t> workers_added{0};
  std::atomic<uint64_t> workers_removed{0};
};

class KnownWorkers {
 public:
  KnownWorkers(WorkerRegistry& registry, uint32_t block_size, KnownWorkerHooks hooks);
  ~KnownWorkers();
  KnownWorkers(const KnownWorkers&) = delete;
  KnownWorkers& operator=(const KnownWorkers&) = delete;

  // Starts both threads with `cfg` (validated). Returns at once; the first
  // reconciliation and DNS resolution follow asynchronously.
  void start(const Config& cfg);
  // Applies a new configuration (workers.*, discovery.*); validated by the caller.
  void apply_config(const Config& cfg);
  void stop();

  // Admin API. `entry` in the workers.static text form (one entry). The
  // worker joins at once; an error names the field. Re-adding a removed
  // worker undoes the removal.
  std::optional<std::string> add_worker(std::string_view entry);
  // Removes any router-known worker (static, DNS or admin) until it is added
  // again through the admin API; false if no such worker.
  bool remove_worker(WorkerId id);

  // Blocks until every change made before the call has reached the registry
  // (tests, admin API answers).
  void sync();

  const KnownWorkerStats& stats() const { return stats_; }
  const ScraperStats& scrape_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  KnownWorkerStats stats_;
};

}  // namespace kvroute
