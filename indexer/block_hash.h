// Block hashing, compatible with NVIDIA Dynamo (rules in indexer/README.md).
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

// XXH3-64 with `seed` over `tokens` as little-endian uint32. Uses the widest
// XXH3 variant the CPU has (runtime dispatch, block_hash.cpp).
LocalBlockHash hash_block(std::span<const TokenId> tokens, uint64_t seed = kDefaultBlockHashSeed);

// Hashes of every complete block of `block_size` tokens; the trailing partial
// block is not hashed. block_size > 0.
std::vector<LocalBlockHash> hash_blocks(std::span<const TokenId> tokens, uint32_t block_size,
                                        uint64_t seed = kDefaultBlockHashSeed);
// The same into `out` (replaced; its capacity is reused).
void hash_blocks(std::span<const TokenId> tokens, uint32_t block_size, std::vector<LocalBlockHash>& out,
                 uint64_t seed = kDefaultBlockHashSeed);

// A request's cache namespace, as vLLM keys its prefix cache: a LoRA adapter
// changes every block's hash (the seed, above); a `cache_salt` (vLLM's
// per-tenant isolation) enters only the first block's hash, so two tenants'
// equal prompts share no block at all (the radix index is prefix-dependent).
// Empty strings = absent. The request side (router) and the event side (ZMQ
// events carrying token ids) hash through the same function.
struct HashNamespace {
  std::string_view lora_name;
  std::string_view cache_salt;
};

// Seed of the first block: block_hash_seed(lora) + salt_hash(cache_salt)
// (wrapping); without a salt, block_hash_seed(lora).
uint64_t first_block_seed(const HashNamespace& ns);
// XXH3_64(cache_salt, seed 0); 0 for no salt. What a salt adds to the first
// block's seed (events/salt_attribution.h keeps salts by this value).
uint64_t salt_hash(std::string_view cache_salt);

// hash_blocks() under a namespace: block 0 with first_block_seed(ns), the
// others with block_hash_seed(ns.lora_name). Equal to the plain overload when
// both strings are empty (Dynamo compatibility).
void hash_blocks(std::span<const TokenId> tokens, uint32_t block_size, const HashNamespace& ns,
                 std::vector<LocalBlockHash>& out);

// A prefix-dependent block id as an engine would compute it: XXH3-64 over
// (parent, local) as two little-endian uint64. Used by kvroute-mocker and the
// simulator as their `block_hash`; the router never derives meaning from it.
SequenceHash sequence_hash(SequenceHash parent, LocalBlockHash local);
// A prompt's blocks chained from the root: element i is
// sequence_hash(element i - 1, blocks[i]), the first one's parent 0.
std::vector<SequenceHash> sequence_hashes(std::span<const LocalBlockHash> blocks);
// The same chain as plain values (the keys of in-flight KV accounting).
std::vector<uint64_t> sequence_hash_values(std::span<const LocalBlockHash> blocks);

}  // namespace kvroute
