// One routing decision: request -> tokens -> block hashes -> overlap per
// worker (index) -> scheduler -> ranked workers. No I/O: the HTTP layer sends
// the request; route explain (admin) will call the same function.
//
// Thread-safe: called concurrently from every HTTP io thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "config/config_store.h"
#include "indexer/indexer.h"
#include "router/openai_request.h"
#include "scheduler/pd_decision.h"
#include "scheduler/scheduler.h"
#include "fleet/worker_registry.h"
#include "tokenizer/model_tokenizer.h"
#include "tokenizer/request_tokens.h"

namespace kvroute {

// Why a request has no worker. Each maps to one client-facing error
// (route_error(): status, OpenAI code and message, written in one place) and
// to one label of kvroute_router_rejected_total where one applies.
enum class RouteError : uint8_t {
  None,
  PromptExceedsKv,  ///< 400 context_length_exceeded: more KV blocks than any worker of the model holds
  ModelNotFound,    ///< 404 model_not_found: no worker serves the model (others serve other models)
  NoWorker,         ///< 503 no_worker: no worker is available at all
  WorkersBusy,      ///< 503 workers_busy: every worker of the model is at capacity
  WorkersDrained,   ///< 503 workers_busy: every worker of the model is drained by an operator
  QueueFull,        ///< 503 workers_busy: busy, and the wait queue (scheduler.queue_size) is full
  QueueTimeout,     ///< 503 workers_busy: busy, and no worker became free within scheduler.queue_timeout_ms
};
// True for a busy fleet (busy or drained workers): the request may wait in
// the queue for a worker to become free (or undrained).
constexpr bool may_queue(RouteError e) { return e == RouteError::WorkersBusy || e == RouteError::WorkersDrained; }

// The prompt tokens a worker holding `overlap_blocks` of the prompt's leading
// blocks serves from its cache, as its engine counts them
// (common/prefix_cache.h): what x-kvroute-cached-tokens, explain and the
// status page claim.
uint32_t claimed_tokens(uint32_t overlap_blocks, uint32_t isl_tokens, uint32_t block_size);

struct RouteTarget {
  WorkerId worker;
  std::string_view url;  // in the worker's announcement, kept alive by RouteResult::workers
  uint32_t cached_tokens = 0;  // matched prefix length per the index
  uint32_t prefill_tokens = 0; // tokens the worker must still prefill (predicted load)
  // The prompt's leading blocks in the worker's cache (any tier), for
  // in-flight accounting (inflight_shared_blocks()).
  uint32_t cached_blocks = 0;
  // Of them, what the request takes back from the worker's parked KV
  // (InflightKv::resumed_blocks): the cached prefix as the decision counted it.
  uint32_t resumed_blocks = 0;
  // The data-parallel rank holding the cached prefix, for a worker with
  // dp_size > 1 and a cache hit (sent as X-data-parallel-rank); none: the
  // engine's own DP balancer picks.
  std::optional<uint32_t> dp_rank;
  // Of cached_tokens, those the worker loads from a shared pool (the end of
  // its prefix: indexer/pool_index.h), and which pool (-1: none).
  int pool = -1;
  uint32_t pool_tokens = 0;
};

// What in-flight accounting (InflightGuard) shares of a request's prompt
// with the worker's other in-flight requests (scheduler.inflight_kv):
// inflight_prompt(), its complete blocks, each counted once per worker
// ("distinct"); else inflight_shared_blocks(), the worker's cached prefix
// of it ("prefix_once", given the target's `cached_blocks`); else nothing
// ("whole").
inline bool inflight_distinct(const SchedulerConfig& s) { return s.inflight_kv == "distinct"; }
inline uint32_t inflight_shared_blocks(const SchedulerConfig& s, uint32_t cached_blocks) {
  return s.inflight_kv == "prefix_once" ? cached_blocks : 0;
}
inline uint32_t inflight_shared_blocks(const SchedulerConfig& s, const RouteTarget& t) {
  return inflight_shared_blocks(s, t.cached_blocks);
}
inline std::span<const LocalBlockHash> inflight_prompt(const SchedulerConfig& s, std::span<const LocalBlockHash> blocks) {
  return inflight_distinct(s) ? blocks : std::span<const LocalBlockHash>{};
}

// Sets `t`'s pool share from the owner's overlap by tier.
void set_pool_share(RouteTarget& t, uint32_t overlap_blocks, const std::array<uint32_t, kNumStorageTiers>& by_tier,
                    uint32_t block_size);

// The rank a target names: `rank` when the worker has several and that rank
// holds some of the prompt itself. None when the worker's prefix is all in a
// shared pool (`pool_blocks` of `overlap_blocks`): every rank of a member
// loads it alike, so the engine's DP balancer picks, as without a hit.
std::optional<uint32_t> steered_rank(const WorkerAnnouncement& info, uint32_t overlap_blocks, uint32_t pool_blocks,
                                     uint32_t rank);

// The target for `worker` (announced as `info`) whose best rank `dp_rank`
// holds `overlap_blocks` of the prompt (`by_tier`: in which tiers): its
// claimed cached tokens, the rest of the prompt to prefill, the rank to name
// and the pool share.
RouteTarget route_target(WorkerId worker, const WorkerAnnouncement& info, uint32_t overlap_blocks,
                         const std::array<uint32_t, kNumStorageTiers>& by_tier, uint32_t dp_rank, uint32_t isl_tokens,
                         uint32_t block_size);

// What the client-facing message of a RouteError names besides the
// RouteResult's own figures.
struct RouteErrorDetail {
  std::string_view model;
  uint64_t kv_capacity_blocks = 0;  // PromptExceedsKv: the largest KV cache of the model's workers
  uint32_t queue_timeout_ms = 0;    // QueueTimeout
};

// A disaggregated fleet's part of a decision (the model has workers of role
// prefill or decode; RoutingService::decide_pd()).
struct PdRoute {
  bool active = false;        // the model's workers have PD roles: RouteResult::ranked holds the decode side only
  bool disaggregate = false;  // split: a prefill worker of `prefill` computes the prompt first
  PdReason reason = PdReason::NoDecodeWorker;
  std::vector<RouteTarget> prefill;        // the prefill ranking, best first (the failover order)
  std::vector<uint32_t> bootstrap_ports;   // parallel to `prefill`: each one's SGLang bootstrap port

  void reset() {
    active = disaggregate = false;
    reason = PdReason::NoDecodeWorker;
    prefill.clear();
    bootstrap_ports.clear();
  }
};

// A worker's prefix of the prompt in flight from this router, as one
// decision counted it (RoutingService::inflight_owners()).
struct InflightPrefix {
  WorkerId worker;
  uint32_t held = 0;     // leading blocks its in-flight requests hold
  uint32_t counted = 0;  // the overlap it counted as (scheduler.inflight_prefix_weight)
};

struct RouteResult {
  bool ok = false;
  RouteError failure = RouteError::None;  // when !ok: why
  ApiError error;                    // when !ok: what the client is told (from `failure`, by fail())
  std::vector<RouteTarget> ranked;   // best first; the proxy fails over along it
  uint32_t isl_tokens = 0;
  // Set when the placeholder tokenized the request instead of the model's own
  // tokenizer (none configured, no chat template, template error).
  TokenizerFallback tokenizer_fallback = TokenizerFallback::None;
  TokenSource token_source = TokenSource::Client;
  uint64_t request_blocks = 0;       // KV blocks the request will occupy (for in-flight accounting)
  std::vector<LocalBlockHash> block_hashes;  // the request's complete blocks
  // The first complete block hashed without the cache_salt, and the salt's
  // salt_hash() (0: none): what a dispatch records for attributing an
  // engine's root blocks to tenants (events/salt_attribution.h).
  std::optional<LocalBlockHash> first_block;
  uint64_t salt_hash = 0;
  // The engine will not read its prefix cache (prompt_logprobs): nothing is
  // matched, nothing claimed; the blocks are still hashed (it stores them).
  bool skips_prefix_cache = false;
  // Time spent per stage: tokenize, hash, find_matches, score (seconds).
  std::array<double, 4> stage_seconds{};
  // True when the chosen worker has the longest cached prefix among the eligible.
  bool chose_best_overlap = false;
  // True when every worker serving the model was busy (over a scheduler.busy_*
  // threshold or full) and the request was ranked among the busy ones
  // (scheduler.reject_when_busy false, queue_size 0): their engines queue it.
  bool all_busy = false;
  // True when the model's workers had nearly all their request slots taken
  // (scheduler.busy_slot_fleet_usage) and the slot test passed over nobody.
  bool slots_full = false;
  // The longest cached prefix among eligible workers (tokens): with the chosen
  // worker's cached tokens, the decision-quality gap metric.
  uint32_t best_cached_tokens = 0;
  // Seconds the request waited in the flow queue before this route was
  // found (set by the proxy after its wait; explain's `queue_wait_ms`);
  // nullopt: it did not wait.
  std::optional<double> queue_wait_seconds;
  // The request band's reserve (ParsedRequest::band_reserve): a worker whose
  // slot or KV usage is at or over 1 - band_reserve is busy for this request.
  // Kept by reroute(), so a queued request's trials apply it too.
  double band_reserve = 0;
  // For explain and metrics (parallel vectors): every candidate for explain
  // and the reference path; only the ranked workers on the fast path
  // (decision.chosen and decision.ranking index them either way).
  std::vector<WorkerView> workers;
  std::vector<Candidate> candidates;
  Decision decision;
  PdRoute pd;  // set by RoutingService::decide_pd()
  // The in-flight prefixes this decision counted. A target whose overlap is
  // one of them claims the blocks held (what its engine will find cached
  // once they are computed), not their value (route_target_of()).
  std::vector<InflightPrefix> inflight;
  // inflight_chain(s, route)'s chain, hashed on its first use (then one key
  // per block of block_hashes); a route is read by its request's thread only.
  mutable std::vector<uint64_t> chain;

