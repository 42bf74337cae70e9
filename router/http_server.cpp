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

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/json_escape.h"
#include "common/log.h"
#include "router/engine_tokenizer.h"
#include "router/io_watch.h"
#include "router/openai_request.h"
#include "router/proxy_policy.h"
#include "common/http_url.h"

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

// Coroutine frames from a per-thread free list per size class. Asio recycles
// one frame per thread, so every coroutine nested below another (each phase
// of proxy(), each use_awaitable operation inside it) was a malloc and a free
// per request; here a frame of a size the thread used before is reused. Runs
// on the thread that allocates or frees (a frame freed on another thread goes
// to that thread's list); the lists are freed at thread exit.
class FramePool {
 public:
  static void* allocate(size_t size) {
    const size_t c = size_class(size);
    if (c >= kClasses) return ::operator new(size);
    Lists& l = lists();
    if (Block* b = l.head[c]) {
      l.head[c] = b->next;
      --l.count[c];
      return b;
    }
    return ::operator new((c + 1) * kGranule);
  }
  static void deallocate(void* p, size_t size) noexcept {
    const size_t c = size_class(size);
    Lists& l = lists();
    if (c >= kClasses || l.count[c] >= kKeep) {
      ::operator delete(p);
      return;
    }
    Block* b = static_cast<Block*>(p);
    b->next = l.head[c];
    l.head[c] = b;
    ++l.count[c];
  }

 private:
  static constexpr size_t kGranule = 64;
  static constexpr size_t kClasses = 64;  // frames up to 4 KiB
  static constexpr uint32_t kKeep = 256;  // per class and thread
  struct Block {
    Block* next;
  };
  struct Lists {
    std::array<Block*, kClasses> head{};
    std::array<uint32_t, kClasses> count{};
    ~Lists() {
      for (Block* b : head)
        while (b) {
          Block* next = b->next;
          ::operator delete(b);
          b = next;
        }
    }
  };
  static size_t size_class(size_t size) { return (size + kGranule - 1) / kGranule - 1; }
  static Lists& lists() {
    thread_local Lists l;
    return l;
  }
};

// Asio's promise type for this executor's coroutines, with frames from the
// FramePool (the std::coroutine_traits specialization below picks it).
template <class T>
class PooledFrame final : public asio::detail::awaitable_frame<T, Executor> {
  using Base = asio::detail::awaitable_frame<T, Executor>;

 public:
  static void* operator new(std::size_t size) { return FramePool::allocate(size); }
  static void operator delete(void* p, std::size_t size) noexcept { FramePool::deallocate(p, size); }

  // Asio's awaitable takes its caller's handle typed on asio's promise: this
  // hands it over as one (the promise is that base at the same address).
  template <class U>
  struct Awaiter {
    asio::awaitable<U, Executor> a;
    bool await_ready() const noexcept { return a.await_ready(); }
    void await_suspend(std::coroutine_handle<PooledFrame> h) {
      a.await_suspend(std::coroutine_handle<Base>::from_promise(static_cast<Base&>(h.promise())));
    }
    U await_resume() { return a.await_resume(); }
  };
  using Base::await_transform;
  template <class U>
  Awaiter<U> await_transform(asio::awaitable<U, Executor> a) const {
    return Awaiter<U>{std::move(a)};
  }
};

}  // namespace kvroute

// Every coroutine of this translation unit typed on kvroute::Executor (the
// only one that instantiates them) uses PooledFrame; asio's own
// specialization, for any executor, is less specialized.
template <class T, class... Args>
struct std::coroutine_traits<boost::asio::awaitable<T, kvroute::Executor>, Args...> {
  using promise_type = kvroute::PooledFrame<T>;
};

namespace kvroute {

namespace {

constexpr size_t kRelayBufferBytes = 16 * 1024;
constexpr size_t kKeptCapacity = 64 * 1024;  // bytes a buffer of an idle connection may keep
constexpr auto kQueuePoll = milliseconds(5);

auto nothrow(beast::error_code& ec) { return asio::redirect_error(use_awaitable, ec); }

double seconds_since(Steady::time_point t) { return std::chrono::duration<double>(Steady::now() - t).count(); }

// The request field naming the engine's data-parallel rank (vLLM, SGLang).
constexpr std::string_view kDpRankHeader = "X-data-parallel-rank";

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
    case http::field::expect:  // answered by kvroute (100 Continue); the worker gets the whole body
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
// For a client's request: `between` (if set) turns false once a byte of it
// arrived (until then shutdown may close the connection); `expect_continue`
// (if set and true once the header is parsed) sends the interim
// "100 Continue" a client waits for before sending its body.
template <bool isRequest>
awaitable<void> read_http(Socket& s, beast::flat_buffer& b, http::basic_parser<isRequest>& p, ReadUntil until,
                          beast::error_code& ec, bool* between = nullptr, const bool* expect_continue = nullptr) {
  if (until == ReadUntil::Header) p.eager(false);
  if (until == ReadUntil::Message) p.eager(true);
  ec = {};
  if (until == ReadUntil::Message && p.is_done()) co_return;  // the header was the whole message
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
    if (expect_continue && *expect_continue && p.is_header_done()) {  // the body is still to come
      expect_continue = nullptr;                                      // once
      co_await asio::async_write(s, asio::buffer("HTTP/1.1 100 Continue\r\n\r\n"sv), nothrow(ec));
      if (ec) co_return;
    }
    const size_t size = std::min<size_t>(std::max<size_t>(512, b.capacity() - b.size()), 65536);
    const size_t n = co_await s.async_read_some(b.prepare(size), nothrow(ec));
    b.commit(n);
    if (between && n > 0) *between = false;
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
  bool has_host = false;
  bool expect_continue = false;  // "Expect: 100-continue"
  std::string transfer_coding;   // the last Transfer-Encoding field, when its final coding is not chunked
};

// Request body bytes being received or held, across every connection of the
// OpenAI listener (`router.max_body_bytes_in_flight`). A lease holds its
// request's share and gives it back when the request is done. Thread-safe.
class BodyLease {
 public:
  BodyLease(std::atomic<uint64_t>& used, uint64_t limit) : used_(used), limit_(limit) {}
  BodyLease(const BodyLease&) = delete;
  BodyLease& operator=(const BodyLease&) = delete;
  ~BodyLease() { used_.fetch_sub(held_, std::memory_order_relaxed); }
  // Holds `total` bytes in all (more than now); false, holding what it held,
  // if that would take the bytes in flight over the limit.
  bool grow(uint64_t total) {
    if (total <= held_) return true;
    const uint64_t more = total - held_;
    if (used_.fetch_add(more, std::memory_order_relaxed) + more > limit_) {
      used_.fetch_sub(more, std::memory_order_relaxed);
      return false;
    }
    held_ = total;
    return true;
  }
  uint64_t held() const { return held_; }

 private:
  std::atomic<uint64_t>& used_;
  const uint64_t limit_;
  uint64_t held_ = 0;
};

class ClientRequestParser;

// Decides, once a request's header is in and before a byte of its body is
// parsed, whether the body may be read at all (HttpServer's admit_body()).
class HeaderCheck {
 public:
  virtual bool admit(const ClientRequest& req, const ClientRequestParser& parser) = 0;

 protected:
  ~HeaderCheck() = default;
};

// Reads one request into a ClientRequest with Beast's basic_parser (all of its
// validation, limits and chunked decoding) but without Beast's field
// container: no allocation per field.
class ClientRequestParser final : public http::basic_parser<true> {
 public:
  // `check` (if set) runs when the header is complete; a refusal ends the
  // parse with an error, the body unread.
  ClientRequestParser(ClientRequest& r, HeaderCheck* check) : r_(r), check_(check) {
    r.method = http::verb::unknown;
    r.method_string.clear();
    r.target.clear();
    r.fields.clear();
    r.authorization.clear();
    r.session.clear();
    r.body.clear();
    r.has_host = false;
    r.expect_continue = false;
    r.transfer_coding.clear();
  }
  // A chunked body's bytes are taken from `lease` as they arrive (a sized
  // body's whole length is taken before it is read).
  void lease_chunks(BodyLease* lease, uint64_t body_limit) {
    lease_ = lease;
    lease_limit_ = body_limit;
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
    if (f == http::field::host) r_.has_host = true;
    if (f == http::field::unknown && beast::iequals(name, "x-session-id")) r_.session.assign(value.data(), value.size());
    // RFC 9110 10.1.1: never a 100 (Continue) to an HTTP/1.0 client.
    if (f == http::field::expect && r_.version >= 11 && beast::iequals(value, "100-continue"))
      r_.expect_continue = true;
    if (f == http::field::transfer_encoding) {
      // Beast reads a body only when the final coding is chunked; any other
      // (gzip, identity, xchunked) left the body to be parsed as the next
      // request. RFC 9112 6.3: such a request is refused (on_header_impl).
      const auto comma = value.rfind(',');
      beast::string_view last = comma == beast::string_view::npos ? value : value.substr(comma + 1);
      while (!last.empty() && (last.front() == ' ' || last.front() == '\t')) last.remove_prefix(1);
      while (!last.empty() && (last.back() == ' ' || last.back() == '\t')) last.remove_suffix(1);
      if (beast::iequals(last, "chunked")) r_.transfer_coding.clear();
      else r_.transfer_coding.assign(value.data(), std::min<size_t>(value.size(), 64));
    }
    // The dp rank is the router's to choose (upstream_request_head()): a
    // client's own would steer past the routing decision.
    if (f == http::field::unknown && beast::iequals(name, beast::string_view(kDpRankHeader.data(), kDpRankHeader.size()))) return;
    if (!is_hop_by_hop(f)) append_field(r_.fields, name, value);
  }
  void on_header_impl(beast::error_code& ec) override {
    if (!r_.transfer_coding.empty()) ec = http::error::bad_transfer_encoding;
    else if (check_ && !check_->admit(r_, *this)) ec = asio::error::operation_not_supported;
  }
  void on_body_init_impl(const boost::optional<std::uint64_t>& length, beast::error_code&) override {
    if (length) r_.body.reserve(static_cast<size_t>(*length));  // within body_limit: the parser checked
  }
  size_t on_body_impl(beast::string_view s, beast::error_code&) override {
    r_.body.append(s.data(), s.size());
    return s.size();
  }
  void on_chunk_header_impl(std::uint64_t, beast::string_view, beast::error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code& ec) override {
    const uint64_t need = r_.body.size() + s.size();
    if (lease_ && need > lease_->held()) {
      // In steps (one atomic per 64 KiB or per doubling, not per chunk), never past the body limit.
      const uint64_t step = std::max<uint64_t>({need, 2 * lease_->held(), 64 * 1024});
      if (!lease_->grow(std::min<uint64_t>(step, lease_limit_)) && !lease_->grow(need)) {
        ec = asio::error::no_buffer_space;
        return 0;
      }
    }
    return on_body_impl(s, ec);
  }
  void on_finish_impl(beast::error_code&) override {}

