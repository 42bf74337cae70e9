// The OpenAI-compatible HTTP front end, streaming proxy and admin listener
// (Boost.Beast), as main() sees it: hooks in, listen, start, shutdown. The
// parts are in router/http/ (router/README.md); no Beast or Asio type is in
// this header.
//
// Threading: `start(n)` runs n io threads, each with its own io_context;
// thread 0 accepts and hands each client connection to a thread
// (round-robin), where the connection, its requests and their upstream
// connections stay (no strands, no locks on the request path). The admin
// listener and its connections have a thread of their own (`kvroute-admin`,
// nice 10). Hooks are called from io threads and must be thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "config/config_store.h"
#include "router/admin_api.h"
#include "router/router_metrics.h"
#include "router/routing.h"
#include "router/session_affinity.h"
#include "router/flow/flow_control.h"
#include "fleet/worker_registry.h"

namespace kvroute {

struct HttpServerHooks {
  RoutingService* routing = nullptr;
  WorkerRegistry* registry = nullptr;
  const ConfigStore* config = nullptr;
  AdminApi* admin = nullptr;          // admin listener only
  RouterMetrics* metrics = nullptr;
  SessionAffinity* sessions = nullptr;  // scheduler.session_affinity (null = off)
  // GET /ready answers 200 only when this returns true (and not shutting down).
  std::function<bool()> ready;
  // GET /metrics body (Prometheus text format).
  std::function<std::string()> render_metrics;
  // Called after a routing decision for a worker in approximate mode.
  std::function<void(const ParsedRequest&, const RouteResult&)> on_routed;
  // The process's descriptor limit (RLIMIT_NOFILE): router.max_connections 0
  // means half of it.
  uint64_t open_files_limit = 1024;
  // Called for every attempt on a worker, before the request is sent to it
  // (events/salt_attribution.h records what went where).
  std::function<void(WorkerId, const RouteResult&)> on_dispatch;
  // Tenants, keys, bands and the wait queue (router/flow/); null: the
  // server keeps its own (keys from flow.keys_file read at construction).
  flow::FlowControl* flow = nullptr;
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerHooks hooks);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the OpenAI listener / the admin listener. False + error on failure.
  bool listen(const std::string& host, uint16_t port, std::string* error);
  bool listen_admin(const std::string& host, uint16_t port, std::string* error);
  uint16_t port() const;
  uint16_t admin_port() const;
  // Starts accepting on `threads` io threads; returns immediately.
  void start(unsigned threads);
  // Graceful stop: /ready turns 503 at once; requests in flight (and new
  // ones that still arrive) are served until none is left or `grace` passes;
  // then the listeners close and stop() runs.
  void shutdown(std::chrono::milliseconds grace);
  // Stops at once: cancels connections and joins the io threads.
  void stop();
  // Requests being handled right now.
  int64_t inflight() const;
  // Reads the key sent to workers (router.worker_api_key_file / _env) for
  // `cfg`: at start and on SIGHUP (a rotated file needs no config change).
  // On an error the key in force stays; the message names the config key.
  std::optional<std::string> reload_worker_key(const std::shared_ptr<const Config>& cfg);
  // Open connections and leased body bytes against their limits (metrics).
  struct Limits {
    int64_t connections = 0;
    uint64_t max_connections = 0;
    uint64_t body_bytes = 0;
    uint64_t max_body_bytes = 0;
  };
  Limits limits() const;
  // At every scrape of `r`: the server's gauges in hooks.metrics (requests
  // in flight, connections and body bytes against their limits, the
  // descriptor limit), and the per-worker series of workers that left the
  // registry removed. The server must outlive `r`'s renders.
  void register_metrics(metrics::Registry& r) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvroute
