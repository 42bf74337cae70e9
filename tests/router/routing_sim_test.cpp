// Deterministic simulation of routing decisions: the production RoutingService
// over a real RadixIndexer fed with KV events, a WorkerRegistry on a manual
// clock, and seeded randomness. No sockets, no threads.
#include "router/routing.h"

#include <doctest/doctest.h>

#include <map>
#include <tuple>

#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"
#include "router/explain.h"
#include "tests/scheduler/same_decision.h"

using namespace kvroute;

namespace {

constexpr uint32_t kBlock = 16;

struct Sim {
  ManualClock clock;
  SeededRandom random{1234};
  RadixIndexer index;
  WorkerRegistry registry{clock};
  ConfigStore config{[] {
    Config c;
    c.indexer.block_size = kBlock;
    return c;
  }()};
  RoutingService routing{index, registry, config, random};

  void add_worker(uint64_t id, uint64_t kv_active = 0, uint64_t kv_total = 10000, uint32_t active = 0,
                  uint32_t total = 256, uint32_t waiting = 0) {
    WorkerAnnouncement a;
    a.id = WorkerId{id};
    a.url = "http://127.0.0.1:" + std::to_string(10000 + id);
    a.model = "m";
    a.block_size = kBlock;
    a.load = WorkerLoad{active, total, waiting, kv_active, kv_total};
    registry.on_heartbeat(a);
  }
  // The worker caches the prompt's complete blocks (as its KV events would say).
  void cache(uint64_t worker, const std::vector<TokenId>& tokens) {
    KvStored s;
    SequenceHash parent{0};
    bool first = true;
    for (auto h : hash_blocks(tokens, kBlock)) {
      SequenceHash id = sequence_hash(parent, h);
      s.blocks.push_back({id, h});
      if (first) first = false;
      parent = id;
    }
    KvEvent ev;
    ev.owner = CacheOwner{WorkerId{worker}, 0};
    ev.data = s;
    REQUIRE(index.apply(ev) == ApplyResult::Applied);
  }
  ParsedRequest request(const std::vector<TokenId>& tokens) {
    ParsedRequest r;
    r.model = "m";
    r.has_prompt_tokens = true;
    r.prompt_tokens = tokens;
    return r;
  }
};

std::vector<TokenId> prompt(uint32_t seed, size_t n) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = seed * 100003u + static_cast<TokenId>(i);
  return t;
}

std::vector<TokenId> with_suffix(std::vector<TokenId> t, uint32_t s, size_t n) {
  for (size_t i = 0; i < n; ++i) t.push_back(900000000u + s * 1000u + static_cast<TokenId>(i));
  return t;
}

}  // namespace

TEST_CASE("same-prefix requests go to the worker that holds the prefix") {
  Sim sim;
  for (uint64_t w = 1; w <= 4; ++w) sim.add_worker(w, 1000);
  const auto shared = prompt(7, 64 * kBlock);
  sim.cache(3, shared);
  for (uint32_t i = 0; i < 20; ++i) {
    auto r = sim.routing.route(sim.request(with_suffix(shared, i, 40)));
    REQUIRE(r.ok);
    CHECK(r.ranked.front().worker == WorkerId{3});
    CHECK(r.ranked.front().cached_tokens == 64 * kBlock);
    CHECK(r.chose_best_overlap);
  }
}

