#include "sim/policies.h"

#include <algorithm>
#include <limits>

namespace kvroute::sim {

void DynamoActive::add(uint32_t w, const std::vector<LocalBlockHash>& full, bool partial) {
  for (const auto& h : full) ++blocks_[w][h.value];
  partial_[w] += partial;
}

void DynamoActive::remove(uint32_t w, const std::vector<LocalBlockHash>& full, bool partial) {
  auto& m = blocks_[w];
  for (const auto& h : full)
    if (auto it = m.find(h.value); it != m.end() && --it->second == 0) m.erase(it);
  partial_[w] -= std::min<uint64_t>(partial_[w], partial);
}

double DynamoActive::potential(uint32_t w, const std::vector<LocalBlockHash>& full, bool partial) const {
  const auto& m = blocks_[w];
  // The request's blocks are a prefix chain: equal local hashes at equal
  // depth stand for equal blocks here (the sim's ids are prefix-unique).
  uint64_t fresh = 0;
  for (const auto& h : full) fresh += !m.count(h.value);
  return static_cast<double>(m.size() + partial_[w] + fresh + partial);
}

namespace {

// Index of the lowest (or highest) score, ties at random (reservoir sampling).
template <class Better>
size_t best_of(size_t n, std::mt19937_64& rng, const std::vector<double>& score, Better better) {
  size_t best = 0, ties = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i == 0 || better(score[i], score[best])) {
      best = i;
      ties = 1;
    } else if (score[i] == score[best] && rng() % ++ties == 0) {
      best = i;
    }
  }
  return best;
}

}  // namespace

size_t pick_dynamo(const RouteResult& route, const DynamoActive& active, const std::vector<LocalBlockHash>& full,
                   bool partial, uint32_t isl_tokens, uint32_t block_size, std::mt19937_64& rng) {
  constexpr double kOverlapScoreWeight = 1.0, kHostHit = 0.75, kDiskHit = 0.25;
  const auto& cands = route.candidates;
  std::vector<double> logit(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    const auto& c = cands[i];
    const auto& t = c.overlap_by_tier;
    const bool tiered = t[0] + t[1] + t[2] + t[3] > 0;
    const double credit = tiered ? t[0] + kHostHit * t[1] + kDiskHit * t[2] : c.overlap_blocks;
    const double raw_prefill_blocks = double(c.pending_prefill_tokens + isl_tokens) / block_size;
    const double prefill_blocks = std::max(0.0, raw_prefill_blocks - credit);
    logit[i] = kOverlapScoreWeight * prefill_blocks +
               active.potential(static_cast<uint32_t>(c.owner.worker.value), full, partial);
  }
  return best_of(cands.size(), rng, logit, [](double a, double b) { return a < b; });
}

size_t pick_llmd(const RouteResult& route, size_t request_blocks, std::mt19937_64& rng) {
  constexpr double kPrefixWeight = 3, kKvWeight = 2, kQueueWeight = 2;
  const auto& views = route.workers;
  uint32_t qmin = std::numeric_limits<uint32_t>::max(), qmax = 0;
  for (const auto& v : views) {
    qmin = std::min(qmin, v.info->load.num_requests_waiting);
    qmax = std::max(qmax, v.info->load.num_requests_waiting);
  }
  std::vector<double> score(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    const auto& l = views[i].info->load;  // scraped metrics, not the router's own bookkeeping
    const double prefix = request_blocks ? double(route.candidates[i].overlap_blocks) / double(request_blocks) : 0;
    const double kv = l.kv_total_blocks ? 1.0 - double(l.kv_active_blocks) / double(l.kv_total_blocks) : 1.0;
    const double queue = qmax == qmin ? 1.0 : double(qmax - l.num_requests_waiting) / double(qmax - qmin);
    score[i] = kPrefixWeight * prefix + kKvWeight * kv + kQueueWeight * queue;
  }
  return best_of(views.size(), rng, score, [](double a, double b) { return a > b; });
}

size_t pick_least_loaded(const std::vector<WorkerView>& views, std::mt19937_64& rng) {
  std::vector<double> load(views.size());
  for (size_t i = 0; i < views.size(); ++i)
    load[i] = double(views[i].predicted.request_active_slots) + views[i].predicted.num_requests_waiting;
  return best_of(views.size(), rng, load, [](double a, double b) { return a < b; });
}

}  // namespace kvroute::sim
