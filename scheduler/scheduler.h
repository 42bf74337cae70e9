// Worker selection: the cost function of ../shared/DESIGN.md ("Scheduling").
// Pure code with no I/O: "a router only decides which worker you should use;
// it doesn't send you there". Thread-safe (no shared state; randomness injected).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/types.h"
#include "config/config.h"

namespace kvroute {

// A worker's load as the scheduler sees it (reported, plus the router's own
// in-flight requests; see worker_registry.h).
struct WorkerLoad {
  uint32_t request_active_slots = 0;
  uint32_t request_total_slots = 0;
  uint32_t num_requests_waiting = 0;
  uint64_t kv_active_blocks = 0;
  uint64_t kv_total_blocks = 0;
};

struct Candidate {
  CacheOwner owner;
  WorkerLoad load;
  uint32_t overlap_blocks = 0;  // cached prefix length on this owner
};

// Why a candidate was not eligible. Maps one-to-one to a metric label.
enum class Exclusion : uint8_t {
  None,
  NoFreeSlot,   // request_active_slots >= request_total_slots
  NoFreeBlock,  // kv_active_blocks >= kv_total_blocks
};
std::string_view to_string(Exclusion e);

// Every term of one candidate's cost, for explain and metrics.
struct WorkerScore {
  Exclusion excluded = Exclusion::None;
  double load_ratio = 0;      // kv_active / kv_total
  double load_deviation = 0;  // load_ratio - mean
  double prefill_ratio = 0;   // new_tokens / isl_tokens
  double slot_ratio = 0;      // active / total slots
  double queue_ratio = 0;     // waiting / max waiting
  double cost = 0;
};

struct Decision {
  std::optional<size_t> chosen;   // index into the candidates; nullopt = nobody eligible
  std::vector<size_t> ranking;    // eligible candidates by cost, best first (ties shuffled)
  std::vector<WorkerScore> scores;  // parallel to candidates
  double alpha = 0;
  double load_mean = 0;
  double load_std = 0;
};

// Scores `candidates` for a request of `isl_tokens` prompt tokens.
// `block_size` converts overlap blocks to tokens.
Decision schedule(const std::vector<Candidate>& candidates, uint32_t isl_tokens, uint32_t block_size,
                  const SchedulerConfig& cfg, Random& random);

}  // namespace kvroute
