#include "router/explain.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/json_escape.h"
#include "scheduler/pd_decision.h"

namespace kvroute {

namespace {

std::string num(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

// A percentage a person reads: 97, 4.5, 0.017.
std::string pct(double ratio) {
  const double v = ratio * 100;
  if (v == 0) return "0";
  if (v >= 10) return fmt::format("{:.0f}", v);
  if (v >= 1) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2g}", v);
}

std::string cost_text(double c) { return fmt::format("{:.3f}", c); }

double kv_usage(const WorkerLoad& l) {
  return l.kv_total_blocks ? static_cast<double>(l.kv_active_blocks) / static_cast<double>(l.kv_total_blocks) : 0;
}

std::string who(const Candidate& c) {
  return c.owner.dp_rank ? fmt::format("worker {} (dp rank {})", c.owner.worker.value, c.owner.dp_rank)
                         : fmt::format("worker {}", c.owner.worker.value);
}

std::string holds(const Candidate& c, size_t blocks) {
  if (blocks == 0) return "the prompt fills no complete block, so no worker can hold any of it";
  return fmt::format("holds {} of {} blocks", c.overlap_blocks, blocks);
}

std::string excluded_because(const Candidate& c, Exclusion e, const SchedulerConfig& cfg) {
  const auto& l = c.load;
  switch (e) {
    case Exclusion::Draining: return "is drained by an operator";
    case Exclusion::NoFreeSlot:
      return fmt::format("has no free request slot ({} of {} busy; scheduler.busy_slot_usage {})",
                         l.request_active_slots, l.request_total_slots, cfg.busy_slot_usage);
    case Exclusion::NoFreeBlock:
      return fmt::format("is at {} % KV usage (limit scheduler.busy_kv_usage {} %)", pct(kv_usage(l)),
                         pct(cfg.busy_kv_usage));
    case Exclusion::TooManyWaiting:
      return fmt::format("has {} requests waiting (limit scheduler.busy_waiting_requests {})",
                         l.num_requests_waiting, cfg.busy_waiting_requests);
    case Exclusion::None: break;
  }
  return "is eligible";
}

// The cost term that most separates candidate i from the chosen one, in words.
std::string costlier_because(const RouteResult& r, size_t i, size_t chosen, const SchedulerConfig& cfg) {
  const auto& d = r.decision;
  const auto& s = d.scores[i];
  const auto& s0 = d.scores[chosen];
  const auto& c = r.candidates[i];
  const auto& c0 = r.candidates[chosen];
  const double isl = std::max<uint32_t>(r.isl_tokens, 1);
  const double parts[5] = {d.alpha * (s.load_deviation - s0.load_deviation),
                           (1 - d.alpha) * (s.prefill_ratio - s0.prefill_ratio),
                           cfg.gamma * (s.slot_ratio - s0.slot_ratio), cfg.delta * (s.queue_ratio - s0.queue_ratio),
                           eviction_term((r.isl_tokens - s.cached_tokens) / isl, s.eviction_share, cfg) -
                               eviction_term((r.isl_tokens - s0.cached_tokens) / isl, s0.eviction_share, cfg)};
  const size_t k = static_cast<size_t>(std::max_element(parts, parts + 5) - parts);
  if (parts[k] <= 0) return "no single term";
  switch (k) {
    case 0: return fmt::format("higher KV usage ({} % against {} %)", pct(s.load_ratio), pct(s0.load_ratio));
    case 1: {
      // The prefill term is the new tokens plus the queue as priced: name the larger difference.
      const double more_new = s0.cached_tokens - s.cached_tokens;
      const double more_queued = (s.prefill_ratio - s0.prefill_ratio) * std::max<uint32_t>(r.isl_tokens, 1) - more_new;
      if (s.cached_tokens != s0.cached_tokens && more_new >= more_queued)
        return fmt::format("more to prefill ({:.0f} prompt tokens cached against {:.0f})", s.cached_tokens,
                           s0.cached_tokens);
      if (c.slot_wait_tokens > c0.slot_wait_tokens)
        return fmt::format("every request slot taken ({} of {}: a wait priced as {} tokens of queue against {})",
                           c.load.request_active_slots, c.load.request_total_slots, c.slot_wait_tokens,
                           c0.slot_wait_tokens);
      return fmt::format("more prefill already in flight ({} pending tokens against {})", c.pending_prefill_tokens,
                         c0.pending_prefill_tokens);
    }
    case 2:
      return fmt::format("more busy request slots ({} of {} against {} of {})", c.load.request_active_slots,
                         c.load.request_total_slots, c0.load.request_active_slots, c0.load.request_total_slots);
    case 4:
      return fmt::format("a cache turning over faster ({} % of its KV evicted lately against {} %)",
                         pct(s.eviction_share), pct(s0.eviction_share));
    default:
      return fmt::format("more waiting requests ({} against {})", c.load.num_requests_waiting,
                         c0.load.num_requests_waiting);
  }
}

std::string worker_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += i + 1 == names.size() ? " and " : ", ";
    out += names[i];
  }
  return out;
}

