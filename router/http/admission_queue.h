// The wait queue as the proxy uses it: a request that found every worker of
// its model busy waits here until it is admitted (a trial routed it), its
// deadline passes, a higher-priority or fairer request sheds it, or the
// router stops. Event-driven (router/flow/flow_queue.h): the waiting
// coroutine sleeps until a wake-up from the queue (a worker may have room: a
// request ended, a load report, a worker joined), posted to its io thread,
// resumes it directly, or its deadline's timer does. Nothing polls.
//
// Handover: a capacity event raised on an io thread (a request of that
// thread ended and freed its slot) that offers a trial to a waiter of another
// io thread runs that trial on the freeing thread (`Handover`), once the
// registry's and the queue's locks are released: the waiter is routed again
// and its worker's slot claimed there (try_admit() claims it, so nobody else
// takes it meanwhile), with no OS thread wake-up before the admission; the
// waiter's own thread is told the outcome (one post) and sends the request.
// An admitted trial chains to the next head on the same thread, so a burst
// of freed slots is handed out at once rather than one cross-thread wake-up
// per admission. A waiter on the freeing thread itself is woken by a post to
// its own thread (no wake-up of another thread either). Events from other
// threads (load reports, heartbeats) post the trial to the waiter's thread.
//
// Threading: the FlowQueue is shared by every io thread (it locks); a
// waiter's timer and wake-up flag live on its own io thread only (the queue
// posts there), in a shared state that outlives a late posted wake-up. A
// handed-over trial reads the request and writes its route on the freeing
// thread while the waiter's coroutine sleeps: the queue keeps the waiter
// (no shed, no stop, its leave() deferred) until the outcome is posted back,
// which orders the two threads' accesses.
#pragma once

#include <boost/asio/post.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "router/flow/flow_queue.h"
#include "router/http/executor.h"

namespace kvroute {

// One waiting request's state on its own io thread (see AdmissionQueue::wait).
struct QueueWaitState {
  QueueWaitState(Executor e, const std::function<bool()>& t) : ex(e), timer(e), trial(&t) {}
  Executor ex;  // the waiter's io thread
  Timer timer;
  std::optional<flow::Wake> wake;
  bool expired = false;
  // Set once the entry trial is over: from then on a trial may be handed
  // over to another thread (before, only the waiter's thread runs one).
  std::atomic<bool> handover_ok{false};
  // The request's trial (routes it again, claims the slot); valid while the
  // waiter is in wait(), which it cannot leave while a trial is handed over.
  const std::function<bool()>* trial;
  std::function<void()> resume;  // the sleeping coroutine's handler, while it sleeps
  void fire() {
    if (!resume) return;
    auto r = std::move(resume);
    resume = nullptr;
    r();
  }
  // Posts a wake-up to the waiter's thread.
  static void post_wake(const std::shared_ptr<QueueWaitState>& st, flow::Wake k) {
    asio::post(st->ex, [st, k] {
      st->wake = k;
      st->fire();
    });
  }
};

// An io thread's handovers: the trials of other threads' waiters that a
// capacity event raised on this thread took (FlowQueue's take()), run here
// in one posted handler, after the locks the event was raised under are
// released. Installed for the thread's life (Scope); touched by its thread
// only.
class Handover {
 public:
  explicit Handover(Executor ex) : ex_(ex) {}

  // The handover of the calling thread while a Scope is alive (else null).
  static Handover* current() { return current_; }
  struct Scope {
    explicit Scope(Handover& h) : prev(current_) { current_ = &h; }
    ~Scope() { current_ = prev; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Handover* prev;
  };

  Executor executor() const { return ex_; }

  // Called under the queue's lock: the trial runs here later.
  void take(flow::FlowQueue& q, std::shared_ptr<QueueWaitState> st, flow::Waiter* w) {
    pending_.push_back(Entry{&q, std::move(st), w});
    if (pending_.size() == 1 && !draining_) asio::post(ex_, [this] { drain(); });
  }

