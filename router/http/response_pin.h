// One exchange's part in previous_response_id affinity (the Responses API;
// router/api/response_affinity.h): before routing, the worker that produced
// the response the request continues; after routing, that worker put first;
// while relaying a 200 answer, its response id read and remembered with the
// worker that answered. Every other route leaves it idle.
//
// Threading: one exchange's, on its io thread; the store is thread-safe.
#pragma once

#include <optional>
#include <string_view>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "router/api/response_affinity.h"
#include "router/http/wire.h"
#include "router/openai_request.h"
#include "router/router_metrics.h"

namespace kvroute {

struct ResponsePin {
  // A Responses request: its previous_response_id's worker, if remembered.
  // `max_ids`: router.response_affinity_max_ids in force (a reload applies).
  void lookup(ResponseAffinity& store, ApiKind kind, const ParsedRequest& parsed, size_t max_ids) {
    if (kind != ApiKind::Responses) return;
    store.set_max_ids(max_ids);
    store_ = &store;
    previous_ = parsed.previous_response_id;
    model_ = parsed.model;
    if (!previous_.empty()) worker_ = store.find(previous_);
  }
  // The remembered worker must be found wherever it ranks: every candidate is scored.
  bool needs_all_scored() const { return worker_.has_value(); }

  // After the decision: the remembered worker first, if it is still a
  // candidate; counted by result (kvroute_router_previous_response_total).
  void apply(uint32_t block_size, RouteResult& route, RouterMetrics* m) {
    if (!store_ || previous_.empty()) return;
    const auto pin = worker_ ? ResponseAffinity::pin(*worker_, block_size, route) : ResponseAffinity::Pin::Unknown;
    if (m) m->previous_response_total.with({to_string(pin)}).inc();
    if (pin != ResponseAffinity::Pin::WorkerGone) return;
    static RateLimiter rl;
    if (rl.allow())
      spdlog::warn("previous_response_id '{}': worker {}, which produced it, is no longer a candidate for model "
                   "'{}'; routed as a new request (a worker without the response answers 404)",
                   previous_.substr(0, 64), worker_->value, model_);
  }

  // A piece of the answer `worker` gives (the whole body of a small one):
  // the response id of a 200 answer, once found, is remembered.
  void answered(const UpstreamResponse& response, WorkerId worker, std::string_view bytes) {
    if (!store_ || response.status != 200) return;
    if (!scanner_) scanner_.emplace(response.event_stream);
    if (!scanner_->wants_more()) return;
    scanner_->feed(bytes);
    if (scanner_->id()) store_->remember(*scanner_->id(), worker);
  }

 private:
  ResponseAffinity* store_ = nullptr;
  std::string_view previous_, model_;  // view the connection's ParsedRequest
  std::optional<WorkerId> worker_;
  std::optional<ResponseIdScanner> scanner_;
};

}  // namespace kvroute