// Ranked candidates whose cost equals the chosen one's (the chosen included).
std::vector<size_t> tied_with_choice(const RouteResult& r) {
  const auto& d = r.decision;
  std::vector<size_t> tied;
  const double c = d.scores[*d.chosen].cost;
  for (size_t k : d.ranking)
    if (d.scores[k].cost == c) tied.push_back(k);
  if (tied.size() < 2) return {};
  std::sort(tied.begin(), tied.end(), [&](size_t a, size_t b) { return r.candidates[a].owner < r.candidates[b].owner; });
  return tied;
}

// Rounding noise (a spread of 1e-17 over equal loads) printed as 0.
double denoise(double v) { return std::abs(v) < 1e-12 ? 0.0 : v; }

std::string alpha_sentence(const Decision& d, const SchedulerConfig& cfg) {
  const double limit = cfg.balance_threshold * d.load_mean;
  if (d.alpha == cfg.alpha_balanced && d.load_std <= limit)
    return fmt::format(
        "Alpha {} (the cache weighs more than load): the eligible workers' KV usage is balanced (spread load_std "
        "{:.3g} <= scheduler.balance_threshold {} x mean {:.3g}).",
        d.alpha, denoise(d.load_std), cfg.balance_threshold, denoise(d.load_mean));
  if (cfg.alpha_imbalanced == cfg.alpha_balanced)  // uneven, but no switch to describe
    return fmt::format(
        "Alpha {} whatever the load spread (scheduler.alpha_imbalanced = alpha_balanced: no switch; spread load_std "
        "{:.3g} > scheduler.balance_threshold {} x mean {:.3g}).",
        d.alpha, denoise(d.load_std), cfg.balance_threshold, denoise(d.load_mean));
  std::string s = fmt::format(
      "Alpha {} (load weighs more than the cache): the eligible workers' KV usage is imbalanced (spread load_std "
      "{:.3g} > scheduler.balance_threshold {} x mean {:.3g}).",
      d.alpha, denoise(d.load_std), cfg.balance_threshold, denoise(d.load_mean));
  if (d.load_std < 0.01)
    s += fmt::format(
        " That spread is {} percentage points, tiny in absolute terms: the threshold is relative to the mean, so a "
        "nearly idle fleet switches to the load-weighted alpha on noise.",
        pct(d.load_std));
  return s;
}

std::string nobody_sentence(const RouteResult& r, const SchedulerConfig& cfg) {
  if (r.candidates.empty() && !r.ok && r.slots_full)  // decide(): the fleet's slots, before any scoring
    return fmt::format(
        "The model's workers have their request slots taken as a whole (their share at or over "
        "scheduler.busy_slot_usage {}, with the slot test lifted at scheduler.busy_slot_fleet_usage {}): the "
        "request waits in the router's queue (scheduler.queue_size) or is refused (scheduler.reject_when_busy).",
        cfg.busy_slot_usage, cfg.busy_slot_fleet_usage);
  if (r.candidates.empty()) return r.ok ? "No worker serves this model." : r.error.message;
  std::vector<std::string> why;
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const auto e = r.decision.scores.empty() ? Exclusion::None : r.decision.scores[i].excluded;
    why.push_back(who(r.candidates[i]) + " " + excluded_because(r.candidates[i], e, cfg));
  }
  return "No worker can take the request now: " + worker_list(why) + ".";
}

