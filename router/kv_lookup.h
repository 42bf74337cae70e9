// The KV location API (POST /v1/kv/lookup on the admin listener): for a
// prompt, which workers hold how much of its prefix, and in which storage
// tier, as kvroute's index knows it. For systems outside kvroute that place
// work by cache (autoscalers, batch schedulers, cache managers). Modelled on
// LMCache's controller `lookup(tokens) -> {instance_id: (location,
// matched_prefix_length)}` (LMCache docs, "Lookup the KV cache";
// lmcache/v1/cache_controller), whose answer it contains as `layout_info`.
//
// No routing decision is taken and nothing is counted as any worker's load:
// the request is tokenized and hashed as the data plane would (its model's
// tokenizer or the engine's, its LoRA adapter and cache_salt), looked up in
// the index once, and the holders are described.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"
#include "fleet/worker_registry.h"
#include "indexer/indexer.h"
#include "router/openai_request.h"
#include "router/routing.h"

namespace kvroute {

// Token ids in one lookup body at most (LMCache's shape, `tokens`).
inline constexpr size_t kMaxLookupTokens = 1 << 20;

// The holders one answer lists at most unless the body's `max_workers` says
// otherwise (1 to this): every worker of the largest fleet kvroute routes.
inline constexpr size_t kMaxLookupHolders = 1 << 16;

// A lookup body: an OpenAI completion (`prompt`: text or token ids) or chat
// (`messages`) body with its `model`, or LMCache's shape `{"tokens": [ids]}`
// (then `model` is optional: without it every worker is looked at). Both
// take vLLM's `cache_salt`; the model names a LoRA adapter as in requests.
// False and `err` (status 400) for a malformed body.
// `max_workers` (optional, 1 to kMaxLookupHolders) bounds the answer to the
// longest matches: what a caller asking per request wants from a fleet whose
// system prompt every worker holds.
bool parse_kv_lookup(std::string_view body, ParsedRequest& out, size_t& max_workers, ApiError& err);

struct KvLookupResult {
  std::string model;
  uint32_t prompt_tokens = 0;
  uint32_t block_size = 0;
  uint32_t complete_blocks = 0;  // blocks looked up (a trailing partial block is never cached)
  TokenSource token_source = TokenSource::Client;
  TokenizerFallback tokenizer_fallback = TokenizerFallback::None;
  uint32_t holders_total = 0;  // every holder, before max_holders kept the first
  // Longest match first, then by worker id and rank; overlaps in blocks
  // (the JSON says tokens: blocks x block_size; pool tiers name the pool).
  std::vector<WorkerRegistry::CacheHolder> holders;
  std::vector<std::string> pool_names;  // KvLookupSources::pool_names, for the JSON
  WorkerRegistry::Keep keep;            // the holders' announcements
};

// What one lookup reads: the data plane's tokenizers and hashing, the index,
// the worker table. Every part must outlive the calls.
struct KvLookupSources {
  const RoutingService& routing;
  const Indexer& index;
  const WorkerRegistry& registry;
  // The shared pools' names (indexer.kv_pools), by pool; empty: no pools.
  std::span<const std::string> pool_names = {};
};

// Looks `request` up, keeping the `max_holders` longest matches (ties by
// worker id, then rank). `scratch` keeps its vectors' capacity between calls.
// The index's answer as shared owner sets (find_match_layers) and the worker
// table's sets of holders kept per set (WorkerRegistry::holders): listing k
// holders costs O(k), whatever number of workers share the prefix.
void kv_lookup(const KvLookupSources& src, const ParsedRequest& request, uint32_t block_size, size_t max_holders,
               RouteResult& scratch, KvLookupResult& out);
// The same answer the simple way: every owner from find_matches, a table
// lookup each, one sort. The reference tests and bench_kv_lookup compare
// kv_lookup with.
void kv_lookup_reference(const KvLookupSources& src, const ParsedRequest& request, uint32_t block_size,
                         size_t max_holders, RouteResult& scratch, KvLookupResult& out);

// The answer's JSON (router/README.md, "KV location API").
std::string kv_lookup_json(const KvLookupResult& r);

}  // namespace kvroute
