#include "sim/ceiling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <unordered_map>

#include "common/prefix_cache.h"
#include "sim/boundary.h"
#include "sim/floor.h"

namespace kvroute::sim {

namespace {

// A step of T tokens with no attention and no KV read: the profile's weight
// read and linear layers (w0 + w1 T + w2 knee(T) on a roofline profile).
double bare_step_ms(const mocker::EngineProfile& p, uint32_t tokens) {
  mocker::StepShape s;
  s.decodes = tokens;
  return p.step_ms(s);
}

// One chunk of n tokens after c of context at token_ms a token: its attention
// and prefix read as the profile charges them, the rest at token_ms.
double chunk_ms(const mocker::EngineProfile& p, double token_ms, uint32_t n, uint64_t c) {
  mocker::StepShape s;
  s.add_chunk(n, c);
  return p.step_ms(s) - bare_step_ms(p, n) + token_ms * n;
}

}  // namespace

double min_token_ms(const mocker::EngineProfile& p, uint32_t budget) {
  double best = bare_step_ms(p, 1);
  for (uint32_t t = 2; t <= budget; ++t) best = std::min(best, bare_step_ms(p, t) / t);
  return best;
}

double least_token_price(const mocker::EngineProfile& p, uint32_t budget) {
  return (p.attn_cached - p.attn_new) * budget + p.prefix_read;
}

bool ceiling_supported(const mocker::EngineProfile& p, uint32_t budget) {
  if (p.kind != mocker::EngineProfile::Kind::Roofline) return false;
  if (p.attn_new < 0 || p.attn_cached < p.attn_new || p.prefix_read < 0 || p.decode_read < 0) return false;
  return min_token_ms(p, budget) >= least_token_price(p, budget);
}

StepLine step_line(const mocker::EngineProfile& p, uint32_t budget, double slope) {
  StepLine l;
  l.slope = slope;
  l.intercept = bare_step_ms(p, 1) - slope;
  for (uint32_t t = 2; t <= budget; ++t) l.intercept = std::min(l.intercept, bare_step_ms(p, t) - slope * t);
  return l;
}

std::vector<StepLine> step_lines(const mocker::EngineProfile& p, uint32_t budget) {
  std::vector<StepLine> out;
  if (!ceiling_supported(p, budget)) return out;
  const double token_ms = min_token_ms(p, budget);
  const double least = least_token_price(p, budget);
  for (int k = 0; k < 4; ++k)
    if (const StepLine l = step_line(p, budget, least + (token_ms - least) * k / 4); l.intercept > 0) out.push_back(l);
  return out;
}

double min_prefill_ms(const mocker::EngineProfile& p, uint32_t budget, double token_ms, uint32_t from, uint32_t to) {
  if (from >= to) return 0;
  const uint32_t n = to - from;
  double ms = 0;
  uint64_t c = from;
  if (const uint32_t rem = n % budget) {  // the remainder first: the shortest context read once
    ms += chunk_ms(p, token_ms, rem, c);
    c += rem;
  }
  for (uint32_t k = 0; k < n / budget; ++k, c += budget) ms += chunk_ms(p, token_ms, budget, c);
  return ms;
}

double min_decode_ms(const mocker::EngineProfile& p, double token_ms, uint32_t input, uint32_t output) {
  if (output < 2) return 0;
  const double m = output - 1;  // decode j = 1..m reads input + j tokens
  return m * token_ms + p.decode_read * (m * input + m * (m + 1) / 2);
}

double recompute_block_ms(const mocker::EngineProfile& p, uint32_t budget, double token_ms, uint32_t position) {
  const double per_token = token_ms - least_token_price(p, budget);
  return kBlock * per_token + p.attn_new * kBlock * (double(kBlock) * position + (kBlock - 1) / 2.0);
}

namespace {

// A reuse gap: a block held from one reader's arrival + S to the next reader's arrival.
struct Gap {
  double ms = 0, value = 0;  // its length; the recomputation it saves
};

// The fractional knapsack of MinimalWork::recompute_ms: of `total` value,
// what keeping the best gaps within `capacity` block-ms cannot save.
double min_recompute(std::vector<Gap> gaps, double total, double capacity) {
  std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.value * b.ms > b.value * a.ms; });
  double saved = 0;
  for (const auto& g : gaps) {
    const double take = std::min(1.0, capacity / g.ms);
    saved += take * g.value;
    capacity -= take * g.ms;
    if (capacity <= 0) break;
  }
  return std::max(0.0, total - saved);
}

}  // namespace

