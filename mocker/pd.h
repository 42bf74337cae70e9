// Prefill/decode disaggregation as kvroute-mocker emulates it (mocker/README.md
// "Prefill/decode disaggregation"): the decode request's transfer parameters,
// the prefill worker's table of held transfers with their lease, the error
// reasons, the transfer time. Pure: no I/O, no clock (times are milliseconds
// passed in by the caller).
//
// Followed (read with the code index; see docs/design/pd-protocols.md):
//   vLLM NixlConnector, vllm/distributed/kv_transfer/kv_connector/v1/nixl/
//     base_scheduler.py + pull_scheduler.py (commit 0050936b): request_finished()
//     builds the kv_transfer_params dict, update_state_after_alloc() checks it;
//     the lease kv_lease_duration (30 s); older connector nixl/scheduler.py
//     (commit 053da34): a fixed VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s).
//   vLLM MooncakeConnector, vllm/distributed/kv_transfer/kv_connector/v1/
//     mooncake/mooncake_connector.py (commit 5c51233): update_state_after_alloc()
//     (a prefill holds only with a transfer_id; a decode needs remote_engine_id,
//     remote_bootstrap_addr and transfer_id), request_finished() (no params
//     returned), VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (480 s); mooncake_utils.py
//     MooncakeBootstrapServer (GET /query).
//   SGLang python/sglang/srt/disaggregation/common/conn.py and decode.py:
//     the bootstrap room rendezvous, SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT
//     and _WAITING_TIMEOUT (300 s each).
//
// Threading: not thread-safe; the mocker's io thread owns every instance.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/types.h"

