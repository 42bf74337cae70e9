#include "events/salt_attribution.h"

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
}

SaltAttribution::Root SaltAttribution::resolve(WorkerId worker, LocalBlockHash first_block) {
  Root root;
  {
    std::lock_guard lk(mu_);
    auto it = workers_.find(worker.value);
    const Worker* w = it == workers_.end() ? nullptr : it->second.get();
    if (w && w->events_carry_salt) {
      root.how = How::Trusted;
    } else if (!w) {
      root.how = How::Unsalted;  // nothing sent to it by this router
    } else {
      bool found = false, ambiguous = false;
      uint64_t salt = 0;
      for (const Dispatch& d : w->ring) {
        if (d.digest != first_block.value) continue;
        if (found && d.salt_hash != salt) {
          ambiguous = true;
          break;
        }
        found = true;
        salt = d.salt_hash;
      }
      if (ambiguous || (!found && w->salted_sent)) root.how = How::Unattributed;
      else if (found && salt != 0) root = Root{How::Attributed, salt};
      else root.how = How::Unsalted;
    }
  }
  resolved_[static_cast<size_t>(root.how)].fetch_add(1, std::memory_order_relaxed);
  return root;
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
