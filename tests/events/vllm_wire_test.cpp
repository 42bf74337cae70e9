#include "events/vllm_wire.h"

#include <doctest/doctest.h>

#include <msgpack.hpp>

#include <random>

#include "events/zmq_source.h"
#include "indexer/block_hash.h"

using namespace kvroute;

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

std::span<const uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
std::span<const uint8_t> bytes(const msgpack::sbuffer& b) {
  return {reinterpret_cast<const uint8_t*>(b.data()), b.size()};
}

std::vector<TokenId> seq_tokens(TokenId first, size_t n) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + static_cast<TokenId>(i) * 7;
  return t;
}

VllmBlockStored stored(std::vector<uint64_t> hashes, std::optional<uint64_t> parent, TokenId first, uint32_t bs) {
  VllmBlockStored s;
  for (auto h : hashes) s.block_hashes.push_back(SequenceHash{h});
  if (parent) s.parent_block_hash = SequenceHash{*parent};
  s.token_ids = seq_tokens(first, hashes.size() * bs);
  s.block_size = bs;
  s.medium = "GPU";
  return s;
}

VllmEventBatch sample_batch() {
  VllmEventBatch b;
  b.ts = 1234.5;
  b.data_parallel_rank = 2;
  auto s = stored({11, 12}, std::nullopt, 100, 4);
  s.lora_name = "adapter-a";
  s.cache_salt = "tenant-1";
  s.lora_id = 7;
  s.group_idx = 0;
  s.kv_cache_spec_kind = "full_attention";
  b.events.push_back(s);
  auto s2 = stored({13}, 12, 300, 4);
  s2.medium = "CPU";
  s2.kv_cache_spec_sliding_window = 128;
  s2.group_idx = 1;
  b.events.push_back(s2);
  b.events.push_back(VllmBlockRemoved{{SequenceHash{13}}, "CPU", 1});
  b.events.push_back(VllmAllBlocksCleared{});
  b.events.push_back(VllmUnknownEvent{"SomethingNew"});
  return b;
}

void check_same(const VllmEventBatch& a, const VllmEventBatch& b) {
  CHECK(a.ts == b.ts);
  CHECK(a.data_parallel_rank == b.data_parallel_rank);
  REQUIRE(a.events.size() == b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    REQUIRE(a.events[i].index() == b.events[i].index());
    if (auto* x = std::get_if<VllmBlockStored>(&a.events[i])) {
      auto& y = std::get<VllmBlockStored>(b.events[i]);
      CHECK(x->block_hashes == y.block_hashes);
      CHECK(x->parent_block_hash == y.parent_block_hash);
      CHECK(x->token_ids == y.token_ids);
      CHECK(x->block_size == y.block_size);
      CHECK(x->lora_id == y.lora_id);
      CHECK(x->lora_name == y.lora_name);
      CHECK(x->medium == y.medium);
      CHECK(x->cache_salt == (x->parent_block_hash ? "" : y.cache_salt));
      CHECK(x->group_idx == y.group_idx);
      CHECK(x->kv_cache_spec_kind == y.kv_cache_spec_kind);
      CHECK(x->kv_cache_spec_sliding_window == y.kv_cache_spec_sliding_window);
    } else if (auto* r = std::get_if<VllmBlockRemoved>(&a.events[i])) {
      auto& q = std::get<VllmBlockRemoved>(b.events[i]);
      CHECK(r->block_hashes == q.block_hashes);
      CHECK(r->medium == q.medium);
      CHECK(r->group_idx == q.group_idx);
    } else if (auto* u = std::get_if<VllmUnknownEvent>(&a.events[i])) {
      CHECK(u->type == std::get<VllmUnknownEvent>(b.events[i]).type);
    }
  }
}

}  // namespace

TEST_CASE("encode then decode gives the batch back, in both encodings") {
  const VllmEventBatch b = sample_batch();
  for (auto enc : {VllmEncoding::Positional, VllmEncoding::TaggedMap}) {
    const std::string wire = encode_vllm_batch(b, enc);
    VllmEventBatch out;
    std::string detail;
    REQUIRE_MESSAGE(decode_vllm_batch(bytes(wire), {}, out, &detail) == DecodeError::None, detail);
    check_same(out, b);
  }
}

