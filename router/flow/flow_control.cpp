// Flow control: keys, bands, rate limits, metrics (flow_control.h).
#include "router/flow/flow_control.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/json_escape.h"

namespace kvroute::flow {

FlowMetrics::FlowMetrics(metrics::Registry& r)
    // counters
    : tenant_requests_total(r.counter("kvroute_router_tenant_requests_total",
                                      "Proxied requests by tenant (from flow.tenants) and outcome (ok, rate_limited, "
                                      "queue_full, shed, queue_timeout, deadline, unauthorized, error)",
                                      {"tenant", "outcome"})),
      tenant_tokens_total(r.counter("kvroute_router_tenant_tokens_total",
                                    "Prompt tokens of routed requests by tenant", {"tenant"})),
      queue_shed_total(r.counter("kvroute_router_queue_rejected_total",
                                 "Requests the wait queue refused or pushed out, by band and reason (full, shed, "
                                 "timeout, deadline)",
                                 {"band", "reason"})),
      auth_failures_total(r.counter("kvroute_router_auth_failures_total",
                                    "Requests refused 401 by reason (missing, invalid)", {"reason"})),
      // histograms
      queue_wait_seconds(r.histogram("kvroute_router_queue_wait_seconds",
                                     "Time requests waited in the queue, by band and outcome (admitted, timeout, "
                                     "shed, deadline, stopped)",
                                     metrics::exponential_buckets(0.0001, 2, 20), {"band", "outcome"})),
      queue_position(r.histogram("kvroute_router_queue_position",
                                 "Requests of the same model ahead in the queue (same or higher band) at entry",
                                 metrics::exponential_buckets(1, 2, 16), {"band"})) {}

FlowControl::FlowControl() = default;
FlowControl::~FlowControl() = default;

std::shared_ptr<const FlowTables> FlowControl::tables(const std::shared_ptr<const Config>& cfg) {
  std::lock_guard lock(mu_);
  if (tables_ && tables_for_ == cfg.get()) return tables_;
  auto t = std::make_shared<FlowTables>();
  // Validated while the config was parsed (config/config.cpp validate()).
  if (parse_band_entries(cfg->flow.bands, t->bands) || t->bands.empty()) {
    BandEntry normal;
    normal.name = "normal";
    t->bands = {normal};
  }
  if (parse_tenant_entries(cfg->flow.tenants, t->tenants)) t->tenants.clear();
  if (std::none_of(t->tenants.begin(), t->tenants.end(),
                   [](const TenantEntry& e) { return e.name == kDefaultTenant; })) {
    TenantEntry d;
    d.name = std::string(kDefaultTenant);
    t->tenants.push_back(d);
  }
  for (uint32_t i = 0; i < t->tenants.size(); ++i) t->tenant_index.emplace(t->tenants[i].name, i);
  t->default_tenant = t->tenant_index.at(std::string(kDefaultTenant));
  tables_ = t;
  tables_for_ = cfg.get();
  tables_cfg_ = cfg;
  return tables_;
}

std::optional<std::string> FlowControl::reload_keys(const Config& cfg) {
  const std::string& path = cfg.flow.keys_file;
  if (path.empty()) {
    std::lock_guard lock(mu_);
    keys_.reset();
    return std::nullopt;
  }
  std::ifstream in(path);
  if (!in) return fmt::format("flow.keys_file: cannot read '{}'", path);
  std::vector<TenantEntry> tenants;
  parse_tenant_entries(cfg.flow.tenants, tenants);
  auto keys = std::make_shared<std::vector<Key>>();
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (n > 1000000) return fmt::format("flow.keys_file: more than 1000000 lines");
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string hex, tenant, extra;
    if (!(fields >> hex)) continue;  // blank or comment
    if (!(fields >> tenant) || (fields >> extra))
      return fmt::format("flow.keys_file: line {}: expected '<sha256 hex> <tenant>'", n);
    Key k;
    if (!from_hex(hex, k.digest))
      return fmt::format("flow.keys_file: line {}: '{}...' is not 64 hex digits (the key's SHA-256)", n,
                         hex.substr(0, 8));
    if (tenant != kDefaultTenant &&
        std::none_of(tenants.begin(), tenants.end(), [&](const TenantEntry& e) { return e.name == tenant; }))
      return fmt::format("flow.keys_file: line {}: tenant '{}' is not in flow.tenants", n, tenant);
    k.tenant = tenant;
    keys->push_back(std::move(k));
  }
  std::lock_guard lock(mu_);
  keys_ = std::move(keys);
  return std::nullopt;
}

bool FlowControl::keys_enabled() const {
  std::lock_guard lock(mu_);
  return keys_ != nullptr;
}

size_t FlowControl::key_count() const {
  std::lock_guard lock(mu_);
  return keys_ ? keys_->size() : 0;
}

