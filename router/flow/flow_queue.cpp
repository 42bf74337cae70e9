// The admission queue's bookkeeping (flow_queue.h).
#include "router/flow/flow_queue.h"

#include <algorithm>
#include <cassert>

namespace kvroute::flow {

double& FlowQueue::vtime(uint32_t tenant) {
  if (tenant >= vtime_.size()) vtime_.resize(tenant + 1, vclock_);
  return vtime_[tenant];
}

uint64_t FlowQueue::tenant_count(uint32_t band, uint32_t tenant) const {
  const auto it = band_tenant_count_.find({band, tenant});
  return it == band_tenant_count_.end() ? 0 : it->second;
}

void FlowQueue::insert(const std::shared_ptr<Waiter>& w) {
  w->seq = ++seq_;
  w->state = Waiter::State::Queued;
  Model& m = models_[w->model];
  m.bands[w->band].tenants[w->tenant].emplace(w->seq, w);
  ++m.bands[w->band].count;
  ++m.count;
  if (w->band >= band_count_.size()) band_count_.resize(w->band + 1, 0);
  ++band_count_[w->band];
  ++band_tenant_count_[{w->band, w->tenant}];
  // A tenant that starts waiting catches up to the virtual clock: time it
  // spent idle is no credit against tenants that kept waiting.
  if (tenant_count_[w->tenant]++ == 0) vtime(w->tenant) = std::max(vtime(w->tenant), vclock_);
  ++count_;
  waiting_.store(count_, std::memory_order_relaxed);
  bytes_ += w->bytes;
}

void FlowQueue::remove(Waiter& w) {
  const auto mit = models_.find(w.model);
  assert(mit != models_.end());
  Model& m = mit->second;
  Band& b = m.bands[w.band];
  auto tit = b.tenants.find(w.tenant);
  tit->second.erase(w.seq);
  if (tit->second.empty()) b.tenants.erase(tit);
  --b.count;
  if (b.count == 0) m.bands.erase(w.band);
  --m.count;
  --band_count_[w.band];
  if (--band_tenant_count_[{w.band, w.tenant}] == 0) band_tenant_count_.erase({w.band, w.tenant});
  if (--tenant_count_[w.tenant] == 0) tenant_count_.erase(w.tenant);
  --count_;
  waiting_.store(count_, std::memory_order_relaxed);
  bytes_ -= w.bytes;
  if (w.state == Waiter::State::Trying || w.state == Waiter::State::Handed) m.trying = false;
  w.state = Waiter::State::Gone;
  if (m.count == 0 && !m.trying) models_.erase(mit);
}

Waiter* FlowQueue::head(Model& m) {
  for (auto& [band, b] : m.bands) {
    Waiter* best = nullptr;
    double best_v = 0;
    for (auto& [tenant, waiters] : b.tenants) {
      Waiter* first = waiters.begin()->second.get();
      const double v = vtime(tenant);
      if (!best || v < best_v || (v == best_v && first->seq < best->seq)) {
        best = first;
        best_v = v;
      }
    }
    if (best) return best;
  }
  return nullptr;
}

void FlowQueue::start_trial(Model& m) {
  if (m.trying) {
    m.again = true;
    return;
  }
  Waiter* w = head(m);
  if (!w) return;
  m.trying = true;
  m.again = false;
  if (w->take && w->take()) {
    w->state = Waiter::State::Handed;
    return;
  }
  w->state = Waiter::State::Trying;
  w->wake(Wake::Try);
}

void FlowQueue::admitted(Waiter& w) {
  double& v = vtime(w.tenant);
  vclock_ = std::max(vclock_, v);
  v += 1.0 / std::max<uint32_t>(w.weight, 1);
  remove(w);  // clears the model's trial; may erase the model (w, the caller's, keeps its name)
  const auto again = models_.find(w.model);
  if (again != models_.end()) start_trial(again->second);  // more slots may be free
}

Waiter* FlowQueue::victim(const Waiter& w, uint32_t only_band, bool any_band, const std::vector<Waiter*>& taken) {
  // Bands from the lowest priority up to the newcomer's own.
  for (auto bit = band_count_.size(); bit-- > 0;) {
    const uint32_t band = static_cast<uint32_t>(bit);
    if (band < w.band) break;
    if (!any_band && band != only_band) continue;
    if (band_count_[band] == 0) continue;
    // The tenant most over its weighted share of this band (count/weight).
    double worst = -1;
    uint32_t worst_tenant = 0;
    for (const auto& [key, n] : band_tenant_count_) {
      if (key.first != band) continue;
      uint32_t weight = 1;
      // The tenant's weight: from any of its waiters (all carry it).
      for (auto& [name, m] : models_) {
        const auto b = m.bands.find(band);
        if (b == m.bands.end()) continue;
        const auto t = b->second.tenants.find(key.second);
        if (t != b->second.tenants.end()) {
          weight = t->second.begin()->second->weight;
          break;
        }
      }
      const double share = static_cast<double>(n) / std::max<uint32_t>(weight, 1);
      if (share > worst) {
        worst = share;
        worst_tenant = key.second;
      }
    }
    if (worst < 0) continue;
    if (band == w.band) {
      // The newcomer's own band: only a tenant over the newcomer's share
      // (after it joined) gives way; otherwise the newcomer is refused.
      const double mine = static_cast<double>(tenant_count(band, w.tenant) + 1) / std::max<uint32_t>(w.weight, 1);
      if (worst_tenant == w.tenant || worst <= mine) continue;
    }
    // Its newest waiter not in a trial and not already taken.
    Waiter* newest = nullptr;
    for (auto& [name, m] : models_) {
      const auto b = m.bands.find(band);
      if (b == m.bands.end()) continue;
      const auto t = b->second.tenants.find(worst_tenant);
      if (t == b->second.tenants.end()) continue;
      for (auto it = t->second.rbegin(); it != t->second.rend(); ++it) {
        Waiter* c = it->second.get();
        if (c->state != Waiter::State::Queued) continue;
        if (std::find(taken.begin(), taken.end(), c) != taken.end()) continue;
        if (!newest || c->seq > newest->seq) newest = c;
        break;
      }
    }
    if (newest) return newest;
  }
  return nullptr;
}

Enter FlowQueue::enter(const std::shared_ptr<Waiter>& w, const QueueLimits& limits, uint64_t* position) {
  std::lock_guard lock(mu_);
  if (stopped_ || limits.max_count == 0) return Enter::Full;
  const uint64_t band_max = w->band < limits.band_max.size() ? limits.band_max[w->band] : 0;
  const uint64_t band_now = w->band < band_count_.size() ? band_count_[w->band] : 0;
  // Shed until the newcomer fits: collect the victims first, change nothing
  // unless it then fits.
  std::vector<Waiter*> victims;
  uint64_t count = count_, bytes = bytes_, in_band = band_now;
  const auto fits = [&] {
    return count < limits.max_count && (limits.max_bytes == 0 || bytes + w->bytes <= limits.max_bytes) &&
           (band_max == 0 || in_band < band_max);
  };
  if (limits.max_bytes && w->bytes > limits.max_bytes) return Enter::Full;
  while (!fits()) {
    const bool band_full = band_max != 0 && in_band >= band_max;
    Waiter* v = victim(*w, w->band, /*any_band=*/!band_full, victims);
    if (!v) return Enter::Full;
    victims.push_back(v);
    --count;
    bytes -= v->bytes;
    if (v->band == w->band) --in_band;
    if (victims.size() > 4096) return Enter::Full;  // a bound on the work one arrival may cause
  }
  for (Waiter* v : victims) {
    remove(*v);
    v->wake(Wake::Shed);
  }
  insert(w);
  if (position) {
    const Model& m = models_[w->model];
    uint64_t ahead = 0;
    for (const auto& [band, b] : m.bands) ahead += band <= w->band ? b.count : 0;
    *position = ahead - 1;
  }
  return Enter::Queued;
}

void FlowQueue::trial_done(Waiter& w, bool admitted) {
  std::lock_guard lock(mu_);
  if (w.state != Waiter::State::Trying) return;  // left, shed or stopped meanwhile
  const auto mit = models_.find(w.model);
  Model& m = mit->second;
  if (admitted) {
    this->admitted(w);
    return;
  }
  w.state = Waiter::State::Queued;
  m.trying = false;
  if (m.again) start_trial(m);
}

std::optional<Wake> FlowQueue::handover_done(Waiter& w, bool admitted) {
  std::lock_guard lock(mu_);
  assert(w.state == Waiter::State::Handed);
  if (admitted) {
    this->admitted(w);  // admitted even if it gave up or the queue stopped meanwhile: it has its worker
    return Wake::Admitted;
  }
  Model& m = models_.find(w.model)->second;
  if (w.stop_pending || w.gave_up) {
    const Wake k = w.stop_pending ? Wake::Stop : Wake::Left;
    remove(w);
    // Its trial counts as failed: an event it absorbed goes to the next head.
    const auto mit = models_.find(w.model);
    if (mit != models_.end() && mit->second.again && !stopped_) start_trial(mit->second);
    return k;
  }
  w.state = Waiter::State::Queued;
  m.trying = false;
  if (m.again) start_trial(m);
  return std::nullopt;
}

bool FlowQueue::leave(Waiter& w) {
  std::lock_guard lock(mu_);
  if (w.state == Waiter::State::Handed) {
    w.gave_up = true;  // handover_done() tells it the outcome
    return false;
  }
  if (w.state != Waiter::State::Queued && w.state != Waiter::State::Trying) return false;
  const bool was_trying = w.state == Waiter::State::Trying;
  const std::string model = w.model;
  remove(w);
  if (was_trying) {
    // Its trial counts as failed: an event it absorbed goes to the next head.
    const auto mit = models_.find(model);
    if (mit != models_.end() && mit->second.again) start_trial(mit->second);
  }
  return true;
}

void FlowQueue::notify() {
  if (waiting() == 0) return;  // the common case: nobody waits
  std::lock_guard lock(mu_);
  for (auto& [name, m] : models_) start_trial(m);
}

void FlowQueue::notify(std::string_view model) {
  if (waiting() == 0) return;  // the common case: nobody waits
  std::lock_guard lock(mu_);
  const auto it = models_.find(model);
  if (it != models_.end()) start_trial(it->second);
  // Requests that name no model are served by any worker.
  if (const auto any = models_.find(std::string_view{}); any != models_.end() && !model.empty())
    start_trial(any->second);
}

void FlowQueue::stop_all() {
  std::lock_guard lock(mu_);
  stopped_ = true;
  std::vector<std::shared_ptr<Waiter>> all;
  for (auto& [name, m] : models_)
    for (auto& [band, b] : m.bands)
      for (auto& [tenant, waiters] : b.tenants)
        for (auto& [seq, w] : waiters) all.push_back(w);
  for (auto& w : all) {
    if (w->state == Waiter::State::Handed) {
      w->stop_pending = true;  // its trial runs on another thread: handover_done() tells it
      continue;
    }
    remove(*w);
    w->wake(Wake::Stop);
  }
}

uint64_t FlowQueue::ahead(std::string_view model, uint32_t band) const {
  std::lock_guard lock(mu_);
  const auto it = models_.find(model);
  if (it == models_.end()) return 0;
  uint64_t n = 0;
  for (const auto& [b, q] : it->second.bands)
    if (b <= band) n += q.count;
  return n;
}

std::optional<int64_t> FlowQueue::oldest_entry(std::string_view model, uint32_t band) const {
  std::lock_guard lock(mu_);
  const auto it = models_.find(model);
  if (it == models_.end()) return std::nullopt;
  std::optional<int64_t> oldest;
  for (const auto& [b, q] : it->second.bands) {
    if (b > band) break;
    // A tenant's waiters are in arrival order: its first entered first.
    for (const auto& [tenant, waiters] : q.tenants) {
      const int64_t e = waiters.begin()->second->entered;
      if (!oldest || e < *oldest) oldest = e;
    }
  }
  return oldest;
}

bool FlowQueue::empty() const {
  std::lock_guard lock(mu_);
  return count_ == 0;
}

QueueSnapshot FlowQueue::snapshot() const {
  std::lock_guard lock(mu_);
  QueueSnapshot s;
  s.count = count_;
  s.bytes = bytes_;
  s.by_band = band_count_;
  s.by_tenant = tenant_count_;
  s.oldest_by_band.resize(band_count_.size());
  // A tenant's waiters of a band and model are in arrival order: its first is its oldest there.
  for (const auto& [name, m] : models_)
    for (const auto& [band, b] : m.bands)
      for (const auto& [tenant, waiters] : b.tenants) {
        const int64_t e = waiters.begin()->second->entered;
        auto& ob = s.oldest_by_band[band];
        if (!ob || e < *ob) ob = e;
        const auto [it, fresh] = s.oldest_by_tenant.try_emplace(tenant, e);
        if (!fresh && e < it->second) it->second = e;
      }
  return s;
}

}  // namespace kvroute::flow
