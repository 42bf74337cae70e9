// bench_resync: how fast a router that starts next to a fleet rebuilds the
// fleet's caches (target: 1M blocks within 5 s). A real nats-server
// (default max_payload, 1 MiB) is started on a free port; WORKERS in-process
// workers each hold BLOCKS/WORKERS blocks and answer chunked resync requests
// as kvroute-mocker does (snapshot on chunk 0, events/wire.h); the router side
// is the production EventPipeline + EventSequencer + RadixIndexer. The clock
// starts when the workers' first heartbeats are published and stops when the
// index holds every block.
// Baseline, in the same process: the same dumps decoded and applied from the
// legacy JSON dump encoding (one message per worker, which NATS would refuse
// above 1 MiB: measured without the network) against the compact chunks
// decoded and applied the same way.
//   bench_resync [BLOCKS=1000000] [WORKERS=4]
// Last line: one JSON object.
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "events/event_pipeline.h"
#include "events/nats_bus.h"
#include "events/wire.h"
#include "tests/support/nats_server.h"
#include "indexer/event_sequencer.h"
#include "indexer/radix_indexer.h"

using namespace kvroute;
using Clock_ = std::chrono::steady_clock;

namespace {

// A worker's cache: chains of 32 blocks (a prompt each), distinct per worker.
ResyncDump make_dump(uint64_t worker, size_t blocks) {
  std::mt19937_64 rng(worker);
  ResyncDump d;
  d.owner = CacheOwner{WorkerId{worker}, 0};
  d.last_event_id = blocks / 32;
  d.instance = worker * 1000 + 7;
  for (size_t done = 0; done < blocks;) {
    KvEvent ev;
    ev.owner = d.owner;
    KvStored st;
    for (size_t i = 0; i < 32 && done < blocks; ++i, ++done)
      st.blocks.push_back({SequenceHash{rng()}, LocalBlockHash{rng()}});
    ev.data = std::move(st);
    d.events.push_back(std::move(ev));
  }
  return d;
}

// Answers chunked resync requests for one dump, as kvroute-mocker does.
struct FakeWorker {
  ResyncDump dump;
  std::unique_ptr<NatsBus> bus;
  std::mutex mu;
  uint64_t snapshot = 0;
  std::vector<std::string> chunks;
  void answer(const NatsMessage& m) {
    ResyncRequest rq;
    if (m.reply.empty() || decode_resync_request(m.data, rq) != DecodeError::None) return;
    std::lock_guard lk(mu);
    if (rq.snapshot == 0 && rq.chunk == 0) chunks = encode_resync_chunks(dump, ++snapshot, std::min<size_t>(rq.max_bytes, bus->max_payload()));
    else if (rq.snapshot != snapshot) return (void)bus->publish(m.reply, encode_resync_gone());
    if (rq.chunk < chunks.size()) bus->publish(m.reply, chunks[rq.chunk]);
  }
};

double decode_apply(const std::vector<std::string>& messages, bool compact) {
  RadixIndexer radix;
  EventSequencer seq(radix);
  DecodeLimits limits;
  limits.max_message_bytes = size_t{1} << 30;
  limits.max_events_per_message = size_t{1} << 24;
  const auto t0 = Clock_::now();
  for (const auto& m : messages) {
    ResyncChunk c;
    if (decode_resync_chunk(m, limits, c) != DecodeError::None) return -1;
    (void)compact;
    seq.apply_resync(c.dump.owner, c.dump.last_event_id, c.dump.events, c.dump.instance);
  }
  return std::chrono::duration<double>(Clock_::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t blocks = argc > 1 ? std::stoull(argv[1]) : 1000000;
  const uint64_t workers = argc > 2 ? std::stoull(argv[2]) : 4;
  kvroute::testing::NatsServer nats;
  if (!nats.ok()) {
    std::fprintf(stderr, "nats-server not found\n");
    return 1;
  }
  const std::string url = nats.url();
  std::string err;
  std::vector<std::unique_ptr<FakeWorker>> fleet;
  for (uint64_t w = 1; w <= workers; ++w) {
    auto fw = std::make_unique<FakeWorker>();
    fw->dump = make_dump(w, blocks / workers);
    fw->bus = NatsBus::connect(url, "worker", std::chrono::seconds(10), &err);
    if (!fw->bus || !fw->bus->subscribe(fmt::format("bench.kv_resync.{}", w),
                                        [p = fw.get()](const NatsMessage& m) { p->answer(m); }, &err)) {
      std::fprintf(stderr, "worker: %s\n", err.c_str());
      return 1;
    }
    fleet.push_back(std::move(fw));
  }
  // The router side, as router/main.cpp wires it.
  RadixIndexer radix;
  EventSequencer sequencer(radix);
  WorkerRegistry registry(SteadyClock::instance());
  EventsConfig ec;
  ec.subject_prefix = "bench";
  EventPipeline pipeline(ec, 16, sequencer, registry, SteadyClock::instance());
  sequencer.set_resync_callback([&](CacheOwner o) { pipeline.request_resync(o); });
  auto bus = NatsBus::connect(url, "router", std::chrono::seconds(10), &err);
  if (!bus || !pipeline.start(*bus, &err)) {
    std::fprintf(stderr, "router: %s\n", err.c_str());
    return 1;
  }
  for (auto& fw : fleet) fw->bus->flush(std::chrono::seconds(2));
  bus->flush(std::chrono::seconds(2));

  const auto t0 = Clock_::now();
  for (auto& fw : fleet) {
    WorkerHeartbeat hb;
    hb.worker_id = fw->dump.owner.worker;
    hb.url = "http://127.0.0.1:9";
    hb.block_size = 16;
    hb.instance_id = fw->dump.instance;
    fw->bus->publish("bench.workers", encode_heartbeat(hb));
  }
  while (radix.stats().entries < blocks && Clock_::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const double rebuild_s = std::chrono::duration<double>(Clock_::now() - t0).count();
  const uint64_t entries = radix.stats().entries;
  const uint64_t chunks = pipeline.stats().resync_chunks_total.load();
  pipeline.stop();
  bus.reset();
  fleet.clear();

  // Baseline: legacy JSON dumps vs compact chunks, decode + apply, no network.
  std::vector<std::string> json, compact;
  size_t json_bytes = 0, compact_bytes = 0;
  for (uint64_t w = 1; w <= workers; ++w) {
    const auto d = make_dump(w, blocks / workers);
    json.push_back(encode_resync_dump(d));
    json_bytes += json.back().size();
    for (auto& c : encode_resync_chunks(d, 1, size_t{1} << 20)) compact_bytes += c.size(), compact.push_back(std::move(c));
  }
  const double json_s = decode_apply(json, false);
  const double compact_s = decode_apply(compact, true);

  std::printf("fleet of %llu workers, %zu blocks: index rebuilt over NATS in %.3f s (%llu entries, %llu chunk requests, "
              "max_payload 1 MiB)\n",
              static_cast<unsigned long long>(workers), blocks, rebuild_s, static_cast<unsigned long long>(entries),
              static_cast<unsigned long long>(chunks));
  std::printf("decode + apply without network: compact chunks %.3f s (%.1f B/block), legacy JSON dump %.3f s "
              "(%.1f B/block): %.2fx\n",
              compact_s, double(compact_bytes) / blocks, json_s, double(json_bytes) / blocks, json_s / compact_s);
  std::printf(
      "{\"blocks\":%zu,\"workers\":%llu,\"rebuild_s\":%.3f,\"entries\":%llu,\"chunks\":%llu,\"compact_decode_apply_s\":%.3f,"
      "\"json_decode_apply_s\":%.3f,\"compact_bytes_per_block\":%.1f,\"json_bytes_per_block\":%.1f}\n",
      blocks, static_cast<unsigned long long>(workers), rebuild_s, static_cast<unsigned long long>(entries),
      static_cast<unsigned long long>(chunks), compact_s, json_s, double(compact_bytes) / blocks,
      double(json_bytes) / blocks);
  return entries == blocks ? 0 : 1;
}
