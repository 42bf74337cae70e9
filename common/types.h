// Domain types shared by every module (Dynamo's `protocols`): strong ids instead
// of bare integers, so a block hash can never be passed where a worker id goes.
// Header-only, no I/O, thread-compatible.
#pragma once

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
inline constexpr int kNumStorageTiers = 4;

constexpr std::string_view to_string(StorageTier t) {
  switch (t) {
    case StorageTier::Device: return "device";
    case StorageTier::HostPinned: return "host_pinned";
    case StorageTier::Disk: return "disk";
    case StorageTier::External: return "external";
  }
  return "device";
}

// Parses a wire tier name; returns false for an unknown name.
constexpr bool parse_storage_tier(std::string_view s, StorageTier& out) {
  for (int i = 0; i < kNumStorageTiers; ++i) {
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
