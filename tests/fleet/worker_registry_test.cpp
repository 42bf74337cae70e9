#include "fleet/worker_registry.h"

#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <thread>
#include <vector>

using namespace kvroute;
using namespace std::chrono_literals;

namespace {
WorkerAnnouncement ann(uint64_t id, std::string model = "m", uint32_t active = 0) {
  WorkerAnnouncement a;
  a.id = WorkerId{id};
  a.url = "http://127.0.0.1:" + std::to_string(9000 + id);
  a.model = std::move(model);
  a.load.request_active_slots = active;
  a.load.request_total_slots = 10;
  a.load.kv_total_blocks = 100;
  return a;
}
}  // namespace

TEST_CASE("heartbeats register workers; silent ones expire after the ttl") {
  ManualClock clock;
  WorkerRegistry r(clock);
  CHECK(r.on_heartbeat(ann(1)));
  CHECK_FALSE(r.on_heartbeat(ann(1)));
  clock.advance(1s);
  r.on_heartbeat(ann(2, "other"));
  CHECK(r.candidates("m").size() == 1);
  CHECK(r.candidates("").size() == 2);
  CHECK(r.models() == std::vector<std::string>{"m", "other"});

  clock.advance(1500ms);  // worker 1 silent 2.5 s, worker 2 1.5 s
  auto dead = r.expire(2s);
  REQUIRE(dead.size() == 1);
  CHECK(dead[0] == WorkerId{1});
  CHECK(r.candidates("m").empty());
}

WorkerAnnouncement router_known(uint64_t id, WorkerSource src = WorkerSource::Static) {
  WorkerAnnouncement a = ann(id);
  a.source = src;
  a.metrics_url = a.url + "/metrics";
  return a;
}

TEST_CASE("router-known workers never expire on heartbeat silence; heartbeats only add load") {
  ManualClock clock;
  WorkerRegistry r(clock);
  CHECK(r.upsert(router_known(1)));
  CHECK_FALSE(r.upsert(router_known(1)));
  r.on_heartbeat(ann(2));
  clock.advance(10s);
  CHECK(r.expire(2s) == std::vector<WorkerId>{WorkerId{2}});  // only the heartbeat-only worker
  REQUIRE(r.candidates("m").size() == 1);
  // A heartbeat for a static worker refreshes its load, never its source or URL.
  auto hb = ann(1, "m", 7);
  hb.url = "http://10.9.9.9:1";
  r.on_heartbeat(hb);
  auto v = r.candidates("m").at(0);
  CHECK(v.info->source == WorkerSource::Static);
  CHECK(v.info->url == "http://127.0.0.1:9001");
  CHECK(v.info->load.request_active_slots == 7);
}

TEST_CASE("has_pd_roles: set while any worker has role prefill or decode, from every source") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.upsert(router_known(1));
  CHECK_FALSE(r.has_pd_roles());
  auto p = router_known(2);
  p.role = WorkerRole::Prefill;
  r.upsert(p);
  CHECK(r.has_pd_roles());
  r.remove(WorkerId{2});
  CHECK_FALSE(r.has_pd_roles());
  // A heartbeat-only worker's role, and a later heartbeat changing it.
  auto hb = ann(3);
  hb.role = WorkerRole::Decode;
  r.on_heartbeat(hb);
  CHECK(r.has_pd_roles());
  hb.role = WorkerRole::Both;
  r.on_heartbeat(hb);
  CHECK_FALSE(r.has_pd_roles());
  hb.role = WorkerRole::Decode;
  r.on_heartbeat(hb);
  clock.advance(10s);
  r.expire(2s);
  CHECK_FALSE(r.has_pd_roles());
}

TEST_CASE("a refused connection takes a worker out at once; the next answer brings it back") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.upsert(router_known(1));
  r.upsert(router_known(2));
  r.report_failure(WorkerId{1}, HealthSignal::ConnectRefused);
  REQUIRE(r.candidates("m").size() == 1);
  CHECK(r.candidates("m")[0].info->id == WorkerId{2});
  CHECK(r.all()[0].health == HealthState::Down);
  WorkerLoad l;
  l.request_total_slots = 10;
  l.request_active_slots = 3;
  r.on_load_report(WorkerId{1}, l);  // a scrape answered
  CHECK(r.candidates("m").size() == 2);
  CHECK(r.all()[0].info->load.request_active_slots == 3);
  CHECK(r.failure_counts()[static_cast<size_t>(HealthSignal::ConnectRefused)] == 1);
}

TEST_CASE("failed scrapes take a worker out after N in a row; a success in between resets the run") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.set_health_policy(HealthPolicy{3, 1000, 8000});
  r.upsert(router_known(1));
  r.report_failure(WorkerId{1}, HealthSignal::ScrapeFailed);
  r.report_failure(WorkerId{1}, HealthSignal::ScrapeFailed);
  r.report_success(WorkerId{1});
  r.report_failure(WorkerId{1}, HealthSignal::ScrapeFailed);
  r.report_failure(WorkerId{1}, HealthSignal::ScrapeFailed);
  CHECK(r.candidates("m").size() == 1);
  r.report_failure(WorkerId{1}, HealthSignal::ScrapeFailed);
  CHECK(r.candidates("m").empty());
  r.report_success(WorkerId{1});
  CHECK(r.candidates("m").size() == 1);
}

