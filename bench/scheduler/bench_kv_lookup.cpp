// bench/scheduler: what one KV location lookup (POST /v1/kv/lookup's work,
// router/kv_lookup.h) costs, against the reference lookup (the previous
// path: find_matches, a worker-table lookup per holder, one sort of the
// holders: kv_lookup_reference) and one routing decision of the production
// RoutingService (fast path), on the same requests, index and registry, in
// the same run: the lookup must be cheap enough to call per request (target:
// p99 <= 20 us for a 128-block prompt at 1,024 workers, after tokenization).
//
// Work timed per call (thread CPU time, net of the clock's own cost; token ids
// given, i.e. after tokenization): hashing the request's blocks, the index's
// match, the holders from the worker table, and (separately) the JSON
// answer. 1,024 workers, block size 16, requests of 128 blocks (2,048 tokens:
// a cached prefix of 124 blocks + 64 random tokens), 256 prefixes of 128
// blocks. Scenarios:
//   by8    - each prefix held by 8 workers (the answer lists 8)
//   shared - the same plus a 32-block system prompt on every worker (the
//            answer lists all 1,024: its JSON is ~220 KB, and that is the cost)
//   shared16 - the same, the body asking for the 16 longest (max_workers)
// Every call of both lookups is checked to give the same holders (worker,
// rank, tokens per tier), in the same order; the run fails otherwise.
// Figures: p50 / p99 over the calls of each of --rounds rounds (median of
// rounds); ratios: reference / lookup at p99 (the speed-up), and the whole
// answer (lookup + JSON) / the decision at p99. Seed 7.
//
// --stages adds one round per scenario timing the lookup's phases one by one
// (hashing, find_match_layers, the holders, the JSON), each after a decision
// and a reference lookup as above: where the lookup's time and its tail go.
//
// Run: build/bench/scheduler/bench_kv_lookup [--quick] [--rounds N] [--calls N] [--scenario NAME] [--stages]
// The last line is one JSON object.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"
#include "router/kv_lookup.h"
#include "router/routing.h"
#include "bench/scheduler/testbed.h"

using namespace kvroute;
using namespace kvroute::bench;

