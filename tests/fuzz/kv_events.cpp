// Fuzz target: decode_kv_events (events/wire.h), a `{prefix}.kv_events` NATS
// message (one RouterEvent or {"events":[...]}) from any publisher.
// Contract checked on every input:
//   - an error appends nothing, names a field in `detail`, and has a name;
//   - a success appends events within the limits (an empty batch appends
//     none), and each decoded event
//     re-encoded with encode_kv_event decodes to the same event.
#include <string>

#include "events/wire.h"
#include "indexer/block_hash.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/kv_event_equal.h"
#include "tests/fuzz/small_limits.h"

using namespace kvroute;

namespace {

KvEvent sentinel() {
  KvEvent e;
  e.owner = CacheOwner{WorkerId{424242}, 7};
  e.event_id = 99;
  e.data = KvCleared{};
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const DecodeLimits limits = fuzz::small_limits();
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  std::vector<KvEvent> out{sentinel()};
  std::string detail;
  const DecodeError err = decode_kv_events(json, limits, out, &detail);
  FUZZ_CHECK(!to_string(err).empty());
  FUZZ_CHECK(fuzz::same_event(out.front(), sentinel()));
  if (err != DecodeError::None) {
    FUZZ_CHECK(out.size() == 1);
    FUZZ_CHECK(!detail.empty());
    return 0;
  }
  FUZZ_CHECK(out.size() <= 1 + limits.max_events_per_message);  // {"events":[]} adds none
  for (size_t i = 1; i < out.size(); ++i) {
    if (const auto* s = std::get_if<KvStored>(&out[i].data)) FUZZ_CHECK(s->blocks.size() <= limits.max_blocks_per_event);
    if (const auto* r = std::get_if<KvRemoved>(&out[i].data))
      FUZZ_CHECK(r->block_hashes.size() <= limits.max_blocks_per_event);
    std::vector<KvEvent> again;
    const std::string encoded = encode_kv_event(out[i]);
    FUZZ_CHECK(decode_kv_events(encoded, limits, again) == DecodeError::None);
    FUZZ_CHECK(again.size() == 1 && fuzz::same_event(again[0], out[i]));
  }
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  std::vector<std::string> seeds;
  KvEvent stored;
  stored.owner = CacheOwner{WorkerId{7}, 1};
  stored.event_id = 42;
  stored.tier = StorageTier::HostPinned;
  KvStored s;
  s.parent = SequenceHash{1234};
  for (uint64_t i = 0; i < 4; ++i) s.blocks.push_back({SequenceHash{5678 + i}, LocalBlockHash{~0ull - i}});
  stored.data = s;
  KvEvent removed;
  removed.owner = CacheOwner{WorkerId{~0ull}, 0};
  removed.event_id = 43;
  removed.tier = StorageTier::Disk;
  removed.data = KvRemoved{{SequenceHash{5678}, SequenceHash{~0ull}}};
  KvEvent cleared;
  cleared.owner = CacheOwner{WorkerId{3}, 4294967295u};
  cleared.tier = StorageTier::External;
  cleared.data = KvCleared{};
  for (const auto* e : {&stored, &removed, &cleared}) seeds.push_back(encode_kv_event(*e));
  seeds.push_back(R"({"events":[)" + seeds[0] + "," + seeds[1] + "," + seeds[2] + "]}");
  // The forms the encoder never writes: token ids hashed by the router (with a
  // LoRA seed), signed hashes, "cleared" as an object, unknown fields.
  seeds.push_back(R"({"worker_id":1,"event":{"data":{"stored":{"parent_hash":null,"lora_name":"ad1",)"
                  R"("blocks":[{"block_hash":9,"token_ids":[1,2,3,4]},{"block_hash":-9,"token_ids":[5,6,7,8]}]}}}})");
  seeds.push_back(R"({"worker_id":2,"x":[1.5,true],"event":{"event_id":0,"data":{"cleared":{}}}})");
  seeds.push_back(R"({"worker_id":2,"event":{"event_id":18446744073709551615,"data":{"removed":{"block_hashes":[-9223372036854775808]}}}})");
  return seeds;
}
