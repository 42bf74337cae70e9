// The routing decision's fast path (the registry's pre-ranked fleets) against
// the O(workers) reference (every candidate scored by schedule()), through the
// real RoutingService, RadixIndexer and WorkerRegistry: random fleets with
// several models and LoRA names, workers without URL, drained, down and
// ejected ones, in-flight load (this router's and other replicas'), KV caches
// of random depths, seeded ties; queued re-decisions (reroute); and
// scheduler.cost = predicted_ttft, which never takes the fast path.
#include "router/routing.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "indexer/approx_indexer.h"
#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"
#include "indexer/merged_index.h"
#include "tests/indexer/doc_events.h"

using namespace kvroute;

namespace {

std::vector<TokenId> prompt(uint32_t family, size_t n) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = family * 100003u + static_cast<TokenId>(i);
  return t;
}

struct World {
  ManualClock clock;
  RadixIndexer index;
  WorkerRegistry registry{clock};
  std::unique_ptr<ConfigStore> config;
  std::vector<WorkerId> ids;
};

void build(World& w, std::mt19937_64& rng, Config cfg) {
  auto pick = [&](uint64_t n) { return rng() % n; };
  w.config = std::make_unique<ConfigStore>(cfg);
  const size_t n = 1 + pick(pick(4) == 0 ? 400 : 40);
  HealthPolicy policy;
  w.registry.set_health_policy(policy);
  const bool ties = pick(2) == 0;
  for (size_t i = 0; i < n; ++i) {
    WorkerAnnouncement a;
    a.id = WorkerId{pick(2) ? i + 1 : rng()};
    a.url = pick(15) == 0 ? "" : "http://127.0.0.1:" + std::to_string(9000 + i);
    a.model = pick(5) == 0 ? "other" : "m";
    if (pick(6) == 0) a.lora_adapters = {"m-lora"};
    a.block_size = 16;
    a.load = ties ? WorkerLoad{8 * static_cast<uint32_t>(pick(2)), 64, 0, 100 * pick(3), 1000}
                  : WorkerLoad{static_cast<uint32_t>(pick(70)), 64, static_cast<uint32_t>(pick(3)), pick(1100), 1000};
    if (pick(2)) w.registry.on_heartbeat(a);
    else w.registry.upsert(a);
    w.ids.push_back(a.id);
    if (pick(20) == 0) w.registry.set_draining(a.id, true);
    if (pick(20) == 0) w.registry.report_failure(a.id, HealthSignal::ConnectRefused);  // down
    if (pick(12) == 0)  // ejected (outlier) for eject_base_ms
      for (uint32_t k = 0; k < policy.eject_after_failures; ++k) w.registry.report_failure(a.id, HealthSignal::ServerError);
    // KV cache: a prefix of one of 4 prompt families, random depth and tier.
    KvEvent ev;
    ev.owner = CacheOwner{a.id, static_cast<uint32_t>(pick(3) == 0)};
    ev.tier = pick(5) == 0 ? StorageTier::HostPinned : StorageTier::Device;
    KvStored st;
    SequenceHash parent{0};
    const auto hashes = hash_blocks(prompt(static_cast<uint32_t>(pick(4)), 16 * (1 + pick(40))), 16);
    for (auto h : hashes) st.blocks.push_back({parent = sequence_hash(parent, h), h});
    ev.data = st;
    if (pick(4)) w.index.apply(ev);
    // In-flight work the router has on it.
    for (uint64_t k = pick(3); k-- > 0;) w.registry.begin_request(a.id, 1 + pick(64), pick(2) ? pick(2000) : 0);
    // Other router replicas' in-flight work on it.
    if (pick(4) == 0) w.registry.set_remote_inflight(a.id, static_cast<uint32_t>(pick(40)), pick(900), pick(3000));
  }
}

// Workers 1 and 2 of model "m" with `kv1` and `kv2` of their 1000 KV blocks
// active, on 16-token blocks.
// Worker `id` serving "m", no request slot taken, `kv` of its 1000 KV blocks active.
void add_worker(World& w, uint64_t id, uint64_t kv) {
  WorkerAnnouncement a;
  a.id = WorkerId{id};
  a.url = "http://127.0.0.1:900" + std::to_string(id);
  a.model = "m";
  a.load = WorkerLoad{0, 64, 0, kv, 1000};
  w.registry.upsert(a);
}

