// The credential kvroute presents to workers, and which credential fields a
// forwarded request carries.
//
// A client's `Authorization` / `x-api-key` are kvroute's business: with API
// keys in force (flow.keys_file) they are the client's key for kvroute, and
// an engine must never see them. Workers that require a key (vLLM
// `--api-key`: its AuthenticationMiddleware in
// vllm/entrypoints/openai/server_utils.py checks `Authorization: Bearer` on
// every /v1 path) get kvroute's own, from router.worker_api_key_file or the
// environment variable router.worker_api_key_env. Only an operator who opts
// in (router.forward_client_credentials, refused with keys or a worker key)
// has the client's own fields passed on, as a transparent proxy would.
//
// The key is never logged and never in the Config (so never in the
// effective-config dump, explain or the status page): the Config holds only
// where to read it.
//
// Threading: thread-safe. The key in force is swapped whole under a mutex
// when the Config it was read for changes, or on reload() (SIGHUP).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"

namespace kvroute {

class WorkerCredential {
 public:
  struct Key {
    std::string authorization;  // "Bearer <key>", or empty (no worker key)
    std::string fields;         // "Authorization: Bearer <key>\r\n", or empty
  };

  // Reads the key `cfg` names (file or environment variable; neither: no
  // key). On an error the key in force stays and the message names the
  // config key (never the secret).
  std::optional<std::string> reload(const std::shared_ptr<const Config>& cfg);

  // The key in force for `cfg`: read again when `cfg` is another Config than
  // the last one (a reload through the admin API); a read that fails keeps
  // the previous key and logs a warning (rate-limited).
  std::shared_ptr<const Key> get(const std::shared_ptr<const Config>& cfg);

  // Reads the key named by `rc` into `out`. Error: a message naming the key.
  // A key is one line of visible ASCII (no spaces, at most 4096 bytes): it
  // goes into a header field as is.
  static std::optional<std::string> read_key(const RouterConfig& rc, Key& out);

  // Re-reads that failed (reload() or get() after a config change) since
  // construction: kvroute_router_worker_key_reload_failures_total, read at
  // scrape time (HttpServer::register_metrics()).
  uint64_t reload_failures() const { return reload_failures_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> reload_failures_{0};
  std::mutex mu_;
  const Config* for_ = nullptr;
  std::shared_ptr<const Config> for_holder_;  // keeps for_ alive
  std::shared_ptr<const Key> key_ = std::make_shared<Key>();
};

// The credential fields of a request forwarded to a worker: the worker key
// when one is configured; else the client's own fields when `forward_client`
// (router.forward_client_credentials, and no flow.keys_file); else none.
inline std::string_view worker_credential_fields(const WorkerCredential::Key& key, bool forward_client,
                                                 std::string_view client_fields) {
  if (!key.fields.empty()) return key.fields;
  return forward_client ? client_fields : std::string_view();
}

// The Authorization value of a request kvroute sends a worker on its own
// account (POST /tokenize), by the same rule.
inline std::string_view worker_authorization(const WorkerCredential::Key& key, bool forward_client,
                                             std::string_view client_authorization) {
  if (!key.authorization.empty()) return key.authorization;
  return forward_client ? client_authorization : std::string_view();
}

// Whether `cfg` passes clients' own credentials on (never with API keys).
inline bool forwards_client_credentials(const Config& cfg) {
  return cfg.router.forward_client_credentials && cfg.flow.keys_file.empty();
}

}  // namespace kvroute
