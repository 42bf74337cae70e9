// bench/flow: admission latency of a queued request when a slot frees: the
// time from "a worker has room" (the event: a request ended on some io
// thread, a load report) to the queued request's route being retried on its
// own io thread, which is where it is admitted. The event-driven queue
// (router/http/admission_queue.h over router/flow/flow_queue.h: the
// registry's capacity event wakes the model's head waiter, posted to its io
// thread) against the previous design kept here as the reference (a copy of
// its loop: the waiter re-routes every 5 ms), in the same process,
// alternating rounds.
//
// Each sample: one request waits in the queue on io thread A; after a random
// pause (0-10 ms, seed 7) a request "ends" (a handler posted to io thread B,
// as a response finishing on another io thread: it frees the slot the
// waiting request's route reads and raises the registry's capacity event,
// FlowQueue::notify(model)). Two placements: the event on the other io
// thread (B != A: an OS thread wake-up is in the latency) and on the same
// io thread (B == A: router.threads 1, or the freeing request shared the
// waiter's thread). The latency is steady_clock from the slot freeing to the
// route seeing it free. W waiters of other models (default 64) sit in the
// queue throughout, as in an overloaded router. The floor, in the same run:
// one bare asio::post from the freeing thread to the waiter's (no queue, no
// coroutine), the OS wake-up every cross-thread design pays.
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
#include <future>
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

struct Sample {
  std::atomic<bool> free{false};
  std::atomic<int64_t> freed_ns{0};
  std::atomic<int64_t> seen_ns{0};
};

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// The floor under any design that wakes the waiter's io thread: one bare
// asio::post from the freeing thread to the waiter's, the handler timing its
// own start (no queue, no coroutine, no route). Across threads this is the OS
// wake-up of a thread blocked in epoll_wait (Asio's eventfd interrupter) and
// its wait for a core; on the same thread, one trip through the handler queue.
std::vector<double> run_floor(bool same_thread, int n, std::mt19937_64& rng) {
  asio::io_context a(1), b(1);
  auto work_a = asio::make_work_guard(a);
  auto work_b = asio::make_work_guard(b);
  std::thread ta([&] { a.run(); });
  std::thread tb([&] { b.run(); });
  asio::io_context& freer = same_thread ? a : b;
  std::vector<double> lat;
  std::uniform_int_distribution<int> pause_us(0, 10000);
  for (int i = 0; i < n; ++i) {
    Sample s;
    std::promise<void> done;
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us(rng)));
    asio::post(freer, [&] {
      s.freed_ns.store(now_ns());
      asio::post(a, [&] {
        s.seen_ns.store(now_ns());
        done.set_value();
      });
    });
    done.get_future().wait();
    lat.push_back(static_cast<double>(s.seen_ns.load() - s.freed_ns.load()) / 1e3);
  }
  work_a.reset();
  work_b.reset();
  ta.join();
  tb.join();
  return lat;
}

