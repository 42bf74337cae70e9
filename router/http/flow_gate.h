// The proxy's flow-control phases (router/flow/), each a plain function of
// the request and the FlowControl: who the caller is (401), which band it
// joins and its deadline (400 for a bad header), its tenant's rate limits
// (429 + Retry-After), the tenant's pinned cache salt, and what a wait in the
// queue ended with. The proxy (proxy.cpp) calls them in the request's order
// and answers a refusal as it is.
//
// Status codes: 401 = no or unknown API key; 429 + Retry-After = overload
// the client should retry (a full band, shed, a rate limit, a queue timeout
// with scheduler.reject_when_busy, a TTFT deadline the queue cannot meet);
// 503 stays for "no worker can serve this" (none, all drained, shutting down).
//
// Threading: the request's io thread; FlowControl is thread-safe.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "router/flow/cache_salt.h"
#include "router/flow/flow_control.h"
#include "router/http/admission_queue.h"
#include "router/http/wire.h"
#include "router/openai_request.h"
#include "router/routing.h"
#include "scheduler/scheduler.h"

namespace kvroute {

// A request's standing with flow control, set by the phases below.
struct FlowStanding {
  std::shared_ptr<const flow::FlowTables> tables;
  uint32_t tenant = 0;
  uint32_t band = 0;
  std::optional<uint32_t> ttft_deadline_ms;  // x-kvroute-ttft-deadline-ms

