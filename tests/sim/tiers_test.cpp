// sim/tiers.h: the tiers' eviction orders (LRU, and the workload-aware
// policy on a hand-computed case), the reuse profile, the request categories,
// and in the simulator (sim/simulate.h) a prefix loaded from a host tier or a
// shared pool at the tier's bandwidth instead of recomputed.
#include "sim/tiers.h"

#include <cmath>
#include <limits>

#include <doctest/doctest.h>

#include "sim/simulate.h"

using namespace kvroute::sim;

namespace {

TierCache::Block blk(uint64_t h, uint8_t category, uint32_t depth, double last_ms) {
  return TierCache::Block{h, category, depth, last_ms};
}

std::vector<uint64_t> hashes(const std::vector<TierCache::Block>& v) {
  std::vector<uint64_t> out;
  for (const auto& b : v) out.push_back(b.hash);
  return out;
}

// Two categories: 0 reused half the time after 10 s on average, dead after
// 60 s; 1 reused 90 % of the time after 100 s on average, dead after 600 s.
ReuseProfiles two_profiles() {
  ReuseProfiles p{};
  p[0] = ReuseProfile{0.5, 10'000, 60'000};
  p[1] = ReuseProfile{0.9, 100'000, 600'000};
  return p;
}

}  // namespace

