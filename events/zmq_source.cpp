#include "events/zmq_source.h"

#include <spdlog/spdlog.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <map>
#include <optional>
#include <unordered_map>

#include <pthread.h>

#include "common/log.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

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

using Clock = std::chrono::steady_clock;
constexpr uint64_t kEndSeq = ~uint64_t{0};  // -1 as 8 big-endian bytes
constexpr auto kTick = std::chrono::milliseconds(20);
constexpr size_t kMaxFramesPerWake = 256;  // per socket per poll: fairness between publishers
constexpr size_t kMaxParts = 4;            // parts kept of one message; more are read and dropped
// A SUB socket that lost its connection is closed and made anew after this,
// doubling per disconnect in a row up to zmq.replay_max_backoff_ms.
constexpr uint32_t kResubscribeMinMs = 100;
// Inbound queue of a replay (DEALER) socket, in messages: with frames of up
// to DecodeLimits::max_message_bytes this bounds what libzmq holds for us
// beside zmq.max_held_bytes.
constexpr int kDealerRcvHwm = 8;
// Inbound queue of a SUB socket, in messages (a burst of live frames while
// this thread is busy elsewhere; beyond it the PUB drops and a gap is replayed).
constexpr int kSubRcvHwm = 1000;

// Monitor events that say a connection is gone and may not come back by
// itself: libzmq 4.3 does not reconnect after a protocol error (a frame over
// ZMQ_MAXMSGSIZE, a bad handshake), only after connection errors.
constexpr int kLostEvents = ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                            ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

