// bench/indexer: throughput, lookup latency and memory of the prefix index,
// RadixIndexer against the naive reference (NaiveIndexer), in the same run.
//
// What it measures
//   1. Event conversion: the Mooncake conversation trace (12,031 requests,
//      512-token hash ids) becomes per-worker KV events. Each hash id is split
//      into `sub` = 32 blocks (16-token blocks); `copies` id-shifted copies of
//      the trace scale it up (fixed per scenario). Every request is routed to
//      a worker by its conversation (second hash id), whose cache stores the
//      request's missing blocks as one stored chain and evicts least recently
//      used blocks beyond `capacity` blocks per worker (removed events).
//   2. Apply: all events replayed into each index on one thread: events/s and
//      blocks/s (stored + removed blocks).
//   3. find_matches: 128-block requests drawn from the trace at 1,024 workers,
//      p50/p99 latency per call; also a worst case where one 128-block prefix
//      is held by every one of the 1,024 workers.
//   3b. find_matches latency on a reader thread while the writer removes 64
//      workers (long clears, chunked): the wait behind writes.
//   4. Memory per (block, worker) entry: the heap growth while applying
//      (glibc mallinfo2, malloc headers included; reported in the JSON as
//      bytes_per_block_worker) and the index's own estimate (stats().bytes).
//      The event stream is built before, so it is not counted.
// Scenarios: 8 workers (capacity 100k blocks each), 64 workers (20k each),
// 1,024 workers (copies 2, capacity 1M: nothing evicted, 11.8 M entries).
// --quick: first 1,500 trace requests, copies 1 (~1 M entries), fewer
// lookups; ~10 s, registered in CTest (label bench).
// Seed: 42 (lookup sampling). Deterministic event streams.
// speedup_vs_naive = radix blocks/s / naive blocks/s (apply, 1,024 workers);
// lookup_speedup_vs_naive = naive p50 / radix p50 (trace requests).
//
// Run: build-indexer/bench/indexer/bench_indexer [--trace PATH] [--quick]
// (full scale: ~2-3 min, peak RSS ~6.3 GiB, most of it the naive index).
// The last line is one JSON object.
#include <malloc.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "indexer/naive_indexer.h"
#include "indexer/radix_indexer.h"

using namespace kvroute;
using Clock = std::chrono::steady_clock;

namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Peak resident set size of the process so far (VmHWM), bytes.
size_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// Bytes allocated from the heap right now, malloc headers included (glibc).
// Unlike RSS it is not hidden by memory freed and reused between scenarios.
size_t heap_bytes() {
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

std::vector<std::vector<uint64_t>> load_trace(const std::string& path) {
  std::vector<std::vector<uint64_t>> out;
  simdjson::dom::parser parser;
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read trace %s\n", path.c_str());
    std::exit(2);
  }
  std::string line;
  while (std::getline(in, line)) {
    auto doc = parser.parse(line);
    if (doc.error()) continue;
    std::vector<uint64_t> ids;
    for (auto v : doc.value_unsafe()["hash_ids"].get_array()) ids.push_back(v.get_uint64().value_unsafe());
    out.push_back(std::move(ids));
  }
  return out;
}

// Local hash of sub-block j of hash id h in copy c (equal ids -> equal content).
LocalBlockHash local_of(uint64_t h, uint32_t j, uint32_t c) { return LocalBlockHash{mix(h * 1315423911u + j + (uint64_t{c} << 48))}; }

struct Workload {
  std::vector<KvEvent> events;
  uint64_t stored_blocks = 0, removed_blocks = 0;
};

