// kvroute-sim's event loop: one workload, one policy, N simulated engines
// (mocker/engine.h) in virtual time, routed with the production code (the
// RadixIndexer fed by the engines' KV events, the WorkerRegistry with load
// reports every report_ms and the router's in-flight accounting, and
// RoutingService::route_blocks).
//
// Threading: simulate() is self-contained (no shared state); callers may run
// several at once on different threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "mocker/engine.h"
#include "sim/tiers.h"
#include "sim/workload.h"

namespace kvroute::sim {

// KV tiers below the device (sim/tiers.h); all off by default.
struct TierOptions {
  uint64_t host_blocks = 0;   // per worker, 512-token blocks; 0 = no host tier
  double host_gb_per_s = 25;  // a worker's host-to-device load bandwidth, 10^9 bytes/s
  uint64_t pool_blocks = 0;   // one pool mounted by every worker; 0 = no pool
  double pool_gb_per_s = 12.5;  // each worker's load bandwidth from the pool (its link)
  // The pool's own bandwidth, shared by the loads in flight (SharedBandwidth,
  // sim/tiers.h); 0 = pool_gb_per_s: one load alone has all of it.
  double pool_total_gb_per_s = 0;
  double kv_bytes_per_token = 0;  // 0 = the engine profile's (131072 for llama3-8b)
  // The pool also receives every block as the device stores it (LMCache's
  // remote backends, HiCache's write-through to storage), not only what the
  // host tiers (or, without them, the devices) evict.
  bool pool_write_through = false;
  // Each host tier receives every block as its device stores it (vLLM's
  // OffloadingConnector copies blocks to the CPU as they are computed), and a
  // device eviction moves nothing: the host holds what it kept of it. Off:
  // a block reaches the host only when the device evicts it (write-back), so
  // host and device hold different blocks.
  bool host_write_through = false;
  Eviction eviction = Eviction::Lru;  // of the host tiers and the pool (the device's is the engine's LRU)
  ReuseProfiles profiles{};  // Eviction::WorkloadAware: the categories' reuse (fit_reuse_profiles)
  bool any() const { return host_blocks > 0 || pool_blocks > 0; }
};

struct SimOptions {
  uint32_t workers = 8;
  std::string engine_profile = mocker::kDefaultProfile;  // mocker/profile.h
  // Per worker, 512-token blocks; 0 = the profile's KV capacity (kDefaultKvBlocks
  // for a profile without one).
  uint64_t kv_blocks = 0;
  uint32_t max_seqs = 64;
  uint32_t max_batched_tokens = 8192;  // per engine step (mocker/engine.h's default)
  double rate = 1.0;          // arrival rate multiplier
  double report_ms = 100;
  uint64_t seed = 1;
  std::vector<std::pair<std::string, std::string>> sets;  // --set key=value for the kvroute policy
  TierOptions tiers;
};

// Per-worker KV blocks when neither --kv-blocks nor the profile gives them.
inline constexpr uint64_t kDefaultKvBlocks = 8000;

// The engines' configuration (block size kBlock); the profile must exist (find_profile).
mocker::EngineConfig engine_config(const SimOptions& o);

// Policies: round_robin, random, least_loaded, dynamo_v01 (the baseline
// weighted cost without the in-flight prefill term), dynamo, llmd
// (sim/policies.h), kvroute (the scheduler's defaults, plus --set keys),
// kvroute_weighted (kvroute with scheduler.cost = weighted), oracle (a
// reference, not a router: each request to the engine where a fork of it,
// run ahead with nothing else arriving, gives the first token soonest; ties
// to kvroute's choice).
const std::vector<std::string>& known_policies();

struct PolicyResult {
  std::string policy;
  double hit_rate = 0, ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0, e2e_p50 = 0, e2e_p99 = 0;
  double itl_p50 = 0, itl_p99 = 0;  // inter-token latency: between a request's consecutive tokens
  double throughput_tok_s = 0, imbalance = 0;
  double ttft_mape = 0;   // the registry's TTFT model: mean |predicted - observed| / observed
  double cache_gap = 0;   // 1 - cached tokens achieved / best reachable among eligible workers (index view)
  size_t completed = 0, rejected = 0;
  // Decisions of kvroute's scheduler (every policy but round_robin and random
  // consults it; the peers then pick by their own score), and how many of
  // them read the eligible workers' KV load as uneven (load_uneven():
  // scheduler.alpha_imbalanced applies, whether or not it differs).
  size_t decisions = 0, uneven_decisions = 0;
  // Tiers (SimOptions::tiers): of the prompt blocks of dispatched requests,
  // the share loaded from a host tier and from the pool; the mean load time
  // of a request that loaded anything.
  double host_hit_rate = 0, pool_hit_rate = 0, load_ms_mean = 0;
  // What the router saw: the chosen workers' cached prefixes in the index,
  // summed over the requests, per storage tier (common/types.h StorageTier;
  // the policies that consult the router only).
  std::array<uint64_t, kNumStorageTiers> routed_overlap_by_tier{};
  std::vector<double> ttft_ms;  // every request's TTFT, for the CDF plot
  // Every request that produced its first token, in workload order: for
  // comparing a live replay with the simulation request by request
  // (kvroute-sim --requests-out, bench/replay.sh).
  struct Request {
    size_t index = 0;  // in the workload
    double arrival_ms = 0, ttft_ms = 0, e2e_ms = 0;
    uint32_t worker = 0, cached_tokens = 0, blocks = 0;
    uint64_t session = 0;  // the workload's conversation id (0 = none)
  };
  std::vector<Request> requests;
};

// `scheduler` (optional) replaces the kvroute policy's scheduler block.
PolicyResult simulate(const std::vector<SimRequest>& w, const SimOptions& o, const std::string& policy,
                      const SchedulerConfig* scheduler = nullptr, bool progress = false);

double percentile(std::vector<double> v, double p);

}  // namespace kvroute::sim
