// bench/proxy/floor_proxy: the floor of kvroute's proxy design on this machine.
//
// The same building blocks as router/http_server.cpp (one io_context per
// thread, C++20 coroutines on the concrete executor, Beast's parsers, per-thread
// pools of keep-alive upstream connections, hand-written heads, one gather
// write each way) and nothing else: no routing, no JSON, no metrics, no
// timeouts, no failover, workers taken round-robin. bench/proxy.sh runs it
// next to kvroute and nginx (FLOOR=1) so that kvroute's own per-request work
// shows as the difference between the two. Not a product: error handling is
// "close the connection".
//
// Usage: kvroute-floor-proxy PORT THREADS WORKER_PORT...
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Executor = asio::io_context::executor_type;
template <class T>
using awaitable = asio::awaitable<T, Executor>;
constexpr asio::use_awaitable_t<Executor> use_awaitable;
using Socket = asio::basic_stream_socket<tcp, Executor>;

std::vector<uint16_t> g_workers;

struct IoThread {
  asio::io_context ioc{1};
  std::vector<std::vector<Socket>> pool;  // idle connections per worker
  size_t next = 0;
  std::thread thread;
};

bool skipped(http::field f) {
  return f == http::field::content_length || f == http::field::host || f == http::field::connection ||
         f == http::field::transfer_encoding;
}

void append_fields(std::string& h, const http::fields& fields) {
  for (const auto& f : fields) {
    if (skipped(f.name())) continue;
    h.append(f.name_string().data(), f.name_string().size());
    h += ": ";
    h.append(f.value().data(), f.value().size());
    h += "\r\n";
  }
}

void append_uint(std::string& h, uint64_t v) {
  char b[20];
  h.append(b, std::to_chars(b, b + sizeof b, v).ptr);
}

awaitable<void> session(Socket client, IoThread& io) {
  beast::flat_buffer buffer;
  std::vector<char> body(16 * 1024);
  for (;;) {
    beast::error_code ec;
    http::request_parser<http::string_body> parser;
    co_await http::async_read(client, buffer, parser, asio::redirect_error(use_awaitable, ec));
    if (ec) co_return;
    const auto& req = parser.get();
    const size_t w = io.next++ % g_workers.size();
    std::optional<Socket> up;
    if (!io.pool[w].empty()) {
      up.emplace(std::move(io.pool[w].back()));
      io.pool[w].pop_back();
    } else {
      up.emplace(io.ioc);
      const tcp::endpoint worker(asio::ip::make_address("127.0.0.1"), g_workers[w]);
      co_await up->async_connect(worker, asio::redirect_error(use_awaitable, ec));
      if (ec) co_return;
      up->set_option(tcp::no_delay(true), ec);
    }
    std::string head(req.method_string().data(), req.method_string().size());
    head += ' ';
    head.append(req.target().data(), req.target().size());
    head += " HTTP/1.1\r\n";
    append_fields(head, req);
    head += "Host: 127.0.0.1\r\nContent-Length: ";
    append_uint(head, req.body().size());
    head += "\r\n\r\n";
    const std::array<asio::const_buffer, 2> request{asio::buffer(head), asio::buffer(req.body())};
    co_await asio::async_write(*up, request, asio::redirect_error(use_awaitable, ec));
    if (ec) co_return;
    beast::flat_buffer up_buffer;
    http::response_parser<http::buffer_body> rp;
    co_await http::async_read_header(*up, up_buffer, rp, asio::redirect_error(use_awaitable, ec));
    if (ec || !rp.content_length() || *rp.content_length() > body.size()) co_return;  // small sized answers only
    const size_t length = static_cast<size_t>(*rp.content_length());
    rp.get().body().data = body.data();
    rp.get().body().size = length;
    if (!rp.is_done()) co_await http::async_read(*up, up_buffer, rp, asio::redirect_error(use_awaitable, ec));
    if (ec && ec != http::error::need_buffer) co_return;
    std::string out = "HTTP/1.1 ";
    append_uint(out, rp.get().result_int());
    out += ' ';
    out.append(rp.get().reason().data(), rp.get().reason().size());
    out += "\r\n";
    append_fields(out, rp.get());
    out += "Content-Length: ";
    append_uint(out, length);
    out += "\r\n\r\n";
    const std::array<asio::const_buffer, 2> response{asio::buffer(out), asio::buffer(body.data(), length)};
    co_await asio::async_write(client, response, asio::redirect_error(use_awaitable, ec));
    if (ec) co_return;
    io.pool[w].push_back(std::move(*up));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: kvroute-floor-proxy PORT THREADS WORKER_PORT...\n");
    return 2;
  }
  const auto port = static_cast<uint16_t>(std::atoi(argv[1]));
  const int threads = std::max(1, std::atoi(argv[2]));
  for (int i = 3; i < argc; ++i) g_workers.push_back(static_cast<uint16_t>(std::atoi(argv[i])));
  std::vector<std::unique_ptr<IoThread>> io;
  for (int i = 0; i < threads; ++i) {
    io.push_back(std::make_unique<IoThread>());
    io.back()->pool.resize(g_workers.size());
  }
  asio::basic_socket_acceptor<tcp, Executor> acceptor(io[0]->ioc,
                                                       tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  asio::co_spawn(
      io[0]->ioc,
      [&]() -> awaitable<void> {
        for (size_t n = 0;; ++n) {
          IoThread& target = *io[n % io.size()];
          beast::error_code ec;
          Socket s = co_await acceptor.async_accept(target.ioc, asio::redirect_error(use_awaitable, ec));
          if (ec) continue;
          s.set_option(tcp::no_delay(true), ec);
          asio::co_spawn(target.ioc, session(std::move(s), target), asio::detached);
        }
      },
      asio::detached);
  std::vector<asio::executor_work_guard<Executor>> work;
  for (auto& t : io) work.push_back(asio::make_work_guard(t->ioc));
  for (auto& t : io) t->thread = std::thread([&ioc = t->ioc] { ioc.run(); });
  for (auto& t : io) t->thread.join();
}
