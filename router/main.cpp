// kvroute: the daemon. The only place that wires the modules together:
// parse the options, build the parts, register their metrics, start, wait for
// signals, stop.
//
// Start-up: defaults < YAML file (--config) < KVROUTE_* environment < flags.
// Then: NATS connect -> event pipeline (index writer thread) -> HTTP and admin
// listeners. SIGHUP re-reads the configuration (reloadable keys only);
// SIGTERM/SIGINT drain in-flight requests for router.shutdown_grace_ms and exit.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>

#include "common/clock.h"
#include "common/log.h"
#include "common/json_escape.h"
#include "common/metrics.h"
#include "common/url_allow_list.h"
#include "config/config.h"
#include "config/config_store.h"
#include "events/event_metrics.h"
#include "events/event_pipeline.h"
#include "events/nats_bus.h"
#include "events/replica_sync.h"
#include "events/salt_attribution.h"
#include "events/zmq_source.h"
#include "fleet/fleet_metrics.h"
#include "fleet/known_workers.h"
#include "fleet/worker_registry.h"
#include "indexer/approx_indexer.h"
#include "indexer/event_sequencer.h"
#include "indexer/indexer_metrics.h"
#include "indexer/radix_indexer.h"
#include "indexer/merged_index.h"
#include "indexer/pool_index.h"
#include "router/admin_api.h"
#include "router/http/server.h"
#include "router/router_metrics.h"
#include "router/routing.h"
#include "router/session_affinity.h"
#include "router/status.h"

extern char** environ;

using namespace kvroute;

