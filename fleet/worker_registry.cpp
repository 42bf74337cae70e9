#include "fleet/worker_registry.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "indexer/block_hash.h"

namespace kvroute {

std::string_view to_string(WorkerSource s) {
  switch (s) {
    case WorkerSource::Heartbeat: return "heartbeat";
    case WorkerSource::Static: return "static";
    case WorkerSource::Dns: return "dns";
    case WorkerSource::Admin: return "admin";
  }
  return "heartbeat";
}

std::string_view to_string(HealthSignal s) {
  switch (s) {
    case HealthSignal::ConnectRefused: return "connect_refused";
    case HealthSignal::ConnectTimeout: return "connect_timeout";
    case HealthSignal::FirstByteTimeout: return "first_byte_timeout";
    case HealthSignal::ServerError: return "server_error";
    case HealthSignal::ScrapeFailed: return "scrape_failed";
  }
  return "scrape_failed";
}

std::string_view to_string(HealthState s) {
  switch (s) {
    case HealthState::Ok: return "ok";
    case HealthState::Down: return "down";
    case HealthState::Ejected: return "ejected";
  }
  return "ok";
}

void WorkerRegistry::capacity_may_be_free(const Entry& e, const CapacityListener* f) {
  if (!e.info) return;
  (*f)(e.info->model);
  for (const std::string& name : e.info->lora_adapters) (*f)(name);
}

bool WorkerRegistry::on_heartbeat(const WorkerAnnouncement& a) {
  return admit_heartbeat(a, std::numeric_limits<size_t>::max()) == HeartbeatVerdict::Joined;
}

size_t WorkerRegistry::bus_workers() const {
  std::lock_guard lk(mu_);
  return bus_workers_;
}

HeartbeatVerdict WorkerRegistry::admit_heartbeat(const WorkerAnnouncement& a, size_t max_bus_workers) {
  std::lock_guard lk(mu_);
  if (const auto known = workers_.find(a.id); known != workers_.end()) {
    const WorkerAnnouncement& was = *known->second.info;
    if (was.source == WorkerSource::Heartbeat && was.url != a.url) return HeartbeatVerdict::UrlChanged;
  } else if (bus_workers_ >= max_bus_workers) {
    return HeartbeatVerdict::TooManyWorkers;
  }
  auto [it, inserted] = workers_.try_emplace(a.id);
  if (inserted) ++bus_workers_;
  Entry& e = it->second;
  if (inserted || !e.info ||
      (e.info->source == WorkerSource::Heartbeat &&
       (e.info->model != a.model || e.info->lora_adapters != a.lora_adapters || e.info->url != a.url ||
        e.info->approximate != a.approximate)))
    membership_changed();
  const auto now = clock_.now();
  if (inserted || e.info->load.kv_total_blocks != a.load.kv_total_blocks) capacity_changed();
  if (!inserted && e.info && e.info->source != WorkerSource::Heartbeat) {
    // Known by the router itself: the heartbeat contributes load only.
    auto info = std::make_shared<WorkerAnnouncement>(*e.info);
    info->load = a.load;
    e.info = std::move(info);
  } else {
    const bool role_changed = inserted || !e.info || e.info->role != a.role;
    auto info = std::make_shared<WorkerAnnouncement>(a);
    info->source = WorkerSource::Heartbeat;
    e.info = std::move(info);
    if (role_changed) refresh_pd_roles();
  }
  e.last_seen = now;
  e.last_load = now;
  e.has_load = true;
  e.ended_requests = 0;  // a fresh report counts only what runs now (as on_load_report)
  e.ended_blocks = 0;
  sync(a.id, e, now);
  capacity_may_be_free(e);
  return inserted ? HeartbeatVerdict::Joined : HeartbeatVerdict::Refreshed;
}

bool WorkerRegistry::upsert(const WorkerAnnouncement& a) {
  std::lock_guard lk(mu_);
  auto [it, inserted] = workers_.try_emplace(a.id);
  Entry& e = it->second;
  membership_changed();
  const bool was_bus = !inserted && e.info && e.info->source == WorkerSource::Heartbeat;
  if (was_bus) --bus_workers_;
  if (a.source == WorkerSource::Heartbeat) ++bus_workers_;
  auto info = std::make_shared<WorkerAnnouncement>(a);
  if (!inserted && e.info) info->load = e.info->load;  // keep the last report until the next scrape
  e.info = std::move(info);
  capacity_changed();
  e.last_seen = clock_.now();
  sync(a.id, e, e.last_seen);
  rebuild_lora_names();
  capacity_may_be_free(e);
  return inserted;
}

std::vector<WorkerId> WorkerRegistry::expire(Nanos ttl) {
  std::lock_guard lk(mu_);
  std::vector<WorkerId> dead;
  const auto now = clock_.now();
  for (auto it = workers_.begin(); it != workers_.end();) {
    const bool heartbeat_only = it->second.info->source == WorkerSource::Heartbeat;
    if (heartbeat_only && now - it->second.last_seen > ttl) {
      dead.push_back(it->first);
      --bus_workers_;
      unsync(it->first, it->second);
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  if (!dead.empty()) {
    membership_changed();
    rebuild_lora_names();
    capacity_changed();
  }
  return dead;
}

void WorkerRegistry::hold_heartbeats() {
  std::lock_guard lk(mu_);
  const auto now = clock_.now();
  for (auto& [id, e] : workers_)
    if (e.info->source == WorkerSource::Heartbeat) e.last_seen = now;
}

bool WorkerRegistry::remove(WorkerId id) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  if (it->second.info->source == WorkerSource::Heartbeat) --bus_workers_;
  unsync(id, it->second);
  workers_.erase(it);
  membership_changed();
  rebuild_lora_names();
  capacity_changed();
  return true;
}

bool WorkerRegistry::on_load_report(WorkerId id, const WorkerLoad& load) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  Entry& e = it->second;
  if (e.info->load.kv_total_blocks != load.kv_total_blocks) capacity_changed();
  auto info = std::make_shared<WorkerAnnouncement>(*e.info);
  info->load = load;
  e.info = std::move(info);
  e.last_load = clock_.now();
  e.has_load = true;
  e.ended_requests = 0;  // a fresh report counts only what runs now
  e.ended_blocks = 0;
  // An answered scrape ends "down"; an outlier ejection runs its course.
  e.consecutive_failures = 0;
  const bool was_down = e.health == HealthState::Down;
  if (was_down) e.health = HealthState::Ok;
  sync(id, e, e.last_load);
  capacity_may_be_free(e);
  return was_down;
}

void WorkerRegistry::report_failure(WorkerId id, HealthSignal signal) {
  std::lock_guard lk(mu_);
  failures_by_signal_[static_cast<size_t>(signal)] += 1;
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  Entry& e = it->second;
  const auto now = clock_.now();
  e.failures_total += 1;
  e.consecutive_failures += 1;
  const bool outlier = signal == HealthSignal::FirstByteTimeout || signal == HealthSignal::ServerError;
  if (signal == HealthSignal::ConnectRefused) {
    e.health = HealthState::Down;  // nothing listens: out at once
    sync(id, e, now);
    return;
  }
  if (e.consecutive_failures < policy_.eject_after_failures) return;
  if (!outlier) {
    if (state(e, now) != HealthState::Ejected) e.health = HealthState::Down;
    sync(id, e, now);
    return;
  }
  if (state(e, now) == HealthState::Ejected) return;  // already out: one ejection per run
  e.ejections_in_a_row += 1;
  const uint64_t shift = std::min<uint32_t>(e.ejections_in_a_row - 1, 16);
  const uint64_t ms = std::min<uint64_t>(uint64_t{policy_.eject_base_ms} << shift, policy_.eject_max_ms);
  e.health = HealthState::Ejected;
  e.ejected_until = now + std::chrono::milliseconds(ms);
  e.consecutive_failures = 0;
  sync(id, e, now);
}

void WorkerRegistry::report_success(WorkerId id) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  Entry& e = it->second;
  e.consecutive_failures = 0;
  if (e.health == HealthState::Down) e.health = HealthState::Ok;
  // A request answered after an ejection ended: the run of ejections is over.
  const auto now = clock_.now();
  if (state(e, now) == HealthState::Ok) e.ejections_in_a_row = 0;
  sync(id, e, now);
  capacity_may_be_free(e);
}

