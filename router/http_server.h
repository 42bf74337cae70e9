// The OpenAI-compatible HTTP front end and streaming proxy (Boost.Beast).
// Every Beast template lives in http_server.cpp, so this header is cheap.
//
// Threading: `start(n)` runs n io threads over one io_context; each client
// connection is one coroutine on its own strand. Hooks are called from io
// threads and must be thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "config/config_store.h"
#include "router/routing.h"
#include "scheduler/worker_registry.h"

namespace kvroute {

struct HttpServerHooks {
  RoutingService* routing = nullptr;
  WorkerRegistry* registry = nullptr;
  const ConfigStore* config = nullptr;
  // GET /ready answers 200 only when this returns true.
  std::function<bool()> ready;
  // GET /metrics body (Prometheus text format).
  std::function<std::string()> metrics;
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerHooks hooks);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens. Returns false and sets `error` on failure.
  bool listen(const std::string& host, uint16_t port, std::string* error);
  // The bound port (useful with port 0).
  uint16_t port() const;
  // Starts accepting on `threads` io threads; returns immediately.
  void start(unsigned threads);
  // Stops accepting, cancels connections and joins the io threads.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvroute
