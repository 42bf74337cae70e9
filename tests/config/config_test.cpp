#include "config/config.h"

#include <doctest/doctest.h>

#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

using namespace kvroute;

namespace {
bool has_text(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }
std::string fmt_allow(std::string_view entry) {
  return "events:\n  worker_url_allow: '" + std::string(entry) + "'\n";
}
}  // namespace

TEST_CASE("YAML overrides defaults; absent keys keep them") {
  Config c;
  REQUIRE_FALSE(apply_yaml(c, "router:\n  port: 9000\nscheduler:\n  gamma: 0.25\n").has_value());
  CHECK(c.router.port == 9000);
  CHECK(c.scheduler.gamma == doctest::Approx(0.25));
  CHECK(c.scheduler.delta == doctest::Approx(0.1));
  CHECK(c.events.subject_prefix == "kvroute");
}

TEST_CASE("errors name the key and the allowed range; nothing is applied") {
  Config c;
  auto e = apply_yaml(c, "scheduler:\n  gamma: 0.25\n  alpha_balanced: 1.5\n");  // 0.25: not the default
  REQUIRE(e.has_value());
  CHECK(e->find("scheduler.alpha_balanced") != std::string::npos);
  CHECK(e->find("[0, 1]") != std::string::npos);
  CHECK(c.scheduler.gamma == doctest::Approx(SchedulerConfig{}.gamma));  // all-or-nothing

  e = apply_yaml(c, "router:\n  prot: 1\n");
  REQUIRE(e.has_value());
  CHECK(*e == "router.prot: unknown key");
  e = apply_yaml(c, "router:\n  port: eighty\n");
  REQUIRE(e.has_value());
  CHECK(e->find("router.port") != std::string::npos);
  e = apply_yaml(c, "router:\n  port: 80.5\n");
  REQUIRE(e.has_value());
  CHECK(e->find("whole number") != std::string::npos);
  e = apply_yaml(c, "router: [1, 2\n");
  REQUIRE(e.has_value());
  CHECK(e->find("invalid YAML") != std::string::npos);
  e = apply_yaml(c, "scheduler:\n  alpha_balanced: 0.8\n  alpha_imbalanced: 0.5\n");
  REQUIRE(e.has_value());
  CHECK(e->find("scheduler.alpha_imbalanced") != std::string::npos);
}

TEST_CASE("scheduler.inflight_kv takes one of its three values; the key it replaced names it") {
  Config c;
  CHECK(c.scheduler.inflight_kv == "distinct");
  REQUIRE_FALSE(apply_yaml(c, "scheduler:\n  inflight_kv: prefix_once\n").has_value());
  CHECK(c.scheduler.inflight_kv == "prefix_once");
  auto e = apply_yaml(c, "scheduler:\n  inflight_kv: once\n");
  REQUIRE(e.has_value());
  CHECK(*e == "scheduler.inflight_kv: 'once' is not one of distinct, prefix_once, whole");
  CHECK(c.scheduler.inflight_kv == "prefix_once");  // nothing applied
  e = apply_yaml(c, "scheduler:\n  inflight_prefix_once: false\n");
  REQUIRE(e.has_value());
  CHECK(e->find("replaced by scheduler.inflight_kv") != std::string::npos);
}

namespace {
// scheduler.<name>: `fallback` by default, `good` applied, and each of `bad`
// refused with an error naming the key, leaving `good` in place.
void check_scheduler_number(const std::string& name, double SchedulerConfig::*field, double fallback, double good,
                            std::initializer_list<const char*> bad) {
  Config c;
  CHECK(c.scheduler.*field == doctest::Approx(fallback));
  REQUIRE_FALSE(apply_yaml(c, "scheduler:\n  " + name + ": " + std::to_string(good) + "\n").has_value());
  CHECK(c.scheduler.*field == doctest::Approx(good));
  for (const char* b : bad) {
    auto e = apply_yaml(c, "scheduler:\n  " + name + ": " + b + "\n");
    REQUIRE(e.has_value());
    CHECK(e->find("scheduler." + name) != std::string::npos);
    CHECK(c.scheduler.*field == doctest::Approx(good));  // nothing applied
  }
}
}  // namespace