AuthResult FlowControl::authenticate(const FlowTables& t, std::string_view authorization, std::string_view api_key,
                                     uint32_t& tenant) const {
  std::shared_ptr<const std::vector<Key>> keys;
  {
    std::lock_guard lock(mu_);
    keys = keys_;
  }
  if (!keys) {
    tenant = t.default_tenant;
    return AuthResult::Ok;
  }
  std::string_view key = api_key;
  if (key.empty() && authorization.size() > 7 && (authorization.substr(0, 7) == "Bearer " ||
                                                   authorization.substr(0, 7) == "bearer "))
    key = authorization.substr(7);
  while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
  while (!key.empty() && key.back() == ' ') key.remove_suffix(1);
  if (key.empty()) return AuthResult::Missing;
  const Sha256Digest d = sha256(key);
  // Every entry is compared (no early exit), each in constant time: how long
  // this takes says nothing about which digest, or how much of one, matched.
  const Key* found = nullptr;
  for (const Key& k : *keys)
    if (equal_constant_time(k.digest, d) && !found) found = &k;
  if (!found) return AuthResult::Invalid;
  const auto it = t.tenant_index.find(found->tenant);
  if (it == t.tenant_index.end()) return AuthResult::Invalid;  // the tenant left flow.tenants since the keys were read
  tenant = it->second;
  return AuthResult::Ok;
}

std::optional<uint32_t> FlowControl::band_of(const FlowTables& t, std::optional<int64_t> body_priority,
                                             std::string_view header) {
  int64_t p = body_priority.value_or(0);
  if (!header.empty()) {
    for (uint32_t i = 0; i < t.bands.size(); ++i)
      if (t.bands[i].name == header) return i;
    int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(header.data(), header.data() + header.size(), v);
    if (ec != std::errc() || ptr != header.data() + header.size()) return std::nullopt;
    p = v;
  }
  for (uint32_t i = 0; i < t.bands.size(); ++i)
    if (!t.bands[i].bounded || p <= t.bands[i].max_priority_value) return i;
  return static_cast<uint32_t>(t.bands.size() - 1);
}

std::optional<int64_t> FlowControl::engine_priority(const FlowTables& t, uint32_t band,
                                                    std::optional<int64_t> body_priority) {
  if (band >= t.bands.size() || band_of(t, body_priority, "") == band) return std::nullopt;
  const BandEntry& b = t.bands[band];
  const int64_t p = b.bounded ? b.max_priority_value : band > 0 ? t.bands[band - 1].max_priority_value + 1 : 0;
  if (p == 0 && !body_priority) return std::nullopt;
  return p;
}

bool FlowControl::take(Bucket& b, double rate, double burst, double cost, FlowClock::time_point now,
                       uint32_t& retry_after_s) {
  if (!b.primed) {
    b.tokens = burst;
    b.last = now;
    b.primed = true;
  }
  const double dt = std::chrono::duration<double>(now - b.last).count();
  if (dt > 0) b.tokens = std::min(burst, b.tokens + dt * rate);
  b.last = std::max(b.last, now);
  // A request larger than the whole bucket passes once the bucket is full
  // (else it could never pass) and leaves it in debt.
  const double need = std::min(cost, burst);
  if (b.tokens >= need) {
    b.tokens -= cost;
    return true;
  }
  retry_after_s = static_cast<uint32_t>(std::max(1.0, std::ceil((need - b.tokens) / rate)));
  return false;
}

bool FlowControl::take_request(const FlowTables& t, uint32_t tenant, FlowClock::time_point now,
                               uint32_t& retry_after_s) {
  if (tenant >= t.tenants.size()) return true;
  const TenantEntry& e = t.tenants[tenant];
  if (e.rps == 0) return true;
  const double burst = e.burst ? e.burst : std::max<double>(e.rps, 1);
  std::lock_guard lock(mu_);
  return take(request_buckets_[e.name], e.rps, burst, 1, now, retry_after_s);
}

bool FlowControl::take_tokens(const FlowTables& t, uint32_t tenant, uint64_t tokens, FlowClock::time_point now,
                              uint32_t& retry_after_s) {
  if (tenant >= t.tenants.size()) return true;
  const TenantEntry& e = t.tenants[tenant];
  if (e.tps == 0) return true;
  std::lock_guard lock(mu_);
  return take(token_buckets_[e.name], static_cast<double>(e.tps), static_cast<double>(e.tps),
              static_cast<double>(tokens), now, retry_after_s);
}

QueueLimits FlowControl::limits(const Config& cfg, const FlowTables& t) {
  QueueLimits l;
  l.max_count = cfg.scheduler.queue_size;
  l.max_bytes = cfg.flow.queue_max_bytes;
  for (const BandEntry& b : t.bands) l.band_max.push_back(b.max_queued);
  return l;
}

void FlowControl::count(const FlowTables& t, uint32_t tenant, std::string_view outcome) {
  const std::string_view name = tenant < t.tenants.size() ? std::string_view(t.tenants[tenant].name) : kDefaultTenant;
  if (metrics_) metrics_->tenant_requests_total.with({name, outcome}).inc();
  std::lock_guard lock(mu_);
  auto it = outcomes_.find(name);
  if (it == outcomes_.end()) it = outcomes_.emplace(std::string(name), std::map<std::string, uint64_t>{}).first;
  ++it->second[std::string(outcome)];
}

