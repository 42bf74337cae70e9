#include "indexer/block_hash.h"

#include <doctest/doctest.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

using namespace kvroute;

TEST_CASE("the block-hash contract's test vector: XXH3-64('test data', seed 1337)") {
  CHECK(XXH3_64bits_withSeed("test data", 9, 1337) == 13226331709069118873ull);
}

TEST_CASE("a block hashes its token ids as little-endian u32 with seed 1337") {
  const std::vector<TokenId> toks = {1, 2, 0x01020304};
  const unsigned char bytes[] = {1, 0, 0, 0, 2, 0, 0, 0, 4, 3, 2, 1};
  CHECK(hash_block(toks).value == XXH3_64bits_withSeed(bytes, sizeof bytes, 1337));
}

TEST_CASE("hash_block (runtime-dispatched XXH3) equals the inline XXH3 for every length and seed") {
  // Lengths cover XXH3's short (<=16, <=128, <=240 bytes) and long paths, one
  // and several 1 KiB stripe blocks, and partial last stripes.
  std::vector<TokenId> toks(2100);
  uint64_t x = 42;
  for (auto& t : toks) t = static_cast<TokenId>((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33);
  for (uint64_t seed : {uint64_t{0}, kDefaultBlockHashSeed, ~uint64_t{0}}) {
    for (size_t n = 0; n <= toks.size(); n += (n < 300 ? 1 : 37)) {
      const std::span<const TokenId> s(toks.data(), n);
      REQUIRE(hash_block(s, seed).value == XXH3_64bits_withSeed(s.data(), s.size_bytes(), seed));
    }
  }
}

TEST_CASE("hash_blocks cuts complete blocks and drops the partial tail") {
  std::vector<TokenId> toks(10);
  for (TokenId i = 0; i < 10; ++i) toks[i] = i;
  auto h = hash_blocks(toks, 4);
  REQUIRE(h.size() == 2);
  CHECK(h[0] == hash_block(std::span<const TokenId>(toks).subspan(0, 4)));
  CHECK(h[1] == hash_block(std::span<const TokenId>(toks).subspan(4, 4)));
  CHECK(hash_blocks(toks, 11).empty());
  CHECK(hash_blocks(toks, 0).empty());
}

TEST_CASE("LoRA seed rule: 1337 + XXH3_64(name, 0), wrapping; empty = base") {
  CHECK(block_hash_seed("") == 1337);
  CHECK(block_hash_seed("sql-adapter") == 1337 + XXH3_64bits_withSeed("sql-adapter", 11, 0));
  const std::vector<TokenId> toks = {5, 6, 7, 8};
  CHECK(hash_block(toks, block_hash_seed("a")) != hash_block(toks, block_hash_seed("b")));
  CHECK(hash_block(toks, block_hash_seed("a")) != hash_block(toks));
}

TEST_CASE("sequence_hash depends on the parent") {
  const LocalBlockHash l{42};
  CHECK(sequence_hash(SequenceHash{1}, l) != sequence_hash(SequenceHash{2}, l));
  CHECK(sequence_hash(SequenceHash{1}, l) == sequence_hash(SequenceHash{1}, l));
}

TEST_CASE("namespaces: cache_salt changes only block 0's hash, a LoRA name every block's") {
  std::vector<TokenId> toks(48);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<TokenId>(i * 7 + 3);
  std::vector<LocalBlockHash> plain, salted, salted2, lora, none;
  hash_blocks(toks, 16, plain);
  hash_blocks(toks, 16, HashNamespace{}, none);
  CHECK(none == plain);  // no namespace = the Dynamo-compatible hashes
  hash_blocks(toks, 16, HashNamespace{"", "tenant-a"}, salted);
  hash_blocks(toks, 16, HashNamespace{"", "tenant-b"}, salted2);
  REQUIRE(salted.size() == 3);
  CHECK(salted[0] != plain[0]);
  CHECK(salted[0] != salted2[0]);
  CHECK(salted[1] == plain[1]);  // later blocks differ only through the prefix (radix path)
  CHECK(salted[0].value ==
        XXH3_64bits_withSeed(toks.data(), 16 * sizeof(TokenId), 1337 + XXH3_64bits_withSeed("tenant-a", 8, 0)));
  hash_blocks(toks, 16, HashNamespace{"my-lora", ""}, lora);
  for (size_t i = 0; i < 3; ++i) CHECK(lora[i] != plain[i]);
  CHECK(lora[2] == hash_block(std::span<const TokenId>(toks).subspan(32, 16), block_hash_seed("my-lora")));
}