  // Back to a default-constructed RouteResult, keeping the vectors' capacity.
  void reset();
  // No worker, because of `e`: sets `failure` and the client's `error`
  // (route_error()).
  void fail(RouteError e, const RouteErrorDetail& detail);
};

// route_target() for candidate `c` of route `r` (announced as `info`): an
// overlap that is an in-flight prefix (RouteResult::inflight) claims the
// blocks held there, on the device, while its prefill_tokens stay the new
// tokens the decision priced (the prefix at its counted value).
RouteTarget route_target_of(const RouteResult& r, const Candidate& c, const WorkerAnnouncement& info,
                            uint32_t block_size);

// What one block of a prompt prefix in flight on a worker counts for against
// a cached block (RoutingService::inflight_owners()): scheduler.
// inflight_prefix_weight in full once `holders` workers compute it and they
// are at least inflight_prefix_spread of the model's `workers` eligible
// ones, and at least two (another copy would take an engine's prefill and
// finish no sooner than the copies under way, and the requests sharing the
// prefix have several to spread over); else scaled by min(1, load_mean /
// inflight_prefix_load).
double inflight_prefix_value(const SchedulerConfig& s, double load_mean, size_t holders, size_t workers);

// The chain in-flight accounting counts for a routed request (InflightKv::
// chain: inflight_chain() of inflight_prompt()), hashed once per route: a
// request's failover attempts, its queue slot and both legs of a split
// request copy it.
const std::vector<uint64_t>& inflight_chain(const SchedulerConfig& s, const RouteResult& r);
// The KV a request of route `r` holds on its target `t` while in flight, as
// the registry counts it: `blocks` of prompt, `shared_blocks` of them the
// worker's cached prefix counted once (prefix_once), the route's chain
// (distinct), and the cached prefix it takes back from the parked KV.
inline InflightKv route_inflight_kv(const SchedulerConfig& s, const RouteResult& r, const RouteTarget& t,
                                    uint64_t blocks, uint64_t shared_blocks) {
  return InflightKv{blocks, shared_blocks, inflight_chain(s, r), t.resumed_blocks, {}};
}

// The error the client gets for `e` (status, OpenAI type and code, message):
// the one place these are written.
ApiError route_error(RouteError e, const RouteResult& r, const RouteErrorDetail& detail);

class RoutingService {
 public:
  // `tokenizers` (may be null: the placeholder for every model) maps models to
  // their tokenizers; it must outlive the service.
  RoutingService(const Indexer& index, WorkerRegistry& registry, const ConfigStore& config, Random& random,
                 const TokenizerSet* tokenizers = nullptr)
      : index_(index), registry_(registry), config_(config), random_(random), tokenizers_(tokenizers) {}

