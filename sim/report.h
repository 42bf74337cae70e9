// kvroute-sim's command line, tables and checks: the run table and JSON, the
// target table (kvroute vs the peers at several rates and workloads, with
// the reason next to every target it misses), `tune`, and the invariants
// that --check asserts.
//
// Threading: single-threaded (the command's main thread).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "sim/boundary.h"
#include "sim/simulate.h"
#include "sim/workload.h"

namespace kvroute::sim {

struct Args {
  SimOptions sim;
  std::string trace = KVROUTE_DEFAULT_TRACE;
  std::string workload = "trace";
  std::string slice = "all";
  std::vector<std::string> workloads = {"trace", "agentic", "api", "bursts", "long_agents", "team"};
  std::vector<double> rates = {1, 2, 3};
  size_t requests = SIZE_MAX;
  std::vector<std::string> policies = {"round_robin", "random", "least_loaded", "dynamo_v01",
                                       "dynamo",      "llmd",   "kvroute"};
  bool policies_set = false;  // --policies given
  std::string cdf_out, expect;
  std::string requests_out;  // --requests-out: one JSON line per request (write_requests)
  bool check = false;
  double tolerance = 0.05;
  double slo_ttft_ms = 2000, slo_itl_ms = 1000;  // goodput's SLOs (p99 of each)
  int goodput_steps = 6;                        // bisection steps after bracketing
  // targets: the load levels, fractions of the better peer's capacity
  // (sim/load_levels.cpp), and the bisection steps that find it.
  std::vector<double> levels = {0.3, 0.6, 0.9};
  int level_steps = 4;
  // pd, pd-tune (sim/pd_report.cpp): the disaggregated fleet and its link.
  uint32_t pd_prefill = 2, pd_decode = 2;  // --pd X:Y
  double kv_link_gbps = 400, kv_bytes_per_token = 0;
  bool workloads_set = false;                    // --workloads given
  bool rates_set = false;                        // --rates given
  // pools and plan (sim/plan.cpp): the tiers' figures and the capacity planner.
  std::vector<double> pool_bandwidths = {5, 12.5, 50};  // GB/s, pools
  std::vector<double> plan_device = {0.5, 1};           // x the profile's device blocks per worker
  std::vector<double> plan_host = {0, 1, 2, 4};         // x the device's, per worker
  std::vector<double> plan_pool = {0, 1, 4};            // x the fleet's device capacity
  bool plan_fleet = true;                               // plan: the smallest-fleet search
  double fleet_host_x = 2, fleet_pool_x = 1;            // plan: the tiered fleets searched
  double slo_percentile = 0.9;                          // plan: the TTFT SLO's percentile (0.5, 0.9, 0.99)
  std::string dat_out;                                  // plan: the capacity grid for plotting
  bool ceiling_goodput = true;                          // ceiling: measure each policy's goodput too
};

// The workload's requests; for the trace, `slice` all, train or test (time split at 50%);
// for a generated one, train is another draw (train_seed), all and test the --seed's own.
std::vector<SimRequest> load_slice(const Args& a, const std::string& workload, const std::string& slice);

// The workload-aware eviction's reuse profiles (sim/tiers.h), fit on the
// first half of the workload's time (for the trace: its train slice).
ReuseProfiles train_profiles(const Args& a, const std::string& workload);

void print_table(const std::vector<PolicyResult>& results, double ideal);
std::string results_json(const std::vector<PolicyResult>& results, double ideal);
void write_cdf(const std::string& path, std::vector<PolicyResult>& results);
// One JSON line per request and policy: {"policy", "i", "arrival_ms", "ttft_ms", "worker", "cached", "blocks"}
// (PolicyResult::requests), the shape bench/replay/replay.py --requests-out writes for a live replay.
void write_requests(const std::string& path, const std::vector<PolicyResult>& results);
// --check: every request answered or rejected, hit rates within the ideal
// and within `capacity_bound` (sim/hit_bound.h; 1 when there is none), kvroute
// ahead of round_robin on hit rate, the TTFT model's MAPE finite.
int check_run(const std::vector<SimRequest>& w, const Args& a, const std::vector<PolicyResult>& results, double ideal,
              double capacity_bound);

// --expect of `targets`, `pd`, `pools` and `plan`: each JSON line of `path`
// (a published table) against the same cell of this run: strings equal,
// numbers within the relative tolerance or `abs_floor`, whichever is larger
// (shares near zero move by whole requests). `what` names the command in
// messages. 0 = all match, 1 = a difference, 2 = unreadable.
int compare_cells(const char* what, const std::string& path, const std::vector<std::string>& lines, double tol,
                  double abs_floor = 0);

// The load levels' reference (sim/load_levels.cpp): the highest rate at which
// the better of dynamo and llmd keeps TTFT p99 <= the causal floor's p99 +
// --slo-ttft-ms, ITL p99 <= --slo-itl-ms and rejects nothing (bisect_rate,
// --level-steps). kvroute is not run.
struct PeerProbe {
  double rate = 0;       // x the workload's own
  bool met = false;      // a peer meets the criterion at this rate
  std::string peer;      // the peer meeting it (not met: the one with the lower TTFT p99)
  PolicyResult at;       // that peer's run
  double floor_p99 = 0;  // the causal floor's TTFT p99 at this rate
};
struct Capacity {
  double rate = 0;   // the capacity; 0: no peer meets the criterion down to kLowestRate
  PeerProbe limit;   // the run at `rate` (rate 0: at kLowestRate, not met)
  PeerProbe beyond;  // the lowest rate seen where no peer meets it (rate 0: none up to kHighestRate)
};
Capacity peer_capacity(const std::vector<SimRequest>& w, const Args& a);

// goodput's search (sim/goodput.cpp): one policy's highest rate meeting both SLOs, nothing rejected.
// Its target: kvroute carries at least this multiple of the better peer's rate.
inline constexpr double kGoodputTarget = 1.15;
bool meets_slos(const PolicyResult& r, const Args& a);
struct Goodput {
  double rate = 0;  // highest multiplier found meeting the SLOs (0: none down to the lowest tried)
  PolicyResult at;  // the run at that rate (rate 0: the run at the lowest rate tried)
  double failed = 0;  // the lowest rate tried that missed them (0: none missed up to kHighestRate)
};
// `scheduler` (optional) replaces the kvroute policy's scheduler block, as in simulate().
Goodput goodput_search(const std::vector<SimRequest>& w, const Args& a, const std::string& policy,
                       const SchedulerConfig* scheduler = nullptr);
// The causal floor's TTFT p99 at the lowest rate goodput tries: above the TTFT SLO, no router meets it
// at any rate and goodput reports the workload floor-bound.
double floor_p99_at_lowest_rate(const std::vector<SimRequest>& w, const Args& a);
// Requests per second at rate multiplier `rate` (at_rate: sessions keep their pauses).
double requests_per_s(const std::vector<SimRequest>& w, double rate);

int tune(const Args& a);
int goodput(const Args& a);
int ceiling(const Args& a);  // sim/ceiling_report.cpp
int targets(const Args& a);
int pd(const Args& a);       // sim/pd_report.cpp
int pd_tune(const Args& a);
int pools(const Args& a);    // sim/plan.cpp
int plan(const Args& a);

}  // namespace kvroute::sim
