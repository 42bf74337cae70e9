// The bodies of a disaggregated (prefill/decode) exchange, as the engines
// expect them (docs/design/pd-protocols.md, which cites each engine file):
// what the router sends each leg, and the prefill answer's kv_transfer_params
// read as untrusted input. Pure functions on JSON text (simdjson DOM, then
// the object written back field by field); no I/O.
//
// Thread-safe: no shared state (a parser per call).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvroute::pd {

// Client body fields that direct KV transfers or pin data-parallel ranks:
// removed from every body kvroute sends a worker of a disaggregated fleet, so
// clients never direct transfers (pd-protocols.md §5: a client's
// do_remote_prefill would make a decode engine pull from a host the client
// picked; its bootstrap_room would join another request's room).
inline constexpr std::array<std::string_view, 9> kTransferFields{
    "kv_transfer_params", "bootstrap_host",  "bootstrap_port",     "bootstrap_room",        "bootstrap_pair_key",
    "decode_tp_size",     "routed_dp_rank",  "data_parallel_rank", "disagg_prefill_dp_rank"};

enum class BodyError : uint8_t {
  None,
  NotJson,    ///< the client body does not parse (the proxy parsed it before: a broken invariant)
  NotObject,  ///< the client body is not a JSON object
};

// The client's body without kTransferFields.
BodyError strip_transfer_fields(std::string_view client_body, std::string& out);

// vLLM NIXL prefill leg (pd-protocols.md §1.2; vLLM
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py @030ea52
// send_request_to_service): the client's body with kv_transfer_params
// {do_remote_decode: true, do_remote_prefill: false, remote_*: null},
// stream false, stream_options removed, max_tokens 1 (and
// max_completion_tokens / max_output_tokens 1 where the client sent them),
// min_tokens and min_completion_tokens removed, n 1. Both caps are needed:
// vLLM's chat request takes max_completion_tokens over max_tokens when both
// are set (vllm/entrypoints/openai/chat_completion/protocol.py @d5dba2d,
// ChatCompletionRequest.build_tok_params), so max_tokens alone would not stop
// a client's max_completion_tokens prefill after one token; the Mooncake
// example proxy sets both likewise (mooncake_connector_proxy.py @4b5c627).
BodyError nixl_prefill_body(std::string_view client_body, std::string& out);

// vLLM NIXL decode leg (§1.4): the client's body (its own stream and token
// limits) with kv_transfer_params = `params`, a JSON object already read by
// read_kv_transfer_params().
BodyError nixl_decode_body(std::string_view client_body, std::string_view params, std::string& out);

// vLLM MooncakeConnector prefill leg (pd-protocols.md §2.3; vLLM
// vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py
// @5c51233 update_state_after_alloc: a producer holds a finished prompt's
// blocks only when kv_transfer_params carries a transfer_id "from router";
// examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py
// @4b5c627 send_request_to_service): nixl_prefill_body's one-token, unstreamed
// body with kv_transfer_params {do_remote_decode: true, do_remote_prefill:
// false, transfer_id}.
BodyError mooncake_prefill_body(std::string_view client_body, std::string_view transfer_id, std::string& out);

// The decode leg's kv_transfer_params of the vLLM MooncakeConnector (the
// prefill engine returns none: request_finished() answers (delay_free, None)):
// {do_remote_decode: false, do_remote_prefill: true, remote_bootstrap_addr
// ("http://host:port" of the prefill worker's bootstrap server),
// remote_engine_id (its engine id for the rank that prefilled), transfer_id},
// the three keys update_state_after_alloc() requires. A JSON object's text
// for nixl_decode_body().
std::string mooncake_decode_params(std::string_view bootstrap_addr, std::string_view engine_id,
                                   std::string_view transfer_id);

// SGLang legs (§3.4; sglang python/sglang/srt/disaggregation/mini_lb.py
// @001c2ae): both legs carry the client's body with bootstrap_host (the
// prefill worker's host, no port), bootstrap_port (its
// --disaggregation-bootstrap-port) and bootstrap_room (random 63-bit: the
// rendezvous id; with data parallelism room % dp_size is the rank).
BodyError sglang_body(std::string_view client_body, std::string_view bootstrap_host, uint32_t bootstrap_port,
                      uint64_t bootstrap_room, std::string& out);