  ClientRequest& r_;
  HeaderCheck* check_;
  BodyLease* lease_ = nullptr;
  uint64_t lease_limit_ = 0;  // the body limit: the lease never grows past it
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
// Connection (close when not pooling), the chosen dp rank (vLLM's API server
// reads X-data-parallel-rank: vllm/entrypoints/openai/engine/serving.py
// _get_data_parallel_rank(), and hands it to its engine client as
// data_parallel_rank; without it vLLM's DP balancer picks) and
// Content-Length, then the blank line.
void upstream_request_head(std::string& h, const ClientRequest& req, const UpstreamUrl& url, bool keep_alive,
                           std::optional<uint32_t> dp_rank) {
  HeadWriter w(h, 160 + req.method_string.size() + url.base.size() + req.target.size() + req.fields.size() +
                      url.host.size() + url.port.size());
  w.text(req.method_string).text(" "sv).text(url.base).text(req.target).text(" HTTP/1.1\r\n"sv);
  w.text(req.fields).text(url.ipv6 ? "Host: ["sv : "Host: "sv).text(url.host).text(url.ipv6 ? "]:"sv : ":"sv);
  w.text(url.port);
  w.text(keep_alive ? "\r\n"sv : "\r\nConnection: close\r\n"sv);
  if (dp_rank) w.text(kDpRankHeader).text(": "sv).number(*dp_rank).text("\r\n"sv);
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
    if (is_hop_by_hop(f) || f == http::field::server) return;  // kvroute names itself
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
// end-to-end fields, Server and kvroute's x-kvroute-* fields, then
// Content-Length (a sized body) or, for an HTTP/1.1 client,
// Transfer-Encoding: chunked (an HTTP/1.0 client gets the body up to the
// connection's close), and Connection: close when the client connection will
// not be kept (keep-alive for an HTTP/1.0 client that keeps it).
void client_response_head(std::string& h, const UpstreamResponse& p, unsigned version, WorkerId worker,
                          uint32_t cached_tokens, std::optional<uint64_t> content_length, bool keep_alive) {
  const beast::string_view obsolete = http::obsolete_reason(static_cast<http::status>(p.status));
  const std::string_view reason = p.reason.empty() ? std::string_view(obsolete.data(), obsolete.size()) : p.reason;
  const bool http10 = version < 11;
  HeadWriter w(h, 256 + reason.size() + p.fields.size());
  w.text(http10 ? "HTTP/1.0 "sv : "HTTP/1.1 "sv).number(p.status).text(" "sv).text(reason).text("\r\n"sv);
  w.text(p.fields).text("Server: kvroute\r\nx-kvroute-worker: "sv).number(worker.value);
  w.text("\r\nx-kvroute-cached-tokens: "sv).number(cached_tokens);
  if (content_length) w.text("\r\nContent-Length: "sv).number(*content_length);
  else if (!http10) w.text("\r\nTransfer-Encoding: chunked"sv);
  if (!keep_alive) w.text("\r\nConnection: close\r\n\r\n"sv);
  else w.text(http10 ? "\r\nConnection: keep-alive\r\n\r\n"sv : "\r\n\r\n"sv);
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
  if (target == "/v1/embeddings") return ApiKind::Embeddings;
  return std::nullopt;
}

std::string_view api_path(ApiKind kind) {
  switch (kind) {
    case ApiKind::ChatCompletions: return "/v1/chat/completions";
    case ApiKind::Embeddings: return "/v1/embeddings";
    default: return "/v1/completions";
  }
}

std::string_view api_label(ApiKind kind) {
  switch (kind) {
    case ApiKind::ChatCompletions: return "chat_completions";
    case ApiKind::Embeddings: return "embeddings";
    default: return "completions";
  }
}

std::string_view route_label(std::string_view target) {
  if (target == "/v1/chat/completions") return "chat_completions";
  if (target == "/v1/completions") return "completions";
  if (target == "/v1/embeddings") return "embeddings";
  if (target == "/v1/models" || target.starts_with("/v1/models/")) return "models";
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
  bool empty() const { return idle_.empty(); }
  bool has_idle(std::string_view key) const {
    auto it = idle_.find(key);
    return it != idle_.end() && !it->second.empty();
  }
  // Closes the idle connections of every url `gone(url)` is true for (a
  // worker that left the registry).
  template <class Gone>
  size_t evict_if(Gone&& gone) {
    size_t closed = 0;
    for (auto it = idle_.begin(); it != idle_.end();) {
      if (!gone(std::string_view(it->first))) {
        ++it;
        continue;
      }
      closed += it->second.size();
      it = idle_.erase(it);
    }
    return closed;
  }

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
  Sweeper connections;  // every client connection; walked when draining (never ticked)
  Sweeper exchanges;    // every proxied request; walked when the shutdown grace is over
  RelayBuffers buffers;
  // Workers this thread reported a failure of (passive health) and has not
  // seen answer since: a success is reported only for them (no registry
  // update per request otherwise).
  std::vector<WorkerId> suspects;
  Steady::time_point next_pool_check{};
  // One thread runs it and only that thread starts operations on its sockets:
  // the reactor's per-socket locks are not needed (registration and posting
  // from other threads stay locked).
  asio::io_context ioc{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(ioc);
  UpstreamPool pool;
  std::thread thread;
};

// A client connection: its socket, the deadline of its current operation, and
// the state its requests need. On its io thread's `connections` list: when
// the server drains, a connection waiting for its next request is closed.
struct ClientConn final : Swept {
  ClientConn(Socket s, IoThread& io) : Swept(io.connections), socket(std::move(s)), deadline(io.sweeper) {}
  Socket socket;
  Deadline deadline;
  bool between = false;  // waiting for the next request, no byte of it received
  uint64_t served = 0;   // requests read on this connection
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
        parsed.prompt_tokens.capacity() * sizeof(TokenId) > kKeptCapacity ||
        parsed.engine_tokens.capacity() * sizeof(TokenId) > kKeptCapacity)
      parsed = ParsedRequest();
    else
      parsed.reset();
    if (route.block_hashes.capacity() * sizeof(LocalBlockHash) > kKeptCapacity) route = RouteResult();
    else route.reset();
  }

 private:
  // Draining: closes a kept-alive connection waiting for its next request (a
  // new connection gets its first request served, with Connection: close).
  void on_sweep(Steady::time_point) override {
    if (!between || served == 0) return;
    beast::error_code ignored;
    socket.cancel(ignored);
  }
};

// What a phase of proxy() tells it to do next.
enum class Next : uint8_t { Go, NextWorker, Done };

// One proxied request, in proxy()'s coroutine frame; its phases read and
// update it. On its io thread's `exchanges` list: when the shutdown grace is
// over, a walk of that list cuts it (its upstream operation is cancelled; a
// stream ends with an error event and [DONE]). Runs on its io thread only.
struct Exchange final : Swept {
  Exchange(ClientConn& c, ClientRequest& r, ApiKind k, IoThread& t, std::shared_ptr<const Config> config)
      : Swept(t.exchanges), client(c), req(r), kind(k), io(t), cfg_holder(std::move(config)), cfg(*cfg_holder),
        up_deadline(t.sweeper), watch(t.sweeper, c.socket) {}

  ClientConn& client;
  ClientRequest& req;
  const ApiKind kind;
  IoThread& io;
  const std::shared_ptr<const Config> cfg_holder;
  const Config& cfg;
  const Steady::time_point started = Steady::now();
  AccessRecord rec;                      // the access log's record, written on every exit
  std::string_view model_label = "unknown";
  bool keep_result = false;              // what proxy() returns when a phase says Done
  bool cut = false;                      // the shutdown grace is over

  // The attempt in progress: one worker of the ranking.
  const RouteTarget* target = nullptr;
  UpstreamUrl url;
  std::optional<InflightGuard> guard;
  std::optional<Socket> upstream;
  bool pooled = false;
  Deadline up_deadline;  // after `upstream`: destroyed first
  std::optional<UpstreamResponseParser> parser;
  beast::error_code ec;
  Steady::time_point sent_at{};
  ClientWatch watch;  // last: stops first