TEST_CASE("in-flight KV shares what scheduler.inflight_kv names: each distinct block, the cached prefix, or nothing") {
  Sim sim;
  for (uint64_t w = 1; w <= 2; ++w) sim.add_worker(w, 1000);
  const auto shared = prompt(9, 64 * kBlock);
  sim.cache(1, shared);
  auto r = sim.routing.route(sim.request(with_suffix(shared, 1, 40)));
  REQUIRE(r.ok);
  REQUIRE(r.ranked.size() == 2);
  CHECK(r.ranked[0].worker == WorkerId{1});
  CHECK(r.ranked[0].cached_blocks == 64);
  CHECK(r.ranked[1].cached_blocks == 0);
  CHECK(r.request_blocks == 67);
  REQUIRE(r.block_hashes.size() == 66);  // complete blocks: 64 shared, 2 of the suffix
  // Three such requests (the same prompt) in flight on the holder, as the proxy counts them.
  auto inflight_on_holder = [&](const SchedulerConfig& s) {
    std::vector<std::unique_ptr<InflightGuard>> g;
    for (int i = 0; i < 3; ++i)
      g.push_back(std::make_unique<InflightGuard>(sim.registry, r.ranked[0].worker, r.request_blocks,
                                                  r.ranked[0].prefill_tokens, inflight_shared_blocks(s, r.ranked[0]),
                                                  inflight_prompt(s, r.block_hashes)));
    for (const auto& v : sim.registry.candidates("m"))
      if (v.info->id == WorkerId{1}) return v.inflight_blocks;
    return uint64_t{0};
  };
  SchedulerConfig s;
  CHECK(s.inflight_kv == "distinct");  // the default
  CHECK(inflight_prompt(s, r.block_hashes).size() == 66);
  CHECK(inflight_shared_blocks(s, r.ranked[0]) == 0);
  CHECK(inflight_on_holder(s) == 66 + 3 * 1);  // each complete block once, each partial block per request
  s.inflight_kv = "prefix_once";
  CHECK(inflight_prompt(s, r.block_hashes).empty());
  CHECK(inflight_on_holder(s) == 3 * 3 + 64);  // own blocks per request, the cached prefix once
  s.inflight_kv = "whole";
  CHECK(inflight_shared_blocks(s, r.ranked[0]) == 0);
  CHECK(inflight_on_holder(s) == 3 * 67);

  // The route's chain, as the proxy, the queue's slot claim and a PD prefill
  // leg copy it: the complete blocks chained, hashed once, kept across a
  // queued request's re-decision, and none unless the config says distinct.
  s.inflight_kv = "distinct";
  const std::vector<uint64_t> want = inflight_chain(inflight_prompt(s, r.block_hashes));
  CHECK(inflight_chain(s, r) == want);
  CHECK(r.chain.size() == r.block_hashes.size());
  r.chain[0] ^= 1;  // a marker: a second call reads the kept chain, not the blocks again
  CHECK(inflight_chain(s, r)[0] == (want[0] ^ 1));
  sim.routing.reroute("m", r, false, false);
  CHECK(r.chain.size() == r.block_hashes.size());
  CHECK(inflight_chain(s, r)[0] == (want[0] ^ 1));
  s.inflight_kv = "whole";
  CHECK(inflight_chain(s, r).empty());
  r.reset();
  CHECK(r.chain.empty());
}

TEST_CASE("an overloaded holder loses to the balance term") {
  Sim sim;
  // The alpha switch (off by default: alpha_imbalanced = alpha_balanced).
  sim.config.update([](Config& c) {
    c.scheduler.alpha_imbalanced = 0.7;
    return std::nullopt;
  });
  sim.add_worker(1, 9500);  // holder, 95% KV used
  sim.add_worker(2, 500);
  sim.add_worker(3, 500);
  const auto shared = prompt(9, 8 * kBlock);
  sim.cache(1, shared);
  auto r = sim.routing.route(sim.request(with_suffix(shared, 0, 8 * kBlock)));
  REQUIRE(r.ok);
  CHECK(r.decision.alpha == doctest::Approx(0.7));
  CHECK(r.ranked.front().worker != WorkerId{1});
  CHECK_FALSE(r.chose_best_overlap);
  // The same prefix on an evenly loaded fleet stays with its holder.
  Sim even;
  for (uint64_t w = 1; w <= 3; ++w) even.add_worker(w, 5000);
  even.cache(1, shared);
  CHECK(even.routing.route(even.request(with_suffix(shared, 0, 8 * kBlock))).ranked.front().worker == WorkerId{1});
}

