#include "scheduler/ranked_fleet.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvroute {

namespace {

double ratio(double num, double den) { return den > 0 ? num / den : 0.0; }

// A worker offered to the ranking, with what its score needs.
struct Offer {
  double cost;
  uint64_t tie;
  uint32_t slot;
  uint32_t owner;  // index into the owners span; ~0u = holds none of the prompt
  double cached;
  bool operator<(const Offer& o) const { return cost != o.cost ? cost < o.cost : tie < o.tie; }
};

// One distinct cached depth among the request's eligible owners. The first
// kSmallGroup members are remembered (a group with no more is scored member
// by member).
struct Group {
  double cached;
  uint32_t count;
  std::array<uint32_t, RankedFleet::kSmallGroup> members;
};

bool same_overlap(const OwnerOverlap& a, uint32_t blocks, const uint64_t tiers[2]) {
  uint64_t t[2];
  std::memcpy(t, a.by_tier.data(), sizeof t);
  return a.blocks == blocks && t[0] == tiers[0] && t[1] == tiers[1];
}

// Per-thread scratch of decide(): slot-indexed marks, valid when stamp == epoch
// (no clearing per decision), and the decision's small lists.
struct Scratch {
  std::vector<uint32_t> stamp, owner_at;
  std::vector<uint16_t> group;
  std::vector<uint32_t> overflow;
  std::vector<Group> groups;
  std::vector<Offer> top;
  uint32_t epoch = 0;

  void begin(size_t slots) {
    if (stamp.size() < slots) {
      stamp.resize(slots, 0);
      owner_at.resize(slots);
      group.resize(slots);
    }
    if (++epoch == 0) {  // wrapped: forget every mark
      std::fill(stamp.begin(), stamp.end(), 0);
      epoch = 1;
    }
    groups.clear();
    top.clear();
  }
};
thread_local Scratch scratch;

constexpr uint16_t kOverflowGroup = 0xffff;  // too many distinct depths: scored one by one
constexpr size_t kMaxGroups = 1024;

// Keeps the `limit` best offers, sorted.
void offer(std::vector<Offer>& top, size_t limit, const Offer& o) {
  if (top.size() == limit) {
    if (!(o < top.back())) return;
    top.pop_back();
  }
  top.insert(std::upper_bound(top.begin(), top.end(), o), o);
}

}  // namespace

void FleetDecision::reset() {
  ranked.clear();
  alpha = load_mean = load_std = 0;
  eligible = best_overlap_blocks = scored = groups = 0;
}

bool RankedFleet::supports(const SchedulerConfig& cfg, size_t rank_limit) {
  // scheduler.cost = predicted_ttft prices each worker by its own TTFT model
  // (schedule()): not the weighted terms the fleet is ranked by.
  return cfg.temperature <= 0 && rank_limit > 0 && cfg.pending_prefill_weight >= 0 && cfg.cost != "predicted_ttft";
}

RankedFleet::Params RankedFleet::params_of(const SchedulerConfig& cfg) {
  Params p;
  p.alpha[0] = cfg.alpha_balanced;
  p.alpha[1] = cfg.alpha_imbalanced;
  p.gamma = cfg.gamma;
  p.delta = cfg.delta;
  p.ppw = cfg.pending_prefill_weight;
  p.busy_kv = cfg.busy_kv_usage;
  p.busy_slot = cfg.busy_slot_usage;
  p.busy_waiting = cfg.busy_waiting_requests;
  return p;
}

double RankedFleet::key_of(const Slot& s, int a) const {
  const double queue =
      max_waiting_ > 0 ? static_cast<double>(s.st.load.num_requests_waiting) / max_waiting_ : 0.0;
  return params_.alpha[a] * s.load_ratio + params_.gamma * s.slot_ratio + params_.delta * queue +
         (1 - params_.alpha[a]) * params_.ppw * static_cast<double>(s.st.pending_prefill_tokens) / isl_ref_;
}

void RankedFleet::add_waiting(uint32_t w) {
  ++waiting_[w];
  if (w > max_waiting_) {
    max_waiting_ = w;
    keys_stale_ |= params_.delta != 0;  // every key's queue term changed
  }
}

void RankedFleet::remove_waiting(uint32_t w) {
  auto it = waiting_.find(w);
  if (it == waiting_.end()) return;
  if (--it->second == 0) waiting_.erase(it);
  const uint32_t max = waiting_.empty() ? 0 : waiting_.rbegin()->first;
  if (max != max_waiting_) {
    max_waiting_ = max;
    keys_stale_ |= params_.delta != 0;
  }
}