TEST_CASE("scheduler.parked_kv_seconds: a time constant in seconds, 0 (off) to an hour") {
  // The default, tuned (config/README.md).
  check_scheduler_number("parked_kv_seconds", &SchedulerConfig::parked_kv_seconds, 10, 45, {"-1", "3601", "soon"});
}

TEST_CASE("scheduler.eviction_weight and _seconds: a weight 0 (off) to 100, a time constant of 1 s to an hour") {
  // On by default (config/README.md).
  check_scheduler_number("eviction_weight", &SchedulerConfig::eviction_weight, 1, 2, {"-0.5", "101", "lots"});
  check_scheduler_number("eviction_seconds", &SchedulerConfig::eviction_seconds, 30, 60, {"0", "3601", "soon"});
}

TEST_CASE("scheduler.slot_wait_tokens: tokens of queue per request waiting for a slot, 0 (off) to a million") {
  // Off by default (config/README.md).
  check_scheduler_number("slot_wait_tokens", &SchedulerConfig::slot_wait_tokens, 0, 3000, {"-1", "1000001", "many"});
}

TEST_CASE("scheduler.inflight_prefix_weight, _load and _spread: a value 0-1, from a mean KV load 0.01-1, a share 0-1") {
  Config c;
  CHECK(c.scheduler.inflight_prefix_weight == doctest::Approx(1));  // the defaults, tuned (config/README.md)
  CHECK(c.scheduler.inflight_prefix_load == doctest::Approx(0.6));
  CHECK(c.scheduler.inflight_prefix_spread == doctest::Approx(0.5));
  REQUIRE_FALSE(apply_yaml(c, "scheduler:\n  inflight_prefix_weight: 0\n  inflight_prefix_load: 0.3\n"
                              "  inflight_prefix_spread: 0\n").has_value());
  CHECK(c.scheduler.inflight_prefix_weight == doctest::Approx(0));
  CHECK(c.scheduler.inflight_prefix_load == doctest::Approx(0.3));
  CHECK(c.scheduler.inflight_prefix_spread == doctest::Approx(0));
  for (const char* bad : {"inflight_prefix_weight: -0.1", "inflight_prefix_weight: 1.5", "inflight_prefix_load: 0",
                          "inflight_prefix_load: 2", "inflight_prefix_weight: some", "inflight_prefix_spread: 1.5",
                          "inflight_prefix_spread: -1"}) {
    auto e = apply_yaml(c, std::string("scheduler:\n  ") + bad + "\n");
    REQUIRE(e.has_value());
    CHECK(e->find(std::string("scheduler.") + std::string(bad).substr(0, std::string(bad).find(':'))) !=
          std::string::npos);
    CHECK(c.scheduler.inflight_prefix_weight == doctest::Approx(0));  // nothing applied
    CHECK(c.scheduler.inflight_prefix_load == doctest::Approx(0.3));
    CHECK(c.scheduler.inflight_prefix_spread == doctest::Approx(0));
  }
}