  // `rank_all` ranks every eligible worker (explain); routing itself ranks
  // only router.max_attempts (the failover order).
  RouteResult route(const ParsedRequest& request, bool rank_all = false) const;
  // The same into `out`, reset first (it reads exactly as a fresh result) but
  // keeping its vectors' capacity: a caller that keeps one RouteResult per
  // client connection allocates nothing per request once they have grown.
  // The previous result's RouteTarget::url views are invalid afterwards.
  // `score_all` scores every eligible worker (decide_all) even when the fast
  // path could decide: session affinity (router/session_affinity.h) compares
  // the session's worker, wherever it ranks, with the choice.
  void route(const ParsedRequest& request, RouteResult& out, bool rank_all = false, bool score_all = false) const;
  // The tokenize and hash stages of route(), for callers that need the request's blocks
  // without a decision (the KV location API): the request's tokens as its
  // engine computes them, hashed into out.block_hashes under its cache
  // namespace (LoRA adapter, cache_salt), with the token source, fallback,
  // first block and salt hash set. Returns the token count; `detail` gets the
  // chat template's error when the placeholder was used.
  uint32_t hash_request(const ParsedRequest& request, uint32_t block_size, RouteResult& out,
                        std::string* detail) const;
  // The same decision from a request's block hashes (already tokenized and
  // hashed; the simulator uses it). Resets and fills `out` (stages 2 and 3 timed).
  void route_blocks(std::string_view model, uint32_t isl_tokens, std::vector<LocalBlockHash> hashes, bool rank_all,
                    RouteResult& out) const;
  // Decides again for a request already routed into `out` (a queued request
  // waiting for a free worker): keeps its block hashes, token count and
  // tokenizer fallback, redoes only the decision (no template, tokenization
  // or hashing per retry).
  // `serve_busy`: an all-busy fleet ranks its busy workers (as with
  // scheduler.queue_size 0 and reject_when_busy false, the fleet's full
  // slots included): a queued request whose wait timed out goes to the best
  // of them.
  void reroute(std::string_view model, RouteResult& out, bool score_all = false, bool serve_busy = false) const;

  // The disaggregated decision for a request already routed into `out`
  // (scheduler/pd_decision.h decide_pd() over out.candidates): when the
  // model's workers have PD roles, out.ranked becomes the decode side's
  // ranking (role decode or both: a prefill worker never serves a request
  // whole while decode-side workers exist) and out.pd the prefill ranking
  // when the request is split. A model without PD roles is left as it is.
  // Requires every candidate scored: decide() scores all of them whenever
  // the registry knows a worker with a PD role.
  void decide_pd(const ParsedRequest& request, RouteResult& out) const;

  // Off: every decision scores every candidate (schedule(), the O(workers)
  // reference) instead of the registry's pre-ranked fleet. For benchmarks and
  // differential tests; set before the service is used (not synchronised).
  void set_fast_path(bool on) { fast_path_ = on; }

