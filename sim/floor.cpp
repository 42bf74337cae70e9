#include "sim/floor.h"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "common/prefix_cache.h"

namespace kvroute::sim {

namespace {

// The request's own prefill on an idle engine from `from` prompt tokens in
// its KV cache to `to`, chunked by the step budget as the engine does
// (mocker/engine.h); `ends` (optional) gets each chunk's end token and time
// offset. A prompt recomputes at least its last token.
double prefill(const mocker::EngineConfig& ec, uint32_t from, uint32_t to,
               std::vector<std::pair<uint32_t, double>>* ends = nullptr) {
  from = std::min(from, to > 0 ? to - 1 : 0);
  double t = 0;
  while (from < to) {
    const uint32_t n = std::min<uint32_t>(to - from, ec.max_batched_tokens);
    t += ec.profile.prefill_ms(n, from);
    from += n;
    if (ends) ends->emplace_back(from, t);
  }
  return t;
}

// Prompt tokens served from the first `blocks` cached blocks, as the engine counts them.
uint32_t cached(const SimRequest& r, size_t blocks) {
  return static_cast<uint32_t>(cached_prefix_tokens(blocks, r.input_tokens, kBlock));
}

}  // namespace

DecodeInterference decode_interference(const std::vector<SimRequest>& all, double rate,
                                       const mocker::EngineConfig& ec, uint32_t workers) {
  std::vector<SimRequest> storage;
  const auto& w = at_rate(all, rate, storage);
  DecodeInterference d;
  if (w.size() < 2 || workers == 0) return d;
  double busy = 0, weighted_context = 0;  // decode ms; decode ms x context
  for (const auto& r : w) {
    if (r.output_tokens < 2) continue;
    const double context = r.input_tokens + 0.5 * r.output_tokens;
    mocker::StepShape one;
    one.add_decode(static_cast<uint64_t>(context));
    const double ms = double(r.output_tokens - 1) * ec.profile.step_ms(one);
    busy += ms;
    weighted_context += ms * context;
  }
  const double span = (w.back().t_ms - w.front().t_ms) / rate;
  if (span <= 0 || busy <= 0) return d;
  d.decodes_per_engine = busy / span / workers;
  d.mean_context = weighted_context / busy;
  // Step time with k decodes added to a chunk, k fractional: interpolate between whole batches.
  auto added = [&](uint64_t chunk) {
    auto with = [&](uint32_t k) {
      mocker::StepShape s;
      s.add_chunk(chunk, 0);
      for (uint32_t i = 0; i < k; ++i) s.add_decode(static_cast<uint64_t>(d.mean_context));
      return ec.profile.step_ms(s);
    };
    const auto k = static_cast<uint32_t>(d.decodes_per_engine);
    const double f = d.decodes_per_engine - k;
    return (1 - f) * with(k) + f * with(k + 1) - with(0);
  };
  d.added_ms_512 = added(512);
  d.added_ms_budget = added(ec.max_batched_tokens);
  return d;
}

FloorResult acausal_floor(const std::vector<SimRequest>& w, const mocker::EngineConfig& ec) {
  FloorResult f;
  std::unordered_set<uint64_t> seen;
  uint64_t total = 0, hits = 0;
  for (const auto& r : w) {
    size_t hit = 0;
    bool prefix = true;
    for (uint64_t c : prefix_chains(r)) {
      prefix = !seen.insert(c).second && prefix;
      hit += prefix;
      ++total;
    }
    hits += hit;
    f.ttft_ms.push_back(prefill(ec, cached(r, hit), r.input_tokens));
  }
  f.hit_rate = total ? double(hits) / double(total) : 0;
  return f;
}

FloorResult causal_floor(const std::vector<SimRequest>& all, double rate, const mocker::EngineConfig& ec) {
  std::vector<SimRequest> storage;
  const auto& w = at_rate(all, rate, storage);  // in arrival order
  FloorResult f;
  std::unordered_map<uint64_t, double> avail;  // prefix identity -> earliest time any request has computed it
  uint64_t total = 0, hits = 0;
  for (const auto& r : w) {
    const double arrival = r.t_ms / rate;
    const auto c = prefix_chains(r);
    double best = prefill(ec, 0, r.input_tokens);  // everything itself
    size_t best_k = 0;
    double best_ready = arrival;
    double ready = -std::numeric_limits<double>::infinity();  // when the first k blocks are all available
    for (size_t k = 1; k <= c.size(); ++k) {
      const auto it = avail.find(c[k - 1]);
      if (it == avail.end()) break;
      ready = std::max(ready, it->second);
      const double t = std::max(0.0, ready - arrival) + prefill(ec, cached(r, k), r.input_tokens);
      if (t < best) best = t, best_k = k, best_ready = ready;
    }
    f.waited += best_ready > arrival;
    // This request computes blocks best_k.. itself; each exists from the end
    // of the chunk that completes it.
    std::vector<std::pair<uint32_t, double>> ends;
    const double start = arrival + best - prefill(ec, cached(r, best_k), r.input_tokens, &ends);
    size_t chunk = 0;
    for (size_t i = best_k; i < c.size(); ++i) {
      while (chunk + 1 < ends.size() && ends[chunk].first < (i + 1) * kBlock) ++chunk;
      const double done = start + ends[chunk].second;
      auto [it, fresh] = avail.try_emplace(c[i], done);
      if (!fresh) it->second = std::min(it->second, done);
    }
    hits += best_k;
    total += c.size();
    f.ttft_ms.push_back(best);
  }
  f.hit_rate = total ? double(hits) / double(total) : 0;
  return f;
}

}  // namespace kvroute::sim