TEST_CASE("scheduler.pending_prefill_excess: on, past 4096 tokens + 3x the cached ones; bounded values") {
  Config c;
  CHECK(c.scheduler.pending_prefill_excess);  // the defaults, tuned (config/README.md)
  CHECK(c.scheduler.pending_prefill_excess_tokens == 4096u);
  CHECK(c.scheduler.pending_prefill_excess_cached == doctest::Approx(3));
  REQUIRE_FALSE(apply_yaml(c, "scheduler:\n  pending_prefill_excess: false\n  pending_prefill_excess_tokens: 8192\n"
                              "  pending_prefill_excess_cached: 0.5\n")
                    .has_value());
  CHECK_FALSE(c.scheduler.pending_prefill_excess);
  CHECK(c.scheduler.pending_prefill_excess_tokens == 8192u);
  CHECK(c.scheduler.pending_prefill_excess_cached == doctest::Approx(0.5));
  for (const char* bad : {"pending_prefill_excess_tokens: -1", "pending_prefill_excess_cached: -0.5",
                          "pending_prefill_excess_cached: 101", "pending_prefill_excess: maybe"}) {
    auto e = apply_yaml(c, std::string("scheduler:\n  ") + bad + "\n");
    REQUIRE(e.has_value());
    CHECK(e->find(std::string("scheduler.") + std::string(bad).substr(0, std::string(bad).find(':'))) !=
          std::string::npos);
    CHECK_FALSE(c.scheduler.pending_prefill_excess);  // nothing applied
    CHECK(c.scheduler.pending_prefill_excess_tokens == 8192u);
  }
}

TEST_CASE("environment variables and set_key") {
  Config c;
  std::string a = "KVROUTE_SCHEDULER_DELTA=0.4", b = "KVROUTE_EVENTS_NATS_URL=nats://h:1", z = "OTHER=1";
  char* env[] = {a.data(), b.data(), z.data(), nullptr};
  REQUIRE_FALSE(apply_env(c, env).has_value());
  CHECK(c.scheduler.delta == doctest::Approx(0.4));
  CHECK(c.events.nats_url == "nats://h:1");
  std::string bad = "KVROUTE_ROUTER_PORT=70000";
  char* env2[] = {bad.data(), nullptr};
  auto e = apply_env(c, env2);
  REQUIRE(e.has_value());
  CHECK(e->find("KVROUTE_ROUTER_PORT") != std::string::npos);
  CHECK(set_key(c, "nope", "1").value() == "nope: unknown key");
}

TEST_CASE("to_yaml lists every key and reads back to the same config") {
  Config c;
  c.scheduler.gamma = 0.33;
  c.events.subject_prefix = "fleet-a";
  const std::string y = to_yaml(c);
  for (const auto& k : config_keys()) CHECK(y.find(std::string(k.path.substr(k.path.find('.') + 1)) + ":") != std::string::npos);
  Config d;
  REQUIRE_FALSE(apply_yaml(d, y).has_value());
  CHECK(d.scheduler.gamma == doctest::Approx(0.33));
  CHECK(d.events.subject_prefix == "fleet-a");
}

TEST_CASE("booleans, enums and reloadability") {
  Config c;
  REQUIRE_FALSE(apply_yaml(c, "indexer:\n  approximate: true\nlog:\n  format: json\n").has_value());
  CHECK(c.indexer.approximate);
  CHECK(apply_yaml(c, "indexer:\n  approximate: maybe\n")->find("not a boolean") != std::string::npos);
  CHECK(apply_yaml(c, "log:\n  format: xml\n")->find("log.format") != std::string::npos);

  Config next = c;
  next.scheduler.gamma = 0.9;
  next.admin.token = "t";
  CHECK_FALSE(check_reload(c, next).has_value());
  next.router.port = 1;
  auto e = check_reload(c, next);
  REQUIRE(e.has_value());
  CHECK(e->find("router.port") != std::string::npos);
}

TEST_CASE("pd: policy is one of three names, thresholds reload") {
  Config c;
  REQUIRE_FALSE(apply_yaml(c, "pd:\n  policy: always\n  min_uncached_tokens: 64\n  prefill_busy_tokens: 8192\n"));
  CHECK(c.pd.policy == "always");
  CHECK(c.pd.min_uncached_tokens == 64);
  CHECK(c.pd.prefill_busy_tokens == 8192);
  auto e = apply_yaml(c, "pd:\n  policy: sometimes\n");
  REQUIRE(e.has_value());
  CHECK(e->find("pd.policy") != std::string::npos);
  CHECK(c.pd.policy == "always");  // nothing applied
  Config next = c;
  next.pd.policy = "never";
  next.pd.min_uncached_tokens = 1;
  next.pd.prefill_busy_tokens = 0;
  CHECK_FALSE(check_reload(c, next).has_value());
}

