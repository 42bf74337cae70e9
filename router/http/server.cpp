// Listeners and lifecycle (server.h): the io threads, the accept loops (thread
// 0 hands each OpenAI connection to the io threads round-robin; the admin
// listener keeps its connections on its own thread), each thread's sweep
// loop, and start, drain and stop.
#include "router/http/server.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"
#include "router/http/io_thread.h"
#include "router/http/server_state.h"
#include "router/http/session.h"

namespace kvroute {

struct HttpServer::Impl {
  explicit Impl(HttpServerHooks h) : state(std::move(h)), acceptor(io0().ioc), admin_acceptor(admin_io->ioc) {}

  ServerState state;
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

  awaitable<void> accept_loop(Acceptor& a, bool admin);
  void refuse_connection(Socket& socket, bool admin);
  awaitable<void> sweep_loop(IoThread& io);
  void evict_departed(IoThread& io);
  std::vector<IoThread*> all_threads();
};

awaitable<void> HttpServer::Impl::accept_loop(Acceptor& a, bool admin) {
  for (;;) {
    boost::system::error_code ec;
    // Admin connections stay on the admin thread; the others go round-robin
    // (next_io is touched by thread 0 only).
    IoThread& target = admin ? *admin_io : *io[next_io++ % io.size()];
    Socket socket = co_await a.async_accept(target.ioc, nothrow(ec));
    if (ec) {
      if (state.stopping.load() || ec == asio::error::operation_aborted || !a.is_open()) co_return;
      static RateLimiter rl;
      if (rl.allow()) spdlog::warn("accept failed: {}", ec.message());
      if (ec == asio::error::no_descriptors) {  // out of file descriptors: back off
        Timer t(co_await asio::this_coro::executor, milliseconds(50));
        co_await t.async_wait(nothrow(ec));
      }
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    std::atomic<int64_t>& open = admin ? state.admin_connections : state.connections;
    const uint64_t limit =
        admin ? ServerState::kMaxAdminConnections : state.connection_limit(*state.hooks.config->get());
    if (open.load(std::memory_order_relaxed) >= static_cast<int64_t>(limit)) {
      refuse_connection(socket, admin);
      continue;
    }
    open.fetch_add(1, std::memory_order_relaxed);  // given back when session() ends
    asio::co_spawn(target.ioc, session(state, std::move(socket), admin, target), asio::detached);
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
  const auto n = state.connections_refused.fetch_add(1, std::memory_order_relaxed) + 1;
  if (RouterMetrics* m = state.hooks.metrics)
    m->rejected_total.with({admin ? "admin_connection_limit" : "connection_limit"}).inc();
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("{} reached: connection refused ({} so far)",
                 admin ? "the admin listener's 256 connections" : "router.max_connections", n);
  [[maybe_unused]] const ssize_t sent =
      ::send(socket.native_handle(), kBusy.data(), kBusy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  boost::system::error_code ignored;
  socket.shutdown(Socket::shutdown_send, ignored);
  socket.close(ignored);
}

// Ticks the io thread's sweeper: a tenth of the shortest configured timeout,
// between 5 and 50 ms, so a timeout fires at most 10% (or 50 ms) late and a
// slow request's client watch is armed within ClientWatch::kDelay + one tick.
awaitable<void> HttpServer::Impl::sweep_loop(IoThread& io) {
  Timer timer(io.ioc);
  boost::system::error_code ec;
  while (!state.stopping.load()) {
    const auto cfg = state.hooks.config->get();
    const auto& r = cfg->router;
    const uint32_t shortest = std::min({r.connect_timeout_ms, r.first_byte_timeout_ms, r.first_byte_timeout_min_ms,
                                        r.idle_timeout_ms, r.client_read_timeout_ms, cfg->tokenizer.remote_timeout_ms});
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
  if (io.pool.empty() || !state.hooks.registry) return;
  const auto workers = state.hooks.registry->all();
  const size_t closed = io.pool.evict_if([&](std::string_view url) {
    return std::none_of(workers.begin(), workers.end(), [&](const WorkerView& w) { return w.info && w.info->url == url; });
  });
  if (closed) spdlog::debug("closed {} pooled connections to departed workers", closed);
}

std::vector<IoThread*> HttpServer::Impl::all_threads() {
  std::vector<IoThread*> all;
  for (auto& t : io) all.push_back(t.get());
  all.push_back(admin_io.get());
  return all;
}

HttpServer::HttpServer(HttpServerHooks hooks) : impl_(std::make_unique<Impl>(std::move(hooks))) {}

HttpServer::~HttpServer() { stop(); }

namespace {
bool bind_acceptor(Acceptor& a, const std::string& host, uint16_t port, std::string_view key, std::string* error) {
  boost::system::error_code ec;
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

// Closes `a` on its own thread.
void close_on_its_thread(IoThread& t, Acceptor& a) {
  asio::post(t.ioc, [&a] {
    boost::system::error_code ec;
    a.close(ec);
  });
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
  boost::system::error_code ec;
  auto ep = impl_->admin_acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

int64_t HttpServer::inflight() const { return impl_->state.inflight.load(); }

std::optional<std::string> HttpServer::reload_worker_key(const std::shared_ptr<const Config>& cfg) {
  return impl_->state.worker_key.reload(cfg);
}

HttpServer::Limits HttpServer::limits() const {
  const ServerState& s = impl_->state;
  const auto cfg = s.hooks.config->get();
  Limits l;
  l.connections = s.connections.load(std::memory_order_relaxed);
  l.max_connections = s.connection_limit(*cfg);
  l.body_bytes = s.body_bytes.load(std::memory_order_relaxed);
  l.max_body_bytes = cfg->router.max_body_bytes_in_flight;
  return l;
}

void HttpServer::register_metrics(metrics::Registry& r) const {
  if (!impl_->state.hooks.flow) impl_->state.flow.register_metrics(r, impl_->state.hooks.config);
  r.counter_fn("kvroute_router_worker_key_reload_failures_total",
               "Re-reads of the worker key (router.worker_api_key_file / _env; SIGHUP or a config change) that "
               "failed; the previous key stays in force",
               [this] { return impl_->state.worker_key.reload_failures(); });
  r.on_scrape([this] {
    const ServerState& s = impl_->state;
    RouterMetrics* m = s.hooks.metrics;
    if (!m) return;
    const Limits l = limits();
    m->inflight_requests.get().set(static_cast<double>(inflight()));
    m->connections.get().set(static_cast<double>(l.connections));
    m->connections_limit.get().set(static_cast<double>(l.max_connections));
    m->body_bytes.get().set(static_cast<double>(l.body_bytes));
    m->body_bytes_limit.get().set(static_cast<double>(l.max_body_bytes));
    m->open_files_limit.get().set(static_cast<double>(s.hooks.open_files_limit));
    m->queued_requests.get().set(static_cast<double>(s.queue.waiting()));
    if (!s.hooks.registry) return;
    std::set<std::string> present;
    for (const auto& w : s.hooks.registry->all()) present.insert(std::to_string(w.info->id.value));
    m->retain_workers(std::move(present));
  });
}

void HttpServer::start(unsigned threads) {
  Impl& im = *impl_;
  while (im.io.size() < std::max(1u, threads)) im.io.push_back(std::make_unique<IoThread>());
  asio::co_spawn(im.io0().ioc, im.accept_loop(im.acceptor, false), asio::detached);
  IoThread& admin = *im.admin_io;
  if (im.admin_acceptor.is_open()) asio::co_spawn(admin.ioc, im.accept_loop(im.admin_acceptor, true), asio::detached);
  for (IoThread* t : im.all_threads()) asio::co_spawn(t->ioc, im.sweep_loop(*t), asio::detached);
  for (auto& t : im.io)
    t->thread = std::thread([&io = *t] {
      pthread_setname_np(pthread_self(), "kvroute-http");
      const Handover::Scope handover(io.handover);
      io.ioc.run();
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
  im.state.draining.store(true);
  // Stop accepting (each listener on its own thread); close connections that
  // wait for their next request (each io thread walks its own).
  close_on_its_thread(im.io0(), im.acceptor);
  close_on_its_thread(*im.admin_io, im.admin_acceptor);
  for (IoThread* t : im.all_threads()) asio::post(t->ioc, [t] { t->connections.sweep(Steady::now()); });
  auto wait_idle = [&im](Steady::time_point until) {
    while (im.state.inflight.load() > 0 && Steady::now() < until) std::this_thread::sleep_for(milliseconds(2));
    return im.state.inflight.load() == 0;
  };
  if (!wait_idle(Steady::now() + grace)) {
    spdlog::warn("shutdown grace of {} ms over with {} requests in flight; cutting them", grace.count(),
                 im.state.inflight.load());
    // Each cut request ends as its client can tell: a stream with an error
    // event and [DONE], a request without an answer yet with a 503.
    im.state.flow.queue().stop_all();  // queued requests: 503 now
    for (auto& t : im.io) asio::post(t->ioc, [&io = *t] { io.exchanges.sweep(Steady::now()); });
    wait_idle(Steady::now() + milliseconds(1000));
  }
  stop();
}

void HttpServer::stop() {
  if (!impl_ || impl_->state.stopping.exchange(true)) return;
  Impl& im = *impl_;
  im.state.flow.queue().stop_all();  // queued requests end now (503), before the io threads stop
  close_on_its_thread(im.io0(), im.acceptor);
  close_on_its_thread(*im.admin_io, im.admin_acceptor);
  const std::vector<IoThread*> all = im.all_threads();
  for (IoThread* t : all) {
    t->work.reset();
    t->ioc.stop();
  }
  for (IoThread* t : all)
    if (t->thread.joinable()) t->thread.join();
  for (IoThread* t : all) t->pool.clear();
}

}  // namespace kvroute