// The whole decision in words: the choice, better-cached workers passed over,
// ties, sampling, alpha.
std::string choice_sentence(const RouteResult& r, const SchedulerConfig& cfg, size_t blocks) {
  const auto& d = r.decision;
  if (!d.chosen) return nobody_sentence(r, cfg);
  const size_t ch = *d.chosen;
  const auto& c0 = r.candidates[ch];
  const auto& s0 = d.scores[ch];
  std::string out = fmt::format("{} {}: {} ({:.0f} of {} prompt tokens cached) at {} % KV usage; cost {}",
                                d.sampled ? "Drew" : "Chose", who(c0), holds(c0, blocks), s0.cached_tokens,
                                r.isl_tokens, pct(s0.load_ratio), cost_text(s0.cost));
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const auto& c = r.candidates[i];
    if (i == ch || c.overlap_blocks <= c0.overlap_blocks) continue;
    const auto& s = d.scores[i];
    if (s.excluded != Exclusion::None)
      out += fmt::format("; {} holds {} but {}", who(c), c.overlap_blocks, excluded_because(c, s.excluded, cfg));
    else
      out += fmt::format("; {} holds {} but costs more ({}: {})", who(c), c.overlap_blocks, cost_text(s.cost),
                         costlier_because(r, i, ch, cfg));
  }
  out += ".";
  if (const auto tied = tied_with_choice(r); !tied.empty()) {
    std::vector<std::string> names;
    for (size_t k : tied) names.push_back(who(r.candidates[k]));
    out += fmt::format(" Tie: {} have the same cost ({}); equal costs are ordered at random, so {} was picked by "
                       "chance among them.",
                       worker_list(names), cost_text(s0.cost), who(c0));
  }
  if (d.sampled) {
    size_t best = d.ranking.front();
    for (size_t k : d.ranking)
      if (d.scores[k].cost < d.scores[best].cost) best = k;
    out += fmt::format(
        " Sampled: scheduler.temperature {} > 0 draws a worker with probability proportional to exp(-cost / "
        "temperature); the lowest cost was {} ({}).",
        cfg.temperature, who(r.candidates[best]), cost_text(d.scores[best].cost));
  }
  if (r.slots_full)
    out += fmt::format(
        " The model's workers have nearly all their request slots taken (at or over "
        "scheduler.busy_slot_fleet_usage {}): the slot test skips nobody, so a full worker's engine queues the request "
        "for a slot rather than another worker recomputing the prompt cached there.",
        cfg.busy_slot_fleet_usage);
  return out + " " + alpha_sentence(d, cfg);
}

std::string worker_sentence(const RouteResult& r, size_t i, int rank, const SchedulerConfig& cfg, size_t blocks) {
  const auto& d = r.decision;
  const auto& c = r.candidates[i];
  const auto& s = d.scores[i];
  if (s.excluded != Exclusion::None)
    return fmt::format("excluded: {}; it {}", excluded_because(c, s.excluded, cfg), holds(c, blocks));
  const std::string facts = fmt::format("{} at {} % KV usage; cost {}", holds(c, blocks), pct(s.load_ratio),
                                        cost_text(s.cost));
  if (rank < 0) return fmt::format("eligible, not ranked (routing ranks only router.max_attempts workers): {}", facts);
  if (rank == 0) return fmt::format("{}: {}", d.sampled ? "chosen by softmax sampling" : "chosen, lowest cost", facts);
  const size_t ch = *d.chosen;
  const double diff = s.cost - d.scores[ch].cost;
  if (diff == 0) return fmt::format("rank {}: {}, the same as the choice (a tie, ordered at random)", rank + 1, facts);
  if (diff < 0)
    return fmt::format("rank {}: {}, lower than the choice's: softmax sampling drew {}", rank + 1, facts,
                       who(r.candidates[ch]));
  return fmt::format("rank {}: {}, {} more than the choice, mostly for {}", rank + 1, facts, cost_text(diff),
                     costlier_because(r, i, ch, cfg));
}

