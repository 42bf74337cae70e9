// Beast HTTP server, streaming proxy and admin listener. The only translation
// unit of the router that instantiates Beast templates (keeps builds fast).
//
// Structure (after Beast's examples, written as C++20 coroutines: each
// `co_await` is one do_x()/on_x() step of the callback style):
//   IoThread       - one io_context per io thread (no strands, no cross-thread
//                    handoff); a connection lives on one thread for its whole life
//   accept_loop()  - listener on thread 0: hands accepted connections to the io
//                    threads round-robin, one coroutine per connection
//   session()      - reads requests (bounded header/body, read timeout) with
//                    ClientRequestParser and read_http(), dispatches (the OpenAI
//                    routes to proxy(), the rest to handle()), keeps alive;
//                    ClientConn keeps what requests need from one to the next
//   proxy()        - limits, routes (with the bounded wait queue), then for each
//                    worker of the ranking: pooled connection, send, response
//                    header (UpstreamResponseParser); the first worker that
//                    answers is relayed piece by piece as it arrives
//   UpstreamPool   - idle keep-alive connections per worker, one pool per io thread
//   sweep_loop()   - per io thread: timeouts and client watches (router/io_watch.h)
#include "router/http_server.h"

#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <deque>
#include <map>
#include <mutex>
#include <cstring>
#include <optional>
#include <span>
#include <thread>

#include "common/json_escape.h"
#include "common/log.h"
#include "router/io_watch.h"
#include "router/openai_request.h"

// GCC 12 destroys some temporaries of a co_await expression twice: never pass
// a temporary object (e.g. ApiError{...}) into a co_await'ed call; name it first.