namespace {

constexpr uint32_t kWorkers = 1024;
// by8 and shared: 256 prefixes held by 8 workers each, with or without a system prompt on every worker.
constexpr Scenario kBy8{"by8", false, 8, 256}, kShared{"shared", true, 8, 256};

struct Percentiles {
  double p50 = 0, p99 = 0;
};

Percentiles percentiles(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

struct Row {
  Percentiles decision, reference, lookup, lookup_json;
  size_t holders = 0, json_bytes = 0;
};

bool same_holders(const KvLookupResult& a, const KvLookupResult& b) {
  if (a.holders_total != b.holders_total || a.holders.size() != b.holders.size()) return false;
  for (size_t i = 0; i < a.holders.size(); ++i) {
    const WorkerRegistry::CacheHolder &x = a.holders[i], &y = b.holders[i];
    if (x.overlap.owner != y.overlap.owner || x.overlap.blocks != y.overlap.blocks ||
        x.overlap.by_tier != y.overlap.by_tier || x.info->url != y.info->url || x.health != y.health ||
        x.draining != y.draining)
      return false;
  }
  return true;
}

// What both rounds call on: the production routing service over the
// testbed's index and registry (seed 7), and the scratch results it fills.
struct LookupRig {
  explicit LookupRig(Testbed& f)
      : random(7), routing(f.index, f.registry, *f.config, random), src{routing, f.index, f.registry} {}
  SeededRandom random;
  RoutingService routing;
  const KvLookupSources src;
  RouteResult decision, scratch;
  KvLookupResult result, reference;
};

// One round: `calls` of each kind over the same requests, interleaved per
// request so that the machine's drift hits all four alike.
Row round(Testbed& f, size_t calls, size_t max_holders, double overhead) {
  LookupRig rig(f);
  const KvLookupSources& src = rig.src;
  RouteResult &decision = rig.decision, &scratch = rig.scratch;
  KvLookupResult &result = rig.result, &reference = rig.reference;
  std::vector<double> d, r, l, j;
  Row row;
  for (size_t i = 0; i < calls; ++i) {
    const ParsedRequest& req = f.reqs[i % f.reqs.size()];
    double t = cpu_us();
    rig.routing.route(req, decision);
    d.push_back(cpu_us() - t - overhead);
    t = cpu_us();
    kv_lookup_reference(src, req, kBlock, max_holders, scratch, reference);
    r.push_back(cpu_us() - t - overhead);
    t = cpu_us();
    kv_lookup(src, req, kBlock, max_holders, scratch, result);
    l.push_back(cpu_us() - t - overhead);
    if (!same_holders(result, reference)) {
      std::fprintf(stderr, "lookup and reference disagree on request %zu\n", i);
      std::exit(1);
    }
    t = cpu_us();
    kv_lookup(src, req, kBlock, max_holders, scratch, result);
    const std::string json = kv_lookup_json(result);
    j.push_back(cpu_us() - t - overhead);
    row.holders = std::max(row.holders, result.holders.size());
    row.json_bytes = std::max(row.json_bytes, json.size());
    if (!decision.ok) {
      std::fprintf(stderr, "routing failed\n");
      std::exit(1);
    }
  }
  row.decision = percentiles(d);
  row.reference = percentiles(r);
  row.lookup = percentiles(l);
  row.lookup_json = percentiles(j);
  return row;
}

// The lookup's phases timed one by one (hash, find_match_layers, holders,
// JSON), each call after a decision and a reference lookup as in round().
void stage_round(Testbed& f, size_t calls, size_t max_holders, double overhead) {
  LookupRig rig(f);
  RouteResult& scratch = rig.scratch;
  KvLookupResult& result = rig.result;
  MatchLayers match;
  std::vector<double> h, m, w, j;
  for (size_t i = 0; i < calls; ++i) {
    const ParsedRequest& req = f.reqs[i % f.reqs.size()];
    rig.routing.route(req, rig.decision);
    kv_lookup_reference(rig.src, req, kBlock, max_holders, scratch, rig.reference);
    double t = cpu_us();
    scratch.reset();
    rig.routing.hash_request(req, kBlock, scratch, nullptr);
    h.push_back(cpu_us() - t - overhead);
    t = cpu_us();
    f.index.find_match_layers(scratch.block_hashes, match);
    m.push_back(cpu_us() - t - overhead);
    t = cpu_us();
    result.holders_total = static_cast<uint32_t>(f.registry.holders(req.model, match, max_holders, result.holders, result.keep));
    w.push_back(cpu_us() - t - overhead);
    match.clear();
    t = cpu_us();
    const std::string json = kv_lookup_json(result);
    j.push_back(cpu_us() - t - overhead);
  }
  const Percentiles ph = percentiles(h), pm = percentiles(m), pw = percentiles(w), pj = percentiles(j);
  std::printf("  stages p50/p99: hash %.2f/%.2f  match %.2f/%.2f  holders %.2f/%.2f  json %.2f/%.2f\n", ph.p50, ph.p99,
              pm.p50, pm.p99, pw.p50, pw.p99, pj.p50, pj.p99);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t rounds = 3, calls = 20000;
  std::string only;  // --scenario NAME: run that one only (for a profiler)
  bool stages = false;  // --stages: one more round per scenario, the lookup's phases timed one by one
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      rounds = 1;
      calls = 2000;
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::strtoul(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--scenario") && i + 1 < argc) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--stages")) {
      stages = true;
    } else if (!std::strcmp(argv[i], "--calls") && i + 1 < argc) {
      calls = std::strtoul(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: bench_kv_lookup [--quick] [--rounds N] [--calls N] [--scenario by8|shared|shared16] [--stages]\n");
      return 2;
    }
  }
  const double overhead = clock_overhead();
  std::printf("KV lookup vs the reference lookup and a routing decision, %u workers, %u-block requests (thread CPU us, clock overhead %.2f us "
              "subtracted; medians of %zu rounds of %zu calls)\n",
              kWorkers, kPrefixBlocks, overhead, rounds, calls);
  std::printf("%-8s %8s %9s %9s %9s %9s %9s %9s %9s %9s %8s %8s %8s\n", "scenario", "holders", "dec_p50",
              "dec_p99", "ref_p50", "ref_p99", "look_p50", "look_p99", "json_p50", "json_p99", "json_KB",
              "ref/look", "json/dec");
  struct Scenario {
    const char* name;
    bool shared;
    size_t max_holders;
  };
  const Scenario scenarios[] = {{"by8", false, kMaxLookupHolders},
                                {"shared", true, kMaxLookupHolders},
                                {"shared16", true, 16}};
  std::string json = "{";
  std::unique_ptr<Testbed> f;
  bool built_shared = false;
  for (const Scenario& sc : scenarios) {
    if (!only.empty() && only != sc.name) continue;
    if (!f || built_shared != sc.shared) f = build(kWorkers, (built_shared = sc.shared) ? kShared : kBy8);
    std::vector<double> dp50, dp99, rp50, rp99, lp50, lp99, jp50, jp99;
    Row last;
    for (size_t r = 0; r < rounds; ++r) {
      last = round(*f, calls, sc.max_holders, overhead);
      dp50.push_back(last.decision.p50);
      dp99.push_back(last.decision.p99);
      rp50.push_back(last.reference.p50);
      rp99.push_back(last.reference.p99);
      lp50.push_back(last.lookup.p50);
      lp99.push_back(last.lookup.p99);
      jp50.push_back(last.lookup_json.p50);
      jp99.push_back(last.lookup_json.p99);
    }
    const double speedup = median(rp99) / median(lp99), ratio = median(jp99) / median(dp99);
    std::printf("%-8s %8zu %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8.1f %8.2f %8.2f\n", sc.name,
                last.holders, median(dp50), median(dp99), median(rp50), median(rp99), median(lp50), median(lp99),
                median(jp50), median(jp99), last.json_bytes / 1024.0, speedup, ratio);
    if (stages) stage_round(*f, calls, sc.max_holders, overhead);
    json += std::string(json.size() > 1 ? "," : "") + "\"" + sc.name + "\":{" +
            "\"holders\":" + std::to_string(last.holders) + ",\"decision_p99_us\":" + std::to_string(median(dp99)) +
            ",\"reference_p99_us\":" + std::to_string(median(rp99)) + ",\"lookup_p50_us\":" +
            std::to_string(median(lp50)) + ",\"lookup_p99_us\":" + std::to_string(median(lp99)) +
            ",\"reference_vs_lookup_p99\":" + std::to_string(speedup) + ",\"lookup_json_p99_us\":" +
            std::to_string(median(jp99)) + ",\"lookup_json_vs_decision_p99\":" + std::to_string(ratio) + "}";
  }
  std::printf("%s}\n", json.c_str());
  return 0;
}
