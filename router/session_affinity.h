// Session affinity: a conversation (the `x-session-id` request header, else
// the OpenAI `user` field) stays on the worker it was last sent to while that
// worker is eligible and not overloaded: its predicted time to first token
// (scheduler/ttft_model.h, computed for every eligible worker under either
// scheduler.cost) is at most 1.5x the scheduler's choice plus 50 ms.
// A request without a session is routed as before; one with a session is
// decided with every eligible worker scored (RoutingService::route's
// score_all, not the fast path), so the session's worker is found wherever
// it ranks. Config:
// scheduler.session_affinity, off by default: in kvroute-sim on agentic
// sessions with the shipped defaults (gamma 0.5, pending_prefill_weight 0.2) the
// scheduler already keeps sessions on their cache, and affinity at rate x1
// raises TTFT p99 7.0 -> 10.7 s; it lowers p50 only where the fleet is over
// capacity (docs/sim/affinity.txt, docs/sim/README.md "Session affinity").
//
// Threading: thread-safe (one mutex; apply() is O(1) plus a scan of the
// candidates, called from every io thread). At most `max_sessions` sessions
// are remembered, least recently used dropped first.
#pragma once

#include <cstddef>
#include <mutex>
#include <string_view>

#include "router/bounded_lru.h"
#include "router/routing.h"

namespace kvroute {

class SessionAffinity {
 public:
  static constexpr double kOverloadFactor = 1.5;  // sticky predicted TTFT <= factor x chosen + slack
  static constexpr double kOverloadSlackMs = 50;

  explicit SessionAffinity(size_t max_sessions = 65536) : sessions_(max_sessions) {}

  // Puts the session's worker first in `r` (ranked and decision.chosen) when
  // the rule above holds, then remembers the worker `r` now goes to. No-op
  // for an empty session or a failed route. Returns true if it overrode the
  // scheduler's choice.
  bool apply(std::string_view session, uint32_t block_size, RouteResult& r);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  BoundedLru<WorkerId> sessions_;  // session -> the worker it last went to
};

}  // namespace kvroute
