#include "scheduler/ranked_candidates.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "common/prefix_cache.h"

namespace kvroute {

namespace {

double ratio(double num, double den) { return den > 0 ? num / den : 0.0; }

// Where a marked worker's overlap comes from: an index into the listed
// owners (MatchLayers::extra), or kFromLayer | layer index.
constexpr uint32_t kFromLayer = 1u << 31;
constexpr uint32_t kNoSource = ~0u;  // holds none of the prompt

// A worker offered to the ranking, with what its score needs.
struct Offer {
  double cost;
  uint64_t tie;
  uint32_t slot;
  uint32_t source;  // kNoSource, a listed owner or kFromLayer | layer
  uint32_t dp_rank;
  double cached;
  bool operator<(const Offer& o) const { return cost != o.cost ? cost < o.cost : tie < o.tie; }
};

// One distinct cached depth among the request's marked owners. The first
// kSmallGroup members are remembered (a group with no more is scored member
// by member).
struct Group {
  double cached;
  uint32_t count;
  std::array<uint32_t, RankedCandidates::kSmallGroup> members;
};

// A large layer of the request: its members' slots (RankedCandidates::SetSlots).
struct Large {
  uint32_t layer;
  const std::vector<uint64_t>* bits;
  const FlatMap64<uint32_t>* rank;  // slot -> lowest dp rank, where not 0
  double cached;
};

bool test_bit(const std::vector<uint64_t>& bits, uint32_t s) {
  return (s >> 6) < bits.size() && (bits[s >> 6] >> (s & 63)) & 1;
}

// Per-thread scratch of decide(): slot-indexed marks, valid when stamp == epoch
// (no clearing per decision), and the decision's small lists.
struct Scratch {
  std::vector<uint32_t> stamp, source, rank;
  std::vector<uint16_t> group;
  std::vector<uint32_t> overflow;
  std::vector<Group> groups;
  std::vector<Large> large;  // deep to shallow
  std::vector<Offer> top;
  uint32_t epoch = 0;

