#include "scheduler/ranked_fleet.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

using namespace kvroute;

namespace {

// One random fleet and request; loads drawn from small sets so that equal
// costs (ties) are common.
struct Case {
  std::map<WorkerId, FleetWorkerState> workers;  // by id: the registry's candidate order
  std::vector<OwnerOverlap> owners;
  SchedulerConfig cfg;
  uint32_t isl = 0, block = 16;
  size_t limit = 3;
  std::vector<WorkerId> strangers;  // upserted into the fleet, not workers of the case
};

FleetWorkerState random_state(std::mt19937_64& rng, bool ties) {
  FleetWorkerState s;
  auto pick = [&](uint64_t n) { return rng() % n; };
  s.load.kv_total_blocks = ties ? 1000 : 500 + pick(2000);
  s.load.kv_active_blocks = ties ? 100 * pick(4) : pick(s.load.kv_total_blocks + 50);
  s.load.request_total_slots = pick(8) == 0 ? 0 : 64;
  s.load.request_active_slots = static_cast<uint32_t>(ties ? 8 * pick(3) : pick(70));
  s.load.num_requests_waiting = static_cast<uint32_t>(pick(3) == 0 ? pick(6) : 0);
  s.pending_prefill_tokens = pick(3) == 0 ? (ties ? 512 : pick(5000)) : 0;
  s.draining = pick(40) == 0;
  return s;
}

Case random_case(std::mt19937_64& rng, RankedFleet& fleet) {
  Case c;
  auto pick = [&](uint64_t n) { return rng() % n; };
  const bool ties = pick(2) == 0;
  const size_t n = pick(4) == 0 ? 1 + pick(2000) : 1 + pick(120);
  c.cfg.alpha_balanced = pick(5) * 0.2;
  c.cfg.alpha_imbalanced = pick(5) * 0.2;
  c.cfg.balance_threshold = pick(4) * 0.1;
  c.cfg.gamma = pick(3) * 0.1;
  c.cfg.delta = pick(3) * 0.1;
  c.cfg.pending_prefill_weight = pick(3) * 0.2;
  c.cfg.busy_kv_usage = pick(3) == 0 ? 0.5 : 1.0;
  c.cfg.busy_slot_usage = pick(3) == 0 ? 0.9 : 1.0;
  c.cfg.busy_waiting_requests = pick(4) == 0 ? 4 : 0;
  c.cfg.tier_weight_host_pinned = 0.5;
  c.isl = static_cast<uint32_t>(pick(10) == 0 ? pick(20) : 64 + pick(4000));
  c.limit = 1 + pick(5);
  std::vector<WorkerId> ids;
  for (size_t i = 0; i < n; ++i) {
    const WorkerId id{pick(2) ? pick(1u << 20) : rng()};
    if (c.workers.count(id)) continue;
    ids.push_back(id);
    c.workers[id] = random_state(rng, ties);
  }
  // Updates in a random order, some workers twice and some removed and
  // re-added, so the incremental structure is exercised.
  std::shuffle(ids.begin(), ids.end(), rng);
  for (WorkerId id : ids) {
    if (pick(4) == 0) fleet.upsert(id, random_state(rng, ties));
    if (pick(10) == 0) fleet.upsert(c.strangers.emplace_back(rng()), random_state(rng, ties));
    fleet.upsert(id, c.workers[id]);
  }
  for (WorkerId id : ids)
    if (pick(8) == 0) {
      CHECK(fleet.erase(id));
      if (pick(2)) fleet.upsert(id, c.workers[id]);
      else c.workers.erase(id);
    }
  // Owners: a few depths, many workers per depth, several dp ranks, tiers,
  // and owners the fleet does not know.
  const uint32_t depths = 1 + static_cast<uint32_t>(pick(5));
  std::vector<uint32_t> depth(depths);
  for (auto& d : depth) d = 1 + static_cast<uint32_t>(pick(300));
  for (const auto& [id, st] : c.workers) {
    if (pick(3) == 0) continue;
    const uint32_t ranks = pick(5) == 0 ? 2 : 1;
    for (uint32_t r = 0; r < ranks; ++r) {
      OwnerOverlap o;
      o.owner = CacheOwner{id, r + static_cast<uint32_t>(pick(2))};
      o.blocks = depth[pick(depths)];
      if (pick(4) == 0) {
        o.by_tier[0] = o.blocks / 2;
        o.by_tier[1] = o.blocks - o.by_tier[0];
      }
      c.owners.push_back(o);
    }
  }
  for (int k = 0; k < 3; ++k) c.owners.push_back(OwnerOverlap{CacheOwner{WorkerId{rng()}, 0}, 5, {}});
  std::shuffle(c.owners.begin(), c.owners.end(), rng);
  return c;
}

// The reference: every worker as a Candidate (registry order), the best dp
// rank per worker (most blocks, then the lowest rank), schedule().
Decision reference(const Case& c, uint64_t seed, std::vector<Candidate>& cands) {
  for (const auto& [id, st] : c.workers) {
    Candidate& x = cands.emplace_back();
    x.owner.worker = id;
    x.load = st.load;
    x.pending_prefill_tokens = st.pending_prefill_tokens;
    x.draining = st.draining;
    for (const auto& o : c.owners) {
      if (o.owner.worker != id) continue;
      if (o.blocks > x.overlap_blocks || (o.blocks == x.overlap_blocks && o.owner.dp_rank < x.owner.dp_rank)) {
        x.owner.dp_rank = o.owner.dp_rank;
        x.overlap_blocks = o.blocks;
        x.overlap_by_tier = o.by_tier;
      }
    }
  }
  SeededRandom rnd(seed);
  return schedule(cands, c.isl, c.block, c.cfg, rnd, c.limit);
}

}  // namespace

