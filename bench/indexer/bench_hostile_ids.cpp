// What a hostile worker's choice of ids costs the index writer.
//
// Measures (writer thread CPU, CLOCK_THREAD_CPUTIME_ID, median of --reps runs,
// each on a fresh RadixIndexer):
//   block_ids  204,800 engine block ids crafted to share one slot of the
//              previous unkeyed table (h = id * 0x9E37..., slot = (h ^ h>>32) &
//              mask: both halves of h equal), in 800 stored events of 256
//              blocks, against 204,800 random ids in the same events;
//   contents   204,800 one-block parentless events whose content hashes are
//              crafted the same way (all children of the root: its child map)
//              against random content hashes.
// Prints crafted / random for each (the keyed table's target: <= 3x), and, as
// the baseline, the same comparison for the previous unkeyed table (a copy of
// its probing, in this file) on --unkeyed-n ids (default 20,480: its cost grows
// with the square of the count, 204,800 would take minutes).
// Then the writer's exclusive holds seen from a reader: lookups on another
// thread while the writer applies one worker's 1,048,576-block flood
// (growing its maps) vs while it applies nothing; p50 / p99 / max.
//
// Seed 7. Run: build/bench/indexer/bench_hostile_ids [--reps 3] [--unkeyed-n 20480]
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "indexer/radix_indexer.h"

using namespace kvroute;

namespace {

double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::vector<uint64_t> crafted_ids(size_t n) {
  const uint64_t g = 0x9E3779B97F4A7C15ull;
  uint64_t inv = g;
  for (int i = 0; i < 6; ++i) inv *= 2 - g * inv;
  std::vector<uint64_t> ids;
  for (uint64_t v = 1; ids.size() < n; ++v) ids.push_back(((v << 32) | v) * inv);
  return ids;
}

std::vector<uint64_t> random_ids(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> ids(n);
  for (auto& x : ids) x = rng() & ~1ull;  // never the empty-key sentinel
  return ids;
}

// The previous FlatMap64 insert path (unkeyed multiplicative hash, linear
// probing, growth at 0.75): the baseline of the flood.
struct UnkeyedTable {
  std::vector<uint64_t> keys;
  size_t size = 0;
  static constexpr uint64_t kEmpty = ~0ull;
  size_t index(uint64_t key) const {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h ^ (h >> 32)) & (keys.size() - 1);
  }
  void put(uint64_t key) {
    if ((size + 1) * 4 > keys.size() * 3) {
      std::vector<uint64_t> old(keys.size() ? keys.size() * 2 : 8, kEmpty);
      old.swap(keys);
      size = 0;
      for (uint64_t k : old)
        if (k != kEmpty) put(k);
    }
    for (size_t i = index(key);; i = (i + 1) & (keys.size() - 1)) {
      if (keys[i] == key) return;
      if (keys[i] == kEmpty) {
        keys[i] = key;
        ++size;
        return;
      }
    }
  }
};

// 800 events of 256 blocks: block ids from `ids`, random contents.
double apply_block_ids(const std::vector<uint64_t>& ids) {
  RadixIndexer idx;
  idx.set_block_limits({}, uint64_t{1} << 30);
  std::mt19937_64 rng(7);
  std::vector<KvEvent> evs;
  for (size_t i = 0; i < ids.size(); i += 256) {
    KvEvent e;
    e.owner = CacheOwner{WorkerId{9}, 0};
    KvStored s;
    for (size_t k = i; k < std::min(ids.size(), i + 256); ++k)
      s.blocks.push_back({SequenceHash{ids[k]}, LocalBlockHash{rng()}});
    e.data = std::move(s);
    evs.push_back(std::move(e));
  }
  const double t0 = thread_cpu_s();
  for (const auto& e : evs) idx.apply(e);
  return thread_cpu_s() - t0;
}

// One-block parentless events: contents from `ids` (children of the root).
double apply_contents(const std::vector<uint64_t>& ids) {
  RadixIndexer idx;
  idx.set_block_limits({}, uint64_t{1} << 30);
  std::vector<KvEvent> evs;
  evs.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    KvEvent e;
    e.owner = CacheOwner{WorkerId{9}, 0};
    KvStored s;
    s.blocks.push_back({SequenceHash{i + 1}, LocalBlockHash{ids[i]}});
    e.data = std::move(s);
    evs.push_back(std::move(e));
  }
  const double t0 = thread_cpu_s();
  for (const auto& e : evs) idx.apply(e);
  return thread_cpu_s() - t0;
}

