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
}
