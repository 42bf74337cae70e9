#include "scheduler/ranked_candidates.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

#include "indexer/radix_indexer.h"
#include "tests/indexer/doc_events.h"

using namespace kvroute;
using kvroute::testing::store_doc;

namespace {

// One random fleet and request; loads drawn from small sets so that equal
// costs (ties) are common.
struct Case {
  std::map<WorkerId, CandidateState> workers;  // by id: the registry's candidate order
  std::vector<OwnerOverlap> owners;
  SchedulerConfig cfg;
  uint32_t isl = 0, block = 16;
  size_t limit = 3;
  std::vector<WorkerId> strangers;  // upserted into the fleet, not workers of the case
};

CandidateState random_state(std::mt19937_64& rng, bool ties) {
  CandidateState s;
  auto pick = [&](uint64_t n) { return rng() % n; };
  s.load.kv_total_blocks = ties ? 1000 : 500 + pick(2000);
  s.load.kv_active_blocks = ties ? 100 * pick(4) : pick(s.load.kv_total_blocks + 50);
  s.load.request_total_slots = pick(8) == 0 ? 0 : 64;
  s.load.request_active_slots = static_cast<uint32_t>(ties ? 8 * pick(3) : pick(70));
  s.load.num_requests_waiting = static_cast<uint32_t>(pick(3) == 0 ? pick(6) : 0);
  // Now and then far more than pending_prefill_excess_tokens (its excess counts in full).
  s.pending_prefill_tokens = pick(3) == 0 ? (ties ? 512 : pick(pick(4) == 0 ? 40000 : 5000)) : 0;
  s.draining = pick(40) == 0;
  // Parked KV on a third of the workers, from the draws above (another draw
  // would change every fleet after it).
  s.parked_blocks = s.load.request_active_slots % 3 == 1 ? static_cast<double>(s.load.kv_active_blocks) / 2 + 7.5 : 0;
  // A worker over its slots waits for them as the registry prices it (3,000 tokens a request).
  const uint32_t total = s.load.request_total_slots, active = s.load.request_active_slots;
  s.slot_wait_tokens = total && active >= total ? 3000ull * (active + 1 - total) : 0;
  // Evictions on another third (past the KV now and then: the share is capped), from the draws above.
  s.evicted_blocks = s.load.request_active_slots % 3 == 2 ? static_cast<double>(s.load.kv_active_blocks) * 1.5 : 0;
  return s;
}

// Weights and thresholds from small sets (equal costs are common).
SchedulerConfig random_config(std::mt19937_64& rng) {
  auto pick = [&](uint64_t n) { return rng() % n; };
  SchedulerConfig cfg;
  cfg.alpha_balanced = pick(5) * 0.2;
  cfg.alpha_imbalanced = pick(5) * 0.2;
  cfg.balance_threshold = pick(4) * 0.1;
  cfg.gamma = pick(3) * 0.1;
  cfg.delta = pick(3) * 0.1;
  cfg.pending_prefill_weight = pick(3) * 0.2;
  cfg.pending_prefill_excess = pick(3) != 0;
  cfg.pending_prefill_excess_tokens = static_cast<uint32_t>(pick(3) * 2048);
  cfg.pending_prefill_excess_cached = static_cast<double>(pick(3)) * 0.75;
  cfg.busy_kv_usage = pick(3) == 0 ? 0.5 : 1.0;
  // 1 in 4: the slot test lifted, as for a fleet with nearly every slot taken.
  if (const auto k = pick(4); k == 0) cfg.busy_slot_usage = 0.9;
  else if (k == 1) cfg = without_slot_limit(cfg);
  else cfg.busy_slot_usage = 1.0;
  cfg.busy_waiting_requests = pick(4) == 0 ? 4 : 0;
  cfg.tier_weight_host_pinned = 0.5;
  cfg.tier_weight_pool = {0.75, 0.25, 0, 0};  // two shared pools of different load costs
  return cfg;
}

Case random_case(std::mt19937_64& rng, RankedCandidates& fleet) {
  Case c;
  auto pick = [&](uint64_t n) { return rng() % n; };
  const bool ties = pick(2) == 0;
  const size_t n = pick(4) == 0 ? 1 + pick(2000) : 1 + pick(120);
  c.cfg = random_config(rng);
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
      } else if (pick(4) == 0) {  // the rest from a shared pool (same depth, another value per pool)
        o.by_tier[0] = o.blocks / 3;
        o.by_tier[kNumBaseTiers + pick(2)] = o.blocks - o.by_tier[0];
      }
      if (pick(5) == 0) o.inflight_blocks = 1 + static_cast<uint32_t>(pick(o.blocks));  // an in-flight prefix
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
    x.slot_wait_tokens = st.slot_wait_tokens;
    x.parked_blocks = st.parked_blocks;
    x.evicted_blocks = st.evicted_blocks;
    x.draining = st.draining;
    for (const auto& o : c.owners) {
      if (o.owner.worker != id) continue;
      if (o.blocks > x.overlap_blocks || (o.blocks == x.overlap_blocks && o.owner.dp_rank < x.owner.dp_rank)) {
        x.owner.dp_rank = o.owner.dp_rank;
        x.overlap_blocks = o.blocks;
        x.overlap_by_tier = o.by_tier;
        x.inflight_prefix_tokens = uint64_t{o.inflight_blocks} * c.block;
      }
    }
  }
  SeededRandom rnd(seed);
  return schedule(cands, c.isl, c.block, c.cfg, rnd, c.limit);
}

