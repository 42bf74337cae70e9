// ZmqEventSource: its public API and the lifecycle of ZmqEventSource::Impl
// (zmq_source_impl.h): sockets made per worker rank, the kvroute-zmq poll loop.
#include "events/zmq_source.h"

#include <spdlog/spdlog.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <chrono>

#include <pthread.h>

#include "common/log.h"
#include "events/zmq_source_impl.h"

namespace kvroute {

std::string offset_endpoint_port(const std::string& endpoint, uint32_t rank) {
  if (endpoint.empty() || rank == 0) return endpoint;
  if (endpoint.find("inproc") != std::string::npos) return endpoint + "_dp" + std::to_string(rank);
  if (endpoint.rfind("tcp://", 0) == 0) {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon < 6 || colon + 1 >= endpoint.size()) return endpoint;
    uint32_t port = 0;
    for (size_t i = colon + 1; i < endpoint.size(); ++i) {
      if (endpoint[i] < '0' || endpoint[i] > '9' || port > 100000) return endpoint;
      port = port * 10 + static_cast<uint32_t>(endpoint[i] - '0');
    }
    return endpoint.substr(0, colon + 1) + std::to_string(port + rank);
  }
  return endpoint;
}

namespace {

bool valid_endpoint(const std::string& ep) {
  if (ep.rfind("tcp://", 0) == 0) {
    const size_t colon = ep.rfind(':');
    return colon != std::string::npos && colon > 6 && colon + 1 < ep.size() &&
           ep.find_first_not_of("0123456789", colon + 1) == std::string::npos;
  }
  return ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0;
}

}  // namespace

bool ZmqEventSource::Impl::recv_message(zmq::socket_t& s, std::array<zmq::message_t, kMaxParts>& parts, size_t& n,
                                        bool& torn) {
  n = 0;
  torn = false;
  zmq::message_t scratch;
  for (;;) {
    zmq::message_t& m = n < kMaxParts ? parts[n] : scratch;
    if (!s.recv(m, zmq::recv_flags::dontwait)) {
      torn = n > 0;
      return n > 0;
    }
    ++n;
    if (!m.more()) return true;
  }
}

uint64_t ZmqEventSource::Impl::read_be64(const zmq::message_t& m) {
  const auto* p = static_cast<const uint8_t*>(m.data());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

// A PAIR socket receiving `s`'s monitor events `mask`; nullopt if libzmq refused.
std::optional<zmq::socket_t> ZmqEventSource::Impl::monitor_of(zmq::socket_t& s, int mask) {
  const std::string name = "inproc://kvroute-zmq-monitor-" + std::to_string(++monitors);
  if (zmq_socket_monitor(s.handle(), name.c_str(), mask) != 0) return std::nullopt;
  std::optional<zmq::socket_t> m;
  m.emplace(ctx, zmq::socket_type::pair);
  m->set(zmq::sockopt::linger, 0);
  m->connect(name);
  return m;
}

// (Re)creates the SUB socket and its monitor. Throws zmq::error_t.
void ZmqEventSource::Impl::open_sub(Publisher& p) {
  p.monitor.reset();
  p.sub = zmq::socket_t(ctx, zmq::socket_type::sub);
  p.sub.set(zmq::sockopt::linger, 0);
  p.sub.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits.max_message_bytes + 64));
  p.sub.set(zmq::sockopt::rcvhwm, kSubRcvHwm);
  p.sub.set(zmq::sockopt::subscribe, cfg.topic);
  p.monitor = monitor_of(p.sub, ZMQ_EVENT_CONNECTED | kLostEvents);
  p.sub.connect(p.sub_ep);
}