std::string load_json(const WorkerLoad& l) {
  return fmt::format(
      R"({{"request_active_slots":{},"request_total_slots":{},"num_requests_waiting":{},"kv_active_blocks":{},"kv_total_blocks":{},"kv_usage":{}}})",
      l.request_active_slots, l.request_total_slots, l.num_requests_waiting, l.kv_active_blocks, l.kv_total_blocks,
      num(kv_usage(l)));
}

std::string candidate_json(const RouteResult& r, size_t i, int rank, const std::string& reason) {
  const auto& d = r.decision;
  const auto& c = r.candidates[i];
  const auto& s = d.scores.empty() ? WorkerScore{} : d.scores[i];
  const auto& t = c.overlap_by_tier;
  // The rank the request would name; null when a worker of several ranks
  // loads its whole prefix from a shared pool (any rank can: the engine picks).
  std::string dp_rank = std::to_string(c.owner.dp_rank);
  if (i < r.workers.size() && r.workers[i].info->dp_size > 1 &&
      !steered_rank(*r.workers[i].info, c.overlap_blocks, pool_blocks(t), c.owner.dp_rank) && c.overlap_blocks > 0)
    dp_rank = "null";
  return fmt::format(
      R"({{"worker_id":{},"url":"{}","role":"{}","dp_rank":{},"overlap_blocks":{},"overlap_by_tier":{{"device":{},"host_pinned":{},"disk":{},"external":{},"pool":{}}},)"
      R"("cached_tokens":{},"reported_load":{},"predicted_load":{},"pending_prefill_tokens":{},"slot_wait_tokens":{},"parked_blocks":{},"excluded":{},"rank":{},)"
      R"("terms":{{"load_ratio":{},"load_deviation":{},"prefill_ratio":{},"slot_ratio":{},"queue_ratio":{},"eviction_share":{}}},"cost":{},"reason":"{}",)"
      R"("predicted_ttft_ms":{}}})",
      c.owner.worker.value, i < r.workers.size() ? json_escape(r.workers[i].info->url) : "",
      to_string(i < r.workers.size() ? r.workers[i].info->role : c.role), dp_rank, c.overlap_blocks, t[0], t[1], t[2], t[3], pool_blocks(t), num(s.cached_tokens),
      i < r.workers.size() ? load_json(r.workers[i].info->load) : "null", load_json(c.load),
      c.pending_prefill_tokens, c.slot_wait_tokens, std::llround(c.parked_blocks),
      s.excluded == Exclusion::None ? std::string("null") : fmt::format("\"{}\"", to_string(s.excluded)),
      rank < 0 ? std::string("null") : std::to_string(rank + 1), num(s.load_ratio), num(s.load_deviation),
      num(s.prefill_ratio), num(s.slot_ratio), num(s.queue_ratio), num(s.eviction_share),
      s.excluded == Exclusion::None && rank >= 0 ? num(s.cost) : "null", json_escape(reason),
      s.excluded == Exclusion::None ? num(s.predicted_ttft_ms) : "null");  // scheduler/ttft_model.h
}

}  // namespace

// Which tokenization the overlaps rest on, when it is not the client's ids.
std::string tokenization_sentence(const RouteResult& r) {
  switch (r.token_source) {
    case TokenSource::Client: return {};
    case TokenSource::Local: return " Tokens from kvroute's tokenizer of the model (tokenizer.models).";
    case TokenSource::Engine: return " Tokens from the engine's own POST /tokenize (tokenizer.remote).";
    case TokenSource::Placeholder:
      return fmt::format(
          " Tokenized with the placeholder ({}), not the model's tokenizer: the overlaps are approximate "
          "(configure tokenizer.models, or keep tokenizer.remote auto).",
          to_string(r.tokenizer_fallback));
  }
  return {};
}

ExplainText explain_text(const RouteResult& r, const SchedulerConfig& cfg, uint32_t /*block_size*/) {
  const size_t blocks = r.block_hashes.size();
  ExplainText out;
  out.choice = choice_sentence(r, cfg, blocks) + tokenization_sentence(r);
  if (r.decision.scores.size() != r.candidates.size()) {
    out.per_worker.assign(r.candidates.size(), "not scored");
    return out;
  }
  std::vector<int> rank(r.candidates.size(), -1);
  for (size_t k = 0; k < r.decision.ranking.size(); ++k) rank[r.decision.ranking[k]] = static_cast<int>(k);
  for (size_t i = 0; i < r.candidates.size(); ++i) out.per_worker.push_back(worker_sentence(r, i, rank[i], cfg, blocks));
  return out;
}

