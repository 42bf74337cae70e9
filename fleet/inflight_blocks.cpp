#include "fleet/inflight_blocks.h"

#include "indexer/block_hash.h"

namespace kvroute {

std::vector<uint64_t> inflight_chain(std::span<const LocalBlockHash> prompt) { return sequence_hash_values(prompt); }

std::optional<uint64_t> InflightBlocks::add(std::span<const uint64_t> chain, uint64_t limit) {
  std::lock_guard lk(mu_);
  if (refs_.size() + chain.size() > limit) return std::nullopt;
  const size_t before = refs_.size();
  refs_.reserve(before + chain.size());  // one rehash at most
  for (uint64_t key : chain) {
    if (uint32_t* n = refs_.find(key)) ++*n;
    else refs_.put(key, 1);
  }
  ++chains_;
  return refs_.size() - before;
}

uint64_t InflightBlocks::remove(std::span<const uint64_t> chain) {
  std::lock_guard lk(mu_);
  const size_t before = refs_.size();
  if (chains_ > 0 && --chains_ == 0) {
    refs_.clear();  // the last chain: no key is held any more
    return before;
  }
  for (uint64_t key : chain) {
    uint32_t* n = refs_.find(key);
    if (!n) continue;
    if (--*n == 0) refs_.erase_no_shrink(key);
  }
  return before - refs_.size();
}

}  // namespace kvroute
