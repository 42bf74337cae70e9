#include "events/wire.h"

#include <doctest/doctest.h>

#include "indexer/block_hash.h"

using namespace kvroute;

TEST_CASE("decodes Dynamo RouterEvent stored/removed/cleared") {
  DecodeLimits lim;
  std::vector<KvEvent> out;
  std::string detail;
  auto e = decode_kv_events(
      R"({"worker_id": 7, "storage_tier": "host_pinned",
          "event": {"event_id": 42, "dp_rank": 1,
            "data": {"stored": {"parent_hash": 1234,
              "blocks": [{"block_hash": 5678, "tokens_hash": 13226331709069118873}]}}}})",
      lim, out, &detail);
  REQUIRE_MESSAGE(e == DecodeError::None, detail);
  REQUIRE(out.size() == 1);
  CHECK(out[0].owner.worker == WorkerId{7});
  CHECK(out[0].owner.dp_rank == 1);
  CHECK(out[0].event_id == 42u);
  CHECK(out[0].tier == StorageTier::HostPinned);
  const auto& s = std::get<KvStored>(out[0].data);
  CHECK(s.parent == SequenceHash{1234});
  REQUIRE(s.blocks.size() == 1);
  CHECK(s.blocks[0].block_hash == SequenceHash{5678});
  CHECK(s.blocks[0].tokens_hash == LocalBlockHash{13226331709069118873ull});

  out.clear();
  CHECK(decode_kv_events(R"({"worker_id": 7, "event": {"event_id": 43, "data": {"removed": {"block_hashes": [5678, -1]}}}})",
                         lim, out) == DecodeError::None);
  const auto& r = std::get<KvRemoved>(out[0].data);
  CHECK(r.block_hashes == std::vector<SequenceHash>{SequenceHash{5678}, SequenceHash{~0ull}});
  CHECK(out[0].tier == StorageTier::Device);

  out.clear();
  CHECK(decode_kv_events(R"({"worker_id": 7, "event": {"event_id": 44, "data": "cleared"}})", lim, out) ==
        DecodeError::None);
  CHECK(std::holds_alternative<KvCleared>(out[0].data));
}

TEST_CASE("token_ids are hashed by the router with the LoRA seed rule") {
  DecodeLimits lim;
  std::vector<KvEvent> out;
  REQUIRE(decode_kv_events(
              R"({"worker_id":1,"event":{"data":{"stored":{"parent_hash":null,"lora_name":"ad1",
                  "blocks":[{"block_hash":9,"token_ids":[1,2,3,4]}]}}}})",
              lim, out) == DecodeError::None);
  const auto& s = std::get<KvStored>(out[0].data);
  CHECK_FALSE(s.parent.has_value());
  CHECK_FALSE(out[0].event_id.has_value());
  const TokenId toks[] = {1, 2, 3, 4};
  CHECK(s.blocks[0].tokens_hash == hash_block(toks, block_hash_seed("ad1")));
  CHECK(s.blocks[0].tokens_hash != hash_block(toks));
}

TEST_CASE("batches decode all-or-nothing; unknown fields are ignored") {
  DecodeLimits lim;
  std::vector<KvEvent> out;
  CHECK(decode_kv_events(R"({"events":[{"worker_id":1,"extra":true,"event":{"event_id":1,"data":"cleared","x":[]}},
                                       {"worker_id":2,"event":{"event_id":1,"data":{"cleared":{}}}}]})",
                         lim, out) == DecodeError::None);
  CHECK(out.size() == 2);
  out.clear();
  CHECK(decode_kv_events(R"({"events":[{"worker_id":1,"event":{"data":"cleared"}},{"worker_id":"x","event":{"data":"cleared"}}]})",
                         lim, out) == DecodeError::WrongType);
  CHECK(out.empty());
}

TEST_CASE("malformed events are rejected with a reason and the field") {
  DecodeLimits lim;
  lim.max_blocks_per_event = 2;
  std::vector<KvEvent> out;
  std::string d;
  CHECK(decode_kv_events("{not json", lim, out, &d) == DecodeError::Json);
  CHECK(decode_kv_events("[1,2]", lim, out, &d) == DecodeError::WrongType);
  CHECK(decode_kv_events(R"({"event":{"data":"cleared"}})", lim, out, &d) == DecodeError::MissingField);
  CHECK(d == "worker_id");
  CHECK(decode_kv_events(R"({"worker_id":-3,"event":{"data":"cleared"}})", lim, out, &d) == DecodeError::WrongType);
  CHECK(decode_kv_events(R"({"worker_id":1,"storage_tier":"gpu","event":{"data":"cleared"}})", lim, out, &d) ==
        DecodeError::UnknownTier);
  CHECK(decode_kv_events(R"({"worker_id":1,"event":{"data":"wiped"}})", lim, out, &d) == DecodeError::BadEvent);
  CHECK(decode_kv_events(R"({"worker_id":1,"event":{"data":{"stored":{"blocks":[{"block_hash":1}]}}}})", lim, out, &d) ==
        DecodeError::MissingField);
  CHECK(d == "tokens_hash");
  CHECK(decode_kv_events(
            R"({"worker_id":1,"event":{"data":{"stored":{"blocks":[{"block_hash":1,"tokens_hash":1},{"block_hash":2,"tokens_hash":1},{"block_hash":3,"tokens_hash":1}]}}}})",
            lim, out, &d) == DecodeError::TooLarge);
  CHECK(decode_kv_events(R"({"worker_id":1,"event":{"event_id":1.5,"data":"cleared"}})", lim, out, &d) ==
        DecodeError::WrongType);
  CHECK(out.empty());
}

