// A disaggregated request's legs (pd_exchange.h). Peers followed: vLLM
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py @030ea52 (the
// NIXL legs, one X-Request-Id), SGLang python/sglang/srt/disaggregation/
// mini_lb.py @001c2ae (both legs at once, one room, the decode answer is the
// client's), SGLang Model Gateway model_gateway/src/routers/http/pd_router.rs
// @f8daa88 (the prefill answer drained and checked; a failed leg cancels the
// other), docs/design/pd-protocols.md for all of them. An SGLang prefill leg
// may be cut with its exchange (a vLLM one may not: pd_prefill_vllm()): it
// answers only once its KV was pushed to the decode side (SGLang
// python/sglang/srt/disaggregation/prefill.py @0bd3524, the inflight queue).
#include "router/http/pd_exchange.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <random>
#include <unordered_map>

#include "common/log.h"
#include "router/http/upstream.h"
#include "router/pd_bodies.h"

namespace kvroute {

std::string_view to_string(LegResult r) {
  switch (r) {
    case LegResult::Answered: return "answered";
    case LegResult::Connect: return "connect";
    case LegResult::Timeout: return "timeout";
    case LegResult::Closed: return "closed";
    case LegResult::TooLarge: return "too_large";
    case LegResult::Cancelled: return "cancelled";
  }
  return "cancelled";
}

void PdLeg::cancel() {
  boost::system::error_code ignored;
  if (socket && socket->is_open()) socket->close(ignored);
  result = LegResult::Cancelled;
}

// What asking a Mooncake prefill worker's bootstrap server came to (outside
// the anonymous namespace: pd_prefill_vllm()'s coroutine frame holds it).
enum class MooncakeSetup : uint8_t { Ready, NoEngine, ClientGone };

namespace {

// The answer of a prefill leg: one output token, and block ids of the prompt.
constexpr size_t kMaxAnswerBytes = pd::ParamsLimits{}.max_answer_bytes;

// A per-thread generator for request ids and bootstrap rooms (not a secret:
// a room must be unique among rooms in flight, which 63 random bits are).
std::mt19937_64& rng() {
  thread_local std::mt19937_64 g{std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32)};
  return g;
}

// Sends the leg and reads its whole answer into `leg`, within `timeout`
// (connect included; router.connect_timeout_ms bounds the connect). A pooled
// connection that fails before the answer is retried once on a fresh one.
// `watch` (sequential legs only: the exchange outlives them): the client's
// watch; when the client leaves, the leg's connection closes and the leg
// ends Cancelled.
awaitable<void> run_leg(std::shared_ptr<PdLeg> leg, const Config& cfg, milliseconds timeout, ClientWatch* watch) {
  PdLeg& l = *leg;
  IoThread& io = l.io;
  const bool keep = cfg.router.upstream_pool_size > 0;
  const size_t pool_size = cfg.router.upstream_pool_size;
  const milliseconds connect_timeout(cfg.router.connect_timeout_ms);
  const auto t0 = Steady::now();
  const auto deadline = t0 + timeout;
  l.result = LegResult::Connect;
  for (int fresh = 0; fresh < 2 && !l.done; ++fresh) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Steady::now());
    if (left.count() <= 0) {
      l.result = LegResult::Timeout;
      break;
    }
    l.socket.reset();
    if (fresh == 0) l.socket = io.pool.take(l.url_text);
    const bool pooled = l.socket.has_value();
    Deadline timer(io.sweeper);
    boost::system::error_code ec;
    if (!pooled) {
      l.socket.emplace(io.ioc.get_executor());
      timer.arm(*l.socket, std::min(left, connect_timeout));
      co_await connect_to(*l.socket, l.url, ec);
      timer.settle(ec);
      if (l.result == LegResult::Cancelled) break;
      if (ec) {
        l.result = ec == asio::error::timed_out ? LegResult::Timeout : LegResult::Connect;
        break;
      }
    }
    timer.arm(*l.socket, std::chrono::duration_cast<milliseconds>(deadline - Steady::now()));
    if (watch) watch->watch(*l.socket, false);
    const std::array<asio::const_buffer, 2> wire{asio::buffer(l.head), asio::buffer(l.body)};
    co_await asio::async_write(*l.socket, wire, nothrow(ec));
    beast::flat_buffer buffer;
    WholeResponseParser parser;
    parser.header_limit(16 * 1024);
    parser.body_limit(kMaxAnswerBytes);
    if (!ec) co_await read_http(*l.socket, buffer, parser, ReadUntil::Message, ec);
    timer.settle(ec);
    if ((watch && watch->client_gone()) || l.result == LegResult::Cancelled) {
      l.result = LegResult::Cancelled;
      break;
    }
    if (ec == asio::error::timed_out) {
      l.result = LegResult::Timeout;
      break;
    }
    if (ec == http::error::body_limit) {
      l.result = LegResult::TooLarge;
      break;
    }
    if (ec && pooled) continue;
    if (ec) {
      l.result = LegResult::Closed;
      break;
    }
    l.result = LegResult::Answered;
    l.status = parser.status();
    l.answer = parser.body();
    if (keep && parser.keep_alive() && buffer.size() == 0) io.pool.give(l.url_text, std::move(*l.socket), pool_size);
    break;
  }
  if (l.result != LegResult::Answered) {
    boost::system::error_code ignored;
    if (l.socket && l.socket->is_open()) l.socket->close(ignored);  // the engine aborts a leg it cannot finish
  }
  l.socket.reset();
  l.seconds = seconds_since(t0);
  l.done = true;
  l.done_signal.cancel();
}