namespace {

// indexer.kv_pools (validated) as the index's pool table.
std::vector<PoolSpec> pool_specs(const Config& cfg) {
  std::vector<PoolEntry> entries;
  std::vector<PoolSpec> out;
  if (parse_pool_entries(cfg.indexer.kv_pools, entries)) return out;
  for (const PoolEntry& e : entries) {
    PoolSpec s{e.name, e.medium, {}, e.max_blocks};
    for (uint64_t id : e.worker_ids) s.members.push_back(WorkerId{id});
    out.push_back(std::move(s));
  }
  return out;
}

// Builds the configuration from all sources. Used at start-up and on SIGHUP.
struct ConfigSources {
  std::string path;
  std::map<std::string, std::string> flags;  // key -> value given on the command line
  std::optional<std::string> load(Config& cfg) const {
    cfg = Config{};
    if (!path.empty())
      if (auto e = load_yaml_file(cfg, path)) return e;
    if (auto e = apply_env(cfg, environ)) return e;
    for (const auto& [key, value] : flags)
      if (auto e = set_key(cfg, key, value)) return fmt::format("{} (from flag --{})", *e, key);
    if (auto e = validate(cfg)) return e;
    apply_pool_weights(cfg);  // derived from indexer.kv_pools (restart-only)
    return std::nullopt;
  }
};

// The command line: --config, --print-config, and every config key as a
// flag. Returns an exit code when the program should end here (--help, a bad
// flag).
std::optional<int> parse_command_line(int argc, char** argv, ConfigSources& sources, bool& print_config) {
  CLI::App app{
      "kvroute: KV-cache-aware router for OpenAI-compatible LLM workers.\n"
      "Configuration precedence: defaults < --config YAML < KVROUTE_<SECTION>_<KEY> environment < flags.\n"
      "Every config key is also a flag (--section.key VALUE); config/README.md documents each.\n"
      "Signals: SIGHUP re-reads the configuration; SIGTERM/SIGINT drain and exit."};
  app.add_option("-c,--config", sources.path, "YAML configuration file");
  app.add_flag("--print-config", print_config, "Print the effective configuration as YAML and exit");
  std::map<std::string, std::string> flag_values;
  for (const auto& k : config_keys()) {
    std::string desc = std::string(k.doc);
    if (!k.is_string) desc += fmt::format(" [{}..{}]", k.min, k.max);
    if (k.reloadable) desc += " (reloadable)";
    app.add_option("--" + std::string(k.path), flag_values[std::string(k.path)], desc);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const auto& [key, value] : flag_values)
    if (app.count("--" + key) > 0) sources.flags[key] = value;
  return std::nullopt;
}

// Raises the soft RLIMIT_NOFILE to the hard limit (the common default of
// 1,024 runs out at about a thousand client connections) and logs it;
// returns the limit now in force.
uint64_t raise_open_files_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  const rlim_t before = rl.rlim_cur;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
    // An unlimited hard limit is refused by Linux (fs.nr_open bounds it): 1,048,576 is its default.
    else if (want.rlim_cur = std::min<rlim_t>(rl.rlim_max, 1 << 20); setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  if (rl.rlim_cur == before)
    spdlog::info("open files limit (RLIMIT_NOFILE) {} (the hard limit)", static_cast<uint64_t>(rl.rlim_cur));
  else
    spdlog::info("open files limit (RLIMIT_NOFILE) raised from {} to {}", static_cast<uint64_t>(before),
                 static_cast<uint64_t>(rl.rlim_cur));
  return rl.rlim_cur;
}

// Per model of the configured workers (workers.static, discovery.dns; their
// LoRA adapters too): how its string and chat prompts will be tokenized. A
// model routed on placeholder tokens is warned about now, never silently.
// Workers that arrive later (admin API, NATS) are warned about by their
// first request routed on the placeholder (router/routing.cpp).
void report_tokenization(const Config& cfg, const TokenizerSet& tokenizers) {
  std::map<std::string, std::string> models;  // model or adapter -> base model ("" = itself)
  std::vector<WorkerEntry> workers;
  std::vector<DnsEntry> dns;
  parse_worker_entries(cfg.workers.static_list, workers);
  parse_dns_entries(cfg.discovery.dns, dns);
  auto add = [&](const std::string& model, const std::vector<std::string>& lora) {
    models.emplace(model, "");
    for (const auto& l : lora) models.emplace(l, model);
  };
  for (const auto& w : workers) add(w.model, w.lora);
  for (const auto& d : dns) add(d.model, d.lora);
  for (const auto& [model, base] : models) {
    if (tokenizers.find(model)) continue;
    if (!base.empty() && tokenizers.find(base)) {
      spdlog::info("model '{}': a LoRA adapter of '{}', tokenized with its tokenizer (tokenizer.models)", model, base);
      continue;
    }
    if (cfg.tokenizer.remote == "off")
      spdlog::warn("model '{}': no tokenizer.models entry and tokenizer.remote is off: its string and chat requests "
                   "will be routed on placeholder tokens (cache hits approximate; "
                   "kvroute_router_tokenizer_fallbacks_total)",
                   model);
    else
      spdlog::info("model '{}': no tokenizer.models entry: its string and chat prompts are tokenized by the engine's "
                   "POST /tokenize (a round trip per request unless cached; tokenizer.models is the fast path)",
                   model);
  }
}


// Warnings about a configuration that works but may not be what was meant.
void warn_about_config(const Config& cfg, bool allow_any_worker_url) {
  if (allow_any_worker_url && !cfg.events.nats_url.empty())
    spdlog::warn("events.worker_url_allow is '*': anyone who may publish on {}.workers can make kvroute send "
                 "requests to any URL; list the workers' subnets instead (config/README.md)",
                 cfg.events.subject_prefix);
  if (cfg.admin.token.empty())
    spdlog::warn("admin.token is empty: the admin API refuses every request (set KVROUTE_ADMIN_TOKEN)");
}

// Signals are handled by sigwait on the main thread: blocked before any other
// thread starts, so every thread inherits the mask.
sigset_t block_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return signals;
}

// The daemon's parts, declared in the order they are built (so destroyed in
// reverse); stop() stops their threads in the order that is safe.
class Daemon {
 public:
  Daemon(const Config& cfg, uint64_t open_files);
  // Each builds and starts one group of parts; false (the error printed) ends
  // the process.
  bool load_tokenizers(const Config& cfg);
  bool start_events(const Config& cfg);
  void start_fleet(const Config& cfg);
  bool start_replicas(const Config& cfg);
  void build_routing();
  void build_server() { server_ = std::make_unique<HttpServer>(server_hooks()); }
  void register_metrics(const Config& cfg);
  bool start_server(const Config& cfg);
  // Until SIGTERM/SIGINT (then drains); SIGHUP reloads from `sources`.
  void serve(const sigset_t& signals, const ConfigSources& sources);
  void stop();

 private:
  void build_status();
  std::string pools_json();  // the status page's "pools"
  std::string pd_status_json();  // the status page's "pd" counters
  HttpServerHooks server_hooks();