TEST_CASE("positional encoding is msgspec's array_like layout: tag first, trailing defaults omitted") {
  VllmEventBatch b;
  b.ts = 1;
  b.events.push_back(stored({5}, std::nullopt, 1, 2));
  const std::string wire = encode_vllm_batch(b, VllmEncoding::Positional);
  msgpack::object_handle oh = msgpack::unpack(wire.data(), wire.size());
  const msgpack::object& root = oh.get();
  REQUIRE(root.type == msgpack::type::ARRAY);
  CHECK(root.via.array.size == 2);  // no data_parallel_rank: omitted default
  const msgpack::object& ev = root.via.array.ptr[1].via.array.ptr[0];
  REQUIRE(ev.type == msgpack::type::ARRAY);
  CHECK(ev.via.array.size == 8);  // tag + 7 fields without defaults
  CHECK(ev.via.array.ptr[0].as<std::string>() == "BlockStored");
  CHECK(ev.via.array.ptr[7].is_nil());  // lora_name
}

TEST_CASE("tagged maps: any key order, unknown fields ignored, omitted defaults, bytes and negative hashes") {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(4);
  pk.pack(std::string("unknown_batch_field")); pk.pack_array(2); pk.pack(1); pk.pack(std::string("x"));
  pk.pack(std::string("events"));
  pk.pack_array(2);
  // BlockStored with keys out of order, an unknown nested field, bytes hashes.
  pk.pack_map(7);
  pk.pack(std::string("token_ids")); pk.pack_array(2); pk.pack(1); pk.pack(2);
  pk.pack(std::string("future_field")); pk.pack_map(1); pk.pack(std::string("a")); pk.pack_array(1); pk.pack_nil();
  pk.pack(std::string("block_hashes")); pk.pack_array(1); pk.pack_bin(3); pk.pack_bin_body("\x01\x02\x03", 3);
  pk.pack(std::string("type")); pk.pack(std::string("BlockStored"));
  pk.pack(std::string("parent_block_hash")); pk.pack(int64_t{-5});
  pk.pack(std::string("block_size")); pk.pack(2);
  pk.pack(std::string("extra_keys")); pk.pack_array(1); pk.pack_array(2);
  pk.pack(std::string("salt-z")); pk.pack_bin(1); pk.pack_bin_body("\x09", 1);
  // An event type from the future.
  pk.pack_map(2);
  pk.pack(std::string("type")); pk.pack(std::string("BlockPinned"));
  pk.pack(std::string("block_hashes")); pk.pack_array(0);
  pk.pack(std::string("ts")); pk.pack(7);
  pk.pack(std::string("data_parallel_rank")); pk.pack_nil();
  VllmEventBatch out;
  std::string detail;
  REQUIRE_MESSAGE(decode_vllm_batch(bytes(buf), {}, out, &detail) == DecodeError::None, detail);
  CHECK(out.ts == 7);
  CHECK(!out.data_parallel_rank);
  REQUIRE(out.events.size() == 2);
  auto& s = std::get<VllmBlockStored>(out.events[0]);
  const uint8_t h[3] = {1, 2, 3};
  CHECK(s.block_hashes == std::vector<SequenceHash>{engine_block_id(h)});
  CHECK(s.parent_block_hash == SequenceHash{static_cast<uint64_t>(int64_t{-5})});
  CHECK(s.token_ids == std::vector<TokenId>{1, 2});
  CHECK(s.medium.empty());  // omitted: the default (GPU)
  CHECK(s.cache_salt == "salt-z");  // the str of block 0's extra keys; bytes (prompt embeds) skipped
  CHECK(std::get<VllmUnknownEvent>(out.events[1]).type == "BlockPinned");
}

TEST_CASE("positional: older (5-field SGLang, 6-field vLLM) events and a 2-element batch decode") {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(2);  // SGLang: [ts, events], no data_parallel_rank
  pk.pack(1.5);
  pk.pack_array(3);
  pk.pack_array(6);  // SGLang BlockStored: tag + 5
  pk.pack(std::string("BlockStored")); pk.pack_array(1); pk.pack(uint64_t{1} << 63); pk.pack_nil();
  pk.pack_array(1); pk.pack(42); pk.pack(1); pk.pack_nil();
  pk.pack_array(2);  // SGLang BlockRemoved: tag + hashes
  pk.pack(std::string("BlockRemoved")); pk.pack_array(1); pk.pack(uint64_t{1} << 63);
  pk.pack_array(1); pk.pack(std::string("AllBlocksCleared"));
  VllmEventBatch out;
  REQUIRE(decode_vllm_batch(bytes(buf), {}, out) == DecodeError::None);
  REQUIRE(out.events.size() == 3);
  CHECK(std::get<VllmBlockStored>(out.events[0]).block_hashes[0] == SequenceHash{uint64_t{1} << 63});
  CHECK(std::get<VllmBlockStored>(out.events[0]).medium.empty());
  CHECK(std::get<VllmBlockRemoved>(out.events[1]).block_hashes.size() == 1);
  CHECK(std::holds_alternative<VllmAllBlocksCleared>(out.events[2]));
}

TEST_CASE("bad payloads are errors naming the field, never exceptions") {
  VllmEventBatch out;
  std::string detail;
  const std::string not_msgpack = "\xc1\x00";
  CHECK(decode_vllm_batch(bytes(not_msgpack), {}, out, &detail) == DecodeError::Json);
  const std::string number = "\x05";
  CHECK(decode_vllm_batch(bytes(number), {}, out, &detail) == DecodeError::WrongType);
  // An array header claiming 2^32-1 elements in a 6-byte payload.
  const std::string huge("\x92\xcb\x00\x00\x00\x00\x00\x00\x00\x00\xdd\xff\xff\xff\xff", 15);
  CHECK(decode_vllm_batch(bytes(huge), {}, out, &detail) == DecodeError::Json);
  // Token ids must be non-negative 32-bit ints.
  VllmEventBatch b;
  b.events.push_back(stored({1}, std::nullopt, 1, 2));
  std::string wire = encode_vllm_batch(b, VllmEncoding::TaggedMap);
  const std::string neg = wire;
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(2); pk.pack(0); pk.pack_array(1);
  pk.pack_array(5); pk.pack(std::string("BlockStored")); pk.pack_array(1); pk.pack(1); pk.pack_nil();
  pk.pack_array(1); pk.pack(-3);
  CHECK(decode_vllm_batch(bytes(buf), {}, out, &detail) == DecodeError::WrongType);
  CHECK(detail == "token_ids[]");
  // Limits.
  DecodeLimits small;
  small.max_events_per_message = 0;
  CHECK(decode_vllm_batch(bytes(wire), small, out, &detail) == DecodeError::TooLarge);
  small = {};
  small.max_message_bytes = 4;
  CHECK(decode_vllm_batch(bytes(wire), small, out, &detail) == DecodeError::TooLarge);
  // Every truncation of a valid payload is rejected cleanly.
  const std::string full = encode_vllm_batch(sample_batch(), VllmEncoding::TaggedMap);
  for (size_t n = 0; n < full.size(); ++n) {
    std::string cut = full.substr(0, n);
    CHECK(decode_vllm_batch(bytes(cut), {}, out) != DecodeError::None);
  }
}

TEST_CASE("deeply nested unknown values are skipped without recursion") {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(3);
  pk.pack(std::string("deep"));
  for (int i = 0; i < 100000; ++i) pk.pack_array(1);
  pk.pack_nil();
  pk.pack(std::string("ts")); pk.pack(1.0);
  pk.pack(std::string("events")); pk.pack_array(0);
  VllmEventBatch out;
  CHECK(decode_vllm_batch(bytes(buf), {}, out) == DecodeError::None);
}

TEST_CASE("to_kv_events hashes token ids as requests are hashed, with LoRA and cache_salt") {
  const uint32_t bs = 4;
  VllmEventBatch b = sample_batch();
  std::vector<KvEvent> out;
  std::array<uint64_t, 5> skipped{};
  VllmGroupState groups;
  to_kv_events(b, CacheOwner{WorkerId{9}, 0}, bs, out, &skipped, &groups);
  // stored(11,12) -> KvStored; stored(13) is sliding window: skipped; removed in
  // group 1 (learned as not indexed): skipped; cleared; unknown: skipped.
  REQUIRE(out.size() == 2);
  CHECK(skipped[static_cast<size_t>(VllmSkip::NotFullAttention)] == 2);
  CHECK(skipped[static_cast<size_t>(VllmSkip::UnknownType)] == 1);
  const auto& st = std::get<KvStored>(out[0].data);
  CHECK(out[0].owner == CacheOwner{WorkerId{9}, 2});  // rank from the batch
  CHECK(out[0].tier == StorageTier::Device);
  CHECK(!st.parent);
  const auto& s = std::get<VllmBlockStored>(b.events[0]);
  std::vector<LocalBlockHash> want;
  hash_blocks(s.token_ids, bs, HashNamespace{"adapter-a", "tenant-1"}, want);
  REQUIRE(st.blocks.size() == 2);
  CHECK(st.blocks[0].block_hash == SequenceHash{11});
  CHECK(st.blocks[0].tokens_hash == want[0]);
  CHECK(st.blocks[1].tokens_hash == want[1]);
  CHECK(want[0] != hash_block(std::span(s.token_ids).subspan(0, bs), block_hash_seed("adapter-a")));
  CHECK(std::holds_alternative<KvCleared>(out[1].data));
}

