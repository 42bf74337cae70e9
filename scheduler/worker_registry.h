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

namespace kvroute {

struct WorkerAnnouncement {
  WorkerId id;
  std::string url;
  std::string model;
  uint32_t block_size = 0;
  uint32_t dp_size = 1;
  WorkerLoad load;  // as reported
};

struct WorkerView {
  WorkerAnnouncement info;
  WorkerLoad predicted;         // reported load, raised by the router's own in-flight work
  uint32_t inflight_requests = 0;
  uint64_t inflight_blocks = 0;
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
  // Removes one worker now (e.g. drained by an operator).
  bool remove(WorkerId id);

  // Workers that serve `model` (empty = any) and have announced a URL, sorted by id.
  std::vector<WorkerView> candidates(std::string_view model) const;
  std::vector<WorkerView> all() const;
  std::vector<std::string> models() const;
  size_t size() const;

  // In-flight accounting: the router calls begin() when it dispatches a
  // request and end() when the response completes (or fails), with the same
  // `blocks` (KV blocks the request will hold on the worker).
  void begin_request(WorkerId id, uint64_t blocks);
  void end_request(WorkerId id, uint64_t blocks);

 private:
  struct Entry {
    WorkerAnnouncement info;
    bool announced = false;  // false: known from events only (no URL yet)
    TimePoint last_seen{};
    uint32_t inflight_requests = 0;
    uint64_t inflight_blocks = 0;
  };
  WorkerView view(const Entry& e) const;

  const Clock& clock_;
  mutable std::mutex mu_;
  std::map<WorkerId, Entry> workers_;
};

// RAII in-flight accounting for one dispatched request.
class InflightGuard {
 public:
  InflightGuard() = default;
  InflightGuard(WorkerRegistry& r, WorkerId id, uint64_t blocks) : r_(&r), id_(id), blocks_(blocks) {
    r.begin_request(id, blocks);
  }
  InflightGuard(InflightGuard&& o) noexcept : r_(o.r_), id_(o.id_), blocks_(o.blocks_) { o.r_ = nullptr; }
  InflightGuard& operator=(InflightGuard&& o) noexcept {
    if (this != &o) { release(); r_ = o.r_; id_ = o.id_; blocks_ = o.blocks_; o.r_ = nullptr; }
    return *this;
  }
  ~InflightGuard() { release(); }
  void release() {
    if (r_) r_->end_request(id_, blocks_);
    r_ = nullptr;
  }

 private:
  WorkerRegistry* r_ = nullptr;
  WorkerId id_;
  uint64_t blocks_ = 0;
};

}  // namespace kvroute
