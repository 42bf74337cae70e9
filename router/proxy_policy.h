// The proxy's per-request policies that need no I/O: the adaptive first-byte
// timeout. Pure; thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>

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

// `predicted_s` times `router.first_byte_timeout_factor`, no less than
// `router.first_byte_timeout_min_ms` and no more than `ceiling_ms` (it wins
// over the floor).
inline std::chrono::milliseconds factor_within(const RouterConfig& r, double predicted_s, double ceiling_ms) {
  const double floor = std::min<double>(r.first_byte_timeout_min_ms, ceiling_ms);
  double ms = predicted_s * r.first_byte_timeout_factor * 1e3;
  if (!(ms >= floor)) ms = floor;  // also NaN
  ms = std::min(ms, ceiling_ms);
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(ms)));
}

// How long the proxy waits for a worker's response header: the predicted
// TTFT times `router.first_byte_timeout_factor`, no less than
// `router.first_byte_timeout_min_ms` and no more than
// `router.first_byte_timeout_ms` (the ceiling; it wins over the floor).
inline std::chrono::milliseconds adaptive_first_byte_timeout(const RouterConfig& r, double predicted_ttft_s) {
  return factor_within(r, predicted_ttft_s, r.first_byte_timeout_ms);
}

// What the proxy knows of one attempt when it waits for the response header.
struct HeaderWait {
  uint64_t prefill_tokens = 0;  // ahead of its first token there (its own uncached, the router's in flight)
  bool streamed = true;         // false: the header comes with the whole answer
  std::optional<uint64_t> max_tokens;  // its output budget; nullopt = up to the context
  bool slot_free = true;        // false: every request slot of the worker was taken when it was chosen
};

// The first-byte timeout of an attempt. A streamed request's header comes
// with its first token: the adaptive timeout above. One not streamed gets
// its header with the whole answer, so the wait adds generating its output
// budget at `router.decode_tokens_per_s` (a deliberately slow rate), up to
// `router.response_timeout_ms`; without a budget, that ceiling. A worker
// chosen with every slot taken (a nearly full fleet, or every worker busy)
// queues the request until one of its requests ends, which nothing here
// predicts: the ceiling. Either way a long answer or a full engine is not
// taken for a hung worker (a first-byte timeout fails over and counts
// against the worker's health).
inline std::chrono::milliseconds header_timeout(const RouterConfig& r, const HeaderWait& w) {
  const double ceiling = w.streamed ? double(r.first_byte_timeout_ms)
                                    : std::max<double>(r.first_byte_timeout_ms, r.response_timeout_ms);
  if (!w.slot_free || (!w.streamed && !w.max_tokens))
    return std::chrono::milliseconds(static_cast<int64_t>(ceiling));
  double s = estimated_ttft_seconds(r, w.prefill_tokens);
  if (!w.streamed) s += static_cast<double>(*w.max_tokens) / (r.decode_tokens_per_s > 0 ? r.decode_tokens_per_s : 1.0);
  return factor_within(r, s, ceiling);
}

}  // namespace kvroute
