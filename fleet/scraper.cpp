#include "fleet/scraper.h"

#include <utility>  // std::exchange, used by Boost 1.74's awaitable.hpp

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>
#include <spdlog/spdlog.h>

#include "common/log.h"
#include "fleet/engine_metrics.h"
#include "common/http_url.h"

namespace kvroute {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
// Errors as values (no exception per failed scrape).
auto nothrow(beast::error_code& ec) { return asio::redirect_error(asio::use_awaitable, ec); }

namespace {

enum class Outcome { Ok, Refused, ConnectTimeout, Failed };

struct Shared {
  WorkerRegistry* registry;
  ScraperStats* stats;
  const std::function<void(WorkerId)>* recovered;
};

}  // namespace

struct Scraper::Loop {
  Loop(asio::io_context& ioc, ScrapeTarget t) : target(std::move(t)), timer(ioc) {}
  ScrapeTarget target;
  std::string url_text;  // owns the text `url` views
  UpstreamUrl url;
  bool stopped = false;
  std::chrono::milliseconds interval{250}, timeout{1000};
  asio::steady_timer timer;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
  std::string failure;  // why the last scrape failed (for the log)
  WorkerLoad load;
  bool warned_block_size = false;  // said once per worker: its engine's block size is not the router's

  void stop() {
    stopped = true;
    timer.cancel();
    if (stream) stream->cancel(), stream->socket().close();
  }
};

namespace {

// Opens a connection to the target. Refused / timed out are told apart: a
// refused connection means nothing listens (down at once).
asio::awaitable<Outcome> connect(Scraper::Loop& L) {
  auto ex = co_await asio::this_coro::executor;
  tcp::resolver resolver(ex);
  beast::error_code rec;
  auto results = co_await resolver.async_resolve(L.url.host, L.url.port, nothrow(rec));
  if (rec) {
    L.failure = "resolve: " + rec.message();
    co_return Outcome::Failed;
  }
  L.stream.emplace(ex);
  L.buffer.clear();
  L.stream->expires_after(L.timeout);
  beast::error_code cec;
  co_await L.stream->async_connect(results, nothrow(cec));
  if (!cec) co_return Outcome::Ok;
  L.failure = "connect: " + cec.message();
  L.stream.reset();
  if (cec == asio::error::connection_refused) co_return Outcome::Refused;
  if (cec == beast::error::timeout) co_return Outcome::ConnectTimeout;
  co_return Outcome::Failed;
}

// An engine whose /metrics name another block size (vLLM's cache_config_info)
// than indexer.block_size: its KV events are skipped and its prefixes never
// match. Said once per worker, before any event arrives.
void warn_block_size(Scraper::Loop& L, const EngineMetrics& m) {
  if (!m.block_size || *m.block_size == L.target.block_size || L.warned_block_size) return;
  L.warned_block_size = true;
  spdlog::warn("worker {}: its /metrics give block_size {} but indexer.block_size is {}: its KV events are skipped and "
               "its cached prefixes never match (set indexer.block_size to the engine's vLLM --block-size / SGLang "
               "--page-size)",
               L.target.id.value, *m.block_size, L.target.block_size);
}

// One GET on the open connection; fills L.load on success.
asio::awaitable<Outcome> request(Scraper::Loop& L) {
  const beast::string_view target = L.url.base.empty() ? beast::string_view("/")
                                                       : beast::string_view(L.url.base.data(), L.url.base.size());
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, L.url.ipv6 ? "[" + std::string(L.url.host) + "]" : std::string(L.url.host));
  req.set(http::field::user_agent, "kvroute-scraper");
  req.set(http::field::accept, "text/plain");
  L.stream->expires_after(L.timeout);
  beast::error_code wec;
  co_await http::async_write(*L.stream, req, nothrow(wec));
  if (wec) {
    L.failure = "send: " + wec.message();
    co_return Outcome::Failed;
  }
  http::response_parser<http::string_body> parser;
  parser.body_limit(32 << 20);
  beast::error_code rec;
  co_await http::async_read(*L.stream, L.buffer, parser, nothrow(rec));
  if (rec) {
    L.failure = "read: " + rec.message();
    co_return Outcome::Failed;
  }
  auto& res = parser.get();
  if (!res.keep_alive()) L.stream.reset();
  if (res.result() != http::status::ok) {
    L.failure = "status " + std::to_string(res.result_int());
    co_return Outcome::Failed;
  }
  auto m = parse_engine_metrics(res.body());
  if (!m) {
    L.failure = "no vLLM or SGLang metric in the answer";
    co_return Outcome::Failed;
  }
  warn_block_size(L, *m);
  L.load = to_worker_load(*m, m->block_size.value_or(L.target.block_size), L.target.max_seqs, L.target.kv_blocks);
  co_return Outcome::Ok;
}

asio::awaitable<Outcome> scrape_once(Scraper::Loop& L) {
  const bool reused = L.stream.has_value();
  if (!reused) {
    if (auto o = co_await connect(L); o != Outcome::Ok) co_return o;
  }
  auto o = co_await request(L);
  if (o == Outcome::Failed && reused && !L.stopped) {
    // The worker may have closed an idle keep-alive connection: once more on a fresh one.
    L.stream.reset();
    if (auto c = co_await connect(L); c != Outcome::Ok) co_return c;
    o = co_await request(L);
  }
  if (o != Outcome::Ok) L.stream.reset();
  co_return o;
}

void report(Scraper::Loop& L, Outcome o, const Shared& sh) {
  const WorkerId id = L.target.id;
  if (o == Outcome::Ok) {
    sh.stats->scrapes_ok.fetch_add(1, std::memory_order_relaxed);
    if (sh.registry->on_load_report(id, L.load) && *sh.recovered) {
      spdlog::info("worker {} answers again: re-syncing its KV events", id.value);
      (*sh.recovered)(id);
    }
    return;
  }
  sh.stats->scrapes_failed.fetch_add(1, std::memory_order_relaxed);
  sh.registry->report_failure(id, o == Outcome::Refused          ? HealthSignal::ConnectRefused
                                  : o == Outcome::ConnectTimeout ? HealthSignal::ConnectTimeout
                                                                 : HealthSignal::ScrapeFailed);
  static RateLimiter rl;
  if (rl.allow()) spdlog::warn("scrape of worker {} ({}) failed: {}", id.value, L.target.url, L.failure);
}

asio::awaitable<void> scrape_loop(std::shared_ptr<Scraper::Loop> L, Shared sh) {
  while (!L->stopped) {
    const Outcome o = co_await scrape_once(*L);
    if (L->stopped) break;
    report(*L, o, sh);
    L->timer.expires_after(L->interval);
    beast::error_code ec;
    co_await L->timer.async_wait(nothrow(ec));
  }
}

}  // namespace