TEST_CASE("to_kv_events: medium to tier, salt only without a parent, size and count checks") {
  VllmEventBatch b;
  auto cont = stored({21}, 20, 5, 2);
  cont.medium = "CPU";
  cont.cache_salt = "ignored-with-a-parent";
  b.events.push_back(cont);
  auto disk = stored({22}, std::nullopt, 5, 2);
  disk.medium = "DISK";
  b.events.push_back(disk);
  auto other = stored({23}, std::nullopt, 5, 2);
  other.medium = "LMCACHE";
  b.events.push_back(other);
  b.events.push_back(stored({24}, std::nullopt, 5, 8));  // block size differs
  auto shortt = stored({25}, std::nullopt, 5, 2);
  shortt.token_ids.pop_back();
  b.events.push_back(shortt);
  b.events.push_back(VllmBlockRemoved{{SequenceHash{21}}, "CPU", std::nullopt});
  // SGLang HiCache's tiers; media compare case-insensitively.
  for (const char* m : {"CPU_TIER1", "gpu", "Disk", "CPU_TIER2"}) b.events.push_back(VllmBlockRemoved{{SequenceHash{26}}, m, std::nullopt});
  std::vector<KvEvent> out;
  std::array<uint64_t, 5> skipped{};
  to_kv_events(b, CacheOwner{WorkerId{1}, 3}, 2, out, &skipped);
  REQUIRE(out.size() == 8);
  CHECK(out[4].tier == StorageTier::HostPinned);
  CHECK(out[5].tier == StorageTier::Device);
  CHECK(out[6].tier == StorageTier::Disk);
  CHECK(out[7].tier == StorageTier::External);
  CHECK(out[0].tier == StorageTier::HostPinned);
  CHECK(std::get<KvStored>(out[0].data).blocks[0].tokens_hash == hash_block(cont.token_ids));
  CHECK(out[0].owner.dp_rank == 3);
  CHECK(out[1].tier == StorageTier::Disk);
  CHECK(out[2].tier == StorageTier::External);
  CHECK(out[3].tier == StorageTier::HostPinned);
  CHECK(std::get<KvRemoved>(out[3].data).block_hashes == std::vector<SequenceHash>{SequenceHash{21}});
  CHECK(skipped[static_cast<size_t>(VllmSkip::BlockSizeMismatch)] == 1);
  CHECK(skipped[static_cast<size_t>(VllmSkip::TokenCount)] == 1);
}

TEST_CASE("to_kv_events: the offloading connector's CPU copies, named by id only, are copies of held blocks") {
  VllmEventBatch b;
  auto copy = stored({31, 32}, std::nullopt, 0, 2);
  copy.token_ids.clear();  // as vLLM's OffloadingConnector announces them
  copy.medium = "CPU";
  b.events.push_back(copy);
  auto on_gpu = copy;
  on_gpu.medium = "GPU";  // a device store needs its tokens
  b.events.push_back(on_gpu);
  auto chained = copy;
  chained.parent_block_hash = SequenceHash{30};  // a chain needs its tokens
  b.events.push_back(chained);
  std::vector<KvEvent> out;
  std::array<uint64_t, 5> skipped{};
  to_kv_events(b, CacheOwner{WorkerId{1}, 0}, 2, out, &skipped);
  REQUIRE(out.size() == 1);
  CHECK(out[0].tier == StorageTier::HostPinned);
  const auto& st = std::get<KvStored>(out[0].data);
  CHECK(st.copies);
  REQUIRE(st.blocks.size() == 2);
  CHECK(st.blocks[0].block_hash == SequenceHash{31});
  CHECK(st.blocks[1].block_hash == SequenceHash{32});
  CHECK(skipped[static_cast<size_t>(VllmSkip::TokenCount)] == 2);
}