void two_workers(World& w, uint64_t kv1, uint64_t kv2) {
  Config cfg;
  cfg.indexer.block_size = 16;
  w.config = std::make_unique<ConfigStore>(cfg);
  add_worker(w, 1, kv1);
  add_worker(w, 2, kv2);
}

// A question on a 64-block document: the first (5 tokens past the document)
// or another one (40 tokens).
ParsedRequest on_document(bool another) {
  ParsedRequest r;
  r.model = "m";
  r.has_prompt_tokens = true;
  r.prompt_tokens = prompt(1, 64 * 16 + 5);
  if (another) {
    r.prompt_tokens.resize(64 * 16);
    for (TokenId t : prompt(2, 40)) r.prompt_tokens.push_back(t);
  }
  return r;
}

// The routed request `lead` in flight on worker `id` (not yet stored: the index has nothing).
void hold_on(World& w, const SchedulerConfig& s, const RouteResult& lead, uint64_t id) {
  RouteTarget on;
  on.worker = WorkerId{id};
  on.prefill_tokens = lead.isl_tokens;
  InflightKv held = route_inflight_kv(s, lead, on, lead.request_blocks, 0);
  w.registry.begin_request(WorkerId{id}, held, lead.isl_tokens);
}

// Teaches some workers' TTFT models observed times (begin_request's sample,
// then first_byte after `ms`), so workers' predictions differ.
void teach_ttft(World& w, std::mt19937_64& rng) {
  for (WorkerId id : w.ids) {
    if (rng() % 2) continue;
    for (int k = 0; k < 4; ++k) {
      const uint64_t prefill = rng() % 4000;
      const TtftSample sample = w.registry.begin_request(id, 1, prefill);
      w.clock.advance(std::chrono::microseconds(100 + rng() % 5000));
      w.registry.first_byte(id, prefill, &sample);
      w.registry.end_request(id, 1, 0, false);
    }
  }
}

void same(const RouteResult& fast, const RouteResult& ref) {
  REQUIRE(fast.ok == ref.ok);
  CHECK(fast.error.status == ref.error.status);
  REQUIRE(fast.ranked.size() == ref.ranked.size());
  for (size_t k = 0; k < ref.ranked.size(); ++k) {
    CHECK(fast.ranked[k].worker == ref.ranked[k].worker);
    CHECK(fast.ranked[k].url == ref.ranked[k].url);
    CHECK(fast.ranked[k].cached_tokens == ref.ranked[k].cached_tokens);
    CHECK(fast.ranked[k].prefill_tokens == ref.ranked[k].prefill_tokens);
  }
  CHECK(fast.chose_best_overlap == ref.chose_best_overlap);
  CHECK(fast.best_cached_tokens == ref.best_cached_tokens);
  if (ref.ok) {
    CHECK(fast.candidates[*fast.decision.chosen].owner == ref.candidates[*ref.decision.chosen].owner);
    CHECK(fast.decision.scores[*fast.decision.chosen].cost ==
          doctest::Approx(ref.decision.scores[*ref.decision.chosen].cost));
    CHECK(fast.decision.scores[*fast.decision.chosen].predicted_ttft_ms ==
          doctest::Approx(ref.decision.scores[*ref.decision.chosen].predicted_ttft_ms));
  }
}

// Block size 16 and random max_attempts and pending prefill weight.
Config random_config(std::mt19937_64& rng) {
  Config cfg;
  cfg.indexer.block_size = 16;
  cfg.router.max_attempts = 1 + static_cast<uint32_t>(rng() % 4);
  cfg.scheduler.pending_prefill_weight = (rng() % 3) * 0.2;
  cfg.scheduler.inflight_prefix_weight = (rng() % 3) * 0.5;
  cfg.scheduler.inflight_prefix_load = rng() % 2 ? 0.6 : 0.05;
  return cfg;
}

