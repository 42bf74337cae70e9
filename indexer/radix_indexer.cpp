#include "indexer/radix_indexer.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <mutex>
#include <thread>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvroute {

RadixIndexer::RadixIndexer() {
  const NodeId root = alloc_node();
  assert(root == kRoot);
  (void)root;
}

RadixIndexer::~RadixIndexer() = default;

// ---- arena -----------------------------------------------------------------

RadixIndexer::NodeId RadixIndexer::alloc_node() {
  // The lowest chunk with room, so that nodes pack into few chunks and a
  // chunk emptied by clears is given back to the allocator (release below).
  uint32_t c;
  if (!open_chunks_.empty()) {
    c = *open_chunks_.begin();
  } else {
    c = static_cast<uint32_t>(chunks_.size());
    chunks_.emplace_back();
    chunk_state_.emplace_back();
    open_chunks_.insert(c);
  }
  if (!chunks_[c]) {
    chunks_[c].reset(new Node[size_t{1} << kChunkBits]);
    ++live_chunks_;
  }
  ChunkState& cs = chunk_state_[c];
  NodeId id;
  if (cs.free_head != kNone) {
    id = cs.free_head;
    cs.free_head = node(id).next_sibling;
  } else {
    id = (c << kChunkBits) | cs.fresh++;
  }
  if (++cs.live == (1u << kChunkBits)) open_chunks_.erase(c);
  node(id) = Node{0, 0, kNone, kNone, kNone, kNoOwner, 0};
  return id;
}

void RadixIndexer::free_node(NodeId id) {
  const uint32_t c = id >> kChunkBits;
  ChunkState& cs = chunk_state_[c];
  Node& n = node(id);
  n.owners = kNoOwner;
  n.next_sibling = cs.free_head;
  cs.free_head = id;
  if (cs.live-- == (1u << kChunkBits)) open_chunks_.insert(c);
  if (cs.live == 0 && c != 0) {
    // Nobody refers to a free node: the chunk's memory goes back (readers
    // only reach nodes linked in the tree). Chunk 0 holds the root.
    chunks_[c].reset();
    cs = ChunkState{};
    --live_chunks_;
  }
}

// ---- children --------------------------------------------------------------

RadixIndexer::NodeId RadixIndexer::child(NodeId parent, uint64_t h) const {
  const Node& p = node(parent);
  if (p.nchildren > kSmallChildren) {
    const NodeId* c = child_maps_[p.children]->find(h);
    return c ? *c : kNone;
  }
  for (NodeId c = p.children; c != kNone;) {
    const Node& n = node(c);
    if (n.hash() == h) return c;
    c = n.next_sibling;
  }
  return kNone;
}

RadixIndexer::NodeId RadixIndexer::add_child(NodeId parent, uint64_t h) {
  if (NodeId c = child(parent, h); c != kNone) return c;
  const NodeId c = alloc_node();  // chunk addresses are stable: references stay valid
  Node& n = node(c);
  n.hash_lo = static_cast<uint32_t>(h);
  n.hash_hi = static_cast<uint32_t>(h >> 32);
  n.parent = parent;
  ++nodes_;
  Node& p = node(parent);
  if (p.nchildren < kSmallChildren) {
    n.next_sibling = p.children;
    p.children = c;
  } else if (p.nchildren == kSmallChildren) {
    // Promote the sibling list to a map.
    uint32_t m;
    if (!free_child_maps_.empty()) {
      m = free_child_maps_.back();
      free_child_maps_.pop_back();
    } else {
      m = static_cast<uint32_t>(child_maps_.size());
      child_maps_.emplace_back();
    }
    child_maps_[m] = std::make_unique<FlatMap64<NodeId>>(FlatMap64<NodeId>().grown().grown());  // 32 slots
    for (NodeId s = p.children; s != kNone;) {
      Node& sn = node(s);
      child_maps_[m]->put(sn.hash(), s);
      s = sn.next_sibling;
      sn.next_sibling = kNone;
    }
    child_maps_[m]->put(h, c);
    p.children = m;
  } else {
    FlatMap64<NodeId>& m = *child_maps_[p.children];
    make_room(m);  // the new node is not linked yet: readers cannot see it meanwhile
    m.put(h, c);
  }
  ++p.nchildren;
  return c;
}

