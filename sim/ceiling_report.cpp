// `kvroute-sim ceiling`: per workload, the goodput ceiling (sim/ceiling.h):
// the rates at which no router can keep TTFT p99 within --slo-ttft-ms on the
// engine model, found by goodput's rate search; then (unless --no-goodput)
// each policy's measured goodput (`goodput`'s search, both SLOs) against it:
// how tight the ceiling is, and whether 1.15x the better peer's goodput (the
// goodput target) lies above it, checked at that rate directly. --check fails
// if any policy's goodput is ruled out by the ceiling (the bound would be
// wrong). Prints a table, then one JSON line per workload (--expect compares).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "sim/ceiling.h"
#include "sim/report.h"

namespace kvroute::sim {

namespace {

CeilingOptions ceiling_options(const Args& a) {
  CeilingOptions o;
  o.workers = a.sim.workers;
  o.max_seqs = a.sim.max_seqs;
  // KV tiers below the device hold blocks the device evicted: no device-only KV bound then.
  o.kv_blocks = a.sim.tiers.any() ? 0 : engine_config(a.sim).kv_blocks;
  o.slo_ttft_ms = a.slo_ttft_ms;
  return o;
}

// Why a rate is ruled out, or "-".
std::string why(const WorkBound& b) {
  char buf[200];
  if (b.floor_misses > b.allowed)
    std::snprintf(buf, sizeof buf, "TTFT floor: %zu requests' causal floor > SLO, %zu may miss", b.floor_misses,
                  b.allowed);
  else if (b.ruled_out() && b.windows.size() == 1)
    std::snprintf(buf, sizeof buf, "work: %zu floor misses + >= %zu forced out by the work of arrivals %.0f-%.0f s "
                  "(%zu requests) > %zu may miss", b.floor_misses, b.need, b.windows[0].start_ms / 1000,
                  b.windows[0].end_ms / 1000, b.windows[0].requests, b.allowed);
  else if (b.ruled_out())
    std::snprintf(buf, sizeof buf, "work: %zu floor misses + >= %zu forced out by the work in %zu windows > %zu may miss",
                  b.floor_misses, b.need, b.windows.size(), b.allowed);
  else
    return "-";
  return buf;
}

std::string rate_str(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "x%.3g", r);
  return buf;
}

struct Row {
  std::string workload;
  Ceiling c;
  std::vector<Goodput> goodputs;  // per a.policies (empty with --no-goodput or below the floor)
  double best = 0;                // the highest goodput of any policy
  double best_peer = 0;           // the better of dynamo and llmd
  double load_at_best = 0;        // run_load at `best`
  double recompute_s = 0;         // the KV bound's forced recomputation at the ceiling
  bool target_ruled_out = false;  // 1.15x best_peer ruled out directly
  WorkBound at_target;
};

std::string ratio(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", x);
  return buf;
}

void print_row(const Row& r, const Args& a) {
  std::printf("| %s | %s | %s | %s | %.0f |", r.workload.c_str(),
              r.c.rate > 0 ? rate_str(r.c.rate).c_str() : "none down to x1/64",
              r.c.ruled_out > 0 ? rate_str(r.c.ruled_out).c_str() : "none up to x256", why(r.c.beyond).c_str(),
              r.recompute_s);
  if (a.policies.empty()) return (void)std::printf("\n");
  for (const auto& g : r.goodputs) std::printf(" %s |", g.rate > 0 ? rate_str(g.rate).c_str() : "none");
  for (size_t i = r.goodputs.size(); i < a.policies.size(); ++i) std::printf(" - |");
  if (r.best > 0)
    std::printf(" %s | %.2f |", r.c.rate > 0 ? ratio(r.c.rate / r.best).c_str() : "-", r.load_at_best);
  else
    std::printf(" - | - |");
  if (r.best_peer > 0)
    std::printf(" %s: %s |\n", rate_str(1.15 * r.best_peer).c_str(),
                r.target_ruled_out ? ("unreachable (" + why(r.at_target) + ")").c_str()
                                   : ("ceiling " + ratio(r.c.rate / (1.15 * r.best_peer)) + " of it").c_str());
  else
    std::printf(" - |\n");
}

std::string row_json(const Row& r, const Args& a) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "{\"workload\":\"%s\",\"ceiling\":%.4f,\"ruled_out\":%.4f,\"allowed\":%zu,\"floor_misses\":%zu,"
                "\"need\":%zu,\"recompute_s\":%.1f",
                r.workload.c_str(), r.c.rate, r.c.ruled_out, r.c.beyond.allowed, r.c.beyond.floor_misses,
                r.c.beyond.need, r.recompute_s);
  std::string json = buf;
  for (size_t i = 0; i < r.goodputs.size(); ++i) {
    std::snprintf(buf, sizeof buf, ",\"%s\":%.4f", a.policies[i].c_str(), r.goodputs[i].rate);
    json += buf;
  }
  return json + "}";
}

