// sim/hit_bound.h: the fleet's hit-rate bound (Belady's MIN) and the one-LRU
// reference on hand-computed sequences, and the bound against the infinite
// cache on a generated workload.
#include "sim/hit_bound.h"

#include <doctest/doctest.h>

using namespace kvroute::sim;

namespace {

SimRequest req(std::vector<uint64_t> ids) {
  SimRequest r;
  r.input_tokens = static_cast<uint32_t>(ids.size() * kBlock);
  r.ids = std::move(ids);
  return r;
}

}  // namespace

TEST_CASE("hit bound: MIN keeps what comes back soonest, LRU thrashes on a cycle one longer than the cache") {
  // One block each: A B C A B C with room for two. MIN keeps A and B past C
  // (C's next use is farthest) and hits A and B: 2 of 6. LRU evicts each block
  // just before it is wanted again: 0.
  const std::vector<SimRequest> w = {req({1}), req({2}), req({3}), req({1}), req({2}), req({3})};
  const auto b = hit_bound(w, 2);
  CHECK(b.capacity_blocks == 2);
  CHECK(b.optimal == doctest::Approx(2.0 / 6));
  CHECK(b.pooled_lru == doctest::Approx(0.0));
}

TEST_CASE("hit bound: prefixes, a cache of one block, and no room at all") {
  // The same two-block prompt twice: four accesses, the second prompt's two blocks reusable.
  const std::vector<SimRequest> w = {req({7, 8}), req({7, 8})};
  CHECK(hit_bound(w, 2).optimal == doctest::Approx(0.5));
  CHECK(hit_bound(w, 2).pooled_lru == doctest::Approx(0.5));
  // Room for one: MIN keeps the first block (needed sooner) and hits it once.
  // LRU frees the prompt last block first, so the first block stays: one prefix hit.
  CHECK(hit_bound(w, 1).optimal == doctest::Approx(0.25));
  CHECK(hit_bound(w, 1).pooled_lru == doctest::Approx(0.25));
  CHECK(hit_bound(w, 0).optimal == 0);
  CHECK(hit_bound(w, 0).pooled_lru == 0);
  // A block after a missed one counts for MIN (a bound), not for LRU's prefix hits:
  // [1,2] then [3,2] chains differently (2 after 3 is another prefix), so nothing repeats.
  CHECK(hit_bound({req({1, 2}), req({3, 2})}, 4).optimal == 0);
}

TEST_CASE("hit bound: with room for everything it is the infinite cache's hit rate, and it grows with the room") {
  const auto w = make_workload("api", "", 1, 800);
  const double ideal = ideal_hit_rate(w);
  REQUIRE(ideal > 0.5);
  CHECK(hit_bound(w, 1u << 30).optimal == doctest::Approx(ideal));
  double last = -1;
  for (uint64_t cap : {0u, 50u, 200u, 1000u, 5000u}) {
    const auto b = hit_bound(w, cap);
    CHECK(b.optimal >= last);
    CHECK(b.pooled_lru <= b.optimal + 1e-12);  // MIN is the best a demand-paged cache of that size does
    last = b.optimal;
  }
}
