// Fuzz target: decode_resync_dump (events/wire.h), a worker's reply to a
// `{prefix}.kv_resync.{worker_id}` request.
// Contract checked on every input:
//   - an error leaves the output untouched and names a field in `detail`;
//   - a success has at most max_events_per_message events, each owned by the
//     dump's owner and without an event id, and the dump re-encoded with
//     encode_resync_dump decodes to the same dump.
#include <string>

#include "events/wire.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/kv_event_equal.h"
#include "tests/fuzz/small_limits.h"

using namespace kvroute;

namespace {

bool same(const ResyncDump& a, const ResyncDump& b) {
  if (a.owner != b.owner || a.last_event_id != b.last_event_id || a.events.size() != b.events.size()) return false;
  for (size_t i = 0; i < a.events.size(); ++i)
    if (!fuzz::same_event(a.events[i], b.events[i])) return false;
  return true;
}

ResyncDump sentinel() {
  ResyncDump d;
  d.owner = CacheOwner{WorkerId{424242}, 3};
  d.last_event_id = 77;
  d.events.resize(1);
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const DecodeLimits limits = fuzz::small_limits();
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  ResyncDump dump;
  if (!fuzz::decoded_or_untouched(dump, sentinel(), same, [&](ResyncDump& o, std::string* detail) {
        return decode_resync_dump(json, limits, o, detail) == DecodeError::None;
      }))
    return 0;
  FUZZ_CHECK(dump.events.size() <= limits.max_events_per_message);
  for (const auto& ev : dump.events) {
    FUZZ_CHECK(ev.owner == dump.owner);
    FUZZ_CHECK(!ev.event_id.has_value());
  }
  ResyncDump again;
  FUZZ_CHECK(decode_resync_dump(encode_resync_dump(dump), limits, again) == DecodeError::None);
  FUZZ_CHECK(same(again, dump));
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  ResyncDump d;
  d.owner = CacheOwner{WorkerId{7}, 1};
  d.last_event_id = 1000;
  KvEvent stored;
  stored.owner = d.owner;
  stored.tier = StorageTier::Disk;
  KvStored s;
  for (uint64_t i = 0; i < 3; ++i) s.blocks.push_back({SequenceHash{100 + i}, LocalBlockHash{200 + i}});
  stored.data = s;
  d.events.push_back(stored);
  s.parent = SequenceHash{102};
  s.blocks = {{SequenceHash{103}, LocalBlockHash{~0ull}}};
  stored.data = s;
  stored.tier = StorageTier::Device;
  d.events.push_back(stored);
  std::vector<std::string> seeds{encode_resync_dump(d)};
  d.events.clear();
  d.last_event_id = 0;
  seeds.push_back(encode_resync_dump(d));
  seeds.push_back(R"({"worker_id":9,"last_event_id":5,"events":[{"event":{"event_id":3,"data":{"removed":)"
                  R"({"block_hashes":[1,-1]}}}},{"event":{"data":"cleared"}},{"event":{"data":{"stored":)"
                  R"({"lora_name":"a","blocks":[{"block_hash":1,"token_ids":[1,2]}]}}}}]})");
  return seeds;
}
