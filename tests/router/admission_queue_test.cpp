// router/http/admission_queue.h on a real io_context: the trial a request
// gets when it enters the queue. The capacity event that would have woken it
// can come between its busy route and its entry (another io thread ends a
// request meanwhile); with nobody queued yet the event wakes nobody, so
// without that trial the request would wait for the next event or its
// deadline though a worker has room.
#include "router/http/admission_queue.h"

#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <optional>

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