Scraper::Scraper(asio::io_context& ioc, WorkerRegistry& registry, std::function<void(WorkerId)> recovered)
    : ioc_(ioc), registry_(registry), recovered_(std::move(recovered)) {}

Scraper::~Scraper() {
  for (auto& [id, loop] : loops_) loop->stop();
}

void Scraper::set_targets(const std::vector<ScrapeTarget>& targets) {
  std::map<uint64_t, std::shared_ptr<Loop>> next;
  for (const auto& t : targets) {
    auto it = loops_.find(t.id.value);
    if (it != loops_.end() && it->second->target == t) {
      next.emplace(t.id.value, std::move(it->second));
      loops_.erase(it);
      continue;
    }
    auto loop = std::make_shared<Loop>(ioc_, t);
    loop->url_text = t.url;
    if (!parse_url(loop->url_text, loop->url)) {
      spdlog::error("worker {}: metrics URL '{}' is not an http:// URL; not scraped", t.id.value, t.url);
      continue;
    }
    loop->interval = interval_;
    loop->timeout = timeout_;
    asio::co_spawn(ioc_, scrape_loop(loop, Shared{&registry_, &stats_, &recovered_}), asio::detached);
    next.emplace(t.id.value, std::move(loop));
  }
  for (auto& [id, loop] : loops_) loop->stop();  // gone or changed
  loops_ = std::move(next);
}

void Scraper::set_timing(std::chrono::milliseconds interval, std::chrono::milliseconds timeout) {
  const bool changed = interval != interval_;
  interval_ = interval;
  timeout_ = timeout;
  for (auto& [id, loop] : loops_) {
    loop->interval = interval, loop->timeout = timeout;
    // A new interval applies now: a loop waiting out the old one scrapes at
    // once (its wait is cancelled) and then every new interval.
    if (changed) loop->timer.cancel();
  }
}

}  // namespace kvroute
