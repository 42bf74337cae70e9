// Fuzz target: decode_resync_chunk (events/wire.h), one reply of a chunked
// resync: a chunk (compact base64 blocks), a legacy whole dump, or
// {"error":"snapshot_gone"}.
// Contract checked on every input:
//   - an error leaves the output untouched and names a field in `detail`;
//   - a success is snapshot_gone, or chunk < chunks with every event owned by
//     the dump's owner, carrying its instance id and no event id;
//   - re-encoded: the stored events as one chunk (encode_resync_chunks) decode
//     to the same owner, instance, last event id, snapshot and events;
//     snapshot_gone through encode_resync_gone.
#include <string>

#include "events/wire.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/kv_event_equal.h"
#include "tests/fuzz/small_limits.h"

using namespace kvroute;

namespace {

bool same(const ResyncChunk& a, const ResyncChunk& b) {
  const ResyncDump &x = a.dump, &y = b.dump;
  if (a.snapshot != b.snapshot || a.chunk != b.chunk || a.chunks != b.chunks || a.snapshot_gone != b.snapshot_gone ||
      x.owner != y.owner || x.instance != y.instance || x.last_event_id != y.last_event_id ||
      x.events.size() != y.events.size())
    return false;
  for (size_t i = 0; i < x.events.size(); ++i)
    if (!fuzz::same_event(x.events[i], y.events[i]) || x.events[i].instance != y.events[i].instance) return false;
  return true;
}

ResyncChunk sentinel() {
  ResyncChunk c;
  c.dump.owner = CacheOwner{WorkerId{424242}, 3};
  c.dump.last_event_id = 77;
  c.dump.instance = 5;
  c.dump.events.resize(1);
  c.snapshot = 9;
  c.chunk = 2;
  c.chunks = 4;
  return c;
}

// What encode_resync_chunks keeps of a dump: its stored events with blocks.
std::vector<KvEvent> stored_events(const ResyncDump& d) {
  std::vector<KvEvent> out;
  for (const auto& ev : d.events)
    if (const auto* st = std::get_if<KvStored>(&ev.data); st && !st->blocks.empty()) out.push_back(ev);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const DecodeLimits limits = fuzz::small_limits();
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  ResyncChunk c;
  if (!fuzz::decoded_or_untouched(c, sentinel(), same, [&](ResyncChunk& o, std::string* detail) {
        return decode_resync_chunk(json, limits, o, detail) == DecodeError::None;
      }))
    return 0;
  ResyncChunk again;
  if (c.snapshot_gone) {
    FUZZ_CHECK(c.dump.events.empty());
    FUZZ_CHECK(decode_resync_chunk(encode_resync_gone(), limits, again) == DecodeError::None && again.snapshot_gone);
    return 0;
  }
  FUZZ_CHECK(c.chunk < c.chunks);
  for (const auto& ev : c.dump.events) {
    FUZZ_CHECK(ev.owner == c.dump.owner);
    FUZZ_CHECK(ev.instance == c.dump.instance);
    FUZZ_CHECK(!ev.event_id.has_value());
  }
  ResyncChunk expected = c;
  expected.chunk = 0, expected.chunks = 1;
  expected.dump.events = stored_events(c.dump);
  const auto chunks = encode_resync_chunks(c.dump, c.snapshot, 64 << 20);
  FUZZ_CHECK(chunks.size() == 1);
  FUZZ_CHECK(decode_resync_chunk(chunks[0], limits, again) == DecodeError::None);
  FUZZ_CHECK(same(again, expected));
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  ResyncDump d;
  d.owner = CacheOwner{WorkerId{7}, 1};
  d.last_event_id = 1000;
  d.instance = 0xabcdef;
  KvEvent stored;
  stored.owner = d.owner;
  stored.instance = d.instance;
  stored.tier = StorageTier::Disk;
  KvStored s;
  for (uint64_t i = 0; i < 40; ++i) s.blocks.push_back({SequenceHash{100 + i}, LocalBlockHash{~0ull - i}});
  stored.data = s;
  d.events.push_back(stored);
  s.parent = SequenceHash{139};
  s.blocks = {{SequenceHash{140}, LocalBlockHash{1}}};
  stored.data = s;
  stored.tier = StorageTier::HostPinned;
  d.events.push_back(stored);
  std::vector<std::string> seeds = encode_resync_chunks(d, 3, 1024);  // several chunks, one event split
  seeds.push_back(encode_resync_chunks(d, 0, 1 << 20)[0]);
  seeds.push_back(encode_resync_chunks(ResyncDump{}, 1, 1024)[0]);  // no blocks
  seeds.push_back(encode_resync_dump(d));                            // legacy whole dump
  seeds.push_back(encode_resync_gone());
  seeds.push_back(R"({"error":"busy"})");
  return seeds;
}
