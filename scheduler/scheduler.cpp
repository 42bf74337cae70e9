#include "scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvroute {

std::string_view to_string(Exclusion e) {
  switch (e) {
    case Exclusion::None: return "none";
    case Exclusion::NoFreeSlot: return "no_free_slot";
    case Exclusion::NoFreeBlock: return "no_free_block";
  }
  return "none";
}

namespace {
double ratio(double num, double den) { return den > 0 ? num / den : 0.0; }
}  // namespace

Decision schedule(const std::vector<Candidate>& candidates, uint32_t isl_tokens, uint32_t block_size,
                  const SchedulerConfig& cfg, Random& random) {
  Decision d;
  d.scores.resize(candidates.size());
  std::vector<size_t> eligible;
  eligible.reserve(candidates.size());
  uint32_t max_waiting = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto& l = candidates[i].load;
    auto& s = d.scores[i];
    // A worker that reports no capacity (total 0) is not treated as full:
    // it simply does not report that dimension.
    if (l.request_total_slots > 0 && l.request_active_slots >= l.request_total_slots)
      s.excluded = Exclusion::NoFreeSlot;
    else if (l.kv_total_blocks > 0 && l.kv_active_blocks >= l.kv_total_blocks)
      s.excluded = Exclusion::NoFreeBlock;
    if (s.excluded != Exclusion::None) continue;
    eligible.push_back(i);
    s.load_ratio = ratio(static_cast<double>(l.kv_active_blocks), static_cast<double>(l.kv_total_blocks));
    max_waiting = std::max(max_waiting, l.num_requests_waiting);
  }
  if (eligible.empty()) return d;

  double sum = 0;
  for (size_t i : eligible) sum += d.scores[i].load_ratio;
  d.load_mean = sum / static_cast<double>(eligible.size());
  double var = 0;
  for (size_t i : eligible) var += std::pow(d.scores[i].load_ratio - d.load_mean, 2);
  d.load_std = std::sqrt(var / static_cast<double>(eligible.size()));
  d.alpha = d.load_std > cfg.balance_threshold * d.load_mean ? cfg.alpha_imbalanced : cfg.alpha_balanced;

  const double isl = std::max<uint32_t>(isl_tokens, 1);
  for (size_t i : eligible) {
    const auto& c = candidates[i];
    auto& s = d.scores[i];
    const double cached = std::min<double>(static_cast<double>(c.overlap_blocks) * block_size, isl_tokens);
    s.load_deviation = s.load_ratio - d.load_mean;
    s.prefill_ratio = (isl_tokens - cached) / isl;
    s.slot_ratio = ratio(c.load.request_active_slots, c.load.request_total_slots);
    s.queue_ratio = max_waiting > 0 ? static_cast<double>(c.load.num_requests_waiting) / max_waiting : 0.0;
    s.cost = d.alpha * s.load_deviation + (1 - d.alpha) * s.prefill_ratio + cfg.gamma * s.slot_ratio +
             cfg.delta * s.queue_ratio;
  }

  // Shuffle first, then a stable sort: equal costs end up in random order.
  d.ranking = eligible;
  for (size_t i = d.ranking.size(); i > 1; --i) std::swap(d.ranking[i - 1], d.ranking[random.below(i)]);
  std::stable_sort(d.ranking.begin(), d.ranking.end(),
                   [&](size_t a, size_t b) { return d.scores[a].cost < d.scores[b].cost; });
  d.chosen = d.ranking.front();
  return d;
}

}  // namespace kvroute
