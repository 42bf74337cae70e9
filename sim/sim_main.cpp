// kvroute-sim: a deterministic discrete-event simulation of a fleet in
// virtual time (sim/simulate.h) over the Mooncake trace or a generated
// workload (sim/workload.h), routed by kvroute or a peer's policy
// (sim/policies.h). Commands:
//   kvroute-sim [flags]        one workload, every policy: a table, then one JSON line
//   kvroute-sim tune [flags]   tune on the train slices at the load levels, report on the held-out ones
//   kvroute-sim targets [flags] the target table (workloads x rates), optionally checked against a file
//   kvroute-sim pd [flags]     aggregated vs disaggregated fleets and the PD policies (sim/pd_report.cpp)
//   kvroute-sim pd-tune [flags] kvroute_pd's thresholds on the trace's train slice
//   kvroute-sim ceiling [flags] the goodput ceiling per workload and each policy's goodput against it (sim/ceiling.h)
// `--help` lists the flags. Same seed, same numbers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/hit_bound.h"
#include "sim/pd_fleet.h"
#include "sim/report.h"
#include "sim/simulate.h"
#include "sim/workload.h"

using namespace kvroute;
using namespace kvroute::sim;

namespace {

void usage() {
  std::printf(
      "kvroute-sim [tune|targets|goodput] [flags]: simulated fleet routed by kvroute's own code or a peer's policy.\n"
      "  tune              tune scheduler weights on the train slices (the trace's first 50%% of its time,\n"
      "                    the generated workloads drawn with another seed) at --levels of the better peer's\n"
      "                    capacity on each; report the best and the defaults on the held-out slices\n"
      "  targets           the target table: kvroute vs the better of dynamo and llmd and the causal floor on\n"
      "                    the trace's test slice and each generated workload at --levels of the better peer's\n"
      "                    capacity, then at the fixed compressions --rates (markdown, then JSON)\n"
      "  --levels LIST     targets, tune: the load levels, fractions of the better peer's capacity (default\n"
      "                    0.3,0.6,0.9: light, busy, at-limit; sim/load_levels.cpp)\n"
      "  --level-steps N   targets, tune: bisection steps after bracketing for that capacity (default 4)\n"
      "  goodput           per workload and policy (default kvroute,dynamo,llmd): the highest rate with TTFT\n"
      "                    p99 <= --slo-ttft-ms and inter-token latency p99 <= --slo-itl-ms (bisection), on\n"
      "                    the held-out slices (--slice train: the slices tune chooses on)\n"
      "  pd                aggregated fleet (X+Y engines) vs X prefill + Y decode engines: TTFT and ITL p50/p99\n"
      "                    per policy (dynamo_pd, llmd_pd, kvroute_pd) on the trace's test slice, long_prompt and\n"
      "                    long_output at --rates (markdown, then JSON; --expect compares; --slice train shows\n"
      "                    the tuning slices; --policies narrows the rows, the three PD peers always run)\n"
      "  pd-tune           kvroute_pd's pd.* keys on the train slices (the trace's first half, another draw of\n"
      "                    each generated workload); the best (best-sets:), shown on the test slices\n"
      "  pools             TTFT p50/p99 and hit rate with and without a host tier and a shared pool at each\n"
      "                    --pool-bandwidths value (default agentic, kvroute and dynamo, x1; sim/plan.cpp)\n"
      "  plan              the capacity planner: hit rate and TTFT by device, host tier and pool size, LRU\n"
      "                    and workload-aware eviction, and the smallest fleet meeting the TTFT SLO\n"
      "                    (default the trace's test slice; sim/plan.cpp, README \"Size a fleet's KV cache\")\n"
      "  --pool-bandwidths LIST  pools: GB/s (default 5,12.5,50)\n"
      "  --plan-device LIST  plan: device blocks per worker, x the profile's (default 0.5,1)\n"
      "  --plan-host LIST  plan: host tier per worker, x the device's (default 0,1,2,4)\n"
      "  --plan-pool LIST  plan: shared pool, x the fleet's device capacity (default 0,1,4)\n"
      "  --fleet-host-x X, --fleet-pool-x X  plan: the tiered fleets the fleet search sizes (default 2, 1)\n"
      "  --no-fleet        plan: skip the smallest-fleet search\n"
      "  ceiling           per workload, the rates at which no router keeps TTFT p99 <= --slo-ttft-ms on the\n"
      "                    engine model (causal floor, minimal work in windows; sim/ceiling.h), then each\n"
      "                    policy's goodput against it and the goodput target (1.15x the better peer); --check\n"
      "                    fails if a goodput lies above the ceiling; --expect compares the JSON lines\n"
      "  --no-goodput      ceiling: the ceiling alone, no goodput search\n"
      "  --slo-percentile P  plan: the TTFT SLO's percentile, 0.5, 0.9 (default) or 0.99\n"
      "  --dat-out FILE    plan: the capacity grid as columns, for gnuplot\n"
      "  --pd X:Y          pd: prefill and decode engines (default 2:2)\n"
      "  --kv-link-gbps G  pd: each decode engine's link, Gbit/s (default 400)\n"
      "  --kv-bytes-per-token B  pd: KV bytes per token (default: the profile's; 131072 for llama3-8b)\n"
      "                    (kvroute_pd is the router's decide_pd(): --set pd.min_uncached_tokens=T etc.)\n"
      "  --slo-ttft-ms X   goodput: TTFT p99 SLO (default 2000)\n"
      "  --slo-itl-ms X    goodput: inter-token latency p99 SLO (default 1000)\n"
      "  --goodput-steps N goodput: bisection steps after bracketing (default 6)\n"
      "  --workload NAME   trace (default), agentic, api, bursts, long_agents or team (sim/workload.h)\n"
      "  --slice S         all (default), train or test: the trace's time split at 50%%; a generated\n"
      "                    workload's train slice is another draw of it (the seed mixed), test and all its own\n"
      "  --trace PATH      JSONL trace (default: traces/mooncake_conversation_trace.jsonl in the source tree)\n"
      "  --workers N       engines (default 8)\n"
      "  --engine-profile NAME  the engines' step times and KV capacity (mocker/profile.h): %s\n"
      "                    (default %s)\n"
      "  --kv-blocks N     KV capacity per engine in 512-token blocks (default: the profile's, else 8000)\n"
      "  --max-seqs N      running sequences per engine (default 64)\n"
      "  --max-batched-tokens N  tokens per engine step (default 8192, as mocker/engine.h)\n"
      "  --rate X          arrival rate multiplier (default 1.0 = the workload's timing)\n"
      "  --rates LIST      targets: the fixed compressions shown after the levels (default 1,2,3)\n"
      "  --workloads LIST  targets, goodput, tune: comma-separated workloads (default trace,agentic,api,bursts,\n"
      "                    long_agents,team)\n"
      "  --requests N      use only the first N requests (before the split)\n"
      "  --report-ms T     load report interval in virtual ms (default 100)\n"
      "  --policies LIST   comma-separated: round_robin,random,least_loaded,dynamo_v01,dynamo,llmd,kvroute,\n"
      "                    kvroute_weighted\n"
      "  --seed N          randomness seed (default 1); the same seed gives the same numbers\n"
      "  --cdf-out FILE    write TTFT CDF points (policy ttft_ms fraction) for plotting\n"
      "  --requests-out FILE  one JSON line per request (policy, i, arrival_ms, ttft_ms, e2e_ms, worker, cached,\n"
      "                    blocks, session): bench/replay.sh compares a live replay with it request by request\n"
      "  --host-blocks N   a host KV tier per worker of N 512-token blocks (default 0: none; sim/tiers.h)\n"
      "  --host-gb-per-s X its load bandwidth, 10^9 bytes/s (default 25)\n"
      "  --pool-blocks N   a KV pool of N blocks shared by every worker (default 0: none)\n"
      "  --pool-gb-per-s X each worker's load bandwidth from it (default 12.5)\n"
      "  --pool-total-gb-per-s X the pool's own bandwidth, shared by the loads in flight (default: --pool-gb-per-s)\n"
      "  --pool-write-through  the pool also receives every block the devices compute (default: only\n"
      "                    what the host tiers, or without them the devices, evict)\n"
      "  --host-write-through  the host tiers receive every block as their device computes it, as vLLM's\n"
      "                    OffloadingConnector does (default: write-back, only what the device evicts)\n"
      "  --eviction E      the host tiers' and the pool's: lru (default) or workload_aware (fit on the\n"
      "                    workload's first half: the trace's train slice)\n"
      "  --set KEY=VALUE   a config key for the kvroute policies (e.g. scheduler.cost=weighted); repeatable\n"
      "  --check           assert the run's invariants (exit 1 naming the first that fails); goodput: that\n"
      "                    each rate found meets the SLOs and the lowest rate seen missing them misses them\n"
      "  --expect FILE     targets: compare with a published table (JSON lines of targets) within --tolerance\n"
      "  --tolerance X     relative tolerance for --expect (default 0.05)\n",
      mocker::profile_list().c_str(), mocker::kDefaultProfile);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ',');)
    if (!p.empty()) out.push_back(p);
  return out;
}

