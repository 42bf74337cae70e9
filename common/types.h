// Domain types shared by every module (Dynamo's `protocols`): strong ids instead
// of bare integers, so a block hash can never be passed where a worker id goes.
// Header-only, no I/O, thread-compatible.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string_view>

namespace kvroute {

// A strongly typed 64-bit value. `Tag` only distinguishes the types.
template <class Tag>
struct StrongU64 {
  uint64_t value = 0;
  constexpr StrongU64() = default;
  constexpr explicit StrongU64(uint64_t v) : value(v) {}
  friend constexpr bool operator==(StrongU64, StrongU64) = default;
  friend constexpr auto operator<=>(StrongU64, StrongU64) = default;
};

// XXH3-64 of one block's token ids (the block's content, independent of prefix).
using LocalBlockHash = StrongU64<struct LocalBlockHashTag>;
// The engine's own opaque id of a block (Dynamo's "external sequence hash");
// used to link a stored block to its parent and to remove blocks.
using SequenceHash = StrongU64<struct SequenceHashTag>;
// A worker (one engine process, possibly with several data-parallel ranks).
using WorkerId = StrongU64<struct WorkerIdTag>;

// Token id as produced by a tokenizer.
using TokenId = uint32_t;

// One cache owner: a worker's data-parallel rank holds its own KV cache.
struct CacheOwner {
  WorkerId worker;
  uint32_t dp_rank = 0;
  friend constexpr bool operator==(const CacheOwner&, const CacheOwner&) = default;
  friend constexpr auto operator<=>(const CacheOwner&, const CacheOwner&) = default;
};

// Where a cached block lives on a worker. The order is the order of value: a
// device hit is worth most.
enum class StorageTier : uint8_t { Device = 0, HostPinned = 1, Disk = 2, External = 3 };
// The tiers a worker reports of its own cache (device .. external).
inline constexpr int kNumBaseTiers = 4;
// Shared KV pools (config `kv_pools`, indexer/pool_index.h): pool p's blocks
// are counted in tier kNumBaseTiers + p, so that each pool keeps its own
// weight (its load cost) wherever tiers are weighed.
inline constexpr int kMaxPools = 4;
inline constexpr int kNumStorageTiers = kNumBaseTiers + kMaxPools;
// Longest medium name a pool may have (and an event's medium is kept up to).
inline constexpr size_t kMaxMediumBytes = 32;

constexpr StorageTier pool_tier(uint32_t pool) { return static_cast<StorageTier>(kNumBaseTiers + pool); }
// A tier's bit in a mask of the tiers one worker holds a block in (all
// kNumStorageTiers fit in 8 bits); the mask's lowest bit is its best tier.
constexpr uint8_t tier_bit(StorageTier t) { return static_cast<uint8_t>(1u << static_cast<uint8_t>(t)); }
// Of a non-empty tier mask, the best (fastest) tier: tiers are numbered best first.
constexpr StorageTier best_tier(uint8_t mask) { return static_cast<StorageTier>(std::countr_zero(mask)); }
static_assert(kNumStorageTiers <= 8);
constexpr bool is_pool_tier(StorageTier t) { return static_cast<int>(t) >= kNumBaseTiers; }
constexpr uint32_t pool_of_tier(StorageTier t) { return static_cast<uint32_t>(t) - kNumBaseTiers; }

// Of a per-tier count, the blocks in any shared pool.
template <class PerTier>
constexpr uint32_t pool_blocks(const PerTier& by_tier) {
  uint32_t n = 0;
  for (int p = 0; p < kMaxPools; ++p) n += by_tier[kNumBaseTiers + p];
  return n;
}

constexpr std::string_view to_string(StorageTier t) {
  switch (t) {
    case StorageTier::Device: return "device";
    case StorageTier::HostPinned: return "host_pinned";
    case StorageTier::Disk: return "disk";
    case StorageTier::External: return "external";
  }
  return is_pool_tier(t) ? "pool" : "device";
}

// Parses a wire tier name (a worker's own tiers only; a pool tier is never
// taken from the wire); returns false for an unknown name.
constexpr bool parse_storage_tier(std::string_view s, StorageTier& out) {
  for (int i = 0; i < kNumBaseTiers; ++i) {
    auto t = static_cast<StorageTier>(i);
    if (to_string(t) == s) { out = t; return true; }
  }
  return false;
}

// What a worker does in a disaggregated (prefill/decode) fleet. `Both` is an
// ordinary aggregated worker and the default of every worker source; a
// `Prefill` worker computes prompts whose KV a `Decode` worker then pulls
// (scheduler/pd_decision.h decides the pair per request).
enum class WorkerRole : uint8_t { Both = 0, Prefill = 1, Decode = 2 };

constexpr std::string_view to_string(WorkerRole r) {
  switch (r) {
    case WorkerRole::Both: return "both";
    case WorkerRole::Prefill: return "prefill";
    case WorkerRole::Decode: return "decode";
  }
  return "both";
}

// Parses a role name ("both", "prefill", "decode"); false for anything else.
constexpr bool parse_worker_role(std::string_view s, WorkerRole& out) {
  for (auto r : {WorkerRole::Both, WorkerRole::Prefill, WorkerRole::Decode}) {
    if (to_string(r) == s) { out = r; return true; }
  }
  return false;
}

}  // namespace kvroute

template <class Tag>
struct std::hash<kvroute::StrongU64<Tag>> {
  size_t operator()(kvroute::StrongU64<Tag> v) const noexcept {
    // Values are hashes already (or small ids); a multiply spreads small ids.
    return static_cast<size_t>(v.value * 0x9E3779B97F4A7C15ull);
  }
};

template <>
struct std::hash<kvroute::CacheOwner> {
  size_t operator()(const kvroute::CacheOwner& o) const noexcept {
    return static_cast<size_t>((o.worker.value * 0x9E3779B97F4A7C15ull) ^ (uint64_t{o.dp_rank} << 1));
  }
};
