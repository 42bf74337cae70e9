// previous_response_id affinity for the Responses API. vLLM keeps the
// responses it stored (`store`, with VLLM_ENABLE_RESPONSES_API_STORE=1) in the
// memory of the one API server that produced them, and answers a request
// whose `previous_response_id` it does not hold with 404 ("Response with id
// '...' not found."; vllm/entrypoints/openai/responses/serving.py
// `create_responses`, `_make_not_found_error`). So a request continuing a
// response must go to the worker that produced it: kvroute remembers, for
// each response a worker answered, the response's id (the `id` of a
// non-streamed answer, the `response.id` of a stream's `response.created`
// event; ResponseIdScanner, response_id.h) and the worker, and puts that worker first for a
// request naming the id (ResponseAffinity::pin).
//
// Bounded: at most `max_ids` ids (router.response_affinity_max_ids, 65,536 by
// default; set_max_ids() applies a reloaded value), least recently used
// dropped first; an id longer than kMaxIdBytes is not remembered. A dropped
// id, or one whose worker has left the model's candidates, is routed as any
// request (and the worker it reaches answers 404 unless it holds the id).
//
// Threading: thread-safe (one mutex, O(1) per call plus a scan of the
// candidates).
#pragma once

#include <cstddef>
#include <mutex>
#include <optional>
#include <string_view>

#include "router/api/response_id.h"
#include "router/bounded_lru.h"
#include "router/routing.h"

namespace kvroute {

class ResponseAffinity {
 public:
  static constexpr size_t kMaxIdBytes = ResponseIdScanner::kMaxIdBytes;

  explicit ResponseAffinity(size_t max_ids = 65536) : ids_(max_ids) {}

  // What pin() did: the id's worker put first, an id not remembered, or a
  // remembered worker that is no longer a candidate for the model.
  enum class Pin : uint8_t { Pinned, Unknown, WorkerGone };

  // The worker that answered response `id`, if remembered (a use: it
  // becomes the most recently used).
  std::optional<WorkerId> find(std::string_view id);
  // Remembers that `worker` answered response `id` (ignored: empty or over
  // kMaxIdBytes).
  void remember(std::string_view id, WorkerId worker);
  // Puts `worker` first in `r` (ranked and decision.chosen) if it is one of
  // r's candidates, busy or not: only it holds the response. `r` must have
  // been decided with every candidate scored (RoutingService::route's
  // score_all). No-op for a failed route.
  static Pin pin(WorkerId worker, uint32_t block_size, RouteResult& r);
  size_t size() const;
  // A new bound (a smaller one drops the least recently used ids at once).
  void set_max_ids(size_t max_ids);

 private:
  mutable std::mutex mu_;
  BoundedLru<WorkerId> ids_;
};

std::string_view to_string(ResponseAffinity::Pin p);

}  // namespace kvroute