// (Re)creates the replay socket: anything queued on the old one (a stale
// request, the rest of an old answer) goes with it. No ZMQ_IMMEDIATE: with
// it libzmq drops a pipe at a disconnect even while a multipart answer is
// being read from it, and the next read asserts (libzmq issue #3663);
// whether a request can be sent is told by the monitor instead.
// Throws zmq::error_t.
void ZmqEventSource::Impl::open_dealer(Publisher& p) {
  p.dealer_monitor.reset();
  p.dealer.reset();
  p.dealer_up = false;
  p.dealer.emplace(ctx, zmq::socket_type::dealer);
  p.dealer->set(zmq::sockopt::linger, 0);
  p.dealer->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits.max_message_bytes + 64));
  p.dealer->set(zmq::sockopt::rcvhwm, kDealerRcvHwm);
  p.dealer_monitor = monitor_of(*p.dealer, ZMQ_EVENT_HANDSHAKE_SUCCEEDED | kLostEvents);
  if (!p.dealer_monitor) p.dealer_up = true;  // no monitor: try requests blindly
  p.dealer->connect(p.replay_ep);
}

void ZmqEventSource::Impl::open(WorkerId id, const ZmqWorkerEndpoints& ep) {
  Worker& w = workers[id];
  w = Worker{ep, {}, 0};
  for (uint32_t r = 0; r < std::max<uint32_t>(1, ep.dp_size); ++r) {
    auto p = std::make_unique<Publisher>();
    p->owner = CacheOwner{id, r};
    p->sub_ep = offset_endpoint_port(ep.kv_events, r);
    p->replay_ep = offset_endpoint_port(ep.replay, r);
    p->held_bytes = &w.held_bytes;
    try {
      open_sub(*p);
      if (!p->replay_ep.empty()) {
        open_dealer(*p);
        p->syncing = true;  // first sight: replay from 0 before trusting live frames
      }
    } catch (const zmq::error_t& e) {
      static RateLimiter rl;
      if (rl.allow()) spdlog::warn("zmq: worker {} rank {}: cannot connect: {}", id.value, r, e.what());
      continue;
    }
    stats().publishers.fetch_add(1, std::memory_order_relaxed);
    w.pubs.push_back(std::move(p));
  }
}

void ZmqEventSource::Impl::close(WorkerId id) {
  auto it = workers.find(id);
  if (it == workers.end()) return;
  for (auto& p : it->second.pubs) {
    set_partial(*p, false);
    unhold_all(*p);
    std::vector<KvEvent> clear(1);  // the tier, id and medium of a clear mean nothing
    clear[0].owner = p->owner;
    clear[0].data = KvCleared{};
    sink(std::move(clear));
    if (salts) salts->cleared(p->owner);
    stats().publishers.fetch_sub(1, std::memory_order_relaxed);
  }
  workers.erase(it);
}

void ZmqEventSource::Impl::apply_commands() {
  std::vector<Command> cmds;
  {
    std::lock_guard lk(mu);
    cmds.swap(commands);
  }
  for (auto& c : cmds) {
    auto it = workers.find(c.worker);
    if (c.ep && it != workers.end() && it->second.ep == *c.ep) continue;
    close(c.worker);
    if (c.ep) open(c.worker, *c.ep);
  }
}

