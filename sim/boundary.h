// Searches for the boundary of a monotone property over a number (an arrival
// rate, a fleet size), shared by `kvroute-sim goodput`, the load levels of
// `targets` (sim/load_levels.cpp) and the planner's smallest fleet
// (sim/plan.cpp). Pure functions; any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

namespace kvroute::sim {

// The boundary of a monotone property, the one search `goodput`, the load
// levels and the planner's fleet size share: from `start` it steps away from
// the boundary (`up` or `down`: the next value, none past the range's end)
// until the property changes, then probes `mid` of the bracket until it
// answers none. `holds_below`: the property holds below the boundary (a rate:
// more load never helps) or above it (a fleet size: more workers never hurt).
// One call of `meets` per value tried, in that order.
struct Bracket {
  double holds = 0;  // the value seen holding it nearest the boundary (0: none in range)
  double fails = 0;  // the value seen failing it nearest the boundary (0: none in range)
};
struct BoundarySearch {
  double start = 1;
  bool holds_below = true;
  std::function<std::optional<double>(double)> up, down;
  std::function<std::optional<double>(double holds, double fails)> mid;
};
Bracket find_boundary(const std::function<bool(double)>& meets, const BoundarySearch& s);

// find_boundary over the arrival-rate multiplier for a property that holds at
// low rates and fails at high ones: from x1 it doubles or halves until the
// property changes (within x1/64 .. x256), then halves the bracket `steps`
// times.
inline constexpr double kLowestRate = 1.0 / 64, kHighestRate = 256;
struct RateBracket {
  double lo = 0;  // the highest rate seen meeting it (0: none down to kLowestRate)
  double hi = 0;  // the lowest rate seen missing it (0: none up to kHighestRate)
};
RateBracket bisect_rate(const std::function<bool(double)>& meets, int steps);

// Fleet sizes 1..kMaxFleet, more workers never hurting: from `start` halving
// (or doubling, up to kMaxFleet), then integer bisection (the planner's
// smallest fleet meeting the SLO).
inline constexpr uint32_t kMaxFleet = 256;
BoundarySearch fleet_search(uint32_t start);

}  // namespace kvroute::sim
