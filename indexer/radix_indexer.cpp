#include "indexer/radix_indexer.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <mutex>

namespace kvroute {

namespace {
constexpr size_t kSmallChildren = 8;
}

RadixIndexer::Node* RadixIndexer::Node::child(LocalBlockHash h) const {
  if (big_children) {
    auto* p = big_children->find(h.value);
    return p ? *p : nullptr;
  }
  for (Node* c : small_children)
    if (c->hash == h) return c;
  return nullptr;
}

size_t RadixIndexer::Node::child_count() const {
  return big_children ? big_children->size() : small_children.size();
}

RadixIndexer::RadixIndexer() = default;

RadixIndexer::~RadixIndexer() {
  // Iterative post-order free (trees can be deep).
  std::vector<Node*> stack;
  auto push_children = [&](Node& n) {
    if (n.big_children) n.big_children->for_each([&](uint64_t, Node* c) { stack.push_back(c); });
    for (Node* c : n.small_children) stack.push_back(c);
  };
  push_children(root_);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    push_children(*n);
    delete n;
  }
}

uint32_t RadixIndexer::intern(CacheOwner o) {
  auto it = owner_ids_.find(o);
  if (it != owner_ids_.end()) return it->second;
  uint32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<uint32_t>(owners_.size());
    owners_.emplace_back();
  }
  assert(id < (1u << 24));
  owners_[id] = std::make_unique<OwnerState>();
  owners_[id]->owner = o;
  owner_ids_.emplace(o, id);
  return id;
}

RadixIndexer::Node* RadixIndexer::add_child(Node* parent, LocalBlockHash h) {
  if (Node* c = parent->child(h)) return c;
  Node* c = new Node;
  c->hash = h;
  c->parent = parent;
  ++nodes_;
  if (parent->big_children) {
    parent->big_children->put(h.value, c);
  } else if (parent->small_children.size() < kSmallChildren) {
    parent->small_children.push_back(c);
  } else {
    parent->big_children = std::make_unique<FlatMap64<Node*>>();
    for (Node* s : parent->small_children) parent->big_children->put(s->hash.value, s);
    parent->big_children->put(h.value, c);
    parent->small_children.clear();
    parent->small_children.shrink_to_fit();
  }
  return c;
}

void RadixIndexer::add_owner(Node* n, uint32_t owner, StorageTier tier) {
  const Entry e = (owner << 8) | static_cast<uint8_t>(tier);
  auto it = std::lower_bound(n->owners.begin(), n->owners.end(), owner << 8);
  if (it != n->owners.end() && entry_owner(*it) == owner) {
    *it = e;  // already held: the latest tier wins
    return;
  }
  n->owners.insert(it, e);
  ++entries_;
}

bool RadixIndexer::drop_owner(Node* n, uint32_t owner) {
  auto it = std::lower_bound(n->owners.begin(), n->owners.end(), owner << 8);
  if (it == n->owners.end() || entry_owner(*it) != owner) return false;
  n->owners.erase(it);
  --entries_;
  return true;
}

void RadixIndexer::prune(Node* n, std::vector<Node*>* freed) {
  while (n != &root_ && n->owners.empty() && n->child_count() == 0) {
    Node* parent = n->parent;
    if (parent->big_children) {
      parent->big_children->erase(n->hash.value);
    } else {
      auto& v = parent->small_children;
      v.erase(std::find(v.begin(), v.end(), n));
    }
    if (freed) freed->push_back(n);
    delete n;
    --nodes_;
    n = parent;
  }
}

bool RadixIndexer::unref(OwnerState& os, uint32_t id, Node* n) {
  const uint64_t key = reinterpret_cast<uintptr_t>(n);
  if (uint32_t* extra = os.aliases.find(key)) {
    if (--*extra == 0) os.aliases.erase(key);
    return false;
  }
  drop_owner(n, id);
  return true;
}

ApplyResult RadixIndexer::apply(const KvEvent& event) {
  if (const auto* st = std::get_if<KvStored>(&event.data)) {
    if (st->blocks.size() > kMaxBlocksPerEvent) return ApplyResult::TooLarge;
    std::unique_lock lk(mu_);
    const uint32_t id = intern(event.owner);
    OwnerState& os = *owners_[id];
    Node* parent = &root_;
    if (st->parent) {
      Node** p = os.blocks.find(st->parent->value);
      if (!p) {
        if (os.blocks.size() == 0) {  // nothing held: do not keep an empty owner
          owner_ids_.erase(event.owner);
          owners_[id].reset();
          free_ids_.push_back(id);
        }
        return ApplyResult::UnknownParent;
      }
      parent = *p;
    }
    size_t in_lock = 0;
    for (const auto& b : st->blocks) {
      if (++in_lock > kMaxBlocksPerLock) {
        // Let readers in between chunks; only this thread mutates, so
        // `parent` and `os` stay valid.
        lk.unlock();
        lk.lock();
        in_lock = 1;
      }
      Node* n = add_child(parent, b.tokens_hash);
      Node** old = os.blocks.find(b.block_hash.value);
      if (old && *old != n) {
        // The engine reused a block id for other content: forget the old one.
        Node* stale = *old;
        os.blocks.erase(b.block_hash.value);
        if (unref(os, id, stale)) prune(stale);
        old = nullptr;
      }
      if (!old) {
        // A second block id for a node this owner already holds is an alias.
        const auto it = std::lower_bound(n->owners.begin(), n->owners.end(), id << 8);
        if (it != n->owners.end() && entry_owner(*it) == id) {
          uint32_t* extra = os.aliases.find(reinterpret_cast<uintptr_t>(n));
          os.aliases.put(reinterpret_cast<uintptr_t>(n), extra ? *extra + 1 : 1);
        }
      }
      add_owner(n, id, event.tier);
      os.blocks.put(b.block_hash.value, n);
      parent = n;
    }
    return ApplyResult::Applied;
  }
  if (const auto* rm = std::get_if<KvRemoved>(&event.data)) {
    if (rm->block_hashes.size() > kMaxBlocksPerEvent) return ApplyResult::TooLarge;
    std::unique_lock lk(mu_);
    auto it = owner_ids_.find(event.owner);
    if (it == owner_ids_.end()) return rm->block_hashes.empty() ? ApplyResult::Applied : ApplyResult::UnknownBlock;
    const uint32_t id = it->second;
    OwnerState& os = *owners_[id];
    bool missing = false;
    size_t in_lock = 0;
    for (SequenceHash h : rm->block_hashes) {
      if (++in_lock > kMaxBlocksPerLock) {
        lk.unlock();
        lk.lock();
        in_lock = 1;
      }
      Node** p = os.blocks.find(h.value);
      if (!p) {
        missing = true;
        continue;
      }
      Node* n = *p;
      os.blocks.erase(h.value);
      if (unref(os, id, n)) prune(n);
    }
    if (os.blocks.size() == 0) {
      owner_ids_.erase(event.owner);
      owners_[id].reset();
      free_ids_.push_back(id);
    }
    return missing ? ApplyResult::UnknownBlock : ApplyResult::Applied;
  }
  clear_owner(event.owner);
  return ApplyResult::Applied;
}

