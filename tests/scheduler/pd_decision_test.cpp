#include "scheduler/pd_decision.h"

#include <doctest/doctest.h>

using namespace kvroute;

namespace {

Candidate worker(uint64_t id, WorkerRole role, uint32_t overlap, uint64_t kv_active = 0, uint64_t kv_total = 1000,
                 uint32_t active = 0, uint32_t slots = 100) {
  Candidate c;
  c.owner.worker = WorkerId{id};
  c.role = role;
  c.overlap_blocks = overlap;
  c.load = WorkerLoad{active, slots, 0, kv_active, kv_total};
  return c;
}

// 1,000-token prompt in 16-token blocks: at most ⌊999/16⌋ = 62 blocks count as cached.
PdRequest request(uint64_t request_blocks = 70) {
  PdRequest r;
  r.isl_tokens = 1000;
  r.block_size = 16;
  r.request_blocks = request_blocks;
  return r;
}

const PdDecodeTerms& decode_terms_of(const PdDecision& d, size_t candidate) {
  for (const auto& t : d.decode_terms)
    if (t.candidate == candidate) return t;
  FAIL("no decode terms for candidate " << candidate);
  return d.decode_terms.front();
}

const PdPrefillTerms& prefill_terms_of(const PdDecision& d, size_t candidate) {
  for (const auto& t : d.prefill_terms)
    if (t.candidate == candidate) return t;
  FAIL("no prefill terms for candidate " << candidate);
  return d.prefill_terms.front();
}

}  // namespace

TEST_CASE("pd: the decode worker holding the prefix is chosen and few uncached tokens run there whole") {
  SchedulerConfig sched;
  PdConfig pd;  // conditional, 512
  SeededRandom rnd(1);
  // Decode 2 holds 50 blocks = 800 tokens: it lacks 200 < 512.
  std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 0), worker(2, WorkerRole::Decode, 50),
                               worker(3, WorkerRole::Prefill, 0)};
  const PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
  REQUIRE(d.decode.has_value());
  CHECK(*d.decode == 1);
  CHECK(d.decode_uncached_tokens == doctest::Approx(200));
  CHECK(decode_terms_of(d, 1).cached_tokens == doctest::Approx(800));
  CHECK(decode_terms_of(d, 0).uncached_tokens == doctest::Approx(1000));
  CHECK_FALSE(d.disaggregate);
  CHECK(d.reason == PdReason::FewUncachedTokens);
  CHECK_FALSE(d.prefill.has_value());
  CHECK(d.decode_ranking == std::vector<size_t>{1, 0});
  // The prefill worker was priced anyway, for explain: 1,000 new tokens on the
  // prior 20 + 15·1.0 + 0.5·1.0² = 35.5 ms.
  CHECK(prefill_terms_of(d, 2).predicted_ttft_ms == doctest::Approx(35.5));
}

TEST_CASE("pd: enough uncached tokens split the request; the prefill worker with the prefix wins") {
  SchedulerConfig sched;
  PdConfig pd;
  SeededRandom rnd(2);
  // No decode worker holds anything: 1,000 uncached ≥ 512.
  // Prefill 3 holds 40 blocks (640 tokens): 360 new → 20 + 15·0.36 + 0.5·0.36² = 25.4648 ms.
  // Prefill 4 holds nothing: 35.5 ms.
  std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 0), worker(2, WorkerRole::Decode, 0),
                               worker(3, WorkerRole::Prefill, 40), worker(4, WorkerRole::Prefill, 0)};
  const PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.disaggregate);
  CHECK(d.reason == PdReason::Disaggregated);
  REQUIRE(d.prefill.has_value());
  CHECK(*d.prefill == 2);
  CHECK(d.prefill_ranking == std::vector<size_t>{2, 3});
  CHECK(prefill_terms_of(d, 2).new_tokens == doctest::Approx(360));
  CHECK(prefill_terms_of(d, 2).predicted_ttft_ms == doctest::Approx(25.4648));
  CHECK(prefill_terms_of(d, 3).predicted_ttft_ms == doctest::Approx(35.5));
  // Prefill workers never decode.
  for (size_t i : d.decode_ranking) CHECK(cs[i].role != WorkerRole::Prefill);
}

