// A worker's load in the five figures every engine reports and the scheduler
// prices: request slots, queue, KV blocks. One struct for every place a load
// travels: the NATS heartbeat (events/wire.h), a /metrics scrape
// (fleet/engine_metrics.h), the registry's reported and predicted load
// (fleet/worker_registry.h), the cost function (scheduler/scheduler.h) and the
// simulated engine (mocker/engine.h). A total of 0 means the worker does not
// report that dimension. Plain value, thread-compatible.
#pragma once

#include <cstdint>

namespace kvroute {

struct WorkerLoad {
  uint32_t request_active_slots = 0;  // requests running
  uint32_t request_total_slots = 0;   // requests the engine runs at once (vLLM max_num_seqs)
  uint32_t num_requests_waiting = 0;  // requests queued in the engine
  uint64_t kv_active_blocks = 0;      // KV blocks in use by running requests
  uint64_t kv_total_blocks = 0;       // KV blocks the engine holds
};

}  // namespace kvroute
