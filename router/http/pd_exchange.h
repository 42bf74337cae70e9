// A disaggregated request's legs (docs/design/pd-protocols.md): the proxy
// (proxy.cpp) runs the decode leg as it runs any request — its worker's
// response is the client's — and calls these phases around it:
//   begin         the client's transfer fields stripped, one X-Request-Id
//                 minted for both legs, the protocol chosen (pd.protocol,
//                 pd.model_protocols)
//   prefill       vLLM NIXL: the prefill leg (nixl_prefill_body, no stream),
//                 over the prefill ranking until one answers with
//                 kv_transfer_params, read as untrusted input; the decode
//                 body carries them (nixl_decode_body). vLLM Mooncake by
//                 default: the same order (P then D, as SGLang Model Gateway
//                 sends them: a failed prefill never leaves a decode engine
//                 waiting with its KV blocks held, see start_mooncake), with a
//                 router-minted transfer_id and the decode params built from
//                 the prefill worker's bootstrap server
//   start_mooncake vLLM Mooncake with pd.mooncake_concurrent_legs: the
//                 prefill leg sent beside the decode leg (vLLM's proxy), the
//                 decode engine's pull waiting for the prefill
//   start_sglang  SGLang: the prefill leg sent beside the decode leg, both
//                 with one bootstrap room (random 63-bit)
//   decode_failed the decode leg failed before its first byte: the next
//                 decode worker gets a fresh prefill where the transfer may
//                 have been consumed or its room closed
//   finish_concurrent SGLang: the concurrent prefill leg's answer drained and checked
//   release       the client left during or after its prefill and the prefill
//                 succeeded (a vLLM prefill leg is never cut: see prefill): a decode leg
//                 with max_tokens 1 still claims the transfer (pd-protocols.md
//                 §1.7), answer discarded
//
// Threading: everything runs on the request's io thread. A leg in flight
// beside the exchange (a concurrent prefill, a release leg) owns its state
// through a shared_ptr, so it may outlive the exchange; an exchange that ends
// first closes its concurrent SGLang leg (the engine sees the disconnect) and
// leaves a Mooncake one to its answer (a vLLM prefill leg is never cut:
// pd_prefill_vllm()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"
#include "router/http/executor.h"
#include "router/http/io_thread.h"
#include "router/http/io_watch.h"
#include "router/http/server_state.h"
#include "router/http/wire.h"
#include "router/routing.h"

