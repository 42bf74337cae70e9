#include "mocker/vllm_publisher.h"

#include <spdlog/spdlog.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <array>
#include <chrono>
#include <vector>

#include <pthread.h>

namespace kvroute::mocker {

struct VllmPublisher::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::optional<zmq::socket_t> router;
};

namespace {

// ZMQ binds a free port with "*"; "tcp://127.0.0.1:0" reads better on a command line.
std::string zmq_bind_form(const std::string& ep) {
  if (ep.rfind("tcp://", 0) == 0 && ep.size() > 2 && ep.compare(ep.size() - 2, 2, ":0") == 0)
    return ep.substr(0, ep.size() - 1) + "*";
  return ep;
}

std::array<uint8_t, 8> be64(uint64_t v) {
  std::array<uint8_t, 8> b;
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (56 - 8 * i));
  return b;
}

}  // namespace

VllmPublisher::VllmPublisher(VllmPublisherOptions opts) : opts_(std::move(opts)), sk_(std::make_unique<Sockets>()) {}

VllmPublisher::~VllmPublisher() { stop(); }

bool VllmPublisher::bind(std::string* error) {
  try {
    sk_->pub.set(zmq::sockopt::linger, 0);
    sk_->pub.set(zmq::sockopt::sndhwm, 100000);
    sk_->pub.bind(zmq_bind_form(opts_.endpoint));
    bound_ = sk_->pub.get(zmq::sockopt::last_endpoint);
    if (!opts_.replay_endpoint.empty()) {
      sk_->router.emplace(sk_->ctx, zmq::socket_type::router);
      sk_->router->set(zmq::sockopt::linger, 0);
      sk_->router->bind(zmq_bind_form(opts_.replay_endpoint));
      bound_replay_ = sk_->router->get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    if (error) *error = std::string("--zmq-endpoint / --zmq-replay-endpoint: cannot bind: ") + e.what();
    return false;
  }
  return true;
}

void VllmPublisher::start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
}

void VllmPublisher::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void VllmPublisher::publish(VllmEventBatch batch) {
  batch.data_parallel_rank = opts_.dp_rank;
  {
    std::lock_guard lk(mu_);
    queue_.push_back(std::move(batch));
  }
  cv_.notify_one();
}

void VllmPublisher::send_batch(VllmEventBatch& b) {
  const uint64_t seq = published_.load();
  std::string payload = encode_vllm_batch(b, opts_.encoding);
  uint64_t drop = drop_live_.load();
  bool dropped = false;
  while (drop > 0 && !dropped) dropped = drop_live_.compare_exchange_weak(drop, drop - 1);
  if (dropped) {
    dropped_.fetch_add(1);
  } else {
    const auto s = be64(seq);
    std::array<zmq::const_buffer, 3> frames{zmq::buffer(opts_.topic), zmq::buffer(s), zmq::buffer(payload)};
    try {
      zmq::send_multipart(sk_->pub, frames, zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      spdlog::warn("kvroute-mocker: ZMQ publish of batch {} failed: {}", seq, e.what());
    }
  }
  if (opts_.buffer_steps > 0) {
    if (buffer_.size() >= opts_.buffer_steps) buffer_.pop_front();
    buffer_.emplace_back(seq, std::move(payload));
  }
  published_.store(seq + 1);
}

void VllmPublisher::serve_replay() {
  std::vector<zmq::message_t> req;
  while (zmq::recv_multipart(*sk_->router, std::back_inserter(req), zmq::recv_flags::dontwait)) {
    if (req.size() != 3 || req[2].size() != 8) {  // [identity, empty, start_seq]
      spdlog::warn("kvroute-mocker: invalid replay request ({} frames)", req.size());
      req.clear();
      continue;
    }
    uint64_t start = 0;
    const auto* p = static_cast<const uint8_t*>(req[2].data());
    for (int i = 0; i < 8; ++i) start = (start << 8) | p[i];
    replays_.fetch_add(1);
    const std::string id = req[0].to_string();
    for (const auto& [seq, payload] : buffer_) {
      if (seq < start) continue;
      const auto s = be64(seq);
      std::array<zmq::const_buffer, 4> f{zmq::buffer(id), zmq::const_buffer(nullptr, 0), zmq::buffer(s),
                                         zmq::buffer(payload)};
      zmq::send_multipart(*sk_->router, f);
    }
    const auto end = be64(~uint64_t{0});
    std::array<zmq::const_buffer, 4> f{zmq::buffer(id), zmq::const_buffer(nullptr, 0), zmq::buffer(end),
                                       zmq::const_buffer(nullptr, 0)};
    zmq::send_multipart(*sk_->router, f);
    req.clear();
  }
}

void VllmPublisher::loop() {
  pthread_setname_np(pthread_self(), "mocker-zmq-pub");
  std::deque<VllmEventBatch> batches;
  while (true) {
    {
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(5), [&] { return stop_ || !queue_.empty(); });
      batches.swap(queue_);
      if (stop_ && batches.empty()) break;
    }
    try {
      for (auto& b : batches) send_batch(b);
      batches.clear();
      if (sk_->router) serve_replay();
    } catch (const zmq::error_t& e) {
      spdlog::warn("kvroute-mocker: ZMQ: {}", e.what());
    }
  }
}

}  // namespace kvroute::mocker