namespace kvroute::mocker {

// --role: which leg of a disaggregated request this worker serves (vLLM
// NixlConnector's roles come from the request, not kv_role; the mocker pins one).
enum class PdRole : uint8_t { Both, Prefill, Decode };
// Which engine's PD protocol: vLLM NIXL (kv_transfer_params returned by the
// prefill worker), vLLM Mooncake (kv_transfer_params with a router-minted
// transfer_id and the prefill worker's bootstrap server) or SGLang (bootstrap room).
enum class PdProtocol : uint8_t { None, VllmNixl, VllmMooncake, Sglang };

// Why a PD leg was refused; one label of kvroute_mocker_pd_rejected_total each.
enum class PdError : uint8_t {
  None,
  Malformed,        // kv_transfer_params / bootstrap fields of the wrong JSON type
  TooLarge,         // kv_transfer_params over kMaxParamsBytes, a string or the block list too long
  Missing,          // do_remote_prefill without all of remote_engine_id/request_id/host/port/block_ids; no room
  WrongRole,        // a prefill leg on a decode worker or the reverse
  BadHost,          // remote_host / bootstrap_host not an IP literal or "localhost"
  Unreachable,      // the prefill worker's side channel did not answer
  UnknownEngine,    // remote_engine_id is not the prefill worker's
  UnknownTransfer,  // no held transfer under remote_request_id (never made, or already pulled)
  Expired,          // the transfer's lease ran out before the pull
  ForgedBlocks,     // block ids that the transfer does not hold
  PromptMismatch,   // the pulled blocks are not this prompt's (another request's params)
  HeldFull,         // the prefill worker holds kMaxHeld transfers already
  RoomsFull,        // SGLang: too many rooms waiting
  DuplicateRoom,    // SGLang: a second prefill (or decode) leg for one room
  RoomTimeout,      // SGLang: the other leg never came
};
const char* pd_error_name(PdError e);
inline constexpr PdError kPdErrors[] = {PdError::Malformed,       PdError::TooLarge,      PdError::Missing,
                                        PdError::WrongRole,       PdError::BadHost,       PdError::Unreachable,
                                        PdError::UnknownEngine,   PdError::UnknownTransfer, PdError::Expired,
                                        PdError::ForgedBlocks,    PdError::PromptMismatch, PdError::HeldFull,
                                        PdError::RoomsFull,       PdError::DuplicateRoom, PdError::RoomTimeout};

// Bounds on hostile input.
inline constexpr size_t kMaxParamsBytes = 1 << 20;    // kv_transfer_params as sent (JSON text)
inline constexpr size_t kMaxParamString = 256;        // each string field
inline constexpr size_t kMaxRemoteBlocks = 1 << 17;   // remote_block_ids entries (2M tokens of 16)

// vLLM's kv_transfer_params as far as the mocker reads them (pull_scheduler.py
// request_finished / update_state_after_alloc). remote_block_ids is a list per
// KV-cache group in the newest connector ([[...]]), a flat list in older ones:
// both are read, group 0 is used.
struct KvTransferParams {
  bool do_remote_decode = false;
  bool do_remote_prefill = false;
  std::string remote_engine_id, remote_request_id, remote_host;
  std::optional<uint16_t> remote_port;
  std::optional<std::vector<uint64_t>> remote_block_ids;
  std::string transfer_id, remote_bootstrap_addr;  // Mooncake
};

// Reads `kv_transfer_params` of a request body's object. Absent or null:
// nullopt with PdError::None. Malformed, too large: nullopt and the error.
// Presence of each remote_* key is recorded (empty string / nullopt = absent
// or null), so missing keys are told apart from bad ones by check_decode().
std::optional<KvTransferParams> parse_kv_transfer_params(simdjson::dom::object body, PdError& err,
                                                         std::string& detail);
// A decode leg's params complete as update_state_after_alloc() requires (all
// four remote_* and remote_block_ids)? PdError::Missing names the first gap.
PdError check_decode_params(const KvTransferParams& p, std::string& detail);
// A Mooncake decode leg's params complete as its update_state_after_alloc()
// requires (remote_engine_id, remote_bootstrap_addr, transfer_id)?
PdError check_mooncake_decode_params(const KvTransferParams& p, std::string& detail);
// "http://HOST:PORT" (remote_bootstrap_addr) into host and port; false otherwise.
bool parse_bootstrap_addr(std::string_view addr, std::string& host, uint16_t& port);
// "localhost" or an IPv4/IPv6 literal: the only hosts a mocker connects to (no DNS lookups on the io thread).
bool pd_host_allowed(std::string_view host);

// Engine milliseconds to move `blocks` blocks over the link.
double pd_transfer_ms(uint64_t blocks, uint32_t block_size, double kv_bytes_per_token, double link_gbps);

// The prefill worker's transfers held for their decode worker's pull.
class TransferTable {
 public:
  struct Held {
    std::string request_id;          // remote_request_id as reported
    uint64_t engine_request = 0;     // the engine's request id (release_held)
    uint32_t rank = 0;               // data-parallel rank holding it
    std::vector<uint64_t> block_ids; // as reported in remote_block_ids
    std::vector<SequenceHash> blocks;
    double expires_ms = 0;
  };
  enum class Take : uint8_t { Ok, Unknown, Expired, Forged };

  // lease_ms: how long a transfer is held without a pull (vLLM's kv_lease_duration).
  TransferTable(size_t max_held, double lease_ms) : max_held_(max_held), lease_ms_(lease_ms) {}
  // Registers a finished prefill; false when max_held transfers are held.
  bool add(Held h, double now_ms);
  // The decode side's read of `ids` (a subset of the held ids): on Ok, `out`
  // is the transfer, removed from the table, and `hashes` the blocks of `ids`
  // in order. Expired: its lease ran out (remembered for the last 4096 expiries).
  Take take(std::string_view request_id, const std::vector<uint64_t>& ids, double now_ms, Held& out,
            std::vector<SequenceHash>& hashes);
  // The held transfer `request_id`, or null (not removed).
  const Held* find(std::string_view request_id) const;
  // Removes a transfer without a read (the decode side's "free" notification).
  std::optional<Held> drop(std::string_view request_id);
  // Removes and returns every transfer whose lease ended at or before now_ms.
  std::vector<Held> expire(double now_ms);
  std::optional<double> next_expiry() const;
  size_t held_transfers() const { return held_.size(); }
  uint64_t held_blocks() const { return held_blocks_; }
  bool full() const { return held_.size() >= max_held_; }

 private:
  void remember_expired(const std::string& id);
  size_t max_held_;
  double lease_ms_;
  std::unordered_map<std::string, Held> held_;
  uint64_t held_blocks_ = 0;
  std::deque<std::string> expired_order_;
  std::unordered_set<std::string> expired_;
};

}  // namespace kvroute::mocker
