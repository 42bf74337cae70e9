#include "scheduler/scheduler.h"

#include <doctest/doctest.h>

#include <map>

#include "tests/scheduler/same_decision.h"

using namespace kvroute;

namespace {

Candidate cand(uint64_t id, uint32_t overlap, uint64_t kv_active, uint64_t kv_total = 1000, uint32_t active = 0,
               uint32_t total = 100, uint32_t waiting = 0) {
  Candidate c;
  c.owner.worker = WorkerId{id};
  c.overlap_blocks = overlap;
  c.load = WorkerLoad{active, total, waiting, kv_active, kv_total};
  return c;
}

}  // namespace

TEST_CASE("cost terms follow the weighted cost (scheduler/README.md) with balanced alpha") {
  SchedulerConfig cfg;  // defaults
  SeededRandom rnd(1);
  // Equal KV load: std 0 -> alpha_balanced. 100-token request, block 10.
  std::vector<Candidate> cs = {cand(1, 5, 500, 1000, 10, 100, 2), cand(2, 0, 500, 1000, 0, 100, 4)};
  Decision d = schedule(cs, 100, 10, cfg, rnd);
  REQUIRE(d.chosen.has_value());
  CHECK(d.alpha == doctest::Approx(0.3));
  CHECK(d.load_mean == doctest::Approx(0.5));
  // worker 1: dev 0, prefill (100-50)/100 = .5, slots .1, queue 2/4
  CHECK(d.scores[0].prefill_ratio == doctest::Approx(0.5));
  CHECK(d.scores[0].cost == doctest::Approx(0.7 * 0.5 + cfg.gamma * 0.1 + 0.1 * 0.5));
  // worker 2: prefill 1, slots 0, queue 1
  CHECK(d.scores[1].cost == doctest::Approx(0.7 * 1.0 + 0.1 * 1.0));
  CHECK(*d.chosen == 0);
  CHECK(d.ranking == std::vector<size_t>{0, 1});
}

TEST_CASE("uneven load switches to alpha_imbalanced and the balance term can beat overlap") {
  SchedulerConfig cfg;
  cfg.alpha_imbalanced = 0.7;
  SeededRandom rnd(1);
  // Holder of the prefix is nearly full; the other is empty.
  std::vector<Candidate> cs = {cand(1, 8, 950), cand(2, 0, 50)};
  Decision d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.alpha == doctest::Approx(0.7));
  // holder: 0.7*0.45 + 0.3*0.2 = 0.375 ; other: 0.7*-0.45 + 0.3*1 = -0.015
  CHECK(d.scores[0].cost == doctest::Approx(0.375));
  CHECK(d.scores[1].cost == doctest::Approx(-0.015));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{2});
}

TEST_CASE("the defaults keep a prefix holder whose KV reads fuller than the rest") {
  // A long session's blocks make the KV load uneven nearly always; the
  // defaults do not switch alpha for it (alpha_imbalanced = alpha_balanced),
  // so a whole prompt's hit is not given up for a load deviation of 0.45.
  SchedulerConfig cfg;
  SeededRandom rnd(1);
  std::vector<Candidate> cs = {cand(1, 8, 950), cand(2, 0, 50)};
  Decision d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.alpha == doctest::Approx(0.3));
  // holder: 0.3*0.45 + 0.7*0.2 = 0.275 ; other: 0.3*-0.45 + 0.7*1 = 0.565
  CHECK(d.scores[0].cost == doctest::Approx(0.275));
  CHECK(d.scores[1].cost == doctest::Approx(0.565));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{1});
  // A holder busy prefilling 150 tokens for earlier requests is still kept
  // (default pending_prefill_weight 0.2: (20 + 0.2*150) / 100 < 1).
  cs[0].pending_prefill_tokens = 150;
  d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[0].prefill_ratio == doctest::Approx((20 + 0.2 * 150) / 100.0));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{1});
}

TEST_CASE("same load: the longest cached prefix wins") {
  SchedulerConfig cfg;
  SeededRandom rnd(7);
  std::vector<Candidate> cs = {cand(1, 1, 100), cand(2, 6, 100), cand(3, 3, 100)};
  Decision d = schedule(cs, 64, 8, cfg, rnd);
  CHECK(cs[*d.chosen].owner.worker == WorkerId{2});
  CHECK(d.ranking == std::vector<size_t>{1, 2, 0});
}