  const uint64_t open_files_;
  ConfigStore config_;
  SteadyClock& clock_ = SteadyClock::instance();
  SeededRandom random_{std::random_device{}()};
  metrics::Registry metrics_;
  RouterMetrics router_metrics_{metrics_};
  // Index: exact (from events, behind the sequencer) and approximate (from
  // routing decisions, for workers that publish no events).
  // Shared pools (indexer.kv_pools) sit between the sequencer (each worker's
  // own event order) and the tree.
  RadixIndexer radix_;
  PoolIndex pools_;
  EventSequencer sequencer_{pools_};
  ApproxIndexer approx_;
  MergedIndex index_{sequencer_, approx_};
  WorkerRegistry registry_{clock_};
  flow::FlowControl flow_;  // tenants, API keys, bands, the wait queue (router/flow/)
  TokenizerSet tokenizers_;  // the models' own tokenizers (tokenizer.models); others use the placeholder
  std::unique_ptr<NatsBus> bus_;
  std::unique_ptr<EventPipeline> pipeline_;
  SaltAttribution salts_;
  std::unique_ptr<ZmqEventSource> zmq_;
  std::unique_ptr<KnownWorkers> fleet_;
  std::unique_ptr<ReplicaSync> replicas_;
  std::unique_ptr<RoutingService> routing_;
  std::unique_ptr<AdminApi> admin_;
  SessionAffinity sessions_;  // scheduler.session_affinity
  DecisionLog decisions_;
  std::unique_ptr<StatusHistory> history_;
  std::unique_ptr<StatusReport> fleet_status_;
  std::unique_ptr<HttpServer> server_;
};

Daemon::Daemon(const Config& cfg, uint64_t open_files)
    : open_files_(open_files),
      config_(cfg),
      pools_(radix_, pool_specs(cfg)),
      approx_(clock_, std::chrono::milliseconds(cfg.indexer.approx_ttl_ms), cfg.indexer.approx_max_entries) {
  config_.on_change([](const Config& c) { setup_logging(c.log.level, c.log.format); });
  for (size_t p = 0; p < pools_.pools().size(); ++p) router_metrics_.pool_names[p] = pools_.pools()[p].name;
}

bool Daemon::load_tokenizers(const Config& cfg) {
  std::string err;
  if (!tokenizers_.load(cfg.tokenizer.models, &err)) {
    std::fprintf(stderr, "kvroute: tokenizer.models: %s\n", err.c_str());
    return false;
  }
  if (tokenizers_.size() > 0) spdlog::info("tokenizers loaded for {} model(s)", tokenizers_.size());
  report_tokenization(cfg, tokenizers_);
  return true;
}

// NATS (optional: without it, workers come from workers.static /
// discovery.dns and their KV events over ZMQ), the event pipeline, and the
// ZMQ source for vLLM / SGLang workers' own sockets (tenants' root blocks
// attributed from the router's own dispatches when the events carry no salt).
bool Daemon::start_events(const Config& cfg) {
  std::string err;
  if (!cfg.events.nats_url.empty()) {
    const auto& e = cfg.events;
    NatsSecurity sec{e.nats_user,         e.nats_password,    e.nats_token,         e.nats_creds_file,
                     e.nats_nkey_seed_file, e.nats_tls,        e.nats_tls_ca_file,   e.nats_tls_cert_file,
                     e.nats_tls_key_file};
    bus_ = NatsBus::connect(e.nats_url, "kvroute", std::chrono::milliseconds(e.connect_timeout_ms), sec, &err);
    if (!bus_) {
      std::fprintf(stderr, "kvroute: events.nats_url: %s\n", err.c_str());
      return false;
    }
  }
  pipeline_ = std::make_unique<EventPipeline>(cfg.events, cfg.indexer.block_size, index_, registry_, clock_);
  sequencer_.set_resync_callback([this](CacheOwner owner) { pipeline_->request_resync(owner); });
  pipeline_->set_block_limit_policy(cfg.indexer.max_blocks_per_worker, cfg.indexer.capacity_slack);
  if (bus_ && !pipeline_->start(*bus_, &err)) {
    std::fprintf(stderr, "kvroute: %s\n", err.c_str());
    return false;
  }
  if (!bus_) pipeline_->start_writer();
  zmq_ = std::make_unique<ZmqEventSource>(
      cfg.zmq, cfg.indexer.block_size,
      [this](std::vector<KvEvent>&& events) { return pipeline_->enqueue_events(std::move(events)); },
      DecodeLimits{}, &salts_);
  zmq_->start();
  return true;
}

