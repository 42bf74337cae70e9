#include "events/event_pipeline.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/log.h"

#include <pthread.h>

#include <chrono>

namespace kvroute {

EventPipeline::EventPipeline(const EventsConfig& events, uint32_t block_size, Indexer& index,
                             WorkerRegistry& registry, const Clock& clock)
    : cfg_(events), block_size_(block_size), index_(index), registry_(registry), clock_(clock) {}

EventPipeline::~EventPipeline() { stop(); }

void EventPipeline::start_writer() {
  if (!writer_.joinable()) writer_ = std::thread([this] { writer_loop(); });
}

bool EventPipeline::start(NatsBus& bus, std::string* error) {
  bus_ = &bus;
  start_writer();
  resync_ = std::thread([this] { resync_loop(); });
  const std::string& p = cfg_.subject_prefix;
  if (!bus.subscribe(p + ".kv_events", [this](const NatsMessage& m) { on_kv_message(m.data); }, error)) return false;
  if (!bus.subscribe(p + ".workers", [this](const NatsMessage& m) { on_heartbeat_message(m.data); }, error))
    return false;
  return true;
}

void EventPipeline::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  resync_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (resync_.joinable()) resync_.join();
}

void EventPipeline::request_resync(CacheOwner owner) {
  {
    std::lock_guard lk(mu_);
    if (std::find(resync_pending_.begin(), resync_pending_.end(), owner) != resync_pending_.end()) return;
    resync_pending_.push_back(owner);
  }
  resync_cv_.notify_one();
}

void EventPipeline::resync_loop() {
  pthread_setname_np(pthread_self(), "kvroute-resync");
  std::unique_lock lk(mu_);
  while (!stop_) {
    resync_cv_.wait(lk, [&] { return stop_ || !resync_pending_.empty(); });
    if (stop_) break;
    const CacheOwner owner = resync_pending_.front();
    resync_pending_.erase(resync_pending_.begin());
    lk.unlock();
    bool done = false;
    if (bus_ && registry_.known(owner.worker)) {
      stats_.resync_requests_total.fetch_add(1, std::memory_order_relaxed);
      const std::string subject = fmt::format("{}.kv_resync.{}", cfg_.subject_prefix, owner.worker.value);
      auto reply = bus_->request(subject, fmt::format(R"({{"dp_rank":{}}})", owner.dp_rank),
                                 std::chrono::milliseconds(cfg_.resync_timeout_ms));
      ResyncDump dump;
      std::string detail;
      if (reply && decode_resync_dump(*reply, limits_, dump, &detail) == DecodeError::None &&
          dump.owner == owner) {
        lk.lock();
        queue_.push_back(std::move(dump));
        ++pushed_;
        lk.unlock();
        cv_.notify_one();
        done = true;
      } else {
        stats_.resync_failures_total.fetch_add(1, std::memory_order_relaxed);
        static RateLimiter rl;
        if (rl.allow())
          spdlog::warn("resync of worker {} rank {} failed ({}); its overlap stays unknown, retrying",
                       owner.worker.value, owner.dp_rank, reply ? "bad dump: " + detail : "no answer");
      }
    } else {
      done = true;  // the worker is gone: nothing to resync
    }
    lk.lock();
    if (!done && !stop_) {
      // Retry after a pause, unless a newer request for it is already queued.
      resync_cv_.wait_for(lk, std::chrono::milliseconds(500), [&] { return stop_; });
      if (std::find(resync_pending_.begin(), resync_pending_.end(), owner) == resync_pending_.end())
        resync_pending_.push_back(owner);
    }
  }
}

