#include "scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/prefix_cache.h"

namespace kvroute {

std::string_view to_string(Exclusion e) {
  switch (e) {
    case Exclusion::None: return "none";
    case Exclusion::NoFreeSlot: return "no_free_slot";
    case Exclusion::NoFreeBlock: return "no_free_block";
    case Exclusion::TooManyWaiting: return "too_many_waiting";
    case Exclusion::Draining: return "draining";
  }
  return "none";
}

namespace {

double ratio(double num, double den) { return den > 0 ? num / den : 0.0; }

// One eligible candidate in the ranking: by cost, then by random tie-break key.
struct Ranked {
  double cost;
  uint64_t tie;
  size_t index;
};

}  // namespace

namespace {
// A busy threshold above 1 (set only by without_busy_limits(); the config
// keys are 0.01-1) turns that dimension's exclusion off, full workers included.
constexpr double kNoBusyLimit = 2.0;
}  // namespace

SchedulerConfig without_busy_limits(const SchedulerConfig& cfg) {
  SchedulerConfig c = cfg;
  c.busy_kv_usage = c.busy_slot_usage = kNoBusyLimit;
  c.busy_waiting_requests = 0;
  return c;
}

SchedulerConfig without_slot_limit(const SchedulerConfig& cfg) {
  SchedulerConfig c = cfg;
  c.busy_slot_usage = kNoBusyLimit;
  return c;
}

Exclusion exclusion_of(const WorkerLoad& l, bool draining, const SchedulerConfig& cfg) {
  if (draining) return Exclusion::Draining;
  // A worker that reports a total of 0 does not report that dimension.
  if (cfg.busy_slot_usage < kNoBusyLimit && l.request_total_slots > 0 &&
      (l.request_active_slots >= l.request_total_slots ||
       ratio(l.request_active_slots, l.request_total_slots) >= cfg.busy_slot_usage))
    return Exclusion::NoFreeSlot;
  if (cfg.busy_kv_usage < kNoBusyLimit && l.kv_total_blocks > 0 &&
      (l.kv_active_blocks >= l.kv_total_blocks ||
       ratio(static_cast<double>(l.kv_active_blocks), static_cast<double>(l.kv_total_blocks)) >= cfg.busy_kv_usage))
    return Exclusion::NoFreeBlock;
  if (cfg.busy_waiting_requests > 0 && l.num_requests_waiting >= cfg.busy_waiting_requests)
    return Exclusion::TooManyWaiting;
  return Exclusion::None;
}

double tier_weighted_blocks(uint32_t overlap_blocks, const std::array<uint32_t, kNumStorageTiers>& t,
                            const SchedulerConfig& cfg) {
  uint32_t sum = 0;
  for (uint32_t n : t) sum += n;
  if (sum == 0) return overlap_blocks * cfg.tier_weight_device;
  double w = t[0] * cfg.tier_weight_device + t[1] * cfg.tier_weight_host_pinned + t[2] * cfg.tier_weight_disk +
             t[3] * cfg.tier_weight_external;
  // A shared pool's block costs its load time (config.h, tier_weight_pool).
  for (int p = 0; p < kMaxPools; ++p) w += t[kNumBaseTiers + p] * cfg.tier_weight_pool[p];
  return w;
}

// scheduler.cost = predicted_ttft: the expected time to first token on this
// candidate (ms): waiting behind its in-flight prefill, then the prefill of the
// uncached suffix (a host or disk hit counts as the fraction of a recompute
// its tier weight leaves), from the worker's online model (ttft_model.h).
double predicted_ttft_ms(const Candidate& c, double new_tokens) {
  return c.ttft.predict_ms(TtftFeatures{new_tokens, static_cast<double>(c.pending_prefill_tokens),
                                        static_cast<double>(c.pending_prefill_requests),
                                        static_cast<double>(c.load.request_active_slots)});
}

void Decision::reset() {
  chosen.reset();
  ranking.clear();
  scores.clear();
  alpha = load_mean = load_std = 0;
  sampled = false;
}

Decision schedule(const std::vector<Candidate>& candidates, uint32_t isl_tokens, uint32_t block_size,
                  const SchedulerConfig& cfg, Random& random, size_t rank_limit) {
  Decision d;
  schedule(candidates, isl_tokens, block_size, cfg, random, rank_limit, d);
  return d;
}

void schedule(const std::vector<Candidate>& candidates, uint32_t isl_tokens, uint32_t block_size,
              const SchedulerConfig& cfg, Random& random, size_t rank_limit, Decision& d) {
  d.reset();
  d.scores.resize(candidates.size());
  // The eligible candidates in index order, then sorted by cost. Per-thread
  // scratch (schedule() runs on every io thread): no allocation per decision.
  thread_local std::vector<Ranked> order;
  order.clear();
  uint32_t max_waiting = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto& l = candidates[i].load;
    auto& s = d.scores[i];
    s.excluded = exclusion_of(l, candidates[i].draining, cfg);
    if (s.excluded != Exclusion::None) continue;
    order.push_back({0, 0, i});
    s.load_ratio = kv_load_ratio(l, candidates[i].parked_blocks);
    max_waiting = std::max(max_waiting, l.num_requests_waiting);
  }
  if (order.empty()) return;