 private:
  void on_sweep(Steady::time_point) override {
    cut = true;
    beast::error_code ignored;
    if (upstream) upstream->cancel(ignored);
  }
};

struct HttpServer::Impl {
  explicit Impl(HttpServerHooks h)
      : hooks(std::move(h)),
        engine_cache(hooks.config ? hooks.config->get()->tokenizer.remote_cache_bytes : 0),
        acceptor(io0().ioc),
        admin_acceptor(admin_io->ioc) {}

  HttpServerHooks hooks;
  // Answers of engines' POST /tokenize (tokenizer.remote), and the per-model
  // backoff after failures; shared by the io threads (router/engine_tokenizer.h).
  EngineTokenCache engine_cache;
  EngineTokenizeBackoff engine_backoff;
  // io[0] exists from construction (the listeners are bound before start()).
  std::vector<std::unique_ptr<IoThread>> io = [] {
    std::vector<std::unique_ptr<IoThread>> v;
    v.push_back(std::make_unique<IoThread>());
    return v;
  }();
  IoThread& io0() { return *io.front(); }
  // The admin listener and its connections run on a thread of their own (at
  // a lower CPU priority): a large PUT /admin/config or a slow explain never
  // holds an io thread of the data plane.
  std::unique_ptr<IoThread> admin_io = std::make_unique<IoThread>();
  size_t next_io = 0;  // round-robin cursor, used by thread 0 only
  Acceptor acceptor;
  Acceptor admin_acceptor;
  std::atomic<bool> stopping{false};
  std::atomic<bool> draining{false};
  std::atomic<int64_t> inflight{0};  // proxied requests being handled
  std::atomic<int64_t> queued{0};    // requests in the wait queue
  std::atomic<int64_t> connections{0};       // open client connections of the OpenAI listener
  std::atomic<int64_t> admin_connections{0};  // open connections of the admin listener
  // The admin listener's own connection cap: an operator's tools need a few;
  // a flood of them must not take every descriptor.
  static constexpr uint64_t kMaxAdminConnections = 256;
  std::atomic<uint64_t> body_bytes{0};       // request body bytes leased (BodyLease)
  std::atomic<uint64_t> connections_refused{0};

  // router.max_connections, 0 = half of the descriptor limit (each client
  // connection may hold an upstream connection too).
  uint64_t connection_limit(const Config& cfg) const {
    if (cfg.router.max_connections) return cfg.router.max_connections;
    return std::max<uint64_t>(64, hooks.open_files_limit / 2);
  }