void RadixIndexer::clear_owner_locked(uint32_t id) {
  OwnerState& os = *owners_[id];
  std::vector<Node*> nodes;
  nodes.reserve(os.blocks.size());
  os.blocks.for_each([&](uint64_t, Node* n) { nodes.push_back(n); });
  for (Node* n : nodes) drop_owner(n, id);
  // Pruning walks up, so any order frees every node left empty; a node of
  // this list freed by an earlier prune is skipped.
  std::vector<Node*> freed;
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());  // aliases
  std::vector<char> gone(nodes.size(), 0);
  auto mark = [&](Node* f) {
    auto it = std::lower_bound(nodes.begin(), nodes.end(), f);
    if (it != nodes.end() && *it == f) gone[static_cast<size_t>(it - nodes.begin())] = 1;
  };
  for (size_t k = 0; k < nodes.size(); ++k) {
    Node* n = nodes[k];
    if (gone[k] || !n->owners.empty() || n->child_count() != 0) continue;
    freed.clear();
    prune(n, &freed);
    for (Node* f : freed) mark(f);
  }
  owner_ids_.erase(os.owner);
  owners_[id].reset();
  free_ids_.push_back(id);
}

void RadixIndexer::clear_owner(CacheOwner owner) {
  std::unique_lock lk(mu_);
  auto it = owner_ids_.find(owner);
  if (it == owner_ids_.end()) return;
  clear_owner_locked(it->second);
}

void RadixIndexer::remove_worker(WorkerId worker) {
  std::unique_lock lk(mu_);
  std::vector<uint32_t> ids;
  for (const auto& [o, id] : owner_ids_)
    if (o.worker == worker) ids.push_back(id);
  for (uint32_t id : ids) clear_owner_locked(id);
}

OverlapScores RadixIndexer::find_matches(std::span<const LocalBlockHash> blocks) const {
  OverlapScores out;
  if (blocks.empty()) return out;
  std::shared_lock lk(mu_);
  const Node* n = root_.child(blocks[0]);
  if (!n) return out;
  // `live` holds the entries (owner | tier) of the owners still matching, as
  // found at the last level; `slot` their result index. Consecutive levels
  // whose owner entries are identical (the common case: a shared prefix held
  // by the same owners in the same tier) are counted in `run` and credited
  // in one pass when the list changes, so such a level costs one memcmp.
  std::vector<Entry> live(n->owners.begin(), n->owners.end());
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
  for (size_t i = 1; i < blocks.size(); ++i) {
    n = n->child(blocks[i]);
    if (!n) break;
    if (n->owners.size() == live.size() &&
        std::memcmp(n->owners.data(), live.data(), live.size() * sizeof(Entry)) == 0) {
      ++run;
      continue;
    }
    credit();
    // Both lists are sorted by owner id: a linear merge keeps the survivors
    // (with the tier they have at this level).
    next_live.clear();
    next_slot.clear();
    auto it = n->owners.begin();
    for (size_t k = 0; k < live.size(); ++k) {
      const uint32_t owner = entry_owner(live[k]);
      while (it != n->owners.end() && entry_owner(*it) < owner) ++it;
      if (it == n->owners.end()) break;
      if (entry_owner(*it) == owner) {
        next_live.push_back(*it);
        next_slot.push_back(slot[k]);
      }
    }
    live.swap(next_live);
    slot.swap(next_slot);
    if (live.empty()) break;
    run = 1;
  }
  credit();
  return out;
}

IndexStats RadixIndexer::stats() const {
  std::shared_lock lk(mu_);
  IndexStats s;
  s.blocks = nodes_;
  s.entries = entries_;
  // Estimate: nodes (with their vectors' capacity approximated by size),
  // owner entries, and the per-owner block maps.
  s.bytes = nodes_ * (sizeof(Node) + sizeof(Node*)) + entries_ * sizeof(Entry);
  for (const auto& o : owners_)
    if (o) s.bytes += o->blocks.bytes() + sizeof(OwnerState);
  return s;
}

}  // namespace kvroute