// Router-known workers (workers.static, discovery.dns, admin API): judged by
// their own /metrics and connections; their KV events over ZMQ.
void Daemon::start_fleet(const Config& cfg) {
  KnownWorkerHooks hooks;
  hooks.added = [this](const WorkerAnnouncement& w) {
    if (w.kv_events.empty()) return;
    std::string e;
    if (!zmq_->add_worker(w.id, ZmqWorkerEndpoints{w.kv_events, w.replay, w.dp_size}, &e))
      spdlog::error("worker {}: KV events endpoint not usable ({}); routing without its cache", w.id.value, e);
  };
  hooks.removed = [this](WorkerId id) {
    zmq_->remove_worker(id);
    salts_.remove_worker(id);
    pipeline_->enqueue_remove_worker(id);
  };
  // Back from down: the engine may have restarted with an empty cache and a
  // new event history. Clear its owners and sync again from its replay buffer.
  hooks.recovered = [this](const WorkerAnnouncement& w) {
    if (w.kv_events.empty()) return;
    zmq_->remove_worker(w.id);
    zmq_->add_worker(w.id, ZmqWorkerEndpoints{w.kv_events, w.replay, w.dp_size});
  };
  fleet_ = std::make_unique<KnownWorkers>(registry_, cfg.indexer.block_size, std::move(hooks));
  fleet_->start(cfg);
  config_.on_change([this](const Config& c) { fleet_->apply_config(c); });
}

// Other replicas' in-flight requests count in predicted load (NATS only).
bool Daemon::start_replicas(const Config& cfg) {
  if (!cfg.events.replica_sync || !bus_) return true;
  replicas_ = std::make_unique<ReplicaSync>(*bus_, registry_, clock_, cfg.events.subject_prefix,
                                            std::chrono::milliseconds(cfg.events.replica_sync_interval_ms),
                                            std::chrono::milliseconds(cfg.events.replica_ttl_ms));
  std::string err;
  if (replicas_->start(&err)) return true;
  std::fprintf(stderr, "kvroute: %s\n", err.c_str());
  return false;
}

// Routing, the admin API and the status page's data.
void Daemon::build_routing() {
  routing_ = std::make_unique<RoutingService>(index_, registry_, config_, random_, &tokenizers_);
  admin_ = std::make_unique<AdminApi>(config_, *routing_, registry_, index_);
  admin_->set_index_age([this](WorkerId w) { return pipeline_->index_age(w); });
  admin_->set_fleet_hooks(AdminWorkerHooks{[this](std::string_view entry) { return fleet_->add_worker(entry); },
                                          [this](WorkerId id) { return fleet_->remove_worker(id); }});
  admin_->set_salt_blind([this](WorkerId w) { return salts_.salt_blind(w); });
  std::vector<std::string> pool_names;
  for (const PoolSpec& p : pools_.pools()) pool_names.push_back(p.name);
  admin_->set_pool_names(std::move(pool_names));
  build_status();
}

