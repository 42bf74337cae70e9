#include "router/pending_prefixes.h"

#include <algorithm>

namespace kvroute {

namespace {

// A prefix's identity from its parent's and its last block's (as the
// indexer's sequence hash chains them; any good mix will do here).
uint64_t chain(uint64_t parent, LocalBlockHash b) {
  uint64_t z = parent ^ (b.value + 0x9E3779B97F4A7C15ull + (parent << 6) + (parent >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t PendingPrefixIndexer::add(CacheOwner owner, std::span<const LocalBlockHash> blocks) {
  if (blocks.empty()) return 0;
  const TimePoint now = clock_.now();
  Entry e{owner, {}, now + ttl_};
  e.prefixes.reserve(blocks.size());
  uint64_t h = 0;
  for (LocalBlockHash b : blocks) e.prefixes.push_back(h = chain(h, b));
  std::lock_guard lock(mu_);
  expire(now);
  for (uint64_t p : e.prefixes) {
    auto& owners = prefixes_[p];
    auto it = std::find_if(owners.begin(), owners.end(), [&](const auto& o) { return o.first == owner; });
    if (it == owners.end()) owners.emplace_back(owner, 1);
    else ++it->second;
  }
  const uint64_t ticket = next_++;
  by_expiry_.emplace_back(e.expires, ticket);
  entries_.emplace(ticket, std::move(e));
  return ticket;
}

void PendingPrefixIndexer::drop(const Entry& e) {
  for (uint64_t p : e.prefixes) {
    auto pit = prefixes_.find(p);
    if (pit == prefixes_.end()) continue;
    auto& owners = pit->second;
    auto it = std::find_if(owners.begin(), owners.end(), [&](const auto& o) { return o.first == e.owner; });
    if (it != owners.end() && --it->second == 0) owners.erase(it);
    if (owners.empty()) prefixes_.erase(pit);
  }
}

void PendingPrefixIndexer::expire(TimePoint now) {
  while (!by_expiry_.empty() && by_expiry_.front().first <= now) {
    if (auto it = entries_.find(by_expiry_.front().second); it != entries_.end()) {
      drop(it->second);
      entries_.erase(it);
    }
    by_expiry_.pop_front();
  }
}

void PendingPrefixIndexer::remove(uint64_t ticket) {
  if (ticket == 0) return;
  std::lock_guard lock(mu_);
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return;
  drop(it->second);
  entries_.erase(it);
  // by_expiry_ keeps the ticket until its time: expire() skips it then.
}

size_t PendingPrefixIndexer::pending() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

void PendingPrefixIndexer::remove_worker(WorkerId worker) {
  base_.remove_worker(worker);
  std::lock_guard lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.owner.worker == worker) {
      drop(it->second);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

OverlapScores PendingPrefixIndexer::find_matches(std::span<const LocalBlockHash> blocks) const {
  OverlapScores s = base_.find_matches(blocks);
  std::lock_guard lock(mu_);
  if (prefixes_.empty()) return s;
  // Walk the request's prefixes while any owner has one in flight; each
  // owner's pending overlap is the last length at which it was still there.
  std::vector<std::pair<CacheOwner, uint32_t>> live;  // owner -> pending prefix length
  uint64_t h = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    h = chain(h, blocks[i]);
    auto pit = prefixes_.find(h);
    if (pit == prefixes_.end()) break;
    bool any = false;
    for (const auto& [owner, n] : pit->second) {
      auto it = std::find_if(live.begin(), live.end(), [&](const auto& o) { return o.first == owner; });
      if (i == 0) live.emplace_back(owner, 1), any = true;
      else if (it != live.end() && it->second == i) it->second = static_cast<uint32_t>(i + 1), any = true;
    }
    if (!any) break;
  }
  for (const auto& [owner, len] : live) {
    auto it = std::find_if(s.owners.begin(), s.owners.end(), [&](const OwnerOverlap& o) { return o.owner == owner; });
    if (it == s.owners.end()) {
      OwnerOverlap o;
      o.owner = owner;
      o.blocks = len;
      o.by_tier[0] = len;
      s.owners.push_back(o);
    } else if (it->blocks < len) {
      // The pending part beyond the cached prefix counts as device blocks.
      const bool tiered = (it->by_tier[0] + it->by_tier[1] + it->by_tier[2] + it->by_tier[3]) != 0;
      if (tiered) it->by_tier[0] += len - it->blocks;
      it->blocks = len;
    }
  }
  return s;
}

}  // namespace kvroute