Workload make_events(const std::vector<std::vector<uint64_t>>& trace, uint32_t workers, uint32_t sub,
                     uint32_t copies, size_t capacity) {
  Workload w;
  struct Cache {
    std::list<uint64_t> lru;  // sequence ids, oldest first
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> pos;
    uint64_t next_event = 1;
  };
  std::vector<Cache> caches(workers);
  for (uint32_t c = 0; c < copies; ++c) {
    for (const auto& req : trace) {
      if (req.empty()) continue;
      const uint32_t wk = static_cast<uint32_t>(mix((req.size() > 1 ? req[1] : req[0]) + c) % workers);
      Cache& cache = caches[wk];
      KvStored st;
      uint64_t parent = 0;
      bool chain_open = false;
      std::vector<KvEvent> pending;
      auto flush = [&] {
        if (st.blocks.empty()) return;
        KvEvent ev;
        ev.owner = CacheOwner{WorkerId{wk}, 0};
        ev.event_id = cache.next_event++;
        ev.data = std::move(st);
        w.events.push_back(std::move(ev));
        st = KvStored{};
      };
      for (uint64_t h : req) {
        for (uint32_t j = 0; j < sub; ++j) {
          const LocalBlockHash local = local_of(h, j, c);
          const uint64_t seq = mix(parent ^ local.value) | 1;  // engine id: prefix-dependent
          auto it = cache.pos.find(seq);
          if (it != cache.pos.end()) {
            cache.lru.splice(cache.lru.end(), cache.lru, it->second);  // touch
            flush();
            chain_open = false;
          } else {
            if (!chain_open) {
              if (parent) st.parent = SequenceHash{parent};
              chain_open = true;
            }
            st.blocks.push_back({SequenceHash{seq}, local});
            cache.lru.push_back(seq);
            cache.pos[seq] = std::prev(cache.lru.end());
            ++w.stored_blocks;
          }
          parent = seq;
        }
      }
      flush();
      // Evict beyond capacity, oldest first (never the request just stored:
      // capacity is far above one request).
      KvRemoved rm;
      while (cache.lru.size() > capacity) {
        rm.block_hashes.push_back(SequenceHash{cache.lru.front()});
        cache.pos.erase(cache.lru.front());
        cache.lru.pop_front();
      }
      if (!rm.block_hashes.empty()) {
        w.removed_blocks += rm.block_hashes.size();
        KvEvent ev;
        ev.owner = CacheOwner{WorkerId{wk}, 0};
        ev.event_id = cache.next_event++;
        ev.data = std::move(rm);
        w.events.push_back(std::move(ev));
      }
    }
  }
  return w;
}

struct ApplyResultStats {
  double seconds = 0;
  double events_per_s = 0, blocks_per_s = 0;
  IndexStats stats;
  double heap_per_entry = 0;
  uint64_t rejected = 0;
};

ApplyResultStats apply_all(Indexer& idx, const Workload& w) {
  ApplyResultStats r;
  const size_t heap0 = heap_bytes();
  const auto t0 = Clock::now();
  for (const auto& ev : w.events) r.rejected += idx.apply(ev) != ApplyResult::Applied;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.events_per_s = static_cast<double>(w.events.size()) / r.seconds;
  r.blocks_per_s = static_cast<double>(w.stored_blocks + w.removed_blocks) / r.seconds;
  r.stats = idx.stats();
  const size_t heap1 = heap_bytes();
  r.heap_per_entry = r.stats.entries && heap1 > heap0
                         ? static_cast<double>(heap1 - heap0) / static_cast<double>(r.stats.entries)
                         : 0;
  return r;
}

struct Latency {
  double p50 = 0, p99 = 0, mean_owners = 0;
};

Latency lookups(const Indexer& idx, const std::vector<std::vector<LocalBlockHash>>& reqs) {
  std::vector<double> us;
  us.reserve(reqs.size());
  double owners = 0;
  for (const auto& q : reqs) {
    const auto t0 = Clock::now();
    auto r = idx.find_matches(q);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    owners += static_cast<double>(r.owners.size());
  }
  std::sort(us.begin(), us.end());
  Latency l;
  l.p50 = us[us.size() / 2];
  l.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  l.mean_owners = owners / static_cast<double>(reqs.size());
  return l;
}

