// vLLM / SGLang KV events as they travel over ZMQ (msgpack), decoded into
// wire structs and converted to the index's KvEvents with kvroute's own block
// hashing. Pure; thread-safe.
//
// Frames on the engine's PUB socket: [topic, seq (8-byte big-endian, from 0),
// payload]. The payload is a KVEventBatch, in either encoding vLLM has used:
//   positional (msgspec array_like):  [ts, [event...], data_parallel_rank]
//       event = ["BlockStored", block_hashes, parent_block_hash, token_ids,
//                block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//                kv_cache_spec_kind, kv_cache_spec_sliding_window] (trailing
//                defaults may be omitted)
//   tagged maps (vLLM 2026):          {"ts":..,"events":[{"type":"BlockStored",
//                "block_hashes":[..],...}],"data_parallel_rank":0}
//       omitted fields take their defaults; unknown fields are ignored.
// Block hashes are ints (signed or unsigned 64-bit) or bytes (SHA-256 based,
// any length); either way only an id for parents and removals.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/types.h"
#include "events/salt_attribution.h"
#include "events/wire.h"
#include "indexer/kv_event.h"

namespace kvroute {

// An engine's block hash as an id: ints as their 64-bit pattern; bytes as
// vLLM reduces them to ints (kv_cache_utils.py maybe_convert_block_hash, with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: the low 64 bits of the big-endian
// number, i.e. the last 8 bytes), so that the bytes and the int form of one
// hash name the same block: vLLM's offloading connector sends bytes even
// when the GPU's events carry ints. Ids only link one worker's own events.
SequenceHash engine_block_id(std::span<const uint8_t> hash_bytes);

struct VllmBlockStored {
  std::vector<SequenceHash> block_hashes;
  std::optional<SequenceHash> parent_block_hash;
  std::vector<TokenId> token_ids;
  uint32_t block_size = 0;
  std::optional<int64_t> lora_id;  // deprecated by vLLM; kept for explain
  std::string lora_name;           // empty = none
  std::string medium;              // "GPU" (default), "CPU", "DISK", ... empty = GPU
  // Extra hash keys of the first block of the chain, reduced to what kvroute's
  // hashing uses: the cache_salt (vLLM puts it in block 0's extra keys).
  std::string cache_salt;
  // Encoding only: leave extra_keys out, as vLLM did before the field (the
  // salt is then not on the wire; kvroute-mocker --no-extra-keys).
  bool omit_extra_keys = false;
  std::optional<uint32_t> group_idx;
  std::string kv_cache_spec_kind;  // e.g. "full_attention", "sliding_window"; empty = unknown
  std::optional<uint32_t> kv_cache_spec_sliding_window;
};

struct VllmBlockRemoved {
  std::vector<SequenceHash> block_hashes;
  std::string medium;
  std::optional<uint32_t> group_idx;
};

struct VllmAllBlocksCleared {};

// An event type this decoder does not know (counted, skipped).
struct VllmUnknownEvent {
  std::string type;
};

using VllmEvent = std::variant<VllmBlockStored, VllmBlockRemoved, VllmAllBlocksCleared, VllmUnknownEvent>;

struct VllmEventBatch {
  double ts = 0;
  std::vector<VllmEvent> events;
  std::optional<uint32_t> data_parallel_rank;
};

enum class VllmEncoding : uint8_t { Positional, TaggedMap };

// Decodes one payload (either encoding, detected per batch and per event).
// On error `out` is unspecified and `detail` names the field. Never throws,
// never allocates more than the payload's size justifies (events/msgpack_reader.h).
// Malformed msgpack is DecodeError::Json ("malformed payload"); a wrong type
// WrongType; sizes over `limits` TooLarge.
DecodeError decode_vllm_batch(std::span<const uint8_t> payload, const DecodeLimits& limits, VllmEventBatch& out,
                              std::string* detail = nullptr);

// Encodes a batch as an engine would (kvroute-mocker, tests, benchmarks).
std::string encode_vllm_batch(const VllmEventBatch& batch, VllmEncoding encoding);

// Why a decoded vLLM event was not turned into an index event. Each maps to a
// label of kvroute_events_zmq_skipped_total.
enum class VllmSkip : uint8_t {
  None,
  UnknownType,        // an event type this decoder does not know
  BlockSizeMismatch,  // block_size differs from indexer.block_size
  TokenCount,         // token_ids is not block_hashes.size() * block_size long
  NotFullAttention,   // hybrid model: a sliding-window / mamba group (only full attention is indexed)
};

// What a publisher told about its KV cache groups (hybrid models): group_idx
// -> indexed or not, learned from BlockStored events' kv_cache_spec_kind, so
// that a later BlockRemoved of a sliding-window / mamba group (which carries
// only group_idx) is not applied to the full-attention blocks of the same
// hash. One per cache owner, owned by its reader (ZmqEventSource's thread).
struct VllmGroupState {
  std::vector<int8_t> indexed;  // by group_idx: -1 unknown, 0 no, 1 yes
  bool skips(std::optional<uint32_t> group_idx) const {
    return group_idx && *group_idx < indexed.size() && indexed[*group_idx] == 0;
  }
};

// The storage tier of a medium: vLLM's media (GPU or absent = device, CPU =
// host_pinned, DISK = disk) and SGLang HiCache's tiers (CPU_TIER1 = host
// memory, CPU_TIER2 = its storage backend, external), in any case; any other
// = external.
StorageTier tier_of(std::string_view medium);
// vLLM's offloading connector announces its copies of the worker's own
// blocks by id only: no tokens, no parent, a medium other than the GPU's
// (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py,
// take_events()). Read as KvStored::copies.
bool vllm_announces_copies(const VllmBlockStored& s);

// True for the kv_cache_spec_kind values whose blocks are indexed: absent
// (engines that do not say), full_attention, mla_attention,
// sink_full_attention. Sliding window, chunked local attention, mamba, ...
// are not (their blocks do not cover the whole prefix).
bool vllm_kind_indexed(std::string_view kind, std::optional<uint32_t> sliding_window);

// Converts a batch into index events for `owner` (its dp_rank taken from the
// batch when present), hashing token_ids exactly as a request's tokens are
// hashed (indexer/block_hash.h, HashNamespace{lora_name, cache_salt}); the
// engine's hashes become the SequenceHash ids. `medium` maps to the storage
// tier (GPU/absent = device, CPU = host_pinned, DISK = disk, other = external).
// Events without an event_id (ordering is per ZMQ seq, see zmq_source.h).
// `skipped` (optional) counts skipped events by VllmSkip.
// `groups` (optional) is read and updated (see VllmGroupState).
// `salts` (optional): a root block whose event carries no salt takes the
// namespace SaltAttribution::resolve() gives it (events/salt_attribution.h).
void to_kv_events(const VllmEventBatch& batch, CacheOwner owner, uint32_t block_size, std::vector<KvEvent>& out,
                  std::array<uint64_t, 5>* skipped = nullptr, VllmGroupState* groups = nullptr,
                  SaltAttribution* salts = nullptr);

std::string_view to_string(VllmSkip s);

}  // namespace kvroute