// The status page's data (router/status.h): latest decisions, fleet totals
// once a second for 15 minutes, the per-worker table.
void Daemon::build_status() {
  history_ = std::make_unique<StatusHistory>([this] {
    StatusCounters c;
    c.routed = decisions_.routed();
    c.prompt_tokens = router_metrics_.prompt_tokens_total.get().value();
    c.cached_tokens = router_metrics_.cached_tokens_total.get().value();
    c.events = pipeline_->stats().messages_total.load() + zmq_->stats().frames_total.load();  // NATS messages, ZMQ frames
    c.decision_buckets = decisions_.decision_buckets();
    const auto is = radix_.stats();
    c.index_blocks = is.blocks;
    c.index_entries = is.entries;
    c.workers = registry_.size();
    c.inflight = server_ ? server_->inflight() : 0;
    return c;
  });
  StatusSources sources;
  sources.index_entries = [this] { return radix_.entries_by_worker(); };
  sources.salt_blind = [this](WorkerId w) { return salts_.salt_blind(w); };
  // Partial index: NATS events lost (the sequencer awaits a resync) or a ZMQ gap replay could not cover.
  sources.partial_index = [this](CacheOwner o) {
    return sequencer_.is_stale(o) || zmq_->is_partial(o) || radix_.is_capped(o);
  };
  sources.worker_tokens = [this](WorkerId w) {
    auto t = router_metrics_.worker_tokens(w.value);
    return std::pair<uint64_t, uint64_t>{t.prompt.value(), t.cached.value()};
  };
  // Stale: a scraped worker (its /metrics) missed two scrapes; a heartbeat-only
  // worker was silent for half its TTL.
  sources.flow_json = [this] { return flow_.status_json(*config_.get()); };
  if (!pools_.pools().empty()) sources.pools_json = [this] { return pools_json(); };
  sources.pd_json = [this] { return pd_status_json(); };
  sources.stale_after = [this](const WorkerAnnouncement& w) {
    const auto c = config_.get();
    const auto ms = w.metrics_url.empty() ? std::chrono::milliseconds(c->events.worker_ttl_ms) / 2
                                          : 3 * std::chrono::milliseconds(c->workers.scrape_interval_ms);
    return std::chrono::duration_cast<Nanos>(ms);
  };
  fleet_status_ = std::make_unique<StatusReport>(registry_, std::move(sources), *history_, decisions_);
  admin_->set_status(fleet_status_.get());
  admin_->set_queue_view([this](std::string_view model, std::optional<int64_t> priority, std::string_view header) {
    const auto cfg = config_.get();
    const auto t = flow_.tables(cfg);
    const uint32_t band = flow::FlowControl::band_of(*t, priority, header).value_or(0);
    // How long the oldest request this one would wait behind has waited.
    const auto oldest = flow_.queue().oldest_entry(model, band);
    const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch()).count();
    const std::string oldest_ms =
        oldest ? fmt::format("{:.3f}", static_cast<double>(now_ns - *oldest) / 1e6) : std::string("null");
    return fmt::format(R"({{"band":"{}","ahead":{},"queued":{},"oldest_wait_ms":{}}})", t->bands[band].name,
                       flow_.queue().ahead(model, band), flow_.queue().waiting(), oldest_ms);
  });
}

// A disaggregated fleet's counters for the status page (the kvroute_pd_*
// families, summed by the label the page shows).
std::string Daemon::pd_status_json() {
  RouterMetrics& m = router_metrics_;
  // {"label":n,...} of a family with one label (or the first of two), summed.
  auto by_first = [](const metrics::CounterFamily& f, uint64_t* not_ok = nullptr) {
    std::map<std::string, uint64_t> sums;
    f.for_each([&](const std::vector<std::string>& labels, const metrics::Counter& c) {
      sums[labels.empty() ? std::string() : labels[0]] += c.value();
    });
    std::string out = "{";
    for (const auto& [k, v] : sums) {
      fmt::format_to(std::back_inserter(out), R"({}"{}":{})", out.size() > 1 ? "," : "", json_escape(k), v);
      if (not_ok && k != "ok" && k != "cancelled") *not_ok += v;
    }
    return out + "}";
  };
  uint64_t prefill_failures = 0;
  const std::string legs = by_first(m.pd_prefill_legs_total, &prefill_failures);
  return fmt::format(
      R"({{"requests":{},"prefill_legs":{},"prefill_failures":{},"releases":{},"transfers_left":{},"client_gone":{}}})",
      by_first(m.pd_requests_total), legs, prefill_failures, by_first(m.pd_releases_total),
      by_first(m.pd_transfers_left_total), by_first(m.pd_client_gone_total));
}

// The shared pools for the status page: each pool's members, weight (its
// load cost against a recompute), blocks indexed, and the requests routed to a
// member that loads part of its prompt from it.
std::string Daemon::pools_json() {
  const auto cfg = config_.get();
  const auto by = radix_.entries_by_worker();
  std::string out = "[";
  for (uint32_t p = 0; p < pools_.pools().size(); ++p) {
    const PoolSpec& s = pools_.pools()[p];
    uint64_t blocks = 0;
    for (const auto& [w, e] : by)
      if (w == PoolIndex::pool_owner(p).worker) blocks = e;
    std::string members;
    for (WorkerId m : s.members) members += fmt::format("{}{}", members.empty() ? "" : ",", m.value);
    RouterMetrics& m = router_metrics_;
    fmt::format_to(std::back_inserter(out),
                   R"({}{{"name":"{}","medium":"{}","workers":[{}],"weight":{},"blocks":{},"hits":{},"hit_tokens":{}}})",
                   p ? "," : "", json_escape(s.name), json_escape(s.medium), members,
                   cfg->scheduler.tier_weight_pool[p], blocks, m.pool_hits_total.with({s.name}).value(),
                   m.pool_hit_tokens_total.with({s.name}).value());
  }
  return out + "]";
}

