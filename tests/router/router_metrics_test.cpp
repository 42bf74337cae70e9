// RouterMetrics' remembered per-request series: the same children as a lookup
// by labels, and a removed worker's series looked up again.
#include <doctest/doctest.h>

#include <thread>

#include "router/router_metrics.h"

using namespace kvroute;

TEST_CASE("request() counts into the child of its labels, whatever the order of calls") {
  metrics::Registry registry;
  RouterMetrics m(registry);
  m.request("completions", 200, "a").inc();
  m.request("completions", 200, "a").inc();
  m.request("completions", 200, "b").inc();
  m.request("completions", 503, "a").inc();
  m.request("chat_completions", 200, "a").inc();
  m.request("completions", 200, "a").inc();
  CHECK(m.requests_total.with({"completions", "200", "a"}).value() == 3);
  CHECK(m.requests_total.with({"completions", "200", "b"}).value() == 1);
  CHECK(m.requests_total.with({"completions", "503", "a"}).value() == 1);
  CHECK(m.requests_total.with({"chat_completions", "200", "a"}).value() == 1);
}

TEST_CASE("worker_tokens() follows the worker and a removal of its series") {
  metrics::Registry registry;
  RouterMetrics m(registry);
  m.worker_tokens(7).prompt.inc(100);
  m.worker_tokens(7).cached.inc(40);
  m.worker_tokens(23).prompt.inc(5);  // 23 % 16 == 7: the same memo slot as worker 7
  m.worker_tokens(7).prompt.inc(1);
  CHECK(m.worker_prompt_tokens_total.with({"7"}).value() == 101);
  CHECK(m.worker_cached_tokens_total.with({"7"}).value() == 40);
  CHECK(m.worker_prompt_tokens_total.with({"23"}).value() == 5);

  // The worker left: its series are removed, and a later request to a worker
  // with the same id starts new ones (not the retired children).
  m.worker_prompt_tokens_total.remove({"7"});
  m.worker_cached_tokens_total.remove({"7"});
  m.worker_tokens(7).prompt.inc(2);
  CHECK(m.worker_prompt_tokens_total.with({"7"}).value() == 2);
  CHECK(m.worker_cached_tokens_total.with({"7"}).value() == 0);
}

TEST_CASE("a second RouterMetrics never gets the first one's children") {
  for (int i = 0; i < 2; ++i) {
    metrics::Registry registry;
    RouterMetrics m(registry);
    m.request("completions", 200, "a").inc();
    m.worker_tokens(1).prompt.inc(3);
    CHECK(m.requests_total.with({"completions", "200", "a"}).value() == 1);
    CHECK(m.worker_prompt_tokens_total.with({"1"}).value() == 3);
  }
}

TEST_CASE("each thread remembers its own series; counts from all threads add up") {
  metrics::Registry registry;
  RouterMetrics m(registry);
  std::thread a([&] { for (int i = 0; i < 1000; ++i) m.worker_tokens(1 + i % 3).prompt.inc(); });
  std::thread b([&] { for (int i = 0; i < 1000; ++i) m.request("completions", 200, i % 2 ? "x" : "y").inc(); });
  a.join();
  b.join();
  CHECK(m.worker_prompt_tokens_total.with({"1"}).value() == 334);
  CHECK(m.worker_prompt_tokens_total.with({"2"}).value() == 333);
  CHECK(m.requests_total.with({"completions", "200", "x"}).value() == 500);
}
