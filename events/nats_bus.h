// The only NATS connection wrapper in kvroute (events/ is the only code that
// includes nats.h). Wraps one libnats connection with automatic reconnects.
//
// Threading: publish/request/subscribe are thread-safe. Subscription handlers
// run on libnats' per-subscription dispatcher thread; they must be quick
// (decode and hand off to a queue) and must not call back into the index.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace kvroute {

struct NatsMessage {
  std::string_view subject;
  std::string_view data;
  std::string_view reply;  // empty unless the sender expects an answer
};

class NatsBus {
 public:
  using Handler = std::function<void(const NatsMessage&)>;

  // Connects to `url` (e.g. "nats://127.0.0.1:4222"). Retries the initial
  // connect for up to `connect_timeout`; returns nullptr and sets `error` if
  // the server cannot be reached by then.
  static std::unique_ptr<NatsBus> connect(const std::string& url, const std::string& client_name,
                                          std::chrono::milliseconds connect_timeout,
                                          std::string* error);
  ~NatsBus();
  NatsBus(const NatsBus&) = delete;
  NatsBus& operator=(const NatsBus&) = delete;

  // Subscribes for the lifetime of this object. Returns false and sets `error` on failure.
  bool subscribe(const std::string& subject, Handler handler, std::string* error);
  // Queues a message; false if the connection is closed (reconnecting buffers).
  bool publish(std::string_view subject, std::string_view data);
  // Request/reply; returns the reply body, or nullopt on timeout or no responder.
  std::optional<std::string> request(std::string_view subject, std::string_view data,
                                     std::chrono::milliseconds timeout);
  // Flushes pending publishes to the server (bounded by timeout).
  bool flush(std::chrono::milliseconds timeout);

  bool connected() const;
  uint64_t reconnects() const { return reconnects_.load(std::memory_order_relaxed); }

 private:
  struct Impl;
  explicit NatsBus(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> reconnects_{0};
  friend struct Impl;
};

}  // namespace kvroute