void WorkerRegistry::set_parked_kv_seconds(double seconds) {
  std::lock_guard lk(mu_);
  if (seconds == parked_kv_seconds_) return;
  const TimePoint now = clock_.now();
  for (auto& [id, e] : workers_) fade_parked(e, now);  // the old constant up to now
  parked_kv_seconds_ = seconds;
  for (auto& [id, e] : workers_) sync(id, e, now);
}

void WorkerRegistry::set_eviction_seconds(double seconds) {
  std::lock_guard lk(mu_);
  if (seconds == eviction_seconds_ || !(seconds > 0)) return;
  const TimePoint now = clock_.now();
  for (auto& [id, e] : workers_) fade_evicted(e, now);  // the old constant up to now
  eviction_seconds_ = seconds;
}

void WorkerRegistry::add_evicted(WorkerId id, uint64_t blocks) {
  if (blocks == 0) return;
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  Entry& e = it->second;
  const uint64_t total = e.info ? e.info->load.kv_total_blocks : 0;
  if (total == 0) return;
  const TimePoint now = clock_.now();
  fade_evicted(e, now);
  e.evicted_blocks = std::min(static_cast<double>(total), e.evicted_blocks + static_cast<double>(blocks));
  sync(id, e, now);
}

void WorkerRegistry::set_slot_wait_tokens(double tokens) {
  std::lock_guard lk(mu_);
  if (tokens == slot_wait_tokens_) return;
  slot_wait_tokens_ = tokens;
  const TimePoint now = clock_.now();
  for (auto& [id, e] : workers_) sync(id, e, now);  // every ranking key prices it
}