void RadixIndexer::unlink_child(NodeId parent, NodeId c) {
  Node& p = node(parent);
  if (p.nchildren > kSmallChildren) {
    const uint32_t m = p.children;
    child_maps_[m]->erase_no_shrink(node(c).hash());
    if (--p.nchildren == kSmallChildren) {
      // Demote back to a sibling list.
      NodeId head = kNone;
      child_maps_[m]->for_each([&](uint64_t, NodeId s) {
        node(s).next_sibling = head;
        head = s;
      });
      p.children = head;
      child_maps_[m].reset();
      free_child_maps_.push_back(m);
    } else {
      shrink_if_sparse(*child_maps_[m]);
    }
    return;
  }
  NodeId* link = &p.children;
  while (*link != c) link = &node(*link).next_sibling;
  *link = node(c).next_sibling;
  --p.nchildren;
}

// ---- owners ----------------------------------------------------------------

std::span<const RadixIndexer::Entry> RadixIndexer::owners_of(const Node& n) const {
  if (n.owners == kNoOwner) return {};
  if (n.owners & kListBit) return lists_[n.owners & ~kListBit].body->entries;
  return {&n.owners, 1};
}

uint32_t RadixIndexer::known_id(CacheOwner o) const {
  auto it = owner_ids_.find(o);
  return it == owner_ids_.end() ? kNone : it->second;
}

uint32_t RadixIndexer::intern(CacheOwner o) {
  if (const uint32_t known = known_id(o); known != kNone) return known;
  uint32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    if (owners_.size() >= kMaxOwners) return kNone;
    id = static_cast<uint32_t>(owners_.size());
    owners_.emplace_back();
  }
  owners_[id] = std::make_unique<OwnerState>();
  owners_[id]->owner = o;
  WorkerQuota& q = quotas_[o.worker];
  ++q.owners;
  owners_[id]->quota = &q;
  owner_ids_.emplace(o, id);
  return id;
}

std::unique_ptr<RadixIndexer::OwnerState> RadixIndexer::release_owner_id(uint32_t id) {
  std::unique_ptr<OwnerState> dead = std::move(owners_[id]);
  owner_ids_.erase(dead->owner);
  free_ids_.push_back(id);
  WorkerQuota& q = *dead->quota;
  q.blocks -= dead->blocks.size();
  if (--q.owners == 0 && q.limit == 0) quotas_.erase(dead->owner.worker);
  dead->quota = nullptr;
  {
    // Its index is whole again (empty): a later store starts a new count.
    std::lock_guard lk(capped_mu_);
    if (capped_.erase(dead->owner)) capped_count_.store(capped_.size(), std::memory_order_relaxed);
  }
  return dead;
}

template <class V>
void RadixIndexer::make_room(FlatMap64<V>& m) {
  if (!m.needs_grow()) return;
  if (!held_ || m.capacity() < kRehashOutsideLock) {
    FlatMap64<V> bigger = m.grown();
    m.swap(bigger);
    return;
  }
  FlatMap64<V> bigger;
  held_->unlocked([&] { bigger = m.grown(); });
  m.swap(bigger);
  held_->unlocked([&] { FlatMap64<V> old(std::move(bigger)); });
}

template <class V>
void RadixIndexer::shrink_if_sparse(FlatMap64<V>& m) {
  if (!m.wants_shrink()) return;
  if (!held_ || m.capacity() < kRehashOutsideLock) {
    FlatMap64<V> smaller = m.shrunk();
    m.swap(smaller);
    return;
  }
  FlatMap64<V> smaller;
  held_->unlocked([&] { smaller = m.shrunk(); });
  m.swap(smaller);
  held_->unlocked([&] { FlatMap64<V> old(std::move(smaller)); });
}

RadixIndexer::Entry RadixIndexer::entry_of(const Node& n, uint32_t owner) const {
  const auto os = owners_of(n);
  const auto it = std::lower_bound(os.begin(), os.end(), owner << 8);
  return it != os.end() && entry_owner(*it) == owner ? *it : kNoOwner;
}

