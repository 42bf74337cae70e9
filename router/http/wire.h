// HTTP/1 on the wire: the client's request and the worker's response parsed by
// Beast's basic_parser (all of its validation, limits and chunked decoding)
// into kvroute's own structures instead of Beast's field container (no
// allocation per field), the heads kvroute writes itself, and read_http(),
// the one read loop every socket read of the data plane goes through.
//
// Beast's parser templates are instantiated in wire.cpp only. Not
// thread-safe: each object belongs to one connection on one io thread.
#pragma once

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/basic_parser.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/http_url.h"
#include "common/types.h"
#include "router/http/executor.h"

namespace kvroute {

namespace beast = boost::beast;
namespace http = beast::http;

// The request field naming the engine's data-parallel rank (vLLM, SGLang).
inline constexpr std::string_view kDpRankHeader = "X-data-parallel-rank";

// A client's request as the server needs it. One lives in each connection's
// session and is reused from request to request (its strings keep their
// capacity).
struct ClientRequest {
  http::verb method = http::verb::unknown;
  std::string method_string;
  std::string target;
  unsigned version = 11;
  bool keep_alive = true;
  // "Name: value\r\n" for each end-to-end field, in order; never the
  // client's credentials (Authorization, x-api-key): those are in
  // `credential_fields`, forwarded only by router/http/worker_credential.h's rule.
  std::string fields;
  std::string credential_fields;
  std::string authorization;
  std::string session;  // x-session-id (session affinity)
  // Flow control (router/flow/): x-api-key, x-kvroute-priority,
  // x-kvroute-ttft-deadline-ms as sent (validated by the proxy).
  std::string api_key;
  std::string priority;
  std::string ttft_deadline;
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
// parsed, whether the body may be read at all (the session's admission).
class HeaderCheck {
 public:
  virtual bool admit(const ClientRequest& req, const ClientRequestParser& parser) = 0;

 protected:
  ~HeaderCheck() = default;
};

// Reads one request into a ClientRequest. Hop-by-hop fields and a client's
// own X-data-parallel-rank are not kept in `fields` (the router chooses the
// rank); a Transfer-Encoding whose final coding is not chunked ends the parse
// with bad_transfer_encoding (RFC 9112 6.3).
class ClientRequestParser final : public http::basic_parser<true> {
 public:
  // `check` (if set) runs when the header is complete; a refusal ends the
  // parse with an error, the body unread.
  ClientRequestParser(ClientRequest& r, HeaderCheck* check);
  // A chunked body's bytes are taken from `lease` as they arrive (a sized
  // body's whole length is taken before it is read).
  void lease_chunks(BodyLease* lease, uint64_t body_limit) {
    lease_ = lease;
    lease_limit_ = body_limit;
  }

 private:
  void on_request_impl(http::verb method, beast::string_view method_string, beast::string_view target,
                       int version, beast::error_code&) override;
  void on_response_impl(int, beast::string_view, int, beast::error_code&) override {}
  void on_field_impl(http::field f, beast::string_view name, beast::string_view value,
                     beast::error_code&) override;
  void on_header_impl(beast::error_code& ec) override;
  void on_body_init_impl(const boost::optional<std::uint64_t>& length, beast::error_code&) override;
  size_t on_body_impl(beast::string_view s, beast::error_code&) override;
  void on_chunk_header_impl(std::uint64_t, beast::string_view, beast::error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code& ec) override;
  void on_finish_impl(beast::error_code&) override {}

  ClientRequest& r_;
  HeaderCheck* check_;
  BodyLease* lease_ = nullptr;
  uint64_t lease_limit_ = 0;  // the body limit: the lease never grows past it
};

// The head of a worker's response as kvroute relays it: the status, and the
// end-to-end fields as text. One per client connection, reused.
struct UpstreamResponse {
  unsigned status = 0;
  std::string reason;
  std::string fields;  // "Name: value\r\n" for each end-to-end field, in order
  bool event_stream = false;
};

// Parses a worker's response into an UpstreamResponse (hop-by-hop fields,
// Server and x-kvroute-* dropped: kvroute sets its own); body bytes go
// straight into the window set by `body_into()` (buffer_body's contract:
// need_buffer once the window is full).
class UpstreamResponseParser final : public http::basic_parser<false> {
 public:
  explicit UpstreamResponseParser(UpstreamResponse& r);

  void body_into(char* data, size_t size) {
    out_ = data;
    room_ = size;
  }
  size_t room() const { return room_; }