TEST_CASE("full workers are skipped; none left means no choice") {
  SchedulerConfig cfg;
  SeededRandom rnd(1);
  std::vector<Candidate> cs = {cand(1, 9, 100, 1000, 100, 100), cand(2, 9, 1000, 1000), cand(3, 0, 100)};
  Decision d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[0].excluded == Exclusion::NoFreeSlot);
  CHECK(d.scores[1].excluded == Exclusion::NoFreeBlock);
  REQUIRE(d.chosen.has_value());
  CHECK(*d.chosen == 2);
  CHECK(d.ranking.size() == 1);

  std::vector<Candidate> full = {cand(1, 0, 100, 1000, 5, 5)};
  CHECK_FALSE(schedule(full, 10, 10, cfg, rnd).chosen.has_value());
}

TEST_CASE("ties break at random, and the seed makes it reproducible") {
  SchedulerConfig cfg;
  std::vector<Candidate> cs = {cand(1, 0, 0), cand(2, 0, 0), cand(3, 0, 0)};
  SeededRandom rnd(42);
  std::map<size_t, int> picks;
  for (int i = 0; i < 300; ++i) picks[*schedule(cs, 50, 10, cfg, rnd).chosen]++;
  REQUIRE(picks.size() == 3);
  for (auto& [idx, n] : picks) CHECK(n > 60);  // ~100 each

  SeededRandom a(5), b(5);
  for (int i = 0; i < 20; ++i) CHECK(*schedule(cs, 50, 10, cfg, a).chosen == *schedule(cs, 50, 10, cfg, b).chosen);
}

TEST_CASE("overlap longer than the prompt is capped; empty prompt does not divide by zero") {
  SchedulerConfig cfg;
  SeededRandom rnd(1);
  std::vector<Candidate> cs = {cand(1, 50, 0)};
  // A 30-token prompt wholly cached: at most 29 tokens hit, in whole blocks
  // of 10: 20 cached, the last block (10 tokens) prefilled again.
  Decision d = schedule(cs, 30, 10, cfg, rnd);
  CHECK(d.scores[0].cached_tokens == doctest::Approx(20));
  CHECK(d.scores[0].prefill_ratio == doctest::Approx(10.0 / 30.0));
  Decision e = schedule(cs, 0, 10, cfg, rnd);
  CHECK(e.chosen.has_value());
  CHECK(e.scores[0].prefill_ratio == doctest::Approx(0.0));
}

TEST_CASE("tier weights: a host hit is worth less than a device hit and more than nothing") {
  SchedulerConfig cfg;
  cfg.tier_weight_host_pinned = 0.5;
  SeededRandom rnd(1);
  Candidate dev = cand(1, 8, 100), host = cand(2, 8, 100), none = cand(3, 0, 100);
  dev.overlap_by_tier = {8, 0, 0, 0};
  host.overlap_by_tier = {0, 8, 0, 0};
  std::vector<Candidate> cs = {none, host, dev};
  Decision d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[2].cached_tokens == doctest::Approx(80));
  CHECK(d.scores[1].cached_tokens == doctest::Approx(40));
  CHECK(d.scores[0].cached_tokens == doctest::Approx(0));
  CHECK(d.ranking == std::vector<size_t>{2, 1, 0});
}

TEST_CASE("a shared pool's hit is priced at its load cost: each pool by its own weight, between recompute and a device hit") {
  SchedulerConfig cfg;
  cfg.tier_weight_pool = {0.75, 0.25, 0, 0};
  SeededRandom rnd(1);
  Candidate dev = cand(1, 8, 100), fast = cand(2, 8, 100), slow = cand(3, 8, 100), none = cand(4, 0, 100);
  dev.overlap_by_tier[0] = 8;
  fast.overlap_by_tier[0] = 2;                  // 2 blocks on its device, 6 loaded from pool 0
  fast.overlap_by_tier[kNumBaseTiers] = 6;
  slow.overlap_by_tier[kNumBaseTiers + 1] = 8;  // 8 from pool 1
  std::vector<Candidate> cs = {none, slow, fast, dev};
  Decision d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[3].cached_tokens == doctest::Approx(80));
  CHECK(d.scores[2].cached_tokens == doctest::Approx(20 + 60 * 0.75));
  CHECK(d.scores[1].cached_tokens == doctest::Approx(80 * 0.25));
  CHECK(d.scores[0].cached_tokens == doctest::Approx(0));
  CHECK(d.ranking == std::vector<size_t>{3, 2, 1, 0});
  // A pool worth nothing (slower than recomputing) is a miss.
  cfg.tier_weight_pool[1] = 0;
  CHECK(schedule(cs, 100, 10, cfg, rnd).scores[1].cached_tokens == doctest::Approx(0));
}

