// The table of live workers: what they announced, their last reported load,
// and the router's own in-flight requests on each (predicted load).
//
// Thread-safe: heartbeats arrive on a NATS dispatcher thread, request threads
// read candidates and update in-flight counts, the index writer thread expires
// dead workers. One mutex; every operation is O(workers) at most and holds it
// for microseconds.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/types.h"
#include "scheduler/scheduler.h"
#include "scheduler/ttft_model.h"

namespace kvroute {

struct WorkerAnnouncement {
  WorkerId id;
  std::string url;
  std::string model;
  uint32_t block_size = 0;
  uint32_t dp_size = 1;
  bool approximate = false;  // publishes no KV events: its cache is predicted from routing
  WorkerLoad load;  // as reported
};

struct WorkerView {
  std::shared_ptr<const WorkerAnnouncement> info;  // immutable; replaced by each heartbeat
  WorkerLoad predicted;         // reported load, raised by the router's own in-flight work
  uint32_t inflight_requests = 0;
  uint64_t inflight_blocks = 0;
  uint64_t pending_prefill_tokens = 0;  // in-flight requests not yet answered with a first byte
  bool draining = false;
  // TTFT model (scheduler/ttft_model.h): requests not yet answered, and the
  // worker's fitted coefficients.
  uint32_t pending_prefill_requests = 0;
  TtftCoefficients ttft;
};

// What begin_request() saw, for learning the TTFT when the first byte comes.
struct TtftSample {
  TtftFeatures features;
  TimePoint start{};
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(const Clock& clock) : clock_(clock) {}

  // Records a heartbeat; returns true if the worker was not known before.
  bool on_heartbeat(const WorkerAnnouncement& a);
  // Notes that a worker is alive without a heartbeat (it published events).
  void touch(WorkerId id);
  // Removes workers silent for longer than `ttl`; returns them.
  std::vector<WorkerId> expire(Nanos ttl);
  // Removes one worker now.
  bool remove(WorkerId id);
  // Marks a worker as draining: it gets no new requests, in-flight ones finish.
  bool set_draining(WorkerId id, bool draining);

  // Workers that serve `model` (empty = any) and have announced a URL, sorted by id.
  std::vector<WorkerView> candidates(std::string_view model) const;
  // The same into `out` (replaced; its capacity is reused: no allocation per request).
  void candidates(std::string_view model, std::vector<WorkerView>& out) const;
  std::vector<WorkerView> all() const;
  bool known(WorkerId id) const;
  std::vector<std::string> models() const;
  size_t size() const;

  // In-flight accounting (predicted load): the router calls begin_request()
  // when it dispatches a request, with the KV blocks it will hold and its
  // uncached prefill tokens; first_byte() when the response starts (prefill
  // is over); end_request() when the response completes or fails.
  // end_request() also releases prefill tokens whose first_byte() was not
  // reported (a failed request, or one answered all at once).
  // begin_request() returns the TTFT model's features as the request found
  // the worker; first_byte() with that sample teaches the worker's model the
  // observed time; `prefilling` in end_request(): first_byte() never came.
  TtftSample begin_request(WorkerId id, uint64_t blocks, uint64_t prefill_tokens);
  void first_byte(WorkerId id, uint64_t prefill_tokens, const TtftSample* sample = nullptr);
  void end_request(WorkerId id, uint64_t blocks, uint64_t prefill_tokens = 0, bool prefilling = false);
  // Prediction error of every worker's TTFT model so far (MAPE metric).
  TtftStats ttft_stats() const;

 private:
  struct Entry {
    std::shared_ptr<const WorkerAnnouncement> info;
    bool announced = false;  // false: known from events only (no URL yet)
    bool draining = false;
    TimePoint last_seen{};
    uint32_t inflight_requests = 0;
    uint64_t inflight_blocks = 0;
    uint64_t pending_prefill_tokens = 0;
    uint32_t pending_prefill_requests = 0;
    TtftModel ttft;
  };
  // Fills `v` (default-constructed, in place in the caller's vector).
  void view(const Entry& e, WorkerView& v) const;

  const Clock& clock_;
  mutable std::mutex mu_;
  std::map<WorkerId, Entry> workers_;
  TtftStats ttft_stats_;
};

// RAII in-flight accounting for one dispatched request. Not thread-safe
// itself (owned by one request); the registry it updates is.
class InflightGuard {
 public:
  InflightGuard() = default;
  InflightGuard(WorkerRegistry& r, WorkerId id, uint64_t blocks, uint64_t prefill_tokens)
      : r_(&r), id_(id), blocks_(blocks), prefill_(prefill_tokens) {
    sample_ = r.begin_request(id, blocks, prefill_tokens);
  }
  InflightGuard(const InflightGuard&) = delete;
  InflightGuard& operator=(const InflightGuard&) = delete;
  ~InflightGuard() { release(); }
  // The worker answered: its prefill for this request is over.
  void first_byte() {
    if (r_ && prefilling_) r_->first_byte(id_, prefill_, &sample_);
    prefill_ = 0;
    prefilling_ = false;
  }
  void release() {
    if (r_) r_->end_request(id_, blocks_, prefill_, prefilling_);  // one update for both
    prefill_ = 0;
    prefilling_ = false;
    r_ = nullptr;
  }

 private:
  WorkerRegistry* r_ = nullptr;
  WorkerId id_;
  uint64_t blocks_ = 0;
  uint64_t prefill_ = 0;
  bool prefilling_ = true;
  TtftSample sample_;
};

}  // namespace kvroute
