// kvroute: the daemon. The only place that wires the modules together.
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
#include <mutex>
#include <set>

#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/url_allow_list.h"
#include "config/config.h"
#include "config/config_store.h"
#include "events/event_pipeline.h"
#include "events/nats_bus.h"
#include "events/salt_attribution.h"
#include "events/zmq_source.h"
#include "events/replica_sync.h"
#include "fleet/known_workers.h"
#include "indexer/approx_indexer.h"
#include "indexer/event_sequencer.h"
#include "indexer/radix_indexer.h"
#include "router/admin_api.h"
#include "router/http_server.h"
#include "indexer/merged_index.h"
#include "router/router_metrics.h"
#include "router/routing.h"
#include "router/status.h"
#include "fleet/worker_registry.h"

extern char** environ;

using namespace kvroute;

namespace {

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
    return validate(cfg);
  }
};

// Metrics of modules that keep plain atomic counters (events, indexer,
// admin): rendered at scrape time in the exposition format.
void render_module_metrics(std::string& out, const EventPipelineStats& st, const EventSequencer& seq,
                           const RadixIndexer& index, const ApproxIndexer& approx, const AdminStats& admin,
                           const NatsBus* bus) {
  auto head = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto line = [&](std::string_view name, std::string_view labels, double v) {
    out += fmt::format("{}{} {}\n", name, labels, v);
  };
  // events: counters, then gauges
  head("kvroute_events_messages_total", "counter", "kv_events messages received");
  line("kvroute_events_messages_total", "", st.messages_total.load());
  head("kvroute_events_rejected_total", "counter", "kv_events messages rejected, by reason");
  for (size_t i = 1; i < st.rejected_total.size(); ++i)
    line("kvroute_events_rejected_total", fmt::format("{{reason=\"{}\"}}", to_string(static_cast<DecodeError>(i))),
         st.rejected_total[i].load());
  head("kvroute_events_queue_dropped_total", "counter", "kv_events messages dropped on a full writer queue");
  line("kvroute_events_queue_dropped_total", "", st.queue_dropped_total.load());
  head("kvroute_events_heartbeats_total", "counter", "worker heartbeats accepted, or rejected");
  line("kvroute_events_heartbeats_total", "{result=\"accepted\"}", st.heartbeats_total.load());
  line("kvroute_events_heartbeats_total", "{result=\"rejected\"}", st.heartbeats_rejected_total.load());
  head("kvroute_events_block_size_mismatch_total", "counter", "heartbeats announcing another block size");
  line("kvroute_events_block_size_mismatch_total", "", st.block_size_mismatch_total.load());
  head("kvroute_events_workers_expired_total", "counter", "workers removed after missing heartbeats");
  line("kvroute_events_workers_expired_total", "", st.workers_expired_total.load());
  head("kvroute_events_expiry_held_total", "counter",
       "heartbeat expiry ticks skipped because NATS was down (heartbeat-only workers kept)");
  line("kvroute_events_expiry_held_total", "", st.expiry_held_ticks_total.load());
  head("kvroute_events_nats_reconnects_total", "counter", "NATS reconnections");
  line("kvroute_events_nats_reconnects_total", "", bus ? bus->reconnects() : 0);
  head("kvroute_events_nats_connected", "gauge", "1 when the NATS connection is up (0 without NATS)");
  line("kvroute_events_nats_connected", "", bus && bus->connected() ? 1 : 0);
  // indexer: counters, then gauges
  head("kvroute_indexer_events_total", "counter", "index events applied, by type and result");
  static constexpr std::string_view kTypes[] = {"stored", "removed", "cleared"};
  for (size_t t = 0; t < st.applied_total.size(); ++t)
    for (size_t i = 0; i < st.applied_total[t].size(); ++i)
      line("kvroute_indexer_events_total",
           fmt::format("{{type=\"{}\",result=\"{}\"}}", kTypes[t], to_string(static_cast<ApplyResult>(i))),
           st.applied_total[t][i].load());
  const auto& sq = seq.counters();
  head("kvroute_indexer_event_gaps_total", "counter", "event_id gaps (lost events) detected");
  line("kvroute_indexer_event_gaps_total", "", sq.gaps.load());
  head("kvroute_indexer_event_duplicates_total", "counter", "events ignored as redelivered");
  line("kvroute_indexer_event_duplicates_total", "", sq.duplicates.load());
  head("kvroute_indexer_worker_restarts_total", "counter", "event_id went backwards: worker restarted");
  line("kvroute_indexer_worker_restarts_total", "", sq.restarts.load());
  head("kvroute_indexer_resyncs_total", "counter", "resyncs by result");
  line("kvroute_indexer_resyncs_total", "{result=\"requested\"}", st.resync_requests_total.load());
  line("kvroute_indexer_resyncs_total", "{result=\"failed\"}", st.resync_failures_total.load());
  line("kvroute_indexer_resyncs_total", "{result=\"applied\"}", st.resync_applied_total.load());
  head("kvroute_indexer_blocks_refused_total", "counter", "stored blocks refused, by reason");
  line("kvroute_indexer_blocks_refused_total", "{reason=\"worker_limit\"}", index.blocks_refused());
  const auto is = index.stats();
  const auto as = approx.stats();
  head("kvroute_indexer_stale_owners", "gauge", "cache owners whose entries are not trusted until a resync");
  line("kvroute_indexer_stale_owners", "", sq.stale_owners.load());
  head("kvroute_indexer_capped_owners", "gauge",
       "cache owners that had blocks refused over their worker's limit (index partial until cleared)");
  line("kvroute_indexer_capped_owners", "", index.capped_owners());
  head("kvroute_indexer_blocks", "gauge", "distinct blocks in the index, by mode");
  line("kvroute_indexer_blocks", "{mode=\"exact\"}", is.blocks);
  line("kvroute_indexer_blocks", "{mode=\"approximate\"}", as.blocks);
  head("kvroute_indexer_entries", "gauge", "(block, owner) entries in the index, by mode");
  line("kvroute_indexer_entries", "{mode=\"exact\"}", is.entries);
  line("kvroute_indexer_entries", "{mode=\"approximate\"}", as.entries);
  head("kvroute_indexer_bytes", "gauge", "memory held by the index, by mode");
  line("kvroute_indexer_bytes", "{mode=\"exact\"}", is.bytes);
  line("kvroute_indexer_bytes", "{mode=\"approximate\"}", as.bytes);
  // config
  head("kvroute_config_reloads_total", "counter", "configuration updates by result");
  line("kvroute_config_reloads_total", "{result=\"ok\"}", admin.reloads_ok.load());
  line("kvroute_config_reloads_total", "{result=\"rejected\"}", admin.reloads_rejected.load());
  head("kvroute_admin_auth_failures_total", "counter", "admin requests refused for a missing or wrong token");
  line("kvroute_admin_auth_failures_total", "", admin.auth_failures.load());
}

