// The exchange's admission phases (exchange.h): route the parsed request,
// wait in the queue while every worker is busy, accept the decision and pin
// the tenant's and the band's body fields; and the route of a Responses
// retrieve. Compiled in the same unity group as proxy.cpp.
#include "router/http/exchange.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>

#include "common/log.h"
#include "router/api/api_routes.h"
#include "router/proxy_policy.h"

namespace kvroute {
namespace phases {

// ---- route

// The request's session (x-session-id, else the OpenAI `user` field).
std::string_view session_key(const Exchange& x) {
  return x.req.session.empty() ? std::string_view(x.client.parsed.user) : std::string_view(x.req.session);
}

// Session affinity applies (router/session_affinity.h): the decision scores
// every eligible worker (not the fast path's few), so the session's worker is
// compared with the choice wherever it ranks.
bool sticky_session(const Exchange& x) {
  return x.s.hooks.sessions && x.cfg.scheduler.session_affinity && !session_key(x).empty();
}

// Routes the parsed request into client.route. True: every worker is busy
// and the request may wait in the queue (wait_in_queue()).
bool route_request(Exchange& x) {
  x.pin.lookup(x.s.responses, x.kind, x.client.parsed, x.cfg.router.response_affinity_max_ids);
  x.s.hooks.routing->route(x.client.parsed, x.client.route, /*rank_all=*/false,
                           sticky_session(x) || x.pin.needs_all_scored());
  const RouteResult& route = x.client.route;
  return !route.ok && may_queue(route.failure) && x.cfg.scheduler.queue_size > 0;
}

// Claims the slot of the worker a queue trial routed the request to (the
// first attempt keeps it: begin_attempt(), proxy.cpp). The trial may run on
// the io thread that freed the slot, well before the request's own thread
// sends it, and the next head's trial follows at once: without the claim it
// would see the same slot free. Counted as an unsplit request (a split one's
// decode leg counts no prefill: its first attempt takes the slot again).
void claim_slot(Exchange& x) {
  const RouteTarget& t = x.client.route.ranked.front();
  const uint64_t prompts = x.client.parsed.prompts;
  const Exchange::Claim c{t.worker, x.client.route.request_blocks * prompts, t.prefill_tokens * prompts,
                          inflight_shared_blocks(x.cfg.scheduler, t), inflight_distinct(x.cfg.scheduler)};
  x.guard.reset();
  x.guard.emplace(*x.s.hooks.registry, c.worker,
                  route_inflight_kv(x.cfg.scheduler, x.client.route, t, c.blocks, c.cached_blocks),
                  c.prefill);
  x.claim = c;
}

// No eligible worker (all busy): waits in the queue (router/http/
// admission_queue.h) until a trial routes it, its deadline (the queue
// timeout, or the latest start that still meets its TTFT deadline), a more
// urgent or fairer request sheds it, or shutdown. A timeout goes to the best
// busy worker (scheduler.reject_when_busy false) or is refused 429.
awaitable<void> wait_in_queue(Exchange& x) {
  RouterMetrics* m = x.metrics();
  RouteResult& route = x.client.route;
  const auto& sc = x.cfg.scheduler;
  if (x.s.stopping.load() || x.cut) {
    x.refusal = queue_refusal(AdmissionQueue::Outcome::Stopped, x.cfg, x.flow, false);
    co_return;
  }
  auto deadline = Steady::now() + milliseconds(sc.queue_timeout_ms);
  bool ttft_bound = false;
  if (x.flow.ttft_deadline_ms) {
    const double predicted = best_predicted_ttft_ms(route, x.cfg.indexer.block_size).value_or(0);
    const auto latest = x.started + milliseconds(*x.flow.ttft_deadline_ms) -
                        std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double, std::milli>(predicted));
    if (latest <= deadline) {
      deadline = latest;
      ttft_bound = true;
    }
  }
  flow::FlowMetrics* fm = x.s.flow.metrics();
  const std::string_view band = x.flow.band_name();
  AdmissionQueue::Outcome outcome = AdmissionQueue::Outcome::Timeout;
  const auto t0 = Steady::now();
  if (!(ttft_bound && deadline <= t0)) {  // else it cannot meet its deadline even if admitted now
    // May run on another io thread while this coroutine sleeps (Handover,
    // admission_queue.h): it touches only the route, the claim and what no
    // one changes while the request waits.
    const std::function<bool()> try_admit = [&x, &route] {
      x.s.hooks.routing->reroute(x.client.parsed.model, route,
                                 sticky_session(x) || x.pin.needs_all_scored());  // keeps tokens and hashes
      if (route.ok && !route.ranked.empty()) claim_slot(x);
      return route.ok;
    };
    const TenantEntry* tenant = x.flow.tenant_entry();
    const AdmissionQueue::Ticket ticket{x.client.parsed.model, x.flow.band, x.flow.tenant,
                                        tenant ? tenant->weight : 1u, x.req.body.size()};
    uint64_t position = 0;
    outcome = co_await x.s.queue.wait(x.io.ioc.get_executor(), ticket, flow::FlowControl::limits(x.cfg, *x.flow.tables),
                                      deadline, try_admit, &position);
    if (fm && outcome != AdmissionQueue::Outcome::Full) fm->queue_position.with({band}).observe(double(position));
  }
  static constexpr std::string_view kOutcome[] = {"admitted", "full", "shed", "timeout", "stopped"};
  const std::string_view label = ttft_bound && outcome == AdmissionQueue::Outcome::Timeout
                                     ? std::string_view("deadline")
                                     : kOutcome[static_cast<int>(outcome)];
  const double waited = seconds_since(t0);
  if (fm && outcome != AdmissionQueue::Outcome::Full) fm->queue_wait_seconds.with({band, label}).observe(waited);
  if (outcome == AdmissionQueue::Outcome::Admitted) {
    route.queue_wait_seconds = waited;  // explain's queue_wait_ms (the decision log)
    co_return;
  }
  if (fm && outcome != AdmissionQueue::Outcome::Stopped) fm->queue_shed_total.with({band, label}).inc();
  if (outcome == AdmissionQueue::Outcome::Timeout && !ttft_bound && !sc.reject_when_busy) {
    // The operator's default for a busy fleet: its engines queue it.
    x.s.hooks.routing->reroute(x.client.parsed.model, route, sticky_session(x) || x.pin.needs_all_scored(), /*serve_busy=*/true);
    route.queue_wait_seconds = waited;
    if (m) m->rejected_total.with({"queue_timeout"}).inc();
    if (!route.ok && may_queue(route.failure))  // nobody can take it (all drained): 503
      route.fail(RouteError::QueueTimeout,
                 RouteErrorDetail{.model = x.client.parsed.model, .queue_timeout_ms = sc.queue_timeout_ms});
    co_return;
  }
  if (m) m->rejected_total.with({outcome == AdmissionQueue::Outcome::Full ? "queue_full" : "queue_timeout"}).inc();
  x.refusal = queue_refusal(outcome, x.cfg, x.flow, ttft_bound);
}

// The decision's metrics; false if there is no worker to send the request to.
bool accept_route(Exchange& x) {
  // A disaggregated fleet: the decode side's ranking, and the prefill one
  // when the request is split (a decision that can still refuse it).
  if (x.client.route.ok) x.s.hooks.routing->decide_pd(x.client.parsed, x.client.route);
  const RouteResult& route = x.client.route;
  RouterMetrics* m = x.metrics();
  if (m) {
    for (int i = 0; i < 4; ++i) m->stage_seconds[i]->observe(route.stage_seconds[i]);
    (!route.ok ? m->decided_no_worker : route.chose_best_overlap ? m->decided_best_overlap : m->decided_balance).inc();
    if (route.all_busy) m->all_busy_total.get().inc();
    if (route.slots_full) m->slots_full_total.get().inc();
    if (route.ok && route.tokenizer_fallback != TokenizerFallback::None)
      m->tokenizer_fallbacks_total.with({x.client.parsed.model, to_string(route.tokenizer_fallback)}).inc();
    if (route.ok) m->tokenized(x.client.parsed.model, to_string(route.token_source)).inc();
  }
  x.rec.prompt_tokens = route.isl_tokens;
  if (!route.ok && route.failure == RouteError::PromptExceedsKv && m)
    m->rejected_total.with({"prompt_exceeds_kv"}).inc();
  if (!route.ok) return false;
  x.model_label = x.client.parsed.model;  // bounded: a model some worker announced
  if (sticky_session(x)) x.s.hooks.sessions->apply(session_key(x), x.cfg.indexer.block_size, x.client.route);
  x.pin.apply(x.cfg.indexer.block_size, x.client.route, x.metrics());
  if (x.s.hooks.on_routed) x.s.hooks.on_routed(x.client.parsed, route);
  return true;
}

// The routed request's tenant: its tokens counted, and its pinned cache_salt
// written into the body. False when the body cannot take the pin.
bool apply_tenant(Exchange& x) {
  const TenantEntry* t = x.flow.tenant_entry();
  if (!t) return true;
  if (flow::FlowMetrics* fm = x.s.flow.metrics()) fm->tenant_tokens_total.with({t->name}).inc(x.client.route.isl_tokens);
  return t->cache_salt.empty() || flow::pin_cache_salt(x.req.body, t->cache_salt);
}

// The band as the engine's priority (flow.forward_priority), written into
// the body. False when the body cannot take it (an escaped top-level key).
bool apply_band_priority(Exchange& x) {
  const auto p = band_engine_priority(x.cfg, x.flow, x.kind, x.client.parsed.priority);
  return !p || flow::pin_member(x.req.body, "priority", std::to_string(*p));
}

// ---- retrieve a response

// GET /v1/responses/{id} (OpenAI's Responses retrieve): kvroute stores no
// response; the worker that produced it does (vLLM keeps stored responses in
// its API server's memory and answers an id it does not hold with 404,
// vllm/entrypoints/openai/responses/serving.py `retrieve_responses`). The
// request goes to that worker, as response affinity remembers it
// (router/api/response_affinity.h), unchanged (its query, e.g. `stream`,
// included); an id kvroute does not remember, or whose worker has left, is
// 404 in OpenAI's error shape, as the engine would answer it. nullopt: the
// ranking is that one worker.
std::optional<ApiError> route_retrieve(Exchange& x) {
  x.client.parsed.reset();
  RouteResult& route = x.client.route;
  route.reset();
  const std::string_view id = response_id_of_path(x.req.target);
  const auto not_found = [&](std::string_view why) {
    if (RouterMetrics* m = x.metrics()) m->response_retrieve_total.with({why}).inc();
    return ApiError{404, fmt::format("Response with id '{}' not found.", id.substr(0, ResponseAffinity::kMaxIdBytes)),
                    "invalid_request_error", "response_id", ""};
  };
  x.s.responses.set_max_ids(x.cfg.router.response_affinity_max_ids);
  const auto worker = id.empty() ? std::nullopt : x.s.responses.find(id);
  if (!worker) return not_found(to_string(ResponseAffinity::Pin::Unknown));
  x.s.hooks.registry->candidates("", route.workers);
  for (const WorkerView& v : route.workers) {
    if (v.info->id != *worker || v.info->url.empty()) continue;
    RouteTarget& t = route.ranked.emplace_back();
    t.worker = *worker;
    t.url = v.info->url;
    route.ok = true;
    if (RouterMetrics* m = x.metrics()) m->response_retrieve_total.with({"routed"}).inc();
    return std::nullopt;
  }
  return not_found(to_string(ResponseAffinity::Pin::WorkerGone));
}

// ---- admit

awaitable<std::optional<bool>> admit(Exchange& x) {
  ServerState& s = x.s;
  ClientConn& client = x.client;
  ClientRequest& req = x.req;
  ApiError err;
  if (!parse_api_request(x.kind, req.body, client.parsed, client.chat_body, err))
    co_return co_await reject(x, err, "bad_request");
  if (auto r = flow_classify(s.flow, x.cfg, req, client.parsed, x.flow)) co_return co_await refuse(x, *r);
  x.rec.model = client.parsed.model;
  x.rec.stream = client.parsed.stream;
  if (s.hooks.routing->needs_engine_tokens(x.cfg, client.parsed)) {
    thread_local std::string scratch;  // no allocation per request once grown; used before any suspension
    if (!engine_tokens_cached(s, x.cfg, client.parsed, scratch)) {
      const std::string body = scratch;  // in the frame: other requests use the scratch while this one waits
      const auto key = s.worker_key.get(x.cfg_holder);  // in the frame: its text is used across the wait
      co_await engine_tokens(s, x.io, x.cfg, client.parsed,
                             worker_authorization(*key, forwards_client_credentials(x.cfg), req.authorization), body);
    }
  }
  const bool queue = route_request(x);
  if (auto r = flow_tokens(s.flow, x.cfg, x.flow, client.route.isl_tokens)) co_return co_await refuse(x, *r);
  if (queue) co_await wait_in_queue(x);
  if (x.refusal) co_return co_await refuse(x, *x.refusal);
  if (!accept_route(x)) co_return co_await reject(x, client.route.error, "no_worker");
  if (!apply_tenant(x)) {
    ApiError e;
    invalid_request(e, "Escaped keys are not accepted at the top level of this tenant's requests (its cache_salt "
                       "is pinned).", "");
    co_return co_await reject(x, e, "bad_request");
  }
  if (!apply_band_priority(x)) {
    ApiError e;
    invalid_request(e, "Escaped keys are not accepted at the top level of a request whose band kvroute forwards as "
                       "its priority (flow.forward_priority).", "");
    co_return co_await reject(x, e, "bad_request");
  }
  co_return std::nullopt;
}

}  // namespace phases
}  // namespace kvroute
