// KV events from vLLM / SGLang workers over their own ZMQ sockets: SUB to each
// publisher's PUB socket, DEALER to its replay (ROUTER) socket, decode
// (events/vllm_wire.h), convert with kvroute's own hashing, and hand the
// index events to a sink (the daemon: EventPipeline::enqueue_events).
//
// Wire (vLLM's ZmqEventPublisher; SGLang's is a port of it):
//   live:    [topic, seq (u64 big-endian, from 0 per publisher), payload]
//   replay:  DEALER sends [empty, start_seq (8 bytes BE)]; the engine answers
//            [empty, seq, payload] for every buffered batch with seq >= start,
//            then [empty, -1 (8 bytes 0xff), empty]. Replies with a topic
//            frame ([empty, topic, seq, payload]) are accepted too.
// A worker with dp_size N has N publishers: rank r at the endpoint's port + r
// (vLLM's offset_endpoint_port), for both sockets.
//
// Per publisher (= cache owner {worker, rank}) ordering:
//   first sight (worker added, router start): subscribe, then replay from 0
//     (the oldest batch the engine still buffers); live frames are held until
//     the replay ends and deduplicated by seq. A replay starting after 0 means
//     the engine no longer has the start: the owner is partial.
//   seq == next                -> applied
//   seq >  next (gap)          -> held; replay from `next` (rate-limited per
//                                 publisher: replay_min_interval_ms, failures
//                                 back off doubling to replay_max_backoff_ms,
//                                 each request times out after replay_timeout_ms)
//   replay cannot cover a gap (no replay socket, the engine's buffer starts
//     later, replay_attempts failures, more than max_pending_frames held)
//                              -> skip to the held frames; the owner is
//                                 partial (is_partial, metric), routing goes on
//                                 with what is known
//   live seq <= the last live seq -> the engine restarted: KvCleared for
//                                 the owner, then its history from 0 (partial
//                                 is reset)
//   the SUB reconnects (ZMQ monitor) or a gap is replayed -> the replay asks
//                                 for the last applied seq too: a different
//                                 batch there, or none at all after a
//                                 reconnect, is a restart as well (an idle
//                                 restarted engine is noticed without traffic;
//                                 its history is then replayed from 0)
//   a payload that does not decode, or a sink that refuses a batch
//                              -> counted; the owner is partial.
//   the SUB loses its connection (monitor: disconnected, handshake failed;
//     libzmq never reconnects after a frame over ZMQ_MAXMSGSIZE)
//                              -> the owner is partial (behind) at once; the
//                                 socket is made anew after a backoff; a
//                                 replay from the last applied batch that
//                                 finds it unchanged clears the mark
//   frames held per worker (live awaiting a replay + replay answers) over
//     zmq.max_held_bytes       -> dropped, counted, the owner behind; asked
//                                 for again by the next replay
// No socket sets ZMQ_IMMEDIATE: with it libzmq drops a pipe mid-message at a
// disconnect and the next read asserts (libzmq #3663); a replay socket whose
// request failed is made anew instead (stale requests and cut answers go).
// KV events feed cache knowledge only: nothing here touches liveness.
//
// Threading: one thread, "kvroute-zmq", owns every socket and all publisher
// state (ZMQ sockets are not thread-safe). add_worker / remove_worker /
// is_partial / partial_owners / stats are thread-safe and callable from any
// thread; membership changes take effect within one poll tick (<= 20 ms).
// The sink runs on the kvroute-zmq thread and must not block; it must stay
// callable until stop() returns (remove_worker and restarts call it too).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/types.h"
#include "config/config.h"
#include "events/vllm_wire.h"
#include "events/wire.h"
#include "indexer/kv_event.h"