TEST_CASE("outlier ejection: a worker that answers scrapes but times out requests stays out for the backoff") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.set_health_policy(HealthPolicy{2, 1000, 3000});
  r.upsert(router_known(1));
  auto eject = [&] {
    r.report_failure(WorkerId{1}, HealthSignal::FirstByteTimeout);
    r.report_failure(WorkerId{1}, HealthSignal::ServerError);
  };
  eject();
  CHECK(r.all()[0].health == HealthState::Ejected);
  r.on_load_report(WorkerId{1}, WorkerLoad{});  // scrapes do not end an outlier ejection
  CHECK(r.candidates("m").empty());
  clock.advance(999ms);
  CHECK(r.candidates("m").empty());
  clock.advance(2ms);
  CHECK(r.candidates("m").size() == 1);  // back after 1 s
  eject();                               // again, without a success in between: 2 s
  clock.advance(1500ms);
  CHECK(r.candidates("m").empty());
  clock.advance(600ms);
  CHECK(r.candidates("m").size() == 1);
  eject();  // third in a row: capped at 3 s
  clock.advance(3001ms);
  CHECK(r.candidates("m").size() == 1);
  r.report_success(WorkerId{1});  // answered: the run of ejections is over
  eject();
  clock.advance(1001ms);
  CHECK(r.candidates("m").size() == 1);
}

TEST_CASE("a 4xx is not a health signal: only the listed failures count") {
  // The proxy reports only HealthSignal values; a client's 4xx has none. Here:
  // many successes never eject, and failures of another worker do not leak.
  ManualClock clock;
  WorkerRegistry r(clock);
  r.upsert(router_known(1));
  r.upsert(router_known(2));
  for (int i = 0; i < 10; ++i) r.report_success(WorkerId{1});
  for (int i = 0; i < 10; ++i) r.report_failure(WorkerId{2}, HealthSignal::ServerError);
  auto c = r.candidates("m");
  REQUIRE(c.size() == 1);
  CHECK(c[0].info->id == WorkerId{1});
}

TEST_CASE("a LoRA adapter routes to the workers that serve it") {
  ManualClock clock;
  WorkerRegistry r(clock);
  auto a = router_known(1);
  a.lora_adapters = {"sql-lora"};
  r.upsert(a);
  r.upsert(router_known(2));
  CHECK(r.candidates("sql-lora").size() == 1);
  CHECK(r.candidates("m").size() == 2);
  CHECK(r.models() == std::vector<std::string>{"m", "sql-lora"});
}

TEST_CASE("in-flight requests raise predicted load until released") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 1));
  {
    InflightGuard a(r, WorkerId{1}, 7, 100);
    InflightGuard b(r, WorkerId{1}, 3, 40);
    auto v = r.candidates("m").at(0);
    CHECK(v.inflight_requests == 2);
    CHECK(v.predicted.request_active_slots == 2);  // max(reported 1, own 2)
    CHECK(v.predicted.kv_active_blocks == 10);
    CHECK(v.pending_prefill_tokens == 140);
    a.first_byte();  // prefill of `a` is over; its blocks stay
    v = r.candidates("m").at(0);
    CHECK(v.pending_prefill_tokens == 40);
    CHECK(v.predicted.kv_active_blocks == 10);
  }
  auto v = r.candidates("m").at(0);
  CHECK(v.inflight_requests == 0);
  CHECK(v.predicted.request_active_slots == 1);
  CHECK(v.predicted.kv_active_blocks == 0);
  CHECK(v.pending_prefill_tokens == 0);
  // Releasing after the worker expired is harmless.
  InflightGuard g(r, WorkerId{1}, 4, 4);
  clock.advance(10s);
  r.expire(1s);
  g.release();
  CHECK(r.size() == 0);
}

TEST_CASE("slot waits: a worker with every request slot taken adds the wait for one to its queue") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 10));  // all 10 of its slots taken
  r.on_heartbeat(ann(2, "m", 9));
  auto wait_of = [&](uint64_t id) {
    for (const auto& v : r.candidates("m"))
      if (v.info->id == WorkerId{id}) return v.slot_wait_tokens;
    FAIL("no worker " << id);
    return uint64_t{0};
  };
  CHECK(wait_of(1) == 0);  // not set (KnownWorkers sets the config's): off
  r.set_slot_wait_tokens(3000);
  CHECK(wait_of(1) == 3000);  // the next request waits for one running request to finish
  CHECK(wait_of(2) == 0);     // a slot is free
  std::vector<std::unique_ptr<InflightGuard>> sent;
  for (int i = 0; i < 12; ++i) sent.push_back(std::make_unique<InflightGuard>(r, WorkerId{1}, 1, 100));
  CHECK(wait_of(1) == 3 * 3000);  // predicted 12 of 10: two wait for a slot, the next is the third
  // The fast path's ranking prices the same queue (CandidateState::slot_wait_tokens).
  SchedulerConfig cfg = without_slot_limit(SchedulerConfig{});  // the slot test lifted: full workers ranked
  SeededRandom rnd(1);
  RankedDecision out;
  std::vector<WorkerView> views;
  REQUIRE(r.decide("m", MatchLayers{}, 1000, 16, cfg, rnd, 2, out, views));
  REQUIRE(out.ranked.size() == 2);
  CHECK(out.ranked[0].worker == WorkerId{2});
  CHECK(out.ranked[1].state.slot_wait_tokens == 3 * 3000);
  CHECK(out.ranked[1].state.pending_prefill_tokens == 12 * 100);  // the prefill queue apart
  sent.clear();
  CHECK(wait_of(1) == 3000);  // back to the reported load
  r.on_load_report(WorkerId{1}, ann(1, "m", 9).load);
  CHECK(wait_of(1) == 0);
  r.set_slot_wait_tokens(0);
  r.on_load_report(WorkerId{1}, ann(1, "m", 10).load);
  CHECK(wait_of(1) == 0);  // off
}

