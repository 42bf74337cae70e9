#include "router/api/api_routes.h"

#include <fmt/format.h>
#include <simdjson.h>

#include "common/json_escape.h"
#include "router/api/messages_request.h"
#include "router/api/responses_request.h"

namespace kvroute {

namespace {

struct Route {
  std::string_view path;
  ApiKind kind;
  std::string_view label;
};

constexpr Route kRoutes[] = {
    {"/v1/chat/completions", ApiKind::ChatCompletions, "chat_completions"},
    {"/v1/completions", ApiKind::Completions, "completions"},
    {"/v1/embeddings", ApiKind::Embeddings, "embeddings"},
    {"/v1/responses", ApiKind::Responses, "responses"},
    {"/v1/messages", ApiKind::Messages, "messages"},
    {"/v1/rerank", ApiKind::Rerank, "rerank"},
    {"/v1/score", ApiKind::Score, "score"},
    {"/tokenize", ApiKind::Tokenize, "tokenize"},
    {"/detokenize", ApiKind::Detokenize, "detokenize"},
    {"/v1/messages/count_tokens", ApiKind::CountTokens, "count_tokens"},
};

const Route& route_of(ApiKind kind) {
  for (const Route& r : kRoutes)
    if (r.kind == kind) return r;
  return kRoutes[1];
}

// A passthrough body: a JSON object with a string `model` (kvroute routes by
// it; vLLM's /tokenize and /detokenize default it to the served model, but
// which workers serve it is what kvroute needs to know). Routed with no
// prompt: given as zero client tokens, so no tokenizer runs and the
// scheduler sees no overlap and no prefill.
bool parse_passthrough(std::string_view body, ParsedRequest& out, ApiError& err) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::dom::object o;
  if (parser.parse(body.data(), body.size(), true).get(doc) || doc.get_object().get(o))
    return invalid_request(err, "The request body must be a JSON object.", "");
  std::string_view model;
  auto m = o.at_key("model");
  if (m.error() || m.value_unsafe().get_string().get(model) || model.empty())
    return invalid_request(err, "'model' is required (a non-empty string): kvroute routes this request by it.",
                           "model");
  out.kind = ApiKind::Completions;
  out.model.assign(model);
  out.has_prompt_tokens = true;  // none: routed by load alone
  out.max_tokens = 0;            // nothing generated: answered after one pass, if any
  out.body = body;
  return true;
}

}  // namespace

std::optional<ApiKind> api_of_path(std::string_view path) {
  for (const Route& r : kRoutes)
    if (r.path == path) return r.kind;
  return std::nullopt;
}

std::string_view api_path(ApiKind kind) { return route_of(kind).path; }
std::string_view api_label(ApiKind kind) { return route_of(kind).label; }

bool is_passthrough(ApiKind kind) {
  switch (kind) {
    case ApiKind::Rerank:
    case ApiKind::Score:
    case ApiKind::Tokenize:
    case ApiKind::Detokenize:
    case ApiKind::CountTokens: return true;
    default: return false;
  }
}

bool anthropic_errors(ApiKind kind) { return kind == ApiKind::Messages || kind == ApiKind::CountTokens; }

bool parse_api_request(ApiKind kind, std::string_view body, ParsedRequest& out, std::string& chat_body,
                       ApiError& err) {
  if (kind == ApiKind::Responses) return parse_responses_request(body, out, chat_body, err);
  if (kind == ApiKind::Messages) return parse_messages_request(body, out, chat_body, err);
  if (is_passthrough(kind)) return parse_passthrough(body, out, err);
  return parse_openai_request(kind, body, out, err);
}

std::string api_error_body(ApiKind kind, const ApiError& e) {
  return anthropic_errors(kind) ? anthropic_error_body(e) : error_body(e);
}

std::string stream_error_event(ApiKind kind, const ApiError& e) {
  if (anthropic_errors(kind)) return fmt::format("event: error\ndata: {}\n\n", anthropic_error_body(e));
  if (kind == ApiKind::Responses) {
    // sequence_number: kvroute does not count the worker's events; 0 says so.
    const std::string code = e.code.empty() ? std::string("null") : "\"" + json_escape(e.code) + "\"";
    return fmt::format(
        "event: error\ndata: {{\"type\":\"error\",\"code\":{},\"message\":\"{}\",\"param\":null,"
        "\"sequence_number\":0}}\n\n",
        code, json_escape(e.message));
  }
  return fmt::format("data: {}\n\ndata: [DONE]\n\n", error_body(e));
}

}  // namespace kvroute
