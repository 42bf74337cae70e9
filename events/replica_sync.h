// Replicas share in-flight load and parked KV. Each kvroute replica publishes,
// on `{prefix}.replicas.inflight`, what it has in flight on each worker (the
// running sum of its requests' lifecycle: routed +1 request, +blocks,
// +prefill tokens; first byte -prefill; finished -request, -blocks) and
// the KV it has parked there (scheduler.parked_kv_seconds: its answered
// prompts, faded; the receiver fades it on from there), batched:
// within a millisecond of a change (WorkerRegistry::inflight_generation), at
// most one message per `interval`, plus a keep-alive every ttl/3. Each replica adds the other replicas' latest
// snapshots to its registry's predicted load (WorkerRegistry::
// set_remote_inflight); a replica silent for `ttl` stops counting.
//
// Against Dynamo's replica sync (ai-dynamo/dynamo lib/kv-router/src/
// protocols.rs `ActiveSequenceEvent`: one NATS message per request event,
// AddRequest carrying the request's whole block-hash sequence, then
// MarkPrefillCompleted and Free; later versions batch them as
// `ActiveSequenceEventBatch`), this sends state, not events: one message per
// interval of O(workers with in-flight work) numbers whatever the request
// rate and prompt length, and a lost message heals with the next one.
// (Dynamo also shares predicted cache blocks; here each replica's index is
// built from the workers' own events, so only load needs sharing.)
//
// Threads: "kvroute-replica" (publishes, expires silent replicas); the libnats
// dispatcher of the subscription (decodes, updates the registry). Public
// functions are thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/types.h"
#include "events/nats_bus.h"
#include "events/wire.h"
#include "fleet/worker_registry.h"

namespace kvroute {

// The wire format (ReplicaSnapshot, encode/decode_replica_snapshot) is in events/wire.h.

struct ReplicaSyncStats {
  std::atomic<uint64_t> published_total{0};
  std::atomic<uint64_t> received_total{0};
  std::atomic<uint64_t> rejected_total{0};
  std::atomic<uint64_t> replicas_expired_total{0};
  std::atomic<uint64_t> peers{0};  // gauge: replicas currently counted
};

class ReplicaSync {
 public:
  ReplicaSync(NatsBus& bus, WorkerRegistry& registry, const Clock& clock, std::string subject_prefix,
              std::chrono::milliseconds interval, std::chrono::milliseconds ttl);
  ~ReplicaSync();
  bool start(std::string* error);
  void stop();

  // Entry point of the subscription; public so tests can feed bytes.
  void on_message(std::string_view data);
  // One publishing / expiry round (the thread calls it every interval).
  void tick();

  const ReplicaSyncStats& stats() const { return stats_; }

 private:
  std::vector<ReplicaInflight> local_snapshot() const;
  void apply_sums(const std::vector<WorkerId>& touched);  // mu_ held

  NatsBus& bus_;
  WorkerRegistry& registry_;
  const Clock& clock_;
  const std::string subject_;
  const std::chrono::milliseconds interval_, ttl_;
  const uint64_t replica_;
  ReplicaSyncStats stats_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  struct Peer {
    TimePoint last_seen{};
    Nanos ttl{};
    std::unordered_map<WorkerId, ReplicaInflight> workers;
  };
  std::map<uint64_t, Peer> peers_;  // guarded by mu_; at most kMaxPeers
  // Replicas counted at once: far above any deployment's, a bound on what the bus may claim.
  static constexpr size_t kMaxPeers = 1024;
  // Publisher state (replica thread only).
  std::vector<ReplicaInflight> last_sent_;
  TimePoint last_publish_{};
  uint64_t seq_ = 0;
  std::thread thread_;
  // The NATS subscription outlives this object (the bus has no unsubscribe):
  // its handler reaches us only through this, cleared by stop() while no
  // handler runs.
  struct HandlerGate {
    std::mutex mu;
    ReplicaSync* self = nullptr;
  };
  std::shared_ptr<HandlerGate> gate_ = std::make_shared<HandlerGate>();
};

}  // namespace kvroute
