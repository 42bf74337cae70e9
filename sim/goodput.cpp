// `kvroute-sim goodput`: the operator's question "how much more traffic does
// the same fleet carry". For each workload and policy, the highest arrival
// rate multiplier at which the fleet still meets both SLOs: TTFT p99 <=
// --slo-ttft-ms and inter-token latency p99 <= --slo-itl-ms, with nothing
// rejected. Found by bisection, which assumes that a policy meeting the SLOs
// at a rate meets them at any lower one (more load never helps it).
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "sim/floor.h"
#include "sim/report.h"

namespace kvroute::sim {

// Requests per second at rate multiplier `rate` (at_rate: sessions keep their pauses).
double requests_per_s(const std::vector<SimRequest>& w, double rate) {
  std::vector<SimRequest> storage;
  const auto& t = at_rate(w, rate, storage);
  const double span_s = t.size() > 1 ? (t.back().t_ms - t.front().t_ms) / rate / 1000.0 : 0;
  return span_s > 0 ? double(t.size()) / span_s : 0;
}

bool meets_slos(const PolicyResult& r, const Args& a) {
  return r.rejected == 0 && r.ttft_p99 <= a.slo_ttft_ms && r.itl_p99 <= a.slo_itl_ms;
}

double floor_p99_at_lowest_rate(const std::vector<SimRequest>& w, const Args& a) {
  return percentile(causal_floor(w, kLowestRate, engine_config(a.sim)).ttft_ms, 0.99);
}

Goodput goodput_search(const std::vector<SimRequest>& w, const Args& a, const std::string& policy,
                       const SchedulerConfig* scheduler) {
  std::map<double, PolicyResult> runs;
  const RateBracket b = bisect_rate(
      [&](double rate) {
        SimOptions o = a.sim;
        o.rate = rate;
        return meets_slos(runs[rate] = simulate(w, o, policy, scheduler), a);
      },
      a.goodput_steps);
  return Goodput{b.lo, runs[b.lo > 0 ? b.lo : kLowestRate], b.hi};
}

int goodput(const Args& a) {
  std::printf("goodput: the highest arrival rate (x the workload's own) with TTFT p99 <= %.0f ms and inter-token\n"
              "latency p99 <= %.0f ms, nothing rejected; bisection, %d steps after bracketing; %u workers, profile %s\n\n",
              a.slo_ttft_ms, a.slo_itl_ms, a.goodput_steps, a.sim.workers, a.sim.engine_profile.c_str());
  std::printf("| workload |");
  for (const auto& p : a.policies) std::printf(" %s |", p.c_str());
  std::printf(" kvroute / best peer (>= 1.15x) |\n|---|");
  for (size_t i = 0; i <= a.policies.size(); ++i) std::printf("---|");
  std::printf("\n");
  std::string json = "{\"goodput\":[";
  for (const auto& wl : a.workloads) {
    // Held out by default (the trace's test slice, each generated workload drawn with the seed);
    // --slice train: the slices `tune` chooses on (the trace's first half, another draw of each).
    const bool train = a.slice == "train";
    const auto w = load_slice(a, wl, train ? "train" : wl == "trace" ? "test" : "all");
    std::printf("| %s |", (wl == "trace" ? "trace/" + std::string(train ? "train" : "test")
                                          : wl + (train ? "/train" : "")).c_str());
    double kv = 0, best_peer = 0;
    json += std::string(json.back() == '[' ? "" : ",") + "{\"workload\":\"" + wl + "\"";
    // No router meets a TTFT p99 below the causal floor's (sim/floor.h) at the lowest rate tried.
    const double floor_p99 = floor_p99_at_lowest_rate(w, a);
    if (floor_p99 > a.slo_ttft_ms) {
      std::printf(" floor-bound: the causal floor's TTFT p99 is %.0f ms even at x1/64 |\n", floor_p99);
      char buf[96];
      std::snprintf(buf, sizeof buf, ",\"floor_bound_p99_ms\":%.1f}", floor_p99);
      json += buf;
      continue;
    }
    for (const auto& p : a.policies) {
      const Goodput g = goodput_search(w, a, p);
      const double rps = g.rate > 0 ? requests_per_s(w, g.rate) : 0;
      if (g.rate > 0)
        std::printf(" x%.3g (%.1f req/s; p99 TTFT %.0f ms, ITL %.0f ms) |", g.rate, rps, g.at.ttft_p99, g.at.itl_p99);
      else
        std::printf(" none down to x1/%.0f (there: p99 TTFT %.0f ms, ITL %.0f ms, %zu rejected) |", 1 / kLowestRate,
                    g.at.ttft_p99, g.at.itl_p99, g.at.rejected);
      std::fflush(stdout);
      char buf[160];
      std::snprintf(buf, sizeof buf, ",\"%s\":{\"rate\":%.4f,\"req_s\":%.3f}", p.c_str(), g.rate, rps);
      json += buf;
      // --check: the bracket is consistent when run again (same seed, same numbers): the rate found
      // meets the SLOs and the lowest rate seen missing them misses them.
      if (a.check && g.rate > 0 && !meets_slos(simulate(w, [&] { SimOptions o = a.sim; o.rate = g.rate; return o; }(), p), a)) {
        std::fprintf(stderr, "kvroute-sim goodput --check FAILED: %s on %s misses the SLOs at x%g\n", p.c_str(),
                     wl.c_str(), g.rate);
        return 1;
      }
      if (a.check && g.failed > 0 && meets_slos(simulate(w, [&] { SimOptions o = a.sim; o.rate = g.failed; return o; }(), p), a)) {
        std::fprintf(stderr, "kvroute-sim goodput --check FAILED: %s on %s meets the SLOs at x%g, reported missed\n",
                     p.c_str(), wl.c_str(), g.failed);
        return 1;
      }
      if (p == "kvroute") kv = g.rate;
      else if (p == "dynamo" || p == "llmd") best_peer = std::max(best_peer, g.rate);
    }
    if (best_peer > 0) {
      if (kv >= kGoodputTarget * best_peer) std::printf(" %.2fx ok |\n", kv / best_peer);
      else std::printf(" %.2fx MISS (target >= %.2fx) |\n", kv / best_peer, kGoodputTarget);
    } else if (kv > 0) {
      std::printf(" no peer meets the SLOs; kvroute does |\n");
    } else {
      std::printf(" - (nobody meets the SLOs down to x1/%.0f) |\n", 1 / kLowestRate);
    }
    json += "}";
  }
  std::printf("\n%s]}\n", json.c_str());
  if (a.check) std::printf("goodput check: ok\n");
  return 0;
}

}  // namespace kvroute::sim