TEST_CASE("parked KV: answered prompts count until they fade or a request takes them up again") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1));
  r.on_heartbeat(ann(2));
  auto parked = [&](uint64_t id) {
    for (const auto& v : r.candidates("m"))
      if (v.info->id == WorkerId{id}) return v.parked_blocks;
    FAIL("no worker " << id);
    return -1.0;
  };
  {
    InflightGuard a(r, WorkerId{1}, 40, 640);
    a.first_byte();
  }
  CHECK(parked(1) == 0);  // no time constant set (KnownWorkers sets the config's): nothing kept
  r.set_parked_kv_seconds(10);
  {
    InflightGuard a(r, WorkerId{1}, 40, 640);
    InflightGuard never(r, WorkerId{2}, 30, 480);  // no first byte: its prompt may not be cached
    a.first_byte();
    CHECK(parked(1) == 0);  // in flight: counted as in-flight KV, not parked
  }
  CHECK(parked(1) == doctest::Approx(40));
  CHECK(parked(2) == 0);
  clock.advance(10s);
  CHECK(parked(1) == doctest::Approx(40));  // faded at the worker's next change or report, as the rankings see it
  r.on_load_report(WorkerId{1}, ann(1).load);
  CHECK(parked(1) == doctest::Approx(40 * std::exp(-1.0)));  // one time constant later
  // A request routed there with 12 of its blocks cached takes them back: in flight again.
  const double before = parked(1);
  {
    InflightGuard next(r, WorkerId{1}, 20, 128, 0, {}, 12);
    CHECK(parked(1) == doctest::Approx(before - 12));
    CHECK(r.candidates("m").at(0).predicted.kv_active_blocks == 20);  // the active KV is apart
    next.first_byte();
  }
  CHECK(parked(1) == doctest::Approx(before - 12 + 20));
  // The scheduler prices it in the KV load term (kv_active + parked) / total.
  auto v = r.candidates("m").at(0);
  Candidate c;
  c.load = v.predicted;
  c.parked_blocks = v.parked_blocks;
  CHECK(kv_load_ratio(c.load, c.parked_blocks) == doctest::Approx((before + 8) / 100));
  clock.advance(1000s);
  r.on_load_report(WorkerId{1}, ann(1).load);
  CHECK(parked(1) == 0);  // faded to nothing (under half a block reads 0)
  {
    InflightGuard a(r, WorkerId{2}, 10, 160);
    a.first_byte();
  }
  CHECK(parked(2) == doctest::Approx(10));
  {
    // A response sent whole (its first byte after the generation): parked,
    // but not a TTFT sample.
    const uint64_t samples = r.ttft_stats().samples;
    InflightGuard whole(r, WorkerId{2}, 6, 96);
    whole.answered();
    CHECK(r.ttft_stats().samples == samples);
  }
  CHECK(parked(2) == doctest::Approx(16));
  {
    InflightGuard big(r, WorkerId{2}, 250, 4000);  // more than the worker's 100 blocks
    big.first_byte();
  }
  CHECK(parked(2) == doctest::Approx(100));  // at most its capacity: LRU evicted the rest
  r.set_parked_kv_seconds(0);  // off: cleared
  CHECK(parked(2) == 0);
  r.set_parked_kv_seconds(10);
  CHECK(parked(2) == 0);  // not brought back
}