void WorkerRegistry::set_health_policy(const HealthPolicy& p) {
  std::lock_guard lk(mu_);
  policy_ = p;
}

std::array<uint64_t, kNumHealthSignals> WorkerRegistry::failure_counts() const {
  std::lock_guard lk(mu_);
  return failures_by_signal_;
}

bool WorkerRegistry::serves(const WorkerAnnouncement& a, std::string_view model) {
  if (model.empty() || a.model == model) return true;
  return std::find(a.lora_adapters.begin(), a.lora_adapters.end(), model) != a.lora_adapters.end();
}

void WorkerRegistry::view(const Entry& e, WorkerView& v, TimePoint now) const {
  v.info = e.info;
  v.inflight_requests = e.inflight_requests + e.remote_requests;  // remote_*: other replicas
  v.inflight_blocks = e.inflight_blocks + e.remote_blocks;
  v.pending_prefill_tokens = e.pending_prefill_tokens + e.remote_prefill_tokens;
  v.remote_requests = e.remote_requests;
  v.remote_blocks = e.remote_blocks;
  v.remote_prefill_tokens = e.remote_prefill_tokens;
  v.draining = e.draining;
  v.health = state(e, now);
  v.consecutive_failures = e.consecutive_failures;
  v.failures_total = e.failures_total;
  v.load_age = e.has_load ? Nanos(now - e.last_load) : Nanos(-1);
  v.pending_prefill_requests = e.pending_prefill_requests;  // TTFT model (ttft_model.h)
  v.ttft = e.ttft.coefficients();
  v.parked_blocks = parked_total(e);  // as the rankings have it (sync()): the reference scorer prices the same
  v.remote_parked_blocks = e.remote_parked_blocks;
  v.evicted_blocks = e.evicted_blocks;  // as the rankings have it (sync())
  v.predicted = predicted(e);
  v.slot_wait_tokens = slot_wait(v.predicted);
}

