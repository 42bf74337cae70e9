// bench/flow: admission latency of a queued request when a slot frees: the
// time from "a worker has room" (the event: a request ended on some io
// thread, a load report) to the queued request's route being retried and
// seeing the slot free, which is its admission. The event-driven queue
// (router/http/admission_queue.h over router/flow/flow_queue.h: the
// registry's capacity event offers the model's head waiter a trial) against
// the previous design kept here as the reference (a copy of its loop: the
// waiter re-routes every 5 ms), in the same process, alternating rounds.
//
// Each sample: one request waits in the queue on io thread A; after a random
// pause (0-10 ms, seed 7) a request "ends" (a handler posted to the freeing
// io thread, as a response finishing there: it frees the slot the waiting
// request's route reads and raises the registry's capacity event,
// FlowQueue::notify(model)). Three placements of the freeing thread:
//   other io thread       B != A, B without a Handover (as an event from a
//                         thread that is no io thread: the trial is posted to
//                         A, an OS thread wake-up is in the admission);
//   handed over           B != A, B an io thread with its Handover installed
//                         (as the router's io threads): the trial runs on B;
//   same io thread        B == A (router.threads 1, or the freeing request
//                         shared the waiter's thread).
// `admit` is steady_clock from the slot freeing to the route seeing it free;
// `resume` to the waiting coroutine running again on A (where the request
// is then sent: for a handed-over trial, the post back to A is in it). W
// waiters of other models (default 64) sit in the queue throughout, as in an
// overloaded router. The floors, in the same run: one bare asio::post from
// the freeing thread to the waiter's (no queue, no coroutine): across
// threads the OS wake-up every cross-thread hop pays; on one thread a trip
// through the handler queue.
//
// Run: build/bench/flow/bench_admission [--samples N] [--rounds R] [--others W] [--quick]
//   --quick: 200 samples, 1 round (CTest). Default: 1,000 samples x 3 rounds.
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "router/flow/flow_queue.h"
#include "router/http/admission_queue.h"

using namespace kvroute;
using Clock = std::chrono::steady_clock;

namespace {

// The previous design's wait, as it was (a copy, the reference).
awaitable<bool> poll_wait(Executor ex, std::chrono::milliseconds timeout, const std::function<bool()>& still_busy) {
  const auto deadline = Steady::now() + timeout;
  Timer timer(ex);
  boost::system::error_code ec;
  bool busy = true;
  while (busy && Steady::now() < deadline) {
    timer.expires_after(std::chrono::milliseconds(5));
    co_await timer.async_wait(nothrow(ec));
    busy = still_busy();
  }
  co_return true;
}

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

enum class Place : int { Other, Handover, Same };
const char* const kPlace[] = {"other io thread", "handed over", "same io thread"};

struct Sample {
  std::atomic<bool> free{false};
  std::atomic<int64_t> freed_ns{0};
  std::atomic<int64_t> seen_ns{0};     // the route saw the slot free
  std::atomic<int64_t> resumed_ns{0};  // the waiter runs again on its own thread
  std::promise<void> done;
};

// One round's latencies in µs.
struct Times {
  std::vector<double> admit, resume;
};

// Two io threads: A (the waiter's) and B; the freeing thread is B or A by
// placement, and B has its Handover installed for Place::Handover.
class Rig {
 public:
  explicit Rig(Place p) : place_(p) {
    ta_ = std::thread([this] { a.run(); });
    tb_ = std::thread([this] {
      std::optional<Handover::Scope> scope;
      if (place_ == Place::Handover) scope.emplace(handover_);
      b.run();
    });
  }
  ~Rig() {
    work_a_.reset();
    work_b_.reset();
    ta_.join();
    tb_.join();
  }