// The leg of `body` to the worker `t`, with the exchange's request id; null
// if its url is unusable.
// `rank`: the data-parallel rank the leg names (X-data-parallel-rank), the
// target's own when unset.
std::shared_ptr<PdLeg> make_leg(const PdState& pd, const PdContext& c, const RouteTarget& t, std::string body,
                                std::optional<uint32_t> rank = std::nullopt) {
  auto leg = std::make_shared<PdLeg>(c.io);
  leg->url_text.assign(t.url);
  if (!parse_url(t.url, leg->url)) return nullptr;
  leg->body = std::move(body);
  pd_leg_request_head(leg->head, c.req, leg->url, c.cfg.router.upstream_pool_size > 0, rank ? rank : t.dp_rank,
                      pd.request_id, leg->body.size(), c.credentials);
  return leg;
}

// ---- vLLM MooncakeConnector: the prefill worker's engine ids

// "http://host:port" of a prefill worker's Mooncake bootstrap server: its
// url's host and its worker entry's bootstrap_port (vLLM's
// VLLM_MOONCAKE_BOOTSTRAP_PORT, 8998 by default; mooncake_connector_proxy.py
// make_http_path).
std::string bootstrap_addr(const UpstreamUrl& url, uint32_t port) {
  return url.ipv6 ? fmt::format("http://[{}]:{}", url.host, port) : fmt::format("http://{}:{}", url.host, port);
}

// The bootstrap servers' /query answers, per io thread (no lock): fetched
// when a prefill leg needs one, kept kMooncakeQueryTtl, dropped when a leg of
// that prefill worker fails (a restarted engine has a new engine id). At most
// kMooncakeQueryEntries answers of at most pd::kMaxQueryAnswerBytes each.
constexpr auto kMooncakeQueryTtl = std::chrono::seconds(10);
constexpr size_t kMooncakeQueryEntries = 64;
struct MooncakeQuery {
  std::string answer;
  Steady::time_point fetched;
};
std::unordered_map<std::string, MooncakeQuery>& mooncake_queries() {
  thread_local std::unordered_map<std::string, MooncakeQuery> m;
  return m;
}
void forget_mooncake_query(const std::string& addr) { mooncake_queries().erase(addr); }

// The next turn of a prefill worker's unpinned prefill legs over its ranks
// (per io thread, per bootstrap server; at most kMooncakeQueryEntries kept):
// the legs go round its ranks as vLLM's proxy sends them
// (mooncake_connector_proxy.py @4b5c627 prefiller_cycle), where always the
// lowest rank would leave the others of a data-parallel prefill engine idle.
uint64_t next_mooncake_turn(const std::string& addr) {
  thread_local std::unordered_map<std::string, uint64_t> turns;
  if (turns.size() >= kMooncakeQueryEntries && !turns.contains(addr)) turns.clear();
  return turns[addr]++;
}

