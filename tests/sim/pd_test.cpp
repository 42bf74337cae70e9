// sim/pd_fleet.h and sim/pd_policies.h: the transfer time, a disaggregated
// request's TTFT on an idle 1P+1D fleet (prefill + transfer + first decode
// step, computed by hand from the profile), decode-side hits shrinking the
// transfer, and the PD policies' decisions at their thresholds.
#include "sim/pd_fleet.h"

#include <doctest/doctest.h>

#include <random>

#include "mocker/engine.h"

using namespace kvroute;
using namespace kvroute::sim;

namespace {

SimRequest req(double t, uint32_t tokens, uint32_t out, std::vector<uint64_t> ids) {
  SimRequest r;
  r.t_ms = t;
  r.input_tokens = tokens;
  r.output_tokens = out;
  r.ids = std::move(ids);
  return r;
}

PdOptions one_one() {
  PdOptions o;
  o.sim.engine_profile = "h100-llama3-8b";
  o.prefill = o.decode = 1;
  o.link_gbps = 400;
  return o;
}

}  // namespace

TEST_CASE("transfer_ms: tokens x KV bytes per token over the link") {
  // 8,192 tokens x 131,072 bytes = 1 GiB = 8,589,934,592 bits; at 400 Gbit/s: 21.47 ms.
  CHECK(transfer_ms(8192, 131072, 400) == doctest::Approx(21.474836));
  CHECK(transfer_ms(512, 131072, 100) == doctest::Approx(5.368709));  // 536,870,912 bits / 1e11
  CHECK(transfer_ms(0, 131072, 400) == 0);
  CHECK(kv_bytes_per_token(one_one()) == 131072);  // the profile's: Llama-3-8B, 32 x 8 x 128 x 2 x 2 bytes
}

TEST_CASE("an engine given transferred KV computes only the last prompt token, then decodes") {
  mocker::EngineConfig ec;
  ec.block_size = 512;
  ec.kv_blocks = 100;
  size_t stored = 0;
  mocker::Engine e(ec, [&](const KvEvent& ev) {
    if (auto* s = std::get_if<KvStored>(&ev.data)) stored += s->blocks.size();
  });
  const std::vector<LocalBlockHash> blocks = {LocalBlockHash{11}, LocalBlockHash{12}};
  REQUIRE(e.add_request_hashed(7, 1100, blocks, 2, 0.0, true));
  CHECK(stored == 2);  // both complete prompt blocks are cached at admission
  const auto out = e.advance_to(1e9);
  REQUIRE(out.size() == 3);
  CHECK(out[0].kind == mocker::EngineOutput::Kind::FirstToken);
  CHECK(out[0].time_ms == doctest::Approx(ec.profile.prefill_ms(1, 1099)));
  CHECK(out[0].cached_tokens == 0);  // local hits only: nothing was cached here before
}

TEST_CASE("PD fleet: a disaggregated request's TTFT is its prefill + the transfer + one step on the decode engine") {
  const auto o = one_one();
  const auto& p = *mocker::find_profile("h100-llama3-8b");
  // llm-d disaggregates 1,024 uncached tokens (>= 16).
  const auto res = simulate_pd({req(0, 1024, 4, {1, 2})}, o, "llmd_pd");
  REQUIRE(res.completed == 1);
  CHECK(res.disaggregated == 1);
  const double want = p.prefill_ms(1024, 0) + transfer_ms(1024, 131072, 400) + p.prefill_ms(1, 1023);
  CHECK(res.ttft_p50 == doctest::Approx(want));
  CHECK(res.transfer_ms_mean == doctest::Approx(transfer_ms(1024, 131072, 400)));
  // Then three decode steps of batch 1 on the decode engine (contexts 1025-1027; the p50 is the middle one).
  mocker::StepShape s;
  s.add_decode(1026);
  CHECK(res.itl_p50 == doctest::Approx(p.step_ms(s)));
}

TEST_CASE("PD fleet: blocks the decode engine holds are not transferred") {
  const auto o = one_one();
  const auto& p = *mocker::find_profile("h100-llama3-8b");
  // The second request shares the first's two leading blocks; it comes after
  // the first has finished, so both engines hold them: the prefill engine
  // computes 512 new tokens after 1,024 cached and only those 512 move.
  const std::vector<SimRequest> w = {req(0, 1536, 2, {1, 2, 3}), req(10000, 1536, 2, {1, 2, 4})};
  const auto res = simulate_pd(w, o, "llmd_pd");
  REQUIRE(res.completed == 2);
  CHECK(res.disaggregated == 2);
  CHECK(res.transferred_share == doctest::Approx((1536.0 + 512.0) / 3072.0));
  const double first = p.prefill_ms(1536, 0) + transfer_ms(1536, 131072, 400) + p.prefill_ms(1, 1535);
  const double second = p.prefill_ms(512, 1024) + transfer_ms(512, 131072, 400) + p.prefill_ms(1, 1535);
  REQUIRE(res.ttft_ms.size() == 2);
  CHECK(res.ttft_ms[0] == doctest::Approx(first));
  CHECK(res.ttft_ms[1] == doctest::Approx(second));
}

TEST_CASE("PD fleet: Dynamo's conditional disaggregation runs a mostly cached request aggregated on the decode engine") {
  const auto o = one_one();
  const auto& p = *mocker::find_profile("h100-llama3-8b");
  // First: 1,536 uncached tokens (ratio 1.0): disaggregated. Second: the
  // decode engine holds 1,024 of its tokens (eff_isl 512 < 2048, ratio 0.33 <
  // 0.7): aggregated there, computing 512 tokens after 1,024 cached.
  const std::vector<SimRequest> w = {req(0, 1536, 2, {1, 2, 3}), req(10000, 1536, 2, {1, 2, 4})};
  const auto res = simulate_pd(w, o, "dynamo_pd");
  REQUIRE(res.completed == 2);
  CHECK(res.disaggregated == 1);
  REQUIRE(res.ttft_ms.size() == 2);
  CHECK(res.ttft_ms[1] == doctest::Approx(p.prefill_ms(512, 1024)));
}

TEST_CASE("pd_dynamo: the isl_bounding bypass at its thresholds, and the prefill logit") {
  std::mt19937_64 rng(1);
  PdInput in;
  in.block_size = 512;
  in.prefill.resize(2);
  in.decode.resize(1);
  // eff_isl = 2559 - 1*512 = 2047 < 2048 but ratio 0.80 >= 0.7: disaggregated.
  in.prompt_tokens = 2559;
  in.decode[0].overlap_blocks = 1;
  CHECK(pd_dynamo(in, rng).disaggregate);
  // eff_isl = 4607 - 5*512 = 2047 < 2048 and ratio 0.444 < 0.7: bypass.
  in.prompt_tokens = 4607;
  in.decode[0].overlap_blocks = 5;
  CHECK_FALSE(pd_dynamo(in, rng).disaggregate);
  // eff_isl = 4608 - 5*512 = 2048: not below the threshold: disaggregated.
  in.prompt_tokens = 4608;
  CHECK(pd_dynamo(in, rng).disaggregate);
  // Prefill logit: (in-flight prefill tokens + 4608)/512 - overlap.
  // Engine 0: (0 + 4608)/512 - 0 = 9; engine 1: (2048 + 4608)/512 - 6 = 7: engine 1.
  in.prefill[1].inflight_prefill_tokens = 2048;
  in.prefill[1].overlap_blocks = 6;
  CHECK(pd_dynamo(in, rng).prefill == 1);
  // Engine 1 with 3,072 in flight: (3072 + 4608)/512 - 6 = 9 = engine 0's: a tie, either is picked.
  in.prefill[1].inflight_prefill_tokens = 3072;
  bool saw0 = false, saw1 = false;
  for (int i = 0; i < 64; ++i) (pd_dynamo(in, rng).prefill == 0 ? saw0 : saw1) = true;
  CHECK((saw0 && saw1));
}

