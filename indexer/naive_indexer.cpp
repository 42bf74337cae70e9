#include "indexer/naive_indexer.h"

#include <vector>

namespace kvroute {

void NaiveIndexer::prune(Node* n) {
  while (n != &root_ && n->owners.empty() && n->children.empty()) {
    Node* parent = n->parent;
    parent->children.erase(n->hash);  // frees n
    n = parent;
  }
}

void NaiveIndexer::unref(Node* n, CacheOwner owner) {
  auto it = n->owners.find(owner);
  if (--it->second.second == 0) {
    n->owners.erase(it);
    prune(n);
  }
}

void NaiveIndexer::remove_block(CacheOwner owner, SequenceHash h) {
  auto& blocks = lookup_[owner];
  auto it = blocks.find(h);
  Node* n = it->second;
  blocks.erase(it);
  unref(n, owner);
}

ApplyResult NaiveIndexer::apply(const KvEvent& event) {
  std::lock_guard lk(mu_);
  if (const auto* st = std::get_if<KvStored>(&event.data); st && st->copies) {
    auto lit = lookup_.find(event.owner);
    bool missing = false;
    for (const auto& b : st->blocks) {
      if (lit == lookup_.end() || !lit->second.count(b.block_hash)) {
        missing = true;
        continue;
      }
      lit->second.at(b.block_hash)->owners.at(event.owner).first |= tier_bit(event.tier);
    }
    return missing ? ApplyResult::UnknownBlock : ApplyResult::Applied;
  }
  if (const auto* st = std::get_if<KvStored>(&event.data)) {
    auto& blocks = lookup_[event.owner];
    Node* parent = &root_;
    if (st->parent) {
      auto it = blocks.find(*st->parent);
      if (it == blocks.end()) {
        if (blocks.empty()) lookup_.erase(event.owner);
        return ApplyResult::UnknownParent;
      }
      parent = it->second;
    }
    for (const auto& b : st->blocks) {
      auto& slot = parent->children[b.tokens_hash];
      if (!slot) {
        slot = std::make_unique<Node>();
        slot->parent = parent;
        slot->hash = b.tokens_hash;
      }
      Node* n = slot.get();
      auto old = blocks.find(b.block_hash);
      if (old != blocks.end() && old->second != n) {
        Node* stale = old->second;
        blocks.erase(old);
        unref(stale, event.owner);
        old = blocks.end();
      }
      auto& entry = n->owners[event.owner];
      entry.first |= tier_bit(event.tier);  // a copy in this tier too
      if (old == blocks.end()) entry.second += 1;
      blocks[b.block_hash] = n;
      parent = n;
    }
    return ApplyResult::Applied;
  }
  if (const auto* rm = std::get_if<KvRemoved>(&event.data)) {
    auto lit = lookup_.find(event.owner);
    bool missing = false;
    for (SequenceHash h : rm->block_hashes) {
      if (lit == lookup_.end() || !lit->second.count(h)) {
        missing = true;
        continue;
      }
      uint8_t& tiers = lit->second.at(h)->owners.at(event.owner).first;
      const uint8_t bit = tier_bit(event.tier);
      if (!(tiers & bit)) continue;  // not held in that tier
      if (tiers != bit) {
        tiers &= static_cast<uint8_t>(~bit);  // still cached in another tier
        continue;
      }
      remove_block(event.owner, h);
      ++removed_[event.owner.worker];
    }
    if (lit != lookup_.end() && lit->second.empty()) lookup_.erase(lit);
    return missing ? ApplyResult::UnknownBlock : ApplyResult::Applied;
  }
  clear_locked(event.owner);
  return ApplyResult::Applied;
}

void NaiveIndexer::take_removed(std::vector<std::pair<WorkerId, uint64_t>>& out) {
  std::lock_guard lk(mu_);
  out.insert(out.end(), removed_.begin(), removed_.end());
  removed_.clear();
}

void NaiveIndexer::clear_locked(CacheOwner owner) {
  auto it = lookup_.find(owner);
  if (it == lookup_.end()) return;
  std::vector<SequenceHash> hs;
  for (const auto& [h, n] : it->second) hs.push_back(h);
  for (SequenceHash h : hs) {
    // A node pruned as an ancestor is never in this list while still
    // referenced: it holds this owner until its own removal.
    remove_block(owner, h);
  }
  lookup_.erase(owner);
}

void NaiveIndexer::clear_owner(CacheOwner owner) {
  std::lock_guard lk(mu_);
  clear_locked(owner);
}

void NaiveIndexer::remove_worker(WorkerId worker) {
  std::lock_guard lk(mu_);
  std::vector<CacheOwner> owners;
  for (const auto& [o, _] : lookup_)
    if (o.worker == worker) owners.push_back(o);
  for (const auto& o : owners) clear_locked(o);
}

// Dynamo v1's lookup (ai-dynamo/dynamo lib/kv-router/src/radix_tree.rs,
// RadixTree::find_matches): one score map for the whole walk, updated in
// place level by level, no map rebuilt per block. An owner's entry advances
// while it holds every block so far (its score equals the depth); the walk
// stops at the first level where nobody advanced.
OverlapScores NaiveIndexer::find_matches(std::span<const LocalBlockHash> blocks) const {
  std::lock_guard lk(mu_);
  OverlapScores out;
  std::unordered_map<CacheOwner, OwnerOverlap> scores;
  const Node* n = &root_;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto it = n->children.find(blocks[i]);
    if (it == n->children.end()) break;
    n = it->second.get();
    size_t advanced = 0;
    for (const auto& [o, held] : n->owners) {
      OwnerOverlap* ov;
      if (i == 0) {
        ov = &scores[o];
        ov->owner = o;
      } else {
        auto s = scores.find(o);
        if (s == scores.end() || s->second.blocks != i) continue;  // dropped out earlier
        ov = &s->second;
      }
      ov->blocks += 1;
      ov->by_tier[static_cast<size_t>(best_tier(held.first))] += 1;
      ++advanced;
    }
    if (advanced == 0) break;
  }
  out.owners.reserve(scores.size());
  for (auto& [o, ov] : scores) out.owners.push_back(ov);
  return out;
}

IndexStats NaiveIndexer::stats() const {
  std::lock_guard lk(mu_);
  IndexStats s;
  std::vector<const Node*> stack;
  for (const auto& [h, c] : root_.children) stack.push_back(c.get());
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    s.blocks += 1;
    s.entries += n->owners.size();
    s.bytes += sizeof(Node) + n->owners.size() * 32 + n->children.size() * 32;
    for (const auto& [h, c] : n->children) stack.push_back(c.get());
  }
  for (const auto& [o, m] : lookup_) s.bytes += m.size() * 40;
  return s;
}

}  // namespace kvroute