const std::vector<OwnerOverlap> kNobody;

}  // namespace

TEST_CASE("fast path = reference scorer on random fleets with seeded ties (weighted cost)") {
  std::mt19937_64 rng(20261124);
  int compared = 0, with_walk = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    RankedCandidates fleet;
    const Case c = random_case(rng, fleet);
    for (WorkerId id : c.strangers) fleet.erase(id);
    std::vector<Candidate> cands;
    const uint64_t seed = rng();
    const Decision ref = reference(c, seed, cands);
    SeededRandom rnd(seed);
    RankedDecision fast;
    fleet.decide(c.owners, c.isl, c.block, c.cfg, rnd, c.limit, fast);
    INFO("trial " << trial << " workers " << c.workers.size() << " owners " << c.owners.size());
    REQUIRE(fast.ranked.size() == ref.ranking.size());
    for (size_t k = 0; k < ref.ranking.size(); ++k) {
      const auto& want = cands[ref.ranking[k]];
      CHECK(fast.ranked[k].worker == want.owner.worker);
      CHECK(fast.ranked[k].overlap_blocks == want.overlap_blocks);
      CHECK(fast.ranked[k].dp_rank == want.owner.dp_rank);
      CHECK(fast.ranked[k].score.cost == doctest::Approx(ref.scores[ref.ranking[k]].cost));
      CHECK(fast.ranked[k].score.prefill_ratio == doctest::Approx(ref.scores[ref.ranking[k]].prefill_ratio));
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
    RankedCandidates updated;
    const Case c = random_case(rng, updated);
    for (WorkerId id : c.strangers) updated.erase(id);
    RankedCandidates fresh;
    for (const auto& [id, st] : c.workers) fresh.upsert(id, st);
    REQUIRE(updated.size() == fresh.size());
    const uint64_t seed = rng();
    SeededRandom r1(seed), r2(seed);
    RankedDecision a, b;
    updated.decide(c.owners, c.isl, c.block, c.cfg, r1, c.limit, a);
    fresh.decide(c.owners, c.isl, c.block, c.cfg, r2, c.limit, b);
    REQUIRE(a.ranked.size() == b.ranked.size());
    for (size_t k = 0; k < a.ranked.size(); ++k) CHECK(a.ranked[k].worker == b.ranked[k].worker);
  }
}