TEST_CASE("pd: pd.decode_alpha weighs the decode side's KV load instead of the scheduler's alpha") {
  SchedulerConfig sched;  // alpha 0.3 balanced and imbalanced
  PdConfig pd;
  SeededRandom rnd(9);
  // Decode 1 holds 50 blocks (800 tokens) at 60 % KV; decode 2 holds nothing at 10 %.
  std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 50, 600), worker(2, WorkerRole::Decode, 0, 100),
                               worker(3, WorkerRole::Prefill, 0)};
  // The scheduler's alpha: 1 costs 0.3·0.6 + 0.7·0.2 = 0.32 against 2's 0.3·0.1 + 0.7·1 = 0.73.
  PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
  REQUIRE(d.decode.has_value());
  CHECK(*d.decode == 0);
  CHECK(d.decode_alpha == doctest::Approx(0.3));
  // 0.9: 1 costs 0.9·0.6 + 0.1·0.2 = 0.56 against 2's 0.9·0.1 + 0.1·1 = 0.19; it lacks 1,000 tokens: split.
  pd.decode_alpha = 0.9;
  d = decide_pd(cs, request(), sched, pd, rnd);
  REQUIRE(d.decode.has_value());
  CHECK(*d.decode == 1);
  CHECK(d.decode_alpha == doctest::Approx(0.9));
  CHECK(decode_terms_of(d, 1).score.cost < decode_terms_of(d, 0).score.cost);
  CHECK(d.disaggregate);
  // The prefill side is priced by its TTFT model either way, whatever the alpha.
  CHECK(prefill_terms_of(d, 2).predicted_ttft_ms == doctest::Approx(35.5));
}

TEST_CASE("pd: a prefill worker's queue outweighs its cached prefix") {
  SchedulerConfig sched;
  PdConfig pd;
  SeededRandom rnd(3);
  std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 0), worker(3, WorkerRole::Prefill, 40),
                               worker(4, WorkerRole::Prefill, 0)};
  cs[1].pending_prefill_tokens = 2000;
  cs[1].pending_prefill_requests = 2;
  // 3: 20 + 5.4 + 15·2 + 25·2 + 0.0648 = 105.4648 ms; 4: 35.5 ms.
  const PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
  REQUIRE(d.prefill.has_value());
  CHECK(*d.prefill == 2);
  CHECK(prefill_terms_of(d, 1).predicted_ttft_ms == doctest::Approx(105.4648));
  CHECK(prefill_terms_of(d, 1).queued_tokens == 2000);
}

TEST_CASE("pd: a busy prefill pool sends the request whole to the decode worker (conditional only)") {
  SchedulerConfig sched;
  SeededRandom rnd(4);
  SUBCASE("best prefill worker's queue at pd.prefill_busy_tokens") {
    PdConfig pd;
    pd.prefill_busy_tokens = 4000;
    std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 0), worker(3, WorkerRole::Prefill, 0),
                                 worker(4, WorkerRole::Prefill, 0)};
    cs[1].pending_prefill_tokens = 4000;
    cs[2].pending_prefill_tokens = 5000;
    PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
    CHECK_FALSE(d.disaggregate);
    CHECK(d.reason == PdReason::PrefillPoolBusy);
    CHECK(*d.decode == 0);
    cs[1].pending_prefill_tokens = 3999;  // below: split, on worker 3
    d = decide_pd(cs, request(), sched, pd, rnd);
    CHECK(d.disaggregate);
    CHECK(*d.prefill == 1);
  }
  SUBCASE("every prefill worker over a busy threshold") {
    std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 0), worker(3, WorkerRole::Prefill, 0, 0, 1000, 100),
                                 worker(4, WorkerRole::Prefill, 0, 1000, 1000)};
    PdConfig pd;
    PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
    CHECK(d.reason == PdReason::PrefillPoolBusy);
    CHECK(prefill_terms_of(d, 1).excluded == Exclusion::NoFreeSlot);
    CHECK(prefill_terms_of(d, 2).excluded == Exclusion::NoFreeBlock);
    pd.policy = "always";  // the busy workers queue it
    d = decide_pd(cs, request(), sched, pd, rnd);
    CHECK(d.disaggregate);
    CHECK(d.prefill_all_busy);
    CHECK(d.prefill_ranking.size() == 2);
  }
}

TEST_CASE("pd: policy always splits even a short uncached remainder; never splits nothing") {
  SchedulerConfig sched;
  SeededRandom rnd(5);
  std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 60), worker(3, WorkerRole::Prefill, 0)};
  PdConfig pd;
  pd.policy = "always";
  PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.disaggregate);
  CHECK(d.decode_uncached_tokens == doctest::Approx(1000 - 60 * 16));
  pd.policy = "never";
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK_FALSE(d.disaggregate);
  CHECK(d.reason == PdReason::PolicyNever);
  CHECK(*d.decode == 0);
}

