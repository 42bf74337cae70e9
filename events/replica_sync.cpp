#include "events/replica_sync.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>
#include <set>

namespace kvroute {

ReplicaSync::ReplicaSync(NatsBus& bus, WorkerRegistry& registry, const Clock& clock, std::string subject_prefix,
                         std::chrono::milliseconds interval, std::chrono::milliseconds ttl)
    : bus_(bus),
      registry_(registry),
      clock_(clock),
      subject_(subject_prefix + ".replicas.inflight"),
      interval_(interval),
      ttl_(ttl),
      replica_((uint64_t{std::random_device{}()} << 32 | std::random_device{}()) | 1) {}

ReplicaSync::~ReplicaSync() { stop(); }

bool ReplicaSync::start(std::string* error) {
  {
    std::lock_guard g(gate_->mu);
    gate_->self = this;
  }
  auto handler = [gate = gate_](const NatsMessage& m) {
    std::lock_guard g(gate->mu);
    if (gate->self) gate->self->on_message(m.data);
  };
  if (!bus_.subscribe(subject_, std::move(handler), error)) return false;
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "kvroute-replica");
    // Watches the registry's in-flight generation every millisecond (one
    // atomic load): a change is published at once, but not more often than
    // every interval; keep-alives and expiry at least every interval.
    uint64_t seen = registry_.inflight_generation();
    const Nanos idle = std::max<Nanos>(interval_, std::min<Nanos>(ttl_ / 10, std::chrono::milliseconds(100)));
    auto last_tick = std::chrono::steady_clock::now();
    std::unique_lock lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(1), [&] { return stop_; });
      if (stop_) break;
      const uint64_t gen = registry_.inflight_generation();
      const auto now = std::chrono::steady_clock::now();
      if (now - last_tick < (gen != seen ? Nanos(interval_) : idle)) continue;
      seen = gen;
      last_tick = now;
      lk.unlock();
      tick();
      lk.lock();
    }
  });
  return true;
}

void ReplicaSync::stop() {
  {
    std::lock_guard g(gate_->mu);  // waits for a handler still running
    gate_->self = nullptr;
  }
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// This replica's own in-flight work per worker (the registry's views add the
// other replicas' on top; they are taken back out here).
std::vector<ReplicaInflight> ReplicaSync::local_snapshot() const {
  std::vector<ReplicaInflight> out;
  for (const auto& v : registry_.all()) {
    ReplicaInflight r{v.info->id, v.inflight_requests - v.remote_requests, v.inflight_blocks - v.remote_blocks,
                      v.pending_prefill_tokens - v.remote_prefill_tokens};
    if (r.requests || r.blocks || r.prefill_tokens) out.push_back(r);
  }
  return out;
}

void ReplicaSync::tick() {
  const TimePoint now = clock_.now();
  auto local = local_snapshot();
  if (local != last_sent_ || now - last_publish_ >= ttl_ / 3) {
    ReplicaSnapshot s{replica_, ++seq_, static_cast<uint32_t>(ttl_.count()), local};
    if (bus_.publish(subject_, encode_replica_snapshot(s))) {
      stats_.published_total.fetch_add(1, std::memory_order_relaxed);
      last_sent_ = std::move(local);
      last_publish_ = now;
    }
  }
  std::lock_guard lk(mu_);
  std::vector<WorkerId> touched;
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (now - it->second.last_seen > it->second.ttl) {
      for (const auto& [id, _] : it->second.workers) touched.push_back(id);
      spdlog::info("router replica {:x} silent for {} ms: its in-flight requests no longer count", it->first,
                   std::chrono::duration_cast<std::chrono::milliseconds>(it->second.ttl).count());
      stats_.replicas_expired_total.fetch_add(1, std::memory_order_relaxed);
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
  if (!touched.empty()) apply_sums(touched);
  stats_.peers.store(peers_.size(), std::memory_order_relaxed);
}

void ReplicaSync::on_message(std::string_view data) {
  ReplicaSnapshot s;
  if (!decode_replica_snapshot(data, s)) {
    stats_.rejected_total.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (s.replica == replica_) return;  // our own, echoed by the server
  stats_.received_total.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lk(mu_);
  Peer& p = peers_[s.replica];
  std::vector<WorkerId> touched;
  for (const auto& [id, _] : p.workers) touched.push_back(id);
  p.workers.clear();
  for (const auto& w : s.workers) touched.push_back(w.worker), p.workers[w.worker] = w;
  p.last_seen = clock_.now();
  p.ttl = std::chrono::milliseconds(s.ttl_ms);
  apply_sums(touched);
  stats_.peers.store(peers_.size(), std::memory_order_relaxed);
}

// Sums every peer's counts for the touched workers into the registry.
void ReplicaSync::apply_sums(const std::vector<WorkerId>& touched) {
  std::set<WorkerId> ids(touched.begin(), touched.end());
  for (WorkerId id : ids) {
    ReplicaInflight sum{id};
    for (const auto& [_, p] : peers_) {
      auto it = p.workers.find(id);
      if (it == p.workers.end()) continue;
      sum.requests += it->second.requests, sum.blocks += it->second.blocks;
      sum.prefill_tokens += it->second.prefill_tokens;
    }
    registry_.set_remote_inflight(id, sum.requests, sum.blocks, sum.prefill_tokens);
  }
}

}  // namespace kvroute
