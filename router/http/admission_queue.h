// The bounded wait queue for requests that found every worker of their model
// busy (scheduler.queue_size, scheduler.queue_timeout_ms): a request waits
// here, routed again every 5 ms, until a worker is free, its timeout, or
// shutdown.
//
// The interface is what the proxy needs and no more (enter and wait, the
// count, its gauge), so that an event-driven queue (woken by a worker's load
// falling instead of polling) can replace it without touching the proxy.
//
// Threading: the count is shared by every io thread (atomic); wait() runs on
// the calling request's io thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "common/metrics.h"
#include "router/http/executor.h"

namespace kvroute {

class AdmissionQueue {
 public:
  static constexpr auto kPoll = milliseconds(5);

  // `waiting` (may be null): the gauge of requests in the queue.
  explicit AdmissionQueue(metrics::Gauge* waiting = nullptr) : gauge_(waiting) {}

  // Waits in the queue unless `capacity` requests wait already (then false at
  // once). While waiting: `still_busy()` is called every kPoll (it routes the
  // request again) until it returns false, `timeout` passes or `stop()` is
  // true. True once it has waited; the request's route says how it ended.
  awaitable<bool> wait(Executor ex, uint64_t capacity, milliseconds timeout, const std::function<bool()>& still_busy,
                       const std::function<bool()>& stop) {
    if (waiting_.fetch_add(1) >= static_cast<int64_t>(capacity)) {
      waiting_.fetch_sub(1);
      co_return false;
    }
    if (gauge_) gauge_->add(1);
    const auto deadline = Steady::now() + timeout;
    Timer timer(ex);
    boost::system::error_code ec;
    bool busy = true;
    while (busy && Steady::now() < deadline && !stop()) {
      timer.expires_after(kPoll);
      co_await timer.async_wait(nothrow(ec));
      busy = still_busy();
    }
    waiting_.fetch_sub(1);
    if (gauge_) gauge_->add(-1);
    co_return true;
  }

  // Requests waiting now.
  int64_t waiting() const { return waiting_.load(std::memory_order_relaxed); }

 private:
  metrics::Gauge* gauge_;
  std::atomic<int64_t> waiting_{0};
};

}  // namespace kvroute
