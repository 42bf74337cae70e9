// Anthropic Messages API (`POST /v1/messages`) request bodies (untrusted input)
// -> the chat request kvroute routes, with the prompt the engine will render;
// and Anthropic's error body. Pure; thread-safe (per-thread parsers).
//
// vLLM serves this API by converting the body into an OpenAI chat request and
// serving that (vllm/entrypoints/anthropic/serving.py
// `_convert_anthropic_to_openai_request` at commit 0001948bc769; validation as
// anthropic/protocol.py at 00589e563e77); this parser does the same conversion
// and writes it as an OpenAI chat completions body, so tokenization and
// prefix-aware routing work unchanged on it. What is accepted and refused:
// router/README.md "Responses and Messages".
#pragma once

#include <string>
#include <string_view>

#include "router/openai_request.h"

namespace kvroute {

// Parses a /v1/messages body. On success `out` is a ChatCompletions request
// whose `body` views `chat_body` (an OpenAI chat body: model, messages, tools,
// chat_template_kwargs), which must outlive every use of `out.body`. On failure
// returns false and fills `err` (400; `anthropic_error_body(err)` is the
// answer); `out` is then unspecified.
bool parse_messages_request(std::string_view body, ParsedRequest& out, std::string& chat_body, ApiError& err);

// {"type":"error","error":{"type":...,"message":...}}: Anthropic's error shape,
// the type from the status (400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 503 and 529 overloaded_error, other
// 5xx api_error).
std::string anthropic_error_body(const ApiError& e);

}  // namespace kvroute