TEST_CASE("a decision reads the owners' depths, not every worker") {
  // 4,096 workers with distinct loads; a system prompt (32 blocks) on every
  // worker and the request's 128 blocks on 8 of them.
  RankedCandidates fleet;
  SchedulerConfig cfg;
  std::vector<OwnerOverlap> owners;
  for (uint64_t w = 0; w < 4096; ++w) {
    CandidateState s;
    s.load = WorkerLoad{static_cast<uint32_t>(w % 50), 256, static_cast<uint32_t>(w % 3), 1000 + 3 * w, 16384};
    fleet.upsert(WorkerId{w}, s);
    owners.push_back(OwnerOverlap{CacheOwner{WorkerId{w}, 0}, (w % 512 == 7) ? 128u : 32u, {}});
  }
  SeededRandom rnd(1);
  RankedDecision d;
  fleet.decide(owners, 2048, 16, cfg, rnd, 3, d);
  REQUIRE(d.ranked.size() == 3);
  CHECK(d.groups == 2);
  CHECK(d.scored < 64);  // 8 deep owners + a few of the pre-ranked shallow ones
  CHECK(d.ranked[0].overlap_blocks == 128);
  // Nobody holds the prompt: the pre-ranked order alone decides.
  fleet.decide(kNobody, 2048, 16, cfg, rnd, 3, d);
  CHECK(d.scored < 16);
}

TEST_CASE("excluded, drained and removed workers never rank; config changes rebuild") {
  RankedCandidates fleet;
  SchedulerConfig cfg;
  CandidateState idle, full, drained;
  idle.load = WorkerLoad{0, 10, 0, 0, 100};
  full.load = WorkerLoad{10, 10, 0, 0, 100};
  drained = idle;
  drained.draining = true;
  fleet.upsert(WorkerId{1}, full);
  fleet.upsert(WorkerId{2}, drained);
  fleet.upsert(WorkerId{3}, idle);
  SeededRandom rnd(3);
  RankedDecision d;
  fleet.decide(kNobody, 100, 16, cfg, rnd, 3, d);
  REQUIRE(d.ranked.size() == 1);
  CHECK(d.ranked[0].worker == WorkerId{3});
  CHECK(fleet.erase(WorkerId{3}));
  CHECK_FALSE(fleet.erase(WorkerId{3}));
  fleet.decide(kNobody, 100, 16, cfg, rnd, 3, d);
  CHECK(d.ranked.empty());
  fleet.upsert(WorkerId{1}, CandidateState{WorkerLoad{5, 10, 0, 0, 100}, 0, false});
  cfg.busy_slot_usage = 0.4;  // now 5/10 is busy: the rebuild at decide() excludes it
  fleet.decide(kNobody, 100, 16, cfg, rnd, 3, d);
  CHECK(d.ranked.empty());
  cfg.busy_slot_usage = 1.0;
  fleet.decide(kNobody, 100, 16, cfg, rnd, 3, d);
  REQUIRE(d.ranked.size() == 1);
  CHECK(d.ranked[0].worker == WorkerId{1});
}

