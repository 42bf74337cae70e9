#include "indexer/event_sequencer.h"

#include <algorithm>

namespace kvroute {

void EventSequencer::mark_stale(CacheOwner owner, OwnerSeq& s) {
  counters_.gaps.fetch_add(1, std::memory_order_relaxed);
  s.stale = true;
  {
    std::unique_lock lk(stale_mu_);
    if (stale_.insert(owner).second) counters_.stale_owners.fetch_add(1, std::memory_order_relaxed);
  }
  counters_.resyncs_requested.fetch_add(1, std::memory_order_relaxed);
  if (resync_cb_) resync_cb_(owner);
}

void EventSequencer::set_trusted(CacheOwner owner) {
  std::unique_lock lk(stale_mu_);
  if (stale_.erase(owner)) counters_.stale_owners.fetch_sub(1, std::memory_order_relaxed);
}

ApplyResult EventSequencer::forward(const KvEvent& event) {
  const ApplyResult r = inner_.apply(event);
  counters_.applied[event.data.index()][static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  return r;
}

ApplyResult EventSequencer::apply(const KvEvent& event) {
  if (!event.event_id) return forward(event);
  const uint64_t id = *event.event_id;
  auto [it, fresh] = seq_.try_emplace(event.owner);
  OwnerSeq& s = it->second;
  if (s.stale) {
    // Waiting for a dump: keep what arrives, to replay after it.
    if (s.buffer.size() >= kMaxBufferedEvents) {
      counters_.buffer_overflows.fetch_add(1, std::memory_order_relaxed);
      s.buffer.clear();  // the dump will be followed by another resync
    }
    s.buffer.push_back(event);
    return ApplyResult::Applied;
  }
  if (fresh) {
    s.last = id;
    if (id > 1) {
      // Joined after the worker started: what it stored before is unknown.
      s.buffer.push_back(event);
      mark_stale(event.owner, s);
      return ApplyResult::Applied;
    }
    return forward(event);
  }
  if (id == s.last || (s.after_resync && id < s.last)) {
    counters_.duplicates.fetch_add(1, std::memory_order_relaxed);
    return ApplyResult::Applied;
  }
  if (id < s.last) {
    counters_.restarts.fetch_add(1, std::memory_order_relaxed);
    inner_.clear_owner(event.owner);
    s.last = id;
    return forward(event);
  }
  if (id > s.last + 1) {
    s.buffer.push_back(event);
    mark_stale(event.owner, s);
    return ApplyResult::Applied;
  }
  s.last = id;
  s.after_resync = false;
  return forward(event);
}

void EventSequencer::apply_resync(CacheOwner owner, uint64_t last_event_id, const std::vector<KvEvent>& dump) {
  inner_.clear_owner(owner);
  for (const auto& ev : dump) {
    KvEvent e = ev;
    e.owner = owner;
    forward(e);
  }
  OwnerSeq& s = seq_[owner];
  s.last = last_event_id;
  std::vector<KvEvent> buffered = std::move(s.buffer);
  s.buffer.clear();
  s.stale = false;
  s.after_resync = true;
  counters_.resyncs_completed.fetch_add(1, std::memory_order_relaxed);
  // Replay what arrived after the dump was taken, in id order.
  std::stable_sort(buffered.begin(), buffered.end(),
                   [](const KvEvent& a, const KvEvent& b) { return *a.event_id < *b.event_id; });
  for (const auto& ev : buffered) {
    if (*ev.event_id <= s.last) continue;  // already in the dump
    if (*ev.event_id > s.last + 1) {
      // A gap remains after the dump: ask again, keep the rest buffered.
      for (const auto& rest : buffered)
        if (*rest.event_id >= *ev.event_id) s.buffer.push_back(rest);
      mark_stale(owner, s);
      return;
    }
    s.last = *ev.event_id;
    s.after_resync = false;
    forward(ev);
  }
  set_trusted(owner);
}

void EventSequencer::remove_worker(WorkerId worker) {
  for (auto it = seq_.begin(); it != seq_.end();) {
    if (it->first.worker == worker) {
      set_trusted(it->first);
      it = seq_.erase(it);
    } else {
      ++it;
    }
  }
  inner_.remove_worker(worker);
}

void EventSequencer::clear_owner(CacheOwner owner) { inner_.clear_owner(owner); }

OverlapScores EventSequencer::find_matches(std::span<const LocalBlockHash> blocks) const {
  OverlapScores out = inner_.find_matches(blocks);
  // The gauge counts stale_ (both change under stale_mu_): with no stale
  // owner, the usual case, readers skip the lock.
  if (counters_.stale_owners.load(std::memory_order_relaxed) == 0) return out;
  std::shared_lock lk(stale_mu_);
  if (stale_.empty()) return out;
  std::erase_if(out.owners, [&](const OwnerOverlap& o) { return stale_.count(o.owner) > 0; });
  return out;
}

bool EventSequencer::is_stale(CacheOwner owner) const {
  std::shared_lock lk(stale_mu_);
  return stale_.count(owner) > 0;
}

}  // namespace kvroute