// Why a prefill answer's kv_transfer_params were not relayed. Maps
// one-to-one to a metric label.
enum class ParamsError : uint8_t {
  None,
  TooLarge,      ///< the answer or its kv_transfer_params over the limits
  NotJson,       ///< the answer is not a JSON object
  Missing,       ///< no kv_transfer_params (vLLM returns none for an aborted or failed prefill)
  NotObject,     ///< kv_transfer_params is not a JSON object
  WrongType,     ///< a key of §1.3 has the wrong type or range (detail names it)
  NotForDecode,  ///< do_remote_prefill is not true: nothing for a decode worker to pull
  HostMismatch,  ///< remote_host names neither the prefill worker nor a loopback/unspecified address
};
std::string_view to_string(ParamsError e);

struct ParamsLimits {
  size_t max_answer_bytes = 4u << 20;  // the whole prefill answer (one output token: small)
  size_t max_params_bytes = 1u << 20;  // the kv_transfer_params object's text (block ids of a long prompt)
};

// Reads the prefill answer's top-level kv_transfer_params (pd-protocols.md
// §1.3; vLLM nixl connector request_finished()) as untrusted input: a JSON
// object within the limits whose known keys have their types
// (do_remote_prefill true; remote_engine_id, remote_request_id, remote_host
// strings; remote_port 1-65535; tp_size, dcp_size, pp_size,
// remote_num_tokens non-negative integers; remote_block_ids a list of
// integers or of lists of integers); other keys pass through. `out` is the
// object's JSON text as received (minified), except that a remote_host that
// is loopback or unspecified ("localhost", 127.0.0.0/8, ::1, 0.0.0.0, ::,
// empty: the engine's default VLLM_NIXL_SIDE_CHANNEL_HOST, unreachable from
// another host) becomes `prefill_host` when that is not loopback itself; any
// other host must equal `prefill_host` (a worker must not send a decode
// engine to a third host). On error `out` is unchanged; `detail` names the key.
ParamsError read_kv_transfer_params(std::string_view answer, std::string_view prefill_host,
                                    const ParamsLimits& limits, std::string& out, std::string* detail = nullptr);

// True for the names an engine reports when its side channel listens on
// loopback or every address (see read_kv_transfer_params()).
bool is_loopback_or_unspecified(std::string_view host);

// The prefill worker's Mooncake bootstrap server answer to GET /query
// (vLLM vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_utils.py
// MooncakeBootstrapServer.query @e7ad92e: {"<dp_rank>": {"engine_id": S,
// "worker_addr": {"<tp_rank>": {"<pp_rank>": "tcp://host:port"}}}, ...}; one
// entry per data-parallel rank of the engine, registered by each rank's
// workers under the rank's engine id: under data parallelism vLLM suffixes
// every rank's, rank 0 included, "<engine_id>_dp<local rank>"
// (vllm/v1/engine/core.py run_engine_core @ac3cb2e; later versions the global
// rank), so kvroute builds none: it takes them from here), read as untrusted
// input. `rank`: the rank the
// prefill leg goes to (its X-data-parallel-rank: vLLM's API server takes it
// as the engine index, the key /query lists the rank under); unset: the
// `turn % ranks`-th listed rank in ascending order (turn 0: the lowest), so
// that a router passing a counter spreads unpinned prefills over the ranks as
// vLLM's proxy does (mooncake_connector_proxy.py @4b5c627 prefiller_cycle).
// `engine_id` that rank's engine id (1..kMaxEngineIdBytes bytes); `ranks`
// how many ranks are listed (over one: the prefill leg must name its rank).
// Missing: no entry for the rank; WrongType: a key that is not a rank, a rank
// listed twice, an engine_id that is not a non-empty string within the bound,
// a worker_addr the decode engine could not read (not a non-empty
// {tp: {pp: string}} map of rank numbers: its pull would fail).
inline constexpr size_t kMaxEngineIdBytes = 256;
inline constexpr size_t kMaxQueryAnswerBytes = 64 * 1024;
inline constexpr size_t kMaxQueryRanks = 1024;
struct MooncakeEngine {
  uint32_t rank = 0;
  std::string engine_id;
  size_t ranks = 0;
};
ParamsError read_mooncake_query(std::string_view answer, std::optional<uint32_t> rank, MooncakeEngine& out,
                                std::string* detail = nullptr, uint64_t turn = 0);

}  // namespace kvroute::pd
