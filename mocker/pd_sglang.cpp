// MockerServer::Impl: SGLang's disaggregation (mocker/README.md
// "Prefill/decode disaggregation"): both legs meet in a bootstrap room on the
// prefill worker's bootstrap server; the decode leg takes the prompt's pages
// from it. The rooms' side-channel route is in pd_server.cpp.
#include "mocker/pd_wire.h"
#include "mocker/server_impl.h"

namespace kvroute::mocker {

// ---- SGLang ----

std::shared_ptr<Room> MockerServer::Impl::room_for(uint64_t id) {
  auto it = rooms.find(id);
  if (it != rooms.end()) return it->second;
  if (rooms.size() >= opts.pd.max_rooms) return nullptr;
  auto room = std::make_shared<Room>(ioc.get_executor());
  rooms.emplace(id, room);
  return room;
}

static void erase_room(std::unordered_map<uint64_t, std::shared_ptr<Room>>& rooms, uint64_t id,
                       const std::shared_ptr<Room>& room) {
  auto it = rooms.find(id);
  if (it != rooms.end() && it->second == room) rooms.erase(it);
}

// Waits on `timer` until `done()` or the deadline; true when done.
template <typename Pred>
static awaitable<bool> wait_for(asio::steady_timer& timer, std::chrono::steady_clock::time_point deadline, Pred done) {
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    timer.expires_at(deadline);
    beast::error_code ec;
    co_await timer.async_wait(nothrow(ec));
  }
  co_return done();
}

// A waiting prefill leg's client leaving sets `gone` and wakes the leg
// (watch_departure(); end_watch() ends it).
static void wake_on_departure(tcp::socket& client, std::shared_ptr<bool> gone, std::shared_ptr<Room> room) {
  watch_departure(client, [gone = std::move(gone), room = std::move(room)] {
    *gone = true;
    room->prefill_wake.cancel();
  });
}

static void end_watch(tcp::socket& sock) {
  beast::error_code ignored;
  sock.cancel(ignored);
}

static std::chrono::steady_clock::time_point deadline_in(double ms) {
  return std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<int64_t>(ms * 1000));
}

// Prefill leg: SGLang's prefill request stays in KVPoll.Bootstrapping until
// its decode leg connects (common/conn.py), failing after the bootstrap timeout.
awaitable<std::optional<MockerServer::Impl::Reject>> MockerServer::Impl::sgl_wait_decode(const GenParams& gen,
                                                                                         tcp::socket& client) {
  auto room = room_for(gen.room);
  if (!room) {
    count_rejection(PdError::RoomsFull);
    co_return pd_reject(http::status::service_unavailable, PdError::RoomsFull,
                        fmt::format("{} bootstrap rooms are waiting already", opts.pd.max_rooms));
  }
  if (room->prefill_arrived) {
    count_rejection(PdError::DuplicateRoom);
    co_return pd_reject(http::status::bad_request, PdError::DuplicateRoom,
                        fmt::format("bootstrap_room {} has a prefill request already", gen.room));
  }
  room->prefill_arrived = true;
  const auto t0 = std::chrono::steady_clock::now();
  auto gone = std::make_shared<bool>(false);
  wake_on_departure(client, gone, room);
  const bool met = co_await wait_for(room->prefill_wake, deadline_in(opts.pd.bootstrap_timeout_ms),
                                     [&] { return room->decode_arrived || room->failed || *gone; });
  end_watch(client);
  if (met && !room->failed && !*gone) co_return std::nullopt;
  room->failed = true;
  room->decode_wake.cancel();
  erase_room(rooms, gen.room, room);
  if (*gone) {  // the client left (the router cancelled the leg): nothing to answer
    ++cancels_total;
    co_return pd_reject(http::status::bad_request, PdError::RoomTimeout, "the client went away");
  }
  count_rejection(PdError::RoomTimeout);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  co_return pd_reject(http::status::internal_server_error, PdError::RoomTimeout,
                      fmt::format("Prefill bootstrap failed for request bootstrap_room={0} with exception "
                                  "KVTransferError(bootstrap_room={0}): Request {0} timed out after {1:.1f}s in "
                                  "KVPoll.Bootstrapping",
                                  gen.room, s));
}

// A prefill leg that met its decode leg and then ended without handing its
// blocks over (refused at admission, or its client left during the prefill):
// the room closes now, and its decode leg, waiting for the KV, fails at once
// (SGLang: the prefill's KVSender fails, the decode's KVReceiver polls Failed).
void MockerServer::Impl::sgl_close_room(uint64_t id) {
  auto it = rooms.find(id);
  if (it == rooms.end()) return;
  std::shared_ptr<Room> room = it->second;
  room->failed = true;
  room->decode_wake.cancel();
  rooms.erase(it);
}

