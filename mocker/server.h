// kvroute-mocker's OpenAI-compatible HTTP server around the engine model.
// Threading: everything (HTTP sessions, engine, timers) runs on ONE io thread;
// NATS callbacks (resync requests) only post work to it. run() blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mocker/engine.h"

namespace kvroute {
class NatsBus;
}

namespace kvroute::mocker {

struct MockerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  uint64_t worker_id = 1;
  std::string model = "mock-model";
  std::string subject_prefix = "kvroute";
  std::string advertise_url;  // URL in heartbeats; empty = http://host:port
  uint32_t heartbeat_ms = 500;
  double speedup = 1.0;  // engine ms per real ms
  EngineConfig engine;
};

class MockerServer {
 public:
  // `bus` may be null (no NATS: no events, no heartbeats).
  MockerServer(MockerOptions opts, NatsBus* bus);
  ~MockerServer();
  bool listen(std::string* error);
  uint16_t port() const;
  // Subscribes to resync requests (if a bus is given). False + error on failure.
  bool start_nats(std::string* error);
  void run();   // serves until stop()
  void stop();  // thread-safe

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvroute::mocker