void ZmqEventSource::Impl::drain_sub(Publisher& p, Clock::time_point now) {
  std::array<zmq::message_t, kMaxParts> f;
  size_t n = 0;
  bool torn = false;
  for (size_t k = 0; k < kMaxFramesPerWake; ++k) {
    if (!recv_message(p.sub, f, n, torn)) return;
    if (torn) {
      p.sub_dead = true;  // never read again: made anew by resubscribe()
      connection_lost(p, now, "a message cut short");
      return;
    }
    if (n != 3 || f[1].size() != 8) {
      stats().bad_frames_total.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    on_live(p, read_be64(f[1]), f[2].to_string(), now);
  }
}

void ZmqEventSource::Impl::loop() {
  pthread_setname_np(pthread_self(), "kvroute-zmq");
  std::vector<zmq::pollitem_t> items;
  // per item: publisher, 0 sub / 1 dealer / 2 SUB monitor / 3 DEALER monitor
  std::vector<std::pair<Publisher*, int>> owners;
  while (true) {
    {
      std::unique_lock lk(mu);
      if (workers.empty()) cv.wait_for(lk, kTick, [&] { return stop || !commands.empty(); });
      if (stop) break;
    }
    apply_commands();
    items.clear();
    owners.clear();
    for (auto& [id, w] : workers)
      for (auto& p : w.pubs) {
        if (!p->sub_dead) {
          items.push_back({p->sub.handle(), 0, ZMQ_POLLIN, 0});
          owners.emplace_back(p.get(), 0);
        }
        if (p->dealer) {
          items.push_back({p->dealer->handle(), 0, ZMQ_POLLIN, 0});
          owners.emplace_back(p.get(), 1);
        }
        if (p->monitor) {
          items.push_back({p->monitor->handle(), 0, ZMQ_POLLIN, 0});
          owners.emplace_back(p.get(), 2);
        }
        if (p->dealer_monitor) {
          items.push_back({p->dealer_monitor->handle(), 0, ZMQ_POLLIN, 0});
          owners.emplace_back(p.get(), 3);
        }
      }
    if (items.empty()) continue;
    try {
      zmq::poll(items.data(), items.size(), kTick);
      const auto now = Clock::now();
      for (size_t i = 0; i < items.size(); ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        Publisher& p = *owners[i].first;
        switch (owners[i].second) {
          case 0: if (!p.sub_dead) drain_sub(p, now); break;
          case 1: drain_dealer(p, now); break;
          case 2: drain_monitor(p, true, now); break;
          default: drain_monitor(p, false, now); break;
        }
      }
      tick(Clock::now());
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      static RateLimiter rl;
      if (rl.allow()) spdlog::warn("zmq: {}", e.what());
    }
  }
  for (auto& [id, w] : workers)
    for (auto& p : w.pubs) {
      stats().publishers.fetch_sub(1, std::memory_order_relaxed);
      unhold_all(*p);
    }
  workers.clear();  // closes the sockets on this thread
}

ZmqEventSource::ZmqEventSource(const ZmqConfig& cfg, uint32_t block_size, Sink sink, DecodeLimits limits,
                               SaltAttribution* salts)
    : impl_(std::make_unique<Impl>(*this, cfg, block_size, std::move(sink), limits, salts)) {}

ZmqEventSource::~ZmqEventSource() { stop(); }

void ZmqEventSource::start() {
  if (!impl_->thread.joinable()) impl_->thread = std::thread([this] { impl_->loop(); });
}

void ZmqEventSource::stop() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

bool ZmqEventSource::add_worker(WorkerId worker, const ZmqWorkerEndpoints& ep, std::string* error) {
  if (!valid_endpoint(ep.kv_events) || (!ep.replay.empty() && !valid_endpoint(ep.replay)) || ep.dp_size == 0 ||
      ep.dp_size > 1024) {
    if (error)
      *error = "kv_events / replay must be tcp://HOST:PORT, ipc://PATH or inproc://NAME, dp_size 1-1024 (got '" +
               ep.kv_events + "', '" + ep.replay + "', " + std::to_string(ep.dp_size) + ")";
    return false;
  }
  {
    std::lock_guard lk(impl_->mu);
    impl_->commands.push_back({worker, ep});
  }
  impl_->cv.notify_all();
  return true;
}

void ZmqEventSource::remove_worker(WorkerId worker) {
  {
    std::lock_guard lk(impl_->mu);
    impl_->commands.push_back({worker, std::nullopt});
  }
  impl_->cv.notify_all();
}

bool ZmqEventSource::is_partial(CacheOwner owner) const {
  std::lock_guard lk(impl_->mu);
  return impl_->partial.count(owner) > 0;
}

std::vector<CacheOwner> ZmqEventSource::partial_owners() const {
  std::lock_guard lk(impl_->mu);
  return {impl_->partial.begin(), impl_->partial.end()};
}

}  // namespace kvroute
