#include "router/admin_api.h"

#include <doctest/doctest.h>

#include "tests/support/recording_indexer.h"

#include <cmath>
#include <regex>

using namespace kvroute;

namespace {
struct Fixture {
  ManualClock clock;
  SeededRandom random{1};
  testing::RecordingIndexer index;
  WorkerRegistry registry{clock};
  ConfigStore config{[] {
    Config c;
    c.admin.token = "s3cret";
    return c;
  }()};
  RoutingService routing{index, registry, config, random};
  AdminApi api{config, routing, registry, index};
  Fixture() {
    WorkerAnnouncement a;
    a.id = WorkerId{4};
    a.url = "http://127.0.0.1:9";
    a.model = "m";
    a.load = WorkerLoad{1, 10, 0, 5, 100};
    registry.on_heartbeat(a);
  }
};
constexpr std::string_view kAuth = "Bearer s3cret";
}  // namespace

TEST_CASE("admin API refuses a missing or wrong token, and everything when none is configured") {
  Fixture f;
  CHECK(f.api.handle("GET", "/admin/config", "", "").status == 401);
  CHECK(f.api.handle("GET", "/admin/config", "Bearer wrong", "").status == 401);
  CHECK(f.api.handle("GET", "/admin/config", "s3cret", "").status == 401);
  CHECK(f.api.handle("GET", "/admin/config", "Bearer s3cret!", "").status == 401);
  CHECK(f.api.handle("GET", "/admin/config", kAuth, "").status == 200);
  CHECK(f.api.stats().auth_failures == 4);
  f.config.update([](Config& c) {
    c.admin.token.clear();
    return std::nullopt;
  });
  auto r = f.api.handle("GET", "/admin/config", kAuth, "");
  CHECK(r.status == 401);
  CHECK(r.body.find("disabled") != std::string::npos);
}

TEST_CASE("PUT /admin/config swaps valid updates and refuses invalid ones with the key") {
  Fixture f;
  auto r = f.api.handle("PUT", "/admin/config", kAuth, "scheduler:\n  gamma: 0.6\n");
  CHECK(r.status == 200);
  CHECK(r.body.find("gamma: 0.6") != std::string::npos);
  CHECK(f.config.get()->scheduler.gamma == doctest::Approx(0.6));
  // JSON is YAML too.
  CHECK(f.api.handle("PUT", "/admin/config", kAuth, R"({"scheduler":{"delta":0.2}})").status == 200);
  CHECK(f.config.get()->scheduler.delta == doctest::Approx(0.2));

  auto before = f.config.get();
  r = f.api.handle("PUT", "/admin/config", kAuth, "scheduler:\n  gamma: -1\n  delta: 0.9\n");
  CHECK(r.status == 400);
  CHECK(r.body.find("scheduler.gamma") != std::string::npos);
  r = f.api.handle("PUT", "/admin/config", kAuth, "router:\n  port: 1234\n");
  CHECK(r.status == 400);
  CHECK(r.body.find("router.port: cannot change at runtime") != std::string::npos);
  CHECK(f.config.get() == before);  // nothing changed
  CHECK(f.api.stats().reloads_ok == 2);
  CHECK(f.api.stats().reloads_rejected == 2);
}

TEST_CASE("explain returns every term for every worker without sending anything") {
  Fixture f;
  auto r = f.api.handle("POST", "/admin/route/explain", kAuth,
                        R"({"model":"m","messages":[{"role":"user","content":"hello there"}]})");
  REQUIRE(r.status == 200);
  for (auto key : {"\"chosen\":4", "\"worker_id\":4", "\"prefill_ratio\":1", "\"cost\":", "\"overlap_by_tier\"",
                   "\"alpha\":0.3", "\"rank\":1", "\"excluded\":null", "\"reason\":\"Chose worker 4"})
    CHECK_MESSAGE(r.body.find(key) != std::string::npos, key, " in ", r.body);
  CHECK(f.registry.candidates("m").at(0).inflight_requests == 0);
  CHECK(f.api.handle("POST", "/admin/route/explain", kAuth, "{bad").status == 400);
}