// One message from `s` without waiting: its first kMaxParts parts in `parts`
// (further parts are read and dropped), the number of parts in `n`.
// Returns false when nothing is queued. A message cut short (a part announced
// but not there; libzmq only allows it on ZMQ_IMMEDIATE sockets, which this
// file never uses) sets `torn`: the socket must not be read again (libzmq
// asserts on the next read, its issue #3663) and is to be made anew.
bool recv_message(zmq::socket_t& s, std::array<zmq::message_t, kMaxParts>& parts, size_t& n, bool& torn) {
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

uint64_t read_be64(const zmq::message_t& m) {
  const auto* p = static_cast<const uint8_t*>(m.data());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

bool valid_endpoint(const std::string& ep) {
  if (ep.rfind("tcp://", 0) == 0) {
    const size_t colon = ep.rfind(':');
    return colon != std::string::npos && colon > 6 && colon + 1 < ep.size() &&
           ep.find_first_not_of("0123456789", colon + 1) == std::string::npos;
  }
  return ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0;
}

}  // namespace

struct ZmqEventSource::Impl {
  // Why an owner is partial (bits). Lost: events are gone for good (until a
  // restart clears the owner). Behind: events may be missing (a disconnect,
  // frames dropped over the byte budget); cleared once a replay has proven
  // continuity from the last applied batch and filled the hole.
  static constexpr uint32_t kLost = 1, kBehind = 2;

  struct Publisher {
    CacheOwner owner;
    std::string sub_ep, replay_ep;  // this rank's endpoints ("" = no replay)
    uint64_t* held_bytes = nullptr;  // the worker's budget use (Worker::held_bytes)
    zmq::socket_t sub;
    std::optional<zmq::socket_t> dealer;
    std::optional<zmq::socket_t> monitor;         // PAIR: the SUB socket's connection events
    std::optional<zmq::socket_t> dealer_monitor;  // PAIR: the DEALER's
    bool dealer_up = false;                       // the replay socket completed a handshake
    std::optional<Clock::time_point> resubscribe_at;  // the SUB is to be made anew then
    bool sub_dead = false;                             // a message on it was cut short: never read it again
    uint32_t resubscribe_backoff_ms = 0;
    bool budget_dropped = false;  // frames were dropped over the byte budget since the last replay
    uint32_t marks = 0;           // kLost | kBehind
    std::optional<uint64_t> next;       // next seq to apply; nullopt: not known yet
    std::optional<uint64_t> last_live;  // last live seq seen (live frames arrive in order)
    bool syncing = false;               // the first-sight replay has not ended
    std::map<uint64_t, std::string> held;  // frames not yet applied, by seq
    bool inflight = false;              // a replay request is out
    bool got_reply = false;             // ... and has brought at least one batch
    uint64_t first_reply = 0;
    Clock::time_point replay_deadline{};
    Clock::time_point next_replay_at{};  // rate limit
    uint32_t backoff_ms = 0;
    uint32_t failures = 0;              // failed replays of the current gap
    bool gap_counted = false;
    VllmGroupState groups;
    // The last applied batch: a gap's replay starts one before it, and a
    // different payload there means a new engine incarnation whose seq
    // overtook ours while we were disconnected.
    std::optional<uint64_t> last_applied_seq;
    uint64_t last_applied_hash = 0;
    bool restart_seen = false;  // set by a replay, acted upon at its end
    // The SUB socket reconnected (engine restarted, or a network blip): ask
    // for the last applied batch again; missing or different = a restart.
    bool ever_connected = false;
    bool verify_pending = false;  // a verification replay is to be sent
    bool verifying = false;       // the replay in flight is one
    bool verify_seen = false;     // ... and brought the last applied seq
  };
  struct Worker {
    ZmqWorkerEndpoints ep;
    std::vector<std::unique_ptr<Publisher>> pubs;
    // Payload bytes held by its publishers (frames awaiting order, replay
    // answers): one budget, zmq.max_held_bytes, for live and replay frames.
    uint64_t held_bytes = 0;
  };
  struct Command {
    WorkerId worker;
    std::optional<ZmqWorkerEndpoints> ep;  // nullopt = remove
  };

  Impl(ZmqEventSource& self, const ZmqConfig& cfg, uint32_t block_size, Sink sink, DecodeLimits limits,
       SaltAttribution* salts)
      : self(self), cfg(cfg), block_size(block_size), sink(std::move(sink)), limits(limits), salts(salts) {}

  ZmqEventSource& self;
  const ZmqConfig cfg;
  const uint32_t block_size;
  Sink sink;
  DecodeLimits limits;
  SaltAttribution* salts;  // may be null
  zmq::context_t ctx{1};

  std::mutex mu;  // guards commands, stop, partial
  std::condition_variable cv;
  std::vector<Command> commands;
  bool stop = false;
  std::unordered_set<CacheOwner> partial;
  std::thread thread;

  // kvroute-zmq thread only.
  std::unordered_map<WorkerId, Worker> workers;
  uint64_t monitors = 0;  // names of the monitor endpoints
  VllmEventBatch batch;  // reused
  std::vector<KvEvent> events;
  std::array<uint64_t, 5> skipped{};

  ZmqSourceStats& stats() { return self.stats_; }

  // ---- membership ----

  // A PAIR socket receiving `s`'s monitor events `mask`; nullopt if libzmq refused.
  std::optional<zmq::socket_t> monitor_of(zmq::socket_t& s, int mask) {
    const std::string name = "inproc://kvroute-zmq-monitor-" + std::to_string(++monitors);
    if (zmq_socket_monitor(s.handle(), name.c_str(), mask) != 0) return std::nullopt;
    std::optional<zmq::socket_t> m;
    m.emplace(ctx, zmq::socket_type::pair);
    m->set(zmq::sockopt::linger, 0);
    m->connect(name);
    return m;
  }

  // (Re)creates the SUB socket and its monitor. Throws zmq::error_t.
  void open_sub(Publisher& p) {
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
  void open_dealer(Publisher& p) {
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

  void open(WorkerId id, const ZmqWorkerEndpoints& ep) {
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

  void close(WorkerId id) {
    auto it = workers.find(id);
    if (it == workers.end()) return;
    for (auto& p : it->second.pubs) {
      set_partial(*p, false);
      unhold_all(*p);
      std::vector<KvEvent> clear{KvEvent{p->owner, std::nullopt, StorageTier::Device, KvCleared{}}};
      sink(std::move(clear));
      if (salts) salts->cleared(p->owner);
      stats().publishers.fetch_sub(1, std::memory_order_relaxed);
    }
    workers.erase(it);
  }

  void apply_commands() {
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

  // ---- per publisher ----

  // Adds (`on`) or removes partial reasons; the owner is partial while any is set.
  void set_marks(Publisher& p, uint32_t bits, bool on) {
    const uint32_t marks = on ? (p.marks | bits) : (p.marks & ~bits);
    const bool was = p.marks != 0, is = marks != 0;
    p.marks = marks;
    if (was == is) return;
    std::lock_guard lk(mu);
    if (is) partial.insert(p.owner);
    else partial.erase(p.owner);
    stats().partial_owners.store(partial.size(), std::memory_order_relaxed);
  }
  void set_partial(Publisher& p, bool on) { set_marks(p, on ? kLost : kLost | kBehind, on); }

  // Frames held per worker share zmq.max_held_bytes; over it a frame is
  // dropped (counted) and the owner is behind until a replay brings it again.
  bool hold(Publisher& p, uint64_t seq, std::string&& payload) {
    if (p.held.count(seq)) return true;
    if (*p.held_bytes + payload.size() > cfg.max_held_bytes) {
      stats().held_dropped_total.fetch_add(1, std::memory_order_relaxed);
      stats().held_dropped_bytes_total.fetch_add(payload.size(), std::memory_order_relaxed);
      p.budget_dropped = true;
      set_marks(p, kBehind, true);
      static RateLimiter rl;
      if (rl.allow())
        spdlog::warn("zmq: worker {} rank {}: frame {} ({} bytes) dropped: the worker's frames held reach "
                     "zmq.max_held_bytes; it is replayed later",
                     p.owner.worker.value, p.owner.dp_rank, seq, payload.size());
      return false;
    }
    *p.held_bytes += payload.size();
    stats().held_bytes.fetch_add(payload.size(), std::memory_order_relaxed);
    p.held.emplace(seq, std::move(payload));
    return true;
  }
  void unhold(Publisher& p, std::map<uint64_t, std::string>::iterator it) {
    *p.held_bytes -= it->second.size();
    stats().held_bytes.fetch_sub(it->second.size(), std::memory_order_relaxed);
    p.held.erase(it);
  }
  void unhold_all(Publisher& p) {
    while (!p.held.empty()) unhold(p, p.held.begin());
  }

  void give_up_gap(Publisher& p, const char* why) {
    stats().unrecoverable_total.fetch_add(1, std::memory_order_relaxed);
    set_partial(p, true);
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("zmq: worker {} rank {}: KV events {}..{} lost ({}); its index is partial", p.owner.worker.value,
                   p.owner.dp_rank, p.next.value_or(0), p.held.empty() ? 0 : p.held.begin()->first - 1, why);
    p.next = p.held.empty() ? p.next : std::optional<uint64_t>(p.held.begin()->first);
    p.failures = 0;
    p.gap_counted = false;
  }

  void apply(Publisher& p, uint64_t seq, const std::string& payload) {
    p.last_applied_seq = seq;
    p.last_applied_hash = XXH3_64bits(payload.data(), payload.size());
    std::string detail;
    const auto bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
    const DecodeError e = decode_vllm_batch(bytes, limits, batch, &detail);
    if (e != DecodeError::None) {
      stats().rejected_total[static_cast<size_t>(e)].fetch_add(1, std::memory_order_relaxed);
      set_partial(p, true);
      static RateLimiter rl;
      if (rl.allow())
        spdlog::warn("zmq: worker {} rank {}: KV event batch rejected ({}: {}); its index is partial",
                     p.owner.worker.value, p.owner.dp_rank, to_string(e), detail);
      return;
    }
    batch.data_parallel_rank.reset();  // the endpoint says which rank this is
    events.clear();
    skipped.fill(0);
    to_kv_events(batch, p.owner, block_size, events, &skipped, &p.groups, salts);
    for (size_t i = 1; i < skipped.size(); ++i)
      if (skipped[i]) stats().skipped_total[i].fetch_add(skipped[i], std::memory_order_relaxed);
    if (events.empty()) return;
    uint64_t blocks = 0;
    for (const auto& ev : events)
      if (auto* s = std::get_if<KvStored>(&ev.data)) blocks += s->blocks.size();
    const size_t n = events.size();
    if (!sink(std::move(events))) {
      stats().sink_refused_total.fetch_add(1, std::memory_order_relaxed);
      set_partial(p, true);
    } else {
      stats().batches_applied_total.fetch_add(1, std::memory_order_relaxed);
      stats().events_total.fetch_add(n, std::memory_order_relaxed);
      stats().blocks_stored_total.fetch_add(blocks, std::memory_order_relaxed);
    }
    events = {};
  }

  bool can_replay(const Publisher& p) const { return p.dealer.has_value() && p.failures < cfg.replay_attempts; }

  void request_replay(Publisher& p, uint64_t from, Clock::time_point now) {
    if (p.inflight || now < p.next_replay_at) return;
    uint8_t be[8];
    for (int i = 0; i < 8; ++i) be[i] = static_cast<uint8_t>(from >> (56 - 8 * i));
    bool sent = false;
    try {
      sent = p.dealer_up &&
             p.dealer->send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait).has_value() &&
             p.dealer->send(zmq::buffer(be, 8), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t&) {
      sent = false;
    }
    p.next_replay_at = now + std::chrono::milliseconds(std::max(cfg.replay_min_interval_ms, p.backoff_ms));
    if (!sent) {
      // Not connected (no handshake yet). An engine that is down has nothing to
      // say either: retry at the rate limit. Only with frames waiting (its
      // PUB answers, its replay socket does not) is this a failed attempt.
      if (!p.held.empty()) replay_failed(p, now);
      return;
    }
    stats().replay_requests_total.fetch_add(1, std::memory_order_relaxed);
    p.inflight = true;
    p.got_reply = false;
    p.verify_seen = false;
    p.replay_deadline = now + std::chrono::milliseconds(cfg.replay_timeout_ms);
  }

  // Makes the replay socket anew (see open_dealer); without one, gaps are given up.
  void reopen_dealer(Publisher& p) {
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

  void replay_failed(Publisher& p, Clock::time_point now) {
    // A request that went out may still be answered late, or half: a fresh
    // socket drops both (and any request still queued on the old one).
    if (p.inflight) reopen_dealer(p);
    p.inflight = false;
    ++p.failures;
    p.backoff_ms = std::min(cfg.replay_max_backoff_ms, std::max(cfg.replay_min_interval_ms, p.backoff_ms * 2));
    p.next_replay_at = now + std::chrono::milliseconds(p.backoff_ms);
    if (p.syncing && p.failures >= cfg.replay_attempts) {
      // The engine does not answer replays: go live with what arrives, and
      // say that what came before is unknown.
      p.syncing = false;
      stats().unrecoverable_total.fetch_add(1, std::memory_order_relaxed);
      set_partial(p, true);
      p.failures = 0;
    }
  }

  // Applies held frames in order; asks for a replay at a gap, or gives it up.
  void process(Publisher& p, Clock::time_point now) {
    if (p.syncing) {
      if (!p.inflight) request_replay(p, 0, now);
      if (p.syncing && p.held.size() <= cfg.max_pending_frames) return;
      if (p.syncing) {  // held too much while waiting: give the start up
        p.syncing = false;
        p.inflight = false;
        stats().unrecoverable_total.fetch_add(1, std::memory_order_relaxed);
        set_partial(p, true);
      }
    }
    while (!p.held.empty()) {
      auto it = p.held.begin();
      if (!p.next) {
        // Joined without a replay: what came before the first frame is unknown.
        if (it->first > 0) set_partial(p, true);
        p.next = it->first;
      }
      if (it->first < *p.next) {
        stats().duplicates_total.fetch_add(1, std::memory_order_relaxed);
        unhold(p, it);
        continue;
      }
      if (it->first == *p.next) {
        apply(p, it->first, it->second);
        unhold(p, it);
        p.next = *p.next + 1;
        p.failures = 0;
        p.gap_counted = false;
        continue;
      }
      // A gap before the held frames.
      if (!p.gap_counted) {
        stats().gaps_total.fetch_add(1, std::memory_order_relaxed);
        p.gap_counted = true;
      }
      if (can_replay(p) && p.held.size() <= cfg.max_pending_frames) {
        const bool verify = p.last_applied_seq && *p.last_applied_seq + 1 == *p.next;
        request_replay(p, verify ? *p.next - 1 : *p.next, now);
        return;  // wait for the replay (or its timeout)
      }
      give_up_gap(p, p.dealer ? "replay failed or too many frames held" : "no replay endpoint");
    }
  }

  // A new engine incarnation: its blocks start empty and its seq at 0.
  void restart(Publisher& p) {
    std::vector<KvEvent> clear{KvEvent{p.owner, std::nullopt, StorageTier::Device, KvCleared{}}};
    sink(std::move(clear));
    if (salts) salts->cleared(p.owner);
    p.groups = {};
    p.next = 0;
    p.last_applied_seq.reset();
    p.last_live.reset();  // the new incarnation's seqs are below the old ones
    p.restart_seen = false;
    p.verifying = false;
    p.verify_pending = false;
    p.inflight = false;
    p.failures = 0;
    p.backoff_ms = 0;
    p.next_replay_at = {};
    p.gap_counted = false;
    set_partial(p, false);
  }

  void on_live(Publisher& p, uint64_t seq, std::string&& payload, Clock::time_point now) {
    stats().frames_total.fetch_add(1, std::memory_order_relaxed);
    stats().bytes_total.fetch_add(payload.size(), std::memory_order_relaxed);
    if (p.last_live && seq <= *p.last_live) {
      // Live frames of one publisher arrive in order: a smaller seq is a new
      // engine incarnation. Its blocks are gone; its history starts at 0.
      stats().restarts_total.fetch_add(1, std::memory_order_relaxed);
      static RateLimiter rl;
      if (rl.allow())
        spdlog::warn("zmq: worker {} rank {}: seq went back from {} to {}: engine restarted, its blocks dropped",
                     p.owner.worker.value, p.owner.dp_rank, *p.last_live, seq);
      unhold_all(p);
      restart(p);
    }
    p.last_live = seq;
    if (p.next && seq < *p.next) {  // already applied through a replay
      stats().duplicates_total.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    hold(p, seq, std::move(payload));
    process(p, now);
  }

  void on_replay_frame(Publisher& p, std::array<zmq::message_t, kMaxParts>& f, size_t parts, Clock::time_point now) {
    size_t i = 0;
    if (parts > 0 && f[0].size() == 0) ++i;  // the DEALER's empty delimiter
    const size_t n = parts > kMaxParts ? 0 : parts - i;
    if (n != 2 && n != 3) {  // [seq, payload] or [topic, seq, payload]
      stats().bad_frames_total.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const zmq::message_t& seqf = f[i + n - 2];
    if (seqf.size() != 8) {
      stats().bad_frames_total.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const uint64_t seq = read_be64(seqf);
    if (seq == kEndSeq) {
      if (p.inflight) end_replay(p, now);
      return;
    }
    stats().replay_frames_total.fetch_add(1, std::memory_order_relaxed);
    if (p.inflight && !p.got_reply) p.first_reply = seq;
    p.got_reply = p.got_reply || p.inflight;
    const zmq::message_t& payload = f[i + n - 1];
    if (p.last_applied_seq && seq == *p.last_applied_seq) {
      p.verify_seen = true;
      if (XXH3_64bits(payload.data(), payload.size()) != p.last_applied_hash)
        p.restart_seen = true;  // the engine's batch at our last seq is another one
    }
    if (p.next && seq < *p.next) {
      stats().duplicates_total.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    hold(p, seq, payload.to_string());
  }

  void end_replay(Publisher& p, Clock::time_point now) {
    p.inflight = false;
    p.failures = 0;
    p.backoff_ms = 0;
    if (p.verifying) {
      // The engine no longer has the newest batch we applied (it had it when
      // it sent it, and it is the last to be forgotten): a new incarnation.
      p.verifying = false;
      if (!p.verify_seen) p.restart_seen = true;
    }
    // This replay started at the last applied batch and found it unchanged:
    // everything the engine published after it came in this answer.
    const bool continuity = p.verify_seen && !p.restart_seen;
    const bool budget_dropped = p.budget_dropped;
    p.budget_dropped = false;
    if (p.restart_seen) {
      // Seq overtook ours during a disconnect: a new incarnation. Its frames
      // held so far are valid; what is missing from 0 is replayed next.
      stats().restarts_total.fetch_add(1, std::memory_order_relaxed);
      static RateLimiter rl;
      if (rl.allow())
        spdlog::warn("zmq: worker {} rank {}: the engine's batch {} differs from the one applied: engine restarted, "
                     "its blocks dropped",
                     p.owner.worker.value, p.owner.dp_rank, p.last_applied_seq.value_or(0));
      restart(p);
    } else if (p.syncing) {
      p.syncing = false;
      if (!p.got_reply) {
        // Nothing buffered: the engine has published nothing yet (or only
        // what arrives live from now on). Start at the first held frame;
        // one after 0 is a gap that the next replay fills.
        p.next = 0;
      } else {
        if (p.first_reply > 0) {
          // The engine's buffer no longer starts at 0: older blocks unknown.
          stats().unrecoverable_total.fetch_add(1, std::memory_order_relaxed);
          set_partial(p, true);
        }
        p.next = p.first_reply;
      }
    } else if (budget_dropped) {
      // Part of the answer did not fit the byte budget: apply what did, then
      // ask again from there (process); no progress at all counts as a failure.
      const auto before = p.next;
      process(p, now);
      if (p.next == before && !p.held.empty()) ++p.failures;
      return;
    } else if (p.next && !p.held.empty() && p.held.begin()->first > *p.next) {
      give_up_gap(p, "the engine's replay buffer no longer has them");
    }
    process(p, now);
    if ((p.marks & kBehind) && continuity && p.held.empty() && !p.budget_dropped && !p.inflight &&
        !p.verify_pending && !p.resubscribe_at) {
      // Reconnected (or dropped frames over the budget), and a replay since
      // brought everything after our last batch: nothing is missing.
      set_marks(p, kBehind, false);
      p.resubscribe_backoff_ms = 0;
    }
  }

  void tick(Clock::time_point now) {
    for (auto& [id, w] : workers)
      for (auto& p : w.pubs) {
        if (p->resubscribe_at && now >= *p->resubscribe_at) resubscribe(*p);
        if (p->inflight && now >= p->replay_deadline) {
          stats().replay_timeouts_total.fetch_add(1, std::memory_order_relaxed);
          replay_failed(*p, now);
        }
        if (!p->inflight && (p->syncing || !p->held.empty())) process(*p, now);
        if (p->verify_pending && !p->inflight && !p->syncing) {
          if (!p->dealer || !p->last_applied_seq) {
            // Nothing to compare (restarts then show as seq going back); a
            // loss shows as a gap at the next frame (replayed, or partial).
            p->verify_pending = false;
            set_marks(*p, kBehind, false);
          } else {
            request_replay(*p, *p->last_applied_seq, now);
            if (p->inflight) {
              p->verify_pending = false;
              p->verifying = true;
              p->verify_seen = false;
            }
          }
        }
      }
  }

  // ---- the loop ----

  void drain_sub(Publisher& p, Clock::time_point now) {
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

  // The SUB lost its connection (or may never get it back: libzmq does not
  // reconnect after a frame over ZMQ_MAXMSGSIZE or a failed handshake). What
  // the engine publishes meanwhile is missed: the owner is behind until the
  // new socket's verifying replay, and the socket is made anew after a backoff.
  void connection_lost(Publisher& p, Clock::time_point now, const char* why) {
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

  void resubscribe(Publisher& p) {
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

  // ZMQ monitor events: [u16 event, u32 value][endpoint]. `sub`: the SUB
  // socket's monitor, else the DEALER's.
  void drain_monitor(Publisher& p, bool sub, Clock::time_point now) {
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

  void drain_dealer(Publisher& p, Clock::time_point now) {
    std::array<zmq::message_t, kMaxParts> f;
    size_t n = 0;
    bool torn = false;
    for (size_t k = 0; k < 4 * kMaxFramesPerWake && p.dealer; ++k) {
      if (!recv_message(*p.dealer, f, n, torn)) return;
      if (torn) {
        stats().bad_frames_total.fetch_add(1, std::memory_order_relaxed);
        if (p.inflight) replay_failed(p, now);
        else reopen_dealer(p);
        return;
      }
      on_replay_frame(p, f, n, now);
    }
  }

  void loop() {
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
};

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
