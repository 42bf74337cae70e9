#include "scheduler/worker_registry.h"

#include <algorithm>
#include <chrono>
#include <set>

namespace kvroute {

bool WorkerRegistry::on_heartbeat(const WorkerAnnouncement& a) {
  std::lock_guard lk(mu_);
  auto [it, inserted] = workers_.try_emplace(a.id);
  const bool is_new = inserted || !it->second.announced;
  it->second.info = std::make_shared<const WorkerAnnouncement>(a);
  it->second.announced = true;
  it->second.last_seen = clock_.now();
  return is_new;
}

void WorkerRegistry::touch(WorkerId id) {
  std::lock_guard lk(mu_);
  auto& e = workers_[id];
  if (!e.info) {
    WorkerAnnouncement a;
    a.id = id;
    e.info = std::make_shared<const WorkerAnnouncement>(std::move(a));
  }
  e.last_seen = clock_.now();
}

std::vector<WorkerId> WorkerRegistry::expire(Nanos ttl) {
  std::lock_guard lk(mu_);
  std::vector<WorkerId> dead;
  const auto now = clock_.now();
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (now - it->second.last_seen > ttl) {
      dead.push_back(it->first);
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  return dead;
}

bool WorkerRegistry::remove(WorkerId id) {
  std::lock_guard lk(mu_);
  return workers_.erase(id) > 0;
}

void WorkerRegistry::view(const Entry& e, WorkerView& v) const {
  v.info = e.info;
  v.inflight_requests = e.inflight_requests;
  v.inflight_blocks = e.inflight_blocks;
  v.pending_prefill_tokens = e.pending_prefill_tokens;
  v.draining = e.draining;
  v.pending_prefill_requests = e.pending_prefill_requests;
  v.ttft = e.ttft.coefficients();
  // Reports lag by up to a heartbeat interval; what the router itself has in
  // flight on the worker is a lower bound of its load right now.
  v.predicted = e.info->load;
  v.predicted.request_active_slots = std::max(v.predicted.request_active_slots, e.inflight_requests);
  v.predicted.kv_active_blocks = std::max(v.predicted.kv_active_blocks, e.inflight_blocks);
}

std::vector<WorkerView> WorkerRegistry::candidates(std::string_view model) const {
  std::vector<WorkerView> out;
  candidates(model, out);
  return out;
}

void WorkerRegistry::candidates(std::string_view model, std::vector<WorkerView>& out) const {
  out.clear();
  std::lock_guard lk(mu_);
  out.reserve(workers_.size());
  for (const auto& [id, e] : workers_) {
    if (!e.announced || e.info->url.empty()) continue;
    if (!model.empty() && e.info->model != model) continue;
    view(e, out.emplace_back());
  }
}

std::vector<WorkerView> WorkerRegistry::all() const {
  std::lock_guard lk(mu_);
  std::vector<WorkerView> out;
  for (const auto& [id, e] : workers_) view(e, out.emplace_back());
  return out;
}

std::vector<std::string> WorkerRegistry::models() const {
  std::lock_guard lk(mu_);
  std::set<std::string> m;
  for (const auto& [id, e] : workers_)
    if (e.announced && !e.info->model.empty()) m.insert(e.info->model);
  return {m.begin(), m.end()};
}

bool WorkerRegistry::known(WorkerId id) const {
  std::lock_guard lk(mu_);
  return workers_.count(id) > 0;
}

size_t WorkerRegistry::size() const {
  std::lock_guard lk(mu_);
  return workers_.size();
}

bool WorkerRegistry::set_draining(WorkerId id, bool draining) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  it->second.draining = draining;
  return true;
}

TtftSample WorkerRegistry::begin_request(WorkerId id, uint64_t blocks, uint64_t prefill_tokens) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return {};
  // The TTFT model's features as the scheduler saw them (view()'s predicted load).
  const auto& e = it->second;
  const uint32_t running = std::max(e.info ? e.info->load.request_active_slots : 0u, e.inflight_requests);
  TtftSample sample{TtftFeatures{static_cast<double>(prefill_tokens), static_cast<double>(e.pending_prefill_tokens),
                                 static_cast<double>(e.pending_prefill_requests), static_cast<double>(running)},
                    clock_.now()};
  it->second.pending_prefill_requests += 1;
  it->second.inflight_requests += 1;
  it->second.inflight_blocks += blocks;
  it->second.pending_prefill_tokens += prefill_tokens;
  return sample;
}

void WorkerRegistry::first_byte(WorkerId id, uint64_t prefill_tokens, const TtftSample* sample) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.pending_prefill_tokens -= std::min(it->second.pending_prefill_tokens, prefill_tokens);
  it->second.pending_prefill_requests -= std::min<uint32_t>(it->second.pending_prefill_requests, 1);
  if (sample) {
    const double ms = std::chrono::duration<double, std::milli>(clock_.now() - sample->start).count();
    if (ms > 0) {
      ttft_stats_.sum_abs_pct_error += it->second.ttft.observe(sample->features, ms);
      ++ttft_stats_.samples;
    }
  }
}

TtftStats WorkerRegistry::ttft_stats() const {
  std::lock_guard lk(mu_);
  return ttft_stats_;
}

void WorkerRegistry::end_request(WorkerId id, uint64_t blocks, uint64_t prefill_tokens, bool prefilling) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;  // expired meanwhile: nothing to release
  it->second.inflight_requests -= std::min<uint32_t>(it->second.inflight_requests, 1);
  it->second.inflight_blocks -= std::min(it->second.inflight_blocks, blocks);
  it->second.pending_prefill_tokens -= std::min(it->second.pending_prefill_tokens, prefill_tokens);
  if (prefilling) it->second.pending_prefill_requests -= std::min<uint32_t>(it->second.pending_prefill_requests, 1);
}

}  // namespace kvroute