TEST_CASE("busy thresholds exclude, each with its reason") {
  SchedulerConfig cfg;
  cfg.busy_kv_usage = 0.9;
  cfg.busy_slot_usage = 0.5;
  cfg.busy_waiting_requests = 3;
  SeededRandom rnd(1);
  Candidate drained = cand(5, 0, 0);
  drained.draining = true;
  std::vector<Candidate> cs = {cand(1, 0, 900), cand(2, 0, 0, 1000, 50, 100), cand(3, 0, 0, 1000, 0, 100, 3),
                               cand(4, 0, 899, 1000, 49, 100, 2), drained};
  Decision d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[0].excluded == Exclusion::NoFreeBlock);
  CHECK(d.scores[1].excluded == Exclusion::NoFreeSlot);
  CHECK(d.scores[2].excluded == Exclusion::TooManyWaiting);
  CHECK(d.scores[3].excluded == Exclusion::None);
  CHECK(d.scores[4].excluded == Exclusion::Draining);
  CHECK(d.ranking == std::vector<size_t>{3});
  // Lifted (every worker busy, not rejecting): only the drained one stays
  // out, full ones included; the ranking is by the same cost.
  cs[0] = cand(1, 0, 1000, 1000, 100, 100);  // KV and slots full
  const SchedulerConfig lifted = without_busy_limits(cfg);
  d = schedule(cs, 100, 10, lifted, rnd);
  for (size_t i = 0; i < 4; ++i) CHECK(d.scores[i].excluded == Exclusion::None);
  CHECK(d.scores[4].excluded == Exclusion::Draining);
  CHECK(d.ranking.size() == 4);
  CHECK(d.ranking.front() != 0);  // the full worker ranks below the others
}

TEST_CASE("parked KV counts with the active KV in the load term, never in the busy threshold") {
  SchedulerConfig cfg;
  cfg.busy_kv_usage = 0.5;
  SeededRandom rnd(1);
  // A new context (no worker holds any of it): the worker holding paused
  // sessions' prompts is the dearer place, though its active KV is lower.
  Candidate paused = cand(1, 0, 100), busy = cand(2, 0, 200);
  paused.parked_blocks = 400;
  std::vector<Candidate> cs = {paused, busy};
  Decision d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[0].load_ratio == doctest::Approx(0.5));  // (100 active + 400 parked) / 1000
  CHECK(d.scores[0].excluded == Exclusion::None);         // 0.5 is the threshold: the active 0.1 is tested
  CHECK(cs[*d.chosen].owner.worker == WorkerId{2});
  cs[0].parked_blocks = 0;
  d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(cs[*d.chosen].owner.worker == WorkerId{1});
}

TEST_CASE("a worker's recent evictions price the request's uncached share of its prompt (eviction_weight)") {
  SchedulerConfig cfg;
  cfg.eviction_weight = 1;
  SeededRandom rnd(1);
  // Equal load; worker 1 evicted 30 % of its KV lately, worker 2 nothing.
  Candidate churning = cand(1, 0, 200), steady = cand(2, 0, 200);
  churning.evicted_blocks = 300;
  std::vector<Candidate> cs = {churning, steady};
  // A new prompt (nothing cached anywhere): its blocks would push out
  // cached prompts on worker 1, at the full weight.
  Decision d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[0].eviction_share == doctest::Approx(0.3));
  CHECK(d.scores[0].cost - d.scores[1].cost == doctest::Approx(0.3));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{2});
  // Half of it cached on both: half the price.
  cs[0].overlap_blocks = cs[1].overlap_blocks = 5;
  d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[0].cost - d.scores[1].cost == doctest::Approx(0.15));
  // Wholly cached on worker 1: only its last block is computed there (an
  // engine computes at least the last token), a tenth of the price; the
  // cache wins.
  cs[0].overlap_blocks = 10;
  cs[1].overlap_blocks = 0;
  d = schedule(cs, 100, 10, cfg, rnd);
  const double cached_cost = d.scores[0].cost;
  CHECK(cs[*d.chosen].owner.worker == WorkerId{1});
  cs[0].evicted_blocks = 0;
  d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(cached_cost - d.scores[0].cost == doctest::Approx(0.03));
  // The share is at most 1 (a worker flooding removals turns away at most
  // eviction_weight of cost), and weight 0 turns the term off.
  cs[0].overlap_blocks = 0;
  cs[0].evicted_blocks = 5000;
  d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[0].eviction_share == 1);
  CHECK(d.scores[0].cost - d.scores[1].cost == doctest::Approx(1));
  cfg.eviction_weight = 0;
  d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[0].cost == doctest::Approx(d.scores[1].cost));
}