TEST_CASE("100 simultaneous same-prefix requests spread according to predicted load") {
  Sim sim;
  for (uint64_t w = 1; w <= 4; ++w) sim.add_worker(w, 1000);
  // Weight 0.5 (the default is 0.2, under which the holder keeps 82 of the
  // 100: its queue of 64-token suffixes stays cheaper than recomputing 576).
  sim.config.update([](Config& c) {
    c.scheduler.pending_prefill_weight = 0.5;
    return std::nullopt;
  });
  const auto shared = prompt(11, 32 * kBlock);  // 512 cached tokens on worker 1
  sim.cache(1, shared);
  // All 100 are dispatched before any load report or first byte comes back:
  // only the router's own in-flight accounting (predicted load) changes.
  std::map<uint64_t, int> per_worker;
  std::vector<std::unique_ptr<InflightGuard>> inflight;
  for (uint32_t i = 0; i < 100; ++i) {
    auto r = sim.routing.route(sim.request(with_suffix(shared, i, 64)));
    REQUIRE(r.ok);
    const auto& t = r.ranked.front();
    per_worker[t.worker.value]++;
    inflight.push_back(std::make_unique<InflightGuard>(sim.registry, t.worker, r.request_blocks, t.prefill_tokens));
  }
  // The holder gets the most (its prefill is cheapest) but not all: once its
  // pending prefill exceeds a full recompute elsewhere, others are cheaper.
  CHECK(per_worker[1] > 25);
  CHECK(per_worker[1] < 100);
  CHECK(per_worker.size() == 4);
  // Predicted prefill per worker ends up comparable: the spread follows load.
  uint64_t lo = ~0ull, hi = 0;
  for (const auto& w : sim.registry.candidates("m")) {
    lo = std::min(lo, w.pending_prefill_tokens);
    hi = std::max(hi, w.pending_prefill_tokens);
  }
  CHECK(hi - lo <= 2 * 576);  // within two uncached requests (the compared cost adds each one's new tokens)
  MESSAGE("distribution: w1=" << per_worker[1] << " w2=" << per_worker[2] << " w3=" << per_worker[3]
                              << " w4=" << per_worker[4]);

  // With the baseline weighted cost (no pending-prefill term) all 100 pile onto the holder.
  Sim base;
  for (uint64_t w = 1; w <= 4; ++w) base.add_worker(w, 1000);
  base.cache(1, shared);
  base.config.update([](Config& c) {
    c.scheduler.pending_prefill_weight = 0;
    c.scheduler.pending_prefill_excess = false;
    return std::nullopt;
  });
  std::vector<std::unique_ptr<InflightGuard>> inflight2;
  int to_holder = 0;
  for (uint32_t i = 0; i < 100; ++i) {
    auto r = base.routing.route(base.request(with_suffix(shared, i, 64)));
    to_holder += r.ranked.front().worker == WorkerId{1};
    inflight2.push_back(std::make_unique<InflightGuard>(base.registry, r.ranked.front().worker, r.request_blocks,
                                                        r.ranked.front().prefill_tokens));
  }
  CHECK(to_holder == 100);
}

TEST_CASE("busy thresholds exclude workers; none left is a 503 'workers_busy'") {
  Sim sim;
  sim.add_worker(1, 1000, 10000, 0, 256, 5);
  sim.add_worker(2, 9000);
  sim.add_worker(3, 1000);
  sim.config.update([](Config& c) {
    c.scheduler.busy_kv_usage = 0.8;
    c.scheduler.busy_waiting_requests = 4;
    return std::nullopt;
  });
  auto r = sim.routing.route(sim.request(prompt(1, 100)));
  REQUIRE(r.ok);
  CHECK(r.ranked.size() == 1);
  CHECK(r.ranked.front().worker == WorkerId{3});
  // Why each worker was left out: explain's full scoring (routing itself
  // reads only the ranked workers: scheduler/README.md, the fast path).
  r = sim.routing.route(sim.request(prompt(1, 100)), /*rank_all=*/true);
  REQUIRE(r.ok);
  CHECK(r.ranked.size() == 1);
  CHECK(r.decision.scores[0].excluded == Exclusion::TooManyWaiting);
  CHECK(r.decision.scores[1].excluded == Exclusion::NoFreeBlock);

  sim.registry.set_draining(WorkerId{3}, true);
  // Every worker left is busy: by default the request goes to the best busy
  // one (its engine queues it), never to the drained worker.
  r = sim.routing.route(sim.request(prompt(1, 100)));
  REQUIRE(r.ok);
  CHECK(r.all_busy);
  CHECK(r.ranked.size() == 2);
  for (const auto& t : r.ranked) CHECK(t.worker != WorkerId{3});
  // Rejecting is the operator's choice.
  sim.config.update([](Config& c) {
    c.scheduler.reject_when_busy = true;
    return std::nullopt;
  });
  r = sim.routing.route(sim.request(prompt(1, 100)));
  CHECK_FALSE(r.ok);
  CHECK(r.error.status == 503);
  CHECK(r.error.code == "workers_busy");
  // A heartbeat reporting less load brings worker 1 back.
  sim.add_worker(1, 1000, 10000, 0, 256, 0);
  r = sim.routing.route(sim.request(prompt(1, 100)));
  REQUIRE(r.ok);
  CHECK(r.ranked.front().worker == WorkerId{1});
}