void EventPipeline::on_kv_message(std::string_view data) {
  stats_.messages_total.fetch_add(1, std::memory_order_relaxed);
  std::vector<KvEvent> events;
  std::string detail;
  DecodeError e = decode_kv_events(data, limits_, events, &detail);
  if (e != DecodeError::None) {
    stats_.rejected_total[static_cast<size_t>(e)].fetch_add(1, std::memory_order_relaxed);
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("kv event rejected ({}; {} so far): {}", to_string(e),
                   stats_.rejected_total[static_cast<size_t>(e)].load(std::memory_order_relaxed), detail);
    return;
  }
  const size_t n = events.size();
  {
    std::lock_guard lk(mu_);
    if (queue_.size() >= cfg_.queue_capacity) {
      // Dropping creates an event_id gap for these workers, which the index
      // treats as lost events; never block the NATS dispatcher.
      stats_.queue_dropped_total.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue_.push_back(std::move(events));
    ++pushed_;
  }
  stats_.events_queued_total.fetch_add(n, std::memory_order_relaxed);
  cv_.notify_one();
}

bool EventPipeline::enqueue_events(std::vector<KvEvent>&& events) {
  const size_t n = events.size();
  {
    std::lock_guard lk(mu_);
    if (queue_.size() >= cfg_.queue_capacity) {
      stats_.queue_dropped_total.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    queue_.push_back(std::move(events));
    ++pushed_;
  }
  stats_.events_queued_total.fetch_add(n, std::memory_order_relaxed);
  cv_.notify_one();
  return true;
}

void EventPipeline::on_heartbeat_message(std::string_view data) {
  WorkerHeartbeat hb;
  std::string detail;
  DecodeError e = decode_heartbeat(data, hb, &detail);
  if (e != DecodeError::None || hb.url.empty()) {
    const auto n = stats_.heartbeats_rejected_total.fetch_add(1, std::memory_order_relaxed) + 1;
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("heartbeat rejected ({}; {} so far): {}", e == DecodeError::None ? "missing url" : to_string(e), n,
                   detail);
    return;
  }
  stats_.heartbeats_total.fetch_add(1, std::memory_order_relaxed);
  if (hb.block_size != 0 && hb.block_size != block_size_) {
    stats_.block_size_mismatch_total.fetch_add(1, std::memory_order_relaxed);
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("worker {} announces block_size {} but indexer.block_size is {}: its overlap will not match",
                   hb.worker_id.value, hb.block_size, block_size_);
  }
  WorkerAnnouncement a;
  a.id = hb.worker_id;
  a.url = std::move(hb.url);
  a.model = std::move(hb.model);
  a.block_size = hb.block_size;
  a.dp_size = hb.dp_size;
  a.approximate = !hb.kv_events;
  a.load = WorkerLoad{hb.load.request_active_slots, hb.load.request_total_slots, hb.load.num_requests_waiting,
                      hb.load.kv_active_blocks, hb.load.kv_total_blocks};
  if (registry_.on_heartbeat(a)) spdlog::info("worker {} joined: {} model '{}'", a.id.value, a.url, a.model);
}

void EventPipeline::enqueue_remove_worker(WorkerId worker) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back(RemoveWorker{worker});  // never dropped: not bounded by queue_capacity
    ++pushed_;
  }
  cv_.notify_one();
}

void EventPipeline::drain() {
  std::unique_lock lk(mu_);
  const uint64_t target = pushed_;
  drained_cv_.wait(lk, [&] { return applied_ >= target || stop_; });
}

void EventPipeline::writer_loop() {
  pthread_setname_np(pthread_self(), "kvroute-indexw");
  const Nanos ttl = std::chrono::milliseconds(cfg_.worker_ttl_ms);
  // Expiry is checked at a quarter of the TTL (at most 250 ms), so a dead
  // worker leaves within ttl + 250 ms.
  const auto tick = std::min<Nanos>(ttl / 4, std::chrono::milliseconds(250));
  auto next_expiry = std::chrono::steady_clock::now() + tick;
  std::unique_lock lk(mu_);
  while (!stop_) {
    cv_.wait_until(lk, next_expiry, [&] { return stop_ || !queue_.empty(); });
    while (!queue_.empty()) {
      auto item = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      if (auto* batch = std::get_if<std::vector<KvEvent>>(&item)) {
        // KV events feed cache knowledge, never liveness: no registry update here.
        for (const auto& ev : *batch) {
          const auto result = static_cast<size_t>(index_.apply(ev));
          stats_.applied_total[ev.data.index()][result].fetch_add(1, std::memory_order_relaxed);
        }
      } else if (auto* rm = std::get_if<RemoveWorker>(&item)) {
        index_.remove_worker(rm->worker);
      } else if (apply_resync_) {
        apply_resync_(std::get<ResyncDump>(item));
        stats_.resync_applied_total.fetch_add(1, std::memory_order_relaxed);
      }
      lk.lock();
      ++applied_;
      drained_cv_.notify_all();
    }
    if (std::chrono::steady_clock::now() >= next_expiry) {
      lk.unlock();
      for (WorkerId w : registry_.expire(ttl)) {
        index_.remove_worker(w);
        stats_.workers_expired_total.fetch_add(1, std::memory_order_relaxed);
        spdlog::warn("heartbeat-only worker {} missed heartbeats for {} ms: removed from candidates and index", w.value,
                     cfg_.worker_ttl_ms);
      }
      lk.lock();
      next_expiry = std::chrono::steady_clock::now() + tick;
    }
  }
  drained_cv_.notify_all();
}

}  // namespace kvroute
