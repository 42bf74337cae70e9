#include "scheduler/ttft_model.h"

#include <algorithm>
#include <cmath>

namespace kvroute {

double TtftCoefficients::predict_ms(const TtftFeatures& f) const {
  const auto x = f.vector();
  double y = 0;
  for (int i = 0; i < kTtftFeatures; ++i) y += w[i] * x[i];
  return std::max(0.0, y);
}

TtftModel::TtftModel() {
  // Prior covariance: wide enough that a few dozen observations dominate
  // (each coefficient may move by about its own size or more).
  const std::array<double, kTtftFeatures> var{400.0, 400.0, 400.0, 400.0, 25.0, 4.0};
  for (int i = 0; i < kTtftFeatures; ++i) p_[i][i] = var[i];
}

double TtftModel::observe(const TtftFeatures& f, double observed_ms) {
  if (!(observed_ms > 0) || !std::isfinite(observed_ms)) return 0;
  const double predicted = c_.predict_ms(f);
  // Relative least squares: each observation weighted by 1 / observed², i.e.
  // x and y scaled by 1 / observed, so the fit minimises the relative error
  // (what MAPE and a cost comparison between workers care about) instead of
  // letting a few multi-second first bytes dominate the short ones.
  const double scale = 1.0 / std::max(observed_ms, kMinObservedMs);
  auto x = f.vector();
  for (double& v : x) v *= scale;
  const double y = observed_ms * scale;
  // Recursive least squares: k = P x / (lambda + x' P x); w += k (y - x'w);
  // P = (P - k x' P) / lambda.
  std::array<double, kTtftFeatures> px{};
  for (int i = 0; i < kTtftFeatures; ++i)
    for (int j = 0; j < kTtftFeatures; ++j) px[i] += p_[i][j] * x[j];
  double denom = kLambda;
  for (int i = 0; i < kTtftFeatures; ++i) denom += x[i] * px[i];
  double raw = 0;  // the unclamped prediction: the regression's own residual
  for (int i = 0; i < kTtftFeatures; ++i) raw += c_.w[i] * x[i];
  const double err = y - raw;
  for (int i = 0; i < kTtftFeatures; ++i) c_.w[i] += px[i] / denom * err;
  for (int i = 0; i < kTtftFeatures; ++i)
    for (int j = 0; j < kTtftFeatures; ++j) p_[i][j] = (p_[i][j] - px[i] * px[j] / denom) / kLambda;
  // Keep P bounded (no wind-up while a feature is constant, e.g. an idle worker).
  double trace = 0;
  for (int i = 0; i < kTtftFeatures; ++i) trace += p_[i][i];
  if (trace > 1e6)
    for (auto& row : p_)
      for (double& v : row) v *= 1e6 / trace;
  ++c_.samples;
  return std::abs(predicted - observed_ms) / observed_ms;
}

}  // namespace kvroute