 private:
  struct Entry {
    flow::FlowQueue* q;
    std::shared_ptr<QueueWaitState> st;
    flow::Waiter* w;  // alive: its coroutine waits for the outcome
  };

  // Runs the taken trials; an admitted one chains the next head's trial,
  // which may be taken here again (appended, run in this loop).
  void drain() {
    draining_ = true;
    for (size_t i = 0; i < pending_.size(); ++i) {
      Entry e = std::move(pending_[i]);
      const bool admitted = (*e.st->trial)();
      if (const auto k = e.q->handover_done(*e.w, admitted)) QueueWaitState::post_wake(e.st, *k);
    }
    pending_.clear();
    draining_ = false;
  }

  Executor ex_;
  std::vector<Entry> pending_;
  bool draining_ = false;
  static inline thread_local Handover* current_ = nullptr;
};

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

  // Queues the request and waits. `try_admit()` runs each time the queue
  // offers the request a slot: on this coroutine's thread, or on the io
  // thread whose request freed the slot (Handover) while this coroutine
  // sleeps; it routes the request again and claims the slot (true = routed).
  // `position` (may be null): requests of the model ahead of it at entry.
  awaitable<Outcome> wait(Executor ex, const Ticket& t, const flow::QueueLimits& limits,
                          Steady::time_point deadline, const std::function<bool()>& try_admit,
                          uint64_t* position = nullptr) {
    // The waiting coroutine sleeps in sleep() below; a wake-up (posted to
    // this thread) or the deadline's timer resumes it directly: one hop on
    // this thread per wake-up (no timer cancel and its completion in between).
    auto st = std::make_shared<QueueWaitState>(ex, try_admit);
    auto w = std::make_shared<flow::Waiter>();
    w->model.assign(t.model);
    w->band = t.band;
    w->tenant = t.tenant;
    w->weight = t.weight;
    w->bytes = t.bytes;
    // Steady nanoseconds: the queue stores it for explain, never reads a clock.
    w->entered = std::chrono::duration_cast<std::chrono::nanoseconds>(Steady::now().time_since_epoch()).count();
    // Called under the queue's lock, from any thread: only posts.
    w->wake = [st](flow::Wake k) { QueueWaitState::post_wake(st, k); };
    // Called under the queue's lock: an io thread other than this one takes
    // the trial (raw pointers: the queue and the waiter outlive it).
    w->take = [st, q = &q_, wp = w.get()] {
      Handover* h = Handover::current();
      if (!h || !st->handover_ok.load(std::memory_order_acquire) || h->executor() == st->ex) return false;
      h->take(*q, st, wp);
      return true;
    };
    if (q_.enter(w, limits, position) == flow::Enter::Full) co_return Outcome::Full;
    // A capacity event between the request's busy route and its entry found
    // nobody to wake and is gone: one trial now, or the request would wait
    // for the next event or its deadline. (No trial is handed over before
    // this one is over: both would write the route.)
    if (try_admit()) {
      q_.leave(*w);  // false: shed or stopped meanwhile, but it has its worker now
      co_return Outcome::Admitted;
    }
    st->handover_ok.store(true, std::memory_order_release);
    struct CancelTimer {
      QueueWaitState& s;
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
        switch (k) {
          case flow::Wake::Shed: co_return Outcome::Shed;
          case flow::Wake::Stop: co_return Outcome::Stopped;
          case flow::Wake::Admitted: co_return Outcome::Admitted;  // routed on the freeing thread
          case flow::Wake::Left: co_return Outcome::Timeout;       // its deadline, after a handed-over trial
          case flow::Wake::Try: break;
        }
        const bool admitted = try_admit();
        q_.trial_done(*w, admitted);
        if (admitted) co_return Outcome::Admitted;
        continue;
      }
      if (q_.leave(*w)) co_return Outcome::Timeout;
      // Shed or stopped at the same moment, or a trial handed over to another
      // thread runs: that wake-up is posted (or will be); sleep until it comes.
      st->expired = false;
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
