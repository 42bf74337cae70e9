// OpenAI Responses API (`POST /v1/responses`) request bodies (untrusted input)
// -> the chat request kvroute routes, with the prompt the engine will render.
// Pure; thread-safe (per-thread parsers).
//
// vLLM serves this API by turning the body into chat messages and rendering
// them with the model's chat template, as its chat endpoint does; this parser
// does the same conversion (vllm/entrypoints/openai/responses/serving.py
// `_make_request` at commit 0001948bc769, responses/utils.py
// `construct_input_messages` and `construct_tool_dicts` at 01ca842df5b1,
// responses/protocol.py at 010a69cea9ac, tool_parsers/utils.py
// `iter_response_function_tool_dicts` at 0064cc9cb1ae) and writes the result as
// an OpenAI chat completions body, so tokenization (local template or the
// engine's /tokenize) and prefix-aware routing work unchanged on it.
// The full list of what is accepted and refused: router/README.md
// "Responses and Messages".
#pragma once

#include <string>
#include <string_view>

#include "router/openai_request.h"

namespace kvroute {

// Parses a /v1/responses body. On success `out` is a ChatCompletions request
// whose `body` views `chat_body`: an OpenAI chat body (model, messages, tools,
// add_generation_prompt, continue_final_message, chat_template_kwargs) holding
// the client's values byte for byte where they pass through. `chat_body` must
// outlive every use of `out.body` (the caller keeps one per connection, like its
// ParsedRequest). On failure returns false and fills `err` (400, OpenAI's
// fields: `error_body(err)` is the answer); `out` is then unspecified.
bool parse_responses_request(std::string_view body, ParsedRequest& out, std::string& chat_body, ApiError& err);

}  // namespace kvroute
