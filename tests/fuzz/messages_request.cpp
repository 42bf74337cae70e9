// Fuzz target: parse_messages_request (router/api/messages_request.h), the body
// of a client's POST /v1/messages (Anthropic's Messages API).
// Contract checked on every input:
//   - an error is a 400 with a message, and anthropic_error_body() of it is valid
//     JSON in Anthropic's shape ({"type":"error","error":{"type":
//     "invalid_request_error","message"}});
//   - a success is a chat request with at least one message, no cache_salt (vLLM's
//     Messages request has none) and max_tokens set, whose `body` views the chat
//     body it built; that chat body is valid JSON with the request's model and as
//     many messages as the request, within 8x the client's body + 256 bytes;
//   - parsing into a ParsedRequest and chat body reused across inputs gives the
//     same result as fresh ones.
#include <simdjson.h>

#include <string>

#include "common/json_numbers.h"
#include "router/api/messages_request.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

bool same(const ParsedRequest& a, const ParsedRequest& b) {
  if (a.kind != b.kind || a.model != b.model || a.stream != b.stream || a.user != b.user ||
      a.max_tokens != b.max_tokens || a.messages.size() != b.messages.size())
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

// The time in a tool_use id vLLM makes up ("call_<unix time>") may move between
// the two parses of one input.
std::string without_made_up_ids(std::string s) {
  for (size_t at = s.find("\"call_"); at != std::string::npos; at = s.find("\"call_", at + 1)) {
    size_t end = at + 6;
    while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
    s.erase(at + 6, end - at - 6);
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  static thread_local ParsedRequest reused;
  static thread_local std::string reused_chat;
  static thread_local simdjson::dom::parser json;
  std::string copy;
  ApiError err;
  if (!parse_messages_request(body, reused, reused_chat, err)) {
    FUZZ_CHECK(err.status == 400 && !err.message.empty());
    simdjson::dom::element e = parse_json(json, anthropic_error_body(err), copy);
    FUZZ_CHECK(e["type"].get_string().value_unsafe() == "error");
    FUZZ_CHECK(e["error"]["type"].get_string().value_unsafe() == "invalid_request_error");
    FUZZ_CHECK(e["error"]["message"].is_string());
    return 0;
  }
  FUZZ_CHECK(reused.kind == ApiKind::ChatCompletions && !reused.messages.empty());
  FUZZ_CHECK(reused.cache_salt.empty() && reused.max_tokens.has_value() && *reused.max_tokens > 0);
  FUZZ_CHECK(reused.body.data() == reused_chat.data() && reused.body.size() == reused_chat.size());
  FUZZ_CHECK(reused_chat.size() <= 8 * body.size() + 256);
  simdjson::dom::element chat = parse_json(json, reused_chat, copy);
  FUZZ_CHECK(chat["model"].is_string() && chat["model"].get_string().value_unsafe() == reused.model);
  FUZZ_CHECK(chat["messages"].is_array() && chat["messages"].get_array().value_unsafe().size() == reused.messages.size());
  ParsedRequest fresh;
  std::string fresh_chat;
  ApiError err2;
  FUZZ_CHECK(parse_messages_request(body, fresh, fresh_chat, err2));
  FUZZ_CHECK(without_made_up_ids(fresh_chat) == without_made_up_ids(reused_chat) && same(fresh, reused));
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  return {
      R"({"model":"claude","max_tokens":100,"system":"Be terse.","messages":[{"role":"user","content":"hi"}],"stream":true,"metadata":{"user_id":"u"}})",
      R"({"model":"m","max_tokens":1,"system":[{"type":"text","text":"x-anthropic-billing-header: 1"},{"type":"text","text":"S"}],)"
      R"("messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}}]},)"
      R"({"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"redacted_thinking","data":"d"},{"type":"tool_use","id":"t1","name":"f","input":{"n":1e400}},)"
      R"({"type":"tool_result","content":[{"type":"text","text":"x","n":1.5}]}]},)"
      R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"r"},{"type":"image","source":{"type":"url","url":"u"}},{"type":"tool_reference","tool_name":"g"}]},{"type":"text","text":"go"}]},)"
      R"({"role":"system","content":"late"},{"role":"ctx","content":"c"}],)"
      R"("tools":[{"name":"f","description":"d","input_schema":{"properties":{}},"defer_loading":true}],"tool_choice":{"type":"tool","name":"f"},)"
      R"("stop_sequences":["\n"],"temperature":0.5,"top_k":3,"chat_template_kwargs":{"enable_thinking":false}})",
      R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t"}]},{"role":"assistant","content":[{"type":"tool_use"}]}]})",
  };
}