TEST_CASE("every worker momentarily full: the request still goes to the best worker unless rejecting is asked for") {
  // Defaults: busy_kv_usage 1.0, busy_slot_usage 1.0, queue_size 0. Every
  // worker reports (or the router predicts) a full KV cache or a full batch.
  Sim sim;
  sim.add_worker(1, 10000, 10000);             // KV full
  sim.add_worker(2, 10000, 10000, 0, 256, 3);  // KV full, 3 waiting
  sim.add_worker(3, 5000, 10000, 256, 256);    // every slot taken
  const auto p = prompt(9, 160);
  sim.cache(2, p);  // worker 2 holds the prompt's prefix
  auto r = sim.routing.route(sim.request(with_suffix(p, 1, 20)), /*rank_all=*/true);
  REQUIRE(r.ok);
  CHECK(r.all_busy);
  CHECK(r.ranked.size() == 3);
  for (const auto& s : r.decision.scores) CHECK(s.excluded == Exclusion::None);
  // The fast path (no explain) decides the same way.
  const auto fast = sim.routing.route(sim.request(with_suffix(p, 1, 20)));
  REQUIRE(fast.ok);
  CHECK(fast.all_busy);
  CHECK(fast.ranked.front().worker == r.ranked.front().worker);

  // A prompt no worker's cache could ever hold is still refused (400), busy or not.
  auto huge = sim.routing.route(sim.request(prompt(3, 10001 * kBlock)));
  CHECK_FALSE(huge.ok);
  CHECK(huge.error.status == 400);

  // A drained worker stays out; all drained is a 503.
  sim.registry.set_draining(WorkerId{1}, true);
  sim.registry.set_draining(WorkerId{2}, true);
  r = sim.routing.route(sim.request(with_suffix(p, 2, 20)));
  REQUIRE(r.ok);
  CHECK(r.ranked.size() == 1);
  CHECK(r.ranked.front().worker == WorkerId{3});
  sim.registry.set_draining(WorkerId{3}, true);
  r = sim.routing.route(sim.request(with_suffix(p, 3, 20)));
  CHECK_FALSE(r.ok);
  CHECK(r.error.code == "workers_busy");
  for (uint64_t w = 1; w <= 3; ++w) sim.registry.set_draining(WorkerId{w}, false);

  // Opt-in shedding: 503 at once.
  sim.config.update([](Config& c) {
    c.scheduler.reject_when_busy = true;
    return std::nullopt;
  });
  r = sim.routing.route(sim.request(with_suffix(p, 4, 20)));
  CHECK_FALSE(r.ok);
  CHECK(r.error.status == 503);
  CHECK(r.error.code == "workers_busy");
  CHECK_FALSE(r.all_busy);
  // A router queue (queue_size > 0) keeps its own rule: the request waits
  // there (router/http/proxy.cpp) and is not placed on a busy worker.
  sim.config.update([](Config& c) {
    c.scheduler.reject_when_busy = false;
    c.scheduler.queue_size = 10;
    return std::nullopt;
  });
  r = sim.routing.route(sim.request(with_suffix(p, 5, 20)));
  CHECK_FALSE(r.ok);
  CHECK(r.error.code == "workers_busy");
}

