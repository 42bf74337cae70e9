#include "indexer/event_sequencer.h"

#include <algorithm>

namespace kvroute {

void EventSequencer::mark_stale(CacheOwner owner, OwnerSeq& s) {
  counters_.gaps.fetch_add(1, std::memory_order_relaxed);
  s.stale = true;
  inner_.on_stream(owner, StreamNotice::Gap);
  {
    std::unique_lock lk(stale_mu_);
    if (stale_.insert(owner).second) counters_.stale_owners.fetch_add(1, std::memory_order_relaxed);
  }
  if (s.resyncing) return;  // a dump is already on its way: it covers this gap
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

void EventSequencer::restart(CacheOwner owner, OwnerSeq& s, uint64_t instance) {
  counters_.restarts.fetch_add(1, std::memory_order_relaxed);
  inner_.on_stream(owner, StreamNotice::Restarted);
  inner_.clear_owner(owner);
  set_trusted(owner);
  s = OwnerSeq{};
  s.instance = instance;
}

void EventSequencer::remember(OwnerSeq& s, const KvEvent& event) {
  if (s.buffer.size() >= kMaxBufferedEvents) {
    counters_.buffer_overflows.fetch_add(1, std::memory_order_relaxed);
    s.buffer.clear();  // the dump will leave a hole: another resync follows
  }
  s.buffer.push_back(event);
}

void EventSequencer::hold(OwnerSeq& s, const KvEvent& event) {
  remember(s, event);
  inner_.on_event_held(event);
}

ApplyResult EventSequencer::apply(const KvEvent& event) {
  auto [it, fresh] = seq_.try_emplace(event.owner);
  OwnerSeq& s = it->second;
  if (fresh)
    if (auto i = instances_.find(event.owner.worker); i != instances_.end()) s.instance = i->second;
  if (event.instance != 0 && event.instance != s.instance) {
    if (s.instance != 0) restart(event.owner, s, event.instance);  // another process: start afresh
    s.instance = event.instance;
  }
  if (!event.event_id) return forward(event);
  const uint64_t id = *event.event_id;
  if (s.stale) {
    hold(s, event);  // waiting for a dump: replayed after it
    return ApplyResult::Applied;
  }
  if (!s.seen) {
    s.seen = true;
    s.last = id;
    if (id > 1) {
      // Joined after the worker started: what it stored before is unknown.
      mark_stale(event.owner, s);
      hold(s, event);
      return ApplyResult::Applied;
    }
    if (s.resyncing) remember(s, event);
    return forward(event);
  }
  if (id == s.last || (id < s.last && (s.after_resync || s.instance != 0))) {
    // Already applied (or covered by the dump); with instance ids a lower id
    // is a late redelivery, never a restart.
    counters_.duplicates.fetch_add(1, std::memory_order_relaxed);
    return ApplyResult::Applied;
  }
  if (id < s.last) {  // no instance ids: an id going backwards is a restart
    restart(event.owner, s, 0);
    s.seen = true;
    s.last = id;
    return forward(event);
  }
  if (id > s.last + 1) {
    mark_stale(event.owner, s);
    hold(s, event);
    return ApplyResult::Applied;
  }
  s.last = id;
  s.after_resync = false;
  if (s.resyncing) remember(s, event);
  return forward(event);
}

void EventSequencer::begin_resync(CacheOwner owner) {
  OwnerSeq& s = seq_[owner];
  if (s.stale || s.resyncing) return;
  s.resyncing = true;
  s.buffer.clear();
  inner_.on_stream(owner, StreamNotice::DumpRequested);
}

bool EventSequencer::on_instance(WorkerId worker, uint64_t instance) {
  if (instance == 0) return false;
  auto [it, fresh] = instances_.try_emplace(worker, instance);
  const uint64_t before = fresh ? 0 : it->second;
  it->second = instance;
  bool restarted = false;
  for (auto& [owner, s] : seq_) {
    if (owner.worker != worker || s.instance == instance) continue;
    if (s.instance != 0) restart(owner, s, instance), restarted = true;
    s.instance = instance;
  }
  return restarted || (before != 0 && before != instance);
}

void EventSequencer::apply_resync(CacheOwner owner, uint64_t last_event_id, const std::vector<KvEvent>& dump,
                                  uint64_t instance) {
  OwnerSeq& s = seq_[owner];
  std::vector<KvEvent> buffered = std::move(s.buffer);
  s.buffer.clear();
  if (instance != 0 && s.instance != instance) {
    // Taken from another process than the events we hold: only its own count.
    if (s.instance != 0) counters_.restarts.fetch_add(1, std::memory_order_relaxed);
    std::erase_if(buffered, [&](const KvEvent& e) { return e.instance != 0 && e.instance != instance; });
    s.instance = instance;
  }
  inner_.on_stream(owner, StreamNotice::DumpBegins);
  inner_.clear_owner(owner);
  for (const auto& ev : dump) {
    KvEvent e = ev;
    e.owner = owner;
    forward(e);
  }
  inner_.on_stream(owner, StreamNotice::DumpApplied);
  s.last = last_event_id;
  s.seen = true;
  s.stale = false;
  s.resyncing = false;
  s.after_resync = true;
  counters_.resyncs_completed.fetch_add(1, std::memory_order_relaxed);
  replay_after_dump(owner, s, std::move(buffered));
  inner_.on_stream(owner, StreamNotice::ReplayDone);
}

// Replays what arrived after the dump was taken, in id order, while contiguous.
void EventSequencer::replay_after_dump(CacheOwner owner, OwnerSeq& s, std::vector<KvEvent> buffered) {
  std::erase_if(buffered, [](const KvEvent& e) { return !e.event_id; });
  std::stable_sort(buffered.begin(), buffered.end(),
                   [](const KvEvent& a, const KvEvent& b) { return *a.event_id < *b.event_id; });
  const uint64_t dump_last = s.last;
  for (size_t i = 0; i < buffered.size(); ++i) {
    const KvEvent& ev = buffered[i];
    const uint64_t id = *ev.event_id;
    if (id <= s.last) continue;  // already in the dump (or a redelivery)
    if (id > s.last + 1) {
      // A hole remains. An id the worker cannot have reached since the dump is
      // hostile or corrupt: dropped. A plausible one asks for one more dump.
      const bool plausible = id - dump_last <= kMaxBufferedEvents;
      if (plausible && !s.retried) {
        s.retried = true;
        s.buffer.assign(buffered.begin() + static_cast<std::ptrdiff_t>(i), buffered.end());
        mark_stale(owner, s);
        return;
      }
      counters_.discarded.fetch_add(buffered.size() - i, std::memory_order_relaxed);
      break;
    }
    s.last = id;
    s.after_resync = false;
    forward(ev);
  }
  s.retried = false;
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
  instances_.erase(worker);
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

void EventSequencer::find_match_layers(std::span<const LocalBlockHash> blocks, MatchLayers& out) const {
  inner_.find_match_layers(blocks, out);
  if (counters_.stale_owners.load(std::memory_order_relaxed) == 0) return;
  std::shared_lock lk(stale_mu_);
  if (stale_.empty()) return;
  // A shared layer cannot leave members out: list the owners one by one.
  OverlapScores all = out.expand();
  out.clear();
  for (const auto& o : all.owners)
    if (stale_.count(o.owner) == 0) out.extra.push_back(o);
}

bool EventSequencer::is_stale(CacheOwner owner) const {
  std::shared_lock lk(stale_mu_);
  return stale_.count(owner) > 0;
}

}  // namespace kvroute
