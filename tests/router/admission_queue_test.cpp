// router/http/admission_queue.h on a real io_context: the trial a request
// gets when it enters the queue. The capacity event that would have woken it
// can come between its busy route and its entry (another io thread ends a
// request meanwhile); with nobody queued yet the event wakes nobody, so
// without that trial the request would wait for the next event or its
// deadline though a worker has room. And the handover: a trial offered by a
// capacity event on another io thread runs on that thread.
#include "router/http/admission_queue.h"

#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>

#include <atomic>
#include <future>
#include <optional>
#include <thread>

using namespace kvroute;

namespace {

struct Run {
  std::optional<AdmissionQueue::Outcome> outcome;
  int trials = 0;
};

// Queues one request of model "m" whose route succeeds once `free` is true,
// with its deadline already past (a wait that does not admit it at once times
// out at once: no sleeping, no clock race).
void wait_once(AdmissionQueue& q, asio::io_context& ioc, const bool& free, Run& run) {
  const std::function<bool()> try_admit = [&] {
    ++run.trials;
    return free;
  };
  const flow::QueueLimits limits{.max_count = 16, .max_bytes = 0, .band_max = {}};
  asio::co_spawn(ioc, [&]() -> awaitable<void> {
    run.outcome = co_await q.wait(ioc.get_executor(), AdmissionQueue::Ticket{"m", 0, 0, 1, 10}, limits,
                                  Steady::now() - std::chrono::seconds(1), try_admit);
  }, asio::detached);
  ioc.run();
  ioc.restart();
}

}  // namespace

TEST_CASE("admission queue: a capacity event between the busy route and the entry is not lost") {
  flow::FlowQueue fq;
  AdmissionQueue q(fq);
  asio::io_context ioc(1);
  bool free = false;  // the request's route found every worker busy
  // A request ends on another io thread: its worker has room, and the
  // registry's capacity event reaches the queue before the request entered it.
  free = true;
  q.notify("m");
  CHECK(q.waiting() == 0);  // nobody to wake: the event is gone
  Run run;
  wait_once(q, ioc, free, run);
  REQUIRE(run.outcome.has_value());
  CHECK(*run.outcome == AdmissionQueue::Outcome::Admitted);
  CHECK(run.trials == 1);
  CHECK(q.waiting() == 0);  // it left the queue with its worker
}

TEST_CASE("admission queue: still busy at entry, it waits (here: to its deadline) and leaves the queue") {
  flow::FlowQueue fq;
  AdmissionQueue q(fq);
  asio::io_context ioc(1);
  const bool free = false;
  Run run;
  wait_once(q, ioc, free, run);
  REQUIRE(run.outcome.has_value());
  CHECK(*run.outcome == AdmissionQueue::Outcome::Timeout);
  CHECK(run.trials == 1);  // the entry trial only: no event came
  CHECK(q.waiting() == 0);
}

// A request of model "m" queued on its own io thread (A, run by a thread of
// its own): its route succeeds once `free` is set; `admitted_on` is the
// thread its successful trial ran on.
struct QueuedOnA {
  flow::FlowQueue fq;
  AdmissionQueue q{fq};
  asio::io_context a{1};
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(a);
  std::thread ta{[this] { a.run(); }};
  std::atomic<bool> free{false};
  std::atomic<int> trials{0};
  std::atomic<std::thread::id> admitted_on{};
  const std::function<bool()> try_admit = [this] {
    ++trials;
    if (!free.load()) return false;
    admitted_on.store(std::this_thread::get_id());
    return true;
  };
  std::promise<AdmissionQueue::Outcome> outcome;

  // Queues it and returns once its entry trial (busy) is over and it sleeps.
  void enter_and_sleep() {
    const flow::QueueLimits limits{.max_count = 16, .max_bytes = 0, .band_max = {}};
    asio::post(a, [this, limits] {
      asio::co_spawn(a, [this, limits]() -> awaitable<void> {
        outcome.set_value(co_await q.wait(a.get_executor(), AdmissionQueue::Ticket{"m", 0, 0, 1, 10}, limits,
                                          Steady::now() + std::chrono::hours(1), try_admit));
      }, asio::detached);
    });
    const auto until = Steady::now() + std::chrono::seconds(30);
    while (trials.load() == 0 && Steady::now() < until) std::this_thread::yield();
    REQUIRE(trials.load() == 1);
    // A handler posted to A after the one that ran the entry trial runs once
    // the coroutine is suspended.
    std::promise<void> asleep;
    asio::post(a, [&] { asleep.set_value(); });
    asleep.get_future().wait();
    REQUIRE(q.waiting() == 1);
  }
  AdmissionQueue::Outcome result() {
    auto f = outcome.get_future();
    REQUIRE(f.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    return f.get();
  }
  ~QueuedOnA() {
    work.reset();
    ta.join();
  }
};

// The handover: a request ends on io thread B and frees the slot a request
// queued on io thread A waits for. The trial (route again, claim the slot)
// runs on B, which raised the capacity event, without waking A first; A is
// then told it was admitted.
TEST_CASE("admission queue: a slot freed on another io thread is handed over there, the waiter told it was admitted") {
  QueuedOnA w;
  asio::io_context b(1);
  auto work_b = asio::make_work_guard(b);
  Handover hb(b.get_executor());
  std::thread tb([&] {
    const Handover::Scope scope(hb);
    b.run();
  });
  w.enter_and_sleep();
  // The request ending on B: the slot frees, the registry's capacity event.
  asio::post(b, [&] {
    w.free.store(true);
    w.q.notify("m");
  });
  CHECK(w.result() == AdmissionQueue::Outcome::Admitted);
  CHECK(w.trials.load() == 2);
  CHECK(w.admitted_on.load() == tb.get_id());  // routed on the freeing thread
  CHECK(w.q.waiting() == 0);
  work_b.reset();
  tb.join();
}

// Without a Handover on the thread that raised the event (a load report from
// the bus thread), the trial runs on the waiter's own thread, as before.
TEST_CASE("admission queue: an event from a thread with no handover runs the trial on the waiter's thread") {
  QueuedOnA w;
  w.enter_and_sleep();
  w.free.store(true);
  w.q.notify("m");  // this (test) thread has no Handover
  CHECK(w.result() == AdmissionQueue::Outcome::Admitted);
  CHECK(w.admitted_on.load() == w.ta.get_id());
}
