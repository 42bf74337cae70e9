// The routes kvroute proxies, and what differs between their APIs: the path,
// the metric label, the body parser, the error shape (OpenAI's or
// Anthropic's) and the SSE event that ends a stream a worker failed in the
// middle of. Pure; thread-safe (per-thread parsers).
//
// Every route's body goes to the worker unchanged; what is parsed is only what
// routing reads. The passthrough routes (rerank, score, tokenize, detokenize,
// Anthropic's count_tokens) are routed by model and load alone: their body's
// `model` names the workers, and the request is counted as one with no prompt
// (no cache overlap, no prefill), so it goes to the least loaded of them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "router/openai_request.h"

namespace kvroute {

// The route of a path (the target without its query), or nullopt.
std::optional<ApiKind> api_of_path(std::string_view path);
std::string_view api_path(ApiKind kind);
// The `route` label of kvroute_router_requests_total and the `api` label of
// kvroute_router_request_duration_seconds.
std::string_view api_label(ApiKind kind);
// Routed by model and load only (no prompt): rerank, score, tokenize,
// detokenize, count_tokens.
bool is_passthrough(ApiKind kind);
// Errors kvroute makes on this route are Anthropic's shape (Messages, count_tokens).
bool anthropic_errors(ApiKind kind);

// Parses `body` for routing. `chat_body` holds the chat body a Responses or
// Messages request converts into (out.body views it: it must outlive `out`).
// On failure fills `err` (400) and returns false.
bool parse_api_request(ApiKind kind, std::string_view body, ParsedRequest& out, std::string& chat_body,
                       ApiError& err);

// The error body kvroute answers on this route: OpenAI's
// {"error":{"message","type","param","code"}}, or Anthropic's
// {"type":"error","error":{"type","message"}} (anthropic_error_body()).
std::string api_error_body(ApiKind kind, const ApiError& e);

// What ends an SSE stream that a worker failed in the middle of (or that
// the shutdown cut), in the route's own streaming protocol:
// - chat and completions: `data: {OpenAI error}` and `data: [DONE]`;
// - Responses: an `error` event, as OpenAI's Responses streaming defines it
//   ({"type":"error","code","message","param","sequence_number"});
// - Messages: an `error` event with Anthropic's error body, as Anthropic's
//   streaming defines it.
std::string stream_error_event(ApiKind kind, const ApiError& e);

}  // namespace kvroute