WorkerLoad WorkerRegistry::predicted(const Entry& e) {
  // Reports lag by up to a scrape or heartbeat interval; what the routers
  // (this one and the other replicas) have in flight on the worker
  // is a lower bound of its load right now.
  // A report older than this router's last completions still counts those
  // requests: they leave the predicted load at once.
  WorkerLoad l = e.info->load;
  l.request_active_slots -= std::min(l.request_active_slots, e.ended_requests);
  l.kv_active_blocks -= std::min(l.kv_active_blocks, e.ended_blocks);
  l.request_active_slots = std::max(l.request_active_slots, e.inflight_requests + e.remote_requests);
  l.kv_active_blocks = std::max(l.kv_active_blocks, e.inflight_blocks + e.remote_blocks);
  return l;
}

uint64_t WorkerRegistry::pending_prefill(const Entry& e) {
  return e.pending_prefill_tokens + e.remote_prefill_tokens;  // as view() reports it
}

uint64_t WorkerRegistry::slot_wait(const WorkerLoad& predicted) const {
  const uint32_t total = predicted.request_total_slots;
  if (slot_wait_tokens_ <= 0 || total == 0 || predicted.request_active_slots < total) return 0;
  return static_cast<uint64_t>(slot_wait_tokens_ * (predicted.request_active_slots + 1 - total));
}

double WorkerRegistry::parked_room(const Entry& e, double parked, double beside) {
  const uint64_t total = e.info ? e.info->load.kv_total_blocks : 0;
  return total ? std::min(parked, std::max(0.0, static_cast<double>(total) - beside)) : parked;
}

namespace {
// exp(-elapsed / seconds): what is left of a fading figure from `from` to `to`.
double fade_factor(TimePoint from, TimePoint to, double seconds) {
  return std::exp(-std::chrono::duration<double>(to - from).count() / seconds);
}
// A block count times `factor`; under half a block it is an exact 0 (no denormals).
void fade_blocks(double& blocks, double factor) {
  blocks *= factor;
  if (blocks < 0.5) blocks = 0;
}
}  // namespace

void WorkerRegistry::fade_parked(Entry& e, TimePoint now) const {
  if (parked_kv_seconds_ <= 0) {
    e.parked_blocks = e.remote_parked_blocks = 0;
  } else if (now > e.parked_at && parked_total(e) > 0) {
    const double f = fade_factor(e.parked_at, now, parked_kv_seconds_);
    for (double* p : {&e.parked_blocks, &e.remote_parked_blocks}) fade_blocks(*p, f);
  }
  e.parked_at = std::max(e.parked_at, now);
}

void WorkerRegistry::fade_evicted(Entry& e, TimePoint now) const {
  if (now > e.evicted_at && e.evicted_blocks > 0) fade_blocks(e.evicted_blocks, fade_factor(e.evicted_at, now, eviction_seconds_));
  e.evicted_at = std::max(e.evicted_at, now);
}

void WorkerRegistry::sync(WorkerId id, Entry& e, TimePoint now) {
  fade_parked(e, now);
  fade_evicted(e, now);
  const WorkerAnnouncement& a = *e.info;
  const HealthState h = state(e, now);
  const bool in = !a.url.empty() && h == HealthState::Ok;
  auto wanted = [&](std::string_view name) {
    return in && !name.empty() &&
           (name == a.model || std::find(a.lora_adapters.begin(), a.lora_adapters.end(), name) != a.lora_adapters.end());
  };
  for (size_t k = 0; k < e.rankings.size();) {
    if (wanted(e.rankings[k])) { ++k; continue; }
    if (auto f = rankings_.find(e.rankings[k]); f != rankings_.end()) f->second.erase(id);
    e.rankings[k] = std::move(e.rankings.back());
    e.rankings.pop_back();
  }
  if (h == HealthState::Ejected) ejections_.emplace(e.ejected_until, id);
  if (!in) return;
  const WorkerLoad load = predicted(e);
  const CandidateState st{load, pending_prefill(e), e.draining, parked_total(e), slot_wait(load), e.evicted_blocks};
  auto put = [&](const std::string& name) {
    if (name.empty()) return;
    auto f = rankings_.find(name);
    if (f == rankings_.end()) f = rankings_.emplace(name, RankedCandidates{}).first;
    f->second.upsert(id, st);
    if (std::find(e.rankings.begin(), e.rankings.end(), name) == e.rankings.end()) e.rankings.push_back(name);
  };
  put(a.model);
  for (const auto& l : a.lora_adapters) put(l);
}