// Prefill leg after its prefill: the room's decode leg takes the held blocks;
// they are released either way.
awaitable<std::optional<MockerServer::Impl::Reject>> MockerServer::Impl::sgl_hand_over(const GenParams& gen,
                                                                                       const Prepared& prep,
                                                                                       uint64_t id,
                                                                                       tcp::socket& client) {
  Engine& engine = *engines[static_cast<size_t>(prep.rank)];
  auto it = rooms.find(gen.room);
  std::shared_ptr<Room> room = it == rooms.end() ? nullptr : it->second;
  bool taken = false;
  if (room && engine.held(id)) {
    room->blocks = *engine.held(id);
    room->ready = true;
    room->decode_wake.cancel();
    auto gone = std::make_shared<bool>(false);
    wake_on_departure(client, gone, room);
    taken = co_await wait_for(room->prefill_wake, deadline_in(opts.pd.waiting_timeout_ms),
                              [&] { return room->taken || room->failed || *gone; }) &&
            room->taken;
    end_watch(client);
    if (!taken) {  // the decode leg will not get it now
      room->failed = true;
      room->decode_wake.cancel();
    }
    erase_room(rooms, gen.room, room);
  }
  engine.release_held(id);
  schedule();
  if (taken) {
    ++pd.rooms_completed;
    ++pd.prefill_legs;
    co_return std::nullopt;
  }
  count_rejection(PdError::RoomTimeout);
  co_return pd_reject(http::status::internal_server_error, PdError::RoomTimeout,
                      fmt::format("Prefill transfer failed for request bootstrap_room={0} with exception "
                                  "KVTransferError(bootstrap_room={0}): the decode instance did not take the KV cache",
                                  gen.room));
}

// The bootstrap server's side of a decode leg (this emulation's stand-in for
// the decode's metadata message and the transfer): waits for the room's
// prefill, then takes its blocks.
awaitable<std::pair<http::status, std::string>> MockerServer::Impl::sgl_room_request(std::string_view body) {
  uint64_t id = 0, wait_ms = 0;
  auto doc = pd_parser().parse(body.data(), body.size(), true);
  if (doc["room"].get_uint64().get(id) || doc["wait_ms"].get_uint64().get(wait_ms))
    co_return std::pair{http::status::bad_request, side_error(PdError::Malformed, R"(body must be {"room": N, "wait_ms": N})")};
  auto room = room_for(id);
  if (!room) {
    ++pd.side_channel_rejected[pd_error_name(PdError::RoomsFull)];
    co_return std::pair{http::status::service_unavailable, side_error(PdError::RoomsFull, "too many rooms waiting")};
  }
  if (room->decode_arrived) {
    ++pd.side_channel_rejected[pd_error_name(PdError::DuplicateRoom)];
    co_return std::pair{http::status::conflict,
                        side_error(PdError::DuplicateRoom, fmt::format("room {} has a decode request already", id))};
  }
  room->decode_arrived = true;
  room->prefill_wake.cancel();
  const double cap = std::min<double>(double(wait_ms), opts.pd.waiting_timeout_ms);
  const bool ready = co_await wait_for(room->decode_wake, deadline_in(cap), [&] { return room->ready || room->failed; });
  if (ready && room->ready && !room->failed) {
    room->taken = true;
    room->prefill_wake.cancel();
    ++pd.transfers_served;
    co_return std::pair{http::status::ok, fmt::format(R"({{"blocks":[{}]}})", join_hashes(room->blocks))};
  }
  room->failed = true;
  room->prefill_wake.cancel();
  if (!room->prefill_arrived) erase_room(rooms, id, room);
  ++pd.side_channel_rejected[pd_error_name(PdError::RoomTimeout)];
  co_return std::pair{http::status::gateway_timeout,
                      side_error(PdError::RoomTimeout, fmt::format("no prefill for room {} in time", id))};
}

// Decode leg: SGLang's decode registers with the prefill's bootstrap server
// and waits in KVPoll.WaitingForInput for the KV, failing after the waiting
// timeout with HTTP 500 (disaggregation/decode.py pop_transferred():
// prepare_abort(..., status_code=INTERNAL_SERVER_ERROR)).
awaitable<std::optional<MockerServer::Impl::Reject>> MockerServer::Impl::sgl_take(const GenParams& gen,
                                                                                  Prepared& prep) {
  Engine& engine = *engines[static_cast<size_t>(prep.rank)];
  const std::vector<SequenceHash> blocks = engine.prompt_blocks(prep.tokens, prep.ns);
  const auto t0 = std::chrono::steady_clock::now();
  auto fail = [&](PdError e, std::string why) -> std::optional<Reject> {
    count_rejection(e);
    return pd_reject(http::status::internal_server_error, e,
                     fmt::format("Decode transfer failed for request bootstrap_room={0} with exception "
                                 "KVTransferError(bootstrap_room={0}): {1}",
                                 gen.room, why));
  };
  std::string body = fmt::format(R"({{"room":{},"wait_ms":{}}})", gen.room,
                                 static_cast<uint64_t>(opts.pd.waiting_timeout_ms));
  const PeerReply reply =
      co_await peer_post(gen.bootstrap_host, gen.bootstrap_port, "/mocker/sglang/room", std::move(body),
                         std::chrono::milliseconds(static_cast<int64_t>(opts.pd.waiting_timeout_ms) + 10000));
  if (reply.status == 0)
    co_return fail(PdError::Unreachable, "Failed to get kvcache from prefill instance, it might be dead");
  if (reply.status == 504) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    co_return fail(PdError::RoomTimeout,
                   fmt::format("Request {} timed out after {:.1f}s in KVPoll.WaitingForInput", gen.room, s));
  }
  if (reply.status != 200) {
    const PdError e = read_error_code(reply.body);
    co_return fail(e, fmt::format("the prefill instance refused the room ({})", pd_error_name(e)));
  }
  std::vector<SequenceHash> got;
  if (!read_blocks(reply.body, got) || got != blocks)
    co_return fail(PdError::PromptMismatch, "the KV cache received is not this prompt's");
  // Pages this worker caches already are not sent (send_metadata's decode_prefix_len, common/conn.py).
  const uint32_t local = engine.cached_prefix(blocks);
  co_await transfer_blocks(blocks.size(), local, prep);
  ++pd.rooms_completed;
  co_return std::nullopt;
}

}  // namespace kvroute::mocker
