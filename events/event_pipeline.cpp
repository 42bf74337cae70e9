#include "events/event_pipeline.h"

#include <cmath>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "common/log.h"
#include "events/evictions.h"

#include <pthread.h>

#include <chrono>

namespace kvroute {

EventPipeline::EventPipeline(const EventsConfig& events, uint32_t block_size, Indexer& index,
                             WorkerRegistry& registry, const Clock& clock)
    : cfg_(events),
      url_allow_(UrlAllowList::parse(events.worker_url_allow).value_or(UrlAllowList())),
      block_size_(block_size),
      index_(index),
      registry_(registry),
      clock_(clock) {}

EventPipeline::~EventPipeline() { stop(); }

void EventPipeline::start_writer() {
  if (!writer_.joinable()) writer_ = std::thread([this] { writer_loop(); });
}

bool EventPipeline::start(NatsBus& bus, std::string* error) {
  bus_ = &bus;
  start_writer();
  for (uint32_t i = 0; i < std::max<uint32_t>(1, cfg_.resync_concurrency); ++i)
    resync_threads_.emplace_back([this] { resync_loop(); });
  bus.on_reconnected([this] { resync_all(); });
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
  for (auto& t : resync_threads_)
    if (t.joinable()) t.join();
  resync_threads_.clear();
}

void EventPipeline::request_resync(CacheOwner owner) {
  {
    std::lock_guard lk(mu_);
    if (std::find(resync_pending_.begin(), resync_pending_.end(), owner) != resync_pending_.end()) return;
    resync_pending_.push_back(owner);
  }
  resync_cv_.notify_one();
}

void EventPipeline::resync_all() {
  size_t n = 0;
  for (const auto& w : registry_.all()) {
    // Workers with ZMQ events replay from their own endpoint (fleet/), not over NATS.
    if (!w.info || w.info->approximate || !w.info->kv_events.empty()) continue;
    for (uint32_t r = 0; r < std::max<uint32_t>(1, w.info->dp_size); ++r, ++n) {
      const CacheOwner owner{w.info->id, r};
      {
        // Dumps that failed while the bus was down say nothing of the worker:
        // its backoff starts over, so it is asked now, not up to
        // resync_backoff_max_ms later (one ask per owner per reconnect).
        std::lock_guard lk(mu_);
        resync_pace_.erase(owner);
      }
      request_resync(owner);
    }
  }
  spdlog::info("NATS reconnected: asking {} cache owner(s) for their dumps (events may have been lost)", n);
}

// Picks a pending owner whose backoff has passed and that no other resync
// thread is fetching; waits (mu_ held through `lk`) until there is one.
bool EventPipeline::take_resync(std::unique_lock<std::mutex>& lk, CacheOwner& owner) {
  const Nanos base = std::chrono::milliseconds(cfg_.resync_backoff_ms);
  const Nanos cap = std::chrono::milliseconds(cfg_.resync_backoff_max_ms);
  while (!stop_) {
    auto soonest = TimePoint::max();
    const TimePoint now = clock_.now();
    for (auto it = resync_pending_.begin(); it != resync_pending_.end(); ++it) {
      if (resync_active_.count(*it)) continue;
      ResyncPace& pace = resync_pace_[*it];
      if (pace.next_allowed <= now) {
        owner = *it;
        resync_pending_.erase(it);
        resync_active_.insert(owner);
        if (pace.backoff < base) pace.backoff = base;
        pace.next_allowed = now + pace.backoff;  // rate limit: one dump per backoff period
        pace.backoff = std::min(cap, pace.backoff * 2);
        return true;
      }
      soonest = std::min(soonest, pace.next_allowed);
    }
    if (soonest == TimePoint::max()) resync_cv_.wait(lk);
    else resync_cv_.wait_for(lk, std::min<Nanos>(soonest - now, std::chrono::milliseconds(100)));
  }
  return false;
}

void EventPipeline::finish_resync(CacheOwner owner, bool ok) {
  {
    std::lock_guard lk(mu_);
    resync_active_.erase(owner);
    if (ok) {
      // A dump that worked halves the backoff; repeated asks keep doubling it.
      ResyncPace& pace = resync_pace_[owner];
      pace.backoff = std::max<Nanos>(std::chrono::milliseconds(cfg_.resync_backoff_ms), pace.backoff / 4);
    } else if (!stop_ &&
               std::find(resync_pending_.begin(), resync_pending_.end(), owner) == resync_pending_.end()) {
      resync_pending_.push_back(owner);  // retried once its backoff has passed
    }
  }
  resync_cv_.notify_all();
}

// Pulls a dump chunk by chunk (events/wire.h "Chunked resync"): a lost or bad
// reply asks for the same chunk again (resumable); a snapshot the worker no
// longer holds starts over. False + why after too many failures.
bool EventPipeline::fetch_dump(CacheOwner owner, ResyncDump& out, std::string& why) {
  constexpr int kAttemptsPerChunk = 3, kRestarts = 2;
  constexpr size_t kMaxDumpBlocks = size_t{1} << 26;
  const std::string subject = fmt::format("{}.kv_resync.{}", cfg_.subject_prefix, owner.worker.value);
  ResyncRequest rq;
  rq.dp_rank = owner.dp_rank;
  rq.max_bytes = bus_->max_payload();
  uint32_t chunks = 1;
  size_t blocks = 0;
  int attempts = 0, restarts = 0;
  out = ResyncDump{};
  for (uint32_t k = 0; k < chunks;) {
    rq.chunk = k;
    stats_.resync_chunks_total.fetch_add(1, std::memory_order_relaxed);
    auto reply = bus_->request(subject, encode_resync_request(rq), std::chrono::milliseconds(cfg_.resync_timeout_ms));
    ResyncChunk c;
    std::string detail;
    const bool ok = reply && decode_resync_chunk(*reply, limits_, c, &detail) == DecodeError::None &&
                    (c.snapshot_gone || (c.dump.owner == owner && (k == 0 || (c.snapshot == rq.snapshot && c.dump.instance == out.instance &&
                                                                                c.chunks == chunks && c.chunk == k))));
    if (!ok || c.snapshot_gone) {
      if (ok || ++attempts > kAttemptsPerChunk) {
        if (!ok || ++restarts > kRestarts) {
          why = reply ? "bad reply: " + (detail.empty() ? std::string("out of sequence") : detail) : "no answer";
          return false;
        }
        k = 0, rq.snapshot = 0, out = ResyncDump{}, blocks = 0, attempts = 0;  // snapshot gone: start over
      }
      stats_.resync_chunk_retries_total.fetch_add(1, std::memory_order_relaxed);
      // No responder yet (e.g. the worker is still reconnecting to NATS): a short pause.
      if (!reply) std::this_thread::sleep_for(std::chrono::milliseconds(100) * attempts);
      continue;
    }
    if (k == 0) {
      rq.snapshot = c.snapshot;
      chunks = c.chunks;
      out.owner = owner;
      out.last_event_id = c.dump.last_event_id;
      out.instance = c.dump.instance;
    }
    for (auto& ev : c.dump.events) {
      if (const auto* st = std::get_if<KvStored>(&ev.data)) blocks += st->blocks.size();
      out.events.push_back(std::move(ev));
    }
    if (blocks > kMaxDumpBlocks) {
      why = "dump larger than 2^26 blocks";
      return false;
    }
    attempts = 0;
    ++k;
  }
  return true;
}

void EventPipeline::resync_loop() {
  pthread_setname_np(pthread_self(), "kvroute-resync");
  std::unique_lock lk(mu_);
  CacheOwner owner;
  while (take_resync(lk, owner)) {
    lk.unlock();
    bool done = true;  // a worker that is gone needs no resync
    if (bus_ && registry_.known(owner.worker)) {
      stats_.resync_requests_total.fetch_add(1, std::memory_order_relaxed);
      // Events queued from now on are remembered, to replay after the dump.
      push_item(ResyncBegin{owner});
      ResyncDump dump;
      std::string why;
      done = fetch_dump(owner, dump, why);
      if (done) {
        note_heard(owner.worker);
        push_item(std::move(dump));  // never dropped: it replaces what the queue lost
      } else {
        stats_.resync_failures_total.fetch_add(1, std::memory_order_relaxed);
        static RateLimiter rl;
        if (rl.allow())
          spdlog::warn("resync of worker {} rank {} failed ({}); its overlap stays unknown, retrying with backoff",
                       owner.worker.value, owner.dp_rank, why);
      }
    }
    finish_resync(owner, done);
    lk.lock();
  }
}

size_t EventPipeline::item_bytes(const QueueItem& item) {
  auto events_bytes = [](const std::vector<KvEvent>& evs) {
    size_t n = evs.capacity() * sizeof(KvEvent);
    for (const auto& e : evs) {
      if (const auto* st = std::get_if<KvStored>(&e.data)) n += st->blocks.capacity() * sizeof(StoredBlock);
      else if (const auto* rm = std::get_if<KvRemoved>(&e.data)) n += rm->block_hashes.capacity() * sizeof(SequenceHash);
    }
    return n;
  };
  if (const auto* b = std::get_if<std::vector<KvEvent>>(&item)) return events_bytes(*b);
  if (const auto* d = std::get_if<ResyncDump>(&item)) return events_bytes(d->events);
  return sizeof(QueueItem);
}

// Queues one item for the writer. Event batches obey both bounds (messages and
// bytes); dumps and control items always go in (they are few and repair losses).
bool EventPipeline::push_item(QueueItem item) {
  const bool bounded = std::holds_alternative<std::vector<KvEvent>>(item);
  const size_t bytes = item_bytes(item);
  const WorkerId worker = item_worker(item);
  {
    std::lock_guard lk(mu_);
    WorkerQueue& q = queues_[worker];
    if (bounded && queued_items_ > 0 &&
        (queued_items_ >= cfg_.queue_capacity || queued_bytes_ + bytes > cfg_.queue_capacity_bytes)) {
      if (q.items.empty()) queues_.erase(worker);
      return false;
    }
    // One worker may fill at most its share of the queue: a flooding worker
    // loses its own events, never the others'.
    if (bounded && q.batches > 0 &&
        (static_cast<double>(q.batches + 1) > cfg_.queue_worker_share * cfg_.queue_capacity ||
         static_cast<double>(q.bytes + bytes) > cfg_.queue_worker_share * static_cast<double>(cfg_.queue_capacity_bytes))) {
      stats_.queue_worker_dropped_total.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    queued_bytes_ += bytes;
    stats_.queued_bytes.store(queued_bytes_, std::memory_order_relaxed);
    if (bounded) {
      q.bytes += bytes;
      ++q.batches;
      ++queued_items_;
    }
    if (q.items.empty()) ready_.push_back(worker);
    q.items.emplace_back(pushed_, std::move(item));
    outstanding_.insert(pushed_++);
  }
  cv_.notify_one();
  return true;
}

WorkerId EventPipeline::item_worker(const QueueItem& item) {
  if (const auto* b = std::get_if<std::vector<KvEvent>>(&item)) return b->empty() ? WorkerId{0} : b->front().owner.worker;
  if (const auto* d = std::get_if<ResyncDump>(&item)) return d->owner.worker;
  if (const auto* r = std::get_if<RemoveWorker>(&item)) return r->worker;
  if (const auto* b = std::get_if<ResyncBegin>(&item)) return b->owner.worker;
  return std::get<InstanceSeen>(item).worker;
}

void EventPipeline::apply_control(QueueItem& item) {
  if (auto* rm = std::get_if<RemoveWorker>(&item)) {
    index_.remove_worker(rm->worker);
  } else if (auto* d = std::get_if<ResyncDump>(&item)) {
    index_.apply_resync(d->owner, d->last_event_id, d->events, d->instance);
    stats_.resync_applied_total.fetch_add(1, std::memory_order_relaxed);
  } else if (auto* b = std::get_if<ResyncBegin>(&item)) {
    index_.begin_resync(b->owner);
  } else if (auto* i = std::get_if<InstanceSeen>(&item)) {
    if (index_.on_instance(i->worker, i->instance))
      spdlog::info("worker {} restarted (instance {}): its blocks were dropped", i->worker.value, i->instance);
  }
}

void EventPipeline::note_heard(WorkerId worker) {
  const TimePoint now = clock_.now();
  std::lock_guard lk(heard_mu_);
  heard_[worker] = now;
}

std::optional<Nanos> EventPipeline::index_age(WorkerId worker) const {
  std::lock_guard lk(heard_mu_);
  auto it = heard_.find(worker);
  if (it == heard_.end()) return std::nullopt;
  return clock_.now() - it->second;
}

std::vector<std::pair<WorkerId, Nanos>> EventPipeline::index_ages() const {
  const TimePoint now = clock_.now();
  std::vector<std::pair<WorkerId, Nanos>> out;
  std::lock_guard lk(heard_mu_);
  for (const auto& [w, t] : heard_)
    if (registry_.known(w)) out.emplace_back(w, now - t);
  std::sort(out.begin(), out.end());
  return out;
}

// Drops events of workers the router does not know (never announced, or
// gone): the bus is not trusted to add workers. True if any remain.
bool EventPipeline::drop_unknown_workers(std::vector<KvEvent>& events) {
  WorkerId last{~0ull};
  bool last_known = false;
  size_t dropped = 0;
  std::erase_if(events, [&](const KvEvent& ev) {
    if (ev.owner.worker != last) {
      last = ev.owner.worker;
      last_known = registry_.known(last);
      if (last_known) note_heard(last);
    }
    if (!last_known) ++dropped;
    return !last_known;
  });
  if (dropped) {
    const auto n = stats_.unknown_worker_events_total.fetch_add(dropped, std::memory_order_relaxed) + dropped;
    static RateLimiter rl;
    if (rl.allow()) spdlog::warn("kv events of unknown workers dropped ({} so far)", n);
  }
  return !events.empty();
}

std::string_view EventPipelineStats::heartbeat_reason(size_t i) {
  switch (i) {
    case kHeartbeatMissingUrl: return "missing_url";
    case kHeartbeatUrlNotAllowed: return "url_not_allowed";
    case kHeartbeatUrlChanged: return "url_changed";
    case kHeartbeatTooManyWorkers: return "too_many_workers";
    default: return to_string(static_cast<DecodeError>(i));
  }
}

// A heartbeat's instance id: a new one (after the first) is a restart, handed
// to the writer; a worker that just joined (or restarted) is asked for a dump.
void EventPipeline::note_instance(WorkerId worker, uint64_t instance, bool joined, uint32_t dp_size,
                                  bool publishes) {
  bool changed = false;
  if (instance != 0) {
    std::lock_guard lk(instance_mu_);
    auto [it, fresh] = instances_.try_emplace(worker, instance);
    changed = fresh || it->second != instance;
    it->second = instance;
  }
  if (changed) push_item(InstanceSeen{worker, instance});
  if ((joined || changed) && publishes && bus_)
    for (uint32_t r = 0; r < std::max<uint32_t>(1, dp_size); ++r) request_resync(CacheOwner{worker, r});
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
  if (!drop_unknown_workers(events)) return;
  const size_t n = events.size();
  if (!push_item(std::move(events))) {
    // Dropping creates an event_id gap for these workers, which the index
    // treats as lost events; never block the NATS dispatcher.
    stats_.queue_dropped_total.fetch_add(1, std::memory_order_relaxed);
    stats_.queue_dropped_bytes_total.fetch_add(data.size(), std::memory_order_relaxed);
    return;
  }
  stats_.events_queued_total.fetch_add(n, std::memory_order_relaxed);
}

bool EventPipeline::enqueue_events(std::vector<KvEvent>&& events) {
  const size_t n = events.size();
  if (!push_item(std::move(events))) {  // bounded by messages and bytes
    stats_.queue_dropped_total.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  stats_.events_queued_total.fetch_add(n, std::memory_order_relaxed);
  return true;
}

void EventPipeline::on_heartbeat_message(std::string_view data) {
  WorkerHeartbeat hb;
  std::string detail;
  DecodeError e = decode_heartbeat(data, hb, &detail);
  if (e != DecodeError::None || hb.url.empty()) {
    const auto n = stats_.heartbeats_rejected_total.fetch_add(1, std::memory_order_relaxed) + 1;
    const size_t reason = e == DecodeError::None ? EventPipelineStats::kHeartbeatMissingUrl : static_cast<size_t>(e);
    stats_.heartbeats_rejected_by_reason[reason].fetch_add(1, std::memory_order_relaxed);
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
  if (!url_allow_.allows(hb.url)) {
    reject_heartbeat(EventPipelineStats::kHeartbeatUrlNotAllowed, hb.worker_id, hb.url);
    return;
  }
  WorkerAnnouncement a;
  a.id = hb.worker_id;
  a.url = std::move(hb.url);
  a.model = std::move(hb.model);
  a.block_size = hb.block_size;
  a.dp_size = hb.dp_size;
  a.approximate = !hb.kv_events;
  a.role = hb.role;
  a.bootstrap_port = hb.bootstrap_port;
  a.load = hb.load;
  const HeartbeatVerdict verdict = registry_.admit_heartbeat(a, cfg_.max_bus_workers);
  if (verdict == HeartbeatVerdict::UrlChanged || verdict == HeartbeatVerdict::TooManyWorkers) {
    reject_heartbeat(verdict == HeartbeatVerdict::UrlChanged ? EventPipelineStats::kHeartbeatUrlChanged
                                                             : EventPipelineStats::kHeartbeatTooManyWorkers,
                     a.id, a.url);
    return;
  }
  const bool joined = verdict == HeartbeatVerdict::Joined;
  if (joined) spdlog::info("worker {} joined: {} model '{}'", a.id.value, a.url, a.model);
  note_instance(a.id, hb.instance_id, joined, a.dp_size, !a.approximate);  // restarts, first dumps
}

// A well-formed heartbeat the trust rules refuse: counted by reason, warned
// at a limited rate (a flood must not flood the log).
void EventPipeline::reject_heartbeat(size_t reason, WorkerId worker, std::string_view url) {
  const auto n = stats_.heartbeats_rejected_total.fetch_add(1, std::memory_order_relaxed) + 1;
  stats_.heartbeats_rejected_by_reason[reason].fetch_add(1, std::memory_order_relaxed);
  static RateLimiter rl;
  if (!rl.allow()) return;
  switch (reason) {
    case EventPipelineStats::kHeartbeatUrlNotAllowed:
      spdlog::warn("heartbeat of worker {} refused: url {} is not in events.worker_url_allow ({} refused so far)",
                   worker.value, url, n);
      break;
    case EventPipelineStats::kHeartbeatUrlChanged:
      spdlog::warn("heartbeat of worker {} refused: it announces url {}, another than the one it is known by (a "
                   "worker's url changes only by config or the admin API, or after it expired; {} refused so far)",
                   worker.value, url, n);
      break;
    default:
      spdlog::warn("heartbeat of new worker {} ({}) refused: events.max_bus_workers ({}) workers are known by "
                   "heartbeat ({} refused so far)",
                   worker.value, url, cfg_.max_bus_workers, n);
  }
}

void EventPipeline::enqueue_remove_worker(WorkerId worker) {
  push_item(RemoveWorker{worker});  // never dropped: only event batches are bounded
}

void EventPipeline::drain() {
  std::unique_lock lk(mu_);
  const uint64_t target = pushed_;
  drained_cv_.wait(lk, [&] { return outstanding_.empty() || *outstanding_.begin() >= target || stop_; });
}

void EventPipeline::refresh_block_limits() {
  if (block_ceiling_ == 0) return;
  std::vector<std::pair<WorkerId, uint64_t>> limits;
  for (const auto& w : registry_.all()) {
    const uint64_t declared = w.info->load.kv_total_blocks;
    if (declared == 0) continue;
    const double n = std::ceil(static_cast<double>(declared) * capacity_slack_);
    limits.emplace_back(w.info->id, n >= static_cast<double>(block_ceiling_) ? block_ceiling_ : static_cast<uint64_t>(n));
  }
  index_.set_block_limits(limits, block_ceiling_);
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
    cv_.wait_until(lk, next_expiry, [&] { return stop_ || !ready_.empty(); });
    while (!ready_.empty()) {
      // The next worker in turn gives one entry, then goes to the back.
      const WorkerId worker = ready_.front();
      ready_.pop_front();
      WorkerQueue& q = queues_[worker];
      auto [number, item] = std::move(q.items.front());
      q.items.pop_front();
      const bool bounded = std::holds_alternative<std::vector<KvEvent>>(item);
      const size_t bytes = item_bytes(item);
      if (bounded) {
        q.bytes -= bytes;
        --q.batches;
        --queued_items_;
      }
      if (!q.items.empty()) ready_.push_back(worker);
      else queues_.erase(worker);
      lk.unlock();
      if (auto* batch = std::get_if<std::vector<KvEvent>>(&item)) {
        for (const auto& ev : *batch) {
          const auto result = static_cast<size_t>(index_.apply(ev));
          stats_.applied_total[ev.data.index()][result].fetch_add(1, std::memory_order_relaxed);
        }
      } else {
        apply_control(item);  // a resync's replay may remove blocks too
      }
      // KV events feed cache knowledge, never liveness: the registry learns
      // only how many blocks each worker's cache lost (WorkerRegistry::add_evicted()).
      hand_evictions(index_, registry_, removed_);
      lk.lock();
      queued_bytes_ -= bytes;
      stats_.queued_bytes.store(queued_bytes_, std::memory_order_relaxed);
      outstanding_.erase(number);
      drained_cv_.notify_all();
    }
    if (std::chrono::steady_clock::now() >= next_expiry) {
      lk.unlock();
      // A bus outage silences every heartbeat at once: it says nothing about
      // the workers. While NATS is down no heartbeat-only worker expires (the
      // proxy's health reports still take out one that stops answering), and
      // each gets a whole ttl to heartbeat again once NATS is back.
      if (bus_ && !bus_->connected()) {
        registry_.hold_heartbeats();
        stats_.expiry_held_ticks_total.fetch_add(1, std::memory_order_relaxed);
      }
      refresh_block_limits();
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
