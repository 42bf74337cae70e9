// MockerServer::Impl: prefill/decode disaggregation (mocker/README.md
// "Prefill/decode disaggregation"). vLLM NIXL: a prefill leg holds its blocks
// and returns kv_transfer_params; a decode leg pulls the blocks over the
// prefill worker's side channel (HTTP here, NIXL in vLLM). SGLang: both legs
// meet in a bootstrap room on the prefill worker's bootstrap server. The pure
// parts (parameters, held transfers, lease) are mocker/pd.h.
#include "mocker/pd_wire.h"
#include "mocker/server_impl.h"

namespace kvroute::mocker {


MockerServer::Impl::Reject MockerServer::Impl::pd_reject(http::status st, PdError e, std::string message) {
  const bool server_side = st >= http::status::internal_server_error;
  return Reject{st, ApiError{static_cast<unsigned>(st), std::move(message),
                             server_side ? "InternalServerError" : "invalid_request_error",
                             e == PdError::Missing || e == PdError::Malformed ? "kv_transfer_params" : "",
                             pd_error_name(e)}};
}

// ---- classification ----

// Which leg a request is, from its body and this worker's role. Role Both
// (the default) ignores every PD field, as before PD existed.
std::optional<MockerServer::Impl::Reject> MockerServer::Impl::classify_pd(const http::request<http::string_body>& req,
                                                                          GenParams& gen) {
  const PdConfig& c = opts.pd;
  if (c.protocol == PdProtocol::None) return std::nullopt;
  if (auto h = req.find("X-Request-Id"); h != req.end() && h->value().size() <= kMaxParamString)
    gen.request_id_header.assign(h->value().data(), h->value().size());
  simdjson::dom::object body;
  if (pd_parser().parse(req.body()).get_object().get(body)) return std::nullopt;  // parse_generation checked it
  if (c.protocol == PdProtocol::VllmNixl || c.protocol == PdProtocol::VllmMooncake) return classify_vllm(body, gen);
  return classify_sglang(body, gen);
}

// vLLM (NIXL or Mooncake connector): the leg from kv_transfer_params
// (do_remote_decode: a prefill leg; do_remote_prefill: a decode leg; neither:
// aggregated, as vLLM serves it).
std::optional<MockerServer::Impl::Reject> MockerServer::Impl::classify_vllm(simdjson::dom::object body, GenParams& gen) {
  const PdConfig& c = opts.pd;
  std::string detail;
  PdError err = PdError::None;
  const bool mooncake = c.protocol == PdProtocol::VllmMooncake;
  auto kv = parse_kv_transfer_params(body, err, detail);
  // Refused here, or (--pd-bad-params recompute, stock vLLM) served aggregated.
  auto refuse = [&](PdError e, std::string msg) -> std::optional<Reject> {
    count_rejection(e);
    if (c.recompute_bad_params) {
      if (log_now(++pd.recomputed))
        spdlog::warn("kvroute-mocker: invalid kv_transfer_params ({}), computed locally ({} so far)", msg,
                     pd.recomputed);
      gen.leg = PdLeg::None;
      return std::nullopt;
    }
    return pd_reject(http::status::bad_request, e, std::move(msg));
  };
  if (err != PdError::None) return refuse(err, detail);
  if (!kv || (!kv->do_remote_decode && !kv->do_remote_prefill)) return std::nullopt;  // aggregated, as vLLM
  if (kv->do_remote_decode && kv->do_remote_prefill)
    return refuse(PdError::Malformed, "kv_transfer_params sets both do_remote_decode and do_remote_prefill");
  if (kv->do_remote_decode) {
    if (c.role != PdRole::Prefill)
      return refuse(PdError::WrongRole, "kv_transfer_params.do_remote_decode sent to a decode worker");
    if (transfers.full()) {
      count_rejection(PdError::HeldFull);
      return pd_reject(http::status::service_unavailable, PdError::HeldFull,
                       fmt::format("this prefill worker holds {} transfers already", opts.pd.max_held));
    }
    // Mooncake: "Missing transfer_id in kv_transfer_params from router!"
    // (update_state_after_alloc; stock vLLM then holds nothing).
    if (mooncake && kv->transfer_id.empty())
      return refuse(PdError::Missing, "kv_transfer_params.do_remote_decode needs transfer_id (minted by the router)");
    gen.leg = mooncake ? PdLeg::MooncakePrefill : PdLeg::NixlPrefill;
    gen.kv = std::move(*kv);
    return std::nullopt;
  }
  if (c.role != PdRole::Decode)
    return refuse(PdError::WrongRole, "kv_transfer_params.do_remote_prefill sent to a prefill worker");
  if (mooncake) {
    if (PdError e = check_mooncake_decode_params(*kv, detail); e != PdError::None) return refuse(e, detail);
    uint16_t port = 0;
    if (!parse_bootstrap_addr(kv->remote_bootstrap_addr, kv->remote_host, port))
      return refuse(PdError::Malformed, fmt::format("kv_transfer_params.remote_bootstrap_addr '{}' is not "
                                                    "http://HOST:PORT", kv->remote_bootstrap_addr));
    kv->remote_port = port;
    if (!pd_host_allowed(kv->remote_host))
      return refuse(PdError::BadHost, fmt::format("kv_transfer_params.remote_bootstrap_addr host '{}' is not an IP "
                                                  "address or localhost", kv->remote_host));
    gen.leg = PdLeg::MooncakeDecode;
    gen.kv = std::move(*kv);
    return std::nullopt;
  }
  if (PdError e = check_decode_params(*kv, detail); e != PdError::None) return refuse(e, detail);
  if (!pd_host_allowed(kv->remote_host))
    return refuse(PdError::BadHost,
                  fmt::format("kv_transfer_params.remote_host '{}' is not an IP address or localhost", kv->remote_host));
  gen.leg = PdLeg::NixlDecode;
  gen.kv = std::move(*kv);
  return std::nullopt;
}

// SGLang (io_struct.py GenerateReqInput): bootstrap_host, bootstrap_port,
// bootstrap_room; the leg is this worker's role.
std::optional<MockerServer::Impl::Reject> MockerServer::Impl::classify_sglang(simdjson::dom::object body,
                                                                              GenParams& gen) {
  const PdConfig& c = opts.pd;
  auto room = body.at_key("bootstrap_room");
  if (room.error() || room.value_unsafe().is_null()) {
    count_rejection(PdError::Missing);
    // SGLang's answer to a request that bypasses the PD router.
    return pd_reject(http::status::bad_request, PdError::Missing,
                     "Disaggregated request received without bootstrap room id");
  }
  int64_t signed_room = 0;
  if (room.value_unsafe().get_uint64().get(gen.room) &&
      (room.value_unsafe().get_int64().get(signed_room) || signed_room < 0)) {
    count_rejection(PdError::Malformed);
    return pd_reject(http::status::bad_request, PdError::Malformed,
                     "bootstrap_room must be a non-negative integer (batched rooms are not emulated)");
  }
  auto host = body.at_key("bootstrap_host");
  std::string_view hv;
  if (!host.error() && !host.value_unsafe().is_null()) {
    if (host.value_unsafe().get_string().get(hv) || hv.size() > kMaxParamString) {
      count_rejection(PdError::Malformed);
      return pd_reject(http::status::bad_request, PdError::Malformed, "bootstrap_host must be a string");
    }
    gen.bootstrap_host.assign(hv);
  }
  auto port = body.at_key("bootstrap_port");
  if (!port.error() && !port.value_unsafe().is_null()) {
    uint64_t n = 0;
    if (port.value_unsafe().get_uint64().get(n) || n == 0 || n > 65535) {
      count_rejection(PdError::Malformed);
      return pd_reject(http::status::bad_request, PdError::Malformed, "bootstrap_port must be an integer in [1, 65535]");
    }
    gen.bootstrap_port = static_cast<uint16_t>(n);
  }
  if (c.role == PdRole::Prefill) {
    gen.leg = PdLeg::SglPrefill;
    gen.max_tokens = 1;  // the prefill server computes the prompt and its first token only
    return std::nullopt;
  }
  if (gen.bootstrap_host.empty()) {
    count_rejection(PdError::Missing);
    return pd_reject(http::status::bad_request, PdError::Missing, "bootstrap_host is required on a decode worker");
  }
  if (!pd_host_allowed(gen.bootstrap_host)) {
    count_rejection(PdError::BadHost);
    return pd_reject(http::status::bad_request, PdError::BadHost,
                     fmt::format("bootstrap_host '{}' is not an IP address or localhost", gen.bootstrap_host));
  }
  gen.leg = PdLeg::SglDecode;
  return std::nullopt;
}

// ---- side-channel client ----

awaitable<PeerReply> MockerServer::Impl::peer_post(std::string host, uint16_t port, std::string target,
                                                   std::string body, std::chrono::milliseconds timeout) {
  PeerReply out;
  beast::error_code ec;
  const auto addr = asio::ip::make_address(host == "localhost" ? std::string("127.0.0.1") : host, ec);
  if (ec) {
    out.error = fmt::format("'{}' is not an IP address", host);
    co_return out;
  }
  beast::tcp_stream s(ioc);
  s.expires_after(timeout);
  co_await s.async_connect(tcp::endpoint(addr, port), nothrow(ec));
  if (ec) {
    out.error = fmt::format("connect {}:{}: {}", host, port, ec.message());
    co_return out;
  }
  http::request<http::string_body> req{http::verb::post, target, 11};
  req.set(http::field::host, fmt::format("{}:{}", host, port));
  req.set(http::field::content_type, "application/json");
  req.keep_alive(false);
  req.body() = std::move(body);
  req.prepare_payload();
  co_await http::async_write(s, req, nothrow(ec));
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(16 << 20);
  if (!ec) co_await http::async_read(s, buf, parser, nothrow(ec));
  if (ec) {
    out.error = fmt::format("{}:{}{}: {}", host, port, target, ec.message());
    co_return out;
  }
  out.status = parser.get().result_int();
  out.body = std::move(parser.get().body());
  co_return out;
}


// ---- vLLM NIXL: decode leg ----

// The decode side of update_state_after_alloc() + the NIXL read
// (pull_scheduler.py): the blocks this worker does not hold already are read
// from the prefill worker named by remote_engine_id/host/port, which frees
// them; the read takes the link's transfer time.
awaitable<std::optional<MockerServer::Impl::Reject>> MockerServer::Impl::nixl_pull(const GenParams& gen,
                                                                                   Prepared& prep, bool& contacted) {
  const KvTransferParams& kv = gen.kv;
  Engine& engine = *engines[static_cast<size_t>(prep.rank)];
  const std::vector<SequenceHash> blocks = engine.prompt_blocks(prep.tokens, prep.ns);
  const std::vector<uint64_t>& ids = *kv.remote_block_ids;
  if (ids.size() != blocks.size())
    co_return pull_failed(PdError::PromptMismatch,
                          fmt::format("kv_transfer_params.remote_block_ids lists {} blocks; this prompt has {} "
                                      "complete blocks",
                                      ids.size(), blocks.size()),
                          prep);
  const uint32_t local = engine.cached_prefix(blocks);
  std::string body = fmt::format(R"({{"engine_id":"{}","request_id":"{}","block_ids":[{}]}})",
                                 json_escape(kv.remote_engine_id), json_escape(kv.remote_request_id),
                                 fmt::join(ids.begin() + local, ids.end(), ","));
  const PeerReply reply =
      co_await peer_post(kv.remote_host, *kv.remote_port, "/nixl/read", std::move(body), std::chrono::seconds(10));
  const std::string transfer = fmt::format("remote_request_id '{}'", kv.remote_request_id);
  co_return co_await finish_pull(reply, blocks, local, prep, contacted, "side channel", transfer);
}

// A decode leg whose pull failed: refused, or computed here (--pd-bad-params
// recompute, vLLM's kv_load_failure_policy=recompute).
std::optional<MockerServer::Impl::Reject> MockerServer::Impl::pull_failed(PdError e, std::string msg, Prepared& prep) {
  count_rejection(e);
  if (opts.pd.recompute_bad_params) {
    if (log_now(++pd.recomputed))
      spdlog::warn("kvroute-mocker: KV transfer failed ({}), computed locally ({} so far)", msg, pd.recomputed);
    prep.imported_blocks = 0;
    return std::nullopt;
  }
  // A prefill worker that did not answer is no fault of the request (500, as
  // SGLang's dead bootstrap server); the rest are its params' (400).
  return pd_reject(e == PdError::Unreachable ? http::status::internal_server_error : http::status::bad_request, e,
                   std::move(msg));
}

// The tail both vLLM pulls share: the prefill worker's reply to a read of
// the prompt's blocks from `local` on, checked (no answer, a refusal naming
// its reason, blocks that are not the prompt's), then the transfer time.
awaitable<std::optional<MockerServer::Impl::Reject>> MockerServer::Impl::finish_pull(
    const PeerReply& reply, const std::vector<SequenceHash>& blocks, uint32_t local, Prepared& prep, bool& contacted,
    std::string_view peer, std::string_view transfer) {
  if (reply.status == 0)
    co_return pull_failed(PdError::Unreachable,
                          fmt::format("the prefill worker's {} did not answer: {}", peer, reply.error), prep);
  contacted = true;
  if (reply.status != 200) {
    const PdError e = read_error_code(reply.body);
    co_return pull_failed(e, fmt::format("the prefill worker refused the KV transfer ({}): {}", pd_error_name(e),
                                         transfer),
                          prep);
  }
  std::vector<SequenceHash> got;
  if (!read_blocks(reply.body, got) || got.size() != blocks.size() - local ||
      !std::equal(got.begin(), got.end(), blocks.begin() + local, blocks.end()))
    co_return pull_failed(PdError::PromptMismatch, "the transferred KV blocks are not this prompt's", prep);
  co_await transfer_blocks(blocks.size(), local, prep);
  co_return std::nullopt;
}

awaitable<void> MockerServer::Impl::transfer_blocks(size_t blocks, uint32_t local, Prepared& prep) {
  const uint64_t moved = blocks - local;
  const double kv_bytes = opts.pd.kv_bytes_per_token > 0 ? opts.pd.kv_bytes_per_token
                                                         : opts.engine.profile.kv_bytes_per_token;
  const double ms = pd_transfer_ms(moved, opts.engine.block_size, kv_bytes, opts.pd.link_gbps) / opts.speedup;
  if (ms > 0) {
    asio::steady_timer t(ioc);
    t.expires_after(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
    beast::error_code ec;
    co_await t.async_wait(nothrow(ec));
  }
  ++pd.transfers_completed;
  pd.blocks_pulled += moved;
  pd.bytes_pulled += static_cast<uint64_t>(double(moved) * opts.engine.block_size * kv_bytes);
  pd.blocks_local += local;
  prep.imported_blocks = static_cast<uint32_t>(blocks);
}

void MockerServer::Impl::pd_leg_refused(const GenParams& gen, bool pulled, bool in_room) {
  if (in_room) sgl_close_room(gen.room);  // refused at admission after the rendezvous
  if (pulled) return;                     // the side channel freed or refused the transfer itself
  // vLLM: a decode leg refused before its pull frees the prefill worker's blocks
  // (_with_kv_transfer_rejection_cleanup, vllm/entrypoints/generate/base/serving.py).
  if (gen.leg == PdLeg::NixlDecode)
    notify_peer(gen, "/nixl/free",
                fmt::format(R"({{"engine_id":"{}","request_id":"{}"}})", json_escape(gen.kv.remote_engine_id),
                            json_escape(gen.kv.remote_request_id)));
  // Mooncake: request_finished() of a decode never scheduled queues an
  // empty pull, so the prefill worker frees the transfer.
  if (gen.leg == PdLeg::MooncakeDecode)
    notify_peer(gen, "/mooncake/free",
                fmt::format(R"({{"engine_id":"{}","transfer_id":"{}"}})", json_escape(gen.kv.remote_engine_id),
                            json_escape(gen.kv.transfer_id)));
}

// The decode side's "free" to the prefill worker that holds a transfer it
// will not read (NIXL's notification, Mooncake's empty pull): sent on its
// own, its answer not awaited by the leg.
void MockerServer::Impl::notify_peer(const GenParams& gen, std::string_view target, std::string body) {
  asio::co_spawn(
      ioc,
      [this, host = gen.kv.remote_host, port = *gen.kv.remote_port, target = std::string(target),
       body = std::move(body)]() -> awaitable<void> {
        co_await peer_post(host, port, target, body, std::chrono::seconds(5));
      },
      asio::detached);
}

// ---- vLLM Mooncake ----

std::string MockerServer::Impl::mooncake_engine_id(uint32_t rank) const {
  return engines.size() > 1 ? fmt::format("{}_dp{}", engine_id, rank) : engine_id;
}

// The decode side of the MooncakeConnector (mooncake_connector.py
// update_state_after_alloc + the worker's receive): the blocks this worker
// does not hold already come from the prefill worker at remote_bootstrap_addr
// holding transfer_id for remote_engine_id, which frees them; the transfer
// takes the link's time. (vLLM asks the bootstrap server for the engine's
// worker addresses and has the prefill engine write the KV over RDMA; here
// one HTTP read on the bootstrap port.)
awaitable<std::optional<MockerServer::Impl::Reject>> MockerServer::Impl::mooncake_pull(const GenParams& gen,
                                                                                       Prepared& prep,
                                                                                       bool& contacted) {
  const KvTransferParams& kv = gen.kv;
  Engine& engine = *engines[static_cast<size_t>(prep.rank)];
  const std::vector<SequenceHash> blocks = engine.prompt_blocks(prep.tokens, prep.ns);
  const uint32_t local = engine.cached_prefix(blocks);
  std::string body = fmt::format(R"({{"engine_id":"{}","transfer_id":"{}","from_block":{},"blocks":{}}})",
                                 json_escape(kv.remote_engine_id), json_escape(kv.transfer_id), local, blocks.size());
  const PeerReply reply =
      co_await peer_post(kv.remote_host, *kv.remote_port, "/mooncake/read", std::move(body),
                         std::chrono::milliseconds(static_cast<int64_t>(opts.pd.lease_ms)) + std::chrono::seconds(60));
  const std::string transfer = fmt::format("transfer_id '{}'", kv.transfer_id);
  co_return co_await finish_pull(reply, blocks, local, prep, contacted, "bootstrap server", transfer);
}

// request_finished() of a Mooncake producer: a prefill that ran to its
// length cap keeps its blocks for transfer_id; nothing is returned.
void MockerServer::Impl::mooncake_hold(const GenParams& gen, const Prepared& prep, uint64_t id) {
  Engine& engine = *engines[static_cast<size_t>(prep.rank)];
  const std::vector<SequenceHash>* held = engine.held(id);
  if (!held) return;
  TransferTable::Held h;
  h.request_id = gen.kv.transfer_id;
  h.engine_request = id;
  h.rank = static_cast<uint32_t>(prep.rank);
  h.blocks = *held;
  for (size_t i = 0; i < h.blocks.size(); ++i) h.block_ids.push_back(i);
  if (!transfers.add(std::move(h), wall_ms())) {  // full, or the transfer id is held already
    engine.release_held(id);
    schedule();
    count_rejection(PdError::HeldFull);
    return;
  }
  arm_lease_timer();
  ++pd.prefill_legs;
  mooncake_wake(gen.kv.transfer_id);
}

// vLLM's send_kv_to_decode (mooncake_connector.py @00f4240): a decode
// engine's request for a transfer id its prefill engine does not know yet
// makes a placeholder and waits for the prefill, at most
// VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (the mocker's lease_ms); a prefill that
// is aborted instead never wakes it (record_send_reqs drops the placeholder
// unsignalled), so the wait runs to its bound, as here.
awaitable<bool> MockerServer::Impl::mooncake_wait_held(std::string transfer_id) {
  if (transfers.find(transfer_id)) co_return true;
  if (mooncake_waiters.size() >= opts.pd.max_held) co_return false;
  ++pd.pulls_waited;
  asio::steady_timer t(ioc);
  t.expires_after(std::chrono::microseconds(static_cast<int64_t>(opts.pd.lease_ms * 1000)));
  const auto it = mooncake_waiters.emplace(transfer_id, &t);
  bool woken = false;
  for (;;) {
    beast::error_code ec;
    co_await t.async_wait(nothrow(ec));
    woken = transfers.find(transfer_id) != nullptr;
    if (woken || ec != asio::error::operation_aborted) break;  // held, or the bound
  }
  mooncake_waiters.erase(it);
  if (!woken) ++pd.pulls_timed_out;
  co_return true;
}

void MockerServer::Impl::mooncake_wake(const std::string& transfer_id) {
  auto [b, e] = mooncake_waiters.equal_range(transfer_id);
  for (auto it = b; it != e; ++it) it->second->cancel();
}

awaitable<void> MockerServer::Impl::hold_answer() {
  if (!hold_answers) co_return;
  ++pd.answers_held;
  while (hold_answers) {
    beast::error_code ec;
    co_await answers_gate.async_wait(nothrow(ec));  // cancelled when the hold is cleared (or the server stops)
    if (ec != asio::error::operation_aborted) break;
  }
  --pd.answers_held;
}

// ---- vLLM NIXL: prefill leg ----

// request_finished() of the prefill side (pull_scheduler.py): the blocks stay
// held and the dict the decode leg needs is returned.
std::string MockerServer::Impl::nixl_hold(const GenParams& gen, const Prepared& prep, const std::string& rid,
                                          uint64_t id) {
  Engine& engine = *engines[static_cast<size_t>(prep.rank)];
  const std::vector<SequenceHash>* held = engine.held(id);
  if (!held) return {};
  TransferTable::Held h;
  // vLLM's internal request id: the serving layer's base id (from
  // X-Request-Id when given) plus 8 random hex digits.
  h.request_id = fmt::format("{}-{:08x}", rid, static_cast<uint32_t>(rng()));
  h.engine_request = id;
  h.rank = static_cast<uint32_t>(prep.rank);
  h.blocks = *held;
  for (size_t i = 0; i < h.blocks.size(); ++i) {
    h.block_ids.push_back(next_block_id);
    next_block_id = next_block_id % opts.engine.kv_blocks + 1;  // block ids stay within the cache, as vLLM's
  }
  const std::string request_id = h.request_id, block_ids = fmt::format("{}", fmt::join(h.block_ids, ","));
  if (!transfers.add(std::move(h), wall_ms())) {  // full since admission: hold nothing, return nothing
    engine.release_held(id);
    schedule();
    count_rejection(PdError::HeldFull);
    return {};
  }
  arm_lease_timer();
  ++pd.prefill_legs;
  const std::string host = opts.pd.side_channel_host.empty() ? opts.host : opts.pd.side_channel_host;
  if (opts.pd.legacy_params)  // nixl/scheduler.py at 053da34: one flat block list, no lease fields
    return fmt::format(
        R"({{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[{}],"remote_engine_id":"{}",)"
        R"("remote_request_id":"{}","remote_host":"{}","remote_port":{},"tp_size":1}})",
        block_ids, json_escape(engine_id), json_escape(request_id), json_escape(host),
        side_acceptor.local_endpoint().port());
  return fmt::format(
      R"({{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[{}]],"remote_engine_id":"{}",)"
      R"("remote_request_id":"{}","remote_host":"{}","remote_port":{},"tp_size":1,"dcp_size":1,"pp_size":1,)"
      R"("remote_num_tokens":{},"remote_blocks_expiry_time":null,"transfer_mode":"pull"}})",
      block_ids, json_escape(engine_id), json_escape(request_id), json_escape(host),
      side_acceptor.local_endpoint().port(), prep.tokens.size());
}

// The lease sweep (vLLM frees expired leases every scheduler step).
void MockerServer::Impl::arm_lease_timer() {
  const auto next = transfers.next_expiry();
  if (!next) {
    lease_timer.cancel();
    return;
  }
  lease_timer.expires_after(std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, *next - wall_ms()) * 1000)));
  lease_timer.async_wait([this](beast::error_code ec) {
    if (ec) return;  // re-armed or stopped
    for (const auto& h : transfers.expire(wall_ms())) {
      engines[h.rank]->release_held(h.engine_request);
      ++pd.transfers_expired;
      if (log_now(pd.transfers_expired))
        spdlog::warn("kvroute-mocker: transfer {} expired after {} ms without a pull ({} so far)", h.request_id,
                     opts.pd.lease_ms, pd.transfers_expired);
    }
    schedule();
    arm_lease_timer();
  });
}

