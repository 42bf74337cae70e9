// Route explain: one routing decision as JSON, with every number of the cost
// function and a `reason` sentence in plain words for the choice and for each
// worker (why it was chosen, ranked lower, or excluded), ties, softmax
// sampling and the alpha in force. Used by the admin API (POST
// /admin/route/explain), the status page's latest decisions and tests.
//
// Pure functions of their arguments: thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "router/routing.h"

namespace kvroute {

// The plain-words part of an explain.
struct ExplainText {
  std::string choice;                   // the decision as a whole (choice, ties, sampling, alpha)
  std::vector<std::string> per_worker;  // parallel to RouteResult::candidates
};

// `cfg` must be the scheduler configuration the decision was made with.
ExplainText explain_text(const RouteResult& r, const SchedulerConfig& cfg, uint32_t block_size);

// JSON of one routing decision. `workers` are ordered by rank (1 = chosen,
// then the failover order), then the workers that were not ranked (excluded).
// `text`, if given, is explain_text() of the same arguments (not computed again).
std::string explain_json(const RouteResult& r, std::string_view model, uint32_t block_size,
                         const SchedulerConfig& cfg, const ExplainText* text = nullptr);

// The disaggregated decision (scheduler/pd_decision.h) for an explained
// request, as the JSON object explain shows under "pd"; empty when no
// candidate has role prefill or decode (an aggregated fleet). `r` must rank
// every candidate (rank_all). `single_consumer`: n == 1 and one prompt.
std::string pd_explain_json(const RouteResult& r, uint32_t block_size, bool single_consumer,
                            const SchedulerConfig& sched, const PdConfig& pd);

}  // namespace kvroute