// Each policy's goodput on `w` into `r`; --check: false if the ceiling rules one out (the bound would be wrong).
bool measure(const std::vector<SimRequest>& w, const Args& a, const mocker::EngineConfig& ec,
             const CeilingOptions& o, Row& r) {
  bool ok = true;
  for (const auto& p : a.policies) {
    r.goodputs.push_back(goodput_search(w, a, p));
    const double g = r.goodputs.back().rate;
    r.best = std::max(r.best, g);
    if (p == "dynamo" || p == "llmd") r.best_peer = std::max(r.best_peer, g);
    // The rate itself must not be ruled out, nor lie at or above the lowest rate ruled out.
    if (a.check && g > 0 && (check_rate(w, g, ec, o).ruled_out() || (r.c.ruled_out > 0 && g >= r.c.ruled_out))) {
      std::fprintf(stderr, "kvroute-sim ceiling --check FAILED: %s meets the SLOs on %s at x%g, which the ceiling rules out\n",
                   p.c_str(), r.workload.c_str(), g);
      ok = false;
    }
  }
  if (r.best > 0) r.load_at_best = run_load(minimal_work(w, r.best, ec, o), o);
  if (r.best_peer > 0) {
    r.at_target = check_rate(w, 1.15 * r.best_peer, ec, o);
    r.target_ruled_out = r.at_target.ruled_out();
  }
  return ok;
}

}  // namespace

int ceiling(const Args& a) {
  const auto ec = engine_config(a.sim);
  if (!ceiling_supported(ec.profile, ec.max_batched_tokens)) {
    std::fprintf(stderr, "kvroute-sim ceiling: profile %s is not a roofline profile the bounds hold on (sim/ceiling.h)\n",
                 a.sim.engine_profile.c_str());
    return 2;
  }
  const CeilingOptions o = ceiling_options(a);
  std::printf("ceiling: the rates (x the workload's own) at which no router keeps TTFT p99 <= %.0f ms on %u workers\n"
              "(%s, %u-token steps, %u sequences each): the causal floor and the minimal work in windows\n"
              "(sim/ceiling.h); rate search as goodput's, %d steps after bracketing. Goodput: TTFT p99 <= %.0f ms,\n"
              "ITL p99 <= %.0f ms, nothing rejected.\n\n",
              a.slo_ttft_ms, a.sim.workers, a.sim.engine_profile.c_str(), ec.max_batched_tokens, ec.max_seqs,
              a.goodput_steps + 4, a.slo_ttft_ms, a.slo_itl_ms);
  std::printf("| workload | ceiling (highest rate not ruled out) | lowest rate ruled out | why | KV recomputation "
              "forced at the ceiling (engine-s) |");
  if (!a.policies.empty()) {
    for (const auto& p : a.policies) std::printf(" %s goodput |", p.c_str());
    std::printf(" ceiling / best goodput | minimal work / fleet time at the best goodput | 1.15x the better peer |");
  }
  std::printf("\n|---|---|---|---|---|");
  if (!a.policies.empty())
    for (size_t i = 0; i < a.policies.size() + 3; ++i) std::printf("---|");
  std::printf("\n");
  std::vector<std::string> lines;
  bool ok = true;
  for (const auto& wl : a.workloads) {
    const auto w = load_slice(a, wl, wl == "trace" ? "test" : "all");
    Row r;
    r.workload = wl == "trace" ? "trace/test" : wl;
    r.c = find_ceiling(w, ec, o, a.goodput_steps + 4);
    if (r.c.rate > 0) r.recompute_s = minimal_work(w, r.c.rate, ec, o).recompute_ms / 1000;
    // Below the floor at x1/64 goodput has no rate to find (it reports such a workload floor-bound).
    if (r.c.rate > 0) ok = measure(w, a, ec, o, r) && ok;
    print_row(r, a);
    std::fflush(stdout);
    lines.push_back(row_json(r, a));
  }
  std::printf("\n");
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  if (!ok) return 1;
  if (a.check) std::printf("ceiling check: ok (every goodput within the ceiling)\n");
  if (!a.expect.empty()) return compare_cells("ceiling", a.expect, lines, a.tolerance);
  return 0;
}

}  // namespace kvroute::sim