  awaitable<void> accept_loop(Acceptor& a, bool admin);
  awaitable<void> sweep_loop(IoThread& io);
  awaitable<void> session(Socket socket, bool admin, IoThread& io);
  std::optional<ApiError> admit_body(const ClientRequest& req, const ClientRequestParser& parser, bool admin,
                                     const Config& cfg, BodyLease& lease);
  awaitable<bool> handle(ClientConn& client, ClientRequest& req);
  awaitable<void> answer_read_error(ClientConn& client, beast::error_code ec, const Config& cfg, bool admin,
                                    const ClientRequest& req);
  awaitable<void> close_lingering(ClientConn& client);
  void refuse_connection(Socket& socket, bool admin);
  awaitable<bool> handle_admin(ClientConn& client, ClientRequest& req, IoThread& io);
  // proxy() and its phases, in order (see proxy()).
  awaitable<bool> proxy(ClientConn& client, ClientRequest& req, ApiKind kind, IoThread& io);
  bool sticky_session(const Exchange& x) const;
  bool engine_tokens_cached(const Config& cfg, ParsedRequest& parsed, std::string& body);
  awaitable<void> engine_tokens(IoThread& io, const Config& cfg, ParsedRequest& parsed, std::string_view authorization,
                                const std::string& body);
  awaitable<EngineTokenizeResult> fetch_engine_tokens(IoThread& io, const Config& cfg, std::string_view url,
                                                      std::string_view body, std::string_view authorization,
                                                      Steady::time_point deadline, std::vector<TokenId>& out);
  bool route_request(Exchange& x);
  awaitable<void> wait_in_queue(Exchange& x);
  bool accept_route(Exchange& x);
  bool begin_attempt(Exchange& x, size_t attempt);
  bool take_pooled(Exchange& x);
  awaitable<Next> connect_upstream(Exchange& x);
  awaitable<Next> send_and_read_head(Exchange& x);
  milliseconds first_byte_timeout(const Exchange& x) const;
  Next check_status(Exchange& x, bool another_left);
  void record_first_byte(Exchange& x);
  awaitable<bool> relay(Exchange& x);
  awaitable<bool> relay_small(Exchange& x, char* buf, uint64_t length, bool client_keep);
  awaitable<bool> relay_stream(Exchange& x, char* buf, std::optional<uint64_t> length, bool client_keep);
  awaitable<bool> end_stream_with_error(Exchange& x, bool chunked, bool sized);
  // Outcomes.
  void finish(Exchange& x, unsigned status, std::string_view outcome);
  awaitable<bool> reject(Exchange& x, const ApiError& e, std::string_view outcome);
  void client_cancelled(Exchange& x, unsigned status);
  void upstream_failed(Exchange& x, const char* phase, HealthSignal signal);
  void report_failure(Exchange& x, HealthSignal signal);
  void report_success(Exchange& x);
  // Closes pooled connections to workers that left the registry (sweep_loop).
  void evict_departed(IoThread& io);
  awaitable<bool> models(ClientConn& client, ClientRequest& req, std::string_view id);
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
    // Admin connections stay on the admin thread; the others go round-robin
    // (next_io is touched by thread 0 only).
    IoThread& target = admin ? *admin_io : *io[next_io++ % io.size()];
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
    std::atomic<int64_t>& open = admin ? admin_connections : connections;
    const uint64_t limit = admin ? kMaxAdminConnections : connection_limit(*hooks.config->get());
    if (open.load(std::memory_order_relaxed) >= static_cast<int64_t>(limit)) {
      refuse_connection(socket, admin);
      continue;
    }
    open.fetch_add(1, std::memory_order_relaxed);  // given back when session() ends
    asio::co_spawn(target.ioc, session(std::move(socket), admin, target), asio::detached);
  }
}

// Over router.max_connections: one 503 in a non-blocking send (the socket
// buffer takes it whole) and the connection closes; nothing of the request
// is read, so the descriptor is back at once.
void HttpServer::Impl::refuse_connection(Socket& socket, bool admin) {
  static const std::string kBusy = [] {
    const std::string body = error_body(ApiError{503, "Too many open connections; retry later.",
                                                 "service_unavailable", "", "too_many_connections"});
    return fmt::format("HTTP/1.1 503 Service Unavailable\r\nServer: kvroute\r\nContent-Type: application/json\r\n"
                       "Retry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{}",
                       body.size(), body);
  }();
  const auto n = connections_refused.fetch_add(1, std::memory_order_relaxed) + 1;
  if (hooks.metrics) hooks.metrics->rejected_total.with({admin ? "admin_connection_limit" : "connection_limit"}).inc();
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("{} reached: connection refused ({} so far)",
                 admin ? "the admin listener's 256 connections" : "router.max_connections", n);
  [[maybe_unused]] const ssize_t sent = ::send(socket.native_handle(), kBusy.data(), kBusy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  beast::error_code ignored;
  socket.shutdown(Socket::shutdown_send, ignored);
  socket.close(ignored);
}

// Ticks the io thread's sweeper: a tenth of the shortest configured timeout,
// between 5 and 50 ms, so a timeout fires at most 10% (or 50 ms) late and a
// slow request's client watch is armed within kDelay + one tick.
awaitable<void> HttpServer::Impl::sweep_loop(IoThread& io) {
  Timer timer(io.ioc);
  beast::error_code ec;
  while (!stopping.load()) {
    const auto& r = hooks.config->get()->router;
    const uint32_t shortest =
        std::min({r.connect_timeout_ms, r.first_byte_timeout_ms, r.first_byte_timeout_min_ms, r.idle_timeout_ms,
                  r.client_read_timeout_ms, hooks.config->get()->tokenizer.remote_timeout_ms});
    timer.expires_after(milliseconds(std::clamp<uint32_t>(shortest / 10, 5, 50)));
    co_await timer.async_wait(nothrow(ec));
    io.sweeper.sweep(Steady::now());
    evict_departed(io);
  }
}

// Once a second: pooled connections to a worker that left the registry close
// (its url is no longer any worker's).
void HttpServer::Impl::evict_departed(IoThread& io) {
  const auto now = Steady::now();
  if (now < io.next_pool_check) return;
  io.next_pool_check = now + std::chrono::seconds(1);
  if (io.pool.empty() || !hooks.registry) return;
  const auto workers = hooks.registry->all();
  const size_t closed = io.pool.evict_if([&](std::string_view url) {
    return std::none_of(workers.begin(), workers.end(), [&](const WorkerView& w) { return w.info && w.info->url == url; });
  });
  if (closed) spdlog::debug("closed {} pooled connections to departed workers", closed);
}

awaitable<void> HttpServer::Impl::session(Socket socket, bool admin, IoThread& io) {
  struct Counted {  // the connection's place under router.max_connections (taken by accept_loop())
    std::atomic<int64_t>* n;
    ~Counted() {
      if (n) n->fetch_sub(1, std::memory_order_relaxed);
    }
  } counted{admin ? &admin_connections : &connections};
  ClientConn stream(std::move(socket), io);
  beast::flat_buffer buffer;
  ClientRequest req;
  try {
    for (;;) {
      // Draining: a kept-alive connection closes instead of waiting for the
      // next request (its last response said Connection: close).
      if (stream.served > 0 && draining.load() && buffer.size() == 0) break;
      const auto cfg = hooks.config->get();
      // The body's bytes count against router.max_body_bytes_in_flight until
      // the request is done (admin bodies have their own limit instead).
      BodyLease lease(body_bytes, cfg->router.max_body_bytes_in_flight);
      struct Admission final : HeaderCheck {
        Admission(Impl& i, bool a, const Config& c, BodyLease& l) : im(i), admin(a), cfg(c), lease(l) {}
        bool admit(const ClientRequest& r, const ClientRequestParser& p) override {
          refusal = im.admit_body(r, p, admin, cfg, lease);
          return !refusal;
        }
        Impl& im;
        const bool admin;
        const Config& cfg;
        BodyLease& lease;
        std::optional<ApiError> refusal;
      } admission(*this, admin, *cfg, lease);
      ClientRequestParser parser(req, &admission);
      const uint64_t body_limit = admin ? cfg->admin.max_body_bytes : cfg->router.max_body_bytes;
      parser.header_limit(cfg->router.max_header_bytes);
      parser.body_limit(body_limit);
      if (!admin) parser.lease_chunks(&lease, body_limit);
      stream.expires_after(milliseconds(cfg->router.client_read_timeout_ms));
      beast::error_code ec;
      stream.between = buffer.size() == 0;
      // Limits are checked once the header is in, before a byte of the body
      // is read (`admission`, from the parser's on_header_impl()).
      co_await read_http(stream.socket, buffer, parser, ReadUntil::Message, ec, &stream.between,
                         &req.expect_continue);
      stream.between = false;
      if (admission.refusal) {
        stream.deadline.disarm();
        count(route_label(req.target), admission.refusal->status, "");
        co_await respond_error(stream, req.version, false, *admission.refusal);
        co_await close_lingering(stream);
        break;
      }
      stream.deadline.settle(ec);
      if (ec) {
        co_await answer_read_error(stream, ec, *cfg, admin, req);
        break;
      }
      req.keep_alive = parser.keep_alive();
      ++stream.served;
      // The OpenAI routes go straight to proxy() (one coroutine frame fewer per request).
      bool keep;
      if (req.version >= 11 && !req.has_host) {  // RFC 9112 3.2: 400 for an HTTP/1.1 request without Host
        count("other", 400, "");
        const ApiError e{400, "An HTTP/1.1 request needs a Host header.", "invalid_request_error", "", ""};
        co_await respond_error(stream, req.version, false, e);
        break;
      }
      if (admin) keep = co_await handle_admin(stream, req, io);
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

// What a request's header says decides, before its body is read, whether the
// body may be read at all: over router.max_concurrent_requests (an OpenAI
// route) or with no room left under router.max_body_bytes_in_flight, the
// request is refused with 503 and its body never read.
std::optional<ApiError> HttpServer::Impl::admit_body(const ClientRequest& req, const ClientRequestParser& parser,
                                                     bool admin, const Config& cfg, BodyLease& lease) {
  if (admin) return std::nullopt;
  RouterMetrics* m = hooks.metrics;
  if (proxied_api(req) && inflight.load() >= static_cast<int64_t>(cfg.router.max_concurrent_requests)) {
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

// A request that could not be read: answers what a client can act on (413,
// 431, 400; a closed or timed-out connection gets nothing), then closes
// lingering (close_lingering()).
awaitable<void> HttpServer::Impl::answer_read_error(ClientConn& client, beast::error_code ec, const Config& cfg,
                                                    bool admin, const ClientRequest& req) {
  std::optional<ApiError> e;
  if (ec == http::error::body_limit) {
    e = ApiError{413,
                 fmt::format("Request body exceeds {} bytes ({}).",
                             admin ? cfg.admin.max_body_bytes : cfg.router.max_body_bytes,
                             admin ? "admin.max_body_bytes" : "router.max_body_bytes"),
                 "invalid_request_error", "", "request_too_large"};
  } else if (ec == asio::error::no_buffer_space) {  // a chunked body over router.max_body_bytes_in_flight
    if (hooks.metrics) hooks.metrics->rejected_total.with({"body_budget"}).inc();
    e = ApiError{503, "Too many request bodies are being received; retry later.", "service_unavailable", "",
                 "body_budget_exhausted"};
  } else if (ec == http::error::bad_transfer_encoding && !req.transfer_coding.empty()) {
    e = ApiError{400,
                 fmt::format("Transfer-Encoding '{}' is not supported: the final transfer coding of a request must "
                             "be chunked (RFC 9112 6.3).",
                             req.transfer_coding),
                 "invalid_request_error", "", "bad_transfer_encoding"};
  } else if (ec == http::error::header_limit) {
    e = ApiError{431, fmt::format("Request headers exceed {} bytes.", cfg.router.max_header_bytes),
                 "invalid_request_error", "", "request_header_too_large"};
  } else if (ec.category() == http::make_error_code(http::error::body_limit).category() &&
             ec != http::error::end_of_stream && ec != http::error::partial_message) {
    e = ApiError{400, fmt::format("Malformed HTTP request: {}.", ec.message()), "invalid_request_error", "", ""};
  }
  if (!e) co_return;
  count("other", e->status, "");
  co_await respond_error(client, 11, false, *e);
  co_await close_lingering(client);
}

// Closes after an answer while the client may still be sending: what it sends
// is read and dropped for a moment (at most 4 MiB, 500 ms), so that closing
// with unread data (a reset) does not destroy the answer.
awaitable<void> HttpServer::Impl::close_lingering(ClientConn& client) {
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

namespace {
// "%2F" -> "/" (a model id such as "Qwen/Qwen3-8B" may come either way).
std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned v = 0;
    if (s[i] == '%' && i + 2 < s.size() &&
        std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16).ptr == s.data() + i + 3) {
      out += static_cast<char>(v);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}
}  // namespace

// GET /v1/models/{id}: the OpenAI model object of a model some worker serves.
awaitable<bool> HttpServer::Impl::models(ClientConn& client, ClientRequest& req, std::string_view id) {
  const std::string model = percent_decode(id);
  const auto known = hooks.registry->models();
  if (std::find(known.begin(), known.end(), model) == known.end()) {
    count("models", 404, "");
    const ApiError e{404, fmt::format("The model '{}' does not exist.", model), "invalid_request_error", "model",
                     "model_not_found"};
    co_return co_await respond_error(client, req.version, req.keep_alive, e);
  }
  std::string body =
      fmt::format(R"({{"id":"{}","object":"model","created":0,"owned_by":"kvroute"}})", json_escape(model));
  count("models", 200, "");
  co_return co_await respond(client, req.version, req.keep_alive, http::status::ok, std::move(body));
}

awaitable<bool> HttpServer::Impl::handle_admin(ClientConn& client, ClientRequest& req, IoThread& io) {
  std::string_view target = req.target;
  target = target.substr(0, target.find('?'));
  // Route explain tokenizes as the data plane does: a model without a local
  // tokenizer is first tokenized by its engine (tokenizer.remote).
  if (hooks.admin && hooks.routing && target == "/admin/route/explain" && req.method == http::verb::post &&
      hooks.admin->authorized(req.authorization)) {
    const auto cfg = hooks.config->get();
    const bool chat = req.body.find("\"messages\"") != std::string::npos;
    ParsedRequest parsed;
    ApiError err;
    if (parse_openai_request(chat ? ApiKind::ChatCompletions : ApiKind::Completions, req.body, parsed, err) &&
        hooks.routing->needs_engine_tokens(*cfg, parsed)) {
      std::string body;
      if (!engine_tokens_cached(*cfg, parsed, body)) co_await engine_tokens(io, *cfg, parsed, {}, body);
      AdminResponse r = hooks.admin->explain(parsed);
      co_return co_await respond(client, req.version, req.keep_alive, static_cast<http::status>(r.status),
                                 std::move(r.body), r.content_type);
    }
  }
  AdminResponse r = hooks.admin ? hooks.admin->handle(req.method_string, target, req.authorization, req.body)
                                : AdminResponse{404, R"({"error":{"message":"no admin API"}})"};
  // Parsing a large YAML document takes about 80 times its size in small
  // allocations, freed at once but kept by malloc: give them back to the
  // system (this thread's arena and the others'), so one PUT does not leave
  // the process that much larger.
  if (req.body.size() > kKeptCapacity) malloc_trim(0);
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
  if (target.starts_with("/v1/models/") && get) co_return co_await models(client, req, target.substr(11));
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

// Passive health: a worker's failure as the proxy saw it; a success is
// reported only after this thread reported a failure of the same worker.
void HttpServer::Impl::report_failure(Exchange& x, HealthSignal signal) {
  const WorkerId id = x.target->worker;
  hooks.registry->report_failure(id, signal);
  auto& s = x.io.suspects;
  if (std::find(s.begin(), s.end(), id) == s.end()) s.push_back(id);
}

void HttpServer::Impl::report_success(Exchange& x) {
  auto& s = x.io.suspects;
  if (s.empty()) return;
  const auto it = std::find(s.begin(), s.end(), x.target->worker);
  if (it == s.end()) return;
  s.erase(it);
  hooks.registry->report_success(x.target->worker);
}

// The access record and the request metrics, on every exit of proxy().
void HttpServer::Impl::finish(Exchange& x, unsigned status, std::string_view outcome) {
  x.rec.status = status;
  x.rec.outcome = outcome;
  const double seconds = seconds_since(x.started);
  x.rec.duration_ms = seconds * 1e3;
  count(api_label(x.kind), status, x.model_label);
  if (RouterMetrics* m = hooks.metrics) {
    if (x.kind == ApiKind::ChatCompletions) m->duration_chat.observe(seconds);
    else if (x.kind == ApiKind::Completions) m->duration_completions.observe(seconds);
    else m->request_duration_seconds.with({api_label(x.kind)}).observe(seconds);
  }
  if (x.cfg.log.access_log) log_access(x.rec);
}

awaitable<bool> HttpServer::Impl::reject(Exchange& x, const ApiError& e, std::string_view outcome) {
  finish(x, e.status, outcome);
  co_return co_await respond_error(x.client, x.req.version, x.req.keep_alive, e);
}

// The client went away: count it and log `status` (499 if it never got one).
void HttpServer::Impl::client_cancelled(Exchange& x, unsigned status) {
  if (hooks.metrics) hooks.metrics->cancels_total.get().inc();
  finish(x, status, "client_cancel");
}

// The request's session (x-session-id, else the OpenAI `user` field).
static std::string_view session_key(const Exchange& x) {
  return x.req.session.empty() ? std::string_view(x.client.parsed.user) : std::string_view(x.req.session);
}

// Session affinity applies (router/session_affinity.h): the decision scores
// every eligible worker (not the fast path's few), so the session's worker is
// compared with the choice wherever it ranks.
bool HttpServer::Impl::sticky_session(const Exchange& x) const {
  return hooks.sessions && x.cfg.scheduler.session_affinity && !session_key(x).empty();
}

// Tokenization by the engine (tokenizer.remote = auto; router/engine_tokenizer.h),
// the synchronous half: the /tokenize body for the request into `body`, and
// its answer from the cache if one was seen. True when the request needs no
// round trip (a cache hit, or nothing to ask: engine_failed).
bool HttpServer::Impl::engine_tokens_cached(const Config& cfg, ParsedRequest& parsed, std::string& body) {
  RouterMetrics* m = hooks.metrics;
  if (!engine_tokenize_body(parsed, body)) {
    parsed.engine_failed = true;
    return true;
  }
  if (engine_cache.get(EngineTokenCache::key_of(body), parsed.engine_tokens)) {
    if (m) m->engine_cache_hit.inc();
    parsed.has_engine_tokens = true;
    return true;
  }
  if (m && cfg.tokenizer.remote_cache_bytes > 0) m->engine_cache_miss.inc();
  return false;
}

// The round trip (a cache miss): the request has text or chat and kvroute
// holds no tokenizer that can tokenize it, so one of the model's workers is
// asked with its own POST /tokenize (`body`), within
// tokenizer.remote_timeout_ms. Connection failures move on to one more
// worker; any failure leaves the request to the placeholder
// (parsed.engine_failed: counted, warned), and the engine's own failures
// (not a request it refuses) start the model's backoff.
awaitable<void> HttpServer::Impl::engine_tokens(IoThread& io, const Config& cfg, ParsedRequest& parsed,
                                                std::string_view authorization, const std::string& body) {
  RouterMetrics* m = hooks.metrics;
  const bool chat = parsed.kind == ApiKind::ChatCompletions;
  EngineTokenizeResult result = EngineTokenizeResult::NoWorker;
  const auto start = Steady::now();
  if (!engine_backoff.allow(parsed.model, chat, start)) {
    result = EngineTokenizeResult::Backoff;
  } else {
    // Any healthy worker serving the model (a LoRA adapter: one serving it):
    // a non-draining one with an idle pooled connection on this thread first
    // (no connect), else round-robin from a per-thread cursor.
    std::vector<WorkerView> workers;
    thread_local size_t cursor = 0;
    hooks.registry->candidates(parsed.model, workers);
    if (std::any_of(workers.begin(), workers.end(), [](const WorkerView& w) { return !w.draining; }))
      std::erase_if(workers, [](const WorkerView& w) { return w.draining; });
    const size_t n = workers.size();
    const size_t first = n ? cursor++ % n : 0;
    size_t pick = first;
    for (size_t i = 0; i < n; ++i)
      if (io.pool.has_idle(workers[(first + i) % n].info->url)) {
        pick = (first + i) % n;
        break;
      }
    const auto deadline = start + milliseconds(cfg.tokenizer.remote_timeout_ms);
    for (size_t attempt = 0; attempt < std::min<size_t>(n, 2) && Steady::now() < deadline; ++attempt) {
      const WorkerView& w = workers[(pick + attempt) % n];
      const std::string url = w.info->url;
      const WorkerId id = w.info->id;
      const auto t0 = Steady::now();
      result = co_await fetch_engine_tokens(io, cfg, url, body, authorization, deadline, parsed.engine_tokens);
      if (m) m->engine_tokenize_seconds.get().observe(seconds_since(t0));
      if (result != EngineTokenizeResult::Connect) break;
      // Refused: counted and reported to passive health as the proxy does,
      // so a dead worker leaves the candidates as fast either way.
      if (m) m->upstream_errors_total.with({"connect"}).inc();
      hooks.registry->report_failure(id, HealthSignal::ConnectRefused);
      if (std::find(io.suspects.begin(), io.suspects.end(), id) == io.suspects.end()) io.suspects.push_back(id);
    }
  }
  if (m) m->engine_tokenize_total.with({to_string(result)}).inc();
  if (result == EngineTokenizeResult::Ok) {
    parsed.has_engine_tokens = true;
    engine_backoff.on_success(parsed.model, chat);
    engine_cache.put(EngineTokenCache::key_of(body), parsed.engine_tokens);
    co_return;
  }
  parsed.engine_tokens.clear();
  parsed.engine_failed = true;
  if (EngineTokenizeBackoff::backs_off(result)) engine_backoff.on_failure(parsed.model, chat, Steady::now());
  if (result == EngineTokenizeResult::NoWorker) co_return;  // an unknown model (404) or no healthy worker (503)
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("model '{}': the engine's POST /tokenize failed ({}); this request is routed on placeholder tokens",
                 parsed.model, to_string(result));
}

// One POST /tokenize to the worker at `url` on this io thread (a pooled
// keep-alive connection if one is idle, else a new one), answered whole by
// `deadline`; the answer bounded by tokenizer.remote_max_tokens. The
// connection goes back to the pool when the answer leaves it reusable.
awaitable<EngineTokenizeResult> HttpServer::Impl::fetch_engine_tokens(IoThread& io, const Config& cfg,
                                                                      std::string_view url_text,
                                                                      std::string_view body,
                                                                      std::string_view authorization,
                                                                      Steady::time_point deadline,
                                                                      std::vector<TokenId>& out) {
  UpstreamUrl url;
  if (!parse_url(url_text, url)) co_return EngineTokenizeResult::Connect;
  const bool keep = cfg.router.upstream_pool_size > 0;
  std::string head;
  head.reserve(256 + authorization.size());
  head += "POST ";
  head += url.base;
  head += "/tokenize HTTP/1.1\r\nHost: ";
  if (url.ipv6) head += '[';
  head += url.host;
  head += url.ipv6 ? "]:" : ":";
  head += url.port;
  head += "\r\nContent-Type: application/json\r\nAccept: application/json\r\n";
  if (!authorization.empty()) {
    head += "Authorization: ";
    head += authorization;
    head += "\r\n";
  }
  if (!keep) head += "Connection: close\r\n";
  head += "Content-Length: ";
  head += std::to_string(body.size());
  head += "\r\n\r\n";
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
    beast::error_code ec;
    if (!socket) {
      socket.emplace(io.ioc.get_executor());
      timer.arm(*socket, left);
      const auto addr = asio::ip::make_address(url.host, ec);
      if (!ec) {
        uint16_t port = 0;
        std::from_chars(url.port.data(), url.port.data() + url.port.size(), port);
        co_await socket->async_connect(tcp::endpoint(addr, port), nothrow(ec));
      } else {
        Resolver resolver(io.ioc.get_executor());
        auto results = co_await resolver.async_resolve(url.host, url.port, nothrow(ec));
        if (!ec) co_await asio::async_connect(*socket, results, nothrow(ec));
      }
      timer.settle(ec);
      if (ec) co_return ec == asio::error::timed_out ? EngineTokenizeResult::Timeout : EngineTokenizeResult::Connect;
      beast::error_code ignored;
      socket->set_option(tcp::no_delay(true), ignored);
    }
    timer.arm(*socket, std::chrono::duration_cast<milliseconds>(deadline - Steady::now()));
    const std::array<asio::const_buffer, 2> wire{asio::buffer(head), asio::buffer(body.data(), body.size())};
    co_await asio::async_write(*socket, wire, nothrow(ec));
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.header_limit(16 * 1024);
    parser.body_limit(max_bytes);
    if (!ec) co_await read_http(*socket, buffer, parser, ReadUntil::Message, ec);
    timer.settle(ec);
    if (ec == asio::error::timed_out) co_return EngineTokenizeResult::Timeout;
    if (ec == http::error::body_limit) co_return EngineTokenizeResult::TooLarge;
    if (ec && pooled) continue;
    if (ec) co_return EngineTokenizeResult::Connect;
    const auto& res = parser.get();
    const bool reusable = keep && parser.keep_alive() && buffer.size() == 0;
    const unsigned status = res.result_int();
    const EngineTokenizeResult result =
        status == 200   ? parse_engine_tokenize_response(res.body(), cfg.tokenizer.remote_max_tokens, out)
        : status / 100 == 4 ? EngineTokenizeResult::Rejected
                            : EngineTokenizeResult::Status;
    if (reusable) io.pool.give(url_text, std::move(*socket), cfg.router.upstream_pool_size);
    co_return result;
  }
  co_return EngineTokenizeResult::Connect;
}

// Routes the parsed request into client.route. True: every worker is busy
// and the request may wait in the queue (wait_in_queue()).
bool HttpServer::Impl::route_request(Exchange& x) {
  hooks.routing->route(x.client.parsed, x.client.route, /*rank_all=*/false, sticky_session(x));
  const RouteResult& route = x.client.route;
  return !route.ok && route.error.code == "workers_busy" && x.cfg.scheduler.queue_size > 0;
}

// No eligible worker (all busy): waits in the bounded queue, re-routing as
// load changes, until a worker is free, the queue timeout, or shutdown.
awaitable<void> HttpServer::Impl::wait_in_queue(Exchange& x) {
  RouterMetrics* m = hooks.metrics;
  RouteResult& route = x.client.route;
  const auto& sc = x.cfg.scheduler;
  if (queued.fetch_add(1) >= static_cast<int64_t>(sc.queue_size)) {
    queued.fetch_sub(1);
    if (m) m->rejected_total.with({"queue_full"}).inc();
    route.error.message = "Every worker is busy and the wait queue is full; retry later.";
    co_return;
  }
  if (m) m->queued_requests.get().add(1);
  const auto deadline = Steady::now() + milliseconds(sc.queue_timeout_ms);
  Timer timer(x.io.ioc);
  beast::error_code ec;
  while (!route.ok && route.error.code == "workers_busy" && Steady::now() < deadline && !stopping.load() &&
         !x.cut) {
    timer.expires_after(kQueuePoll);
    co_await timer.async_wait(nothrow(ec));
    hooks.routing->reroute(x.client.parsed.model, route, sticky_session(x));  // keeps the request's tokens and hashes
  }
  queued.fetch_sub(1);
  if (m) m->queued_requests.get().add(-1);
  if (!route.ok && route.error.code == "workers_busy") {
    if (m) m->rejected_total.with({"queue_timeout"}).inc();
    route.error.message = fmt::format("No worker became free within {} ms; retry later.", sc.queue_timeout_ms);
  }
}

// The decision's metrics; false if there is no worker to send the request to.
bool HttpServer::Impl::accept_route(Exchange& x) {
  const RouteResult& route = x.client.route;
  if (RouterMetrics* m = hooks.metrics) {
    for (int i = 0; i < 4; ++i) m->stage_seconds[i]->observe(route.stage_seconds[i]);
    (!route.ok ? m->decided_no_worker : route.chose_best_overlap ? m->decided_best_overlap : m->decided_balance).inc();
    if (route.all_busy) m->all_busy_total.get().inc();
    if (route.ok && route.tokenizer_fallback != TokenizerFallback::None)
      m->tokenizer_fallbacks_total.with({x.client.parsed.model, to_string(route.tokenizer_fallback)}).inc();
    if (route.ok) m->tokenized(x.client.parsed.model, to_string(route.token_source)).inc();
  }
  x.rec.prompt_tokens = route.isl_tokens;
  if (!route.ok && route.error.code == "context_length_exceeded" && hooks.metrics)
    hooks.metrics->rejected_total.with({"prompt_exceeds_kv"}).inc();
  if (!route.ok) return false;
  x.model_label = x.client.parsed.model;  // bounded: a model some worker announced
  if (sticky_session(x)) hooks.sessions->apply(session_key(x), x.cfg.indexer.block_size, x.client.route);
  if (hooks.on_routed) hooks.on_routed(x.client.parsed, route);
  return true;
}

// Starts the attempt on the ranking's `attempt`-th worker: in-flight
// accounting and the request head to send it. False if its url is unusable.
bool HttpServer::Impl::begin_attempt(Exchange& x, size_t attempt) {
  x.watch.client_gone();
  x.up_deadline.disarm();
  x.parser.reset();
  x.upstream.reset();
  x.guard.reset();
  const RouteTarget& target = x.client.route.ranked[attempt];
  x.target = &target;
  x.rec.attempts = static_cast<uint32_t>(attempt + 1);
  x.rec.worker = static_cast<int64_t>(target.worker.value);
  x.rec.cached_tokens = target.cached_tokens;
  if (attempt > 0 && hooks.metrics) hooks.metrics->retries_total.get().inc();
  if (!parse_url(target.url, x.url)) {
    static RateLimiter rl;
    if (rl.allow()) spdlog::warn("worker {} has an unusable url '{}'", target.worker.value, target.url);
    return false;
  }
  // A batch is routed on its first prompt; its load is counted as that many
  // prompts like the first (n > 1 shares the prompt's prefill and blocks).
  const uint64_t prompts = x.client.parsed.prompts;
  x.guard.emplace(*hooks.registry, target.worker, x.client.route.request_blocks * prompts,
                  target.prefill_tokens * prompts);
  if (hooks.on_dispatch) hooks.on_dispatch(target.worker, x.client.route);
  // The request to forward: unchanged but for hop-by-hop headers. Its head is
  // written out here (fields as Beast parsed and validated them) and sent with
  // the body in one gather write: no serializer on the hot path.
  upstream_request_head(x.client.upstream_head, x.req, x.url, x.cfg.router.upstream_pool_size > 0, target.dp_rank);
  return true;
}

// A pooled connection to the attempt's worker, if one is idle.
bool HttpServer::Impl::take_pooled(Exchange& x) {
  auto s = x.io.pool.take(x.target->url);
  if (!s) return false;
  x.upstream.emplace(std::move(*s));
  return true;
}

// A connection to a worker failed before its response head: counted, logged,
// reported to passive health.
void HttpServer::Impl::upstream_failed(Exchange& x, const char* phase, HealthSignal signal) {
  if (hooks.metrics) hooks.metrics->upstream_errors_total.with({phase}).inc();
  report_failure(x, signal);
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("worker {} ({}): {} failed: {}; trying the next worker", x.target->worker.value, x.target->url,
                 phase, x.ec.message());
}

// A fresh connection to the attempt's worker, within router.connect_timeout_ms.
awaitable<Next> HttpServer::Impl::connect_upstream(Exchange& x) {
  x.up_deadline.disarm();
  x.upstream.emplace(x.io.ioc.get_executor());
  Socket& up = *x.upstream;
  x.ec = {};
  x.up_deadline.arm(up, milliseconds(x.cfg.router.connect_timeout_ms));
  beast::error_code addr_ec;
  const auto addr = asio::ip::make_address(x.url.host, addr_ec);
  if (!addr_ec) {
    uint16_t port = 0;
    std::from_chars(x.url.port.data(), x.url.port.data() + x.url.port.size(), port);
    const tcp::endpoint endpoint(addr, port);
    co_await up.async_connect(endpoint, nothrow(x.ec));
  } else {
    Resolver resolver(x.io.ioc.get_executor());
    auto results = co_await resolver.async_resolve(x.url.host, x.url.port, nothrow(x.ec));
    if (!x.ec) co_await asio::async_connect(up, results, nothrow(x.ec));
  }
  x.up_deadline.settle(x.ec);
  if (x.ec) {
    if (!x.cut)
      upstream_failed(x, "connect",
                      x.ec == asio::error::timed_out ? HealthSignal::ConnectTimeout : HealthSignal::ConnectRefused);
    co_return Next::NextWorker;
  }
  beast::error_code ignored;
  up.set_option(tcp::no_delay(true), ignored);
  co_return Next::Go;
}

// The first-byte timeout of this attempt: a multiple of the request's
// predicted time to first token on its worker (its uncached prefill plus the
// prefill the router already has in flight there), within the floor and
// ceiling (router/proxy_policy.h).
milliseconds HttpServer::Impl::first_byte_timeout(const Exchange& x) const {
  uint64_t prefill = x.target->prefill_tokens;
  for (const WorkerView& w : x.client.route.workers)
    if (w.info && w.info->id == x.target->worker) prefill += w.pending_prefill_tokens;
  return adaptive_first_byte_timeout(x.cfg.router, estimated_ttft_seconds(x.cfg.router, prefill));
}

// Sends the request and reads the worker's response head (the first byte),
// watching for the client going away meanwhile. A pooled connection that
// fails (the worker closed it while idle) is not the worker's fault: the
// caller retries on a fresh one.
awaitable<Next> HttpServer::Impl::send_and_read_head(Exchange& x) {
  Socket& up = *x.upstream;
  x.ec = {};
  x.up_deadline.arm(up, first_byte_timeout(x));
  x.sent_at = Steady::now();
  // One send nearly always takes the whole request; asio::async_write (a
  // composed operation) only for what it leaves.
  std::array<asio::const_buffer, 2> wire{asio::buffer(x.client.upstream_head), asio::buffer(x.req.body)};
  std::span<asio::const_buffer> rest(wire);
  const size_t sent = co_await up.async_write_some(rest, nothrow(x.ec));
  if (!x.ec && consume(rest, sent)) co_await asio::async_write(up, rest, nothrow(x.ec));
  x.parser.emplace(x.client.response);
  x.parser->body_limit(std::numeric_limits<std::uint64_t>::max());
  x.client.upstream_buffer.clear();
  if (!x.ec) {
    x.watch.watch(up, false);  // while the worker prefills
    co_await read_http(up, x.client.upstream_buffer, *x.parser, ReadUntil::Header, x.ec);
    if (x.ec && x.watch.client_gone()) {
      client_cancelled(x, 499);
      x.keep_result = false;
      co_return Next::Done;
    }
  }
  x.up_deadline.settle(x.ec);
  if (!x.ec) co_return Next::Go;
  x.watch.client_gone();
  const bool timed_out = x.ec == asio::error::timed_out;
  if (x.cut || (x.pooled && !timed_out)) co_return Next::NextWorker;
  // The worker is at fault (a timeout, or a fresh connection it closed): the
  // next worker, not a fresh connection to this one.
  x.pooled = false;
  upstream_failed(x, "first_byte", timed_out ? HealthSignal::FirstByteTimeout : HealthSignal::ServerError);
  co_return Next::NextWorker;
}

// The worker answered: a 5xx counts against it and 502/503/504 move on to
// the next worker while one is left; anything else (a 4xx is the client's
// own error) is relayed as it is, never retried.
Next HttpServer::Impl::check_status(Exchange& x, bool another_left) {
  const unsigned status = x.client.response.status;
  if (status < 500) {
    report_success(x);
    return Next::Go;
  }
  if (hooks.metrics) hooks.metrics->upstream_errors_total.with({"status_5xx"}).inc();
  report_failure(x, HealthSignal::ServerError);
  if ((status == 502 || status == 503 || status == 504) && another_left) {
    if (x.watch.client_gone()) {
      client_cancelled(x, 499);
      x.keep_result = false;
      return Next::Done;
    }
    return Next::NextWorker;  // the connection (and any body) is dropped
  }
  return Next::Go;
}

// Committed to the worker: the first byte's metrics. The access log's
// ttfb_ms is the client's: from the request read to its first response byte,
// every failed-over attempt included; the histogram is the chosen worker's
// (request sent to first byte).
void HttpServer::Impl::record_first_byte(Exchange& x) {
  const double ttfb = seconds_since(x.sent_at);
  x.rec.ttfb_ms = seconds_since(x.started) * 1e3;
  RouterMetrics* m = hooks.metrics;
  if (!m) return;
  const RouteResult& route = x.client.route;
  const RouteTarget& target = *x.target;
  m->ttfb_seconds.get().observe(ttfb);
  m->prompt_tokens_total.get().inc(route.isl_tokens);
  m->cached_tokens_total.get().inc(target.cached_tokens);
  m->best_cached_tokens_total.get().inc(route.best_cached_tokens);  // decision-quality gap
  const auto worker = m->worker_tokens(target.worker.value);
  worker.prompt.inc(route.isl_tokens);
  worker.cached.inc(target.cached_tokens);
  m->overlap_ratio.get().observe(route.isl_tokens ? double(target.cached_tokens) / route.isl_tokens : 0.0);
}

// Relays the worker's response to the client: a small sized body whole, with
// its head in one write; anything else piece by piece as it arrives.
awaitable<bool> HttpServer::Impl::relay(Exchange& x) {
  record_first_byte(x);
  UpstreamResponseParser& parser = *x.parser;
  // A body without a length (chunked, or up to the connection's end) goes to
  // the client chunked (an HTTP/1.0 client: up to the connection's close); a
  // sized one keeps its length.
  std::optional<uint64_t> length;
  if (!parser.chunked()) {
    if (const auto declared = parser.content_length()) length = *declared;
    else if (parser.is_done()) length = 0;  // no body at all (e.g. 204)
  }
  const bool client_keep = x.req.keep_alive && !draining.load() && (length || x.req.version >= 11);
  RelayBuffers::Lease lease = x.io.buffers.take();
  bool relayed;
  if (length && *length <= kRelayBufferBytes) relayed = co_await relay_small(x, lease.data(), *length, client_keep);
  else relayed = co_await relay_stream(x, lease.data(), length, client_keep);
  if (!relayed) co_return false;  // the outcome is recorded
  x.watch.client_gone();
  x.up_deadline.disarm();
  if (parser.keep_alive() && x.cfg.router.upstream_pool_size > 0)
    x.io.pool.give(x.target->url, std::move(*x.upstream), x.cfg.router.upstream_pool_size);
  const unsigned status = x.client.response.status;
  finish(x, status, status < 400 ? "ok" : "worker_error");
  co_return client_keep;
}

// A small sized body (a non-streaming answer) is read whole first, so the
// client gets head and body in one write: one send on the hot path.
awaitable<bool> HttpServer::Impl::relay_small(Exchange& x, char* buf, uint64_t length, bool client_keep) {
  UpstreamResponseParser& parser = *x.parser;
  const unsigned status = x.client.response.status;
  const milliseconds idle(x.cfg.router.idle_timeout_ms);
  beast::error_code& ec = x.ec;
  parser.body_into(buf, static_cast<size_t>(length));
  if (!parser.is_done()) {
    x.up_deadline.arm(*x.upstream, idle);
    co_await read_http(*x.upstream, x.client.upstream_buffer, parser, ReadUntil::Message, ec);
    x.up_deadline.settle(ec);
  }
  if (x.watch.client_gone()) {
    client_cancelled(x, status);
    co_return false;
  }
  if (ec == http::error::need_buffer) ec = {};
  if (ec && x.cut) {
    static const ApiError shutting_down{503, "The router is shutting down.", "service_unavailable", "",
                                        "shutting_down"};
    co_await reject(x, shutting_down, "shutdown");
    co_return false;
  }
  if (ec) {
    if (hooks.metrics) hooks.metrics->upstream_errors_total.with({"mid_stream"}).inc();
    finish(x, status, "upstream_error");
    co_return false;  // nothing sent yet, but the worker is committed: close
  }
  const size_t body_size = static_cast<size_t>(length) - parser.room();
  client_response_head(x.client.response_head, x.client.response, x.req.version, x.target->worker,
                       x.target->cached_tokens, body_size, client_keep);
  std::array<asio::const_buffer, 2> wire{asio::buffer(x.client.response_head), asio::buffer(buf, body_size)};
  std::span<asio::const_buffer> rest(wire);
  x.client.expires_after(idle);
  const size_t sent = co_await x.client.socket.async_write_some(rest, nothrow(ec));  // as for the request
  if (!ec && consume(rest, sent)) co_await asio::async_write(x.client.socket, rest, nothrow(ec));
  x.client.deadline.settle(ec);
  if (ec) {
    client_cancelled(x, status);
    co_return false;
  }
  co_return true;
}

// A stream, or a large body: head first, then each piece as it arrives (a
// chunk each when chunked), with one watch on the client to the end.
awaitable<bool> HttpServer::Impl::relay_stream(Exchange& x, char* buf, std::optional<uint64_t> length,
                                               bool client_keep) {
  static constexpr std::string_view kCrlf = "\r\n";
  static constexpr std::string_view kLastChunk = "0\r\n\r\n";
  UpstreamResponseParser& parser = *x.parser;
  const unsigned status = x.client.response.status;
  const milliseconds idle(x.cfg.router.idle_timeout_ms);
  beast::error_code& ec = x.ec;
  x.guard->first_byte();  // the worker's prefill is over
  if (x.watch.client_gone()) {
    client_cancelled(x, 499);
    co_return false;
  }
  const bool chunked = !length && x.req.version >= 11;
  client_response_head(x.client.response_head, x.client.response, x.req.version, x.target->worker,
                       x.target->cached_tokens, length, client_keep);
  x.client.expires_after(idle);
  co_await asio::async_write(x.client.socket, asio::buffer(x.client.response_head), nothrow(ec));
  x.client.deadline.settle(ec);
  if (ec) {
    client_cancelled(x, 499);
    co_return false;
  }
  x.watch.watch(*x.upstream, true);
  bool last = parser.is_done();  // an empty body: just the last chunk
  while (!last || chunked) {
    size_t n = 0;
    if (!last) {
      parser.body_into(buf, kRelayBufferBytes);
      x.up_deadline.arm(*x.upstream, idle);
      co_await read_http(*x.upstream, x.client.upstream_buffer, parser, ReadUntil::Some, ec);
      x.up_deadline.settle(ec);
      if (ec && x.watch.client_gone()) {
        client_cancelled(x, status);
        co_return false;
      }
      if (ec == http::error::need_buffer) ec = {};
      if (ec) co_return co_await end_stream_with_error(x, chunked, length.has_value());
      n = kRelayBufferBytes - parser.room();
      last = parser.is_done();
      if (n == 0 && !(last && chunked)) continue;  // only framing arrived: nothing to pass on yet
    }
    char line[24];
    std::array<asio::const_buffer, 4> piece{};
    size_t parts = 0;
    if (chunked && n) piece[parts++] = asio::buffer(chunk_size_line(n, line));
    if (n) piece[parts++] = asio::buffer(buf, n);
    if (chunked && n) piece[parts++] = asio::buffer(kCrlf);
    if (chunked && last) piece[parts++] = asio::buffer(kLastChunk);
    x.client.expires_after(idle);
    co_await asio::async_write(x.client.socket, std::span(piece.data(), parts), nothrow(ec));
    x.client.deadline.settle(ec);
    if (ec) {  // client gone: the upstream connection closes with this exchange
      client_cancelled(x, status);
      co_return false;
    }
    if (last) break;
  }
  co_return true;
}

// The worker failed mid-response, or the shutdown grace cut it. A stream
// without a declared length ends with an OpenAI-style error event and
// [DONE]; a sized body cannot signal it: the connection closes.
awaitable<bool> HttpServer::Impl::end_stream_with_error(Exchange& x, bool chunked, bool sized) {
  const unsigned status = x.client.response.status;
  if (x.cut) {
    finish(x, status, "shutdown");
  } else {
    if (hooks.metrics) hooks.metrics->upstream_errors_total.with({"mid_stream"}).inc();
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("worker {} ({}): failed mid-response: {}", x.target->worker.value, x.target->url, x.ec.message());
    finish(x, status, "upstream_error");
  }
  if (!x.client.response.event_stream || sized) co_return false;
  const ApiError e = x.cut ? ApiError{503, "The router is shutting down; the response was cut.",
                                      "service_unavailable", "", "shutting_down"}
                           : ApiError{502, "The worker failed while streaming the response.", "upstream_error", "",
                                      "upstream_failed"};
  const std::string tail = fmt::format("data: {}\n\ndata: [DONE]\n\n", error_body(e));
  char line[24];
  static constexpr std::string_view kCrlf = "\r\n";
  static constexpr std::string_view kLastChunk = "0\r\n\r\n";
  const std::array<asio::const_buffer, 4> framed{asio::buffer(chunk_size_line(tail.size(), line)),
                                                 asio::buffer(tail), asio::buffer(kCrlf), asio::buffer(kLastChunk)};
  const std::array<asio::const_buffer, 1> raw{asio::buffer(tail)};  // close-delimited (HTTP/1.0)
  x.watch.client_gone();
  x.client.expires_after(milliseconds(x.cfg.router.idle_timeout_ms));
  beast::error_code ec;
  if (chunked) co_await asio::async_write(x.client.socket, framed, nothrow(ec));
  else co_await asio::async_write(x.client.socket, raw, nothrow(ec));
  x.client.deadline.settle(ec);
  co_return false;
}

// One proxied OpenAI request, as its phases: limit, parse, route (maybe
// queue), then for each worker of the ranking until one answers: connect
// (or a pooled connection), send and read the response head; then relay.
awaitable<bool> HttpServer::Impl::proxy(ClientConn& client, ClientRequest& req, ApiKind kind, IoThread& io) {
  Exchange x(client, req, kind, io, hooks.config->get());
  x.rec.method = "POST";
  x.rec.path = api_path(kind);
  // Concurrency limit: counted for the whole request, released on every exit
  // (the in-flight gauge reads the count at scrape time).
  struct Slot {
    std::atomic<int64_t>& n;
    explicit Slot(std::atomic<int64_t>& c) : n(c) { n.fetch_add(1); }
    ~Slot() { n.fetch_sub(1); }
  } slot(inflight);
  if (inflight.load() > static_cast<int64_t>(x.cfg.router.max_concurrent_requests)) {
    if (hooks.metrics) hooks.metrics->rejected_total.with({"limit"}).inc();
    static const ApiError e{503, "Too many concurrent requests; retry later.", "service_unavailable", "",
                            "too_many_requests"};
    co_return co_await reject(x, e, "rejected_limit");
  }
  ApiError err;
  if (!parse_openai_request(kind, req.body, client.parsed, err)) co_return co_await reject(x, err, "bad_request");
  x.rec.model = client.parsed.model;
  x.rec.stream = client.parsed.stream;
  if (hooks.routing->needs_engine_tokens(x.cfg, client.parsed)) {
    thread_local std::string scratch;  // no allocation per request once grown; used before any suspension
    if (!engine_tokens_cached(x.cfg, client.parsed, scratch)) {
      const std::string body = scratch;  // in the frame: other requests use the scratch while this one waits
      co_await engine_tokens(io, x.cfg, client.parsed, req.authorization, body);
    }
  }
  if (route_request(x)) co_await wait_in_queue(x);
  if (!accept_route(x)) co_return co_await reject(x, client.route.error, "no_worker");

  const size_t attempts = std::min<size_t>(x.cfg.router.max_attempts, client.route.ranked.size());
  for (size_t attempt = 0; attempt < attempts && !x.cut; ++attempt) {
    if (!begin_attempt(x, attempt)) continue;
    // The head kvroute forwards must fit what a worker accepts: over it, the
    // worker would refuse it and be blamed.
    if (client.upstream_head.size() > x.cfg.router.max_header_bytes) {
      static const ApiError e{431, "Request headers too large.", "invalid_request_error", "", ""};
      co_return co_await reject(x, e, "header_too_large");
    }
    // A pooled connection the worker closed meanwhile fails before the first
    // response byte: retried once on a fresh connection to the same worker.
    Next next = Next::NextWorker;
    for (int fresh = 0; fresh < 2 && !x.cut; ++fresh) {
      x.pooled = fresh == 0 && take_pooled(x);
      if (!x.pooled && (next = co_await connect_upstream(x)) != Next::Go) break;
      next = co_await send_and_read_head(x);
      if (next != Next::NextWorker || !x.pooled) break;
    }
    if (next == Next::Go) next = check_status(x, attempt + 1 < attempts);
    if (next == Next::Done) co_return x.keep_result;
    if (next == Next::Go) co_return co_await relay(x);
  }
  if (x.cut) {
    static const ApiError e{503, "The router is shutting down.", "service_unavailable", "", "shutting_down"};
    co_return co_await reject(x, e, "shutdown");
  }
  static const ApiError unreachable{503, "No worker could be reached for this request.", "service_unavailable", "",
                                    "upstream_unavailable"};
  co_return co_await reject(x, unreachable, "upstream_unavailable");
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

HttpServer::Limits HttpServer::limits() const {
  const auto cfg = impl_->hooks.config->get();
  Limits l;
  l.connections = impl_->connections.load(std::memory_order_relaxed);
  l.max_connections = impl_->connection_limit(*cfg);
  l.body_bytes = impl_->body_bytes.load(std::memory_order_relaxed);
  l.max_body_bytes = cfg->router.max_body_bytes_in_flight;
  return l;
}

void HttpServer::start(unsigned threads) {
  while (impl_->io.size() < std::max(1u, threads)) impl_->io.push_back(std::make_unique<IoThread>());
  asio::co_spawn(impl_->io0().ioc, impl_->accept_loop(impl_->acceptor, false), asio::detached);
  IoThread& admin = *impl_->admin_io;
  if (impl_->admin_acceptor.is_open())
    asio::co_spawn(admin.ioc, impl_->accept_loop(impl_->admin_acceptor, true), asio::detached);
  for (auto& t : impl_->io) {
    IoThread& io = *t;
    asio::co_spawn(io.ioc, impl_->sweep_loop(io), asio::detached);
  }
  asio::co_spawn(admin.ioc, impl_->sweep_loop(admin), asio::detached);
  for (auto& t : impl_->io)
    t->thread = std::thread([&ioc = t->ioc] {
      pthread_setname_np(pthread_self(), "kvroute-http");
      ioc.run();
    });
  admin.thread = std::thread([&ioc = admin.ioc] {
    pthread_setname_np(pthread_self(), "kvroute-admin");
    // Below the io threads: on a busy machine the data plane gets the CPU
    // first (Linux: a thread's nice value is its own).
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10) != 0)
      spdlog::debug("admin thread: nice 10 not set ({})", std::strerror(errno));
    ioc.run();
  });
}

void HttpServer::shutdown(std::chrono::milliseconds grace) {
  Impl& im = *impl_;
  im.draining.store(true);
  // Stop accepting (the listeners live on thread 0); close connections that
  // wait for their next request (each io thread walks its own).
  asio::post(im.io0().ioc, [&im] {
    beast::error_code ec;
    im.acceptor.close(ec);
  });
  asio::post(im.admin_io->ioc, [&im] {
    beast::error_code ec;
    im.admin_acceptor.close(ec);
  });
  for (auto& t : im.io) asio::post(t->ioc, [&io = *t] { io.connections.sweep(Steady::now()); });
  asio::post(im.admin_io->ioc, [&io = *im.admin_io] { io.connections.sweep(Steady::now()); });
  auto wait_idle = [&im](Steady::time_point until) {
    while (im.inflight.load() > 0 && Steady::now() < until) std::this_thread::sleep_for(milliseconds(2));
    return im.inflight.load() == 0;
  };
  if (!wait_idle(Steady::now() + grace)) {
    spdlog::warn("shutdown grace of {} ms over with {} requests in flight; cutting them", grace.count(),
                 im.inflight.load());
    // Each cut request ends as its client can tell: a stream with an error
    // event and [DONE], a request without an answer yet with a 503.
    for (auto& t : im.io) asio::post(t->ioc, [&io = *t] { io.exchanges.sweep(Steady::now()); });
    wait_idle(Steady::now() + milliseconds(1000));
  }
  stop();
}

void HttpServer::stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  asio::post(impl_->io0().ioc, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
  asio::post(impl_->admin_io->ioc, [this] {
    beast::error_code ec;
    impl_->admin_acceptor.close(ec);
  });
  std::vector<IoThread*> all;
  for (auto& t : impl_->io) all.push_back(t.get());
  all.push_back(impl_->admin_io.get());
  for (IoThread* t : all) {
    t->work.reset();
    t->ioc.stop();
  }
  for (IoThread* t : all)
    if (t->thread.joinable()) t->thread.join();
  for (IoThread* t : all) t->pool.clear();
}

}  // namespace kvroute