// One round of `n` samples; returns latencies in µs.
std::vector<double> run(bool event_driven, bool same_thread, int n, int others, std::mt19937_64& rng) {
  asio::io_context a(1), b(1);
  auto work_a = asio::make_work_guard(a);
  auto work_b = asio::make_work_guard(b);
  std::thread ta([&] { a.run(); });
  std::thread tb([&] { b.run(); });
  asio::io_context& freer = same_thread ? a : b;
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
  std::vector<double> lat;
  std::uniform_int_distribution<int> pause_us(0, 10000);
  for (int i = 0; i < n; ++i) {
    Sample s;
    std::promise<void> done;
    const std::function<bool()> routed = [&s] {
      if (!s.free.load()) return false;
      s.seen_ns.store(now_ns());
      return true;
    };
    asio::post(a, [&] {
      asio::co_spawn(a, [&]() -> awaitable<void> {
        if (event_driven) {
          co_await q.wait(a.get_executor(), AdmissionQueue::Ticket{"m", 0, 0, 1, 100}, limits, far, routed);
        } else {
          co_await poll_wait(a.get_executor(), std::chrono::hours(1), [&] { return !routed(); });
        }
        done.set_value();
      }, asio::detached);
    });
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us(rng)));
    asio::post(freer, [&] {
      s.freed_ns.store(now_ns());
      s.free.store(true);
      if (event_driven) fq.notify("m");  // the registry's capacity event for the worker's model
    });
    done.get_future().wait();
    lat.push_back(static_cast<double>(s.seen_ns.load() - s.freed_ns.load()) / 1e3);
  }
  fq.stop_all();
  work_a.reset();
  work_b.reset();
  ta.join();
  tb.join();
  return lat;
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
  // [placement][design] -> per-round p50 / p99
  std::vector<double> p50[2][2], p99[2][2], floor50[2], floor99[2];
  const char* placement[2] = {"other io thread", "same io thread"};
  for (int r = 0; r < rounds; ++r)
    for (int same = 0; same < 2; ++same) {
      const auto fl = run_floor(same == 1, samples, rng);
      floor50[same].push_back(percentile(fl, 0.5));
      floor99[same].push_back(percentile(fl, 0.99));
      std::printf("round %d %-15s %-12s p50 %9.1f us  p99 %9.1f us  (%d samples)\n", r + 1, placement[same],
                  "post-floor", percentile(fl, 0.5), percentile(fl, 0.99), samples);
      for (int k = 0; k < 2; ++k) {
        const int ev = (r + k) % 2 == 0 ? 1 : 0;  // alternate which design runs first
        const auto lat = run(ev == 1, same == 1, samples, others, rng);
        p50[same][ev].push_back(percentile(lat, 0.5));
        p99[same][ev].push_back(percentile(lat, 0.99));
        std::printf("round %d %-15s %-12s p50 %9.1f us  p99 %9.1f us  (%d samples)\n", r + 1, placement[same],
                    ev ? "event-driven" : "poll-5ms", percentile(lat, 0.5), percentile(lat, 0.99), samples);
      }
    }
  auto median = [](std::vector<double> v) { return percentile(std::move(v), 0.5); };
  std::printf("admission latency, slot freed -> queued request re-routed (median of %d rounds, %d waiters of "
              "other models queued):\n", rounds, others);
  std::string json = "{\"bench\":\"admission\",\"samples\":" + std::to_string(samples) +
                     ",\"rounds\":" + std::to_string(rounds) + ",\"others\":" + std::to_string(others);
  for (int same = 0; same < 2; ++same) {
    const double e50 = median(p50[same][1]), e99 = median(p99[same][1]);
    const double o50 = median(p50[same][0]), o99 = median(p99[same][0]);
    std::printf("  event on the %s: event-driven p50 %.1f us p99 %.1f us; poll every 5 ms (previous) p50 %.1f us "
                "p99 %.1f us; ratio poll / event-driven p50 %.0fx p99 %.0fx (target p99 <= 50 us)\n",
                placement[same], e50, e99, o50, o99, o50 / e50, o99 / e99);
    const double f50 = median(floor50[same]), f99 = median(floor99[same]);
    std::printf("  event on the %s: a bare post to the waiter's thread (the floor of any wake-up) p50 %.1f us "
                "p99 %.1f us; the queue's own cost above it p50 %.1f us p99 %.1f us\n",
                placement[same], f50, f99, e50 - f50, e99 - f99);
    const std::string k = same ? "same_thread" : "cross_thread";
    char buf[384];
    std::snprintf(buf, sizeof buf,
                  ",\"%s_event_p99_us\":%.2f,\"%s_poll_p99_us\":%.2f,\"%s_p99_ratio\":%.1f,\"%s_post_floor_p99_us\":%.2f",
                  k.c_str(), e99, k.c_str(), o99, k.c_str(), o99 / e99, k.c_str(), f99);
    json += buf;
  }
  std::printf("%s}\n", json.c_str());
  return 0;
}