// Each module's metrics, next to its stats, into the one registry (the
// router's own families are declared by RouterMetrics).
void Daemon::register_metrics(const Config& cfg) {
  const bool allow_any = UrlAllowList::parse(cfg.events.worker_url_allow).value_or(UrlAllowList()).allows_any();
  register_worker_load_metrics(metrics_, registry_);
  register_pipeline_metrics(metrics_, *pipeline_, bus_.get(), registry_, allow_any);
  register_index_metrics(metrics_, sequencer_, radix_, approx_);
  if (!pools_.pools().empty()) register_pool_metrics(metrics_, pools_, radix_);
  admin_->register_metrics(metrics_);
  register_fleet_metrics(metrics_, *fleet_, registry_);
  register_zmq_metrics(metrics_, zmq_->stats());
  register_salt_metrics(metrics_, salts_);
  if (replicas_) register_replica_metrics(metrics_, *replicas_);
  server_->register_metrics(metrics_);
  flow_.register_metrics(metrics_, &config_);
}

HttpServerHooks Daemon::server_hooks() {
  HttpServerHooks hooks;
  hooks.routing = routing_.get();
  hooks.registry = &registry_;
  hooks.sessions = &sessions_;
  hooks.config = &config_;
  hooks.admin = admin_.get();
  hooks.metrics = &router_metrics_;
  hooks.flow = &flow_;
  // Ready while some worker can take requests; a NATS outage does not make
  // the router unready (workers are judged by the router, not by the bus).
  hooks.ready = [this] { return !registry_.candidates("").empty(); };
  hooks.open_files_limit = open_files_;
  hooks.render_metrics = [this] { return metrics_.render(); };
  hooks.on_routed = [this](const ParsedRequest& request, const RouteResult& r) {
    // Approximate mode: the chosen worker will cache the request's blocks.
    const auto& w = r.workers[*r.decision.chosen];
    const auto cfg = config_.get();
    if (cfg->indexer.approximate || w.info->approximate)
      approx_.record(r.candidates[*r.decision.chosen].owner, r.block_hashes, clock_.now());
    decisions_.on_routed(request, r, cfg->scheduler, cfg->indexer.block_size);
  };
  // Only workers whose KV events come over ZMQ (token ids hashed here) need
  // it; they leave with the fleet's `removed` hook, which bounds the table.
  hooks.on_dispatch = [this](WorkerId worker, const RouteResult& r) {
    if (!r.first_block) return;
    for (const auto& w : r.workers)
      if (w.info->id == worker) {
        if (!w.info->kv_events.empty()) salts_.record_dispatch(worker, *r.first_block, r.salt_hash);
        return;
      }
  };
  return hooks;
}