  // `n` samples: start(s) (the waiter queues), a seeded pause, free(s)
  // posted to the freeing thread (it stamps freed_ns first), then the wait
  // for the sample's end.
  Times collect(int n, std::mt19937_64& rng, const std::function<void(Sample&)>& start,
                const std::function<void(Sample&)>& free) {
    asio::io_context& freer = place_ == Place::Same ? a : b;
    std::uniform_int_distribution<int> pause_us(0, 10000);
    Times t;
    for (int i = 0; i < n; ++i) {
      Sample s;
      start(s);
      std::this_thread::sleep_for(std::chrono::microseconds(pause_us(rng)));
      asio::post(freer, [&] {
        s.freed_ns.store(now_ns());
        free(s);
      });
      s.done.get_future().wait();
      t.admit.push_back(static_cast<double>(s.seen_ns.load() - s.freed_ns.load()) / 1e3);
      t.resume.push_back(static_cast<double>(s.resumed_ns.load() - s.freed_ns.load()) / 1e3);
    }
    return t;
  }

  asio::io_context a{1}, b{1};

 private:
  Place place_;
  asio::executor_work_guard<asio::io_context::executor_type> work_a_ = asio::make_work_guard(a);
  asio::executor_work_guard<asio::io_context::executor_type> work_b_ = asio::make_work_guard(b);
  Handover handover_{b.get_executor()};
  std::thread ta_, tb_;
};

// The floor under any design that wakes the waiter's io thread: one bare
// asio::post from the freeing thread to the waiter's, the handler timing its
// own start (no queue, no coroutine, no route). Across threads this is the OS
// wake-up of a thread blocked in epoll_wait (Asio's eventfd interrupter) and
// its wait for a core; on the same thread, one trip through the handler queue.
Times run_floor(Place place, int n, std::mt19937_64& rng) {
  Rig rig(place);
  return rig.collect(
      n, rng, [](Sample&) {},
      [&](Sample& s) {
        asio::post(rig.a, [&s] {
          s.seen_ns.store(now_ns());
          s.resumed_ns.store(s.seen_ns.load());
          s.done.set_value();
        });
      });
}

// One round of the queue (event-driven or the 5 ms poll).
Times run(bool event_driven, Place place, int n, int others, std::mt19937_64& rng) {
  Rig rig(place);
  asio::io_context& a = rig.a;
  flow::FlowQueue fq;
  AdmissionQueue q(fq);
  const flow::QueueLimits limits{.max_count = 1u << 20, .max_bytes = 0, .band_max = {}};
  const auto far = Steady::now() + std::chrono::hours(1);
  // Background waiters of other models (never admitted here).
  std::vector<std::string> models;
  for (int i = 0; i < others; ++i) models.push_back("other-" + std::to_string(i));
  if (event_driven)
    for (const auto& m : models)
      asio::co_spawn(a, [&, m]() -> awaitable<void> {
        co_await q.wait(a.get_executor(), AdmissionQueue::Ticket{m, 1, 0, 1, 100}, limits, far, [] { return false; });
      }, asio::detached);
  std::function<bool()> routed;  // the sample's route: free once its slot is
  Sample* current = nullptr;
  routed = [&current] {
    if (!current->free.load()) return false;
    current->seen_ns.store(now_ns());
    return true;
  };
  const auto start = [&](Sample& s) {
    current = &s;
    asio::post(a, [&] {
      asio::co_spawn(a, [&]() -> awaitable<void> {
        if (event_driven) {
          co_await q.wait(a.get_executor(), AdmissionQueue::Ticket{"m", 0, 0, 1, 100}, limits, far, routed);
        } else {
          co_await poll_wait(a.get_executor(), std::chrono::hours(1), [&] { return !routed(); });
        }
        s.resumed_ns.store(now_ns());
        s.done.set_value();
      }, asio::detached);
    });
  };
  const auto free = [&](Sample& s) {
    s.free.store(true);
    if (event_driven) fq.notify("m");  // the registry's capacity event for the worker's model
  };
  Times t = rig.collect(n, rng, start, free);
  fq.stop_all();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int samples = 1000, rounds = 3, others = 64;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) samples = 200, rounds = 1;
    else if (!std::strcmp(argv[i], "--samples") && i + 1 < argc) samples = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--others") && i + 1 < argc) others = std::atoi(argv[++i]);
  }
  std::mt19937_64 rng(7);
  // Per placement, per-round percentiles: [0] event-driven admit, [1] event-driven
  // resume, [2] poll, [3] post floor.
  enum Row { EvAdmit, EvResume, Poll, Floor, kRows };
  const char* const kRow[] = {"event-driven", "  resumed", "poll-5ms", "post-floor"};
  std::vector<double> p50[3][kRows], p99[3][kRows];
  const auto record = [&](int r, int place, Row row, const std::vector<double>& lat) {
    p50[place][row].push_back(percentile(lat, 0.5));
    p99[place][row].push_back(percentile(lat, 0.99));
    std::printf("round %d %-15s %-12s p50 %9.1f us  p99 %9.1f us  (%d samples)\n", r + 1, kPlace[place], kRow[row],
                percentile(lat, 0.5), percentile(lat, 0.99), samples);
  };
  for (int r = 0; r < rounds; ++r)
    for (int place = 0; place < 3; ++place) {
      const Place p = static_cast<Place>(place);
      if (p != Place::Handover) record(r, place, Floor, run_floor(p, samples, rng).admit);
      // The poll does not depend on who frees the slot: run for the two floors' placements.
      for (int k = 0; k < 2; ++k) {
        const bool ev = (r + k) % 2 == 0;  // alternate which design runs first
        if (!ev && p == Place::Handover) continue;
        const Times t = run(ev, p, samples, others, rng);
        if (ev) {
          record(r, place, EvAdmit, t.admit);
          record(r, place, EvResume, t.resume);
        } else {
          record(r, place, Poll, t.admit);
        }
      }
    }
  auto median = [](std::vector<double> v) { return v.empty() ? 0.0 : percentile(std::move(v), 0.5); };
  std::printf("admission latency, slot freed -> queued request re-routed (median of %d rounds, %d waiters of "
              "other models queued; target p99 <= 50 us):\n", rounds, others);
  const int kOther = 0, kHand = 1, kSame = 2;
  for (int place = 0; place < 3; ++place) {
    // The floor a placement's admission pays: the handed-over trial runs on
    // the freeing thread (the same-thread floor); its resume crosses threads.
    const int floor_of = place == kHand ? kSame : place;
    const int resume_floor = place == kSame ? kSame : kOther;
    std::printf("  %s: event-driven admission p50 %.1f us p99 %.1f us (floor p99 %.1f us, ratio %.2fx); "
                "the waiter resumed p50 %.1f us p99 %.1f us (floor p99 %.1f us, ratio %.2fx)\n",
                kPlace[place], median(p50[place][EvAdmit]), median(p99[place][EvAdmit]),
                median(p99[floor_of][Floor]), median(p99[place][EvAdmit]) / median(p99[floor_of][Floor]),
                median(p50[place][EvResume]), median(p99[place][EvResume]), median(p99[resume_floor][Floor]),
                median(p99[place][EvResume]) / median(p99[resume_floor][Floor]));
  }
  for (int place : {kOther, kSame})
    std::printf("  %s: poll every 5 ms (previous) p50 %.1f us p99 %.1f us; ratio poll / event-driven p99 %.0fx\n",
                kPlace[place], median(p50[place][Poll]), median(p99[place][Poll]),
                median(p99[place][Poll]) / median(p99[place][EvAdmit]));
  std::printf("  handover / no handover (a slot freed on another io thread), admission p99: %.2fx\n",
              median(p99[kHand][EvAdmit]) / median(p99[kOther][EvAdmit]));
  std::string json = "{\"bench\":\"admission\",\"samples\":" + std::to_string(samples) +
                     ",\"rounds\":" + std::to_string(rounds) + ",\"others\":" + std::to_string(others);
  const char* const key[] = {"cross_thread", "handover", "same_thread"};
  for (int place = 0; place < 3; ++place) {
    char buf[256];
    std::snprintf(buf, sizeof buf, ",\"%s_event_p99_us\":%.2f,\"%s_resume_p99_us\":%.2f", key[place],
                  median(p99[place][EvAdmit]), key[place], median(p99[place][EvResume]));
    json += buf;
    if (place != kHand) {
      std::snprintf(buf, sizeof buf, ",\"%s_poll_p99_us\":%.2f,\"%s_post_floor_p99_us\":%.2f", key[place],
                    median(p99[place][Poll]), key[place], median(p99[place][Floor]));
      json += buf;
    }
  }
  std::printf("%s}\n", json.c_str());
  return 0;
}
