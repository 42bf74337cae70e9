// `kvroute-sim targets`: the target table. For every workload (the trace's
// test slice, then each generated one) and rate: kvroute's TTFT p50/p99
// relative to dynamo, llmd and round_robin, its hit rate relative to the
// infinite-cache ideal, and a verdict per target with the reason when missed.
// Targets: <= 0.8x dynamo and llmd (p50 and p99); <= 0.5x round_robin at the
// stressed level (the highest rate); hit rate >= 0.9 of ideal; never worse
// than dynamo. A miss is explained by the engine floor (engine_floor()) when
// the peer is already within 1.25x of it: no router can be 0.8x there.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_set>

#include <simdjson.h>

#include "mocker/engine.h"
#include "sim/report.h"

namespace kvroute::sim {

namespace {

struct Cell {
  std::string workload;
  double rate = 0;
  PolicyResult kv, dyn, llmd, rr;
  double ideal = 0, floor_p50 = 0, floor_p99 = 0;
};

// TTFT with one infinite cache and nothing queued: the prefill of what the
// ideal cache misses plus the decode of the requests running in the same step
// (at its minimum, decode_base_ms), from the engine's own step model.
void engine_floor(const std::vector<SimRequest>& w, double& p50, double& p99) {
  const mocker::EngineConfig ec;
  std::unordered_set<uint64_t> seen;
  std::vector<double> t;
  for (const auto& r : w) {
    uint64_t chain = 0, hit = 0;
    const uint32_t full = std::min<uint32_t>(static_cast<uint32_t>(r.ids.size()), r.input_tokens / kBlock);
    bool prefix = true;
    for (uint32_t i = 0; i < full; ++i) {
      chain = mix(chain ^ mix(r.ids[i]));
      const bool known = !seen.insert(chain).second;
      prefix = prefix && known;
      hit += prefix;
    }
    const double n = r.input_tokens - std::min<double>(r.input_tokens, double(hit) * kBlock);
    t.push_back(ec.prefill_a * n * n + ec.prefill_b * n + ec.prefill_c + ec.decode_base_ms);
  }
  p50 = percentile(t, 0.5);
  p99 = percentile(t, 0.99);
}

std::string verdict(double ratio, double target, double peer_ms, double floor_ms) {
  char buf[160];
  if (ratio <= target) {
    std::snprintf(buf, sizeof buf, "%.2fx ok", ratio);
  } else if (peer_ms < 1.25 * floor_ms) {
    std::snprintf(buf, sizeof buf, "%.2fx MISS (peer %.0f ms is within 1.25x of the engine floor %.0f ms)", ratio,
                  peer_ms, floor_ms);
  } else {
    std::snprintf(buf, sizeof buf, "%.2fx MISS", ratio);
  }
  return buf;
}

void print_cell(const Cell& c, bool stressed) {
  std::printf("| %s | x%g | %s | %s | %s | %s | ", c.workload.c_str(), c.rate,
              verdict(c.kv.ttft_p50 / c.dyn.ttft_p50, 0.8, c.dyn.ttft_p50, c.floor_p50).c_str(),
              verdict(c.kv.ttft_p99 / c.dyn.ttft_p99, 0.8, c.dyn.ttft_p99, c.floor_p99).c_str(),
              verdict(c.kv.ttft_p50 / c.llmd.ttft_p50, 0.8, c.llmd.ttft_p50, c.floor_p50).c_str(),
              verdict(c.kv.ttft_p99 / c.llmd.ttft_p99, 0.8, c.llmd.ttft_p99, c.floor_p99).c_str());
  if (stressed)
    std::printf("%s / %s | ", verdict(c.kv.ttft_p50 / c.rr.ttft_p50, 0.5, c.rr.ttft_p50, c.floor_p50).c_str(),
                verdict(c.kv.ttft_p99 / c.rr.ttft_p99, 0.5, c.rr.ttft_p99, c.floor_p99).c_str());
  else
    std::printf("(not stressed) | ");
  const double hit = c.ideal > 0 ? c.kv.hit_rate / c.ideal : 1;
  const bool never_worse = c.kv.ttft_p50 <= c.dyn.ttft_p50 && c.kv.ttft_p99 <= c.dyn.ttft_p99;
  std::printf("%.3f = %.2f %s | %s | %.0f/%.0f | %.0f/%.0f | %.0f/%.0f | %.0f/%.0f |\n", c.kv.hit_rate, hit,
              hit >= 0.9 ? "ok" : "MISS", never_worse ? "yes" : "NO", c.kv.ttft_p50, c.kv.ttft_p99, c.dyn.ttft_p50,
              c.dyn.ttft_p99, c.llmd.ttft_p50, c.llmd.ttft_p99, c.rr.ttft_p50, c.rr.ttft_p99);
}

std::string cell_json(const Cell& c) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"workload\":\"%s\",\"rate\":%g,\"kvroute_p50\":%.2f,\"kvroute_p99\":%.2f,\"dynamo_p50\":%.2f,"
                "\"dynamo_p99\":%.2f,\"llmd_p50\":%.2f,\"llmd_p99\":%.2f,\"round_robin_p50\":%.2f,"
                "\"round_robin_p99\":%.2f,\"kvroute_hit\":%.4f,\"ideal_hit\":%.4f}",
                c.workload.c_str(), c.rate, c.kv.ttft_p50, c.kv.ttft_p99, c.dyn.ttft_p50, c.dyn.ttft_p99,
                c.llmd.ttft_p50, c.llmd.ttft_p99, c.rr.ttft_p50, c.rr.ttft_p99, c.kv.hit_rate, c.ideal);
  return buf;
}