 private:
  void on_request_impl(http::verb, beast::string_view, beast::string_view, int, beast::error_code&) override {}
  void on_response_impl(int code, beast::string_view reason, int, beast::error_code&) override;
  void on_field_impl(http::field f, beast::string_view name, beast::string_view value,
                     beast::error_code&) override;
  void on_header_impl(beast::error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>&, beast::error_code&) override {}
  size_t on_body_impl(beast::string_view s, beast::error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t, beast::string_view, beast::error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code& ec) override;
  void on_finish_impl(beast::error_code&) override {}

  UpstreamResponse& r_;
  char* out_ = nullptr;
  size_t room_ = 0;
};

// A whole response with its body in a string (the engine's POST /tokenize
// answer): the status and the body, bounded by body_limit(); fields are not
// kept.
class WholeResponseParser final : public http::basic_parser<false> {
 public:
  unsigned status() const { return status_; }
  const std::string& body() const { return body_; }

 private:
  void on_request_impl(http::verb, beast::string_view, beast::string_view, int, beast::error_code&) override {}
  void on_response_impl(int code, beast::string_view, int, beast::error_code&) override;
  void on_field_impl(http::field, beast::string_view, beast::string_view, beast::error_code&) override {}
  void on_header_impl(beast::error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>& length, beast::error_code&) override;
  size_t on_body_impl(beast::string_view s, beast::error_code&) override;
  void on_chunk_header_impl(std::uint64_t, beast::string_view, beast::error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code& ec) override;
  void on_finish_impl(beast::error_code&) override {}

  unsigned status_ = 0;
  std::string body_;
};

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
// Instantiated for requests and responses in wire.cpp.
template <bool isRequest>
awaitable<void> read_http(Socket& s, beast::flat_buffer& b, http::basic_parser<isRequest>& p, ReadUntil until,
                          beast::error_code& ec, bool* between = nullptr, const bool* expect_continue = nullptr);

// "POST /base/v1/... HTTP/1.1\r\n" + the client's end-to-end fields + Host,
// Connection (close when not pooling), the chosen dp rank (vLLM's API server
// reads X-data-parallel-rank: vllm/entrypoints/openai/engine/serving.py
// _get_data_parallel_rank(), and hands it to its engine client as
// data_parallel_rank; without it vLLM's DP balancer picks) and
// Content-Length, then the blank line. `credentials` ("Name: value\r\n"
// fields, or empty) go after the client's fields: the worker's credential,
// never the client's unless the operator asked (worker_credential.h). Into
// `h` (its capacity reused).
void upstream_request_head(std::string& h, const ClientRequest& req, const UpstreamUrl& url, bool keep_alive,
                           std::optional<uint32_t> dp_rank, std::string_view credentials);

// The head kvroute sends the client for a worker's response: its status and
// end-to-end fields, Server and kvroute's x-kvroute-* fields, then
// Content-Length (a sized body) or, for an HTTP/1.1 client,
// Transfer-Encoding: chunked (an HTTP/1.0 client gets the body up to the
// connection's close), and Connection: close when the client connection will
// not be kept (keep-alive for an HTTP/1.0 client that keeps it).
// `extra`: further x-kvroute-* fields, each as "\r\nName: value" (a
// disaggregated request's prefill worker).
void client_response_head(std::string& h, const UpstreamResponse& p, unsigned version, WorkerId worker,
                          uint32_t cached_tokens, std::optional<uint64_t> content_length, bool keep_alive,
                          std::string_view extra = {});

// The head of one leg of a disaggregated request (router/http/pd_exchange.h):
// upstream_request_head()'s, but the client's own X-Request-Id and
// x-prefiller-host-port fields left out (clients never direct transfers:
// docs/design/pd-protocols.md §5), the router's `request_id` as
// X-Request-Id (one id on both legs), the leg body's length, and the
// workers' `credentials` fields (worker_credential.h) as upstream_request_head().
void pd_leg_request_head(std::string& h, const ClientRequest& req, const UpstreamUrl& url, bool keep_alive,
                         std::optional<uint32_t> dp_rank, std::string_view request_id, size_t body_size,
                         std::string_view credentials);

// The head of a POST /tokenize of `body_size` bytes to the worker at `url`
// (JSON both ways; `authorization` sent when not empty: the worker's key,
// worker_credential.h's worker_authorization()).
std::string tokenize_request_head(const UpstreamUrl& url, std::string_view authorization, bool keep_alive,
                                  size_t body_size);

// "<size in hex>\r\n": the line before a chunk of `n` bytes.
std::string_view chunk_size_line(size_t n, char (&b)[24]);

// Drops the first `n` bytes from a gather list; true if any are left.
inline bool consume(std::span<asio::const_buffer>& buffers, size_t n) {
  while (!buffers.empty() && n >= buffers.front().size()) {
    n -= buffers.front().size();
    buffers = buffers.subspan(1);
  }
  if (n) buffers.front() += n;
  return !buffers.empty();
}

}  // namespace kvroute
