// The exchange and its phases (proxy.h). Each phase is one function over the
// Exchange (exchange.h), the request's state in the proxy coroutine's frame;
// proxy() at the bottom reads as the request's life. The admission phases
// (parse, route, queue, accept) are in admission.cpp.
#include "router/http/proxy.h"

#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <span>

#include "common/log.h"
#include "router/api/api_routes.h"
#include "router/http/exchange.h"
#include "router/proxy_policy.h"

namespace kvroute {

namespace {
constexpr std::string_view kResponsesPrefix = "/v1/responses/";
}  // namespace

// The {id} of GET /v1/responses/{id}[?query] (empty: none, or it has a '/').
std::string_view response_id_of_path(std::string_view target) {
  target = target.substr(0, target.find('?'));
  if (!target.starts_with(kResponsesPrefix)) return {};
  const std::string_view id = target.substr(kResponsesPrefix.size());
  return id.find('/') == std::string_view::npos ? id : std::string_view{};
}

namespace phases {

// ---- outcomes

// Passive health: a worker's failure as the proxy saw it; a success is
// reported only after this thread reported a failure of the same worker.
void report_failure(Exchange& x, HealthSignal signal) {
  x.s.hooks.registry->report_failure(x.target->worker, signal);
  x.io.suspect(x.target->worker);
}

void report_success(Exchange& x) {
  auto& s = x.io.suspects;
  if (s.empty()) return;
  const auto it = std::find(s.begin(), s.end(), x.target->worker);
  if (it == s.end()) return;
  s.erase(it);
  x.s.hooks.registry->report_success(x.target->worker);
}

// The access record and the request metrics, on every exit of proxy().
void finish(Exchange& x, unsigned status, std::string_view outcome) {
  x.rec.status = status;
  x.rec.outcome = outcome;
  const double seconds = seconds_since(x.started);
  x.rec.duration_ms = seconds * 1e3;
  x.s.count(api_label(x.kind), status, x.model_label);
  if (RouterMetrics* m = x.metrics()) {
    if (x.kind == ApiKind::ChatCompletions) m->duration_chat.observe(seconds);
    else if (x.kind == ApiKind::Completions) m->duration_completions.observe(seconds);
    else m->request_duration_seconds.with({api_label(x.kind)}).observe(seconds);
  }
  if (x.cfg.log.access_log) log_access(x.rec);
  if (x.flow.tables) x.s.flow.count(*x.flow.tables, x.flow.tenant, status == 200 ? std::string_view("ok") : outcome);
}

awaitable<bool> reject(Exchange& x, const ApiError& e, std::string_view outcome) {
  finish(x, e.status, outcome);
  co_return co_await respond_error(x.s, x.client, x.req.version, x.req.keep_alive, e, x.kind);
}

awaitable<bool> refuse(Exchange& x, const FlowRefusal& r) {
  finish(x, r.error.status, r.outcome);
  co_return co_await respond_error(x.s, x.client, x.req.version, x.req.keep_alive, r.error, x.kind, r.retry_after);
}

// The client went away: count it and log `status` (499 if it never got one).
void client_cancelled(Exchange& x, unsigned status) {
  if (RouterMetrics* m = x.metrics()) m->cancels_total.get().inc();
  finish(x, status, "client_cancel");
}

// A connection to a worker failed before its response head: counted, logged,
// reported to passive health.
void upstream_failed(Exchange& x, const char* phase, HealthSignal signal) {
  if (RouterMetrics* m = x.metrics()) m->upstream_errors_total.with({phase}).inc();
  report_failure(x, signal);
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("worker {} ({}): {} failed: {}; trying the next worker", x.target->worker.value, x.target->url,
                 phase, x.ec.message());
}

// ---- forward

// Starts the attempt on the ranking's `attempt`-th worker: in-flight
// accounting and the request head to send it. False if its url is unusable.
bool begin_attempt(Exchange& x, size_t attempt) {
  x.watch.client_gone();
  x.up_deadline.disarm();
  x.parser.reset();
  x.upstream.reset();
  const RouteTarget& target = x.client.route.ranked[attempt];
  // A batch is routed on its first prompt; its load is counted as that many
  // prompts like the first (n > 1 shares the prompt's prefill and blocks).
  const uint64_t prompts = x.client.parsed.prompts;
  const uint64_t blocks = x.client.route.request_blocks * prompts;
  // A split request's decode worker pulls the prompt's KV: no prefill counted.
  const uint64_t prefill = x.pd.split ? 0 : target.prefill_tokens * prompts;
  const uint64_t shared = inflight_shared_blocks(x.cfg.scheduler, target);
  const bool distinct = inflight_distinct(x.cfg.scheduler);
  // The slot the queue's trial claimed is kept when this attempt is its.
  const bool claimed = x.claim && x.claim->worker == target.worker && x.claim->blocks == blocks &&
                       x.claim->prefill == prefill && x.claim->cached_blocks == shared && x.claim->distinct == distinct;
  if (x.claim && !claimed && x.guard) x.guard->withdraw();  // never sent: not in any load report
  x.claim.reset();
  if (!claimed) x.guard.reset();
  x.target = &target;
  x.rec.attempts = static_cast<uint32_t>(attempt + 1);
  x.rec.worker = static_cast<int64_t>(target.worker.value);
  x.rec.cached_tokens = target.cached_tokens;
  if (attempt > 0 && x.metrics()) x.metrics()->retries_total.get().inc();
  if (!parse_url(target.url, x.url)) {
    static RateLimiter rl;
    if (rl.allow()) spdlog::warn("worker {} has an unusable url '{}'", target.worker.value, target.url);
    return false;
  }
  if (!claimed)
    x.guard.emplace(*x.s.hooks.registry, target.worker,
                    route_inflight_kv(x.cfg.scheduler, x.client.route, target, blocks, shared),
                    prefill);
  if (x.s.hooks.on_dispatch) x.s.hooks.on_dispatch(target.worker, x.client.route);
  // The request to forward: unchanged but for hop-by-hop headers. Its head is
  // written out here (fields as Beast parsed and validated them) and sent with
  // the body in one gather write: no serializer on the hot path.
  if (x.pd.active)
    pd_leg_request_head(x.client.upstream_head, x.req, x.url, x.cfg.router.upstream_pool_size > 0, target.dp_rank,
                        x.pd.request_id, x.body().size(), x.credentials);
  else
    upstream_request_head(x.client.upstream_head, x.req, x.url, x.cfg.router.upstream_pool_size > 0, target.dp_rank,
                          x.credentials);
  return true;
}

// A pooled connection to the attempt's worker, if one is idle.
bool take_pooled(Exchange& x) {
  auto s = x.io.pool.take(x.target->url);
  if (!s) return false;
  x.upstream.emplace(std::move(*s));
  return true;
}

// A fresh connection to the attempt's worker, within router.connect_timeout_ms.
awaitable<Next> connect_upstream(Exchange& x) {
  x.up_deadline.disarm();
  x.upstream.emplace(x.io.ioc.get_executor());
  x.up_deadline.arm(*x.upstream, milliseconds(x.cfg.router.connect_timeout_ms));
  co_await connect_to(*x.upstream, x.url, x.ec);
  x.up_deadline.settle(x.ec);
  if (!x.ec) co_return Next::Go;
  if (!x.cut)
    upstream_failed(x, "connect",
                    x.ec == asio::error::timed_out ? HealthSignal::ConnectTimeout : HealthSignal::ConnectRefused);
  co_return Next::NextWorker;
}

// The first-byte timeout of this attempt (router/proxy_policy.h
// header_timeout()): a multiple of the request's predicted time to first
// token on its worker (its uncached prefill plus the prefill the router
// already has in flight there), plus its output budget when the answer is
// not streamed; the ceiling when the worker had no free slot.
milliseconds first_byte_timeout(const Exchange& x) {
  HeaderWait w{.prefill_tokens = x.target->prefill_tokens,
               .streamed = x.client.parsed.stream,
               .max_tokens = x.client.parsed.max_tokens};
  for (const WorkerView& v : x.client.route.workers)
    if (v.info && v.info->id == x.target->worker) {
      w.prefill_tokens += v.pending_prefill_tokens;
      w.slot_free = v.predicted.request_total_slots == 0 ||
                    v.predicted.request_active_slots < v.predicted.request_total_slots;
    }
  return header_timeout(x.cfg.router, w);
}

// Sends the request and reads the worker's response head (the first byte),
// watching for the client going away meanwhile. A pooled connection that
// fails (the worker closed it while idle) is not the worker's fault: the
// caller retries on a fresh one.
awaitable<Next> send_and_read_head(Exchange& x) {
  Socket& up = *x.upstream;
  x.ec = {};
  x.up_deadline.arm(up, first_byte_timeout(x));
  x.sent_at = Steady::now();
  // One send nearly always takes the whole request; asio::async_write (a
  // composed operation) only for what it leaves.
  const std::string_view body = x.body();
  std::array<asio::const_buffer, 2> wire{asio::buffer(x.client.upstream_head), asio::buffer(body.data(), body.size())};
  std::span<asio::const_buffer> rest(wire);
  const size_t sent = co_await up.async_write_some(rest, nothrow(x.ec));
  if (!x.ec && consume(rest, sent)) co_await asio::async_write(up, rest, nothrow(x.ec));
  x.sent_request = x.sent_request || !x.ec;
  x.parser.emplace(x.client.response);
  x.parser->body_limit(std::numeric_limits<std::uint64_t>::max());
  x.client.upstream_buffer.clear();
  if (!x.ec) {
    x.watch.watch(up, false);  // while the worker prefills
    x.pd.decode_waits_on(&up);  // SGLang: a failing prefill leg ends this wait
    co_await read_http(up, x.client.upstream_buffer, *x.parser, ReadUntil::Header, x.ec);
    x.pd.decode_waits_on(nullptr);
    if (x.ec && x.watch.client_gone()) {
      if (x.pdc) pd_client_gone(x.pd, *x.pdc, "decode_head");
      client_cancelled(x, 499);
      x.keep_result = false;
      co_return Next::Done;
    }
  }
  x.up_deadline.settle(x.ec);
  if (!x.ec) co_return Next::Go;
  x.watch.client_gone();
  const bool timed_out = x.ec == asio::error::timed_out;
  if (x.cut || (x.pooled && !timed_out) || x.pd.prefill_failed()) co_return Next::NextWorker;
  // The worker is at fault (a timeout, or a fresh connection it closed): the
  // next worker, not a fresh connection to this one.
  x.pooled = false;
  upstream_failed(x, "first_byte", timed_out ? HealthSignal::FirstByteTimeout : HealthSignal::ServerError);
  co_return Next::NextWorker;
}

// The worker answered: a 5xx counts against it and 502/503/504 move on to
// the next worker while one is left; anything else (a 4xx is the client's
// own error) is relayed as it is, never retried.
Next check_status(Exchange& x, bool another_left) {
  const unsigned status = x.client.response.status;
  if (status < 500) {
    report_success(x);
    return Next::Go;
  }
  if (RouterMetrics* m = x.metrics()) m->upstream_errors_total.with({"status_5xx"}).inc();
  report_failure(x, HealthSignal::ServerError);
  // A split request's decode worker answering 500 before its first byte has
  // failed its transfer (SGLang: the prefill side is gone): retried, as
  // 502/503/504 are, with a fresh prefill.
  const bool retryable = status == 502 || status == 503 || status == 504 || (x.pd.split && status == 500);
  if (retryable && another_left) {
    if (x.watch.client_gone()) {
      client_cancelled(x, 499);
      x.keep_result = false;
      return Next::Done;
    }
    return Next::NextWorker;  // the connection (and any body) is dropped
  }
  return Next::Go;
}

// ---- relay

// Committed to the worker: the first byte's metrics. The access log's
// ttfb_ms is the client's: from the request read to its first response byte,
// every failed-over attempt included; the histogram is the chosen worker's
// (request sent to first byte).
void record_first_byte(Exchange& x) {
  const double ttfb = seconds_since(x.sent_at);
  x.rec.ttfb_ms = seconds_since(x.started) * 1e3;
  RouterMetrics* m = x.metrics();
  if (!m) return;
  const RouteResult& route = x.client.route;
  const RouteTarget& target = *x.target;
  m->ttfb_seconds.get().observe(ttfb);
  m->prompt_tokens_total.get().inc(route.isl_tokens);
  m->cached_tokens_total.get().inc(target.cached_tokens);
  m->best_cached_tokens_total.get().inc(route.best_cached_tokens);  // decision-quality gap
  if (target.pool >= 0 && target.pool_tokens > 0) {
    const std::string& pool = m->pool_names[static_cast<size_t>(target.pool)];
    m->pool_hit_tokens_total.with({pool}).inc(target.pool_tokens);
    m->pool_hits_total.with({pool}).inc();
  }
  const auto worker = m->worker_tokens(target.worker.value);
  worker.prompt.inc(route.isl_tokens);
  worker.cached.inc(target.cached_tokens);
  m->overlap_ratio.get().observe(route.isl_tokens ? double(target.cached_tokens) / route.isl_tokens : 0.0);
}

// A small sized body (a non-streaming answer) is read whole first, so the
// client gets head and body in one write: one send on the hot path.
awaitable<bool> relay_small(Exchange& x, char* buf, uint64_t length, bool client_keep) {
  UpstreamResponseParser& parser = *x.parser;
  const unsigned status = x.client.response.status;
  const milliseconds idle(x.cfg.router.idle_timeout_ms);
  beast::error_code& ec = x.ec;
  // A whole response: its prefill is over (not a TTFT: the first byte came
  // after the generation); an error's prompt is not known to be cached.
  if (status / 100 == 2) x.guard->answered();
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
    if (RouterMetrics* m = x.metrics()) m->upstream_errors_total.with({"mid_stream"}).inc();
    finish(x, status, "upstream_error");
    co_return false;  // nothing sent yet, but the worker is committed: close
  }
  const size_t body_size = static_cast<size_t>(length) - parser.room();
  x.pin.answered(x.client.response, x.target->worker, std::string_view(buf, body_size));
  client_response_head(x.client.response_head, x.client.response, x.req.version, x.target->worker,
                       x.target->cached_tokens, body_size, client_keep, x.pd.fields);
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

constexpr std::string_view kCrlf = "\r\n";
constexpr std::string_view kLastChunk = "0\r\n\r\n";

// The worker failed mid-response, or the shutdown grace cut it. A stream
// without a declared length ends with an OpenAI-style error event and
// [DONE]; a sized body cannot signal it: the connection closes.
awaitable<bool> end_stream_with_error(Exchange& x, bool chunked, bool sized) {
  const unsigned status = x.client.response.status;
  if (x.cut) {
    finish(x, status, "shutdown");
  } else {
    if (RouterMetrics* m = x.metrics()) m->upstream_errors_total.with({"mid_stream"}).inc();
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
  const std::string tail = stream_error_event(x.kind, e);
  char line[24];
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

// A stream, or a large body: head first, then each piece as it arrives (a
// chunk each when chunked), with one watch on the client to the end.
awaitable<bool> relay_stream(Exchange& x, char* buf, std::optional<uint64_t> length, bool client_keep) {
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
                       x.target->cached_tokens, length, client_keep, x.pd.fields);
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
      // The grace may end while this coroutine writes to the client, when no
      // upstream read is pending for the sweep to cancel: checked here.
      if (x.cut) {
        x.ec = asio::error::operation_aborted;
        co_return co_await end_stream_with_error(x, chunked, length.has_value());
      }
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
      x.pin.answered(x.client.response, x.target->worker, std::string_view(buf, n));
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

// Relays the worker's response to the client: a small sized body whole, with
// its head in one write; anything else piece by piece as it arrives. Then
// the upstream connection goes back to the pool and the exchange finishes.
awaitable<bool> relay(Exchange& x) {
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
  const bool client_keep = x.req.keep_alive && !x.s.draining.load() && (length || x.req.version >= 11);
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

// ---- disaggregated legs (pd_exchange.h)

// Before a split request's decode attempt: vLLM's (NIXL, Mooncake) prefill leg when no
// transfer is ready (the first attempt, or a decode worker that may have
// consumed it), answered first, or with pd.mooncake_concurrent_legs sent
// beside the decode leg; SGLang's concurrent prefill leg with a fresh room. A
// prefill that cannot be had falls back to the decode worker alone or, with
// pd.on_prefill_failure fail, answers 503 (Done).
awaitable<Next> prepare_legs(Exchange& x, const PdContext& pd, size_t attempt) {
  if (x.pd.protocol == PdProtocol::Sglang) {
    if (pd_start_sglang(x.pd, pd)) co_return Next::Go;
    // An SGLang decode server cannot run the request alone: no fallback.
    x.pd.outcome = "failed";
    x.pd.reason = "no_prefill_worker";
  } else if (x.pd.need_prefill) {
    // (Two statements: GCC 12 mishandles a conditional expression's temporaries in co_await.)
    PdPrefill r;
    if (x.pd.concurrent_legs) r = co_await pd_start_mooncake(x.pd, pd);
    else r = co_await pd_prefill_vllm(x.pd, pd);
    if (r == PdPrefill::ClientGone) {  // counted by pd_prefill_vllm()
      client_cancelled(x, 499);
      x.keep_result = false;
      co_return Next::Done;
    }
    if (r != PdPrefill::Fail) {
      // The client left while the transfer was made: a decode leg still
      // claims it (never leave a prefill worker holding KV for nobody).
      if (r == PdPrefill::Ready && (x.pd.client_left || peer_closed(x.client.socket))) {
        if (!x.pd.client_left) pd_client_gone(x.pd, pd, "after_prefill");
        pd_release(x.pd, pd, x.client.route.ranked[attempt]);
        pd_count(x.pd, pd);
        client_cancelled(x, 499);
        x.keep_result = false;
        co_return Next::Done;
      }
      co_return Next::Go;
    }
  } else {
    co_return Next::Go;
  }
  pd_count(x.pd, pd);
  static const ApiError e{503, "No prefill worker could prefill this request.",
                          "service_unavailable", "", "prefill_unavailable"};
  x.keep_result = co_await reject(x, e, "prefill_unavailable");
  co_return Next::Done;
}

// Concurrency limit: counted for the whole request, released on every exit
// (the in-flight gauge reads the count at scrape time).
struct InflightSlot {
  std::atomic<int64_t>& n;
  explicit InflightSlot(std::atomic<int64_t>& c) : n(c) { n.fetch_add(1); }
  ~InflightSlot() { n.fetch_sub(1); }
  InflightSlot(const InflightSlot&) = delete;
  InflightSlot& operator=(const InflightSlot&) = delete;
};

// One proxied OpenAI request, as its phases: admit, parse, tokenize (by the
// engine, when needed), route (maybe queue), then for each worker of the
// ranking until one answers: connect (or a pooled connection), send and read
// the response head; then relay and finish. (The phases that need no
// suspension are plain functions, and the short ones are inline here: each
// awaited coroutine is a frame per request.)
awaitable<bool> run(ServerState& s, ClientConn& client, ClientRequest& req, ApiKind kind, IoThread& io,
                    bool retrieve) {
  Exchange x(s, client, req, kind, io, s.hooks.config->get());
  x.rec.method = retrieve ? "GET" : "POST";
  x.rec.path = retrieve ? std::string_view("/v1/responses/{id}") : api_path(kind);
  InflightSlot slot(s.inflight);
  if (s.inflight.load() > static_cast<int64_t>(x.cfg.router.max_concurrent_requests)) {
    if (RouterMetrics* m = x.metrics()) m->rejected_total.with({"limit"}).inc();
    static const ApiError e{503, "Too many concurrent requests; retry later.", "service_unavailable", "",
                            "too_many_requests"};
    co_return co_await reject(x, e, "rejected_limit");
  }
  if (auto r = flow_authenticate(s.flow, x.cfg_holder, req, x.flow)) co_return co_await refuse(x, *r);
  if (retrieve) {
    if (auto e = route_retrieve(x)) co_return co_await reject(x, *e, "not_found");
  } else if (auto answered = co_await admit(x)) {
    co_return *answered;
  }

  x.worker_key = s.worker_key.get(x.cfg_holder);
  x.credentials = worker_credential_fields(*x.worker_key, forwards_client_credentials(x.cfg), req.credential_fields);
  const PdContext pd{s, io, x.cfg, req, client.route, x.watch, client.parsed.model, x.credentials};
  x.pdc = &pd;
  if (!retrieve && !pd_begin(x.pd, pd)) {
    ApiError e;
    invalid_request(e, "The request body must be a JSON object.", "");
    co_return co_await reject(x, e, "bad_request");
  }
  const size_t attempts = std::min<size_t>(x.cfg.router.max_attempts, client.route.ranked.size());
  for (size_t attempt = 0; attempt < attempts && !x.cut; ++attempt) {
    if (x.pd.split) {
      const Next n = co_await prepare_legs(x, pd, attempt);
      if (n == Next::Done) co_return x.keep_result;
    }
    x.sent_request = false;
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
    if (next == Next::Go) {
      pd_committed(x.pd, pd, seconds_since(x.sent_at));
      const bool keep = co_await relay(x);
      if (x.pd.concurrent) co_await pd_finish_concurrent(x.pd, pd);
      co_return keep;
    }
    pd_decode_failed(x.pd, pd, x.sent_request,
                     x.parser && x.parser->is_header_done() ? "status_5xx"
                     : x.ec == asio::error::timed_out       ? "timeout"
                                                            : "worker_closed");
    if (x.pd.split && attempt + 1 < attempts && x.metrics()) x.metrics()->pd_retries_total.with({"decode"}).inc();
  }
  // A prefilled transfer no decode worker took: claimed by a release leg on
  // the best decode worker (it may be back), else freed by its lease.
  if (x.pd.split && !x.pd.need_prefill && !client.route.ranked.empty()) pd_release(x.pd, pd, client.route.ranked[0]);
  if (x.pd.split && x.pd.prefill_failed() && !x.cut) {  // concurrent legs: the last attempt's prefill leg failed
    x.pd.outcome = "failed";
    x.pd.reason = "prefill_failed";
    pd_count(x.pd, pd);
    static const ApiError e{503, "No prefill worker could prefill this request.", "service_unavailable", "",
                            "prefill_unavailable"};
    co_return co_await reject(x, e, "prefill_unavailable");
  }
  pd_count(x.pd, pd);
  if (x.cut) {
    static const ApiError e{503, "The router is shutting down.", "service_unavailable", "", "shutting_down"};
    co_return co_await reject(x, e, "shutdown");
  }
  static const ApiError unreachable{503, "No worker could be reached for this request.", "service_unavailable", "",
                                    "upstream_unavailable"};
  co_return co_await reject(x, unreachable, "upstream_unavailable");
}

}  // namespace phases

std::optional<ApiKind> proxied_api(const ClientRequest& req) {
  const std::string_view target = std::string_view(req.target).substr(0, req.target.find('?'));
  if (req.method == http::verb::get && !response_id_of_path(target).empty())
    return ApiKind::Responses;  // GET /v1/responses/{id}: the retrieve (run() tells it by the method)
  if (req.method != http::verb::post) return std::nullopt;
  return api_of_path(target);
}

// Not a coroutine itself: the request's one frame is phases::run()'s.
awaitable<bool> proxy(ServerState& s, ClientConn& client, ClientRequest& req, ApiKind kind, IoThread& io) {
  return phases::run(s, client, req, kind, io, req.method == http::verb::get);
}

}  // namespace kvroute
