// sim/simulate.h: the engines' configuration from a profile, and the
// inter-token latency a run reports.
#include "sim/simulate.h"

#include <doctest/doctest.h>

using namespace kvroute::sim;

TEST_CASE("engine_config: the profile's step times and KV capacity unless --kv-blocks is given") {
  SimOptions o;
  o.engine_profile = "h100-llama3-8b";
  CHECK(engine_config(o).kv_blocks == 875);  // 448,308 tokens / 512
  CHECK(engine_config(o).profile.name == "h100-llama3-8b");
  o.kv_blocks = 2000;
  CHECK(engine_config(o).kv_blocks == 2000);
  o.kv_blocks = 0;
  o.engine_profile = "dynamo-mocker";  // no capacity of its own
  CHECK(engine_config(o).kv_blocks == kDefaultKvBlocks);
}

TEST_CASE("inter-token latency: a request alone decodes one token per decode step") {
  // One 1024-token request generating 5 tokens on one idle engine: its first
  // token ends its prefill, then each token is one decode step of batch 1
  // reading the context so far.
  SimRequest r;
  r.t_ms = 0;
  r.input_tokens = 1024;
  r.output_tokens = 5;
  r.ids = {1, 2};
  SimOptions o;
  o.workers = 1;
  o.engine_profile = "h100-llama3-8b";
  const auto res = simulate({r}, o, "round_robin");
  const auto& p = engine_config(o).profile;
  CHECK(res.ttft_p50 == doctest::Approx(p.prefill_ms(1024, 0)));
  // Gaps: decode steps at contexts 1025..1028; p50 of the four is the third.
  kvroute::mocker::StepShape s;
  s.add_decode(1027);
  CHECK(res.itl_p50 == doctest::Approx(p.step_ms(s)));
  CHECK(res.itl_p99 > res.itl_p50);
  CHECK(res.itl_p99 < 7.0);  // measured: 6.5 ms at batch 1, context 1024
  // Its record (--requests-out) ends at its last token: the prefill and four decode steps.
  REQUIRE(res.requests.size() == 1);
  double decodes = 0;
  for (uint64_t ctx = 1025; ctx <= 1028; ++ctx) {
    kvroute::mocker::StepShape d;
    d.add_decode(ctx);
    decodes += p.step_ms(d);
  }
  CHECK(res.requests[0].e2e_ms == doctest::Approx(res.requests[0].ttft_ms + decodes));
}

TEST_CASE("a rate multiplier starts sessions faster or slower and keeps their tool pauses") {
  // Two sessions of two turns on one engine holding 30 blocks: A (blocks 1..20)
  // at 0 and again 1 s later, B (blocks 101..120) 100 ms after A. At x1/100 the
  // sessions start 10 s apart; A's second turn still comes 1 s after its first,
  // before B's first evicts A's context, so it finds its 20 blocks cached. (With
  // the pauses compressed too, A's second turn would come at 100 s, after B.)
  auto turn = [](double t, uint64_t session, double offset, uint64_t first, uint32_t blocks) {
    SimRequest r;
    r.t_ms = t;
    r.session = session;
    r.session_offset_ms = offset;
    r.input_tokens = blocks * kBlock + 1;
    r.output_tokens = 2;
    for (uint32_t i = 0; i < blocks; ++i) r.ids.push_back(first + i);
    return r;
  };
  const std::vector<SimRequest> w = {turn(0, 1, 0, 1, 20), turn(100, 2, 0, 101, 20), turn(1000, 1, 1000, 1, 21),
                                     turn(1100, 2, 1000, 101, 21)};
  std::vector<SimRequest> storage;
  const auto& slow = at_rate(w, 0.01, storage);
  REQUIRE(slow.size() == 4);
  CHECK(slow[0].t_ms / 0.01 == doctest::Approx(0));
  CHECK(slow[1].t_ms / 0.01 == doctest::Approx(1000));   // A's second turn: 1 s after its first
  CHECK(slow[2].t_ms / 0.01 == doctest::Approx(10000));  // B starts 100 x 100 ms later
  CHECK(slow[3].t_ms / 0.01 == doctest::Approx(11000));
  const std::vector<SimRequest> starts(w.begin(), w.begin() + 2);  // no offsets: nothing moves, nothing copied
  std::vector<SimRequest> none;
  CHECK(&at_rate(starts, 0.01, none) == &starts);
  SimOptions o;
  o.workers = 1;
  o.kv_blocks = 30;
  o.rate = 0.01;
  const auto res = simulate(w, o, "round_robin");
  // Cached: A's second turn 20 of its 21 blocks, B's 20 of 21 (B evicted A,
  // not its own): 40 of 82 prompt blocks.
  CHECK(res.hit_rate == doctest::Approx(40.0 / 82.0));
}