TEST_CASE("workers list, drain and undrain, index stats") {
  Fixture f;
  auto r = f.api.handle("GET", "/admin/workers", kAuth, "");
  CHECK(r.body.find("\"worker_id\":4") != std::string::npos);
  CHECK(f.api.handle("POST", "/admin/workers/4/drain", kAuth, "").status == 200);
  CHECK(f.registry.candidates("m").at(0).draining);
  auto e = f.api.handle("POST", "/admin/route/explain", kAuth, R"({"model":"m","prompt":"x"})");
  CHECK(e.body.find("\"excluded\":\"draining\"") != std::string::npos);
  CHECK(f.api.handle("POST", "/admin/workers/4/undrain", kAuth, "").status == 200);
  CHECK_FALSE(f.registry.candidates("m").at(0).draining);
  CHECK(f.api.handle("POST", "/admin/workers/99/drain", kAuth, "").status == 404);
  CHECK(f.api.handle("POST", "/admin/workers/x/drain", kAuth, "").status == 404);
  CHECK(f.api.handle("GET", "/admin/index", kAuth, "").body == R"({"blocks":0,"entries":0,"bytes":0})");
  CHECK(f.api.handle("DELETE", "/admin/config", kAuth, "").status == 404);
}

namespace {
// A decision over hand-made candidates, as RoutingService::decide() fills it.
RouteResult decide(std::vector<Candidate> cands, size_t request_blocks, const SchedulerConfig& cfg,
                   uint64_t seed = 7) {
  RouteResult r;
  r.ok = true;
  r.block_hashes.assign(request_blocks, LocalBlockHash{1});
  r.isl_tokens = static_cast<uint32_t>(request_blocks * 16 + 5);
  r.candidates = std::move(cands);
  SeededRandom random(seed);
  r.decision = schedule(r.candidates, r.isl_tokens, 16, cfg, random);
  return r;
}
Candidate cand(uint64_t id, uint32_t overlap, uint64_t kv_active, uint64_t kv_total = 1000) {
  Candidate c;
  c.owner = CacheOwner{WorkerId{id}, 0};
  c.overlap_blocks = overlap;
  c.load = WorkerLoad{1, 16, 0, kv_active, kv_total};
  return c;
}
bool has(const std::string& text, std::string_view what) { return text.find(what) != std::string::npos; }
}  // namespace

TEST_CASE("explain says in words why a worker was chosen and why a better-cached one was not") {
  SchedulerConfig cfg;
  cfg.busy_kv_usage = 0.95;
  // worker 3 holds the whole prompt but is nearly full; worker 2 holds most of it.
  auto r = decide({cand(1, 0, 100), cand(2, 12, 100), cand(3, 14, 970)}, 14, cfg);
  REQUIRE(r.decision.chosen);
  CHECK(r.candidates[*r.decision.chosen].owner.worker == WorkerId{2});
  const auto text = explain_text(r, cfg, 16);
  CHECK_MESSAGE(has(text.choice, "Chose worker 2: holds 12 of 14 blocks"), text.choice);
  CHECK_MESSAGE(has(text.choice, "worker 3 holds 14 but is at 97 % KV usage (limit scheduler.busy_kv_usage 95 %)"),
                text.choice);
  // The example of router/README.md ("Route explain in words"), word for word.
  CHECK(text.choice ==
        "Chose worker 2: holds 12 of 14 blocks (192 of 229 prompt tokens cached) at 10 % KV usage; cost 0.144; "
        "worker 3 holds 14 but is at 97 % KV usage (limit scheduler.busy_kv_usage 95 %). Alpha 0.3 (the cache "
        "weighs more than load): the eligible workers' KV usage is balanced (spread load_std 0 <= "
        "scheduler.balance_threshold 0.1 x mean 0.1).");
  CHECK(text.per_worker[0] ==
        "rank 2: holds 0 of 14 blocks at 10 % KV usage; cost 0.731, 0.587 more than the choice, mostly for more to "
        "prefill (0 prompt tokens cached against 192)");
  CHECK(has(text.per_worker[2], "excluded: is at 97 % KV usage"));
  CHECK(has(text.per_worker[1], "chosen, lowest cost"));
  CHECK_MESSAGE(has(text.per_worker[0], "rank 2: holds 0 of 14 blocks"), text.per_worker[0]);
  CHECK_MESSAGE(has(text.per_worker[0], "mostly for more to prefill"), text.per_worker[0]);
  // JSON: workers by rank from 1, the excluded one last without a rank.
  const auto json = explain_json(r, "m", 16, cfg);
  const auto w2 = json.find(R"("worker_id":2)"), w1 = json.find(R"("worker_id":1)"), w3 = json.find(R"("worker_id":3)");
  CHECK((w2 < w1 && w1 < w3));
  CHECK(has(json, R"("rank":1,)"));
  CHECK(has(json, R"("rank":2,)"));
  CHECK(has(json, R"("excluded":"no_free_block","rank":null)"));
  CHECK(has(json, R"("tie":[])"));
}

