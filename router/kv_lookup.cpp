#include "router/kv_lookup.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>

#include "common/json_escape.h"

namespace kvroute {

namespace {

namespace dom = simdjson::dom;

// LMCache's shape: {"tokens": [ids], "model"?: str, "cache_salt"?: str}.
bool parse_token_lookup(dom::object o, std::string_view body, ParsedRequest& out, ApiError& err) {
  out.reset();
  out.kind = ApiKind::Completions;
  out.body = body;
  if (auto model = o.at_key("model"); !model.error() && !model.value_unsafe().is_null()) {
    if (!model.value_unsafe().is_string()) return invalid_request(err, "'model' must be a string", "model");
    out.model.assign(model.value_unsafe().get_string().value_unsafe());
  }
  if (auto salt = o.at_key("cache_salt"); !salt.error() && !salt.value_unsafe().is_null()) {
    if (!salt.value_unsafe().is_string() || salt.value_unsafe().get_string().value_unsafe().empty())
      return invalid_request(err, "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt");
    out.cache_salt.assign(salt.value_unsafe().get_string().value_unsafe());
  }
  dom::element tokens = o.at_key("tokens").value_unsafe();
  if (!tokens.is_array()) return invalid_request(err, "'tokens' must be an array of token ids", "tokens");
  dom::array ids = tokens.get_array().value_unsafe();
  if (ids.size() > kMaxLookupTokens)
    return invalid_request(err, fmt::format("'tokens' holds more than {} token ids", kMaxLookupTokens), "tokens");
  out.prompt_tokens.reserve(ids.size());
  for (dom::element id : ids) {
    uint64_t v = 0;
    if (!id.is_uint64() || (v = id.get_uint64().value_unsafe()) > UINT32_MAX)
      return invalid_request(err, "'tokens' must hold token ids (integers from 0 to 4294967295)", "tokens");
    out.prompt_tokens.push_back(static_cast<TokenId>(v));
  }
  out.has_prompt_tokens = true;
  return true;
}

}  // namespace

bool parse_kv_lookup(std::string_view body, ParsedRequest& out, size_t& max_workers, ApiError& err) {
  thread_local dom::parser parser;
  auto doc = parser.parse(body.data(), body.size(), true);
  if (doc.error())
    return invalid_request(
        err, fmt::format("We could not parse the JSON body of your request ({}).", simdjson::error_message(doc.error())),
        "");
  if (!doc.value_unsafe().is_object()) return invalid_request(err, "The request body must be a JSON object.", "");
  dom::object o = doc.value_unsafe().get_object().value_unsafe();
  max_workers = kMaxLookupHolders;
  if (auto m = o.at_key("max_workers"); !m.error() && !m.value_unsafe().is_null()) {
    const dom::element v = m.value_unsafe();
    if (!v.is_uint64() || v.get_uint64().value_unsafe() < 1 || v.get_uint64().value_unsafe() > kMaxLookupHolders)
      return invalid_request(err, fmt::format("'max_workers' must be an integer from 1 to {}", kMaxLookupHolders),
                             "max_workers");
    max_workers = v.get_uint64().value_unsafe();
  }
  const bool has_tokens = !o.at_key("tokens").error();
  const bool has_prompt = !o.at_key("prompt").error();
  const bool has_messages = !o.at_key("messages").error();
  if (has_tokens + has_prompt + has_messages != 1)
    return invalid_request(err, "Give exactly one of 'tokens', 'prompt' or 'messages'.", "");
  if (has_tokens) return parse_token_lookup(o, body, out, err);
  return parse_openai_request(has_messages ? ApiKind::ChatCompletions : ApiKind::Completions, body, out, err);
}

namespace {

// The request's blocks, hashed as the data plane hashes them, and the
// answer's head; false when nothing can match (no complete block, or the
// engine will not read its cache: prompt_logprobs).
bool begin_lookup(const KvLookupSources& src, const ParsedRequest& request, uint32_t block_size,
                  RouteResult& scratch, KvLookupResult& out) {
  scratch.reset();
  out.holders_total = 0;
  out.model = request.model;
  out.block_size = block_size;
  if (!std::equal(out.pool_names.begin(), out.pool_names.end(), src.pool_names.begin(), src.pool_names.end()))
    out.pool_names.assign(src.pool_names.begin(), src.pool_names.end());
  out.prompt_tokens = src.routing.hash_request(request, block_size, scratch, nullptr);
  out.complete_blocks = static_cast<uint32_t>(scratch.block_hashes.size());
  out.token_source = scratch.token_source;
  out.tokenizer_fallback = scratch.tokenizer_fallback;
  out.holders.clear();
  out.keep.clear();
  return !scratch.skips_prefix_cache && !scratch.block_hashes.empty();
}

}  // namespace

void kv_lookup(const KvLookupSources& src, const ParsedRequest& request, uint32_t block_size, size_t max_holders,
               RouteResult& scratch, KvLookupResult& out) {
  if (!begin_lookup(src, request, block_size, scratch, out)) return;
  thread_local MatchLayers match;
  src.index.find_match_layers(scratch.block_hashes, match);
  out.holders_total =
      static_cast<uint32_t>(src.registry.holders(request.model, match, max_holders, out.holders, out.keep));
  match.clear();  // drops the index's sets
}

void kv_lookup_reference(const KvLookupSources& src, const ParsedRequest& request, uint32_t block_size,
                         size_t max_holders, RouteResult& scratch, KvLookupResult& out) {
  if (!begin_lookup(src, request, block_size, scratch, out)) return;
  const OverlapScores scores = src.index.find_matches(scratch.block_hashes);
  thread_local std::vector<WorkerRegistry::CacheHolder> holders;
  src.registry.holders(request.model, scores.owners, holders, out.keep);
  out.holders_total = static_cast<uint32_t>(holders.size());
  // The longest first (ties by worker id, then rank), sorted as 24-byte
  // keys, not as holders (each moves a shared_ptr); a full sort when most
  // are kept (partial_sort's heap was 3x slower at 1,024).
  struct Key {
    uint32_t blocks;
    uint32_t rank;
    uint64_t worker;
    uint32_t at;
    bool operator<(const Key& o) const {
      if (blocks != o.blocks) return blocks > o.blocks;
      if (worker != o.worker) return worker < o.worker;
      return rank < o.rank;
    }
  };
  thread_local std::vector<Key> order;
  order.resize(holders.size());
  for (size_t i = 0; i < holders.size(); ++i) {
    const OwnerOverlap& o = holders[i].overlap;
    order[i] = Key{o.blocks, o.owner.dp_rank, o.owner.worker.value, static_cast<uint32_t>(i)};
  }
  const size_t keep = std::min(holders.size(), max_holders);
  if (keep < order.size() / 2) {
    std::nth_element(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep), order.end());
    std::sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep));
  } else {
    std::sort(order.begin(), order.end());
  }
  out.holders.resize(keep);
  for (size_t i = 0; i < keep; ++i) out.holders[i] = holders[order[i].at];
}