  double sum = 0;
  for (const auto& r : order) sum += d.scores[r.index].load_ratio;
  d.load_mean = sum / static_cast<double>(order.size());
  double var = 0;
  for (const auto& r : order) {
    const double dev = d.scores[r.index].load_ratio - d.load_mean;
    var += dev * dev;
  }
  d.load_std = std::sqrt(var / static_cast<double>(order.size()));
  d.alpha = load_uneven(d.load_std, d.load_mean, cfg) ? cfg.alpha_imbalanced : cfg.alpha_balanced;

  // Order by cost; equal costs in random order (a random tie-break key per
  // worker id from one draw of the injected randomness, so a seed reproduces
  // the ranking).
  const uint64_t draw = random.below(~0ull);
  const double isl = std::max<uint32_t>(isl_tokens, 1);
  const bool predicted_cost = cfg.cost == "predicted_ttft";
  for (auto& r : order) {
    const auto& c = candidates[r.index];
    auto& s = d.scores[r.index];
    s.cached_tokens =
        cached_prefix_tokens(tier_weighted_blocks(c.overlap_blocks, c.overlap_by_tier, cfg), isl_tokens, block_size);
    const double new_tokens = isl_tokens - s.cached_tokens;
    s.load_deviation = s.load_ratio - d.load_mean;
    s.prefill_ratio = (new_tokens + priced_pending(static_cast<double>(c.pending_prefill_tokens + c.slot_wait_tokens),
                                                   static_cast<double>(c.inflight_prefix_tokens), s.cached_tokens, cfg)) /
                      isl;
    s.slot_ratio = ratio(c.load.request_active_slots, c.load.request_total_slots);
    s.queue_ratio = max_waiting > 0 ? static_cast<double>(c.load.num_requests_waiting) / max_waiting : 0.0;
    s.eviction_share = eviction_share(c.evicted_blocks, c.load.kv_total_blocks);
    s.predicted_ttft_ms = predicted_ttft_ms(c, new_tokens);
    if (predicted_cost) {
      // Both costs keep the load terms (KV, slots, queue) and the eviction
      // term: TTFT alone fills a worker's KV and slots with the requests that
      // hit its cache. (Never on the fast path: RankedCandidates::supports()
      // refuses this cost.)
      const double load = d.alpha * s.load_deviation + cfg.gamma * s.slot_ratio + cfg.delta * s.queue_ratio;
      s.cost = load + eviction_term(new_tokens / isl, s.eviction_share, cfg) + s.predicted_ttft_ms / 1000.0;
      r.cost = s.cost;
    } else {
      r.cost = ranking_cost(d.alpha, s.load_ratio, s.prefill_ratio, s.slot_ratio, s.queue_ratio, cfg) +
               eviction_term(new_tokens / isl, s.eviction_share, cfg);
      s.cost = r.cost - d.alpha * d.load_mean;
    }
    r.tie = tie_key(draw, c.owner.worker);
  }
  auto better = [](const Ranked& a, const Ranked& b) { return a.cost != b.cost ? a.cost < b.cost : a.tie < b.tie; };
  // With softmax sampling every eligible worker may be drawn: rank them all.
  const size_t limit = rank_limit && cfg.temperature <= 0 ? std::min(rank_limit, order.size()) : order.size();
  // Tie keys of distinct workers collide with probability 2^-64, so both
  // sorts give the one order; a full sort is cheaper when all are ranked.
  if (limit < order.size())
    std::partial_sort(order.begin(), order.begin() + static_cast<long>(limit), order.end(), better);
  else
    std::sort(order.begin(), order.end(), better);
  d.ranking.reserve(limit);
  for (size_t k = 0; k < limit; ++k) d.ranking.push_back(order[k].index);

  if (cfg.temperature > 0 && d.ranking.size() > 1) {
    // Softmax over -cost/T, shifted by the best cost for numerical stability.
    const double best = order.front().cost;
    std::vector<double> w(d.ranking.size());
    double total = 0;
    for (size_t k = 0; k < d.ranking.size(); ++k) total += w[k] = std::exp(-(order[k].cost - best) / cfg.temperature);
    double x = random.unit() * total;
    size_t pick = d.ranking.size() - 1;
    for (size_t k = 0; k < w.size(); ++k) {
      if (x < w[k]) { pick = k; break; }
      x -= w[k];
    }
    // The sampled worker goes first; failover continues by cost.
    std::rotate(d.ranking.begin(), d.ranking.begin() + static_cast<long>(pick),
                d.ranking.begin() + static_cast<long>(pick) + 1);
    d.sampled = true;
  }
  d.chosen = d.ranking.front();
}

}  // namespace kvroute
