// Beast HTTP server and streaming proxy. The only translation unit of the
// router that instantiates Beast templates (keeps builds fast).
//
// Structure (after Beast's examples, written as C++20 coroutines: each
// `co_await` is one do_x()/on_x() step of the callback style):
//   accept_loop()  - listener: one coroutine per accepted connection
//   session()      - reads requests (bounded header/body), dispatches, keeps alive
//   proxy()        - routes, connects to the chosen worker, relays the response
//                    piece by piece as it arrives (Beast's relay() pattern)
#include "router/http_server.h"

#include <utility>  // Boost 1.74 awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <charconv>
#include <optional>
#include <thread>

#include "common/json_escape.h"
#include "router/openai_request.h"

namespace kvroute {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using std::chrono::milliseconds;

namespace {

constexpr uint32_t kHeaderLimit = 16 * 1024;  // request header bytes; beyond: 431
constexpr size_t kRelayBufferBytes = 16 * 1024;

auto nothrow(beast::error_code& ec) { return asio::redirect_error(use_awaitable, ec); }

// "http://host:port[/base]" -> parts. Returns false for anything else.
struct UpstreamUrl {
  std::string host;
  std::string port = "80";
  std::string base;  // path prefix without trailing '/'
};
bool parse_url(std::string_view url, UpstreamUrl& out) {
  constexpr std::string_view scheme = "http://";
  if (url.substr(0, scheme.size()) != scheme) return false;
  url.remove_prefix(scheme.size());
  auto slash = url.find('/');
  std::string_view hostport = url.substr(0, slash);
  out.base = slash == std::string_view::npos ? "" : std::string(url.substr(slash));
  while (!out.base.empty() && out.base.back() == '/') out.base.pop_back();
  auto colon = hostport.rfind(':');
  if (colon != std::string_view::npos && hostport.find(']') == std::string_view::npos) {
    out.host = std::string(hostport.substr(0, colon));
    out.port = std::string(hostport.substr(colon + 1));
  } else {
    out.host = std::string(hostport);
  }
  return !out.host.empty();
}

bool is_hop_by_hop(http::field f) {
  switch (f) {
    case http::field::connection:
    case http::field::keep_alive:
    case http::field::proxy_authenticate:
    case http::field::proxy_authorization:
    case http::field::te:
    case http::field::trailer:
    case http::field::transfer_encoding:
    case http::field::upgrade:
    case http::field::host:
    case http::field::content_length:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct HttpServer::Impl {
  explicit Impl(HttpServerHooks h) : hooks(std::move(h)), acceptor(ioc) {}

  HttpServerHooks hooks;
  asio::io_context ioc;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false};

  awaitable<void> accept_loop();
  awaitable<void> session(tcp::socket socket);
  awaitable<bool> handle(beast::tcp_stream& client, http::request<http::string_body>& req);
  awaitable<bool> proxy(beast::tcp_stream& client, http::request<http::string_body>& req, ApiKind kind);
  awaitable<bool> respond(beast::tcp_stream& client, unsigned version, bool keep_alive, http::status status,
                          std::string body, std::string_view content_type = "application/json",
                          std::optional<unsigned> retry_after = std::nullopt);
  awaitable<bool> respond_error(beast::tcp_stream& client, unsigned version, bool keep_alive, const ApiError& e);
};

awaitable<void> HttpServer::Impl::accept_loop() {
  for (;;) {
    beast::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(asio::make_strand(ioc), nothrow(ec));
    if (ec) {
      if (stopping.load() || ec == asio::error::operation_aborted) co_return;
      spdlog::warn("accept failed: {}", ec.message());
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    auto ex = socket.get_executor();
    asio::co_spawn(ex, session(std::move(socket)), asio::detached);
  }
}

awaitable<void> HttpServer::Impl::session(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  try {
    for (;;) {
      const auto cfg = hooks.config->get();
      http::request_parser<http::string_body> parser;
      parser.header_limit(kHeaderLimit);
      parser.body_limit(cfg->router.max_body_bytes);
      stream.expires_after(milliseconds(cfg->router.client_read_timeout_ms));
      beast::error_code ec;
      co_await http::async_read(stream, buffer, parser, nothrow(ec));
      if (ec) {
        // Answer what a client can act on; a closed or timed-out connection gets nothing.
        if (ec == http::error::body_limit) {
          co_await respond_error(stream, 11, false,
                                 ApiError{413, fmt::format("Request body exceeds {} bytes.", cfg->router.max_body_bytes),
                                          "invalid_request_error", "", "request_too_large"});
        } else if (ec == http::error::header_limit) {
          co_await respond_error(stream, 11, false,
                                 ApiError{431, "Request headers too large.", "invalid_request_error", "", ""});
        } else if (ec.category() == http::make_error_code(http::error::body_limit).category() && ec != http::error::end_of_stream &&
                   ec != http::error::partial_message) {
          co_await respond_error(stream, 11, false,
                                 ApiError{400, fmt::format("Malformed HTTP request: {}.", ec.message()),
                                          "invalid_request_error", "", ""});
        }
        break;
      }
      auto req = parser.release();
      if (!co_await handle(stream, req)) break;
    }
  } catch (const std::exception& e) {
    spdlog::error("connection aborted by an internal error: {}", e.what());
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

awaitable<bool> HttpServer::Impl::respond(beast::tcp_stream& client, unsigned version, bool keep_alive,
                                          http::status status, std::string body, std::string_view content_type,
                                          std::optional<unsigned> retry_after) {
  http::response<http::string_body> res{status, version};
  res.set(http::field::server, "kvroute");
  res.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
  if (retry_after) res.set(http::field::retry_after, std::to_string(*retry_after));
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  beast::error_code ec;
  client.expires_after(milliseconds(hooks.config->get()->router.idle_timeout_ms));
  co_await http::async_write(client, res, nothrow(ec));
  co_return !ec && keep_alive;
}

awaitable<bool> HttpServer::Impl::respond_error(beast::tcp_stream& client, unsigned version, bool keep_alive,
                                                const ApiError& e) {
  std::optional<unsigned> retry_after;
  if (e.status == 503) retry_after = 1;
  co_return co_await respond(client, version, keep_alive, static_cast<http::status>(e.status), error_body(e),
                             "application/json", retry_after);
}

awaitable<bool> HttpServer::Impl::handle(beast::tcp_stream& client, http::request<http::string_body>& req) {
  std::string_view target(req.target().data(), req.target().size());
  target = target.substr(0, target.find('?'));
  const bool keep = req.keep_alive();
  const unsigned v = req.version();
  const bool get = req.method() == http::verb::get;
  const bool post = req.method() == http::verb::post;

  if (target == "/v1/chat/completions" && post) co_return co_await proxy(client, req, ApiKind::ChatCompletions);
  if (target == "/v1/completions" && post) co_return co_await proxy(client, req, ApiKind::Completions);
  if (target == "/health" && get) co_return co_await respond(client, v, keep, http::status::ok, R"({"status":"ok"})");
  if (target == "/ready" && get) {
    const bool ready = hooks.ready && hooks.ready();
    co_return co_await respond(client, v, keep, ready ? http::status::ok : http::status::service_unavailable,
                               ready ? R"({"status":"ready"})" : R"({"status":"not_ready"})");
  }
  if (target == "/metrics" && get && hooks.metrics)
    co_return co_await respond(client, v, keep, http::status::ok, hooks.metrics(),
                               "text/plain; version=0.0.4; charset=utf-8");
  if (target == "/v1/models" && get) {
    std::string body = R"({"object":"list","data":[)";
    bool first = true;
    for (const auto& m : hooks.registry->models()) {
      body += fmt::format(R"({}{{"id":"{}","object":"model","created":0,"owned_by":"kvroute"}})", first ? "" : ",",
                          json_escape(m));
      first = false;
    }
    body += "]}";
    co_return co_await respond(client, v, keep, http::status::ok, std::move(body));
  }
  const bool known = target == "/v1/chat/completions" || target == "/v1/completions" || target == "/health" ||
                     target == "/ready" || target == "/v1/models" || target == "/metrics";
  if (known)
    co_return co_await respond_error(client, v, keep,
                                     ApiError{405, fmt::format("Method {} not allowed on {}.",
                                                               std::string(req.method_string()), target),
                                              "invalid_request_error", "", "method_not_allowed"});
  co_return co_await respond_error(
      client, v, keep, ApiError{404, fmt::format("Unknown path {}.", target), "invalid_request_error", "", "not_found"});
}

awaitable<bool> HttpServer::Impl::proxy(beast::tcp_stream& client, http::request<http::string_body>& req,
                                        ApiKind kind) {
  const bool keep = req.keep_alive();
  const unsigned v = req.version();
  ParsedRequest parsed;
  ApiError err;
  if (!parse_openai_request(kind, req.body(), parsed, err)) co_return co_await respond_error(client, v, keep, err);

  RouteResult route = hooks.routing->route(parsed);
  if (!route.ok) co_return co_await respond_error(client, v, keep, route.error);

  const auto cfg = hooks.config->get();
  const size_t attempts = std::min<size_t>(cfg->router.max_attempts, route.ranked.size());
  auto ex = co_await asio::this_coro::executor;

  for (size_t attempt = 0; attempt < attempts; ++attempt) {
    const RouteTarget& target = route.ranked[attempt];
    UpstreamUrl url;
    if (!parse_url(target.url, url)) {
      spdlog::warn("worker {} has an unusable url '{}'", target.worker.value, target.url);
      continue;
    }
    InflightGuard inflight(*hooks.registry, target.worker, route.request_blocks);

    // Connect (numeric addresses skip the resolver).
    beast::tcp_stream upstream(ex);
    beast::error_code ec;
    upstream.expires_after(milliseconds(cfg->router.connect_timeout_ms));
    beast::error_code addr_ec;
    auto addr = asio::ip::make_address(url.host, addr_ec);
    uint16_t port = 0;
    std::from_chars(url.port.data(), url.port.data() + url.port.size(), port);
    if (!addr_ec) {
      co_await upstream.async_connect(tcp::endpoint(addr, port), nothrow(ec));
    } else {
      tcp::resolver resolver(ex);
      auto results = co_await resolver.async_resolve(url.host, url.port, nothrow(ec));
      if (!ec) co_await upstream.async_connect(results, nothrow(ec));
    }
    if (ec) {
      spdlog::warn("worker {} ({}): connect failed: {}; trying the next worker", target.worker.value, target.url,
                   ec.message());
      continue;
    }
    upstream.socket().set_option(tcp::no_delay(true), ec);

    // Forward the request unchanged but for hop-by-hop headers.
    http::request<http::string_body> up_req{req.method(), url.base + std::string(req.target()), 11};
    for (const auto& f : req)
      if (!is_hop_by_hop(f.name())) up_req.insert(f.name_string(), f.value());
    up_req.set(http::field::host, url.host + ":" + url.port);
    up_req.body() = req.body();
    up_req.keep_alive(false);
    up_req.prepare_payload();
    upstream.expires_after(milliseconds(cfg->router.first_byte_timeout_ms));
    co_await http::async_write(upstream, up_req, nothrow(ec));
    beast::flat_buffer up_buf;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (!ec) co_await http::async_read_header(upstream, up_buf, parser, nothrow(ec));
    if (ec) {
      spdlog::warn("worker {} ({}): failed before the first response byte: {}; trying the next worker",
                   target.worker.value, target.url, ec.message());
      continue;
    }

    // Committed to this worker: relay the response as it arrives.
    auto& res = parser.get();
    res.set("x-kvroute-worker", std::to_string(target.worker.value));
    res.set("x-kvroute-cached-tokens", std::to_string(target.cached_tokens));
    res.keep_alive(keep);
    if (!res.has_content_length() && !res.chunked()) res.chunked(true);
    const bool sse = res[http::field::content_type].starts_with("text/event-stream");
    http::serializer<false, http::buffer_body> sr{res};
    client.expires_after(milliseconds(cfg->router.idle_timeout_ms));
    co_await http::async_write_header(client, sr, nothrow(ec));
    if (ec) co_return false;

    char buf[kRelayBufferBytes];
    std::string tail;  // error event appended when the worker fails mid-stream
    do {
      if (!parser.is_done()) {
        res.body().data = buf;
        res.body().size = sizeof buf;
        upstream.expires_after(milliseconds(cfg->router.idle_timeout_ms));
        co_await http::async_read_some(upstream, up_buf, parser, nothrow(ec));
        if (ec == http::error::need_buffer) ec = {};
        if (ec) {
          spdlog::warn("worker {} ({}): failed mid-response: {}", target.worker.value, target.url, ec.message());
          if (!sse || !res.chunked()) co_return false;  // cannot signal inside a sized body: close
          tail = fmt::format("data: {}\n\ndata: [DONE]\n\n",
                             error_body(ApiError{502, "The worker failed while streaming the response.",
                                                 "upstream_error", "", "upstream_failed"}));
          res.body().data = tail.data();
          res.body().size = tail.size();
          res.body().more = false;
          client.expires_after(milliseconds(cfg->router.idle_timeout_ms));
          co_await http::async_write(client, sr, nothrow(ec));
          co_return false;
        }
        res.body().size = sizeof buf - res.body().size;
        res.body().data = buf;
        res.body().more = !parser.is_done();
      } else {
        res.body().data = nullptr;
        res.body().size = 0;
        res.body().more = false;
      }
      client.expires_after(milliseconds(cfg->router.idle_timeout_ms));
      co_await http::async_write(client, sr, nothrow(ec));
      if (ec == http::error::need_buffer) ec = {};
      if (ec) co_return false;  // client gone: the upstream stream closes with this frame
    } while (!parser.is_done() || !sr.is_done());
    co_return keep;
  }
  co_return co_await respond_error(client, v, keep,
                                   ApiError{503, "No worker could be reached for this request.",
                                            "service_unavailable", "", "upstream_unavailable"});
}

HttpServer::HttpServer(HttpServerHooks hooks) : impl_(std::make_unique<Impl>(std::move(hooks))) {}

HttpServer::~HttpServer() { stop(); }

bool HttpServer::listen(const std::string& host, uint16_t port, std::string* error) {
  beast::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (ec) {
    if (error) *error = fmt::format("router.host: '{}' is not an IP address", host);
    return false;
  }
  tcp::endpoint ep(addr, port);
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    if (error) *error = fmt::format("cannot listen on {}:{}: {}", host, port, ec.message());
    return false;
  }
  return true;
}

uint16_t HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

void HttpServer::start(unsigned threads) {
  asio::co_spawn(impl_->ioc, impl_->accept_loop(), asio::detached);
  for (unsigned i = 0; i < std::max(1u, threads); ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
}

void HttpServer::stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  asio::post(impl_->ioc, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
  impl_->ioc.stop();
  for (auto& t : impl_->threads)
    if (t.joinable()) t.join();
}

}  // namespace kvroute