// The /query answer of the bootstrap server at `addr` (cached, else a GET
// within pd.prefill_timeout_ms); nullopt when it cannot be had (`why` says
// how the GET ended).
awaitable<std::optional<std::string>> mooncake_query(const PdContext& c, const std::string& addr,
                                                     std::string_view& why) {
  auto& cache = mooncake_queries();
  if (auto it = cache.find(addr); it != cache.end()) {
    if (Steady::now() - it->second.fetched < kMooncakeQueryTtl) co_return it->second.answer;
    cache.erase(it);
  }
  auto leg = std::make_shared<PdLeg>(c.io);
  leg->url_text = addr;
  if (!parse_url(leg->url_text, leg->url)) {
    why = "connect";
    co_return std::nullopt;
  }
  const bool keep = c.cfg.router.upstream_pool_size > 0;
  leg->head = fmt::format("GET /query HTTP/1.1\r\nHost: {}{}{}:{}\r\nAccept: application/json\r\n{}\r\n",
                          leg->url.ipv6 ? "[" : "", leg->url.host, leg->url.ipv6 ? "]" : "", leg->url.port,
                          keep ? "" : "Connection: close\r\n");
  co_await run_leg(leg, c.cfg, milliseconds(c.cfg.pd.prefill_timeout_ms), &c.watch);
  if (leg->result != LegResult::Answered) {
    why = to_string(leg->result);
    co_return std::nullopt;
  }
  if (leg->status != 200) {
    why = leg->status / 100 == 5 ? "status_5xx" : "status_4xx";
    co_return std::nullopt;
  }
  if (leg->answer.size() > pd::kMaxQueryAnswerBytes) {
    why = "too_large";
    co_return std::nullopt;
  }
  if (cache.size() >= kMooncakeQueryEntries) cache.clear();  // more prefill workers than entries: start over
  cache[addr] = MooncakeQuery{leg->answer, Steady::now()};
  co_return std::move(leg->answer);
}

// The label of a prefill leg's end (kvroute_pd_prefill_legs_total).
std::string_view leg_label(const PdLeg& l) {
  if (l.result != LegResult::Answered) return to_string(l.result);
  if (l.status / 100 == 2) return "ok";
  if (l.status == 429) return "status_429";
  return l.status / 100 == 4 ? "status_4xx" : "status_5xx";
}

// Passive health, as the proxy reports a worker's failures and successes.
void report_leg(ServerState& s, IoThread& io, WorkerId worker, const PdLeg& l) {
  WorkerRegistry& registry = *s.hooks.registry;
  const bool failed = l.result == LegResult::Connect || l.result == LegResult::Timeout ||
                      l.result == LegResult::Closed || (l.result == LegResult::Answered && l.status >= 500);
  if (failed) {
    registry.report_failure(worker, l.result == LegResult::Connect   ? HealthSignal::ConnectRefused
                                    : l.result == LegResult::Timeout ? HealthSignal::FirstByteTimeout
                                                                     : HealthSignal::ServerError);
    io.suspect(worker);
    return;
  }
  auto& suspects = io.suspects;
  if (const auto it = std::find(suspects.begin(), suspects.end(), worker); it != suspects.end()) {
    suspects.erase(it);
    registry.report_success(worker);
  }
}
void report_leg(const PdContext& c, WorkerId worker, const PdLeg& l) { report_leg(c.s, c.io, worker, l); }

void count_leg(ServerState& s, const PdLeg& l) {
  RouterMetrics* m = s.hooks.metrics;
  if (!m) return;
  m->pd_prefill_legs_total.with({leg_label(l)}).inc();
  if (l.result == LegResult::Answered) m->pd_leg_seconds.with({"prefill"}).observe(l.seconds);
}
void count_leg(const PdContext& c, const PdLeg& l) { count_leg(c.s, l); }

void warn_leg(const RouteTarget& t, const PdLeg& l, std::string_view what) {
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("prefill worker {} ({}): {} ({}{}); trying the next prefill worker", t.worker.value, t.url, what,
                 leg_label(l), l.result == LegResult::Answered ? fmt::format(" {}", l.status) : std::string());
}

// NIXL: the kv_transfer_params of a prefill leg's 2xx answer, read as
// untrusted input into `params`; false (counted, warned) when refused: the
// transfer they would name is left to the engine's lease.
bool nixl_params(const PdContext& c, const RouteTarget& t, const PdLeg& leg, std::string& params) {
  std::string detail;
  const pd::ParamsError err = pd::read_kv_transfer_params(leg.answer, leg.url.host, {}, params, &detail);
  if (err == pd::ParamsError::None) return true;
  if (RouterMetrics* m = c.s.hooks.metrics) {
    m->pd_params_rejected_total.with({pd::to_string(err)}).inc();
    m->pd_transfers_left_total.with({"params_rejected"}).inc();
  }
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("prefill worker {} ({}): its kv_transfer_params are not relayed: {}{}{}; the transfer they name "
                 "is left to its lease",
                 t.worker.value, t.url, pd::to_string(err), detail.empty() ? "" : ": ", detail);
  return false;
}