void WorkerRegistry::unsync(WorkerId id, Entry& e) {
  for (const auto& name : e.rankings)
    if (auto f = rankings_.find(name); f != rankings_.end()) f->second.erase(id);
  e.rankings.clear();
}

void WorkerRegistry::end_ejections(TimePoint now) {
  while (!ejections_.empty() && ejections_.begin()->first <= now) {
    const WorkerId id = ejections_.begin()->second;
    ejections_.erase(ejections_.begin());
    if (auto it = workers_.find(id); it != workers_.end()) sync(id, it->second, now);
  }
}

bool WorkerRegistry::decide(std::string_view model, const MatchLayers& match, uint32_t isl_tokens,
                            uint32_t block_size, const SchedulerConfig& cfg, Random& random, size_t rank_limit,
                            RankedDecision& out, std::vector<WorkerView>& views) {
  out.reset();
  views.clear();
  std::lock_guard lk(mu_);
  const auto now = clock_.now();
  end_ejections(now);
  auto f = rankings_.find(model);
  if (f == rankings_.end() || f->second.size() == 0) return false;
  f->second.decide(match, isl_tokens, block_size, cfg, random, rank_limit, out);
  for (const auto& p : out.ranked) view(workers_.find(p.worker)->second, views.emplace_back(), now);
  return true;
}

bool WorkerRegistry::slots_full(std::string_view model, const SchedulerConfig& cfg, double* usage) {
  std::lock_guard lk(mu_);
  end_ejections(clock_.now());  // as decide(): the same workers
  const auto f = rankings_.find(model);
  if (usage) *usage = f != rankings_.end() ? f->second.slot_usage() : 0.0;
  return f != rankings_.end() && f->second.slots_full(cfg.busy_slot_fleet_usage);
}

std::vector<WorkerView> WorkerRegistry::candidates(std::string_view model) const {
  std::vector<WorkerView> out;
  candidates(model, out);
  return out;
}

void WorkerRegistry::candidates(std::string_view model, std::vector<WorkerView>& out) const {
  out.clear();
  std::lock_guard lk(mu_);
  const auto now = clock_.now();
  out.reserve(workers_.size());
  for (const auto& [id, e] : workers_) {
    if (e.info->url.empty() || !serves(*e.info, model)) continue;
    if (state(e, now) != HealthState::Ok) continue;
    view(e, out.emplace_back(), now);
  }
}

void WorkerRegistry::holders(std::string_view model, std::span<const OwnerOverlap> owners,
                             std::vector<CacheHolder>& out, Keep& keep) const {
  out.clear();
  keep.clear();
  std::lock_guard lk(mu_);
  const auto now = clock_.now();
  for (const OwnerOverlap& o : owners) {
    const auto it = workers_.find(o.owner.worker);
    if (it == workers_.end() || !serves(*it->second.info, model)) continue;
    out.push_back(CacheHolder{o, it->second.info.get(), state(it->second, now), it->second.draining});
    keep.push_back(it->second.info);
  }
}

std::vector<WorkerView> WorkerRegistry::all() const {
  std::lock_guard lk(mu_);
  const auto now = clock_.now();
  std::vector<WorkerView> out;
  for (const auto& [id, e] : workers_) view(e, out.emplace_back(), now);
  return out;
}

std::vector<std::string> WorkerRegistry::models() const {
  std::lock_guard lk(mu_);
  std::set<std::string> m;
  for (const auto& [id, e] : workers_) {
    if (!e.info->model.empty()) m.insert(e.info->model);
    for (const auto& l : e.info->lora_adapters) m.insert(l);
  }
  return {m.begin(), m.end()};
}

void WorkerRegistry::rebuild_lora_names() {
  std::map<std::string, std::string> names;  // adapter -> base model of the first worker (by id) serving it
  for (const auto& [id, e] : workers_)
    for (const auto& l : e.info->lora_adapters) names.emplace(l, e.info->model);
  std::atomic_store(&lora_names_, std::make_shared<const LoraNames>(names.begin(), names.end()));
  refresh_pd_roles();
}

