#include "router/api/response_affinity.h"

#include <algorithm>

namespace kvroute {

std::optional<WorkerId> ResponseAffinity::find(std::string_view id) {
  std::lock_guard lk(mu_);
  const WorkerId* w = ids_.find(id);
  return w ? std::optional<WorkerId>(*w) : std::nullopt;
}

void ResponseAffinity::remember(std::string_view id, WorkerId worker) {
  if (id.empty() || id.size() > kMaxIdBytes) return;
  std::lock_guard lk(mu_);
  ids_.put(id, worker);
}

size_t ResponseAffinity::size() const {
  std::lock_guard lk(mu_);
  return ids_.size();
}

void ResponseAffinity::set_max_ids(size_t max_ids) {
  std::lock_guard lk(mu_);
  if (ids_.capacity() != (max_ids ? max_ids : 1)) ids_.set_capacity(max_ids);
}

ResponseAffinity::Pin ResponseAffinity::pin(WorkerId worker, uint32_t block_size, RouteResult& r) {
  if (!r.ok || r.ranked.empty()) return Pin::WorkerGone;
  if (r.ranked.front().worker == worker) return Pin::Pinned;
  size_t i = 0;
  while (i < r.candidates.size() && r.candidates[i].owner.worker != worker) ++i;
  if (i == r.candidates.size() || !r.workers[i].info) return Pin::WorkerGone;
  const auto& c = r.candidates[i];
  const auto it =
      std::find_if(r.ranked.begin(), r.ranked.end(), [&](const RouteTarget& t) { return t.worker == worker; });
  RouteTarget t;
  if (it != r.ranked.end()) {
    t = *it;
    r.ranked.erase(it);
  } else {
    t = route_target(worker, *r.workers[i].info, c.overlap_blocks, c.overlap_by_tier, c.owner.dp_rank, r.isl_tokens,
                     block_size);
  }
  r.ranked.insert(r.ranked.begin(), t);
  r.decision.chosen = i;
  return Pin::Pinned;
}

std::string_view to_string(ResponseAffinity::Pin p) {
  switch (p) {
    case ResponseAffinity::Pin::Pinned: return "pinned";
    case ResponseAffinity::Pin::Unknown: return "unknown";
    case ResponseAffinity::Pin::WorkerGone: return "worker_gone";
  }
  return "unknown";
}

}  // namespace kvroute