// The KV a prefill leg holds on its worker `t` while it runs, as in-flight
// accounting counts it (router/routing.h inflight_prompt()); a copy, since
// a concurrent leg may outlive the route.
InflightKv prefill_leg_kv(const PdContext& c, const RouteTarget& t) {
  return route_inflight_kv(c.cfg.scheduler, c.route, t, c.route.request_blocks, inflight_shared_blocks(c.cfg.scheduler, t));
}

// A prefill leg beside the decode leg (SGLang; Mooncake with
// pd.mooncake_concurrent_legs), with the prefill worker's in-flight
// accounting while it runs; when it fails it ends the decode leg's wait.
// `self_counted` (Mooncake: the leg outlives its attempt, never cut): counted
// and reported here when it ends, on `s` and `io` (they outlive it), rather
// than by the exchange.
awaitable<void> concurrent_prefill_leg(std::shared_ptr<PdLeg> leg, std::shared_ptr<PdDecodeLink> link,
                                   std::shared_ptr<const Config> cfg, WorkerRegistry* registry, WorkerId worker,
                                   InflightKv kv, uint64_t tokens, ServerState* self_counted, IoThread* io) {
  InflightGuard guard(*registry, worker, std::move(kv), tokens);
  co_await run_leg(leg, *cfg, milliseconds(cfg->pd.prefill_timeout_ms), nullptr);
  // Answered: its prefill is over, as for a sequential leg (the TTFT model
  // learns it; the prompt is in the worker's cache: parked KV).
  if (leg->result == LegResult::Answered) guard.first_byte();
  if (self_counted) {
    count_leg(*self_counted, *leg);
    report_leg(*self_counted, *io, worker, *leg);
  }
  const bool ok = leg->result == LegResult::Answered && leg->status / 100 == 2;
  if (ok || leg->result == LegResult::Cancelled) co_return;
  link->prefill_failed = true;
  if (link->decode) {
    boost::system::error_code ignored;
    link->decode->cancel(ignored);  // the decode leg's wait ends: the proxy retries with a fresh room or transfer
  }
}

// The concurrent leg of `pd` set up: the decode body names the same
// transfer, and the leg runs on its own (it may outlive the exchange).
void spawn_concurrent(PdState& pd, const PdContext& c, const RouteTarget& t, std::shared_ptr<PdLeg> leg) {
  pd.prefill = pd.next_prefill;
  pd.concurrent = leg;
  if (pd.link) pd.link->decode = nullptr;  // the previous attempt's link stays with its leg
  pd.link = std::make_shared<PdDecodeLink>();
  const bool self_counted = pd.protocol == PdProtocol::VllmMooncake;
  asio::co_spawn(c.io.ioc,
                 concurrent_prefill_leg(std::move(leg), pd.link, c.s.hooks.config->get(), c.s.hooks.registry,
                                        t.worker, prefill_leg_kv(c, t), t.prefill_tokens,
                                        self_counted ? &c.s : nullptr, &c.io),
                 asio::detached);
}

// How a split request ends when no prefill worker is left to try.
PdPrefill no_prefill_left(PdState& pd, const PdContext& c, std::string_view failure) {
  if (c.cfg.pd.on_prefill_failure == "fail") {
    pd.outcome = "failed";
    pd.reason = failure;
    return PdPrefill::Fail;
  }
  pd_fall_back(pd, failure);
  return PdPrefill::Aggregated;
}

// A release leg: its answer discarded, its end counted.
awaitable<void> release_leg(std::shared_ptr<PdLeg> leg, std::shared_ptr<const Config> cfg, RouterMetrics* m) {
  co_await run_leg(leg, *cfg, milliseconds(cfg->pd.prefill_timeout_ms), nullptr);
  const bool ok = leg->result == LegResult::Answered && leg->status / 100 == 2;
  if (m) m->pd_releases_total.with({ok ? "ok" : "failed"}).inc();
  if (!ok && m) m->pd_transfers_left_total.with({"release_failed"}).inc();
  if (!ok) {
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("a decode leg sent to release a prefilled transfer ({}) failed: {} {}; the prefill worker frees "
                   "it when its lease ends",
                   leg->url_text, to_string(leg->result), leg->status);
  }
}

