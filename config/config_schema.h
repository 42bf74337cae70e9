// The configuration schema: every key, its documentation, range and whether
// it is reloadable, in one visitor (declared in config/config.h). Included
// only where the schema is walked (parsing, validation, docs), so that the
// translation units that only read a Config do not compile it.
#pragma once

#include "config/config.h"

namespace kvroute {

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
  f(KeyInfo{"router.decode_tokens_per_s",
            "Conservative per-request decode rate (tokens/s) for the wait of a request not streamed.", 0.1, 1e6, !S, R},
    c.router.decode_tokens_per_s);
  f(KeyInfo{"router.response_timeout_ms",
            "Ceiling of a request's wait for its answer when it is not streamed (its header comes with the whole answer).",
            100, 86400000, !S, R},
    c.router.response_timeout_ms);
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
  f(KeyInfo{"scheduler.pending_prefill_excess",
            "Count a worker's pending prefill in full past pending_prefill_excess_tokens + "
            "pending_prefill_excess_cached x the request's cached tokens there (+ its prefix in flight there).",
            0, 1, !S, R},
    c.scheduler.pending_prefill_excess);
  f(KeyInfo{"scheduler.pending_prefill_excess_tokens",
            "Pending prefill tokens on a worker a request tolerates at pending_prefill_weight before the excess "
            "counts in full.",
            0, 1e9, !S, R},
    c.scheduler.pending_prefill_excess_tokens);
  f(KeyInfo{"scheduler.pending_prefill_excess_cached",
            "Further pending prefill tolerated per token the request has cached on the worker.", 0, 100, !S, R},
    c.scheduler.pending_prefill_excess_cached);
  f(KeyInfo{"scheduler.inflight_kv",
            "What in-flight KV counts: distinct (each block of the in-flight prompts once), prefix_once or whole.", 0,
            0, S, R},
    c.scheduler.inflight_kv);
  f(KeyInfo{"scheduler.inflight_prefix_weight",
            "Value of the prompt prefix the router has in flight on a worker (other requests' prompts sent there, "
            "not yet ended) against a cached one, at or over inflight_prefix_load (0 = off; needs inflight_kv "
            "distinct).",
            0, 1, !S, R},
    c.scheduler.inflight_prefix_weight);
  f(KeyInfo{"scheduler.inflight_prefix_load",
            "The fleet's mean KV load from which an in-flight prefix counts at inflight_prefix_weight; under it, in "
            "proportion.",
            0.01, 1, !S, R},
    c.scheduler.inflight_prefix_load);
  f(KeyInfo{"scheduler.inflight_prefix_spread",
            "Once this share of the model's workers compute one prompt prefix (in flight, not yet stored), it "
            "counts at inflight_prefix_weight at any load: a request sharing it joins a copy under way (0 = off).",
            0, 1, !S, R},
    c.scheduler.inflight_prefix_spread);
  f(KeyInfo{"scheduler.parked_kv_seconds",
            "Time constant (s) of the parked KV: the prompts the router answered on a worker, counted in its KV load "
            "until they fade or a request takes them up again (0 = off).",
            0, 3600, !S, R},
    c.scheduler.parked_kv_seconds);
  f(KeyInfo{"scheduler.eviction_weight",
            "Weight of a worker's recent evictions (the KV blocks its events report removed from the device, over "
            "its KV capacity) in the cost, times the request's uncached share of its prompt (0 = off).",
            0, 100, !S, R},
    c.scheduler.eviction_weight);
  f(KeyInfo{"scheduler.eviction_seconds", "Time constant (s) over which a worker's evictions fade.", 1, 3600, !S, R},
    c.scheduler.eviction_seconds);
  f(KeyInfo{"scheduler.slot_wait_tokens",
            "Tokens of queue the cost adds on a worker with every request slot taken, per request waiting there "
            "for a slot (this one included): the wait for a running request to finish (0 = off).",
            0, 1e6, !S, R},
    c.scheduler.slot_wait_tokens);
  f(KeyInfo{"scheduler.busy_kv_usage", "Skip workers whose KV usage is at or above this (0 would skip every worker).", 0.01, 1, !S, R},
    c.scheduler.busy_kv_usage);
  f(KeyInfo{"scheduler.busy_slot_usage", "Skip workers whose request-slot usage is at or above this (0 would skip every worker).", 0.01, 1, !S, R},
    c.scheduler.busy_slot_usage);
  f(KeyInfo{"scheduler.busy_slot_fleet_usage",
            "While the model's workers together have this share of their request slots taken, skip no worker for "
            "its slots (1 = never): with every engine nearly full, a request moved off a full one fills another "
            "and recomputes its cached prompt there. With queue_size > 0 or reject_when_busy, while lifted the "
            "fleet is busy (a request waits or is refused) once the share reaches busy_slot_usage. Not in a "
            "prefill/decode fleet.",
            0.01, 1, !S, R},
    c.scheduler.busy_slot_fleet_usage);
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
