#include "scheduler/pd_decision.h"

#include <algorithm>

#include "common/prefix_cache.h"

namespace kvroute {

std::string_view to_string(PdReason r) {
  switch (r) {
    case PdReason::Disaggregated: return "disaggregated";
    case PdReason::PolicyNever: return "policy_never";
    case PdReason::NoDecodeWorker: return "no_decode_worker";
    case PdReason::AggregatedWorker: return "aggregated_worker";
    case PdReason::FewUncachedTokens: return "few_uncached_tokens";
    case PdReason::NoPrefillWorker: return "no_prefill_worker";
    case PdReason::PrefillPoolBusy: return "prefill_pool_busy";
    case PdReason::MultipleConsumers: return "multiple_consumers";
    case PdReason::AggregatedFaster: return "aggregated_faster";
  }
  return "no_decode_worker";
}

namespace {

double cached_tokens_of(const Candidate& c, const PdRequest& r, const SchedulerConfig& cfg) {
  return cached_prefix_tokens(tier_weighted_blocks(c.overlap_blocks, c.overlap_by_tier, cfg), r.isl_tokens,
                              r.block_size);
}

// Step 1: the decode worker, by schedule()'s cost over the decode side among
// the workers with KV headroom for what they would hold of the request.
void choose_decode(const std::vector<Candidate>& candidates, const PdRequest& r, const SchedulerConfig& cfg,
                   Random& random, PdDecision& d) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (c.role == WorkerRole::Prefill) continue;
    PdDecodeTerms t;
    t.candidate = i;
    t.cached_tokens = cached_tokens_of(c, r, cfg);
    t.uncached_tokens = std::max(0.0, r.isl_tokens - t.cached_tokens);
    if (c.load.kv_total_blocks > 0 && r.request_blocks > 0) {
      // Blocks it already holds are shared with the request, not allocated again.
      const auto held = static_cast<uint64_t>(t.cached_tokens) / std::max<uint32_t>(r.block_size, 1);
      const int64_t needed = static_cast<int64_t>(r.request_blocks) - static_cast<int64_t>(held);
      const int64_t free_blocks = static_cast<int64_t>(c.load.kv_total_blocks) -
                                  static_cast<int64_t>(std::min(c.load.kv_active_blocks, c.load.kv_total_blocks));
      t.kv_headroom_blocks = free_blocks - needed;
    } else {
      t.kv_headroom_blocks = -1;  // unknown: never left out for it
    }
    d.decode_terms.push_back(t);
  }
  if (d.decode_terms.empty()) return;
  // A worker that reports no KV total (or a request of unknown size) is never left out for headroom.
  auto known = [&](const PdDecodeTerms& t) {
    return candidates[t.candidate].load.kv_total_blocks > 0 && r.request_blocks > 0;
  };
  const bool someone_fits = std::any_of(d.decode_terms.begin(), d.decode_terms.end(), [&](const PdDecodeTerms& t) {
    return !known(t) || t.kv_headroom_blocks >= 0;
  });
  std::vector<Candidate> side;
  std::vector<size_t> side_terms;  // side index -> decode_terms index
  for (size_t k = 0; k < d.decode_terms.size(); ++k) {
    auto& t = d.decode_terms[k];
    t.lacks_headroom = someone_fits && known(t) && t.kv_headroom_blocks < 0;
    if (t.lacks_headroom) continue;
    side.push_back(candidates[t.candidate]);
    side_terms.push_back(k);
  }
  Decision dec;
  schedule(side, r.isl_tokens, r.block_size, cfg, random, 0, dec);
  if (!dec.chosen && !cfg.reject_when_busy) {
    schedule(side, r.isl_tokens, r.block_size, without_busy_limits(cfg), random, 0, dec);
    d.decode_all_busy = dec.chosen.has_value();
  } else if (!dec.chosen) {
    d.decode_all_busy = true;
  }
  for (size_t s = 0; s < side.size(); ++s) d.decode_terms[side_terms[s]].score = dec.scores[s];
  d.decode_alpha = dec.alpha;
  if (!dec.chosen) return;
  for (size_t s : dec.ranking) d.decode_ranking.push_back(d.decode_terms[side_terms[s]].candidate);
  d.decode = d.decode_ranking.front();
  for (const auto& t : d.decode_terms)
    if (t.candidate == *d.decode) d.decode_uncached_tokens = t.uncached_tokens;
}

// Step 3's terms: every prefill worker priced by its predicted time to first
// token for this request (cached prefix, queue, fitted model).
void price_prefill(const std::vector<Candidate>& candidates, const PdRequest& r, const SchedulerConfig& cfg,
                   PdDecision& d) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (c.role != WorkerRole::Prefill) continue;
    PdPrefillTerms t;
    t.candidate = i;
    t.excluded = exclusion_of(c.load, c.draining, cfg);
    t.cached_tokens = cached_tokens_of(c, r, cfg);
    t.new_tokens = std::max(0.0, r.isl_tokens - t.cached_tokens);
    t.queued_tokens = c.pending_prefill_tokens;
    t.queued_requests = c.pending_prefill_requests;
    t.predicted_ttft_ms = predicted_ttft_ms(c, t.new_tokens);
    d.prefill_terms.push_back(t);
  }
}