// ---- the side channel's routes ----

awaitable<bool> MockerServer::Impl::side_channel(beast::tcp_stream& s, const http::request<http::string_body>& req,
                                                 bool& again) {
  const std::string_view target(req.target().data(), req.target().size());
  const bool keep = req.keep_alive();
  const unsigned v = req.version();
  if (target == "/health") {  // SGLang's bootstrap server answers "OK"
    again = co_await respond(s, v, keep, http::status::ok, "OK", "text/plain");
    co_return true;
  }
  if (opts.pd.protocol == PdProtocol::VllmMooncake && target == "/query" && req.method() == http::verb::get) {
    // MooncakeBootstrapServer.query (mooncake_utils.py): {dp_rank: {engine_id, worker_addr: {tp: {pp: addr}}}}.
    std::string out = "{";
    const std::string host = opts.pd.side_channel_host.empty() ? opts.host : opts.pd.side_channel_host;
    for (uint32_t r = 0; r < engines.size(); ++r)
      out += fmt::format(R"({}"{}":{{"engine_id":"{}","worker_addr":{{"0":{{"0":"tcp://{}:{}"}}}}}})", r ? "," : "", r,
                         json_escape(mooncake_engine_id(r)), json_escape(host), side_acceptor.local_endpoint().port());
    out += "}";
    again = co_await respond(s, v, keep, http::status::ok, std::move(out));
    co_return true;
  }
  if (req.method() != http::verb::post) co_return false;
  if (opts.pd.protocol == PdProtocol::VllmMooncake && (target == "/mooncake/read" || target == "/mooncake/free")) {
    co_await mooncake_side_channel(s, req, again);
    co_return true;
  }
  if (opts.pd.protocol == PdProtocol::Sglang && target == "/mocker/sglang/room") {
    auto [st, body] = co_await sgl_room_request(req.body());
    again = co_await respond(s, v, keep, st, std::move(body));
    co_return true;
  }
  if (opts.pd.protocol != PdProtocol::VllmNixl || (target != "/nixl/read" && target != "/nixl/free")) co_return false;
  // {"engine_id", "request_id", "block_ids"?}
  simdjson::dom::object o;
  std::string_view eid, rid;
  std::vector<uint64_t> ids;
  bool ok = !pd_parser().parse(req.body()).get_object().get(o) && !o["engine_id"].get_string().get(eid) &&
            !o["request_id"].get_string().get(rid);
  if (ok && target == "/nixl/read") {
    simdjson::dom::array a;
    ok = !o["block_ids"].get_array().get(a) && a.size() <= kMaxRemoteBlocks;
    if (ok)
      for (simdjson::dom::element e : a) {
        uint64_t id = 0;
        if (e.get_uint64().get(id)) ok = false;
        ids.push_back(id);
      }
  }
  auto refuse = [&](http::status st, PdError e, std::string msg) -> awaitable<void> {
    ++pd.side_channel_rejected[pd_error_name(e)];
    again = co_await respond(s, v, keep, st, side_error(e, msg));
  };
  if (!ok) {
    co_await refuse(http::status::bad_request, PdError::Malformed,
                    R"(body must be {"engine_id": S, "request_id": S, "block_ids": [N...]})");
    co_return true;
  }
  if (eid != engine_id) {
    co_await refuse(http::status::not_found, PdError::UnknownEngine, fmt::format("engine '{}' is not this worker", eid));
    co_return true;
  }
  if (target == "/nixl/free") {  // the decode side refused or aborted the request: free without a read
    auto h = transfers.drop(rid);
    if (h) {
      engines[h->rank]->release_held(h->engine_request);
      ++pd.transfers_freed;
      schedule();
      arm_lease_timer();
    }
    again = co_await respond(s, v, keep, http::status::ok, fmt::format(R"({{"freed":{}}})", h.has_value()));
    co_return true;
  }
  TransferTable::Held h;
  std::vector<SequenceHash> hashes;
  switch (transfers.take(rid, ids, wall_ms(), h, hashes)) {
    case TransferTable::Take::Unknown:
      co_await refuse(http::status::not_found, PdError::UnknownTransfer, fmt::format("no transfer '{}' is held", rid));
      co_return true;
    case TransferTable::Take::Expired:
      co_await refuse(http::status::gone, PdError::Expired,
                      fmt::format("transfer '{}' expired after {} ms without a pull", rid, opts.pd.lease_ms));
      co_return true;
    case TransferTable::Take::Forged:
      co_await refuse(http::status::bad_request, PdError::ForgedBlocks,
                      fmt::format("transfer '{}' does not hold those block ids", rid));
      co_return true;
    case TransferTable::Take::Ok: break;
  }
  engines[h.rank]->release_held(h.engine_request);  // the read is done: the prefill worker frees the blocks
  ++pd.transfers_served;
  schedule();
  arm_lease_timer();
  again = co_await respond(s, v, keep, http::status::ok, fmt::format(R"({{"blocks":[{}]}})", join_hashes(hashes)));
  co_return true;
}

