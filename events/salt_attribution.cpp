#include "events/salt_attribution.h"

#include <algorithm>

namespace kvroute {

std::string_view to_string(SaltAttribution::How how) {
  switch (how) {
    case SaltAttribution::How::Event: return "event";
    case SaltAttribution::How::Trusted: return "trusted";
    case SaltAttribution::How::Unsalted: return "unsalted";
    case SaltAttribution::How::Attributed: return "attributed";
    case SaltAttribution::How::Unattributed: return "unattributed";
  }
  return "unknown";
}

void SaltAttribution::record_dispatch(WorkerId worker, LocalBlockHash first_block, uint64_t salt_hash) {
  std::lock_guard lk(mu_);
  auto& w = workers_[worker.value];
  if (!w) w = std::make_unique<Worker>();
  if (w->events_carry_salt) return;  // its events say it themselves
  if (salt_hash != 0) w->salted_sent = true;
  const Dispatch d{first_block.value, salt_hash};
  if (w->ring.size() < kDispatchesPerWorker) {
    w->ring.push_back(d);
    return;
  }
  w->ring[w->next] = d;
  w->next = (w->next + 1) % kDispatchesPerWorker;
}

void SaltAttribution::saw_salt_in_events(WorkerId worker) {
  resolved_[static_cast<size_t>(How::Event)].fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lk(mu_);
  auto& w = workers_[worker.value];
  if (!w) w = std::make_unique<Worker>();
  if (w->events_carry_salt) return;
  w->events_carry_salt = true;
  w->ring = {};  // not needed any more
  w->next = 0;
  w->held = {};
}

SaltAttribution::Root SaltAttribution::resolve(CacheOwner owner, LocalBlockHash first_block,
                                               SequenceHash engine_block) {
  Root root;
  {
    std::lock_guard lk(mu_);
    auto it = workers_.find(owner.worker.value);
    Worker* w = it == workers_.end() ? nullptr : it->second.get();
    if (w && w->events_carry_salt) {
      root.how = How::Trusted;
    } else if (!w) {
      root.how = How::Unsalted;  // nothing sent to it by this router
    } else {
      HeldRoots& held = w->held[owner.dp_rank];
      // The namespaces sent with this first block, less those already held.
      uint64_t candidate = 0;
      size_t candidates = 0;
      bool sent = false;
      std::vector<uint64_t> seen;
      for (const Dispatch& d : w->ring) {
        if (d.digest != first_block.value) continue;
        sent = true;
        if (std::find(seen.begin(), seen.end(), d.salt_hash) != seen.end()) continue;
        seen.push_back(d.salt_hash);
        if (held.holds(key(first_block.value, d.salt_hash))) continue;
        candidate = d.salt_hash;
        ++candidates;
      }
      if (candidates == 1) root = Root{candidate ? How::Attributed : How::Unsalted, candidate};
      else if (!sent && !w->salted_sent) root.how = How::Unsalted;
      else root.how = How::Unattributed;
      if (root.how != How::Unattributed) {
        if (held.by_block.size() >= kHeldPerOwner) held = HeldRoots{};
        held.add(engine_block.value, key(first_block.value, root.salt_hash));
      }
    }
  }
  resolved_[static_cast<size_t>(root.how)].fetch_add(1, std::memory_order_relaxed);
  return root;
}

void SaltAttribution::removed(CacheOwner owner, std::span<const SequenceHash> engine_blocks) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(owner.worker.value);
  if (it == workers_.end() || it->second->held.empty()) return;
  auto h = it->second->held.find(owner.dp_rank);
  if (h == it->second->held.end()) return;
  for (SequenceHash b : engine_blocks) h->second.remove(b.value);
}

void SaltAttribution::HeldRoots::add(uint64_t block, uint64_t k) {
  auto [it, fresh] = by_block.try_emplace(block, k);
  if (!fresh) {
    if (it->second == k) return;
    remove(block);
    by_block.emplace(block, k);
  }
  ++count[k];
}

void SaltAttribution::HeldRoots::remove(uint64_t block) {
  auto it = by_block.find(block);
  if (it == by_block.end()) return;
  if (auto c = count.find(it->second); c != count.end() && --c->second == 0) count.erase(c);
  by_block.erase(it);
}

void SaltAttribution::cleared(CacheOwner owner) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(owner.worker.value);
  if (it != workers_.end()) it->second->held.erase(owner.dp_rank);
}

void SaltAttribution::remove_worker(WorkerId worker) {
  std::lock_guard lk(mu_);
  workers_.erase(worker.value);
}

bool SaltAttribution::salt_blind(WorkerId worker) const {
  std::lock_guard lk(mu_);
  auto it = workers_.find(worker.value);
  return it != workers_.end() && it->second->salted_sent && !it->second->events_carry_salt;
}

size_t SaltAttribution::salt_blind_workers() const {
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (const auto& [id, w] : workers_) n += w->salted_sent && !w->events_carry_salt;
  return n;
}

}  // namespace kvroute