TEST_CASE("parked KV: other replicas' adds to this router's, fades with it, and is bounded by the worker's KV") {
  using namespace std::chrono_literals;
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1));  // 100 KV blocks
  auto view = [&] { return r.candidates("m").at(0); };
  r.set_remote_inflight(WorkerId{1}, 0, 0, 0, 30);
  CHECK(view().parked_blocks == 0);  // the parked KV off: a peer's figure is not taken
  r.set_parked_kv_seconds(10);
  r.set_remote_inflight(WorkerId{1}, 0, 0, 0, 30);
  {
    InflightGuard a(r, WorkerId{1}, 20, 320);
    a.first_byte();
  }
  CHECK(view().parked_blocks == doctest::Approx(50));
  CHECK(view().remote_parked_blocks == doctest::Approx(30));
  clock.advance(10s);
  r.on_load_report(WorkerId{1}, ann(1).load);
  CHECK(view().parked_blocks == doctest::Approx(50 * std::exp(-1.0)));  // both fade
  CHECK(view().remote_parked_blocks == doctest::Approx(30 * std::exp(-1.0)));
  // A request resuming 15 cached blocks takes them from this router's figure first.
  const double own = view().parked_blocks - view().remote_parked_blocks;  // 20/e = 7.36
  {
    InflightGuard next(r, WorkerId{1}, 15, 240, 0, {}, 15);
    CHECK(view().parked_blocks == doctest::Approx(50 * std::exp(-1.0) - 15));
    CHECK(view().remote_parked_blocks == doctest::Approx(30 * std::exp(-1.0) - (15 - own)));
  }
  // The next snapshot replaces the peers' figure; what a peer claims is capped
  // at what the worker can hold beside this router's own.
  r.set_remote_inflight(WorkerId{1}, 0, 0, 0, 1e12);
  CHECK(view().parked_blocks == doctest::Approx(100));
  r.set_remote_inflight(WorkerId{1}, 0, 0, 0, -5);
  CHECK(view().remote_parked_blocks == 0);
  r.set_remote_inflight(WorkerId{1}, 0, 0, 0, 12);
  r.set_parked_kv_seconds(0);  // off: both cleared
  CHECK(view().parked_blocks == 0);
  CHECK(view().remote_parked_blocks == 0);
}

TEST_CASE("in-flight KV counts a cached prefix that the worker's in-flight requests share once") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 0));
  {
    // Three turns on one 60-block context the worker holds, each with 4 new
    // blocks: 3 x 4 own blocks + the 60-block prefix once, not 3 x 64.
    InflightGuard a(r, WorkerId{1}, 64, 2048, 60);
    InflightGuard b(r, WorkerId{1}, 64, 2048, 60);
    InflightGuard c(r, WorkerId{1}, 64, 2048, 60);
    CHECK(r.candidates("m").at(0).inflight_blocks == 72);
    CHECK(r.candidates("m").at(0).predicted.kv_active_blocks == 72);
    // A request on another, shorter prefix: its own blocks only (a lower
    // bound: prefixes that differ are left to the worker's report).
    InflightGuard d(r, WorkerId{1}, 30, 5120, 20);
    CHECK(r.candidates("m").at(0).inflight_blocks == 82);
    // The largest prefix leaves with the last request that holds it.
    a.release();
    b.release();
    CHECK(r.candidates("m").at(0).inflight_blocks == 74);
    c.release();
    CHECK(r.candidates("m").at(0).inflight_blocks == 30);
    // More cached than the request's blocks counts as all of them.
    InflightGuard e(r, WorkerId{1}, 5, 0, 9);
    CHECK(r.candidates("m").at(0).inflight_blocks == 30);
  }
  CHECK(r.candidates("m").at(0).inflight_blocks == 0);
}

namespace {
// A prompt of `n` complete blocks: `shared` of them common to every prompt
// of this test, the rest its own (`tag`).
std::vector<LocalBlockHash> blocks_of(uint64_t tag, size_t shared, size_t n) {
  std::vector<LocalBlockHash> b;
  for (size_t i = 0; i < n; ++i) b.push_back(LocalBlockHash{i < shared ? 1000 + i : tag * 100000 + i});
  return b;
}
uint64_t inflight_blocks(WorkerRegistry& r) { return r.candidates("m").at(0).inflight_blocks; }
}  // namespace

TEST_CASE("in-flight KV counts each distinct block of the in-flight prompts once") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 0));  // 100 blocks of KV
  {
    // Two sessions on one 20-block system prompt with 30-block contexts of
    // their own, one with a second turn in flight: 20 + 30 + 30, plus each
    // request's partial last block.
    const auto s1 = blocks_of(1, 20, 50), s2 = blocks_of(2, 20, 50);
    InflightGuard a(r, WorkerId{1}, 51, 0, 0, s1);
    InflightGuard b(r, WorkerId{1}, 51, 0, 0, s1);
    InflightGuard c(r, WorkerId{1}, 51, 0, 0, s2);
    CHECK(inflight_blocks(r) == 20 + 30 + 30 + 3);
    // The prefix-once lower bound would have left out one context: 3 + 50 + 20.
    a.release();
    CHECK(inflight_blocks(r) == 20 + 30 + 30 + 2);  // `b` still holds the context
    b.release();
    CHECK(inflight_blocks(r) == 50 + 1);
    // A block equal to one of another prompt but after another prefix is another block.
    std::vector<LocalBlockHash> other(s2.rbegin(), s2.rend());
    InflightGuard d(r, WorkerId{1}, 50, 0, 0, other);
    CHECK(inflight_blocks(r) == 50 + 1 + 50);
  }
  CHECK(inflight_blocks(r) == 0);
}

namespace {
// A prompt of `n` complete blocks: `doc_blocks` of document `doc`, then a
// question of its own (`question`).
std::vector<LocalBlockHash> on_doc(uint64_t doc, size_t doc_blocks, uint64_t question, size_t n) {
  std::vector<LocalBlockHash> b;
  for (size_t i = 0; i < n; ++i) b.push_back(LocalBlockHash{i < doc_blocks ? doc * 1000 + i : question * 100000 + i});
  return b;
}
}  // namespace

