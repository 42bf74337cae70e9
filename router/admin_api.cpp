#include "router/admin_api.h"

#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <cmath>

#include "common/json_escape.h"
#include "router/kv_lookup.h"
#include "router/openai_request.h"

namespace kvroute {

namespace {

AdminResponse json_error(unsigned status, std::string_view message, std::string_view type, std::string_view code) {
  ApiError e{status, std::string(message), type, "", std::string(code)};  // type: a literal
  return AdminResponse{status, error_body(e)};
}

// Compares in time independent of where the strings differ.
bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string load_json(const WorkerLoad& l) {
  return fmt::format(
      R"({{"request_active_slots":{},"request_total_slots":{},"num_requests_waiting":{},"kv_active_blocks":{},"kv_total_blocks":{}}})",
      l.request_active_slots, l.request_total_slots, l.num_requests_waiting, l.kv_active_blocks, l.kv_total_blocks);
}

std::string worker_json(const WorkerView& w) {
  return fmt::format(
      R"({{"worker_id":{},"url":"{}","model":"{}","block_size":{},"dp_size":{},"approximate":{},"draining":{},"reported_load":{},"predicted_load":{},"inflight_requests":{},"inflight_blocks":{},"pending_prefill_tokens":{},"parked_blocks":{},"evicted_blocks":{},)"
      R"("source":"{}","health":"{}","consecutive_failures":{},"failures_total":{},"load_age_ms":{},"kv_events":"{}",)"
      R"("role":"{}","bootstrap_port":{}}})",
      w.info->id.value, json_escape(w.info->url), json_escape(w.info->model), w.info->block_size, w.info->dp_size,
      w.info->approximate, w.draining, load_json(w.info->load), load_json(w.predicted), w.inflight_requests,
      w.inflight_blocks, w.pending_prefill_tokens, static_cast<uint64_t>(std::llround(w.parked_blocks)),
      static_cast<uint64_t>(std::llround(w.evicted_blocks)), to_string(w.info->source), to_string(w.health),
      w.consecutive_failures, w.failures_total,
      w.load_age.count() < 0 ? -1 : std::chrono::duration_cast<std::chrono::milliseconds>(w.load_age).count(),
      json_escape(w.info->kv_events), to_string(w.info->role), w.info->bootstrap_port);
}

}  // namespace

void AdminApi::register_metrics(metrics::Registry& r) const {
  r.collect(metrics::Type::Counter, "kvroute_config_reloads_total", "configuration updates by result", {"result"},
            [this](metrics::Samples& s) {
              s.add({"ok"}, stats_.reloads_ok.load());
              s.add({"rejected"}, stats_.reloads_rejected.load());
            });
  r.counter_fn("kvroute_admin_auth_failures_total", "admin requests refused for a missing or wrong token",
               [this] { return stats_.auth_failures.load(); });
}

bool AdminApi::authorized(std::string_view authorization) const {
  const auto cfg = config_.get();
  if (cfg->admin.token.empty()) return false;
  constexpr std::string_view bearer = "Bearer ";
  if (authorization.substr(0, bearer.size()) != bearer) return false;
  return constant_time_equal(authorization.substr(bearer.size()), cfg->admin.token);
}

std::optional<std::string> AdminApi::apply_update(std::string_view yaml_overlay) {
  auto e = config_.update([&](Config& c) {
    const std::string token = c.admin.token, password = c.events.nats_password, nats_token = c.events.nats_token;
    auto err = apply_yaml(c, yaml_overlay);
    // GET's output PUT back: the secrets stay.
    if (c.admin.token == kRedacted) c.admin.token = token;
    if (c.events.nats_password == kRedacted) c.events.nats_password = password;
    if (c.events.nats_token == kRedacted) c.events.nats_token = nats_token;
    // An empty token refuses every admin request, this API included: set
    // through the API, it would lock the operator out until a SIGHUP.
    if (!err && c.admin.token.empty() && !token.empty())
      err = "admin.token: an empty token would refuse every admin request, this one included (locking the "
            "operator out); set a new token instead, or change the file and send SIGHUP";
    return err;
  });
  (e ? stats_.reloads_rejected : stats_.reloads_ok).fetch_add(1, std::memory_order_relaxed);
  return e;
}

std::optional<std::string> AdminApi::replace(const Config& next) {
  auto e = config_.update([&](Config& c) {
    c = next;
    return std::nullopt;
  });
  (e ? stats_.reloads_rejected : stats_.reloads_ok).fetch_add(1, std::memory_order_relaxed);
  return e;
}

AdminResponse AdminApi::explain(ApiKind kind, std::string_view body) const {
  ParsedRequest parsed;
  ApiError err;
  if (!parse_openai_request(kind, body, parsed, err)) return AdminResponse{err.status, error_body(err)};
  return explain(parsed);
}

AdminResponse AdminApi::explain(const ParsedRequest& parsed) const {
  RouteResult r = routing_.route(parsed, /*rank_all=*/true);
  const auto cfg = config_.get();
  std::string out = explain_json(r, parsed.model, cfg->indexer.block_size, cfg->scheduler);
  // A disaggregated fleet: the prefill/decode decision too (the legs the
  // proxy runs: router/http/pd_exchange.h), with the protocol they speak.
  if (const std::string pd = pd_explain_json(r, cfg->indexer.block_size, parsed.n <= 1 && parsed.prompts <= 1,
                                             cfg->scheduler, cfg->pd);
      !pd.empty()) {
    out.pop_back();  // the closing brace
    // The legs the proxy would send now (RoutingService::decide_pd(), the
    // proxy's own call, with its SGLang rule: a decode server cannot run a
    // request alone); ties may break otherwise than in the terms above.
    RouteResult legs = r;
    routing_.decide_pd(parsed, legs);
    const bool split = legs.ok && legs.pd.disaggregate;
    out += fmt::format(R"(,"pd":{{"protocol":"{}","legs":{{"split":{},"decode":{},"prefill":{}}},)",
                       to_string(pd_protocol_of(cfg->pd, parsed.model)), split,
                       legs.ok && !legs.ranked.empty() ? std::to_string(legs.ranked.front().worker.value) : "null",
                       split ? std::to_string(legs.pd.prefill.front().worker.value) : "null");
    out.append(pd, 1);
    out += "}";
  }
  if (salt_blind_) {
    out.pop_back();  // the closing brace
    out += R"(,"salt_blind_workers":[)";
    bool first = true;
    for (const auto& c : r.candidates)
      if (salt_blind_(c.owner.worker)) {
        out += fmt::format("{}{}", first ? "" : ",", c.owner.worker.value);
        first = false;
      }
    out += "]}";
  }
  if (index_age_) {  // the last-known index age of each candidate worker
    out.pop_back();  // the closing brace
    out += R"(,"index_age_ms":{)";
    for (size_t i = 0; i < r.candidates.size(); ++i) {
      const auto age = index_age_(r.candidates[i].owner.worker);
      out += fmt::format(R"({}"{}":{})", i ? "," : "", r.candidates[i].owner.worker.value,
                         age ? std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(*age).count())
                             : std::string("null"));
    }
    out += "}}";
  }
  if (queue_view_) {
    out.pop_back();  // the closing brace
    out += R"(,"queue":)" + queue_view_(parsed.model, parsed.priority, "") + "}";
  }
  return AdminResponse{200, out};
}