MinimalWork minimal_work(const std::vector<SimRequest>& all, double rate, const mocker::EngineConfig& ec,
                         const CeilingOptions& o) {
  std::vector<SimRequest> storage;
  const auto& w = at_rate(all, rate, storage);  // arrival order, as causal_floor takes it
  const auto floor = causal_floor(all, rate, ec);
  const double token_ms = min_token_ms(ec.profile, ec.max_batched_tokens);
  std::unordered_map<uint64_t, double> last;  // prefix identity -> the latest arrival reading it
  std::vector<Gap> gaps;
  double gap_value = 0;
  MinimalWork out;
  out.token_ms = token_ms;
  out.lines = step_lines(ec.profile, ec.max_batched_tokens);
  out.requests.reserve(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const auto& r = w[i];
    RequestWork q;
    q.arrival_ms = r.t_ms / rate;
    const uint32_t full = std::min<uint32_t>(static_cast<uint32_t>(r.ids.size()), r.input_tokens / kBlock);
    std::vector<uint64_t> chain(full);
    size_t hit = 0;
    for (uint32_t b = 0; b < full; ++b) {
      chain[b] = mix((b ? chain[b - 1] : 0) ^ mix(r.ids[b]));  // the chained identity floor.cpp and the engines use
      hit += hit == b && last.count(chain[b]);
    }
    const auto cached = static_cast<uint32_t>(cached_prefix_tokens(double(hit), r.input_tokens, kBlock));
    for (uint32_t b = 0; b < cached / kBlock; ++b) {
      const double c = recompute_block_ms(ec.profile, ec.max_batched_tokens, token_ms, b);
      q.reuse_ms += c;
      const double gap = q.arrival_ms - last[chain[b]] - o.slo_ttft_ms;
      if (gap > 0) gaps.push_back({gap, c}), gap_value += c;
    }
    for (uint32_t b = 0; b < full; ++b) last[chain[b]] = q.arrival_ms;
    q.prefill_ms = min_prefill_ms(ec.profile, ec.max_batched_tokens, token_ms, cached, r.input_tokens);
    q.decode_ms = min_decode_ms(ec.profile, token_ms, r.input_tokens, r.output_tokens);
    q.prefill_tokens = r.input_tokens - std::min(cached, r.input_tokens);
    q.decode_tokens = r.output_tokens > 1 ? r.output_tokens - 1 : 0;
    q.floor_miss = floor.ttft_ms[i] > o.slo_ttft_ms;
    out.requests.push_back(q);
  }
  if (o.kv_blocks > 0 && w.size() > 1) {
    const double run = out.requests.back().arrival_ms - out.requests.front().arrival_ms + o.slo_ttft_ms;
    out.recompute_ms = min_recompute(std::move(gaps), gap_value, double(o.workers) * double(o.kv_blocks) * run);
  }
  return out;
}

namespace {

// One pricing of the minimal work (ceiling.h, "Decodes are priced twice"):
// what it adds to each prefill and decode token over MinimalWork::token_ms,
// and whether the KV bound's recomputation (priced at token_ms) is counted.
struct Pricing {
  double prefill_delta = 0, decode_delta = 0;
  bool recompute = true;
  double prefill(const RequestWork& q) const { return q.prefill_ms + prefill_delta * q.prefill_tokens; }
  double decode(const RequestWork& q) const { return q.decode_ms + decode_delta * q.decode_tokens; }
};

std::vector<Pricing> pricings(const MinimalWork& mw, const CeilingOptions& o) {
  std::vector<Pricing> v = {Pricing{}};
  for (const StepLine& l : mw.lines)
    v.push_back({l.slope - mw.token_ms, l.slope + l.intercept / o.max_seqs - mw.token_ms, false});
  return v;
}

}  // namespace

