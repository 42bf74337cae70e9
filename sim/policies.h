// kvroute-sim's peer policies: each follows one router's published source, as
// cited below, on the same inputs kvroute gets (the production index's
// overlaps and the registry's loads). Every policy breaks ties at random.
//
//   dynamo      ai-dynamo/dynamo lib/kv-router/src/scheduling/selector/default.rs
//               (worker_logit) with the defaults of lib/kv-router/src/scheduling/config.rs
//               and docs/design_docs/router_design.md:
//                 logit = overlap_score_weight(1.0) × potential prefill blocks
//                       + potential active (decode) blocks,  lowest wins, temperature 0
//               potential prefill blocks = (in-flight prefill tokens the router tracks
//                 on the worker + this request's tokens − overlap credit × block) / block,
//                 overlap credit = device hits + 0.75 × host hits + 0.25 × disk hits
//                 (router_track_prefill_tokens, default on)
//               potential active blocks = the distinct blocks of the worker's active
//                 sequences as the router tracks them (ActiveSequences: added at
//                 dispatch, freed at completion) plus this request's blocks not among them.
//   llmd        llm-d/llm-d-inference-scheduler's default scheduling profile
//               (prefix-cache-scorer 3, kv-cache-utilization-scorer 2, queue-scorer 2,
//               max-score-picker; guides' EndpointPickerConfig), scorers as in
//               kubernetes-sigs/gateway-api-inference-extension
//               pkg/epp/scheduling/framework/plugins/scorer/{queue,kvcache_utilization}.go
//               and .../multi/prefix/plugin.go:
//                 prefix = matched blocks / request blocks (precise: from KV events)
//                 kv     = 1 − KV usage (scraped metrics)
//                 queue  = (max waiting − waiting) / (max − min waiting), 1 when all equal
//               highest weighted sum wins.
//   least_loaded  fewest active + waiting requests (predicted load).
//
// Threading: plain functions; DynamoActive is owned by one simulation.
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "router/routing.h"

namespace kvroute::sim {

// Dynamo's ActiveSequences per worker: distinct prompt blocks of the requests
// the router has dispatched and not yet seen complete.
class DynamoActive {
 public:
  explicit DynamoActive(uint32_t workers) : blocks_(workers), partial_(workers, 0) {}
  void add(uint32_t w, const std::vector<LocalBlockHash>& full, bool partial);
  void remove(uint32_t w, const std::vector<LocalBlockHash>& full, bool partial);
  // Active blocks if this request were added to worker w.
  double potential(uint32_t w, const std::vector<LocalBlockHash>& full, bool partial) const;

 private:
  std::vector<std::unordered_map<uint64_t, uint32_t>> blocks_;
  std::vector<uint64_t> partial_;  // private partial last blocks
};

// Each returns an index into route.candidates (== worker order).
size_t pick_dynamo(const RouteResult& route, const DynamoActive& active, const std::vector<LocalBlockHash>& full,
                   bool partial, uint32_t isl_tokens, uint32_t block_size, std::mt19937_64& rng);
size_t pick_llmd(const RouteResult& route, size_t request_blocks, std::mt19937_64& rng);
size_t pick_least_loaded(const std::vector<WorkerView>& views, std::mt19937_64& rng);

}  // namespace kvroute::sim