TEST_CASE("explain names the wait for a request slot on a full worker") {
  const SchedulerConfig cfg = without_slot_limit(SchedulerConfig{});  // a nearly full fleet: full workers ranked
  // Worker 1 holds half the prompt but has all 16 slots taken and 2 more
  // requests waiting for one (the registry prices 3 x 3,000 tokens); worker 2
  // holds nothing and has a slot free.
  Candidate full = cand(1, 7, 100), free = cand(2, 0, 100);
  full.load.request_active_slots = 18;
  full.slot_wait_tokens = 9000;
  full.pending_prefill_tokens = 100;
  free.load.request_active_slots = 15;
  auto r = decide({full, free}, 14, cfg);
  REQUIRE(r.decision.chosen);
  CHECK(r.candidates[*r.decision.chosen].owner.worker == WorkerId{2});
  const auto text = explain_text(r, cfg, 16);
  CHECK_MESSAGE(has(text.per_worker[0], "every request slot taken (18 of 16: a wait priced as 9000 tokens of queue "
                                        "against 0)"),
                text.per_worker[0]);
  const auto json = explain_json(r, "m", 16, cfg);
  CHECK_MESSAGE(has(json, R"("pending_prefill_tokens":100,"slot_wait_tokens":9000,)"), json);
  CHECK(has(json, R"("pending_prefill_tokens":0,"slot_wait_tokens":0,)"));
}

TEST_CASE("explain states a tie and that the order among equal costs is random") {
  SchedulerConfig cfg;
  auto r = decide({cand(1, 3, 100), cand(2, 3, 100), cand(3, 3, 100)}, 8, cfg);
  const auto text = explain_text(r, cfg, 16);
  CHECK_MESSAGE(has(text.choice, "Tie: worker 1, worker 2 and worker 3 have the same cost"), text.choice);
  CHECK(has(text.choice, "ordered at random"));
  int ties = 0;
  for (const auto& w : text.per_worker) ties += has(w, "the same as the choice (a tie");
  CHECK(ties == 2);
  CHECK(has(explain_json(r, "m", 16, cfg), R"("tie":[)"));
  CHECK_FALSE(has(explain_json(r, "m", 16, cfg), R"("tie":[])"));
}

TEST_CASE("explain of a decision that waited in the flow queue states the wait") {
  SchedulerConfig cfg;
  auto r = decide({cand(1, 3, 100), cand(2, 0, 100)}, 8, cfg);
  CHECK_FALSE(has(explain_json(r, "m", 16, cfg), "queue_wait_ms"));  // did not wait
  r.queue_wait_seconds = 0.0125;
  CHECK_MESSAGE(has(explain_json(r, "m", 16, cfg), R"("queue_wait_ms":12.5,)"), explain_json(r, "m", 16, cfg));
  r.reset();
  CHECK_FALSE(r.queue_wait_seconds.has_value());
}

TEST_CASE("explain explains an alpha switch caused by a tiny load spread") {
  SchedulerConfig cfg;
  cfg.alpha_imbalanced = 0.7;  // the switch is off by default (equal alphas)
  // KV usage 0.01 % and 0.04 %: load_std 0.00015 > 0.1 x mean 0.00025.
  auto r = decide({cand(1, 2, 1, 10000), cand(2, 2, 4, 10000)}, 4, cfg);
  CHECK(r.decision.alpha == cfg.alpha_imbalanced);
  auto text = explain_text(r, cfg, 16);
  CHECK_MESSAGE(has(text.choice, "Alpha 0.7 (load weighs more than the cache)"), text.choice);
  CHECK_MESSAGE(has(text.choice, "That spread is 0.015 percentage points, tiny in absolute terms: the threshold is "
                                 "relative to the mean, so a nearly idle fleet switches to the load-weighted alpha on noise."),
                text.choice);
  // Balanced: said so, and no noise warning.
  r = decide({cand(1, 2, 500), cand(2, 2, 510)}, 4, cfg);
  text = explain_text(r, cfg, 16);
  CHECK(has(text.choice, "Alpha 0.3 (the cache weighs more than load)"));
  CHECK_FALSE(has(text.choice, "tiny"));
  // The defaults do not switch: explain says so instead of "load weighs more".
  const SchedulerConfig defaults;
  r = decide({cand(1, 2, 1, 10000), cand(2, 2, 4, 10000)}, 4, defaults);
  text = explain_text(r, defaults, 16);
  CHECK_MESSAGE(has(text.choice, "Alpha 0.3 whatever the load spread (scheduler.alpha_imbalanced = alpha_balanced"),
                text.choice);
  CHECK_FALSE(has(text.choice, "load weighs more"));
}