std::string explain_json(const RouteResult& r, std::string_view model, uint32_t block_size,
                         const SchedulerConfig& cfg, const ExplainText* given) {
  const auto& d = r.decision;
  const ExplainText text = given ? *given : explain_text(r, cfg, block_size);
  std::string out = fmt::format(
      R"({{"model":"{}","isl_tokens":{},"request_blocks":{},"block_size":{},"alpha":{},"load_mean":{},"load_std":{},"reason":"{}",)",
      json_escape(model), r.isl_tokens, r.block_hashes.size(), block_size, num(d.alpha), num(d.load_mean),
      num(d.load_std), json_escape(text.choice));
  if (d.chosen) out += fmt::format(R"("chosen":{},"sampled":{},)", r.candidates[*d.chosen].owner.worker.value, d.sampled);
  else out += R"("chosen":null,"sampled":false,)";
  out += fmt::format(R"("slots_full":{},)", r.slots_full);
  out += R"("tie":[)";
  if (d.chosen) {
    const auto tied = tied_with_choice(r);
    for (size_t k = 0; k < tied.size(); ++k)
      out += fmt::format("{}{}", k ? "," : "", r.candidates[tied[k]].owner.worker.value);
  }
  out += "],";
  if (!r.ok) out += fmt::format(R"("error":{},)", error_body(r.error));
  out += fmt::format(R"("tokenization":"{}","tokenizer_fallback":"{}",)", to_string(r.token_source),
                     to_string(r.tokenizer_fallback));
  // How long the request waited in the flow queue for this route (a
  // queued request's decision only).
  if (r.queue_wait_seconds) out += fmt::format(R"("queue_wait_ms":{},)", num(*r.queue_wait_seconds * 1e3));
  out += fmt::format(R"("stage_us":{{"tokenize":{},"hash":{},"find_matches":{},"score":{}}},)",
                     num(r.stage_seconds[0] * 1e6), num(r.stage_seconds[1] * 1e6),
                     num(r.stage_seconds[2] * 1e6), num(r.stage_seconds[3] * 1e6));
  // Ranked first (rank 1 = chosen), then the rest in candidate order.
  std::vector<int> rank(r.candidates.size(), -1);
  for (size_t k = 0; k < d.ranking.size(); ++k) rank[d.ranking[k]] = static_cast<int>(k);
  std::vector<size_t> order(d.ranking.begin(), d.ranking.end());
  for (size_t i = 0; i < r.candidates.size(); ++i)
    if (rank[i] < 0) order.push_back(i);
  out += R"("workers":[)";
  for (size_t k = 0; k < order.size(); ++k) {
    if (k) out += ',';
    const size_t i = order[k];
    out += candidate_json(r, i, rank[i], i < text.per_worker.size() ? text.per_worker[i] : "");
  }
  out += "]}";
  return out;
}