// Parses argv into `a`; exits 2 with a message on a bad flag.
void parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    auto need = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvroute-sim: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    const std::string f = argv[i];
    try {
      if (f == "--trace") a.trace = need("--trace");
      else if (f == "--workload") a.workload = need("--workload");
      else if (f == "--slice") a.slice = need("--slice");
      else if (f == "--workers") a.sim.workers = static_cast<uint32_t>(std::stoul(need("--workers")));
      else if (f == "--kv-blocks") {
        a.sim.kv_blocks = std::stoull(need("--kv-blocks"));
        if (a.sim.kv_blocks == 0) {
          std::fprintf(stderr, "kvroute-sim: --kv-blocks must be > 0\n");
          std::exit(2);
        }
      } else if (f == "--engine-profile") {
        a.sim.engine_profile = need("--engine-profile");
        if (!mocker::find_profile(a.sim.engine_profile)) {
          std::fprintf(stderr, "kvroute-sim: --engine-profile '%s' is not one of %s\n", a.sim.engine_profile.c_str(),
                       mocker::profile_list().c_str());
          std::exit(2);
        }
      }
      else if (f == "--max-seqs") a.sim.max_seqs = static_cast<uint32_t>(std::stoul(need("--max-seqs")));
      else if (f == "--max-batched-tokens")
        a.sim.max_batched_tokens = static_cast<uint32_t>(std::stoul(need("--max-batched-tokens")));
      else if (f == "--rate") a.sim.rate = std::stod(need("--rate"));
      else if (f == "--rates") {
        a.rates.clear();
        for (const auto& x : split_list(need("--rates"))) a.rates.push_back(std::stod(x));
        a.rates_set = true;
      } else if (f == "--pool-bandwidths" || f == "--plan-device" || f == "--plan-host" || f == "--plan-pool") {
        auto& v = f == "--pool-bandwidths" ? a.pool_bandwidths
                  : f == "--plan-device"   ? a.plan_device
                  : f == "--plan-host"     ? a.plan_host
                                           : a.plan_pool;
        v.clear();
        for (const auto& x : split_list(need(f.c_str()))) v.push_back(std::stod(x));
        const bool positive = f == "--pool-bandwidths" || f == "--plan-device";
        if (v.empty() || std::any_of(v.begin(), v.end(), [&](double x) {
              return !(x >= 0) || x > 1e4 || (positive && x == 0);
            })) {
          std::fprintf(stderr, "kvroute-sim: %s needs a list of numbers in [0, 10000]%s\n", f.c_str(),
                       positive ? ", each > 0" : "");
          std::exit(2);
        }
      } else if (f == "--fleet-host-x") a.fleet_host_x = std::stod(need("--fleet-host-x"));
      else if (f == "--fleet-pool-x") a.fleet_pool_x = std::stod(need("--fleet-pool-x"));
      else if (f == "--no-fleet") a.plan_fleet = false;
      else if (f == "--no-goodput") a.ceiling_goodput = false;
      else if (f == "--slo-percentile") {
        a.slo_percentile = std::stod(need("--slo-percentile"));
        if (a.slo_percentile != 0.5 && a.slo_percentile != 0.9 && a.slo_percentile != 0.99) {
          std::fprintf(stderr, "kvroute-sim: --slo-percentile must be 0.5, 0.9 or 0.99\n");
          std::exit(2);
        }
      } else if (f == "--dat-out") a.dat_out = need("--dat-out"); else if (f == "--workloads") a.workloads = split_list(need("--workloads")), a.workloads_set = true;
      else if (f == "--pd") {
        const std::string v = need("--pd");
        const auto colon = v.find(':');
        if (colon == std::string::npos) throw std::invalid_argument("--pd");
        a.pd_prefill = static_cast<uint32_t>(std::stoul(v.substr(0, colon)));
        a.pd_decode = static_cast<uint32_t>(std::stoul(v.substr(colon + 1)));
        if (a.pd_prefill == 0 || a.pd_decode == 0 || a.pd_prefill + a.pd_decode > 1024) {
          std::fprintf(stderr, "kvroute-sim: --pd X:Y needs 1 <= X, Y and X + Y <= 1024\n");
          std::exit(2);
        }
      } else if (f == "--kv-link-gbps") {
        a.kv_link_gbps = std::stod(need("--kv-link-gbps"));
        if (!(a.kv_link_gbps > 0)) {
          std::fprintf(stderr, "kvroute-sim: --kv-link-gbps must be > 0\n");
          std::exit(2);
        }
      } else if (f == "--kv-bytes-per-token") {
        a.kv_bytes_per_token = std::stod(need("--kv-bytes-per-token"));
        if (!(a.kv_bytes_per_token > 0)) {
          std::fprintf(stderr, "kvroute-sim: --kv-bytes-per-token must be > 0\n");
          std::exit(2);
        }
      } else if (f == "--host-blocks") a.sim.tiers.host_blocks = std::stoull(need("--host-blocks"));
      else if (f == "--host-gb-per-s") a.sim.tiers.host_gb_per_s = std::stod(need("--host-gb-per-s"));
      else if (f == "--pool-blocks") a.sim.tiers.pool_blocks = std::stoull(need("--pool-blocks"));
      else if (f == "--pool-gb-per-s") a.sim.tiers.pool_gb_per_s = std::stod(need("--pool-gb-per-s"));
      else if (f == "--pool-total-gb-per-s")
        a.sim.tiers.pool_total_gb_per_s = std::stod(need("--pool-total-gb-per-s"));
      else if (f == "--pool-write-through") a.sim.tiers.pool_write_through = true;
      else if (f == "--host-write-through") a.sim.tiers.host_write_through = true;
      else if (f == "--eviction") {
        const std::string v = need("--eviction");
        if (!parse_eviction(v, a.sim.tiers.eviction)) {
          std::fprintf(stderr, "kvroute-sim: --eviction must be lru or workload_aware, not '%s'\n", v.c_str());
          std::exit(2);
        }
      } else if (f == "--requests") a.requests = std::stoull(need("--requests"));
      else if (f == "--report-ms") a.sim.report_ms = std::stod(need("--report-ms"));
      else if (f == "--seed") a.sim.seed = std::stoull(need("--seed"));
      else if (f == "--cdf-out") a.cdf_out = need("--cdf-out");
      else if (f == "--requests-out") a.requests_out = need("--requests-out");
      else if (f == "--check") a.check = true;
      else if (f == "--expect") a.expect = need("--expect");
      else if (f == "--tolerance") a.tolerance = std::stod(need("--tolerance"));
      else if (f == "--slo-ttft-ms") a.slo_ttft_ms = std::stod(need("--slo-ttft-ms"));
      else if (f == "--slo-itl-ms") a.slo_itl_ms = std::stod(need("--slo-itl-ms"));
      else if (f == "--goodput-steps") a.goodput_steps = std::stoi(need("--goodput-steps"));
      else if (f == "--level-steps") a.level_steps = std::stoi(need("--level-steps"));
      else if (f == "--levels") {
        a.levels.clear();
        for (const auto& x : split_list(need("--levels"))) a.levels.push_back(std::stod(x));
        if (a.levels.empty() || std::any_of(a.levels.begin(), a.levels.end(), [](double x) { return !(x > 0) || x > 4; })) {
          std::fprintf(stderr, "kvroute-sim: --levels needs fractions of the capacity in (0, 4]\n");
          std::exit(2);
        }
      }
      else if (f == "--policies") a.policies = split_list(need("--policies")), a.policies_set = true;
      else if (f == "--set") {
        const std::string kv = need("--set");
        const auto eq = kv.find('=');
        if (eq == std::string::npos) {
          std::fprintf(stderr, "kvroute-sim: --set needs key=value (a config key, e.g. scheduler.gamma=0.2)\n");
          std::exit(2);
        }
        a.sim.sets.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
      } else if (f == "--help" || f == "-h") {
        usage();
        std::exit(0);
      } else {
        std::fprintf(stderr, "kvroute-sim: unknown argument %s (see --help)\n", f.c_str());
        std::exit(2);
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "kvroute-sim: %s: not a number\n", f.c_str());
      std::exit(2);
    }
  }
  if (!(a.slo_ttft_ms > 0) || !(a.slo_itl_ms > 0) || a.goodput_steps < 0 || a.goodput_steps > 30 ||
      a.level_steps < 0 || a.level_steps > 30) {
    std::fprintf(stderr, "kvroute-sim: --slo-ttft-ms and --slo-itl-ms must be > 0, --goodput-steps and --level-steps 0-30\n");
    std::exit(2);
  }
  if (a.sim.workers == 0 || a.sim.rate <= 0 || a.sim.max_seqs == 0 ||
      a.sim.max_batched_tokens == 0 || a.rates.empty()) {
    std::fprintf(stderr,
                 "kvroute-sim: --workers, --max-seqs, --max-batched-tokens, --rate(s) must be > 0\n");
    std::exit(2);
  }
  for (const auto& p : a.policies)
    if (std::find(known_policies().begin(), known_policies().end(), p) == known_policies().end() &&
        std::find(pd_policies().begin(), pd_policies().end(), p) == pd_policies().end()) {
      std::fprintf(stderr, "kvroute-sim: unknown policy '%s'\n", p.c_str());
      std::exit(2);
    }
  if (a.sim.tiers.any() && std::find(a.policies.begin(), a.policies.end(), "oracle") != a.policies.end()) {
    // Its forks run the device cache alone: a request's host or pool load would be missing from them.
    std::fprintf(stderr, "kvroute-sim: the oracle policy runs without --host-blocks and --pool-blocks\n");
    std::exit(2);
  }
  if (!(a.sim.tiers.host_gb_per_s > 0) || !(a.sim.tiers.pool_gb_per_s > 0) || !(a.sim.tiers.pool_total_gb_per_s >= 0) ||
      a.sim.tiers.host_blocks > (uint64_t{1} << 32) || a.sim.tiers.pool_blocks > (uint64_t{1} << 32)) {
    std::fprintf(stderr, "kvroute-sim: --host-gb-per-s and --pool-gb-per-s must be > 0, --host-blocks and "
                         "--pool-blocks at most 2^32\n");
    std::exit(2);
  }
  if (a.slice != "all" && a.slice != "train" && a.slice != "test") {
    std::fprintf(stderr, "kvroute-sim: --slice must be all, train or test\n");
    std::exit(2);
  }
}