TEST_CASE("in-flight prefix: each worker's longest prefix of a prompt that its in-flight prompts hold") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1));
  r.on_heartbeat(ann(2));
  auto multi = ann(3);
  multi.dp_size = 2;  // which rank computes a prefix is its engine's choice
  r.on_heartbeat(multi);
  r.on_heartbeat(ann(4, "other"));
  const auto chain = inflight_chain(on_doc(1, 20, 1, 30));  // a 20-block document and a 10-block question
  std::vector<OwnerOverlap> out;
  const auto idle = r.inflight_overlaps("m", chain, 0, SchedulerConfig{}, out);
  CHECK(idle.load_mean == doctest::Approx(0));
  CHECK(idle.workers == 3);  // model m's: 1, 2 and 3
  CHECK(out.empty());  // nothing in flight
  {
    InflightGuard on1(r, WorkerId{1}, 25, 0, 0, on_doc(1, 20, 2, 25));   // the document, another question
    InflightGuard on1b(r, WorkerId{1}, 40, 0, 0, on_doc(1, 12, 3, 40));  // 12 blocks of it only
    InflightGuard on2(r, WorkerId{2}, 30, 0, 0, on_doc(2, 20, 1, 30));   // another document
    InflightGuard on3(r, WorkerId{3}, 30, 0, 0, on_doc(1, 20, 1, 30));
    InflightGuard on4(r, WorkerId{4}, 30, 0, 0, on_doc(1, 20, 1, 30));
    // Model m's workers' mean KV load, each of 100 blocks: 1 holds 25 + 28 distinct, 2 and 3 30 each.
    CHECK(r.inflight_overlaps("m", chain, 0, SchedulerConfig{}, out).load_mean ==
          doctest::Approx((53.0 + 30 + 30) / 300));
    REQUIRE(out.size() == 1);
    CHECK(out[0].owner == CacheOwner{WorkerId{1}, 0});
    CHECK(out[0].blocks == 20);  // the longer in-flight prefix counts
    // Every length of a prompt: exactly the part in flight.
    for (size_t n : {1, 5, 12, 19, 20, 21, 30}) {
      out.clear();
      r.inflight_overlaps("m", std::span(chain).first(n), 0, SchedulerConfig{}, out);
      REQUIRE(out.size() == 1);
      CHECK(out[0].blocks == std::min<size_t>(n, 20));
    }
    // Only what goes beyond the longest prefix cached anywhere (the index's): 20 past 12, none past 20.
    out.clear();
    r.inflight_overlaps("m", chain, 12, SchedulerConfig{}, out);
    REQUIRE(out.size() == 1);
    CHECK(out[0].blocks == 20);
    out.clear();
    r.inflight_overlaps("m", chain, 20, SchedulerConfig{}, out);
    CHECK(out.empty());
    on1.release();
    out.clear();
    r.inflight_overlaps("m", chain, 0, SchedulerConfig{}, out);
    REQUIRE(out.size() == 1);
    CHECK(out[0].blocks == 12);  // the other request's part is still in flight
    out.clear();
    r.inflight_overlaps("m", chain, 12, SchedulerConfig{}, out);
    CHECK(out.empty());
    r.report_failure(WorkerId{1}, HealthSignal::ConnectRefused);  // down: no overlap there
    out.clear();
    r.inflight_overlaps("m", chain, 0, SchedulerConfig{}, out);
    CHECK(out.empty());
  }
  out.clear();
  r.inflight_overlaps("m", chain, 0, SchedulerConfig{}, out);
  CHECK(out.empty());
}

TEST_CASE("parked KV: a prefix that requests in flight together share parks once, when the last of them ends") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1));  // 100 blocks
  r.set_parked_kv_seconds(10);
  auto parked = [&] { return r.candidates("m").at(0).parked_blocks; };
  // A burst: five questions of 5 blocks each over one 20-block document.
  std::vector<std::unique_ptr<InflightGuard>> burst;
  for (uint64_t q = 1; q <= 5; ++q) {
    burst.push_back(std::make_unique<InflightGuard>(r, WorkerId{1}, 25, 400, 0, on_doc(1, 20, q, 25)));
    burst.back()->first_byte();
  }
  CHECK(inflight_blocks(r) == 20 + 5 * 5);
  burst[0]->release();
  CHECK(parked() == doctest::Approx(5));  // its question; the others still hold the document
  for (size_t k = 1; k < 4; ++k) burst[k]->release();
  CHECK(parked() == doctest::Approx(4 * 5));
  burst[4]->release();
  // What the engine keeps: the document once and the five questions (not 5 x 25).
  CHECK(parked() == doctest::Approx(20 + 5 * 5));
  {
    // The document's next reader takes its 20 blocks back; a reader beside
    // it takes none (they are in flight, not parked). Both park their
    // questions, and the document once more when the last of them ends.
    InflightGuard next(r, WorkerId{1}, 25, 80, 0, on_doc(1, 20, 6, 25), 20);
    CHECK(parked() == doctest::Approx(5 * 5));
    InflightGuard beside(r, WorkerId{1}, 25, 80, 0, on_doc(1, 20, 7, 25), 20);
    CHECK(parked() == doctest::Approx(5 * 5));
    next.first_byte();
    beside.first_byte();
    next.release();
    CHECK(parked() == doctest::Approx(6 * 5));
  }
  CHECK(parked() == doctest::Approx(20 + 7 * 5));
  {
    // A prompt counted whole (no chain: the in-flight table past its bound,
    // or a client that sends no prompt blocks) parks its own blocks.
    InflightGuard whole(r, WorkerId{1}, 10, 160);
    whole.first_byte();
  }
  CHECK(parked() == doctest::Approx(20 + 7 * 5 + 10));
}

