// bench/scheduler's common testbed: the routing stack (a RadixIndexer, a
// WorkerRegistry of N workers, the config) populated with cached prefixes,
// the requests routed over it, and the thread CPU clock the figures use.
// Shared by bench_scheduler (routing decisions) and bench_kv_lookup (the KV
// location API against a decision), so both measure the same fleet.
//
// Scenarios: block size 16, requests of 128 blocks = 2,048 tokens (a cached
// prefix of 124 blocks + 64 random tokens); each of `prefixes` prefixes of
// 128 blocks held by `holders` workers (0 = every worker), and with
// `system_prompt` a 32-block system prompt on every worker. Seed 7.
#pragma once

#include <time.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"
#include "router/routing.h"

namespace kvroute::bench {

inline constexpr uint32_t kBlock = 16, kPrefixBlocks = 128, kSystemBlocks = 32;

struct Scenario {
  const char* name;
  bool system_prompt;
  uint32_t holders;   // workers holding each prefix; 0 = every worker
  uint32_t prefixes;
};

inline std::vector<TokenId> prefix_tokens(uint32_t p, size_t n, bool system_prompt) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i)
    t[i] = (system_prompt && i < kSystemBlocks * kBlock) ? static_cast<TokenId>(i)
                                                         : p * 1000003u + static_cast<TokenId>(i) + 7;
  return t;
}

// One run's routing stack: the index, the registry of `workers` workers and the requests.
struct Testbed {
  uint32_t workers = 0;
  ManualClock clock;
  RadixIndexer index;
  WorkerRegistry registry{clock};
  std::unique_ptr<ConfigStore> config;
  std::vector<ParsedRequest> reqs;
};

inline std::unique_ptr<Testbed> build(uint32_t workers, const Scenario& sc) {
  auto f = std::make_unique<Testbed>();
  f->workers = workers;
  Config cfg;
  cfg.indexer.block_size = kBlock;
  f->config = std::make_unique<ConfigStore>(cfg);
  for (uint32_t w = 0; w < workers; ++w) {
    WorkerAnnouncement a;
    a.id = WorkerId{w};
    a.url = "http://10.0.0.1:" + std::to_string(8000 + w);
    a.model = "m";
    a.block_size = kBlock;
    a.load = WorkerLoad{w % 50, 256, w % 3, 1000 + 7 * (w % 2048), 16384};
    f->registry.on_heartbeat(a);
  }
  auto store = [&](WorkerId w, const std::vector<LocalBlockHash>& hashes) {
    KvEvent ev;
    ev.owner = CacheOwner{w, 0};
    KvStored st;
    const std::vector<SequenceHash> ids = sequence_hashes(hashes);
    for (size_t i = 0; i < ids.size(); ++i) st.blocks.push_back({ids[i], hashes[i]});
    ev.data = st;
    f->index.apply(ev);
  };
  const uint32_t holders = sc.holders ? std::min(sc.holders, workers) : workers;
  for (uint32_t p = 0; p < sc.prefixes; ++p) {
    const auto hashes = hash_blocks(prefix_tokens(p, kPrefixBlocks * kBlock, sc.system_prompt), kBlock);
    for (uint32_t r = 0; r < holders; ++r) store(WorkerId{(p * holders + r) % workers}, hashes);
  }
  if (sc.system_prompt) {  // every worker (those above hold it already)
    const auto sys = hash_blocks(prefix_tokens(0, kSystemBlocks * kBlock, true), kBlock);
    for (uint32_t w = 0; w < workers; ++w) store(WorkerId{w}, sys);
  }
  std::mt19937_64 rng(7);
  f->reqs.resize(1024);
  for (auto& r : f->reqs) {
    r.model = "m";
    r.has_prompt_tokens = true;
    r.prompt_tokens =
        prefix_tokens(static_cast<uint32_t>(rng() % sc.prefixes), kPrefixBlocks * kBlock - 64, sc.system_prompt);
    for (int i = 0; i < 64; ++i) r.prompt_tokens.push_back(static_cast<TokenId>(rng()));
  }
  return f;
}

// Thread CPU time: what this thread ran, whatever else the (shared) machine
// runs. One read costs a system call (~0.3-0.7 us here); clock_overhead()
// measures it and latencies are net of it.
inline double cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

inline double clock_overhead() {
  std::vector<double> d(2001);
  for (auto& x : d) {
    const double a = cpu_us();
    x = cpu_us() - a;
  }
  std::sort(d.begin(), d.end());
  return d[d.size() / 2];
}

}  // namespace kvroute::bench