// One workload, every policy: the table and the JSON line.
int run(const Args& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto w = load_slice(a, a.workload, a.slice);
  Args tiered = a;
  if (a.sim.tiers.eviction == Eviction::WorkloadAware) tiered.sim.tiers.profiles = train_profiles(a, a.workload);
  std::printf("workload %s (%s): %zu requests; %u workers (%s) x %llu blocks of 512 tokens; rate x%.2f; seed %llu\n",
              a.workload.c_str(), a.slice.c_str(), w.size(), a.sim.workers, a.sim.engine_profile.c_str(),
              (unsigned long long)engine_config(a.sim).kv_blocks,
              a.sim.rate, (unsigned long long)a.sim.seed);
  std::vector<PolicyResult> results;
  for (const auto& p : a.policies) results.push_back(simulate(w, tiered.sim, p, nullptr, true));
  if (a.sim.tiers.any())
    for (const auto& r : results)
      std::printf("tiers: %s host %llu blocks/worker at %.1f GB/s, pool %llu blocks at %.1f GB/s, %s eviction: "
                  "loaded from host %.3f, from pool %.3f of prompt blocks; mean load %.1f ms\n",
                  r.policy.c_str(), (unsigned long long)a.sim.tiers.host_blocks, a.sim.tiers.host_gb_per_s,
                  (unsigned long long)a.sim.tiers.pool_blocks, a.sim.tiers.pool_gb_per_s,
                  to_string(a.sim.tiers.eviction), r.host_hit_rate, r.pool_hit_rate, r.load_ms_mean);
  for (const auto& r : results)
    if (r.decisions)
      std::printf("load: %s, kvroute's scheduler read the KV load as uneven (std > scheduler.balance_threshold x "
                  "mean) in %zu of %zu decisions (%.1f %%)\n",
                  r.policy.c_str(), r.uneven_decisions, r.decisions,
                  100.0 * double(r.uneven_decisions) / double(r.decisions));
  const double ideal = ideal_hit_rate(w);
  if (!a.cdf_out.empty()) write_cdf(a.cdf_out, results);
  if (!a.requests_out.empty()) write_requests(a.requests_out, results);
  print_table(results, ideal);
  HitBound bound;
  if (!a.sim.tiers.any()) {  // tiers bring blocks back that the engines evicted: no capacity bound then
    std::vector<SimRequest> storage;
    bound = hit_bound(at_rate(w, a.sim.rate, storage), uint64_t{a.sim.workers} * engine_config(a.sim).kv_blocks);
    std::printf("%-16s %8.3f   (the fleet's %llu blocks, Belady's MIN over the arrivals: no router above it; one LRU "
                "cache of them: %.3f)\n",
                "capacity", bound.optimal, (unsigned long long)bound.capacity_blocks, bound.pooled_lru);
  }
  std::printf("simulated in %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::printf("%s\n", results_json(results, ideal).c_str());
  if (a.check) return check_run(w, a, results, ideal, bound.capacity_blocks ? bound.optimal : 1.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::string command;
  if (argc > 1 && (std::string(argv[1]) == "tune" || std::string(argv[1]) == "targets" ||
                   std::string(argv[1]) == "goodput" || std::string(argv[1]) == "pd" ||
                   std::string(argv[1]) == "pd-tune" || std::string(argv[1]) == "pools" ||
                   std::string(argv[1]) == "plan" || std::string(argv[1]) == "ceiling")) {
    command = argv[1];
    --argc;
    ++argv;
  }
  parse(argc, argv, a);
  if (command == "tune") return tune(a);
  if (command == "targets") return targets(a);
  if (command == "pd") return pd(a);
  if (command == "pd-tune") return pd_tune(a);
  if (command == "pools") {
    if (!a.rates_set) a.rates = {1};
    return pools(a);
  }
  if (command == "plan") return plan(a);
  if (command == "ceiling") {
    if (!a.policies_set) a.policies = {"kvroute", "dynamo", "llmd"};
    if (!a.ceiling_goodput) a.policies.clear();
    return ceiling(a);
  }
  if (command == "goodput") {
    if (!a.policies_set) a.policies = {"kvroute", "dynamo", "llmd"};
    return goodput(a);
  }
  return run(a);
}
