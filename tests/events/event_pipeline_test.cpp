#include "events/event_pipeline.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <thread>

#include "indexer/radix_indexer.h"
#include "tests/support/recording_indexer.h"

using namespace kvroute;
using namespace std::chrono_literals;

namespace {

// Runs the writer thread without NATS: start() needs a bus, so tests drive the
// handlers directly and start the writer through a bus-less helper.
struct Harness {
  EventsConfig cfg;
  testing::RecordingIndexer index;
  SteadyClock& clock = SteadyClock::instance();
  WorkerRegistry registry{clock};
  std::unique_ptr<EventPipeline> pipeline;
  explicit Harness(uint32_t ttl_ms = 100000) {
    cfg.worker_ttl_ms = ttl_ms;
    cfg.queue_capacity = 16;
    cfg.queue_worker_share = 1.0;  // these tests are about one worker and the global bounds
    pipeline = std::make_unique<EventPipeline>(cfg, 16, index, registry, clock);
    pipeline->start_writer();
  }
};

}  // namespace

TEST_CASE("decoded events reach the index writer in order; bad ones are counted, never applied") {
  Harness h;
  h.pipeline->on_heartbeat_message(R"({"worker_id":3,"url":"http://127.0.0.1:9"})");
  for (int i = 1; i <= 5; ++i)
    h.pipeline->on_kv_message(
        R"({"worker_id":3,"event":{"event_id":)" + std::to_string(i) + R"(,"data":"cleared"}})");
  h.pipeline->on_kv_message("garbage");
  h.pipeline->on_kv_message(R"({"worker_id":3,"storage_tier":"tape","event":{"data":"cleared"}})");
  h.pipeline->drain();
  std::lock_guard lk(h.index.mu);
  REQUIRE(h.index.applied.size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(h.index.applied[i].event_id == uint64_t(i + 1));
  const auto& st = h.pipeline->stats();
  CHECK(st.rejected_total[static_cast<size_t>(DecodeError::Json)] == 1);
  CHECK(st.rejected_total[static_cast<size_t>(DecodeError::UnknownTier)] == 1);
  CHECK(st.messages_total == 7);
  CHECK(st.applied_total[2][static_cast<size_t>(ApplyResult::Applied)] == 5);  // 5 cleared events
  CHECK(st.applied_total[0][static_cast<size_t>(ApplyResult::Applied)] == 0);
}

TEST_CASE("blocks a worker's removals take out of its cache count as its evictions; blocks moved to its host tier do not") {
  EventsConfig cfg;
  RadixIndexer index;
  SteadyClock& clock = SteadyClock::instance();
  WorkerRegistry registry{clock};
  EventPipeline pipeline(cfg, 16, index, registry, clock);
  pipeline.start_writer();
  pipeline.on_heartbeat_message(
      R"({"worker_id":3,"url":"http://127.0.0.1:9","load":{"request_active_slots":0,"request_total_slots":8,)"
      R"("num_requests_waiting":0,"kv_active_blocks":0,"kv_total_blocks":1000}})");
  auto event = [&](uint64_t id, std::string_view tier, std::string_view data) {
    pipeline.on_kv_message(fmt::format(R"({{"worker_id":3,{}"event":{{"event_id":{},"data":{}}}}})",
                                       tier.empty() ? "" : fmt::format(R"("storage_tier":"{}",)", tier), id, data));
  };
  // A chain of 4 on the device; its last 2 blocks offloaded to the host
  // (announced before the device lets them go, as write-through offloading does).
  event(1, "", R"({"stored":{"blocks":[{"block_hash":1,"tokens_hash":11},{"block_hash":2,"tokens_hash":12},)"
               R"({"block_hash":3,"tokens_hash":13},{"block_hash":4,"tokens_hash":14}]}})");
  event(2, "host_pinned", R"({"stored":{"parent_hash":2,"blocks":[{"block_hash":3,"tokens_hash":13},)"
                          R"({"block_hash":4,"tokens_hash":14}]}})");
  event(3, "", R"({"removed":{"block_hashes":[4,3,2,1,99]}})");  // 1, 2 gone; 3, 4 stay on the host; 99 unknown
  event(4, "host_pinned", R"({"removed":{"block_hashes":[4]}})");  // now gone
  pipeline.drain();
  REQUIRE(registry.size() == 1);
  // 3 blocks left the worker; the clock runs, so they have faded a little (30 s time constant).
  const double evicted = registry.all().at(0).evicted_blocks;
  CHECK(evicted <= 3);
  CHECK(evicted > 2.9);
  const auto m = index.find_matches(std::vector<LocalBlockHash>{LocalBlockHash{11}});
  CHECK(m.owners.empty());
  CHECK(index.stats().entries == 1);  // block 3, on the host
}

TEST_CASE("heartbeats register workers; bad heartbeats are counted") {
  Harness h;
  h.pipeline->on_heartbeat_message(
      R"({"worker_id":4,"url":"http://127.0.0.1:9","model":"m","block_size":16,"load":{"kv_total_blocks":10}})");
  h.pipeline->on_heartbeat_message(R"({"worker_id":5,"url":"http://127.0.0.1:9","block_size":32})");
  h.pipeline->on_heartbeat_message(R"({"worker_id":"x"})");
  CHECK(h.registry.candidates("m").size() == 1);
  CHECK(h.registry.candidates("m")[0].info->load.kv_total_blocks == 10);
  CHECK(h.pipeline->stats().heartbeats_total == 2);
  CHECK(h.pipeline->stats().heartbeats_rejected_total == 1);
  CHECK(h.pipeline->stats().block_size_mismatch_total == 1);
}

TEST_CASE("a worker that stops heartbeating leaves registry and index within the ttl") {
  Harness h(200);
  h.pipeline->on_heartbeat_message(R"({"worker_id":8,"url":"http://127.0.0.1:9"})");
  const auto start = std::chrono::steady_clock::now();
  bool gone = false;
  while (std::chrono::steady_clock::now() - start < 2s) {
    {
      std::lock_guard lk(h.index.mu);
      gone = !h.index.removed_workers.empty();
    }
    if (gone) break;
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(gone);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 200ms);
  CHECK(took < 2s);  // ttl + one expiry tick (250 ms) + generous slack for a loaded machine
  CHECK(h.index.removed_workers[0] == WorkerId{8});
  CHECK(h.registry.size() == 0);
}

TEST_CASE("KV events never keep a worker alive: a silent heartbeat-only worker expires while publishing") {
  Harness h(200);
  h.pipeline->on_heartbeat_message(R"({"worker_id":9,"url":"http://127.0.0.1:9"})");
  const auto start = std::chrono::steady_clock::now();
  bool gone = false;
  uint64_t id = 1;
  while (!gone && std::chrono::steady_clock::now() - start < 3s) {
    h.pipeline->on_kv_message(fmt::format(
        R"({{"worker_id":9,"event":{{"event_id":{},"data":{{"stored":{{"blocks":[{{"block_hash":{},"tokens_hash":{}}}]}}}}}}}})",
        id, id, id));
    ++id;
    std::this_thread::sleep_for(20ms);
    std::lock_guard lk(h.index.mu);
    gone = !h.index.removed_workers.empty();
  }
  CHECK(gone);
  CHECK(h.registry.size() == 0);
}

TEST_CASE("a full queue drops messages and counts them instead of blocking") {
  EventsConfig cfg;
  cfg.queue_capacity = 16;
  cfg.queue_worker_share = 1.0;
  testing::RecordingIndexer index;
  WorkerRegistry registry(SteadyClock::instance());
  EventPipeline p(cfg, 16, index, registry, SteadyClock::instance());  // writer not started
  p.on_heartbeat_message(R"({"worker_id":1,"url":"http://127.0.0.1:9"})");
  for (int i = 0; i < 20; ++i) p.on_kv_message(R"({"worker_id":1,"event":{"data":"cleared"}})");
  CHECK(p.stats().queue_dropped_total == 4);
  CHECK(p.stats().events_queued_total == 16);
}

TEST_CASE("a worker that fills its share of the queue loses its own messages, never another worker's") {
  EventsConfig cfg;
  cfg.queue_capacity = 16;
  cfg.queue_worker_share = 0.25;  // 4 messages each
  testing::RecordingIndexer index;
  WorkerRegistry registry(SteadyClock::instance());
  EventPipeline p(cfg, 16, index, registry, SteadyClock::instance());  // writer not started
  p.on_heartbeat_message(R"({"worker_id":1,"url":"http://127.0.0.1:9"})");
  p.on_heartbeat_message(R"({"worker_id":2,"url":"http://127.0.0.1:9"})");
  for (int i = 0; i < 10; ++i) p.on_kv_message(R"({"worker_id":1,"event":{"data":"cleared"}})");
  for (int i = 0; i < 4; ++i) p.on_kv_message(R"({"worker_id":2,"event":{"data":"cleared"}})");
  CHECK(p.stats().queue_worker_dropped_total == 6);
  CHECK(p.stats().queue_dropped_total == 6);
  CHECK(p.stats().events_queued_total == 8);
}

TEST_CASE("the writer serves workers round-robin: a backlog delays another worker by one message") {
  EventsConfig cfg;
  cfg.queue_worker_share = 1.0;
  testing::RecordingIndexer index;
  WorkerRegistry registry(SteadyClock::instance());
  EventPipeline p(cfg, 16, index, registry, SteadyClock::instance());
  p.on_heartbeat_message(R"({"worker_id":1,"url":"http://127.0.0.1:9"})");
  p.on_heartbeat_message(R"({"worker_id":2,"url":"http://127.0.0.1:9"})");
  // Queued before the writer starts: worker 1's backlog first, then worker 2.
  for (int i = 0; i < 4; ++i) p.on_kv_message(R"({"worker_id":1,"event":{"data":"cleared"}})");
  for (int i = 0; i < 2; ++i) p.on_kv_message(R"({"worker_id":2,"event":{"data":"cleared"}})");
  p.start_writer();
  p.drain();
  std::lock_guard lk(index.mu);
  std::vector<uint64_t> order;
  for (const auto& e : index.applied) order.push_back(e.owner.worker.value);
  CHECK(order == std::vector<uint64_t>{1, 2, 1, 2, 1, 1});
  p.stop();
}

// ---- resync, bounded queue, instances ----

TEST_CASE("events of workers the router does not know are dropped and counted, never indexed") {
  Harness h;
  h.pipeline->on_heartbeat_message(R"({"worker_id":3,"url":"http://127.0.0.1:9"})");
  h.pipeline->on_kv_message(
      R"({"events":[{"worker_id":3,"event":{"event_id":1,"data":"cleared"}},)"
      R"({"worker_id":66,"event":{"event_id":1,"data":"cleared"}},{"worker_id":66,"event":{"event_id":2,"data":"cleared"}}]})");
  h.pipeline->on_kv_message(R"({"worker_id":67,"event":{"event_id":1,"data":"cleared"}})");
  h.pipeline->drain();
  std::lock_guard lk(h.index.mu);
  REQUIRE(h.index.applied.size() == 1);
  CHECK(h.index.applied[0].owner.worker == WorkerId{3});
  CHECK(h.pipeline->stats().unknown_worker_events_total == 3);
  CHECK(h.pipeline->index_age(WorkerId{3}).has_value());
  CHECK_FALSE(h.pipeline->index_age(WorkerId{66}).has_value());
}

TEST_CASE("heartbeat rejections are counted by reason") {
  Harness h;
  h.pipeline->on_heartbeat_message("{");
  h.pipeline->on_heartbeat_message(R"({"url":"http://x:1"})");
  h.pipeline->on_heartbeat_message(R"({"worker_id":"x","url":"http://x:1"})");
  h.pipeline->on_heartbeat_message(R"({"worker_id":1,"url":""})");
  const auto& r = h.pipeline->stats().heartbeats_rejected_by_reason;
  CHECK(r[static_cast<size_t>(DecodeError::Json)] == 1);
  CHECK(r[static_cast<size_t>(DecodeError::MissingField)] == 1);
  CHECK(r[static_cast<size_t>(DecodeError::WrongType)] == 1);
  CHECK(r[EventPipelineStats::kHeartbeatMissingUrl] == 1);
  CHECK(EventPipelineStats::heartbeat_reason(EventPipelineStats::kHeartbeatMissingUrl) == "missing_url");
  CHECK(h.pipeline->stats().heartbeats_rejected_total == 4);
}

TEST_CASE("the ingest queue is bounded by bytes, not only by message count") {
  EventsConfig cfg;
  cfg.queue_capacity = 1000000;
  cfg.queue_capacity_bytes = 1 << 20;
  testing::RecordingIndexer index;
  WorkerRegistry registry(SteadyClock::instance());
  EventPipeline p(cfg, 16, index, registry, SteadyClock::instance());  // writer not started
  p.on_heartbeat_message(R"({"worker_id":1,"url":"http://127.0.0.1:9"})");
  // One message of 5,000 stored blocks is ~100 KB decoded: at most ~10 fit in 1 MiB.
  std::string msg = R"({"worker_id":1,"event":{"data":{"stored":{"blocks":[)";
  for (int i = 0; i < 5000; ++i) msg += (i ? "," : "") + std::string(R"({"block_hash":1,"tokens_hash":2})");
  msg += "]}}}}";
  for (int i = 0; i < 40; ++i) p.on_kv_message(msg);
  const auto& st = p.stats();
  CHECK(st.queue_dropped_total > 25);
  CHECK(st.queue_dropped_total < 40);
  CHECK(st.queued_bytes <= cfg.queue_capacity_bytes);
  CHECK(st.queue_dropped_bytes_total == st.queue_dropped_total * msg.size());
}
