// kvroute configuration: one struct per module, one schema that drives YAML
// loading, flag and environment overrides, validation and the effective-config
// dump. config/README.md documents every key; helm/values.yaml mirrors it.
//
// Threading: a Config is a plain value. The daemon keeps the live one in a
// ConfigStore (config/config_store.h) and swaps it atomically on reload.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute {

struct RouterConfig {
  std::string host = "0.0.0.0";
  uint32_t port = 8080;                 // 0 = ephemeral (tests)
  uint32_t threads = 2;                 // HTTP io threads
  uint64_t max_body_bytes = 8 << 20;    // larger request bodies get 413
  uint32_t connect_timeout_ms = 1000;   // upstream TCP connect
  uint32_t first_byte_timeout_ms = 60000;  // request sent -> response header
  uint32_t idle_timeout_ms = 60000;     // between two body reads/writes of a stream
  uint32_t client_read_timeout_ms = 30000;  // request header+body from the client
  uint32_t max_attempts = 3;            // workers tried before the first response byte
};

struct EventsConfig {
  std::string nats_url = "nats://127.0.0.1:4222";
  std::string subject_prefix = "kvroute";
  uint32_t worker_ttl_ms = 3000;        // heartbeat silence after which a worker is dead
  uint32_t connect_timeout_ms = 10000;  // initial NATS connect retries
  uint32_t queue_capacity = 65536;      // decoded messages waiting for the index writer
};

struct IndexerConfig {
  uint32_t block_size = 16;             // tokens per KV block; must equal the workers'
};

struct SchedulerConfig {
  double alpha_balanced = 0.3;
  double alpha_imbalanced = 0.7;
  double balance_threshold = 0.1;
  double gamma = 0.1;                   // weight of request-slot load
  double delta = 0.1;                   // weight of queued requests
};

struct Config {
  RouterConfig router;
  EventsConfig events;
  IndexerConfig indexer;
  SchedulerConfig scheduler;
};

// One documented key of the schema.
struct KeyInfo {
  std::string_view path;  // "scheduler.gamma"
  std::string_view doc;
  double min = 0;
  double max = std::numeric_limits<double>::max();
  bool is_string = false;
};

// Visits every key: f(const KeyInfo&, T& field) with T one of std::string,
// uint32_t, uint64_t, double. The single source of truth for the schema.
template <class C, class F>
void for_each_key(C& c, F&& f);

// The list of keys with their docs and ranges (for --help and docs).
std::vector<KeyInfo> config_keys();

// Sets one key from text ("0.5", "nats://..."). Returns an error message that
// names the key and the allowed range, or nullopt on success.
std::optional<std::string> set_key(Config& c, std::string_view path, std::string_view value);

// Reads a YAML document over `c` (keys absent from it keep their values).
// Unknown keys and bad values are errors naming the key.
std::optional<std::string> apply_yaml(Config& c, std::string_view yaml_text);
std::optional<std::string> load_yaml_file(Config& c, const std::string& path);

// Applies KVROUTE_<SECTION>_<KEY> environment variables (e.g. KVROUTE_SCHEDULER_GAMMA).
std::optional<std::string> apply_env(Config& c, char** envp);

// Cross-key checks that a single key's range cannot express.
std::optional<std::string> validate(const Config& c);

// The effective configuration as YAML (every key, also defaults).
std::string to_yaml(const Config& c);

// ---- implementation of the schema ----

template <class C, class F>
void for_each_key(C& c, F&& f) {
  constexpr double kMaxU32 = 4294967295.0;
  f(KeyInfo{"router.host", "Address the OpenAI listener binds.", 0, 0, true}, c.router.host);
  f(KeyInfo{"router.port", "Port of the OpenAI listener (0 = ephemeral).", 0, 65535}, c.router.port);
  f(KeyInfo{"router.threads", "HTTP io threads.", 1, 256}, c.router.threads);
  f(KeyInfo{"router.max_body_bytes", "Largest request body accepted; larger gets 413.", 1024, 1 << 30},
    c.router.max_body_bytes);
  f(KeyInfo{"router.connect_timeout_ms", "Upstream TCP connect timeout.", 1, 600000}, c.router.connect_timeout_ms);
  f(KeyInfo{"router.first_byte_timeout_ms", "Request sent to first response byte from the worker.", 1, 3600000},
    c.router.first_byte_timeout_ms);
  f(KeyInfo{"router.idle_timeout_ms", "Longest silence while relaying a response.", 1, 3600000},
    c.router.idle_timeout_ms);
  f(KeyInfo{"router.client_read_timeout_ms", "Time allowed to receive a client's whole request.", 1, 3600000},
    c.router.client_read_timeout_ms);
  f(KeyInfo{"router.max_attempts", "Workers tried before the first response byte (1 = no retry).", 1, 16},
    c.router.max_attempts);
  f(KeyInfo{"events.nats_url", "NATS server URL.", 0, 0, true}, c.events.nats_url);
  f(KeyInfo{"events.subject_prefix", "Prefix of the NATS subjects ({prefix}.kv_events, {prefix}.workers).", 0, 0, true},
    c.events.subject_prefix);
  f(KeyInfo{"events.worker_ttl_ms", "Heartbeat silence after which a worker leaves candidates and index.", 100,
            3600000},
    c.events.worker_ttl_ms);
  f(KeyInfo{"events.connect_timeout_ms", "How long start-up retries the first NATS connect.", 0, 3600000},
    c.events.connect_timeout_ms);
  f(KeyInfo{"events.queue_capacity", "Decoded event messages queued for the index writer; beyond, dropped.", 16,
            kMaxU32},
    c.events.queue_capacity);
  f(KeyInfo{"indexer.block_size", "Tokens per KV block; must match the workers' block size.", 1, 65536},
    c.indexer.block_size);
  f(KeyInfo{"scheduler.alpha_balanced", "Weight of load deviation vs prefill cost when load is even.", 0, 1},
    c.scheduler.alpha_balanced);
  f(KeyInfo{"scheduler.alpha_imbalanced", "Weight of load deviation when load is uneven.", 0, 1},
    c.scheduler.alpha_imbalanced);
  f(KeyInfo{"scheduler.balance_threshold", "Load is uneven when std > threshold * mean.", 0, 100},
    c.scheduler.balance_threshold);
  f(KeyInfo{"scheduler.gamma", "Weight of request-slot usage.", 0, 100}, c.scheduler.gamma);
  f(KeyInfo{"scheduler.delta", "Weight of waiting requests (relative to the most-queued worker).", 0, 100},
    c.scheduler.delta);
}

}  // namespace kvroute
