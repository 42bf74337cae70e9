#include "sim/floor.h"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace kvroute::sim {

namespace {

double prefill(const mocker::EngineConfig& ec, double n) {
  return ec.prefill_a * n * n + ec.prefill_b * n + ec.prefill_c;
}

// The request's prefix identities (chained block hashes) over its full blocks.
std::vector<uint64_t> chains(const SimRequest& r) {
  const uint32_t full = std::min<uint32_t>(static_cast<uint32_t>(r.ids.size()), r.input_tokens / kBlock);
  std::vector<uint64_t> c(full);
  uint64_t chain = 0;
  for (uint32_t i = 0; i < full; ++i) c[i] = chain = mix(chain ^ mix(r.ids[i]));
  return c;
}

double uncached(const SimRequest& r, size_t hit_blocks) {
  return r.input_tokens - std::min<double>(r.input_tokens, double(hit_blocks) * kBlock);
}

}  // namespace

FloorResult acausal_floor(const std::vector<SimRequest>& w, const mocker::EngineConfig& ec) {
  FloorResult f;
  std::unordered_set<uint64_t> seen;
  uint64_t total = 0, hits = 0;
  for (const auto& r : w) {
    size_t hit = 0;
    bool prefix = true;
    for (uint64_t c : chains(r)) {
      prefix = !seen.insert(c).second && prefix;
      hit += prefix;
      ++total;
    }
    hits += hit;
    f.ttft_ms.push_back(prefill(ec, uncached(r, hit)));
  }
  f.hit_rate = total ? double(hits) / double(total) : 0;
  return f;
}

FloorResult causal_floor(const std::vector<SimRequest>& w, double rate, const mocker::EngineConfig& ec) {
  FloorResult f;
  std::unordered_map<uint64_t, double> avail;  // prefix identity -> earliest time any request has computed it
  uint64_t total = 0, hits = 0;
  for (const auto& r : w) {
    const double arrival = r.t_ms / rate;
    const auto c = chains(r);
    double best = prefill(ec, r.input_tokens);  // everything itself
    size_t best_k = 0;
    double best_ready = arrival;
    double ready = -std::numeric_limits<double>::infinity();  // when the first k blocks are all available
    for (size_t k = 1; k <= c.size(); ++k) {
      const auto it = avail.find(c[k - 1]);
      if (it == avail.end()) break;
      ready = std::max(ready, it->second);
      const double t = std::max(0.0, ready - arrival) + prefill(ec, uncached(r, k));
      if (t < best) best = t, best_k = k, best_ready = ready;
    }
    f.waited += best_ready > arrival;
    // This request computes blocks best_k.. itself; they exist from the end of its prefill.
    const double done = arrival + best;
    for (size_t i = best_k; i < c.size(); ++i) {
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
