// kvroute's own answers (local_routes.h).
#include "router/http/local_routes.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include <malloc.h>

#include "common/json_escape.h"
#include "router/api/api_routes.h"
#include "router/http/proxy.h"
#include "router/kv_lookup.h"

namespace kvroute {

std::string_view route_label(std::string_view target) {
  if (const auto api = api_of_path(target)) return api_label(*api);
  if (target == "/v1/models" || target.starts_with("/v1/models/")) return "models";
  if (target == "/health") return "health";
  if (target == "/ready") return "ready";
  if (target == "/metrics") return "metrics";
  return "other";
}

namespace {

// "%2F" -> "/" (a model id such as "Qwen/Qwen3-8B" may come either way).
std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned v = 0;
    if (s[i] == '%' && i + 2 < s.size() &&
        std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16).ptr == s.data() + i + 3) {
      out += static_cast<char>(v);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The OpenAI model object of `model`.
std::string model_object(std::string_view model) {
  return fmt::format(R"({{"id":"{}","object":"model","created":0,"owned_by":"kvroute"}})", json_escape(model));
}

// GET /v1/models: every model some worker serves.
awaitable<bool> list_models(ServerState& s, ClientConn& client, ClientRequest& req) {
  std::string body = R"({"object":"list","data":[)";
  bool first = true;
  for (const auto& m : s.hooks.registry->models()) {
    if (!first) body += ',';
    body += model_object(m);
    first = false;
  }
  body += "]}";
  s.count("models", 200, "");
  co_return co_await respond(s, client, req.version, req.keep_alive, http::status::ok, std::move(body));
}

// GET /v1/models/{id}: the OpenAI model object of a model some worker serves.
awaitable<bool> get_model(ServerState& s, ClientConn& client, ClientRequest& req, std::string_view id) {
  const std::string model = percent_decode(id);
  const auto known = s.hooks.registry->models();
  if (std::find(known.begin(), known.end(), model) == known.end()) {
    s.count("models", 404, "");
    const ApiError e{404, fmt::format("The model '{}' does not exist.", model), "invalid_request_error", "model",
                     "model_not_found"};
    co_return co_await respond_error(s, client, req.version, req.keep_alive, e);
  }
  std::string body = model_object(model);
  s.count("models", 200, "");
  co_return co_await respond(s, client, req.version, req.keep_alive, http::status::ok, std::move(body));
}

}  // namespace

awaitable<bool> handle_local(ServerState& s, ClientConn& client, ClientRequest& req) {
  std::string_view target = req.target;
  target = target.substr(0, target.find('?'));
  const bool keep = req.keep_alive;
  const unsigned v = req.version;
  const bool get = req.method == http::verb::get;

  const auto route = route_label(target);
  if (target == "/health" && get) {
    s.count(route, 200, "");
    co_return co_await respond(s, client, v, keep, http::status::ok, R"({"status":"ok"})");
  }
  if (target == "/ready" && get) {
    const bool draining = s.draining.load();
    const bool ready = !draining && s.hooks.ready && s.hooks.ready();
    s.count(route, ready ? 200 : 503, "");
    co_return co_await respond(s, client, v, keep, ready ? http::status::ok : http::status::service_unavailable,
                               ready      ? R"({"status":"ready"})"
                               : draining ? R"({"status":"shutting_down"})"
                                          : R"({"status":"not_ready"})");
  }
  if (target == "/metrics" && get && s.hooks.render_metrics) {
    s.count(route, 200, "");
    co_return co_await respond(s, client, v, keep, http::status::ok, s.hooks.render_metrics(),
                               "text/plain; version=0.0.4; charset=utf-8");
  }
  if (target.starts_with("/v1/models/") && get) co_return co_await get_model(s, client, req, target.substr(11));
  if (target == "/v1/models" && get) co_return co_await list_models(s, client, req);
  if (route != "other") {
    s.count(route, 405, "");
    const ApiError e{405, fmt::format("Method {} not allowed on {}.", req.method_string, target),
                     "invalid_request_error", "", "method_not_allowed"};
    co_return co_await respond_error(s, client, v, keep, e);
  }
  s.count(route, 404, "");
  const ApiError e{404, fmt::format("Unknown path {}.", target), "invalid_request_error", "", "not_found"};
  co_return co_await respond_error(s, client, v, keep, e);
}

awaitable<bool> handle_admin(ServerState& s, ClientConn& client, ClientRequest& req, IoThread& io) {
  std::string_view target = req.target;
  target = target.substr(0, target.find('?'));
  AdminApi* admin = s.hooks.admin;
  // Route explain and the KV location API tokenize as the data plane does: a
  // model without a local tokenizer is first tokenized by its engine
  // (tokenizer.remote).
  const bool explain = target == "/admin/route/explain", lookup = target == "/v1/kv/lookup";
  if (admin && s.hooks.routing && (explain || lookup) && req.method == http::verb::post &&
      admin->authorized(req.authorization)) {
    const auto cfg = s.hooks.config->get();
    const bool chat = req.body.find("\"messages\"") != std::string::npos;
    ParsedRequest parsed;
    size_t max_workers = 0;
    ApiError err;
    const bool parsed_ok = explain ? parse_openai_request(chat ? ApiKind::ChatCompletions : ApiKind::Completions,
                                                          req.body, parsed, err)
                                   : parse_kv_lookup(req.body, parsed, max_workers, err);
    if (parsed_ok && s.hooks.routing->needs_engine_tokens(*cfg, parsed)) {
      std::string body;
      if (!engine_tokens_cached(s, *cfg, parsed, body)) co_await engine_tokens(s, io, *cfg, parsed, {}, body);
      AdminResponse r = explain ? admin->explain(parsed) : admin->kv_lookup(parsed, max_workers);
      co_return co_await respond(s, client, req.version, req.keep_alive, static_cast<http::status>(r.status),
                                 std::move(r.body), r.content_type);
    }
  }
  AdminResponse r = admin ? admin->handle(req.method_string, target, req.authorization, req.body)
                          : AdminResponse{404, R"({"error":{"message":"no admin API"}})"};
  // Parsing a large YAML document takes about 80 times its size in small
  // allocations, freed at once but kept by malloc: give them back to the
  // system (this thread's arena and the others'), so one PUT does not leave
  // the process that much larger.
  if (req.body.size() > ServerState::kKeptCapacity) malloc_trim(0);
  co_return co_await respond(s, client, req.version, req.keep_alive, static_cast<http::status>(r.status),
                             std::move(r.body), r.content_type);
}

}  // namespace kvroute