TEST_CASE("one worker's distinct in-flight blocks are bounded by its KV capacity; past it a prompt counts whole") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 0));  // 100 blocks: at most 200 distinct keys
  std::vector<std::unique_ptr<InflightGuard>> g;
  for (uint64_t i = 0; i < 3; ++i)
    g.push_back(std::make_unique<InflightGuard>(r, WorkerId{1}, 60, 0, 0, blocks_of(10 + i, 0, 60)));
  CHECK(inflight_blocks(r) == 180);
  // This prompt's chain would make 240 keys: it is counted whole, its
  // blocks shared with nobody (the same prompt again adds 60 more).
  g.push_back(std::make_unique<InflightGuard>(r, WorkerId{1}, 60, 0, 0, blocks_of(10, 0, 60)));
  CHECK(inflight_blocks(r) == 240);
  g.erase(g.begin());  // a chained prompt leaves: the copy counted whole stays
  CHECK(inflight_blocks(r) == 180);
  g.clear();
  CHECK(inflight_blocks(r) == 0);
  // A chain longer than the request's blocks is cut to them.
  InflightGuard h(r, WorkerId{1}, 5, 0, 0, blocks_of(1, 0, 9));
  CHECK(inflight_blocks(r) == 5);
}

TEST_CASE("concurrent requests count their chains outside the table's lock and leave nothing behind") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 0));  // 100 blocks of KV: up to 200 chained keys
  // Four threads, each holding up to 3 requests at once on one worker: 4
  // prompts that share their first 10 blocks, 30 blocks each.
  std::vector<std::vector<LocalBlockHash>> prompts;
  for (uint64_t p = 0; p < 4; ++p) prompts.push_back(blocks_of(p + 1, 10, 30));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<std::unique_ptr<InflightGuard>> held;
      for (int i = 0; i < 2000; ++i) {
        if (held.size() == 3) held.erase(held.begin() + i % 3);
        held.push_back(std::make_unique<InflightGuard>(r, WorkerId{1}, 31, 0, 0, prompts[(t + i) % 4]));
      }
    });
  for (auto& t : threads) t.join();
  CHECK(inflight_blocks(r) == 0);
  // Then a known set: all four prompts in flight twice.
  std::vector<std::unique_ptr<InflightGuard>> g;
  for (int k = 0; k < 8; ++k) g.push_back(std::make_unique<InflightGuard>(r, WorkerId{1}, 31, 0, 0, prompts[k % 4]));
  CHECK(inflight_blocks(r) == 10 + 4 * 20 + 8);
}

TEST_CASE("a chain counted for a worker that left is taken back; its successor starts from nothing") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 0));
  auto a = std::make_unique<InflightGuard>(r, WorkerId{1}, 40, 0, 0, blocks_of(1, 0, 40));
  CHECK(inflight_blocks(r) == 40);
  clock.advance(10s);
  r.expire(1s);  // the worker's entry goes, `a` still in flight
  REQUIRE(r.size() == 0);
  r.on_heartbeat(ann(1, "m", 0));  // back, as a new entry
  InflightGuard b(r, WorkerId{1}, 40, 0, 0, blocks_of(1, 0, 40));
  CHECK(inflight_blocks(r) == 40);  // `a` was counted in the old entry only
  a.reset();
  CHECK(inflight_blocks(r) == 40);
}

TEST_CASE("a request whose blocks others still hold takes only the rest off a report that counted it") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 0));
  clock.advance(10ms);
  InflightGuard a(r, WorkerId{1}, 64, 2048, 0, blocks_of(1, 60, 64));
  auto b = std::make_unique<InflightGuard>(r, WorkerId{1}, 64, 2048, 0, blocks_of(2, 60, 64));
  clock.advance(10ms);
  WorkerAnnouncement report = ann(1, "m", 2);
  report.load.kv_total_blocks = 1000;
  report.load.kv_active_blocks = 168;  // 60 + 4 + 4, and 100 of another client's request
  r.on_heartbeat(report);
  clock.advance(10ms);
  b.reset();  // its 4 blocks leave; the 60 that `a` shares stay
  CHECK(r.candidates("m").at(0).predicted.kv_active_blocks == 164);
}

