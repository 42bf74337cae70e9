// sim/boundary.h: find_boundary, the one search goodput, the load levels
// (bisect_rate) and the planner's smallest fleet (fleet_search) share, on
// synthetic monotone properties against a plain scan.
#include "sim/boundary.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace kvroute::sim;

TEST_CASE("bisect_rate brackets a rate threshold from x1 and halves the bracket `steps` times") {
  for (const double threshold : {0.01, 0.3, 1.0, 3.3, 100.0, 300.0}) {
    CAPTURE(threshold);
    std::vector<double> tried;
    const RateBracket b = bisect_rate([&](double r) { tried.push_back(r); return r <= threshold; }, 5);
    REQUIRE_FALSE(tried.empty());
    CHECK(tried.front() == 1);
    if (threshold < kLowestRate) {
      CHECK(b.lo == 0);
      CHECK(b.hi == kLowestRate);
    } else if (threshold >= kHighestRate) {
      CHECK(b.hi == 0);
      CHECK(b.lo == kHighestRate);
    } else {
      CHECK(b.lo <= threshold);
      CHECK(b.hi > threshold);
      // The doubling (or halving) bracket is [2^k, 2^(k+1)] around the threshold: 5 halvings leave 1/32 of it.
      CHECK(b.hi - b.lo == doctest::Approx(std::exp2(std::floor(std::log2(threshold))) / 32).epsilon(1e-9));
    }
  }
}

TEST_CASE("fleet_search finds the smallest fleet a scan finds, from any start, and tries each size once") {
  for (const uint32_t start : {1u, 4u, 8u, 100u, 256u}) {
    for (uint32_t need = 1; need <= 260; ++need) {
      CAPTURE(start);
      CAPTURE(need);
      std::vector<double> tried;
      const Bracket b = find_boundary([&](double n) { tried.push_back(n); return n >= need; }, fleet_search(start));
      CHECK(tried.front() == start);
      std::vector<double> sorted = tried;
      std::sort(sorted.begin(), sorted.end());
      CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
      if (need > 256) {
        CHECK(b.holds == 0);
        continue;
      }
      CHECK(b.holds == need);
      if (need > 1) CHECK(b.fails == need - 1);
    }
  }
}
