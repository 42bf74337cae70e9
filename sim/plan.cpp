// kvroute-sim pools and plan: what KV tiers below the device are worth
// (sim/tiers.h), measured on the simulated fleet rather than assumed.
//
//   pools  per workload (default agentic) and rate: TTFT p50/p99, hit rate and
//          the shares loaded from the host tiers and the pool, without tiers,
//          with a host tier, with a shared pool at each --pool-bandwidths
//          value, and with both; per policy (default kvroute, dynamo).
//          Markdown, then one JSON line per cell (--expect compares).
//   plan   the capacity planner, on a workload (default the trace's test
//          slice; the workload-aware eviction is fit on its train slice):
//          hit rate and TTFT as a function of the per-worker device capacity
//          (--plan-device), the host tier (--plan-host, multiples of the
//          device's) and the pool (--plan-pool, multiples of the fleet's
//          device capacity), for LRU and the workload-aware eviction; then,
//          for a few configurations, the smallest fleet meeting the TTFT SLO
//          at the workload's rate (--slo-ttft-ms on the --slo-percentile,
//          --slo-itl-ms on ITL p99, nothing rejected), found by doubling and
//          bisection as `goodput` finds a rate, under the same assumption
//          (more workers never hurt). Markdown, one JSON line per cell,
//          --dat-out for the plots (sim/plan_report.sh).
//
// Threading: single-threaded.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>


#include "sim/report.h"
#include "sim/tiers.h"

