// Field-by-field equality of decoded KV events, for the round-trip checks of
// the kv_events and resync_dump fuzz targets. Pure.
#pragma once

#include <variant>

#include "indexer/kv_event.h"

namespace kvroute::fuzz {

inline bool same_data(const KvStored& a, const KvStored& b) {
  if (a.parent != b.parent || a.copies != b.copies || a.blocks.size() != b.blocks.size()) return false;
  for (size_t i = 0; i < a.blocks.size(); ++i)
    if (a.blocks[i].block_hash != b.blocks[i].block_hash || a.blocks[i].tokens_hash != b.blocks[i].tokens_hash)
      return false;
  return true;
}
inline bool same_data(const KvRemoved& a, const KvRemoved& b) { return a.block_hashes == b.block_hashes; }
inline bool same_data(const KvCleared&, const KvCleared&) { return true; }

inline bool same_event(const KvEvent& a, const KvEvent& b) {
  if (a.owner != b.owner || a.event_id != b.event_id || a.tier != b.tier || a.data.index() != b.data.index())
    return false;
  return std::visit(
      [&](const auto& x) { return same_data(x, std::get<std::decay_t<decltype(x)>>(b.data)); }, a.data);
}

}  // namespace kvroute::fuzz
