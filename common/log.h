// Logging set-up (spdlog), human or JSON lines, the per-request access log,
// and rate limiting for warnings of degraded modes. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvroute {

// level: trace|debug|info|warn|error; format: human|json. Safe to call again
// at runtime (config reload).
void setup_logging(std::string_view level, std::string_view format);

// One line per request. Never carries the prompt or the completion text.
struct AccessRecord {
  std::string_view method, path, model;
  unsigned status = 0;
  int64_t worker = -1;            // -1: no worker was chosen
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;
  uint32_t attempts = 0;
  double ttfb_ms = -1;            // -1: no response byte from a worker
  double duration_ms = 0;
  bool stream = false;
  std::string_view outcome;       // ok, client_cancel, upstream_error, rejected, ...
};
void log_access(const AccessRecord& r);

// Allows the first `burst` events, then one per `interval`; counts the rest.
// Use one per call site: `static RateLimiter rl; if (rl.allow()) spdlog::warn(...)`.
class RateLimiter {
 public:
  explicit RateLimiter(uint32_t burst = 5, std::chrono::seconds interval = std::chrono::seconds(10))
      : burst_(burst), interval_ns_(std::chrono::nanoseconds(interval).count()) {}
  bool allow();
  // Events suppressed since the last allowed one (reset by allow() == true).
  uint64_t suppressed() const { return suppressed_.load(std::memory_order_relaxed); }

 private:
  const uint32_t burst_;
  const int64_t interval_ns_;
  std::atomic<uint32_t> seen_{0};
  std::atomic<int64_t> next_ns_{0};
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace kvroute