double unkeyed(const std::vector<uint64_t>& ids) {
  UnkeyedTable t;
  const double t0 = thread_cpu_s();
  for (uint64_t k : ids) t.put(k);
  return thread_cpu_s() - t0;
}

template <class F>
double median_of(int reps, F&& f) {
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) v.push_back(f());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Lat {
  double p50, p99, max;
};

// Lookup latency on a reader thread (a 64-block legitimate prefix, one lookup
// every 20 us) while `writer` runs.
template <class W>
Lat reader_latency(RadixIndexer& idx, W&& writer) {
  std::vector<LocalBlockHash> q;
  for (uint64_t i = 0; i < 64; ++i) q.push_back(LocalBlockHash{1000 + i});
  std::atomic<bool> stop{false};
  std::vector<double> us;
  std::thread reader([&] {
    while (!stop.load()) {
      const auto t0 = std::chrono::steady_clock::now();
      auto m = idx.find_matches(q);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      if (m.owners.empty()) std::abort();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  writer();
  stop = true;
  reader.join();
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100], us.back()};
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  size_t unkeyed_n = 20480;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--unkeyed-n")) unkeyed_n = std::strtoull(argv[i + 1], nullptr, 10);
  }
  const size_t n = 204800;
  const auto bad = crafted_ids(n), good = random_ids(n, 7);
  const double blk_bad = median_of(reps, [&] { return apply_block_ids(bad); });
  const double blk_good = median_of(reps, [&] { return apply_block_ids(good); });
  const double cnt_bad = median_of(reps, [&] { return apply_contents(bad); });
  const double cnt_good = median_of(reps, [&] { return apply_contents(good); });
  const std::vector<uint64_t> ubad(bad.begin(), bad.begin() + static_cast<long>(unkeyed_n));
  const std::vector<uint64_t> ugood(good.begin(), good.begin() + static_cast<long>(unkeyed_n));
  const double un_bad = median_of(reps, [&] { return unkeyed(ubad); });
  const double un_good = median_of(reps, [&] { return unkeyed(ugood); });
  std::printf("writer CPU, %zu ids, median of %d (seconds):\n", n, reps);
  std::printf("  engine block ids  crafted %.4f  random %.4f  ratio %.2f\n", blk_bad, blk_good, blk_bad / blk_good);
  std::printf("  content hashes    crafted %.4f  random %.4f  ratio %.2f\n", cnt_bad, cnt_good, cnt_bad / cnt_good);
  std::printf("  baseline: previous unkeyed table, %zu ids: crafted %.4f  random %.6f  ratio %.0f\n", unkeyed_n,
              un_bad, un_good, un_bad / un_good);

  // Exclusive holds while one worker floods: growth of its block map and of
  // the root's child map happens outside the hold.
  RadixIndexer idx;
  idx.set_block_limits({}, uint64_t{1} << 30);
  {
    KvEvent e;
    e.owner = CacheOwner{WorkerId{1}, 0};
    KvStored s;
    for (uint64_t i = 0; i < 64; ++i) s.blocks.push_back({SequenceHash{i + 1}, LocalBlockHash{1000 + i}});
    e.data = s;
    idx.apply(e);
  }
  const Lat idle = reader_latency(idx, [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
  const auto flood_ids = random_ids(1 << 20, 11);
  double flood_s = 0;
  const Lat flood = reader_latency(idx, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < flood_ids.size(); i += 256) {
      KvEvent e;
      e.owner = CacheOwner{WorkerId{9}, 0};
      KvStored s;
      for (size_t k = i; k < i + 256; ++k) s.blocks.push_back({SequenceHash{flood_ids[k]}, LocalBlockHash{flood_ids[k] ^ 1}});
      e.data = std::move(s);
      idx.apply(e);
    }
    flood_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  std::printf("lookups during one worker's 1,048,576-block flood (%.2f s of writing): p50 %.1f us  p99 %.1f us  "
              "max %.0f us; idle: p50 %.1f  p99 %.1f  max %.0f\n",
              flood_s, flood.p50, flood.p99, flood.max, idle.p50, idle.p99, idle.max);
  std::printf(
      "{\"bench\":\"hostile_ids\",\"block_ids_crafted_over_random\":%.3f,\"contents_crafted_over_random\":%.3f,"
      "\"unkeyed_crafted_over_random\":%.1f,\"unkeyed_n\":%zu,\"flood_lookup_p99_us\":%.1f,\"flood_lookup_max_us\":%.0f,"
      "\"idle_lookup_p99_us\":%.1f}\n",
      blk_bad / blk_good, cnt_bad / cnt_good, un_bad / un_good, unkeyed_n, flood.p99, flood.max, idle.p99);
  return 0;
}
