// Online per-worker model of the time to first token (TTFT), for the
// `scheduler.cost: predicted_ttft` cost and for explain.
//
//   ttft_ms = w0 + w1·new_k + w2·pending_k + w3·pending_requests + w4·running + w5·new_k²
//
//   new_k            this request's uncached prompt tokens / 1000 (tier-weighted:
//                    a host or disk hit counts as the fraction it costs to load)
//   pending_k        prefill tokens the router has in flight on the worker and
//                    not yet seen answered with a first byte / 1000 (the queue
//                    this request waits behind)
//   pending_requests those in-flight, not yet answered requests (each one is a
//                    step of its own with its fixed overhead)
//   running          requests running on the worker (decode work in every step)
//   new_k²           attention's quadratic share of a long prefill
//
// Fitted per worker by recursive least squares with a forgetting factor
// (lambda 0.995: about the last 200 first bytes matter) from observed
// dispatch-to-first-byte times, each weighted by 1 / observed² so that the fit
// minimises the relative error. Plain least squares let a few multi-second
// first bytes set the coefficients for every short prompt: kvroute-sim's MAPE
// on the trace's test slice (8 workers x 8,000 blocks, --slice test) was 0.154
// at 8,192-token engine steps and 0.706 at 65,536; relative, 0.113 and 0.171
// (bursts 0.436 -> 0.288; agentic and api unchanged at 0.06-0.07).
// Before data it predicts from the prior below
// (15 ms per 1,000 tokens of prefill, new or queued; 25 ms per queued request;
// 20 ms fixed): what a mid-size model on one modern GPU does, so that routing
// is sensible from the first request; the prior's covariance is wide, so a few
// dozen observations override it. Predictions are clamped to >= 0.
// A prediction is 5 multiply-adds (nanoseconds); an update is O(25).
//
// Threading: TtftModel is a plain value, not thread-safe; WorkerRegistry keeps
// one per worker under its mutex. TtftCoefficients is an immutable snapshot
// copied into each routing decision.
#pragma once

#include <array>
#include <cstdint>

namespace kvroute {

constexpr int kTtftFeatures = 6;

struct TtftFeatures {
  double new_tokens = 0;        // uncached prompt tokens of this request
  double pending_tokens = 0;    // in-flight prefill tokens ahead of it
  double pending_requests = 0;  // in-flight requests not yet answered
  double running = 0;           // requests running on the worker
  std::array<double, kTtftFeatures> vector() const {
    const double k = new_tokens / 1000.0;
    return {1.0, k, pending_tokens / 1000.0, pending_requests, running, k * k};
  }
};

// A snapshot of one worker's model: enough to predict, nothing to update.
struct TtftCoefficients {
  std::array<double, kTtftFeatures> w{20.0, 15.0, 15.0, 25.0, 0.0, 0.5};  // the prior
  uint64_t samples = 0;  // observations the model has learned from
  double predict_ms(const TtftFeatures& f) const;
};

// Prediction quality so far (for the MAPE metric and kvroute-sim).
struct TtftStats {
  uint64_t samples = 0;
  double sum_abs_pct_error = 0;  // sum of |predicted - observed| / observed
  double mape() const { return samples ? sum_abs_pct_error / static_cast<double>(samples) : 0.0; }
};

class TtftModel {
 public:
  TtftModel();
  const TtftCoefficients& coefficients() const { return c_; }
  double predict_ms(const TtftFeatures& f) const { return c_.predict_ms(f); }
  // Learns from one observation; returns |predicted - observed| / observed
  // of the prediction made before this update (0 when observed_ms <= 0,
  // which is then ignored as a measurement error).
  double observe(const TtftFeatures& f, double observed_ms);

  static constexpr double kLambda = 0.995;
  // Observations below this (ms) are weighted as if they were this long.
  static constexpr double kMinObservedMs = 1.0;

 private:
  TtftCoefficients c_;
  std::array<std::array<double, kTtftFeatures>, kTtftFeatures> p_{};  // covariance
};

}  // namespace kvroute