// The fast path and the O(workers) reference on one world, seeded alike.
struct RoutePair {
  SeededRandom r1, r2;
  RoutingService fast, ref;
  RouteResult a, b;  // fast's and ref's answers
  RoutePair(World& w, uint64_t seed)
      : r1(seed), r2(seed), fast(w.index, w.registry, *w.config, r1), ref(w.index, w.registry, *w.config, r2) {
    ref.set_fast_path(false);
  }
  void route(const ParsedRequest& r) {
    fast.route(r, a);
    ref.route(r, b);
  }
};

}  // namespace

TEST_CASE("routing: the pre-ranked fast path chooses as the O(workers) reference") {
  std::mt19937_64 rng(17);
  int compared = 0, routed = 0, rerouted = 0, joined = 0;
  for (int trial = 0; trial < 150; ++trial) {
    Config cfg = random_config(rng);
    cfg.scheduler.busy_kv_usage = rng() % 3 == 0 ? 0.8 : 1.0;
    World w;
    build(w, rng, cfg);
    for (int q = 0; q < 12; ++q) {
      if (q == 6) w.clock.advance(std::chrono::seconds(5));  // ejections end (lazily)
      ParsedRequest r;
      const int m = static_cast<int>(rng() % 10);
      r.model = m < 7 ? "m" : m < 9 ? "m-lora" : "missing";
      r.has_prompt_tokens = true;
      r.prompt_tokens = prompt(static_cast<uint32_t>(rng() % 5), 1 + rng() % 900);
      RoutePair pair(w, rng());
      pair.route(r);
      const RouteResult &a = pair.a, &b = pair.b;
      INFO("trial " << trial << " request " << q << " model " << r.model);
      same(a, b);
      ++compared;
      routed += a.ok;
      // Decisions that saw more of the prompt in flight on a worker than any worker has cached.
      std::vector<OwnerOverlap> inflight;
      if (a.ok && cfg.scheduler.inflight_prefix_weight > 0) {
        const uint32_t cached = w.index.find_matches(a.block_hashes).longest();
        w.registry.inflight_overlaps(r.model, inflight_chain(a.block_hashes), cached, cfg.scheduler, inflight);
      }
      joined += !inflight.empty();
      // The chosen worker takes the request: load changes between decisions.
      // Its prompt's blocks are in flight there: a later prompt sharing them overlaps it there.
      if (a.ok && rng() % 2) {
        InflightKv kv = route_inflight_kv(w.config->get()->scheduler, a, a.ranked[0], a.request_blocks, 0);
        w.registry.begin_request(a.ranked[0].worker, kv, a.ranked[0].prefill_tokens);
      }
      // Another replica's in-flight counts on some worker change.
      if (rng() % 3 == 0)
        w.registry.set_remote_inflight(w.ids[rng() % w.ids.size()], static_cast<uint32_t>(rng() % 40), rng() % 900,
                                       rng() % 3000);
      // A queued request decides again on the new load (reroute): the same.
      if (rng() % 3 == 0) {
        pair.fast.reroute(r.model, pair.a);
        pair.ref.reroute(r.model, pair.b);
        INFO("reroute");
        same(a, b);
        ++rerouted;
      }
    }
  }
  CHECK(compared == 150 * 12);
  CHECK(routed > compared / 2);
  CHECK(rerouted > 150 * 12 / 5);
  CHECK(joined > 100);
}