bool RadixIndexer::holds(const Node& n, uint32_t owner) const { return entry_of(n, owner) != kNoOwner; }

namespace {
// Sets are never reused under a serial (OwnerSet), across every index.
std::atomic<uint64_t> next_set_serial{1};
}  // namespace

uint32_t RadixIndexer::owner_word_for(const std::vector<Entry>& v) {
  if (v.empty()) return kNoOwner;
  if (v.size() == 1) return v[0];
  const uint64_t h = XXH3_64bits(v.data(), v.size() * sizeof(Entry));
  const uint32_t* found = list_index_.find(h);
  if (found && lists_[*found].body->entries == v) {
    ++lists_[*found].refs;
    return kListBit | *found;
  }
  uint32_t l;
  if (!free_lists_.empty()) {
    l = free_lists_.back();
    free_lists_.pop_back();
  } else {
    l = static_cast<uint32_t>(lists_.size());
    lists_.emplace_back();
  }
  auto body = std::make_shared<ListBody>();
  body->serial = next_set_serial.fetch_add(1, std::memory_order_relaxed);
  body->tier = entry_tier(v[0]);
  body->entries.assign(v.begin(), v.end());  // exact capacity
  body->owners.reserve(v.size());
  for (Entry e : v) {
    body->owners.push_back(owners_[entry_owner(e)]->owner);
    body->one_tier &= entry_tier(e) == body->tier;
  }
  OwnerList& ol = lists_[l];
  ol.body = std::move(body);
  ol.hash = h;
  ol.refs = 1;
  ol.interned = !found;  // a different list owns this hash: stay private
  if (ol.interned) {
    make_room(list_index_);
    list_index_.put(h, l);
  }
  list_heap_bytes_ += list_bytes(v.size());
  return kListBit | l;
}

void RadixIndexer::release_word(uint32_t word) {
  if (word == kNoOwner || !(word & kListBit)) return;
  const uint32_t l = word & ~kListBit;
  OwnerList& ol = lists_[l];
  if (--ol.refs > 0) return;
  const bool interned = ol.interned;
  if (interned) list_index_.erase_no_shrink(ol.hash);
  list_heap_bytes_ -= list_bytes(ol.body->entries.size());
  ol.body.reset();  // readers holding it keep it alive
  ol.interned = false;
  free_lists_.push_back(l);
  if (interned) shrink_if_sparse(list_index_);
}

void RadixIndexer::add_owner(Node& n, uint32_t owner, StorageTier tier) {
  const Entry e = (owner << 8) | static_cast<uint8_t>(tier);
  if (n.owners == kNoOwner) {
    n.owners = e;
    ++entries_;
    return;
  }
  if (!(n.owners & kListBit) && entry_owner(n.owners) == owner) {
    n.owners = e;  // already held: the latest tier wins
    return;
  }
  const auto cur = owners_of(n);
  auto it = std::lower_bound(cur.begin(), cur.end(), owner << 8);
  if (it != cur.end() && *it == e) return;  // held in this tier already
  const bool fresh = it == cur.end() || entry_owner(*it) != owner;
  scratch_.assign(cur.begin(), it);
  scratch_.push_back(e);
  scratch_.insert(scratch_.end(), fresh ? it : it + 1, cur.end());
  const uint32_t old = n.owners;
  n.owners = owner_word_for(scratch_);
  release_word(old);
  if (fresh) ++entries_;
}

bool RadixIndexer::drop_owner(Node& n, uint32_t owner) {
  if (n.owners == kNoOwner) return false;
  if (!(n.owners & kListBit)) {
    if (entry_owner(n.owners) != owner) return false;
    n.owners = kNoOwner;
    --entries_;
    return true;
  }
  const auto cur = owners_of(n);
  auto it = std::lower_bound(cur.begin(), cur.end(), owner << 8);
  if (it == cur.end() || entry_owner(*it) != owner) return false;
  scratch_.assign(cur.begin(), it);
  scratch_.insert(scratch_.end(), it + 1, cur.end());
  const uint32_t old = n.owners;
  n.owners = owner_word_for(scratch_);
  release_word(old);
  --entries_;
  return true;
}