TEST_CASE("the share of decisions that read the KV load as uneven (alpha_imbalanced applies)") {
  // Two idle engines; A (20 blocks, long output) at 0, B (20 other blocks) 1 ms
  // later, while A still runs. A's decision sees equal loads (0 and 0: even);
  // B's sees A's worker holding A's blocks and the other empty: std = mean,
  // over balance_threshold 0.1 x mean, uneven.
  auto req = [](double t, uint64_t first) {
    SimRequest r;
    r.t_ms = t;
    r.input_tokens = 20 * kBlock;
    r.output_tokens = 200;
    for (uint64_t i = 0; i < 20; ++i) r.ids.push_back(first + i);
    return r;
  };
  const std::vector<SimRequest> w = {req(0, 1), req(1, 101)};
  SimOptions o;
  o.workers = 2;
  auto res = simulate(w, o, "kvroute");
  CHECK(res.decisions == 2);
  CHECK(res.uneven_decisions == 1);
  // std / mean is 1 for two workers, one of them empty: under a threshold of 2, even.
  o.sets = {{"scheduler.balance_threshold", "2"}};
  res = simulate(w, o, "kvroute");
  CHECK(res.decisions == 2);
  CHECK(res.uneven_decisions == 0);
  // Round robin never asks the scheduler.
  res = simulate(w, o, "round_robin");
  CHECK(res.decisions == 0);
}

TEST_CASE("the router's wait queue: a request finding every worker busy waits for a slot, times out or is refused") {
  // One engine with one request slot. A (20 blocks, 200 tokens out) arrives
  // at 0 and takes the slot; B (other blocks) 1 ms later finds the worker
  // busy (the router counts A in flight), C 1 ms after B.
  auto req = [](double t, uint64_t first, uint32_t out) {
    SimRequest r;
    r.t_ms = t;
    r.input_tokens = 20 * kBlock;
    r.output_tokens = out;
    for (uint64_t i = 0; i < 20; ++i) r.ids.push_back(first + i);
    return r;
  };
  const std::vector<SimRequest> two = {req(0, 1, 200), req(1, 101, 2)};
  SimOptions o;
  o.workers = 1;
  o.max_seqs = 1;
  auto run = [&](const std::vector<SimRequest>& w, std::vector<std::pair<std::string, std::string>> sets) {
    o.sets = std::move(sets);
    return simulate(w, o, "kvroute");
  };
  // No queue, the engine queues B: the reference, B starting as A ends.
  const auto engine = run(two, {});
  REQUIRE(engine.completed == 2);
  const double a_end = engine.requests[0].ttft_ms + 199 * 6.0;  // A's decode steps: over 6 ms each
  CHECK(engine.requests[1].ttft_ms > a_end);
  // No queue and reject_when_busy: B is refused at once.
  auto res = run(two, {{"scheduler.reject_when_busy", "true"}});
  CHECK(res.completed == 1);
  CHECK(res.rejected == 1);
  // A queue: B waits at the router until A's slot is free, then runs there.
  res = run(two, {{"scheduler.reject_when_busy", "true"}, {"scheduler.queue_size", "1"},
                  {"scheduler.queue_timeout_ms", "60000"}});
  CHECK(res.completed == 2);
  CHECK(res.rejected == 0);
  REQUIRE(res.requests.size() == 2);
  CHECK(res.requests[1].arrival_ms == doctest::Approx(1));
  // After A's slot frees (seen within one load report, 100 ms), its own prefill.
  CHECK(res.requests[1].ttft_ms >= engine.requests[1].ttft_ms);
  CHECK(res.requests[1].ttft_ms <= engine.requests[1].ttft_ms + o.report_ms + 1);
  // Its deadline passes first: refused (reject_when_busy), or sent to the
  // busy worker whose engine queues it, as without a queue.
  res = run(two, {{"scheduler.reject_when_busy", "true"}, {"scheduler.queue_size", "1"},
                  {"scheduler.queue_timeout_ms", "5"}});
  CHECK(res.completed == 1);
  CHECK(res.rejected == 1);
  res = run(two, {{"scheduler.queue_size", "1"}, {"scheduler.queue_timeout_ms", "5"}});
  CHECK(res.completed == 2);
  CHECK(res.rejected == 0);
  CHECK(res.requests[1].ttft_ms == doctest::Approx(engine.requests[1].ttft_ms));
  // The queue holds one: C, arriving while B waits, is refused.
  const std::vector<SimRequest> three = {req(0, 1, 200), req(1, 101, 2), req(2, 201, 2)};
  res = run(three, {{"scheduler.queue_size", "1"}, {"scheduler.queue_timeout_ms", "60000"}});
  CHECK(res.completed == 2);
  CHECK(res.rejected == 1);
  CHECK(res.requests[1].index == 1);
}
