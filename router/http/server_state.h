// What every part of the HTTP server shares across io threads: the hooks into
// the rest of kvroute, the counters the limits are checked against, the
// lifecycle flags, the engine-token cache and the wait queue.
//
// Threading: shared by every io thread and the admin thread; the counters and
// flags are atomics, the cache and backoff lock inside, the hooks point to
// thread-safe objects (server.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "router/api/response_affinity.h"
#include "router/engine_tokenizer.h"
#include "router/flow/flow_control.h"
#include "router/http/admission_queue.h"
#include "router/http/server.h"
#include "router/http/worker_credential.h"

namespace kvroute {

struct ServerState {
  explicit ServerState(HttpServerHooks h)
      : hooks(std::move(h)),
        engine_cache(hooks.config ? hooks.config->get()->tokenizer.remote_cache_bytes : 0),
        own_flow(hooks.flow ? nullptr : std::make_unique<flow::FlowControl>()),
        flow(hooks.flow ? *hooks.flow : *own_flow),
        queue(flow.queue()) {
    // A worker with room wakes the queue's waiters (no polling).
    if (hooks.registry) hooks.registry->set_capacity_listener(&capacity_listener);
  }
  ~ServerState() {
    if (hooks.registry) hooks.registry->set_capacity_listener(nullptr);
  }
  ServerState(const ServerState&) = delete;
  ServerState& operator=(const ServerState&) = delete;

  HttpServerHooks hooks;
  // Answers of engines' POST /tokenize (tokenizer.remote), and the per-model
  // backoff after failures (router/engine_tokenizer.h).
  EngineTokenCache engine_cache;
  EngineTokenizeBackoff engine_backoff;
  // Tenants, keys, bands, rate limits and the wait queue (router/flow/):
  // the daemon's (hooks.flow), else this server's own.
  std::unique_ptr<flow::FlowControl> own_flow;
  flow::FlowControl& flow;
  AdmissionQueue queue;  // requests waiting for a free worker
  // The key kvroute sends workers (router.worker_api_key_file / _env).
  WorkerCredential worker_key;
  // Which worker produced each Responses API answer (previous_response_id affinity).
  ResponseAffinity responses;
  const WorkerRegistry::CapacityListener capacity_listener = [this](std::string_view model) {
    flow.queue().notify(model);
  };
  std::atomic<bool> stopping{false};
  std::atomic<bool> draining{false};  // shutting down: /ready 503, no keep-alive
  std::atomic<int64_t> inflight{0};   // proxied requests being handled
  std::atomic<int64_t> connections{0};        // open client connections of the OpenAI listener
  std::atomic<int64_t> admin_connections{0};  // open connections of the admin listener
  std::atomic<uint64_t> body_bytes{0};        // request body bytes leased (BodyLease)
  std::atomic<uint64_t> connections_refused{0};

  // The admin listener's own connection cap: an operator's tools need a few;
  // a flood of them must not take every descriptor.
  static constexpr uint64_t kMaxAdminConnections = 256;
  // Bytes a buffer of an idle connection may keep.
  static constexpr size_t kKeptCapacity = 64 * 1024;

  // router.max_connections, 0 = half of the descriptor limit (each client
  // connection may hold an upstream connection too).
  uint64_t connection_limit(const Config& cfg) const {
    if (cfg.router.max_connections) return cfg.router.max_connections;
    return std::max<uint64_t>(64, hooks.open_files_limit / 2);
  }
  // kvroute_router_requests_total{route,status,model}.
  void count(std::string_view route, unsigned status, std::string_view model) {
    if (hooks.metrics) hooks.metrics->request(route, status, model).inc();
  }
};

}  // namespace kvroute