TEST_CASE("pd_llmd: the prefix-based decider's non-cached-tokens threshold on the chosen decode endpoint") {
  std::mt19937_64 rng(1);
  PdInput in;
  in.block_size = 512;
  in.prefill.resize(1);
  in.decode.resize(1);
  in.request_blocks = 2;
  in.prompt_tokens = 15;  // below 16: decode only
  CHECK_FALSE(pd_llmd(in, rng, 16).disaggregate);
  in.prompt_tokens = 16;
  CHECK(pd_llmd(in, rng, 16).disaggregate);
  in.decode[0].overlap_blocks = 2;  // 1,024 cached there
  in.prompt_tokens = 1040;          // 16 uncached: disaggregated
  CHECK(pd_llmd(in, rng, 16).disaggregate);
  in.prompt_tokens = 1039;  // 15 uncached: decode only
  CHECK_FALSE(pd_llmd(in, rng, 16).disaggregate);
  in.prompt_tokens = 100000;
  CHECK_FALSE(pd_llmd(in, rng, 0).disaggregate);  // the code's default 0 disables it
}

TEST_CASE("pd_llmd: prefix-cache-scorer 2 + queue-scorer 1 picks the endpoint") {
  std::mt19937_64 rng(1);
  PdInput in;
  in.block_size = 512;
  in.prompt_tokens = 4096;
  in.request_blocks = 8;
  in.decode.resize(2);
  in.prefill.resize(2);
  // Scores (queues 0..5): decode 0: 2 x 4/8 + 1 x (5-5)/5 = 1.0; decode 1: 0 + (5-1)/5 = 0.8;
  // decode 2: 0 + (5-0)/5 = 1.0. Decodes 0 and 2 tie; decode 1 is never picked.
  in.decode[0].overlap_blocks = 4;
  in.decode[0].scraped.num_requests_waiting = 5;
  in.decode[1].scraped.num_requests_waiting = 1;
  in.decode.push_back({});
  in.decode[2].scraped.num_requests_waiting = 0;  // queue 1.0, prefix 0: 1.0 = decode 0's: a tie
  bool saw0 = false, saw2 = false, saw1 = false;
  for (int i = 0; i < 64; ++i) {
    const size_t d = pd_llmd(in, rng, 16).decode;
    saw0 |= d == 0, saw1 |= d == 1, saw2 |= d == 2;
  }
  CHECK((saw0 && saw2 && !saw1));
}

TEST_CASE("PD fleet: kvroute_pd is the router's decide_pd, with its pd.* keys") {
  auto o = one_one();
  const auto& p = *mocker::find_profile("h100-llama3-8b");
  // 1,024 uncached tokens >= pd.min_uncached_tokens (512 by default): split,
  // with the same TTFT as any split on an idle fleet.
  auto res = simulate_pd({req(0, 1024, 2, {1, 2})}, o, "kvroute_pd");
  REQUIRE(res.completed == 1);
  CHECK(res.disaggregated == 1);
  CHECK(res.ttft_p50 ==
        doctest::Approx(p.prefill_ms(1024, 0) + transfer_ms(1024, 131072, 400) + p.prefill_ms(1, 1023)));
  // Raised above the prompt: aggregated on the decode engine, which computes it all.
  o.sim.sets = {{"pd.min_uncached_tokens", "2000"}};
  res = simulate_pd({req(0, 1024, 2, {1, 2})}, o, "kvroute_pd");
  REQUIRE(res.completed == 1);
  CHECK(res.disaggregated == 0);
  CHECK(res.ttft_p50 == doctest::Approx(p.prefill_ms(1024, 0)));
  o.sim.sets = {{"pd.policy", "never"}};
  CHECK(simulate_pd({req(0, 100000, 2, {})}, o, "kvroute_pd").disaggregated == 0);
}

TEST_CASE("PD fleet: kvroute_pd sizes a request by its prompt's blocks, as the router does") {
  // The decode gate at 0.003 of 875 blocks: the prompt's 2 blocks (0.0023) leave the idle decode
  // engine under it, so the request runs whole there (pd.min_uncached_tokens above the prompt); its
  // 3 blocks with the output (0.0034), which the router cannot know at dispatch, would veto that.
  auto o = one_one();
  o.sim.sets = {{"pd.min_uncached_tokens", "2000"}, {"pd.decode_busy_kv_usage", "0.003"}};
  const auto res = simulate_pd({req(0, 1024, 512, {1, 2})}, o, "kvroute_pd");
  REQUIRE(res.completed == 1);
  CHECK(res.disaggregated == 0);
  // A prompt of 3 blocks is over the gate: split.
  CHECK(simulate_pd({req(0, 1536, 2, {1, 2, 3})}, o, "kvroute_pd").disaggregated == 1);
}
