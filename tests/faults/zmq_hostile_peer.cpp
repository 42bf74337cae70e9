// A vLLM-style KV event publisher (PUB + replay ROUTER, the frames of
// vLLM's ZmqEventPublisher) that misbehaves on command, for the fault tests
// (tests/faults/test_zmq_hostile_peer.py). Binds 127.0.0.1 on the given ports
// (0 = any), prints
//   ready kv_events tcp://127.0.0.1:P replay tcp://127.0.0.1:R
// and then obeys one command per stdin line, answering one line each:
//   publish N          N batches of one fresh 4-block chain (kept for replay) -> "published <blocks in total>"
//   oversize BYTES     one live frame with a BYTES payload (not in the replay buffer) -> "sent oversize"
//   torn N FRAMES      answer the next N replay requests with FRAMES batches each and then vanish
//                      (close the ROUTER mid-answer, bind a new one on the same port); while no
//                      request comes, publish frames with a seq gap to provoke them -> "torn N" at the end
//   big COUNT BYTES    answer the next replay request with COUNT frames of BYTES each (one shared
//                      buffer, zero-copy) and the end marker -> "big sent"
//   quit
// Replay requests are otherwise answered as vLLM does: every buffered batch
// from the start seq, then [-1, empty].
#include <zmq.hpp>

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "events/vllm_wire.h"

using namespace kvroute;

namespace {

void no_free(void*, void*) {}

std::string be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (56 - 8 * i));
  return s;
}

uint64_t read_be64(const zmq::message_t& m) {
  const auto* p = static_cast<const uint8_t*>(m.data());
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < m.size(); ++i) v = (v << 8) | p[i];
  return v;
}

int bound_port(zmq::socket_t& s) {
  const std::string ep = s.get(zmq::sockopt::last_endpoint);
  return std::atoi(ep.substr(ep.rfind(':') + 1).c_str());
}

struct Peer {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::unique_ptr<zmq::socket_t> router;
  int replay_port = 0;
  uint32_t block_size = 16;
  uint64_t seq = 0;            // next live seq
  std::map<uint64_t, std::string> buffer;  // replay buffer
  uint64_t blocks = 0;
  uint64_t next_block_id = 1;
  uint32_t next_token = 100;
  // torn mode
  int torn_left = 0, torn_done = 0, torn_frames = 0;
  // big mode
  uint64_t big_count = 0, big_bytes = 0;
  std::unique_ptr<char[]> big_buf;  // never freed while libzmq may still send from it