TEST_CASE("a request that shares its prefix takes only its own blocks off a report that counted it") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 0));
  clock.advance(10ms);
  InflightGuard a(r, WorkerId{1}, 64, 2048, 60);
  auto b = std::make_unique<InflightGuard>(r, WorkerId{1}, 64, 2048, 60);
  clock.advance(10ms);
  WorkerAnnouncement report = ann(1, "m", 3);
  report.load.kv_total_blocks = 1000;
  // The engine: the prefix once, 4 + 4 own blocks, and 100 of a request
  // another client sent it.
  report.load.kv_active_blocks = 168;
  r.on_heartbeat(report);
  clock.advance(10ms);
  b.reset();  // ended after the report: its 4 own blocks leave; the prefix stays with `a`
  CHECK(r.candidates("m").at(0).predicted.kv_active_blocks == 164);
}

TEST_CASE("a heartbeat's load report starts the count of ended requests afresh, as a scrape does") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1, "m", 0));
  // Three requests started after that report and ended after the next one:
  // the next report (3 running) counted them; their ends take them off it.
  std::vector<std::unique_ptr<InflightGuard>> g;
  clock.advance(10ms);
  for (int i = 0; i < 3; ++i) g.push_back(std::make_unique<InflightGuard>(r, WorkerId{1}, 1, 0));
  clock.advance(10ms);
  r.on_heartbeat(ann(1, "m", 3));
  clock.advance(10ms);
  g.clear();
  CHECK(r.candidates("m").at(0).predicted.request_active_slots == 0);
  // A later heartbeat reports 5 requests the router does not know of (another
  // router's, or sent to the engine directly): they are its load now.
  clock.advance(10ms);
  r.on_heartbeat(ann(1, "m", 5));
  CHECK(r.candidates("m").at(0).predicted.request_active_slots == 5);
}

TEST_CASE("draining survives heartbeats and is reported") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1));
  CHECK(r.set_draining(WorkerId{1}, true));
  r.on_heartbeat(ann(1));
  CHECK(r.candidates("m").at(0).draining);
  CHECK_FALSE(r.set_draining(WorkerId{2}, true));
}

TEST_CASE("candidates into a reused vector replace its contents") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1));
  r.on_heartbeat(ann(2, "other"));
  r.on_heartbeat(ann(3, "m", 4));
  r.begin_request(WorkerId{3}, 7, 5);
  std::vector<WorkerView> out;
  r.candidates("", out);
  CHECK(out.size() == 3);
  r.candidates("m", out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].info->id == WorkerId{1});
  CHECK(out[1].info->id == WorkerId{3});
  CHECK(out[1].inflight_requests == 1);
  CHECK(out[1].inflight_blocks == 7);
  CHECK(out[1].pending_prefill_tokens == 5);
  CHECK(out[1].predicted.request_active_slots == 4);
  CHECK(out[1].predicted.kv_active_blocks == 7);
  r.candidates("none", out);
  CHECK(out.empty());
}

TEST_CASE("hold_heartbeats: a bus outage does not expire heartbeat-only workers") {
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1));
  for (int i = 0; i < 10; ++i) {  // 10 s without heartbeats, the bus down
    clock.advance(1s);
    r.hold_heartbeats();
    CHECK(r.expire(2s).empty());
  }
  clock.advance(3s);  // the bus is back, the worker stays silent: it goes
  CHECK(r.expire(2s) == std::vector<WorkerId>{WorkerId{1}});
}

TEST_CASE("heartbeats never change a known worker's URL, and new ones stop at the bus-worker cap") {
  ManualClock clock;
  WorkerRegistry r(clock);
  CHECK(r.admit_heartbeat(ann(1), 2) == HeartbeatVerdict::Joined);
  CHECK(r.admit_heartbeat(ann(1, "m", 3), 2) == HeartbeatVerdict::Refreshed);
  auto forged = ann(1);
  forged.url = "http://10.6.6.6:8000";
  forged.load.request_active_slots = 9;
  CHECK(r.admit_heartbeat(forged, 2) == HeartbeatVerdict::UrlChanged);
  auto v = r.candidates("m").at(0);
  CHECK(v.info->url == "http://127.0.0.1:9001");
  CHECK(v.info->load.request_active_slots == 3);  // the refused heartbeat changed nothing
  CHECK(r.admit_heartbeat(ann(2), 2) == HeartbeatVerdict::Joined);
  CHECK(r.admit_heartbeat(ann(3), 2) == HeartbeatVerdict::TooManyWorkers);
  CHECK(r.size() == 2);
  CHECK(r.bus_workers() == 2);
  CHECK(r.admit_heartbeat(ann(1), 2) == HeartbeatVerdict::Refreshed);  // known ones keep their place
  // A router-known worker does not count, and keeps its own URL (heartbeats add load).
  CHECK(r.upsert(router_known(7)));
  CHECK(r.bus_workers() == 2);
  // Once a bus worker expired, its place (and its id, with any URL) is free again.
  clock.advance(10s);
  r.admit_heartbeat(ann(2), 2);
  CHECK(r.expire(5s) == std::vector<WorkerId>{WorkerId{1}});
  CHECK(r.bus_workers() == 1);
  CHECK(r.admit_heartbeat(forged, 2) == HeartbeatVerdict::Joined);
  CHECK(r.candidates("m").size() == 3);
  CHECK(r.remove(WorkerId{1}));
  CHECK(r.bus_workers() == 1);
}

