// bench/scheduler: routing decision latency and decisions per second of the
// production RoutingService (block hashing of the request's token ids,
// find_matches on a populated RadixIndexer, the decision over the
// WorkerRegistry), with the registry's pre-ranked fast path against the
// O(workers) reference scorer (every candidate copied out of the registry and
// scored by schedule(), as before the fast path) in the same run, on the same
// requests, from the same seed. Both make the same choices (checked: the run
// fails otherwise).
//
// Load accumulates as in a live router: every decision begins an in-flight
// request on the chosen worker (InflightGuard, as the proxy counts it under
// scheduler.inflight_kv), which ends W decisions later (W = workers; its
// first byte comes after W/4), so predicted load changes on every decision
// and at steady state W requests are in flight. The bookkeeping is part of
// decisions_per_s; the latency is the decision alone (hash + find_matches +
// score; token ids are given, as with the placeholder).
//
// Then the in-flight prefix's share of a decision: the fast path with
// scheduler.inflight_prefix_weight at its default against 0, same testbed,
// alternating (inflight_prefix_cost()).
//
// Then the in-flight accounting alone (accounting_us()) per
// scheduler.inflight_kv against `whole`, and routing beside a thread that
// accounts long prompts (decisions_beside_accounting()).
//
// Scenarios (block size 16, requests of 128 blocks = 2,048 tokens: a cached
// prefix of 124 blocks + 64 random tokens):
//   default - the issue's: a 32-block system prompt on every worker, and 256
//             prefixes of 128 blocks each on 8 workers
//   by1 / by10 / byall - no system prompt; the request's prefix is held by
//             1 / 10 / every worker (256 prefixes; 1 prefix for byall)
// at 8, 128, 1,024 and 8,192 workers. Rounds alternate which scorer runs
// first; figures are medians over rounds. Seed 7.
//
// Run: build/bench/scheduler/bench_scheduler [--quick]
//   --quick: 1 round, fewer decisions, no byall at 8,192 workers (CTest).
//   --only SCENARIO:WORKERS: that row only; --fast-only: no reference runs
//   (both for profiling; the reference figures then repeat the fast ones);
//   --decisions N: N decisions per run.
// The last line is one JSON object (the default scenario at 1,024 workers,
// plus the p99 at 8,192).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <ctime>
#include <string>
#include <thread>
#include <atomic>

#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"
#include "router/routing.h"
#include "bench/scheduler/testbed.h"

using namespace kvroute;
using namespace kvroute::bench;
using Steady = std::chrono::steady_clock;

namespace {

struct Run {
  double per_s = 0, p50 = 0, p99 = 0;  // per thread-CPU second; thread CPU time per decision
  double wall_p50 = 0, wall_p99 = 0;   // wall clock per decision (includes preemption)
  std::array<double, 4> stage_us{};    // mean per stage (wall)
  uint64_t choices = 0;  // hash of the chosen workers, in order
};


// `decisions` decisions with in-flight load accumulating; every guard is
// released at the end, so the next run starts from the same registry state.
// `timed`: per-decision clocks (latency); otherwise only the whole loop's
// thread CPU time (throughput, no clock calls inside).
Run run(Testbed& f, bool fast, size_t decisions, bool timed) {
  SeededRandom random(7);
  RoutingService routing(f.index, f.registry, *f.config, random);
  routing.set_fast_path(fast);
  const size_t end_after = f.workers, first_byte_after = f.workers / 4;
  std::vector<std::optional<InflightGuard>> inflight(end_after);
  RouteResult r;  // reused, as a connection does
  std::vector<double> cpu, wall;
  cpu.reserve(decisions);
  wall.reserve(decisions);
  Run out;
  static const double overhead = clock_overhead();
  const double c0 = cpu_us();
  for (size_t i = 0; i < decisions; ++i) {
    if (timed) {
      const auto s = Steady::now();
      const double c = cpu_us();
      routing.route(f.reqs[i % f.reqs.size()], r);
      cpu.push_back(cpu_us() - c - overhead);
      wall.push_back(std::chrono::duration<double, std::micro>(Steady::now() - s).count());
    } else {
      routing.route(f.reqs[i % f.reqs.size()], r);
    }
    if (!r.ok) {
      std::fprintf(stderr, "routing failed: %s\n", r.error.message.c_str());
      std::exit(1);
    }
    for (int k = 0; k < 4; ++k) out.stage_us[k] += r.stage_seconds[k] * 1e6;
    const auto& t = r.ranked.front();
    out.choices = (out.choices ^ t.worker.value) * 0x100000001B3ull;
    auto& slot = inflight[i % end_after];
    slot.reset();  // the request dispatched end_after decisions ago ends
    const SchedulerConfig& sc = f.config->get()->scheduler;  // as the proxy counts it (scheduler.inflight_kv)
    slot.emplace(f.registry, t.worker, r.request_blocks, t.prefill_tokens, inflight_shared_blocks(sc, t),
                 inflight_prompt(sc, r.block_hashes));
    if (i >= first_byte_after)
      if (auto& old = inflight[(i - first_byte_after) % end_after]) old->first_byte();
  }
  out.per_s = static_cast<double>(decisions) / ((cpu_us() - c0) / 1e6);
  for (auto& g : inflight) g.reset();
  auto pct = [](std::vector<double>& v, double q) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[static_cast<size_t>(static_cast<double>(v.size() - 1) * q)];
  };
  out.p50 = pct(cpu, 0.5);
  out.p99 = pct(cpu, 0.99);
  out.wall_p50 = pct(wall, 0.5);
  out.wall_p99 = pct(wall, 0.99);
  for (auto& s : out.stage_us) s /= static_cast<double>(decisions);
  return out;
}

