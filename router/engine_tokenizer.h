// Tokenization by the engine itself (tokenizer.remote = auto): for a model
// without a local tokenizer, the HTTP layer asks one of the model's workers
// for the request's token ids with the engine's own POST /tokenize, before the
// routing decision. This file is the part without I/O: what to send, how to
// read the answer (untrusted: bounded), the cache of exact answers, and the
// per-model backoff after failures. The round trip itself is the HTTP
// server's (router/http/proxy.cpp: engine_tokens_cached(), engine_tokens();
// router/http/upstream.cpp: fetch_engine_tokens()).
//
// The wire shapes follow vLLM's `POST /tokenize`
// (vllm/entrypoints/serve/tokenize/protocol.py, TokenizeCompletionRequest /
// TokenizeChatRequest / TokenizeResponse; serving.py renders chat messages
// with the chat template and `add_generation_prompt` exactly as the chat
// endpoint does): completions send {"model", "prompt", "add_special_tokens"},
// chat sends {"model", "messages", ...the fields the template reads}, the
// answer is {"count", "max_model_len", "tokens": [ids]}. SGLang serves the same
// completion shape on /tokenize (python/sglang/srt/entrypoints/openai/
// serving_tokenize.py) but no chat messages: a chat request to it fails and
// that request uses the placeholder.
//
// Thread-safety: the free functions are pure; EngineTokenCache and
// EngineTokenizeBackoff are thread-safe (one mutex each, held for a lookup).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/types.h"
#include "router/openai_request.h"

namespace kvroute {

// The outcome of asking an engine for a request's tokens. One metric label each.
enum class EngineTokenizeResult : uint8_t {
  Ok,           ///< tokens received (or found in the cache)
  NoWorker,     ///< no healthy worker serves the model
  Backoff,      ///< not asked: the model's engine failed just before (EngineTokenizeBackoff)
  Connect,      ///< connecting or sending failed
  Timeout,      ///< no whole answer within tokenizer.remote_timeout_ms
  Rejected,     ///< the engine refused this request with a 4xx (its template's error, chat on SGLang, no /tokenize)
  Status,       ///< the engine answered with another status than 200 or a 4xx (a 5xx)
  BadResponse,  ///< the answer is not {"tokens": [ids], ...} (or its count disagrees)
  TooLarge,     ///< the answer is over tokenizer.remote_max_tokens (or its byte bound)
};
inline constexpr size_t kNumEngineTokenizeResults = 9;
// Metric label: "ok", "no_worker", "backoff", "connect", "timeout", "rejected",
// "status", "bad_response", "too_large".
std::string_view to_string(EngineTokenizeResult r);

// The /tokenize request body for `r` (a text completion or embedding prompt,
// or a chat request), into `out`. Chat copies the request's own JSON for
// `messages` and every field the template reads (`tools`,
// `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`,
// `add_special_tokens`, `chat_template`, `mm_processor_kwargs`) byte for byte,
// so the engine renders what its chat endpoint will. The model sent is the
// request's own (a LoRA adapter's name: vLLM accepts it and tokenizes with
// what serves that adapter). False when `r` has nothing to tokenize (client
// token ids) or its body cannot be read again.
bool engine_tokenize_body(const ParsedRequest& r, std::string& out);

// The answer's byte bound for `max_tokens` tokens (12 bytes per id and its
// separator, plus 4 KiB for the other fields).
inline uint64_t engine_tokenize_max_bytes(uint32_t max_tokens) { return uint64_t{max_tokens} * 12 + 4096; }

// Reads a /tokenize answer body into `out` (replaced). Ok, BadResponse (not
// an object with a `tokens` array of ids in [0, 2^32), or a `count` that
// disagrees) or TooLarge (more than `max_tokens` ids).
EngineTokenizeResult parse_engine_tokenize_response(std::string_view body, uint32_t max_tokens,
                                                    std::vector<TokenId>& out);

// Exact answers, keyed by the 128-bit XXH3 of the /tokenize body (which holds
// the model and everything the engine tokenizes), least recently used evicted
// first once the entries' bytes exceed the budget. Never a prefix: a longer
// prompt is a different key (BPE may merge across the cut; a chat template
// renders a different tail).
class EngineTokenCache {
 public:
  explicit EngineTokenCache(uint64_t budget_bytes) : budget_(budget_bytes) {}

  using Key = std::array<uint64_t, 2>;
  static Key key_of(std::string_view tokenize_body);
  // Copies the cached tokens into `out`; false on a miss.
  bool get(const Key& key, std::vector<TokenId>& out);
  // Stores a copy (an answer larger than an eighth of the budget is not kept).
  void put(const Key& key, const std::vector<TokenId>& tokens);

  uint64_t bytes() const;
  size_t size() const;

 private:
  static constexpr uint64_t kEntryOverhead = 96;  // list node, map node, key
  struct Entry {
    Key key;
    std::vector<TokenId> tokens;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return static_cast<size_t>(k[0] ^ (k[1] * 0x9e3779b97f4a7c15ull)); }
  };
  static uint64_t cost(const std::vector<TokenId>& t) { return t.size() * sizeof(TokenId) + kEntryOverhead; }

  const uint64_t budget_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> index_;
  uint64_t bytes_ = 0;
};

// After a failed /tokenize for a model and kind (chat or not), that model's
// requests of that kind skip the engine for a while: 100 ms, doubling per
// failure in a row up to 10 s; a success clears it. So an engine whose
// /tokenize hangs costs one timeout per backoff, not one per request. Only
// the engine's failures count (backs_off()): a request it refuses (4xx) or
// one too large is that request's, and must not degrade other clients.
// Bounded: at most kMaxKeys keys (all forgotten when full).
class EngineTokenizeBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kFirst = std::chrono::milliseconds(100);
  static constexpr auto kMax = std::chrono::milliseconds(10000);
  static constexpr size_t kMaxKeys = 4096;

  // True when the engine may be asked now.
  bool allow(std::string_view model, bool chat, Clock::time_point now) const;
  // True for the results that start or extend a backoff: Connect, Timeout,
  // Status, BadResponse.
  static bool backs_off(EngineTokenizeResult r);
  void on_failure(std::string_view model, bool chat, Clock::time_point now);
  void on_success(std::string_view model, bool chat);

 private:
  struct State {
    uint32_t failures = 0;
    Clock::time_point until{};
  };
  static std::string key(std::string_view model, bool chat);
  mutable std::mutex mu_;
  std::map<std::string, State, std::less<>> states_;
};

}  // namespace kvroute
