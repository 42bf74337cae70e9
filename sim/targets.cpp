// `kvroute-sim targets`: the target table. For every workload (the trace's
// test slice, then each generated one) and rate: kvroute's TTFT p50/p99
// relative to dynamo, llmd and round_robin, its hit rate relative to the
// infinite-cache ideal, and a verdict per target with the reason when missed.
// Targets: <= 0.8x dynamo and llmd (p50 and p99); <= 0.5x round_robin at the
// stressed level (the highest rate); hit rate >= 0.9 of ideal; never worse
// than dynamo. A miss is floor-bound when the causal engine floor
// (sim/floor.h) is above the target: no router can meet it there.
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <unordered_set>

#include "mocker/engine.h"
#include "sim/floor.h"
#include "sim/report.h"

namespace kvroute::sim {

namespace {

struct Cell {
  std::string workload;
  double rate = 0;
  PolicyResult kv, dyn, llmd, rr;
  double ideal = 0, floor_p50 = 0, floor_p99 = 0;  // the causal floor at this rate
  double acausal_p50 = 0, acausal_p99 = 0, floor_hit = 0;
  size_t floor_waited = 0, requests = 0;
  DecodeInterference interference;
};

// A miss is floor-bound when the causal engine floor's percentile (sim/floor.h,
// a lower bound on any router's) is above target x the peer's: no router can
// meet it. Every miss says which, with both figures.
std::string ms(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 100 ? "%.1f ms" : "%.0f ms", v);
  return buf;
}

std::string verdict(double ratio, double target, double peer_ms, double floor_ms) {
  char buf[200];
  if (ratio <= target) {
    std::snprintf(buf, sizeof buf, "%.2fx ok", ratio);
  } else if (floor_ms > target * peer_ms) {
    std::snprintf(buf, sizeof buf, "%.2fx MISS (floor-bound: floor %s > %.1fx peer = %s)", ratio,
                  ms(floor_ms).c_str(), target, ms(target * peer_ms).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "%.2fx MISS (reachable: floor %s <= %.1fx peer = %s)", ratio,
                  ms(floor_ms).c_str(), target, ms(target * peer_ms).c_str());
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
  std::printf("%.3f = %.2f %s | %s | %.0f/%.0f | %.0f/%.0f | %.0f/%.0f | %.0f/%.0f | %zu/%zu/%zu of %zu |\n",
              c.kv.hit_rate, hit, hit >= 0.9 ? "ok" : "MISS", never_worse ? "yes" : "NO", c.kv.ttft_p50, c.kv.ttft_p99,
              c.dyn.ttft_p50, c.dyn.ttft_p99, c.llmd.ttft_p50, c.llmd.ttft_p99, c.rr.ttft_p50, c.rr.ttft_p99,
              c.kv.rejected, c.dyn.rejected, c.llmd.rejected, c.requests);
}

std::string cell_json(const Cell& c) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"workload\":\"%s\",\"rate\":%g,\"kvroute_p50\":%.2f,\"kvroute_p99\":%.2f,\"dynamo_p50\":%.2f,"
                "\"dynamo_p99\":%.2f,\"llmd_p50\":%.2f,\"llmd_p99\":%.2f,\"round_robin_p50\":%.2f,"
                "\"round_robin_p99\":%.2f,\"kvroute_hit\":%.4f,\"ideal_hit\":%.4f,\"floor_p50\":%.2f,\"floor_p99\":%.2f,"
                "\"kvroute_rejected\":%zu}",
                c.workload.c_str(), c.rate, c.kv.ttft_p50, c.kv.ttft_p99, c.dyn.ttft_p50, c.dyn.ttft_p99,
                c.llmd.ttft_p50, c.llmd.ttft_p99, c.rr.ttft_p50, c.rr.ttft_p99, c.kv.hit_rate, c.ideal, c.floor_p50,
                c.floor_p99, c.kv.rejected);
  return buf;
}

}  // namespace

int targets(const Args& a) {
  std::printf("| workload | rate | p50 vs dynamo | p99 vs dynamo | p50 vs llmd | p99 vs llmd | p50 / p99 vs round_robin "
              "| hit rate = of ideal | never worse than dynamo | kvroute p50/p99 ms | dynamo | llmd | round_robin "
              "| rejected (503) kvroute/dynamo/llmd of requests |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> json;
  std::vector<Cell> cells;
  for (const auto& wl : a.workloads) {
    const auto w = load_slice(a, wl, wl == "trace" ? "test" : "all");
    Cell base;
    base.workload = wl == "trace" ? "trace/test" : wl;
    base.ideal = ideal_hit_rate(w);
    const auto acausal = acausal_floor(w, engine_config(a.sim));
    base.acausal_p50 = percentile(acausal.ttft_ms, 0.5);
    base.acausal_p99 = percentile(acausal.ttft_ms, 0.99);
    base.requests = w.size();
    for (double rate : a.rates) {
      SimOptions o = a.sim;
      o.rate = rate;
      Cell c = base;
      c.rate = rate;
      const auto floor = causal_floor(w, rate, engine_config(a.sim));
      c.floor_p50 = percentile(floor.ttft_ms, 0.5);
      c.floor_p99 = percentile(floor.ttft_ms, 0.99);
      c.floor_hit = floor.hit_rate;
      c.floor_waited = floor.waited;
      c.interference = decode_interference(w, rate, engine_config(a.sim), a.sim.workers);
      c.kv = simulate(w, o, "kvroute");
      c.dyn = simulate(w, o, "dynamo");
      c.llmd = simulate(w, o, "llmd");
      c.rr = simulate(w, o, "round_robin");
      print_cell(c, rate == a.rates.back());
      json.push_back(cell_json(c));
      cells.push_back(c);
    }
  }
  std::printf("\n| workload | rate | causal floor p50/p99 ms | acausal floor p50/p99 ms | floor's hit rate | "
              "requests waiting for a prefix in computation | kvroute p50/p99 vs causal floor | "
              "decode interference: decodes per engine (fleet mean), mean context, ms added to a 512 / %u-token "
              "chunk's step |\n", a.sim.max_batched_tokens);
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const auto& c : cells)
    std::printf("| %s | x%g | %.0f/%.0f | %.0f/%.0f | %.3f | %zu of %zu | %.2fx/%.2fx | %.1f, %.0f tokens, +%.1f / +%.1f ms |\n",
                c.workload.c_str(), c.rate, c.floor_p50, c.floor_p99, c.acausal_p50, c.acausal_p99, c.floor_hit,
                c.floor_waited, c.requests, c.kv.ttft_p50 / c.floor_p50, c.kv.ttft_p99 / c.floor_p99,
                c.interference.decodes_per_engine, c.interference.mean_context, c.interference.added_ms_512,
                c.interference.added_ms_budget);
  for (const auto& j : json) std::printf("%s\n", j.c_str());
  if (!a.expect.empty()) return compare_cells("targets", a.expect, json, a.tolerance);
  return 0;
}

}  // namespace kvroute::sim
