// PoolIndex under its members' gaps and resyncs: a pool is as exact as a
// worker (indexer/event_sequencer.h). A member's gap makes the pool stale
// until that member's dump replaces the pool's blocks; the pool's events that
// arrived since the dump was asked for are replayed after it, in arrival
// order (indexer/README.md, "Shared pools").
#include <algorithm>
#include <spdlog/spdlog.h>

#include "common/log.h"
#include "indexer/pool_index.h"

namespace kvroute {

void PoolIndex::on_stream(CacheOwner owner, StreamNotice notice) {
  const int pi = pool_of(owner.worker);
  if (pi < 0) return;
  const auto p = static_cast<uint32_t>(pi);
  switch (notice) {
    case StreamNotice::DumpRequested: await_dump(owner, false); break;
    case StreamNotice::Gap: await_dump(owner, true); break;
    case StreamNotice::Restarted: forget_dump(owner); break;
    case StreamNotice::DumpBegins: begin_dump(owner); break;
    case StreamNotice::DumpApplied:
      if (loading_ && *loading_ == owner) {
        loading_.reset();
        replay_log(owner);
        replaying_ = owner;
      }
      break;
    case StreamNotice::ReplayDone:
      if (replaying_ && *replaying_ == owner) replaying_.reset();
      trim_log(p);
      update_stale(p);
      break;
  }
}

void PoolIndex::on_event_held(const KvEvent& event) {
  const int p = pool_of(event.owner.worker);
  if (p < 0 || event.medium.empty()) return;
  const auto pool = static_cast<uint32_t>(p);
  // Kept in arrival order with the other members' events: replayed from the
  // log after the dump, then skipped when the sequencer replays it.
  if (same_medium(event.medium, pools_[pool].medium)) log_event(pool, event);
}

void PoolIndex::await_dump(CacheOwner owner, bool gap) {
  const auto p = static_cast<uint32_t>(pool_of(owner.worker));
  PoolSync& s = sync_[p];
  // A dump already asked for keeps its position: the one on its way answers both.
  auto [it, fresh] = s.awaited.try_emplace(owner);
  if (fresh) it->second.from = s.log_base + s.log.size();
  it->second.gap |= gap;
  update_stale(p);
}

void PoolIndex::forget_dump(CacheOwner owner) {
  const auto p = static_cast<uint32_t>(pool_of(owner.worker));
  PoolSync& s = sync_[p];
  const auto it = s.awaited.find(owner);
  if (it == s.awaited.end()) return;
  const bool gap = it->second.gap;
  s.awaited.erase(it);
  if (gap) {
    // The member's lost events (removals among them) will never be known.
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("pool {}: worker {} rank {} left or restarted before its dump after a gap: the pool is emptied",
                   pools_[p].name, owner.worker.value, owner.dp_rank);
    empty_pool(p);
  }
  trim_log(p);
  update_stale(p);
}

void PoolIndex::forget_dumps(WorkerId worker) {
  const int p = pool_of(worker);
  if (p < 0) return;
  std::vector<CacheOwner> owners;
  for (const auto& [o, a] : sync_[static_cast<size_t>(p)].awaited)
    if (o.worker == worker) owners.push_back(o);
  for (const CacheOwner& o : owners) forget_dump(o);
}

void PoolIndex::begin_dump(CacheOwner owner) {
  const auto p = static_cast<uint32_t>(pool_of(owner.worker));
  PoolSync& s = sync_[p];
  const auto it = s.awaited.find(owner);
  // A dump nobody asked for has no log to replay after it: its pool blocks
  // are stored again (idempotent), the pool is not replaced.
  if (it == s.awaited.end()) return;
  loading_ = owner;
  loading_from_ = it->second.from;
  s.awaited.erase(it);  // answered; the pool's stale bit is updated once the replay is done
  inner_.clear_owner(pool_owner(p));
}

void PoolIndex::replay_log(CacheOwner owner) {
  const auto p = static_cast<uint32_t>(pool_of(owner.worker));
  PoolSync& s = sync_[p];
  if (loading_from_ < s.log_base) {
    // The log overflowed since the request: part of what followed the dump is
    // lost, and the dump alone would bring back what was removed since.
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("pool {}: more than {} pool events while worker {}'s dump was awaited: the pool is emptied",
                   pools_[p].name, kMaxLogEvents, owner.worker.value);
    empty_pool(p);
    return;
  }
  counters_.resyncs.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = static_cast<size_t>(loading_from_ - s.log_base); i < s.log.size(); ++i) apply_to_pool(p, s.log[i]);
}

void PoolIndex::log_event(uint32_t p, const KvEvent& event) {
  PoolSync& s = sync_[p];
  if (s.awaited.empty()) return;
  if (s.log.size() >= kMaxLogEvents) {
    // Bounded: the awaited dumps will empty the pool instead of replaying.
    s.log_base += s.log.size();
    s.log.clear();
  }
  s.log.push_back(event);
}

void PoolIndex::trim_log(uint32_t p) {
  PoolSync& s = sync_[p];
  uint64_t keep_from = s.log_base + s.log.size();
  for (const auto& [o, a] : s.awaited) keep_from = std::min(keep_from, a.from);
  if (keep_from <= s.log_base) return;
  const auto drop = static_cast<std::ptrdiff_t>(keep_from - s.log_base);
  s.log.erase(s.log.begin(), s.log.begin() + drop);
  s.log_base = keep_from;
}

void PoolIndex::update_stale(uint32_t p) {
  bool gap = false;
  for (const auto& [o, a] : sync_[p].awaited) gap |= a.gap;
  const uint32_t bit = 1u << p;
  const uint32_t before = gap ? stale_.fetch_or(bit, std::memory_order_acq_rel)
                              : stale_.fetch_and(~bit, std::memory_order_acq_rel);
  if (gap && !(before & bit)) {
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("pool {}: a member lost KV events: the pool's hits count as none until its dump", pools_[p].name);
  }
}

}  // namespace kvroute
