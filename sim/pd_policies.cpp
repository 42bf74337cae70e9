#include "sim/pd_policies.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvroute::sim {

double transfer_ms(uint64_t tokens, double kv_bytes_per_token, double gbps) {
  if (tokens == 0 || !(gbps > 0)) return 0;
  return double(tokens) * kv_bytes_per_token * 8.0 / (gbps * 1e9) * 1000.0;
}

namespace {

// Index of the lowest (better = less) or highest score, ties at random (reservoir sampling).
template <class Better>
size_t best_of(const std::vector<double>& score, std::mt19937_64& rng, Better better) {
  size_t best = 0, ties = 0;
  for (size_t i = 0; i < score.size(); ++i) {
    if (i == 0 || better(score[i], score[best])) {
      best = i;
      ties = 1;
    } else if (score[i] == score[best] && rng() % ++ties == 0) {
      best = i;
    }
  }
  return best;
}
size_t argmin(const std::vector<double>& s, std::mt19937_64& rng) {
  return best_of(s, rng, [](double a, double b) { return a < b; });
}
size_t argmax(const std::vector<double>& s, std::mt19937_64& rng) {
  return best_of(s, rng, [](double a, double b) { return a > b; });
}

// llm-d's profile scorers: prefix-cache-scorer (matched blocks / request blocks)
// weight 2 + queue-scorer ((max − waiting) / (max − min), 1 when all equal)
// weight 1, on the scraped waiting queues; the highest sum wins.
size_t llmd_pick(const std::vector<PdEngineView>& pool, uint32_t request_blocks, std::mt19937_64& rng) {
  constexpr double kPrefixWeight = 2, kQueueWeight = 1;
  uint32_t qmin = std::numeric_limits<uint32_t>::max(), qmax = 0;
  for (const auto& e : pool) {
    qmin = std::min(qmin, e.scraped.num_requests_waiting);
    qmax = std::max(qmax, e.scraped.num_requests_waiting);
  }
  std::vector<double> score(pool.size());
  for (size_t i = 0; i < pool.size(); ++i) {
    const auto& e = pool[i];
    const double prefix = request_blocks ? double(e.overlap_blocks) / double(request_blocks) : 0;
    const double queue = qmax == qmin ? 1.0 : double(qmax - e.scraped.num_requests_waiting) / double(qmax - qmin);
    score[i] = kPrefixWeight * prefix + kQueueWeight * queue;
  }
  return argmax(score, rng);
}

}  // namespace

PdChoice pd_dynamo(const PdInput& in, std::mt19937_64& rng) {
  constexpr double kEffIslThreshold = 2048, kEffIslRatioThreshold = 0.7;
  constexpr double kPrefillLoadScale = 1.0, kOverlapScoreCredit = 1.0;
  PdChoice c;
  // Decode router: overlap credit forced to 0 and no prefill tracking, so the
  // prefill term is the same for every worker; the potential active blocks decide.
  std::vector<double> dlogit(in.decode.size());
  for (size_t i = 0; i < in.decode.size(); ++i) dlogit[i] = in.decode[i].dynamo_active_blocks;
  c.decode = argmin(dlogit, rng);
  // Conditional disaggregation (isl_bounding) on the peeked decode worker's overlap.
  const double isl = in.prompt_tokens;
  const double eff_isl = std::max(0.0, isl - double(in.decode[c.decode].overlap_blocks) * in.block_size);
  const double ratio = eff_isl / std::max(isl, 1.0);
  if (eff_isl < kEffIslThreshold && ratio < kEffIslRatioThreshold) return c;  // bypass: aggregated
  c.disaggregate = true;
  // Prefill router: tracked in-flight prefill tokens, no active blocks.
  std::vector<double> plogit(in.prefill.size());
  for (size_t i = 0; i < in.prefill.size(); ++i) {
    const auto& e = in.prefill[i];
    const double raw = double(e.inflight_prefill_tokens + in.prompt_tokens) / in.block_size;
    plogit[i] = kPrefillLoadScale * std::max(0.0, raw - kOverlapScoreCredit * e.overlap_blocks);
  }
  c.prefill = argmin(plogit, rng);
  return c;
}

PdChoice pd_llmd(const PdInput& in, std::mt19937_64& rng, uint32_t non_cached_tokens) {
  PdChoice c;
  c.decode = llmd_pick(in.decode, in.request_blocks, rng);
  // prefix_based_pd_decider.go: 0 disables; short prompts stay on decode.
  if (non_cached_tokens == 0 || in.prompt_tokens < non_cached_tokens) return c;
  const uint64_t hit = uint64_t{in.decode[c.decode].overlap_blocks} * in.block_size;
  if (in.prompt_tokens < hit + non_cached_tokens) return c;
  c.disaggregate = true;
  c.prefill = llmd_pick(in.prefill, in.request_blocks, rng);
  return c;
}

}  // namespace kvroute::sim