TEST_CASE("slot usage: exact sums over the workers not draining that report slots, and its band") {
  std::mt19937_64 rng(17);
  RankedCandidates fleet;
  std::map<WorkerId, CandidateState> now;
  for (int step = 0; step < 3000; ++step) {
    const WorkerId id{rng() % 40};
    if (rng() % 5 == 0) {
      CHECK(fleet.erase(id) == (now.erase(id) == 1));
    } else {
      const CandidateState s = random_state(rng, false);
      fleet.upsert(id, s);
      now[id] = s;
    }
    uint64_t taken = 0, total = 0;
    for (const auto& [w, s] : now)
      if (!s.draining && s.load.request_total_slots) taken += s.load.request_active_slots, total += s.load.request_total_slots;
    CHECK(fleet.slot_usage() == (total ? static_cast<double>(taken) / static_cast<double>(total) : 0.0));
  }
  // Full from the threshold on, until 0.02 below it; 1 never.
  RankedCandidates f;
  auto at = [&](uint32_t taken) { f.upsert(WorkerId{1}, CandidateState{WorkerLoad{taken, 100, 0, 0, 100}, 0, false}); };
  struct Step {
    uint32_t taken;
    double threshold;
    bool full;
  };
  for (const Step& st : {Step{89, 0.9, false}, Step{90, 0.9, true}, Step{89, 0.9, true}, Step{88, 0.9, true},
                         Step{87, 0.9, false}, Step{100, 1.0, false}, Step{100, 0.95, true}, Step{100, 1.0, false}}) {
    at(st.taken);
    INFO(st.taken << " of 100 at " << st.threshold);
    CHECK(f.slots_full(st.threshold) == st.full);
  }
}

TEST_CASE("layers from a real index: the same choices as the reference, while the fleet and index change") {
  // Workers share a few documents (sets of tens to hundreds of owners, so
  // large layers are read through bitmaps); some workers of the index are not
  // in the fleet (another model), some have two dp ranks, some blocks sit in
  // host memory. Between decisions loads change, workers leave and join
  // (cached bitmaps must be dropped) and the index changes.
  std::mt19937_64 rng(777);
  auto pick = [&](uint64_t n) { return rng() % n; };
  int decisions = 0, with_large = 0, walked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    RankedCandidates fleet;
    RadixIndexer idx;
    Case c;
    c.cfg = random_config(rng);
    const bool ties = pick(2) == 0;
    const uint32_t n = 20 + static_cast<uint32_t>(pick(400));
    const uint64_t docs = 1 + pick(3);
    for (uint32_t w = 0; w < n; ++w) {
      const WorkerId id{w};
      if (pick(10) != 0) {  // in this fleet
        c.workers[id] = random_state(rng, ties);
        fleet.upsert(id, c.workers[id]);
      }
    }
    auto store_random = [&] {
      const CacheOwner who{WorkerId{pick(n + 5)}, pick(6) == 0 ? 1u : 0u};
      const StorageTier tier = pick(30) == 0 ? StorageTier::HostPinned : StorageTier::Device;
      idx.apply(store_doc(who, pick(docs), 1 + static_cast<uint32_t>(pick(64)), tier));
    };
    for (uint32_t k = 0; k < 3 * n; ++k) store_random();
    for (int step = 0; step < 40; ++step) {
      const uint64_t op = pick(10);
      if (op < 5) {  // a load changes
        const WorkerId id{pick(n)};
        if (c.workers.count(id)) fleet.upsert(id, c.workers[id] = random_state(rng, ties));
      } else if (op == 5) {  // a worker leaves
        const WorkerId id{pick(n)};
        if (c.workers.erase(id)) CHECK(fleet.erase(id));
      } else if (op == 6) {  // a worker joins (its blocks may be indexed already)
        const WorkerId id{pick(n)};
        if (!c.workers.count(id)) fleet.upsert(id, c.workers[id] = random_state(rng, ties));
      } else {
        store_random();
      }
      std::vector<LocalBlockHash> q;
      const uint64_t d = pick(docs);
      for (uint32_t i = 0, len = 1 + static_cast<uint32_t>(pick(80)); i < len; ++i) q.push_back(LocalBlockHash{d * 1000 + i + 1});
      MatchLayers m;
      idx.find_match_layers(q, m);
      c.owners = idx.find_matches(q).owners;
      c.isl = static_cast<uint32_t>(q.size() * c.block - pick(c.block));
      c.limit = 1 + pick(4);
      std::vector<Candidate> cands;
      const uint64_t seed = rng();
      const Decision ref = reference(c, seed, cands);
      SeededRandom rnd(seed);
      RankedDecision fast;
      fleet.decide(m, c.isl, c.block, c.cfg, rnd, c.limit, fast);
      INFO("trial " << trial << " step " << step << " layers " << m.layers.size() << " listed " << m.extra.size());
      REQUIRE(fast.ranked.size() == ref.ranking.size());
      for (size_t k = 0; k < ref.ranking.size(); ++k) {
        const auto& want = cands[ref.ranking[k]];
        CHECK(fast.ranked[k].worker == want.owner.worker);
        CHECK(fast.ranked[k].overlap_blocks == want.overlap_blocks);
        CHECK(fast.ranked[k].overlap_by_tier == want.overlap_by_tier);
        CHECK(fast.ranked[k].dp_rank == want.owner.dp_rank);
        CHECK(fast.ranked[k].score.cost == doctest::Approx(ref.scores[ref.ranking[k]].cost));
      }
      uint32_t best = 0;
      for (size_t i = 0; i < cands.size(); ++i)
        if (ref.scores[i].excluded == Exclusion::None) best = std::max(best, cands[i].overlap_blocks);
      CHECK(fast.best_overlap_blocks == best);
      ++decisions;
      for (const auto& l : m.layers) with_large += l.set->owners.size() > RankedCandidates::kSmallGroup;
      walked += fast.scored < c.workers.size();
    }
  }
  CHECK(decisions == 2400);
  CHECK(with_large > 500);  // large layers (bitmaps) are exercised...
  CHECK(walked > 1000);     // ...and the early stop
}