namespace kvroute::sim {

namespace {

// A plan's shares near zero move by whole requests: numbers match within the
// tolerance or this much, whichever is larger.
constexpr double kShareFloor = 0.002;

double kv_bytes(const Args& a) {
  if (a.kv_bytes_per_token > 0) return a.kv_bytes_per_token;
  const mocker::EngineProfile* p = mocker::find_profile(a.sim.engine_profile);
  return p && p->kv_bytes_per_token > 0 ? p->kv_bytes_per_token : 131072.0;
}

double gib(uint64_t blocks, const Args& a) { return double(blocks) * kBlock * kv_bytes(a) / double(1ull << 30); }

// How the host tiers receive blocks, as the tables' headers say it.
const char* host_writes(const Args& a) {
  return a.sim.tiers.host_write_through
             ? "written through (every block as its device computes it; --host-write-through)"
             : "written back (a block when its device evicts it; --host-write-through writes through)";
}

std::string fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

}  // namespace

int pools(const Args& a) {
  const std::vector<std::string> workloads = a.workloads_set ? a.workloads : std::vector<std::string>{"agentic"};
  const std::vector<std::string> policies =
      a.policies_set ? a.policies : std::vector<std::string>{"kvroute", "dynamo"};
  const uint64_t device = engine_config(a.sim).kv_blocks;
  const uint64_t host = a.sim.tiers.host_blocks ? a.sim.tiers.host_blocks : 2 * device;
  const uint64_t pool = a.sim.tiers.pool_blocks ? a.sim.tiers.pool_blocks : 4 * device * a.sim.workers;
  struct Config {
    std::string name;
    uint64_t host = 0, pool = 0;
    double pool_bw = 0;
    bool write_through = false;
  };
  std::vector<Config> configs = {{"device only", 0, 0, 0}, {"+ host", host, 0, 0}};
  for (double bw : a.pool_bandwidths) configs.push_back({"+ pool " + fmt("%g", bw) + " GB/s", 0, pool, bw});
  for (double bw : a.pool_bandwidths) configs.push_back({"+ host + pool " + fmt("%g", bw) + " GB/s", host, pool, bw});
  // The middle bandwidth once more, the pool written through at compute time.
  const double mid = a.pool_bandwidths[a.pool_bandwidths.size() / 2];
  configs.push_back({"+ host + pool " + fmt("%g", mid) + " GB/s, write-through", host, pool, mid, true});
  std::printf("## The fleet and the table\n\n%u workers (%s), device %llu blocks (%.0f GiB) each; host tier "
              "%llu blocks (%.0f GiB) per worker at %.1f GB/s, %s; pool %llu blocks (%.0f GiB) shared, each worker "
              "loading at the bandwidth shown, the loads in flight sharing the pool's (%s); %s eviction in the tiers; %.0f bytes of KV per token; seed %llu.\n\n",
              a.sim.workers, a.sim.engine_profile.c_str(), (unsigned long long)device, gib(device, a),
              (unsigned long long)host, gib(host, a), a.sim.tiers.host_gb_per_s, host_writes(a), (unsigned long long)pool,
              gib(pool, a),
              a.sim.tiers.pool_total_gb_per_s > 0 ? (fmt("%g", a.sim.tiers.pool_total_gb_per_s) + " GB/s").c_str()
                                                  : "the bandwidth shown",
              to_string(a.sim.tiers.eviction), kv_bytes(a), (unsigned long long)a.sim.seed);
  std::printf("| workload | rate | policy | tiers | TTFT p50 ms | TTFT p99 ms | hit rate | from host | from pool | "
              "mean load ms |\n|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> json;
  for (const auto& wl : workloads) {
    const auto w = load_slice(a, wl, wl == "trace" ? "test" : "all");
    const ReuseProfiles profiles = train_profiles(a, wl);
    for (double rate : a.rates)
      for (const auto& pol : policies)
        for (const auto& c : configs) {
          SimOptions o = a.sim;
          o.rate = rate;
          o.tiers.host_blocks = c.host;
          o.tiers.pool_blocks = c.pool;
          if (c.pool) o.tiers.pool_gb_per_s = c.pool_bw;
          o.tiers.pool_write_through = c.write_through;
          o.tiers.kv_bytes_per_token = kv_bytes(a);
          o.tiers.profiles = profiles;
          const PolicyResult r = simulate(w, o, pol);
          std::printf("| %s | x%g | %s | %s | %.0f | %.0f | %.3f | %.3f | %.3f | %.1f |\n", wl.c_str(), rate,
                      pol.c_str(), c.name.c_str(), r.ttft_p50, r.ttft_p99, r.hit_rate, r.host_hit_rate,
                      r.pool_hit_rate, r.load_ms_mean);
          std::fflush(stdout);
          char line[512];
          std::snprintf(line, sizeof line,
                        "{\"workload\":\"%s\",\"rate\":%g,\"policy\":\"%s\",\"tiers\":\"%s\",\"ttft_p50_ms\":%.2f,"
                        "\"ttft_p99_ms\":%.2f,\"hit_rate\":%.4f,\"host_share\":%.4f,\"pool_share\":%.4f}",
                        wl.c_str(), rate, pol.c_str(), c.name.c_str(), r.ttft_p50, r.ttft_p99, r.hit_rate,
                        r.host_hit_rate, r.pool_hit_rate);
          json.push_back(line);
        }
  }
  std::printf("\n");
  for (const auto& l : json) std::printf("%s\n", l.c_str());
  if (!a.expect.empty()) return compare_cells("pools", a.expect, json, a.tolerance, kShareFloor);
  return 0;
}

namespace {

double ttft_at(const PolicyResult& r, double pct) { return pct >= 0.99 ? r.ttft_p99 : pct >= 0.9 ? r.ttft_p90 : r.ttft_p50; }

bool meets_slo(const PolicyResult& r, const Args& a) {
  return r.rejected == 0 && ttft_at(r, a.slo_percentile) <= a.slo_ttft_ms && r.itl_p99 <= a.slo_itl_ms;
}

struct Fleet {
  uint32_t workers = 0;  // smallest meeting the SLO (0: none up to kMaxFleet)
  PolicyResult at;
};


// The smallest fleet meeting the SLO (find_boundary, sim/boundary.h): from
// --workers, halve (or double) until the answer is bracketed, then bisect on
// the integer count.
Fleet smallest_fleet(const std::vector<SimRequest>& w, const Args& a, const SimOptions& base) {
  std::map<uint32_t, PolicyResult> seen;
  auto meets = [&](double x) {
    const auto n = static_cast<uint32_t>(x);
    SimOptions o = base;
    o.workers = n;
    // A pool sized per worker grows with the fleet (base.tiers.pool_blocks is for base.workers).
    if (base.tiers.pool_blocks) o.tiers.pool_blocks = base.tiers.pool_blocks * n / base.workers;
    const PolicyResult& r = seen[n] = simulate(w, o, "kvroute");
    return meets_slo(r, a);
  };
  const Bracket b = find_boundary(meets, fleet_search(base.workers));
  if (b.holds == 0) return {};
  const auto n = static_cast<uint32_t>(b.holds);
  return {n, seen[n]};
}

// The smallest fleet meeting the SLO for device only and the tiered fleets
// (--fleet-host-x, --fleet-pool-x), as a table and JSON lines.
void fleet_table(const std::vector<SimRequest>& w, const Args& a, const ReuseProfiles& profiles,
               uint64_t profile_blocks, std::vector<std::string>& json) {
  const int pct = static_cast<int>(std::lround(a.slo_percentile * 100));
  std::printf("\n## Smallest fleet meeting the SLO at x%g\n\nSLO: TTFT p%d <= %.0f ms, inter-token latency p99 <= "
              "%.0f ms, nothing rejected (policy kvroute, the profile's device capacity).\n\n"
              "| tiers | workers | TTFT p50 ms | TTFT p%d ms | ITL p99 ms | hit rate |\n|---|---|---|---|---|---|\n",
              a.sim.rate, pct, a.slo_ttft_ms, a.slo_itl_ms, pct);
  struct FleetConfig {
    std::string name;
    double host_x, pool_x;
    Eviction ev;
    bool write_through = false;
  };
  const double hx = a.fleet_host_x, px = a.fleet_pool_x;
  const std::vector<FleetConfig> fleets = {
      {"device only", 0, 0, Eviction::Lru},
      {"+ host " + fmt("%gx", hx) + " (lru)", hx, 0, Eviction::Lru},
      {"+ host " + fmt("%gx", hx) + " + pool " + fmt("%gx", px) + " (lru)", hx, px, Eviction::Lru},
      {"+ host " + fmt("%gx", hx) + " + pool " + fmt("%gx", px) + " (workload_aware)", hx, px,
       Eviction::WorkloadAware},
      {"+ host " + fmt("%gx", hx) + " + pool " + fmt("%gx", px) + " written through (lru)", hx, px, Eviction::Lru,
       true}};
  for (const auto& fc : fleets) {
    SimOptions o = a.sim;
    o.kv_blocks = profile_blocks;
    o.tiers.host_blocks = static_cast<uint64_t>(std::llround(fc.host_x * double(profile_blocks)));
    o.tiers.pool_blocks = static_cast<uint64_t>(std::llround(fc.pool_x * double(profile_blocks) * o.workers));
    o.tiers.kv_bytes_per_token = kv_bytes(a);
    o.tiers.eviction = fc.ev;
    o.tiers.pool_write_through = fc.write_through;
    o.tiers.profiles = profiles;
    const Fleet f = smallest_fleet(w, a, o);
    if (f.workers == 0)
      std::printf("| %s | more than %u | | | | |\n", fc.name.c_str(), kMaxFleet);
    else
      std::printf("| %s | %u | %.0f | %.0f | %.0f | %.3f |\n", fc.name.c_str(), f.workers, f.at.ttft_p50,
                  ttft_at(f.at, a.slo_percentile), f.at.itl_p99, f.at.hit_rate);
    std::fflush(stdout);
    char line[256];
    std::snprintf(line, sizeof line, "{\"fleet\":\"%s\",\"workers\":%u}", fc.name.c_str(), f.workers);
    json.push_back(line);
  }
}

}  // namespace

int plan(const Args& a) {
  const std::string wl = a.workload;
  const std::string slice = wl == "trace" && a.slice == "all" ? "test" : a.slice;
  const auto w = load_slice(a, wl, slice);
  const ReuseProfiles profiles = train_profiles(a, wl);
  const double span_s = w.empty() ? 0 : w.back().t_ms / 1000.0;
  std::printf("## The run\n\nworkload %s (%s): %zu requests over %.0f s (%.2f requests/s at x%g); %u workers "
              "(%s), %.0f bytes of KV per token (%.0f MiB per 512-token block); host tiers at %.1f GB/s, %s; pool at "
              "%.1f GB/s per worker's link and %.1f GB/s in all, shared by the loads in flight; policy kvroute; "
              "seed %llu. Host sizes are per worker, in multiples of the device's; pool sizes in multiples of the "
              "whole fleet's device capacity.\n\n",
              wl.c_str(), slice.c_str(), w.size(), span_s, span_s > 0 ? double(w.size()) / span_s * a.sim.rate : 0,
              a.sim.rate, a.sim.workers, a.sim.engine_profile.c_str(), kv_bytes(a),
              double(kBlock) * kv_bytes(a) / (1 << 20), a.sim.tiers.host_gb_per_s, host_writes(a), a.sim.tiers.pool_gb_per_s,
              a.sim.tiers.pool_total_gb_per_s > 0 ? a.sim.tiers.pool_total_gb_per_s : a.sim.tiers.pool_gb_per_s,
              (unsigned long long)a.sim.seed);
  std::printf("The workload-aware eviction's reuse profiles (fit on the %s; category = turn):\n\n"
              "| category | reused | mean time to reuse s | lifetime (p99) s |\n|---|---|---|---|\n",
              wl == "trace" ? "trace's train slice" : "workload's first half");
  const char* names[kCategories] = {"turn 1", "turn 2", "turn 3-5", "turn 6+"};
  for (size_t c = 0; c < kCategories; ++c)
    std::printf("| %s | %.3f | %.1f | %.1f |\n", names[c], profiles[c].p_reuse, profiles[c].mean_ms / 1000,
                profiles[c].life_ms / 1000);
  std::printf("\n## Hit rate and TTFT by capacity\n\n| device blocks/worker (GiB) | host/worker | pool | eviction | "
              "hit rate | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | from host | from pool |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> json, dat;
  const uint64_t profile_blocks = engine_config([&] { SimOptions o = a.sim; o.kv_blocks = 0; return o; }()).kv_blocks;
  for (double dx : a.plan_device)
    for (double hx : a.plan_host)
      for (double px : a.plan_pool)
        for (Eviction ev : {Eviction::Lru, Eviction::WorkloadAware}) {
          if (hx == 0 && px == 0 && ev == Eviction::WorkloadAware) continue;  // no tier to evict from
          SimOptions o = a.sim;
          o.kv_blocks = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(dx * double(profile_blocks))));
          o.tiers.host_blocks = static_cast<uint64_t>(std::llround(hx * double(o.kv_blocks)));
          o.tiers.pool_blocks = static_cast<uint64_t>(std::llround(px * double(o.kv_blocks) * o.workers));
          o.tiers.kv_bytes_per_token = kv_bytes(a);
          o.tiers.eviction = ev;
          o.tiers.profiles = profiles;
          const PolicyResult r = simulate(w, o, "kvroute");
          std::printf("| %llu (%.0f) | %gx | %gx | %s | %.3f | %.0f | %.0f | %.0f | %.3f | %.3f |\n",
                      (unsigned long long)o.kv_blocks, gib(o.kv_blocks, a), hx, px, to_string(ev), r.hit_rate,
                      r.ttft_p50, r.ttft_p90, r.ttft_p99, r.host_hit_rate, r.pool_hit_rate);
          std::fflush(stdout);
          char line[512];
          std::snprintf(line, sizeof line,
                        "{\"device_x\":%g,\"host_x\":%g,\"pool_x\":%g,\"eviction\":\"%s\",\"hit_rate\":%.4f,"
                        "\"ttft_p50_ms\":%.2f,\"ttft_p90_ms\":%.2f,\"ttft_p99_ms\":%.2f}",
                        dx, hx, px, to_string(ev), r.hit_rate, r.ttft_p50, r.ttft_p90, r.ttft_p99);
          json.push_back(line);
          std::snprintf(line, sizeof line, "%g %g %g %d %.4f %.2f %.2f %.2f %.4f %.4f", dx, hx, px,
                        ev == Eviction::Lru ? 0 : 1, r.hit_rate, r.ttft_p50, r.ttft_p90, r.ttft_p99,
                        r.host_hit_rate, r.pool_hit_rate);
          dat.push_back(line);
        }
  if (a.plan_fleet) fleet_table(w, a, profiles, profile_blocks, json);
  std::printf("\n");
  for (const auto& l : json) std::printf("%s\n", l.c_str());
  if (!a.dat_out.empty()) {
    std::ofstream out(a.dat_out);
    out << "# device_x host_x pool_x eviction(0 lru, 1 workload_aware) hit_rate ttft_p50 ttft_p90 ttft_p99 "
           "host_share pool_share\n";
    for (const auto& l : dat) out << l << "\n";
  }
  if (!a.expect.empty()) return compare_cells("plan", a.expect, json, a.tolerance, kShareFloor);
  return 0;
}

}  // namespace kvroute::sim