TEST_CASE("routing: with cost=predicted_ttft the fast path is not used and results equal decide_all") {
  std::mt19937_64 rng(23);
  int compared = 0, routed = 0, partial = 0;
  for (int trial = 0; trial < 60; ++trial) {
    Config cfg = random_config(rng);
    cfg.scheduler.cost = "predicted_ttft";
    CHECK_FALSE(RankedCandidates::supports(cfg.scheduler, cfg.router.max_attempts));
    World w;
    build(w, rng, cfg);
    teach_ttft(w, rng);
    for (int q = 0; q < 8; ++q) {
      ParsedRequest r;
      r.model = rng() % 4 ? "m" : "m-lora";
      r.has_prompt_tokens = true;
      r.prompt_tokens = prompt(static_cast<uint32_t>(rng() % 5), 1 + rng() % 900);
      RoutePair pair(w, rng());  // fast path on, but refused
      pair.route(r);
      const RouteResult &a = pair.a, &b = pair.b;
      INFO("trial " << trial << " request " << q << " model " << r.model);
      same(a, b);
      // decide_all(): every candidate scored (the fast path has only the ranked).
      REQUIRE(a.candidates.size() == b.candidates.size());
      REQUIRE(a.decision.scores.size() == b.decision.scores.size());
      for (size_t i = 0; i < b.candidates.size(); ++i) {
        CHECK(a.candidates[i].owner == b.candidates[i].owner);
        CHECK(a.decision.scores[i].excluded == b.decision.scores[i].excluded);
        CHECK(a.decision.scores[i].cost == b.decision.scores[i].cost);
        CHECK(a.decision.scores[i].predicted_ttft_ms == b.decision.scores[i].predicted_ttft_ms);
      }
      CHECK(a.decision.ranking == b.decision.ranking);
      ++compared;
      routed += a.ok;
      if (a.ok && a.ranked.size() < a.candidates.size()) ++partial;
    }
  }
  CHECK(compared == 60 * 8);
  CHECK(routed > compared / 2);
  CHECK(partial > 0);  // some rankings were cut at max_attempts: the fast path would have read fewer
}

TEST_CASE("routing: an ejected worker is never a candidate on the fast path, and returns when the ejection ends") {
  World w;
  two_workers(w, 0, 500);  // worker 1 is the cheaper
  HealthPolicy policy;
  w.registry.set_health_policy(policy);
  for (uint32_t k = 0; k < policy.eject_after_failures; ++k) w.registry.report_failure(WorkerId{1}, HealthSignal::ServerError);
  SeededRandom rnd(1);
  RoutingService routing(w.index, w.registry, *w.config, rnd);
  ParsedRequest r;
  r.model = "m";
  r.has_prompt_tokens = true;
  r.prompt_tokens = prompt(1, 64);
  RouteResult out;
  routing.route(r, out);
  REQUIRE(out.ok);
  REQUIRE(out.ranked.size() == 1);
  CHECK(out.ranked[0].worker == WorkerId{2});
  w.clock.advance(std::chrono::milliseconds(policy.eject_base_ms));
  routing.route(r, out);
  REQUIRE(out.ok);
  CHECK(out.ranked[0].worker == WorkerId{1});
  CHECK(out.ranked.size() == 2);
  // Down (refused): out at once, back with the next answered scrape.
  w.registry.report_failure(WorkerId{1}, HealthSignal::ConnectRefused);
  routing.route(r, out);
  CHECK(out.ranked[0].worker == WorkerId{2});
  w.registry.on_load_report(WorkerId{1}, WorkerLoad{0, 64, 0, 0, 1000});
  routing.route(r, out);
  CHECK(out.ranked[0].worker == WorkerId{1});
  // Removed: gone from the fleet too.
  CHECK(w.registry.remove(WorkerId{1}));
  routing.route(r, out);
  CHECK(out.ranked[0].worker == WorkerId{2});
}

TEST_CASE("merged index: predicted owners join the exact index's layers with their longer overlap") {
  ManualClock clock;
  RadixIndexer exact;
  ApproxIndexer approx(clock, std::chrono::seconds(60));
  MergedIndex merged(exact, approx);
  // 30 owners hold 4 blocks in the exact index (one large layer); worker 7
  // is predicted to hold 6 and worker 40 (no events) 3.
  std::vector<LocalBlockHash> q;
  for (uint64_t i = 1; i <= 8; ++i) q.push_back(LocalBlockHash{i});
  for (uint64_t w = 0; w < 30; ++w)  // document 0: blocks q[0..4)
    exact.apply(testing::store_doc(CacheOwner{WorkerId{w}, 0}, 0, 4, StorageTier::Device));
  approx.record(CacheOwner{WorkerId{7}, 0}, std::span(q).first(6), clock.now());
  approx.record(CacheOwner{WorkerId{40}, 0}, std::span(q).first(3), clock.now());
  MatchLayers m;
  merged.find_match_layers(q, m);
  REQUIRE(m.layers.size() == 1);
  CHECK(m.layers[0].set->owners.size() == 30);
  auto got = m.expand().owners, want = merged.find_matches(q).owners;
  auto by_owner = [](const OwnerOverlap& a, const OwnerOverlap& b) { return a.owner < b.owner; };
  std::sort(got.begin(), got.end(), by_owner);
  std::sort(want.begin(), want.end(), by_owner);
  REQUIRE(got.size() == want.size());
  CHECK(got.size() == 31);
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].owner == want[i].owner);
    CHECK(got[i].blocks == want[i].blocks);
  }
}