namespace kvroute {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::string_view_literals;
// Coroutines, sockets and timers typed on the io_context's own executor: the
// default (any_io_executor) type-erases it on every completion.
using Executor = asio::io_context::executor_type;
template <class T>
using awaitable = asio::awaitable<T, Executor>;
constexpr asio::use_awaitable_t<Executor> use_awaitable;
using Acceptor = asio::basic_socket_acceptor<tcp, Executor>;
using Timer = asio::basic_waitable_timer<std::chrono::steady_clock, asio::wait_traits<std::chrono::steady_clock>, Executor>;
using Resolver = asio::ip::basic_resolver<tcp, Executor>;
using std::chrono::milliseconds;
using Steady = std::chrono::steady_clock;

namespace {

constexpr uint32_t kHeaderLimit = 16 * 1024;  // request header bytes; beyond: 431
constexpr size_t kRelayBufferBytes = 16 * 1024;
constexpr size_t kKeptCapacity = 64 * 1024;  // bytes a buffer of an idle connection may keep
constexpr auto kQueuePoll = milliseconds(5);

auto nothrow(beast::error_code& ec) { return asio::redirect_error(use_awaitable, ec); }

double seconds_since(Steady::time_point t) { return std::chrono::duration<double>(Steady::now() - t).count(); }

// "http://host:port[/base]" -> parts, as views into the url (a worker's
// announcement, which outlives the request). Returns false for anything else.
struct UpstreamUrl {
  std::string_view host;
  std::string_view port = "80";
  std::string_view base;  // path prefix without trailing '/'
};
bool parse_url(std::string_view url, UpstreamUrl& out) {
  constexpr std::string_view scheme = "http://";
  if (!url.starts_with(scheme)) return false;
  url.remove_prefix(scheme.size());
  const auto slash = url.find('/');
  const std::string_view hostport = url.substr(0, slash);
  out.base = slash == std::string_view::npos ? std::string_view() : url.substr(slash);
  while (!out.base.empty() && out.base.back() == '/') out.base.remove_suffix(1);
  const auto colon = hostport.rfind(':');
  if (colon != std::string_view::npos && hostport.find(']') == std::string_view::npos) {
    out.host = hostport.substr(0, colon);
    out.port = hostport.substr(colon + 1);
  } else {
    out.host = hostport;
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

// "Name: value\r\n", as kvroute forwards a field.
void append_field(std::string& h, beast::string_view name, beast::string_view value) {
  h.append(name.data(), name.size());
  h += ": "sv;
  h.append(value.data(), value.size());
  h += "\r\n"sv;
}

// What read_http() reads: up to the end of the header, the whole message, or
// whatever one read from the socket brings (a piece of a stream).
enum class ReadUntil : uint8_t { Header, Message, Some };

// Beast's http::async_read_header / async_read / async_read_some, as one loop
// over the socket's own async_read_some: the same parser calls, buffer sizing
// and end-of-stream handling, without Beast's two layers of composed
// operations (and their executor work tracking) on every read.
template <bool isRequest>
awaitable<void> read_http(Socket& s, beast::flat_buffer& b, http::basic_parser<isRequest>& p, ReadUntil until,
                          beast::error_code& ec) {
  if (until == ReadUntil::Header) p.eager(false);
  if (until == ReadUntil::Message) p.eager(true);
  ec = {};
  for (;;) {
    if (b.size() > 0) {
      b.consume(p.put(b.data(), ec));
      if (ec != http::error::need_more) {
        if (ec || until == ReadUntil::Some || (until == ReadUntil::Header ? p.is_header_done() : p.is_done()))
          co_return;
        continue;
      }
      ec = {};
    }
    const size_t size = std::min<size_t>(std::max<size_t>(512, b.capacity() - b.size()), 65536);
    const size_t n = co_await s.async_read_some(b.prepare(size), nothrow(ec));
    b.commit(n);
    if (ec == asio::error::eof) {
      ec = {};
      if (p.got_some()) p.put_eof(ec);  // a message that ends with the connection (e.g. no length)
      else ec = http::error::end_of_stream;
      co_return;
    }
    if (ec) co_return;
  }
}

// Drops the first `n` bytes from a gather list; true if any are left.
bool consume(std::span<asio::const_buffer>& buffers, size_t n) {
  while (!buffers.empty() && n >= buffers.front().size()) {
    n -= buffers.front().size();
    buffers = buffers.subspan(1);
  }
  if (n) buffers.front() += n;
  return !buffers.empty();
}

// A client's request as the server needs it. One lives in each connection's
// session and is reused from request to request (its strings keep their
// capacity).
struct ClientRequest {
  http::verb method = http::verb::unknown;
  std::string method_string;
  std::string target;
  unsigned version = 11;
  bool keep_alive = true;
  std::string fields;  // "Name: value\r\n" for each end-to-end field, in order
  std::string authorization;
  std::string session;  // x-session-id (session affinity)
  std::string body;
};

// Reads one request into a ClientRequest with Beast's basic_parser (all of its
// validation, limits and chunked decoding) but without Beast's field
// container: no allocation per field.
class ClientRequestParser final : public http::basic_parser<true> {
 public:
  explicit ClientRequestParser(ClientRequest& r) : r_(r) {
    r.method = http::verb::unknown;
    r.method_string.clear();
    r.target.clear();
    r.fields.clear();
    r.authorization.clear();
    r.session.clear();
    r.body.clear();
  }

 private:
  void on_request_impl(http::verb method, beast::string_view method_string, beast::string_view target,
                       int version, beast::error_code&) override {
    r_.method = method;
    r_.method_string.assign(method_string.data(), method_string.size());
    r_.target.assign(target.data(), target.size());
    r_.version = static_cast<unsigned>(version);
  }
  void on_response_impl(int, beast::string_view, int, beast::error_code&) override {}
  void on_field_impl(http::field f, beast::string_view name, beast::string_view value,
                     beast::error_code&) override {
    if (f == http::field::authorization) r_.authorization.assign(value.data(), value.size());
    if (f == http::field::unknown && beast::iequals(name, "x-session-id")) r_.session.assign(value.data(), value.size());
    if (!is_hop_by_hop(f)) append_field(r_.fields, name, value);
  }
  void on_header_impl(beast::error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>& length, beast::error_code&) override {
    if (length) r_.body.reserve(static_cast<size_t>(*length));  // within body_limit: the parser checked
  }
  size_t on_body_impl(beast::string_view s, beast::error_code&) override {
    r_.body.append(s.data(), s.size());
    return s.size();
  }
  void on_chunk_header_impl(std::uint64_t, beast::string_view, beast::error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code& ec) override {
    return on_body_impl(s, ec);
  }
  void on_finish_impl(beast::error_code&) override {}

  ClientRequest& r_;
};

// Writes a head into a string (reused: it keeps its capacity) through a
// pointer: one size check per piece instead of std::string's append path.
// The string is sized up front for the head's usual length and grows if a
// piece does not fit.
class HeadWriter {
 public:
  HeadWriter(std::string& s, size_t expected) : s_(s) {
    s_.resize(expected);
    p_ = s_.data();
    end_ = p_ + s_.size();
  }
  HeadWriter& text(std::string_view v) {
    room(v.size());
    std::memcpy(p_, v.data(), v.size());
    p_ += v.size();
    return *this;
  }
  HeadWriter& number(uint64_t v) {
    room(20);
    p_ = std::to_chars(p_, p_ + 20, v).ptr;
    return *this;
  }
  // Trims the string to what was written.
  void finish() { s_.resize(static_cast<size_t>(p_ - s_.data())); }

 private:
  void room(size_t n) {
    if (n <= static_cast<size_t>(end_ - p_)) return;
    const size_t at = static_cast<size_t>(p_ - s_.data());
    s_.resize(2 * s_.size() + n);
    p_ = s_.data() + at;
    end_ = s_.data() + s_.size();
  }
  std::string& s_;
  char* p_;
  char* end_;
};

// "POST /base/v1/... HTTP/1.1\r\n" + the client's end-to-end fields + Host,
// Connection (close when not pooling) and Content-Length, then the blank line.
void upstream_request_head(std::string& h, const ClientRequest& req, const UpstreamUrl& url, bool keep_alive) {
  HeadWriter w(h, 128 + req.method_string.size() + url.base.size() + req.target.size() + req.fields.size() +
                      url.host.size() + url.port.size());
  w.text(req.method_string).text(" "sv).text(url.base).text(req.target).text(" HTTP/1.1\r\n"sv);
  w.text(req.fields).text("Host: "sv).text(url.host).text(":"sv).text(url.port);
  w.text(keep_alive ? "\r\n"sv : "\r\nConnection: close\r\n"sv);
  w.text("Content-Length: "sv).number(req.body.size()).text("\r\n\r\n"sv);
  w.finish();
}

// The head of a worker's response as kvroute relays it: the status, and the
// end-to-end fields as text. One per client connection, reused.
struct UpstreamResponse {
  unsigned status = 0;
  std::string reason;
  std::string fields;  // "Name: value\r\n" for each end-to-end field, in order
  bool event_stream = false;
};

// Parses a worker's response with Beast's basic_parser (all of its validation
// and chunked decoding) into an UpstreamResponse instead of Beast's field
// container (no allocation per field); body bytes go straight into the
// window set by `body_into()` (buffer_body's contract: need_buffer once the
// window is full).
class UpstreamResponseParser final : public http::basic_parser<false> {
 public:
  explicit UpstreamResponseParser(UpstreamResponse& r) : r_(r) {
    r.status = 0;
    r.reason.clear();
    r.fields.clear();
    r.event_stream = false;
  }

  void body_into(char* data, size_t size) {
    out_ = data;
    room_ = size;
  }
  size_t room() const { return room_; }

 private:
  void on_request_impl(http::verb, beast::string_view, beast::string_view, int, beast::error_code&) override {}
  void on_response_impl(int code, beast::string_view reason, int, beast::error_code&) override {
    r_.status = static_cast<unsigned>(code);
    r_.reason.assign(reason.data(), reason.size());
  }
  void on_field_impl(http::field f, beast::string_view name, beast::string_view value,
                     beast::error_code&) override {
    if (f == http::field::content_type && value.starts_with("text/event-stream")) r_.event_stream = true;
    if (is_hop_by_hop(f)) return;
    // kvroute sets its own x-kvroute-* fields (a worker behind another kvroute,
    // or the mocker, may send them too).
    if (f == http::field::unknown &&
        (beast::iequals(name, "x-kvroute-worker") || beast::iequals(name, "x-kvroute-cached-tokens")))
      return;
    append_field(r_.fields, name, value);
  }
  void on_header_impl(beast::error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>&, beast::error_code&) override {}
  size_t on_body_impl(beast::string_view s, beast::error_code& ec) override {
    const size_t n = std::min(s.size(), room_);
    if (n) std::memcpy(out_, s.data(), n);
    out_ += n;
    room_ -= n;
    if (n < s.size()) ec = http::error::need_buffer;
    return n;
  }
  void on_chunk_header_impl(std::uint64_t, beast::string_view, beast::error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code& ec) override {
    return on_body_impl(s, ec);
  }
  void on_finish_impl(beast::error_code&) override {}

  UpstreamResponse& r_;
  char* out_ = nullptr;
  size_t room_ = 0;
};

// The head kvroute sends the client for a worker's response: its status and
// end-to-end fields, kvroute's x-kvroute-* fields, then Content-Length (a
// sized body) or Transfer-Encoding: chunked, and Connection: close when the
// client connection will not be kept.
void client_response_head(std::string& h, const UpstreamResponse& p, WorkerId worker, uint32_t cached_tokens,
                          std::optional<uint64_t> content_length, bool keep_alive) {
  const beast::string_view obsolete = http::obsolete_reason(static_cast<http::status>(p.status));
  const std::string_view reason = p.reason.empty() ? std::string_view(obsolete.data(), obsolete.size()) : p.reason;
  HeadWriter w(h, 256 + reason.size() + p.fields.size());
  w.text("HTTP/1.1 "sv).number(p.status).text(" "sv).text(reason).text("\r\n"sv).text(p.fields);
  w.text("x-kvroute-worker: "sv).number(worker.value);
  w.text("\r\nx-kvroute-cached-tokens: "sv).number(cached_tokens);
  if (content_length) w.text("\r\nContent-Length: "sv).number(*content_length);
  else w.text("\r\nTransfer-Encoding: chunked"sv);
  w.text(keep_alive ? "\r\n\r\n"sv : "\r\nConnection: close\r\n\r\n"sv);
  w.finish();
}

// "<size in hex>\r\n": the line before a chunk of `n` bytes.
std::string_view chunk_size_line(size_t n, char (&b)[24]) {
  auto end = std::to_chars(b, b + 20, n, 16).ptr;
  *end++ = '\r';
  *end++ = '\n';
  return {b, static_cast<size_t>(end - b)};
}

// The API a request is proxied as, if it is a POST to one of the OpenAI routes.
std::optional<ApiKind> proxied_api(const ClientRequest& req) {
  if (req.method != http::verb::post) return std::nullopt;
  const std::string_view target = std::string_view(req.target).substr(0, req.target.find('?'));
  if (target == "/v1/chat/completions") return ApiKind::ChatCompletions;
  if (target == "/v1/completions") return ApiKind::Completions;
  return std::nullopt;
}

std::string_view route_label(std::string_view target) {
  if (target == "/v1/chat/completions") return "chat_completions";
  if (target == "/v1/completions") return "completions";
  if (target == "/v1/models") return "models";
  if (target == "/health") return "health";
  if (target == "/ready") return "ready";
  if (target == "/metrics") return "metrics";
  return "other";
}

// Idle keep-alive connections per worker url, owned by one io
// thread: a pooled socket stays registered with that thread's reactor and is
// only ever used there, so the pool needs no lock. Not thread-safe.
class UpstreamPool {
 public:
  // A connection idle for longer than this is checked (one MSG_PEEK) before
  // reuse; servers close idle keep-alive connections after seconds, not
  // milliseconds. Either way a pooled connection that fails before the first
  // response byte is retried on a fresh one (proxy()).
  static constexpr auto kCheckAfter = milliseconds(200);

  std::optional<Socket> take(std::string_view key) {
    auto it = idle_.find(key);
    const auto now = Steady::now();
    while (it != idle_.end() && !it->second.empty()) {
      Idle c = std::move(it->second.back());
      it->second.pop_back();
      // An idle connection the worker closed reads as EOF.
      if (now - c.since < kCheckAfter || !peer_closed(c.socket)) return std::move(c.socket);
      beast::error_code ec;
      c.socket.close(ec);
    }
    return std::nullopt;
  }
  void give(std::string_view key, Socket s, size_t limit) {
    auto it = idle_.find(key);
    if (it == idle_.end()) it = idle_.emplace(std::string(key), std::vector<Idle>()).first;
    auto& v = it->second;
    if (v.size() >= limit) return;  // `s` closes here
    v.push_back(Idle{std::move(s), Steady::now()});
  }
  void clear() { idle_.clear(); }

 private:
  struct Idle {
    Socket socket;
    Steady::time_point since;
  };
  std::map<std::string, std::vector<Idle>, std::less<>> idle_;  // found by string_view
};

}  // namespace

bool peer_closed(Socket& s) {
  char b;
  const ssize_t n = ::recv(s.native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  return true;  // eof, reset, or another socket error
}

// Relay buffers of one io thread, reused from request to request: a 16 KiB
// array in the proxy coroutine's frame made every request malloc that much.
class RelayBuffers {
 public:
  class Lease {
   public:
    Lease(RelayBuffers& owner, std::unique_ptr<char[]> b) : owner_(owner), b_(std::move(b)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (owner_.spare_.size() < kKeep) owner_.spare_.push_back(std::move(b_));
    }
    char* data() { return b_.get(); }

   private:
    RelayBuffers& owner_;
    std::unique_ptr<char[]> b_;
  };
  Lease take() {
    std::unique_ptr<char[]> b;
    if (spare_.empty()) {
      b = std::make_unique_for_overwrite<char[]>(kRelayBufferBytes);
    } else {
      b = std::move(spare_.back());
      spare_.pop_back();
    }
    return Lease(*this, std::move(b));
  }

 private:
  static constexpr size_t kKeep = 256;  // spare buffers kept per thread (4 MiB)
  std::vector<std::unique_ptr<char[]>> spare_;
};

// One io thread: its own io_context (run by exactly one thread, so handlers
// need no strand), its own upstream pool and its own sweeper (timeouts and
// client watches, router/io_watch.h).
struct IoThread {
  // First: these outlive the coroutines the io_context destroys.
  Sweeper sweeper;
  RelayBuffers buffers;
  // One thread runs it and only that thread starts operations on its sockets:
  // the reactor's per-socket locks are not needed (registration and posting
  // from other threads stay locked).
  asio::io_context ioc{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(ioc);
  UpstreamPool pool;
  std::thread thread;
};

// A client connection: its socket, the deadline of its current operation, and
// the state its requests need.
struct ClientConn {
  ClientConn(Socket s, Sweeper& sweeper) : socket(std::move(s)), deadline(sweeper) {}
  Socket socket;
  Deadline deadline;
  // The current request's state, kept from request to request for its
  // capacity (no allocation per request once it has grown).
  std::string upstream_head;
  std::string response_head;
  beast::flat_buffer upstream_buffer;
  UpstreamResponse response;
  ParsedRequest parsed;
  RouteResult route;
  // Arms the deadline for the next operation on the socket.
  void expires_after(milliseconds t) { deadline.arm(socket, t); }
  // Between requests: an idle connection (thousands may be open) keeps no
  // worker announcement alive and no large buffer.
  void idle() {
    upstream_buffer.clear();
    if (upstream_buffer.capacity() > kKeptCapacity) upstream_buffer.shrink_to_fit();
    if (parsed.prompt_text.capacity() > kKeptCapacity ||
        parsed.prompt_tokens.capacity() * sizeof(TokenId) > kKeptCapacity)
      parsed = ParsedRequest();
    else
      parsed.reset();
    if (route.block_hashes.capacity() * sizeof(LocalBlockHash) > kKeptCapacity) route = RouteResult();
    else route.reset();
  }
};

struct HttpServer::Impl {
  explicit Impl(HttpServerHooks h)
      : hooks(std::move(h)), acceptor(io0().ioc), admin_acceptor(io0().ioc) {}

  HttpServerHooks hooks;
  // io[0] exists from construction (the listeners are bound before start()).
  std::vector<std::unique_ptr<IoThread>> io = [] {
    std::vector<std::unique_ptr<IoThread>> v;
    v.push_back(std::make_unique<IoThread>());
    return v;
  }();
  IoThread& io0() { return *io.front(); }
  size_t next_io = 0;  // round-robin cursor, used by thread 0 only
  Acceptor acceptor;
  Acceptor admin_acceptor;
  std::atomic<bool> stopping{false};
  std::atomic<bool> draining{false};
  std::atomic<int64_t> inflight{0};  // proxied requests being handled
  std::atomic<int64_t> queued{0};    // requests in the wait queue

  awaitable<void> accept_loop(Acceptor& a, bool admin);
  awaitable<void> sweep_loop(IoThread& io);
  awaitable<void> session(Socket socket, bool admin, IoThread& io);
  awaitable<bool> handle(ClientConn& client, ClientRequest& req);
  awaitable<bool> handle_admin(ClientConn& client, ClientRequest& req);
  awaitable<bool> proxy(ClientConn& client, ClientRequest& req, ApiKind kind,
                        IoThread& io);
  awaitable<bool> respond(ClientConn& client, unsigned version, bool keep_alive, http::status status,
                          std::string body, std::string_view content_type = "application/json",
                          std::optional<unsigned> retry_after = std::nullopt);
  awaitable<bool> respond_error(ClientConn& client, unsigned version, bool keep_alive, const ApiError& e);
  void count(std::string_view route, unsigned status, std::string_view model) {
    if (hooks.metrics) hooks.metrics->request(route, status, model).inc();
  }
};

awaitable<void> HttpServer::Impl::accept_loop(Acceptor& a, bool admin) {
  for (;;) {
    beast::error_code ec;
    IoThread& target = *io[next_io++ % io.size()];
    Socket socket = co_await a.async_accept(target.ioc, nothrow(ec));
    if (ec) {
      if (stopping.load() || ec == asio::error::operation_aborted || !a.is_open()) co_return;
      static RateLimiter rl;
      if (rl.allow()) spdlog::warn("accept failed: {}", ec.message());
      if (ec == asio::error::no_descriptors) {  // out of file descriptors: back off
        Timer t(co_await asio::this_coro::executor, milliseconds(50));
        co_await t.async_wait(nothrow(ec));
      }
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    asio::co_spawn(target.ioc, session(std::move(socket), admin, target), asio::detached);
  }
}

// Ticks the io thread's sweeper: a tenth of the shortest configured timeout,
// between 5 and 50 ms, so a timeout fires at most 10% (or 50 ms) late and a
// slow request's client watch is armed within kDelay + one tick.
awaitable<void> HttpServer::Impl::sweep_loop(IoThread& io) {
  Timer timer(io.ioc);
  beast::error_code ec;
  while (!stopping.load()) {
    const auto& r = hooks.config->get()->router;
    const uint32_t shortest = std::min({r.connect_timeout_ms, r.first_byte_timeout_ms, r.idle_timeout_ms,
                                        r.client_read_timeout_ms});
    timer.expires_after(milliseconds(std::clamp<uint32_t>(shortest / 10, 5, 50)));
    co_await timer.async_wait(nothrow(ec));
    io.sweeper.sweep(Steady::now());
  }
}

awaitable<void> HttpServer::Impl::session(Socket socket, bool admin, IoThread& io) {
  ClientConn stream(std::move(socket), io.sweeper);
  beast::flat_buffer buffer;
  ClientRequest req;
  try {
    for (;;) {
      const auto cfg = hooks.config->get();
      ClientRequestParser parser(req);
      parser.header_limit(kHeaderLimit);
      parser.body_limit(cfg->router.max_body_bytes);
      stream.expires_after(milliseconds(cfg->router.client_read_timeout_ms));
      beast::error_code ec;
      co_await read_http(stream.socket, buffer, parser, ReadUntil::Message, ec);
      stream.deadline.settle(ec);
      if (ec) {
        // Answer what a client can act on; a closed or timed-out connection gets nothing.
        if (ec == http::error::body_limit) {
          count("other", 413, "");
          const ApiError e{413, fmt::format("Request body exceeds {} bytes.", cfg->router.max_body_bytes),
                           "invalid_request_error", "", "request_too_large"};
          co_await respond_error(stream, 11, false, e);
        } else if (ec == http::error::header_limit) {
          count("other", 431, "");
          const ApiError e{431, "Request headers too large.", "invalid_request_error", "", ""};
          co_await respond_error(stream, 11, false, e);
        } else if (ec.category() == http::make_error_code(http::error::body_limit).category() &&
                   ec != http::error::end_of_stream && ec != http::error::partial_message) {
          count("other", 400, "");
          const ApiError e{400, fmt::format("Malformed HTTP request: {}.", ec.message()), "invalid_request_error", "",
                           ""};
          co_await respond_error(stream, 11, false, e);
        }
        break;
      }
      req.keep_alive = parser.keep_alive();
      // The OpenAI routes go straight to proxy() (one coroutine frame fewer per request).
      bool keep;
      if (admin) keep = co_await handle_admin(stream, req);
      else if (const auto api = proxied_api(req)) keep = co_await proxy(stream, req, *api, io);
      else keep = co_await handle(stream, req);
      if (!keep) break;
      if (req.body.capacity() > kKeptCapacity) req.body = std::string();
      stream.idle();
    }
  } catch (const std::exception& e) {
    spdlog::error("connection aborted by an internal error: {}", e.what());
  }
  beast::error_code ignored;
  stream.socket.shutdown(Socket::shutdown_send, ignored);
}

awaitable<bool> HttpServer::Impl::respond(ClientConn& client, unsigned version, bool keep_alive,
                                          http::status status, std::string body, std::string_view content_type,
                                          std::optional<unsigned> retry_after) {
  http::response<http::string_body> res{status, version};
  res.set(http::field::server, "kvroute");
  res.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
  if (retry_after) res.set(http::field::retry_after, std::to_string(*retry_after));
  res.keep_alive(keep_alive && !draining.load());
  res.body() = std::move(body);
  res.prepare_payload();
  beast::error_code ec;
  client.expires_after(milliseconds(hooks.config->get()->router.idle_timeout_ms));
  co_await http::async_write(client.socket, res, nothrow(ec));
  client.deadline.settle(ec);
  co_return !ec && res.keep_alive();
}

awaitable<bool> HttpServer::Impl::respond_error(ClientConn& client, unsigned version, bool keep_alive,
                                                const ApiError& e) {
  std::optional<unsigned> retry_after;
  if (e.status == 503) retry_after = 1;
  std::string body = error_body(e);
  co_return co_await respond(client, version, keep_alive, static_cast<http::status>(e.status), std::move(body),
                             "application/json", retry_after);
}

awaitable<bool> HttpServer::Impl::handle_admin(ClientConn& client, ClientRequest& req) {
  std::string_view target = req.target;
  target = target.substr(0, target.find('?'));
  AdminResponse r = hooks.admin ? hooks.admin->handle(req.method_string, target, req.authorization, req.body)
                                : AdminResponse{404, R"({"error":{"message":"no admin API"}})"};
  co_return co_await respond(client, req.version, req.keep_alive, static_cast<http::status>(r.status),
                             std::move(r.body), r.content_type);
}

// Everything but the proxied OpenAI routes (see proxied_api()).
awaitable<bool> HttpServer::Impl::handle(ClientConn& client, ClientRequest& req) {
  std::string_view target = req.target;
  target = target.substr(0, target.find('?'));
  const bool keep = req.keep_alive;
  const unsigned v = req.version;
  const bool get = req.method == http::verb::get;

  const auto route = route_label(target);
  if (target == "/health" && get) {
    count(route, 200, "");
    co_return co_await respond(client, v, keep, http::status::ok, R"({"status":"ok"})");
  }
  if (target == "/ready" && get) {
    const bool ready = !draining.load() && hooks.ready && hooks.ready();
    count(route, ready ? 200 : 503, "");
    co_return co_await respond(client, v, keep, ready ? http::status::ok : http::status::service_unavailable,
                               ready ? R"({"status":"ready"})"
                                     : (draining.load() ? R"({"status":"shutting_down"})" : R"({"status":"not_ready"})"));
  }
  if (target == "/metrics" && get && hooks.render_metrics) {
    count(route, 200, "");
    co_return co_await respond(client, v, keep, http::status::ok, hooks.render_metrics(),
                               "text/plain; version=0.0.4; charset=utf-8");
  }
  if (target == "/v1/models" && get) {
    std::string body = R"({"object":"list","data":[)";
    bool first = true;
    for (const auto& m : hooks.registry->models()) {
      body += fmt::format(R"({}{{"id":"{}","object":"model","created":0,"owned_by":"kvroute"}})", first ? "" : ",",
                          json_escape(m));
      first = false;
    }
    body += "]}";
    count(route, 200, "");
    co_return co_await respond(client, v, keep, http::status::ok, std::move(body));
  }
  if (route != "other") {
    count(route, 405, "");
    const ApiError e{405, fmt::format("Method {} not allowed on {}.", req.method_string, target),
                     "invalid_request_error", "", "method_not_allowed"};
    co_return co_await respond_error(client, v, keep, e);
  }
  count(route, 404, "");
  const ApiError e{404, fmt::format("Unknown path {}.", target), "invalid_request_error", "", "not_found"};
  co_return co_await respond_error(client, v, keep, e);
}

awaitable<bool> HttpServer::Impl::proxy(ClientConn& client, ClientRequest& req,
                                        ApiKind kind, IoThread& io) {
  const auto started = Steady::now();
  const bool keep = req.keep_alive;
  const unsigned v = req.version;
  const auto cfg = hooks.config->get();
  const std::string_view route_name = kind == ApiKind::ChatCompletions ? "chat_completions" : "completions";
  const std::string_view path = kind == ApiKind::ChatCompletions ? "/v1/chat/completions" : "/v1/completions";
  RouterMetrics* m = hooks.metrics;

  // Per-request record for the access log and metrics, written on every exit.
  AccessRecord rec;
  rec.method = "POST";
  rec.path = path;
  std::string_view model_label = "unknown";
  auto finish = [&](unsigned status, std::string_view outcome) {
    rec.status = status;
    rec.outcome = outcome;
    const double seconds = seconds_since(started);
    rec.duration_ms = seconds * 1e3;
    count(route_name, status, model_label);
    if (m) (kind == ApiKind::ChatCompletions ? m->duration_chat : m->duration_completions).observe(seconds);
    if (cfg->log.access_log) log_access(rec);
  };
  auto reject = [&](const ApiError& e, std::string_view outcome) -> awaitable<bool> {
    finish(e.status, outcome);
    co_return co_await respond_error(client, v, keep, e);
  };
  // The client went away: count it and log `status` (499 if it never got one).
  auto client_cancelled = [&](unsigned status) {
    if (m) m->cancels_total.get().inc();
    finish(status, "client_cancel");
  };

  // Concurrency limit: counted for the whole request, released on every exit
  // (the in-flight gauge reads the count at scrape time).
  struct Slot {
    std::atomic<int64_t>& n;
    explicit Slot(std::atomic<int64_t>& c) : n(c) { n.fetch_add(1); }
    ~Slot() { n.fetch_sub(1); }
  } slot(inflight);
  if (inflight.load() > static_cast<int64_t>(cfg->router.max_concurrent_requests)) {
    if (m) m->rejected_total.with({"limit"}).inc();
    const ApiError e{503, "Too many concurrent requests; retry later.", "service_unavailable", "", "too_many_requests"};
    co_return co_await reject(e, "rejected_limit");
  }

  ParsedRequest& parsed = client.parsed;
  ApiError err;
  if (!parse_openai_request(kind, req.body, parsed, err)) co_return co_await reject(err, "bad_request");
  rec.model = parsed.model;
  rec.stream = parsed.stream;

  RouteResult& route = client.route;
  hooks.routing->route(parsed, route);
  // No eligible worker (all busy): wait in the bounded queue, re-routing as load changes.
  if (!route.ok && route.error.code == "workers_busy" && cfg->scheduler.queue_size > 0) {
    if (queued.fetch_add(1) >= static_cast<int64_t>(cfg->scheduler.queue_size)) {
      queued.fetch_sub(1);
      if (m) m->rejected_total.with({"queue_full"}).inc();
      route.error.message = "Every worker is busy and the wait queue is full; retry later.";
    } else {
      if (m) m->queued_requests.get().add(1);
      const auto deadline = Steady::now() + milliseconds(cfg->scheduler.queue_timeout_ms);
      Timer timer(co_await asio::this_coro::executor);
      beast::error_code ec;
      while (!route.ok && route.error.code == "workers_busy" && Steady::now() < deadline && !stopping.load()) {
        timer.expires_after(kQueuePoll);
        co_await timer.async_wait(nothrow(ec));
        hooks.routing->route(parsed, route);
      }
      queued.fetch_sub(1);
      if (m) m->queued_requests.get().add(-1);
      if (!route.ok && route.error.code == "workers_busy") {
        if (m) m->rejected_total.with({"queue_timeout"}).inc();
        route.error.message = fmt::format("No worker became free within {} ms; retry later.",
                                          cfg->scheduler.queue_timeout_ms);
      }
    }
  }
  if (m) {
    for (int i = 0; i < 4; ++i) m->stage_seconds[i]->observe(route.stage_seconds[i]);
    (!route.ok ? m->decided_no_worker : route.chose_best_overlap ? m->decided_best_overlap : m->decided_balance).inc();
  }
  rec.prompt_tokens = route.isl_tokens;
  if (!route.ok) {
    if (route.error.status == 404) model_label = "unknown";
    co_return co_await reject(route.error, "no_worker");
  }
  model_label = parsed.model;  // bounded: a model some worker announced
  if (hooks.sessions && cfg->scheduler.session_affinity)  // router/session_affinity.h
    hooks.sessions->apply(req.session.empty() ? std::string_view(parsed.user) : std::string_view(req.session),
                          cfg->indexer.block_size, route);
  if (m && route.tokenizer_fallback != TokenizerFallback::None)
    m->tokenizer_fallbacks_total.with({model_label, to_string(route.tokenizer_fallback)}).inc();
  if (hooks.on_routed) hooks.on_routed(parsed, route);

  const size_t attempts = std::min<size_t>(cfg->router.max_attempts, route.ranked.size());
  auto ex = co_await asio::this_coro::executor;

  for (size_t attempt = 0; attempt < attempts; ++attempt) {
    const RouteTarget& target = route.ranked[attempt];
    rec.attempts = static_cast<uint32_t>(attempt + 1);
    rec.worker = static_cast<int64_t>(target.worker.value);
    rec.cached_tokens = target.cached_tokens;
    if (attempt > 0 && m) m->retries_total.get().inc();
    UpstreamUrl url;
    if (!parse_url(target.url, url)) {
      static RateLimiter rl;
      if (rl.allow()) spdlog::warn("worker {} has an unusable url '{}'", target.worker.value, target.url);
      continue;
    }
    InflightGuard inflight_guard(*hooks.registry, target.worker, route.request_blocks, target.prefill_tokens);

    // The request to forward: unchanged but for hop-by-hop headers. Its head
    // is written out here (fields as Beast parsed and validated them) and sent
    // with the body in one gather write: no serializer on the hot path.
    upstream_request_head(client.upstream_head, req, url, cfg->router.upstream_pool_size > 0);
    const std::array<asio::const_buffer, 2> up_wire{asio::buffer(client.upstream_head), asio::buffer(req.body)};
    std::array<asio::const_buffer, 2> up_left{};

    // A pooled connection may have been closed by the worker in the meantime:
    // such a failure retries on a fresh connection to the same worker.
    const milliseconds idle(cfg->router.idle_timeout_ms);
    std::optional<Socket> upstream;
    Deadline up_deadline(io.sweeper);  // after `upstream`: goes first
    beast::flat_buffer& up_buf = client.upstream_buffer;
    std::optional<UpstreamResponseParser> parser;
    // Watches the client from the request's send until the answer is committed
    // to it (a stream: until its end). Declared last: stops first.
    ClientWatch watch(io.sweeper, client.socket);
    beast::error_code ec;
    const char* failed_phase = nullptr;
    const auto sent_at = Steady::now();
    for (int fresh = 0; fresh < 2; ++fresh) {
      ec = {};
      up_deadline.disarm();
      upstream.reset();
      bool pooled = false;
      if (fresh == 0) {
        if (auto s = io.pool.take(target.url)) {
          upstream.emplace(std::move(*s));
          pooled = true;
        }
      }
      if (!upstream) {
        upstream.emplace(ex);
        up_deadline.arm(*upstream, milliseconds(cfg->router.connect_timeout_ms));
        beast::error_code addr_ec;
        const auto addr = asio::ip::make_address(url.host, addr_ec);
        uint16_t port = 0;
        std::from_chars(url.port.data(), url.port.data() + url.port.size(), port);
        if (!addr_ec) {
          const tcp::endpoint endpoint(addr, port);
          co_await upstream->async_connect(endpoint, nothrow(ec));
        } else {
          Resolver resolver(ex);
          auto results = co_await resolver.async_resolve(url.host, url.port, nothrow(ec));
          if (!ec) co_await asio::async_connect(*upstream, results, nothrow(ec));
        }
        up_deadline.settle(ec);
        if (ec) {
          failed_phase = "connect";
          break;
        }
        upstream->set_option(tcp::no_delay(true), ec);
        ec = {};
      }
      up_deadline.arm(*upstream, milliseconds(cfg->router.first_byte_timeout_ms));
      // One send nearly always takes the whole request; asio::async_write
      // (a composed operation) only for what it leaves.
      up_left = up_wire;
      std::span<asio::const_buffer> up_rest(up_left);
      const size_t sent = co_await upstream->async_write_some(up_rest, nothrow(ec));
      if (!ec && consume(up_rest, sent)) co_await asio::async_write(*upstream, up_rest, nothrow(ec));
      parser.emplace(client.response);
      parser->body_limit(std::numeric_limits<std::uint64_t>::max());
      up_buf.clear();
      if (!ec) {
        // While the worker prefills, watch for the client going away.
        watch.watch(*upstream, false);
        co_await read_http(*upstream, up_buf, *parser, ReadUntil::Header, ec);
        if (ec && watch.client_gone()) {
          client_cancelled(499);
          co_return false;
        }
      }
      up_deadline.settle(ec);
      if (!ec) break;
      watch.client_gone();
      failed_phase = "first_byte";
      if (!pooled) break;  // a fresh connection failed: the worker is at fault
    }
    if (ec) {
      if (m) m->upstream_errors_total.with({failed_phase}).inc();
      static RateLimiter rl;
      if (rl.allow())
        spdlog::warn("worker {} ({}): {} failed: {}; trying the next worker", target.worker.value, target.url,
                     failed_phase, ec.message());
      continue;
    }
    const double ttfb = seconds_since(sent_at);
    const unsigned status = client.response.status;
    // An overloaded or unavailable worker is retried while nothing reached the client.
    if ((status == 502 || status == 503 || status == 504) && attempt + 1 < attempts) {
      if (watch.client_gone()) {
        client_cancelled(499);
        co_return false;
      }
      if (m) m->upstream_errors_total.with({"status_5xx"}).inc();
      continue;  // the connection (and any body) is dropped
    }
    if (status >= 500 && m) m->upstream_errors_total.with({"status_5xx"}).inc();
    rec.ttfb_ms = ttfb * 1e3;
    if (m) {
      m->ttfb_seconds.get().observe(ttfb);
      m->prompt_tokens_total.get().inc(route.isl_tokens);
      m->cached_tokens_total.get().inc(target.cached_tokens);
      m->best_cached_tokens_total.get().inc(route.best_cached_tokens);  // decision-quality gap
      const auto worker = m->worker_tokens(target.worker.value);
      worker.prompt.inc(route.isl_tokens);
      worker.cached.inc(target.cached_tokens);
      m->overlap_ratio.get().observe(route.isl_tokens ? double(target.cached_tokens) / route.isl_tokens : 0.0);
    }

    // Committed to this worker: relay the response as it arrives.
    const bool upstream_keep = parser->keep_alive();
    const bool client_keep = keep && !draining.load();
    // A body without a length (chunked, or up to the connection's end) goes
    // to the client chunked; a sized one keeps its length.
    std::optional<uint64_t> length;
    if (!parser->chunked()) {
      if (const auto declared = parser->content_length()) length = *declared;
      else if (parser->is_done()) length = 0;  // no body at all (e.g. 204)
    }
    RelayBuffers::Lease lease = io.buffers.take();
    char* const buf = lease.data();

    // A small sized body (a non-streaming answer) is read whole first, so the
    // client gets header and body in one write: one send on the hot path.
    if (length && *length <= kRelayBufferBytes) {
      parser->body_into(buf, static_cast<size_t>(*length));
      if (!parser->is_done()) {
        up_deadline.arm(*upstream, idle);
        co_await read_http(*upstream, up_buf, *parser, ReadUntil::Message, ec);
        up_deadline.settle(ec);
      }
      if (watch.client_gone()) {
        client_cancelled(status);
        co_return false;
      }
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        if (m) m->upstream_errors_total.with({"mid_stream"}).inc();
        finish(status, "upstream_error");
        co_return false;  // nothing sent yet, but the worker is committed: close
      }
      const size_t body_size = static_cast<size_t>(*length) - parser->room();
      client_response_head(client.response_head, client.response, target.worker, target.cached_tokens, body_size,
                           client_keep);
      std::array<asio::const_buffer, 2> wire{asio::buffer(client.response_head), asio::buffer(buf, body_size)};
      std::span<asio::const_buffer> rest(wire);
      client.expires_after(idle);
      const size_t sent = co_await client.socket.async_write_some(rest, nothrow(ec));  // as for the request
      if (!ec && consume(rest, sent)) co_await asio::async_write(client.socket, rest, nothrow(ec));
      client.deadline.settle(ec);
      if (ec) {
        client_cancelled(status);
        co_return false;
      }
    } else {
      // A stream, or a large body: head first, then each piece as it arrives
      // (a chunk each when chunked), with one watch on the client to the end.
      // The worker's prefill is over (a small body's is released with the
      // request, microseconds from now: one registry update, not two).
      inflight_guard.first_byte();
      if (watch.client_gone()) {
        client_cancelled(499);
        co_return false;
      }
      const bool chunked = !length;
      client_response_head(client.response_head, client.response, target.worker, target.cached_tokens, length,
                           client_keep);
      client.expires_after(idle);
      co_await asio::async_write(client.socket, asio::buffer(client.response_head), nothrow(ec));
      client.deadline.settle(ec);
      if (ec) {
        client_cancelled(499);
        co_return false;
      }
      watch.watch(*upstream, true);
      static constexpr std::string_view kCrlf = "\r\n";
      static constexpr std::string_view kLastChunk = "0\r\n\r\n";
      if (chunked && parser->is_done()) {  // an empty body: just the last chunk
        client.expires_after(idle);
        co_await asio::async_write(client.socket, asio::buffer(kLastChunk), nothrow(ec));
        client.deadline.settle(ec);
        if (ec) {
          client_cancelled(status);
          co_return false;
        }
      }
      while (!parser->is_done()) {
        parser->body_into(buf, kRelayBufferBytes);
        up_deadline.arm(*upstream, idle);
        co_await read_http(*upstream, up_buf, *parser, ReadUntil::Some, ec);
        up_deadline.settle(ec);
        if (ec && watch.client_gone()) {
          client_cancelled(status);
          co_return false;
        }
        if (ec == http::error::need_buffer) ec = {};
        if (ec) {
          if (m) m->upstream_errors_total.with({"mid_stream"}).inc();
          static RateLimiter rl;
          if (rl.allow())
            spdlog::warn("worker {} ({}): failed mid-response: {}", target.worker.value, target.url, ec.message());
          finish(status, "upstream_error");
          if (!client.response.event_stream || !chunked) co_return false;  // cannot signal inside a sized body: close
          // An SSE stream ends with an OpenAI-style error event and [DONE].
          const std::string tail = fmt::format(
              "data: {}\n\ndata: [DONE]\n\n",
              error_body(ApiError{502, "The worker failed while streaming the response.", "upstream_error", "",
                                  "upstream_failed"}));
          char line[24];
          const std::array<asio::const_buffer, 4> end{asio::buffer(chunk_size_line(tail.size(), line)),
                                                      asio::buffer(tail), asio::buffer(kCrlf),
                                                      asio::buffer(kLastChunk)};
          watch.client_gone();
          client.expires_after(idle);
          co_await asio::async_write(client.socket, end, nothrow(ec));
          client.deadline.settle(ec);
          co_return false;
        }
        const size_t n = kRelayBufferBytes - parser->room();
        const bool last = parser->is_done();
        if (n == 0 && !(last && chunked)) continue;  // only framing arrived: nothing to pass on yet
        char line[24];
        std::array<asio::const_buffer, 4> piece{};
        size_t parts = 0;
        if (chunked && n) {
          piece[parts++] = asio::buffer(chunk_size_line(n, line));
          piece[parts++] = asio::buffer(buf, n);
          piece[parts++] = asio::buffer(kCrlf);
        } else if (n) {
          piece[parts++] = asio::buffer(buf, n);
        }
        if (chunked && last) piece[parts++] = asio::buffer(kLastChunk);
        client.expires_after(idle);
        co_await asio::async_write(client.socket, std::span(piece.data(), parts), nothrow(ec));
        client.deadline.settle(ec);
        if (ec) {  // client gone: the upstream connection closes with this frame
          client_cancelled(status);
          co_return false;
        }
      }
    }

    watch.client_gone();
    up_deadline.disarm();
    if (upstream_keep && cfg->router.upstream_pool_size > 0)
      io.pool.give(target.url, std::move(*upstream), cfg->router.upstream_pool_size);
    finish(status, status < 400 ? "ok" : "worker_error");
    co_return client_keep;
  }
  const ApiError unreachable{503, "No worker could be reached for this request.", "service_unavailable", "",
                             "upstream_unavailable"};
  co_return co_await reject(unreachable, "upstream_unavailable");
}

HttpServer::HttpServer(HttpServerHooks hooks) : impl_(std::make_unique<Impl>(std::move(hooks))) {}

HttpServer::~HttpServer() { stop(); }

namespace {
bool bind_acceptor(Acceptor& a, const std::string& host, uint16_t port, std::string_view key, std::string* error) {
  beast::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (ec) {
    if (error) *error = fmt::format("{}.host: '{}' is not an IP address", key, host);
    return false;
  }
  tcp::endpoint ep(addr, port);
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    if (error) *error = fmt::format("{}: cannot listen on {}:{}: {}", key, host, port, ec.message());
    return false;
  }
  return true;
}
}  // namespace

bool HttpServer::listen(const std::string& host, uint16_t port, std::string* error) {
  return bind_acceptor(impl_->acceptor, host, port, "router", error);
}

bool HttpServer::listen_admin(const std::string& host, uint16_t port, std::string* error) {
  return bind_acceptor(impl_->admin_acceptor, host, port, "admin", error);
}

uint16_t HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

uint16_t HttpServer::admin_port() const {
  beast::error_code ec;
  auto ep = impl_->admin_acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

int64_t HttpServer::inflight() const { return impl_->inflight.load(); }

void HttpServer::start(unsigned threads) {
  while (impl_->io.size() < std::max(1u, threads)) impl_->io.push_back(std::make_unique<IoThread>());
  asio::co_spawn(impl_->io0().ioc, impl_->accept_loop(impl_->acceptor, false), asio::detached);
  if (impl_->admin_acceptor.is_open())
    asio::co_spawn(impl_->io0().ioc, impl_->accept_loop(impl_->admin_acceptor, true), asio::detached);
  for (auto& t : impl_->io) {
    IoThread& io = *t;
    asio::co_spawn(io.ioc, impl_->sweep_loop(io), asio::detached);
  }
  for (auto& t : impl_->io)
    t->thread = std::thread([&ioc = t->ioc] {
      pthread_setname_np(pthread_self(), "kvroute-http");
      ioc.run();
    });
}

void HttpServer::shutdown(std::chrono::milliseconds grace) {
  impl_->draining.store(true);
  const auto deadline = Steady::now() + grace;
  while (Steady::now() < deadline && impl_->inflight.load() > 0) std::this_thread::sleep_for(milliseconds(20));
  if (impl_->inflight.load() > 0)
    spdlog::warn("shutdown grace of {} ms over with {} requests in flight; closing them", grace.count(),
                 impl_->inflight.load());
  stop();
}

void HttpServer::stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  asio::post(impl_->io0().ioc, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
    impl_->admin_acceptor.close(ec);
  });
  for (auto& t : impl_->io) {
    t->work.reset();
    t->ioc.stop();
  }
  for (auto& t : impl_->io)
    if (t->thread.joinable()) t->thread.join();
  for (auto& t : impl_->io) t->pool.clear();
}

}  // namespace kvroute
