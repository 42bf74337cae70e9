// NATS wire formats (events/README.md): decoding of untrusted bytes into in-memory structs,
// and encoding for publishers (kvroute-mocker). Pure; thread-safe.
//
// Decoding reads fields by name, ignores unknown fields, and accepts both
// numbers and numeric strings nowhere: a wrong type is an error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/load.h"
#include "common/types.h"
#include "indexer/kv_event.h"

namespace kvroute {

// Why a message was rejected. Each value maps one-to-one to the label
// `reason` of kvroute_events_rejected_total.
enum class DecodeError : uint8_t {
  None,          // decoded
  Json,          // not valid JSON
  MissingField,  // a required field is absent
  WrongType,     // a field has the wrong JSON type or is out of range
  UnknownTier,   // storage_tier is not one of device/host_pinned/disk/external
  TooLarge,      // message or block list larger than the configured bounds
  BadEvent,      // event data is none of stored/removed/cleared
};

std::string_view to_string(DecodeError e);

// `{prefix}.workers` heartbeat.
struct WorkerHeartbeat {
  WorkerId worker_id;
  std::string url;    // http://host:port of the worker's OpenAI server
  std::string model;  // model name served
  uint32_t block_size = 0;
  uint32_t dp_size = 1;
  bool kv_events = true;  // false: the worker publishes no KV events (approximate mode)
  WorkerRole role = WorkerRole::Both;  // "role": both, prefill or decode (disaggregated fleets)
  uint32_t bootstrap_port = 8998;      // "bootstrap_port": an SGLang prefill worker's bootstrap server
  WorkerLoad load;
  // Changes each time the worker process starts (random or start time); 0 =
  // not announced (older workers). Also carried by its KV events.
  uint64_t instance_id = 0;
};

struct DecodeLimits {
  size_t max_message_bytes = 16 << 20;
  size_t max_blocks_per_event = 1 << 16;
  size_t max_events_per_message = 1 << 16;
};

// Decodes one `{prefix}.kv_events` message (a single RouterEvent or
// {"events":[...]}) and appends its events to `out`. On error nothing is
// appended and `detail` (if non-null) says which field.
DecodeError decode_kv_events(std::string_view json, const DecodeLimits& limits,
                             std::vector<KvEvent>& out, std::string* detail = nullptr);

DecodeError decode_heartbeat(std::string_view json, WorkerHeartbeat& out,
                             std::string* detail = nullptr);

std::string encode_kv_event(const KvEvent& event);
std::string encode_heartbeat(const WorkerHeartbeat& hb);

}  // namespace kvroute

namespace kvroute {

// Reply to a `{prefix}.kv_resync.{worker_id}` request: the owner's full state
// after `last_event_id`, as stored events without event ids:
// {"worker_id":7,"dp_rank":0,"last_event_id":N,"events":[RouterEvent,...]}
// The router clears the owner, applies `events`, and expects N+1 next.
struct ResyncDump {
  CacheOwner owner;
  uint64_t last_event_id = 0;
  std::vector<KvEvent> events;
  uint64_t instance = 0;  // the worker's instance id when the dump was taken (0 = not announced)
};

DecodeError decode_resync_dump(std::string_view json, const DecodeLimits& limits, ResyncDump& out,
                               std::string* detail = nullptr);
std::string encode_resync_dump(const ResyncDump& dump);

// ---- Chunked resync (events/README.md "Resync") --------------------------
// The router pulls a dump chunk by chunk over request/reply, each reply under
// the server's max payload. Chunk 0 with snapshot 0 asks the worker to take a
// new snapshot; later chunks name it, so a lost reply is asked for again
// (resumable) without a new snapshot.
struct ResyncRequest {
  uint32_t dp_rank = 0;
  uint64_t snapshot = 0;   // 0 = take a new snapshot
  uint32_t chunk = 0;      // which chunk of the snapshot
  uint64_t max_bytes = 0;  // largest reply the router's connection accepts (0 = one legacy dump)
};
std::string encode_resync_request(const ResyncRequest& r);
// An empty or legacy body (`{"dp_rank":N}`) decodes with max_bytes 0. On error
// `out` is left untouched.
DecodeError decode_resync_request(std::string_view json, ResyncRequest& out);

// One reply: {"worker_id","dp_rank","instance_id","last_event_id","snapshot",
// "chunk","chunks","blocks":"<base64>"}; `blocks` is the compact encoding of
// stored events: per event u8 tier, u8 flags (1 = has parent, 2 = has a
// medium), u32 count, [u8 length + the medium's bytes, 1-32], [u64 parent],
// count x (u64 block_hash, u64 tokens_hash), little-endian.
// {"error":"snapshot_gone"} when the worker no longer holds the snapshot.
// A legacy reply (a whole dump with "events") decodes as chunk 0 of 1.
struct ResyncChunk {
  ResyncDump dump;          // owner, instance, last_event_id, this chunk's events
  uint64_t snapshot = 0;
  uint32_t chunk = 0, chunks = 1;
  bool snapshot_gone = false;
};
DecodeError decode_resync_chunk(std::string_view json, const DecodeLimits& limits, ResyncChunk& out,
                                std::string* detail = nullptr);
// Worker side: the dump's stored events (others are skipped: a dump is state)
// as replies each at most `max_bytes` long (at least 1,024); a long event is
// split into several, each continuing from the previous one's last block.
std::vector<std::string> encode_resync_chunks(const ResyncDump& dump, uint64_t snapshot, size_t max_bytes);
std::string encode_resync_gone();

// ---- Replicas' in-flight load (events/replica_sync.h) -------------------
// One replica's snapshot on the wire:
// {"replica":R,"seq":N,"ttl_ms":T,"w":[[worker_id,requests,blocks,prefill_tokens],...],
//  "p":[[worker_id,parked_blocks],...]}
// "p" (the replica's parked KV per worker, whole blocks) is optional: a
// snapshot without it parks nothing, and a decoder that predates it ignores it
// ("w" lists every worker of the snapshot, one with only parked KV as zeros).
struct ReplicaInflight {
  WorkerId worker;
  uint32_t requests = 0;
  uint64_t blocks = 0;
  uint64_t prefill_tokens = 0;
  uint64_t parked_blocks = 0;
  friend bool operator==(const ReplicaInflight&, const ReplicaInflight&) = default;
};
struct ReplicaSnapshot {
  uint64_t replica = 0;  // random per process
  uint64_t seq = 0;
  uint32_t ttl_ms = 0;
  std::vector<ReplicaInflight> workers;  // only workers with something in flight or parked
};
std::string encode_replica_snapshot(const ReplicaSnapshot& s);
// False on malformed input (bounded: at most 65,536 workers in all,
// parked_blocks at most 2^40, a worker at most once in "p").
bool decode_replica_snapshot(std::string_view json, ReplicaSnapshot& out);

}  // namespace kvroute
