#include "router/admin_api.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "common/json_escape.h"
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

std::string num(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

std::string load_json(const WorkerLoad& l) {
  return fmt::format(
      R"({{"request_active_slots":{},"request_total_slots":{},"num_requests_waiting":{},"kv_active_blocks":{},"kv_total_blocks":{}}})",
      l.request_active_slots, l.request_total_slots, l.num_requests_waiting, l.kv_active_blocks, l.kv_total_blocks);
}

std::string worker_json(const WorkerView& w) {
  return fmt::format(
      R"({{"worker_id":{},"url":"{}","model":"{}","block_size":{},"dp_size":{},"approximate":{},"draining":{},"reported_load":{},"predicted_load":{},"inflight_requests":{},"inflight_blocks":{},"pending_prefill_tokens":{},)"
      R"("source":"{}","health":"{}","consecutive_failures":{},"failures_total":{},"load_age_ms":{},"kv_events":"{}"}})",
      w.info->id.value, json_escape(w.info->url), json_escape(w.info->model), w.info->block_size, w.info->dp_size,
      w.info->approximate, w.draining, load_json(w.info->load), load_json(w.predicted), w.inflight_requests,
      w.inflight_blocks, w.pending_prefill_tokens, to_string(w.info->source), to_string(w.health),
      w.consecutive_failures, w.failures_total,
      w.load_age.count() < 0 ? -1 : std::chrono::duration_cast<std::chrono::milliseconds>(w.load_age).count(),
      json_escape(w.info->kv_events));
}

}  // namespace

std::string explain_json(const RouteResult& r, std::string_view model, uint32_t block_size) {
  const auto& d = r.decision;
  std::string out = fmt::format(R"({{"model":"{}","isl_tokens":{},"block_size":{},"alpha":{},"load_mean":{},"load_std":{},)",
                                json_escape(model), r.isl_tokens, block_size, num(d.alpha), num(d.load_mean),
                                num(d.load_std));
  if (d.chosen) out += fmt::format(R"("chosen":{},"sampled":{},)", r.candidates[*d.chosen].owner.worker.value, d.sampled);
  else out += R"("chosen":null,"sampled":false,)";
  if (!r.ok) out += fmt::format(R"("error":{},)", error_body(r.error));
  out += fmt::format(R"("tokenizer_fallback":"{}","stage_us":{{"tokenize":{},"hash":{},"find_matches":{},"score":{}}},)",
                     to_string(r.tokenizer_fallback), num(r.stage_seconds[0] * 1e6), num(r.stage_seconds[1] * 1e6),
                     num(r.stage_seconds[2] * 1e6), num(r.stage_seconds[3] * 1e6));
  std::vector<int> rank(r.candidates.size(), -1);
  for (size_t k = 0; k < d.ranking.size(); ++k) rank[d.ranking[k]] = static_cast<int>(k);
  out += R"("workers":[)";
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const auto& c = r.candidates[i];
    const auto& s = d.scores.empty() ? WorkerScore{} : d.scores[i];
    const auto& t = c.overlap_by_tier;
    if (i) out += ',';
    out += fmt::format(
        R"({{"worker_id":{},"url":"{}","dp_rank":{},"overlap_blocks":{},"overlap_by_tier":{{"device":{},"host_pinned":{},"disk":{},"external":{}}},)"
        R"("cached_tokens":{},"reported_load":{},"predicted_load":{},"pending_prefill_tokens":{},"excluded":{},"rank":{},)"
        R"("terms":{{"load_ratio":{},"load_deviation":{},"prefill_ratio":{},"slot_ratio":{},"queue_ratio":{}}},"cost":{}}})",
        c.owner.worker.value, i < r.workers.size() ? json_escape(r.workers[i].info->url) : "", c.owner.dp_rank,
        c.overlap_blocks, t[0], t[1], t[2], t[3], num(s.cached_tokens),
        i < r.workers.size() ? load_json(r.workers[i].info->load) : "null", load_json(c.load),
        c.pending_prefill_tokens,
        s.excluded == Exclusion::None ? std::string("null") : fmt::format("\"{}\"", to_string(s.excluded)),
        rank[i] < 0 ? std::string("null") : std::to_string(rank[i]), num(s.load_ratio), num(s.load_deviation),
        num(s.prefill_ratio), num(s.slot_ratio), num(s.queue_ratio),
        s.excluded == Exclusion::None ? num(s.cost) : "null");
  }
  out += "]}";
  return out;
}

bool AdminApi::authorized(std::string_view authorization) const {
  const auto cfg = config_.get();
  if (cfg->admin.token.empty()) return false;
  constexpr std::string_view bearer = "Bearer ";
  if (authorization.substr(0, bearer.size()) != bearer) return false;
  return constant_time_equal(authorization.substr(bearer.size()), cfg->admin.token);
}

std::optional<std::string> AdminApi::apply_update(std::string_view yaml_overlay) {
  auto e = config_.update([&](Config& c) { return apply_yaml(c, yaml_overlay); });
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
  RouteResult r = routing_.route(parsed, /*rank_all=*/true);
  return AdminResponse{200, explain_json(r, parsed.model, config_.get()->indexer.block_size)};
}

AdminResponse AdminApi::handle(std::string_view method, std::string_view path, std::string_view authorization,
                               std::string_view body) {
  if (!authorized(authorization)) {
    stats_.auth_failures.fetch_add(1, std::memory_order_relaxed);
    const bool configured = !config_.get()->admin.token.empty();
    return json_error(401,
                      configured ? "Missing or wrong bearer token."
                                 : "The admin API is disabled: set admin.token (or KVROUTE_ADMIN_TOKEN).",
                      "authentication_error", "invalid_token");
  }
  if (path == "/admin/config") {
    if (method == "GET") return AdminResponse{200, to_yaml(*config_.get()), "application/yaml"};
    if (method == "PUT") {
      if (auto e = apply_update(body)) return json_error(400, *e, "invalid_request_error", "invalid_config");
      return AdminResponse{200, to_yaml(*config_.get()), "application/yaml"};
    }
  } else if (path == "/admin/route/explain" && method == "POST") {
    // A chat body has "messages"; anything else is explained as a completion.
    const bool chat = body.find("\"messages\"") != std::string_view::npos;
    return explain(chat ? ApiKind::ChatCompletions : ApiKind::Completions, body);
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
