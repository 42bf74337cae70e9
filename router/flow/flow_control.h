// Flow control of the OpenAI listener, as the proxy asks for it: who the
// caller is (API keys -> tenant), which priority band a request joins, the
// tenant's rate limits and cache salt, and the shared admission queue
// (flow_queue.h). Tenants and bands come from config only (flow.tenants,
// flow.bands), so every label and table here is bounded by config.
//
// Threading: thread-safe. Config-derived tables are rebuilt when the live
// Config changes (a pointer compare per request); keys are re-read by
// reload_keys() (SIGHUP), swapped whole under a mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/metrics.h"
#include "config/config.h"
#include "config/config_store.h"
#include "router/flow/flow_queue.h"
#include "router/flow/sha256.h"

namespace kvroute::flow {

using FlowClock = std::chrono::steady_clock;

// The tenant of unauthenticated requests (no flow.keys_file), and of every
// request when no tenant is configured.
inline constexpr std::string_view kDefaultTenant = "default";

// The config's bands and tenants, parsed once per Config.
struct FlowTables {
  std::vector<BandEntry> bands;      // highest first
  std::vector<TenantEntry> tenants;  // config order; "default" appended when absent
  std::map<std::string, uint32_t, std::less<>> tenant_index;
  uint32_t default_tenant = 0;
};

enum class AuthResult : uint8_t {
  Ok,       ///< a known key (or no keys configured): the tenant is set
  Missing,  ///< keys are configured and the request carries none: 401
  Invalid,  ///< a key no entry of the keys file hashes to: 401
};

// Per-tenant counters (labels: tenant from config, outcome a fixed set) and
// the queue's series. Created by FlowControl::register_metrics().
struct FlowMetrics {
  explicit FlowMetrics(metrics::Registry& r);
  metrics::CounterFamily& tenant_requests_total;  // {tenant, outcome}
  metrics::CounterFamily& tenant_tokens_total;    // {tenant}
  metrics::CounterFamily& queue_shed_total;       // {band, reason}
  metrics::CounterFamily& auth_failures_total;    // {reason}
  metrics::HistogramFamily& queue_wait_seconds;   // {band, outcome}
  metrics::HistogramFamily& queue_position;       // {band}
};

class FlowControl {
 public:
  FlowControl();
  ~FlowControl();

  // The tables of `cfg` (rebuilt when `cfg` is another Config than last time).
  std::shared_ptr<const FlowTables> tables(const std::shared_ptr<const Config>& cfg);

  // Reads flow.keys_file (empty: no keys, unauthenticated mode). On an
  // error the keys in force stay and the message says why. Every tenant a
  // key names must be in flow.tenants (or be "default").
  std::optional<std::string> reload_keys(const Config& cfg);
  bool keys_enabled() const;
  size_t key_count() const;

  // The caller's tenant from `Authorization: Bearer <key>` or `x-api-key`.
  AuthResult authenticate(const FlowTables& t, std::string_view authorization, std::string_view api_key,
                          uint32_t& tenant) const;

  // The band of a request: the x-kvroute-priority header (a band name or an
  // integer priority) wins over the body's vLLM priority. nullopt: the
  // header is neither (the caller answers 400).
  static std::optional<uint32_t> band_of(const FlowTables& t, std::optional<int64_t> body_priority,
                                         std::string_view header);
  // The vLLM priority an engine should see for a request of `band`
  // (flow.forward_priority): nullopt when the body's own priority already
  // joins that band (forwarded unchanged; an absent one is vLLM's default 0),
  // else the band's max_priority (the last, unbounded band: one past the band
  // above's, 0 when it is the only band), nullopt again when that is an
  // absent body priority's 0.
  static std::optional<int64_t> engine_priority(const FlowTables& t, uint32_t band,
                                                std::optional<int64_t> body_priority);

  // The tenant's request-rate limit: true if one request may pass now; else
  // `retry_after_s` says when one will.
  bool take_request(const FlowTables& t, uint32_t tenant, FlowClock::time_point now, uint32_t& retry_after_s);
  // The tenant's token-rate limit for a request of `tokens` prompt tokens.
  bool take_tokens(const FlowTables& t, uint32_t tenant, uint64_t tokens, FlowClock::time_point now,
                   uint32_t& retry_after_s);

  // The queue limits of `cfg` (scheduler.queue_size, flow.queue_max_bytes,
  // the bands' max_queued).
  static QueueLimits limits(const Config& cfg, const FlowTables& t);

  FlowQueue& queue() { return queue_; }
  const FlowQueue& queue() const { return queue_; }

  // Series at scrape time (queue depth by band, bytes, per-tenant queued)
  // and the counters above. The FlowControl must outlive `r`'s renders.
  void register_metrics(metrics::Registry& r, const ConfigStore* config);
  FlowMetrics* metrics() const { return metrics_.get(); }

  // The status page's and explain's view: the queue by band and tenant, and
  // each tenant's limits and counts so far (a JSON object). The queue wait:
  // per band and tenant how long its oldest waiter has waited
  // (`oldest_wait_ms`, null when none waits; `now_ns` is the clock the
  // waiters' entry times are in, steady nanoseconds), and per band the p99
  // of the waits that ended since start (`wait_p99_ms`, from
  // kvroute_router_queue_wait_seconds' buckets as histogram_quantile() reads
  // them; null before the first).
  std::string status_json(const Config& cfg, int64_t now_ns);
  std::string status_json(const Config& cfg);  // now_ns: the steady clock now
  // Counts a finished request of a tenant by outcome (ok, rate_limited,
  // queue_full, shed, queue_timeout, deadline, unauthorized, error).
  void count(const FlowTables& t, uint32_t tenant, std::string_view outcome);

 private:
  struct Bucket {
    double tokens = 0;
    FlowClock::time_point last{};
    bool primed = false;
  };
  static bool take(Bucket& b, double rate, double burst, double cost, FlowClock::time_point now,
                   uint32_t& retry_after_s);

  FlowQueue queue_;
  mutable std::mutex mu_;
  const Config* tables_for_ = nullptr;
  std::shared_ptr<const Config> tables_cfg_;  // keeps tables_for_ alive
  std::shared_ptr<const FlowTables> tables_;
  struct Key {
    Sha256Digest digest;
    std::string tenant;
  };
  std::shared_ptr<const std::vector<Key>> keys_;  // null: no keys file
  std::map<std::string, Bucket, std::less<>> request_buckets_, token_buckets_;  // by tenant name
  std::map<std::string, std::map<std::string, uint64_t>, std::less<>> outcomes_;  // tenant -> outcome -> n
  std::unique_ptr<FlowMetrics> metrics_;
};

}  // namespace kvroute::flow