  void begin(size_t slots) {
    if (stamp.size() < slots) {
      stamp.resize(slots, 0);
      source.resize(slots);
      rank.resize(slots);
      group.resize(slots);
    }
    if (++epoch == 0) {  // wrapped: forget every mark
      std::fill(stamp.begin(), stamp.end(), 0);
      epoch = 1;
    }
    overflow.clear();
    groups.clear();
    large.clear();
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

void RankedDecision::reset() {
  ranked.clear();
  alpha = load_mean = load_std = 0;
  eligible = best_overlap_blocks = scored = groups = 0;
}

bool RankedCandidates::supports(const SchedulerConfig& cfg, size_t rank_limit) {
  // scheduler.cost = predicted_ttft prices each worker by its own TTFT model
  // (schedule()): not the weighted terms the candidates are ranked by.
  return cfg.temperature <= 0 && rank_limit > 0 && cfg.pending_prefill_weight >= 0 && cfg.cost != "predicted_ttft";
}

RankedCandidates::Params RankedCandidates::params_of(const SchedulerConfig& cfg) {
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

double RankedCandidates::key_of(const Slot& s, int a) const {
  const double queue =
      max_waiting_ > 0 ? static_cast<double>(s.st.load.num_requests_waiting) / max_waiting_ : 0.0;
  return params_.alpha[a] * s.load_ratio + params_.gamma * s.slot_ratio + params_.delta * queue +
         (1 - params_.alpha[a]) * params_.ppw * static_cast<double>(s.st.queued_tokens()) / isl_ref_;
}

void RankedCandidates::add_waiting(uint32_t w) {
  ++waiting_[w];
  if (w > max_waiting_) {
    max_waiting_ = w;
    keys_stale_ |= params_.delta != 0;  // every key's queue term changed
  }
}

void RankedCandidates::remove_waiting(uint32_t w) {
  auto it = waiting_.find(w);
  if (it == waiting_.end()) return;
  if (--it->second == 0) waiting_.erase(it);
  const uint32_t max = waiting_.empty() ? 0 : waiting_.rbegin()->first;
  if (max != max_waiting_) {
    max_waiting_ = max;
    keys_stale_ |= params_.delta != 0;
  }
}

void RankedCandidates::add_eligible(uint32_t slot) {
  Slot& s = slots_[slot];
  s.eligible = true;
  eligible_flag_[slot] = 1;
  eligible_bits_[slot >> 6] |= uint64_t{1} << (slot & 63);
  ++eligible_;
  sum_lr_ += s.load_ratio;
  sum_lr2_ += s.load_ratio * s.load_ratio;
  pending_max_ = std::max(pending_max_, s.st.queued_tokens());
  for (int a = 0; a < 2; ++a) s.at[a] = order_[a].insert(Key{key_of(s, a), slot}).first;
  add_waiting(s.st.load.num_requests_waiting);
}

void RankedCandidates::remove_eligible(uint32_t slot) {
  Slot& s = slots_[slot];
  s.eligible = false;
  eligible_flag_[slot] = 0;
  eligible_bits_[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
  --eligible_;
  sum_lr_ -= s.load_ratio;
  sum_lr2_ -= s.load_ratio * s.load_ratio;
  for (int a = 0; a < 2; ++a) order_[a].erase(s.at[a]);
  remove_waiting(s.st.load.num_requests_waiting);
}

void RankedCandidates::exact_sums() {
  sum_lr_ = sum_lr2_ = 0;
  for (const auto& s : slots_)
    if (s.live && s.eligible) {
      sum_lr_ += s.load_ratio;
      sum_lr2_ += s.load_ratio * s.load_ratio;
    }
  updates_ = 0;
}

void RankedCandidates::rebuild() {
  for (auto& o : order_) o.clear();
  waiting_.clear();
  eligible_ = 0;
  pending_max_ = 0;
  eligible_flag_.assign(slots_.size(), 0);
  eligible_bits_.assign((slots_.size() + 63) / 64, 0);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    s.eligible = s.live && exclusion_of(s.st.load, s.st.draining, cfg_) == Exclusion::None;
    eligible_flag_[i] = s.eligible;
    if (s.eligible) eligible_bits_[i >> 6] |= uint64_t{1} << (i & 63);
    if (!s.eligible) continue;
    ++eligible_;
    ++waiting_[s.st.load.num_requests_waiting];
    pending_max_ = std::max(pending_max_, s.st.queued_tokens());
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

void RankedCandidates::count_slots(const CandidateState& st, bool add) {
  if (st.draining || st.load.request_total_slots == 0) return;  // serves nothing new / reports no slots
  if (add) {
    slots_taken_ += st.load.request_active_slots;
    slots_total_ += st.load.request_total_slots;
  } else {
    slots_taken_ -= st.load.request_active_slots;
    slots_total_ -= st.load.request_total_slots;
  }
}

double RankedCandidates::slot_usage() const {
  return slots_total_ ? static_cast<double>(slots_taken_) / static_cast<double>(slots_total_) : 0.0;
}

bool RankedCandidates::slots_full(double threshold) {
  if (threshold >= 1) return slots_full_ = false;
  const double u = slot_usage();
  if (u >= threshold) slots_full_ = true;
  else if (u < threshold - kSlotsFullBand) slots_full_ = false;
  return slots_full_;
}

void RankedCandidates::upsert(WorkerId id, const CandidateState& st) {
  uint32_t slot;
  if (const uint32_t* at = index_.find(id.value)) {
    slot = *at;
    if (slots_[slot].eligible) remove_eligible(slot);
    count_slots(slots_[slot].st, false);
  } else {
    if (free_.empty()) {
      slot = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
      eligible_flag_.push_back(0);
      if (eligible_bits_.size() * 64 < slots_.size()) eligible_bits_.push_back(0);
    } else {
      slot = free_.back();
      free_.pop_back();
    }
    index_.put(id.value, slot);
    forget_sets();  // a cached set may list this worker (or the slot's last one)
    ++live_;
  }
  Slot& s = slots_[slot];
  s.id = id;
  s.live = true;
  s.st = st;
  count_slots(st, true);
  s.load_ratio = kv_load_ratio(st.load, st.parked_blocks);
  s.slot_ratio = ratio(st.load.request_active_slots, st.load.request_total_slots);
  if (exclusion_of(st.load, st.draining, cfg_) == Exclusion::None) add_eligible(slot);
  if (keys_stale_) rebuild();
  else if (++updates_ >= kExactEvery) exact_sums();
}

bool RankedCandidates::erase(WorkerId id) {
  const uint32_t* at = index_.find(id.value);
  if (!at) return false;
  const uint32_t slot = *at;
  if (slots_[slot].eligible) remove_eligible(slot);
  count_slots(slots_[slot].st, false);
  slots_[slot] = Slot{};
  index_.erase(id.value);  // its bits in cached sets are never read: the slot is not eligible until reused
  free_.push_back(slot);
  --live_;
  if (keys_stale_) rebuild();
  return true;
}

void RankedCandidates::forget_sets() {
  sets_.clear();
  set_at_.clear();
}

const RankedCandidates::SetSlots& RankedCandidates::slots_of(const OwnerSet& set) {
  if (const uint32_t* at = set_at_.find(set.serial)) return sets_[*at];
  SetSlots& ss = sets_.emplace_back();
  set_at_.put(set.serial, static_cast<uint32_t>(sets_.size() - 1));
  ss.bits.assign((slots_.size() + 63) / 64, 0);
  for (const CacheOwner& o : set.owners) {
    const uint32_t* at = index_.find(o.worker.value);
    if (!at) continue;  // not a candidate of this ranking
    const uint32_t s = *at;
    uint64_t& word = ss.bits[s >> 6];
    const uint64_t bit = uint64_t{1} << (s & 63);
    if (!(word & bit)) {
      word |= bit;
      if (o.dp_rank != 0) ss.rank.put(s, o.dp_rank);
      continue;
    }
    // Another dp rank of a worker already in: the lowest counts.
    const uint32_t* r = ss.rank.find(s);
    if (r && o.dp_rank < *r) {
      if (o.dp_rank == 0) ss.rank.erase(s);
      else ss.rank.put(s, o.dp_rank);
    }
  }
  return ss;
}

// One decision, phase by phase: mark the owners (layers, then listed ones),
// count who holds the prompt, score the small groups, walk the ranked order
// for the rest, emit the picks.
class RankedCandidates::Pass {
 public:
  Pass(RankedCandidates& ranking, std::span<const MatchLayers::Layer> layers, std::span<const OwnerOverlap> extra,
       uint32_t isl_tokens, uint32_t block_size, const SchedulerConfig& cfg, size_t limit, int a, uint64_t draw,
       RankedDecision& out)
      : f_(ranking), layers_(layers), extra_(extra), isl_tokens_(isl_tokens), block_size_(block_size),
        isl_(std::max<uint32_t>(isl_tokens, 1)), cfg_(cfg),
        limit_(limit), a_(a), alpha_(ranking.params_.alpha[a]), draw_(draw), out_(out), sc_(scratch) {
    sc_.begin(f_.slots_.size());
    if (!layers_.empty() && layers_[0].set->owners.size() > kSmallGroup) l0_ = &f_.slots_of(*layers_[0].set).bits;
  }

  // 1a. Layers, deep to shallow (a worker counts at its deepest): a small
  //     layer marks its members; a large one is kept as a bitmap.
  void mark_layers() {
    for (size_t k = layers_.size(); k-- > 0;) {
      const MatchLayers::Layer& l = layers_[k];
      const double cached = cached_of(l.blocks, l.by_tier);
      const uint32_t source = kFromLayer | static_cast<uint32_t>(k);
      if (l.set->owners.size() > kSmallGroup) {
        const SetSlots& ss = f_.slots_of(*l.set);
        sc_.large.push_back(Large{static_cast<uint32_t>(k), &ss.bits, &ss.rank, cached});
        continue;
      }
      uint16_t g = 0;
      bool have_group = false;
      for (const CacheOwner& o : l.set->owners) {
        const uint32_t* at = f_.index_.find(o.worker.value);
        if (!at || !f_.eligible_flag_[*at]) continue;
        const uint32_t s = *at;
        if (sc_.stamp[s] == sc_.epoch) {
          // Marked by a deeper layer (kept), or by this one through another
          // dp rank (the lowest counts).
          if (sc_.source[s] == source && o.dp_rank < sc_.rank[s]) sc_.rank[s] = o.dp_rank;
          continue;
        }
        if (!have_group) {
          g = group_for(cached);
          have_group = true;
        }
        mark(s, source, o.dp_rank, g);
        best_blocks_ = std::max(best_blocks_, l.blocks);
      }
    }
  }

  // 1b. Listed owners: a worker takes its best overlap (most blocks, then the
  //     lowest dp rank), against its layer's too.
  void mark_listed() {
    for (uint32_t i = 0; i < extra_.size(); ++i) {
      const OwnerOverlap& o = extra_[i];
      const uint32_t* at = f_.index_.find(o.owner.worker.value);
      if (!at || !f_.eligible_flag_[*at]) continue;
      const uint32_t s = *at;
      const bool marked = sc_.stamp[s] == sc_.epoch;
      uint32_t blocks = 0, rank = 0;
      bool held = marked;
      if (marked) {
        blocks = blocks_of(sc_.source[s]);
        rank = sc_.rank[s];
      } else if (const Large* l = large_of(s)) {
        held = true;
        blocks = layers_[l->layer].blocks;
        rank = rank_in(*l, s);
      }
      if (held && !(o.blocks > blocks || (o.blocks == blocks && o.owner.dp_rank < rank))) continue;
      best_blocks_ = std::max(best_blocks_, o.blocks);
      const uint16_t g = group_of_listed(o);
      if (!marked) {
        mark(s, i, o.owner.dp_rank, g);
        continue;
      }
      // It moves to this owner's group; its old group keeps a stale member
      // entry (skipped: group[s] says where it is) and its count (an upper
      // bound; only decides small or large).
      sc_.source[s] = i;
      sc_.rank[s] = o.owner.dp_rank;
      const uint16_t old = sc_.group[s];
      sc_.group[s] = g;
      if (g != old) join(s, g);
    }
  }

  // 1c. Eligible workers holding some of the prompt, and the longest overlap.
  void count_holders() {
    uint32_t holders = marked_;
    if (l0_) {
      const size_t n = std::min(l0_->size(), f_.eligible_bits_.size());
      uint32_t in = 0;
      for (size_t w = 0; w < n; ++w) in += static_cast<uint32_t>(std::popcount((*l0_)[w] & f_.eligible_bits_[w]));
      holders += in - marked_in_l0_;
    }
    none_ = f_.eligible_ - holders;
    for (const Large& l : sc_.large) {  // deepest first
      if (layers_[l.layer].blocks <= best_blocks_) break;
      const size_t n = std::min(l.bits->size(), f_.eligible_bits_.size());
      bool any = false;
      for (size_t w = 0; w < n && !any; ++w) any = ((*l.bits)[w] & f_.eligible_bits_[w]) != 0;
      if (any) {
        best_blocks_ = layers_[l.layer].blocks;
        break;
      }
    }
    out_.best_overlap_blocks = best_blocks_;
    out_.groups = static_cast<uint32_t>(sc_.groups.size() + sc_.large.size());
  }

  // 2. Small groups: every member.
  void score_small() {
    for (size_t g = 0; g < sc_.groups.size(); ++g) {
      const Group& gr = sc_.groups[g];
      if (gr.count > kSmallGroup) continue;
      for (uint32_t k = 0; k < gr.count; ++k)
        if (const uint32_t s = gr.members[k]; sc_.group[s] == g) score(s, sc_.source[s], sc_.rank[s], gr.cached);
    }
    for (uint32_t s : sc_.overflow)
      if (sc_.group[s] == kOverflowGroup)
        score(s, sc_.source[s], sc_.rank[s], cached_of(blocks_of(sc_.source[s]), tiers_of(sc_.source[s])));
  }

  // 3. Large groups, large layers and the workers holding none of the prompt:
  //    in key order, until no worker further on can enter the ranking.
  void walk() {
    double min_cached = none_ > 0 ? 0 : -1;  // largest cached walked (smallest depth term)
    for (const Group& g : sc_.groups)
      if (g.count > kSmallGroup) min_cached = std::max(min_cached, g.cached);
    for (const Large& l : sc_.large) min_cached = std::max(min_cached, l.cached);
    if (min_cached < 0) return;
    // cost = key + min_term + (c - c_ref)·pending + the pending's excess (>= 0)
    // at least, where the order prices pending at c_ref and leaves the excess
    // out: when this request's c is lower, subtract the most it can take off
    // (any eligible worker's pending <= pending_max_).
    const double min_term = (1 - alpha_) * ((isl_tokens_ - min_cached) / isl_);
    const double c = (1 - alpha_) * cfg_.pending_prefill_weight / isl_;
    const double c_ref = (1 - alpha_) * cfg_.pending_prefill_weight / f_.isl_ref_;
    const double slack = c < c_ref ? (c_ref - c) * static_cast<double>(f_.pending_max_) : 0.0;
    for (const Key& k : f_.order_[a_]) {
      if (sc_.top.size() == limit_) {
        const double kth = sc_.top.back().cost;
        if (k.key + min_term - slack > kth + 1e-9 * (1 + std::abs(kth))) break;
      }
      const uint32_t s = k.slot;
      if (sc_.stamp[s] == sc_.epoch) {
        const uint16_t g = sc_.group[s];
        if (g == kOverflowGroup || sc_.groups[g].count <= kSmallGroup) continue;  // scored in step 2
        score(s, sc_.source[s], sc_.rank[s], sc_.groups[g].cached);
      } else if (const Large* l = large_of(s)) {
        score(s, kFromLayer | l->layer, rank_in(*l, s), l->cached);
      } else {
        score(s, kNoSource, 0, 0.0);
      }
    }
  }

  // 4. The picks, with every term for explain and metrics.
  void emit() {
    out_.ranked.reserve(sc_.top.size());
    for (const Offer& o : sc_.top) {
      const Slot& w = f_.slots_[o.slot];
      RankedPick& p = out_.ranked.emplace_back();
      p.worker = w.id;
      p.state = w.st;
      if (o.source != kNoSource) {
        p.dp_rank = o.dp_rank;
        p.overlap_blocks = blocks_of(o.source);
        p.overlap_by_tier = tiers_of(o.source);
        p.inflight_blocks = inflight_of(o.source);
      }
      WorkerScore& ws = p.score;
      ws.cached_tokens = o.cached;
      ws.load_ratio = w.load_ratio;
      ws.load_deviation = w.load_ratio - out_.load_mean;
      ws.prefill_ratio = prefill_ratio(w, o.cached, own_of(o.source));
      ws.eviction_share = eviction_share(w.st.evicted_blocks, w.st.load.kv_total_blocks);
      ws.slot_ratio = w.slot_ratio;
      ws.queue_ratio = queue_ratio(w);
      ws.cost = o.cost - alpha_ * out_.load_mean;
    }
  }

 private:
  double cached_of(uint32_t blocks, const std::array<uint32_t, kNumStorageTiers>& by_tier) const {
    return cached_prefix_tokens(tier_weighted_blocks(blocks, by_tier, cfg_), isl_tokens_, block_size_);
  }
  uint32_t blocks_of(uint32_t source) const {
    return source & kFromLayer ? layers_[source & ~kFromLayer].blocks : extra_[source].blocks;
  }
  const std::array<uint32_t, kNumStorageTiers>& tiers_of(uint32_t source) const {
    return source & kFromLayer ? layers_[source & ~kFromLayer].by_tier : extra_[source].by_tier;
  }
  // The deepest large layer holding slot s, or null.
  const Large* large_of(uint32_t s) const {
    for (const Large& l : sc_.large)
      if (test_bit(*l.bits, s)) return &l;
    return nullptr;
  }
  static uint32_t rank_in(const Large& l, uint32_t s) {
    const uint32_t* r = l.rank->find(s);
    return r ? *r : 0;
  }
  // The prefill term's ratio at `cached` tokens, `own` of the worker's
  // pending being the prompt's own prefix (schedule()'s formula).
  double prefill_ratio(const Slot& w, double cached, double own) const {
    return (isl_tokens_ - cached + priced_pending(static_cast<double>(w.st.queued_tokens()), own, cached, cfg_)) /
           isl_;
  }
  // The in-flight prefix (tokens) of the overlap `source` names: a listed
  // owner's OwnerOverlap::inflight_blocks; 0 for a layer or no overlap.
  uint32_t inflight_of(uint32_t source) const {
    return source == kNoSource || (source & kFromLayer) ? 0 : extra_[source].inflight_blocks;
  }
  double own_of(uint32_t source) const { return static_cast<double>(inflight_of(source)) * block_size_; }
  double queue_ratio(const Slot& w) const {
    return f_.max_waiting_ > 0 ? static_cast<double>(w.st.load.num_requests_waiting) / f_.max_waiting_ : 0.0;
  }

  uint16_t group_for(double cached) {
    for (size_t k = sc_.groups.size(); k-- > 0;)
      if (sc_.groups[k].cached == cached) return static_cast<uint16_t>(k);
    if (sc_.groups.size() == kMaxGroups) return kOverflowGroup;
    sc_.groups.push_back(Group{cached, 0, {}});
    return static_cast<uint16_t>(sc_.groups.size() - 1);
  }
  // Listed owners come in runs of equal overlap: the last one's group first.
  uint16_t group_of_listed(const OwnerOverlap& o) {
    if (o.blocks == last_blocks_ && o.by_tier == last_tiers_) return last_group_;
    last_blocks_ = o.blocks;
    last_tiers_ = o.by_tier;
    return last_group_ = group_for(cached_of(o.blocks, o.by_tier));
  }
  void join(uint32_t s, uint16_t g) {
    if (g == kOverflowGroup) {
      sc_.overflow.push_back(s);
      return;
    }
    Group& gr = sc_.groups[g];
    if (gr.count < kSmallGroup) gr.members[gr.count] = s;
    ++gr.count;
  }
  void mark(uint32_t s, uint32_t source, uint32_t dp_rank, uint16_t g) {
    sc_.stamp[s] = sc_.epoch;
    sc_.source[s] = source;
    sc_.rank[s] = dp_rank;
    sc_.group[s] = g;
    ++marked_;
    if (l0_ && test_bit(*l0_, s)) ++marked_in_l0_;
    join(s, g);
  }
  // The exact cost of one worker at `cached` tokens (schedule()'s doubles).
  void score(uint32_t s, uint32_t source, uint32_t dp_rank, double cached) {
    const Slot& w = f_.slots_[s];
    const double prefill = prefill_ratio(w, cached, own_of(source));
    ++out_.scored;
    offer(sc_.top, limit_,
          Offer{ranking_cost(alpha_, w.load_ratio, prefill, w.slot_ratio, queue_ratio(w), cfg_) +
                    eviction_term((isl_tokens_ - cached) / isl_,
                                  eviction_share(w.st.evicted_blocks, w.st.load.kv_total_blocks), cfg_),
                tie_key(draw_, w.id),
                s, source, dp_rank, cached});
  }

  RankedCandidates& f_;
  std::span<const MatchLayers::Layer> layers_;
  std::span<const OwnerOverlap> extra_;
  uint32_t isl_tokens_, block_size_;
  double isl_;  // isl_tokens_, at least 1 (the ratios' denominator)
  const SchedulerConfig& cfg_;
  size_t limit_;
  int a_;
  double alpha_;
  uint64_t draw_;
  RankedDecision& out_;
  Scratch& sc_;
  const std::vector<uint64_t>* l0_ = nullptr;  // the shallowest layer's bitmap, when large
  uint32_t marked_ = 0, marked_in_l0_ = 0, none_ = 0, best_blocks_ = 0;
  uint32_t last_blocks_ = ~0u;
  std::array<uint32_t, kNumStorageTiers> last_tiers_{};
  uint16_t last_group_ = kOverflowGroup;
};

void RankedCandidates::decide(const MatchLayers& match, uint32_t isl_tokens, uint32_t block_size,
                         const SchedulerConfig& cfg, Random& random, size_t rank_limit, RankedDecision& out) {
  decide_impl(match.layers, match.extra, isl_tokens, block_size, cfg, random, rank_limit, out);
}

void RankedCandidates::decide(std::span<const OwnerOverlap> owners, uint32_t isl_tokens, uint32_t block_size,
                         const SchedulerConfig& cfg, Random& random, size_t rank_limit, RankedDecision& out) {
  decide_impl({}, owners, isl_tokens, block_size, cfg, random, rank_limit, out);
}

void RankedCandidates::use(const SchedulerConfig& cfg) {
  if (const Params p = params_of(cfg); !(p == params_)) {
    params_ = p;
    cfg_ = cfg;
    rebuild();
  }
}

double RankedCandidates::load_mean(const SchedulerConfig& cfg) {
  use(cfg);
  return eligible_ ? sum_lr_ / eligible_ : 0.0;
}

size_t RankedCandidates::eligible(const SchedulerConfig& cfg) {
  use(cfg);
  return eligible_;
}

void RankedCandidates::decide_impl(std::span<const MatchLayers::Layer> layers, std::span<const OwnerOverlap> extra,
                              uint32_t isl_tokens, uint32_t block_size, const SchedulerConfig& cfg, Random& random,
                              size_t rank_limit, RankedDecision& out) {
  out.reset();
  use(cfg);
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
  const int a = load_uneven(out.load_std, out.load_mean, cfg) ? 1 : 0;
  out.alpha = params_.alpha[a];
  // Bitmaps are cached up to kMaxCachedSets, never dropped within a decision.
  if (sets_.size() + layers.size() > kMaxCachedSets) forget_sets();
  Pass pass(*this, layers, extra, isl_tokens, block_size, cfg, std::min<size_t>(rank_limit, eligible_), a, draw, out);
  pass.mark_layers();
  pass.mark_listed();
  pass.count_holders();
  pass.score_small();
  pass.walk();
  pass.emit();
}

}  // namespace kvroute