// Mooncake: the decode engine finds the prefilled blocks by the prefill
// worker's bootstrap server, its engine id for the rank that prefilled, and
// a transfer id the router mints, fresh for every prefill leg (the prefill
// engine keys its held blocks by it). Ready: `leg_body` is the prefill leg's
// body, `params` the decode leg's kv_transfer_params and `rank` the rank the
// prefill leg names (over one rank with none pinned).
awaitable<MooncakeSetup> mooncake_setup(PdState& pd, const PdContext& c, const RouteTarget& t, const UpstreamUrl& url,
                                        std::string& leg_body, std::string& params, std::optional<uint32_t>& rank) {
  RouterMetrics* m = c.s.hooks.metrics;
  const std::string addr = bootstrap_addr(url, c.route.pd.bootstrap_ports[pd.next_prefill]);
  std::string_view why;
  const std::optional<std::string> answer = co_await mooncake_query(c, addr, why);
  if (c.watch.client_gone()) co_return MooncakeSetup::ClientGone;
  pd::MooncakeEngine engine;
  std::string detail;
  // A worker kvroute knows as one rank (its dp_size) keeps the lowest: the
  // index follows its rank 0's KV events only.
  uint32_t known_ranks = 1;
  for (const WorkerView& w : c.route.workers)
    if (w.info && w.info->id == t.worker) known_ranks = w.info->dp_size;
  const uint64_t turn = answer && !t.dp_rank && known_ranks > 1 ? next_mooncake_turn(addr) : 0;
  const pd::ParamsError err =
      answer ? pd::read_mooncake_query(*answer, t.dp_rank, engine, &detail, turn) : pd::ParamsError::None;
  if (!answer || err != pd::ParamsError::None) {
    if (answer && m) m->pd_params_rejected_total.with({pd::to_string(err)}).inc();
    if (answer) forget_mooncake_query(addr);
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("prefill worker {} ({}): its Mooncake bootstrap server {} gave no engine id: {}{}{}",
                   t.worker.value, t.url, addr, answer ? pd::to_string(err) : why, detail.empty() ? "" : ": ",
                   detail);
    co_return MooncakeSetup::NoEngine;
  }
  // Over one rank: the prefill leg names the rank whose engine id the
  // decode leg gets (mooncake_connector_proxy.py sends X-data-parallel-rank);
  // when the router steered to no rank (no cached prefix there), the worker's
  // next turn over its ranks.
  if (!t.dp_rank && engine.ranks > 1) rank = engine.rank;
  const std::string transfer_id = fmt::format("xfer-{}-{}", pd.request_id, ++pd.transfers_minted);
  pd::mooncake_prefill_body(pd.stripped, transfer_id, leg_body);
  params = pd::mooncake_decode_params(addr, engine.engine_id, transfer_id);
  co_return MooncakeSetup::Ready;
}

// The Mooncake prefill leg to the prefill ranking's pd.next_prefill worker
// (mooncake_setup()): `leg_body` its body, `params` the decode leg's
// kv_transfer_params. Null when that worker cannot be asked (`failure` says
// why) or the client left during its bootstrap query (`gone`, counted:
// nothing was sent).
awaitable<std::shared_ptr<PdLeg>> mooncake_leg(PdState& pd, const PdContext& c, std::string& leg_body,
                                               std::string& params, std::string_view& failure, bool& gone) {
  const RouteTarget& t = c.route.pd.prefill[pd.next_prefill];
  UpstreamUrl url;
  if (!parse_url(t.url, url)) {
    failure = "connect";
    co_return nullptr;
  }
  std::optional<uint32_t> rank;
  const MooncakeSetup setup = co_await mooncake_setup(pd, c, t, url, leg_body, params, rank);
  if (setup == MooncakeSetup::ClientGone) {
    pd_client_gone(pd, c, "prefill");
    gone = true;
    co_return nullptr;
  }
  if (setup == MooncakeSetup::NoEngine) {
    failure = "bootstrap_query";
    co_return nullptr;
  }
  auto leg = make_leg(pd, c, t, leg_body, rank);
  if (!leg) failure = "connect";
  co_return leg;
}

}  // namespace

bool pd_begin(PdState& pd, const PdContext& c) {
  const PdRoute& r = c.route.pd;
  if (!r.active) return true;
  pd.active = true;
  if (pd::strip_transfer_fields(c.req.body, pd.stripped) != pd::BodyError::None) return false;
  pd.split = r.disaggregate && !r.prefill.empty();
  pd.protocol = pd_protocol_of(c.cfg.pd, c.model);
  pd.concurrent_legs = pd.protocol == PdProtocol::Sglang ||
                       (pd.protocol == PdProtocol::VllmMooncake && c.cfg.pd.mooncake_concurrent_legs);
  pd.request_id = fmt::format("kvroute-{:016x}", rng()());
  pd.outcome = pd.split ? "disaggregated" : "aggregated";
  pd.reason = to_string(r.reason);
  return true;
}

