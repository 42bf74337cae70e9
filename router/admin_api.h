// The admin API (its own listener, behind a bearer token): effective config
// read and update (the token redacted), worker list and drain, index stats,
// route explain, the status page's JSON (fleet, history, latest decisions) and
// the status page itself (/ui: static files, no data, served without the
// token; the page asks for the token and sends it as a bearer header). Plain
// request -> response functions with no Beast types, so they are unit-tested
// without sockets; router/http/local_routes.cpp serves them.
//
// Thread-safe: called from HTTP io threads.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <string_view>

#include "common/metrics.h"
#include "config/config_store.h"
#include "indexer/indexer.h"
#include "router/explain.h"
#include "router/routing.h"
#include "router/status.h"
#include "fleet/worker_registry.h"

namespace kvroute {

struct AdminResponse {
  unsigned status = 200;
  std::string body;
  std::string content_type = "application/json";
};

// What GET /admin/config shows instead of a non-empty admin.token; a PUT
// carrying it back leaves the token unchanged.
inline constexpr std::string_view kRedacted = "<redacted>";

struct AdminStats {
  std::atomic<uint64_t> reloads_ok{0};
  std::atomic<uint64_t> reloads_rejected{0};
  std::atomic<uint64_t> auth_failures{0};
};

// The admin entry points of the router-known workers (fleet/known_workers.h), wired by main.
struct AdminWorkerHooks {
  std::function<std::optional<std::string>(std::string_view entry)> add_worker;  // workers.static text form
  std::function<bool(WorkerId)> remove_worker;
};

class AdminApi {
 public:
  AdminApi(ConfigStore& config, RoutingService& routing, WorkerRegistry& registry, const Indexer& index)
      : config_(config), routing_(routing), registry_(registry), index_(index) {}

  // `authorization` is the request's Authorization header value.
  AdminResponse handle(std::string_view method, std::string_view path, std::string_view authorization,
                       std::string_view body);

  // Applies a YAML/JSON overlay to the live config (PUT /admin/config and
  // reloads). Counts the outcome. Returns the error, or nullopt on success.
  std::optional<std::string> apply_update(std::string_view yaml_overlay);
  // Replaces the live config with `next` if only reloadable keys differ (SIGHUP).
  std::optional<std::string> replace(const Config& next);

  // Counts a reload that failed before reaching replace() (e.g. unreadable file).
  void count_rejected_reload() { stats_.reloads_rejected.fetch_add(1, std::memory_order_relaxed); }

  const AdminStats& stats() const { return stats_; }
  // kvroute_config_reloads_total{result} and kvroute_admin_auth_failures_total,
  // read from stats() at every scrape of `r` (this object must outlive them).
  void register_metrics(metrics::Registry& r) const;
  // The status page's data (GET /admin/status, /admin/status/history,
  // /admin/decisions[/{id}]); without it those answer 404. Set before serving.
  void set_status(const StatusReport* status) { status_ = status; }
  // The shared pools' names (indexer.kv_pools, by pool) the KV location API names; before serving.
  void set_pool_names(std::vector<std::string> names) { pool_names_ = std::move(names); }
  // POST /admin/workers ({"url":..,"model":..,...} or the text form) and
  // DELETE /admin/workers/{id}: 501 until set.
  void set_fleet_hooks(AdminWorkerHooks hooks) { fleet_ = std::move(hooks); }

  // Explain of one request body (the data plane's routing, no request sent).
  AdminResponse explain(ApiKind kind, std::string_view body) const;
  // The same for a request already parsed (the HTTP layer may first have had
  // its engine tokenize it, as the data plane does: tokenizer.remote).
  AdminResponse explain(const ParsedRequest& parsed) const;
  // POST /v1/kv/lookup (router/kv_lookup.h): a body, or one already parsed
  // (and tokenized by its engine when the data plane would have).
  AdminResponse kv_lookup(std::string_view body) const;
  AdminResponse kv_lookup(const ParsedRequest& parsed, size_t max_workers) const;
  // True when `authorization` carries the admin token (the HTTP layer checks
  // before doing work for an admin request).
  bool authorized(std::string_view authorization) const;
  // How old each worker's part of the index is (time since its last
  // event or dump; nullopt = never heard), shown by explain as
  // "index_age_ms":{"<worker_id>":ms|null,...}. Unset: the field is omitted.
  void set_index_age(std::function<std::optional<Nanos>(WorkerId)> f) { index_age_ = std::move(f); }
  // Workers whose KV events carry no cache_salt while they are sent salted
  // requests (events/salt_attribution.h): explain lists the candidates among
  // them as "salt_blind_workers":[ids]. Unset: the field is omitted.
  void set_salt_blind(std::function<bool(WorkerId)> f) { salt_blind_ = std::move(f); }
  // The wait queue as the explained request would meet it (its band, the
  // requests of its model ahead of it, all waiting), a JSON object shown by
  // explain as "queue". Args: model, the body's priority, x-kvroute-priority.
  using QueueView = std::function<std::string(std::string_view, std::optional<int64_t>, std::string_view)>;
  void set_queue_view(QueueView f) { queue_view_ = std::move(f); }

 private:
  std::optional<AdminResponse> status_endpoint(std::string_view method, std::string_view path) const;
  AdminResponse config_yaml() const;
  AdminResponse add_worker(std::string_view body);
  AdminResponse remove_worker(std::string_view idtext);

  ConfigStore& config_;
  RoutingService& routing_;
  WorkerRegistry& registry_;
  const Indexer& index_;
  std::vector<std::string> pool_names_;
  const StatusReport* status_ = nullptr;
  AdminStats stats_;
  AdminWorkerHooks fleet_;
  std::function<std::optional<Nanos>(WorkerId)> index_age_;  // explain's index_age_ms; unset: omitted
  std::function<bool(WorkerId)> salt_blind_;
  QueueView queue_view_;
};

// The status page's files (router/status/), compiled in: nullptr if `path`
// is none of them. `/`, `/ui` and `/ui/` are the page.
const AdminResponse* status_page_asset(std::string_view path);

}  // namespace kvroute
