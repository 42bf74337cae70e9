#include "events/replica_sync.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
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

// This replica's own in-flight work and parked KV per worker (the
// registry's views add the other replicas' on top; they are taken back out
// here). The parked KV in whole blocks, as faded at the worker's last change.
std::vector<ReplicaInflight> ReplicaSync::local_snapshot() const {
  std::vector<ReplicaInflight> out;
  for (const auto& v : registry_.all()) {
    ReplicaInflight r{v.info->id, v.inflight_requests - v.remote_requests, v.inflight_blocks - v.remote_blocks,
                      v.pending_prefill_tokens - v.remote_prefill_tokens,
                      static_cast<uint64_t>(std::llround(std::max(0.0, v.parked_blocks - v.remote_parked_blocks)))};
    if (r.requests || r.blocks || r.prefill_tokens || r.parked_blocks) out.push_back(r);
  }
  return out;
}

namespace {
// Whether two snapshots' in-flight counts differ. The parked KV alone never
// triggers a snapshot: it fades at every load report, and each receiver fades
// it on its own; the keep-alive carries its current figure.
bool inflight_differs(const std::vector<ReplicaInflight>& a, const std::vector<ReplicaInflight>& b) {
  return !std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const ReplicaInflight& x, const ReplicaInflight& y) {
    return x.worker == y.worker && x.requests == y.requests && x.blocks == y.blocks &&
           x.prefill_tokens == y.prefill_tokens;
  });
}
}  // namespace

void ReplicaSync::tick() {
  const TimePoint now = clock_.now();
  auto local = local_snapshot();
  if (inflight_differs(local, last_sent_) || now - last_publish_ >= ttl_ / 3) {
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
  std::lock_guard lk(mu_);
  if (!peers_.count(s.replica) && peers_.size() >= kMaxPeers) {  // a flood of made-up replicas: bounded
    stats_.rejected_total.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  stats_.received_total.fetch_add(1, std::memory_order_relaxed);
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
    // Saturating sums: a peer's figures are bounded on decode, not their total.
    uint64_t requests = 0, blocks = 0, prefill = 0, parked = 0;
    auto add = [](uint64_t& to, uint64_t v) { to = v > UINT64_MAX - to ? UINT64_MAX : to + v; };
    for (const auto& [_, p] : peers_) {
      auto it = p.workers.find(id);
      if (it == p.workers.end()) continue;
      add(requests, it->second.requests), add(blocks, it->second.blocks);
      add(prefill, it->second.prefill_tokens), add(parked, it->second.parked_blocks);
    }
    registry_.set_remote_inflight(id, static_cast<uint32_t>(std::min<uint64_t>(requests, UINT32_MAX)), blocks, prefill,
                                  static_cast<double>(parked));
  }
}

}  // namespace kvroute
