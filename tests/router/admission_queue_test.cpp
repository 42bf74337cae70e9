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

// The handover: a request ends on io thread B and frees the slot a request
// queued on io thread A waits for. The trial (route again, claim the slot)
// runs on B, which raised the capacity event, without waking A first; A is
// then told it was admitted.
TEST_CASE("admission queue: a slot freed on another io thread is handed over there, the waiter told it was admitted") {
  flow::FlowQueue fq;
  AdmissionQueue q(fq);
  asio::io_context a(1), b(1);
  auto work_a = asio::make_work_guard(a);
  auto work_b = asio::make_work_guard(b);
  Handover hb(b.get_executor());
  std::thread ta([&] { a.run(); });
  std::thread tb([&] {
    const Handover::Scope scope(hb);
    b.run();
  });
  std::atomic<bool> free{false};
  std::atomic<int> trials{0};
  std::atomic<std::thread::id> admitted_on{};
  const std::function<bool()> try_admit = [&] {
    ++trials;
    if (!free.load()) return false;
    admitted_on.store(std::this_thread::get_id());
    return true;
  };
  std::promise<AdmissionQueue::Outcome> outcome;
  const flow::QueueLimits limits{.max_count = 16, .max_bytes = 0, .band_max = {}};
  asio::post(a, [&] {
    asio::co_spawn(a, [&]() -> awaitable<void> {
      outcome.set_value(co_await q.wait(a.get_executor(), AdmissionQueue::Ticket{"m", 0, 0, 1, 10}, limits,
                                        Steady::now() + std::chrono::hours(1), try_admit));
    }, asio::detached);
  });
  // Until its entry trial is over and it sleeps: a handler posted to A after
  // the one that ran the entry trial runs once the coroutine is suspended.
  const auto until = Steady::now() + std::chrono::seconds(30);
  while (trials.load() == 0 && Steady::now() < until) std::this_thread::yield();
  REQUIRE(trials.load() == 1);
  std::promise<void> asleep;
  asio::post(a, [&] { asleep.set_value(); });
  asleep.get_future().wait();
  REQUIRE(q.waiting() == 1);
  // The request ending on B: the slot frees, the registry's capacity event.
  asio::post(b, [&] {
    free.store(true);
    q.notify("m");
  });
  auto f = outcome.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  CHECK(f.get() == AdmissionQueue::Outcome::Admitted);
  CHECK(trials.load() == 2);
  CHECK(admitted_on.load() == tb.get_id());  // routed on the freeing thread
  CHECK(q.waiting() == 0);
  work_a.reset();
  work_b.reset();
  ta.join();
  tb.join();
}

// Without a Handover on the thread that raised the event (a load report from
// the bus thread), or when the waiter is on that thread, the trial runs on
// the waiter's own thread, as before.
TEST_CASE("admission queue: an event from a thread with no handover runs the trial on the waiter's thread") {
  flow::FlowQueue fq;
  AdmissionQueue q(fq);
  asio::io_context a(1);
  auto work_a = asio::make_work_guard(a);
  std::thread ta([&] { a.run(); });
  std::atomic<bool> free{false};
  std::atomic<int> trials{0};
  std::atomic<std::thread::id> admitted_on{};
  const std::function<bool()> try_admit = [&] {
    ++trials;
    if (!free.load()) return false;
    admitted_on.store(std::this_thread::get_id());
    return true;
  };
  std::promise<AdmissionQueue::Outcome> outcome;
  const flow::QueueLimits limits{.max_count = 16, .max_bytes = 0, .band_max = {}};
  asio::post(a, [&] {
    asio::co_spawn(a, [&]() -> awaitable<void> {
      outcome.set_value(co_await q.wait(a.get_executor(), AdmissionQueue::Ticket{"m", 0, 0, 1, 10}, limits,
                                        Steady::now() + std::chrono::hours(1), try_admit));
    }, asio::detached);
  });
  const auto until = Steady::now() + std::chrono::seconds(30);
  while (trials.load() == 0 && Steady::now() < until) std::this_thread::yield();
  std::promise<void> asleep;
  asio::post(a, [&] { asleep.set_value(); });
  asleep.get_future().wait();
  free.store(true);
  q.notify("m");  // this (test) thread has no Handover
  auto f = outcome.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  CHECK(f.get() == AdmissionQueue::Outcome::Admitted);
  CHECK(admitted_on.load() == ta.get_id());
  work_a.reset();
  ta.join();
}