void RankedFleet::add_eligible(uint32_t slot) {
  Slot& s = slots_[slot];
  s.eligible = true;
  eligible_flag_[slot] = 1;
  ++eligible_;
  sum_lr_ += s.load_ratio;
  sum_lr2_ += s.load_ratio * s.load_ratio;
  pending_max_ = std::max(pending_max_, s.st.pending_prefill_tokens);
  for (int a = 0; a < 2; ++a) s.at[a] = order_[a].insert(Key{key_of(s, a), slot}).first;
  add_waiting(s.st.load.num_requests_waiting);
}

void RankedFleet::remove_eligible(uint32_t slot) {
  Slot& s = slots_[slot];
  s.eligible = false;
  eligible_flag_[slot] = 0;
  --eligible_;
  sum_lr_ -= s.load_ratio;
  sum_lr2_ -= s.load_ratio * s.load_ratio;
  for (int a = 0; a < 2; ++a) order_[a].erase(s.at[a]);
  remove_waiting(s.st.load.num_requests_waiting);
}

void RankedFleet::exact_sums() {
  sum_lr_ = sum_lr2_ = 0;
  for (const auto& s : slots_)
    if (s.live && s.eligible) {
      sum_lr_ += s.load_ratio;
      sum_lr2_ += s.load_ratio * s.load_ratio;
    }
  updates_ = 0;
}

void RankedFleet::rebuild() {
  for (auto& o : order_) o.clear();
  waiting_.clear();
  eligible_ = 0;
  pending_max_ = 0;
  eligible_flag_.assign(slots_.size(), 0);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    s.eligible = s.live && exclusion_of(s.st.load, s.st.draining, cfg_) == Exclusion::None;
    eligible_flag_[i] = s.eligible;
    if (!s.eligible) continue;
    ++eligible_;
    ++waiting_[s.st.load.num_requests_waiting];
    pending_max_ = std::max(pending_max_, s.st.pending_prefill_tokens);
  }
  max_waiting_ = waiting_.empty() ? 0 : waiting_.rbegin()->first;
  keys_stale_ = false;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.eligible) continue;
    for (int a = 0; a < 2; ++a) s.at[a] = order_[a].insert(Key{key_of(s, a), i}).first;
  }
  exact_sums();
}

void RankedFleet::upsert(WorkerId id, const FleetWorkerState& st) {
  uint32_t slot;
  if (const uint32_t* at = index_.find(id.value)) {
    slot = *at;
    if (slots_[slot].eligible) remove_eligible(slot);
  } else {
    if (free_.empty()) {
      slot = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
      eligible_flag_.push_back(0);
    } else {
      slot = free_.back();
      free_.pop_back();
    }
    index_.put(id.value, slot);
    ++live_;
  }
  Slot& s = slots_[slot];
  s.id = id;
  s.live = true;
  s.st = st;
  s.load_ratio = ratio(static_cast<double>(st.load.kv_active_blocks), static_cast<double>(st.load.kv_total_blocks));
  s.slot_ratio = ratio(st.load.request_active_slots, st.load.request_total_slots);
  if (exclusion_of(st.load, st.draining, cfg_) == Exclusion::None) add_eligible(slot);
  if (keys_stale_) rebuild();
  else if (++updates_ >= kExactEvery) exact_sums();
}

bool RankedFleet::erase(WorkerId id) {
  const uint32_t* at = index_.find(id.value);
  if (!at) return false;
  const uint32_t slot = *at;
  if (slots_[slot].eligible) remove_eligible(slot);
  slots_[slot] = Slot{};
  index_.erase(id.value);
  free_.push_back(slot);
  --live_;
  if (keys_stale_) rebuild();
  return true;
}

