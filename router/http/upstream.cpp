// The worker side (upstream.h): the pool's take/give, connecting, and the
// engine's POST /tokenize round trip.
#include "router/http/upstream.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/write.hpp>

#include <array>
#include <charconv>

#include "router/http/io_thread.h"
#include "router/http/wire.h"

namespace kvroute {

std::optional<Socket> UpstreamPool::take(std::string_view key) {
  auto it = idle_.find(key);
  const auto now = Steady::now();
  while (it != idle_.end() && !it->second.empty()) {
    Idle c = std::move(it->second.back());
    it->second.pop_back();
    // An idle connection the worker closed reads as EOF.
    if (now - c.since < kCheckAfter || !peer_closed(c.socket)) return std::move(c.socket);
    boost::system::error_code ec;
    c.socket.close(ec);
  }
  return std::nullopt;
}

void UpstreamPool::give(std::string_view key, Socket s, size_t limit) {
  auto it = idle_.find(key);
  if (it == idle_.end()) it = idle_.emplace(std::string(key), std::vector<Idle>()).first;
  auto& v = it->second;
  if (v.size() >= limit) return;  // `s` closes here
  v.push_back(Idle{std::move(s), Steady::now()});
}

awaitable<void> connect_to(Socket& socket, const UpstreamUrl& url, boost::system::error_code& ec) {
  ec = {};
  boost::system::error_code addr_ec;
  const auto addr = asio::ip::make_address(url.host, addr_ec);
  if (!addr_ec) {
    uint16_t port = 0;
    std::from_chars(url.port.data(), url.port.data() + url.port.size(), port);
    const tcp::endpoint endpoint(addr, port);
    co_await socket.async_connect(endpoint, nothrow(ec));
  } else {
    Resolver resolver(socket.get_executor());
    auto results = co_await resolver.async_resolve(url.host, url.port, nothrow(ec));
    if (!ec) co_await asio::async_connect(socket, results, nothrow(ec));
  }
  if (ec) co_return;
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
}

awaitable<EngineTokenizeResult> fetch_engine_tokens(IoThread& io, const Config& cfg, std::string_view url_text,
                                                    std::string_view body, std::string_view authorization,
                                                    Steady::time_point deadline, std::vector<TokenId>& out) {
  UpstreamUrl url;
  if (!parse_url(url_text, url)) co_return EngineTokenizeResult::Connect;
  const bool keep = cfg.router.upstream_pool_size > 0;
  const std::string head = tokenize_request_head(url, authorization, keep, body.size());
  const uint64_t max_bytes = engine_tokenize_max_bytes(cfg.tokenizer.remote_max_tokens);

  // A pooled connection the worker closed meanwhile fails before the answer:
  // one more try on a fresh connection.
  for (int fresh = 0; fresh < 2; ++fresh) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Steady::now());
    if (left.count() <= 0) co_return EngineTokenizeResult::Timeout;
    std::optional<Socket> socket;
    if (fresh == 0) socket = io.pool.take(url_text);
    const bool pooled = socket.has_value();
    Deadline timer(io.sweeper);  // after `socket`: destroyed first
    boost::system::error_code ec;
    if (!socket) {
      socket.emplace(io.ioc.get_executor());
      timer.arm(*socket, left);
      co_await connect_to(*socket, url, ec);
      timer.settle(ec);
      if (ec) co_return ec == asio::error::timed_out ? EngineTokenizeResult::Timeout : EngineTokenizeResult::Connect;
    }
    timer.arm(*socket, std::chrono::duration_cast<milliseconds>(deadline - Steady::now()));
    const std::array<asio::const_buffer, 2> wire{asio::buffer(head), asio::buffer(body.data(), body.size())};
    co_await asio::async_write(*socket, wire, nothrow(ec));
    beast::flat_buffer buffer;
    WholeResponseParser parser;
    parser.header_limit(16 * 1024);
    parser.body_limit(max_bytes);
    if (!ec) co_await read_http(*socket, buffer, parser, ReadUntil::Message, ec);
    timer.settle(ec);
    if (ec == asio::error::timed_out) co_return EngineTokenizeResult::Timeout;
    if (ec == http::error::body_limit) co_return EngineTokenizeResult::TooLarge;
    if (ec && pooled) continue;
    if (ec) co_return EngineTokenizeResult::Connect;
    const bool reusable = keep && parser.keep_alive() && buffer.size() == 0;
    const unsigned status = parser.status();
    const EngineTokenizeResult result =
        status == 200       ? parse_engine_tokenize_response(parser.body(), cfg.tokenizer.remote_max_tokens, out)
        : status / 100 == 4 ? EngineTokenizeResult::Rejected
                            : EngineTokenizeResult::Status;
    if (reusable) io.pool.give(url_text, std::move(*socket), cfg.router.upstream_pool_size);
    co_return result;
  }
  co_return EngineTokenizeResult::Connect;
}

}  // namespace kvroute