void pd_fall_back(PdState& pd, std::string_view reason) {
  if (pd.link) pd.link->decode = nullptr;
  pd.link.reset();  // a failed concurrent prefill leg no longer ends the (whole) decode attempt's wait
  pd.split = false;
  pd.outcome = "fallback";
  pd.reason = reason;
}

awaitable<PdPrefill> pd_prefill_vllm(PdState& pd, const PdContext& c) {
  RouterMetrics* m = c.s.hooks.metrics;
  const std::vector<RouteTarget>& prefill = c.route.pd.prefill;
  const bool mooncake = pd.protocol == PdProtocol::VllmMooncake;
  std::string leg_body;
  if (!mooncake) pd::nixl_prefill_body(pd.stripped, leg_body);
  std::string_view failure = "no_prefill_worker";
  for (size_t tried = 0; pd.next_prefill < prefill.size(); ++pd.next_prefill, ++tried) {
    if (tried > 0 && m) m->pd_retries_total.with({"prefill"}).inc();
    const RouteTarget& t = prefill[pd.next_prefill];
    UpstreamUrl url;
    if (!parse_url(t.url, url)) {
      failure = "connect";
      continue;
    }
    std::string mooncake_params;
    std::shared_ptr<PdLeg> leg;
    if (mooncake) {
      bool gone = false;
      leg = co_await mooncake_leg(pd, c, leg_body, mooncake_params, failure, gone);
      if (gone) co_return PdPrefill::ClientGone;
    } else if (!(leg = make_leg(pd, c, t, leg_body))) {
      failure = "connect";
    }
    if (!leg) continue;
    // The router's in-flight accounting: the prefill worker computes the
    // prompt; the decode worker's guard (the proxy's) counts no prefill.
    InflightGuard guard(*c.s.hooks.registry, t.worker, prefill_leg_kv(c, t), t.prefill_tokens);
    // A sent prefill leg is never cut for its client: cut as the engine
    // finished, its KV is held for nobody (the engine's abort is a no-op for
    // a finished request: vLLM nixl pull_scheduler.py and mooncake_connector.py
    // request_finished() hold a FINISHED_LENGTH_CAPPED prefill's blocks),
    // and kvroute would never read the answer that names it. A Mooncake
    // release leg sent blind after a cut is no way out either: when the
    // abort won, the decode engine waits VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT
    // (480 s) for a transfer that will not come (mooncake_connector.py @5c51233
    // send_kv_to_decode(); record_send_reqs() drops an aborted transfer id).
    // So the leg runs to its answer (within pd.prefill_timeout_ms) and a
    // client that left meanwhile gets its transfer released (prepare_legs).
    c.watch.notice([&pd, &c] { pd_client_gone(pd, c, "prefill"); });
    co_await run_leg(leg, c.cfg, milliseconds(c.cfg.pd.prefill_timeout_ms), nullptr);
    pd.client_left = c.watch.client_gone();
    count_leg(c, *leg);
    report_leg(c, t.worker, *leg);
    const bool prefilled = leg->result == LegResult::Answered && leg->status / 100 == 2;
    if (pd.client_left && !prefilled) co_return PdPrefill::ClientGone;
    if (leg->result != LegResult::Answered) {
      failure = to_string(leg->result);
      if (mooncake) forget_mooncake_query(bootstrap_addr(url, c.route.pd.bootstrap_ports[pd.next_prefill]));
      warn_leg(t, *leg, "the prefill leg failed");
      continue;
    }
    guard.first_byte();
    if (leg->status / 100 == 4 && leg->status != 429 && leg->status != 408) {
      // The request itself is refused (validation): run it whole; its decode
      // worker answers the client the engine's own error.
      pd_fall_back(pd, "status_4xx");
      co_return PdPrefill::Aggregated;
    }
    if (leg->status / 100 != 2) {
      failure = leg->status == 429 ? "status_429" : "status_5xx";
      if (mooncake) forget_mooncake_query(bootstrap_addr(url, c.route.pd.bootstrap_ports[pd.next_prefill]));
      warn_leg(t, *leg, "the prefill leg failed");
      continue;
    }
    std::string params;
    if (mooncake) {
      params = std::move(mooncake_params);  // the prefill engine answers no kv_transfer_params
    } else if (!nixl_params(c, t, *leg, params)) {
      if (pd.client_left) co_return PdPrefill::ClientGone;
      failure = "params_rejected";
      continue;
    }
    pd::nixl_decode_body(pd.stripped, params, pd.decode_body);
    pd::nixl_decode_body(leg_body, params, pd.release_body);  // max_tokens 1, no stream: a release
    pd.prefill = pd.next_prefill;
    pd.need_prefill = false;
    co_return PdPrefill::Ready;
  }
  co_return no_prefill_left(pd, c, failure);
}