void WorkerRegistry::refresh_pd_roles() {
  bool any = false;
  for (const auto& [id, e] : workers_) any = any || e.info->role != WorkerRole::Both;
  pd_roles_.store(any, std::memory_order_relaxed);
}

WorkerRegistry::EligibleFleet WorkerRegistry::inflight_overlaps(std::string_view model, std::span<const uint64_t> chain,
                                                                uint32_t beyond, const SchedulerConfig& cfg,
                                                                std::vector<OwnerOverlap>& out) {
  std::lock_guard lk(mu_);
  const auto now = clock_.now();
  end_ejections(now);  // as decide(): the same workers, the same mean
  const auto ranking = rankings_.find(model);
  if (chain.empty() || ranking == rankings_.end()) return {};
  for (const auto& [id, e] : workers_) {
    // A prefix is in computation only where a request is not answered yet;
    // an answered one's blocks are stored and in the index.
    if (e.pending_prefill_requests == 0 || e.info->dp_size > 1 || !serves(*e.info, model)) continue;
    if (state(e, now) != HealthState::Ok) continue;
    const std::optional<uint32_t> held = e.inflight_chained->try_held_prefix(chain, beyond);
    if (!held || *held == 0) continue;
    OwnerOverlap& o = out.emplace_back();
    o.owner = CacheOwner{id, 0};
    o.blocks = *held;
  }
  return {ranking->second.load_mean(cfg), ranking->second.eligible(cfg)};
}

std::optional<uint64_t> WorkerRegistry::kv_capacity(std::string_view model) const {
  constexpr uint64_t kUnknown = std::numeric_limits<uint64_t>::max();
  std::lock_guard lk(mu_);
  if (capacity_dirty_) {
    capacity_.clear();
    uint64_t floor = kUnknown;
    for (const auto& [id, e] : workers_) {
      const uint64_t cap = e.info->load.kv_total_blocks ? e.info->load.kv_total_blocks : kUnknown;
      floor = std::min(floor, cap);
      auto put = [&](const std::string& name) {
        if (name.empty()) return;
        auto [it, fresh] = capacity_.try_emplace(name, cap);
        if (!fresh) it->second = std::max(it->second, cap);
      };
      put(e.info->model);
      for (const auto& l : e.info->lora_adapters) put(l);
    }
    capacity_dirty_ = false;
    capacity_floor_.store(floor, std::memory_order_relaxed);
  }
  const auto it = capacity_.find(model);
  if (it == capacity_.end() || it->second == kUnknown) return std::nullopt;
  return it->second;
}

bool WorkerRegistry::exceeds_kv_capacity(std::string_view model, uint64_t blocks, uint64_t* capacity) const {
  if (blocks <= capacity_floor_.load(std::memory_order_relaxed)) return false;  // within every worker's
  const auto most = kv_capacity(model);
  if (most && capacity) *capacity = *most;
  return most && blocks > *most;
}

void WorkerRegistry::capacity_changed() {
  capacity_dirty_ = true;
  capacity_floor_.store(0, std::memory_order_relaxed);
}

namespace {
const std::pair<std::string, std::string>* find_lora(const std::vector<std::pair<std::string, std::string>>& names,
                                                     std::string_view model) {
  auto it = std::lower_bound(names.begin(), names.end(), model,
                             [](const auto& entry, std::string_view m) { return entry.first < m; });
  return it != names.end() && it->first == model ? &*it : nullptr;
}
}  // namespace

bool WorkerRegistry::is_lora_adapter(std::string_view model) const {
  const auto names = std::atomic_load(&lora_names_);
  if (names->empty()) return false;
  return find_lora(*names, model) != nullptr;
}

std::string WorkerRegistry::lora_base(std::string_view model) const {
  const auto names = std::atomic_load(&lora_names_);
  if (names->empty()) return {};
  const auto* entry = find_lora(*names, model);
  return entry ? entry->second : std::string();
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
  sync(id, it->second, clock_.now());
  if (!draining) capacity_may_be_free(it->second);
  return true;
}