TEST_CASE("routing: a prompt joins the worker computing its prefix on a busy fleet, computes its own on an idle one") {
  for (const uint64_t kv : {0, 950}) {  // both workers' active KV of 1000 blocks: idle, busy (over inflight_prefix_load)
    for (const double weight : {0.0, 1.0}) {
      World w;
      two_workers(w, kv, kv);
      Config cfg = *w.config->get();
      cfg.scheduler.inflight_prefix_weight = weight;
      w.config = std::make_unique<ConfigStore>(cfg);
      SeededRandom rnd(1);
      RoutingService routing(w.index, w.registry, *w.config, rnd);
      // A 64-block document with a question, in flight on worker 1.
      RouteResult lead;
      routing.route(on_document(false), lead);
      REQUIRE(lead.ok);
      hold_on(w, cfg.scheduler, lead, 1);
      // Another question on the same document, decided by both scorers.
      const ParsedRequest next = on_document(true);
      for (bool fast : {true, false}) {
        CAPTURE(kv);
        CAPTURE(weight);
        CAPTURE(fast);
        routing.set_fast_path(fast);
        RouteResult out;
        routing.route(next, out);
        REQUIRE(out.ok);
        // Busy, with the in-flight prefix counted: it waits for worker 1's copy
        // (64 blocks counted as cached there). Otherwise worker 2, which has
        // none of the router's prefill queued, computes its own.
        const bool joins = kv > 0 && weight > 0;
        CHECK(out.ranked[0].worker == WorkerId{joins ? 1u : 2u});
        const auto c = std::find_if(out.candidates.begin(), out.candidates.end(),
                                    [](const Candidate& x) { return x.owner.worker == WorkerId{1}; });
        REQUIRE(c != out.candidates.end());
        // Idle, the prefix counts in proportion to the fleet's mean KV load
        // (65 blocks in flight of 2,000) against inflight_prefix_load.
        const double full_from = cfg.scheduler.inflight_prefix_load;
        const uint32_t want = weight == 0 ? 0 : kv > 0 ? 64 : static_cast<uint32_t>(64 * (65.0 / 2000) / full_from);
        CHECK(c->overlap_blocks == want);
        // Whatever it counted as, worker 1's target claims the 64 blocks its engine will find cached there.
        const auto t = std::find_if(out.ranked.begin(), out.ranked.end(),
                                    [](const RouteTarget& x) { return x.worker == WorkerId{1}; });
        REQUIRE(t != out.ranked.end());
        CHECK(t->cached_tokens == (weight > 0 ? 64u * 16 : 0u));
        // Its queue counts what the decision priced: the prefix at its value.
        CHECK(t->prefill_tokens == out.isl_tokens - claimed_tokens(want, out.isl_tokens, 16));
        CHECK(t->resumed_blocks == want);  // taken back from the parked KV as counted
      }
    }
  }
}

