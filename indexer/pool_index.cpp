#include "indexer/pool_index.h"

#include <algorithm>
#include <cassert>

namespace kvroute {

namespace {

// A member's own prefix, continued in the pool's tier as far as the pool holds the prompt.
void continue_with_pool(OwnerOverlap& o, const OwnerOverlap& pool, StorageTier tier) {
  if (o.blocks >= pool.blocks) return;
  // All-zero tiers mean "all device" (scheduler.h): make that explicit first.
  uint32_t sum = 0;
  for (uint32_t t : o.by_tier) sum += t;
  if (sum == 0) o.by_tier[0] = o.blocks;
  o.by_tier[static_cast<size_t>(tier)] += pool.blocks - o.blocks;
  o.blocks = pool.blocks;
}

bool is_pool_owner(const CacheOwner& o) {
  return PoolIndex::is_reserved(o.worker) && o.dp_rank == PoolIndex::kPoolRank;
}

}  // namespace


PoolIndex::PoolIndex(Indexer& inner, std::vector<PoolSpec> pools) : inner_(inner), pools_(std::move(pools)) {
  assert(pools_.size() <= static_cast<size_t>(kMaxPools));
  live_.resize(pools_.size());
  sync_.resize(pools_.size());
  for (uint32_t p = 0; p < pools_.size(); ++p)
    for (WorkerId w : pools_[p].members) member_of_.emplace(w.value, p);
}

int PoolIndex::pool_of(WorkerId worker) const {
  const auto it = member_of_.find(worker.value);
  return it == member_of_.end() ? -1 : static_cast<int>(it->second);
}

int PoolIndex::pool_for(const KvEvent& event) {
  if (pools_.empty()) return -1;
  const int p = pool_of(event.owner.worker);
  if (p >= 0) live_[static_cast<size_t>(p)].insert(event.owner.worker.value);
  if (event.medium.empty()) return -1;
  if (p >= 0 && same_medium(event.medium, pools_[static_cast<size_t>(p)].medium)) return p;
  for (const PoolSpec& s : pools_)
    if (same_medium(event.medium, s.medium)) {
      // A pool's medium from a worker that does not mount it: its own blocks.
      counters_.claims_refused.fetch_add(1, std::memory_order_relaxed);
      break;
    }
  return -1;
}

ApplyResult PoolIndex::apply(const KvEvent& event) {
  if (is_reserved(event.owner.worker)) {
    counters_.reserved_refused.fetch_add(1, std::memory_order_relaxed);
    return ApplyResult::ReservedOwner;
  }
  const int p = pool_for(event);
  if (p < 0) return inner_.apply(event);
  // A member's replayed event after its dump: the pool's log had it already.
  if (replaying_ && *replaying_ == event.owner) return ApplyResult::Applied;
  counters_.events.fetch_add(1, std::memory_order_relaxed);
  const auto pool = static_cast<uint32_t>(p);
  // A dump's events are the pool's new contents, not news to replay.
  if (!(loading_ && *loading_ == event.owner)) log_event(pool, event);
  return apply_to_pool(pool, event);
}

ApplyResult PoolIndex::apply_to_pool(uint32_t pool, const KvEvent& event) {
  if (std::holds_alternative<KvCleared>(event.data)) {
    empty_pool(pool);
    return ApplyResult::Applied;
  }
  KvEvent e = event;
  e.owner = pool_owner(pool);
  e.tier = pool_tier(pool);
  e.event_id.reset();
  e.instance = 0;
  return inner_.apply(e);
}

void PoolIndex::empty_pool(uint32_t p) {
  counters_.emptied.fetch_add(1, std::memory_order_relaxed);
  inner_.clear_owner(pool_owner(p));
}

void PoolIndex::remove_worker(WorkerId worker) {
  if (is_reserved(worker)) return;  // a pool is no worker: only its members' leaving empties it
  inner_.remove_worker(worker);
  const int p = pool_of(worker);
  if (p < 0) return;
  forget_dumps(worker);
  auto& live = live_[static_cast<size_t>(p)];
  if (live.erase(worker.value) && live.empty()) empty_pool(static_cast<uint32_t>(p));
}

void PoolIndex::clear_owner(CacheOwner owner) {
  if (is_reserved(owner.worker)) return;
  inner_.clear_owner(owner);
}

void PoolIndex::set_block_limits(const std::vector<std::pair<WorkerId, uint64_t>>& limits, uint64_t ceiling) {
  std::vector<std::pair<WorkerId, uint64_t>> all;
  all.reserve(limits.size() + pools_.size());
  for (const auto& l : limits)
    if (!is_reserved(l.first)) all.push_back(l);
  for (uint32_t p = 0; p < pools_.size(); ++p) {
    const uint64_t m = pools_[p].max_blocks;
    all.emplace_back(pool_owner(p).worker, m == 0 ? ceiling : std::min(m, ceiling));
  }
  inner_.set_block_limits(all, ceiling);
}

void PoolIndex::expand(const std::vector<PoolSpec>& pools, std::vector<OwnerOverlap>& owners, uint32_t stale) {
  // The pools' entries, taken out of the list (rare: only when a pool holds some of the prompt).
  std::array<const OwnerOverlap*, kMaxPools> hit{};
  std::array<OwnerOverlap, kMaxPools> held{};
  bool any = false;
  for (size_t i = 0; i < owners.size();) {
    if (!is_pool_owner(owners[i].owner)) {
      ++i;
      continue;
    }
    const uint64_t p = owners[i].owner.worker.value - kPoolWorkerBase;
    if (p < pools.size() && !((stale >> p) & 1u)) {
      held[p] = owners[i];
      hit[p] = &held[p];
      any = true;
    }
    owners[i] = owners.back();
    owners.pop_back();
  }
  if (!any) return;
  // Every rank of a member can load the pool's blocks: each of the member's
  // own entries (any dp rank) is continued by its pool.
  thread_local std::unordered_map<uint64_t, uint32_t> member_pool;
  thread_local std::unordered_set<uint64_t> continued;
  member_pool.clear();
  continued.clear();
  for (size_t p = 0; p < pools.size(); ++p)
    if (hit[p])
      for (WorkerId m : pools[p].members) member_pool.emplace(m.value, static_cast<uint32_t>(p));
  for (OwnerOverlap& o : owners) {
    const auto it = member_pool.find(o.owner.worker.value);
    if (it == member_pool.end()) continue;
    continued.insert(o.owner.worker.value);
    continue_with_pool(o, *hit[it->second], pool_tier(it->second));
  }
  // A member holding none of the prompt itself: one entry, rank 0, all of it
  // in the pool: any rank loads it alike (the router leaves the rank to the
  // engine: router/routing.cpp, steered_rank).
  for (size_t p = 0; p < pools.size(); ++p) {
    if (!hit[p]) continue;
    const auto tier = static_cast<size_t>(pool_tier(static_cast<uint32_t>(p)));
    for (WorkerId m : pools[p].members) {
      if (continued.count(m.value)) continue;
      OwnerOverlap o;
      o.owner = CacheOwner{m, 0};
      o.blocks = hit[p]->blocks;
      o.by_tier[tier] = hit[p]->blocks;
      owners.push_back(o);
    }
  }
}

OverlapScores PoolIndex::find_matches(std::span<const LocalBlockHash> blocks) const {
  OverlapScores out = inner_.find_matches(blocks);
  if (!pools_.empty()) expand(pools_, out.owners, stale_.load(std::memory_order_acquire));
  return out;
}

void PoolIndex::find_match_layers(std::span<const LocalBlockHash> blocks, MatchLayers& out) const {
  inner_.find_match_layers(blocks, out);
  if (pools_.empty()) return;
  // A pool owner is in `extra`, or in a layer whose set is in a pool tier
  // (a set's members share one tier).
  bool in_layers = false;
  for (const auto& l : out.layers) in_layers |= is_pool_tier(l.set->tier);
  bool in_extra = false;
  for (const auto& o : out.extra) in_extra |= is_pool_owner(o.owner);
  if (!in_layers && !in_extra) return;
  if (in_layers) {
    // Members are no subset of the layers: every owner listed one by one.
    OverlapScores all = out.expand();
    out.clear();
    out.extra = std::move(all.owners);
  }
  expand(pools_, out.extra, stale_.load(std::memory_order_acquire));
}

}  // namespace kvroute
