#include "router/routing.h"

#include <fmt/format.h>

#include <unordered_map>

#include "indexer/block_hash.h"
#include "tokenizer/placeholder.h"

namespace kvroute {

std::vector<TokenId> RoutingService::tokens_of(const ParsedRequest& r) {
  if (r.has_prompt_tokens) return r.prompt_tokens;
  if (r.kind == ApiKind::ChatCompletions) return placeholder_tokenize(placeholder_chat_prompt(r.messages));
  return placeholder_tokenize(r.prompt_text);
}

RouteResult RoutingService::route(const ParsedRequest& request) const {
  RouteResult out;
  const auto cfg = config_.get();
  const uint32_t block_size = cfg->indexer.block_size;

  auto workers = registry_.candidates(request.model);
  if (workers.empty()) {
    if (!registry_.candidates("").empty()) {
      out.error = ApiError{404, fmt::format("The model `{}` does not exist.", request.model),
                           "invalid_request_error", "model", "model_not_found"};
    } else {
      out.error = ApiError{503, "No worker is available to serve this request.", "service_unavailable", "",
                           "no_worker"};
    }
    return out;
  }

  const auto tokens = tokens_of(request);
  out.isl_tokens = static_cast<uint32_t>(tokens.size());
  out.request_blocks = (tokens.size() + block_size - 1) / block_size;
  const auto hashes = hash_blocks(tokens, block_size);
  const auto scores = index_.find_matches(hashes);

  // A worker with several dp ranks is scored by its best rank's overlap.
  std::unordered_map<WorkerId, const OwnerOverlap*> best;
  for (const auto& o : scores.owners) {
    auto& b = best[o.owner.worker];
    if (!b || o.blocks > b->blocks) b = &o;
  }
  out.candidates.reserve(workers.size());
  for (const auto& w : workers) {
    Candidate c;
    c.owner.worker = w.info.id;
    c.load = w.predicted;
    if (auto it = best.find(w.info.id); it != best.end()) {
      c.owner.dp_rank = it->second->owner.dp_rank;
      c.overlap_blocks = it->second->blocks;
    }
    out.candidates.push_back(c);
  }

  out.decision = schedule(out.candidates, out.isl_tokens, block_size, cfg->scheduler, random_);
  if (!out.decision.chosen) {
    out.error = ApiError{503, "Every worker is at capacity; retry later.", "service_unavailable", "",
                         "workers_busy"};
    return out;
  }
  for (size_t i : out.decision.ranking) {
    const auto& c = out.candidates[i];
    out.ranked.push_back(RouteTarget{
        c.owner.worker, workers[i].info.url,
        static_cast<uint32_t>(std::min<uint64_t>(uint64_t{c.overlap_blocks} * block_size, tokens.size()))});
  }
  out.ok = true;
  return out;
}

}  // namespace kvroute