awaitable<PdPrefill> pd_start_mooncake(PdState& pd, const PdContext& c) {
  RouterMetrics* m = c.s.hooks.metrics;
  const std::vector<RouteTarget>& prefill = c.route.pd.prefill;
  std::string_view failure = "no_prefill_worker";
  // The last attempt's prefill worker failed (or may have): this is a retry on the next.
  const bool after_failure = pd.prefill && pd.next_prefill > *pd.prefill;
  for (size_t tried = 0; pd.next_prefill < prefill.size(); ++pd.next_prefill, ++tried) {
    if ((tried > 0 || after_failure) && m) m->pd_retries_total.with({"prefill"}).inc();
    const RouteTarget& t = prefill[pd.next_prefill];
    std::string leg_body, params;
    bool gone = false;
    auto leg = co_await mooncake_leg(pd, c, leg_body, params, failure, gone);
    if (gone) co_return PdPrefill::ClientGone;
    if (!leg) continue;
    pd::nixl_decode_body(pd.stripped, params, pd.decode_body);
    pd::nixl_decode_body(leg_body, params, pd.release_body);  // max_tokens 1, no stream: a release
    pd.need_prefill = false;
    spawn_concurrent(pd, c, t, std::move(leg));
    co_return PdPrefill::Ready;
  }
  co_return no_prefill_left(pd, c, failure);
}

bool pd_start_sglang(PdState& pd, const PdContext& c) {
  const PdRoute& r = c.route.pd;
  if (pd.concurrent && !pd.concurrent->done) pd.concurrent->cancel();
  pd.concurrent.reset();
  for (; pd.next_prefill < r.prefill.size(); ++pd.next_prefill) {
    const RouteTarget& t = r.prefill[pd.next_prefill];
    UpstreamUrl url;
    if (!parse_url(t.url, url)) continue;
    // One room per attempt (a room is single-use); the decode worker finds
    // the prefill worker's bootstrap server on its host (no port, as SGLang
    // takes it) and bootstrap_port.
    const uint64_t room = rng()() & 0x7fffffffffffffffull;
    pd::sglang_body(pd.stripped, url.host, r.bootstrap_ports[pd.next_prefill], room, pd.decode_body);
    auto leg = make_leg(pd, c, t, pd.decode_body);
    if (!leg) continue;
    spawn_concurrent(pd, c, t, std::move(leg));
    return true;
  }
  return false;
}

void pd_client_gone(const PdState& pd, const PdContext& c, std::string_view phase) {
  if (!pd.split) return;
  if (RouterMetrics* m = c.s.hooks.metrics) m->pd_client_gone_total.with({phase}).inc();
}

namespace {

// Mooncake with concurrent legs: a decode attempt ended before its first
// byte. Its prefill leg failed: that transfer is gone (the prefill engine
// frees an aborted prefill's blocks; a decode engine pulling it waits out
// VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, which the router cannot shorten: see
// README "Connect a disaggregated vLLM fleet"); its worker's bootstrap
// answer is dropped (the leg counted itself), and the next attempt has a fresh
// transfer on the next prefill worker (so does a decode failure while the
// prefill leg has not succeeded). A decode worker that received the
// request holds the transfer id: its pull, or the empty pull of its abort
// (mooncake_connector.py request_finished()), claims the transfer, so the
// next attempt gets a fresh one and this prefill leg runs on to its answer
// (never cut). One that never received it leaves the transfer for the next.
void mooncake_decode_failed(PdState& pd, const PdContext& c, bool sent) {
  const bool prefill_failed = pd.prefill_failed();
  if (prefill_failed && pd.concurrent && pd.prefill) {  // (the leg counted and reported itself)
    const RouteTarget& t = c.route.pd.prefill[*pd.prefill];
    UpstreamUrl url;
    if (parse_url(t.url, url)) forget_mooncake_query(bootstrap_addr(url, c.route.pd.bootstrap_ports[*pd.prefill]));
    warn_leg(t, *pd.concurrent, "the concurrent prefill leg failed");
    pd.next_prefill = *pd.prefill + 1;
  } else if (sent && pd.concurrent && pd.prefill &&
             !(pd.concurrent->done && pd.concurrent->result == LegResult::Answered && pd.concurrent->status / 100 == 2)) {
    // A prefill leg that did not succeed may be the cause even when it has
    // not ended yet: a decode engine whose pull finds the prefill worker gone
    // answers first (as SGLang's, pd_decode_failed()).
    pd.next_prefill = *pd.prefill + 1;
  }
  if (!prefill_failed && !sent) return;
  pd.need_prefill = true;
  pd.concurrent.reset();
  if (pd.link) pd.link->decode = nullptr;
  if (!prefill_failed) pd.link.reset();  // a failed one tells the exchange why, should it be the last attempt
}

}  // namespace