TEST_CASE("a fleet with nearly every slot taken: the slot test passes over nobody") {
  // 64 + 61 + 62 of 3 x 64 slots taken (0.974); worker 1, every slot taken,
  // holds the prompt. At the default scheduler.busy_slot_fleet_usage 0.9 it
  // stays eligible and wins on its cache (its engine queues the request for a
  // slot); the others would recompute the whole prompt.
  Sim sim;
  sim.add_worker(1, 100, 10000, 64, 64);
  sim.add_worker(2, 100, 10000, 61, 64);
  sim.add_worker(3, 100, 10000, 62, 64);
  const auto p = prompt(11, 160);
  sim.cache(1, p);
  auto route = [&](uint32_t s, bool rank_all = false) { return sim.routing.route(sim.request(with_suffix(p, s, 20)), rank_all); };
  auto r = route(1, /*rank_all=*/true);
  REQUIRE(r.ok);
  CHECK(r.slots_full);
  CHECK_FALSE(r.all_busy);
  CHECK(r.ranked.front().worker == WorkerId{1});
  for (const auto& sc : r.decision.scores) CHECK(sc.excluded == Exclusion::None);
  CHECK(explain_text(r, sim.config.get()->scheduler, kBlock).choice.find("the slot test skips nobody") !=
        std::string::npos);
  auto fast = route(2);  // the fast path decides the same
  REQUIRE(fast.ok);
  CHECK(fast.slots_full);
  CHECK(fast.ranked.front().worker == WorkerId{1});

  auto set = [&](auto f) {
    sim.config.update([&](Config& c) {
      f(c.scheduler);
      return std::nullopt;
    });
  };
  auto passed_over = [&](uint32_t s) {
    for (bool rank_all : {true, false}) {
      const auto x = route(s, rank_all);
      REQUIRE(x.ok);
      CHECK_FALSE(x.slots_full);
      CHECK(x.ranked.front().worker != WorkerId{1});
    }
  };
  // 1 = never lifted; above the fleet's share: not lifted.
  set([](SchedulerConfig& c) { c.busy_slot_fleet_usage = 1; });
  passed_over(3);
  set([](SchedulerConfig& c) { c.busy_slot_fleet_usage = 0.98; });
  passed_over(4);
  // Lifted from 0.97 until the share falls 0.02 below it: 184 of 192 (0.958)
  // keeps it lifted, 181 (0.943) ends it.
  set([](SchedulerConfig& c) { c.busy_slot_fleet_usage = 0.97; });
  CHECK(route(5).slots_full);
  sim.add_worker(2, 100, 10000, 58, 64);
  CHECK(route(6).slots_full);
  CHECK(route(7, true).slots_full);
  sim.add_worker(2, 100, 10000, 55, 64);
  passed_over(8);
  sim.add_worker(2, 100, 10000, 61, 64);
  set([](SchedulerConfig& c) { c.busy_slot_fleet_usage = 0.95; });
  CHECK(route(9).slots_full);
  // A router queue or rejection: lifted too, and the fleet is busy once its
  // share reaches busy_slot_usage (1.0: every slot taken), not when one
  // worker is full. At 0.974 the full holder takes the request; at a
  // busy_slot_usage of 0.97 nobody does: it waits (or is refused), 503
  // workers_busy from the decision, whatever the path.
  for (const bool queue : {true, false}) {
    set([&](SchedulerConfig& c) {
      c.queue_size = queue ? 10 : 0;
      c.reject_when_busy = !queue;
    });
    for (bool rank_all : {true, false}) {
      const auto x = route(10, rank_all);
      REQUIRE(x.ok);
      CHECK(x.slots_full);
      CHECK_FALSE(x.all_busy);
      CHECK(x.ranked.front().worker == WorkerId{1});
    }
    set([](SchedulerConfig& c) { c.busy_slot_usage = 0.97; });
    for (bool rank_all : {true, false}) {
      const auto x = route(11, rank_all);
      CHECK_FALSE(x.ok);
      CHECK(x.slots_full);
      CHECK(x.error.status == 503);
      CHECK(x.error.code == "workers_busy");
      CHECK(explain_text(x, sim.config.get()->scheduler, kBlock).choice.find("request slots taken as a whole") !=
            std::string::npos);
    }
    // Without a queue or rejection the same threshold only lifts: the engine queues it.
    set([](SchedulerConfig& c) {
      c.queue_size = 0;
      c.reject_when_busy = false;
    });
    const auto served = route(11);
    REQUIRE(served.ok);
    CHECK(served.ranked.front().worker == WorkerId{1});
    set([](SchedulerConfig& c) { c.busy_slot_usage = 1.0; });
  }
  // Never lifted (1), a queue keeps the per-worker slot test: the full holder
  // is passed over while the others have room.
  set([](SchedulerConfig& c) {
    c.busy_slot_fleet_usage = 1;
    c.queue_size = 10;
  });
  passed_over(10);
  set([](SchedulerConfig& c) {
    c.busy_slot_fleet_usage = 0.95;
    c.queue_size = 0;
  });
  // A band's reserve is room kept for higher bands: never lifted for it. At
  // a 4 % reserve only worker 2 (61 of 64, under 0.96) may take it.
  auto banded = sim.request(with_suffix(p, 12, 20));
  banded.band_reserve = 0.04;
  for (bool rank_all : {true, false}) {
    const auto x = sim.routing.route(banded, rank_all);
    REQUIRE(x.ok);
    CHECK_FALSE(x.slots_full);
    CHECK_FALSE(x.all_busy);
    CHECK(x.ranked.front().worker == WorkerId{2});
  }
  CHECK(route(13).slots_full);
}

TEST_CASE("a disaggregated fleet with nearly every slot taken keeps its slot test") {
  // The same loads as above, with worker 3 a decode worker: the fleet's one
  // share would mix two pools, so nothing is lifted and the full worker 1 is
  // passed over.
  Sim sim;
  sim.add_worker(1, 100, 10000, 64, 64);
  sim.add_worker(2, 100, 10000, 61, 64);
  WorkerAnnouncement d;
  d.id = WorkerId{3};
  d.url = "http://127.0.0.1:10003";
  d.model = "m";
  d.block_size = kBlock;
  d.role = WorkerRole::Decode;
  d.load = WorkerLoad{62, 64, 0, 100, 10000};
  sim.registry.on_heartbeat(d);
  REQUIRE(sim.registry.has_pd_roles());
  const auto p = prompt(11, 160);
  sim.cache(1, p);
  for (bool rank_all : {true, false}) {
    const auto r = sim.routing.route(sim.request(with_suffix(p, rank_all ? 1 : 2, 20)), rank_all);
    REQUIRE(r.ok);
    CHECK_FALSE(r.slots_full);
    CHECK(r.ranked.front().worker != WorkerId{1});
  }
}

