#include "indexer/approx_indexer.h"

#include "indexer/block_hash.h"

namespace kvroute {

void ApproxIndexer::record(CacheOwner owner, std::span<const LocalBlockHash> blocks, TimePoint now) {
  std::lock_guard lk(mu_);
  KvEvent ev;
  ev.owner = owner;
  KvStored st;
  const std::vector<SequenceHash> ids = sequence_hashes(blocks);
  for (size_t i = 0; i < ids.size(); ++i) {
    st.blocks.push_back({ids[i], blocks[i]});
    touched_[Key{owner, ids[i].value}] = now;
  }
  // Deepest block first: among records of the same age the tail of a prefix
  // is evicted before its head (evicting block 0 would void the whole prefix).
  for (auto it = st.blocks.rbegin(); it != st.blocks.rend(); ++it) order_.emplace_back(now, Key{owner, it->block_hash.value});
  if (!st.blocks.empty()) {
    ev.data = std::move(st);
    tree_.apply(ev);
  }
  // Expire by age, then by size.
  while (!order_.empty() && now - order_.front().first > ttl_) evict_front_locked();
  while (touched_.size() > max_entries_ && !order_.empty()) evict_front_locked();
  // order_ also holds superseded records (a prefix routed again); bound it
  // too. Its front is the oldest record, so this still evicts oldest first.
  while (order_.size() > 2 * max_entries_) evict_front_locked();
  note_oldest_locked();
}

void ApproxIndexer::note_oldest_locked() {
  oldest_.store(order_.empty() ? std::numeric_limits<int64_t>::max() : order_.front().first.time_since_epoch().count(),
                std::memory_order_relaxed);
}

void ApproxIndexer::expire_locked(TimePoint now) {
  while (!order_.empty() && now - order_.front().first > ttl_) evict_front_locked();
  note_oldest_locked();
}

void ApproxIndexer::evict_front_locked() {
  auto [t, k] = order_.front();
  order_.pop_front();
  auto it = touched_.find(k);
  if (it == touched_.end() || it->second != t) return;  // re-recorded later, or already gone
  touched_.erase(it);
  KvEvent ev;
  ev.owner = k.owner;
  ev.data = KvRemoved{{SequenceHash{k.block}}};
  tree_.apply(ev);
}

void ApproxIndexer::expire(TimePoint now) {
  std::lock_guard lk(mu_);
  expire_locked(now);
}

ApplyResult ApproxIndexer::apply(const KvEvent& event) {
  if (std::holds_alternative<KvCleared>(event.data)) clear_owner(event.owner);
  return ApplyResult::Applied;
}

void ApproxIndexer::remove_worker(WorkerId worker) {
  std::lock_guard lk(mu_);
  tree_.remove_worker(worker);
  std::erase_if(touched_, [&](const auto& kv) { return kv.first.owner.worker == worker; });
}

void ApproxIndexer::clear_owner(CacheOwner owner) {
  std::lock_guard lk(mu_);
  tree_.clear_owner(owner);
  std::erase_if(touched_, [&](const auto& kv) { return kv.first.owner == owner; });
}

OverlapScores ApproxIndexer::find_matches(std::span<const LocalBlockHash> blocks) const {
  const TimePoint now = clock_.now();
  const int64_t oldest = oldest_.load(std::memory_order_relaxed);
  if (oldest != std::numeric_limits<int64_t>::max() && now - TimePoint(Nanos(oldest)) > ttl_) {
    std::unique_lock lk(mu_, std::try_to_lock);
    // Expiry is a mutation of the prediction, not of observable state the
    // caller owns; the tree has its own lock.
    if (lk.owns_lock()) const_cast<ApproxIndexer*>(this)->expire_locked(now);
  }
  return tree_.find_matches(blocks);
}

}  // namespace kvroute