TEST_CASE("pd: decode_alpha is -1 (the scheduler's) or within 0-1, and reloads") {
  Config c;
  CHECK(c.pd.decode_alpha == -1);
  REQUIRE_FALSE(apply_yaml(c, "pd:\n  decode_alpha: 0.7\n"));
  CHECK(c.pd.decode_alpha == doctest::Approx(0.7));
  for (const char* bad : {"pd:\n  decode_alpha: -0.5\n", "pd:\n  decode_alpha: 1.5\n"}) {
    auto e = apply_yaml(c, bad);
    REQUIRE(e.has_value());
    CHECK(e->find("pd.decode_alpha") != std::string::npos);
    CHECK(c.pd.decode_alpha == doctest::Approx(0.7));  // nothing applied
  }
  REQUIRE_FALSE(apply_yaml(c, "pd:\n  decode_alpha: -1\n"));
  Config next = c;
  next.pd.decode_alpha = 0.5;
  CHECK_FALSE(check_reload(c, next).has_value());
}

TEST_CASE("pd: the legs' protocol per model, the prefill timeout and failure policy, validated and reloadable") {
  Config c;
  REQUIRE_FALSE(apply_yaml(c, "pd:\n  protocol: sglang\n  model_protocols: \"a=vllm_nixl, b/c=sglang\"\n"
                              "  prefill_timeout_ms: 1500\n  on_prefill_failure: fail\n"
                              "  mooncake_concurrent_legs: true\n"));
  CHECK(c.pd.mooncake_concurrent_legs);
  CHECK(pd_protocol_of(c.pd, "a") == PdProtocol::VllmNixl);
  CHECK(pd_protocol_of(c.pd, "b/c") == PdProtocol::Sglang);
  CHECK(pd_protocol_of(c.pd, "other") == PdProtocol::Sglang);  // pd.protocol
  CHECK(c.pd.prefill_timeout_ms == 1500);
  {
    Config m = c;
    REQUIRE_FALSE(apply_yaml(m, "pd:\n  protocol: vllm_mooncake\n  model_protocols: \"s=sglang\"\n"));
    CHECK(pd_protocol_of(m.pd, "other") == PdProtocol::VllmMooncake);
    CHECK(pd_protocol_of(m.pd, "s") == PdProtocol::Sglang);
    CHECK(to_string(PdProtocol::VllmMooncake) == "vllm_mooncake");
    REQUIRE_FALSE(apply_yaml(m, "pd:\n  protocol: sglang\n  model_protocols: \"v=vllm_mooncake\"\n"));
    CHECK(pd_protocol_of(m.pd, "v") == PdProtocol::VllmMooncake);
  }
  CHECK(c.pd.on_prefill_failure == "fail");
  for (const char* bad : {"pd:\n  protocol: mooncake\n", "pd:\n  model_protocols: \"a=nixl\"\n",
                          "pd:\n  model_protocols: \"=sglang\"\n", "pd:\n  on_prefill_failure: retry\n",
                          "pd:\n  prefill_timeout_ms: 5\n", "pd:\n  mooncake_concurrent_legs: sometimes\n"}) {
    Config d = c;
    const auto e = apply_yaml(d, bad);
    REQUIRE(e.has_value());
    CHECK(e->find("pd.") != std::string::npos);
  }
  Config next = c;
  next.pd.protocol = "vllm_nixl";
  next.pd.model_protocols = "";
  next.pd.prefill_timeout_ms = 30000;
  next.pd.on_prefill_failure = "fallback";
  next.pd.mooncake_concurrent_legs = false;
  CHECK_FALSE(check_reload(c, next).has_value());
}