double run_load(const MinimalWork& work, const CeilingOptions& o) {
  if (work.requests.size() < 2) return 0;
  double most = 0;
  for (const Pricing& p : pricings(work, o)) {
    double ms = p.recompute ? work.recompute_ms : 0;
    for (const auto& q : work.requests) ms += p.prefill(q) + p.decode(q);
    most = std::max(most, ms);
  }
  const double run = work.requests.back().arrival_ms - work.requests.front().arrival_ms + o.slo_ttft_ms;
  return most / (double(o.workers) * run);
}

size_t allowed_misses(size_t n, double p) {
  if (n == 0) return 0;
  const auto index = std::min(n - 1, static_cast<size_t>(p * static_cast<double>(n)));
  return n - 1 - index;  // the values above the one percentile() picks
}

namespace {

// The sum of the k largest of v (all of them if fewer); reorders v.
double top_sum(std::vector<double>& v, size_t k) {
  if (k >= v.size()) return std::accumulate(v.begin(), v.end(), 0.0);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end(), std::greater<>());
  return std::accumulate(v.begin(), v.begin() + static_cast<long>(k), 0.0);
}

// The exclusions requests [i, j) of `work` need under one pricing (at most
// `budget` + 1: beyond the budget the count only has to show it is over),
// and their work.
std::pair<size_t, double> window_need(const MinimalWork& mw, size_t i, size_t j, const CeilingOptions& o,
                                      size_t budget, const Pricing& p, double capacity_ms) {
  const auto& work = mw.requests;
  const bool whole = p.recompute && i == 0 && j == work.size();  // the KV bound's recomputation is the whole run's
  double work_ms = whole ? mw.recompute_ms : 0;
  std::vector<double> decode, total;
  for (size_t k = i; k < j; ++k) {
    if (work[k].floor_miss) continue;  // excluded already, counted once in WorkBound::floor_misses
    const double pre = p.prefill(work[k]), dec = p.decode(work[k]);
    work_ms += pre + dec;
    decode.push_back(dec);
    total.push_back(pre + dec + (whole ? work[k].reuse_ms : 0));
  }
  if (work_ms <= capacity_ms) return {0, work_ms};
  // Still running at the end: at most workers x max_seqs, their decodes dropped (the costliest).
  double over = work_ms - top_sum(decode, size_t{o.workers} * o.max_seqs) - capacity_ms;
  if (over <= 0) return {0, work_ms};
  const size_t k = std::min(total.size(), budget + 1);
  std::partial_sort(total.begin(), total.begin() + static_cast<long>(k), total.end(), std::greater<>());
  size_t need = 0;
  while (over > 0 && need < k) over -= total[need++];
  return {over > 0 ? budget + 1 : need, work_ms};
}

// Requests [i, j) of `work` as one window: the most exclusions any of
// `prices` (pricings(mw, o)) needs (each is a necessary condition), and that
// pricing's work.
WindowNeed window(const MinimalWork& mw, size_t i, size_t j, const CeilingOptions& o, size_t budget,
                  const std::vector<Pricing>& prices) {
  const auto& work = mw.requests;
  WindowNeed wn;
  wn.start_ms = work[i].arrival_ms;
  wn.end_ms = work[j - 1].arrival_ms;
  wn.requests = j - i;
  wn.capacity_ms = double(o.workers) * (wn.end_ms - wn.start_ms + o.slo_ttft_ms);
  for (const Pricing& p : prices) {
    const auto [need, work_ms] = window_need(mw, i, j, o, budget, p, wn.capacity_ms);
    if (need > wn.need || (need == wn.need && work_ms > wn.work_ms)) wn.need = need, wn.work_ms = work_ms;
  }
  return wn;
}

