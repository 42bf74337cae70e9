// Instance ids on the wire, and the chunked, compact resync.
#include <doctest/doctest.h>

#include <random>

#include "events/wire.h"

using namespace kvroute;

namespace {
// A dump of `events` stored events of `blocks` blocks each, chained.
ResyncDump make_dump(size_t events, size_t blocks, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  ResyncDump d;
  d.owner = CacheOwner{WorkerId{42}, 1};
  d.last_event_id = 777;
  d.instance = 0xABCDEF0123456789ull;
  for (size_t e = 0; e < events; ++e) {
    KvEvent ev;
    ev.owner = d.owner;
    ev.tier = static_cast<StorageTier>(e % 4);
    KvStored st;
    if (e % 2) st.parent = SequenceHash{rng()};
    for (size_t b = 0; b < blocks; ++b) st.blocks.push_back({SequenceHash{rng()}, LocalBlockHash{rng()}});
    ev.data = std::move(st);
    d.events.push_back(std::move(ev));
  }
  return d;
}

// Every (block_hash, tokens_hash, parent-of-run) in order, flattened.
std::vector<uint64_t> flatten(const std::vector<KvEvent>& evs) {
  std::vector<uint64_t> out;
  for (const auto& e : evs) {
    const auto& st = std::get<KvStored>(e.data);
    for (const auto& b : st.blocks) out.push_back(b.block_hash.value), out.push_back(b.tokens_hash.value);
  }
  return out;
}
}  // namespace