TEST_CASE("explain states softmax sampling and the lowest-cost worker it passed over") {
  SchedulerConfig cfg;
  cfg.temperature = 100;  // nearly uniform
  bool drew_other = false;
  for (uint64_t seed = 1; seed < 40 && !drew_other; ++seed) {
    auto r = decide({cand(1, 8, 100), cand(2, 0, 100)}, 8, cfg, seed);
    const auto text = explain_text(r, cfg, 16);
    CHECK(r.decision.sampled);
    CHECK(has(text.choice, "Sampled: scheduler.temperature 100 > 0"));
    CHECK(has(text.choice, "the lowest cost was worker 1"));
    if (r.candidates[*r.decision.chosen].owner.worker == WorkerId{2}) {
      drew_other = true;
      CHECK(has(text.choice, "Drew worker 2"));
      CHECK_MESSAGE(has(text.per_worker[0], "lower than the choice's: softmax sampling drew worker 2"),
                    text.per_worker[0]);
    }
  }
  CHECK(drew_other);
}

TEST_CASE("explain with nobody eligible names each worker's exclusion") {
  SchedulerConfig cfg;
  auto a = cand(1, 0, 1000);  // full
  auto b = cand(2, 0, 10);
  b.draining = true;
  auto r = decide({a, b}, 2, cfg);
  CHECK_FALSE(r.decision.chosen);
  const auto text = explain_text(r, cfg, 16);
  CHECK_MESSAGE(has(text.choice, "No worker can take the request now: worker 1 is at 100 % KV usage"), text.choice);
  CHECK(has(text.choice, "worker 2 is drained by an operator"));
}

TEST_CASE("GET /admin/config never shows the admin token; PUT of it back keeps the token") {
  Fixture f;
  auto r = f.api.handle("GET", "/admin/config", kAuth, "");
  REQUIRE(r.status == 200);
  CHECK_FALSE(has(r.body, "s3cret"));
  CHECK(has(r.body, "token: \"<redacted>\""));
  r = f.api.handle("PUT", "/admin/config", kAuth, r.body);  // the whole document back
  CHECK(r.status == 200);
  CHECK_FALSE(has(r.body, "s3cret"));
  CHECK(f.config.get()->admin.token == "s3cret");
  CHECK(f.api.handle("GET", "/admin/config", kAuth, "").status == 200);  // still the same token
  CHECK(f.api.handle("PUT", "/admin/config", kAuth, "admin:\n  token: n3w\n").status == 200);
  CHECK(f.api.handle("GET", "/admin/config", "Bearer n3w", "").status == 200);
}