  // Token ids of a request as its engine computes them: the client's ids; else
  // the model's tokenizer from `tokenizers` (chat: template, then no special
  // tokens; completions: with them; the request's add_special_tokens wins);
  // else the placeholder, and *fallback says why (*detail: the template's error).
  // kvroute-mocker calls it too, so both sides agree.
  static std::vector<TokenId> tokens_of(const ParsedRequest& request, const TokenizerSet* tokenizers = nullptr,
                                        TokenizerFallback* fallback = nullptr, std::string* detail = nullptr);
  // The same without a copy: the client's ids in place, else the ids computed
  // into `buffer` (its capacity reused). Valid while `request` and `buffer` are.
  static std::span<const TokenId> tokens_of(const ParsedRequest& request, std::vector<TokenId>& buffer,
                                            const TokenizerSet* tokenizers = nullptr,
                                            TokenizerFallback* fallback = nullptr, std::string* detail = nullptr);
  // The same with the model's tokenizer already looked up (`local`, may be
  // null), and the engine's tokens (request.engine_tokens) used when `local`
  // cannot tokenize the request; *source says which was used
  // (tokenizer/request_tokens.h tokenize_request(), which the mocker calls too).
  static std::span<const TokenId> tokenize_request(const ParsedRequest& request, std::vector<TokenId>& buffer,
                                                   const ModelTokenizer* local, TokenSource* source,
                                                   TokenizerFallback* fallback, std::string* detail);

  // The tokenizer kvroute holds for `model`: its tokenizer.models entry, else,
  // for a LoRA adapter, its base model's. Null when there is none.
  const ModelTokenizer* local_tokenizer(std::string_view model) const;
  // True when the request should be tokenized by its engine before routing
  // (tokenizer.remote = auto): text or chat, and no local tokenizer can do it
  // (none for the model, or a chat request and the model's directory has no
  // chat template).
  bool needs_engine_tokens(const Config& cfg, const ParsedRequest& request) const;

 private:
  // Stages 2 and 3 for the request's out.block_hashes: candidates, overlaps,
  // schedule, ranking. `out` holds only what route()/route_blocks() set.
  // Explain (rank_all), score_all, softmax sampling, scheduler.cost =
  // predicted_ttft and a request without a model take decide_all(); the rest
  // decide_ranked().
  void decide(const Config& cfg, std::string_view model, uint32_t isl_tokens, bool rank_all, bool score_all,
              RouteResult& out) const;
  // The registry's pre-ranked fleet (scheduler/ranked_candidates.h): the candidates
  // are only the ranked workers. False when nobody serves the model.
  // Both take the prompt's prefix in flight per worker (inflight_owners()) as
  // an overlap beside the index's (the longer counts).
  // `fleet`: the fleet's thresholds the ranking keeps (the slot test lifted
  // when the fleet's slots are nearly all taken); `sched`: the request's own
  // (a band's reserve lowers them).
  bool decide_ranked(const Config& cfg, const SchedulerConfig& fleet, const SchedulerConfig& sched,
                     std::string_view model, size_t limit, RouteResult& out) const;
  // Every candidate scored (schedule()): explain's full ranking, and the reference.
  void decide_all(const Config& cfg, const SchedulerConfig& fleet, const SchedulerConfig& sched,
                  std::string_view model, bool rank_all, RouteResult& out) const;
  // The prompt's leading blocks this router has in flight on each worker,
  // beyond the longest prefix the index has (`cached_blocks`), at their
  // value as overlaps (scheduler.inflight_prefix_weight, of the fleet's
  // thresholds; WorkerRegistry::inflight_overlaps()), appended to `out`;
  // none when off, under another inflight_kv, or when the engine will not
  // read its cache.
  void inflight_owners(const SchedulerConfig& fleet, std::string_view model, RouteResult& r,
                       uint32_t cached_blocks, std::vector<OwnerOverlap>& out) const;

  const Indexer& index_;
  WorkerRegistry& registry_;
  const ConfigStore& config_;
  Random& random_;
  const TokenizerSet* tokenizers_;
  bool fast_path_ = true;
};

}  // namespace kvroute
