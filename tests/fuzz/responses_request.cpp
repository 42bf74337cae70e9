// Fuzz target: parse_responses_request (router/api/responses_request.h), the body
// of a client's POST /v1/responses.
// Contract checked on every input:
//   - an error is a 400 with a message, and error_body() of it is valid JSON in
//     OpenAI's shape ({"error":{"message","type","param","code"}});
//   - a success is a chat request with at least one message whose `body` views
//     the chat body it built; that chat body is valid JSON (out-of-range numbers
//     pass through as Python reads them) with the request's model and as many
//     messages as the request, within 8x the client's body + 256 bytes;
//   - parsing into a ParsedRequest and chat body reused across inputs (as a
//     connection reuses them) gives the same result as fresh ones.
#include <simdjson.h>

#include <string>

#include "common/json_numbers.h"
#include "router/api/responses_request.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

bool same(const ParsedRequest& a, const ParsedRequest& b) {
  if (a.kind != b.kind || a.model != b.model || a.stream != b.stream || a.cache_salt != b.cache_salt ||
      a.user != b.user || a.priority != b.priority || a.max_tokens != b.max_tokens ||
      a.previous_response_id != b.previous_response_id || a.messages.size() != b.messages.size() ||
      a.has_prompt_tokens != b.has_prompt_tokens || !a.prompt_text.empty() || !b.prompt_text.empty())
    return false;
  for (size_t i = 0; i < a.messages.size(); ++i)
    if (a.messages[i].role != b.messages[i].role || a.messages[i].content != b.messages[i].content) return false;
  return true;
}

simdjson::dom::element parse_json(simdjson::dom::parser& json, std::string_view text, std::string& copy) {
  auto doc = json.parse(text);
  if (doc.error() == simdjson::NUMBER_ERROR && replace_out_of_range_numbers(text, &copy)) doc = json.parse(copy);
  FUZZ_CHECK(!doc.error());
  return doc.value_unsafe();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  static thread_local ParsedRequest reused;
  static thread_local std::string reused_chat;
  static thread_local simdjson::dom::parser json;
  std::string copy;
  ApiError err;
  if (!parse_responses_request(body, reused, reused_chat, err)) {
    FUZZ_CHECK(err.status == 400 && !err.message.empty());
    simdjson::dom::element e = parse_json(json, error_body(err), copy);
    FUZZ_CHECK(e["error"]["message"].is_string() && e["error"]["type"].is_string());
    FUZZ_CHECK(!e["error"]["param"].error() && !e["error"]["code"].error());
    return 0;
  }
  FUZZ_CHECK(reused.kind == ApiKind::ChatCompletions && !reused.messages.empty());
  FUZZ_CHECK(reused.body.data() == reused_chat.data() && reused.body.size() == reused_chat.size());
  FUZZ_CHECK(reused_chat.size() <= 8 * body.size() + 256);
  simdjson::dom::element chat = parse_json(json, reused_chat, copy);
  FUZZ_CHECK(chat["model"].is_string() && chat["model"].get_string().value_unsafe() == reused.model);
  FUZZ_CHECK(chat["messages"].is_array() && chat["messages"].get_array().value_unsafe().size() == reused.messages.size());
  ParsedRequest fresh;
  std::string fresh_chat;
  ApiError err2;
  FUZZ_CHECK(parse_responses_request(body, fresh, fresh_chat, err2));
  FUZZ_CHECK(fresh_chat == reused_chat && same(fresh, reused));
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  return {
      R"({"model":"m","input":"hello","instructions":"Be terse.","stream":true,"max_output_tokens":16})",
      R"({"model":"m","input":[{"role":"user","content":"q"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"}]}],"user":"u","prompt_cache_key":"k"})",
      R"({"model":"m","input":[{"role":"developer","content":"d"},{"type":"reasoning","id":"r","summary":[{"type":"summary_text","text":"s"}],"content":[{"type":"reasoning_text","text":"t"}]},)"
      R"({"type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"o","annotations":[]}]},)"
      R"({"type":"function_call","call_id":"c1","name":"f","namespace":"ns","arguments":"{\"a\":1e400}"},)"
      R"({"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"42"}]}],"priority":-2,"cache_salt":"s"})",
      R"({"model":"m","input":[{"role":"user","content":"q"},{"type":"message","role":"assistant","status":"incomplete","content":[{"type":"output_text","text":"par"}]}],)"
      R"("tools":[{"type":"function","name":"f","description":"d","parameters":{"type":"object","properties":{"x":{"maximum":18446744073709551616}}},"strict":true,"x":1},{"type":"web_search"}],)"
      R"("reasoning":{"effort":"high"},"previous_response_id":"resp_1"})",
  };
}
