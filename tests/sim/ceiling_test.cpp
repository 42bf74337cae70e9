// sim/ceiling.h: the minimal costs on hand-made profiles, against the engine
// itself, the percentile's allowance, the window needs and the KV bound's
// knapsack on hand-computed cases.
#include "sim/ceiling.h"

#include <doctest/doctest.h>

#include "sim/simulate.h"

using namespace kvroute::sim;
using kvroute::mocker::EngineProfile;

namespace {

// A roofline profile with only the named coefficients (knee off: w2 = 0).
EngineProfile roofline(double w0, double w1, double attn_new, double attn_cached, double prefix_read,
                       double decode_read) {
  EngineProfile p;
  p.kind = EngineProfile::Kind::Roofline;
  p.w0 = w0;
  p.w1 = w1;
  p.attn_new = attn_new;
  p.attn_cached = attn_cached;
  p.prefix_read = prefix_read;
  p.decode_read = decode_read;
  return p;
}

RequestWork job(double at, double prefill, double decode = 0) {
  RequestWork q;
  q.arrival_ms = at;
  q.prefill_ms = prefill;
  q.decode_ms = decode;
  return q;
}

SimRequest req(double t, uint32_t blocks, uint32_t output, uint64_t first_id) {
  SimRequest r;
  r.t_ms = t;
  r.input_tokens = blocks * kBlock;
  r.output_tokens = output;
  for (uint32_t i = 0; i < blocks; ++i) r.ids.push_back(first_id + i);
  return r;
}

}  // namespace

TEST_CASE("min_token_ms: the cheapest step per token within the budget") {
  // 10 ms a step + 1 ms a token: (10 + T) / T, lowest at the budget.
  CHECK(min_token_ms(roofline(10, 1, 0, 0, 0, 0), 10) == doctest::Approx(2.0));
  CHECK(min_token_ms(roofline(10, 1, 0, 0, 0, 0), 1) == doctest::Approx(11.0));
  // The fitted profile: past the knee a token costs about w1 + w2, 0.025 ms.
  const auto& h100 = *kvroute::mocker::find_profile("h100-llama3-8b");
  CHECK(min_token_ms(h100, 8192) == doctest::Approx(0.0251).epsilon(0.02));
  CHECK(ceiling_supported(h100, 8192));
  CHECK_FALSE(ceiling_supported(*kvroute::mocker::find_profile("dynamo-mocker"), 8192));
  // Attention across a split dearer than a token: recomputing before new tokens could pay, no bound.
  CHECK_FALSE(ceiling_supported(roofline(10, 1, 0, 1, 0, 0), 10));
}

TEST_CASE("min_prefill_ms and min_decode_ms: hand-computed chunks and decodes") {
  // Budget 4, tokens [2, 8): the remainder (2 after 2) first, then 4 after 4.
  // 6 tokens x 10 + attn_new (2^2/2 + 4^2/2) + attn_cached (2x2 + 4x4) + prefix_read (2 + 4).
  const auto p = roofline(0, 0, 1, 2, 0.5, 0.25);
  CHECK(min_prefill_ms(p, 4, 10, 2, 8) == doctest::Approx(60 + 10 + 40 + 3));
  CHECK(min_prefill_ms(p, 4, 10, 8, 8) == 0);
  // Two decodes after 100 tokens read 101 and 102 tokens.
  CHECK(min_decode_ms(p, 10, 100, 3) == doctest::Approx(20 + 0.25 * 203));
  CHECK(min_decode_ms(p, 10, 100, 1) == 0);
}

TEST_CASE("minimal work: at most what the engine takes for a request alone") {
  // One request alone on an idle engine: its TTFT is its chunked prefill,
  // its decodes batch-1 steps; the minimal costs must not exceed them.
  SimOptions o;
  o.workers = 1;
  const auto ec = engine_config(o);
  const double token_ms = min_token_ms(ec.profile, ec.max_batched_tokens);
  for (uint32_t blocks : {2u, 17u, 60u}) {
    const auto r = req(0, blocks, 40, 1);
    const auto res = simulate({r}, o, "round_robin");
    const double prefill = min_prefill_ms(ec.profile, ec.max_batched_tokens, token_ms, 0, r.input_tokens);
    CHECK(prefill <= res.ttft_p50);
    CHECK(prefill >= 0.5 * res.ttft_p50);  // the bound is not vacuous
    CHECK(min_decode_ms(ec.profile, token_ms, r.input_tokens, r.output_tokens) <= res.e2e_p50 - res.ttft_p50);
  }
}