TEST_CASE("encode -> decode round trip for events, heartbeats and resync dumps") {
  KvEvent ev;
  ev.owner = CacheOwner{WorkerId{3}, 2};
  ev.event_id = 17;
  ev.tier = StorageTier::Disk;
  ev.data = KvStored{SequenceHash{11}, {{SequenceHash{12}, LocalBlockHash{~0ull}}, {SequenceHash{13}, LocalBlockHash{5}}}};
  std::vector<KvEvent> out;
  REQUIRE(decode_kv_events(encode_kv_event(ev), DecodeLimits{}, out) == DecodeError::None);
  CHECK(out[0].owner == ev.owner);
  CHECK(out[0].event_id == 17u);
  CHECK(out[0].tier == StorageTier::Disk);
  CHECK(std::get<KvStored>(out[0].data).blocks.size() == 2);
  CHECK(std::get<KvStored>(out[0].data).blocks[0].tokens_hash == LocalBlockHash{~0ull});

  WorkerHeartbeat hb;
  hb.worker_id = WorkerId{9};
  hb.url = "http://127.0.0.1:1234";
  hb.model = "m\"x";
  hb.block_size = 64;
  hb.load = {1, 2, 3, 4, 5};
  WorkerHeartbeat back;
  REQUIRE(decode_heartbeat(encode_heartbeat(hb), back) == DecodeError::None);
  CHECK(back.model == "m\"x");
  CHECK(back.load.kv_total_blocks == 5);
  CHECK(back.load.num_requests_waiting == 3);

  ResyncDump dump;
  dump.owner = CacheOwner{WorkerId{3}, 0};
  dump.last_event_id = 99;
  dump.events.push_back(ev);
  ResyncDump dback;
  REQUIRE(decode_resync_dump(encode_resync_dump(dump), DecodeLimits{}, dback) == DecodeError::None);
  CHECK(dback.last_event_id == 99);
  REQUIRE(dback.events.size() == 1);
  CHECK(dback.events[0].owner == dump.owner);
  CHECK_FALSE(dback.events[0].event_id.has_value());
}

TEST_CASE("heartbeat validation") {
  WorkerHeartbeat hb;
  std::string d;
  CHECK(decode_heartbeat(R"({"worker_id":1})", hb, &d) == DecodeError::MissingField);
  CHECK(d == "url");
  CHECK(decode_heartbeat(R"({"worker_id":1,"url":"http://x:1","block_size":0})", hb, &d) == DecodeError::WrongType);
  CHECK(decode_heartbeat(R"({"worker_id":1,"url":"http://x:1","load":{"kv_total_blocks":"many"}})", hb, &d) ==
        DecodeError::WrongType);
  CHECK(d == "kv_total_blocks");
  CHECK(decode_heartbeat(R"({"worker_id":1,"url":"http://x:1"})", hb, &d) == DecodeError::None);
}

TEST_CASE("a heartbeat's role and bootstrap port: optional, validated, round-trip") {
  WorkerHeartbeat hb;
  std::string d;
  REQUIRE(decode_heartbeat(R"({"worker_id":1,"url":"http://x:1"})", hb, &d) == DecodeError::None);
  CHECK(hb.role == WorkerRole::Both);
  CHECK(hb.bootstrap_port == 8998u);
  REQUIRE(decode_heartbeat(R"({"worker_id":1,"url":"http://x:1","role":"decode","bootstrap_port":9000})", hb, &d) ==
          DecodeError::None);
  CHECK(hb.role == WorkerRole::Decode);
  CHECK(hb.bootstrap_port == 9000u);
  for (const char* bad : {R"({"worker_id":1,"url":"http://x:1","role":"leader"})",
                          R"({"worker_id":1,"url":"http://x:1","role":1})"}) {
    CHECK(decode_heartbeat(bad, hb, &d) == DecodeError::WrongType);
    CHECK(d == "role");
  }
  for (const char* bad : {R"({"worker_id":1,"url":"http://x:1","bootstrap_port":0})",
                          R"({"worker_id":1,"url":"http://x:1","bootstrap_port":65536})"}) {
    CHECK(decode_heartbeat(bad, hb, &d) == DecodeError::WrongType);
    CHECK(d == "bootstrap_port");
  }
  WorkerHeartbeat p;
  p.worker_id = WorkerId{2};
  p.url = "http://x:2";
  p.role = WorkerRole::Prefill;
  p.bootstrap_port = 8999;
  WorkerHeartbeat back;
  REQUIRE(decode_heartbeat(encode_heartbeat(p), back) == DecodeError::None);
  CHECK(back.role == WorkerRole::Prefill);
  CHECK(back.bootstrap_port == 8999u);
}

TEST_CASE("a heartbeat without a block size (0, not announced) round-trips") {
  WorkerHeartbeat hb;
  hb.worker_id = WorkerId{4};
  hb.url = "http://x:1";
  hb.block_size = 0;
  hb.instance_id = 12;
  const std::string text = encode_heartbeat(hb);
  CHECK(text.find("block_size") == std::string::npos);
  WorkerHeartbeat back;
  back.block_size = 99;
  std::string d;
  REQUIRE(decode_heartbeat(text, back, &d) == DecodeError::None);
  CHECK(back.block_size == 0u);
  CHECK(back.instance_id == 12u);
}
