// HTTP/1 on the wire (wire.h): the parsers' callbacks, read_http() and the
// heads kvroute writes. Beast's parser templates are instantiated here only.
#include "router/http/wire.h"

#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/status.hpp>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace kvroute {

using namespace std::string_view_literals;

namespace {

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

}  // namespace

// ---- the client's request

ClientRequestParser::ClientRequestParser(ClientRequest& r, HeaderCheck* check) : r_(r), check_(check) {
  r.method = http::verb::unknown;
  r.method_string.clear();
  r.target.clear();
  r.fields.clear();
  r.authorization.clear();
  r.credential_fields.clear();
  r.session.clear();
  r.api_key.clear();
  r.priority.clear();
  r.ttft_deadline.clear();
  r.body.clear();
  r.has_host = false;
  r.expect_continue = false;
  r.transfer_coding.clear();
}

void ClientRequestParser::on_request_impl(http::verb method, beast::string_view method_string,
                                          beast::string_view target, int version, beast::error_code&) {
  r_.method = method;
  r_.method_string.assign(method_string.data(), method_string.size());
  r_.target.assign(target.data(), target.size());
  r_.version = static_cast<unsigned>(version);
}

void ClientRequestParser::on_field_impl(http::field f, beast::string_view name, beast::string_view value,
                                        beast::error_code&) {
  // The client's credentials: kept apart from the fields a worker gets.
  if (f == http::field::authorization) {
    r_.authorization.assign(value.data(), value.size());
    append_field(r_.credential_fields, name, value);
    return;
  }
  if (f == http::field::host) r_.has_host = true;
  if (f == http::field::unknown && beast::iequals(name, "x-session-id")) r_.session.assign(value.data(), value.size());
  if (f == http::field::unknown) {
    if (beast::iequals(name, "x-api-key")) {
      r_.api_key.assign(value.data(), value.size());
      append_field(r_.credential_fields, name, value);
      return;
    }
    if (beast::iequals(name, "x-kvroute-priority")) r_.priority.assign(value.data(), value.size());
    else if (beast::iequals(name, "x-kvroute-ttft-deadline-ms")) r_.ttft_deadline.assign(value.data(), value.size());
  }
  // RFC 9110 10.1.1: never a 100 (Continue) to an HTTP/1.0 client.
  if (f == http::field::expect && r_.version >= 11 && beast::iequals(value, "100-continue")) r_.expect_continue = true;
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
  if (f == http::field::unknown && beast::iequals(name, beast::string_view(kDpRankHeader.data(), kDpRankHeader.size())))
    return;
  if (!is_hop_by_hop(f)) append_field(r_.fields, name, value);
}

void ClientRequestParser::on_header_impl(beast::error_code& ec) {
  if (!r_.transfer_coding.empty()) ec = http::error::bad_transfer_encoding;
  else if (check_ && !check_->admit(r_, *this)) ec = asio::error::operation_not_supported;
}

void ClientRequestParser::on_body_init_impl(const boost::optional<std::uint64_t>& length, beast::error_code&) {
  if (length) r_.body.reserve(static_cast<size_t>(*length));  // within body_limit: the parser checked
}

size_t ClientRequestParser::on_body_impl(beast::string_view s, beast::error_code&) {
  r_.body.append(s.data(), s.size());
  return s.size();
}