uint8_t RadixIndexer::tiers_of(const OwnerState& os, uint32_t id, NodeId n) const {
  if (const uint8_t* m = os.tiers.find(n)) return *m;
  return tier_bit(entry_tier(entry_of(node(n), id)));
}

void RadixIndexer::set_tiers(OwnerState& os, uint32_t id, NodeId n, uint8_t mask) {
  add_owner(node(n), id, best_tier(mask));
  if (std::popcount(mask) > 1) {
    make_room(os.tiers);
    os.tiers.put(n, mask);
  } else {
    os.tiers.erase_no_shrink(n);
  }
}

bool RadixIndexer::unref(OwnerState& os, uint32_t id, NodeId n) {
  if (uint32_t* extra = os.aliases.find(n)) {
    if (--*extra == 0) os.aliases.erase_no_shrink(n);
    return false;
  }
  drop_owner(node(n), id);
  return true;
}

void RadixIndexer::prune(NodeId id, std::vector<NodeId>* freed) {
  while (id != kRoot) {
    Node& n = node(id);
    if (n.owners != kNoOwner || n.nchildren != 0) return;
    const NodeId parent = n.parent;
    unlink_child(parent, id);
    free_node(id);
    --nodes_;
    if (freed) freed->push_back(id);
    id = parent;
  }
}

// ---- writer ----------------------------------------------------------------

RadixIndexer::WriteLock::WriteLock(const RadixIndexer& idx) : idx_(idx), lk_(idx.mu_, std::defer_lock) {
  lock();
  idx_.held_ = this;
}

RadixIndexer::WriteLock::~WriteLock() { idx_.held_ = nullptr; }

void RadixIndexer::WriteLock::lock() {
  // glibc's rwlock prefers readers: hold new readers off while waiting, or a
  // steady stream of overlapping lookups could starve the writer.
  idx_.writer_waiting_.store(true, std::memory_order_release);
  // Spin (yielding) like the readers: a futex wake-up after the last reader
  // leaves costs tens of microseconds on a busy host, during which new
  // readers would already be held off.
  while (!lk_.try_lock()) std::this_thread::yield();
  idx_.writer_waiting_.store(false, std::memory_order_release);
  ops_ = 0;
  since_ = std::chrono::steady_clock::now();
}

void RadixIndexer::WriteLock::step() {
  ++ops_;
  if (ops_ >= kMaxBlocksPerLock || ((ops_ & 7) == 0 && std::chrono::steady_clock::now() - since_ > kMaxHold))
    handoff();
}

void RadixIndexer::WriteLock::handoff() {
  lk_.unlock();
  // Only this thread mutates: everything the caller holds stays valid.
  const auto t0 = std::chrono::steady_clock::now();
  while (idx_.readers_waiting_.load(std::memory_order_acquire) > 0 &&
         std::chrono::steady_clock::now() - t0 < kMaxReaderWait)
    std::this_thread::yield();
  lock();
}

