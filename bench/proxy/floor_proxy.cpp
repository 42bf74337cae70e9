// bench/proxy/floor_proxy: the floor of kvroute's proxy design on this machine.
//
// The same building blocks and the same socket calls per request as
// router/http/: one io_context per thread, C++20 coroutines on the
// concrete executor, Beast's basic_parser driven by one loop over the socket's
// async_read_some (kvroute's read_http), per-thread pools of keep-alive
// upstream connections, hand-written heads, one async_write_some (gather: head
// + body) each way. Per connection, every buffer (client and upstream read
// buffers, the request's fields and body, both heads, the answer's body) is
// kept and reused, so a request allocates nothing once a connection has
// warmed up: counted by the replaced global operator new and printed at exit
// (SIGTERM/SIGINT) as "allocations after warm-up per request". Nothing
// of kvroute's own: no routing, no JSON, no metrics, no timeouts, no
// failover, workers round-robin; sized non-streaming answers up to 64 KiB.
// bench/proxy.sh runs it next to kvroute and nginx so that kvroute's own
// per-request work shows as the difference. Not a product: any error closes
// the connection.
//
// Usage: kvroute-floor-proxy PORT THREADS WORKER_PORT...
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {
std::atomic<uint64_t> g_allocs{0};
std::atomic<uint64_t> g_requests{0};
std::atomic<uint64_t> g_allocs_at_warm{0}, g_requests_at_warm{0};
constexpr uint64_t kWarmRequests = 2000;  // connections and pools have grown by then
}  // namespace

void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

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
auto nothrow(beast::error_code& ec) { return asio::redirect_error(use_awaitable, ec); }

std::vector<uint16_t> g_workers;
constexpr size_t kBodyBytes = 64 * 1024;

struct IoThread {
  asio::io_context ioc{1};
  std::vector<std::vector<Socket>> pool;  // idle connections per worker
  size_t next = 0;
  std::thread thread;
};

bool hop_by_hop(http::field f) {
  return f == http::field::content_length || f == http::field::host || f == http::field::connection ||
         f == http::field::transfer_encoding || f == http::field::keep_alive;
}

void append_field(std::string& h, beast::string_view name, beast::string_view value) {
  h.append(name.data(), name.size());
  h += ": ";
  h.append(value.data(), value.size());
  h += "\r\n";
}

void append_uint(std::string& h, uint64_t v) {
  char b[20];
  h.append(b, std::to_chars(b, b + sizeof b, v).ptr);
}

// One connection's reused state.
struct Conn {
  beast::flat_buffer in, up_in;
  std::string method, target, fields, body, head, resp_fields, resp_reason;
  unsigned status = 0;
  std::vector<char> resp_body = std::vector<char>(kBodyBytes);
};

// Request parser into Conn's strings (kvroute's ClientRequestParser, minus
// what kvroute needs for routing).
class RequestParser final : public http::basic_parser<true> {
 public:
  explicit RequestParser(Conn& c) : c_(c) {
    c.method.clear();
    c.target.clear();
    c.fields.clear();
    c.body.clear();
  }

 private:
  void on_request_impl(http::verb, beast::string_view m, beast::string_view t, int, beast::error_code&) override {
    c_.method.assign(m.data(), m.size());
    c_.target.assign(t.data(), t.size());
  }
  void on_response_impl(int, beast::string_view, int, beast::error_code&) override {}
  void on_field_impl(http::field f, beast::string_view n, beast::string_view v, beast::error_code&) override {
    if (!hop_by_hop(f)) append_field(c_.fields, n, v);
  }
  void on_header_impl(beast::error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>& len, beast::error_code&) override {
    if (len) c_.body.reserve(static_cast<size_t>(*len));
  }
  size_t on_body_impl(beast::string_view s, beast::error_code&) override {
    c_.body.append(s.data(), s.size());
    return s.size();
  }
  void on_chunk_header_impl(std::uint64_t, beast::string_view, beast::error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code&) override {
    c_.body.append(s.data(), s.size());
    return s.size();
  }
  void on_finish_impl(beast::error_code&) override {}
  Conn& c_;
};

// Response parser: fields into Conn, the body straight into resp_body.
class ResponseParser final : public http::basic_parser<false> {
 public:
  explicit ResponseParser(Conn& c) : c_(c) { c.resp_fields.clear(); }
  size_t got = 0;

 private:
  void on_request_impl(http::verb, beast::string_view, beast::string_view, int, beast::error_code&) override {}
  void on_response_impl(int code, beast::string_view reason, int, beast::error_code&) override {
    c_.status = static_cast<unsigned>(code);
    c_.resp_reason.assign(reason.data(), reason.size());
  }
  void on_field_impl(http::field f, beast::string_view n, beast::string_view v, beast::error_code&) override {
    if (!hop_by_hop(f)) append_field(c_.resp_fields, n, v);
  }
  void on_header_impl(beast::error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>&, beast::error_code&) override {}
  size_t on_body_impl(beast::string_view s, beast::error_code& ec) override {
    const size_t n = std::min(s.size(), c_.resp_body.size() - got);
    std::memcpy(c_.resp_body.data() + got, s.data(), n);
    got += n;
    if (n < s.size()) ec = http::error::body_limit;
    return n;
  }
  void on_chunk_header_impl(std::uint64_t, beast::string_view, beast::error_code& ec) override {
    ec = http::error::bad_chunk;  // sized answers only
  }
  size_t on_chunk_body_impl(std::uint64_t, beast::string_view, beast::error_code& ec) override {
    ec = http::error::bad_chunk;
    return 0;
  }
  void on_finish_impl(beast::error_code&) override {}
  Conn& c_;
};