namespace kvroute {

struct ZmqSourceStats {
  std::atomic<uint64_t> frames_total{0};          // live frames received (topic matched)
  std::atomic<uint64_t> bytes_total{0};           // their payload bytes
  std::atomic<uint64_t> bad_frames_total{0};      // wrong frame count or seq size
  std::array<std::atomic<uint64_t>, 7> rejected_total{};  // payloads by DecodeError
  std::array<std::atomic<uint64_t>, 5> skipped_total{};   // events by VllmSkip
  std::atomic<uint64_t> batches_applied_total{0};  // batches handed to the sink
  std::atomic<uint64_t> events_total{0};           // index events handed to the sink
  std::atomic<uint64_t> blocks_stored_total{0};    // blocks in stored events handed to the sink
  std::atomic<uint64_t> sink_refused_total{0};     // batches the sink could not take (queue full)
  std::atomic<uint64_t> duplicates_total{0};       // frames already applied (replay overlap)
  std::atomic<uint64_t> gaps_total{0};             // seq gaps seen on live frames
  std::atomic<uint64_t> replay_requests_total{0};
  std::atomic<uint64_t> replay_frames_total{0};    // batches received on replay sockets
  std::atomic<uint64_t> replay_timeouts_total{0};
  std::atomic<uint64_t> unrecoverable_total{0};    // gaps given up (owner marked partial)
  std::atomic<uint64_t> restarts_total{0};         // seq went backwards
  std::atomic<uint64_t> disconnects_total{0};      // SUB connections lost (monitor), incl. size violations
  std::atomic<uint64_t> sockets_reopened_total{0};  // SUB / replay sockets closed and made anew
  std::atomic<uint64_t> held_dropped_total{0};     // frames dropped over zmq.max_held_bytes
  std::atomic<uint64_t> held_dropped_bytes_total{0};
  std::atomic<uint64_t> held_bytes{0};             // gauge: payload bytes held (all workers)
  std::atomic<uint64_t> publishers{0};             // gauge: SUB sockets open
  std::atomic<uint64_t> partial_owners{0};         // gauge
};

// Where one worker's events come from. dp_size publishers: rank r at port + r.
struct ZmqWorkerEndpoints {
  std::string kv_events;  // e.g. tcp://10.0.0.7:5557 (required)
  std::string replay;     // e.g. tcp://10.0.0.7:5558; empty = no replay (gaps make the owner partial)
  uint32_t dp_size = 1;
  friend bool operator==(const ZmqWorkerEndpoints&, const ZmqWorkerEndpoints&) = default;
};

// `endpoint` with its TCP port offset by `rank` (vLLM's offset_endpoint_port);
// ipc:// and inproc:// get "_dp{rank}" appended. Empty stays empty; rank 0 is
// unchanged. An endpoint without a numeric port is returned unchanged.
std::string offset_endpoint_port(const std::string& endpoint, uint32_t rank);

class ZmqEventSource {
 public:
  // Receives one batch's index events, in seq order per owner. Returns false
  // when it could not take them (queue full): the owner becomes partial.
  using Sink = std::function<bool(std::vector<KvEvent>&&)>;

  // `salts` (may be null; must outlive the source): root blocks without a
  // salt in their event are attributed by it (events/salt_attribution.h).
  ZmqEventSource(const ZmqConfig& cfg, uint32_t block_size, Sink sink, DecodeLimits limits = {},
                 SaltAttribution* salts = nullptr);
  ~ZmqEventSource();
  ZmqEventSource(const ZmqEventSource&) = delete;
  ZmqEventSource& operator=(const ZmqEventSource&) = delete;

  void start();  // starts the thread
  void stop();   // joins it; idempotent

  // Adds a worker, or replaces its endpoints (then its owners are cleared and
  // synced anew). Same endpoints again: no-op. False + error for an endpoint
  // ZMQ cannot parse (checked here, on the caller's thread).
  bool add_worker(WorkerId worker, const ZmqWorkerEndpoints& ep, std::string* error = nullptr);
  // Closes the worker's sockets and emits KvCleared for each of its owners.
  void remove_worker(WorkerId worker);

  bool is_partial(CacheOwner owner) const;
  std::vector<CacheOwner> partial_owners() const;
  const ZmqSourceStats& stats() const { return stats_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ZmqSourceStats stats_;
};

}  // namespace kvroute
