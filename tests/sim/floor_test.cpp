// sim/floor.h: the causal engine floor on a tiny hand-computed case.
#include "sim/floor.h"

#include <doctest/doctest.h>

using namespace kvroute::sim;

namespace {

SimRequest req(double t, std::vector<uint64_t> ids) {
  SimRequest r;
  r.t_ms = t;
  r.input_tokens = static_cast<uint32_t>(ids.size() * kBlock);
  r.ids = std::move(ids);
  return r;
}

// Linear prefill, 0.1 ms per token, no constant (no decode step is added): a 3-block
// (1536-token) prompt takes 153.6 ms, its last block alone 51.2 ms.
kvroute::mocker::EngineConfig linear() {
  kvroute::mocker::EngineConfig ec;
  ec.profile = *kvroute::mocker::find_profile("dynamo-mocker");
  ec.profile.prefill_a = 0;
  ec.profile.prefill_b = 0.1;
  ec.profile.prefill_c = 0;
  return ec;
}

}  // namespace

TEST_CASE("causal floor: a shared document exists only once its first reader has computed it") {
  // A computes document [1,2] + its question 3, done at 153.6. B (t=10) would
  // wait 143.6 for it + 51.2: computing everything itself (153.6) is better.
  // D (t=150) waits 3.6 + 51.2 = 54.8. C (t=200) finds it: 51.2.
  const std::vector<SimRequest> w = {req(0, {1, 2, 3}), req(10, {1, 2, 4}), req(150, {1, 2, 5}), req(200, {1, 2, 6})};
  const auto ec = linear();
  const auto f = causal_floor(w, 1.0, ec);
  REQUIRE(f.ttft_ms.size() == 4);
  CHECK(f.ttft_ms[0] == doctest::Approx(153.6));
  CHECK(f.ttft_ms[1] == doctest::Approx(153.6));
  CHECK(f.ttft_ms[2] == doctest::Approx(3.6 + 51.2));
  CHECK(f.ttft_ms[3] == doctest::Approx(51.2));
  CHECK(f.waited == 1);
  CHECK(f.hit_rate == doctest::Approx(4.0 / 12));  // D and C take 2 blocks each

  // The old floor gives every later reader the document at once.
  const auto a = acausal_floor(w, ec);
  CHECK(a.ttft_ms[1] == doctest::Approx(51.2));
  CHECK(a.ttft_ms[2] == doctest::Approx(51.2));
  CHECK(a.hit_rate == doctest::Approx(6.0 / 12));

  // At rate x2 arrivals halve: D arrives at 75 and waits 78.6 + 51.2 = 129.8.
  const auto f2 = causal_floor(w, 2.0, ec);
  CHECK(f2.ttft_ms[2] == doctest::Approx(78.6 + 51.2));
  // C arrives at 100 and waits 53.6 + 51.2 = 104.8.
  CHECK(f2.ttft_ms[3] == doctest::Approx(53.6 + 51.2));
}

TEST_CASE("causal floor: a block comes from whichever computing request finishes first") {
  // A (t=0) computes [1..10] (512 ms of prefill); B (t=1) computes [1] itself
  // (51.2 ms, done at 52.2) since waiting for A is longer. C (t=60) then finds
  // block 1 from B, not from A.
  std::vector<uint64_t> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<SimRequest> w = {req(0, ten), req(1, {1}), req(60, {1, 7})};
  const auto f = causal_floor(w, 1.0, linear());
  CHECK(f.ttft_ms[0] == doctest::Approx(512));
  CHECK(f.ttft_ms[1] == doctest::Approx(51.2));
  CHECK(f.ttft_ms[2] == doctest::Approx(51.2));
  CHECK(f.waited == 0);
}

TEST_CASE("causal floor: prompts longer than the step budget are chunked; blocks exist from their chunk's end") {
  // Budget 1024 tokens, 0.1 ms a token + 1 ms a step: A's 1536 tokens take a
  // 1024-token chunk (103.4 ms, blocks 1 and 2 done) and a 512-token one (52.2 ms).
  auto ec = linear();
  ec.profile.prefill_c = 1;
  ec.max_batched_tokens = 1024;
  const std::vector<SimRequest> w = {req(0, {1, 2, 3}), req(10, {1, 2, 4})};
  const auto f = causal_floor(w, 1.0, ec);
  CHECK(f.ttft_ms[0] == doctest::Approx(103.4 + 52.2));
  // B waits for A's first chunk (until 103.4), then computes its last block: 93.4 + 52.2 = 145.6,
  // better than computing its own 1536 tokens (155.6). With blocks only at the end of A's whole
  // prefill (155.6) it would have computed everything itself.
  CHECK(f.ttft_ms[1] == doctest::Approx(93.4 + 52.2));
  CHECK(f.waited == 1);
}

TEST_CASE("decode interference: Little's law on the fastest decode, spread over the workers") {
  // Two requests 1 s apart generating 11 tokens each: 10 decode steps of batch 1
  // at 1 ms each (decode_base 1, no KV term) = 20 ms decoding over a 1,000 ms span:
  // 0.02 decoding requests at a time, 0.01 per engine on 2 workers.
  auto ec = linear();
  ec.profile.decode_base_ms = 1;
  ec.profile.decode_kv_ms = 0;
  auto a = req(0, {1}), b = req(1000, {2});
  a.output_tokens = b.output_tokens = 11;
  const auto d = decode_interference({a, b}, 1.0, ec, 2);
  CHECK(d.decodes_per_engine == doctest::Approx(0.01));
  CHECK(d.mean_context == doctest::Approx(512 + 5.5));
  // The polynomial adds decode_base to a step with any decode: 0.01 of 1 ms on average.
  CHECK(d.added_ms_512 == doctest::Approx(0.01));
  // At rate x2 the span halves: twice the decodes per engine.
  CHECK(decode_interference({a, b}, 2.0, ec, 2).decodes_per_engine == doctest::Approx(0.02));
}
