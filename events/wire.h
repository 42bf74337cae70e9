// NATS wire formats (../shared/DESIGN.md, "KV events on NATS" and "Worker
// registration and load"): decoding of untrusted bytes into in-memory structs,
// and encoding for publishers (kvroute-mocker). Pure; thread-safe.
//
// Decoding reads fields by name, ignores unknown fields, and accepts both
// numbers and numeric strings nowhere: a wrong type is an error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

struct WorkerLoadReport {
  uint32_t request_active_slots = 0;
  uint32_t request_total_slots = 0;
  uint32_t num_requests_waiting = 0;
  uint64_t kv_active_blocks = 0;
  uint64_t kv_total_blocks = 0;
};

// `{prefix}.workers` heartbeat.
struct WorkerHeartbeat {
  WorkerId worker_id;
  std::string url;    // http://host:port of the worker's OpenAI server
  std::string model;  // model name served
  uint32_t block_size = 0;
  uint32_t dp_size = 1;
  bool kv_events = true;  // false: the worker publishes no KV events (approximate mode)
  WorkerLoadReport load;
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
};

DecodeError decode_resync_dump(std::string_view json, const DecodeLimits& limits, ResyncDump& out,
                               std::string* detail = nullptr);
std::string encode_resync_dump(const ResyncDump& dump);

}  // namespace kvroute