TEST_CASE("the status page's files are served without the token; its data needs the token") {
  Fixture f;
  for (auto path : {"/", "/ui", "/ui/", "/ui/index.html"}) {
    auto r = f.api.handle("GET", path, "", "");
    CHECK(r.status == 200);
    CHECK(r.content_type == "text/html; charset=utf-8");
    CHECK(has(r.body, "<script src=\"/ui/app.js\""));
    CHECK_FALSE(has(r.body, "s3cret"));
  }
  CHECK(f.api.handle("GET", "/ui/app.js", "", "").content_type == "text/javascript; charset=utf-8");
  CHECK(has(f.api.handle("GET", "/ui/app.js", "", "").body, "sessionStorage"));
  CHECK(f.api.handle("GET", "/ui/app.css", "", "").content_type == "text/css; charset=utf-8");
  CHECK(f.api.handle("GET", "/ui/nope.js", "", "").status == 401);
  CHECK(f.api.handle("POST", "/ui", "", "").status == 401);
  CHECK(f.api.handle("GET", "/admin/status", "", "").status == 401);
  CHECK(f.api.handle("GET", "/admin/status", kAuth, "").status == 404);  // no StatusReport set

  // With the daemon's status sources.
  DecisionLog decisions(4, std::chrono::milliseconds(0));
  StatusHistory history([&] {
    StatusCounters c;
    c.routed = decisions.routed();
    return c;
  });
  StatusSources sources;
  sources.index_entries = [] { return std::vector<std::pair<WorkerId, uint64_t>>{{WorkerId{4}, 17}}; };
  sources.partial_index = [](CacheOwner o) { return o.worker == WorkerId{4}; };
  sources.worker_tokens = [](WorkerId) { return std::pair<uint64_t, uint64_t>{100, 25}; };
  StatusReport status(f.registry, sources, history, decisions);
  f.api.set_status(&status);
  auto r = f.api.handle("GET", "/admin/status", kAuth, "");
  REQUIRE(r.status == 200);
  for (auto key : {R"("worker_id":4)", R"("state":"partial_index")", R"("index_entries":17)", R"("hit_rate":0.25)",
                   R"("kv_usage_reported":0.05)", R"("totals":{)"})
    CHECK_MESSAGE(has(r.body, key), key, " in ", r.body);
  CHECK(f.api.handle("GET", "/admin/status/history", kAuth, "").status == 200);
  CHECK(f.api.handle("GET", "/admin/decisions", kAuth, "").body == "[]");
  CHECK(f.api.handle("GET", "/admin/decisions/1", kAuth, "").status == 404);
  CHECK(f.api.handle("GET", "/admin/decisions/x", kAuth, "").status == 404);

  // A routed request is kept with its explain.
  ParsedRequest req;
  req.model = "m";
  req.prompt_text = "hello";
  const RouteResult routed = f.routing.route(req);
  REQUIRE(routed.ok);
  decisions.on_routed(req, routed, f.config.get()->scheduler, 16);
  auto list = f.api.handle("GET", "/admin/decisions", kAuth, "");
  CHECK_MESSAGE(has(list.body, R"({"id":1,)"), list.body);
  CHECK(has(list.body, R"("chosen":4)"));
  auto x = f.api.handle("GET", "/admin/decisions/1", kAuth, "");
  CHECK(x.status == 200);
  CHECK(has(x.body, R"("reason":"Chose worker 4)"));
}

TEST_CASE("status history: per-second rates, hit rate, decision latency quantiles, a bounded ring") {
  StatusCounters now;
  StatusHistory h([&] { return now; }, 3);
  h.sample(100);  // baseline
  CHECK(h.samples().empty());
  now.routed = 50;
  now.prompt_tokens = 1000;
  now.cached_tokens = 250;
  now.events = 20;
  now.decision_buckets.assign(decision_time_bounds().size() + 1, 0);
  now.decision_buckets[5] = 99;   // (16 us, 32 us]
  now.decision_buckets[10] = 1;   // (512 us, 1024 us]
  now.index_entries = 7;
  h.sample(102);  // two seconds later
  auto s = h.samples();
  REQUIRE(s.size() == 1);
  CHECK(s[0].requests_per_s == doctest::Approx(25));
  CHECK(s[0].hit_rate == doctest::Approx(0.25));
  CHECK(s[0].events_per_s == doctest::Approx(10));
  CHECK(s[0].decision_p50_us > 16);
  CHECK(s[0].decision_p50_us <= 32);
  CHECK(s[0].decision_p99_us > 16);
  CHECK(s[0].decision_p99_us <= 32);
  CHECK(s[0].index_entries == 7);
  for (int i = 0; i < 5; ++i) h.sample(103 + i);  // idle seconds
  s = h.samples();
  CHECK(s.size() == 3);  // the capacity
  CHECK(s.back().requests_per_s == 0);
  CHECK(std::isnan(s.back().hit_rate));
  CHECK(has(h.json(), R"("hit_rate":[null,null,null])"));
  StatusHistory wall([&] { return now; });
  wall.sample(1795480000.25);
  wall.sample(1795480001.5);
  CHECK_MESSAGE(has(wall.json(), R"("t":[1795480001.500])"), wall.json());  // full precision
  CHECK(std::isnan(histogram_quantile({1, 2}, {0, 0, 0}, 0.5)));
  CHECK(histogram_quantile({1, 2}, {0, 4, 0}, 0.5) == doctest::Approx(1.5));
}

TEST_CASE("the decision log keeps at most one decision per gap and only the latest ones") {
  Fixture f;
  ParsedRequest req;
  req.model = "m";
  req.prompt_text = "hello";
  const RouteResult routed = f.routing.route(req);
  DecisionLog spaced(2, std::chrono::hours(1));
  for (int i = 0; i < 5; ++i) spaced.on_routed(req, routed, f.config.get()->scheduler, 16);
  CHECK(spaced.routed() == 5);
  CHECK(spaced.explain(1).has_value());
  CHECK_FALSE(spaced.explain(2).has_value());
  DecisionLog every(2, std::chrono::milliseconds(0));
  for (int i = 0; i < 5; ++i) every.on_routed(req, routed, f.config.get()->scheduler, 16);
  CHECK_FALSE(every.explain(3).has_value());  // left the ring
  CHECK(every.explain(4).has_value());
  CHECK(every.explain(5).has_value());
  uint64_t timed = 0;
  for (auto n : every.decision_buckets()) timed += n;
  CHECK(timed == 5);
}

TEST_CASE("a worker's state on the status page: the most pressing first") {
  WorkerView w;
  const Nanos stale(std::chrono::seconds(1));
  CHECK(worker_state(w, false, stale) == "ok");
  w.load_age = std::chrono::seconds(2);
  CHECK(worker_state(w, false, stale) == "stale");
  CHECK(worker_state(w, false, Nanos{-1}) == "ok");  // no staleness rule
  CHECK(worker_state(w, true, stale) == "partial_index");
  w.draining = true;
  CHECK(worker_state(w, true, stale) == "draining");
  w.health = HealthState::Down;
  CHECK(worker_state(w, true, stale) == "down");
  w.health = HealthState::Ejected;
  CHECK(worker_state(w, true, stale) == "ejected");
  WorkerView never;  // a static worker that is not scraped has no load age
  never.load_age = Nanos{-1};
  CHECK(worker_state(never, false, stale) == "ok");
}

TEST_CASE("PUT /admin/config refuses values that would stop routing or lock the operator out, naming the key") {
  Fixture f;
  const auto before = f.config.get();
  const std::pair<std::string_view, std::string_view> fatal[] = {
      {"scheduler:\n  busy_kv_usage: 0\n", "scheduler.busy_kv_usage"},         // every worker busy: all 503
      {"scheduler:\n  busy_slot_usage: 0\n", "scheduler.busy_slot_usage"},     // the same by request slots
      {"admin:\n  token: ''\n", "admin.token"},                                // refuses this API too
      {"router:\n  first_byte_timeout_ms: 1\n", "router.first_byte_timeout_ms"},  // every request times out
      {"router:\n  first_byte_timeout_min_ms: 1\n", "router.first_byte_timeout_min_ms"},
      {"router:\n  client_read_timeout_ms: 1\n", "router.client_read_timeout_ms"},  // no request can be read
      {"router:\n  idle_timeout_ms: 1\n", "router.idle_timeout_ms"},          // every stream cut
      {"router:\n  connect_timeout_ms: 1\n", "router.connect_timeout_ms"},    // no worker reachable
      {"router:\n  max_body_bytes_in_flight: 1048576\n  max_body_bytes: 2097152\n",
       "router.max_body_bytes_in_flight"},  // no body of the largest size could ever be read
  };
  for (const auto& [yaml, key] : fatal) {
    CAPTURE(yaml);
    const auto r = f.api.handle("PUT", "/admin/config", kAuth, yaml);
    CHECK(r.status == 400);
    CHECK(has(r.body, key));
  }
  CHECK(f.config.get() == before);  // nothing changed
  CHECK(f.api.handle("GET", "/admin/config", kAuth, "").status == 200);  // the operator still gets in
  // The edge values just inside stay allowed.
  CHECK(f.api.handle("PUT", "/admin/config", kAuth, "scheduler:\n  busy_kv_usage: 0.01\n").status == 200);
}
