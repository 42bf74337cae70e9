// bench/events: decode + apply throughput of KV events arriving over ZMQ
// (vLLM msgpack batches with token ids, events/vllm_wire.h) against the NATS
// JSON path (Dynamo RouterEvent with tokens_hash, events/wire.h, as
// kvroute-mocker publishes it), in the same run, on one core.
//
// What it measures
//   The Mooncake conversation trace (12,031 requests, 512-token blocks given
//   as hash ids) becomes per-worker KV events: every request goes to one of
//   8 workers by its conversation (second hash id), whose cache stores the
//   request's missing blocks as one chain under the last cached one (no
//   eviction). Token ids are synthesized from the hash id (512 per block,
//   deterministic, uniform in [100, 100 + vocab)). The default vocab, 32000
//   (Llama 2, Mistral), makes nearly every id a msgpack uint16 (0.5% are
//   fixint / uint8); --vocab 152000 (Qwen 2) makes 57% of them uint32
//   (>= 65536), 43% uint16: the realistic worst case for the decoder.
//   Each stored chain is one payload on each path, encoded before timing:
//     zmq:  KVEventBatch [ts, [BlockStored(... token_ids ...)], 0], positional
//           (and, separately, tagged maps) - the router hashes 512 tokens per block;
//     nats: {"worker_id","event":{"event_id","data":{"stored":{"parent_hash",
//           "blocks":[{"block_hash","tokens_hash"}]}}}} - hashes precomputed by the worker.
//   Timed, per path, into a fresh RadixIndexer on this thread: decode ->
//   (zmq: to_kv_events, i.e. hashing) -> Indexer::apply, for every payload.
//   blocks/s = stored blocks applied / CPU time of this thread (not wall time:
//   the machine is shared); also payload MB/s. Each path
//   runs --reps times (default 3), the median is reported. The two indexes
//   must end with the same entry count (checked). The zmq path's split into
//   decode, hash and apply is printed too (separate passes), and the decode
//   with each payload already in cache (what bounds the decode phase).
// Target: zmq >= 2M blocks/s on one core.
//
// Run: build/bench/events/bench_events [--trace PATH] [--quick] [--reps N] [--vocab N]
// (--quick: first 2,000 requests; registered in CTest, label bench).
// The last line is one JSON object.
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "events/vllm_wire.h"
#include "events/wire.h"
#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"

using namespace kvroute;
#include <time.h>

// The benchmark thread's CPU time: the machine is shared (2 cores, many
// builds), and wall time would measure the neighbours. Both paths are timed
// alike, so their ratio holds either way.
struct Clock {
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<Clock, duration>;
  static time_point now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return time_point(duration(int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec));
  }
};

namespace {

constexpr uint32_t kBlock = 512;
constexpr uint32_t kWorkers = 8;

struct Request {
  std::vector<uint64_t> hash_ids;
};

std::vector<Request> load_trace(const std::string& path, size_t limit) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "bench_events: cannot open trace %s (--trace PATH)\n", path.c_str());
    std::exit(2);
  }
  simdjson::dom::parser p;
  std::vector<Request> out;
  std::string line;
  while (out.size() < limit && std::getline(f, line)) {
    simdjson::dom::element e = p.parse(line);
    Request r;
    for (simdjson::dom::element h : e["hash_ids"].get_array()) r.hash_ids.push_back(h.get_uint64());
    out.push_back(std::move(r));
  }
  return out;
}

uint32_t g_vocab = 32000;

void block_tokens(uint64_t hash_id, std::vector<TokenId>& out) {
  uint64_t x = hash_id * 0x9E3779B97F4A7C15ull + 1;
  for (uint32_t i = 0; i < kBlock; ++i) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    out.push_back(static_cast<TokenId>(100 + (x >> 33) % g_vocab));
  }
}

struct Chain {
  CacheOwner owner;
  std::optional<uint64_t> parent;
  std::vector<uint64_t> ids;
};

// The stored chains the workers announce, in trace order.
std::vector<Chain> build_chains(const std::vector<Request>& reqs) {
  std::vector<std::unordered_set<uint64_t>> cached(kWorkers);
  std::vector<Chain> out;
  for (const auto& r : reqs) {
    if (r.hash_ids.empty()) continue;
    const uint64_t conv = r.hash_ids.size() > 1 ? r.hash_ids[1] : r.hash_ids[0];
    const uint32_t w = static_cast<uint32_t>((conv * 0x9E3779B97F4A7C15ull) >> 61) % kWorkers;
    size_t k = 0;
    while (k < r.hash_ids.size() && cached[w].count(r.hash_ids[k])) ++k;
    if (k == r.hash_ids.size()) continue;
    Chain c{CacheOwner{WorkerId{w + 1}, 0}, k ? std::optional<uint64_t>(r.hash_ids[k - 1]) : std::nullopt, {}};
    for (size_t i = k; i < r.hash_ids.size(); ++i) {
      c.ids.push_back(r.hash_ids[i]);
      cached[w].insert(r.hash_ids[i]);
    }
    out.push_back(std::move(c));
  }
  return out;
}