TEST_CASE("engine_block_id: a bytes hash names the block its int form names, as vLLM reduces it") {
  // int.from_bytes(h, "big") & (2**64 - 1): the last 8 bytes, big-endian.
  std::array<uint8_t, 32> h{};
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint8_t>(i * 37 + 1);
  uint64_t low = 0;
  for (size_t i = 24; i < 32; ++i) low = (low << 8) | h[i];
  CHECK(engine_block_id(h) == SequenceHash{low});
  const uint8_t short_hash[3] = {1, 2, 3};
  CHECK(engine_block_id(short_hash) == SequenceHash{0x010203});
  CHECK(engine_block_id(std::span<const uint8_t>{}) == SequenceHash{0});
}

TEST_CASE("vllm_kind_indexed: full attention kinds only") {
  CHECK(vllm_kind_indexed("", std::nullopt));
  CHECK(vllm_kind_indexed("full_attention", std::nullopt));
  CHECK(vllm_kind_indexed("mla_attention", std::nullopt));
  CHECK_FALSE(vllm_kind_indexed("sliding_window", std::nullopt));
  CHECK_FALSE(vllm_kind_indexed("mamba", std::nullopt));
  CHECK_FALSE(vllm_kind_indexed("full_attention", 4096u));
}

TEST_CASE("offset_endpoint_port follows vLLM") {
  CHECK(offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557");
  CHECK(offset_endpoint_port("tcp://10.0.0.1:5557", 3) == "tcp://10.0.0.1:5560");
  CHECK(offset_endpoint_port("inproc://cache", 2) == "inproc://cache_dp2");
  CHECK(offset_endpoint_port("", 2).empty());
}

// Found by scripts/fuzz.sh (tests/fuzz/regressions/vllm_wire/ts-2pow64-reencode):
// msgpack-c's pack_double converted ts = 2^64 to uint64_t (undefined).
TEST_CASE("ts is encoded as a float64 whatever its value, and decodes back unchanged") {
  for (double ts : {0.0, 1.5, 1e9, 18446744073709551616.0, -1.0, 1e300}) {
    VllmEventBatch b;
    b.ts = ts;
    b.events.push_back(VllmAllBlocksCleared{});
    for (auto enc : {VllmEncoding::Positional, VllmEncoding::TaggedMap}) {
      const std::string bytes = encode_vllm_batch(b, enc);
      VllmEventBatch back;
      REQUIRE(decode_vllm_batch({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, DecodeLimits{}, back) ==
              DecodeError::None);
      CHECK(back.ts == ts);
      CHECK(bytes.find('\xcb') != std::string::npos);  // float64 marker, never an int
    }
  }
}

TEST_CASE("decoding into a reused batch never leaks the previous batch's values") {
  VllmEventBatch out;
  const std::string first = encode_vllm_batch(sample_batch(), VllmEncoding::Positional);
  REQUIRE(decode_vllm_batch(bytes(first), {}, out) == DecodeError::None);
  // A map BlockStored without block_hashes and token_ids, then a shorter one.
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(2);
  pk.pack(std::string("ts")); pk.pack(3);
  pk.pack(std::string("events")); pk.pack_array(2);
  pk.pack_map(2); pk.pack(std::string("type")); pk.pack(std::string("BlockStored"));
  pk.pack(std::string("block_size")); pk.pack(4);
  pk.pack_array(5); pk.pack(std::string("BlockStored")); pk.pack_array(1); pk.pack(99); pk.pack_nil();
  pk.pack_array(4); for (int i = 0; i < 4; ++i) pk.pack(i);
  pk.pack(4);  // block_size
  REQUIRE(decode_vllm_batch(bytes(buf), {}, out) == DecodeError::None);
  REQUIRE(out.events.size() == 2);
  CHECK(std::get<VllmBlockStored>(out.events[0]).block_hashes.empty());
  CHECK(std::get<VllmBlockStored>(out.events[0]).token_ids.empty());
  CHECK(std::get<VllmBlockStored>(out.events[0]).lora_name.empty());
  CHECK(std::get<VllmBlockStored>(out.events[1]).block_hashes == std::vector<SequenceHash>{SequenceHash{99}});
  CHECK(std::get<VllmBlockStored>(out.events[1]).token_ids == std::vector<TokenId>{0, 1, 2, 3});
  CHECK(std::get<VllmBlockStored>(out.events[1]).medium.empty());
  CHECK(!out.data_parallel_rank);
}
