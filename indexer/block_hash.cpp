#include "indexer/block_hash.h"

#include <bit>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

// XXH3 over a whole block (2 KiB at 512 tokens) runs ~1.6x faster with AVX2
// or AVX-512 than with the SSE2 that the inline build above targets (the build
// uses no -mavx2). libxxhash's x86 dispatcher (upstream xxh_x86dispatch.c,
// in Debian's libxxhash.so) picks scalar, SSE2, AVX2 or AVX-512 by cpuid at
// run time; every variant returns the same value (tests/indexer/block_hash_test.cpp
// checks it against the inline path). KVROUTE_XXH_DISPATCH is set by CMake
// when the library has the symbol; without it the inline path is used.
#if KVROUTE_XXH_DISPATCH
extern "C" XXH64_hash_t XXH3_64bits_withSeed_dispatch(const void* input, size_t len, XXH64_hash_t seed);
#endif

namespace kvroute {

static_assert(std::endian::native == std::endian::little,
              "block hashing assumes a little-endian host (token ids are hashed as LE u32)");

uint64_t block_hash_seed(std::string_view lora_name) {
  if (lora_name.empty()) return kDefaultBlockHashSeed;
  return kDefaultBlockHashSeed + XXH3_64bits_withSeed(lora_name.data(), lora_name.size(), 0);
}

namespace {
#if KVROUTE_XXH_DISPATCH
// The dispatcher picks its variant on its first call and stores the choice
// unsynchronised: make that first call here, during static initialisation,
// before any thread can race on it.
[[maybe_unused]] const uint64_t dispatch_warmed_up = XXH3_64bits_withSeed_dispatch("", 0, 0);
#endif
}  // namespace

LocalBlockHash hash_block(std::span<const TokenId> tokens, uint64_t seed) {
#if KVROUTE_XXH_DISPATCH
  return LocalBlockHash{XXH3_64bits_withSeed_dispatch(tokens.data(), tokens.size_bytes(), seed)};
#else
  return LocalBlockHash{XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), seed)};
#endif
}

std::vector<LocalBlockHash> hash_blocks(std::span<const TokenId> tokens, uint32_t block_size,
                                        uint64_t seed) {
  std::vector<LocalBlockHash> out;
  hash_blocks(tokens, block_size, out, seed);
  return out;
}

void hash_blocks(std::span<const TokenId> tokens, uint32_t block_size, std::vector<LocalBlockHash>& out,
                 uint64_t seed) {
  out.clear();
  if (block_size == 0) return;
  const size_t n = tokens.size() / block_size;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(hash_block(tokens.subspan(i * block_size, block_size), seed));
}

uint64_t salt_hash(std::string_view cache_salt) {
  return cache_salt.empty() ? 0 : XXH3_64bits_withSeed(cache_salt.data(), cache_salt.size(), 0);
}

uint64_t first_block_seed(const HashNamespace& ns) { return block_hash_seed(ns.lora_name) + salt_hash(ns.cache_salt); }

void hash_blocks(std::span<const TokenId> tokens, uint32_t block_size, const HashNamespace& ns,
                 std::vector<LocalBlockHash>& out) {
  hash_blocks(tokens, block_size, out, block_hash_seed(ns.lora_name));
  if (!out.empty() && !ns.cache_salt.empty())
    out[0] = hash_block(tokens.subspan(0, block_size), first_block_seed(ns));
}

SequenceHash sequence_hash(SequenceHash parent, LocalBlockHash local) {
  uint64_t buf[2] = {parent.value, local.value};
  return SequenceHash{XXH3_64bits_withSeed(buf, sizeof buf, kDefaultBlockHashSeed)};
}

namespace {
// Calls `f` with each block's sequence hash, first block first (its parent 0).
template <class F>
void for_each_sequence_hash(std::span<const LocalBlockHash> blocks, F&& f) {
  SequenceHash parent{0};
  for (LocalBlockHash b : blocks) f(parent = sequence_hash(parent, b));
}
}  // namespace

std::vector<SequenceHash> sequence_hashes(std::span<const LocalBlockHash> blocks) {
  std::vector<SequenceHash> out;
  out.reserve(blocks.size());
  for_each_sequence_hash(blocks, [&](SequenceHash h) { out.push_back(h); });
  return out;
}

std::vector<uint64_t> sequence_hash_values(std::span<const LocalBlockHash> blocks) {
  std::vector<uint64_t> out;
  out.reserve(blocks.size());
  for_each_sequence_hash(blocks, [&](SequenceHash h) { out.push_back(h.value); });
  return out;
}

}  // namespace kvroute