// One latency run and one throughput run of the same scorer.
Run both(Testbed& f, bool fast, size_t decisions) {
  Run r = run(f, fast, decisions, true);
  r.per_s = run(f, fast, decisions, false).per_s;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  Run fast, ref;  // medians over rounds (stage means of the last round)
};

bool fast_only = false;  // --fast-only: no reference runs (profiling)

Row measure(Testbed& f, size_t decisions, int rounds) {
  if (fast_only) {
    Run r = both(f, true, decisions);
    return Row{r, r};
  }
  std::vector<Run> fast, ref;
  for (int k = 0; k < rounds; ++k) {  // alternate which scorer goes first
    if (k % 2 == 0) {
      fast.push_back(both(f, true, decisions));
      ref.push_back(both(f, false, decisions));
    } else {
      ref.push_back(both(f, false, decisions));
      fast.push_back(both(f, true, decisions));
    }
    if (fast.back().choices != ref.back().choices) {
      std::fprintf(stderr, "the fast path and the reference chose differently\n");
      std::exit(1);
    }
  }
  auto med = [](const std::vector<Run>& rs) {
    Run m = rs.back();
    std::vector<double> a, b, c, d, e;
    for (const auto& r : rs) {
      a.push_back(r.per_s);
      b.push_back(r.p50);
      c.push_back(r.p99);
      d.push_back(r.wall_p50);
      e.push_back(r.wall_p99);
    }
    m.per_s = median(a);
    m.p50 = median(b);
    m.p99 = median(c);
    m.wall_p50 = median(d);
    m.wall_p99 = median(e);
    return m;
  };
  return Row{med(fast), med(ref)};
}

// The fast path with scheduler.inflight_prefix_weight 0 and at its default,
// alternating `rounds` times on one testbed: the median decisions per
// thread-CPU second and p99 of each ({off, on}). Every decision has W
// requests in flight, so each one probes every worker's in-flight table.
std::array<Run, 2> inflight_prefix_cost(Testbed& f, size_t decisions, int rounds) {
  const double on = SchedulerConfig{}.inflight_prefix_weight;
  std::array<std::vector<Run>, 2> runs;
  for (int k = 0; k < 2 * rounds; ++k) {
    const int which = (k + k / 2) % 2;  // off, on, on, off, ...
    f.config->update([&](Config& c) {
      c.scheduler.inflight_prefix_weight = which ? on : 0;
      return std::optional<std::string>{};
    });
    runs[which].push_back(both(f, true, decisions));
  }
  f.config->update([&](Config& c) {
    c.scheduler.inflight_prefix_weight = on;
    return std::optional<std::string>{};
  });
  std::array<Run, 2> out;
  for (int w = 0; w < 2; ++w) {
    std::vector<double> per_s, p99;
    for (const auto& r : runs[w]) {
      per_s.push_back(r.per_s);
      p99.push_back(r.p99);
    }
    out[w] = runs[w].back();
    out[w].per_s = median(per_s);
    out[w].p99 = median(p99);
  }
  return out;
}

