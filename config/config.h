// kvroute configuration: one struct per module, one schema that drives YAML
// loading, flag and environment overrides, validation and the effective-config
// dump. config/README.md documents every key; helm/values.yaml mirrors it.
//
// Threading: a Config is a plain value. The daemon keeps the live one in a
// ConfigStore (config/config_store.h) and swaps it atomically on reload.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"

namespace kvroute {

struct RouterConfig {
  std::string host = "0.0.0.0";
  uint32_t port = 8080;                 // 0 = ephemeral (tests)
  uint32_t threads = 2;                 // HTTP io threads
  uint64_t max_body_bytes = 8 << 20;    // larger request bodies get 413
  uint32_t max_concurrent_requests = 20000;  // beyond: 503
  uint32_t connect_timeout_ms = 1000;   // upstream TCP connect
  uint32_t first_byte_timeout_ms = 60000;  // request sent -> response header
  uint32_t idle_timeout_ms = 60000;     // between two body reads/writes of a stream
  uint32_t client_read_timeout_ms = 30000;  // request header+body from the client
  uint32_t max_attempts = 3;            // workers tried before the first response byte
  uint32_t upstream_pool_size = 64;     // idle keep-alive connections kept per worker
  uint32_t shutdown_grace_ms = 30000;   // SIGTERM: how long in-flight requests may finish
  uint32_t max_header_bytes = 8192;     // request line + fields; beyond: 431 (what a worker accepts)
  uint32_t first_byte_timeout_min_ms = 10000;  // floor of the adaptive first-byte timeout
  double first_byte_timeout_factor = 4.0;      // adaptive first-byte timeout = factor x predicted TTFT
  double ttft_prefill_tokens_per_s = 1000;     // conservative prefill rate for the predicted TTFT
  // Open client connections on the OpenAI listener; beyond, new ones are
  // answered 503 and closed. 0 = half of the descriptor limit (RLIMIT_NOFILE).
  uint32_t max_connections = 0;
  // Bytes of request bodies being received or held at once (all connections);
  // a request whose body does not fit gets 503 before its body is read.
  uint64_t max_body_bytes_in_flight = 256ull << 20;
  // The credential kvroute sends workers (vLLM --api-key) as `Authorization:
  // Bearer`: read from this file (its first line), or from the environment
  // variable this names; at most one is set; empty = none. The secret itself
  // never enters the Config (router/http/worker_credential.h holds it).
  std::string worker_api_key_file;
  std::string worker_api_key_env;
  // Pass the client's own Authorization / x-api-key on to workers. Only
  // without flow.keys_file (the clients' keys are then kvroute's own) and
  // without a worker key; off by default: a credential meant for the router
  // never reaches an engine.
  bool forward_client_credentials = false;
  // Responses API ids remembered with the worker that produced them
  // (previous_response_id affinity, router/api/response_affinity.h).
  uint32_t response_affinity_max_ids = 65536;
};

struct AdminConfig {
  // Loopback unless configured: the admin API (config, drain, workers) is
  // never exposed by the router's own 0.0.0.0. Empty = router.host.
  std::string host = "127.0.0.1";
  uint32_t port = 8081;                 // 0 = ephemeral (tests)
  std::string token;                    // bearer token; empty = admin API refuses every request
  uint64_t max_body_bytes = 1 << 20;    // larger admin request bodies get 413
};

struct EventsConfig {
  std::string nats_url = "nats://127.0.0.1:4222";
  std::string subject_prefix = "kvroute";
  uint32_t worker_ttl_ms = 2500;        // heartbeat silence after which a worker is dead
  uint32_t connect_timeout_ms = 10000;  // initial NATS connect retries
  uint32_t queue_capacity = 65536;      // decoded messages waiting for the index writer
  uint32_t resync_timeout_ms = 2000;    // wait for a worker's full dump after a gap
  // --- resync, ingest memory, NATS authentication and TLS ---
  uint32_t resync_concurrency = 4;      // dumps fetched at once (router start, reconnect)
  uint32_t resync_backoff_ms = 500;     // least time between two dumps of one worker; doubles per dump
  uint32_t resync_backoff_max_ms = 30000;  // ceiling of that backoff
  uint64_t queue_capacity_bytes = 256ull << 20;  // decoded events waiting for the writer, by bytes
  double queue_worker_share = 0.25;     // fraction of both queue bounds one worker may fill
  std::string nats_user;                // user/password authentication
  std::string nats_password;
  std::string nats_token;               // token authentication
  std::string nats_creds_file;          // JWT + nkey seed (.creds) file
  std::string nats_nkey_seed_file;      // nkey seed file (nkey authentication)
  bool nats_tls = false;                // require TLS (also implied by a tls:// URL)
  std::string nats_tls_ca_file;         // CA that signed the server's certificate
  std::string nats_tls_cert_file;       // client certificate (mutual TLS), with nats_tls_key_file
  std::string nats_tls_key_file;
  bool replica_sync = true;             // share in-flight load with other router replicas
  uint32_t replica_sync_interval_ms = 5;   // at most one in-flight snapshot per interval (when changed)
  uint32_t replica_ttl_ms = 1000;       // a replica silent this long stops counting
  // Bus-announced workers (heartbeats) whose URL may join: CIDRs, IPs or URL
  // origins (http://host:port), comma-separated; "*" = any (warned at start).
  std::string worker_url_allow = "127.0.0.0/8,::1";
  uint32_t max_bus_workers = 1024;      // bus-announced workers known at once; beyond, new ones are refused
};

// Workers the router knows itself and how it judges them (fleet/).
struct WorkersConfig {
  // Static workers: entries separated by ';', fields `key=value` separated by
  // ','. In YAML also a list of mappings (see config/README.md). Parsed by
  // parse_worker_entries().
  std::string static_list;
  uint32_t scrape_interval_ms = 250;    // /metrics of every router-known worker
  uint32_t scrape_timeout_ms = 1000;    // one scrape: connect + answer
  uint32_t eject_after_failures = 3;    // consecutive failed scrapes / timeouts / 5xx
  uint32_t eject_base_ms = 2000;        // first outlier ejection (doubles per ejection in a row)
  uint32_t eject_max_ms = 30000;
};

struct DiscoveryConfig {
  // DNS names re-resolved every dns_interval_ms; every A/AAAA record is one
  // worker. Same syntax as workers.static; parsed by parse_dns_entries().
  std::string dns;
  uint32_t dns_interval_ms = 5000;
  // "host:port" servers to ask, comma-separated; empty = the system's (/etc/resolv.conf).
  std::string dns_servers;
};

struct IndexerConfig {
  uint32_t block_size = 16;             // tokens per KV block; must equal the workers'
  bool approximate = false;             // treat every worker as publishing no events
  uint32_t approx_ttl_ms = 120000;      // predicted blocks expire after this
  uint64_t approx_max_entries = 1000000;  // predicted (block, worker) entries kept
  uint64_t max_blocks_per_worker = 1ull << 22;  // ceiling of blocks indexed per worker (all dp ranks)
  double capacity_slack = 2.0;  // a worker may hold its declared KV capacity times this in the index
  // Shared KV pools (tiers several workers mount): entries
  // `name=N,medium=M,workers=ID:ID,bandwidth_mb_s=B,kv_bytes_per_token=K[,prefill_tokens_per_s=P][,max_blocks=X]`
  // separated by ';' (YAML: a list under top-level `kv_pools:`). parse_pool_entries().
  std::string kv_pools;
};

struct SchedulerConfig {
  double alpha_balanced = 0.3;
  // Equal to alpha_balanced by default (kvroute-sim: the 0.7 switch moved
  // long sessions off their caches; config/README.md).
  double alpha_imbalanced = 0.3;
  double balance_threshold = 0.1;
  // 0.5: kvroute-sim tune's best on the train slices (docs/sim/tune.txt; config/README.md).
  double gamma = 0.5;                   // weight of request-slot load
  double delta = 0.1;                   // weight of queued requests
  // Value of a cached block by storage tier, relative to recomputing it (0) or
  // a device hit (1).
  double tier_weight_device = 1.0;
  double tier_weight_host_pinned = 0.8;
  double tier_weight_disk = 0.5;
  double tier_weight_external = 0.3;
  // Value of a block in shared pool p (tier kNumBaseTiers + p): 1 - its load
  // time / its recompute time, from indexer.kv_pools (pool_tier_weight()).
  // Not a key: set by apply_pool_weights() once the config is read.
  std::array<double, kMaxPools> tier_weight_pool{};
  // Weight of prefill tokens the router has in flight on a worker (not yet
  // answered with a first byte), added to this request's new tokens. 0 = the
  // baseline weighted cost (Dynamo v0.1's formula, scheduler/README.md).
  double pending_prefill_weight = 0.2;
  // In-flight KV (predicted load): false = every in-flight request's whole
  // prompt; true = its uncached blocks, plus the largest cached prefix among
  // the worker's in-flight requests once (WorkerRegistry::begin_request).
  bool inflight_prefix_once = true;
  // Busy thresholds: a worker at or over any of them is skipped.
  double busy_kv_usage = 1.0;           // kv_active / kv_total
  double busy_slot_usage = 1.0;         // active / total request slots
  uint32_t busy_waiting_requests = 0;   // num_requests_waiting; 0 = no limit
  uint32_t queue_size = 0;              // requests that may wait for a free worker; 0 = 503 at once
  uint32_t queue_timeout_ms = 5000;     // longest wait in that queue
  // Every worker busy and no queue (queue_size 0): false = the request goes to
  // the best busy worker (its engine queues it); true = 503 at once.
  bool reject_when_busy = false;
  double temperature = 0;               // 0 = lowest cost; > 0 = softmax sampling over -cost/T
  // "weighted" (the alpha/gamma/delta formula) or "predicted_ttft" (each
  // candidate's expected time to first token from an online model).
  std::string cost = "weighted";
  // Keep a conversation (x-session-id header, else the OpenAI `user` field) on
  // its worker while that worker is not overloaded (router/session_affinity.h).
  bool session_affinity = false;
};

// Disaggregated (prefill/decode) routing: when a request is split between a
// prefill and a decode worker (scheduler/pd_decision.h). Applies only to models
// with workers of role prefill or decode.
struct PdConfig {
  // "conditional": disaggregate unless the decode worker's uncached tokens are
  // below min_uncached_tokens or the prefill pool is busy; "always": whenever
  // a prefill worker exists; "never": every request aggregated on the decode side.
  std::string policy = "conditional";
  uint32_t min_uncached_tokens = 512;   // conditional: fewer uncached tokens on the decode worker run there whole
  uint64_t prefill_busy_tokens = 0;     // conditional: best prefill worker's queued prefill tokens at which the pool is busy; 0 = off
  // conditional: the decode worker's KV usage (with the request's blocks it
  // does not hold) above which it never runs a request whole; 0 = off.
  double decode_busy_kv_usage = 0;
  // conditional: run whole when predicted TTFT on the decode worker ≤ this ×
  // the split's predicted TTFT (prefill + transfer); 0 = off.
  double aggregate_time_ratio = 0;
  double transfer_ms_per_1k_tokens = 2.62;  // KV transfer time per 1,000 tokens (prediction only)
  // The decode worker's choice weighs KV load against the prefill term with
  // this alpha (both of scheduler.alpha_balanced / alpha_imbalanced, for the
  // decode side only); -1 = the scheduler's. A decode worker's own cached
  // prefix only shortens a transfer, its KV holds every decode.
  double decode_alpha = -1;
  // The wire protocol of a split request (docs/design/pd-protocols.md):
  // "vllm_nixl" (prefill leg first, its kv_transfer_params relayed to the
  // decode leg), "vllm_mooncake" (prefill leg first with a router-minted
  // transfer_id, the decode leg told the prefill worker's bootstrap address
  // and engine id) or "sglang" (both legs at once, a bootstrap room).
  std::string protocol = "vllm_nixl";
  // Per-model exceptions to `protocol`: "model=protocol" entries separated by
  // ',' (pd_protocol_of()).
  std::string model_protocols;
  uint32_t prefill_timeout_ms = 30000;  // one prefill leg (connect to its whole answer); then the next prefill worker
  // When no prefill worker could prefill the request: "fallback" runs it whole
  // on its decode worker; "fail" answers 503 in the API's shape.
  std::string on_prefill_failure = "fallback";
  // vllm_mooncake: send the prefill leg and the decode leg at once, as vLLM's
  // proxy does (the decode engine's pull waits for the prefill); false: the
  // decode leg once the prefill leg answered.
  bool mooncake_concurrent_legs = false;
};

// The protocol a disaggregated request to `model` speaks: its
// pd.model_protocols entry, else pd.protocol.
enum class PdProtocol : uint8_t { VllmNixl, VllmMooncake, Sglang };
std::string_view to_string(PdProtocol p);
bool parse_pd_protocol(std::string_view s, PdProtocol& out);
PdProtocol pd_protocol_of(const PdConfig& pd, std::string_view model);
// Checks pd.model_protocols: "model=protocol" entries separated by ','.
std::optional<std::string> check_model_protocols(std::string_view text);

// Flow control of the OpenAI listener (router/flow/): priority bands, tenants
// and their API keys, rate limits, the wait queue's byte bound.
struct FlowConfig {
  // Priority bands, highest first: entries `name=N[,max_priority=P][,max_queued=Q]`
  // separated by ';'. A request's vLLM `priority` (lower = more urgent; 0 by
  // default) joins the first band whose max_priority is >= it; the last band
  // takes the rest. parse_band_entries().
  std::string bands = "name=high,max_priority=-1;name=normal";
  uint64_t queue_max_bytes = 64ull << 20;  // request bodies waiting in the queue; beyond, 429 (or shed)
  uint32_t retry_after_s = 1;              // Retry-After of a 429 for a full queue or a timed-out wait
  // File of API keys: lines `<sha256 hex of the key> <tenant>`; empty = no
  // keys (every request is the tenant "default"). Re-read on SIGHUP.
  std::string keys_file;
  // Tenants: entries `name=N[,weight=W][,rps=R][,burst=B][,tps=T][,cache_salt=S]`
  // separated by ';'. parse_tenant_entries().
  std::string tenants;
  // Write the request's band into the forwarded body as vLLM's `priority`
  // (the band's max_priority) when the body's own priority is absent or
  // outside the band (the x-kvroute-priority header chose it). Off by
  // default: an engine without --scheduling-policy priority refuses a
  // priority other than 0 (400).
  bool forward_priority = false;
};

struct TokenizerConfig {
  // "model=dir,model=dir": each dir holds the model's tokenizer.json (and its
  // chat template); a LoRA adapter uses its base model's. Other models ask
  // the engine (remote) or use the placeholder tokenizer.
  std::string models;
  // "auto": a model without a local tokenizer has its string and chat prompts
  // tokenized by the engine's own POST /tokenize (router/engine_tokenizer.h);
  // "off": the placeholder tokenizer.
  std::string remote = "auto";
  uint32_t remote_timeout_ms = 1000;        // one /tokenize round trip (connect included)
  uint32_t remote_max_tokens = 1048576;     // larger answers are refused (and the request uses the placeholder)
  uint64_t remote_cache_bytes = 64ull << 20;  // LRU of exact /tokenize answers; 0 = no cache
};

struct LogConfig {
  std::string level = "info";           // trace, debug, info, warn, error
  std::string format = "human";         // human or json
  bool access_log = true;               // one line per request (never the prompt text)
};

// ZMQ KV events from vLLM / SGLang workers (events/zmq_source.h).
struct ZmqConfig {
  std::string topic;                     // SUB prefix filter; "" = every topic
  uint32_t replay_timeout_ms = 1000;     // a replay request without its end marker by then failed
  uint32_t replay_min_interval_ms = 200;  // per publisher: at most one replay request this often
  uint32_t replay_max_backoff_ms = 10000;  // failed replays back off, doubling up to this
  uint32_t replay_attempts = 3;          // failed replays of one gap before it is given up (owner partial)
  uint32_t max_pending_frames = 10000;   // live frames held per publisher while a gap is replayed
  uint64_t max_held_bytes = 128ull << 20;  // payload bytes held per worker (live + replay frames awaiting order)
};

struct Config {
  RouterConfig router;
  AdminConfig admin;
  EventsConfig events;
  WorkersConfig workers;
  DiscoveryConfig discovery;
  IndexerConfig indexer;
  SchedulerConfig scheduler;
  PdConfig pd;
  FlowConfig flow;
  TokenizerConfig tokenizer;
  LogConfig log;
  ZmqConfig zmq;
};

// One documented key of the schema.
struct KeyInfo {
  std::string_view path;  // "scheduler.gamma"
  std::string_view doc;
  double min = 0;
  double max = std::numeric_limits<double>::max();
  bool is_string = false;
  bool reloadable = false;  // may change at runtime (PUT /admin/config, SIGHUP)
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

// Every key with its value as text, in schema order.
std::vector<std::pair<std::string, std::string>> key_values(const Config& c);

// Checks that `next` differs from `current` only in reloadable keys; the
// error names the first key that needs a restart.
std::optional<std::string> check_reload(const Config& current, const Config& next);

// The effective configuration as YAML (every key, also defaults).
std::string to_yaml(const Config& c);

// One router-known worker (workers.static entry, or a DNS record expanded).
struct WorkerEntry {
  uint64_t id = 0;           // 0 = derived from the URL (stable across restarts)
  std::string url;           // http://host:port of its OpenAI server (IPv6: http://[::1]:8000)
  std::string model;         // model served (required)
  std::string metrics;       // default url + "/metrics"; "none" = not scraped
  std::string kv_events;     // ZMQ PUB endpoint of dp rank 0, e.g. tcp://10.0.0.7:5557; empty = none
  std::string replay;        // ZMQ ROUTER replay endpoint of dp rank 0; empty = none
  uint32_t dp_size = 1;      // data-parallel ranks; rank r uses kv_events/replay port + r
  uint32_t max_seqs = 256;   // request slots (vLLM --max-num-seqs) when /metrics does not say
  uint64_t kv_blocks = 0;    // KV capacity in blocks when /metrics does not say (0 = unknown)
  std::vector<std::string> lora;  // LoRA adapter names served (':'-separated in the text form)
  std::string role = "both";  // both (aggregated), prefill or decode (disaggregated fleets)
  uint32_t bootstrap_port = 8998;  // SGLang prefill: --disaggregation-bootstrap-port
};

// One discovery.dns entry: `host` re-resolved; the rest as WorkerEntry, with
// ports instead of URLs.
struct DnsEntry {
  std::string host;
  uint32_t port = 8000;
  std::string scheme = "http";
  std::string model;
  uint32_t kv_events_port = 0;  // 0 = no ZMQ events
  uint32_t replay_port = 0;     // 0 = no replay
  std::string metrics_path = "/metrics";
  uint32_t dp_size = 1;
  uint32_t max_seqs = 256;
  uint64_t kv_blocks = 0;
  std::vector<std::string> lora;
  std::string role = "both";
  uint32_t bootstrap_port = 8998;
};

// One flow.bands entry.
struct BandEntry {
  std::string name;
  std::string max_priority;  // text: may be negative; empty = no bound (the last band)
  int64_t max_priority_value = 0;
  bool bounded = false;
  uint64_t max_queued = 0;   // 0 = only scheduler.queue_size bounds it
  // Percent of each worker's request slots and KV blocks a request of this
  // band may not take: kept for the bands above it, so their requests find
  // room (0 = none; the first band's is 0; never below a higher band's).
  uint32_t reserve_pct = 0;
};

// One flow.tenants entry.
struct TenantEntry {
  std::string name;
  uint32_t weight = 1;       // share of queued capacity and of freed slots
  uint32_t rps = 0;          // requests per second (0 = no limit)
  uint32_t burst = 0;        // request bucket size (0 = max(rps, 1))
  uint64_t tps = 0;          // prompt tokens per second (0 = no limit); bucket = one second's worth
  std::string cache_salt;    // pinned into every forwarded request of the tenant (empty = the client's own)
};

// One indexer.kv_pools entry: a KV store several workers mount (LMCache's
// remote backend, SGLang HiCache's storage tier, a shared host pool). A block
// a member stores with the pool's medium counts for every member.
struct PoolEntry {
  std::string name;                  // 1-64 letters, digits, '_' or '-' (metrics label, status page)
  std::string medium;                // the medium the members' KV events name it by (case-insensitive), 1-32 bytes
  std::vector<std::string> workers;  // member worker ids (':'-separated in the text form)
  std::vector<uint64_t> worker_ids;  // the same, parsed
  uint64_t bandwidth_mb_s = 0;       // load bandwidth of one member from the pool, MB/s (10^6 bytes)
  uint64_t kv_bytes_per_token = 0;   // KV bytes of one token (all layers, K and V)
  uint64_t prefill_tokens_per_s = 10000;  // a member's prefill speed: what loading is compared with
  uint64_t max_blocks = 0;           // blocks indexed for the pool at most; 0 = indexer.max_blocks_per_worker
};
// The value of a pool hit against a recompute (0) and a device hit (1):
// 1 - (kv_bytes_per_token / bandwidth) / (1 / prefill_tokens_per_s), at least 0.
double pool_tier_weight(const PoolEntry& p);
// Fills cfg.scheduler.tier_weight_pool from cfg.indexer.kv_pools (already
// validated). Call after reading the config (start-up); kv_pools needs a
// restart to change, so a reloaded copy keeps the weights.
void apply_pool_weights(Config& cfg);

// Parse the text forms; the error names the entry and the field.
std::optional<std::string> parse_pool_entries(std::string_view text, std::vector<PoolEntry>& out);
std::optional<std::string> parse_band_entries(std::string_view text, std::vector<BandEntry>& out);
std::optional<std::string> parse_tenant_entries(std::string_view text, std::vector<TenantEntry>& out);
std::optional<std::string> parse_worker_entries(std::string_view text, std::vector<WorkerEntry>& out);
std::optional<std::string> parse_dns_entries(std::string_view text, std::vector<DnsEntry>& out);
// One worker given as a YAML/JSON mapping ({"url": ..., "model": ..., "lora": [..]})
// or already in the text form: the text form (admin API).
std::optional<std::string> worker_entry_text(std::string_view body, std::string& out);
// The id a worker gets when its entry names none: FNV-1a (64-bit prime) of the
// URL from the offset basis 1469598103934665603 (one digit short of FNV's
// 14695981039346656037; kept, since operators may have stored ids), top bit
// cleared (so it never collides with a small heartbeat id by accident).
uint64_t worker_id_for_url(std::string_view url);

// ---- implementation of the schema ----

template <class C, class F>
void for_each_key(C& c, F&& f) {
  constexpr double kMaxU32 = 4294967295.0;
  constexpr bool S = true;   // is_string
  constexpr bool R = true;   // reloadable
  // router
  f(KeyInfo{"router.host", "Address the OpenAI listener binds.", 0, 0, S}, c.router.host);
  f(KeyInfo{"router.port", "Port of the OpenAI listener (0 = ephemeral).", 0, 65535}, c.router.port);
  f(KeyInfo{"router.threads", "HTTP io threads.", 1, 256}, c.router.threads);
  f(KeyInfo{"router.max_body_bytes", "Largest request body accepted; larger gets 413.", 1024, 1 << 30, !S, R},
    c.router.max_body_bytes);
  f(KeyInfo{"router.max_concurrent_requests", "Requests handled at once; beyond, 503 with Retry-After.", 1, 1e7, !S, R},
    c.router.max_concurrent_requests);
  f(KeyInfo{"router.connect_timeout_ms", "Upstream TCP connect timeout.", 10, 600000, !S, R},
    c.router.connect_timeout_ms);
  f(KeyInfo{"router.first_byte_timeout_ms", "Request sent to first response byte from the worker.", 100, 3600000, !S, R},
    c.router.first_byte_timeout_ms);
  f(KeyInfo{"router.idle_timeout_ms", "Longest silence while relaying a response.", 100, 3600000, !S, R},
    c.router.idle_timeout_ms);
  f(KeyInfo{"router.client_read_timeout_ms", "Time allowed to receive a client's whole request.", 100, 3600000, !S, R},
    c.router.client_read_timeout_ms);
  f(KeyInfo{"router.max_attempts", "Workers tried before the first response byte (1 = no retry).", 1, 16, !S, R},
    c.router.max_attempts);
  f(KeyInfo{"router.upstream_pool_size", "Idle keep-alive connections kept per worker (0 = none).", 0, 100000, !S, R},
    c.router.upstream_pool_size);
  f(KeyInfo{"router.shutdown_grace_ms", "On SIGTERM, how long in-flight requests may finish.", 0, 3600000, !S, R},
    c.router.shutdown_grace_ms);
  f(KeyInfo{"router.max_header_bytes", "Largest request header (request line and fields); larger gets 431.", 1024,
            65536, !S, R},
    c.router.max_header_bytes);
  f(KeyInfo{"router.first_byte_timeout_min_ms", "Floor of the adaptive first-byte timeout.", 100, 3600000, !S, R},
    c.router.first_byte_timeout_min_ms);
  f(KeyInfo{"router.first_byte_timeout_factor", "Adaptive first-byte timeout as a multiple of the predicted TTFT.",
            1, 1000, !S, R},
    c.router.first_byte_timeout_factor);
  f(KeyInfo{"router.ttft_prefill_tokens_per_s", "Conservative prefill rate for the predicted TTFT (tokens/s).", 1,
            1e9, !S, R},
    c.router.ttft_prefill_tokens_per_s);
  f(KeyInfo{"router.max_connections",
            "Open client connections on the OpenAI listener; beyond, 503 and close (0 = half of RLIMIT_NOFILE).", 0,
            1e7, !S, R},
    c.router.max_connections);
  f(KeyInfo{"router.max_body_bytes_in_flight",
            "Request body bytes being received or held at once; a body that does not fit gets 503 unread.",
            1 << 20, 1ull << 40, !S, R},
    c.router.max_body_bytes_in_flight);
  f(KeyInfo{"router.worker_api_key_file",
            "File whose first line is the key sent to workers as 'Authorization: Bearer' (vLLM --api-key); empty = "
            "none. Re-read on SIGHUP.",
            0, 0, S, R},
    c.router.worker_api_key_file);
  f(KeyInfo{"router.worker_api_key_env",
            "Name of an environment variable holding the key sent to workers as 'Authorization: Bearer' (instead of "
            "a file); empty = none.",
            0, 0, S, R},
    c.router.worker_api_key_env);
  f(KeyInfo{"router.forward_client_credentials",
            "Pass the client's Authorization / x-api-key on to workers (only without flow.keys_file and a worker "
            "key); false: workers never see them.",
            0, 1, !S, R},
    c.router.forward_client_credentials);
  f(KeyInfo{"router.response_affinity_max_ids",
            "Responses API ids remembered with the worker that produced them (previous_response_id affinity); the "
            "least recently used are dropped first.",
            1, 1e7, !S, R},
    c.router.response_affinity_max_ids);
  // admin
  f(KeyInfo{"admin.host", "Address the admin listener binds (loopback by default; empty = router.host).", 0, 0, S}, c.admin.host);
  f(KeyInfo{"admin.port", "Port of the admin listener (0 = ephemeral).", 0, 65535}, c.admin.port);
  f(KeyInfo{"admin.token", "Bearer token of the admin API; empty refuses every admin request.", 0, 0, S, R},
    c.admin.token);
  f(KeyInfo{"admin.max_body_bytes", "Largest admin request body (PUT /admin/config, explain); larger gets 413.",
            1024, 1 << 30, !S, R},
    c.admin.max_body_bytes);
  // events
  f(KeyInfo{"events.nats_url", "NATS server URL; empty = no NATS (workers from workers.static / discovery.dns).", 0,
            0, S},
    c.events.nats_url);
  f(KeyInfo{"events.subject_prefix", "Prefix of the NATS subjects ({prefix}.kv_events, {prefix}.workers).", 0, 0, S},
    c.events.subject_prefix);
  f(KeyInfo{"events.worker_ttl_ms", "Heartbeat silence after which a worker leaves candidates and index.", 100,
            3600000},
    c.events.worker_ttl_ms);
  f(KeyInfo{"events.connect_timeout_ms", "How long start-up retries the first NATS connect.", 0, 3600000},
    c.events.connect_timeout_ms);
  f(KeyInfo{"events.queue_capacity", "Decoded event messages queued for the index writer; beyond, dropped.", 16,
            kMaxU32},
    c.events.queue_capacity);
  f(KeyInfo{"events.resync_timeout_ms", "How long to wait for a worker's full dump after lost events.", 10, 600000},
    c.events.resync_timeout_ms);
  f(KeyInfo{"events.resync_concurrency", "Workers' dumps fetched at once (router start, NATS reconnect).", 1, 256},
    c.events.resync_concurrency);
  f(KeyInfo{"events.resync_backoff_ms", "Least time between two dumps asked of one worker; doubles per dump.", 10,
            600000},
    c.events.resync_backoff_ms);
  f(KeyInfo{"events.resync_backoff_max_ms", "Ceiling of the per-worker resync backoff.", 10, 3600000},
    c.events.resync_backoff_max_ms);
  f(KeyInfo{"events.queue_capacity_bytes", "Bytes of decoded events queued for the index writer; beyond, dropped.",
            1 << 20, 1ull << 40},
    c.events.queue_capacity_bytes);
  f(KeyInfo{"events.queue_worker_share",
            "Fraction of events.queue_capacity and events.queue_capacity_bytes one worker's queued events may fill; "
            "beyond, that worker's messages are dropped (a gap, resynced), never another worker's.",
            0.01, 1},
    c.events.queue_worker_share);
  f(KeyInfo{"events.nats_user", "NATS user (with events.nats_password).", 0, 0, S}, c.events.nats_user);
  f(KeyInfo{"events.nats_password", "NATS password.", 0, 0, S}, c.events.nats_password);
  f(KeyInfo{"events.nats_token", "NATS authentication token.", 0, 0, S}, c.events.nats_token);
  f(KeyInfo{"events.nats_creds_file", "NATS credentials file (JWT and nkey seed).", 0, 0, S},
    c.events.nats_creds_file);
  f(KeyInfo{"events.nats_nkey_seed_file", "File holding the NATS nkey seed (nkey authentication).", 0, 0, S},
    c.events.nats_nkey_seed_file);
  f(KeyInfo{"events.nats_tls", "Require TLS to NATS (also implied by a tls:// URL).", 0, 1}, c.events.nats_tls);
  f(KeyInfo{"events.nats_tls_ca_file", "CA certificate(s) that signed the NATS server's certificate.", 0, 0, S},
    c.events.nats_tls_ca_file);
  f(KeyInfo{"events.nats_tls_cert_file", "Client certificate for mutual TLS to NATS.", 0, 0, S},
    c.events.nats_tls_cert_file);
  f(KeyInfo{"events.nats_tls_key_file", "Private key of events.nats_tls_cert_file.", 0, 0, S},
    c.events.nats_tls_key_file);
  f(KeyInfo{"events.replica_sync", "Share in-flight load with other router replicas over NATS.", 0, 1},
    c.events.replica_sync);
  f(KeyInfo{"events.replica_sync_interval_ms", "At most one in-flight snapshot per interval, when changed.", 1, 60000},
    c.events.replica_sync_interval_ms);
  f(KeyInfo{"events.replica_ttl_ms", "A replica silent this long stops counting in predicted load.", 10, 3600000},
    c.events.replica_ttl_ms);
  f(KeyInfo{"events.worker_url_allow",
            "URLs a bus-announced (heartbeat) worker may have: CIDRs, IPs or origins http://host:port, "
            "comma-separated; \"*\" = any.",
            0, 0, S},
    c.events.worker_url_allow);
  f(KeyInfo{"events.max_bus_workers", "Bus-announced (heartbeat) workers known at once; beyond, new ones are refused.",
            1, 1e6},
    c.events.max_bus_workers);
  // workers
  f(KeyInfo{"workers.static",
            "Workers the router knows itself: entries 'url=...,model=...[,kv_events=tcp://...,replay=tcp://...,"
            "metrics=...,dp_size=N,max_seqs=N,kv_blocks=N,lora=a:b,id=N,role=both|prefill|decode,bootstrap_port=N]' "
            "separated by ';' (YAML: a list).",
            0, 0, S, R},
    c.workers.static_list);
  f(KeyInfo{"workers.scrape_interval_ms", "How often each router-known worker's /metrics is scraped.", 20, 600000, !S, R},
    c.workers.scrape_interval_ms);
  f(KeyInfo{"workers.scrape_timeout_ms", "Time allowed for one scrape (connect + answer).", 10, 600000, !S, R},
    c.workers.scrape_timeout_ms);
  f(KeyInfo{"workers.eject_after_failures",
            "Consecutive failed scrapes, connect timeouts, first-byte timeouts or 5xx that take a worker out.", 1, 1000,
            !S, R},
    c.workers.eject_after_failures);
  f(KeyInfo{"workers.eject_base_ms", "First outlier ejection (timeouts/5xx); doubles per ejection in a row.", 1,
            3600000, !S, R},
    c.workers.eject_base_ms);
  f(KeyInfo{"workers.eject_max_ms", "Longest outlier ejection.", 1, 3600000, !S, R}, c.workers.eject_max_ms);
  // discovery
  f(KeyInfo{"discovery.dns",
            "DNS names whose every A/AAAA record is a worker: 'host=...,port=N,model=...[,kv_events_port=N,"
            "replay_port=N,metrics_path=/metrics,dp_size=N,scheme=http,role=both|prefill|decode,bootstrap_port=N]' "
            "separated by ';' (YAML: a list).",
            0, 0, S, R},
    c.discovery.dns);
  f(KeyInfo{"discovery.dns_interval_ms", "How often DNS names are re-resolved.", 100, 3600000, !S, R},
    c.discovery.dns_interval_ms);
  f(KeyInfo{"discovery.dns_servers", "DNS servers 'host:port,...' to ask; empty = the system's resolv.conf.", 0, 0,
            S, R},
    c.discovery.dns_servers);
  // indexer
  f(KeyInfo{"indexer.block_size", "Tokens per KV block; must match the workers' block size.", 1, 65536},
    c.indexer.block_size);
  f(KeyInfo{"indexer.approximate", "Predict every worker's cache from routing decisions instead of events.", 0, 1},
    c.indexer.approximate);
  f(KeyInfo{"indexer.approx_ttl_ms", "Lifetime of a predicted block in approximate mode.", 1000, 86400000},
    c.indexer.approx_ttl_ms);
  f(KeyInfo{"indexer.approx_max_entries", "Predicted (block, worker) entries kept; oldest evicted first.", 1000, 1e10},
    c.indexer.approx_max_entries);
  f(KeyInfo{"indexer.kv_pools",
            "Shared KV pools: entries 'name=...,medium=...,workers=ID:ID,bandwidth_mb_s=N,kv_bytes_per_token=N"
            "[,prefill_tokens_per_s=N,max_blocks=N]' separated by ';' (YAML: a list under kv_pools:).",
            0, 0, S},
    c.indexer.kv_pools);
  f(KeyInfo{"indexer.max_blocks_per_worker",
            "Most blocks the exact index holds for one worker (all dp ranks); a worker that declares its KV "
            "capacity gets capacity x indexer.capacity_slack if lower. Blocks beyond are refused.",
            1000, 1e10},
    c.indexer.max_blocks_per_worker);
  f(KeyInfo{"indexer.capacity_slack",
            "A worker may hold its declared KV capacity (scrape or heartbeat) times this many blocks in the index.",
            1, 1000},
    c.indexer.capacity_slack);
  // scheduler
  f(KeyInfo{"scheduler.alpha_balanced", "Weight of load deviation vs prefill cost when load is even.", 0, 1, !S, R},
    c.scheduler.alpha_balanced);
  f(KeyInfo{"scheduler.alpha_imbalanced", "Weight of load deviation when load is uneven.", 0, 1, !S, R},
    c.scheduler.alpha_imbalanced);
  f(KeyInfo{"scheduler.balance_threshold", "Load is uneven when std > threshold * mean.", 0, 100, !S, R},
    c.scheduler.balance_threshold);
  f(KeyInfo{"scheduler.gamma", "Weight of request-slot usage.", 0, 100, !S, R}, c.scheduler.gamma);
  f(KeyInfo{"scheduler.delta", "Weight of waiting requests (relative to the most-queued worker).", 0, 100, !S, R},
    c.scheduler.delta);
  f(KeyInfo{"scheduler.tier_weight_device", "Value of a cached block on the device (1 = no recompute).", 0, 1, !S, R},
    c.scheduler.tier_weight_device);
  f(KeyInfo{"scheduler.tier_weight_host_pinned", "Value of a cached block in host pinned memory.", 0, 1, !S, R},
    c.scheduler.tier_weight_host_pinned);
  f(KeyInfo{"scheduler.tier_weight_disk", "Value of a cached block on local disk.", 0, 1, !S, R},
    c.scheduler.tier_weight_disk);
  f(KeyInfo{"scheduler.tier_weight_external", "Value of a cached block in an external store.", 0, 1, !S, R},
    c.scheduler.tier_weight_external);
  f(KeyInfo{"scheduler.pending_prefill_weight",
            "Weight of prefill tokens in flight on a worker, added to a request's new tokens (0 = DESIGN baseline).",
            0, 100, !S, R},
    c.scheduler.pending_prefill_weight);
  f(KeyInfo{"scheduler.inflight_prefix_once",
            "In-flight KV counts a cached prefix shared by the worker's in-flight requests once (else each request's whole prompt).",
            0, 1, !S, R},
    c.scheduler.inflight_prefix_once);
  f(KeyInfo{"scheduler.busy_kv_usage", "Skip workers whose KV usage is at or above this (0 would skip every worker).", 0.01, 1, !S, R},
    c.scheduler.busy_kv_usage);
  f(KeyInfo{"scheduler.busy_slot_usage", "Skip workers whose request-slot usage is at or above this (0 would skip every worker).", 0.01, 1, !S, R},
    c.scheduler.busy_slot_usage);
  f(KeyInfo{"scheduler.busy_waiting_requests", "Skip workers with this many waiting requests (0 = no limit).", 0,
            kMaxU32, !S, R},
    c.scheduler.busy_waiting_requests);
  f(KeyInfo{"scheduler.queue_size",
            "Requests that may wait for a free worker (0 = no queue: see reject_when_busy).", 0, 1e7, !S, R},
    c.scheduler.queue_size);
  f(KeyInfo{"scheduler.queue_timeout_ms", "Longest wait for a free worker before 503.", 1, 3600000, !S, R},
    c.scheduler.queue_timeout_ms);
  f(KeyInfo{"scheduler.reject_when_busy",
            "Every worker busy and queue_size 0: 503 at once (true) or send to the best busy worker (false).", 0, 1,
            !S, R},
    c.scheduler.reject_when_busy);
  f(KeyInfo{"scheduler.temperature", "0 = lowest cost wins; > 0 = softmax sampling over -cost/temperature.", 0,
            100, !S, R},
    c.scheduler.temperature);
  f(KeyInfo{"scheduler.cost", "weighted or predicted_ttft (expected time to first token per worker, online model).",
            0, 0, S, R},
    c.scheduler.cost);
  f(KeyInfo{"scheduler.session_affinity",
            "Keep a session (x-session-id header, else the user field) on its worker while not overloaded.", 0, 1,
            !S, R},
    c.scheduler.session_affinity);
  // pd
  f(KeyInfo{"pd.policy",
            "Disaggregated fleets: conditional (split unless few uncached tokens or a busy prefill pool), always or "
            "never.",
            0, 0, S, R},
    c.pd.policy);
  f(KeyInfo{"pd.min_uncached_tokens",
            "conditional: a request whose decode worker lacks fewer prompt tokens than this runs there whole.", 0,
            kMaxU32, !S, R},
    c.pd.min_uncached_tokens);
  f(KeyInfo{"pd.prefill_busy_tokens",
            "conditional: the best prefill worker's queued prefill tokens at which requests run on the decode "
            "worker whole (0 = off).",
            0, 1e12, !S, R},
    c.pd.prefill_busy_tokens);
  f(KeyInfo{"pd.decode_busy_kv_usage",
            "conditional: a decode worker whose KV usage with the request would exceed this never runs it whole "
            "(split instead; Dynamo's decode_busy_threshold). 0 = off.",
            0, 1, !S, R},
    c.pd.decode_busy_kv_usage);
  f(KeyInfo{"pd.aggregate_time_ratio",
            "conditional: run a request whole on its decode worker when its predicted TTFT there is at most this "
            "times the split's (best prefill worker's predicted TTFT + KV transfer). 0 = off.",
            0, 100, !S, R},
    c.pd.aggregate_time_ratio);
  f(KeyInfo{"pd.transfer_ms_per_1k_tokens",
            "Predicted KV transfer time per 1,000 prompt tokens the decode worker lacks (pd.aggregate_time_ratio).",
            0, 1e6, !S, R},
    c.pd.transfer_ms_per_1k_tokens);
  f(KeyInfo{"pd.decode_alpha",
            "The decode worker's choice: weight of KV load against the prefill term (replaces "
            "scheduler.alpha_balanced/alpha_imbalanced there); -1 = the scheduler's.",
            -1, 1, !S, R},
    c.pd.decode_alpha);
  f(KeyInfo{"pd.protocol",
            "The wire protocol of a split request: vllm_nixl (prefill leg, then its kv_transfer_params to the decode "
            "leg) or sglang (both legs at once, a bootstrap room).",
            0, 0, S, R},
    c.pd.protocol);
  f(KeyInfo{"pd.model_protocols",
            "Per-model exceptions to pd.protocol: 'model=protocol' entries separated by ','.", 0, 0, S, R},
    c.pd.model_protocols);
  f(KeyInfo{"pd.prefill_timeout_ms",
            "One prefill leg, connect to its whole answer; then the next prefill worker.", 100, 3600000, !S, R},
    c.pd.prefill_timeout_ms);
  f(KeyInfo{"pd.on_prefill_failure",
            "When no prefill worker could prefill a split request: fallback (run it whole on its decode worker) or "
            "fail (503 in the API's shape).",
            0, 0, S, R},
    c.pd.on_prefill_failure);
  f(KeyInfo{"pd.mooncake_concurrent_legs",
            "vllm_mooncake: send the prefill and decode legs at once (vLLM's proxy; the decode engine waits for the "
            "prefill's KV) instead of the decode leg once the prefill leg answered.",
            0, 1, !S, R},
    c.pd.mooncake_concurrent_legs);
  // flow
  f(KeyInfo{"flow.bands",
            "Priority bands, highest first: 'name=N[,max_priority=P][,max_queued=Q]' separated by ';' (YAML: a "
            "list). vLLM priority p (lower = more urgent) joins the first band with p <= max_priority.",
            0, 0, S, R},
    c.flow.bands);
  f(KeyInfo{"flow.queue_max_bytes", "Request body bytes waiting in the queue at once; beyond, 429 or a lower band shed.",
            1024, 1ull << 40, !S, R},
    c.flow.queue_max_bytes);
  f(KeyInfo{"flow.retry_after_s", "Retry-After (seconds) of a 429 from the queue or a rate limit floor.", 1, 3600,
            !S, R},
    c.flow.retry_after_s);
  f(KeyInfo{"flow.keys_file",
            "API keys file: lines '<sha256 hex of the key> <tenant>'; empty = no authentication. Re-read on SIGHUP.",
            0, 0, S, R},
    c.flow.keys_file);
  f(KeyInfo{"flow.forward_priority",
            "Write the band a request joined into the body kvroute forwards, as vLLM's priority (the band's "
            "max_priority), when the body's own priority is absent or outside the band. Needs engines run with "
            "--scheduling-policy priority.",
            0, 1, !S, R},
    c.flow.forward_priority);
  f(KeyInfo{"flow.tenants",
            "Tenants: 'name=N[,weight=W][,rps=R][,burst=B][,tps=T][,cache_salt=S]' separated by ';' (YAML: a list).",
            0, 0, S, R},
    c.flow.tenants);
  // tokenizer
  f(KeyInfo{"tokenizer.models",
            "MODEL=DIR list, comma-separated: each DIR holds tokenizer.json (+ chat template); "
            "a LoRA adapter uses its base model's; other models ask the engine (tokenizer.remote).",
            0, 0, S},
    c.tokenizer.models);
  f(KeyInfo{"tokenizer.remote",
            "auto: models without a local tokenizer are tokenized by the engine's POST /tokenize; off: placeholder.",
            0, 0, S, R},
    c.tokenizer.remote);
  f(KeyInfo{"tokenizer.remote_timeout_ms", "One /tokenize round trip to an engine (connect included).", 1, 600000,
            !S, R},
    c.tokenizer.remote_timeout_ms);
  f(KeyInfo{"tokenizer.remote_max_tokens", "Largest /tokenize answer accepted (tokens); larger: placeholder.", 1,
            1 << 26, !S, R},
    c.tokenizer.remote_max_tokens);
  f(KeyInfo{"tokenizer.remote_cache_bytes", "Memory of the LRU cache of exact /tokenize answers (0 = no cache).", 0,
            1ull << 36},
    c.tokenizer.remote_cache_bytes);
  // log
  f(KeyInfo{"log.level", "trace, debug, info, warn or error.", 0, 0, S, R}, c.log.level);
  f(KeyInfo{"log.format", "human or json.", 0, 0, S, R}, c.log.format);
  f(KeyInfo{"log.access_log", "One log line per request (worker, cached tokens, TTFB, status; never the prompt).",
            0, 1, !S, R},
    c.log.access_log);
  // zmq
  f(KeyInfo{"zmq.topic", "ZMQ KV events: topic prefix subscribed on every worker's PUB socket (\"\" = all).", 0, 0, S},
    c.zmq.topic);
  f(KeyInfo{"zmq.replay_timeout_ms", "ZMQ KV events: a replay request unanswered this long has failed.", 10, 600000},
    c.zmq.replay_timeout_ms);
  f(KeyInfo{"zmq.replay_min_interval_ms", "ZMQ KV events: at most one replay request per publisher this often.", 1,
            600000},
    c.zmq.replay_min_interval_ms);
  f(KeyInfo{"zmq.replay_max_backoff_ms", "ZMQ KV events: failed replays back off, doubling, up to this.", 1, 3600000},
    c.zmq.replay_max_backoff_ms);
  f(KeyInfo{"zmq.replay_attempts", "ZMQ KV events: failed replays of one gap before the owner is marked partial.", 1,
            100},
    c.zmq.replay_attempts);
  f(KeyInfo{"zmq.max_pending_frames", "ZMQ KV events: live frames held per publisher while a gap is replayed.", 1,
            10000000},
    c.zmq.max_pending_frames);
  f(KeyInfo{"zmq.max_held_bytes",
            "ZMQ KV events: payload bytes of frames held per worker (live frames awaiting a replay and replay "
            "answers, one budget); beyond, frames are dropped and replayed later.",
            1 << 20, 1ull << 40},
    c.zmq.max_held_bytes);
}

}  // namespace kvroute
