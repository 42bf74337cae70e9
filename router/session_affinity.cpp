#include "router/session_affinity.h"

#include <algorithm>

namespace kvroute {

namespace {

// Index into r.candidates of `worker`, if it is an eligible candidate.
long eligible_index(const RouteResult& r, WorkerId worker) {
  for (size_t i = 0; i < r.candidates.size(); ++i)
    if (r.candidates[i].owner.worker == worker)
      return i < r.decision.scores.size() && r.decision.scores[i].excluded == Exclusion::None ? static_cast<long>(i)
                                                                                              : -1;
  return -1;
}

// Moves candidate i to the front of r.ranked (adding its target if the
// ranking was cut short) and makes it the decision.
void promote(RouteResult& r, size_t i, uint32_t block_size) {
  const auto& c = r.candidates[i];
  auto it = std::find_if(r.ranked.begin(), r.ranked.end(), [&](const RouteTarget& t) { return t.worker == c.owner.worker; });
  RouteTarget t;
  if (it != r.ranked.end()) {
    t = *it;
    r.ranked.erase(it);
  } else {
    t = route_target(c.owner.worker, *r.workers[i].info, c.overlap_blocks, c.overlap_by_tier, c.owner.dp_rank,
                     r.isl_tokens, block_size);
  }
  r.ranked.insert(r.ranked.begin(), t);
  r.decision.chosen = i;
}

}  // namespace

bool SessionAffinity::apply(std::string_view session, uint32_t block_size, RouteResult& r) {
  if (session.empty() || !r.ok || r.ranked.empty() || !r.decision.chosen) return false;
  std::lock_guard lk(mu_);
  const WorkerId* found = sessions_.find(session);
  bool overrode = false;
  if (found && *found != r.ranked.front().worker) {
    const long i = eligible_index(r, *found);
    const auto& best = r.decision.scores[*r.decision.chosen];
    if (i >= 0 && r.decision.scores[static_cast<size_t>(i)].predicted_ttft_ms <=
                      kOverloadFactor * best.predicted_ttft_ms + kOverloadSlackMs) {
      promote(r, static_cast<size_t>(i), block_size);
      overrode = true;
    }
  }
  sessions_.put(session, r.ranked.front().worker);
  return overrode;
}

size_t SessionAffinity::size() const {
  std::lock_guard lk(mu_);
  return sessions_.size();
}

}  // namespace kvroute
