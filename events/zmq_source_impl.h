// Internal to events/ (included only by events/zmq_*.cpp): ZmqEventSource::Impl,
// the state of the kvroute-zmq thread. Its members are defined by phase:
//   zmq_source.cpp   lifecycle: sockets made per worker rank, the poll loop, the public API
//   zmq_replay.cpp   sequence tracking: held frames, in-order apply, gap / first-sight replays, restarts
//   zmq_monitor.cpp  connections: monitor events, lost connections, sockets made anew with backoff
#pragma once

#include <zmq.hpp>

#include <array>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "events/zmq_source.h"

namespace kvroute {

struct ZmqEventSource::Impl {
  using Clock = std::chrono::steady_clock;
  static constexpr uint64_t kEndSeq = ~uint64_t{0};  // -1 as 8 big-endian bytes
  static constexpr auto kTick = std::chrono::milliseconds(20);
  static constexpr size_t kMaxFramesPerWake = 256;  // per socket per poll: fairness between publishers
  static constexpr size_t kMaxParts = 4;            // parts kept of one message; more are read and dropped
  // A SUB socket that lost its connection is closed and made anew after this,
  // doubling per disconnect in a row up to zmq.replay_max_backoff_ms.
  static constexpr uint32_t kResubscribeMinMs = 100;
  // Inbound queue of a replay (DEALER) socket, in messages: with frames of up
  // to DecodeLimits::max_message_bytes this bounds what libzmq holds for us
  // beside zmq.max_held_bytes.
  static constexpr int kDealerRcvHwm = 8;
  // Inbound queue of a SUB socket, in messages (a burst of live frames while
  // this thread is busy elsewhere; beyond it the PUB drops and a gap is replayed).
  static constexpr int kSubRcvHwm = 1000;

  // Monitor events that say a connection is gone and may not come back by
  // itself: libzmq 4.3 does not reconnect after a protocol error (a frame over
  // ZMQ_MAXMSGSIZE, a bad handshake), only after connection errors.
  static constexpr int kLostEvents = ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

  // One message from `s` without waiting: its first kMaxParts parts in `parts`
  // (further parts are read and dropped), the number of parts in `n`.
  // Returns false when nothing is queued. A message cut short (a part announced
  // but not there; libzmq only allows it on ZMQ_IMMEDIATE sockets, which these
  // files never use) sets `torn`: the socket must not be read again (libzmq
  // asserts on the next read, its issue #3663) and is to be made anew.
  static bool recv_message(zmq::socket_t& s, std::array<zmq::message_t, kMaxParts>& parts, size_t& n, bool& torn);
  static uint64_t read_be64(const zmq::message_t& m);

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

  void set_partial(Publisher& p, bool on) { set_marks(p, on ? kLost : kLost | kBehind, on); }

  bool can_replay(const Publisher& p) const { return p.dealer.has_value() && p.failures < cfg.replay_attempts; }

  // ---- lifecycle (zmq_source.cpp) ----
  std::optional<zmq::socket_t> monitor_of(zmq::socket_t& s, int mask);
  void open_sub(Publisher& p);
  void open_dealer(Publisher& p);
  void open(WorkerId id, const ZmqWorkerEndpoints& ep);
  void close(WorkerId id);
  void apply_commands();
  void drain_sub(Publisher& p, Clock::time_point now);
  void loop();

  // ---- sequence tracking and replay (zmq_replay.cpp) ----
  void set_marks(Publisher& p, uint32_t bits, bool on);
  bool hold(Publisher& p, uint64_t seq, std::string&& payload);
  void unhold(Publisher& p, std::map<uint64_t, std::string>::iterator it);
  void unhold_all(Publisher& p);
  void give_up_gap(Publisher& p, const char* why);
  void apply(Publisher& p, uint64_t seq, const std::string& payload);
  // Says loudly (rate-limited) that a batch's stored blocks were skipped for
  // their block size: a worker whose engine runs another block size than
  // indexer.block_size is otherwise indexed as empty, with only a counter.
  void warn_block_size(const Publisher& p, const VllmEventBatch& batch, uint64_t skipped);
  void request_replay(Publisher& p, uint64_t from, Clock::time_point now);
  void replay_failed(Publisher& p, Clock::time_point now);
  void process(Publisher& p, Clock::time_point now);
  void restart(Publisher& p);
  void on_live(Publisher& p, uint64_t seq, std::string&& payload, Clock::time_point now);
  void on_replay_frame(Publisher& p, std::array<zmq::message_t, kMaxParts>& f, size_t parts, Clock::time_point now);
  void end_replay(Publisher& p, Clock::time_point now);
  void tick(Clock::time_point now);
  void drain_dealer(Publisher& p, Clock::time_point now);

  // ---- connections and monitors (zmq_monitor.cpp) ----
  void connection_lost(Publisher& p, Clock::time_point now, const char* why);
  void resubscribe(Publisher& p);
  void reopen_dealer(Publisher& p);
  void drain_monitor(Publisher& p, bool sub, Clock::time_point now);
};

}  // namespace kvroute