TEST_CASE("instance ids ride on events, heartbeats and dumps; messages without them still decode") {
  KvEvent ev;
  ev.owner = CacheOwner{WorkerId{3}, 0};
  ev.event_id = 1;
  ev.instance = 123456789;
  ev.data = KvCleared{};
  std::vector<KvEvent> out;
  REQUIRE(decode_kv_events(encode_kv_event(ev), DecodeLimits{}, out) == DecodeError::None);
  CHECK(out[0].instance == 123456789u);
  out.clear();
  REQUIRE(decode_kv_events(R"({"worker_id":3,"event":{"event_id":1,"data":"cleared"}})", DecodeLimits{}, out) ==
          DecodeError::None);
  CHECK(out[0].instance == 0u);
  std::string d;
  CHECK(decode_kv_events(R"({"worker_id":3,"instance_id":-1,"event":{"data":"cleared"}})", DecodeLimits{}, out, &d) ==
        DecodeError::WrongType);
  CHECK(d == "instance_id");

  WorkerHeartbeat hb, back;
  hb.worker_id = WorkerId{9};
  hb.url = "http://127.0.0.1:1";
  hb.block_size = 16;
  hb.instance_id = 55;
  REQUIRE(decode_heartbeat(encode_heartbeat(hb), back) == DecodeError::None);
  CHECK(back.instance_id == 55u);
  REQUIRE(decode_heartbeat(R"({"worker_id":9,"url":"http://x:1"})", back) == DecodeError::None);
  CHECK(back.instance_id == 0u);
}

TEST_CASE("a dump is split into chunks under max_bytes that decode back to the same blocks") {
  const ResyncDump dump = make_dump(40, 700);  // one event is larger than a chunk
  for (size_t max_bytes : {size_t{1024}, size_t{4096}, size_t{64 << 10}, size_t{1 << 20}}) {
    const auto chunks = encode_resync_chunks(dump, 9, max_bytes);
    REQUIRE(!chunks.empty());
    std::vector<KvEvent> events;
    for (size_t i = 0; i < chunks.size(); ++i) {
      CHECK(chunks[i].size() <= max_bytes);
      ResyncChunk c;
      std::string detail;
      REQUIRE_MESSAGE(decode_resync_chunk(chunks[i], DecodeLimits{}, c, &detail) == DecodeError::None, detail);
      CHECK(c.chunk == i);
      CHECK(c.chunks == chunks.size());
      CHECK(c.snapshot == 9u);
      CHECK(c.dump.owner == dump.owner);
      CHECK(c.dump.instance == dump.instance);
      CHECK(c.dump.last_event_id == 777u);
      for (auto& e : c.dump.events) events.push_back(std::move(e));
    }
    CHECK(flatten(events) == flatten(dump.events));
    // A split event's later parts continue from the previous part's last
    // block: parentless parts are exactly the parentless events.
    size_t parentless = 0;
    for (size_t i = 0; i < events.size(); ++i) {
      const auto& st = std::get<KvStored>(events[i].data);
      if (!st.parent) ++parentless;
      else if (i > 0 && events.size() > dump.events.size() && *st.parent == std::get<KvStored>(events[i - 1].data).blocks.back().block_hash)
        CHECK(events[i].tier == events[i - 1].tier);
    }
    CHECK(parentless == 20);
    if (max_bytes <= 4096) CHECK(events.size() > dump.events.size());
  }
  // Compact: far fewer bytes per block than the JSON dump (bytes per block printed).
  const size_t json = encode_resync_dump(dump).size();
  size_t compact = 0;
  for (const auto& c : encode_resync_chunks(dump, 1, 1 << 20)) compact += c.size();
  MESSAGE("bytes per block: json " << double(json) / 28000 << ", compact " << double(compact) / 28000);
  CHECK(compact * 3 < json);
}

TEST_CASE("chunk replies: legacy whole dumps, snapshot_gone, and corrupt blocks") {
  ResyncDump dump = make_dump(2, 3);
  ResyncChunk c;
  REQUIRE(decode_resync_chunk(encode_resync_dump(dump), DecodeLimits{}, c) == DecodeError::None);
  CHECK(c.chunks == 1u);
  CHECK(c.dump.events.size() == 2);
  CHECK(c.dump.instance == dump.instance);
  REQUIRE(decode_resync_chunk(encode_resync_gone(), DecodeLimits{}, c) == DecodeError::None);
  CHECK(c.snapshot_gone);

  std::string good = encode_resync_chunks(dump, 1, 4096)[0];
  std::string detail;
  // Truncated base64 payload; a chunk index beyond the count; a bad tier byte.
  std::string bad = good;
  bad.erase(bad.size() - 6, 4);
  CHECK(decode_resync_chunk(bad, DecodeLimits{}, c, &detail) == DecodeError::WrongType);
  bad = good;
  bad.replace(bad.find("\"chunk\":0"), 9, "\"chunk\":5");
  CHECK(decode_resync_chunk(bad, DecodeLimits{}, c, &detail) == DecodeError::WrongType);
  bad = good;
  const size_t at = bad.find("\"blocks\":\"") + 10;
  bad[at] = 'B';  // first byte (tier) becomes 4..7
  bad[at + 1] = 'A';
  CHECK(decode_resync_chunk(bad, DecodeLimits{}, c, &detail) == DecodeError::UnknownTier);

  ResyncRequest rq{3, 8, 2, 1 << 20}, back;
  REQUIRE(decode_resync_request(encode_resync_request(rq), back) == DecodeError::None);
  CHECK(back.dp_rank == 3u);
  CHECK(back.snapshot == 8u);
  CHECK(back.chunk == 2u);
  CHECK(back.max_bytes == uint64_t{1} << 20);
  REQUIRE(decode_resync_request(R"({"dp_rank":1})", back) == DecodeError::None);
  CHECK(back.max_bytes == 0u);  // a legacy request: answered with one dump
  CHECK(decode_resync_request("{", back) != DecodeError::None);
}

TEST_CASE("the medium rides on events and dump records; a name longer than any pool's is dropped") {
  KvEvent ev;
  ev.owner = CacheOwner{WorkerId{7}, 0};
  ev.tier = StorageTier::External;
  ev.medium = "LMCache";
  ev.data = KvStored{std::nullopt, {{SequenceHash{1}, LocalBlockHash{2}}}};
  std::vector<KvEvent> out;
  REQUIRE(decode_kv_events(encode_kv_event(ev), DecodeLimits{}, out) == DecodeError::None);
  REQUIRE(out.size() == 1);
  CHECK(out[0].medium == "LMCache");
  CHECK(out[0].tier == StorageTier::External);
  out.clear();
  REQUIRE(decode_kv_events(R"({"worker_id":7,"medium":")" + std::string(33, 'x') +
                               R"(","event":{"data":{"removed":{"block_hashes":[1]}}}})",
                           DecodeLimits{}, out) == DecodeError::None);
  CHECK(out.at(0).medium.empty());
  out.clear();
  CHECK(decode_kv_events(R"({"worker_id":7,"medium":5,"event":{"data":"cleared"}})", DecodeLimits{}, out) ==
        DecodeError::WrongType);

  // Dump records: the medium survives the compact encoding, per record.
  ResyncDump d = make_dump(4, 3);
  std::get<KvStored>(d.events[0].data).parent.reset();
  d.events[1].medium = "LMCache";
  d.events[3].medium = std::string(40, 'y');  // too long: sent without one
  std::vector<KvEvent> got;
  for (const auto& c : encode_resync_chunks(d, 1, 1 << 20)) {
    ResyncChunk r;
    REQUIRE(decode_resync_chunk(c, DecodeLimits{}, r) == DecodeError::None);
    for (auto& e : r.dump.events) got.push_back(std::move(e));
  }
  REQUIRE(got.size() == 4);
  CHECK(got[0].medium.empty());
  CHECK(got[1].medium == "LMCache");
  CHECK(got[3].medium.empty());
  CHECK(flatten(got) == flatten(d.events));
}
