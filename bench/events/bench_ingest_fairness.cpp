// How long one worker's KV event waits behind another worker's backlog in
// the ingest pipeline (events/event_pipeline.h: one queue per worker, served
// round-robin, one message at a time).
//
// A hostile worker queues --backlog messages of 256 blocks each (random ids)
// before the writer starts; then a legitimate worker queues one message of
// 256 blocks and the writer starts. Measured (wall clock, median of --reps):
//   legit_ms    until the legitimate message is in the index;
//   backlog_ms  until the whole backlog is applied: what the legitimate
//               message waited behind a single FIFO queue (the design before).
// Prints both and their ratio. events.queue_worker_share is 1 here so that
// the whole backlog is queued (the default 0.25 would drop its excess).
//
// Run: build/bench/events/bench_ingest_fairness [--backlog 2000] [--reps 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "events/event_pipeline.h"
#include "indexer/radix_indexer.h"
#include "fleet/worker_registry.h"

using namespace kvroute;

namespace {

std::vector<KvEvent> message(uint64_t worker, std::mt19937_64& rng) {
  KvEvent e;
  e.owner = CacheOwner{WorkerId{worker}, 0};
  KvStored s;
  for (int i = 0; i < 256; ++i) s.blocks.push_back({SequenceHash{rng() >> 1}, LocalBlockHash{rng()}});
  e.data = std::move(s);
  std::vector<KvEvent> v;
  v.push_back(std::move(e));
  return v;
}

struct Run {
  double legit_ms, backlog_ms;
};

Run one(size_t backlog, uint64_t seed) {
  EventsConfig cfg;
  cfg.queue_capacity = static_cast<uint32_t>(backlog + 16);
  cfg.queue_capacity_bytes = uint64_t{1} << 34;
  cfg.queue_worker_share = 1.0;
  RadixIndexer idx;
  WorkerRegistry registry(SteadyClock::instance());
  EventPipeline p(cfg, 16, idx, registry, SteadyClock::instance());
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < backlog; ++i) p.enqueue_events(message(9, rng));
  p.enqueue_events(message(1, rng));
  const auto t0 = std::chrono::steady_clock::now();
  p.start_writer();
  double legit = -1;
  for (;;) {
    const auto by = idx.entries_by_worker();
    const auto now = std::chrono::steady_clock::now();
    bool legit_done = false;
    uint64_t hostile = 0;
    for (const auto& [w, n] : by) {
      if (w.value == 1 && n == 256) legit_done = true;
      if (w.value == 9) hostile = n;
    }
    if (legit_done && legit < 0) legit = std::chrono::duration<double, std::milli>(now - t0).count();
    if (legit >= 0 && hostile == backlog * 256) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  p.drain();
  const double all = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  p.stop();
  return {legit, all};
}

}  // namespace

int main(int argc, char** argv) {
  size_t backlog = 2000;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--backlog")) backlog = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  std::vector<double> legit, all;
  for (int r = 0; r < reps; ++r) {
    const Run x = one(backlog, 7 + static_cast<uint64_t>(r));
    legit.push_back(x.legit_ms);
    all.push_back(x.backlog_ms);
  }
  std::sort(legit.begin(), legit.end());
  std::sort(all.begin(), all.end());
  const double l = legit[legit.size() / 2], a = all[all.size() / 2];
  std::printf("a legitimate message behind a %zu-message backlog (%zu blocks) of another worker: applied after "
              "%.2f ms; the backlog took %.1f ms (what a single FIFO queue made it wait); ratio %.0fx\n",
              backlog, backlog * 256, l, a, a / l);
  std::printf("{\"bench\":\"ingest_fairness\",\"backlog_messages\":%zu,\"legit_ms\":%.3f,\"backlog_ms\":%.1f}\n", backlog,
              l, a);
  return 0;
}