TEST_CASE("KV capacity per served model: the largest worker's, unknown when one has not said") {
  ManualClock clock;
  WorkerRegistry r(clock);
  auto a = ann(1);  // kv_total_blocks 100
  auto b = ann(2);
  b.load.kv_total_blocks = 200;
  b.lora_adapters = {"adapter"};
  r.on_heartbeat(a);
  r.on_heartbeat(b);
  CHECK(r.kv_capacity("m") == 200u);
  CHECK(r.kv_capacity("adapter") == 200u);
  CHECK_FALSE(r.kv_capacity("nobody").has_value());
  uint64_t most = 0;
  CHECK_FALSE(r.exceeds_kv_capacity("m", 50));   // under every worker's: no lock taken
  CHECK_FALSE(r.exceeds_kv_capacity("m", 200));
  CHECK(r.exceeds_kv_capacity("m", 201, &most));
  CHECK(most == 200);
  CHECK_FALSE(r.exceeds_kv_capacity("nobody", 1u << 30));
  // A capacity that shrinks counts at once.
  WorkerLoad smaller = b.load;
  smaller.kv_total_blocks = 120;
  r.on_load_report(WorkerId{2}, smaller);
  CHECK(r.exceeds_kv_capacity("m", 150));
  CHECK_FALSE(r.exceeds_kv_capacity("m", 110));
  // A worker that reports no capacity: nothing is refused for its model.
  auto c = ann(3);
  c.load.kv_total_blocks = 0;
  r.on_heartbeat(c);
  CHECK_FALSE(r.kv_capacity("m").has_value());
  CHECK_FALSE(r.exceeds_kv_capacity("m", 1u << 30));
  CHECK(r.remove(WorkerId{3}));
  CHECK(r.exceeds_kv_capacity("m", 150));
}

TEST_CASE("the registry learns from first bytes and reports its MAPE") {
  ManualClock clock;
  WorkerRegistry reg(clock);
  WorkerAnnouncement a;
  a.id = WorkerId{1};
  a.url = "http://w1";
  a.model = "m";
  a.load = WorkerLoad{0, 64, 0, 0, 1000};
  reg.on_heartbeat(a);
  for (int i = 0; i < 50; ++i) {
    InflightGuard g(reg, WorkerId{1}, 10, 4000);  // 4,000 new tokens on an idle worker
    CHECK(reg.candidates("m")[0].pending_prefill_requests == 1);
    clock.advance(std::chrono::milliseconds(200));  // this worker is slower than the prior: 200 ms
    g.first_byte();
    CHECK(reg.candidates("m")[0].pending_prefill_requests == 0);
  }
  const auto stats = reg.ttft_stats();
  CHECK(stats.samples == 50);
  CHECK(stats.mape() > 0);
  const auto view = reg.candidates("m")[0];
  CHECK(view.ttft.samples == 50);
  CHECK(view.ttft.predict_ms(TtftFeatures{4000, 0, 0, 0}) == doctest::Approx(200).epsilon(0.05));
  // A request that never answered releases its pending count at the end.
  { InflightGuard g(reg, WorkerId{1}, 10, 100); }
  CHECK(reg.candidates("m")[0].pending_prefill_requests == 0);
  CHECK(reg.ttft_stats().samples == 50);
}

TEST_CASE("evictions: device removals add up per worker, fade with their time constant and stay within its KV") {
  using namespace std::chrono_literals;
  ManualClock clock;
  WorkerRegistry r(clock);
  r.on_heartbeat(ann(1));  // 100 KV blocks
  r.on_heartbeat(ann(2));
  WorkerAnnouncement blind = ann(3);
  blind.load.kv_total_blocks = 0;  // reports no KV capacity
  r.on_heartbeat(blind);
  r.set_eviction_seconds(30);
  auto evicted = [&](uint64_t id) {
    for (const auto& w : r.all())
      if (w.info->id.value == id) return w.evicted_blocks;
    return -1.0;
  };
  r.add_evicted(WorkerId{1}, 12);
  r.add_evicted(WorkerId{1}, 8);
  r.add_evicted(WorkerId{3}, 50);  // nothing to weigh them against
  r.add_evicted(WorkerId{9}, 50);  // unknown: ignored
  CHECK(evicted(1) == doctest::Approx(20));
  CHECK(evicted(2) == 0);
  CHECK(evicted(3) == 0);
  // The scheduler sees what the view shows.
  for (const auto& c : r.candidates("m"))
    if (c.info->id.value == 1) CHECK(c.evicted_blocks == doctest::Approx(20));
  clock.advance(30s);
  r.on_load_report(WorkerId{1}, ann(1).load);
  CHECK(evicted(1) == doctest::Approx(20 * std::exp(-1.0)));
  r.add_evicted(WorkerId{1}, 1000000);  // a flood: at most the worker's KV
  CHECK(evicted(1) == doctest::Approx(100));
  // A new time constant fades what is there under the old one up to now.
  clock.advance(30s);
  r.set_eviction_seconds(60);
  clock.advance(60s);
  r.on_load_report(WorkerId{1}, ann(1).load);
  CHECK(evicted(1) == doctest::Approx(100 * std::exp(-2.0)));
}
