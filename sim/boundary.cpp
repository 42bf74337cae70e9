#include "sim/boundary.h"

#include <algorithm>
#include <cmath>

namespace kvroute::sim {

Bracket find_boundary(const std::function<bool(double)>& meets, const BoundarySearch& s) {
  Bracket b;
  double x = s.start;
  const bool at_start = meets(x);
  (at_start ? b.holds : b.fails) = x;
  // Away from the boundary: up while holding below it (or failing above it).
  const auto& away = at_start == s.holds_below ? s.up : s.down;
  for (auto next = away(x); next; next = away(x)) {
    x = *next;
    if (meets(x) != at_start) {
      (at_start ? b.fails : b.holds) = x;
      break;
    }
    (at_start ? b.holds : b.fails) = x;
  }
  if (b.holds == 0 || b.fails == 0) return b;  // the property does not change within the range
  for (auto m = s.mid(b.holds, b.fails); m; m = s.mid(b.holds, b.fails)) (meets(*m) ? b.holds : b.fails) = *m;
  return b;
}

RateBracket bisect_rate(const std::function<bool(double)>& meets, int steps) {
  int left = steps;
  BoundarySearch s;
  s.start = 1;
  s.holds_below = true;
  s.up = [](double r) { return r * 2 <= kHighestRate ? std::optional(r * 2) : std::nullopt; };
  s.down = [](double r) { return r / 2 >= kLowestRate ? std::optional(r / 2) : std::nullopt; };
  s.mid = [&left](double lo, double hi) { return left-- > 0 ? std::optional(0.5 * (lo + hi)) : std::nullopt; };
  const Bracket b = find_boundary(meets, s);
  return RateBracket{b.holds, b.fails};
}

BoundarySearch fleet_search(uint32_t start) {
  BoundarySearch s;
  s.start = start;
  s.holds_below = false;
  s.up = [](double n) { return n < kMaxFleet ? std::optional(std::min<double>(kMaxFleet, n * 2)) : std::nullopt; };
  s.down = [](double n) { return n > 1 ? std::optional(std::floor(n / 2)) : std::nullopt; };
  s.mid = [](double holds, double fails) {
    const auto hi = static_cast<uint32_t>(holds), lo = static_cast<uint32_t>(fails);
    return hi - lo > 1 ? std::optional<double>(lo + (hi - lo) / 2) : std::nullopt;
  };
  return s;
}

}  // namespace kvroute::sim
