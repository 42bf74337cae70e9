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

std::optional<uint32_t> InflightBlocks::try_held_prefix(std::span<const uint64_t> chain, uint32_t beyond) {
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return std::nullopt;
  if (chains_ == 0 || beyond >= chain.size() || !refs_.find(chain[beyond])) return 0;
  size_t lo = beyond + 1, hi = chain.size();  // chain[0, lo) held; chain[hi, end) not
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (refs_.find(chain[mid])) lo = mid + 1;
    else hi = mid;
  }
  return static_cast<uint32_t>(lo);
}

}  // namespace kvroute