// 128-block requests: a trace request's blocks (copy 0), extended with
// uncached blocks when shorter.
std::vector<std::vector<LocalBlockHash>> sample_requests(const std::vector<std::vector<uint64_t>>& trace, uint32_t sub,
                                                         size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<LocalBlockHash>> out;
  while (out.size() < n) {
    const auto& req = trace[rng() % trace.size()];
    std::vector<LocalBlockHash> q;
    for (uint64_t h : req)
      for (uint32_t j = 0; j < sub && q.size() < 128; ++j) q.push_back(local_of(h, j, 0));
    while (q.size() < 128) q.push_back(LocalBlockHash{rng()});
    out.push_back(std::move(q));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string trace_path = KVROUTE_DEFAULT_TRACE;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--trace") && i + 1 < argc) trace_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else {
      std::fprintf(stderr, "usage: bench_indexer [--trace PATH] [--quick]\n");
      return 2;
    }
  }
  auto trace = load_trace(trace_path);
  if (quick) trace.resize(std::min<size_t>(trace.size(), 1500));
  std::printf("trace: %zu requests (%s)%s\n", trace.size(), trace_path.c_str(), quick ? " [quick]" : "");

  struct Scenario {
    uint32_t workers, sub, copies;
    size_t capacity;
  };
  const std::vector<Scenario> scenarios = {
      {8, 32, 1, 100000}, {64, 32, 1, 20000}, {1024, 32, quick ? 1u : 2u, 1000000}};
  std::printf("%-8s %-7s %10s %10s | %12s %12s | %12s %12s | %9s %9s %9s | %8s\n", "workers", "index", "events",
              "blocks", "events/s", "blocks/s", "entries", "nodes", "B/entry", "heap B/e", "apply s", "rejected");
  const auto run_start = Clock::now();
  double final_events_s = 0, final_blocks_s = 0, final_bytes = 0, final_heap = 0, apply_speedup = 0;
  Latency radix_lat, naive_lat, radix_hot, naive_hot;
  double during_p99 = 0, during_max = 0;
  uint64_t final_entries = 0;
  for (const auto& sc : scenarios) {
    Workload w = make_events(trace, sc.workers, sc.sub, sc.copies, sc.capacity);
    ApplyResultStats rr, nr;
    std::unique_ptr<RadixIndexer> radix = std::make_unique<RadixIndexer>();
    rr = apply_all(*radix, w);
    std::unique_ptr<NaiveIndexer> naive = std::make_unique<NaiveIndexer>();
    nr = apply_all(*naive, w);
    for (auto [name, r] : {std::pair{"radix", &rr}, std::pair{"naive", &nr}})
      std::printf("%-8u %-7s %10zu %10llu | %12.0f %12.0f | %12llu %12llu | %9.1f %9.1f %9.2f | %8llu\n", sc.workers,
                  name, w.events.size(), (unsigned long long)(w.stored_blocks + w.removed_blocks), r->events_per_s,
                  r->blocks_per_s, (unsigned long long)r->stats.entries, (unsigned long long)r->stats.blocks,
                  r->stats.entries ? double(r->stats.bytes) / double(r->stats.entries) : 0.0, r->heap_per_entry,
                  r->seconds, (unsigned long long)r->rejected);
    if (rr.stats.entries != nr.stats.entries || rr.stats.blocks != nr.stats.blocks) {
      std::fprintf(stderr, "MISMATCH: radix and naive disagree on the index contents\n");
      return 1;
    }
    if (sc.workers == 1024) {
      final_events_s = rr.events_per_s;
      final_blocks_s = rr.blocks_per_s;
      final_bytes = rr.stats.entries ? double(rr.stats.bytes) / double(rr.stats.entries) : 0;
      final_entries = rr.stats.entries;
      final_heap = rr.heap_per_entry;
      apply_speedup = rr.blocks_per_s / nr.blocks_per_s;
      const auto reqs = sample_requests(trace, sc.sub, quick ? 2000 : 20000, 42);
      radix_lat = lookups(*radix, reqs);
      naive_lat = lookups(*naive, reqs);
      // Worst case: one 128-block prefix held by all 1,024 workers.
      std::vector<LocalBlockHash> hot;
      for (uint32_t j = 0; j < 128; ++j) hot.push_back(LocalBlockHash{mix(0xABCDEF00ull + j)});
      for (uint32_t wk = 0; wk < sc.workers; ++wk) {
        KvEvent ev;
        ev.owner = CacheOwner{WorkerId{wk}, 0};
        KvStored st;
        for (uint32_t j = 0; j < 128; ++j) st.blocks.push_back({SequenceHash{mix(0x5EED0000ull + j)}, hot[j]});
        ev.data = st;
        radix->apply(ev);
        naive->apply(ev);
      }
      std::vector<std::vector<LocalBlockHash>> hot_reqs(quick ? 200 : 2000, hot);
      radix_hot = lookups(*radix, hot_reqs);
      naive_hot = lookups(*naive, hot_reqs);
      std::printf("\nfind_matches, 128-block requests, %u workers, %llu entries:\n", sc.workers,
                  (unsigned long long)final_entries);
      std::printf("  trace requests (mean %.1f owners matched): radix p50 %.2f us p99 %.2f us | naive p50 %.2f us p99 %.2f us\n",
                  radix_lat.mean_owners, radix_lat.p50, radix_lat.p99, naive_lat.p50, naive_lat.p99);
      std::printf("  hot prefix held by all %u workers:        radix p50 %.2f us p99 %.2f us | naive p50 %.2f us p99 %.2f us\n",
                  sc.workers, radix_hot.p50, radix_hot.p99, naive_hot.p50, naive_hot.p99);
      std::printf("  apply speedup (blocks/s radix / naive): %.2fx; lookup speedup (p50, trace): %.2fx\n",
                  apply_speedup, naive_lat.p50 / radix_lat.p50);
      // Lookups on a reader thread while the writer removes 64 workers (each
      // a long clear, applied in chunks of kMaxBlocksPerLock): how long a
      // lookup can wait behind writes. Two threads on a 2-core machine.
      {
        std::atomic<bool> done{false}, warm{false};
        std::vector<double> us;
        us.reserve(1 << 20);
        std::thread reader([&] {
          size_t k = 0;
          // Warm the thread up first (its malloc arena, caches): production
          // readers are long-lived io threads.
          for (int i = 0; i < 200; ++i) radix->find_matches(reqs[k++ % reqs.size()]);
          warm = true;
          while (!done.load(std::memory_order_relaxed)) {
            const auto t0 = Clock::now();
            auto r = radix->find_matches(reqs[k++ % reqs.size()]);
            us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
          }
        });
        while (!warm) std::this_thread::yield();
        const auto t0 = Clock::now();
        for (uint32_t wk = 0; wk < 64; ++wk) radix->remove_worker(WorkerId{wk});
        const double write_s = std::chrono::duration<double>(Clock::now() - t0).count();
        done = true;
        reader.join();
        std::sort(us.begin(), us.end());
        if (!us.empty()) {
          during_p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
          during_max = us.back();
        }
        std::printf("  during writes (64 remove_worker, %.1f ms of writer time, %zu lookups): p50 %.2f us p99 %.2f us max %.1f us\n",
                    write_s * 1e3, us.size(), us.empty() ? 0.0 : us[us.size() / 2], during_p99, during_max);
      }
    }
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - run_start).count();
  std::printf("\ntotal %.1f s, peak RSS %.0f MiB\n", total_s, double(peak_rss_bytes()) / (1 << 20));
  std::printf(
      "{\"events_per_s\":%.0f,\"blocks_per_s\":%.0f,\"find_matches_p50_us\":%.3f,\"find_matches_p99_us\":%.3f,"
      "\"find_matches_hot_p99_us\":%.3f,\"find_matches_during_writes_p99_us\":%.3f,\"entries\":%llu,\"bytes_per_block_worker\":%.1f,\"stats_bytes_per_block_worker\":%.1f,\"speedup_vs_naive\":%.2f,"
      "\"lookup_speedup_vs_naive\":%.2f,\"peak_rss_mib\":%.0f,\"total_s\":%.1f,\"quick\":%s}\n",
      final_events_s, final_blocks_s, radix_lat.p50, radix_lat.p99, radix_hot.p99, during_p99, (unsigned long long)final_entries,
      final_heap, final_bytes, apply_speedup, naive_lat.p50 / radix_lat.p50, double(peak_rss_bytes()) / (1 << 20), total_s, quick ? "true" : "false");
  return 0;
}