TEST_CASE("workers and DNS entries take a role and a bootstrap port") {
  std::vector<WorkerEntry> w;
  REQUIRE_FALSE(parse_worker_entries("url=http://a:1,model=m;url=http://b:1,model=m,role=prefill,bootstrap_port=9000;"
                                     "url=http://c:1,model=m,role=decode",
                                     w));
  REQUIRE(w.size() == 3);
  CHECK(w[0].role == "both");
  CHECK(w[0].bootstrap_port == 8998u);
  CHECK(w[1].role == "prefill");
  CHECK(w[1].bootstrap_port == 9000u);
  CHECK(w[2].role == "decode");
  auto e = parse_worker_entries("url=http://a:1,model=m;url=http://b:1,model=m,role=leader", w);
  REQUIRE(e.has_value());
  CHECK(e->find("entry 2") != std::string::npos);
  CHECK(e->find("role 'leader'") != std::string::npos);
  e = parse_worker_entries("url=http://a:1,model=m,bootstrap_port=0", w);
  REQUIRE(e.has_value());
  CHECK(e->find("bootstrap_port") != std::string::npos);
  std::vector<DnsEntry> d;
  REQUIRE_FALSE(parse_dns_entries("host=p.svc,model=m,role=prefill,bootstrap_port=8999", d));
  CHECK(d[0].role == "prefill");
  CHECK(d[0].bootstrap_port == 8999u);
  CHECK(parse_dns_entries("host=p.svc,model=m,role=Prefill", d)->find("role") != std::string::npos);
  Config c;
  REQUIRE_FALSE(apply_yaml(c, "workers:\n  static:\n    - {url: http://a:1, model: m, role: decode}\n"));
  REQUIRE_FALSE(parse_worker_entries(c.workers.static_list, w));
  CHECK(w[0].role == "decode");
}

TEST_CASE("config/README.md documents every key") {
  std::ifstream in(KVROUTE_SOURCE_DIR "/config/README.md");
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  for (const auto& k : config_keys())
    CHECK_MESSAGE(doc.find("| `" + std::string(k.path) + "` |") != std::string::npos, k.path, " is not documented");
}

// Found by tests/fuzz/config.cpp (inputs in tests/fuzz/regressions/config/).
TEST_CASE("NaN is refused for every numeric key, integer keys too (no undefined conversion)") {
  Config c;
  for (const char* key : {"scheduler.gamma", "scheduler.temperature", "router.port", "indexer.approx_max_entries"}) {
    auto e = set_key(c, key, "nan");
    REQUIRE_MESSAGE(e.has_value(), key);
    CHECK(e->find("is not a finite number") != std::string::npos);
  }
  auto e = apply_yaml(c, "scheduler:\n  gamma: nan\n");
  REQUIRE(e.has_value());
  CHECK(e->find("scheduler.gamma") != std::string::npos);
  CHECK(c.scheduler.gamma == Config{}.scheduler.gamma);
}

TEST_CASE("a mapping outside the known sections is an unknown key (no exponential alias walk)") {
  // 2^40 paths through aliases if the walk followed mappings it does not know.
  std::string yaml = "a0: &a0 {}\n";
  for (int i = 1; i < 40; ++i)
    yaml += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " {x: *a" + std::to_string(i - 1) + ", y: *a" +
            std::to_string(i - 1) + "}\n";
  Config c;
  auto e = apply_yaml(c, yaml);
  REQUIRE(e.has_value());
  CHECK(*e == "a0: unknown key");
  e = apply_yaml(c, "scheduler:\n  gamma:\n    deeper: 1\n");
  REQUIRE(e.has_value());
  CHECK(*e == "scheduler.gamma: expected a scalar value");
  // Sections still take mappings, also through an alias.
  REQUIRE_FALSE(apply_yaml(c, "router: &r {threads: 3}\n").has_value());
  CHECK(c.router.threads == 3);
}