// Issue 15 (bus): resync, unknown workers, heartbeat rejections by reason,
// ingest queue bytes, and how old each worker's part of the index is.
void render_bus_metrics(std::string& out, const EventPipeline& pipeline, const EventSequencer& seq) {
  const auto& st = pipeline.stats();
  auto head = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  head("kvroute_events_unknown_worker_events_total", "counter", "kv events dropped: their worker is not known");
  out += fmt::format("kvroute_events_unknown_worker_events_total {}\n", st.unknown_worker_events_total.load());
  head("kvroute_events_heartbeats_rejected_total", "counter", "heartbeats rejected, by reason");
  for (size_t i = 1; i < st.heartbeats_rejected_by_reason.size(); ++i)
    out += fmt::format("kvroute_events_heartbeats_rejected_total{{reason=\"{}\"}} {}\n",
                       EventPipelineStats::heartbeat_reason(i), st.heartbeats_rejected_by_reason[i].load());
  head("kvroute_events_resync_chunks_total", "counter", "resync chunk requests sent, and repeated");
  out += fmt::format("kvroute_events_resync_chunks_total{{result=\"sent\"}} {}\n", st.resync_chunks_total.load());
  out += fmt::format("kvroute_events_resync_chunks_total{{result=\"retried\"}} {}\n",
                     st.resync_chunk_retries_total.load());
  head("kvroute_events_queue_dropped_bytes_total", "counter", "bytes of kv_events messages dropped on a full queue");
  out += fmt::format("kvroute_events_queue_dropped_bytes_total {}\n", st.queue_dropped_bytes_total.load());
  head("kvroute_events_queue_worker_dropped_total", "counter",
       "kv_events messages dropped because their worker filled its share of the queue (events.queue_worker_share)");
  out += fmt::format("kvroute_events_queue_worker_dropped_total {}\n", st.queue_worker_dropped_total.load());
  head("kvroute_events_queue_bytes", "gauge", "bytes of decoded events waiting for the index writer");
  out += fmt::format("kvroute_events_queue_bytes {}\n", st.queued_bytes.load());
  head("kvroute_indexer_events_discarded_total", "counter",
       "buffered events dropped after a dump: ids the worker cannot have reached (absurd or hostile)");
  out += fmt::format("kvroute_indexer_events_discarded_total {}\n", seq.counters().discarded.load());
  head("kvroute_indexer_worker_index_age_seconds", "gauge",
       "time since the index last heard from a worker (an event or a dump)");
  for (const auto& [w, age] : pipeline.index_ages())
    out += fmt::format("kvroute_indexer_worker_index_age_seconds{{worker=\"{}\"}} {:.3f}\n", w.value,
                       std::chrono::duration<double>(age).count());
}

