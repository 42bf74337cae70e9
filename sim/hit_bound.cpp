#include "sim/hit_bound.h"

#include <limits>
#include <list>
#include <queue>
#include <unordered_map>
#include <utility>

namespace kvroute::sim {

namespace {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// Belady's MIN over the access sequence `keys`: the hits of the best
// demand-paged cache of `capacity` entries.
uint64_t min_hits(const std::vector<uint64_t>& keys, uint64_t capacity) {
  std::vector<uint64_t> next(keys.size(), kNever);  // the position of each access's next use
  std::unordered_map<uint64_t, uint64_t> later;
  later.reserve(keys.size());
  for (size_t i = keys.size(); i-- > 0;) {
    const auto [it, fresh] = later.try_emplace(keys[i], i);
    if (!fresh) next[i] = std::exchange(it->second, i);
  }
  std::unordered_map<uint64_t, uint64_t> held;  // block -> its next use
  std::priority_queue<std::pair<uint64_t, uint64_t>> farthest;  // (next use, block); stale entries skipped
  uint64_t hits = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto it = held.find(keys[i]);
    if (it != held.end()) {
      ++hits;
      if (next[i] == kNever) {
        held.erase(it);  // never needed again: its room is worth more to the others
        continue;
      }
      it->second = next[i];
    } else {
      if (next[i] == kNever || capacity == 0) continue;
      held.emplace(keys[i], next[i]);
    }
    farthest.emplace(next[i], keys[i]);
    while (held.size() > capacity) {
      const auto [use, key] = farthest.top();
      farthest.pop();
      const auto h = held.find(key);
      if (h != held.end() && h->second == use) held.erase(h);
    }
  }
  return hits;
}

// One LRU cache of `capacity` blocks serving the requests in order, a prompt's
// blocks freed last to first as an engine frees them (its first block the
// most recently used): the prefix hits it takes.
uint64_t lru_prefix_hits(const std::vector<std::vector<uint64_t>>& prompts, uint64_t capacity) {
  std::list<uint64_t> order;  // most recently used first
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> held;
  uint64_t hits = 0;
  for (const auto& c : prompts) {
    size_t prefix = 0;
    while (prefix < c.size() && held.count(c[prefix])) ++prefix;
    hits += prefix;
    for (size_t i = c.size(); i-- > 0;) {
      const auto it = held.find(c[i]);
      if (it != held.end()) order.erase(it->second);
      order.push_front(c[i]);
      held[c[i]] = order.begin();
    }
    while (held.size() > capacity) {
      held.erase(order.back());
      order.pop_back();
    }
  }
  return hits;
}

}  // namespace

HitBound hit_bound(const std::vector<SimRequest>& w, uint64_t capacity_blocks) {
  std::vector<std::vector<uint64_t>> prompts;
  prompts.reserve(w.size());
  std::vector<uint64_t> keys;
  for (const auto& r : w) {
    prompts.push_back(prefix_chains(r));
    keys.insert(keys.end(), prompts.back().begin(), prompts.back().end());
  }
  HitBound b;
  b.capacity_blocks = capacity_blocks;
  if (keys.empty()) return b;
  const double total = double(keys.size());
  b.optimal = double(min_hits(keys, capacity_blocks)) / total;
  b.pooled_lru = double(lru_prefix_hits(prompts, capacity_blocks)) / total;
  return b;
}

}  // namespace kvroute::sim