void WorkerRegistry::total_inflight_kv(Entry& e) {
  const uint64_t prefix = e.inflight_prefixes.empty() ? 0 : e.inflight_prefixes.rbegin()->first;
  const uint64_t chained = static_cast<uint64_t>(std::max<int64_t>(0, e.inflight_chained_blocks));
  e.inflight_blocks = e.inflight_own_blocks + prefix + chained;
}

uint64_t WorkerRegistry::add_inflight_kv(Entry& e, const InflightKv& kv, uint64_t chained) {
  const uint64_t before = e.inflight_blocks;
  const uint64_t cached = kv.chain.empty() ? std::min(kv.cached_blocks, kv.blocks) : 0;
  e.inflight_own_blocks += kv.blocks - kv.chain.size() - cached;
  if (cached > 0) ++e.inflight_prefixes[cached];
  e.inflight_chained_blocks += static_cast<int64_t>(chained);
  total_inflight_kv(e);
  return e.inflight_blocks - std::min(e.inflight_blocks, before);
}

uint64_t WorkerRegistry::remove_inflight_kv(Entry& e, const InflightKv& kv, uint64_t chained) {
  const uint64_t before = e.inflight_blocks;
  const uint64_t cached = kv.chain.empty() ? std::min(kv.cached_blocks, kv.blocks) : 0;
  e.inflight_own_blocks -= std::min(e.inflight_own_blocks, kv.blocks - kv.chain.size() - cached);
  if (auto it = e.inflight_prefixes.find(cached); cached > 0 && it != e.inflight_prefixes.end())
    if (--it->second == 0) e.inflight_prefixes.erase(it);
  e.inflight_chained_blocks -= static_cast<int64_t>(chained);
  total_inflight_kv(e);
  return before - std::min(before, e.inflight_blocks);
}

uint64_t WorkerRegistry::count_chain(WorkerId id, InflightKv& kv) {
  kv.counted_in.reset();
  if (kv.chain.empty()) return 0;
  std::shared_ptr<InflightBlocks> table;
  uint64_t limit = 0;
  {
    std::lock_guard lk(mu_);
    if (auto it = workers_.find(id); it != workers_.end()) {
      table = it->second.inflight_chained;
      const uint64_t capacity = it->second.info ? it->second.info->load.kv_total_blocks : 0;
      limit = capacity ? kMaxInflightChainFactor * capacity : kMaxInflightChainUnknown;
    }
  }
  const std::optional<uint64_t> added =
      table && kv.chain.size() <= kv.blocks ? table->add(kv.chain, limit) : std::nullopt;
  if (!added) {
    kv.chain.clear();  // counted whole
    return 0;
  }
  kv.counted_in = std::move(table);
  return *added;
}

TtftSample WorkerRegistry::begin_request(WorkerId id, InflightKv& kv, uint64_t prefill_tokens) {
  inflight_generation_.fetch_add(1, std::memory_order_relaxed);  // replica sync publishes on change
  const uint64_t chained = count_chain(id, kv);
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end() || (kv.counted_in && kv.counted_in != it->second.inflight_chained)) {
    // Gone (or replaced) since its chain was counted: counted nowhere, as
    // end_request() will find.
    if (kv.counted_in) kv.counted_in->remove(kv.chain);
    kv.counted_in.reset();
    kv.chain.clear();
    return {};
  }
  // The TTFT model's features as the scheduler saw them (view()'s predicted load).
  const auto& e = it->second;
  const uint32_t running = std::max(e.info ? e.info->load.request_active_slots : 0u, e.inflight_requests);
  TtftSample sample{TtftFeatures{static_cast<double>(prefill_tokens), static_cast<double>(e.pending_prefill_tokens),
                                 static_cast<double>(e.pending_prefill_requests), static_cast<double>(running)},
                    clock_.now()};
  it->second.pending_prefill_requests += 1;
  it->second.inflight_requests += 1;
  fade_parked(it->second, clock_.now());
  // The cached prefix it takes up again leaves the parked KV, but for the
  // blocks that requests in flight there already hold (its chain counted:
  // the keys it did not add), which were never parked. Taken back from this
  // router's parked KV first, then from the other replicas'.
  const uint64_t held = kv.counted_in ? kv.chain.size() - std::min<uint64_t>(kv.chain.size(), chained) : 0;
  double resumed = static_cast<double>(kv.resumed_blocks - std::min(kv.resumed_blocks, held));
  for (double* p : {&it->second.parked_blocks, &it->second.remote_parked_blocks}) {
    const double taken = std::min(*p, resumed);
    *p -= taken;
    resumed -= taken;
  }
  add_inflight_kv(it->second, kv, chained);
  it->second.pending_prefill_tokens += prefill_tokens;
  sync(id, it->second, clock_.now());
  return sample;
}