TEST_CASE("reuse probability: the exponential fit given the idle time, zero past the lifetime") {
  const ReuseProfile p{0.5, 10'000, 60'000};
  CHECK(p.reuse_probability(0) == doctest::Approx(0.5));
  // q = 0.5 e^-2 = 0.067668; q / (q + 0.5) = 0.119203
  CHECK(p.reuse_probability(20'000) == doctest::Approx(0.119203).epsilon(1e-5));
  CHECK(p.reuse_probability(60'001) == 0);
  CHECK(ReuseProfile{}.reuse_probability(0) == 0);  // never reused
}

TEST_CASE("LRU tier: evicts the least recently stored or loaded block first") {
  TierCache c(3, Eviction::Lru);
  std::vector<TierCache::Block> ev;
  c.put(blk(1, 0, 0, 0), 0, ev);
  c.put(blk(2, 1, 3, 0), 0, ev);
  c.put(blk(3, 0, 5, 50'000), 50'000, ev);
  c.touch(1, 60'000, 0);  // a load: block 1 is the most recent now
  c.put(blk(4, 0, 0, 70'000), 70'000, ev);
  c.put(blk(5, 1, 0, 70'000), 70'000, ev);
  CHECK(hashes(ev) == std::vector<uint64_t>{2, 3});
  CHECK(c.size() == 3);
  CHECK(c.contains(1));
}

TEST_CASE("workload-aware tier: evicts by reuse probability of the category at the block's age, then deeper first") {
  // Hand-computed at t = 70 s (two_profiles):
  //   A (category 0, idle 70 s): past category 0's 60 s lifetime -> 0
  //   B (category 1, idle 70 s): q = 0.9 e^-0.7 = 0.44690 -> 0.44690 / 0.54690 = 0.8172
  //   C (category 0, idle 20 s): q = 0.5 e^-2 = 0.06767 -> 0.1192
  // so A goes first, then C (its queue's head once A is gone), though B was
  // used before C: LRU would evict A, B, C.
  const ReuseProfiles p = two_profiles();
  TierCache wa(3, Eviction::WorkloadAware, &p);
  TierCache lru(3, Eviction::Lru);
  std::vector<TierCache::Block> ev_wa, ev_lru;
  for (auto* c : {&wa, &lru}) {
    auto& ev = c == &wa ? ev_wa : ev_lru;
    c->put(blk(0xA, 0, 0, 0), 0, ev);
    c->put(blk(0xB, 1, 3, 0), 0, ev);
    c->put(blk(0xC, 0, 5, 50'000), 50'000, ev);
  }
  CHECK(wa.victim(70'000).hash == 0xA);
  // D (category 0, used now) comes in: A out. Then E (category 1, used now): the heads are C (0.1192)
  // and B (0.8172): C out. Then F: the heads are D (category 0, idle 0: 0.5) and B (0.8172): D out.
  for (auto* c : {&wa, &lru}) {
    auto& ev = c == &wa ? ev_wa : ev_lru;
    c->put(blk(0xD, 0, 0, 70'000), 70'000, ev);
    c->put(blk(0xE, 1, 0, 70'000), 70'000, ev);
    c->put(blk(0xF, 1, 0, 70'000), 70'000, ev);
  }
  CHECK(hashes(ev_wa) == std::vector<uint64_t>{0xA, 0xC, 0xD});
  CHECK(hashes(ev_lru) == std::vector<uint64_t>{0xA, 0xB, 0xC});
}

TEST_CASE("workload-aware tier: among equally unlikely blocks the deeper one goes first (the paper's -offset)") {
  const ReuseProfiles p = two_profiles();
  TierCache wa(2, Eviction::WorkloadAware, &p);
  std::vector<TierCache::Block> ev;
  wa.put(blk(1, 0, 2, 0), 0, ev);     // category 0, depth 2: dead after 60 s
  wa.put(blk(2, 1, 9, 0), 0, ev);     // category 1, depth 9: dead after 600 s
  CHECK(wa.victim(700'000).hash == 2);  // both past their lifetimes: probability 0; depth 9 > 2
  CHECK(wa.victim(1'000).hash == 1);    // category 0 is less likely at 1 s: 0.45 vs 0.90
}

TEST_CASE("request categories: the turn estimated from the prefixes a prompt extends") {
  std::vector<SimRequest> w(5);
  w[0].ids = {1, 2};        // turn 1
  w[1].ids = {1, 2, 3, 4};  // extends request 0's prompt: turn 2
  w[2].ids = {1, 2, 3, 4, 5, 6};  // extends 0 and 1: turn 3
  w[3].ids = {1, 7};        // shares a block but extends nothing: turn 1
  w[4].ids = {1, 2, 3, 4, 5, 6, 8};  // extends 0, 1, 2: turn 4 (bucket 3-5)
  CHECK(request_categories(w) == std::vector<uint8_t>{0, 1, 2, 0, 2});
}

TEST_CASE("reuse profiles: fit from the accesses and the time to the next access") {
  std::vector<SimRequest> w(3);
  w[0].t_ms = 0, w[0].ids = {1, 2};
  w[1].t_ms = 1000, w[1].ids = {1, 2, 3};  // category 1 (extends request 0)
  w[2].t_ms = 4000, w[2].ids = {1, 9};     // category 0
  const ReuseProfiles p = fit_reuse_profiles(w);
  // Category 0's accesses: 1, 2 (request 0), 1, 9 (request 2); reused: 1 and 2 (after 1 s): p = 2/4.
  CHECK(p[0].p_reuse == doctest::Approx(0.5));
  CHECK(p[0].mean_ms == doctest::Approx(1000));
  // Category 1's accesses: 1, 2, 3; reused: 1 (after 3 s): p = 1/3.
  CHECK(p[1].p_reuse == doctest::Approx(1.0 / 3));
  CHECK(p[1].mean_ms == doctest::Approx(3000));
  CHECK(p[1].life_ms == doctest::Approx(3000));
}

namespace {

SimRequest prompt(double t_ms, uint64_t first_id) {
  SimRequest r;
  r.t_ms = t_ms;
  r.input_tokens = 8 * kBlock + 100;  // 8 complete blocks and 100 tokens
  r.output_tokens = 1;
  for (uint64_t i = 0; i < 8; ++i) r.ids.push_back(first_id + i);
  return r;
}

// A (8 blocks), B (8 other blocks) 10 s later, A again 10 s after that.
std::vector<SimRequest> a_b_a() { return {prompt(0, 100), prompt(10'000, 200), prompt(20'000, 100)}; }

// `workers` engines of the h100-llama3-8b profile with `kv_blocks` blocks each, no tiers.
SimOptions engines(uint32_t workers, uint64_t kv_blocks) {
  SimOptions o;
  o.workers = workers;
  o.kv_blocks = kv_blocks;
  o.engine_profile = "h100-llama3-8b";
  return o;
}

}  // namespace

TEST_CASE("host tier: a prefix the device evicted is loaded at the host's bandwidth, not recomputed") {
  // One engine of 12 blocks. A (8 blocks) is computed; B (8 other blocks)
  // evicts A's last 5 blocks (tail first); C repeats A's prompt. Without a
  // host tier C recomputes those 5 blocks; with one, they come back in
  // load_ms(5 blocks), and C computes only its last 100 tokens.
  const std::vector<SimRequest> w = a_b_a();
  SimOptions o = engines(1, 12);
  const auto plain = simulate(w, o, "round_robin");
  o.tiers.host_blocks = 100;
  o.tiers.host_gb_per_s = 25;
  const auto tiered = simulate(w, o, "round_robin");

  const double load = load_ms(5 * kBlock, 131072, 25);
  CHECK(load == doctest::Approx(5 * 512 * 131072.0 / 25e9 * 1000));  // 13.4 ms
  CHECK(tiered.load_ms_mean == doctest::Approx(load));
  CHECK(tiered.host_hit_rate == doctest::Approx(5.0 / 24));
  CHECK(tiered.pool_hit_rate == 0);
  CHECK(plain.host_hit_rate == 0);
  // Hits: C's 3 blocks on the device, + its 5 loaded ones with the tier.
  CHECK(plain.hit_rate == doctest::Approx(3.0 / 24));
  CHECK(tiered.hit_rate == doctest::Approx(8.0 / 24));
  const auto& p = engine_config(o).profile;
  // The engine is idle when the load completes: the placeholder starts a
  // step of its own (one token), and C's last 100 tokens are the next step.
  kvroute::mocker::StepShape placeholder, own;
  placeholder.add_chunk(1, 8 * kBlock);
  own.add_chunk(100, 8 * kBlock);
  REQUIRE(tiered.ttft_ms.size() == 3);
  CHECK(tiered.ttft_ms[2] == doctest::Approx(load + p.step_ms(placeholder) + p.step_ms(own)));
  // Recomputing 5 blocks costs far more than loading them.
  own = {};
  own.add_chunk(5 * kBlock + 100, 3 * kBlock);
  CHECK(plain.ttft_ms[2] == doctest::Approx(p.step_ms(own)));
  CHECK(plain.ttft_ms[2] > 2 * tiered.ttft_ms[2]);
}

TEST_CASE("tiers as the router sees them: the index holds device, host_pinned and external copies") {
  // The host case above, routed by kvroute: the index's view of C's prefix
  // is its 3 device blocks and the 5 demoted to the host tier.
  const std::vector<SimRequest> w = a_b_a();
  SimOptions o = engines(1, 12);
  o.tiers.host_blocks = 100;
  auto res = simulate(w, o, "kvroute");
  using T = kvroute::StorageTier;
  CHECK(res.routed_overlap_by_tier[size_t(T::Device)] == 3);
  CHECK(res.routed_overlap_by_tier[size_t(T::HostPinned)] == 5);
  CHECK(res.routed_overlap_by_tier[size_t(T::External)] == 0);
  CHECK(res.host_hit_rate == doctest::Approx(5.0 / 24));
  // A pool instead: B evicts all of A (9 blocks of room), so C's whole prefix is in the pool.
  o.kv_blocks = 9;
  o.tiers.host_blocks = 0;
  o.tiers.pool_blocks = 100;
  res = simulate(w, o, "kvroute");
  CHECK(res.routed_overlap_by_tier[size_t(T::Device)] == 0);
  CHECK(res.routed_overlap_by_tier[size_t(T::HostPinned)] == 0);
  CHECK(res.routed_overlap_by_tier[size_t(T::External)] == 8);
  CHECK(res.pool_hit_rate == doctest::Approx(8.0 / 24));
  // Without tiers the index forgets what the device evicted.
  o.tiers.pool_blocks = 0;
  res = simulate(w, o, "kvroute");
  CHECK(res.routed_overlap_by_tier == std::array<uint64_t, kvroute::kNumStorageTiers>{});
}

TEST_CASE("write-through host: every computed block takes host room, so a small host keeps less of what the device evicted") {
  // The case above with a host of 8 blocks. Written back, it receives only
  // the 5 blocks of A that B evicts: C finds them there. Written through, it
  // receives A's 8 blocks and then B's 8, which push A's out (LRU): C finds
  // only its 3 device blocks. With room for both (16), the two agree.
  const std::vector<SimRequest> w = a_b_a();
  SimOptions o = engines(1, 12);
  o.tiers.host_blocks = 8;
  using T = kvroute::StorageTier;
  auto res = simulate(w, o, "kvroute");
  CHECK(res.routed_overlap_by_tier[size_t(T::HostPinned)] == 5);
  CHECK(res.host_hit_rate == doctest::Approx(5.0 / 24));
  o.tiers.host_write_through = true;
  res = simulate(w, o, "kvroute");
  CHECK(res.routed_overlap_by_tier[size_t(T::Device)] == 3);
  CHECK(res.routed_overlap_by_tier[size_t(T::HostPinned)] == 0);
  CHECK(res.host_hit_rate == 0);
  o.tiers.host_blocks = 16;
  res = simulate(w, o, "kvroute");
  CHECK(res.routed_overlap_by_tier[size_t(T::HostPinned)] == 5);
  CHECK(res.host_hit_rate == doctest::Approx(5.0 / 24));
}

TEST_CASE("shared pool: a prefix one worker computed is loaded by another from the pool") {
  // Two engines of 9 blocks, round robin: A on 0, a filler on 1, B on 0
  // evicting all of A (into the pool), then A again on 1, which has never
  // seen it: every block comes from the pool at the pool's bandwidth.
  const std::vector<SimRequest> w = {prompt(0, 100), prompt(5'000, 300), prompt(10'000, 200),
                                     prompt(20'000, 100)};
  SimOptions o = engines(2, 9);
  o.tiers.pool_blocks = 1000;
  o.tiers.pool_gb_per_s = 10;
  const auto res = simulate(w, o, "round_robin");
  CHECK(res.pool_hit_rate == doctest::Approx(8.0 / 32));
  CHECK(res.host_hit_rate == 0);
  CHECK(res.load_ms_mean == doctest::Approx(load_ms(8 * kBlock, 131072, 10)));
  CHECK(res.hit_rate == doctest::Approx(8.0 / 32));
  o.tiers.pool_blocks = 0;
  CHECK(simulate(w, o, "round_robin").hit_rate == 0);
}

TEST_CASE("write-through pool: a block is in the pool as soon as a device computes it") {
  // Round robin over two roomy engines: A on 0, A again on 1. Nothing is
  // evicted, so only a pool written through at compute time holds A.
  const std::vector<SimRequest> w = {prompt(0, 100), prompt(10'000, 100)};
  SimOptions o = engines(2, 100);
  o.tiers.pool_blocks = 1000;
  CHECK(simulate(w, o, "round_robin").pool_hit_rate == 0);
  o.tiers.pool_write_through = true;
  const auto res = simulate(w, o, "round_robin");
  CHECK(res.pool_hit_rate == doctest::Approx(8.0 / 16));
  CHECK(res.hit_rate == doctest::Approx(8.0 / 16));
}

TEST_CASE("a pool's bandwidth is shared by the loads in flight; a worker's own link carries one load at a time") {
  constexpr double kBytes = 1000;
  // A pool of 10 bytes/ms in total, each worker's link 10 bytes/ms.
  SharedBandwidth b(10, 10, 4);
  CHECK(b.next_done() == std::numeric_limits<double>::infinity());
  b.start(0, 7, kBytes, 0);
  CHECK(b.next_done() == doctest::Approx(100));  // alone: the whole bandwidth
  b.start(1, 8, kBytes, 50);                     // half done; the two now share 10 bytes/ms
  CHECK(b.next_done() == doctest::Approx(150));  // 500 left at 5 bytes/ms
  CHECK(b.finish(b.next_done()) == 7);
  CHECK(b.next_done() == doctest::Approx(200));  // 500 left, alone again at 10 bytes/ms
  // Worker 1's next load waits for its first, then has the pool to itself.
  b.start(1, 9, kBytes, 160);
  CHECK(b.finish(b.next_done()) == 8);
  CHECK(b.next_done() == doctest::Approx(300));
  CHECK(b.finish(b.next_done()) == 9);
  CHECK(b.in_flight() == 0);
  // A pool four links wide: two loads at once each get a full link.
  SharedBandwidth wide(40, 10, 2);
  wide.start(0, 1, kBytes, 0);
  wide.start(1, 2, kBytes, 0);
  CHECK(wide.next_done() == doctest::Approx(100));
}

TEST_CASE("two workers loading from the pool at once share its bandwidth; a pool twice as wide serves both in full") {
  // Round robin over three roomy engines, the pool written through: A on 0,
  // then A on 1 and on 2 at the same moment, both loading its 8 blocks from the pool.
  const std::vector<SimRequest> w = {prompt(0, 100), prompt(10'000, 100), prompt(10'000, 100)};
  SimOptions o = engines(3, 100);
  o.tiers.pool_blocks = 1000;
  o.tiers.pool_write_through = true;
  o.tiers.pool_gb_per_s = 10;
  const double alone = load_ms(8 * kBlock, 131072, 10);
  auto res = simulate(w, o, "round_robin");
  CHECK(res.pool_hit_rate == doctest::Approx(16.0 / 24));
  CHECK(res.load_ms_mean == doctest::Approx(2 * alone));  // both at half the bandwidth
  o.tiers.pool_total_gb_per_s = 20;
  res = simulate(w, o, "round_robin");
  CHECK(res.load_ms_mean == doctest::Approx(alone));
}