// --expect: every published cell's figures within the relative tolerance.
int compare(const std::string& path, const std::vector<std::string>& lines, double tol) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "kvroute-sim targets: cannot read --expect %s\n", path.c_str());
    return 2;
  }
  simdjson::dom::parser pa, pb;
  std::string line;
  size_t i = 0, bad = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    if (i >= lines.size()) {
      std::fprintf(stderr, "targets --expect: the published table has more cells than this run\n");
      return 1;
    }
    simdjson::dom::object want, got;
    if (pa.parse(line).get(want) || pb.parse(lines[i]).get(got)) return 2;
    for (auto [key, v] : want) {
      double x = 0, y = 0;
      if (v.get_double().get(x)) continue;  // the workload name
      if (got[key].get_double().get(y)) return 2;
      if (std::abs(x - y) > tol * std::max(std::abs(x), 1e-9)) {
        std::fprintf(stderr, "targets --expect: cell %zu %s: published %g, now %g (tolerance %.0f%%)\n", i,
                     std::string(key).c_str(), x, y, tol * 100);
        ++bad;
      }
    }
    ++i;
  }
  if (i != lines.size()) {
    std::fprintf(stderr, "targets --expect: %zu published cells, %zu now\n", i, lines.size());
    return 1;
  }
  if (bad) return 1;
  std::printf("targets: all %zu cells within %.0f%% of %s\n", i, tol * 100, path.c_str());
  return 0;
}

}  // namespace

int targets(const Args& a) {
  std::printf("| workload | rate | p50 vs dynamo | p99 vs dynamo | p50 vs llmd | p99 vs llmd | p50 / p99 vs round_robin "
              "| hit rate = of ideal | never worse than dynamo | kvroute p50/p99 ms | dynamo | llmd | round_robin |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> json;
  for (const auto& wl : a.workloads) {
    const auto w = load_slice(a, wl, wl == "trace" ? "test" : "all");
    Cell base;
    base.workload = wl == "trace" ? "trace/test" : wl;
    base.ideal = ideal_hit_rate(w);
    engine_floor(w, base.floor_p50, base.floor_p99);
    for (double rate : a.rates) {
      SimOptions o = a.sim;
      o.rate = rate;
      Cell c = base;
      c.rate = rate;
      c.kv = simulate(w, o, "kvroute");
      c.dyn = simulate(w, o, "dynamo");
      c.llmd = simulate(w, o, "llmd");
      c.rr = simulate(w, o, "round_robin");
      print_cell(c, rate == a.rates.back());
      json.push_back(cell_json(c));
    }
  }
  for (const auto& j : json) std::printf("%s\n", j.c_str());
  if (!a.expect.empty()) return compare(a.expect, json, a.tolerance);
  return 0;
}

}  // namespace kvroute::sim