TEST_CASE("routing: once half the workers compute a prefix, a request sharing it joins one of them, even on an idle fleet") {
  // Four idle workers; a 64-block document in flight on the first `holders`
  // of them. The fleet's mean KV load is near 0, so under
  // scheduler.inflight_prefix_load the prefix would count at a small share.
  for (const double spread : {0.0, 0.5}) {
    for (const uint32_t holders : {1u, 2u, 3u}) {
      World w;
      Config cfg;
      cfg.indexer.block_size = 16;
      cfg.scheduler.inflight_prefix_spread = spread;
      w.config = std::make_unique<ConfigStore>(cfg);
      for (uint64_t id = 1; id <= 4; ++id) add_worker(w, id, 0);
      SeededRandom rnd(1);
      RoutingService routing(w.index, w.registry, *w.config, rnd);
      RouteResult lead;
      routing.route(on_document(false), lead);
      REQUIRE(lead.ok);
      for (uint64_t id = 1; id <= holders; ++id) hold_on(w, cfg.scheduler, lead, id);
      const ParsedRequest next = on_document(true);
      for (bool fast : {true, false}) {
        CAPTURE(spread);
        CAPTURE(holders);
        CAPTURE(fast);
        routing.set_fast_path(fast);
        RouteResult out;
        routing.route(next, out);
        REQUIRE(out.ok);
        // Two holders are half of the four workers: the prefix counts in full
        // there and the request joins a holder; with one, or with the rule
        // off, it counts at the load's share and an idle worker computes a copy.
        const bool full = spread > 0 && holders >= 2;
        CHECK((out.ranked[0].worker.value <= holders) == full);
        for (const Candidate& c : out.candidates)
          if (c.owner.worker.value <= holders) {
            if (full) CHECK(c.overlap_blocks == 64);
            else CHECK(c.overlap_blocks < 8);
          }
      }
    }
  }
  // The rule in numbers: at least half of the workers, rounded up, and at least two.
  SchedulerConfig s;
  s.inflight_prefix_load = 0.6;
  CHECK(inflight_prefix_value(s, 0.06, 4, 8) == doctest::Approx(1));  // the default 0.5: 4 of 8
  s.inflight_prefix_spread = 0.625;  // 5 of 8
  CHECK(inflight_prefix_value(s, 0.06, 4, 8) == doctest::Approx(0.1));
  CHECK(inflight_prefix_value(s, 0.06, 5, 8) == doctest::Approx(1));
  s.inflight_prefix_spread = 0.5;
  CHECK(inflight_prefix_value(s, 0.06, 4, 8) == doctest::Approx(1));
  CHECK(inflight_prefix_value(s, 0.06, 3, 8) == doctest::Approx(0.1));
  CHECK(inflight_prefix_value(s, 0.06, 3, 5) == doctest::Approx(1));
  CHECK(inflight_prefix_value(s, 0.06, 1, 2) == doctest::Approx(0.1));
  CHECK(inflight_prefix_value(s, 0.06, 2, 2) == doctest::Approx(1));
  CHECK(inflight_prefix_value(s, 0.9, 1, 8) == doctest::Approx(1));  // busy: in full from inflight_prefix_load
  s.inflight_prefix_spread = 0;
  CHECK(inflight_prefix_value(s, 0.06, 8, 8) == doctest::Approx(0.1));
}

TEST_CASE("routing: a request with no prompt is ranked without the parked KV, which it would not displace") {
  World w;
  two_workers(w, 0, 100);  // worker 1 the less loaded
  w.registry.set_parked_kv_seconds(10);
  {
    InflightGuard answered(w.registry, WorkerId{1}, 600, 9600);  // a long prompt answered on worker 1
    answered.first_byte();
  }
  SeededRandom rnd(1);
  RoutingService routing(w.index, w.registry, *w.config, rnd);
  ParsedRequest r;
  r.model = "m";
  r.has_prompt_tokens = true;
  RouteResult out;
  for (bool fast : {true, false}) {
    CAPTURE(fast);
    routing.set_fast_path(fast);
    // A prompt: worker 1's 600 parked blocks outweigh worker 2's 100 active ones.
    r.prompt_tokens = prompt(1, 64);
    routing.route(r, out);
    REQUIRE(out.ok);
    CHECK(out.ranked[0].worker == WorkerId{2});
    // No prompt (a passthrough route: tokenize, rerank, ...): by the active KV alone.
    r.prompt_tokens.clear();
    routing.route(r, out);
    REQUIRE(out.ok);
    CHECK(out.ranked[0].worker == WorkerId{1});
    CHECK(out.candidates[out.decision.ranking[0]].parked_blocks == 0);
  }
}
