// kvroute-mocker's vLLM mode: publishes KV event batches exactly as vLLM's
// ZmqEventPublisher does (vllm/distributed/kv_events.py): a PUB socket
// sending [topic, seq (8-byte big-endian, from 0), msgpack KVEventBatch], a
// buffer of the last `buffer_steps` batches, and a ROUTER socket answering a
// replay request [identity, empty, start_seq] with [identity, empty, seq,
// payload] for every buffered batch with seq >= start_seq, then [identity,
// empty, -1, empty].
//
// Threading: publish(), drop_next_live() and the stats are thread-safe (the
// mocker's io thread queues batches); one thread, "mocker-zmq-pub", owns both
// sockets, encodes, sends and serves replays (as vLLM's publisher thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "events/vllm_wire.h"

namespace kvroute::mocker {

struct VllmPublisherOptions {
  std::string endpoint;         // PUB, bound: tcp://HOST:PORT (PORT 0 = a free one), ipc://, inproc://
  std::string replay_endpoint;  // ROUTER, bound; empty = no replay socket
  std::string topic;            // first frame of every live message
  VllmEncoding encoding = VllmEncoding::Positional;
  size_t buffer_steps = 10000;  // batches kept for replay (vLLM's default)
  uint32_t dp_rank = 0;         // data_parallel_rank in every batch
};

class VllmPublisher {
 public:
  explicit VllmPublisher(VllmPublisherOptions opts);
  ~VllmPublisher();

  // Binds both sockets (on the caller's thread, before start()). False + error.
  bool bind(std::string* error);
  // The endpoints as bound (a port 0 resolved). Valid after bind().
  const std::string& endpoint() const { return bound_; }
  const std::string& replay_endpoint() const { return bound_replay_; }

  void start();
  void stop();  // sends what is queued, then joins

  void publish(VllmEventBatch batch);
  // Test hook: the next `n` batches are numbered and buffered for replay but
  // not sent live (a subscriber sees a gap that a replay fills).
  void drop_next_live(uint64_t n) { drop_live_.fetch_add(n); }

  uint64_t published() const { return published_.load(); }      // batches numbered
  uint64_t dropped_live() const { return dropped_.load(); }      // of those, not sent live
  uint64_t replays_served() const { return replays_.load(); }

 private:
  void loop();
  void send_batch(VllmEventBatch& b);
  void serve_replay();

  struct Sockets;
  VllmPublisherOptions opts_;
  std::unique_ptr<Sockets> sk_;
  std::string bound_, bound_replay_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<VllmEventBatch> queue_;
  bool stop_ = false;
  std::thread thread_;

  std::deque<std::pair<uint64_t, std::string>> buffer_;  // publisher thread only
  std::atomic<uint64_t> published_{0}, dropped_{0}, replays_{0}, drop_live_{0};
};

}  // namespace kvroute::mocker
