#include "router/routing.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>

#include "common/log.h"
#include "common/prefix_cache.h"
#include "indexer/block_hash.h"
#include "tokenizer/placeholder.h"

namespace kvroute {

std::optional<uint32_t> steered_rank(const WorkerAnnouncement& info, uint32_t overlap_blocks, uint32_t pool_blocks,
                                     uint32_t rank) {
  if (info.dp_size <= 1 || overlap_blocks == 0 || pool_blocks >= overlap_blocks || rank >= info.dp_size)
    return std::nullopt;
  return rank;
}

uint32_t claimed_tokens(uint32_t overlap_blocks, uint32_t isl_tokens, uint32_t block_size) {
  return static_cast<uint32_t>(cached_prefix_tokens(overlap_blocks, isl_tokens, block_size));
}

RouteTarget route_target(WorkerId worker, const WorkerAnnouncement& info, uint32_t overlap_blocks,
                         const std::array<uint32_t, kNumStorageTiers>& by_tier, uint32_t dp_rank, uint32_t isl_tokens,
                         uint32_t block_size) {
  const uint32_t cached = claimed_tokens(overlap_blocks, isl_tokens, block_size);
  RouteTarget t{worker, info.url, cached, isl_tokens - cached, overlap_blocks, overlap_blocks,
                steered_rank(info, overlap_blocks, pool_blocks(by_tier), dp_rank)};
  set_pool_share(t, overlap_blocks, by_tier, block_size);
  return t;
}

RouteTarget route_target_of(const RouteResult& r, const Candidate& c, const WorkerAnnouncement& info,
                            uint32_t block_size) {
  for (const InflightPrefix& p : r.inflight)
    if (p.worker == c.owner.worker && p.counted == c.overlap_blocks && p.held > c.overlap_blocks) {
      RouteTarget t = route_target(c.owner.worker, info, p.held, {}, c.owner.dp_rank, r.isl_tokens, block_size);
      // Its queue counts the new tokens the decision priced: the request waits
      // for the prefix, and reads all of it in its prefill and every decode step.
      t.prefill_tokens = r.isl_tokens - claimed_tokens(c.overlap_blocks, r.isl_tokens, block_size);
      t.resumed_blocks = c.overlap_blocks;
      return t;
    }
  return route_target(c.owner.worker, info, c.overlap_blocks, c.overlap_by_tier, c.owner.dp_rank, r.isl_tokens,
                      block_size);
}

const std::vector<uint64_t>& inflight_chain(const SchedulerConfig& s, const RouteResult& r) {
  static const std::vector<uint64_t> none;
  if (!inflight_distinct(s)) return none;  // read per call: a reload may change it between attempts
  // Hashed once: the chain is complete exactly when it has a key per block (reset() clears both).
  if (r.chain.size() != r.block_hashes.size()) r.chain = inflight_chain(r.block_hashes);
  return r.chain;
}

void set_pool_share(RouteTarget& t, uint32_t overlap_blocks, const std::array<uint32_t, kNumStorageTiers>& by_tier,
                    uint32_t block_size) {
  for (int p = 0; p < kMaxPools; ++p) {
    const uint32_t n = by_tier[kNumBaseTiers + p];
    if (n == 0) continue;
    const uint64_t own = uint64_t{overlap_blocks - std::min(n, overlap_blocks)} * block_size;
    t.pool = p;
    t.pool_tokens = t.cached_tokens > own ? static_cast<uint32_t>(t.cached_tokens - own) : 0;
    return;  // a worker mounts one pool at most
  }
}

ApiError route_error(RouteError e, const RouteResult& r, const RouteErrorDetail& d) {
  switch (e) {
    case RouteError::None: break;
    case RouteError::PromptExceedsKv:
      return ApiError{400,
                      fmt::format("This prompt needs {} KV blocks ({} tokens); the largest KV cache of the "
                                  "workers serving '{}' holds {} blocks.",
                                  r.request_blocks, r.isl_tokens, d.model, d.kv_capacity_blocks),
                      "invalid_request_error", "prompt", "context_length_exceeded"};
    case RouteError::ModelNotFound:
      return ApiError{404, fmt::format("The model `{}` does not exist.", d.model), "invalid_request_error", "model",
                      "model_not_found"};
    case RouteError::NoWorker:
      return ApiError{503, "No worker is available to serve this request.", "service_unavailable", "", "no_worker"};
    case RouteError::WorkersBusy:
      return ApiError{503, "Every worker is at capacity; retry later.", "service_unavailable", "", "workers_busy"};
    case RouteError::WorkersDrained:
      return ApiError{503,
                      fmt::format("Every worker serving `{}` is drained by an operator "
                                  "(POST /admin/workers/{{id}}/undrain); retry later.",
                                  d.model),
                      "service_unavailable", "", "workers_busy"};
    case RouteError::QueueFull:
      return ApiError{503, "Every worker is busy and the wait queue is full; retry later.", "service_unavailable", "",
                      "workers_busy"};
    case RouteError::QueueTimeout:
      return ApiError{503, fmt::format("No worker became free within {} ms; retry later.", d.queue_timeout_ms),
                      "service_unavailable", "", "workers_busy"};
  }
  return ApiError{};
}

void RouteResult::fail(RouteError e, const RouteErrorDetail& detail) {
  ok = false;
  failure = e;
  error = route_error(e, *this, detail);
}

void RouteResult::reset() {
  ok = false;
  failure = RouteError::None;
  error = {};
  ranked.clear();
  isl_tokens = 0;
  tokenizer_fallback = TokenizerFallback::None;
  token_source = TokenSource::Client;
  request_blocks = 0;
  block_hashes.clear();
  chain.clear();
  first_block.reset();
  salt_hash = 0;
  skips_prefix_cache = false;
  stage_seconds = {};
  chose_best_overlap = false;
  all_busy = false;
  slots_full = false;
  best_cached_tokens = 0;
  queue_wait_seconds.reset();
  band_reserve = 0;
  workers.clear();
  candidates.clear();
  decision.reset();
  pd.reset();
  inflight.clear();
}

std::vector<TokenId> RoutingService::tokens_of(const ParsedRequest& r, const TokenizerSet* tokenizers,
                                              TokenizerFallback* fallback, std::string* detail) {
  std::vector<TokenId> ids;
  const auto tokens = tokens_of(r, ids, tokenizers, fallback, detail);
  if (tokens.data() != ids.data()) ids.assign(tokens.begin(), tokens.end());  // the client's own ids
  return ids;
}

std::span<const TokenId> RoutingService::tokens_of(const ParsedRequest& r, std::vector<TokenId>& buffer,
                                                   const TokenizerSet* tokenizers, TokenizerFallback* fallback,
                                                   std::string* detail) {
  TokenSource source;
  return tokenize_request(r, buffer, tokenizers ? tokenizers->find(r.model) : nullptr, &source, fallback, detail);
}

std::span<const TokenId> RoutingService::tokenize_request(const ParsedRequest& r, std::vector<TokenId>& buffer,
                                                          const ModelTokenizer* mt, TokenSource* source,
                                                          TokenizerFallback* fallback, std::string* detail) {
  return kvroute::tokenize_request(r.prompt(), buffer, mt, source, fallback, detail);
}

const ModelTokenizer* RoutingService::local_tokenizer(std::string_view model) const {
  if (!tokenizers_ || tokenizers_->size() == 0) return nullptr;
  if (const ModelTokenizer* mt = tokenizers_->find(model)) return mt;
  if (!registry_.is_lora_adapter(model)) return nullptr;
  return tokenizers_->find(registry_.lora_base(model));
}

bool RoutingService::needs_engine_tokens(const Config& cfg, const ParsedRequest& r) const {
  if (r.has_prompt_tokens || cfg.tokenizer.remote != "auto") return false;
  const ModelTokenizer* mt = local_tokenizer(r.model);
  return !mt || (r.kind == ApiKind::ChatCompletions && !mt->chat_template());
}

namespace {
// A request routed on placeholder tokens: the first one of each model is
// always logged, later ones rate-limited (the metric counts every one).
void warn_placeholder(std::string_view model, TokenizerFallback why, std::string_view detail) {
  static std::mutex mu;
  static std::set<std::string, std::less<>> warned;  // bounded: models some worker serves
  static RateLimiter rl;
  bool first = false;
  {
    std::lock_guard lk(mu);
    if (warned.size() < 4096 && !warned.count(model)) first = warned.emplace(model).second;
  }
  if (!first && !rl.allow()) return;
  const char* hint = why == TokenizerFallback::EngineError
                         ? "the engine's POST /tokenize failed (kvroute_router_engine_tokenize_total)"
                     : why == TokenizerFallback::NoTokenizer
                         ? "no tokenizer.models entry, and the engine was not asked (tokenizer.remote off)"
                         : "the local tokenizer could not render it";
  spdlog::warn("model '{}': routed on placeholder tokens ({}{}{}: {}); cache hits are approximate", model,
               to_string(why), detail.empty() ? "" : ": ", detail, hint);
}
}  // namespace

namespace {
using StageClock = std::chrono::steady_clock;

// The blocks looked up in the index: none when the engine will not read its cache.
std::span<const LocalBlockHash> matchable(const RouteResult& r) {
  return r.skips_prefix_cache ? std::span<const LocalBlockHash>{} : std::span<const LocalBlockHash>(r.block_hashes);
}
double seconds_between(StageClock::time_point a, StageClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

RouteResult RoutingService::route(const ParsedRequest& request, bool rank_all) const {
  RouteResult out;
  route(request, out, rank_all);
  return out;
}

uint32_t RoutingService::hash_request(const ParsedRequest& request, uint32_t block_size, RouteResult& out,
                                      std::string* detail) const {
  const auto t0 = StageClock::now();
  thread_local std::vector<TokenId> buffer;  // per-thread scratch: no allocation per request
  const auto tokens = tokenize_request(request, buffer, local_tokenizer(request.model), &out.token_source,
                                       &out.tokenizer_fallback, detail);

  const auto t1 = StageClock::now();
  // The engine's cache namespace: a LoRA adapter named as the model, and the
  // request's cache_salt (indexer/block_hash.h), exactly as ZMQ events are hashed.
  const HashNamespace ns{registry_.is_lora_adapter(request.model) ? std::string_view(request.model) : std::string_view{},
                         request.cache_salt};
  hash_blocks(tokens, block_size, ns, out.block_hashes);
  out.skips_prefix_cache = request.prompt_logprobs;
  if (!out.block_hashes.empty()) {
    out.salt_hash = salt_hash(request.cache_salt);
    out.first_block = out.salt_hash == 0 ? out.block_hashes[0]
                                         : hash_block(tokens.subspan(0, block_size), block_hash_seed(ns.lora_name));
  }
  out.stage_seconds[0] = seconds_between(t0, t1);
  out.stage_seconds[1] = seconds_between(t1, StageClock::now());
  return static_cast<uint32_t>(tokens.size());
}

void RoutingService::route(const ParsedRequest& request, RouteResult& out, bool rank_all, bool score_all) const {
  out.reset();
  out.band_reserve = request.band_reserve;
  const auto cfg = config_.get();
  std::string detail;
  const uint32_t isl_tokens = hash_request(request, cfg->indexer.block_size, out, &detail);
  decide(*cfg, request.model, isl_tokens, rank_all, score_all, out);
  // Never silent: placeholder tokens make every cache overlap a guess. Only
  // for a model some worker serves (a client's unknown model is a 404).
  if (out.tokenizer_fallback != TokenizerFallback::None && out.ok)
    warn_placeholder(request.model, out.tokenizer_fallback, detail);
}

void RoutingService::route_blocks(std::string_view model, uint32_t isl_tokens, std::vector<LocalBlockHash> hashes,
                                  bool rank_all, RouteResult& out) const {
  out.reset();
  out.block_hashes = std::move(hashes);
  decide(*config_.get(), model, isl_tokens, rank_all, /*score_all=*/false, out);
}

void RoutingService::reroute(std::string_view model, RouteResult& out, bool score_all, bool serve_busy) const {
  std::vector<LocalBlockHash> hashes = std::move(out.block_hashes);
  std::vector<uint64_t> chain = std::move(out.chain);  // the same blocks: hashed once (inflight_chain())
  const auto first_block = out.first_block;
  const uint64_t salt = out.salt_hash;
  const bool skips = out.skips_prefix_cache;
  const uint32_t isl = out.isl_tokens;
  const TokenizerFallback fallback = out.tokenizer_fallback;
  const TokenSource source = out.token_source;
  const double stage0 = out.stage_seconds[0], stage1 = out.stage_seconds[1];
  const double reserve = out.band_reserve;
  out.reset();
  out.band_reserve = reserve;
  out.block_hashes = std::move(hashes);
  out.chain = std::move(chain);
  out.first_block = first_block;
  out.salt_hash = salt;
  out.skips_prefix_cache = skips;
  out.tokenizer_fallback = fallback;
  out.token_source = source;
  out.stage_seconds[0] = stage0;
  out.stage_seconds[1] = stage1;
  const auto cfg = config_.get();
  if (!serve_busy || cfg->scheduler.reject_when_busy) {
    decide(*cfg, model, isl, /*rank_all=*/false, score_all, out);
    return;
  }
  Config busy = *cfg;  // rare (a queue timeout): a copy rather than a flag through every stage
  busy.scheduler.queue_size = 0;
  decide(busy, model, isl, /*rank_all=*/false, score_all, out);
}

void RoutingService::decide(const Config& cfg, std::string_view model, uint32_t isl_tokens, bool rank_all,
                            bool score_all, RouteResult& out) const {
  const uint32_t block_size = cfg.indexer.block_size;
  out.isl_tokens = isl_tokens;
  out.request_blocks = (uint64_t{isl_tokens} + block_size - 1) / block_size;
  // A prompt larger than any worker's whole KV cache can never be served: 400
  // at once, before it is counted as any worker's load (its in-flight blocks
  // would make healthy workers look full to every other request).
  if (uint64_t capacity = 0; registry_.exceeds_kv_capacity(model, out.request_blocks, &capacity)) {
    out.fail(RouteError::PromptExceedsKv, RouteErrorDetail{.model = model, .kv_capacity_blocks = capacity});
    return;
  }
  const size_t limit = rank_all ? 0 : cfg.router.max_attempts;
  // A lower band's reserve: its busy thresholds lowered by the reserve, so
  // each worker keeps that much room for higher bands (router/README.md,
  // "Band reserves"). As Dynamo's policy classes carry their own busy
  // thresholds (lib/kv-router/src/scheduling/policy_config.rs,
  // PolicyClassConfig::worker_is_busy) and llm-d's flow control gates each
  // priority band at its own usage ceiling (llm-d-inference-scheduler
  // pkg/epp/flowcontrol/controller/internal/processor.go dispatchCycle(),
  // UsageLimitPolicy in pkg/epp/framework/interface/flowcontrol/plugins.go);
  // here per worker, not per pool: the reserve is room on an engine, where a
  // high-band request's time to first token is made.
  // The fleet's thresholds: its slot test lifted while the model's workers
  // have nearly every slot taken (scheduler.busy_slot_fleet_usage). A request
  // moved off a full worker then only fills another and recomputes there the
  // prompt cached where it was sent; the engine queues it for a slot, as the
  // every-worker-busy fallback below lets it. Not in a disaggregated fleet:
  // one share over its prefill and decode pools says nothing of either, and
  // decide_pd() judges each pool by the configured thresholds.
  SchedulerConfig lifted;
  const SchedulerConfig* fleet = &cfg.scheduler;
  double slot_share = 0;
  if (!registry_.has_pd_roles() && registry_.slots_full(model, cfg.scheduler, &slot_share)) {
    lifted = without_slot_limit(cfg.scheduler);
    fleet = &lifted;
    // A router queue or reject_when_busy holds or refuses a request when the
    // workers are busy. With the slot test lifted that is the fleet's share
    // reaching busy_slot_usage (at 1.0: every slot taken, as every worker
    // failing its own test would say), not one full worker: skipping a full
    // holder for a free worker recomputes its prompt there, and on a fleet
    // this loaded every such move adds work that only queues more.
    if ((cfg.scheduler.reject_when_busy || cfg.scheduler.queue_size > 0) &&
        slot_share >= cfg.scheduler.busy_slot_usage) {
      out.slots_full = true;
      out.fail(RouteError::WorkersBusy, RouteErrorDetail{.model = model});
      return;
    }
  }
  const SchedulerConfig* sched = fleet;
  SchedulerConfig reserved;
  if (out.band_reserve > 0) {
    reserved = cfg.scheduler;  // a reserve is room kept for higher bands: never lifted
    reserved.busy_slot_usage = std::min(reserved.busy_slot_usage, 1.0 - out.band_reserve);
    reserved.busy_kv_usage = std::min(reserved.busy_kv_usage, 1.0 - out.band_reserve);
    sched = &reserved;
  }
  // A disaggregated fleet: decide_pd() needs every candidate's terms. A
  // request with no prompt (the passthrough routes) is scored apart: the fast
  // path's ranking prices the parked KV, which it would not displace.
  if (registry_.has_pd_roles() || isl_tokens == 0) score_all = true;
  out.slots_full = sched == &lifted;
  if (fast_path_ && !score_all && !model.empty() && RankedCandidates::supports(*sched, limit) &&
      decide_ranked(cfg, *fleet, *sched, model, limit, out))
    return;
  decide_all(cfg, *fleet, *sched, model, rank_all, out);
}

double inflight_prefix_value(const SchedulerConfig& s, double load_mean, size_t holders, size_t workers) {
  const double spread = s.inflight_prefix_spread;
  if (spread > 0 && static_cast<double>(holders) >= std::max(2.0, std::ceil(spread * static_cast<double>(workers))))
    return s.inflight_prefix_weight;
  return s.inflight_prefix_weight * std::min(1.0, load_mean / s.inflight_prefix_load);
}

void RoutingService::inflight_owners(const SchedulerConfig& fleet, std::string_view model, RouteResult& r,
                                     uint32_t cached_blocks, std::vector<OwnerOverlap>& out) const {
  r.inflight.clear();
  if (fleet.inflight_prefix_weight <= 0 || !inflight_distinct(fleet) || r.skips_prefix_cache ||
      cached_blocks >= r.block_hashes.size())
    return;
  const size_t first = out.size();
  const auto eligible = registry_.inflight_overlaps(model, inflight_chain(fleet, r), cached_blocks, fleet, out);
  const double w = inflight_prefix_value(fleet, eligible.load_mean, out.size() - first, eligible.workers);
  // Its value as blocks: the cost prices an overlap by its blocks (all on the device).
  size_t kept = first;
  for (size_t i = first; i < out.size(); ++i)
    if (const auto blocks = static_cast<uint32_t>(out[i].blocks * w); blocks > 0) {
      r.inflight.push_back({out[i].owner.worker, out[i].blocks, blocks});
      out[kept++] = {out[i].owner, blocks, {}, out[i].blocks};
    }
  out.resize(kept);
}

// True when it decided (a choice), false to let decide_all() decide: nobody
// serves the model, or nobody is eligible (decide_all() tells why).
bool RoutingService::decide_ranked(const Config& cfg, const SchedulerConfig& fleet, const SchedulerConfig& sched,
                                   std::string_view model, size_t limit, RouteResult& out) const {
  const uint32_t block_size = cfg.indexer.block_size;
  auto t0 = StageClock::now();
  thread_local MatchLayers match;  // per-thread scratch, as fd
  index_.find_match_layers(matchable(out), match);
  inflight_owners(fleet, model, out, match.longest(), match.extra);  // an owner's longest entry counts
  auto t1 = StageClock::now();
  out.stage_seconds[2] = seconds_between(t0, t1);
  thread_local RankedDecision fd;  // per-thread scratch: no allocation per decision
  if (!registry_.decide(model, match, out.isl_tokens, block_size, fleet, random_, limit, fd, out.workers))
    return false;  // nobody serves the model: decide_all() tells 404 from 503
  // The fast path ranks by the fleet's thresholds; a band's reserve lowers
  // them: a ranking that holds a worker over them is decided again by
  // decide_all() (every worker scored under the lowered thresholds).
  if (&sched != &fleet)
    for (size_t i = 0; i < fd.ranked.size(); ++i)
      if (exclusion_of(fd.ranked[i].state.load, fd.ranked[i].state.draining, sched) != Exclusion::None) {
        out.workers.clear();
        return false;
      }
  Decision& d = out.decision;
  d.alpha = fd.alpha;
  d.load_mean = fd.load_mean;
  d.load_std = fd.load_std;
  out.candidates.reserve(fd.ranked.size());
  out.ranked.reserve(fd.ranked.size());
  for (size_t i = 0; i < fd.ranked.size(); ++i) {
    const RankedPick& p = fd.ranked[i];
    Candidate& c = out.candidates.emplace_back();
    c.owner = CacheOwner{p.worker, p.dp_rank};
    c.load = p.state.load;
    c.overlap_blocks = p.overlap_blocks;
    c.overlap_by_tier = p.overlap_by_tier;
    c.inflight_prefix_tokens = uint64_t{p.inflight_blocks} * block_size;
    c.pending_prefill_tokens = p.state.pending_prefill_tokens;
    c.slot_wait_tokens = p.state.slot_wait_tokens;
    c.draining = p.state.draining;
    c.parked_blocks = p.state.parked_blocks;
    c.evicted_blocks = p.state.evicted_blocks;
    c.pending_prefill_requests = out.workers[i].pending_prefill_requests;  // as decide_all()
    c.ttft = out.workers[i].ttft;
    c.role = out.workers[i].info->role;
    WorkerScore& s = d.scores.emplace_back(p.score);
    s.predicted_ttft_ms = predicted_ttft_ms(c, out.isl_tokens - s.cached_tokens);  // explain, affinity
    d.ranking.push_back(i);
    out.ranked.push_back(route_target_of(out, c, *out.workers[i].info, block_size));
  }
  out.stage_seconds[3] = seconds_between(t1, StageClock::now());
  if (fd.ranked.empty()) {
    // Nobody eligible (rare): decide_all() scores every worker and says why.
    out.candidates.clear();
    out.ranked.clear();
    out.workers.clear();
    out.decision.reset();
    return false;
  }
  d.chosen = 0;
  out.chose_best_overlap = fd.ranked.front().overlap_blocks == fd.best_overlap_blocks;
  out.best_cached_tokens = claimed_tokens(fd.best_overlap_blocks, out.isl_tokens, block_size);
  out.ok = true;
  return true;
}

void RoutingService::decide_all(const Config& cfg, const SchedulerConfig& fleet, const SchedulerConfig& sched,
                                std::string_view model, bool rank_all, RouteResult& out) const {
  const uint32_t block_size = cfg.indexer.block_size;
  const uint32_t isl_tokens = out.isl_tokens;
  registry_.candidates(model, out.workers);
  if (out.workers.empty()) {
    out.fail(registry_.candidates("").empty() ? RouteError::NoWorker : RouteError::ModelNotFound,
             RouteErrorDetail{.model = model});
    return;
  }
  auto t0 = StageClock::now();
  auto lap = [&](int stage) {
    const auto t = StageClock::now();
    out.stage_seconds[stage] = seconds_between(t0, t);
    t0 = t;
  };
  auto scores = index_.find_matches(matchable(out));
  inflight_owners(fleet, model, out, scores.longest(), scores.owners);  // the longest per worker counts
  lap(2);

  // A worker with several dp ranks is scored by its best rank's overlap
  // (most blocks, then the lowest rank: RankedCandidates's rule too).
  // Both lists are sorted by worker id (the registry's order), so one merge
  // pass pairs them: O(workers + owners log owners), no hashing.
  auto& owners = scores.owners;
  std::sort(owners.begin(), owners.end(), [](const OwnerOverlap& a, const OwnerOverlap& b) {
    if (a.owner.worker != b.owner.worker) return a.owner.worker < b.owner.worker;
    return a.blocks != b.blocks ? a.blocks > b.blocks : a.owner.dp_rank < b.owner.dp_rank;
  });
  out.candidates.reserve(out.workers.size());
  size_t k = 0;
  for (const auto& w : out.workers) {
    Candidate& c = out.candidates.emplace_back();
    c.owner.worker = w.info->id;
    c.load = w.predicted;
    c.pending_prefill_tokens = w.pending_prefill_tokens;
    c.slot_wait_tokens = w.slot_wait_tokens;
    c.draining = w.draining;
    // A request with no prompt allocates no KV and evicts nothing parked there.
    c.parked_blocks = isl_tokens ? w.parked_blocks : 0;
    c.evicted_blocks = w.evicted_blocks;
    c.pending_prefill_requests = w.pending_prefill_requests;  // scheduler.cost = predicted_ttft
    c.ttft = w.ttft;
    c.role = w.info->role;
    while (k < owners.size() && owners[k].owner.worker < w.info->id) ++k;
    if (k < owners.size() && owners[k].owner.worker == w.info->id) {  // first = best rank
      c.owner.dp_rank = owners[k].owner.dp_rank;
      c.overlap_blocks = owners[k].blocks;
      c.overlap_by_tier = owners[k].by_tier;
      c.inflight_prefix_tokens = uint64_t{owners[k].inflight_blocks} * block_size;
    }
  }

  schedule(out.candidates, out.isl_tokens, block_size, sched, random_, rank_all ? 0 : cfg.router.max_attempts,
           out.decision);
  if (!out.decision.chosen && !cfg.scheduler.reject_when_busy && cfg.scheduler.queue_size == 0) {
    // Every worker not drained is busy. The prompt fits some worker's cache
    // (decide() checked), and an engine whose KV or batch is full queues the
    // request itself (vLLM's scheduler waits for free blocks; cached blocks no
    // running request holds are free to it), so a momentarily full fleet is
    // no reason to refuse: rank the busy workers by the same cost (the least
    // loaded, cache hits considered, first). Rejecting is the operator's
    // choice (reject_when_busy, or a queue with a deadline).
    schedule(out.candidates, out.isl_tokens, block_size, without_busy_limits(cfg.scheduler), random_,
             rank_all ? 0 : cfg.router.max_attempts, out.decision);
    out.all_busy = out.decision.chosen.has_value();
  }
  lap(3);
  if (!out.decision.chosen) {
    // The same code either way (a drained worker may come back: queued
    // requests wait for it too); the message says which.
    const bool all_drained = std::all_of(out.decision.scores.begin(), out.decision.scores.end(),
                                         [](const WorkerScore& s) { return s.excluded == Exclusion::Draining; });
    out.fail(all_drained ? RouteError::WorkersDrained : RouteError::WorkersBusy, RouteErrorDetail{.model = model});
    return;
  }
  out.ranked.reserve(out.decision.ranking.size());
  for (size_t i : out.decision.ranking) {
    const auto& c = out.candidates[i];
    out.ranked.push_back(route_target_of(out, c, *out.workers[i].info, block_size));
  }
  uint32_t best_overlap = 0;
  for (size_t i = 0; i < out.candidates.size(); ++i)
    if (out.decision.scores[i].excluded == Exclusion::None)
      best_overlap = std::max(best_overlap, out.candidates[i].overlap_blocks);
  out.chose_best_overlap = out.candidates[*out.decision.chosen].overlap_blocks == best_overlap;
  out.best_cached_tokens = claimed_tokens(best_overlap, isl_tokens, block_size);
  out.ok = true;
}

void RoutingService::decide_pd(const ParsedRequest& request, RouteResult& out) const {
  out.pd.reset();
  if (!out.ok || std::none_of(out.candidates.begin(), out.candidates.end(),
                              [](const Candidate& c) { return c.role != WorkerRole::Both; }))
    return;
  const auto cfg = config_.get();
  const uint32_t block_size = cfg->indexer.block_size;
  PdRequest req;
  req.isl_tokens = out.isl_tokens;
  req.block_size = block_size;
  req.request_blocks = out.request_blocks;
  req.single_consumer = request.prompts <= 1 && request.n <= 1;
  PdDecision d = kvroute::decide_pd(out.candidates, req, cfg->scheduler, cfg->pd, random_);
  // An SGLang decode server cannot run a request alone (its scheduler waits
  // for a bootstrap room; SGLang answers "Disaggregated request received
  // without bootstrap room id"), and Dynamo's conditional disaggregation is
  // not offered on SGLang for the same reason: a request the decision would
  // run whole on a decode-role worker is split whenever a prefill worker can
  // take it.
  if (d.decode && !d.disaggregate && out.candidates[*d.decode].role == WorkerRole::Decode &&
      pd_protocol_of(cfg->pd, request.model) == PdProtocol::Sglang &&
      (d.reason == PdReason::FewUncachedTokens || d.reason == PdReason::PrefillPoolBusy ||
       d.reason == PdReason::PolicyNever || d.reason == PdReason::MultipleConsumers)) {
    // The single-consumer rule is vLLM's (one kv_transfer_params per
    // response); SGLang's room carries the whole request to its decode side.
    PdConfig always = cfg->pd;
    always.policy = "always";
    PdRequest whole = req;
    whole.single_consumer = true;
    if (PdDecision split = kvroute::decide_pd(out.candidates, whole, cfg->scheduler, always, random_); split.disaggregate)
      d = std::move(split);
  }
  if (!d.decode) {
    // Nobody on the decode side: the ranking stays as routed (prefill
    // workers serve a request whole), unless the decode side is all busy and
    // the operator refuses busy work.
    if (d.decode_all_busy) out.fail(RouteError::WorkersBusy, RouteErrorDetail{.model = request.model});
    return;
  }
  out.pd.active = true;
  out.pd.reason = d.reason;
  const size_t limit = cfg->router.max_attempts;
  auto target_of = [&](size_t i) {
    const Candidate& c = out.candidates[i];
    return route_target_of(out, c, *out.workers[i].info, block_size);
  };
  out.ranked.clear();
  for (size_t k = 0; k < d.decode_ranking.size() && k < limit; ++k) out.ranked.push_back(target_of(d.decode_ranking[k]));
  out.decision.chosen = *d.decode;
  if (!d.disaggregate) return;
  out.pd.disaggregate = true;
  for (size_t k = 0; k < d.prefill_ranking.size() && k < limit; ++k) {
    out.pd.prefill.push_back(target_of(d.prefill_ranking[k]));
    out.pd.bootstrap_ports.push_back(out.workers[d.prefill_ranking[k]].info->bootstrap_port);
  }
  if (out.pd.prefill.empty()) out.pd.disaggregate = false;
}

}  // namespace kvroute
