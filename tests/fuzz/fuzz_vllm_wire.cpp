// Fuzz target: vLLM / SGLang ZMQ KV event payloads (events/vllm_wire.h).
// Every input goes through decode_vllm_batch and, when it decodes,
// to_kv_events (with group state, as ZmqEventSource does). Oracle beyond "no
// crash, no sanitizer report": a decoded batch re-encoded in either layout
// decodes again to the same index events.
#include <cstdio>
#include <cstdlib>

#include "events/vllm_wire.h"
#include "tests/fuzz/fuzz_driver.h"

using namespace kvroute;

const char* const kvroute_fuzz_target = "vllm_wire";
uint64_t kvroute_fuzz_accepted = 0;

namespace {

bool same(const std::vector<KvEvent>& a, const std::vector<KvEvent>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(a[i].owner == b[i].owner) || a[i].tier != b[i].tier || a[i].data.index() != b[i].data.index()) return false;
    if (auto* s = std::get_if<KvStored>(&a[i].data)) {
      auto& t = std::get<KvStored>(b[i].data);
      if (s->parent != t.parent || s->blocks.size() != t.blocks.size()) return false;
      for (size_t k = 0; k < s->blocks.size(); ++k)
        if (s->blocks[k].block_hash != t.blocks[k].block_hash || s->blocks[k].tokens_hash != t.blocks[k].tokens_hash)
          return false;
    } else if (auto* r = std::get_if<KvRemoved>(&a[i].data)) {
      if (r->block_hashes != std::get<KvRemoved>(b[i].data).block_hashes) return false;
    }
  }
  return true;
}

VllmBlockStored stored(uint64_t h0, std::optional<uint64_t> parent, uint32_t n, uint32_t bs) {
  VllmBlockStored s;
  for (uint32_t i = 0; i < n; ++i) s.block_hashes.push_back(SequenceHash{h0 + i});
  if (parent) s.parent_block_hash = SequenceHash{*parent};
  for (uint32_t i = 0; i < n * bs; ++i) s.token_ids.push_back(i * 1009 % 200000);
  s.block_size = bs;
  return s;
}

}  // namespace

std::vector<std::string> kvroute_fuzz_seeds() {
  std::vector<VllmEventBatch> batches;
  VllmEventBatch a;
  a.ts = 1.5;
  a.events.push_back(stored(1, std::nullopt, 2, 4));
  batches.push_back(a);
  VllmEventBatch b;
  b.ts = 2;
  b.data_parallel_rank = 1;
  auto s = stored(10, 2, 1, 4);
  s.lora_name = "lora";
  s.cache_salt = "salt";
  s.medium = "CPU";
  s.group_idx = 1;
  s.kv_cache_spec_kind = "sliding_window";
  s.kv_cache_spec_sliding_window = 128;
  s.lora_id = -3;
  b.events.push_back(s);
  auto root = stored(20, std::nullopt, 1, 4);
  root.lora_name = "lora";
  root.cache_salt = "tenant";
  b.events.push_back(root);
  b.events.push_back(VllmBlockRemoved{{SequenceHash{10}, SequenceHash{~0ull}}, "GPU", 1});
  b.events.push_back(VllmAllBlocksCleared{});
  b.events.push_back(VllmUnknownEvent{"Future"});
  batches.push_back(b);
  std::vector<std::string> out;
  for (const auto& x : batches)
    for (auto enc : {VllmEncoding::Positional, VllmEncoding::TaggedMap}) out.push_back(encode_vllm_batch(x, enc));
  // SGLang's positional form with a bytes hash: [ts, [["BlockStored", [bin], nil, [1,2,3,4], 4, nil]]].
  static const char kSglang[] =
      "\x92\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\x91\x96\xab" "BlockStored"
      "\x91\xc4\x03\x01\x02\x03\xc0\x94\x01\x02\x03\x04\x04\xc0";
  out.push_back(std::string(kSglang, sizeof kSglang - 1));
  return out;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  DecodeLimits limits;
  limits.max_message_bytes = 1 << 20;
  VllmEventBatch batch;
  std::string detail;
  if (decode_vllm_batch({data, size}, limits, batch, &detail) != DecodeError::None) return 0;
  ++kvroute_fuzz_accepted;
  std::vector<KvEvent> events;
  std::array<uint64_t, 5> skipped{};
  VllmGroupState groups;
  to_kv_events(batch, CacheOwner{WorkerId{1}, 0}, 4, events, &skipped, &groups);
  // Oracle: re-encoding keeps the meaning (without group state: it depends on history).
  std::vector<KvEvent> want;
  to_kv_events(batch, CacheOwner{WorkerId{1}, 0}, 4, want);
  for (auto enc : {VllmEncoding::Positional, VllmEncoding::TaggedMap}) {
    if (enc == VllmEncoding::TaggedMap) {
      bool empty_type = false;  // a map event needs a non-empty "type"; positional allows ""
      for (const auto& e : batch.events)
        if (auto* u = std::get_if<VllmUnknownEvent>(&e)) empty_type |= u->type.empty();
      if (empty_type) continue;
    }
    const std::string again = encode_vllm_batch(batch, enc);
    VllmEventBatch b2;
    const auto* p = reinterpret_cast<const uint8_t*>(again.data());
    if (decode_vllm_batch({p, again.size()}, DecodeLimits{1 << 30, 1 << 30, 1 << 30}, b2, &detail) !=
        DecodeError::None) {
      std::fprintf(stderr, "fuzz: a decoded batch re-encoded (%s) does not decode: %s\n",
                   enc == VllmEncoding::Positional ? "positional" : "map", detail.c_str());
      std::abort();
    }
    std::vector<KvEvent> got;
    to_kv_events(b2, CacheOwner{WorkerId{1}, 0}, 4, got);
    if (!same(want, got)) {
      std::fprintf(stderr, "fuzz: re-encoding (%s) changed the index events\n",
                   enc == VllmEncoding::Positional ? "positional" : "map");
      std::abort();
    }
  }
  return 0;
}