// In-flight accounting alone: thread CPU time (us) per request to begin and
// end it on its worker (InflightGuard; the chain hashed, the worker's
// reference counts updated) under scheduler.inflight_kv `mode`, for prompts
// of `blocks` complete blocks, `per_worker` requests in flight on each
// worker. Prompts share their first half (a system prompt); their worker
// is given.
double accounting_us(Testbed& f, const char* mode, uint32_t blocks, uint32_t per_worker, size_t requests) {
  SchedulerConfig sc;
  sc.inflight_kv = mode;
  std::vector<std::vector<LocalBlockHash>> prompts(64);
  for (size_t p = 0; p < prompts.size(); ++p)
    for (uint32_t b = 0; b < blocks; ++b) prompts[p].push_back(LocalBlockHash{b < blocks / 2 ? b + 1 : p << 32 | b});
  std::vector<std::optional<InflightGuard>> inflight(size_t{f.workers} * per_worker);
  const double c0 = cpu_us();
  for (size_t i = 0; i < requests; ++i) {
    const auto& prompt = prompts[i % prompts.size()];
    const WorkerId w{static_cast<uint64_t>(i % f.workers)};  // the slot's request ended on the same worker
    auto& slot = inflight[i % inflight.size()];
    slot.reset();
    slot.emplace(f.registry, w, blocks + 1, 0, inflight_shared_blocks(sc, blocks / 2), inflight_prompt(sc, prompt));
  }
  for (auto& g : inflight) g.reset();
  return (cpu_us() - c0) / static_cast<double>(requests);
}

