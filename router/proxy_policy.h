// The proxy's per-request policies that need no I/O: the adaptive first-byte
// timeout. Pure; thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "config/config.h"

namespace kvroute {

// A request's predicted time to first token on a worker, in seconds: the
// prefill tokens ahead of its first byte (its own uncached ones plus those the
// router already has in flight there) at `router.ttft_prefill_tokens_per_s`,
// a deliberately conservative rate (a slow GPU, a large model). A
// predicted-TTFT model replaces this estimate when one is available.
inline double estimated_ttft_seconds(const RouterConfig& r, uint64_t prefill_tokens) {
  const double rate = r.ttft_prefill_tokens_per_s > 0 ? r.ttft_prefill_tokens_per_s : 1.0;
  return static_cast<double>(prefill_tokens) / rate;
}

// How long the proxy waits for a worker's response header: the predicted
// TTFT times `router.first_byte_timeout_factor`, no less than
// `router.first_byte_timeout_min_ms` and no more than
// `router.first_byte_timeout_ms` (the ceiling; it wins over the floor).
inline std::chrono::milliseconds adaptive_first_byte_timeout(const RouterConfig& r, double predicted_ttft_s) {
  const double ceiling = r.first_byte_timeout_ms;
  const double floor = std::min<double>(r.first_byte_timeout_min_ms, ceiling);
  double ms = predicted_ttft_s * r.first_byte_timeout_factor * 1e3;
  if (!(ms >= floor)) ms = floor;  // also NaN
  ms = std::min(ms, ceiling);
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(ms)));
}

}  // namespace kvroute