TEST_CASE("pd: pd.min_uncached_tokens is the boundary (at it: split; below: whole)") {
  SchedulerConfig sched;
  SeededRandom rnd(6);
  // Decode holds 30 blocks = 480 tokens: 520 uncached.
  std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 30), worker(3, WorkerRole::Prefill, 0)};
  PdConfig pd;
  pd.min_uncached_tokens = 520;
  CHECK(decide_pd(cs, request(), sched, pd, rnd).disaggregate);
  pd.min_uncached_tokens = 521;
  CHECK(decide_pd(cs, request(), sched, pd, rnd).reason == PdReason::FewUncachedTokens);
}

TEST_CASE("pd: mixed fleets, missing pools and multi-consumer requests") {
  SchedulerConfig sched;
  PdConfig pd;
  SeededRandom rnd(7);
  SUBCASE("an aggregated worker with the prefix serves the request whole") {
    std::vector<Candidate> cs = {worker(1, WorkerRole::Both, 60), worker(2, WorkerRole::Decode, 0),
                                 worker(3, WorkerRole::Prefill, 0)};
    const PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
    CHECK(*d.decode == 0);
    CHECK(d.reason == PdReason::AggregatedWorker);
    CHECK_FALSE(d.disaggregate);
  }
  SUBCASE("no prefill worker, or every one drained") {
    std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 0)};
    CHECK(decide_pd(cs, request(), sched, pd, rnd).reason == PdReason::NoPrefillWorker);
    cs.push_back(worker(3, WorkerRole::Prefill, 0));
    cs.back().draining = true;
    pd.policy = "always";
    const PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
    CHECK(d.reason == PdReason::NoPrefillWorker);
    CHECK(prefill_terms_of(d, 1).excluded == Exclusion::Draining);
  }
  SUBCASE("only prefill workers: nobody decodes") {
    std::vector<Candidate> cs = {worker(3, WorkerRole::Prefill, 0)};
    const PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
    CHECK_FALSE(d.decode.has_value());
    CHECK(d.reason == PdReason::NoDecodeWorker);
  }
  SUBCASE("n > 1 or several prompts") {
    std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 0), worker(3, WorkerRole::Prefill, 0)};
    PdRequest r = request();
    r.single_consumer = false;
    CHECK(decide_pd(cs, r, sched, pd, rnd).reason == PdReason::MultipleConsumers);
  }
}

TEST_CASE("pd: a decode worker without KV headroom for the request is left out while another has room") {
  SchedulerConfig sched;
  PdConfig pd;
  SeededRandom rnd(8);
  // Request of 70 blocks. Decode 1 holds 50 of them but has 990/1000 in use:
  // 10 free − (70 − 50) needed = −10. Decode 2: 1000 free − 70 = 930.
  std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 50, 990), worker(2, WorkerRole::Decode, 0, 0),
                               worker(3, WorkerRole::Prefill, 0)};
  PdDecision d = decide_pd(cs, request(70), sched, pd, rnd);
  CHECK(decode_terms_of(d, 0).kv_headroom_blocks == -10);
  CHECK(decode_terms_of(d, 0).lacks_headroom);
  CHECK(decode_terms_of(d, 1).kv_headroom_blocks == 930);
  CHECK(*d.decode == 1);
  CHECK(d.decode_ranking == std::vector<size_t>{1});
  CHECK(d.disaggregate);
  // One block short is short (not "unknown").
  cs[0].load.kv_active_blocks = 981;  // 19 free − 20 needed
  d = decide_pd(cs, request(70), sched, pd, rnd);
  CHECK(decode_terms_of(d, 0).kv_headroom_blocks == -1);
  CHECK(decode_terms_of(d, 0).lacks_headroom);
  cs[0].load.kv_active_blocks = 990;
  // When nobody has room, nobody is left out for it (the engines queue).
  cs[1].load.kv_active_blocks = 990;
  d = decide_pd(cs, request(70), sched, pd, rnd);
  CHECK_FALSE(decode_terms_of(d, 0).lacks_headroom);
  CHECK(d.decode_ranking.size() == 2);
}

TEST_CASE("pd: a busy decode side is ranked among the busy unless reject_when_busy") {
  PdConfig pd;
  SeededRandom rnd(9);
  std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 0, 0, 1000, 100), worker(3, WorkerRole::Prefill, 0)};
  SchedulerConfig sched;
  PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.decode_all_busy);
  CHECK(*d.decode == 0);
  sched.reject_when_busy = true;
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK_FALSE(d.decode.has_value());
  CHECK(d.decode_all_busy);
  CHECK(d.reason == PdReason::NoDecodeWorker);
}