ApplyResult RadixIndexer::apply(const KvEvent& event) {
  if (const auto* st = std::get_if<KvStored>(&event.data)) return apply_stored(event, *st);
  if (const auto* rm = std::get_if<KvRemoved>(&event.data)) {
    if (rm->block_hashes.size() > kMaxBlocksPerEvent) return ApplyResult::TooLarge;
    // owner_ids_ and owner states change only on this thread: read unlocked.
    const uint32_t id = known_id(event.owner);
    if (id == kNone) return rm->block_hashes.empty() ? ApplyResult::Applied : ApplyResult::UnknownBlock;
    OwnerState& os = *owners_[id];
    bool missing = false;
    uint64_t taken = 0;
    std::unique_ptr<OwnerState> dead;  // destroyed after the hold
    {
      WriteLock lk(*this);
      for (SequenceHash h : rm->block_hashes) {
        lk.step();
        const NodeId* p = os.blocks.find(h.value);
        if (!p) {
          missing = true;
          continue;
        }
        const NodeId n = *p;
        const uint8_t held = tiers_of(os, id, n);
        if (!(held & tier_bit(event.tier))) continue;  // not held there: nothing to take out
        if (held != tier_bit(event.tier)) {
          set_tiers(os, id, n, held & ~tier_bit(event.tier));  // still cached in another tier
          continue;
        }
        os.blocks.erase_no_shrink(h.value);
        --os.quota->blocks;
        ++taken;
        if (unref(os, id, n)) prune(n);
      }
      if (taken > 0) removed_[event.owner.worker] += taken;
      if (os.blocks.size() == 0) {
        dead = release_owner_id(id);
      } else {
        shrink_if_sparse(os.blocks);
        shrink_if_sparse(os.aliases);
        shrink_if_sparse(os.tiers);
      }
    }
    return missing ? ApplyResult::UnknownBlock : ApplyResult::Applied;
  }
  clear_owner(event.owner);
  return ApplyResult::Applied;
}

void RadixIndexer::take_removed(std::vector<std::pair<WorkerId, uint64_t>>& out) {
  out.insert(out.end(), removed_.begin(), removed_.end());
  removed_.clear();
}

ApplyResult RadixIndexer::apply_copies(const KvEvent& event, const KvStored& st) {
  const uint32_t id = known_id(event.owner);
  if (id == kNone) return st.blocks.empty() ? ApplyResult::Applied : ApplyResult::UnknownBlock;
  OwnerState& os = *owners_[id];
  bool missing = false;
  WriteLock lk(*this);
  for (const StoredBlock& b : st.blocks) {
    lk.step();
    const NodeId* p = os.blocks.find(b.block_hash.value);
    if (!p) {
      missing = true;  // not held (evicted meanwhile, or never indexed): nothing to copy
      continue;
    }
    set_tiers(os, id, *p, tiers_of(os, id, *p) | tier_bit(event.tier));
  }
  return missing ? ApplyResult::UnknownBlock : ApplyResult::Applied;
}

ApplyResult RadixIndexer::apply_stored(const KvEvent& event, const KvStored& st) {
  if (st.blocks.size() > kMaxBlocksPerEvent) return ApplyResult::TooLarge;
  if (st.copies) return apply_copies(event, st);
  std::unique_ptr<OwnerState> dead;  // destroyed after the hold
  WriteLock lk(*this);
  const uint32_t id = intern(event.owner);
  if (id == kNone) return ApplyResult::TooLarge;  // more than kMaxOwners owners
  OwnerState& os = *owners_[id];
  WorkerQuota& quota = *os.quota;
  const uint64_t limit = quota.limit ? quota.limit : default_block_limit_;
  NodeId parent = kRoot;
  if (st.parent) {
    const NodeId* p = os.blocks.find(st.parent->value);
    if (!p) {
      if (os.blocks.size() == 0) dead = release_owner_id(id);  // do not keep an empty owner
      return ApplyResult::UnknownParent;
    }
    parent = *p;
  }
  ApplyResult result = ApplyResult::Applied;
  for (size_t i = 0; i < st.blocks.size(); ++i) {
    const auto& b = st.blocks[i];
    NodeId* old = os.blocks.find(b.block_hash.value);
    if (!old && quota.blocks >= limit) {
      // Over the worker's declared capacity (with slack) or the ceiling: the
      // rest of the chain is refused; the owner's index is partial.
      refuse_over_limit(event.owner, st.blocks.size() - i);
      result = ApplyResult::OverLimit;
      break;
    }
    NodeId n = add_child(parent, b.tokens_hash.value);
    if (old && *old != n) {
      // The engine reused a block id for other content: forget the old one.
      // Pruning it may free `n` too (an unowned interior node whose only
      // child was the stale one): look it up again.
      const NodeId stale = *old;
      os.blocks.erase_no_shrink(b.block_hash.value);
      --quota.blocks;
      if (unref(os, id, stale)) {
        os.tiers.erase_no_shrink(stale);
        prune(stale);
        n = add_child(parent, b.tokens_hash.value);
      }
      old = nullptr;
    }
    if (!old && holds(node(n), id)) {
      // A second block id for a node this owner already holds is an alias.
      const uint32_t* extra = os.aliases.find(n);
      const uint32_t count = extra ? *extra + 1 : 1;
      make_room(os.aliases);
      os.aliases.put(n, count);
    }
    // Stored again in another tier: a copy there too (an engine that moves a
    // block removes it from the tier it left).
    set_tiers(os, id, n, holds(node(n), id) ? tiers_of(os, id, n) | tier_bit(event.tier) : tier_bit(event.tier));
    make_room(os.blocks);
    if (os.blocks.put(b.block_hash.value, n)) ++quota.blocks;
    parent = n;
    lk.step();  // may let readers in: `parent` and `os` stay valid
  }
  if (os.blocks.size() == 0) dead = release_owner_id(id);
  return result;
}

