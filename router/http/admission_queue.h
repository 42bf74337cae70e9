// The wait queue as the proxy uses it: a request that found every worker of
// its model busy waits here until it is admitted (a trial routed it), its
// deadline passes, a higher-priority or fairer request sheds it, or the
// router stops. Event-driven (router/flow/flow_queue.h): the waiting
// coroutine sleeps until a wake-up from the queue (a worker may have room: a
// request ended, a load report, a worker joined), posted to its io thread,
// resumes it directly, or its deadline's timer does. Nothing polls.
//
// Threading: the FlowQueue is shared by every io thread (it locks); a
// waiter's timer and wake-up flag live on its own io thread only (the queue
// posts there), in a shared state that outlives a late posted wake-up.
#pragma once

#include <boost/asio/post.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "router/flow/flow_queue.h"
#include "router/http/executor.h"

namespace kvroute {

class AdmissionQueue {
 public:
  // How a wait ended.
  enum class Outcome : uint8_t {
    Admitted,  ///< a trial routed it: the route is set
    Full,      ///< not queued: the queue (or its band) is full and nobody may be shed for it
    Shed,      ///< pushed out by a higher band or a tenant under its share
    Timeout,   ///< its deadline passed
    Stopped,   ///< the router is shutting down
  };

  struct Ticket {
    std::string_view model;
    uint32_t band = 0;
    uint32_t tenant = 0;
    uint32_t weight = 1;
    uint64_t bytes = 0;
  };

  explicit AdmissionQueue(flow::FlowQueue& q) : q_(q) {}

  // Queues the request and waits. `try_admit()` runs on this coroutine's
  // thread each time the queue offers it a slot (it routes the request
  // again; true = routed). `position` (may be null): requests of the model
  // ahead of it at entry.
  awaitable<Outcome> wait(Executor ex, const Ticket& t, const flow::QueueLimits& limits,
                          Steady::time_point deadline, const std::function<bool()>& try_admit,
                          uint64_t* position = nullptr) {
    // The waiting coroutine sleeps in sleep() below; a wake-up (posted to
    // this thread) or the deadline's timer resumes it directly: one hop on
    // this thread per wake-up (no timer cancel and its completion in between).
    struct WaitState {
      explicit WaitState(Executor e) : timer(e) {}
      Timer timer;
      std::optional<flow::Wake> wake;
      bool expired = false;
      std::function<void()> resume;  // the sleeping coroutine's handler, while it sleeps
      void fire() {
        if (!resume) return;
        auto r = std::move(resume);
        resume = nullptr;
        r();
      }
    };
    auto st = std::make_shared<WaitState>(ex);
    auto w = std::make_shared<flow::Waiter>();
    w->model.assign(t.model);
    w->band = t.band;
    w->tenant = t.tenant;
    w->weight = t.weight;
    w->bytes = t.bytes;
    // Steady nanoseconds: the queue stores it for explain, never reads a clock.
    w->entered = std::chrono::duration_cast<std::chrono::nanoseconds>(Steady::now().time_since_epoch()).count();
    // Called under the queue's lock, from any thread: only posts.
    w->wake = [st, ex](flow::Wake k) {
      asio::post(ex, [st, k] {
        st->wake = k;
        st->fire();
      });
    };
    if (q_.enter(w, limits, position) == flow::Enter::Full) co_return Outcome::Full;
    // A capacity event between the request's busy route and its entry found
    // nobody to wake and is gone: one trial now, or the request would wait
    // for the next event or its deadline.
    if (try_admit()) {
      q_.leave(*w);  // false: shed or stopped meanwhile, but it has its worker now
      co_return Outcome::Admitted;
    }
    struct CancelTimer {
      WaitState& s;
      ~CancelTimer() { s.timer.cancel(); }
    } cancel_timer{*st};
    st->timer.expires_at(deadline);
    st->timer.async_wait([st](const boost::system::error_code& ec) {
      if (ec) return;  // cancelled: the wait is over
      st->expired = true;
      st->fire();
    });
    const auto sleep = [&st]() {
      return asio::async_initiate<const asio::use_awaitable_t<Executor>&, void()>(
          [&st](auto handler) {
            auto h = std::make_shared<decltype(handler)>(std::move(handler));
            st->resume = [h] { std::move (*h)(); };
          },
          use_awaitable);
    };
    for (;;) {
      if (!st->wake && !st->expired) co_await sleep();
      if (st->wake) {
        const flow::Wake k = *st->wake;
        st->wake.reset();
        if (k == flow::Wake::Shed) co_return Outcome::Shed;
        if (k == flow::Wake::Stop) co_return Outcome::Stopped;
        const bool admitted = try_admit();
        q_.trial_done(*w, admitted);
        if (admitted) co_return Outcome::Admitted;
        continue;
      }
      if (q_.leave(*w)) co_return Outcome::Timeout;
      // Shed or stopped at the same moment: that wake-up is posted; take it.
      co_await asio::post(ex, use_awaitable);
    }
  }

  // A worker of `model` may have room.
  void notify(std::string_view model) { q_.notify(model); }
  // Requests waiting now.
  int64_t waiting() const { return static_cast<int64_t>(q_.waiting()); }

 private:
  flow::FlowQueue& q_;
};

}  // namespace kvroute