// The Mooncake prefill worker's side of a transfer: {"engine_id", "transfer_id",
// "from_block"?, "blocks"?} read (the held blocks from `from_block` on, then
// freed: the prefill engine's send_kv_to_decode) or freed unread (a decode
// aborted before its transfer: request_finished()'s empty pull).
awaitable<void> MockerServer::Impl::mooncake_side_channel(beast::tcp_stream& s,
                                                          const http::request<http::string_body>& req, bool& again) {
  const std::string_view target(req.target().data(), req.target().size());
  const bool keep = req.keep_alive();
  const unsigned v = req.version();
  simdjson::dom::object o;
  std::string_view eid, tid;
  uint64_t from = 0, count = 0;
  bool ok = !pd_parser().parse(req.body()).get_object().get(o) && !o["engine_id"].get_string().get(eid) &&
            !o["transfer_id"].get_string().get(tid);
  if (ok && target == "/mooncake/read") ok = !o["from_block"].get_uint64().get(from) && !o["blocks"].get_uint64().get(count);
  auto refuse = [&](http::status st, PdError e, std::string msg) -> awaitable<void> {
    ++pd.side_channel_rejected[pd_error_name(e)];
    again = co_await respond(s, v, keep, st, side_error(e, msg));
  };
  if (!ok) {
    co_await refuse(http::status::bad_request, PdError::Malformed,
                    R"(body must be {"engine_id": S, "transfer_id": S, "from_block": N, "blocks": N})");
    co_return;
  }
  // The engine id names a rank of this worker, the one holding the transfer
  // (an unknown transfer is told below).
  bool engine_known = false;
  for (uint32_t r = 0; r < engines.size(); ++r) engine_known = engine_known || eid == mooncake_engine_id(r);
  if (!engine_known) {
    co_await refuse(http::status::not_found, PdError::UnknownEngine, fmt::format("engine '{}' is not this worker's", eid));
    co_return;
  }
  // Concurrent legs: the decode side may ask before the prefill is done. (The
  // parser's views do not outlive the wait: copied.)
  const std::string eid_held(eid), tid_held(tid);
  eid = eid_held;
  tid = tid_held;
  if (!co_await mooncake_wait_held(tid_held)) {
    co_await refuse(http::status::service_unavailable, PdError::HeldFull,
                    fmt::format("{} pulls wait for their transfer already", mooncake_waiters.size()));
    co_return;
  }
  const TransferTable::Held* held = transfers.find(tid);
  if (held && eid != mooncake_engine_id(held->rank)) {
    co_await refuse(http::status::not_found, PdError::UnknownEngine, fmt::format("engine '{}' is not this worker's", eid));
    co_return;
  }
  if (target == "/mooncake/free") {
    auto h = transfers.drop(tid);
    if (h) {
      engines[h->rank]->release_held(h->engine_request);
      ++pd.transfers_freed;
      schedule();
      arm_lease_timer();
    }
    again = co_await respond(s, v, keep, http::status::ok, fmt::format(R"({{"freed":{}}})", h.has_value()));
    co_return;
  }
  if (held && held->blocks.size() != count) {  // another prompt's transfer id: the transfer stays held
    co_await refuse(http::status::bad_request, PdError::PromptMismatch,
                    fmt::format("transfer '{}' holds {} blocks, not {}", tid, held->blocks.size(), count));
    co_return;
  }
  std::vector<uint64_t> ids;
  if (held)
    for (size_t i = std::min<size_t>(from, held->block_ids.size()); i < held->block_ids.size(); ++i)
      ids.push_back(held->block_ids[i]);
  TransferTable::Held h;
  std::vector<SequenceHash> hashes;
  switch (transfers.take(tid, ids, wall_ms(), h, hashes)) {
    case TransferTable::Take::Unknown:
      co_await refuse(http::status::not_found, PdError::UnknownTransfer, fmt::format("no transfer '{}' is held", tid));
      co_return;
    case TransferTable::Take::Expired:
      co_await refuse(http::status::gone, PdError::Expired,
                      fmt::format("transfer '{}' expired after {} ms without a pull", tid, opts.pd.lease_ms));
      co_return;
    case TransferTable::Take::Forged:  // not reached: the ids are the transfer's own
      co_await refuse(http::status::bad_request, PdError::ForgedBlocks, "forged block ids");
      co_return;
    case TransferTable::Take::Ok: break;
  }
  engines[h.rank]->release_held(h.engine_request);
  ++pd.transfers_served;
  schedule();
  arm_lease_timer();
  again = co_await respond(s, v, keep, http::status::ok, fmt::format(R"({{"blocks":[{}]}})", join_hashes(hashes)));
}

