// kvroute: the daemon. The only place that wires the modules together.
//
// Start-up: defaults < YAML file (--config) < KVROUTE_* environment < flags.
// Then: NATS connect -> event pipeline (index writer thread) -> HTTP server.
// SIGINT/SIGTERM stop it.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>
#include <map>

#include "common/clock.h"
#include "config/config.h"
#include "config/config_store.h"
#include "events/event_pipeline.h"
#include "events/nats_bus.h"
#include "indexer/radix_indexer.h"
#include "router/http_server.h"
#include "router/routing.h"
#include "scheduler/worker_registry.h"

extern char** environ;

using namespace kvroute;

namespace {

// Prometheus exposition of what the modules count. Names follow
// kvroute_<module>_<noun>_<unit|total>.
std::string render_metrics(const Indexer& index, const EventPipeline& pipeline, const WorkerRegistry& registry,
                           const NatsBus& bus) {
  std::string out;
  auto metric = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  const auto& st = pipeline.stats();
  metric("kvroute_events_messages_total", "counter", "kv_events messages received");
  out += fmt::format("kvroute_events_messages_total {}\n", st.messages_total.load());
  metric("kvroute_events_rejected_total", "counter", "kv_events messages rejected, by reason");
  for (size_t i = 1; i < st.rejected_total.size(); ++i)
    out += fmt::format("kvroute_events_rejected_total{{reason=\"{}\"}} {}\n", to_string(static_cast<DecodeError>(i)),
                       st.rejected_total[i].load());
  metric("kvroute_events_queue_dropped_total", "counter", "kv_events messages dropped on a full writer queue");
  out += fmt::format("kvroute_events_queue_dropped_total {}\n", st.queue_dropped_total.load());
  metric("kvroute_events_heartbeats_total", "counter", "worker heartbeats accepted");
  out += fmt::format("kvroute_events_heartbeats_total {}\n", st.heartbeats_total.load());
  metric("kvroute_events_workers_expired_total", "counter", "workers removed after missing heartbeats");
  out += fmt::format("kvroute_events_workers_expired_total {}\n", st.workers_expired_total.load());
  metric("kvroute_events_nats_connected", "gauge", "1 when the NATS connection is up");
  out += fmt::format("kvroute_events_nats_connected {}\n", bus.connected() ? 1 : 0);
  metric("kvroute_indexer_events_total", "counter", "index events applied, by result");
  for (size_t i = 0; i < st.applied_total.size(); ++i)
    out += fmt::format("kvroute_indexer_events_total{{result=\"{}\"}} {}\n", to_string(static_cast<ApplyResult>(i)),
                       st.applied_total[i].load());
  const auto is = index.stats();
  metric("kvroute_indexer_blocks", "gauge", "distinct blocks in the index");
  out += fmt::format("kvroute_indexer_blocks {}\n", is.blocks);
  metric("kvroute_indexer_entries", "gauge", "(block, owner) entries in the index");
  out += fmt::format("kvroute_indexer_entries {}\n", is.entries);
  metric("kvroute_indexer_bytes", "gauge", "memory held by the index");
  out += fmt::format("kvroute_indexer_bytes {}\n", is.bytes);
  metric("kvroute_scheduler_workers", "gauge", "workers known (announced or seen in events)");
  out += fmt::format("kvroute_scheduler_workers {}\n", registry.size());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kvroute: KV-cache-aware router for OpenAI-compatible LLM workers.\n"
      "Configuration precedence: defaults < --config YAML < KVROUTE_<SECTION>_<KEY> environment < flags.\n"
      "Every config key is also a flag (--section.key VALUE); see config/README.md."};
  std::string config_path;
  std::string log_level = "info";
  bool print_config = false;
  app.add_option("-c,--config", config_path, "YAML configuration file");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  app.add_flag("--print-config", print_config, "Print the effective configuration as YAML and exit");
  std::map<std::string, std::string> flag_values;
  for (const auto& k : config_keys()) {
    std::string name = "--" + std::string(k.path);
    std::string desc = std::string(k.doc);
    if (!k.is_string) desc += fmt::format(" [range {}..{}]", k.min, k.max);
    app.add_option(name, flag_values[std::string(k.path)], desc);
  }
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(log_level));
  Config cfg;
  if (!config_path.empty()) {
    if (auto e = load_yaml_file(cfg, config_path)) {
      std::fprintf(stderr, "kvroute: %s\n", e->c_str());
      return 2;
    }
  }
  if (auto e = apply_env(cfg, environ)) {
    std::fprintf(stderr, "kvroute: %s\n", e->c_str());
    return 2;
  }
  for (const auto& [key, value] : flag_values) {
    if (app.count("--" + key) == 0) continue;
    if (auto e = set_key(cfg, key, value)) {
      std::fprintf(stderr, "kvroute: %s (from flag --%s)\n", e->c_str(), key.c_str());
      return 2;
    }
  }
  if (auto e = validate(cfg)) {
    std::fprintf(stderr, "kvroute: %s\n", e->c_str());
    return 2;
  }
  if (print_config) {
    std::fputs(to_yaml(cfg).c_str(), stdout);
    return 0;
  }

  // Signals are handled by sigwait on this thread: block them before any
  // other thread starts so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  ConfigStore config(cfg);
  SteadyClock& clock = SteadyClock::instance();
  SeededRandom random(std::random_device{}());
  RadixIndexer index;
  WorkerRegistry registry(clock);

  std::string err;
  auto bus = NatsBus::connect(cfg.events.nats_url, "kvroute", std::chrono::milliseconds(cfg.events.connect_timeout_ms),
                              &err);
  if (!bus) {
    std::fprintf(stderr, "kvroute: events.nats_url: %s\n", err.c_str());
    return 1;
  }
  EventPipeline pipeline(cfg.events, cfg.indexer.block_size, index, registry, clock);
  if (!pipeline.start(*bus, &err)) {
    std::fprintf(stderr, "kvroute: %s\n", err.c_str());
    return 1;
  }

  RoutingService routing(index, registry, config, random);
  HttpServerHooks hooks;
  hooks.routing = &routing;
  hooks.registry = &registry;
  hooks.config = &config;
  hooks.ready = [&] { return bus->connected() && !registry.candidates("").empty(); };
  hooks.metrics = [&] { return render_metrics(index, pipeline, registry, *bus); };
  HttpServer server(hooks);
  if (!server.listen(cfg.router.host, static_cast<uint16_t>(cfg.router.port), &err)) {
    std::fprintf(stderr, "kvroute: %s\n", err.c_str());
    return 1;
  }
  server.start(cfg.router.threads);
  std::printf("kvroute listening on http://%s:%u\n", cfg.router.host.c_str(), server.port());
  std::fflush(stdout);
  spdlog::info("nats {} prefix '{}', block_size {}, worker_ttl {} ms", cfg.events.nats_url,
               cfg.events.subject_prefix, cfg.indexer.block_size, cfg.events.worker_ttl_ms);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  server.stop();
  pipeline.stop();
  return 0;
}