  void bind_router() {
    for (int attempt = 0;; ++attempt) {
      try {
        auto r = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::router);
        r->set(zmq::sockopt::linger, 0);
        r->set(zmq::sockopt::sndhwm, 100000);
        r->bind("tcp://127.0.0.1:" + std::to_string(replay_port));
        replay_port = bound_port(*r);
        router = std::move(r);
        return;
      } catch (const zmq::error_t& e) {
        if (attempt > 500) throw;  // the old listener is closed asynchronously: retry for ~5 s
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }

  void send_live(uint64_t s, const std::string& payload) {
    pub.send(zmq::buffer(std::string_view("")), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(be64(s)), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(payload), zmq::send_flags::none);
  }

  void publish(int n) {
    for (int i = 0; i < n; ++i) {
      VllmBlockStored st;
      st.block_size = block_size;
      for (int b = 0; b < 4; ++b) {
        st.block_hashes.push_back(SequenceHash{next_block_id++});
        for (uint32_t t = 0; t < block_size; ++t) st.token_ids.push_back(next_token++);
      }
      VllmEventBatch batch;
      batch.ts = 1.0;
      batch.events.emplace_back(std::move(st));
      std::string payload = encode_vllm_batch(batch, VllmEncoding::Positional);
      send_live(seq, payload);
      buffer[seq++] = std::move(payload);
      blocks += 4;
    }
  }

  static std::string empty_batch() {
    VllmEventBatch batch;
    batch.ts = 1.0;
    return encode_vllm_batch(batch, VllmEncoding::Positional);
  }

  void reply(const zmq::message_t& id, uint64_t s, const void* data, size_t n, bool zero_copy = false) {
    router->send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
    router->send(zmq::message_t(), zmq::send_flags::sndmore);
    router->send(zmq::buffer(be64(s)), zmq::send_flags::sndmore);
    if (zero_copy) {
      zmq::message_t m(const_cast<void*>(data), n, no_free);  // the buffer lives as long as the process
      router->send(m, zmq::send_flags::none);
    } else {
      router->send(zmq::buffer(data, n), zmq::send_flags::none);
    }
  }

  void on_request() {
    zmq::message_t id, empty, start;
    if (!router->recv(id, zmq::recv_flags::dontwait)) return;
    bool more = id.more();
    if (more) (void)router->recv(empty);
    more = empty.more();
    if (more) (void)router->recv(start);
    while (start.more()) (void)router->recv(start);
    const uint64_t from = read_be64(start);
    if (torn_left > 0) {
      // Many whole answers, then gone before the end marker: the requester
      // is most likely still reading them when its connection drops.
      // All at the requested seq: the requester keeps at most one, so its
      // next live frame is a gap again and asks for the next replay.
      const std::string p = empty_batch();
      for (int i = 0; i < torn_frames; ++i) reply(id, from, p.data(), p.size());
      // Closed with the answer queued: libzmq sends it (linger), then the
      // connection goes, before the end marker.
      router->set(zmq::sockopt::linger, 2000);
      router.reset();
      bind_router();
      --torn_left;
      ++torn_done;
      std::fprintf(stderr, "torn answer %d (from %llu)\n", torn_done, static_cast<unsigned long long>(from));
      if (torn_left == 0) {
        std::printf("torn %d\n", torn_done);
        std::fflush(stdout);
      }
      return;
    }
    if (big_count > 0) {
      big_buf.reset(new char[big_bytes]);
      std::memset(big_buf.get(), 0xc1, big_bytes);  // 0xc1: never valid msgpack
      // A new socket per answer would lose the requester: block at the HWM
      // instead of dropping (ROUTER_MANDATORY), a few frames at a time.
      router->set(zmq::sockopt::router_mandatory, 1);
      router->set(zmq::sockopt::sndhwm, 4);
      uint64_t sent = 0;
      try {
        for (; sent < big_count; ++sent) reply(id, from + sent, big_buf.get(), big_bytes, true);
      } catch (const zmq::error_t& e) {  // the requester went away (its replay timed out)
        std::fprintf(stderr, "big answer cut after %llu frames: %s\n", static_cast<unsigned long long>(sent),
                     e.what());
      }
      try {
        send_end(id);
      } catch (const zmq::error_t&) {
      }
      big_count = 0;
      std::printf("big sent\n");
      std::fflush(stdout);
      return;
    }
    for (auto it = buffer.lower_bound(from); it != buffer.end(); ++it)
      reply(id, it->first, it->second.data(), it->second.size());
    send_end(id);
  }

  void send_end(const zmq::message_t& id) {
    const uint8_t end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    router->send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
    router->send(zmq::message_t(), zmq::send_flags::sndmore);
    router->send(zmq::buffer(end, 8), zmq::send_flags::sndmore);
    router->send(zmq::message_t(), zmq::send_flags::none);
  }

  bool command(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "publish") {
      int n = 0;
      in >> n;
      publish(n);
      std::printf("published %llu\n", static_cast<unsigned long long>(blocks));
    } else if (cmd == "oversize") {
      size_t n = 0;
      in >> n;
      send_live(seq, std::string(n, 'x'));
      std::printf("sent oversize\n");
    } else if (cmd == "torn") {
      in >> torn_left >> torn_frames;
    } else if (cmd == "big") {
      in >> big_count >> big_bytes;
    } else if (cmd == "quit") {
      return false;
    }
    std::fflush(stdout);
    return true;
  }

  void run() {
    std::string pending;
    auto last_request = std::chrono::steady_clock::now();
    for (;;) {
      zmq::pollitem_t items[] = {{router->handle(), 0, ZMQ_POLLIN, 0}, {nullptr, 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, std::chrono::milliseconds(20));
      if (items[0].revents & ZMQ_POLLIN) {
        on_request();
        last_request = std::chrono::steady_clock::now();
      }
      if (items[1].revents & ZMQ_POLLIN) {
        char buf[4096];
        const ssize_t n = ::read(0, buf, sizeof(buf));
        if (n <= 0) return;
        pending.append(buf, static_cast<size_t>(n));
        for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
          const std::string line = pending.substr(0, nl);
          pending.erase(0, nl + 1);
          if (!command(line)) return;
        }
      }
      if (torn_left > 0 && std::chrono::steady_clock::now() - last_request > std::chrono::milliseconds(100)) {
        // Provoke a replay request: a live frame after a hole.
        seq += 1;
        send_live(seq++, empty_batch());
        last_request = std::chrono::steady_clock::now();
      }
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  int pub_port = 0;
  Peer peer;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--pub-port") pub_port = std::atoi(argv[i + 1]);
    else if (a == "--replay-port") peer.replay_port = std::atoi(argv[i + 1]);
    else if (a == "--block-size") peer.block_size = static_cast<uint32_t>(std::atoi(argv[i + 1]));
  }
  peer.pub.set(zmq::sockopt::linger, 0);
  peer.pub.set(zmq::sockopt::sndhwm, 100000);
  peer.pub.bind("tcp://127.0.0.1:" + std::to_string(pub_port));
  peer.bind_router();
  std::printf("ready kv_events tcp://127.0.0.1:%d replay tcp://127.0.0.1:%d\n", bound_port(peer.pub),
              peer.replay_port);
  std::fflush(stdout);
  peer.run();
  return 0;
}