// Decisions per wall second on this thread while another thread begins and
// ends requests of `blocks`-block prompts (16 in flight per worker) under
// scheduler.inflight_kv `mode`: what the accounting takes from routing
// (both need the worker table's lock; InflightBlocks counts a chain
// without it).
double decisions_beside_accounting(Testbed& f, const char* mode, uint32_t blocks, size_t decisions) {
  std::atomic<bool> stop{false};
  std::thread other([&] {
    while (!stop.load(std::memory_order_relaxed)) accounting_us(f, mode, blocks, 16, 64);
  });
  SeededRandom random(7);
  RoutingService routing(f.index, f.registry, *f.config, random);
  RouteResult r;
  const auto t0 = Steady::now();
  for (size_t i = 0; i < decisions; ++i) routing.route(f.reqs[i % f.reqs.size()], r);
  const double s = std::chrono::duration<double>(Steady::now() - t0).count();
  stop = true;
  other.join();
  return static_cast<double>(decisions) / s;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;  // "--only default:1024": one row (for profiling)
  size_t forced = 0;  // --decisions N
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--fast-only")) fast_only = true;
    else if (!std::strcmp(argv[i], "--decisions") && i + 1 < argc) forced = std::strtoul(argv[++i], nullptr, 10);
  }
  const int rounds = quick ? 1 : 3;
  const Scenario scenarios[] = {{"default", true, 8, 256}, {"by1", false, 1, 256}, {"by10", false, 10, 256},
                                {"byall", false, 0, 1}};
  const uint32_t sizes[] = {8, 128, 1024, 8192};
  std::printf("decisions per thread-CPU second; p50/p99: thread CPU time per decision (us), [wall p99]\n");
  std::printf("%-8s %7s | %9s %7s %7s %8s | %9s %7s %8s %9s | %7s %6s | %s\n", "scenario", "workers", "fast/s", "p50",
              "p99", "[wall]", "ref/s", "p50", "p99", "[wall]", "x p99", "x /s", "fast mean us: hash find score");
  Row headline{}, at8192{};
  for (const auto& sc : scenarios) {
    for (uint32_t w : sizes) {
      if (quick && w == 8192 && sc.holders == 0) continue;
      if (!only.empty() && only != std::string(sc.name) + ":" + std::to_string(w)) continue;
      const bool head = !std::strcmp(sc.name, "default") && w == 1024;
      size_t decisions = head ? (quick ? 20000 : 50000) : (quick ? 4000 : 10000);
      if (w == 8192) decisions /= 2;  // the reference takes ~0.5 ms per decision there
      if (forced) decisions = forced;
      const auto t0 = Steady::now();
      auto f = build(w, sc);
      const double build_s = std::chrono::duration<double>(Steady::now() - t0).count();
      const Row row = measure(*f, decisions, rounds);
      std::printf("%-8s %7u | %9.0f %7.2f %7.2f %8.1f | %9.0f %7.2f %8.2f %9.1f | %7.1f %6.1f | %.2f %.2f %.2f (built in %.1f s)\n",
                  sc.name, w, row.fast.per_s, row.fast.p50, row.fast.p99, row.fast.wall_p99, row.ref.per_s, row.ref.p50,
                  row.ref.p99, row.ref.wall_p99, row.ref.p99 / row.fast.p99, row.fast.per_s / row.ref.per_s,
                  row.fast.stage_us[1], row.fast.stage_us[2], row.fast.stage_us[3], build_s);
      std::fflush(stdout);
      if (head) headline = row;
      if (!std::strcmp(sc.name, "default") && w == 8192) at8192 = row;
    }
  }
  // What probing the workers' in-flight tables for the prompt's prefix adds to a decision.
  std::printf("\nin-flight prefix (scheduler.inflight_prefix_weight %g vs 0), fast path, default scenario:\n",
              SchedulerConfig{}.inflight_prefix_weight);
  for (uint32_t w : {128u, 1024u}) {
    if (!only.empty() && only != "default:" + std::to_string(w)) continue;
    auto f = build(w, scenarios[0]);
    const auto r = inflight_prefix_cost(*f, quick ? 4000 : 10000, quick ? 1 : 3);
    std::printf("  %4u workers: off %.0f/s p99 %.2f us, on %.0f/s p99 %.2f us (%.2fx the decisions per second)\n", w,
                r[0].per_s, r[0].p99, r[1].per_s, r[1].p99, r[1].per_s / r[0].per_s);
  }
  // The in-flight accounting's cost per request by scheduler.inflight_kv (the decisions above count
  // the default, distinct), against `whole` (no chain) in the same process.
  {
    auto f = build(128, scenarios[0]);
    const size_t n = quick ? 20000 : 100000;
    std::printf("\nin-flight accounting, thread CPU us per request (begin + end), 128 workers:\n");
    for (uint32_t per_worker : {1u, 16u})
      for (uint32_t blocks : {128u, 2048u}) {
        const size_t k = blocks > 128 ? n / 16 : n;
        const double whole = accounting_us(*f, "whole", blocks, per_worker, k);
        const double once = accounting_us(*f, "prefix_once", blocks, per_worker, k);
        const double distinct = accounting_us(*f, "distinct", blocks, per_worker, k);
        std::printf("  %2u in flight per worker, %4u-block prompts: whole %.2f, prefix_once %.2f, distinct %.2f"
                    " (%.0fx whole)\n", per_worker, blocks, whole, once, distinct, distinct / whole);
      }
    const size_t d = quick ? 20000 : 100000;
    const double whole = decisions_beside_accounting(*f, "whole", 2048, d);
    const double distinct = decisions_beside_accounting(*f, "distinct", 2048, d);
    std::printf("  decisions per wall second beside a thread accounting 2048-block requests: whole %.0f, distinct %.0f"
                " (%.2fx)\n", whole, distinct, distinct / whole);
  }
  std::printf("{\"workers\":1024,\"scenario\":\"default\",\"decisions_per_s\":%.0f,\"decision_p50_us\":%.3f,"
              "\"decision_p99_us\":%.3f,\"decision_wall_p99_us\":%.3f,\"baseline\":\"O(workers) schedule()\",\"baseline_decisions_per_s\":%.0f,"
              "\"baseline_p50_us\":%.3f,\"baseline_p99_us\":%.3f,\"p99_ratio_vs_baseline\":%.2f,"
              "\"throughput_ratio_vs_baseline\":%.2f,\"decision_p99_us_8192\":%.3f,\"baseline_p99_us_8192\":%.3f,"
              "\"same_choices\":true,\"rounds\":%d,\"quick\":%s}\n",
              headline.fast.per_s, headline.fast.p50, headline.fast.p99, headline.fast.wall_p99, headline.ref.per_s, headline.ref.p50,
              headline.ref.p99, headline.ref.p99 / headline.fast.p99, headline.fast.per_s / headline.ref.per_s,
              at8192.fast.p99, at8192.ref.p99, rounds, quick ? "true" : "false");
  return 0;
}
