// Test helper: two Decisions agree field by field (scores compared exactly:
// the same inputs must give the same doubles). Used where a reused Decision
// or RouteResult is checked against a fresh one.
#pragma once

#include <doctest/doctest.h>

#include "scheduler/scheduler.h"

namespace kvroute {

inline void check_same_decision(const Decision& reused, const Decision& fresh) {
  CHECK(reused.chosen == fresh.chosen);
  CHECK(reused.ranking == fresh.ranking);
  CHECK(reused.alpha == fresh.alpha);
  CHECK(reused.load_mean == fresh.load_mean);
  CHECK(reused.load_std == fresh.load_std);
  CHECK(reused.sampled == fresh.sampled);
  REQUIRE(reused.scores.size() == fresh.scores.size());
  for (size_t i = 0; i < fresh.scores.size(); ++i) {
    const auto &x = reused.scores[i], &y = fresh.scores[i];
    CHECK(x.excluded == y.excluded);
    CHECK(x.cached_tokens == y.cached_tokens);
    CHECK(x.load_ratio == y.load_ratio);
    CHECK(x.load_deviation == y.load_deviation);
    CHECK(x.prefill_ratio == y.prefill_ratio);
    CHECK(x.slot_ratio == y.slot_ratio);
    CHECK(x.queue_ratio == y.queue_ratio);
    CHECK(x.eviction_share == y.eviction_share);
    CHECK(x.cost == y.cost);
  }
}

}  // namespace kvroute