AdminResponse AdminApi::kv_lookup(std::string_view body) const {
  ParsedRequest parsed;
  size_t max_workers = 0;
  ApiError err;
  if (!parse_kv_lookup(body, parsed, max_workers, err)) return AdminResponse{err.status, error_body(err)};
  return kv_lookup(parsed, max_workers);
}

AdminResponse AdminApi::kv_lookup(const ParsedRequest& parsed, size_t max_workers) const {
  thread_local RouteResult scratch;
  thread_local KvLookupResult result;
  kvroute::kv_lookup(KvLookupSources{routing_, index_, registry_, pool_names_}, parsed, config_.get()->indexer.block_size,
                     max_workers, scratch, result);
  return AdminResponse{200, kv_lookup_json(result)};
}

AdminResponse AdminApi::config_yaml() const {
  Config shown = *config_.get();
  if (!shown.admin.token.empty()) shown.admin.token = kRedacted;  // no API returns a secret
  if (!shown.events.nats_password.empty()) shown.events.nats_password = kRedacted;
  if (!shown.events.nats_token.empty()) shown.events.nats_token = kRedacted;
  return AdminResponse{200, to_yaml(shown), "application/yaml"};
}

std::optional<AdminResponse> AdminApi::status_endpoint(std::string_view method, std::string_view path) const {
  if (method != "GET" || !status_) return std::nullopt;
  if (path == "/admin/status") {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    return AdminResponse{200, status_->status_json(now)};
  }
  if (path == "/admin/status/history") return AdminResponse{200, status_->history_json()};
  if (path == "/admin/decisions") return AdminResponse{200, status_->decisions().list_json()};
  constexpr std::string_view prefix = "/admin/decisions/";
  if (path.substr(0, prefix.size()) != prefix) return std::nullopt;
  const auto idtext = path.substr(prefix.size());
  uint64_t id = 0;
  auto [p, ec] = std::from_chars(idtext.data(), idtext.data() + idtext.size(), id);
  if (ec != std::errc() || p != idtext.data() + idtext.size())
    return json_error(404, "Use GET /admin/decisions/{id}.", "invalid_request_error", "not_found");
  if (auto e = status_->decisions().explain(id)) return AdminResponse{200, std::move(*e)};
  return json_error(404, fmt::format("Decision {} is no longer kept (only the latest are).", id),
                    "invalid_request_error", "unknown_decision");
}

