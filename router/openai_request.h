// Parsing and validation of OpenAI request bodies (untrusted input) into what
// routing needs, and OpenAI-shaped error bodies. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"
#include "tokenizer/placeholder.h"
#include "tokenizer/request_tokens.h"

namespace kvroute {

// The APIs kvroute proxies. Embeddings are tokenized and routed as
// completions are (ParsedRequest::kind is Completions for them): their `input`
// is parsed like a completion prompt. The others name a route only (a parsed
// request's kind is one of the first three): Responses and Messages are parsed
// into a ChatCompletions request (router/api/), the passthrough routes
// (Rerank ... CountTokens) are routed by model and load alone
// (router/api/api_routes.h).
enum class ApiKind : uint8_t {
  Completions,
  ChatCompletions,
  Embeddings,
  Responses,    // POST /v1/responses (OpenAI Responses API)
  Messages,     // POST /v1/messages (Anthropic Messages API)
  Rerank,       // POST /v1/rerank
  Score,        // POST /v1/score
  Tokenize,     // POST /tokenize
  Detokenize,   // POST /detokenize
  CountTokens,  // POST /v1/messages/count_tokens (Anthropic)
};

// A request error as the client sees it: HTTP status and OpenAI error fields.
struct ApiError {
  unsigned status = 400;
  std::string message;
  std::string_view type = "invalid_request_error";  // always a string literal
  std::string param;  // empty = null
  std::string code;   // empty = null
};

// Sets `err` to a 400 invalid_request_error with this message and param
// (empty: null). Returns false, for `return invalid_request(...)`.
bool invalid_request(ApiError& err, std::string message, std::string param);

struct ParsedRequest {
  ApiKind kind = ApiKind::Completions;
  std::string model;
  bool stream = false;
  // Exactly one of these is set by the parser: token ids given by the client,
  // or the text the tokenizer must turn into tokens.
  std::vector<TokenId> prompt_tokens;
  bool has_prompt_tokens = false;
  std::string prompt_text;               // completions text prompt
  std::vector<ChatMessage> messages;     // chat: content parts flattened, null -> ""
  // The raw body (a view of the caller's buffer; valid while the caller keeps
  // it): a model's chat template renders the request from it.
  std::string_view body;
  // vLLM's `add_special_tokens`; unset = its default (true for completions,
  // false for chat, whose template already holds the special tokens).
  std::optional<bool> add_special_tokens;
  // Choices asked per prompt (`n`, default 1) and prompts in the request (a
  // batched completion or embedding: an array of strings or of token arrays).
  // The request is routed on its first prompt; the whole batch goes to that
  // worker (router/README.md, "Batches and n").
  uint32_t n = 1;
  uint32_t prompts = 1;
  // vLLM's `cache_salt` (per-tenant cache isolation); empty = none.
  std::string cache_salt;
  // vLLM's `prompt_logprobs` was asked for: the engine does not read its
  // prefix cache for this request (vllm/v1/request.py
  // get_skip_reading_prefix_cache()), so nothing of it is cached for it.
  bool prompt_logprobs = false;
  // The OpenAI `user` field (end-user id): a session key for session affinity.
  // The Responses parser puts `prompt_cache_key` here when given (else `user`),
  // the Messages parser `metadata.user_id`.
  std::string user;
  // Set by the Responses and Messages parsers (router/api/); the OpenAI parser
  // reads `priority` and the output limit. vLLM's `priority` (lower is served
  // earlier; unset = 0), the output token limit (`max_output_tokens`,
  // `max_tokens`, chat's `max_completion_tokens`; unset = up to the context), and the
  // Responses `previous_response_id`: a reference to a response the engine
  // stored (kvroute keeps no response store; router/README.md "Responses and
  // Messages").
  std::optional<int64_t> priority;
  // Not parsed: set by flow control (router/http/flow_gate.h) from the
  // request's band (flow.bands reserve_pct): the fraction of each worker's
  // slots and KV blocks kept for higher bands, which routing leaves free.
  double band_reserve = 0;
  std::optional<uint64_t> max_tokens;
  std::string previous_response_id;
  // Not parsed: set by the HTTP layer before routing when the model has no
  // local tokenizer and tokenizer.remote is auto (router/engine_tokenizer.h).
  // `engine_tokens` are what the engine's POST /tokenize answered for this
  // request (has_engine_tokens); `engine_failed` says the engine was asked
  // (or skipped in backoff) and gave nothing, so the placeholder is used.
  std::vector<TokenId> engine_tokens;
  bool has_engine_tokens = false;
  bool engine_failed = false;

  // Back to a default-constructed request, keeping the strings' and vectors'
  // capacity (the server reuses one per connection).
  // The fields tokenize_request() reads (tokenizer/request_tokens.h), as
  // views valid while this request is unchanged.
  RequestPrompt prompt() const {
    RequestPrompt p;
    p.completions = kind == ApiKind::Completions;
    p.chat = kind == ApiKind::ChatCompletions;
    p.has_prompt_tokens = has_prompt_tokens;
    p.prompt_tokens = prompt_tokens;
    p.prompt_text = prompt_text;
    p.messages = &messages;
    p.body = body;
    p.add_special_tokens = add_special_tokens;
    p.has_engine_tokens = has_engine_tokens;
    p.engine_tokens = engine_tokens;
    p.engine_failed = engine_failed;
    return p;
  }

  void reset() {
    kind = ApiKind::Completions;
    model.clear();
    stream = false;
    prompt_tokens.clear();
    has_prompt_tokens = false;
    prompt_text.clear();
    messages.clear();
    body = {};
    add_special_tokens.reset();
    n = 1;
    prompts = 1;
    cache_salt.clear();
    prompt_logprobs = false;
    user.clear();
    priority.reset();
    band_reserve = 0;
    max_tokens.reset();
    previous_response_id.clear();
    engine_tokens.clear();
    has_engine_tokens = false;
    engine_failed = false;
  }
};

// Parses a /v1/completions, /v1/chat/completions or /v1/embeddings body.
// Returns false and fills `err` (status 400) when the body is malformed or
// lacks a field.
bool parse_openai_request(ApiKind kind, std::string_view body, ParsedRequest& out, ApiError& err);
// Bytes of document the calling thread's JSON parser is sized for now; back
// under 1 MiB after each request that needed more.
size_t json_parser_capacity();

// {"error":{"message":...,"type":...,"param":...,"code":...}}
std::string error_body(const ApiError& e);

}  // namespace kvroute