// The prefill workers `admit` lets in, by predicted TTFT, random among equals.
template <class Admit>
std::vector<size_t> rank_prefill(const std::vector<Candidate>& candidates, const PdDecision& d, uint64_t draw,
                                 Admit&& admit) {
  struct Ranked {
    double cost;
    uint64_t tie;
    size_t candidate;
  };
  std::vector<Ranked> order;
  for (const auto& t : d.prefill_terms)
    if (admit(t))
      order.push_back({t.predicted_ttft_ms, tie_key(draw, candidates[t.candidate].owner.worker), t.candidate});
  std::sort(order.begin(), order.end(),
            [](const Ranked& a, const Ranked& b) { return a.cost != b.cost ? a.cost < b.cost : a.tie < b.tie; });
  std::vector<size_t> out;
  out.reserve(order.size());
  for (const auto& o : order) out.push_back(o.candidate);
  return out;
}

// The decode worker's KV usage were it to run the request whole: its active
// blocks plus the request's blocks it does not hold, over its total; −1 when
// either is unknown (Dynamo's decode gate: potential decode blocks over
// total_kv_blocks, lib/kv-router/src/conditional_disagg.rs @088ca50).
double decode_kv_usage(const Candidate& c, const PdRequest& r, const PdDecodeTerms& t) {
  if (c.load.kv_total_blocks == 0 || r.request_blocks == 0) return -1;
  const auto held = static_cast<uint64_t>(t.cached_tokens) / std::max<uint32_t>(r.block_size, 1);
  const uint64_t needed = r.request_blocks > held ? r.request_blocks - held : 0;
  return double(c.load.kv_active_blocks + needed) / double(c.load.kv_total_blocks);
}

}  // namespace

PdDecision decide_pd(const std::vector<Candidate>& candidates, const PdRequest& r, const SchedulerConfig& cfg,
                     const PdConfig& pd, Random& random) {
  PdDecision d;
  // The decode side's own weighting (pd.decode_alpha): its KV holds every
  // decode it runs, while its cached prefix only shortens a transfer.
  SchedulerConfig decode_cfg;
  const SchedulerConfig* dc = &cfg;
  if (pd.decode_alpha >= 0) {
    decode_cfg = cfg;
    decode_cfg.alpha_balanced = decode_cfg.alpha_imbalanced = pd.decode_alpha;
    dc = &decode_cfg;
  }
  choose_decode(candidates, r, *dc, random, d);
  price_prefill(candidates, r, cfg, d);
  if (!d.decode) {
    d.reason = PdReason::NoDecodeWorker;
    return d;
  }
  const bool conditional = pd.policy == "conditional";
  auto aggregated = [&](PdReason why) {
    d.reason = why;
    return d;
  };
  if (candidates[*d.decode].role == WorkerRole::Both) return aggregated(PdReason::AggregatedWorker);
  if (pd.policy == "never") return aggregated(PdReason::PolicyNever);
  if (!r.single_consumer) return aggregated(PdReason::MultipleConsumers);
  const bool any_prefill = std::any_of(d.prefill_terms.begin(), d.prefill_terms.end(),
                                       [](const PdPrefillTerms& t) { return t.excluded != Exclusion::Draining; });
  if (!any_prefill) return aggregated(PdReason::NoPrefillWorker);
  for (const auto& t : d.decode_terms)
    if (t.candidate == *d.decode) d.decode_kv_usage = decode_kv_usage(candidates[*d.decode], r, t);
  // Dynamo's decode gate: a busy decode worker never takes a whole request
  // (its decodes would share steps with the prefill and its KV would fill);
  // an unknown usage is not busy (kvroute does not deny for a missing report).
  d.decode_busy = conditional && pd.decode_busy_kv_usage > 0 && d.decode_kv_usage > pd.decode_busy_kv_usage;
  const bool may_run_whole = conditional && !d.decode_busy;
  if (may_run_whole && d.decode_uncached_tokens < pd.min_uncached_tokens)
    return aggregated(PdReason::FewUncachedTokens);

  const uint64_t draw = random.below(~0ull);
  auto ranking = rank_prefill(candidates, d, draw, [](const PdPrefillTerms& t) { return t.excluded == Exclusion::None; });
  if (ranking.empty()) {
    if (conditional) return aggregated(PdReason::PrefillPoolBusy);
    // always: the busy prefill workers queue it (drained ones never take work).
    ranking = rank_prefill(candidates, d, draw, [](const PdPrefillTerms& t) { return t.excluded != Exclusion::Draining; });
    d.prefill_all_busy = true;
  }
  if (may_run_whole && pd.prefill_busy_tokens > 0 &&
      candidates[ranking.front()].pending_prefill_tokens >= pd.prefill_busy_tokens)
    return aggregated(PdReason::PrefillPoolBusy);
  if (conditional) {
    // Both pools' predictions: whole on the decode worker (its TTFT model
    // prices its queue and its running decodes) against the best prefill
    // worker's plus the transfer of what the decode worker lacks.
    d.transfer_ms = d.decode_uncached_tokens * pd.transfer_ms_per_1k_tokens / 1000.0;
    for (const auto& t : d.prefill_terms)
      if (t.candidate == ranking.front()) d.predicted_split_ms = t.predicted_ttft_ms + d.transfer_ms;
    d.predicted_aggregated_ms = predicted_ttft_ms(candidates[*d.decode], d.decode_uncached_tokens);
    if (may_run_whole && pd.aggregate_time_ratio > 0 &&
        d.predicted_aggregated_ms <= pd.aggregate_time_ratio * d.predicted_split_ms)
      return aggregated(PdReason::AggregatedFaster);
  }
  d.disaggregate = true;
  d.reason = PdReason::Disaggregated;
  d.prefill_ranking = std::move(ranking);
  d.prefill = d.prefill_ranking.front();
  return d;
}

}  // namespace kvroute
