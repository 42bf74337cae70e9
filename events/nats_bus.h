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

// Authentication and TLS (config keys events.nats_*; at most one way to
// authenticate). Empty strings are unset.
struct NatsSecurity {
  std::string user, password;  // user/password
  std::string token;           // token
  std::string creds_file;      // JWT + seed (.creds)
  std::string nkey_seed_file;  // nkey seed; the public key is derived from it
  bool tls = false;            // require TLS (a tls:// URL implies it)
  std::string tls_ca_file;     // trusted CA(s) for the server's certificate
  std::string tls_cert_file, tls_key_file;  // client certificate (mutual TLS)
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
  // The same with authentication and TLS. An authentication or TLS refusal is
  // reported at once (no retries: it would not change).
  static std::unique_ptr<NatsBus> connect(const std::string& url, const std::string& client_name,
                                          std::chrono::milliseconds connect_timeout, const NatsSecurity& security,
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
  // The largest message the server accepts (its max_payload), read from the
  // connection; 1 MiB (the server default) while disconnected.
  size_t max_payload() const;
  // Runs `f` on a libnats thread after each reconnection (events published
  // while disconnected may be lost). Set before traffic starts; `f` must stay
  // valid until the bus is destroyed and must not block.
  void on_reconnected(std::function<void()> f);

 private:
  struct Impl;
  explicit NatsBus(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> reconnects_{0};
  friend struct Impl;
};

}  // namespace kvroute