// The candidate windows: arrival spans of 0, S/16 x 2^k and the whole run,
// starting at every arrival while a window holds few requests, then at
// strides of 1/32 of its size.
std::vector<WindowNeed> candidate_windows(const MinimalWork& mw, const CeilingOptions& o, size_t budget) {
  const auto& work = mw.requests;
  std::vector<WindowNeed> out;
  if (work.empty()) return out;
  const double span = work.back().arrival_ms - work.front().arrival_ms;
  const std::vector<Pricing> prices = pricings(mw, o);  // the same for every window
  std::vector<double> lengths = {0};
  for (double l = o.slo_ttft_ms / 16; l < span; l *= 2) lengths.push_back(l);
  lengths.push_back(span);
  for (double len : lengths) {
    size_t j = 0;
    for (size_t i = 0; i < work.size();) {
      j = std::max(j, i + 1);
      while (j < work.size() && work[j].arrival_ms <= work[i].arrival_ms + len) ++j;
      WindowNeed wn = window(mw, i, j, o, budget, prices);
      if (wn.need > 0) out.push_back(wn);
      if (j == work.size()) break;
      i += std::max<size_t>(1, (j - i) / 32);
    }
  }
  return out;
}

// The most needing set of windows whose spans [start, end + S] do not
// overlap (weighted interval scheduling by end).
std::vector<WindowNeed> disjoint_max(std::vector<WindowNeed> c, double slo_ms) {
  std::sort(c.begin(), c.end(), [](const WindowNeed& a, const WindowNeed& b) { return a.end_ms < b.end_ms; });
  std::vector<size_t> best(c.size() + 1, 0);  // best[i]: the first i windows
  std::vector<long> prev(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    // The last window ending (with its S) before this one starts.
    long p = static_cast<long>(i) - 1;
    while (p >= 0 && c[static_cast<size_t>(p)].end_ms + slo_ms > c[i].start_ms) --p;
    prev[i] = p;
    best[i + 1] = std::max(best[i], c[i].need + best[static_cast<size_t>(p + 1)]);
  }
  std::vector<WindowNeed> chosen;
  for (long i = static_cast<long>(c.size()) - 1; i >= 0;) {
    const auto u = static_cast<size_t>(i);
    if (best[u + 1] == best[u]) {
      --i;
      continue;
    }
    chosen.push_back(c[u]);
    i = prev[u];
  }
  std::reverse(chosen.begin(), chosen.end());
  return chosen;
}

}  // namespace

WorkBound work_bound(const MinimalWork& work, const CeilingOptions& o) {
  WorkBound b;
  b.allowed = allowed_misses(work.requests.size(), o.percentile);
  for (const auto& q : work.requests) b.floor_misses += q.floor_miss;
  if (b.floor_misses > b.allowed) return b;  // the floor alone rules it out
  const size_t budget = b.allowed - b.floor_misses;
  b.windows = disjoint_max(candidate_windows(work, o, budget), o.slo_ttft_ms);
  for (const auto& wn : b.windows) b.need += wn.need;
  return b;
}

WorkBound check_rate(const std::vector<SimRequest>& w, double rate, const mocker::EngineConfig& ec,
                     const CeilingOptions& o) {
  return work_bound(minimal_work(w, rate, ec, o), o);
}

Ceiling find_ceiling(const std::vector<SimRequest>& w, const mocker::EngineConfig& ec, const CeilingOptions& o,
                     int steps) {
  std::map<double, WorkBound> seen;
  const RateBracket b = bisect_rate(
      [&](double rate) { return !(seen[rate] = check_rate(w, rate, ec, o)).ruled_out(); }, steps);
  Ceiling c;
  c.rate = b.lo;
  c.ruled_out = b.hi;
  c.at = seen[b.lo > 0 ? b.lo : kLowestRate];
  if (b.hi > 0) c.beyond = seen[b.hi];
  return c;
}

}  // namespace kvroute::sim
