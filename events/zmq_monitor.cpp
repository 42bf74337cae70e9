// ZmqEventSource::Impl (zmq_source_impl.h): connection events of the SUB and
// DEALER sockets, lost connections, sockets made anew with backoff.
#include "events/zmq_source_impl.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/log.h"

namespace kvroute {

// The SUB lost its connection (or may never get it back: libzmq does not
// reconnect after a frame over ZMQ_MAXMSGSIZE or a failed handshake). What
// the engine publishes meanwhile is missed: the owner is behind until the
// new socket's verifying replay, and the socket is made anew after a backoff.
void ZmqEventSource::Impl::connection_lost(Publisher& p, Clock::time_point now, const char* why) {
  stats().disconnects_total.fetch_add(1, std::memory_order_relaxed);
  set_marks(p, kBehind, true);
  if (p.resubscribe_at) return;
  p.resubscribe_backoff_ms = std::min(cfg.replay_max_backoff_ms,
                                      std::max(kResubscribeMinMs, p.resubscribe_backoff_ms * 2));
  p.resubscribe_at = now + std::chrono::milliseconds(p.resubscribe_backoff_ms);
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("zmq: worker {} rank {}: KV event stream {} ({}); its index is partial until it is replayed, "
                 "reconnecting in {} ms",
                 p.owner.worker.value, p.owner.dp_rank, p.sub_ep, why, p.resubscribe_backoff_ms);
}

void ZmqEventSource::Impl::resubscribe(Publisher& p) {
  p.resubscribe_at.reset();
  try {
    open_sub(p);
    p.sub_dead = false;
    stats().sockets_reopened_total.fetch_add(1, std::memory_order_relaxed);
  } catch (const zmq::error_t& e) {
    p.resubscribe_at = Clock::now() + std::chrono::milliseconds(cfg.replay_max_backoff_ms);
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("zmq: worker {} rank {}: cannot reopen {}: {}", p.owner.worker.value, p.owner.dp_rank,
                   p.sub_ep, e.what());
  }
}

// Makes the replay socket anew (see open_dealer); without one, gaps are given up.
void ZmqEventSource::Impl::reopen_dealer(Publisher& p) {
  try {
    open_dealer(p);
    stats().sockets_reopened_total.fetch_add(1, std::memory_order_relaxed);
  } catch (const zmq::error_t& e) {
    p.dealer.reset();
    p.dealer_monitor.reset();
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("zmq: worker {} rank {}: cannot reopen the replay socket: {}", p.owner.worker.value,
                   p.owner.dp_rank, e.what());
  }
}

// ZMQ monitor events: [u16 event, u32 value][endpoint]. `sub`: the SUB
// socket's monitor, else the DEALER's.
void ZmqEventSource::Impl::drain_monitor(Publisher& p, bool sub, Clock::time_point now) {
  std::array<zmq::message_t, kMaxParts> f;
  size_t n = 0;
  bool torn = false;
  for (size_t k = 0; k < 64; ++k) {
    zmq::socket_t* m = sub ? (p.monitor ? &*p.monitor : nullptr) : (p.dealer_monitor ? &*p.dealer_monitor : nullptr);
    if (!m || !recv_message(*m, f, n, torn) || torn) return;
    if (f[0].size() < 2) continue;
    uint16_t event;
    std::memcpy(&event, f[0].data(), 2);  // host order, as libzmq writes it
    if (sub) {
      if (event == ZMQ_EVENT_CONNECTED) {
        if (p.ever_connected) p.verify_pending = true;
        p.ever_connected = true;
      } else if (event & kLostEvents) {
        connection_lost(p, now, event == ZMQ_EVENT_DISCONNECTED ? "disconnected" : "handshake failed");
        return;  // the socket (and this monitor) is replaced soon: read no more of it
      }
    } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      p.dealer_up = true;
    } else if (event & kLostEvents) {
      p.dealer_up = false;
      if (p.inflight) {
        replay_failed(p, now);  // the answer will not come; the socket is made anew
        return;
      }
      if (event != ZMQ_EVENT_DISCONNECTED) {  // libzmq will not retry a failed handshake
        reopen_dealer(p);
        return;
      }
    }
  }
}

}  // namespace kvroute
