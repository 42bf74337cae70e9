// Scrapes every router-known worker's Prometheus /metrics for its load and
// liveness (fleet/engine_metrics.h) and reports to the WorkerRegistry:
// on_load_report() on an answer, report_failure() otherwise
// (ConnectRefused, ConnectTimeout, or ScrapeFailed for a timeout, a non-200
// status, or a body with no engine metric).
//
// One coroutine per target on the fleet io_context, keep-alive connection
// reused between scrapes, each scrape bounded by the timeout. The only Beast
// code outside router/ and mocker/ (a plain client; http only).
//
// Threading: every member runs on the thread that runs `ioc` (the fleet
// thread); set_targets() and set_timing() must be called there. The
// registry is thread-safe.
#pragma once

#include <boost/asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/types.h"
#include "fleet/worker_registry.h"

namespace kvroute {

struct ScrapeTarget {
  WorkerId id;
  std::string url;          // http://host:port/metrics
  uint32_t block_size = 16; // converts SGLang's token capacity to blocks
  uint32_t max_seqs = 256;  // capacity when /metrics does not say
  uint64_t kv_blocks = 0;
  friend bool operator==(const ScrapeTarget&, const ScrapeTarget&) = default;
};

// Written by the fleet thread, readable from any thread.
struct ScraperStats {
  std::atomic<uint64_t> scrapes_ok{0};
  std::atomic<uint64_t> scrapes_failed{0};
};

class Scraper {
 public:
  // `recovered` (may be empty) runs on the fleet thread when a worker that
  // was down answers again.
  Scraper(boost::asio::io_context& ioc, WorkerRegistry& registry, std::function<void(WorkerId)> recovered = {});
  ~Scraper();
  // Replaces the set of targets: new ones start at once, removed ones stop
  // (their connection closes), changed ones restart.
  void set_targets(const std::vector<ScrapeTarget>& targets);
  void set_timing(std::chrono::milliseconds interval, std::chrono::milliseconds timeout);
  const ScraperStats& stats() const { return stats_; }

  struct Loop;  // one target's state (scraper.cpp)

 private:
  boost::asio::io_context& ioc_;
  WorkerRegistry& registry_;
  std::function<void(WorkerId)> recovered_;
  std::chrono::milliseconds interval_{250}, timeout_{1000};
  std::map<uint64_t, std::shared_ptr<Loop>> loops_;  // by worker id
  ScraperStats stats_;
};

}  // namespace kvroute
