#include "scheduler/ttft_model.h"

#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "scheduler/scheduler.h"

using namespace kvroute;

namespace {

// A worker whose TTFT is linear in the model's features, with 3 % noise.
double truth(const TtftFeatures& f, std::mt19937_64& rng) {
  const double k = f.new_tokens / 1000, p = f.pending_tokens / 1000;
  const double y = 30 + 40 * k + 35 * p + 12 * f.pending_requests + 0.8 * f.running + 2 * k * k;
  return y * (1 + std::normal_distribution<double>(0, 0.03)(rng));
}

TtftFeatures random_features(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  return TtftFeatures{u(rng) * 8000, u(rng) * 20000, std::floor(u(rng) * 6), std::floor(u(rng) * 64)};
}

}  // namespace

TEST_CASE("the prior predicts a sensible TTFT before any observation") {
  TtftModel m;
  CHECK(m.coefficients().samples == 0);
  // 2,000 new tokens on an idle worker: 20 + 2 x 15 ms (+ the small quadratic term).
  CHECK(m.predict_ms(TtftFeatures{2000, 0, 0, 0}) == doctest::Approx(52).epsilon(0.05));
  // Waiting behind 10,000 queued tokens in 2 requests costs more than an idle worker.
  CHECK(m.predict_ms(TtftFeatures{2000, 10000, 2, 10}) > m.predict_ms(TtftFeatures{2000, 0, 0, 10}) + 100);
}

TEST_CASE("recursive least squares learns a worker's TTFT to within a few percent") {
  std::mt19937_64 rng(7);
  TtftModel m;
  for (int i = 0; i < 400; ++i) {
    const auto f = random_features(rng);
    m.observe(f, truth(f, rng));
  }
  CHECK(m.coefficients().samples == 400);
  // Held-out requests: mean absolute percentage error against the noiseless truth.
  double ape = 0;
  const int n = 300;
  for (int i = 0; i < n; ++i) {
    const auto f = random_features(rng);
    std::mt19937_64 quiet(0);
    const double k = f.new_tokens / 1000, p = f.pending_tokens / 1000;
    const double y = 30 + 40 * k + 35 * p + 12 * f.pending_requests + 0.8 * f.running + 2 * k * k;
    ape += std::abs(m.predict_ms(f) - y) / y;
  }
  CHECK(ape / n < 0.03);
  CHECK(m.coefficients().w[1] == doctest::Approx(40).epsilon(0.15));
}

TEST_CASE("a bad observation is ignored") {
  TtftModel m;
  const auto before = m.coefficients();
  CHECK(m.observe(TtftFeatures{1000, 0, 0, 0}, 0) == 0);
  CHECK(m.observe(TtftFeatures{1000, 0, 0, 0}, std::nan("")) == 0);
  CHECK(m.observe(TtftFeatures{1000, 0, 0, 0}, -5) == 0);
  CHECK(m.coefficients().samples == 0);
  CHECK(m.coefficients().w == before.w);
}

TEST_CASE("scheduler.cost predicted_ttft: a long queue on the cache holder loses to recomputing elsewhere") {
  SchedulerConfig cfg;
  cfg.cost = "predicted_ttft";
  SeededRandom rnd(1);
  Candidate holder, idle;
  holder.owner.worker = WorkerId{1};
  holder.overlap_blocks = 50;  // 800 of 1,000 tokens cached (block 16)
  holder.load = WorkerLoad{4, 64, 0, 100, 1000};
  idle = holder;
  idle.owner.worker = WorkerId{2};
  idle.overlap_blocks = 0;
  // Nothing queued on the holder: the cache wins.
  Decision d = schedule({holder, idle}, 1000, 16, cfg, rnd);
  REQUIRE(d.chosen);
  CHECK(*d.chosen == 0);
  CHECK(d.scores[0].predicted_ttft_ms < d.scores[1].predicted_ttft_ms);
  // 60,000 tokens queued on it in 6 requests: waiting costs more than recomputing 800 tokens.
  holder.pending_prefill_tokens = 60000;
  holder.pending_prefill_requests = 6;
  d = schedule({holder, idle}, 1000, 16, cfg, rnd);
  CHECK(*d.chosen == 1);
  CHECK(d.scores[0].cost - d.scores[1].cost ==
        doctest::Approx((d.scores[0].predicted_ttft_ms - d.scores[1].predicted_ttft_ms) / 1000 +
                        cfg.gamma * (d.scores[0].slot_ratio - d.scores[1].slot_ratio) +
                        d.alpha * (d.scores[0].load_deviation - d.scores[1].load_deviation) +
                        cfg.delta * (d.scores[0].queue_ratio - d.scores[1].queue_ratio)));
}

TEST_CASE("a few very slow first bytes do not spoil the predictions for short prompts") {
  // Short prompts follow the model's features exactly; one prompt in ten is
  // long and its first byte also waits an extra 0-4 s the features cannot see
  // (a preempted batch, a long step in progress). The fit weighs each
  // observation by its relative error, so the slow ones do not drag the
  // short ones' coefficients (plain least squares: MAPE 0.86 here; relative: 0.005).
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  auto short_truth = [](const TtftFeatures& f) { return 20 + 15 * f.new_tokens / 1000 + 25 * f.pending_requests; };
  TtftModel m;
  for (int i = 0; i < 2000; ++i) {
    if (i % 10 == 9) {
      const TtftFeatures f{20000 + u(rng) * 20000, 0, std::floor(u(rng) * 3), 4};
      m.observe(f, short_truth(f) + 4000 * u(rng));
    } else {
      const TtftFeatures f{u(rng) * 2000, 0, std::floor(u(rng) * 3), 4};
      m.observe(f, short_truth(f));
    }
  }
  double ape = 0;
  const int n = 200;
  for (int i = 0; i < n; ++i) {
    const TtftFeatures f{u(rng) * 2000, 0, std::floor(u(rng) * 3), 4};
    ape += std::abs(m.predict_ms(f) - short_truth(f)) / short_truth(f);
  }
  CHECK(ape / n < 0.15);
}
