#include <unordered_map>

#include "indexer/indexer.h"

namespace kvroute {

OverlapScores MatchLayers::expand() const {
  OverlapScores out;
  std::unordered_map<CacheOwner, size_t> at;
  auto offer = [&](const OwnerOverlap& o) {
    auto [it, fresh] = at.emplace(o.owner, out.owners.size());
    if (fresh) out.owners.push_back(o);
    else if (o.blocks > out.owners[it->second].blocks) out.owners[it->second] = o;
  };
  // Shallow to deep: a deeper layer holds more blocks, so it replaces.
  for (const Layer& l : layers)
    for (const CacheOwner& c : l.set->owners) offer(OwnerOverlap{c, l.blocks, l.by_tier});
  for (const OwnerOverlap& o : extra) offer(o);
  return out;
}

}  // namespace kvroute