void RadixIndexer::refuse_over_limit(CacheOwner owner, uint64_t blocks) {
  blocks_refused_.fetch_add(blocks, std::memory_order_relaxed);
  std::lock_guard lk(capped_mu_);
  if (capped_.insert(owner).second) capped_count_.store(capped_.size(), std::memory_order_relaxed);
}

void RadixIndexer::set_block_limits(const std::vector<std::pair<WorkerId, uint64_t>>& limits, uint64_t ceiling) {
  default_block_limit_ = std::max<uint64_t>(ceiling, 1);
  for (auto& [w, q] : quotas_) q.limit = 0;
  for (const auto& [w, n] : limits) {
    WorkerQuota& q = quotas_[w];
    q.limit = n ? std::min(n, default_block_limit_) : 0;
  }
  // Workers with no owner and no limit of their own need no entry.
  for (auto it = quotas_.begin(); it != quotas_.end();)
    it = it->second.limit == 0 && it->second.owners == 0 ? quotas_.erase(it) : std::next(it);
}

bool RadixIndexer::is_capped(CacheOwner owner) const {
  std::lock_guard lk(capped_mu_);
  return capped_.count(owner) > 0;
}

void RadixIndexer::clear_owner_impl(uint32_t id) {
  // The owner's node list is gathered without the lock (only this thread
  // mutates). Then long clears hand the lock over between chunks, like long
  // events; readers meanwhile see the owner with part of its blocks (a
  // consistent tree). No freed id is reused before the end: nothing is
  // allocated here.
  OwnerState& os = *owners_[id];
  std::vector<NodeId> nodes;
  nodes.reserve(os.blocks.size());
  os.blocks.for_each([&](uint64_t, NodeId n) { nodes.push_back(n); });
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());  // aliases
  std::vector<NodeId> freed;
  std::vector<char> gone(nodes.size(), 0);
  std::unique_ptr<OwnerState> dead;  // destroyed after the hold (its maps may be large)
  WriteLock lk(*this);
  for (NodeId n : nodes) {
    drop_owner(node(n), id);
    lk.step();
  }
  // Pruning walks up, so any order frees every node left empty; a node of
  // this list freed by an earlier prune is skipped.
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (gone[k]) continue;
    const Node& n = node(nodes[k]);
    if (n.owners != kNoOwner || n.nchildren != 0) continue;
    freed.clear();
    prune(nodes[k], &freed);
    for (NodeId f : freed) {
      auto it = std::lower_bound(nodes.begin(), nodes.end(), f);
      if (it != nodes.end() && *it == f) gone[static_cast<size_t>(it - nodes.begin())] = 1;
    }
    lk.step();
  }
  dead = release_owner_id(id);
}

void RadixIndexer::clear_owner(CacheOwner owner) {
  const uint32_t id = known_id(owner);
  if (id != kNone) clear_owner_impl(id);
}

void RadixIndexer::remove_worker(WorkerId worker) {
  std::vector<uint32_t> ids;
  for (const auto& [o, id] : owner_ids_)
    if (o.worker == worker) ids.push_back(id);
  for (uint32_t id : ids) clear_owner_impl(id);
}

}  // namespace kvroute