// One step of kvroute's read_http() loop: feeds what is buffered to the
// parser; true when the caller must read more from the socket.
template <bool isRequest>
bool parse_buffered(beast::flat_buffer& b, http::basic_parser<isRequest>& p, beast::error_code& ec) {
  ec = {};
  if (b.size() == 0) return true;
  b.consume(p.put(b.data(), ec));
  if (ec == http::error::need_more) {
    ec = {};
    return !p.is_done();
  }
  return false;
}
size_t read_size(const beast::flat_buffer& b) {
  return std::min<size_t>(std::max<size_t>(512, b.capacity() - b.size()), 65536);
}
// Drops `n` sent bytes from a gather list; true if any are left.
bool consume(std::span<asio::const_buffer>& rest, size_t n) {
  while (!rest.empty() && n >= rest.front().size()) {
    n -= rest.front().size();
    rest = rest.subspan(1);
  }
  if (!rest.empty()) rest.front() += n;
  return !rest.empty();
}

awaitable<void> session(Socket client, IoThread& io) {
  Conn c;
  for (;;) {
    beast::error_code ec;
    // The loops are written out here, not as sub-coroutines: each call of
    // an awaitable function allocates its frame (kvroute's read_http does).
    RequestParser parser(c);
    parser.eager(true);
    parser.body_limit(16 * 1024 * 1024);
    while (parse_buffered(c.in, parser, ec)) {
      const size_t n = co_await client.async_read_some(c.in.prepare(read_size(c.in)), nothrow(ec));
      c.in.commit(n);
      if (ec) co_return;
    }
    if (ec || !parser.is_done()) co_return;
    const size_t w = io.next++ % g_workers.size();
    std::optional<Socket> up;
    if (!io.pool[w].empty()) {
      up.emplace(std::move(io.pool[w].back()));
      io.pool[w].pop_back();
    } else {
      up.emplace(io.ioc);
      const tcp::endpoint worker(asio::ip::make_address("127.0.0.1"), g_workers[w]);
      co_await up->async_connect(worker, nothrow(ec));
      if (ec) co_return;
      up->set_option(tcp::no_delay(true), ec);
    }
    c.head.clear();
    c.head += c.method;
    c.head += ' ';
    c.head += c.target;
    c.head += " HTTP/1.1\r\n";
    c.head += c.fields;
    c.head += "Host: 127.0.0.1\r\nContent-Length: ";
    append_uint(c.head, c.body.size());
    c.head += "\r\n\r\n";
    std::array<asio::const_buffer, 2> wire{asio::buffer(c.head), asio::buffer(c.body)};
    for (std::span<asio::const_buffer> rest(wire); !ec && consume(rest, 0);)
      consume(rest, co_await up->async_write_some(rest, nothrow(ec)));
    if (ec) co_return;
    ResponseParser rp(c);
    rp.eager(true);
    rp.body_limit(kBodyBytes);
    c.up_in.clear();
    while (parse_buffered(c.up_in, rp, ec)) {
      const size_t n = co_await up->async_read_some(c.up_in.prepare(read_size(c.up_in)), nothrow(ec));
      c.up_in.commit(n);
      if (ec) co_return;
    }
    if (ec || !rp.is_done() || rp.chunked()) co_return;
    c.head.clear();
    c.head += "HTTP/1.1 ";
    append_uint(c.head, c.status);
    c.head += ' ';
    c.head += c.resp_reason;
    c.head += "\r\n";
    c.head += c.resp_fields;
    c.head += "Content-Length: ";
    append_uint(c.head, rp.got);
    c.head += "\r\n\r\n";
    wire = {asio::buffer(c.head), asio::buffer(c.resp_body.data(), rp.got)};
    for (std::span<asio::const_buffer> rest(wire); !ec && consume(rest, 0);)
      consume(rest, co_await client.async_write_some(rest, nothrow(ec)));
    if (ec) co_return;
    if (rp.keep_alive()) io.pool[w].push_back(std::move(*up));
    if (g_requests.fetch_add(1, std::memory_order_relaxed) + 1 == kWarmRequests) {
      g_allocs_at_warm = g_allocs.load();
      g_requests_at_warm = kWarmRequests;
    }
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
    for (auto& p : io.back()->pool) p.reserve(1024);
  }
  asio::basic_socket_acceptor<tcp, Executor> acceptor(io[0]->ioc,
                                                       tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  asio::co_spawn(
      io[0]->ioc,
      [&]() -> awaitable<void> {
        for (size_t n = 0;; ++n) {
          IoThread& target = *io[n % io.size()];
          beast::error_code ec;
          Socket s = co_await acceptor.async_accept(target.ioc, nothrow(ec));
          if (ec) continue;
          s.set_option(tcp::no_delay(true), ec);
          asio::co_spawn(target.ioc, session(std::move(s), target), asio::detached);
        }
      },
      asio::detached);
  asio::signal_set stop(io[0]->ioc, SIGINT, SIGTERM);
  stop.async_wait([&](const beast::error_code&, int) {
    const uint64_t req = g_requests.load(), warm = g_requests_at_warm.load();
    const double per = req > warm && warm ? double(g_allocs.load() - g_allocs_at_warm.load()) / double(req - warm) : -1;
    std::printf("requests %llu; allocations after warm-up (%llu requests) per request: %.4f\n",
                (unsigned long long)req, (unsigned long long)kWarmRequests, per);
    std::fflush(stdout);
    for (auto& t : io) t->ioc.stop();
  });
  std::vector<asio::executor_work_guard<Executor>> work;
  for (auto& t : io) work.push_back(asio::make_work_guard(t->ioc));
  for (auto& t : io) t->thread = std::thread([&ioc = t->ioc] { ioc.run(); });
  for (auto& t : io) t->thread.join();
}
