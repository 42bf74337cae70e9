// RadixIndexer, the readers' side: lookups (find_matches, find_match_layers)
// and the figures (stats, entries_by_worker), under the shared lock; the
// writer's side is radix_indexer.cpp. Threading: indexer/radix_indexer.h.
#include "indexer/radix_indexer.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

namespace kvroute {

void RadixIndexer::lock_for_read() const {
  // Spin (yielding) instead of sleeping in the lock: when the writer hands
  // the lock over between chunks, a waiting reader takes it at once rather
  // than after a futex wake-up, which on a loaded host can outlast the
  // writer's wait and let it re-take the lock first.
  readers_waiting_.fetch_add(1, std::memory_order_relaxed);
  while (writer_waiting_.load(std::memory_order_acquire) || !mu_.try_lock_shared()) std::this_thread::yield();
  readers_waiting_.fetch_sub(1, std::memory_order_release);
}

OverlapScores RadixIndexer::find_matches(std::span<const LocalBlockHash> blocks) const {
  OverlapScores out;
  if (blocks.empty()) return out;
  lock_for_read();
  std::shared_lock lk(mu_, std::adopt_lock);
  NodeId n = child(kRoot, blocks[0].value);
  if (n == kNone) return out;
  // `live` holds the entries (owner | tier) of the owners still matching, as
  // found at the last level; `slot` their result index. Consecutive levels
  // whose owner entries are identical (the common case: a shared prefix held
  // by the same owners in the same tier) are counted in `run` and credited
  // in one pass when the list changes, so such a level costs one memcmp.
  // `last_word`: the owner word of the previous level. `live` is a subset of
  // that word's set (with its tiers), so a level with the same word (interned
  // lists: same set = same word) keeps `live` unchanged: O(1).
  uint32_t last_word = node(n).owners;
  auto first = owners_of(node(n));
  std::vector<Entry> live(first.begin(), first.end());
  std::vector<uint32_t> slot(live.size());
  out.owners.resize(live.size());
  for (size_t k = 0; k < live.size(); ++k) {
    slot[k] = static_cast<uint32_t>(k);
    out.owners[k].owner = owners_[entry_owner(live[k])]->owner;
  }
  uint32_t run = 1;
  auto credit = [&] {
    for (size_t k = 0; k < live.size(); ++k) {
      auto& o = out.owners[slot[k]];
      o.blocks += run;
      o.by_tier[static_cast<size_t>(entry_tier(live[k]))] += run;
    }
    run = 0;
  };
  std::vector<Entry> next_live;
  std::vector<uint32_t> next_slot;
  for (size_t i = 1; i < blocks.size() && !live.empty(); ++i) {
    n = child(n, blocks[i].value);
    if (n == kNone) break;
    const uint32_t word = node(n).owners;
    if (word == last_word) {
      ++run;
      continue;
    }
    last_word = word;
    const auto here = owners_of(node(n));
    if (here.size() == live.size() && std::memcmp(here.data(), live.data(), live.size() * sizeof(Entry)) == 0) {
      ++run;
      continue;
    }
    credit();
    // Both lists are sorted by owner id: a linear merge keeps the survivors
    // (with the tier they have at this level).
    next_live.clear();
    next_slot.clear();
    auto it = here.begin();
    for (size_t k = 0; k < live.size(); ++k) {
      const uint32_t owner = entry_owner(live[k]);
      while (it != here.end() && entry_owner(*it) < owner) ++it;
      if (it == here.end()) break;
      if (entry_owner(*it) == owner) {
        next_live.push_back(*it);
        next_slot.push_back(slot[k]);
      }
    }
    live.swap(next_live);
    slot.swap(next_slot);
    run = 1;
  }
  if (!live.empty()) credit();
  // Owners of the first node always matched >= 1 block; none has 0.
  return out;
}

namespace {

// How many owners of `sub` are in `set` (both sorted by owner id, entries
// owner << 8 | tier): a merge when the sizes are alike, else a binary search
// per element of the smaller.
size_t count_in(std::span<const uint32_t> sub, std::span<const uint32_t> set) {
  size_t n = 0;
  if (sub.size() * 16 < set.size()) {
    for (uint32_t e : sub) {
      const auto it = std::lower_bound(set.begin(), set.end(), e & ~0xffu);
      n += it != set.end() && (*it >> 8) == (e >> 8);
    }
    return n;
  }
  auto it = set.begin();
  for (uint32_t e : sub) {
    while (it != set.end() && (*it >> 8) < (e >> 8)) ++it;
    if (it == set.end()) break;
    n += (*it >> 8) == (e >> 8);
  }
  return n;
}

}  // namespace

void RadixIndexer::find_match_layers(std::span<const LocalBlockHash> blocks, MatchLayers& out) const {
  out.clear();
  if (blocks.empty()) return;
  {
    lock_for_read();
    std::shared_lock lk(mu_, std::adopt_lock);
    if (walk_layers(blocks, out)) return;
  }
  Indexer::find_match_layers(blocks, out);  // every owner listed
}

bool RadixIndexer::walk_layers(std::span<const LocalBlockHash> blocks, MatchLayers& out) const {
  NodeId n = child(kRoot, blocks[0].value);
  if (n == kNone) return true;
  std::array<uint32_t, kNumStorageTiers> tiers{};  // blocks per tier of the layers so far
  size_t level = 0;                                // levels before node n
  uint32_t word = node(n).owners;                  // the live owners: this node's
  for (;;) {
    if (word == kNoOwner) return true;
    if (!(word & kListBit)) {
      walk_single(blocks, level, n, entry_owner(word), tiers, out);
      return true;
    }
    const auto& body = lists_[word & ~kListBit].body;
    if (!body->one_tier) return false;
    // The levels with this very word (interned: same owners, same tiers).
    size_t end = level + 1;
    NodeId next = kNone;
    for (; end < blocks.size(); ++end) {
      next = child(n, blocks[end].value);
      if (next == kNone || node(next).owners != word) break;
      n = next;
    }
    tiers[static_cast<size_t>(body->tier)] += static_cast<uint32_t>(end - level);
    out.layers.push_back(MatchLayers::Layer{static_cast<uint32_t>(end), tiers, body});
    if (end == blocks.size() || next == kNone) return true;
    // The next level's owners: the deeper layer if they are a subset of this one.
    const uint32_t w = node(next).owners;
    if (w == kNoOwner) return true;
    if (!(w & kListBit)) {
      if (entry_of(node(n), entry_owner(w)) == kNoOwner) return true;  // nobody goes on
      walk_single(blocks, end, next, entry_owner(w), tiers, out);
      return true;
    }
    const auto& sub = lists_[w & ~kListBit].body->entries;
    const size_t in = count_in(sub, body->entries);
    if (in == 0) return true;
    if (in != sub.size()) return false;  // not nested
    n = next;
    word = w;
    level = end;
  }
}

void RadixIndexer::walk_single(std::span<const LocalBlockHash> blocks, size_t from, NodeId n, uint32_t owner,
                               std::array<uint32_t, kNumStorageTiers> tiers, MatchLayers& out) const {
  size_t level = from;
  for (;;) {
    const Entry e = entry_of(node(n), owner);
    if (e == kNoOwner) break;
    ++tiers[static_cast<size_t>(entry_tier(e))];
    if (++level == blocks.size()) break;
    n = child(n, blocks[level].value);
    if (n == kNone) break;
  }
  if (level == from) return;
  OwnerOverlap& o = out.extra.emplace_back();
  o.owner = owners_[owner]->owner;
  o.blocks = static_cast<uint32_t>(level);
  o.by_tier = tiers;
}

std::vector<std::pair<WorkerId, uint64_t>> RadixIndexer::entries_by_worker() const {
  lock_for_read();
  std::shared_lock lk(mu_, std::adopt_lock);
  std::map<WorkerId, uint64_t> by;
  // Entries, as stats() counts them: nodes the owner is on. A node it reaches
  // through several of its block hashes (aliases) is one entry.
  for (const auto& o : owners_) {
    if (!o) continue;
    uint64_t extra = 0;
    o->aliases.for_each([&](uint64_t, uint32_t n) { extra += n; });
    by[o->owner.worker] += o->blocks.size() - extra;
  }
  return {by.begin(), by.end()};
}

IndexStats RadixIndexer::stats() const {
  lock_for_read();
  std::shared_lock lk(mu_, std::adopt_lock);
  IndexStats s;
  s.blocks = nodes_;
  s.entries = entries_;
  // Allocated memory (malloc headers excluded): arena chunks, owner lists,
  // child maps, per-owner maps, owner table.
  s.bytes = live_chunks_ * (sizeof(Node) << kChunkBits) + chunks_.capacity() * sizeof(void*) +
            chunk_state_.capacity() * sizeof(ChunkState) + lists_.capacity() * sizeof(OwnerList) +
            list_heap_bytes_ + list_index_.bytes() + child_maps_.capacity() * sizeof(void*) +
            owners_.capacity() * sizeof(void*) + owner_ids_.size() * 48;
  for (const auto& m : child_maps_)
    if (m) s.bytes += m->bytes() + sizeof(*m);
  for (const auto& o : owners_)
    if (o) s.bytes += o->blocks.bytes() + o->aliases.bytes() + o->tiers.bytes() + sizeof(OwnerState);
  return s;
}

}  // namespace kvroute