void WorkerRegistry::first_byte(WorkerId id, uint64_t prefill_tokens, const TtftSample* sample) {
  inflight_generation_.fetch_add(1, std::memory_order_relaxed);  // replica sync publishes on change
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
  sync(id, it->second, clock_.now());
}

TtftStats WorkerRegistry::ttft_stats() const {
  std::lock_guard lk(mu_);
  return ttft_stats_;
}

void WorkerRegistry::end_request(WorkerId id, const InflightKv& kv, uint64_t prefill_tokens, bool prefilling,
                                 TimePoint started) {
  inflight_generation_.fetch_add(1, std::memory_order_relaxed);  // replica sync publishes on change
  const uint64_t unchained = kv.counted_in ? kv.counted_in->remove(kv.chain) : 0;  // outside mu_
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;  // expired meanwhile: nothing to release
  it->second.inflight_requests -= std::min<uint32_t>(it->second.inflight_requests, 1);
  // The blocks that left the in-flight KV: a prefix other requests still
  // share stays (on the worker and in its next report).
  const bool same_table = kv.counted_in == it->second.inflight_chained;  // else counted in a replaced entry
  const uint64_t freed = remove_inflight_kv(it->second, kv, same_table ? unchained : 0);
  Entry& e = it->second;
  if (!prefilling && parked_kv_seconds_ > 0) {  // answered: its prompt is in the engine's cache
    fade_parked(e, clock_.now());
    // What it leaves parked is what no request in flight there still holds:
    // with its chain counted, the blocks that left the in-flight KV (a prefix
    // shared by a burst parks once, when the last of them ends); counted
    // whole, its own blocks.
    const uint64_t parked = same_table && kv.counted_in ? freed : kv.blocks;
    // The engine holds no more than its capacity: past it, LRU has evicted the oldest.
    e.parked_blocks = parked_room(e, e.parked_blocks + static_cast<double>(parked), e.remote_parked_blocks);
  }
  e.pending_prefill_tokens -= std::min(e.pending_prefill_tokens, prefill_tokens);
  if (prefilling) e.pending_prefill_requests -= std::min<uint32_t>(e.pending_prefill_requests, 1);
  if (e.has_load && started != TimePoint{} && started <= e.last_load) {
    e.ended_requests += 1;
    e.ended_blocks += freed;
  }
  sync(id, e, clock_.now());
  capacity_may_be_free(e);
}

}  // namespace kvroute

namespace kvroute {

// --- other router replicas' in-flight work -----------------------------------
void WorkerRegistry::set_remote_inflight(WorkerId id, uint32_t requests, uint64_t blocks, uint64_t prefill_tokens,
                                         double parked_blocks) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  const bool fewer = requests < it->second.remote_requests || blocks < it->second.remote_blocks;
  it->second.remote_requests = requests;
  it->second.remote_blocks = blocks;
  it->second.remote_prefill_tokens = prefill_tokens;
  const TimePoint now = clock_.now();
  fade_parked(it->second, now);  // this router's own to now; the others' is replaced
  // No engine holds more than its capacity: a bound on what a peer says, with this router's own.
  const double remote = parked_kv_seconds_ > 0 && std::isfinite(parked_blocks) ? std::max(0.0, parked_blocks) : 0.0;
  it->second.remote_parked_blocks = parked_room(it->second, remote, it->second.parked_blocks);
  sync(id, it->second, now);  // remote counts are in the rankings' predicted load and parked KV too
  if (fewer) capacity_may_be_free(it->second);
}

}  // namespace kvroute
