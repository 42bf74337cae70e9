// common/metrics: counters and histograms add up across threads, and the
// exposition stays consistent (cumulative buckets, +Inf bucket = count).
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics.h"

using namespace kvroute::metrics;

TEST_CASE("counters and histograms updated from many threads sum exactly") {
  Registry r;
  auto& c = r.counter("t_requests_total", "requests", {"route"});
  auto& h = r.histogram("t_seconds", "durations", {0.5, 1.0, 2.0});
  constexpr int kThreads = 12;
  constexpr int kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        c.with({"a"}).inc();
        c.with({t % 2 ? "b" : "c"}).inc(2);
        h.get().observe(i % 4 == 0 ? 0.25 : i % 4 == 1 ? 0.75 : i % 4 == 2 ? 1.5 : 3.0);
      }
    });
  for (auto& th : threads) th.join();
  CHECK(c.with({"a"}).value() == uint64_t{kThreads} * kEach);
  CHECK(c.with({"b"}).value() == uint64_t{kThreads / 2} * kEach * 2);
  CHECK(c.with({"c"}).value() == uint64_t{kThreads / 2} * kEach * 2);
  const Histogram& hist = h.get();
  for (size_t b = 0; b < 4; ++b) CHECK(hist.bucket(b) == uint64_t{kThreads} * kEach / 4);
  CHECK(hist.count() == uint64_t{kThreads} * kEach);
  CHECK(hist.sum() == doctest::Approx((0.25 + 0.75 + 1.5 + 3.0) * kThreads * kEach / 4));

  const std::string text = r.render();
  const uint64_t n = uint64_t{kThreads} * kEach;
  CHECK(text.find("t_seconds_bucket{le=\"0.5\"} " + std::to_string(n / 4) + "\n") != std::string::npos);
  CHECK(text.find("t_seconds_bucket{le=\"2\"} " + std::to_string(3 * n / 4) + "\n") != std::string::npos);
  CHECK(text.find("t_seconds_bucket{le=\"+Inf\"} " + std::to_string(n) + "\n") != std::string::npos);
  CHECK(text.find("t_seconds_count " + std::to_string(n) + "\n") != std::string::npos);
  CHECK(text.find("t_requests_total{route=\"a\"} " + std::to_string(n) + "\n") != std::string::npos);
}

TEST_CASE("an unlabelled family's child is the one get() returns") {
  Registry r;
  auto& c = r.counter("t_plain_total", "plain");
  c.get().inc(3);
  c.with({}).inc(4);
  CHECK(c.get().value() == 7);
  CHECK(r.render().find("t_plain_total 7\n") != std::string::npos);
}

TEST_CASE("a removed child is gone from the exposition and a new one starts from zero") {
  for (int round = 0; round < 3; ++round) {  // families of earlier registries may reuse addresses
    Registry r;
    auto& c = r.counter("t_worker_total", "per worker", {"worker"});
    CHECK(c.with({"1"}).value() == 0);
    c.with({"1"}).inc(5);
    c.with({"2"}).inc(1);
    CHECK(c.with({"1"}).value() == 5);
    c.remove({"1"});
    CHECK(r.render().find("t_worker_total{worker=\"1\"}") == std::string::npos);
    CHECK(c.with({"1"}).value() == 0);
    CHECK(c.with({"2"}).value() == 1);
  }
}

TEST_CASE("families of different kinds never share cached children") {
  // Many families of each kind with the same label values: ids or hashes
  // shared across kinds would hand one kind's child to another.
  Registry r;
  std::vector<CounterFamily*> cs;
  std::vector<GaugeFamily*> gs;
  std::vector<HistogramFamily*> hs;
  for (int i = 0; i < 20; ++i) {
    cs.push_back(&r.counter("t_c" + std::to_string(i) + "_total", "c", {"k"}));
    gs.push_back(&r.gauge("t_g" + std::to_string(i), "g", {"k"}));
    hs.push_back(&r.histogram("t_h" + std::to_string(i) + "_seconds", "h", {1.0}, {"k"}));
  }
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 20; ++i) {
      cs[i]->with({"x"}).inc(i + 1);
      gs[i]->with({"x"}).set(i);
      hs[i]->with({"x"}).observe(0.5);
    }
  for (int i = 0; i < 20; ++i) {
    CHECK(cs[i]->with({"x"}).value() == uint64_t(3 * (i + 1)));
    CHECK(gs[i]->with({"x"}).value() == i);
    CHECK(hs[i]->with({"x"}).count() == 3);
  }
}

TEST_CASE("a collected metric is read at every render, with its labels, exact integers and escaped values") {
  Registry r;
  std::atomic<uint64_t> messages{0};
  std::vector<std::pair<std::string, double>> workers{{"1", 0.5}};
  r.counter_fn("t_messages_total", "messages", [&] { return messages.load(); });
  r.collect(Type::Gauge, "t_usage_ratio", "usage by worker", {"worker", "source"}, [&](Samples& s) {
    for (const auto& [w, v] : workers) s.add({w, "reported"}, v);
  });
  r.gauge_fn("t_connected", "flag", [] { return true; });

  messages = (uint64_t{1} << 60) + 1;  // beyond a double's exact integers
  std::string text = r.render();
  CHECK(text.find("# HELP t_messages_total messages\n# TYPE t_messages_total counter\n"
                  "t_messages_total 1152921504606846977\n") != std::string::npos);
  CHECK(text.find("# TYPE t_usage_ratio gauge\nt_usage_ratio{worker=\"1\",source=\"reported\"} 0.5\n") !=
        std::string::npos);
  CHECK(text.find("t_connected 1\n") != std::string::npos);

  // Read again at the next render: a worker that left has no series, a new
  // one has; label values are escaped as a family's are.
  messages = 7;
  workers = {{"a\"b\\", 2}};
  text = r.render();
  CHECK(text.find("t_messages_total 7\n") != std::string::npos);
  CHECK(text.find("worker=\"1\"") == std::string::npos);
  CHECK(text.find("t_usage_ratio{worker=\"a\\\"b\\\\\",source=\"reported\"} 2\n") != std::string::npos);

  // No samples: the HELP and TYPE lines only.
  workers.clear();
  text = r.render();
  CHECK(text.find("# TYPE t_usage_ratio gauge\n# HELP t_connected") != std::string::npos);
}
