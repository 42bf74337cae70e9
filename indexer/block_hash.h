// Block hashing, compatible with NVIDIA Dynamo (see ../shared/DESIGN.md).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/types.h"

namespace kvroute {

inline constexpr uint64_t kDefaultBlockHashSeed = 1337;

// seed = 1337 + XXH3_64(lora_name, seed 0) (wrapping); empty name = 1337.
uint64_t block_hash_seed(std::string_view lora_name);

// XXH3-64 with `seed` over `tokens` as little-endian uint32.
LocalBlockHash hash_block(std::span<const TokenId> tokens, uint64_t seed = kDefaultBlockHashSeed);

// Hashes of every complete block of `block_size` tokens; the trailing partial
// block is not hashed. block_size > 0.
std::vector<LocalBlockHash> hash_blocks(std::span<const TokenId> tokens, uint32_t block_size,
                                        uint64_t seed = kDefaultBlockHashSeed);
// The same into `out` (replaced; its capacity is reused).
void hash_blocks(std::span<const TokenId> tokens, uint32_t block_size, std::vector<LocalBlockHash>& out,
                 uint64_t seed = kDefaultBlockHashSeed);

// A prefix-dependent block id as an engine would compute it: XXH3-64 over
// (parent, local) as two little-endian uint64. Used by kvroute-mocker and the
// simulator as their `block_hash`; the router never derives meaning from it.
SequenceHash sequence_hash(SequenceHash parent, LocalBlockHash local);

}  // namespace kvroute