AdminResponse AdminApi::handle(std::string_view method, std::string_view path, std::string_view authorization,
                               std::string_view body) {
  // The status page's files hold no data and no secret: a browser loads them
  // without a token (it cannot send a bearer header on navigation); the page
  // then asks for the token and calls the JSON endpoints below with it.
  if (method == "GET")
    if (const AdminResponse* asset = status_page_asset(path)) return *asset;
  if (!authorized(authorization)) {
    stats_.auth_failures.fetch_add(1, std::memory_order_relaxed);
    const bool configured = !config_.get()->admin.token.empty();
    return json_error(401,
                      configured ? "Missing or wrong bearer token."
                                 : "The admin API is disabled: set admin.token (or KVROUTE_ADMIN_TOKEN).",
                      "authentication_error", "invalid_token");
  }
  if (path == "/admin/config") {
    if (method == "GET") return config_yaml();
    if (method == "PUT") {
      if (auto e = apply_update(body)) return json_error(400, *e, "invalid_request_error", "invalid_config");
      return config_yaml();
    }
  } else if (path == "/admin/route/explain" && method == "POST") {
    // A chat body has "messages"; anything else is explained as a completion.
    const bool chat = body.find("\"messages\"") != std::string_view::npos;
    return explain(chat ? ApiKind::ChatCompletions : ApiKind::Completions, body);
  } else if (path == "/v1/kv/lookup" && method == "POST") {
    return kv_lookup(body);
  } else if (path == "/admin/workers" && method == "GET") {
    std::string out = "[";
    bool first = true;
    for (const auto& w : registry_.all()) {
      if (!first) out += ',';
      out += worker_json(w);
      first = false;
    }
    return AdminResponse{200, out + "]"};
  } else if (path == "/admin/index" && method == "GET") {
    const auto s = index_.stats();
    return AdminResponse{200, fmt::format(R"({{"blocks":{},"entries":{},"bytes":{}}})", s.blocks, s.entries, s.bytes)};
  } else if (auto r = status_endpoint(method, path)) {
    return std::move(*r);
  } else if (path == "/admin/workers" && method == "POST") {
    return add_worker(body);
  } else if (path.substr(0, 15) == "/admin/workers/" && method == "DELETE") {
    return remove_worker(path.substr(15));
  } else if (path.substr(0, 15) == "/admin/workers/" && method == "POST") {
    // /admin/workers/{id}/drain or /admin/workers/{id}/undrain
    std::string_view rest = path.substr(15);
    const auto slash = rest.find('/');
    uint64_t id = 0;
    const auto idtext = rest.substr(0, slash);
    auto [p, ec] = std::from_chars(idtext.data(), idtext.data() + idtext.size(), id);
    const std::string_view action = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
    if (ec != std::errc() || p != idtext.data() + idtext.size() || (action != "drain" && action != "undrain"))
      return json_error(404, "Use POST /admin/workers/{id}/drain or /undrain.", "invalid_request_error", "not_found");
    if (!registry_.set_draining(WorkerId{id}, action == "drain"))
      return json_error(404, fmt::format("Worker {} is not known.", id), "invalid_request_error", "unknown_worker");
    return AdminResponse{200, fmt::format(R"({{"worker_id":{},"draining":{}}})", id, action == "drain")};
  }
  return json_error(404, fmt::format("No admin endpoint {} {}.", method, path), "invalid_request_error", "not_found");
}

AdminResponse AdminApi::add_worker(std::string_view body) {
  if (!fleet_.add_worker)
    return json_error(501, "This router has no fleet manager.", "invalid_request_error", "unsupported");
  std::string entry;
  if (auto e = worker_entry_text(body, entry)) return json_error(400, *e, "invalid_request_error", "invalid_worker");
  if (auto e = fleet_.add_worker(entry)) return json_error(400, *e, "invalid_request_error", "invalid_worker");
  std::vector<WorkerEntry> parsed;
  parse_worker_entries(entry, parsed);  // valid: add_worker accepted it
  return AdminResponse{201, fmt::format(R"({{"worker_id":{},"url":"{}"}})", parsed.at(0).id,
                                        json_escape(parsed.at(0).url))};
}

AdminResponse AdminApi::remove_worker(std::string_view idtext) {
  uint64_t id = 0;
  auto [p, ec] = std::from_chars(idtext.data(), idtext.data() + idtext.size(), id);
  if (ec != std::errc() || p != idtext.data() + idtext.size())
    return json_error(404, "Use DELETE /admin/workers/{id}.", "invalid_request_error", "not_found");
  if (!fleet_.remove_worker)
    return json_error(501, "This router has no fleet manager.", "invalid_request_error", "unsupported");
  if (!fleet_.remove_worker(WorkerId{id}))
    return json_error(404, fmt::format("Worker {} is not a router-known worker.", id), "invalid_request_error",
                      "unknown_worker");
  return AdminResponse{200, fmt::format(R"({{"worker_id":{},"removed":true}})", id)};
}

}  // namespace kvroute
