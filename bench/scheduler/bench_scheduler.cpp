// bench/scheduler: routing decisions per second and decision latency at
// 1,024 workers — the production RoutingService (block hashing of the
// request's token ids, find_matches on a populated RadixIndexer, candidate
// load from the WorkerRegistry, cost scoring and ranking), with and without
// the predicted-load bookkeeping a real request adds (in-flight begin, first
// byte, end), in the same run.
//
// Parameters: 1,024 workers, block size 16; the index holds 256 prefixes of
// 128 blocks, each on 8 workers (262k entries) plus a 32-block system prompt
// on every worker; requests are 2,048-token prompts (128 blocks) on one of
// the prefixes with a random suffix. 200,000 decisions per variant, one
// thread, seed 7.
//
// Run: build/bench/scheduler/bench_scheduler [--quick]
// The last line is one JSON object.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"
#include "router/routing.h"

using namespace kvroute;
using Steady = std::chrono::steady_clock;

namespace {

constexpr uint32_t kWorkers = 1024, kBlock = 16, kPrefixes = 256, kPrefixBlocks = 128;

std::vector<TokenId> prefix_tokens(uint32_t p, size_t n) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = (i < 32 * kBlock) ? static_cast<TokenId>(i) : p * 1000003u + static_cast<TokenId>(i);
  return t;
}

struct Result {
  double per_s = 0, p50 = 0, p99 = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && !std::strcmp(argv[1], "--quick");
  const size_t decisions = quick ? 20000 : 200000;
  ManualClock clock;
  SeededRandom random(7);
  RadixIndexer index;
  WorkerRegistry registry(clock);
  Config cfg;
  cfg.indexer.block_size = kBlock;
  ConfigStore config(cfg);
  RoutingService routing(index, registry, config, random);

  for (uint32_t w = 0; w < kWorkers; ++w) {
    WorkerAnnouncement a;
    a.id = WorkerId{w};
    a.url = "http://10.0.0.1:" + std::to_string(8000 + w);
    a.model = "m";
    a.block_size = kBlock;
    a.load = WorkerLoad{w % 50, 256, w % 3, 1000 + 7 * w, 16384};
    registry.on_heartbeat(a);
  }
  for (uint32_t p = 0; p < kPrefixes; ++p) {
    const auto hashes = hash_blocks(prefix_tokens(p, kPrefixBlocks * kBlock), kBlock);
    for (uint32_t r = 0; r < 8; ++r) {
      KvEvent ev;
      ev.owner = CacheOwner{WorkerId{(p * 8 + r) % kWorkers}, 0};
      KvStored st;
      SequenceHash parent{0};
      for (auto h : hashes) st.blocks.push_back({parent = sequence_hash(parent, h), h});
      ev.data = st;
      index.apply(ev);
    }
  }
  std::printf("index: %llu entries, %llu blocks; %u workers\n", (unsigned long long)index.stats().entries,
              (unsigned long long)index.stats().blocks, kWorkers);

  std::mt19937_64 rng(7);
  std::vector<ParsedRequest> reqs(1024);
  for (auto& r : reqs) {
    r.model = "m";
    r.has_prompt_tokens = true;
    r.prompt_tokens = prefix_tokens(static_cast<uint32_t>(rng() % kPrefixes), kPrefixBlocks * kBlock - 64);
    for (int i = 0; i < 64; ++i) r.prompt_tokens.push_back(static_cast<TokenId>(rng()));
  }

  std::array<double, 4> stage_total{};
  auto run = [&](bool bookkeeping) {
    stage_total = {};
    std::vector<double> us;
    us.reserve(decisions);
    const auto t0 = Steady::now();
    for (size_t i = 0; i < decisions; ++i) {
      const auto s = Steady::now();
      RouteResult r = routing.route(reqs[i % reqs.size()]);
      if (bookkeeping) {
        const auto& t = r.ranked.front();
        InflightGuard g(registry, t.worker, r.request_blocks, t.prefill_tokens);
        g.first_byte();
      }
      us.push_back(std::chrono::duration<double, std::micro>(Steady::now() - s).count());
      for (int k = 0; k < 4; ++k) stage_total[k] += r.stage_seconds[k];
      if (!r.ok) {
        std::fprintf(stderr, "routing failed: %s\n", r.error.message.c_str());
        std::exit(1);
      }
    }
    Result res;
    res.per_s = static_cast<double>(decisions) / std::chrono::duration<double>(Steady::now() - t0).count();
    std::sort(us.begin(), us.end());
    res.p50 = us[us.size() / 2];
    res.p99 = us[us.size() * 99 / 100];
    return res;
  };
  run(false);  // warm-up
  const Result plain = run(false);
  const Result full = run(true);
  std::printf("mean per stage (us): tokenize %.2f, hash %.2f, find_matches %.2f, score %.2f (candidates + cost + ranking)\n",
              stage_total[0] / decisions * 1e6, stage_total[1] / decisions * 1e6, stage_total[2] / decisions * 1e6,
              stage_total[3] / decisions * 1e6);
  std::printf("decision without bookkeeping: %10.0f /s  p50 %7.2f us  p99 %7.2f us\n", plain.per_s, plain.p50, plain.p99);
  std::printf("decision with bookkeeping:    %10.0f /s  p50 %7.2f us  p99 %7.2f us  (throughput ratio %.3f)\n",
              full.per_s, full.p50, full.p99, full.per_s / plain.per_s);
  std::printf("{\"decisions_per_s\":%.0f,\"decision_p50_us\":%.3f,\"decision_p99_us\":%.3f,"
              "\"baseline_decisions_per_s\":%.0f,\"baseline_p99_us\":%.3f,\"ratio_vs_baseline\":%.3f,\"workers\":%u,"
              "\"quick\":%s}\n",
              full.per_s, full.p50, full.p99, plain.per_s, plain.p99, full.per_s / plain.per_s, kWorkers,
              quick ? "true" : "false");
  return 0;
}