// ---- telemetry ----

std::string MockerServer::Impl::pd_stats_json() const {
  auto reasons = [](const std::unordered_map<std::string, uint64_t>& m) {
    std::string out;
    for (const auto& [k, n] : m) out += fmt::format(R"({}"{}":{})", out.empty() ? "" : ",", k, n);
    return "{" + out + "}";
  };
  const char* role = opts.pd.role == PdRole::Prefill ? "prefill" : opts.pd.role == PdRole::Decode ? "decode" : "both";
  const char* proto = opts.pd.protocol == PdProtocol::VllmNixl       ? "vllm-nixl"
                      : opts.pd.protocol == PdProtocol::VllmMooncake ? "vllm-mooncake"
                      : opts.pd.protocol == PdProtocol::Sglang       ? "sglang"
                                                                 : "none";
  uint64_t held_blocks = 0, ready_rooms = 0;
  for (const auto& e : engines) held_blocks += e->held_blocks();
  for (const auto& [id, r] : rooms) ready_rooms += r->ready && !r->taken;
  return fmt::format(
      R"({{"role":"{}","protocol":"{}","engine_id":"{}","side_channel_port":{},"held_transfers":{},"held_blocks":{},)"
      R"("transfers_served":{},"transfers_expired":{},"transfers_freed":{},)"
      R"("transfers_completed":{},"blocks_pulled":{},"bytes_pulled":{},"blocks_local":{},"prefill_legs":{},)"
      R"("recomputed":{},"answers_held":{},"pulls_waiting":{},"pulls_waited":{},"pulls_timed_out":{},)"
      R"("rooms_waiting":{},"rooms_completed":{},"rejected":{},"side_channel_rejected":{}}})",
      role, proto, json_escape(engine_id), side_acceptor.is_open() ? side_acceptor.local_endpoint().port() : 0,
      transfers.held_transfers() + ready_rooms, held_blocks, pd.transfers_served, pd.transfers_expired,
      pd.transfers_freed, pd.transfers_completed, pd.blocks_pulled, pd.bytes_pulled, pd.blocks_local,
      pd.prefill_legs, pd.recomputed, pd.answers_held, mooncake_waiters.size(), pd.pulls_waited, pd.pulls_timed_out,
      rooms.size(), pd.rooms_completed, reasons(pd.rejected),
      reasons(pd.side_channel_rejected));
}