void FlowControl::register_metrics(metrics::Registry& r, const ConfigStore* config) {
  metrics_ = std::make_unique<FlowMetrics>(r);
  r.gauge_fn("kvroute_router_queue_bytes", "Request body bytes waiting in the queue (flow.queue_max_bytes)",
             [this] { return static_cast<double>(queue_.snapshot().bytes); });
  r.collect(metrics::Type::Gauge, "kvroute_router_queue_requests", "Requests waiting in the queue by band", {"band"},
            [this, config](metrics::Samples& s) {
              if (!config) return;
              const auto t = tables(config->get());
              const QueueSnapshot q = queue_.snapshot();
              for (uint32_t i = 0; i < t->bands.size(); ++i)
                s.add({t->bands[i].name}, i < q.by_band.size() ? q.by_band[i] : uint64_t{0});
            });
  r.collect(metrics::Type::Gauge, "kvroute_router_tenant_queued_requests", "Requests waiting in the queue by tenant",
            {"tenant"}, [this, config](metrics::Samples& s) {
              if (!config) return;
              const auto t = tables(config->get());
              const QueueSnapshot q = queue_.snapshot();
              for (uint32_t i = 0; i < t->tenants.size(); ++i) {
                const auto it = q.by_tenant.find(i);
                s.add({t->tenants[i].name}, it == q.by_tenant.end() ? uint64_t{0} : it->second);
              }
            });
}

namespace {

// "null" or the milliseconds since `entered` (steady nanoseconds).
std::string wait_ms(std::optional<int64_t> entered, int64_t now_ns) {
  if (!entered) return "null";
  return fmt::format("{:.1f}", static_cast<double>(std::max<int64_t>(now_ns - *entered, 0)) / 1e6);
}

// The p99 of a band's queue waits since start (every outcome), in ms, from
// the histogram's buckets; "null" before the first.
std::string wait_p99_ms(const FlowMetrics* m, std::string_view band) {
  if (!m) return "null";
  std::vector<uint64_t> counts;
  std::vector<double> bounds;
  m->queue_wait_seconds.for_each([&](const auto& labels, const metrics::Histogram& h) {
    if (labels.empty() || labels[0] != band) return;
    bounds = h.bounds();
    counts.resize(bounds.size() + 1, 0);
    for (size_t i = 0; i < counts.size(); ++i) counts[i] += h.bucket(i);
  });
  const double p99 = metrics::histogram_quantile(bounds, counts, 0.99);
  return std::isnan(p99) ? "null" : fmt::format("{:.1f}", p99 * 1e3);
}

}  // namespace

std::string FlowControl::status_json(const Config& cfg) {
  return status_json(cfg, std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now().time_since_epoch()).count());
}

std::string FlowControl::status_json(const Config& cfg, int64_t now_ns) {
  (void)cfg;
  std::shared_ptr<const FlowTables> t;
  {
    std::lock_guard lock(mu_);
    t = tables_;
  }
  const QueueSnapshot q = queue_.snapshot();
  std::string out = fmt::format(R"({{"queued":{},"queued_bytes":{},"authenticated":{},"keys":{},"bands":[)", q.count,
                                q.bytes, keys_enabled() ? "true" : "false", key_count());
  if (t) {
    for (uint32_t i = 0; i < t->bands.size(); ++i) {
      const auto oldest = i < q.oldest_by_band.size() ? q.oldest_by_band[i] : std::nullopt;
      out += fmt::format(R"({}{{"name":"{}","queued":{},"oldest_wait_ms":{},"wait_p99_ms":{}}})", i ? "," : "",
                         json_escape(t->bands[i].name), i < q.by_band.size() ? q.by_band[i] : 0,
                         wait_ms(oldest, now_ns), wait_p99_ms(metrics_.get(), t->bands[i].name));
    }
  }
  out += R"(],"tenants":[)";
  if (t) {
    std::lock_guard lock(mu_);
    for (uint32_t i = 0; i < t->tenants.size(); ++i) {
      const TenantEntry& e = t->tenants[i];
      const auto qt = q.by_tenant.find(i);
      const auto ot = q.oldest_by_tenant.find(i);
      std::string outcomes;
      if (const auto it = outcomes_.find(e.name); it != outcomes_.end())
        for (const auto& [k, v] : it->second) outcomes += fmt::format(R"({}"{}":{})", outcomes.empty() ? "" : ",", k, v);
      out += fmt::format(
          R"({}{{"name":"{}","weight":{},"rps":{},"tps":{},"cache_salt_pinned":{},"queued":{},"oldest_wait_ms":{},)"
          R"("outcomes":{{{}}}}})",
          i ? "," : "", json_escape(e.name), e.weight, e.rps, e.tps, e.cache_salt.empty() ? "false" : "true",
          qt == q.by_tenant.end() ? 0 : qt->second,
          wait_ms(ot == q.oldest_by_tenant.end() ? std::nullopt : std::optional<int64_t>(ot->second), now_ns),
          outcomes);
    }
  }
  out += "]}";
  return out;
}

}  // namespace kvroute::flow
