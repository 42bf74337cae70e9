// A request's token ids, as the router routes it and the simulated engine
// serves it: the one function both call, so both sides agree on every id
// (router/routing.h RoutingService::tokenize_request, mocker/server.cpp).
//
// Order: the client's own ids; else the model's tokenizer (a completion's
// text, or the chat template's rendering of the messages); else the engine's
// ids (its POST /tokenize answer, when the router asked for them); else the
// placeholder (one token per 4 bytes), with the reason.
//
// Pure; thread-safe (the chat placeholder's scratch string is per thread).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"
#include "tokenizer/model_tokenizer.h"
#include "tokenizer/placeholder.h"

namespace kvroute {

// Where a request's token ids came from (explain, metrics, status page).
enum class TokenSource : uint8_t {
  Client,       ///< the client sent token ids
  Local,        ///< the model's tokenizer in kvroute (tokenizer.models; a LoRA adapter: its base model's)
  Engine,       ///< the engine's own POST /tokenize (tokenizer.remote)
  Placeholder,  ///< the placeholder tokenizer: cache overlap is approximate (RouteResult::tokenizer_fallback says why)
};
// "client", "local", "engine", "placeholder".
std::string_view to_string(TokenSource s);

// What a request gives its tokenizer: views of its parsed fields (the caller
// keeps them alive; router/openai_request.h ParsedRequest::prompt()).
struct RequestPrompt {
  bool completions = false;  // /v1/completions: the model's tokenizer encodes prompt_text
  bool chat = false;         // /v1/chat/completions: the template renders body, the placeholder messages
                             // (neither, /v1/embeddings: the template if any, else the text placeholder)
  bool has_prompt_tokens = false;              // the client sent token ids:
  std::span<const TokenId> prompt_tokens;      //   these
  std::string_view prompt_text;                // completions text prompt
  const std::vector<ChatMessage>* messages = nullptr;  // chat: the messages (placeholder)
  std::string_view body;                       // chat: the raw body (the template reads it)
  std::optional<bool> add_special_tokens;      // vLLM's; unset = its default per endpoint
  bool has_engine_tokens = false;              // the engine's POST /tokenize answered:
  std::span<const TokenId> engine_tokens;      //   these
  bool engine_failed = false;                  // the engine was asked and failed
};

// The request's ids: the client's or the engine's in place, else computed
// into `buffer` (its capacity reused). Valid while the request's fields and
// `buffer` are. `local` is the model's tokenizer (may be null). *source says
// which was used; *fallback why the placeholder was (None otherwise);
// *detail (may be null) the template's error.
std::span<const TokenId> tokenize_request(const RequestPrompt& request, std::vector<TokenId>& buffer,
                                          const ModelTokenizer* local, TokenSource* source,
                                          TokenizerFallback* fallback, std::string* detail);

}  // namespace kvroute
