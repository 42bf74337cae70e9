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
  // A request not streamed gets its response header with the whole answer:
  // its first-byte wait adds generating its output budget at this
  // conservative per-request rate, up to response_timeout_ms (unbounded
  // output: that ceiling).
  double decode_tokens_per_s = 10;
  uint32_t response_timeout_ms = 600000;
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
  // The part of a worker's pending prefill past what the request saves
  // there counts in full (weight 1): vLLM's scheduler (first come first
  // served, chunked prefill) makes a new request wait for every prefill
  // token ahead of it, so a request does not queue behind another prompt's
  // long prefill to save a far shorter recompute of its own. Past = over
  // pending_prefill_excess_tokens + pending_prefill_excess_cached x the
  // request's cached tokens there + its prefix the router has in flight
  // there (its own prefix being computed: waiting for that is no loss).
  // scheduler/README.md, "Cost".
  bool pending_prefill_excess = true;
  uint32_t pending_prefill_excess_tokens = 4096;
  double pending_prefill_excess_cached = 3;
  // What the router's in-flight KV on a worker counts (WorkerRegistry::
  // begin_request): "distinct" each block of the in-flight prompts once,
  // "prefix_once" each request's uncached blocks and the largest cached
  // prefix once, "whole" every prompt whole.
  std::string inflight_kv = "distinct";
  // A prompt's leading blocks that the router has in flight on a worker
  // (requests sent there whose prompts share them, not yet ended): the
  // engine computes them once, and a request queued behind reads them from
  // its cache (WorkerRegistry::inflight_overlaps). They count as cached
  // there, at this value against blocks the index has, scaled down while
  // the fleet's mean KV load is under inflight_prefix_load: on an idle
  // fleet a request does better computing its own copy elsewhere (the
  // prefix then has several holders for the requests after it); on a busy
  // one that copy is time taken from other requests. The worker's overlap
  // is the longer of the index's and this. 0 = off. Needs inflight_kv
  // "distinct".
  double inflight_prefix_weight = 1;
  double inflight_prefix_load = 0.6;
  // Once this share of the model's eligible workers compute one prefix (the
  // number of them rounded up, and at least two), it counts at
  // inflight_prefix_weight whatever the load: a request sharing it joins a
  // copy under way rather than start another. 0 = off (the load alone
  // scales it).
  double inflight_prefix_spread = 0.5;
  // KV the router expects back on a worker (WorkerRegistry: parked KV): the
  // prompt blocks of the requests it answered there (each block once, when
  // no request in flight there holds it any more), fading with this time
  // constant in seconds, less the parked part of the cached prefix each new
  // request there takes up again. It counts with the worker's active KV in
  // the cost's KV-load term only (not in busy_kv_usage). 0 = off.
  double parked_kv_seconds = 10;
  // A worker's recent evictions (WorkerRegistry: the blocks its KV events
  // report removed from the device, fading with eviction_seconds as time
  // constant) over its KV capacity: how fast its cache turns over. The cost
  // adds eviction_weight x that share (at most 1: its whole KV) x the
  // request's uncached share of its prompt: the blocks a request computes
  // there push out cached prompts at the rate the worker already evicts, so
  // new work goes where the cache keeps what it holds longest (a session
  // back from a long tool pause finds its context). 0 = off.
  double eviction_weight = 1;
  double eviction_seconds = 30;
  // A request placed on a worker whose request slots are all taken (the
  // router's predicted load) waits for a running request to finish before
  // its prefill starts. The cost prices that wait as this many tokens of the
  // worker's queue per request waiting for a slot there, this one included
  // (WorkerRegistry: slot_wait_tokens; scheduler/README.md "Cost"); the queue
  // is priced as ever (pending_prefill_weight, the excess in full). 0 = off,
  // the default: config/README.md gives the held-out trade that kept it off.
  double slot_wait_tokens = 0;
  // Busy thresholds: a worker at or over any of them is skipped.
  double busy_kv_usage = 1.0;           // kv_active / kv_total
  double busy_slot_usage = 1.0;         // active / total request slots
  // The slot test is lifted while the model's workers together have this
  // share of their request slots taken (WorkerRegistry::slots_full; 1 = never):
  // every engine is nearly full, so passing over a full one only fills
  // another, which then recomputes the prompt that was cached there. Only with
  // no router queue (queue_size 0) and reject_when_busy false, as the
  // every-worker-busy fallback below.
  double busy_slot_fleet_usage = 0.9;
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
// uint32_t, uint64_t, double. The single source of truth for the schema;
// defined in config/config_schema.h (included where it is visited).
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

}  // namespace kvroute