TEST_CASE("a cached layer bitmap follows workers joining and leaving") {
  // 40 workers hold a 64-block document (one large layer); worker 0 is not
  // in the fleet yet.
  RadixIndexer idx;
  for (uint64_t w = 0; w < 40; ++w) idx.apply(store_doc(CacheOwner{WorkerId{w}, 0}, 1, 64, StorageTier::Device));
  std::vector<LocalBlockHash> q;
  for (uint32_t i = 0; i < 64; ++i) q.push_back(LocalBlockHash{1000 + i + 1});
  MatchLayers m;
  idx.find_match_layers(q, m);
  REQUIRE(m.layers.size() == 1);
  REQUIRE(m.layers[0].set->owners.size() == 40);
  RankedCandidates fleet;
  SchedulerConfig cfg;
  CandidateState busy, idle;
  busy.load = WorkerLoad{8, 16, 0, 500, 1000};
  idle.load = WorkerLoad{0, 16, 0, 0, 1000};
  for (uint64_t w = 1; w < 40; ++w) fleet.upsert(WorkerId{w}, busy);
  SeededRandom rnd(5);
  RankedDecision d;
  fleet.decide(m, 1024, 16, cfg, rnd, 1, d);  // caches the layer's bitmap
  REQUIRE(d.ranked.size() == 1);
  CHECK(d.ranked[0].overlap_blocks == 64);
  // Worker 0 joins, idle: it holds the whole prompt and wins.
  fleet.upsert(WorkerId{0}, idle);
  fleet.decide(m, 1024, 16, cfg, rnd, 1, d);
  REQUIRE(d.ranked.size() == 1);
  CHECK(d.ranked[0].worker == WorkerId{0});
  CHECK(d.ranked[0].overlap_blocks == 64);
  // Worker 0 leaves and worker 99 (holding nothing) takes its slot, idle: it
  // must not inherit worker 0's overlap.
  CHECK(fleet.erase(WorkerId{0}));
  fleet.upsert(WorkerId{99}, idle);
  cfg.alpha_balanced = cfg.alpha_imbalanced = 0.0;  // only the prefill term: overlap decides
  fleet.decide(m, 1024, 16, cfg, rnd, 40, d);
  bool seen = false;
  for (const auto& p : d.ranked)
    if (p.worker == WorkerId{99}) {
      seen = true;
      CHECK(p.overlap_blocks == 0);
    }
  CHECK(seen);
  CHECK(d.ranked.back().worker == WorkerId{99});
}