TEST_CASE("allowed_misses: the values percentile() may leave above the SLO") {
  for (size_t n : {1u, 99u, 100u, 101u, 1000u, 12000u}) {
    const size_t k = allowed_misses(n);
    std::vector<double> v(n, 1.0);
    for (size_t i = 0; i < k; ++i) v[i] = 100;
    CHECK(percentile(v, 0.99) == 1.0);  // k misses: p99 still within
    if (k < n) {
      v[k] = 100;
      CHECK(percentile(v, 0.99) == 100);  // one more: over
    }
  }
  CHECK(allowed_misses(12000) == 119);
}

TEST_CASE("work bound: needs of disjoint windows add up") {
  CeilingOptions o;
  o.workers = 1;
  o.max_seqs = 1;
  o.slo_ttft_ms = 1000;
  // Three 600 ms prefills at t=0 on one worker: 1,800 ms of work in [0, 1000]; dropping
  // the costliest leaves 1,200, two leave 600: need 2. Again at t=5000 (its span does not
  // overlap): 4 in all. The whole run [0, 6000] holds 3,600 ms: no need.
  MinimalWork mw;
  for (double t : {0.0, 0.0, 0.0, 5000.0, 5000.0, 5000.0}) mw.requests.push_back(job(t, 600));
  o.percentile = 0.3;  // 6 - 1 - floor(1.8) = 4 may miss: not ruled out
  CHECK(allowed_misses(6, 0.3) == 4);
  auto b = work_bound(mw, o);
  CHECK(b.need == 4);
  CHECK(b.windows.size() == 2);
  CHECK_FALSE(b.ruled_out());
  o.percentile = 0.5;  // 2 may miss
  CHECK(work_bound(mw, o).ruled_out());
  o.percentile = 0.99;  // none may miss: each window's count stops at 1 over the budget
  CHECK(work_bound(mw, o).need == 2);
  CHECK(work_bound(mw, o).ruled_out());
  // The second burst 800 ms later: the spans overlap, so one window counts: [0, 800] holds
  // 3,600 ms on 1,800, three dropped fit.
  mw.requests[3].arrival_ms = mw.requests[4].arrival_ms = mw.requests[5].arrival_ms = 800;
  o.percentile = 0.3;
  b = work_bound(mw, o);
  CHECK(b.windows.size() == 1);
  CHECK(b.need == 3);
  // Decodes of requests still running at the end are dropped, the dearest first. Three
  // 100 ms prefills with 900 ms of decodes at t=0 (2 of 3 may miss at p30): max_seqs 3
  // drops every decode, 300 ms fit in 1,000; max_seqs 1 drops one, 2,100 ms left, two
  // requests excluded.
  MinimalWork d;
  for (int i = 0; i < 3; ++i) d.requests.push_back(job(0, 100, 900));
  o.max_seqs = 3;
  CHECK(work_bound(d, o).need == 0);
  o.max_seqs = 1;
  CHECK(work_bound(d, o).need == 2);
}

TEST_CASE("step lines: decodes priced by the steps they need") {
  // 10 ms a step + 1 ms a token, budget 10: min_token_ms 2, the chunking condition's least
  // price 0; slopes 0, 0.5, 1 and 1.5 lie under 10 + T at T = 1, 1, any T and T = 10.
  const auto p = roofline(10, 1, 0, 0, 0, 0);
  CHECK(step_line(p, 10, 0.5).intercept == doctest::Approx(10.5));
  CHECK(step_line(p, 10, 1.5).intercept == doctest::Approx(5));
  const auto lines = step_lines(p, 10);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0].slope == 0);
  CHECK(lines[0].intercept == doctest::Approx(11));
  CHECK(lines[3].slope == doctest::Approx(1.5));
  // Three requests of 10 decodes at t=0 on one worker running one sequence, S = 100 ms: at
  // 2 ms a token they ask 60 ms of 100. But each decode is a step of its own, 11 ms at
  // least (slope 0): 330 ms; the one still running drops its 110, 220 - 100 over, two of
  // 110 excluded.
  CeilingOptions o;
  o.workers = 1;
  o.max_seqs = 1;
  o.slo_ttft_ms = 100;
  o.percentile = 0.3;
  MinimalWork mw;
  mw.token_ms = min_token_ms(p, 10);
  for (int i = 0; i < 3; ++i) {
    mw.requests.push_back(job(0, 0, 20));
    mw.requests.back().decode_tokens = 10;
  }
  CHECK(work_bound(mw, o).need == 0);  // min_token_ms alone
  mw.lines = lines;
  CHECK(work_bound(mw, o).need == 2);
  CHECK(work_bound(mw, o).windows.at(0).work_ms == doctest::Approx(330));
  // Twelve such requests, two sequences a step (11 of 12 may miss): at 2 ms a token 240 ms,
  // two running drop 40, 100 over: five of 20 excluded. By steps, a decode costs at least
  // 0 + 11 / 2, 0.5 + 10.5 / 2, 1 + 10 / 2 or 1.5 + 5 / 2 ms: the third, 60 ms a request,
  // 720 - 120 - 100 over: nine.
  o.max_seqs = 2;
  o.percentile = 0.01;
  mw.requests.resize(12, mw.requests[0]);
  auto b = work_bound(mw, o);
  CHECK(b.need == 9);
  CHECK(b.windows.at(0).work_ms == doctest::Approx(720));
  mw.lines.clear();
  CHECK(work_bound(mw, o).need == 5);
}