  const TenantEntry* tenant_entry() const {
    return tables && tenant < tables->tenants.size() ? &tables->tenants[tenant] : nullptr;
  }
  std::string_view band_name() const {
    return tables && band < tables->bands.size() ? std::string_view(tables->bands[band].name) : "normal";
  }
};

// A request flow control answers itself.
struct FlowRefusal {
  ApiError error;
  std::optional<unsigned> retry_after;  // seconds (a 429's Retry-After)
  std::string_view outcome;             // the access log's and the tenant counter's label
};

inline FlowRefusal too_many(std::string message, std::string_view code, unsigned retry_after,
                            std::string_view outcome) {
  return FlowRefusal{ApiError{429, std::move(message), "rate_limit_error", "", std::string(code)}, retry_after,
                     outcome};
}

// Phase 1, before the body is parsed: the caller's tenant from its API key
// (flow.keys_file); every caller is the tenant "default" without keys.
inline std::optional<FlowRefusal> flow_authenticate(flow::FlowControl& fc, const std::shared_ptr<const Config>& cfg,
                                                    const ClientRequest& req, FlowStanding& st) {
  st.tables = fc.tables(cfg);
  const flow::AuthResult a = fc.authenticate(*st.tables, req.authorization, req.api_key, st.tenant);
  if (a == flow::AuthResult::Ok) return std::nullopt;
  const bool missing = a == flow::AuthResult::Missing;
  if (fc.metrics()) fc.metrics()->auth_failures_total.with({missing ? "missing" : "invalid"}).inc();
  // OpenAI's shape for a bad key (401 invalid_request_error, code invalid_api_key).
  return FlowRefusal{ApiError{401,
                              missing ? "You didn't provide an API key. Provide it as 'Authorization: Bearer <key>' "
                                        "or in the 'x-api-key' header."
                                      : "Incorrect API key provided.",
                              "invalid_request_error", "", "invalid_api_key"},
                     std::nullopt, "unauthorized"};
}

// Phase 2, after parsing: the band (x-kvroute-priority, else vLLM's
// `priority`), the TTFT deadline header, the tenant's request rate, and its
// pinned cache salt (the request is routed, and forwarded, with it).
inline std::optional<FlowRefusal> flow_classify(flow::FlowControl& fc, const Config& cfg, const ClientRequest& req,
                                                ParsedRequest& parsed, FlowStanding& st) {
  const auto band = flow::FlowControl::band_of(*st.tables, parsed.priority, req.priority);
  if (!band) {
    ApiError e;
    invalid_request(e, "x-kvroute-priority must be a band name (flow.bands) or an integer priority",
                    "x-kvroute-priority");
    return FlowRefusal{e, std::nullopt, "bad_request"};
  }
  st.band = *band;
  // The room each worker keeps for higher bands (routing leaves it free).
  parsed.band_reserve = st.tables->bands[*band].reserve_pct / 100.0;
  if (!req.ttft_deadline.empty()) {
    uint32_t ms = 0;
    const char* end = req.ttft_deadline.data() + req.ttft_deadline.size();
    const auto [ptr, ec] = std::from_chars(req.ttft_deadline.data(), end, ms);
    if (ec != std::errc() || ptr != end || ms == 0 || ms > 3600000) {
      ApiError e;
      invalid_request(e, "x-kvroute-ttft-deadline-ms must be an integer from 1 to 3600000",
                      "x-kvroute-ttft-deadline-ms");
      return FlowRefusal{e, std::nullopt, "bad_request"};
    }
    st.ttft_deadline_ms = ms;
  }
  uint32_t retry = 0;
  if (!fc.take_request(*st.tables, st.tenant, flow::FlowClock::now(), retry)) {
    retry = std::max(retry, cfg.flow.retry_after_s);
    return too_many(fmt::format("Tenant '{}' is over its request rate; retry after {} s.", st.tenant_entry()->name,
                                retry),
                    "rate_limited", retry, "rate_limited");
  }
  if (const auto* t = st.tenant_entry(); t && !t->cache_salt.empty()) parsed.cache_salt = t->cache_salt;
  return std::nullopt;
}

// The band as the priority written into the forwarded body
// (flow.forward_priority; FlowControl::engine_priority() says which value),
// so an engine run with vLLM's --scheduling-policy priority serves the
// request before lower bands' inside its own waiting queue. nullopt: leave
// the body as it is (the key is off, or the API carries no vLLM priority:
// vLLM's ChatCompletionRequest, CompletionRequest and ResponsesRequest have
// `priority`, vllm/entrypoints/openai/protocol.py; Anthropic's Messages body
// has none).
inline std::optional<int64_t> band_engine_priority(const Config& cfg, const FlowStanding& st, ApiKind kind,
                                                   std::optional<int64_t> body_priority) {
  if (!cfg.flow.forward_priority || !st.tables) return std::nullopt;
  if (kind != ApiKind::ChatCompletions && kind != ApiKind::Completions && kind != ApiKind::Responses)
    return std::nullopt;
  return flow::FlowControl::engine_priority(*st.tables, st.band, body_priority);
}

// Phase 3, once the prompt's tokens are counted (routed): the tenant's
// token rate.
inline std::optional<FlowRefusal> flow_tokens(flow::FlowControl& fc, const Config& cfg, const FlowStanding& st,
                                              uint32_t prompt_tokens) {
  uint32_t retry = 0;
  if (fc.take_tokens(*st.tables, st.tenant, prompt_tokens, flow::FlowClock::now(), retry)) return std::nullopt;
  retry = std::max(retry, cfg.flow.retry_after_s);
  return too_many(fmt::format("Tenant '{}' is over its prompt token rate; retry after {} s.", st.tenant_entry()->name,
                              retry),
                  "token_rate_limited", retry, "rate_limited");
}

// The TTFT the predictor expects for this request on its best worker now
// (busy ones included: the queue's head goes to one of them next), in ms;
// nullopt when no candidate was scored.
inline std::optional<double> best_predicted_ttft_ms(const RouteResult& route, uint32_t block_size) {
  std::optional<double> best;
  for (const Candidate& c : route.candidates) {
    if (c.draining) continue;
    const uint32_t cached = claimed_tokens(c.overlap_blocks, route.isl_tokens, block_size);
    const double ms = predicted_ttft_ms(c, static_cast<double>(route.isl_tokens - std::min(cached, route.isl_tokens)));
    if (!best || ms < *best) best = ms;
  }
  return best;
}

// What a wait that did not end admitted answers (Timeout with
// reject_when_busy false is handled by the proxy: the best busy worker).
inline FlowRefusal queue_refusal(AdmissionQueue::Outcome o, const Config& cfg, const FlowStanding& st,
                                 bool ttft_deadline) {
  const unsigned retry = cfg.flow.retry_after_s;
  switch (o) {
    case AdmissionQueue::Outcome::Full:
      return too_many(fmt::format("Every worker is busy and the wait queue of band '{}' is full; retry after {} s.",
                                  st.band_name(), retry),
                      "queue_full", retry, "queue_full");
    case AdmissionQueue::Outcome::Shed:
      return too_many(fmt::format("Every worker is busy; this request of band '{}' gave its place in the wait "
                                  "queue to a more urgent or fairer one; retry after {} s.",
                                  st.band_name(), retry),
                      "queue_shed", retry, "shed");
    case AdmissionQueue::Outcome::Stopped:
      return FlowRefusal{ApiError{503, "The router is shutting down.", "service_unavailable", "", "shutting_down"},
                         1, "shutdown"};
    default:
      if (ttft_deadline)
        return too_many(fmt::format("The time to first token predicted for this request cannot meet its "
                                    "x-kvroute-ttft-deadline-ms of {} ms; retry after {} s.",
                                    st.ttft_deadline_ms.value_or(0), retry),
                        "ttft_deadline", retry, "deadline");
      return too_many(fmt::format("No worker became free within {} ms; retry after {} s.",
                                  cfg.scheduler.queue_timeout_ms, retry),
                      "queue_timeout", retry, "queue_timeout");
  }
}

}  // namespace kvroute
