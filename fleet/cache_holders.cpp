// WorkerRegistry::holders(MatchLayers): the KV location API's read of the
// worker table (router/kv_lookup.h), in the order the API lists holders
// (longest first, ties by worker id, then rank), from the index's shared
// owner sets. The contract is in fleet/worker_registry.h.
//
// Why not one table lookup per owner and a sort: at 1,024 workers sharing a
// system prompt that was ~1,024 std::map lookups, model checks and a sort of
// 1,024 keys per lookup (hundreds of µs), even to list 16. A layer's set is
// immutable and interned by the index (same owners = same serial), so its
// members are resolved and sorted once and kept; a lookup merges the layers'
// sorted members, deepest first, and stops after `max`.
#include <algorithm>

#include "fleet/worker_registry.h"

namespace kvroute {

std::shared_ptr<WorkerRegistry::SetMembers> WorkerRegistry::resolve(std::span<const CacheOwner> owners,
                                                                   std::string_view model) const {
  auto out = std::make_shared<SetMembers>();
  out->reserve(owners.size());
  for (const CacheOwner& o : owners) {
    const auto it = workers_.find(o.worker);
    if (it != workers_.end() && serves(*it->second.info, model))
      out->push_back(SetMember{o, &it->second, it->second.info});
  }
  std::sort(out->begin(), out->end(), [](const SetMember& a, const SetMember& b) { return a.owner < b.owner; });
  return out;
}

std::shared_ptr<const WorkerRegistry::SetMembers> WorkerRegistry::set_members(const OwnerSet& set,
                                                                              std::string_view model) const {
  if (set.owners.size() <= kSmallHolderSet) return resolve(set.owners, model);
  for (HolderSet& h : holder_sets_) {
    if (h.serial != set.serial || h.model != model) continue;
    if (h.gen == members_gen_) return h.members;
    // The table changed since: resolve again in place.
    auto m = resolve(set.owners, model);
    holder_set_members_ = holder_set_members_ - h.members->size() + m->size();
    h.members = std::move(m);
    h.gen = members_gen_;
    return h.members;
  }
  auto m = resolve(set.owners, model);
  const size_t budget = 8 * workers_.size() + 4096;
  while (!holder_sets_.empty() &&
         (holder_sets_.size() >= kMaxHolderSets || holder_set_members_ + m->size() > budget)) {
    const size_t at = holder_sets_next_++ % holder_sets_.size();
    holder_set_members_ -= holder_sets_[at].members->size();
    holder_sets_[at] = std::move(holder_sets_.back());
    holder_sets_.pop_back();
  }
  holder_set_members_ += m->size();
  holder_sets_.push_back(HolderSet{set.serial, members_gen_, std::string(model), m});
  return m;
}

size_t WorkerRegistry::holders(std::string_view model, const MatchLayers& match, size_t max,
                               std::vector<CacheHolder>& out, Keep& keep) const {
  out.clear();
  keep.clear();
  const auto& layers = match.layers;
  // Per-call scratch, reused by the thread's next call.
  thread_local std::vector<std::shared_ptr<const SetMembers>> members;  // by layer
  struct Winner {
    OwnerOverlap overlap;
    const Entry* entry;
  };
  thread_local std::vector<Winner> winners;
  thread_local std::vector<CacheOwner> winner_owners;
  const auto by_owner = [](const SetMember& m, const CacheOwner& o) { return m.owner < o; };
  const auto in = [&](const SetMembers& s, const CacheOwner& o) {
    const auto it = std::lower_bound(s.begin(), s.end(), o, by_owner);
    return it != s.end() && it->owner == o;
  };

  std::lock_guard lk(mu_);
  const auto now = clock_.now();
  // 1. Each layer's members that serve the model, sorted by owner.
  members.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) members[i] = set_members(*layers[i].set, model);
  // 2. The owners listed one by one whose entry is longer than their deepest
  // layer (an owner listed twice counts once, with its longest).
  winners.clear();
  for (const OwnerOverlap& o : match.extra) {
    const auto it = workers_.find(o.owner.worker);
    if (it == workers_.end() || !serves(*it->second.info, model)) continue;
    uint32_t layered = 0;
    for (size_t i = layers.size(); i-- > 0;)
      if (in(*members[i], o.owner)) {
        layered = layers[i].blocks;
        break;
      }
    if (o.blocks > layered) winners.push_back(Winner{o, &it->second});
  }
  // Stable: of two entries of one owner as long, the first listed counts (as MatchLayers::expand).
  std::stable_sort(winners.begin(), winners.end(), [](const Winner& a, const Winner& b) {
    return a.overlap.owner != b.overlap.owner ? a.overlap.owner < b.overlap.owner : a.overlap.blocks > b.overlap.blocks;
  });
  winners.erase(std::unique(winners.begin(), winners.end(),
                            [](const Winner& a, const Winner& b) { return a.overlap.owner == b.overlap.owner; }),
                winners.end());
  winner_owners.clear();
  for (const Winner& w : winners) winner_owners.push_back(w.overlap.owner);
  // Every deeper layer's set is a subset of the first's.
  size_t total = layers.empty() ? 0 : members[0]->size();
  for (const Winner& w : winners) total += layers.empty() || !in(*members[0], w.overlap.owner);
  std::sort(winners.begin(), winners.end(), [](const Winner& a, const Winner& b) {
    return a.overlap.blocks != b.overlap.blocks ? a.overlap.blocks > b.overlap.blocks
                                                : a.overlap.owner < b.overlap.owner;
  });

  // 3. Deepest layer first: its members not in the layer below it (listed
  // there, longer) and not winners, merged by owner with the winners of the
  // same length; longer winners before.
  const auto emit_winner = [&](const Winner& w) {
    const Entry& e = *w.entry;
    out.push_back(CacheHolder{w.overlap, e.info.get(), state(e, now), e.draining});
    keep.push_back(e.info);
  };
  size_t w = 0;
  for (size_t i = layers.size(); i-- > 0 && out.size() < max;) {
    const MatchLayers::Layer& layer = layers[i];
    for (; w < winners.size() && winners[w].overlap.blocks > layer.blocks && out.size() < max; ++w)
      emit_winner(winners[w]);
    const SetMembers* deeper = i + 1 < layers.size() ? members[i + 1].get() : nullptr;
    const size_t before = out.size();
    size_t d = 0;
    for (const SetMember& m : *members[i]) {
      if (out.size() >= max) break;
      if (deeper) {
        while (d < deeper->size() && (*deeper)[d].owner < m.owner) ++d;
        if (d < deeper->size() && (*deeper)[d].owner == m.owner) continue;
      }
      if (!winner_owners.empty() && std::binary_search(winner_owners.begin(), winner_owners.end(), m.owner)) continue;
      for (; w < winners.size() && winners[w].overlap.blocks == layer.blocks && winners[w].overlap.owner < m.owner &&
             out.size() < max;
           ++w)
        emit_winner(winners[w]);
      if (out.size() >= max) break;
      const Entry& e = *m.entry;
      CacheHolder& h = out.emplace_back();  // in place: no temporary to copy
      h.overlap.owner = m.owner;
      h.overlap.blocks = layer.blocks;
      h.overlap.by_tier = layer.by_tier;
      h.info = m.info.get();
      h.health = state(e, now);
      h.draining = e.draining;
    }
    if (out.size() > before) keep.push_back(members[i]);  // its members' announcements
  }
  for (; w < winners.size() && out.size() < max; ++w) emit_winner(winners[w]);
  members.clear();  // a kept set may be dropped by the next change
  return total;
}

}  // namespace kvroute