TEST_CASE("pending prefill on a worker counts like its own new tokens, weighted; weight 0 is the baseline") {
  SchedulerConfig cfg;
  cfg.pending_prefill_weight = 0.2;
  SeededRandom rnd(1);
  Candidate holder = cand(1, 9, 100), other = cand(2, 0, 100);
  holder.pending_prefill_tokens = 150;  // busy prefilling for earlier requests
  std::vector<Candidate> cs = {holder, other};
  // Weight 0.2: (10 new + 0.2 * 150 pending) / 100; still cheaper than a full recompute.
  Decision d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[0].prefill_ratio == doctest::Approx((10 + 0.2 * 150) / 100.0));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{1});
  // Weight 1: the holder's queue now costs more than recomputing elsewhere.
  cfg.pending_prefill_weight = 1.0;
  d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(d.scores[0].prefill_ratio == doctest::Approx((10 + 150) / 100.0));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{2});
  cfg.pending_prefill_weight = 0;
  d = schedule(cs, 100, 10, cfg, rnd);
  CHECK(cs[*d.chosen].owner.worker == WorkerId{1});
}

TEST_CASE("pending prefill past what the request saves on a worker counts in full (pending_prefill_excess)") {
  SchedulerConfig cfg;  // weight 0.2; the excess over 4096 + 2 x cached (+ own) at weight 1
  cfg.pending_prefill_excess_tokens = 4096;
  cfg.pending_prefill_excess_cached = 2;
  CHECK(priced_pending(3000, 0, 0, cfg) == doctest::Approx(600));                         // under 4096
  CHECK(priced_pending(10000, 0, 0, cfg) == doctest::Approx(2000 + 0.8 * (10000 - 4096)));  // 6,723.2
  CHECK(priced_pending(10000, 0, 1000, cfg) == doctest::Approx(2000 + 0.8 * (10000 - 6096)));
  CHECK(priced_pending(10000, 4000, 1000, cfg) == doctest::Approx(2000));  // its own prefix: tolerated
  SeededRandom rnd(1);
  // A 20,000-token prompt, 16,000 of it cached on the holder, which is busy
  // with 60,000 tokens of other prompts' prefill; the other worker is idle.
  Candidate holder = cand(1, 1000, 100), idle = cand(2, 0, 100);
  holder.pending_prefill_tokens = 60000;
  std::vector<Candidate> cs = {holder, idle};
  // Tolerated 4096 + 2 x 16,000 = 36,096: 0.2 x 60,000 + 0.8 x 23,904 of pending
  // against the idle worker's 20,000-token recompute.
  Decision d = schedule(cs, 20000, 16, cfg, rnd);
  CHECK(d.scores[0].prefill_ratio == doctest::Approx((4000 + 12000 + 0.8 * 23904) / 20000.0));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{2});
  // Off, the weight alone prices the wait at (4,000 + 12,000) / 20,000: the holder.
  cfg.pending_prefill_excess = false;
  d = schedule(cs, 20000, 16, cfg, rnd);
  CHECK(d.scores[0].prefill_ratio == doctest::Approx(0.8));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{1});
  // On, with 24,000 of the holder's pending being this prompt's own prefix in
  // flight (computed for the requests before it): 60,096 tolerated, the holder.
  cfg.pending_prefill_excess = true;
  cs[0].inflight_prefix_tokens = 24000;
  d = schedule(cs, 20000, 16, cfg, rnd);
  CHECK(d.scores[0].prefill_ratio == doctest::Approx(0.8));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{1});
}