// The server's listeners (the admin one binds where the router binds unless
// admin.host says otherwise), then its io threads and the status sampler.
bool Daemon::start_server(const Config& cfg) {
  std::string err;
  if (auto e = flow_.reload_keys(cfg)) {
    std::fprintf(stderr, "kvroute: %s\n", e->c_str());
    return false;
  }
  if (flow_.keys_enabled()) spdlog::info("{} API keys loaded: the OpenAI listener requires one", flow_.key_count());
  if (auto e = server_->reload_worker_key(config_.get())) {
    std::fprintf(stderr, "kvroute: %s\n", e->c_str());
    return false;
  }
  const std::string admin_host = cfg.admin.host.empty() ? cfg.router.host : cfg.admin.host;
  if (!server_->listen(cfg.router.host, static_cast<uint16_t>(cfg.router.port), &err)) {
    std::fprintf(stderr, "kvroute: router.port: %s\n", err.c_str());
    return false;
  }
  if (!server_->listen_admin(admin_host, static_cast<uint16_t>(cfg.admin.port), &err)) {
    // A second kvroute on one machine: say which key to change (documented in config/README.md).
    std::fprintf(stderr,
                 "kvroute: admin.port: cannot open the admin listener on %s:%u (%s); another process (a second "
                 "kvroute?) holds it: set admin.port (--admin.port, KVROUTE_ADMIN_PORT; 0 = any free port)\n",
                 admin_host.c_str(), cfg.admin.port, err.c_str());
    return false;
  }
  server_->start(cfg.router.threads);
  history_->start();
  std::printf("kvroute listening on http://%s:%u admin http://%s:%u\n", cfg.router.host.c_str(), server_->port(),
              admin_host.c_str(), server_->admin_port());
  std::fflush(stdout);
  if (cfg.events.nats_url.empty())
    spdlog::info("no NATS (events.nats_url empty): workers from workers.static, discovery.dns and the admin API; "
                 "block_size {}", cfg.indexer.block_size);
  else
    spdlog::info("nats {} prefix '{}', block_size {}, worker_ttl {} ms", cfg.events.nats_url,
                 cfg.events.subject_prefix, cfg.indexer.block_size, cfg.events.worker_ttl_ms);
  return true;
}

void Daemon::serve(const sigset_t& signals, const ConfigSources& sources) {
  for (;;) {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == SIGHUP) {
      Config next;
      auto e = sources.load(next);
      if (e) admin_->count_rejected_reload();
      else e = admin_->replace(next);
      if (e) spdlog::error("SIGHUP: configuration not reloaded, the old one keeps serving: {}", *e);
      else spdlog::info("SIGHUP: configuration reloaded");
      // The API keys are re-read either way (a rotated key file needs no
      // config change); a bad file keeps the keys in force.
      if (auto ke = flow_.reload_keys(*config_.get()))
        spdlog::error("SIGHUP: API keys not reloaded, the old ones stay: {}", *ke);
      else if (flow_.keys_enabled())
        spdlog::info("SIGHUP: {} API keys loaded", flow_.key_count());
      // The worker key too (a rotated file); a bad one keeps the key in force.
      if (auto we = server_->reload_worker_key(config_.get()))
        spdlog::error("SIGHUP: worker key not reloaded, the old one stays: {}", *we);
      continue;
    }
    const auto grace = std::chrono::milliseconds(config_.get()->router.shutdown_grace_ms);
    spdlog::info("signal {}: draining {} in-flight requests for up to {} ms", sig, server_->inflight(), grace.count());
    server_->shutdown(grace);
    return;
  }
}

// The bus's callbacks point into the pipeline: stop the pipeline's threads
// (they use the bus), then close the bus while the pipeline still exists.
void Daemon::stop() {
  if (history_) history_->stop();
  if (replicas_) replicas_->stop();
  if (fleet_) fleet_->stop();
  if (zmq_) zmq_->stop();
  if (pipeline_) pipeline_->stop();
  bus_.reset();
}

}  // namespace

int main(int argc, char** argv) {
  ConfigSources sources;
  bool print_config = false;
  if (const auto exit_code = parse_command_line(argc, argv, sources, print_config)) return *exit_code;
  Config cfg;
  if (auto e = sources.load(cfg)) {
    std::fprintf(stderr, "kvroute: %s\n", e->c_str());
    return 2;
  }
  if (print_config) {
    std::fputs(to_yaml(cfg).c_str(), stdout);
    return 0;
  }
  setup_logging(cfg.log.level, cfg.log.format);
  const uint64_t open_files = raise_open_files_limit();
  warn_about_config(cfg, UrlAllowList::parse(cfg.events.worker_url_allow).value_or(UrlAllowList()).allows_any());
  const sigset_t signals = block_signals();

  Daemon daemon(cfg, open_files);
  if (!daemon.load_tokenizers(cfg)) return 2;
  if (!daemon.start_events(cfg)) return daemon.stop(), 1;
  daemon.start_fleet(cfg);
  if (!daemon.start_replicas(cfg)) return daemon.stop(), 1;
  daemon.build_routing();
  daemon.build_server();
  daemon.register_metrics(cfg);  // before the listeners open: the first scrape sees every metric
  if (!daemon.start_server(cfg)) return daemon.stop(), 1;
  daemon.serve(signals, sources);
  daemon.stop();
  return 0;
}