TEST_CASE("unknown model is 404, no worker at all is 503") {
  Sim sim;
  auto r = sim.routing.route(sim.request(prompt(1, 10)));
  CHECK(r.error.status == 503);
  sim.add_worker(1);
  ParsedRequest other = sim.request(prompt(1, 10));
  other.model = "nope";
  r = sim.routing.route(other);
  CHECK(r.error.status == 404);
  CHECK(r.error.code == "model_not_found");
}

namespace {

auto load_fields(const WorkerLoad& l) {
  return std::tuple(l.request_active_slots, l.request_total_slots, l.num_requests_waiting, l.kv_active_blocks,
                    l.kv_total_blocks);
}

// Every field of `reused` (routed into a RouteResult that held an earlier
// result) against `fresh` (a new one, from an identical Sim).
void check_same(const RouteResult& reused, const RouteResult& fresh) {
  CHECK(reused.ok == fresh.ok);
  CHECK(reused.error.status == fresh.error.status);
  CHECK(reused.error.message == fresh.error.message);
  CHECK(reused.error.type == fresh.error.type);
  CHECK(reused.error.param == fresh.error.param);
  CHECK(reused.error.code == fresh.error.code);
  REQUIRE(reused.ranked.size() == fresh.ranked.size());
  for (size_t i = 0; i < fresh.ranked.size(); ++i) {
    CHECK(reused.ranked[i].worker == fresh.ranked[i].worker);
    CHECK(reused.ranked[i].url == fresh.ranked[i].url);
    CHECK(reused.ranked[i].cached_tokens == fresh.ranked[i].cached_tokens);
    CHECK(reused.ranked[i].prefill_tokens == fresh.ranked[i].prefill_tokens);
  }
  CHECK(reused.isl_tokens == fresh.isl_tokens);
  CHECK(reused.tokenizer_fallback == fresh.tokenizer_fallback);
  CHECK(reused.request_blocks == fresh.request_blocks);
  CHECK(reused.block_hashes == fresh.block_hashes);
  // Timings differ from run to run; a stage that did not run reads 0 in both.
  for (size_t i = 0; i < fresh.stage_seconds.size(); ++i)
    if (fresh.stage_seconds[i] == 0) CHECK(reused.stage_seconds[i] == 0);
  CHECK(reused.chose_best_overlap == fresh.chose_best_overlap);
  REQUIRE(reused.workers.size() == fresh.workers.size());
  for (size_t i = 0; i < fresh.workers.size(); ++i) {
    const auto &a = reused.workers[i], &b = fresh.workers[i];
    CHECK(a.info->id == b.info->id);
    CHECK(a.info->url == b.info->url);
    CHECK(load_fields(a.predicted) == load_fields(b.predicted));
    CHECK(a.inflight_requests == b.inflight_requests);
    CHECK(a.inflight_blocks == b.inflight_blocks);
    CHECK(a.pending_prefill_tokens == b.pending_prefill_tokens);
    CHECK(a.draining == b.draining);
  }
  REQUIRE(reused.candidates.size() == fresh.candidates.size());
  for (size_t i = 0; i < fresh.candidates.size(); ++i) {
    const auto &a = reused.candidates[i], &b = fresh.candidates[i];
    CHECK(a.owner == b.owner);
    CHECK(load_fields(a.load) == load_fields(b.load));
    CHECK(a.overlap_blocks == b.overlap_blocks);
    CHECK(a.overlap_by_tier == b.overlap_by_tier);
    CHECK(a.pending_prefill_tokens == b.pending_prefill_tokens);
    CHECK(a.draining == b.draining);
  }
  check_same_decision(reused.decision, fresh.decision);
}

}  // namespace