void pd_decode_failed(PdState& pd, const PdContext& c, bool sent, std::string_view how) {
  if (!pd.split) return;
  if (sent && !pd.prefill_failed())
    if (RouterMetrics* m = c.s.hooks.metrics) m->pd_transfers_left_total.with({how}).inc();
  if (pd.protocol == PdProtocol::VllmMooncake && pd.concurrent_legs) {
    mooncake_decode_failed(pd, c, sent);
    return;
  }
  if (pd.protocol != PdProtocol::Sglang) {
    // vLLM (NIXL, Mooncake): a decode worker that received the request may
    // have pulled (and so freed) the transfer: the next decode worker gets a
    // fresh prefill. One that never received it leaves the transfer for the next.
    if (sent) pd.need_prefill = true;
    return;
  }
  // SGLang: the room dies with this attempt; a prefill leg that failed on
  // its own (its worker gone) moves the next attempt to the next prefill worker.
  // A prefill leg that did not succeed may be the cause even when it has not
  // ended yet (a decode worker notices a dead bootstrap server first).
  if (pd.concurrent) {
    const PdLeg& l = *pd.concurrent;
    if (!(l.done && l.result == LegResult::Answered && l.status / 100 == 2)) ++pd.next_prefill;
    if (!l.done) pd.concurrent->cancel();
    pd.concurrent.reset();
  }
}

awaitable<void> pd_finish_concurrent(PdState& pd, const PdContext& c) {
  std::shared_ptr<PdLeg> leg = std::move(pd.concurrent);
  // A Mooncake leg counts and reports itself (concurrent_prefill_leg): the
  // client's connection need not wait for it.
  if (!leg || pd.protocol != PdProtocol::Sglang) co_return;
  if (!leg->done) {
    boost::system::error_code ec;
    co_await leg->done_signal.async_wait(nothrow(ec));  // woken when the leg ends (bounded by its own timeout)
  }
  count_leg(c, *leg);
  if (pd.prefill) report_leg(c, c.route.pd.prefill[*pd.prefill].worker, *leg);
  if (!(leg->result == LegResult::Answered && leg->status / 100 == 2) && pd.prefill) {
    const RouteTarget& t = c.route.pd.prefill[*pd.prefill];
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("prefill worker {} ({}): its SGLang prefill leg ended {} {} while its decode leg answered",
                   t.worker.value, t.url, to_string(leg->result), leg->status);
  }
}

void pd_release(PdState& pd, const PdContext& c, const RouteTarget& decode) {
  if (!pd.split || pd.protocol == PdProtocol::Sglang || pd.need_prefill || pd.release_body.empty()) return;
  pd.need_prefill = true;
  auto leg = make_leg(pd, c, decode, std::move(pd.release_body));
  if (!leg) return;
  asio::co_spawn(c.io.ioc, release_leg(leg, c.s.hooks.config->get(), c.s.hooks.metrics), asio::detached);
}

void pd_committed(PdState& pd, const PdContext& c, double ttfb) {
  if (!pd.active) return;
  if (RouterMetrics* m = c.s.hooks.metrics; m && pd.split) m->pd_leg_seconds.with({"decode"}).observe(ttfb);
  if (pd.split && pd.prefill)
    pd.fields = fmt::format("\r\nx-kvroute-pd: disaggregated\r\nx-kvroute-prefill-worker: {}",
                            c.route.pd.prefill[*pd.prefill].worker.value);
  else
    pd.fields = fmt::format("\r\nx-kvroute-pd: {}", pd.outcome == "fallback" ? "fallback" : "aggregated");
  pd_count(pd, c);
}

void pd_count(PdState& pd, const PdContext& c) {
  if (!pd.active || pd.counted) return;
  pd.counted = true;
  if (RouterMetrics* m = c.s.hooks.metrics) m->pd_requests_total.with({pd.outcome, pd.reason}).inc();
}

}  // namespace kvroute