namespace kvroute {

// How one leg ended. Maps one-to-one to kvroute_pd_prefill_legs_total's
// result label (with the status classes of an answered leg).
enum class LegResult : uint8_t {
  Answered,   ///< a whole answer (any status)
  Connect,    ///< the connection failed (refused, unreachable, bad url)
  Timeout,    ///< no whole answer within pd.prefill_timeout_ms
  Closed,     ///< the worker closed or reset the connection before its whole answer
  TooLarge,   ///< the answer exceeded its bound
  Cancelled,  ///< the exchange ended (client gone, shutdown) before the answer
};
std::string_view to_string(LegResult r);

// What a prefill leg running beside the decode leg (SGLang, Mooncake with
// pd.mooncake_concurrent_legs) knows of it. A prefill leg that fails while the
// decode leg waits for its first byte cancels that wait (the decode engine
// would wait for the KV until its own timeout: SGLang's room 300 s, vLLM
// Mooncake's VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT 480 s; SGLang Model Gateway
// pd_router.rs cancels the surviving leg likewise); one that failed before
// the decode leg waits ends the wait as it starts. Shared by the exchange and
// the leg; the exchange clears `decode` before the socket goes away.
struct PdDecodeLink {
  Socket* decode = nullptr;     // the decode leg's connection while it waits for its head
  bool prefill_failed = false;  // set by the prefill leg
};

// One leg sent whole and answered whole (the prefill legs and the release
// leg). Owned by a shared_ptr: the coroutine running it holds one.
struct PdLeg {
  explicit PdLeg(IoThread& t) : io(t), done_signal(t.ioc.get_executor()) {
    done_signal.expires_at(Steady::time_point::max());
  }
  IoThread& io;
  std::string url_text;
  UpstreamUrl url;
  std::string head;
  std::string body;
  std::optional<Socket> socket;
  LegResult result = LegResult::Cancelled;
  unsigned status = 0;
  std::string answer;
  bool done = false;
  Timer done_signal;  // cancelled when the leg is done (a waiter's wake-up)
  double seconds = 0;  // sent to whole answer
  // Closes the leg's connection: the engine sees its client leave and aborts.
  void cancel();
};

// What the PD phases read of the exchange.
struct PdContext {
  ServerState& s;
  IoThread& io;
  const Config& cfg;
  const ClientRequest& req;
  const RouteResult& route;
  ClientWatch& watch;
  std::string_view model;
  std::string_view credentials;  // the workers' credential fields (worker_credential.h), for every leg's head
};

// A disaggregated request's state, in the proxy coroutine's frame.
struct PdState {
  bool active = false;  // the model's fleet has PD roles: every body sent is stripped of transfer fields
  bool split = false;   // two legs (cleared by a fallback to the decode worker alone)
  PdProtocol protocol = PdProtocol::VllmNixl;
  bool concurrent_legs = false;  // the prefill leg runs beside the decode leg (SGLang; Mooncake when configured)
  std::string request_id;   // X-Request-Id of both legs
  std::string stripped;     // the client's body without transfer fields
  std::string decode_body;  // the decode leg's body while split
  size_t next_prefill = 0;  // the prefill ranking's next worker to try
  uint32_t transfers_minted = 0;  // Mooncake: transfer ids minted (one per prefill leg)
  std::optional<size_t> prefill;  // the prefill worker (index into route.pd.prefill) of decode_body's transfer
  bool need_prefill = true;       // vLLM: no unclaimed transfer ready for the next decode attempt
  bool client_left = false;       // vLLM: the client left during the prefill leg (counted then)
  std::string release_body;       // vLLM: the decode body of a release leg for the ready transfer
  std::string_view outcome;       // kvroute_pd_requests_total labels
  std::string_view reason;
  std::shared_ptr<PdLeg> concurrent;  // concurrent legs: the prefill leg in flight beside the decode leg
  std::shared_ptr<PdDecodeLink> link; // concurrent legs: that leg's hold on the decode leg's wait
  std::string fields;                 // x-kvroute-* fields of the client's response head
  bool counted = false;               // in kvroute_pd_requests_total