TEST_CASE("a RouteResult routed into again reads exactly as a fresh one, failure or success") {
  // Two identical Sims (same seed): one answers with fresh results, the other
  // into one RouteResult, request after request.
  Sim fresh_sim, reused_sim;
  auto both = [&](auto&& f) {
    f(fresh_sim);
    f(reused_sim);
  };
  RouteResult out;
  auto step = [&](const ParsedRequest& r, bool rank_all = false) {
    const RouteResult fresh = fresh_sim.routing.route(r, rank_all);
    reused_sim.routing.route(r, out, rank_all);
    check_same(out, fresh);
  };
  const auto shared = prompt(5, 8 * kBlock);

  step(fresh_sim.request(shared));  // nobody at all
  CHECK(out.error.code == "no_worker");
  both([&](Sim& s) {
    for (uint64_t w = 1; w <= 3; ++w) s.add_worker(w, 1000 * w);
    s.cache(2, shared);
  });
  step(fresh_sim.request(with_suffix(shared, 1, 40)), /*rank_all=*/true);
  REQUIRE(out.ok);
  CHECK(out.ranked.size() == 3);
  CHECK(out.ranked.front().worker == WorkerId{2});

  ParsedRequest unknown = fresh_sim.request(shared);
  unknown.model = "nope";
  step(unknown);
  CHECK(out.error.code == "model_not_found");

  ParsedRequest text;  // shorter than a block: no hashes; the placeholder tokenizes it
  text.model = "m";
  text.prompt_text = "a short prompt";
  step(text);
  REQUIRE(out.ok);
  CHECK(out.block_hashes.empty());
  CHECK(out.tokenizer_fallback == TokenizerFallback::NoTokenizer);

  both([](Sim& s) {
    for (uint64_t w = 1; w <= 3; ++w) s.registry.set_draining(WorkerId{w}, true);
  });
  step(fresh_sim.request(with_suffix(shared, 2, 40)), /*rank_all=*/true);
  CHECK(out.error.code == "workers_busy");
  CHECK(out.candidates.size() == 3);

  both([](Sim& s) { s.registry.set_draining(WorkerId{3}, false); });
  ParsedRequest chat;
  chat.kind = ApiKind::ChatCompletions;
  chat.model = "m";
  chat.messages = {{"system", "be brief"}, {"user", std::string(200, 'x')}};
  step(chat);
  REQUIRE(out.ok);
  CHECK(out.ranked.size() == 1);

  step(fresh_sim.request(with_suffix(shared, 3, 40)));
  REQUIRE(out.ok);

  // route_blocks resets its result the same way.
  RouteResult fresh;
  fresh_sim.routing.route_blocks("nope", 10, {}, false, fresh);
  reused_sim.routing.route_blocks("nope", 10, {}, false, out);
  check_same(out, fresh);
  CHECK(out.error.code == "model_not_found");
}

TEST_CASE("reroute: a queued request decides again from its kept hashes, as a fresh route would") {
  Sim sim;
  sim.add_worker(1);
  sim.add_worker(2);
  const auto p = prompt(7, 160);
  sim.cache(2, p);
  sim.registry.set_draining(WorkerId{1}, true);
  sim.registry.set_draining(WorkerId{2}, true);
  RouteResult r;
  sim.routing.route(sim.request(with_suffix(p, 1, 20)), r);
  REQUIRE_FALSE(r.ok);
  CHECK(r.error.code == "workers_busy");
  const auto hashes = r.block_hashes;
  const auto isl = r.isl_tokens;
  REQUIRE(hashes.size() == 11);
  // A worker frees up: the decision is redone from the same hashes.
  sim.registry.set_draining(WorkerId{2}, false);
  sim.routing.reroute("m", r);
  REQUIRE(r.ok);
  CHECK(r.block_hashes == hashes);
  CHECK(r.isl_tokens == isl);
  CHECK(r.ranked.front().worker == WorkerId{2});
  RouteResult fresh;
  sim.routing.route(sim.request(with_suffix(p, 1, 20)), fresh);
  CHECK(fresh.ranked.front().worker == r.ranked.front().worker);
  CHECK(fresh.ranked.front().cached_tokens == r.ranked.front().cached_tokens);
  CHECK(r.ranked.front().cached_tokens == 160);
}