TEST_CASE("pd: every reason has a distinct name") {
  std::vector<std::string_view> names;
  for (int i = 0; i <= static_cast<int>(PdReason::MultipleConsumers); ++i)
    names.push_back(to_string(static_cast<PdReason>(i)));
  std::sort(names.begin(), names.end());
  CHECK(std::unique(names.begin(), names.end()) == names.end());
}

TEST_CASE("pd: a decode worker over pd.decode_busy_kv_usage never runs a request whole: it is split") {
  SchedulerConfig sched;
  SeededRandom rnd(11);
  // The only decode worker holds 50 blocks (800 tokens): it lacks 200 < 512, so
  // it would run the request whole. Its KV: 900 of 1,000 blocks active, and the
  // request needs 70 − 50 = 20 more: (900 + 20) / 1,000 = 0.92.
  std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 50, 900), worker(3, WorkerRole::Prefill, 0)};
  PdConfig pd;  // gate off: few uncached tokens, whole
  PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.reason == PdReason::FewUncachedTokens);
  CHECK(d.decode_kv_usage == doctest::Approx(0.92));
  CHECK_FALSE(d.decode_busy);
  pd.decode_busy_kv_usage = 0.92;  // at the threshold: not busy (over it is)
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.reason == PdReason::FewUncachedTokens);
  pd.decode_busy_kv_usage = 0.9;
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.decode_busy);
  CHECK(d.disaggregate);
  CHECK(d.reason == PdReason::Disaggregated);
  REQUIRE(d.prefill.has_value());
  CHECK(*d.prefill == 1);
  // The gate also overrides a busy prefill queue: the decode worker cannot take the prefill either.
  pd.prefill_busy_tokens = 100;
  cs[1].pending_prefill_tokens = 100;
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.disaggregate);
  // A decode worker that reports no KV total is never busy for it (unknown usage).
  cs[0].load.kv_total_blocks = 0;
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.decode_kv_usage == doctest::Approx(-1));
  CHECK_FALSE(d.decode_busy);
  CHECK(d.reason == PdReason::FewUncachedTokens);
}

TEST_CASE("pd: pd.aggregate_time_ratio runs a request whole when the decode worker is predicted faster") {
  SchedulerConfig sched;
  SeededRandom rnd(12);
  // 1,000 uncached tokens on the decode worker (≥ 512: not "few"). On the prior:
  // whole there 20 + 15·1 + 0.5·1² = 35.5 ms; the prefill worker has 10,000
  // tokens and 2 requests queued: 35.5 + 15·10 + 25·2 = 235.5 ms, plus the
  // transfer of 1,000 tokens at 2.62 ms per 1,000 = 238.12 ms split.
  std::vector<Candidate> cs = {worker(1, WorkerRole::Decode, 0), worker(3, WorkerRole::Prefill, 0)};
  cs[1].pending_prefill_tokens = 10000;
  cs[1].pending_prefill_requests = 2;
  PdConfig pd;  // ratio off: split however long the prefill queue
  PdDecision d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.disaggregate);
  CHECK(d.predicted_aggregated_ms == doctest::Approx(35.5));
  CHECK(d.transfer_ms == doctest::Approx(2.62));
  CHECK(d.predicted_split_ms == doctest::Approx(238.12));
  pd.aggregate_time_ratio = 0.7;  // 35.5 ≤ 0.7 · 238.12: whole
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK_FALSE(d.disaggregate);
  CHECK(d.reason == PdReason::AggregatedFaster);
  CHECK(to_string(d.reason) == "aggregated_faster");
  CHECK(*d.decode == 0);
  // An idle prefill worker: split 35.5 + 2.62 = 38.12; 0.7 · 38.12 = 26.7 < 35.5: split.
  cs[1].pending_prefill_tokens = 0;
  cs[1].pending_prefill_requests = 0;
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.disaggregate);
  CHECK(d.predicted_split_ms == doctest::Approx(38.12));
  // ...but with ratio 1 and a slower link (40 ms per 1,000 tokens: 75.5 ms split) it runs whole.
  pd.aggregate_time_ratio = 1;
  pd.transfer_ms_per_1k_tokens = 40;
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.reason == PdReason::AggregatedFaster);
  // A busy decode worker is split even when predicted faster (the decode gate).
  cs[0].load.kv_active_blocks = 950;  // (950 + 70) / 1,000 > 0.8
  pd.decode_busy_kv_usage = 0.8;
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.decode_busy);
  CHECK(d.disaggregate);
  // policy always ignores the prediction.
  cs[0].load.kv_active_blocks = 0;
  pd.policy = "always";
  d = decide_pd(cs, request(), sched, pd, rnd);
  CHECK(d.disaggregate);
}