// Fleet metrics: workers by source and health, scrapes, DNS, health signals.
void render_fleet_metrics(std::string& out, const KnownWorkers& fleet, const WorkerRegistry& registry) {
  auto head = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  const auto& sc = fleet.scrape_stats();
  const auto& st = fleet.stats();
  head("kvroute_fleet_scrapes_total", "counter", "worker /metrics scrapes by result");
  out += fmt::format("kvroute_fleet_scrapes_total{{result=\"ok\"}} {}\n", sc.scrapes_ok.load());
  out += fmt::format("kvroute_fleet_scrapes_total{{result=\"failed\"}} {}\n", sc.scrapes_failed.load());
  head("kvroute_fleet_dns_lookups_total", "counter", "discovery.dns lookups by result");
  out += fmt::format("kvroute_fleet_dns_lookups_total{{result=\"ok\"}} {}\n", st.dns_lookups_ok.load());
  out += fmt::format("kvroute_fleet_dns_lookups_total{{result=\"not_found\"}} {}\n", st.dns_lookups_not_found.load());
  out += fmt::format("kvroute_fleet_dns_lookups_total{{result=\"failed\"}} {}\n", st.dns_lookups_failed.load());
  head("kvroute_fleet_worker_changes_total", "counter", "router-known workers added and removed");
  out += fmt::format("kvroute_fleet_worker_changes_total{{change=\"added\"}} {}\n", st.workers_added.load());
  out += fmt::format("kvroute_fleet_worker_changes_total{{change=\"removed\"}} {}\n", st.workers_removed.load());
  head("kvroute_fleet_health_failures_total", "counter", "failures observed talking to workers, by signal");
  const auto failures = registry.failure_counts();
  for (size_t i = 0; i < failures.size(); ++i)
    out += fmt::format("kvroute_fleet_health_failures_total{{signal=\"{}\"}} {}\n",
                       to_string(static_cast<HealthSignal>(i)), failures[i]);
  std::map<std::pair<std::string_view, std::string_view>, int> by;
  for (const auto& w : registry.all()) by[{to_string(w.info->source), to_string(w.health)}] += 1;
  head("kvroute_fleet_workers", "gauge", "workers known, by source and health");
  for (auto src : {WorkerSource::Heartbeat, WorkerSource::Static, WorkerSource::Dns, WorkerSource::Admin})
    for (auto h : {HealthState::Ok, HealthState::Down, HealthState::Ejected})
      out += fmt::format("kvroute_fleet_workers{{source=\"{}\",health=\"{}\"}} {}\n", to_string(src), to_string(h),
                         by[{to_string(src), to_string(h)}]);
}

// Tenant attribution of root blocks (events/salt_attribution.h).
void render_salt_metrics(std::string& out, const SaltAttribution& s) {
  out += "# HELP kvroute_events_salt_roots_total root blocks of ZMQ events by how their cache_salt was decided\n"
         "# TYPE kvroute_events_salt_roots_total counter\n";
  for (size_t i = 0; i < SaltAttribution::kNumHow; ++i) {
    const auto how = static_cast<SaltAttribution::How>(i);
    out += fmt::format("kvroute_events_salt_roots_total{{how=\"{}\"}} {}\n", to_string(how), s.resolved_total(how));
  }
  out += fmt::format("# HELP kvroute_events_salt_blind_workers workers sent salted requests whose KV events never "
                     "carried a salt\n# TYPE kvroute_events_salt_blind_workers gauge\nkvroute_events_salt_blind_workers {}\n",
                     s.salt_blind_workers());
}