TEST_CASE("a route failure is typed, and the client's error is derived from the type") {
  Sim sim;
  RouteResult r;
  sim.routing.route(sim.request(prompt(1, 40)), r);
  CHECK(r.failure == RouteError::NoWorker);
  CHECK(r.error.status == 503);
  CHECK(r.error.code == "no_worker");
  CHECK_FALSE(may_queue(r.failure));

  sim.add_worker(1, 0, 5);  // a KV cache of 5 blocks
  sim.add_worker(2, 0, 5);
  sim.routing.route(sim.request(prompt(1, 200)), r);  // 13 blocks
  CHECK(r.failure == RouteError::PromptExceedsKv);
  CHECK(r.error.status == 400);
  CHECK(r.error.code == "context_length_exceeded");
  CHECK(r.error.message.find("needs 13 KV blocks (200 tokens)") != std::string::npos);
  CHECK(r.error.message.find("holds 5 blocks") != std::string::npos);

  ParsedRequest other = sim.request(prompt(1, 40));
  other.model = "nope";
  sim.routing.route(other, r);
  CHECK(r.failure == RouteError::ModelNotFound);
  CHECK(r.error.status == 404);
  CHECK(r.error.message == "The model `nope` does not exist.");

  sim.registry.set_draining(WorkerId{1}, true);
  sim.registry.set_draining(WorkerId{2}, true);
  sim.routing.route(sim.request(prompt(1, 40)), r);
  CHECK(r.failure == RouteError::WorkersDrained);
  CHECK(may_queue(r.failure));
  CHECK(r.error.code == "workers_busy");
  CHECK(r.error.message.find("Every worker serving `m` is drained by an operator") == 0);

  sim.registry.set_draining(WorkerId{2}, false);
  sim.add_worker(2, 4, 5);  // KV full
  sim.config.update([](Config& c) {
    c.scheduler.busy_kv_usage = 0.5;
    c.scheduler.reject_when_busy = true;  // else a busy fleet is still served
    return std::nullopt;
  });
  sim.routing.route(sim.request(prompt(1, 40)), r);
  CHECK(r.failure == RouteError::WorkersBusy);
  CHECK(may_queue(r.failure));
  CHECK(r.error.code == "workers_busy");
  CHECK(r.error.message == "Every worker is at capacity; retry later.");

  // What the wait queue sets: the same status and code, its own message.
  r.fail(RouteError::QueueTimeout, RouteErrorDetail{.model = "m", .queue_timeout_ms = 250});
  CHECK_FALSE(r.ok);
  CHECK_FALSE(may_queue(r.failure));
  CHECK(r.error.status == 503);
  CHECK(r.error.code == "workers_busy");
  CHECK(r.error.message == "No worker became free within 250 ms; retry later.");
  r.fail(RouteError::QueueFull, RouteErrorDetail{});
  CHECK(r.error.message == "Every worker is busy and the wait queue is full; retry later.");
  CHECK(r.error.code == "workers_busy");
}

TEST_CASE("a band's reserve: a lower band leaves room on every worker for higher bands; reroute keeps it") {
  Sim sim;
  // Worker 1 has 3 of 4 slots busy and the prompt cached; worker 2 has 2 of 4 busy.
  sim.add_worker(1, 0, 10000, 3, 4);
  sim.add_worker(2, 0, 10000, 2, 4);
  sim.cache(1, prompt(1, 100));
  sim.config.update([](Config& c) {
    c.scheduler.reject_when_busy = true;
    c.scheduler.queue_size = 8;
    return std::nullopt;
  });
  ParsedRequest high = sim.request(prompt(1, 100));
  ParsedRequest normal = sim.request(prompt(1, 100));
  normal.band_reserve = 0.25;  // may use at most 3 of 4 slots
  for (bool fast : {true, false}) {
    CAPTURE(fast);
    // Both workers have room for the high band: the cached one wins.
    RouteResult r;
    sim.routing.route(high, r, /*rank_all=*/!fast);
    REQUIRE(r.ok);
    CHECK(r.ranked.front().worker == WorkerId{1});
    // The normal band may not take worker 1's last slot: worker 2, though uncached.
    sim.routing.route(normal, r, /*rank_all=*/!fast);
    REQUIRE(r.ok);
    CHECK(r.ranked.size() == 1);
    CHECK(r.ranked.front().worker == WorkerId{2});
    CHECK(r.band_reserve == 0.25);
  }
  // Worker 2 at 3 of 4 too: every worker is busy for the normal band (it would
  // queue), not for the high band.
  sim.add_worker(2, 0, 10000, 3, 4);
  RouteResult r;
  sim.routing.route(normal, r);
  CHECK_FALSE(r.ok);
  CHECK(r.failure == RouteError::WorkersBusy);
  // A queued request's trial (reroute) applies its band's reserve too.
  sim.routing.reroute("m", r);
  CHECK_FALSE(r.ok);
  CHECK(r.band_reserve == 0.25);
  RouteResult h;
  sim.routing.route(high, h);
  REQUIRE(h.ok);
  // A slot frees on worker 2: the queued normal request's trial takes it.
  sim.add_worker(2, 0, 10000, 2, 4);
  sim.routing.reroute("m", r);
  REQUIRE(r.ok);
  CHECK(r.ranked.front().worker == WorkerId{2});
  // KV usage is kept the same way.
  sim.add_worker(1, 7000, 10000, 0, 4);
  sim.add_worker(2, 8000, 10000, 0, 4);
  sim.routing.route(normal, r);
  REQUIRE(r.ok);
  CHECK(r.ranked.size() == 1);
  CHECK(r.ranked.front().worker == WorkerId{1});
}