size_t ClientRequestParser::on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code& ec) {
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

// ---- the worker's response

UpstreamResponseParser::UpstreamResponseParser(UpstreamResponse& r) : r_(r) {
  r.status = 0;
  r.reason.clear();
  r.fields.clear();
  r.event_stream = false;
}

void UpstreamResponseParser::on_response_impl(int code, beast::string_view reason, int, beast::error_code&) {
  r_.status = static_cast<unsigned>(code);
  r_.reason.assign(reason.data(), reason.size());
}

void UpstreamResponseParser::on_field_impl(http::field f, beast::string_view name, beast::string_view value,
                                           beast::error_code&) {
  if (f == http::field::content_type && value.starts_with("text/event-stream")) r_.event_stream = true;
  if (is_hop_by_hop(f) || f == http::field::server) return;  // kvroute names itself
  // kvroute sets its own x-kvroute-* fields (a worker behind another kvroute,
  // or the mocker, may send them too).
  if (f == http::field::unknown &&
      (beast::iequals(name, "x-kvroute-worker") || beast::iequals(name, "x-kvroute-cached-tokens")))
    return;
  append_field(r_.fields, name, value);
}

size_t UpstreamResponseParser::on_body_impl(beast::string_view s, beast::error_code& ec) {
  const size_t n = std::min(s.size(), room_);
  if (n) std::memcpy(out_, s.data(), n);
  out_ += n;
  room_ -= n;
  if (n < s.size()) ec = http::error::need_buffer;
  return n;
}

size_t UpstreamResponseParser::on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code& ec) {
  return on_body_impl(s, ec);
}

void WholeResponseParser::on_response_impl(int code, beast::string_view, int, beast::error_code&) {
  status_ = static_cast<unsigned>(code);
}

void WholeResponseParser::on_body_init_impl(const boost::optional<std::uint64_t>& length, beast::error_code&) {
  if (length) body_.reserve(static_cast<size_t>(*length));  // within body_limit: the parser checked
}

size_t WholeResponseParser::on_body_impl(beast::string_view s, beast::error_code&) {
  body_.append(s.data(), s.size());
  return s.size();
}

size_t WholeResponseParser::on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code& ec) {
  return on_body_impl(s, ec);
}

// ---- reading

template <bool isRequest>
awaitable<void> read_http(Socket& s, beast::flat_buffer& b, http::basic_parser<isRequest>& p, ReadUntil until,
                          beast::error_code& ec, bool* between, const bool* expect_continue) {
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

template awaitable<void> read_http<true>(Socket&, beast::flat_buffer&, http::basic_parser<true>&, ReadUntil,
                                         beast::error_code&, bool*, const bool*);
template awaitable<void> read_http<false>(Socket&, beast::flat_buffer&, http::basic_parser<false>&, ReadUntil,
                                          beast::error_code&, bool*, const bool*);

// ---- writing heads

void upstream_request_head(std::string& h, const ClientRequest& req, const UpstreamUrl& url, bool keep_alive,
                           std::optional<uint32_t> dp_rank, std::string_view credentials) {
  HeadWriter w(h, 160 + req.method_string.size() + url.base.size() + req.target.size() + req.fields.size() +
                      credentials.size() + url.host.size() + url.port.size());
  w.text(req.method_string).text(" "sv).text(url.base).text(req.target).text(" HTTP/1.1\r\n"sv);
  w.text(req.fields).text(credentials).text(url.ipv6 ? "Host: ["sv : "Host: "sv).text(url.host).text(url.ipv6 ? "]:"sv : ":"sv);
  w.text(url.port);
  w.text(keep_alive ? "\r\n"sv : "\r\nConnection: close\r\n"sv);
  if (dp_rank) w.text(kDpRankHeader).text(": "sv).number(*dp_rank).text("\r\n"sv);
  w.text("Content-Length: "sv).number(req.body.size()).text("\r\n\r\n"sv);
  w.finish();
}

void client_response_head(std::string& h, const UpstreamResponse& p, unsigned version, WorkerId worker,
                          uint32_t cached_tokens, std::optional<uint64_t> content_length, bool keep_alive,
                          std::string_view extra) {
  const beast::string_view obsolete = http::obsolete_reason(static_cast<http::status>(p.status));
  const std::string_view reason = p.reason.empty() ? std::string_view(obsolete.data(), obsolete.size()) : p.reason;
  const bool http10 = version < 11;
  HeadWriter w(h, 256 + reason.size() + p.fields.size() + extra.size());
  w.text(http10 ? "HTTP/1.0 "sv : "HTTP/1.1 "sv).number(p.status).text(" "sv).text(reason).text("\r\n"sv);
  w.text(p.fields).text("Server: kvroute\r\nx-kvroute-worker: "sv).number(worker.value);
  w.text("\r\nx-kvroute-cached-tokens: "sv).number(cached_tokens);
  w.text(extra);
  if (content_length) w.text("\r\nContent-Length: "sv).number(*content_length);
  else if (!http10) w.text("\r\nTransfer-Encoding: chunked"sv);
  if (!keep_alive) w.text("\r\nConnection: close\r\n\r\n"sv);
  else w.text(http10 ? "\r\nConnection: keep-alive\r\n\r\n"sv : "\r\n\r\n"sv);
  w.finish();
}

namespace {
// True for a "Name: value\r\n" line naming `name` (ASCII, any case).
bool field_named(std::string_view line, std::string_view name) {
  if (line.size() <= name.size() || line[name.size()] != ':') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = line[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != name[i]) return false;
  }
  return true;
}
}  // namespace