  PdState() = default;
  PdState(const PdState&) = delete;
  PdState& operator=(const PdState&) = delete;
  ~PdState() {
    if (link) link->decode = nullptr;
    if (concurrent && !concurrent->done && protocol == PdProtocol::Sglang) concurrent->cancel();
  }
  // Concurrent legs: the decode leg waits on `s` for its head (null: no
  // longer); a prefill leg that failed already ends the wait at once.
  void decode_waits_on(Socket* s) {
    if (!link) return;
    link->decode = s;
    boost::system::error_code ignored;
    if (s && link->prefill_failed) s->cancel(ignored);
  }
  // Concurrent legs: the decode attempt ended because its prefill leg failed
  // (not the decode worker's fault).
  bool prefill_failed() const { return link && link->prefill_failed; }
  // The body the decode leg (or the whole request) sends now.
  std::string_view body() const { return split ? decode_body : stripped; }
};

// begin: sets up `pd` for a routed request. False if the client's body is
// not a JSON object (the parser accepted it: should not happen).
bool pd_begin(PdState& pd, const PdContext& c);

// What the prefill phase came to.
enum class PdPrefill : uint8_t {
  Ready,       ///< split: the decode body carries the transfer
  Aggregated,  ///< run whole on the decode worker (a fallback, or the prefill refused the request as invalid)
  Fail,        ///< pd.on_prefill_failure fail: answer 503
  ClientGone,  ///< the client left and nothing is held for it (no prefill, or one that failed)
};

// prefill (vLLM NIXL, vLLM Mooncake): the prefill ranking from
// pd.next_prefill until a worker prefills. NIXL: its answer's valid
// kv_transfer_params go to the decode body. Mooncake: the worker's engine id
// for the leg's rank comes from its bootstrap server (GET /query, cached), the
// leg carries a transfer id minted here, and a 2xx answer is a prefilled
// transfer the decode body names (the prefill engine returns no params). A
// refused, failed or timed out leg moves to the next worker; a 4xx (the
// request itself is invalid) runs the request whole, whose worker answers the
// client the same error. A sent leg is never cut for its client: a client
// that leaves meanwhile is counted then (kvroute_pd_client_gone_total
// {phase="prefill"}, pd.client_left) and, when the leg prefilled, gets Ready
// so that the caller releases the transfer (pd_release()); otherwise
// ClientGone.
awaitable<PdPrefill> pd_prefill_vllm(PdState& pd, const PdContext& c);

// start_mooncake (pd.mooncake_concurrent_legs, off by default): the prefill
// leg of a fresh
// transfer on the prefill ranking's pd.next_prefill worker (its engine id
// from its bootstrap server, as pd_prefill_vllm() has it), sent beside the
// decode leg about to start, whose body names the transfer: the decode
// engine's pull waits on the prefill worker until the prefill is done
// (mooncake_connector.py send_kv_to_decode: "This req is not enqueued in P
// side yet", bounded by VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT). The leg is
// never cut; when it fails the decode leg's wait ends (PdDecodeLink) and the
// next attempt gets a fresh transfer on the next prefill worker. What the
// router cannot undo: a decode engine whose pull began keeps the request's KV
// blocks until the prefill engine's wait runs out (vLLM
// vllm/v1/core/sched/scheduler.py finish_requests @00024d3 delays the free of
// a WAITING_FOR_REMOTE_KVS request; mooncake_connector.py @00f4240
// record_send_reqs drops an aborted prefill's transfer without waking the
// pull): why the legs are sequential by default. Ready; else,
// with no worker left, Aggregated or Fail per pd.on_prefill_failure, or
// ClientGone (the client left during a bootstrap query).
awaitable<PdPrefill> pd_start_mooncake(PdState& pd, const PdContext& c);

// start_sglang: the prefill leg for the decode attempt about to start, on the
// prefill ranking's pd.next_prefill worker, with a fresh room; the decode
// body gets the same fields. False when no prefill worker is left (the
// caller falls back).
bool pd_start_sglang(PdState& pd, const PdContext& c);

// decode_failed: the decode attempt failed before its first byte; `sent`:
// the decode worker may have received the request (its transfer consumed);
// `how` (when sent): worker_closed, timeout or status_5xx, counted in
// kvroute_pd_transfers_left_total. No release leg follows a worker that
// received the leg: kvroute cannot tell whether it pulled the transfer, and a
// Mooncake prefill engine asked for a transfer it no longer holds waits
// VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (480 s) before answering; the engines'
// own abort paths (a closed decode leg) and leases free it.
void pd_decode_failed(PdState& pd, const PdContext& c, bool sent, std::string_view how);

// The client left during phase `phase` of a split request (prefill,
// after_prefill, decode_head): kvroute_pd_client_gone_total.
void pd_client_gone(const PdState& pd, const PdContext& c, std::string_view phase);

// finish_concurrent: SGLang: waits (within pd.prefill_timeout_ms) for the
// prefill leg beside a decode leg that answered, and counts how it ended (a
// Mooncake leg counts itself: no wait).
awaitable<void> pd_finish_concurrent(PdState& pd, const PdContext& c);

// release: the client left after a vLLM (NIXL, Mooncake) prefill succeeded and before a decode
// worker took the transfer: a decode leg (max_tokens 1, no stream) to the
// decode ranking's `decode` worker claims it, its answer discarded. Runs on
// its own; the exchange may end.
void pd_release(PdState& pd, const PdContext& c, const RouteTarget& decode);

// The decode worker answered (its head, `ttfb` seconds after the decode leg
// was sent): the x-kvroute-* response fields, the decode leg's latency, and
// the request's count in kvroute_pd_requests_total.
void pd_committed(PdState& pd, const PdContext& c, double ttfb);
// The request's count in kvroute_pd_requests_total (once per request).
void pd_count(PdState& pd, const PdContext& c);

// Falls back to the decode worker alone (pd.on_prefill_failure fallback).
void pd_fall_back(PdState& pd, std::string_view reason);

}  // namespace kvroute