struct Payloads {
  std::vector<std::string> zmq_pos, zmq_map, nats;
  std::vector<CacheOwner> owners;
  uint64_t blocks = 0;
};

Payloads encode(const std::vector<Chain>& chains) {
  Payloads p;
  uint64_t event_id = 0;
  std::vector<TokenId> toks;
  for (const auto& c : chains) {
    VllmEventBatch b;
    b.ts = 1.0;
    b.data_parallel_rank = 0;
    VllmBlockStored s;
    s.block_size = kBlock;
    s.medium = "GPU";
    if (c.parent) s.parent_block_hash = SequenceHash{*c.parent};
    KvStored st;
    if (c.parent) st.parent = SequenceHash{*c.parent};
    for (uint64_t id : c.ids) {
      toks.clear();
      block_tokens(id, toks);
      s.block_hashes.push_back(SequenceHash{id});
      s.token_ids.insert(s.token_ids.end(), toks.begin(), toks.end());
      st.blocks.push_back(StoredBlock{SequenceHash{id}, hash_block(toks)});
    }
    b.events.push_back(std::move(s));
    p.zmq_pos.push_back(encode_vllm_batch(b, VllmEncoding::Positional));
    p.zmq_map.push_back(encode_vllm_batch(b, VllmEncoding::TaggedMap));
    KvEvent ev{c.owner, ++event_id, StorageTier::Device, std::move(st)};
    p.nats.push_back(encode_kv_event(ev));
    p.owners.push_back(c.owner);
    p.blocks += c.ids.size();
  }
  return p;
}

struct Result {
  double seconds = 0;
  uint64_t blocks = 0, entries = 0;
};

// One ZMQ frame's payload into `batch` (the bench's own payloads: any error is a bug).
void decode_frame(const std::string& frame, VllmEventBatch& batch) {
  if (decode_vllm_batch({reinterpret_cast<const uint8_t*>(frame.data()), frame.size()}, DecodeLimits{}, batch) !=
      DecodeError::None)
    std::abort();
}

// Applies `events` (all stored events: the bench's payloads) to `index`, counting their blocks in r.
void apply_counted(RadixIndexer& index, const std::vector<KvEvent>& events, Result& r) {
  for (const auto& e : events) {
    index.apply(e);
    r.blocks += std::get<KvStored>(e.data).blocks.size();
  }
}

Result run_zmq(const Payloads& p, const std::vector<std::string>& frames) {
  RadixIndexer index;
  VllmEventBatch batch;
  std::vector<KvEvent> events;
  Result r;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < frames.size(); ++i) {
    decode_frame(frames[i], batch);
    events.clear();
    to_kv_events(batch, p.owners[i], kBlock, events);
    apply_counted(index, events, r);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.entries = index.stats().entries;
  return r;
}

// The zmq path's phases, each alone over the whole stream: decode, hash
// (to_kv_events on decoded batches), apply (converted events into an index).
// decode_hot: each payload decoded kHotRepeats times in a row into one reused
// batch, i.e. from cache after the first pass: the decoder's own speed,
// without reading the payload from DRAM (blocks/s = blocks x repeats / time).
constexpr int kHotRepeats = 8;
struct Phases {
  double decode = 0, hash = 0, apply = 0, decode_hot = 0;
};

Phases run_zmq_phases(const Payloads& p, const std::vector<std::string>& frames) {
  Phases ph;
  std::vector<VllmEventBatch> batches(frames.size());
  auto t0 = Clock::now();
  for (size_t i = 0; i < frames.size(); ++i) decode_frame(frames[i], batches[i]);
  ph.decode = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<std::vector<KvEvent>> events(frames.size());
  t0 = Clock::now();
  for (size_t i = 0; i < frames.size(); ++i) to_kv_events(batches[i], p.owners[i], kBlock, events[i]);
  ph.hash = std::chrono::duration<double>(Clock::now() - t0).count();
  RadixIndexer index;
  t0 = Clock::now();
  for (const auto& evs : events)
    for (const auto& e : evs) index.apply(e);
  ph.apply = std::chrono::duration<double>(Clock::now() - t0).count();
  VllmEventBatch hot;
  t0 = Clock::now();
  for (const auto& f : frames)
    for (int k = 0; k < kHotRepeats; ++k) decode_frame(f, hot);
  ph.decode_hot = std::chrono::duration<double>(Clock::now() - t0).count() / kHotRepeats;
  return ph;
}