void RankedFleet::decide(std::span<const OwnerOverlap> owners, uint32_t isl_tokens, uint32_t block_size,
                         const SchedulerConfig& cfg, Random& random, size_t rank_limit, FleetDecision& out) {
  out.reset();
  if (const Params p = params_of(cfg); !(p == params_)) {
    params_ = p;
    cfg_ = cfg;
    rebuild();
  }
  // The order's pending term is priced at a typical prompt length: when the
  // prompts' running mean drifts 2x away from it, re-price (rebuild).
  isl_mean_ = isl_mean_ == 0 ? std::max<uint32_t>(isl_tokens, 1) : 0.99 * isl_mean_ + 0.01 * std::max<uint32_t>(isl_tokens, 1);
  if (params_.ppw > 0 && (isl_mean_ > 2 * isl_ref_ || isl_mean_ < isl_ref_ / 2)) {
    isl_ref_ = std::exp2(std::round(std::log2(isl_mean_)));
    rebuild();
  }
  out.eligible = eligible_;
  if (eligible_ == 0) return;
  // The same draw as schedule(): one, even when nobody is eligible there too.
  const uint64_t draw = random.below(~0ull);
  const double n = eligible_;
  out.load_mean = sum_lr_ / n;
  out.load_std = std::sqrt(std::max(0.0, sum_lr2_ / n - out.load_mean * out.load_mean));
  const int a = out.load_std > cfg.balance_threshold * out.load_mean ? 1 : 0;
  out.alpha = params_.alpha[a];
  const double alpha = out.alpha;
  const double isl = std::max<uint32_t>(isl_tokens, 1);
  const size_t limit = std::min<size_t>(rank_limit, eligible_);

  Scratch& sc = scratch;
  sc.begin(slots_.size());
  // 1. Owners -> slots, the best dp rank per worker (most blocks, then the
  //    lowest rank: the reference's rule), grouped by cached tokens.
  auto cached_of = [&](const OwnerOverlap& o) {
    return std::min<double>(tier_weighted_blocks(o.blocks, o.by_tier, cfg) * block_size, isl_tokens);
  };
  // One pass: owners -> eligible slots (several dp ranks of one worker keep
  // the best), each joined to its group. Owners come in runs of equal
  // overlap, so the previous owner's group is tried first.
  uint32_t ntouched = 0;  // distinct eligible workers among the owners
  uint32_t best_blocks = 0;
  uint32_t* const stamp = sc.stamp.data();
  uint32_t* const owner_at = sc.owner_at.data();
  uint16_t* const group = sc.group.data();
  const uint8_t* const eligible = eligible_flag_.data();
  const uint32_t epoch = sc.epoch;
  static_assert(sizeof(OwnerOverlap::by_tier) == 2 * sizeof(uint64_t));
  uint32_t last_blocks = ~0u;
  uint64_t last_tiers[2] = {0, 0};
  uint16_t last_group = kOverflowGroup;
  auto group_of = [&](const OwnerOverlap& o) {
    if (same_overlap(o, last_blocks, last_tiers)) return last_group;
    last_blocks = o.blocks;
    std::memcpy(last_tiers, o.by_tier.data(), sizeof last_tiers);
    const double cached = cached_of(o);
    for (size_t k = sc.groups.size(); k-- > 0;)
      if (sc.groups[k].cached == cached) return last_group = static_cast<uint16_t>(k);
    if (sc.groups.size() == kMaxGroups) return last_group = kOverflowGroup;
    sc.groups.push_back(Group{cached, 0, {}});
    return last_group = static_cast<uint16_t>(sc.groups.size() - 1);
  };
  std::vector<uint32_t>& overflow = sc.overflow;  // members of no group: scored one by one
  overflow.clear();
  auto join = [&](uint32_t s, uint32_t i, bool moving) {
    owner_at[s] = i;
    const uint16_t old = group[s];
    const uint16_t g = group[s] = group_of(owners[i]);
    best_blocks = std::max(best_blocks, owners[i].blocks);
    if (moving && g == old) return;  // already a member (overflow: scored by owner_at)
    if (g == kOverflowGroup) {
      overflow.push_back(s);
    } else {
      Group& gr = sc.groups[g];
      if (gr.count < kSmallGroup) gr.members[gr.count] = s;
      ++gr.count;
    }
  };
  // The hot loop (every owner): plain code, the group of the previous owner
  // in registers; group_of() / join() only on a change of overlap or a
  // second dp rank.
  const OwnerOverlap* const ow = owners.data();
  const uint32_t n_owners = static_cast<uint32_t>(owners.size());
  for (uint32_t i = 0; i < n_owners; ++i) {
    const OwnerOverlap& o = ow[i];
    const uint32_t* at = index_.find(o.owner.worker.value);
    if (!at) continue;
    const uint32_t s = *at;
    if (!eligible[s]) continue;
    if (stamp[s] == epoch) {
      const OwnerOverlap& cur = ow[owner_at[s]];
      // Another rank is better: the worker moves to that rank's group. Its
      // old group keeps a stale member entry (skipped below: group[s] says
      // where it is) and its count (an upper bound; only decides small/large).
      if (o.blocks > cur.blocks || (o.blocks == cur.blocks && o.owner.dp_rank < cur.owner.dp_rank)) join(s, i, true);
      continue;
    }
    stamp[s] = epoch;
    ++ntouched;
    if (!same_overlap(o, last_blocks, last_tiers) || last_group == kOverflowGroup) {
      join(s, i, false);
      continue;
    }
    owner_at[s] = i;
    group[s] = last_group;
    Group& gr = sc.groups[last_group];
    if (gr.count < kSmallGroup) gr.members[gr.count] = s;
    ++gr.count;
  }
  out.best_overlap_blocks = best_blocks;
  out.groups = static_cast<uint32_t>(sc.groups.size());

  // The exact cost of one worker at `cached` tokens (schedule()'s doubles).
  const double max_waiting = max_waiting_;
  auto score = [&](uint32_t s, uint32_t owner, double cached) {
    const Slot& w = slots_[s];
    const double new_tokens = isl_tokens - cached;
    const double prefill =
        (new_tokens + cfg.pending_prefill_weight * static_cast<double>(w.st.pending_prefill_tokens)) / isl;
    const double queue = max_waiting > 0 ? static_cast<double>(w.st.load.num_requests_waiting) / max_waiting : 0.0;
    ++out.scored;
    offer(sc.top, limit, Offer{ranking_cost(alpha, w.load_ratio, prefill, w.slot_ratio, queue, cfg),
                               tie_key(draw, w.id), s, owner, cached});
  };
  auto small = [&](uint16_t g) { return g == kOverflowGroup || sc.groups[g].count <= kSmallGroup; };
  // 2. Small groups: every member.
  for (size_t g = 0; g < sc.groups.size(); ++g) {
    const Group& gr = sc.groups[g];
    if (gr.count > kSmallGroup) continue;
    for (uint32_t k = 0; k < gr.count; ++k)
      if (const uint32_t s = gr.members[k]; sc.group[s] == g) score(s, sc.owner_at[s], gr.cached);
  }
  for (uint32_t s : overflow)
    if (sc.group[s] == kOverflowGroup) score(s, sc.owner_at[s], cached_of(owners[sc.owner_at[s]]));
  // 3. Large groups and the workers holding none of the prompt: in key order,
  //    until no worker further on can enter the ranking.
  const uint32_t none = eligible_ - ntouched;
  double min_cached = -1;  // largest cached among the walked groups (smallest depth term)
  if (none > 0) min_cached = 0;
  for (const auto& g : sc.groups)
    if (g.count > kSmallGroup) min_cached = std::max(min_cached, g.cached);
  if (min_cached >= 0) {
    // cost = key + min_term + (c - c_ref)·pending at least, where the order
    // prices pending at c_ref: when this request's c is lower, subtract the
    // most it can take off (any eligible worker's pending <= pending_max_).
    const double min_term = (1 - alpha) * ((isl_tokens - min_cached) / isl);
    const double c = (1 - alpha) * cfg.pending_prefill_weight / isl;
    const double c_ref = (1 - alpha) * cfg.pending_prefill_weight / isl_ref_;
    const double slack = c < c_ref ? (c_ref - c) * static_cast<double>(pending_max_) : 0.0;
    for (const Key& k : order_[a]) {
      if (sc.top.size() == limit) {
        const double kth = sc.top.back().cost;
        if (k.key + min_term - slack > kth + 1e-9 * (1 + std::abs(kth))) break;
      }
      if (sc.stamp[k.slot] == sc.epoch) {
        const uint16_t g = sc.group[k.slot];
        if (small(g)) continue;  // scored in step 2
        score(k.slot, sc.owner_at[k.slot], sc.groups[g].cached);
      } else {
        score(k.slot, ~0u, 0.0);
      }
    }
  }
  // 4. The picks, with every term for explain and metrics.
  out.ranked.reserve(sc.top.size());
  for (const Offer& o : sc.top) {
    const Slot& w = slots_[o.slot];
    FleetPick& p = out.ranked.emplace_back();
    p.worker = w.id;
    p.state = w.st;
    if (o.owner != ~0u) {
      p.dp_rank = owners[o.owner].owner.dp_rank;
      p.overlap_blocks = owners[o.owner].blocks;
      p.overlap_by_tier = owners[o.owner].by_tier;
    }
    WorkerScore& sc2 = p.score;
    sc2.cached_tokens = o.cached;
    sc2.load_ratio = w.load_ratio;
    sc2.load_deviation = w.load_ratio - out.load_mean;
    sc2.prefill_ratio =
        (isl_tokens - o.cached + cfg.pending_prefill_weight * static_cast<double>(w.st.pending_prefill_tokens)) / isl;
    sc2.slot_ratio = w.slot_ratio;
    sc2.queue_ratio = max_waiting > 0 ? static_cast<double>(w.st.load.num_requests_waiting) / max_waiting : 0.0;
    sc2.cost = o.cost - alpha * out.load_mean;
  }
}

}  // namespace kvroute