// ZMQ KV event metrics (events/zmq_source.h).
void render_zmq_metrics(std::string& out, const ZmqSourceStats& z) {
  auto counter = [&](std::string_view name, std::string_view help, uint64_t v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, v);
  };
  counter("kvroute_events_zmq_frames_total", "ZMQ KV event frames received", z.frames_total.load());
  counter("kvroute_events_zmq_bad_frames_total", "ZMQ frames with a wrong shape", z.bad_frames_total.load());
  out += "# HELP kvroute_events_zmq_rejected_total ZMQ payloads that did not decode, by reason\n"
         "# TYPE kvroute_events_zmq_rejected_total counter\n";
  for (size_t i = 1; i < z.rejected_total.size(); ++i)
    out += fmt::format("kvroute_events_zmq_rejected_total{{reason=\"{}\"}} {}\n",
                       to_string(static_cast<DecodeError>(i)), z.rejected_total[i].load());
  static constexpr std::string_view kSkips[] = {"none", "unknown_type", "block_size_mismatch", "token_count",
                                                "not_full_attention"};
  out += "# HELP kvroute_events_zmq_skipped_total ZMQ events not indexed, by reason\n"
         "# TYPE kvroute_events_zmq_skipped_total counter\n";
  for (size_t i = 1; i < z.skipped_total.size(); ++i)
    out += fmt::format("kvroute_events_zmq_skipped_total{{reason=\"{}\"}} {}\n", kSkips[i], z.skipped_total[i].load());
  counter("kvroute_events_zmq_blocks_stored_total", "blocks stored by ZMQ events", z.blocks_stored_total.load());
  counter("kvroute_events_zmq_gaps_total", "ZMQ sequence gaps seen", z.gaps_total.load());
  counter("kvroute_events_zmq_replay_requests_total", "replay requests sent", z.replay_requests_total.load());
  counter("kvroute_events_zmq_replay_timeouts_total", "replay requests that timed out", z.replay_timeouts_total.load());
  counter("kvroute_events_zmq_unrecoverable_total", "gaps replay could not cover (owner partial)",
          z.unrecoverable_total.load());
  counter("kvroute_events_zmq_restarts_total", "engine restarts seen (sequence went backwards)", z.restarts_total.load());
  counter("kvroute_events_zmq_sink_refused_total", "batches dropped on a full writer queue", z.sink_refused_total.load());
  counter("kvroute_events_zmq_disconnects_total",
          "KV event connections lost (disconnect, frame over the size limit, failed handshake): owner partial until "
          "replayed",
          z.disconnects_total.load());
  counter("kvroute_events_zmq_sockets_reopened_total", "SUB / replay sockets closed and made anew",
          z.sockets_reopened_total.load());
  counter("kvroute_events_zmq_held_dropped_total", "frames dropped over zmq.max_held_bytes (replayed later)",
          z.held_dropped_total.load());
  counter("kvroute_events_zmq_held_dropped_bytes_total", "payload bytes of those frames",
          z.held_dropped_bytes_total.load());
  out += fmt::format("# HELP kvroute_events_zmq_held_bytes payload bytes of frames held awaiting order or a replay\n"
                     "# TYPE kvroute_events_zmq_held_bytes gauge\nkvroute_events_zmq_held_bytes {}\n",
                     z.held_bytes.load());
  out += fmt::format("# HELP kvroute_events_zmq_publishers ZMQ publishers subscribed\n"
                     "# TYPE kvroute_events_zmq_publishers gauge\nkvroute_events_zmq_publishers {}\n",
                     z.publishers.load());
  out += fmt::format("# HELP kvroute_indexer_partial_owners cache owners whose index is known incomplete\n"
                     "# TYPE kvroute_indexer_partial_owners gauge\nkvroute_indexer_partial_owners {}\n",
                     z.partial_owners.load());
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kvroute: KV-cache-aware router for OpenAI-compatible LLM workers.\n"
      "Configuration precedence: defaults < --config YAML < KVROUTE_<SECTION>_<KEY> environment < flags.\n"
      "Every config key is also a flag (--section.key VALUE); config/README.md documents each.\n"
      "Signals: SIGHUP re-reads the configuration; SIGTERM/SIGINT drain and exit."};
  ConfigSources sources;
  bool print_config = false;
  app.add_option("-c,--config", sources.path, "YAML configuration file");
  app.add_flag("--print-config", print_config, "Print the effective configuration as YAML and exit");
  std::map<std::string, std::string> flag_values;
  for (const auto& k : config_keys()) {
    std::string desc = std::string(k.doc);
    if (!k.is_string) desc += fmt::format(" [{}..{}]", k.min, k.max);
    if (k.reloadable) desc += " (reloadable)";
    app.add_option("--" + std::string(k.path), flag_values[std::string(k.path)], desc);
  }
  CLI11_PARSE(app, argc, argv);
  for (const auto& [key, value] : flag_values)
    if (app.count("--" + key) > 0) sources.flags[key] = value;

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
  const bool allow_any_worker_url = UrlAllowList::parse(cfg.events.worker_url_allow).value_or(UrlAllowList()).allows_any();
  if (allow_any_worker_url && !cfg.events.nats_url.empty())
    spdlog::warn("events.worker_url_allow is '*': anyone who may publish on {}.workers can make kvroute send "
                 "requests to any URL; list the workers' subnets instead (config/README.md)",
                 cfg.events.subject_prefix);
  if (cfg.admin.token.empty())
    spdlog::warn("admin.token is empty: the admin API refuses every request (set KVROUTE_ADMIN_TOKEN)");

  // Signals are handled by sigwait on this thread: block them before any
  // other thread starts so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  ConfigStore config(cfg);
  config.on_change([](const Config& c) { setup_logging(c.log.level, c.log.format); });
  SteadyClock& clock = SteadyClock::instance();
  SeededRandom random(std::random_device{}());
  metrics::Registry registry_metrics;
  RouterMetrics router_metrics(registry_metrics);

  // Index: exact (from events, behind the sequencer) and approximate (from
  // routing decisions, for workers that publish no events).
  RadixIndexer radix;
  EventSequencer sequencer(radix);
  ApproxIndexer approx(clock, std::chrono::milliseconds(cfg.indexer.approx_ttl_ms), cfg.indexer.approx_max_entries);
  MergedIndex index(sequencer, approx);
  WorkerRegistry registry(clock);

  std::string err;
  // The models' own tokenizers (tokenizer.models); others use the placeholder.
  TokenizerSet tokenizers;
  if (!tokenizers.load(cfg.tokenizer.models, &err)) {
    std::fprintf(stderr, "kvroute: tokenizer.models: %s\n", err.c_str());
    return 2;
  }
  if (tokenizers.size() > 0) spdlog::info("tokenizers loaded for {} model(s)", tokenizers.size());
  report_tokenization(cfg, tokenizers);
  // NATS is optional: without it, workers come from workers.static /
  // discovery.dns and their KV events over ZMQ.
  std::unique_ptr<NatsBus> bus;
  if (!cfg.events.nats_url.empty()) {
    NatsSecurity sec{cfg.events.nats_user,        cfg.events.nats_password,       cfg.events.nats_token,
                     cfg.events.nats_creds_file,  cfg.events.nats_nkey_seed_file, cfg.events.nats_tls,
                     cfg.events.nats_tls_ca_file, cfg.events.nats_tls_cert_file, cfg.events.nats_tls_key_file};
    bus = NatsBus::connect(cfg.events.nats_url, "kvroute", std::chrono::milliseconds(cfg.events.connect_timeout_ms),
                           sec, &err);
    if (!bus) {
      std::fprintf(stderr, "kvroute: events.nats_url: %s\n", err.c_str());
      return 1;
    }
  }
  EventPipeline pipeline(cfg.events, cfg.indexer.block_size, index, registry, clock);
  sequencer.set_resync_callback([&](CacheOwner owner) { pipeline.request_resync(owner); });
  pipeline.set_block_limit_policy(cfg.indexer.max_blocks_per_worker, cfg.indexer.capacity_slack);
  if (bus) {
    if (!pipeline.start(*bus, &err)) {
      std::fprintf(stderr, "kvroute: %s\n", err.c_str());
      return 1;
    }
  } else {
    pipeline.start_writer();
  }

  // KV events of vLLM / SGLang workers over their own ZMQ sockets; tenants'
  // root blocks attributed from the router's own dispatches when the events
  // carry no salt.
  SaltAttribution salts;
  ZmqEventSource zmq(
      cfg.zmq, cfg.indexer.block_size,
      [&](std::vector<KvEvent>&& events) { return pipeline.enqueue_events(std::move(events)); }, DecodeLimits{},
      &salts);
  zmq.start();

  // Router-known workers (workers.static, discovery.dns, admin API): judged
  // by their own /metrics and connections; their KV events over ZMQ.
  KnownWorkerHooks fleet_hooks;
  fleet_hooks.added = [&](const WorkerAnnouncement& w) {
    if (w.kv_events.empty()) return;
    std::string e;
    if (!zmq.add_worker(w.id, ZmqWorkerEndpoints{w.kv_events, w.replay, w.dp_size}, &e))
      spdlog::error("worker {}: KV events endpoint not usable ({}); routing without its cache", w.id.value, e);
  };
  fleet_hooks.removed = [&](WorkerId id) {
    zmq.remove_worker(id);
    salts.remove_worker(id);
    pipeline.enqueue_remove_worker(id);
  };
  // Back from down: the engine may have restarted with an empty cache and a
  // new event history. Clear its owners and sync again from its replay buffer.
  fleet_hooks.recovered = [&](const WorkerAnnouncement& w) {
    if (w.kv_events.empty()) return;
    zmq.remove_worker(w.id);
    zmq.add_worker(w.id, ZmqWorkerEndpoints{w.kv_events, w.replay, w.dp_size});
  };
  KnownWorkers fleet(registry, cfg.indexer.block_size, std::move(fleet_hooks));
  fleet.start(cfg);
  config.on_change([&](const Config& c) { fleet.apply_config(c); });

  // Issue 15: other replicas' in-flight requests count in predicted load.
  std::unique_ptr<ReplicaSync> replicas;
  if (cfg.events.replica_sync && bus) {
    replicas = std::make_unique<ReplicaSync>(*bus, registry, clock, cfg.events.subject_prefix,
                                             std::chrono::milliseconds(cfg.events.replica_sync_interval_ms),
                                             std::chrono::milliseconds(cfg.events.replica_ttl_ms));
    if (!replicas->start(&err)) {
      std::fprintf(stderr, "kvroute: %s\n", err.c_str());
      return 1;
    }
  }

  RoutingService routing(index, registry, config, random, &tokenizers);
  AdminApi admin(config, routing, registry, index);
  admin.set_index_age([&](WorkerId w) { return pipeline.index_age(w); });  // issue 15
  admin.set_fleet_hooks(AdminWorkerHooks{[&](std::string_view entry) { return fleet.add_worker(entry); },
                                        [&](WorkerId id) { return fleet.remove_worker(id); }});
  registry_metrics.on_scrape([&] {
    // Per-worker load as reported and as predicted (bounded by the fleet).
    static std::mutex mu;
    static std::set<std::string> last;
    std::lock_guard lk(mu);
    static auto& kv = registry_metrics.gauge("kvroute_scheduler_worker_kv_usage_ratio",
                                             "KV usage per worker, as reported and as predicted", {"worker", "source"});
    static auto& act = registry_metrics.gauge("kvroute_scheduler_worker_active_requests",
                                              "Active requests per worker, as reported and as predicted",
                                              {"worker", "source"});
    static auto& workers = registry_metrics.gauge("kvroute_scheduler_workers", "Workers known");
    std::set<std::string> now;
    const auto all = registry.all();
    workers.get().set(static_cast<double>(all.size()));
    for (const auto& w : all) {
      const auto id = std::to_string(w.info->id.value);
      now.insert(id);
      auto ratio = [](const WorkerLoad& l) {
        return l.kv_total_blocks ? double(l.kv_active_blocks) / double(l.kv_total_blocks) : 0.0;
      };
      kv.with({id, "reported"}).set(ratio(w.info->load));
      kv.with({id, "predicted"}).set(ratio(w.predicted));
      act.with({id, "reported"}).set(w.info->load.request_active_slots);
      act.with({id, "predicted"}).set(w.predicted.request_active_slots);
    }
    for (const auto& id : last) {
      if (now.count(id)) continue;
      for (auto src : {"reported", "predicted"}) {
        kv.remove({id, src});
        act.remove({id, src});
      }
      router_metrics.worker_prompt_tokens_total.remove({id});
      router_metrics.worker_cached_tokens_total.remove({id});
    }
    last = std::move(now);
  });

  HttpServerHooks hooks;
  hooks.routing = &routing;
  hooks.registry = &registry;
  SessionAffinity sessions;  // scheduler.session_affinity
  hooks.sessions = &sessions;
  hooks.config = &config;
  hooks.admin = &admin;
  hooks.metrics = &router_metrics;
  // Ready while some worker can take requests; a NATS outage does not make
  // the router unready (workers are judged by the router, not by the bus).
  hooks.ready = [&] { return !registry.candidates("").empty(); };
  hooks.open_files_limit = open_files;
  hooks.render_metrics = [&] {
    std::string out = registry_metrics.render();
    render_module_metrics(out, pipeline.stats(), sequencer, radix, approx, admin.stats(), bus.get());
    render_fleet_metrics(out, fleet, registry);
    render_zmq_metrics(out, zmq.stats());
    render_salt_metrics(out, salts);
    render_bus_metrics(out, pipeline, sequencer);
    out += fmt::format(
        "# HELP kvroute_events_worker_url_allow_any 1 when events.worker_url_allow is '*' (any URL may join by "
        "heartbeat)\n# TYPE kvroute_events_worker_url_allow_any gauge\nkvroute_events_worker_url_allow_any {}\n"
        "# HELP kvroute_events_bus_workers workers known by heartbeat only (limit events.max_bus_workers)\n"
        "# TYPE kvroute_events_bus_workers gauge\nkvroute_events_bus_workers {}\n",
        allow_any_worker_url ? 1 : 0, registry.bus_workers());
    if (replicas) {
      const auto& rs = replicas->stats();
      out += "# HELP kvroute_events_replica_peers other router replicas whose in-flight requests count\n"
             "# TYPE kvroute_events_replica_peers gauge\n";
      out += fmt::format("kvroute_events_replica_peers {}\n", rs.peers.load());
      out += "# HELP kvroute_events_replica_snapshots_total in-flight snapshots by direction\n"
             "# TYPE kvroute_events_replica_snapshots_total counter\n";
      out += fmt::format("kvroute_events_replica_snapshots_total{{direction=\"published\"}} {}\n",
                         rs.published_total.load());
      out += fmt::format("kvroute_events_replica_snapshots_total{{direction=\"received\"}} {}\n",
                         rs.received_total.load());
      out += fmt::format("kvroute_events_replica_snapshots_total{{direction=\"rejected\"}} {}\n",
                         rs.rejected_total.load());
    }
    return out;
  };
  // ---- the status page's data (router/status.h): latest decisions, fleet
  // totals once a second for 15 minutes, the per-worker table.
  DecisionLog decisions;
  const HttpServer* live_server = nullptr;  // set before history.start()
  StatusHistory history([&] {
    StatusCounters c;
    c.routed = decisions.routed();
    c.prompt_tokens = router_metrics.prompt_tokens_total.get().value();
    c.cached_tokens = router_metrics.cached_tokens_total.get().value();
    c.events = pipeline.stats().messages_total.load() + zmq.stats().frames_total.load();  // NATS messages, ZMQ frames
    c.decision_buckets = decisions.decision_buckets();
    const auto is = radix.stats();
    c.index_blocks = is.blocks;
    c.index_entries = is.entries;
    c.workers = registry.size();
    c.inflight = live_server ? live_server->inflight() : 0;
    return c;
  });
  StatusSources fleet_sources;
  fleet_sources.index_entries = [&] { return radix.entries_by_worker(); };
  fleet_sources.salt_blind = [&](WorkerId w) { return salts.salt_blind(w); };
  admin.set_salt_blind([&](WorkerId w) { return salts.salt_blind(w); });
  // Partial index: NATS events lost (the sequencer awaits a resync) or a ZMQ gap replay could not cover.
  fleet_sources.partial_index = [&](CacheOwner o) {
    return sequencer.is_stale(o) || zmq.is_partial(o) || radix.is_capped(o);
  };
  fleet_sources.worker_tokens = [&](WorkerId w) {
    auto t = router_metrics.worker_tokens(w.value);
    return std::pair<uint64_t, uint64_t>{t.prompt.value(), t.cached.value()};
  };
  // Stale: no load report for half the heartbeat TTL (several missed heartbeats or scrapes).
  // Stale: a scraped worker (its /metrics) missed two scrapes; a heartbeat-only
  // worker was silent for half its TTL.
  fleet_sources.stale_after = [&](const WorkerAnnouncement& w) {
    const auto c = config.get();
    const auto ms = w.metrics_url.empty() ? std::chrono::milliseconds(c->events.worker_ttl_ms) / 2
                                          : 3 * std::chrono::milliseconds(c->workers.scrape_interval_ms);
    return std::chrono::duration_cast<Nanos>(ms);
  };
  StatusReport fleet_status(registry, std::move(fleet_sources), history, decisions);
  admin.set_status(&fleet_status);

  hooks.on_routed = [&](const ParsedRequest& request, const RouteResult& r) {
    // Approximate mode: the chosen worker will cache the request's blocks.
    const auto& w = r.workers[*r.decision.chosen];
    const auto cfg = config.get();
    if (cfg->indexer.approximate || w.info->approximate)
      approx.record(r.candidates[*r.decision.chosen].owner, r.block_hashes, clock.now());
    decisions.on_routed(request, r, cfg->scheduler, cfg->indexer.block_size);
  };
  // Only workers whose KV events come over ZMQ (token ids hashed here) need
  // it; they leave with fleet_hooks.removed, which bounds the table.
  hooks.on_dispatch = [&](WorkerId worker, const RouteResult& r) {
    if (!r.first_block) return;
    for (const auto& w : r.workers)
      if (w.info->id == worker) {
        if (!w.info->kv_events.empty()) salts.record_dispatch(worker, *r.first_block, r.salt_hash);
        return;
      }
  };
  HttpServer server(hooks);
  live_server = &server;
  registry_metrics.on_scrape(
      [&] {
        router_metrics.inflight_requests.get().set(static_cast<double>(server.inflight()));
        const auto limits = server.limits();
        router_metrics.connections.get().set(static_cast<double>(limits.connections));
        router_metrics.connections_limit.get().set(static_cast<double>(limits.max_connections));
        router_metrics.body_bytes.get().set(static_cast<double>(limits.body_bytes));
        router_metrics.body_bytes_limit.get().set(static_cast<double>(limits.max_body_bytes));
        router_metrics.open_files_limit.get().set(static_cast<double>(open_files));
        router_metrics.ttft_mape_ratio.get().set(registry.ttft_stats().mape());  // scheduler/ttft_model.h
      });
  // The admin listener binds where the router binds unless admin.host says otherwise.
  const std::string admin_host = cfg.admin.host.empty() ? cfg.router.host : cfg.admin.host;
  if (!server.listen(cfg.router.host, static_cast<uint16_t>(cfg.router.port), &err)) {
    std::fprintf(stderr, "kvroute: router.port: %s\n", err.c_str());
    return 1;
  }
  if (!server.listen_admin(admin_host, static_cast<uint16_t>(cfg.admin.port), &err)) {
    // A second kvroute on one machine: say which key to change (documented in config/README.md).
    std::fprintf(stderr,
                 "kvroute: admin.port: cannot open the admin listener on %s:%u (%s); another process (a second "
                 "kvroute?) holds it: set admin.port (--admin.port, KVROUTE_ADMIN_PORT; 0 = any free port)\n",
                 admin_host.c_str(), cfg.admin.port, err.c_str());
    return 1;
  }
  server.start(cfg.router.threads);
  history.start();
  std::printf("kvroute listening on http://%s:%u admin http://%s:%u\n", cfg.router.host.c_str(), server.port(),
              admin_host.c_str(), server.admin_port());
  std::fflush(stdout);
  if (cfg.events.nats_url.empty())
    spdlog::info("no NATS (events.nats_url empty): workers from workers.static, discovery.dns and the admin API; "
                 "block_size {}", cfg.indexer.block_size);
  else
    spdlog::info("nats {} prefix '{}', block_size {}, worker_ttl {} ms", cfg.events.nats_url,
                 cfg.events.subject_prefix, cfg.indexer.block_size, cfg.events.worker_ttl_ms);

  for (;;) {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == SIGHUP) {
      Config next;
      auto e = sources.load(next);
      if (e) admin.count_rejected_reload();
      else e = admin.replace(next);
      if (e) spdlog::error("SIGHUP: configuration not reloaded, the old one keeps serving: {}", *e);
      else spdlog::info("SIGHUP: configuration reloaded");
      continue;
    }
    const auto grace = std::chrono::milliseconds(config.get()->router.shutdown_grace_ms);
    spdlog::info("signal {}: draining {} in-flight requests for up to {} ms", sig, server.inflight(), grace.count());
    server.shutdown(grace);
    break;
  }
  // The bus's callbacks point into the pipeline: stop the pipeline's threads
  // (they use the bus), then close the bus while the pipeline still exists.
  history.stop();
  if (replicas) replicas->stop();
  fleet.stop();
  zmq.stop();
  pipeline.stop();
  bus.reset();
  return 0;
}
