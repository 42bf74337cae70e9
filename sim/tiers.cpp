#include "sim/tiers.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace kvroute::sim {

const char* to_string(Eviction e) { return e == Eviction::Lru ? "lru" : "workload_aware"; }

bool parse_eviction(const std::string& s, Eviction& out) {
  if (s == "lru") out = Eviction::Lru;
  else if (s == "workload_aware" || s == "wa") out = Eviction::WorkloadAware;
  else return false;
  return true;
}

namespace {

uint8_t bucket(uint64_t turn) { return turn <= 1 ? 0 : turn == 2 ? 1 : turn <= 5 ? 2 : 3; }

}  // namespace

std::vector<uint8_t> request_categories(const std::vector<SimRequest>& w) {
  std::unordered_map<uint64_t, uint32_t> ends;  // block id -> earlier requests whose prompt ends there
  std::vector<uint8_t> out;
  out.reserve(w.size());
  for (const auto& r : w) {
    uint64_t turn = 1;
    for (uint64_t id : r.ids)
      if (auto it = ends.find(id); it != ends.end()) turn += it->second;
    out.push_back(bucket(turn));
    if (!r.ids.empty()) ++ends[r.ids.back()];
  }
  return out;
}

double ReuseProfile::reuse_probability(double idle_ms) const {
  if (idle_ms > life_ms || p_reuse <= 0) return 0;
  if (p_reuse >= 1) return 1;
  const double q = p_reuse * std::exp(-idle_ms / std::max(mean_ms, 1e-9));
  return q / (q + 1 - p_reuse);
}

ReuseProfiles fit_reuse_profiles(const std::vector<SimRequest>& w) {
  const auto cats = request_categories(w);
  struct Last {
    double t = 0;
    uint8_t category = 0;
  };
  std::unordered_map<uint64_t, Last> last;
  std::array<uint64_t, kCategories> accesses{};
  std::array<std::vector<double>, kCategories> intervals;
  for (size_t i = 0; i < w.size(); ++i) {
    const auto& r = w[i];
    for (uint64_t id : r.ids) {
      auto [it, fresh] = last.try_emplace(id, Last{r.t_ms, cats[i]});
      if (!fresh) {
        intervals[it->second.category].push_back(r.t_ms - it->second.t);
        it->second = Last{r.t_ms, cats[i]};
      }
      ++accesses[cats[i]];
    }
  }
  ReuseProfiles out;
  for (size_t c = 0; c < kCategories; ++c) {
    auto& v = intervals[c];
    ReuseProfile& p = out[c];
    if (accesses[c] == 0 || v.empty()) continue;  // never reused: probability 0 at any age
    p.p_reuse = double(v.size()) / double(accesses[c]);
    double sum = 0;
    for (double x : v) sum += x;
    p.mean_ms = std::max(sum / double(v.size()), 1.0);
    std::sort(v.begin(), v.end());
    p.life_ms = v[std::min(v.size() - 1, static_cast<size_t>(0.99 * double(v.size())))];
  }
  return out;
}

TierCache::TierCache(uint64_t capacity_blocks, Eviction e, const ReuseProfiles* profiles)
    : capacity_(capacity_blocks), eviction_(e), profiles_(profiles) {
  assert(e == Eviction::Lru || profiles);
}

void TierCache::insert(const Block& b, double order_ms) {
  Entry e{b, {order_ms, seq_++}};
  queues_[queue_of(b)].insert({e.key, b.hash});
  blocks_[b.hash] = e;
}

void TierCache::erase(std::unordered_map<uint64_t, Entry>::iterator it) {
  queues_[queue_of(it->second.block)].erase({it->second.key, it->first});
  blocks_.erase(it);
}

void TierCache::put(const Block& b, double now_ms, std::vector<Block>& evicted) {
  if (capacity_ == 0) return;
  if (auto it = blocks_.find(b.hash); it != blocks_.end()) erase(it);
  while (blocks_.size() >= capacity_) {
    const Block v = victim(now_ms);
    evicted.push_back(v);
    erase(blocks_.find(v.hash));
  }
  // LRU orders by the time stored or loaded; workload-aware by last use.
  insert(b, eviction_ == Eviction::Lru ? now_ms : b.last_ms);
}

void TierCache::touch(uint64_t hash, double now_ms, uint8_t category) {
  auto it = blocks_.find(hash);
  if (it == blocks_.end()) return;
  Block b = it->second.block;
  b.last_ms = now_ms;
  b.category = category;
  erase(it);
  insert(b, now_ms);
}

TierCache::Block TierCache::victim(double now_ms) const {
  assert(!blocks_.empty());
  if (eviction_ == Eviction::Lru) return blocks_.at(queues_[0].begin()->second).block;
  // The paper's priority (ReuseProb_w(t, life), -offset), compared in that
  // order: the lowest is evicted, so among equally likely blocks the deeper
  // one goes first; then the older.
  const Block* best = nullptr;
  double best_p = 0;
  std::pair<double, uint64_t> best_key{};
  for (size_t c = 0; c < kCategories; ++c) {
    if (queues_[c].empty()) continue;
    const Entry& e = blocks_.at(queues_[c].begin()->second);
    const double p = (*profiles_)[c].reuse_probability(now_ms - e.block.last_ms);
    const bool better = !best || p < best_p ||
                        (p == best_p && (e.block.depth > best->depth ||
                                         (e.block.depth == best->depth && e.key < best_key)));
    if (better) best = &e.block, best_p = p, best_key = e.key;
  }
  return *best;
}

double load_ms(uint64_t tokens, double kv_bytes_per_token, double gbytes_per_s) {
  return double(tokens) * kv_bytes_per_token / (gbytes_per_s * 1e9) * 1000.0;
}

SharedBandwidth::SharedBandwidth(double total_bytes_per_ms, double link_bytes_per_ms, uint32_t workers)
    : total_(total_bytes_per_ms), link_(link_bytes_per_ms), queued_(workers), busy_(workers, 0) {}

double SharedBandwidth::rate() const {
  return active_.empty() ? link_ : std::min(link_, total_ / double(active_.size()));
}

void SharedBandwidth::advance(double now) {
  if (now <= last_) return;
  const double moved = rate() * (now - last_);
  for (Transfer& t : active_) t.remaining = std::max(0.0, t.remaining - moved);
  last_ = now;
}

void SharedBandwidth::start(uint32_t w, size_t id, double bytes, double now) {
  advance(now);
  if (busy_[w]) {
    queued_[w].push_back(Transfer{w, id, bytes});
    return;
  }
  busy_[w] = 1;
  active_.push_back(Transfer{w, id, bytes});
}

double SharedBandwidth::next_done() const {
  if (active_.empty()) return std::numeric_limits<double>::infinity();
  double least = active_.front().remaining;
  for (const Transfer& t : active_) least = std::min(least, t.remaining);
  return last_ + least / rate();
}

size_t SharedBandwidth::finish(double now) {
  advance(now);
  // The load with the least left (ties: the earliest started) ends now.
  size_t at = 0;
  for (size_t i = 1; i < active_.size(); ++i)
    if (active_[i].remaining < active_[at].remaining) at = i;
  const Transfer done = active_[at];
  active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(at));
  busy_[done.worker] = 0;
  auto& q = queued_[done.worker];
  if (!q.empty()) {
    busy_[done.worker] = 1;
    active_.push_back(q.front());
    q.erase(q.begin());
  }
  return done.id;
}

}  // namespace kvroute::sim