namespace {

// The shared pool part of the prefix loads from (a worker mounts one at
// most); -1: none.
int pool_of(const WorkerRegistry::CacheHolder& h) {
  for (int p = kMaxPools - 1; p >= 0; --p)
    if (h.overlap.by_tier[kNumBaseTiers + p] > 0) return p;
  return -1;
}

// The slowest tier the matched prefix touches: what loading it waits on
// (LMCache's `location` names one backend per instance). A shared pool is
// named by its pool's name.
std::string_view location(const KvLookupResult& r, const WorkerRegistry::CacheHolder& h) {
  if (const int pool = pool_of(h); pool >= 0)
    return static_cast<size_t>(pool) < r.pool_names.size() ? std::string_view(r.pool_names[pool])
                                                           : std::string_view("pool");
  for (int t = kNumBaseTiers - 1; t > 0; --t)
    if (h.overlap.by_tier[t] > 0) return to_string(static_cast<StorageTier>(t));
  return to_string(StorageTier::Device);
}

}  // namespace

std::string kv_lookup_json(const KvLookupResult& r) {
  // Written piece by piece (no format string parsed per holder: it was most
  // of the answer's cost at 1,024 holders).
  fmt::memory_buffer out;
  out.reserve(256 + r.holders.size() * 240);
  const auto put = [&out](std::string_view s) { out.append(s.data(), s.data() + s.size()); };
  const auto num = [&out](uint64_t v) {
    const fmt::format_int f(v);
    out.append(f.data(), f.data() + f.size());
  };
  thread_local std::string escaped;
  escaped.clear();
  json_escape_append(escaped, r.model);
  fmt::format_to(std::back_inserter(out),
                 R"({{"model":"{}","prompt_tokens":{},"block_size":{},"complete_blocks":{},"token_source":"{}","tokenizer_fallback":"{}","workers_total":{},"layout_info":{{)",
                 escaped, r.prompt_tokens, r.block_size, r.complete_blocks, to_string(r.token_source),
                 to_string(r.tokenizer_fallback), r.holders_total);
  for (size_t i = 0; i < r.holders.size(); ++i) {
    const WorkerRegistry::CacheHolder& h = r.holders[i];
    // One key per cache: "7" for rank 0, "7:1" for a data-parallel rank.
    put(i ? ",\"" : "\"");
    num(h.overlap.owner.worker.value);
    if (h.overlap.owner.dp_rank != 0) {
      put(":");
      num(h.overlap.owner.dp_rank);
    }
    put("\":[\"");
    put(location(r, h));
    put("\",");
    num(uint64_t{h.overlap.blocks} * r.block_size);
    put("]");
  }
  put(R"(},"workers":[)");
  for (size_t i = 0; i < r.holders.size(); ++i) {
    const WorkerRegistry::CacheHolder& h = r.holders[i];
    put(i ? R"(,{"worker_id":)" : R"({"worker_id":)");
    num(h.overlap.owner.worker.value);
    put(R"(,"dp_rank":)");
    // A worker of several ranks whose prefix is all in its pool: any rank loads it.
    if (h.info->dp_size > 1 && pool_blocks(h.overlap.by_tier) >= h.overlap.blocks && h.overlap.blocks > 0)
      put("null");
    else
      num(h.overlap.owner.dp_rank);
    put(R"(,"url":")");
    escaped.clear();
    json_escape_append(escaped, h.info->url);
    put(escaped);
    put(R"(","matched_tokens":)");
    num(uint64_t{h.overlap.blocks} * r.block_size);
    put(R"(,"tiers":{)");
    for (int t = 0; t < kNumBaseTiers; ++t) {
      put(t ? ",\"" : "\"");
      put(to_string(static_cast<StorageTier>(t)));
      put("\":");
      num(uint64_t{h.overlap.by_tier[t]} * r.block_size);
    }
    // A shared pool's tokens in one key; the pool named beside.
    put(R"(,"pool":)");
    num(uint64_t{pool_blocks(h.overlap.by_tier)} * r.block_size);
    put("}");
    if (pool_of(h) >= 0) {
      escaped.clear();
      json_escape_append(escaped, location(r, h));
      put(R"(,"pool":")");
      put(escaped);
      put("\"");
    }
    put(R"(,"health":")");
    put(to_string(h.health));
    put(R"(","draining":)");
    put(h.draining ? "true" : "false");
    put(R"(,"approximate":)");
    put(h.info->approximate ? "true}" : "false}");
  }
  put("]}");
  return fmt::to_string(out);
}

}  // namespace kvroute