// kvroute_mocker_pd_*: counters, then gauges.
std::string MockerServer::Impl::pd_metrics_text() const {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto one = [&](const char* name, const char* type, const char* help, uint64_t v) {
    family(name, type, help);
    out += fmt::format("{} {}\n", name, v);
  };
  one("kvroute_mocker_pd_transfers_served_total", "counter", "Prefill: KV transfers read by their decode worker.",
      pd.transfers_served);
  one("kvroute_mocker_pd_transfers_expired_total", "counter", "Prefill: held transfers whose lease ran out.",
      pd.transfers_expired);
  one("kvroute_mocker_pd_transfers_freed_total", "counter", "Prefill: held transfers freed by the decode side unread.",
      pd.transfers_freed);
  one("kvroute_mocker_pd_transfers_completed_total", "counter", "Decode: KV transfers pulled before the request ran.",
      pd.transfers_completed);
  one("kvroute_mocker_pd_blocks_pulled_total", "counter", "Decode: KV blocks transferred.", pd.blocks_pulled);
  one("kvroute_mocker_pd_bytes_pulled_total", "counter", "Decode: KV bytes transferred.", pd.bytes_pulled);
  one("kvroute_mocker_pd_blocks_local_total", "counter", "Decode: blocks cached here already, not transferred.",
      pd.blocks_local);
  one("kvroute_mocker_pd_rooms_completed_total", "counter", "SGLang: bootstrap rooms whose KV changed hands.",
      pd.rooms_completed);
  family("kvroute_mocker_pd_rejected_total", "counter", "PD legs refused, by reason.");
  for (PdError e : kPdErrors) {
    auto it = pd.rejected.find(pd_error_name(e));
    out += fmt::format("kvroute_mocker_pd_rejected_total{{reason=\"{}\"}} {}\n", pd_error_name(e),
                       it == pd.rejected.end() ? 0 : it->second);
  }
  family("kvroute_mocker_pd_side_channel_rejected_total", "counter", "Prefill: side-channel reads refused, by reason.");
  for (PdError e : kPdErrors) {
    auto it = pd.side_channel_rejected.find(pd_error_name(e));
    out += fmt::format("kvroute_mocker_pd_side_channel_rejected_total{{reason=\"{}\"}} {}\n", pd_error_name(e),
                       it == pd.side_channel_rejected.end() ? 0 : it->second);
  }
  uint64_t held_blocks = 0, ready_rooms = 0;
  for (const auto& e : engines) held_blocks += e->held_blocks();
  for (const auto& [id, r] : rooms) ready_rooms += r->ready && !r->taken;
  one("kvroute_mocker_pd_held_transfers", "gauge", "Prefill: transfers holding blocks for their decode worker.",
      transfers.held_transfers() + ready_rooms);
  one("kvroute_mocker_pd_held_blocks", "gauge", "Prefill: KV blocks held for transfers (not evictable).", held_blocks);
  one("kvroute_mocker_pd_rooms_waiting", "gauge", "SGLang: bootstrap rooms open on this prefill worker.", rooms.size());
  one("kvroute_mocker_pd_pulls_waiting", "gauge",
      "vLLM Mooncake: decode pulls waiting on this prefill worker for a transfer not held yet.",
      mooncake_waiters.size());
  return out;
}

}  // namespace kvroute::mocker