Result run_nats(const Payloads& p) {
  RadixIndexer index;
  std::vector<KvEvent> events;
  Result r;
  const auto t0 = Clock::now();
  for (const auto& m : p.nats) {
    events.clear();
    if (decode_kv_events(m, DecodeLimits{}, events) != DecodeError::None) std::abort();
    apply_counted(index, events, r);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.entries = index.stats().entries;
  return r;
}

template <class F>
Result median_of(int reps, F f) {
  std::vector<Result> rs;
  for (int i = 0; i < reps; ++i) rs.push_back(f());
  std::sort(rs.begin(), rs.end(), [](const Result& a, const Result& b) { return a.seconds < b.seconds; });
  return rs[rs.size() / 2];
}

size_t bytes_of(const std::vector<std::string>& v) {
  size_t n = 0;
  for (const auto& s : v) n += s.size();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string trace = KVROUTE_DEFAULT_TRACE;
  bool quick = false;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--trace") && i + 1 < argc) trace = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--vocab") && i + 1 < argc) g_vocab = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--trace PATH] [--quick] [--reps N] [--vocab N]\n", argv[0]);
      return 2;
    }
  }
  const auto reqs = load_trace(trace, quick ? 2000 : SIZE_MAX);
  const auto chains = build_chains(reqs);
  const Payloads p = encode(chains);
  std::printf("trace: %zu requests -> %zu stored chains, %llu blocks of %u tokens, %u workers, vocab %u\n",
              reqs.size(), chains.size(), static_cast<unsigned long long>(p.blocks), kBlock, kWorkers, g_vocab);
  std::printf("payload bytes: zmq positional %.1f MB, zmq map %.1f MB, nats json %.1f MB\n",
              bytes_of(p.zmq_pos) / 1e6, bytes_of(p.zmq_map) / 1e6, bytes_of(p.nats) / 1e6);

  const Result zp = median_of(reps, [&] { return run_zmq(p, p.zmq_pos); });
  const Result zm = median_of(reps, [&] { return run_zmq(p, p.zmq_map); });
  const Result nj = median_of(reps, [&] { return run_nats(p); });
  std::vector<Phases> phs;
  for (int i = 0; i < reps; ++i) phs.push_back(run_zmq_phases(p, p.zmq_pos));
  auto med = [&](double Phases::*f) {
    std::vector<double> v;
    for (const auto& x : phs) v.push_back(x.*f);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double decode_s = med(&Phases::decode), hash_s = med(&Phases::hash), apply_s = med(&Phases::apply),
               decode_hot_s = med(&Phases::decode_hot);
  if (zp.entries != nj.entries || zm.entries != nj.entries || zp.blocks != p.blocks) {
    std::fprintf(stderr, "bench_events: indexes differ (zmq %llu, zmq map %llu, nats %llu entries)\n",
                 static_cast<unsigned long long>(zp.entries), static_cast<unsigned long long>(zm.entries),
                 static_cast<unsigned long long>(nj.entries));
    return 1;
  }
  auto rate = [](const Result& r) { return r.blocks / r.seconds; };
  std::printf("zmq positional: %.3f s, %.2f M blocks/s, %.0f MB/s\n", zp.seconds, rate(zp) / 1e6,
              bytes_of(p.zmq_pos) / zp.seconds / 1e6);
  std::printf("  phases alone: decode %.2f M blocks/s (%.0f MB/s), hash %.2f M blocks/s, apply %.2f M blocks/s\n",
              p.blocks / decode_s / 1e6, bytes_of(p.zmq_pos) / decode_s / 1e6, p.blocks / hash_s / 1e6,
              p.blocks / apply_s / 1e6);
  std::printf("  decode with each payload in cache (%d repeats): %.2f M blocks/s (%.0f MB/s)\n", kHotRepeats,
              p.blocks / decode_hot_s / 1e6, bytes_of(p.zmq_pos) / decode_hot_s / 1e6);
  std::printf("zmq map:        %.3f s, %.2f M blocks/s\n", zm.seconds, rate(zm) / 1e6);
  std::printf("nats json:      %.3f s, %.2f M blocks/s, %.0f MB/s\n", nj.seconds, rate(nj) / 1e6,
              bytes_of(p.nats) / nj.seconds / 1e6);
  std::printf("index entries (all paths): %llu; median of %d runs each\n",
              static_cast<unsigned long long>(nj.entries), reps);
  std::printf(
      "{\"bench\":\"events\",\"requests\":%zu,\"blocks\":%llu,\"block_size\":%u,\"vocab\":%u,\"zmq_blocks_per_s\":%.0f,"
      "\"zmq_map_blocks_per_s\":%.0f,\"zmq_decode_blocks_per_s\":%.0f,\"zmq_hash_blocks_per_s\":%.0f,"
      "\"zmq_apply_blocks_per_s\":%.0f,\"zmq_decode_hot_blocks_per_s\":%.0f,\"nats_blocks_per_s\":%.0f,"
      "\"zmq_over_nats\":%.3f,\"target_zmq_blocks_per_s\":2000000}\n",
      reqs.size(), static_cast<unsigned long long>(p.blocks), kBlock, g_vocab, rate(zp), rate(zm), p.blocks / decode_s,
      p.blocks / hash_s, p.blocks / apply_s, p.blocks / decode_hot_s, rate(nj), rate(zp) / rate(nj));
  return 0;
}