TEST_CASE("KV bound: the reuse gaps the fleet's blocks cannot hold are recomputed, the dearest kept") {
  // A reads blocks 1, 2 at t=0; B reads them at t=10,000 with one more. With S = 1,000 each
  // reused block must be held 9,000 ms; one worker of 1 block over the run (11,000 ms) holds
  // 11,000 block-ms: the deeper block (dearer) whole, 2,000 / 9,000 of the first.
  SimOptions so;
  so.workers = 1;
  auto ec = engine_config(so);
  CeilingOptions o;
  o.workers = 1;
  o.slo_ttft_ms = 1000;
  o.kv_blocks = 1;
  const std::vector<SimRequest> w = {req(0, 2, 1, 1), req(10000, 3, 1, 1)};
  const double token_ms = min_token_ms(ec.profile, ec.max_batched_tokens);
  const double c0 = recompute_block_ms(ec.profile, ec.max_batched_tokens, token_ms, 0);
  const double c1 = recompute_block_ms(ec.profile, ec.max_batched_tokens, token_ms, 1);
  CHECK(c1 > c0);
  auto mw = minimal_work(w, 1.0, ec, o);
  CHECK(mw.requests[1].reuse_ms == doctest::Approx(c0 + c1));
  CHECK(mw.recompute_ms == doctest::Approx(c0 * 7000.0 / 9000.0));
  // B's own prefill: the third block after 1,024 cached tokens.
  CHECK(mw.requests[1].prefill_ms ==
        doctest::Approx(min_prefill_ms(ec.profile, ec.max_batched_tokens, token_ms, 1024, 1536)));
  o.kv_blocks = 2;  // room for both: nothing recomputed
  CHECK(minimal_work(w, 1.0, ec, o).recompute_ms == 0);
  o.kv_blocks = 0;  // no KV bound
  CHECK(minimal_work(w, 1.0, ec, o).recompute_ms == 0);
}

TEST_CASE("ceiling: a rate the simulator meets is never ruled out; an overloaded one is") {
  // 300 distinct 8k-token prompts, 10 a second at x1, on one worker: each prefill takes
  // about 230 ms of the engine, so x1 asks 2.3 s of work a second and x1/4 about 0.6.
  std::vector<SimRequest> w;
  for (uint32_t i = 0; i < 300; ++i) w.push_back(req(100.0 * i, 16, 2, 1000 * (i + 1)));
  SimOptions so;
  so.workers = 1;
  const auto ec = engine_config(so);
  CeilingOptions o;
  o.workers = 1;
  o.max_seqs = so.max_seqs;
  o.kv_blocks = ec.kv_blocks;
  for (double rate : {0.25, 1.0}) {
    so.rate = rate;
    const auto run = simulate(w, so, "round_robin");
    const bool met = run.rejected == 0 && run.ttft_p99 <= o.slo_ttft_ms;
    CHECK(met == (rate < 1));  // the simulator: within at x1/4, far over at x1
    CHECK(check_rate(w, rate, ec, o).ruled_out() == !met);
  }
  // Work alone binds here, and the ceiling is where the least work fills the fleet: 300 x
  // 238 ms (8,192 tokens at 0.0251 ms + attention) less the 2 dearest p99 lets miss, on
  // 29.9 s / rate + 2 s: x0.44.
  const auto c = find_ceiling(w, ec, o, 6);
  CHECK(c.rate == doctest::Approx(0.44).epsilon(0.03));
  CHECK(c.ruled_out > c.rate);
  // ... and the simulator meets the SLO at 0.9 of it: tight where work is what binds.
  so.rate = 0.9 * c.rate;
  const auto near = simulate(w, so, "round_robin");
  CHECK(near.ttft_p99 <= o.slo_ttft_ms);
}