void pd_leg_request_head(std::string& h, const ClientRequest& req, const UpstreamUrl& url, bool keep_alive,
                         std::optional<uint32_t> dp_rank, std::string_view request_id, size_t body_size,
                         std::string_view credentials) {
  HeadWriter w(h, 200 + req.method_string.size() + url.base.size() + req.target.size() + req.fields.size() +
                      credentials.size() + url.host.size() + url.port.size() + request_id.size());
  w.text(req.method_string).text(" "sv).text(url.base).text(req.target).text(" HTTP/1.1\r\n"sv);
  std::string_view fields = req.fields;
  while (!fields.empty()) {
    const size_t end = fields.find("\r\n"sv);
    const size_t n = end == std::string_view::npos ? fields.size() : end + 2;
    const std::string_view line = fields.substr(0, n);
    fields.remove_prefix(n);
    if (field_named(line, "x-request-id"sv) || field_named(line, "x-prefiller-host-port"sv)) continue;
    w.text(line);
  }
  w.text(credentials);
  w.text("X-Request-Id: "sv).text(request_id).text("\r\n"sv);
  w.text(url.ipv6 ? "Host: ["sv : "Host: "sv).text(url.host).text(url.ipv6 ? "]:"sv : ":"sv).text(url.port);
  w.text(keep_alive ? "\r\n"sv : "\r\nConnection: close\r\n"sv);
  if (dp_rank) w.text(kDpRankHeader).text(": "sv).number(*dp_rank).text("\r\n"sv);
  w.text("Content-Length: "sv).number(body_size).text("\r\n\r\n"sv);
  w.finish();
}

std::string tokenize_request_head(const UpstreamUrl& url, std::string_view authorization, bool keep_alive,
                                  size_t body_size) {
  std::string h;
  HeadWriter w(h, 256 + authorization.size() + url.base.size() + url.host.size());
  w.text("POST "sv).text(url.base).text("/tokenize HTTP/1.1\r\nHost: "sv);
  w.text(url.ipv6 ? "["sv : ""sv).text(url.host).text(url.ipv6 ? "]:"sv : ":"sv).text(url.port);
  w.text("\r\nContent-Type: application/json\r\nAccept: application/json\r\n"sv);
  if (!authorization.empty()) w.text("Authorization: "sv).text(authorization).text("\r\n"sv);
  if (!keep_alive) w.text("Connection: close\r\n"sv);
  w.text("Content-Length: "sv).number(body_size).text("\r\n\r\n"sv);
  w.finish();
  return h;
}

std::string_view chunk_size_line(size_t n, char (&b)[24]) {
  auto end = std::to_chars(b, b + 20, n, 16).ptr;
  *end++ = '\r';
  *end++ = '\n';
  return {b, static_cast<size_t>(end - b)};
}

}  // namespace kvroute
