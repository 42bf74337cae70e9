// A client connection's life (session.h): read a request within the limits,
// admit its body or refuse it, dispatch it, answer, keep alive or close.
#include "router/http/session.h"

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>

#include "common/log.h"
#include "router/api/api_routes.h"
#include "router/http/local_routes.h"
#include "router/http/proxy.h"

namespace kvroute {

void ClientConn::idle() {
  upstream_buffer.clear();
  if (upstream_buffer.capacity() > ServerState::kKeptCapacity) upstream_buffer.shrink_to_fit();
  if (chat_body.capacity() > ServerState::kKeptCapacity) chat_body = std::string();
  if (parsed.prompt_text.capacity() > ServerState::kKeptCapacity ||
      parsed.prompt_tokens.capacity() * sizeof(TokenId) > ServerState::kKeptCapacity ||
      parsed.engine_tokens.capacity() * sizeof(TokenId) > ServerState::kKeptCapacity)
    parsed = ParsedRequest();
  else
    parsed.reset();
  if (route.block_hashes.capacity() * sizeof(LocalBlockHash) > ServerState::kKeptCapacity ||
      route.chain.capacity() * sizeof(uint64_t) > ServerState::kKeptCapacity)
    route = RouteResult();
  else route.reset();
}

void ClientConn::on_sweep(Steady::time_point) {
  if (!between || served == 0) return;
  beast::error_code ignored;
  socket.cancel(ignored);
}

namespace {

// What a request's header says decides, before its body is read, whether the
// body may be read at all: over router.max_concurrent_requests (an OpenAI
// route) or with no room left under router.max_body_bytes_in_flight, the
// request is refused with 503 and its body never read.
std::optional<ApiError> admit_body(ServerState& s, const ClientRequest& req, const ClientRequestParser& parser,
                                   bool admin, const Config& cfg, BodyLease& lease) {
  if (admin) return std::nullopt;
  RouterMetrics* m = s.hooks.metrics;
  if (proxied_api(req) && s.inflight.load() >= static_cast<int64_t>(cfg.router.max_concurrent_requests)) {
    if (m) m->rejected_total.with({"limit"}).inc();
    return ApiError{503, "Too many concurrent requests; retry later.", "service_unavailable", "", "too_many_requests"};
  }
  const auto length = parser.content_length();
  if (!length || lease.grow(*length)) return std::nullopt;  // a chunked body is leased as it arrives
  if (m) m->rejected_total.with({"body_budget"}).inc();
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("router.max_body_bytes_in_flight ({} bytes) reached: a request of {} body bytes refused",
                 cfg.router.max_body_bytes_in_flight, *length);
  return ApiError{503, "Too many request bodies are being received; retry later.", "service_unavailable", "",
                  "body_budget_exhausted"};
}

// The admission check the parser runs once a request's header is in.
struct Admission final : HeaderCheck {
  Admission(ServerState& st, bool a, const Config& c, BodyLease& l) : s(st), admin(a), cfg(c), lease(l) {}
  bool admit(const ClientRequest& r, const ClientRequestParser& p) override {
    refusal = admit_body(s, r, p, admin, cfg, lease);
    return !refusal;
  }
  ServerState& s;
  const bool admin;
  const Config& cfg;
  BodyLease& lease;
  std::optional<ApiError> refusal;
};

// Closes after an answer while the client may still be sending: what it sends
// is read and dropped for a moment (at most 4 MiB, 500 ms), so that closing
// with unread data (a reset) does not destroy the answer.
awaitable<void> close_lingering(ClientConn& client) {
  beast::error_code ec;
  client.socket.shutdown(Socket::shutdown_send, ec);
  std::array<char, 4096> sink;
  size_t drained = 0;
  client.expires_after(milliseconds(500));
  while (drained < (4u << 20)) {
    const size_t n = co_await client.socket.async_read_some(asio::buffer(sink), nothrow(ec));
    if (ec) break;
    drained += n;
  }
  client.deadline.settle(ec);
}

// The route whose error shape a refusal before the proxy takes (the OpenAI
// shape for any other path).
ApiKind error_shape(const ClientRequest& req) { return proxied_api(req).value_or(ApiKind::ChatCompletions); }

// A request that could not be read: what a client can act on (413, 431, 400;
// a closed or timed-out connection gets nothing).
std::optional<ApiError> read_error(ServerState& s, beast::error_code ec, const Config& cfg, bool admin,
                                   const ClientRequest& req) {
  if (ec == http::error::body_limit)
    return ApiError{413,
                    fmt::format("Request body exceeds {} bytes ({}).",
                                admin ? cfg.admin.max_body_bytes : cfg.router.max_body_bytes,
                                admin ? "admin.max_body_bytes" : "router.max_body_bytes"),
                    "invalid_request_error", "", "request_too_large"};
  if (ec == asio::error::no_buffer_space) {  // a chunked body over router.max_body_bytes_in_flight
    if (s.hooks.metrics) s.hooks.metrics->rejected_total.with({"body_budget"}).inc();
    return ApiError{503, "Too many request bodies are being received; retry later.", "service_unavailable", "",
                    "body_budget_exhausted"};
  }
  if (ec == http::error::bad_transfer_encoding && !req.transfer_coding.empty())
    return ApiError{400,
                    fmt::format("Transfer-Encoding '{}' is not supported: the final transfer coding of a request "
                                "must be chunked (RFC 9112 6.3).",
                                req.transfer_coding),
                    "invalid_request_error", "", "bad_transfer_encoding"};
  if (ec == http::error::header_limit)
    return ApiError{431, fmt::format("Request headers exceed {} bytes.", cfg.router.max_header_bytes),
                    "invalid_request_error", "", "request_header_too_large"};
  if (ec.category() == http::make_error_code(http::error::body_limit).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message)
    return ApiError{400, fmt::format("Malformed HTTP request: {}.", ec.message()), "invalid_request_error", "", ""};
  return std::nullopt;
}

// Answers a request that could not be read (read_error()), then closes
// lingering (close_lingering()).
awaitable<void> answer_read_error(ServerState& s, ClientConn& client, beast::error_code ec, const Config& cfg,
                                  bool admin, const ClientRequest& req) {
  const std::optional<ApiError> e = read_error(s, ec, cfg, admin, req);
  if (!e) co_return;
  s.count("other", e->status, "");
  co_await respond_error(s, client, 11, false, *e, error_shape(req));
  co_await close_lingering(client);
}

// Reads the connection's requests one after another and dispatches each: the
// OpenAI routes to the proxy, the admin listener's to the admin API, the rest
// to kvroute's own answers. Limits are checked once a header is in, before a
// byte of its body is read (Admission, from the parser's on_header_impl()).
awaitable<void> serve_requests(ServerState& s, ClientConn& stream, bool admin, IoThread& io) {
  beast::flat_buffer buffer;
  ClientRequest req;
  for (;;) {
    // Draining: a kept-alive connection closes instead of waiting for the
    // next request (its last response said Connection: close).
    if (stream.served > 0 && s.draining.load() && buffer.size() == 0) break;
    const auto cfg = s.hooks.config->get();
    // The body's bytes count against router.max_body_bytes_in_flight until
    // the request is done (admin bodies have their own limit instead).
    BodyLease lease(s.body_bytes, cfg->router.max_body_bytes_in_flight);
    Admission admission(s, admin, *cfg, lease);
    ClientRequestParser parser(req, &admission);
    const uint64_t body_limit = admin ? cfg->admin.max_body_bytes : cfg->router.max_body_bytes;
    parser.header_limit(cfg->router.max_header_bytes);
    parser.body_limit(body_limit);
    if (!admin) parser.lease_chunks(&lease, body_limit);
    stream.expires_after(milliseconds(cfg->router.client_read_timeout_ms));
    beast::error_code ec;
    stream.between = buffer.size() == 0;
    co_await read_http(stream.socket, buffer, parser, ReadUntil::Message, ec, &stream.between, &req.expect_continue);
    stream.between = false;
    if (admission.refusal) {
      stream.deadline.disarm();
      s.count(route_label(req.target), admission.refusal->status, "");
      co_await respond_error(s, stream, req.version, false, *admission.refusal, error_shape(req));
      co_await close_lingering(stream);
      break;
    }
    stream.deadline.settle(ec);
    if (ec) {
      co_await answer_read_error(s, stream, ec, *cfg, admin, req);
      break;
    }
    req.keep_alive = parser.keep_alive();
    ++stream.served;
    if (req.version >= 11 && !req.has_host) {  // RFC 9112 3.2: 400 for an HTTP/1.1 request without Host
      s.count("other", 400, "");
      const ApiError e{400, "An HTTP/1.1 request needs a Host header.", "invalid_request_error", "", ""};
      co_await respond_error(s, stream, req.version, false, e);
      break;
    }
    // The OpenAI routes go straight to proxy() (one coroutine frame fewer per request).
    bool keep;
    if (admin) keep = co_await handle_admin(s, stream, req, io);
    else if (const auto api = proxied_api(req)) keep = co_await proxy(s, stream, req, *api, io);
    else keep = co_await handle_local(s, stream, req);
    if (!keep) break;
    if (req.body.capacity() > ServerState::kKeptCapacity) req.body = std::string();
    stream.idle();
  }
}

}  // namespace

// A connection's place under its listener's connection limit, taken by the
// accept loop and given back when the session ends. (Not a local class: the
// session's coroutine frame holds it.)
struct ConnectionPlace {
  std::atomic<int64_t>* n;
  ~ConnectionPlace() {
    if (n) n->fetch_sub(1, std::memory_order_relaxed);
  }
};

awaitable<void> session(ServerState& s, Socket socket, bool admin, IoThread& io) {
  ConnectionPlace place{admin ? &s.admin_connections : &s.connections};
  ClientConn stream(std::move(socket), io);
  try {
    co_await serve_requests(s, stream, admin, io);
  } catch (const std::exception& e) {
    spdlog::error("connection aborted by an internal error: {}", e.what());
  }
  beast::error_code ignored;
  stream.socket.shutdown(Socket::shutdown_send, ignored);
}

awaitable<bool> respond(ServerState& s, ClientConn& client, unsigned version, bool keep_alive, http::status status,
                        std::string body, std::string_view content_type, std::optional<unsigned> retry_after) {
  http::response<http::string_body> res{status, version};
  res.set(http::field::server, "kvroute");
  res.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
  if (retry_after) res.set(http::field::retry_after, std::to_string(*retry_after));
  res.keep_alive(keep_alive && !s.draining.load());
  res.body() = std::move(body);
  res.prepare_payload();
  beast::error_code ec;
  client.expires_after(milliseconds(s.hooks.config->get()->router.idle_timeout_ms));
  co_await http::async_write(client.socket, res, nothrow(ec));
  client.deadline.settle(ec);
  co_return !ec && res.keep_alive();
}

awaitable<bool> respond_error(ServerState& s, ClientConn& client, unsigned version, bool keep_alive,
                              const ApiError& e, ApiKind api, std::optional<unsigned> retry_after) {
  if (!retry_after && e.status == 503) retry_after = 1;
  std::string body = api_error_body(api, e);
  co_return co_await respond(s, client, version, keep_alive, static_cast<http::status>(e.status), std::move(body),
                             "application/json", retry_after);
}

}  // namespace kvroute