TEST_CASE("workers.static: a YAML list of workers, or the compact text form; errors name entry and field") {
  Config c;
  REQUIRE_FALSE(apply_yaml(c, R"(
workers:
  scrape_interval_ms: 100
  static:
    - url: http://127.0.0.1:8001
      model: qwen3
      kv_events: tcp://127.0.0.1:5557
      replay: tcp://127.0.0.1:5558
      dp_size: 2
      lora: [sql-lora, chat-lora]
    - {url: "http://[::1]:8002", model: qwen3, metrics: none, id: 42}
)"));
  CHECK(c.workers.scrape_interval_ms == 100);
  std::vector<WorkerEntry> w;
  REQUIRE_FALSE(parse_worker_entries(c.workers.static_list, w));
  REQUIRE(w.size() == 2);
  CHECK(w[0].url == "http://127.0.0.1:8001");
  CHECK(w[0].metrics == "http://127.0.0.1:8001/metrics");
  CHECK(w[0].kv_events == "tcp://127.0.0.1:5557");
  CHECK(w[0].replay == "tcp://127.0.0.1:5558");
  CHECK(w[0].dp_size == 2);
  CHECK(w[0].lora == std::vector<std::string>{"sql-lora", "chat-lora"});
  CHECK(w[0].id == worker_id_for_url("http://127.0.0.1:8001"));
  CHECK(w[1].id == 42);
  CHECK(w[1].metrics == "none");

  // `workers:` given directly as the list.
  Config d;
  REQUIRE_FALSE(apply_yaml(d, "workers:\n  - {url: http://a:1, model: m}\n"));
  REQUIRE_FALSE(parse_worker_entries(d.workers.static_list, w));
  CHECK(w.size() == 1);

  // The text form (flags, environment) is the same key.
  Config e;
  REQUIRE_FALSE(set_key(e, "workers.static", "url=http://a:1,model=m; url=http://b:2,model=m,dp_size=4"));
  REQUIRE_FALSE(validate(e));
  REQUIRE_FALSE(parse_worker_entries(e.workers.static_list, w));
  CHECK(w.size() == 2);
  CHECK(w[1].dp_size == 4);

  auto err = [](std::string_view text) {
    Config x;
    REQUIRE_FALSE(set_key(x, "workers.static", text));
    auto e = validate(x);
    return e ? *e : std::string();
  };
  CHECK(err("url=http://a:1") == "workers.static: entry 1: model is required");
  CHECK(err("url=http://a:1,model=m;url=ftp://b,model=m") ==
        "workers.static: entry 2: url 'ftp://b' must start with http:// or https://");
  CHECK(err("url=http://a:1,model=m,dp_size=0") ==
        "workers.static: entry 1: dp_size='0' is not a whole number in [1, 1024]");
  CHECK(err("url=http://a:1,model=m,colour=red").find("unknown field 'colour'") != std::string::npos);
  CHECK(err("url=http://a:1,model=m;url=http://a:1,model=m").find("duplicate worker") != std::string::npos);
  CHECK(err("url=http://a:1,model=m,kv_events=http://x").find("tcp://") != std::string::npos);
  CHECK(err("nonsense").find("not key=value") != std::string::npos);
}

TEST_CASE("discovery.dns entries and an empty nats_url (no NATS) validate") {
  Config c;
  REQUIRE_FALSE(apply_yaml(c, R"(
events: {nats_url: ""}
discovery:
  dns_interval_ms: 500
  dns_servers: "127.0.0.1:5353"
  dns:
    - {host: vllm.default.svc, port: 8000, model: qwen3, kv_events_port: 5557, replay_port: 5558}
)"));
  std::vector<DnsEntry> d;
  REQUIRE_FALSE(parse_dns_entries(c.discovery.dns, d));
  REQUIRE(d.size() == 1);
  CHECK(d[0].host == "vllm.default.svc");
  CHECK(d[0].kv_events_port == 5557);
  CHECK(d[0].metrics_path == "/metrics");
  Config bad;
  CHECK(apply_yaml(bad, "discovery: {dns: [{port: 8000, model: m}]}").value() ==
        "discovery.dns: entry 1: host is required");
  CHECK(apply_yaml(bad, "workers: {eject_base_ms: 5000, eject_max_ms: 1000}").has_value());
}

TEST_CASE("nan and inf are refused for floating-point keys, naming the key") {
  for (const char* bad : {"nan", "NaN", "-nan", "inf", "-inf", "infinity"}) {
    Config c;
    auto e = set_key(c, "scheduler.gamma", bad);
    REQUIRE_MESSAGE(e.has_value(), bad);
    CHECK(e->find("scheduler.gamma") != std::string::npos);
    CHECK(c.scheduler.gamma == Config{}.scheduler.gamma);  // nothing changed
    Config y;
    CHECK(apply_yaml(y, std::string("scheduler:\n  temperature: ") + bad + "\n").has_value());
  }
  Config c;
  CHECK_FALSE(set_key(c, "scheduler.gamma", "0.25").has_value());
  CHECK(c.scheduler.gamma == 0.25);
}

TEST_CASE("limits of bodies, connections and bus-announced workers validate") {
  Config c;
  CHECK(c.router.max_body_bytes_in_flight >= c.router.max_body_bytes);
  auto e = apply_yaml(c, "router:\n  max_body_bytes_in_flight: 1048576\n  max_body_bytes: 2097152\n");
  REQUIRE(e.has_value());
  CHECK(has_text(*e, "router.max_body_bytes_in_flight"));
  CHECK_FALSE(apply_yaml(c, "router:\n  max_connections: 100\n").has_value());
  CHECK_FALSE(apply_yaml(c, "events:\n  worker_url_allow: '10.0.0.0/8, fd00::/8, http://vllm-0:8000, 10.1.2.3'\n")
                  .has_value());
  for (std::string_view bad : {"10.0.0.0/33", "not-an-ip", "http://x/base", "::1/129", "10.0.0.0/"}) {
    CAPTURE(bad);
    e = apply_yaml(c, fmt_allow(bad));
    REQUIRE(e.has_value());
    CHECK(has_text(*e, "events.worker_url_allow"));
  }
  e = apply_yaml(c, "scheduler:\n  busy_kv_usage: 0\n");
  REQUIRE(e.has_value());
  CHECK(has_text(*e, "scheduler.busy_kv_usage"));
}

TEST_CASE("a worker's default id is the FNV-1a hash its header documents") {
  // FNV-1a over the URL's bytes from offset basis 1469598103934665603, top bit cleared.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : std::string_view("http://10.0.0.7:8000")) h = (h ^ ch) * 1099511628211ull;
  CHECK(worker_id_for_url("http://10.0.0.7:8000") == (h & 0x7fffffffffffffffull));
  CHECK(worker_id_for_url("") == 1469598103934665603ull);
  CHECK(worker_id_for_url("a") == 0x44bd8ad473cd9906ull);
}

TEST_CASE("kv_pools: a YAML list under kv_pools:, validated while parsing; the pool's weight is its load cost") {
  Config c;
  REQUIRE_FALSE(apply_yaml(c, R"(kv_pools:
  - name: shared
    medium: LMCache
    workers: [11, 12]
    bandwidth_mb_s: 10000
    kv_bytes_per_token: 131072
    prefill_tokens_per_s: 20000
  - name: ssd
    medium: DISK
    workers: [13]
    bandwidth_mb_s: 2000
    kv_bytes_per_token: 131072
)").has_value());
  REQUIRE_FALSE(validate(c));
  std::vector<PoolEntry> p;
  REQUIRE_FALSE(parse_pool_entries(c.indexer.kv_pools, p));
  REQUIRE(p.size() == 2);
  CHECK(p[0].name == "shared");
  CHECK(p[0].worker_ids == std::vector<uint64_t>{11, 12});
  CHECK(p[1].prefill_tokens_per_s == 10000);  // the default
  CHECK(p[1].max_blocks == 0);
  // 131,072 B at 10 GB/s = 13.1 us to load a token; 50 us to recompute one at 20,000 tok/s.
  CHECK(pool_tier_weight(p[0]) == doctest::Approx(1 - 13.1072 / 50));
  // 65.5 us to load from the 2 GB/s pool against 100 us to recompute: still worth it.
  CHECK(pool_tier_weight(p[1]) == doctest::Approx(1 - 65.536 / 100));
  apply_pool_weights(c);
  CHECK(c.scheduler.tier_weight_pool[0] == doctest::Approx(pool_tier_weight(p[0])));
  CHECK(c.scheduler.tier_weight_pool[1] == doctest::Approx(pool_tier_weight(p[1])));
  CHECK(c.scheduler.tier_weight_pool[2] == 0);
  // A pool slower than recomputing is worth nothing, never negative.
  PoolEntry slow = p[1];
  slow.bandwidth_mb_s = 100;
  CHECK(pool_tier_weight(slow) == 0);

  auto err = [](std::string_view text) {
    Config x;
    REQUIRE_FALSE(set_key(x, "indexer.kv_pools", text));
    auto e = validate(x);
    return e ? *e : std::string();
  };
  const std::string ok = "name=a,medium=m,workers=1:2,bandwidth_mb_s=100,kv_bytes_per_token=1000";
  CHECK(err(ok).empty());
  CHECK(err("name=a,medium=m,workers=1,kv_bytes_per_token=1000") ==
        "indexer.kv_pools: entry 1: bandwidth_mb_s is required (1-1073741824)");
  CHECK(err("name=a,medium=m,workers=1,bandwidth_mb_s=1") ==
        "indexer.kv_pools: entry 1: kv_bytes_per_token is required (1-16777216)");
  CHECK(err("name=a,medium=m,bandwidth_mb_s=1,kv_bytes_per_token=1") ==
        "indexer.kv_pools: entry 1: workers (member worker ids) is required");
  CHECK(err("name=a,workers=1,bandwidth_mb_s=1,kv_bytes_per_token=1").find("medium must be 1-32 bytes") !=
        std::string::npos);
  CHECK(err("name=a b,medium=m,workers=1,bandwidth_mb_s=1,kv_bytes_per_token=1").find("name 'a b'") !=
        std::string::npos);
  CHECK(err("name=a,medium=m,workers=1:x,bandwidth_mb_s=1,kv_bytes_per_token=1") ==
        "indexer.kv_pools: entry 1: worker id 'x' is not an integer from 1 to 9223372036854775807");
  CHECK(err("name=a,medium=m,workers=0,bandwidth_mb_s=1,kv_bytes_per_token=1").find("worker id '0'") !=
        std::string::npos);
  CHECK(err(ok + ";name=b,medium=n,workers=2,bandwidth_mb_s=1,kv_bytes_per_token=1") ==
        "indexer.kv_pools: entry 2: worker 2 already mounts pool 'a' (a worker mounts one pool at most)");
  CHECK(err(ok + ";" + ok).find("duplicate pool 'a'") != std::string::npos);
  CHECK(err("name=a,medium=m,workers=1,bandwidth_mb_s=0,kv_bytes_per_token=1").find("bandwidth_mb_s") !=
        std::string::npos);
  std::string five;
  for (int i = 0; i < 5; ++i)
    five += std::string(i ? ";" : "") + "name=p" + std::to_string(i) + ",medium=m,workers=" + std::to_string(i + 1) +
            ",bandwidth_mb_s=1,kv_bytes_per_token=1";
  CHECK(err(five) == "indexer.kv_pools: at most 4 pools");
  // Membership and the weights it derives need a restart.
  Config a, b;
  REQUIRE_FALSE(set_key(b, "indexer.kv_pools", ok));
  CHECK(check_reload(a, b).value_or("").find("indexer.kv_pools: cannot change at runtime") != std::string::npos);
}