TEST_CASE("a wait for a request slot is priced as queue on the worker (slot_wait_tokens)") {
  // Pending weight 0.2, the excess past 4096 + 3 x cached in full; the slot test
  // lifted (a nearly full fleet), or a full worker would not be ranked at all.
  const SchedulerConfig cfg = without_slot_limit(SchedulerConfig{});
  SeededRandom rnd(1);
  // A 4,000-token prompt, half of it cached on the holder, whose 100 slots are
  // all taken with 4 more requests sent there (the registry's predicted load):
  // this one would be the fifth to wait for a running request to finish. The
  // other worker has 10 slots free and nothing cached.
  Candidate holder = cand(1, 125, 100, 1000, 104, 100), free = cand(2, 0, 100, 1000, 90, 100);
  std::vector<Candidate> cs = {holder, free};
  Decision d = schedule(cs, 4000, 16, cfg, rnd);  // no wait priced: the cache wins
  CHECK(d.scores[0].prefill_ratio == doctest::Approx(2000 / 4000.0));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{1});
  // Priced (WorkerRegistry: 3,000 tokens x 5 requests for a slot): 0.2 x 15,000 +
  // 0.8 x (15,000 - 10,096 tolerated) against a 4,000-token recompute.
  cs[0].slot_wait_tokens = 15000;
  d = schedule(cs, 4000, 16, cfg, rnd);
  CHECK(d.scores[0].prefill_ratio == doctest::Approx((2000 + 3000 + 0.8 * (15000 - 10096)) / 4000.0));
  CHECK(cs[*d.chosen].owner.worker == WorkerId{2});
  // It joins the worker's pending prefill in one queue: the same cost as that much pending.
  cs[0].slot_wait_tokens = 5000;
  cs[0].pending_prefill_tokens = 10000;
  const double both = schedule(cs, 4000, 16, cfg, rnd).scores[0].cost;
  cs[0].slot_wait_tokens = 0;
  cs[0].pending_prefill_tokens = 15000;
  CHECK(schedule(cs, 4000, 16, cfg, rnd).scores[0].cost == doctest::Approx(both));
}

TEST_CASE("softmax sampling: temperature 0 is argmin; T > 0 follows exp(-cost/T), seeded") {
  SchedulerConfig cfg;
  std::vector<Candidate> cs = {cand(1, 0, 100), cand(2, 5, 100)};  // costs 0.7 and 0.35
  SeededRandom rnd(3);
  for (int i = 0; i < 50; ++i) CHECK(*schedule(cs, 100, 10, cfg, rnd).chosen == 1);
  cfg.temperature = 0.35;
  int picks[2] = {0, 0};
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    Decision d = schedule(cs, 100, 10, cfg, rnd);
    CHECK(d.sampled);
    CHECK(d.ranking.size() == 2);
    picks[*d.chosen]++;
  }
  // P(worker 1) = 1 / (1 + e^{(0.7-0.35)/0.35}) = 1/(1+e) = 0.2689
  CHECK(picks[0] / double(n) == doctest::Approx(0.2689).epsilon(0.05));
  SeededRandom a(9), b(9);
  for (int i = 0; i < 50; ++i) CHECK(*schedule(cs, 100, 10, cfg, a).chosen == *schedule(cs, 100, 10, cfg, b).chosen);
}

TEST_CASE("schedule into a reused Decision gives the fresh Decision") {
  SchedulerConfig cfg;
  cfg.busy_kv_usage = 0.9;
  const std::vector<std::vector<Candidate>> rounds = {
      {cand(1, 5, 500), cand(2, 0, 100), cand(3, 5, 500), cand(4, 2, 950)},  // 4 is excluded
      {cand(1, 0, 950), cand(2, 0, 990)},                                    // nobody eligible
      {cand(1, 3, 200)},
      {cand(1, 5, 500), cand(2, 5, 500), cand(3, 5, 500)},  // equal costs: random order
  };
  SeededRandom a(7), b(7);
  Decision reused;
  for (double temperature : {0.0, 0.5}) {
    cfg.temperature = temperature;
    for (size_t rank_limit : {0, 1}) {
      for (const auto& cs : rounds) {
        const Decision fresh = schedule(cs, 100, 10, cfg, a, rank_limit);
        schedule(cs, 100, 10, cfg, b, rank_limit, reused);
        check_same_decision(reused, fresh);
      }
    }
  }
}

TEST_CASE("a partial ranking is the prefix of the full one (same draw)") {
  SchedulerConfig cfg;
  std::vector<Candidate> cs;
  for (uint64_t id = 1; id <= 40; ++id) cs.push_back(cand(id, static_cast<uint32_t>(id % 3), 500));  // many ties
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SeededRandom a(seed), b(seed);
    const Decision full = schedule(cs, 100, 10, cfg, a);
    const Decision partial = schedule(cs, 100, 10, cfg, b, 5);
    REQUIRE(full.ranking.size() == cs.size());
    CHECK(partial.ranking == std::vector<size_t>(full.ranking.begin(), full.ranking.begin() + 5));
  }
}