TEST_CASE("fast path = reference scorer on random fleets with seeded ties (weighted cost)") {
  std::mt19937_64 rng(20261124);
  int compared = 0, with_walk = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    RankedFleet fleet;
    const Case c = random_case(rng, fleet);
    for (WorkerId id : c.strangers) fleet.erase(id);
    std::vector<Candidate> cands;
    const uint64_t seed = rng();
    const Decision ref = reference(c, seed, cands);
    SeededRandom rnd(seed);
    FleetDecision fast;
    fleet.decide(c.owners, c.isl, c.block, c.cfg, rnd, c.limit, fast);
    INFO("trial " << trial << " workers " << c.workers.size() << " owners " << c.owners.size());
    REQUIRE(fast.ranked.size() == ref.ranking.size());
    for (size_t k = 0; k < ref.ranking.size(); ++k) {
      const auto& want = cands[ref.ranking[k]];
      CHECK(fast.ranked[k].worker == want.owner.worker);
      CHECK(fast.ranked[k].overlap_blocks == want.overlap_blocks);
      CHECK(fast.ranked[k].dp_rank == want.owner.dp_rank);
      CHECK(fast.ranked[k].score.cost == doctest::Approx(ref.scores[ref.ranking[k]].cost));
    }
    if (ref.chosen) CHECK(fast.alpha == ref.alpha);
    ++compared;
    with_walk += fast.scored < c.workers.size();
  }
  CHECK(compared == 1500);
  CHECK(with_walk > 300);  // the early stop is exercised, not only full scans
}

TEST_CASE("incremental updates give the decision of a fleet built from scratch") {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    RankedFleet updated;
    const Case c = random_case(rng, updated);
    for (WorkerId id : c.strangers) updated.erase(id);
    RankedFleet fresh;
    for (const auto& [id, st] : c.workers) fresh.upsert(id, st);
    REQUIRE(updated.size() == fresh.size());
    const uint64_t seed = rng();
    SeededRandom r1(seed), r2(seed);
    FleetDecision a, b;
    updated.decide(c.owners, c.isl, c.block, c.cfg, r1, c.limit, a);
    fresh.decide(c.owners, c.isl, c.block, c.cfg, r2, c.limit, b);
    REQUIRE(a.ranked.size() == b.ranked.size());
    for (size_t k = 0; k < a.ranked.size(); ++k) CHECK(a.ranked[k].worker == b.ranked[k].worker);
  }
}

TEST_CASE("a decision reads the owners' depths, not every worker") {
  // 4,096 workers with distinct loads; a system prompt (32 blocks) on every
  // worker and the request's 128 blocks on 8 of them.
  RankedFleet fleet;
  SchedulerConfig cfg;
  std::vector<OwnerOverlap> owners;
  for (uint64_t w = 0; w < 4096; ++w) {
    FleetWorkerState s;
    s.load = WorkerLoad{static_cast<uint32_t>(w % 50), 256, static_cast<uint32_t>(w % 3), 1000 + 3 * w, 16384};
    fleet.upsert(WorkerId{w}, s);
    owners.push_back(OwnerOverlap{CacheOwner{WorkerId{w}, 0}, (w % 512 == 7) ? 128u : 32u, {}});
  }
  SeededRandom rnd(1);
  FleetDecision d;
  fleet.decide(owners, 2048, 16, cfg, rnd, 3, d);
  REQUIRE(d.ranked.size() == 3);
  CHECK(d.groups == 2);
  CHECK(d.scored < 64);  // 8 deep owners + a few of the pre-ranked shallow ones
  CHECK(d.ranked[0].overlap_blocks == 128);
  // Nobody holds the prompt: the pre-ranked order alone decides.
  fleet.decide({}, 2048, 16, cfg, rnd, 3, d);
  CHECK(d.scored < 16);
}

TEST_CASE("excluded, drained and removed workers never rank; config changes rebuild") {
  RankedFleet fleet;
  SchedulerConfig cfg;
  FleetWorkerState idle, full, drained;
  idle.load = WorkerLoad{0, 10, 0, 0, 100};
  full.load = WorkerLoad{10, 10, 0, 0, 100};
  drained = idle;
  drained.draining = true;
  fleet.upsert(WorkerId{1}, full);
  fleet.upsert(WorkerId{2}, drained);
  fleet.upsert(WorkerId{3}, idle);
  SeededRandom rnd(3);
  FleetDecision d;
  fleet.decide({}, 100, 16, cfg, rnd, 3, d);
  REQUIRE(d.ranked.size() == 1);
  CHECK(d.ranked[0].worker == WorkerId{3});
  CHECK(fleet.erase(WorkerId{3}));
  CHECK_FALSE(fleet.erase(WorkerId{3}));
  fleet.decide({}, 100, 16, cfg, rnd, 3, d);
  CHECK(d.ranked.empty());
  fleet.upsert(WorkerId{1}, FleetWorkerState{WorkerLoad{5, 10, 0, 0, 100}, 0, false});
  cfg.busy_slot_usage = 0.4;  // now 5/10 is busy: the rebuild at decide() excludes it
  fleet.decide({}, 100, 16, cfg, rnd, 3, d);
  CHECK(d.ranked.empty());
  cfg.busy_slot_usage = 1.0;
  fleet.decide({}, 100, 16, cfg, rnd, 3, d);
  REQUIRE(d.ranked.size() == 1);
  CHECK(d.ranked[0].worker == WorkerId{1});
}