std::string pd_explain_json(const RouteResult& r, uint32_t block_size, bool single_consumer,
                            const SchedulerConfig& sched, const PdConfig& pd) {
  if (std::none_of(r.candidates.begin(), r.candidates.end(),
                   [](const Candidate& c) { return c.role != WorkerRole::Both; }))
    return "";
  PdRequest req;
  req.isl_tokens = r.isl_tokens;
  req.block_size = block_size;
  req.request_blocks = r.request_blocks;
  req.single_consumer = single_consumer;
  SeededRandom random(r.isl_tokens);  // explain only: a fixed tie-break per prompt length
  const PdDecision d = decide_pd(r.candidates, req, sched, pd, random);
  auto id = [&](std::optional<size_t> i) {
    return i ? std::to_string(r.candidates[*i].owner.worker.value) : std::string("null");
  };
  auto ids = [&](const std::vector<size_t>& v) {
    std::string out = "[";
    for (size_t k = 0; k < v.size(); ++k)
      out += fmt::format("{}{}", k ? "," : "", r.candidates[v[k]].owner.worker.value);
    return out + "]";
  };
  std::string out = fmt::format(
      R"({{"disaggregate":{},"reason":"{}","decode":{},"prefill":{},"decode_uncached_tokens":{},"policy":"{}",)"
      R"("min_uncached_tokens":{},"prefill_busy_tokens":{},"decode_all_busy":{},"prefill_all_busy":{},)"
      R"("decode_ranking":{},"prefill_ranking":{})",
      d.disaggregate, to_string(d.reason), id(d.decode), id(d.prefill), num(d.decode_uncached_tokens),
      json_escape(pd.policy), pd.min_uncached_tokens, pd.prefill_busy_tokens, d.decode_all_busy, d.prefill_all_busy,
      ids(d.decode_ranking), ids(d.prefill_ranking));
  // The decode gate: its threshold, the decode worker's KV usage with the
  // request (null when unknown or the decision stopped before pricing it) and
  // whether it vetoed running the request whole.
  out += fmt::format(R"(,"decode_busy_kv_usage":{},"decode_kv_usage":{},"decode_busy":{})",
                     num(pd.decode_busy_kv_usage),
                     d.decode_kv_usage < 0 ? std::string("null") : num(d.decode_kv_usage), d.decode_busy);
  // The alpha the decode side was ranked with: pd.decode_alpha, or the scheduler's when it is -1.
  out += fmt::format(R"(,"decode_alpha":{})", num(d.decode_alpha));
  // The prediction rule, only while it is on (conditional, ratio > 0): both
  // predicted times and the transfer, null when the decision ended before the
  // prediction (it runs last, once a prefill worker is ranked).
  if (pd.policy == "conditional" && pd.aggregate_time_ratio > 0) {
    const bool predicted = d.disaggregate || d.reason == PdReason::AggregatedFaster;
    auto ms = [&](double v) { return predicted ? num(v) : std::string("null"); };
    out += fmt::format(
        R"(,"aggregate_time_ratio":{},"transfer_ms_per_1k_tokens":{},"predicted_aggregated_ms":{},)"
        R"("predicted_split_ms":{},"transfer_ms":{})",
        num(pd.aggregate_time_ratio), num(pd.transfer_ms_per_1k_tokens), ms(d.predicted_aggregated_ms),
        ms(d.predicted_split_ms), ms(d.transfer_ms));
  }
  out += R"(,"decode_workers":[)";
  for (size_t k = 0; k < d.decode_terms.size(); ++k) {
    const auto& t = d.decode_terms[k];
    const auto& c = r.candidates[t.candidate];
    out += fmt::format(
        R"({}{{"worker_id":{},"role":"{}","cached_tokens":{},"uncached_tokens":{},"kv_headroom_blocks":{},)"
        R"("lacks_headroom":{},"excluded":{},"cost":{}}})",
        k ? "," : "", c.owner.worker.value, to_string(c.role), num(t.cached_tokens), num(t.uncached_tokens),
        t.kv_headroom_blocks, t.lacks_headroom,
        t.score.excluded == Exclusion::None ? std::string("null") : fmt::format("\"{}\"", to_string(t.score.excluded)),
        t.lacks_headroom || t.score.excluded != Exclusion::None ? std::string("null") : num(t.score.cost));
  }
  out += R"(],"prefill_workers":[)";
  for (size_t k = 0; k < d.prefill_terms.size(); ++k) {
    const auto& t = d.prefill_terms[k];
    out += fmt::format(
        R"({}{{"worker_id":{},"excluded":{},"cached_tokens":{},"new_tokens":{},"queued_tokens":{},)"
        R"("queued_requests":{},"predicted_ttft_ms":{}}})",
        k ? "," : "", r.candidates[t.candidate].owner.worker.value,
        t.excluded == Exclusion::None ? std::string("null") : fmt::format("\"{}\"", to_string(t.excluded)),
        num(t.cached_tokens), num(t.new_tokens), t.queued_tokens, t.queued_requests, num(t.predicted_ttft_ms));
  }
  return out + "]}";
}

}  // namespace kvroute
