#include "router/api/messages_request.h"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>

using namespace kvroute;

namespace {

struct Parsed {
  ParsedRequest r;
  std::string chat;
  ApiError e;
  bool ok = false;
};

Parsed parse(std::string_view body) {
  Parsed p;
  p.ok = parse_messages_request(body, p.r, p.chat, p.e);
  return p;
}

// The refusal's message; anthropic_error_body() of it is Anthropic's shape.
std::string refused(std::string_view body) {
  Parsed p = parse(body);
  REQUIRE_FALSE(p.ok);
  CHECK(p.e.status == 400);
  simdjson::dom::parser json;
  simdjson::dom::element doc = json.parse(anthropic_error_body(p.e)).value();
  CHECK(doc["type"].get_string().value() == "error");
  CHECK(doc["error"]["type"].get_string().value() == "invalid_request_error");
  CHECK(doc["error"]["message"].get_string().value() == p.e.message);
  return p.e.message;
}

constexpr std::string_view kHead = R"({"model":"claude","max_tokens":100,)";

std::string with(std::string_view rest) { return std::string(kHead) + std::string(rest) + "}"; }

}  // namespace

TEST_CASE("messages: string system and content; fields routing reads") {
  Parsed p = parse(with(R"("system":"Be terse.","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},)"
                        R"({"role":"user","content":"more"}],"stream":true,"metadata":{"user_id":"u-1"},"stop_sequences":["\n"],)"
                        R"("temperature":0.5,"top_k":5,"cache_salt":"ignored-by-vllm")"));
  REQUIRE(p.ok);
  CHECK(p.r.kind == ApiKind::ChatCompletions);
  CHECK(p.r.model == "claude");
  CHECK(p.r.stream);
  CHECK(p.r.max_tokens == 100u);
  CHECK(p.r.user == "u-1");
  CHECK(p.r.cache_salt.empty());  // vLLM's Messages request has no cache_salt: the engine does not salt
  CHECK_FALSE(p.r.priority);
  REQUIRE(p.r.messages.size() == 4);
  CHECK(p.r.messages[0].role == "system");
  CHECK(p.r.body.data() == p.chat.data());
  CHECK(p.chat == R"({"model":"claude","messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"hi"},)"
                  R"({"role":"assistant","content":"yo"},{"role":"user","content":"more"}]})");
}

TEST_CASE("messages: system blocks and system messages join into one system message; the billing block is dropped") {
  Parsed p = parse(with(R"("system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"A"},)"
                        R"({"type":"text","text":""},{"type":"text","text":"B"}],"messages":[{"role":"user","content":"q"},)"
                        R"({"role":"system","content":[{"type":"text","text":"C"}]},{"role":"ctx","content":"r"}])"));
  REQUIRE(p.ok);
  CHECK(p.chat == R"({"model":"claude","messages":[{"role":"system","content":"ABC"},{"role":"user","content":"q"},)"
                  R"({"role":"user","content":"r"}]})");
  // Only a billing block: no system message at all; an empty system message is one.
  Parsed q = parse(with(R"("system":[{"type":"text","text":"x-anthropic-billing-header: 1"}],"messages":[{"role":"user","content":"q"}])"));
  REQUIRE(q.ok);
  CHECK(q.chat.find("system") == std::string::npos);
  Parsed s = parse(with(R"("messages":[{"role":"system","content":""},{"role":"user","content":"q"}])"));
  REQUIRE(s.ok);
  CHECK(s.chat.find(R"({"role":"system","content":""})") != std::string::npos);
}

TEST_CASE("messages: blocks -> text, images, reasoning, tool calls; tool results -> tool messages first") {
  Parsed p = parse(with(R"("messages":[{"role":"user","content":[{"type":"text","text":"look"},)"
                        R"({"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}}]},)"
                        R"({"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"redacted_thinking","data":"x"},)"
                        R"({"type":"text","text":"calling"},{"type":"tool_use","id":"t1","name":"f","input":{"n":1e400,"k":2.50}},{"type":"tool_use","id":"t2","name":"g","input":{}}]},)"
                        R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"r1"},{"type":"text","text":"r2"},)"
                        R"({"type":"image","source":{"type":"url","url":"http://i/x.png"}},{"type":"tool_reference","tool_name":"h"}]},)"
                        R"({"type":"tool_result","tool_use_id":"t2","content":"done"},{"type":"text","text":"go on"}]}])"));
  REQUIRE(p.ok);
  CHECK(p.chat ==
        R"({"model":"claude","messages":[)"
        R"({"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]},)"
        R"({"role":"assistant","content":"calling","reasoning":"hm","tool_calls":[)"
        R"({"id":"t1","type":"function","function":{"name":"f","arguments":{"n":1e400,"k":2.50}}},)"
        R"({"id":"t2","type":"function","function":{"name":"g","arguments":{}}}]},)"
        R"({"role":"tool","tool_call_id":"t1","content":"r1\nr2"},)"
        R"({"role":"user","content":[{"type":"image_url","image_url":{"url":"http://i/x.png"}}]},)"
        R"({"role":"tool","tool_call_id":"t1","content":[{"type":"tool_reference","name":"h"}]},)"
        R"({"role":"tool","tool_call_id":"t2","content":"done"},)"
        R"({"role":"user","content":"go on"}]})");
  REQUIRE(p.r.messages.size() == 7);
  CHECK(p.r.messages[0].content == "look");
  CHECK(p.r.messages[2].content == "r1\nr2");
}

TEST_CASE("messages: a user message of tool results only is not sent; an empty assistant one is") {
  Parsed p = parse(with(R"("messages":[{"role":"user","content":"q"},{"role":"assistant","content":[]},)"
                        R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"t"}]}])"));
  REQUIRE(p.ok);
  CHECK(p.chat == R"({"model":"claude","messages":[{"role":"user","content":"q"},{"role":"assistant"},)"
                  R"({"role":"tool","tool_call_id":"t","content":""}]})");
}

TEST_CASE("messages: a tool result inside an assistant message is text, its content as Python prints it") {
  Parsed p = parse(with(R"("messages":[{"role":"user","content":"q"},{"role":"assistant","content":[)"
                        R"({"type":"tool_result","content":[{"type":"text","text":"it's","n":1.0,"b":null,"t":true}]}]}])"));
  REQUIRE(p.ok);
  CHECK(p.chat.find(R"({"role":"assistant","content":"Tool result: [{'type': 'text', 'text': \"it's\", 'n': 1.0, 'b': None, 't': True}]"})") !=
        std::string::npos);
}

TEST_CASE("messages: tools as vLLM converts them; chat_template_kwargs passed on") {
  Parsed p = parse(with(R"("messages":[{"role":"user","content":"q"}],"tools":[{"name":"f","input_schema":{"properties":{"x":{"maximum":1e400}}}},)"
                        R"({"name":"g","description":"d","input_schema":{ },"defer_loading":true},{"name":"h","input_schema":{"type":"object"},"strict":true}],)"
                        R"("tool_choice":{"type":"tool","name":"f"},"chat_template_kwargs":{"enable_thinking":false})"));
  REQUIRE(p.ok);
  CHECK(p.chat.find(R"("tools":[{"type":"function","function":{"name":"f","description":null,)"
                    R"("parameters":{"properties":{"x":{"maximum":1e400}},"type":"object"},"defer_loading":null}},)"
                    R"({"type":"function","function":{"name":"g","description":"d","parameters":{ "type":"object"},"defer_loading":true}},)"
                    R"({"type":"function","function":{"name":"h","description":null,"parameters":{"type":"object"},"defer_loading":null}}],)"
                    R"("chat_template_kwargs":{"enable_thinking":false}})") != std::string::npos);
}

TEST_CASE("messages: each refusal says which field") {
  CHECK(refused("{").find("could not parse") != std::string::npos);
  CHECK(refused(R"({"max_tokens":1,"messages":[{"role":"user","content":"q"}]})").starts_with("model"));
  CHECK(refused(R"({"model":"","max_tokens":1,"messages":[{"role":"user","content":"q"}]})").starts_with("model"));
  CHECK(refused(R"({"model":"m","messages":[{"role":"user","content":"q"}]})").starts_with("max_tokens"));
  CHECK(refused(R"({"model":"m","max_tokens":0,"messages":[{"role":"user","content":"q"}]})").starts_with("max_tokens"));
  CHECK(refused(R"({"model":"m","max_tokens":"5","messages":[{"role":"user","content":"q"}]})").starts_with("max_tokens"));
  CHECK(refused(with(R"("messages":[])")).starts_with("messages"));
  CHECK(refused(with(R"("messages":{})")).starts_with("messages"));
  CHECK(refused(with(R"("messages":[1])")).starts_with("messages.0"));
  CHECK(refused(with(R"("messages":[{"role":"tool","content":"q"}])")).starts_with("messages.0.role"));
  CHECK(refused(with(R"("messages":[{"role":"user"}])")).starts_with("messages.0.content"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":[{"type":"video"}]}])")).starts_with("messages.0.content.0.type"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":[{"text":"x"}]}])")).starts_with("messages.0.content.0.type"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":[{"type":"text","text":5}]}])")).starts_with("messages.0.content.0.text"));
  CHECK(refused(with(R"("messages":[{"role":"assistant","content":[{"type":"tool_use","input":[1]}]}])"))
            .starts_with("messages.0.content.0.input"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":[{"type":"tool_result","content":[1]}]}])"))
            .starts_with("messages.0.content.0.content.0"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":1}]}]}])"))
            .starts_with("messages.0.content.0.content.0.text"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":[]}])")).starts_with("messages:"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"system":5)")).starts_with("system"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"stream":1)")).starts_with("stream"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"metadata":{"user_id":5})")).starts_with("metadata.user_id"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"stop_sequences":[1])")).starts_with("stop_sequences.0"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"temperature":"hot")")).starts_with("temperature"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"top_k":1.5)")).starts_with("top_k"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"tool_choice":{"type":"tool"})")).starts_with("tool_choice"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"tool_choice":{"type":"some"})")).starts_with("tool_choice.type"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"tools":[{"name":"f"}])")).starts_with("tools.0.input_schema"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"tools":[{"input_schema":{}}])")).starts_with("tools.0.name"));
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"chat_template_kwargs":[])")).starts_with("chat_template_kwargs"));
}

TEST_CASE("messages: bounds on messages, blocks and tools") {
  std::string msgs;
  for (int i = 0; i < 100'001; ++i) msgs += i ? R"(,{"role":"user","content":"x"})" : R"({"role":"user","content":"x"})";
  CHECK(refused(with(R"("messages":[)" + msgs + "]"))== "messages could not be read (a JSON array or object of more than 100000 elements)");
  std::string blocks;
  for (int i = 0; i < 100'001; ++i) blocks += i ? R"(,{"type":"text","text":"x"})" : R"({"type":"text","text":"x"})";
  CHECK(refused(with(R"("messages":[{"role":"user","content":[)" + blocks + "]}]")).find(
            "messages.0.content could not be read (a JSON array or object of more than 100000 elements)") == 0);
  std::string tools;
  for (int i = 0; i < 10'001; ++i) tools += i ? R"(,{"name":"f","input_schema":{}})" : R"({"name":"f","input_schema":{}})";
  CHECK(refused(with(R"("messages":[{"role":"user","content":"q"}],"tools":[)" + tools + "]")).find("more than 10000 tools") !=
        std::string::npos);
}

TEST_CASE("messages: Anthropic's error type follows the status") {
  ApiError e;
  e.message = "no such model";
  e.status = 404;
  CHECK(anthropic_error_body(e) == R"({"type":"error","error":{"type":"not_found_error","message":"no such model"}})");
  e.status = 429;
  CHECK(anthropic_error_body(e).find("rate_limit_error") != std::string::npos);
  e.status = 503;
  CHECK(anthropic_error_body(e).find("overloaded_error") != std::string::npos);
  e.status = 413;
  CHECK(anthropic_error_body(e).find("request_too_large") != std::string::npos);
  e.status = 502;
  CHECK(anthropic_error_body(e).find("api_error") != std::string::npos);
}

TEST_CASE("messages: a reused request gives what a fresh one gives") {
  const std::string second = with(R"("messages":[{"role":"user","content":"second"}])");
  Parsed fresh = parse(second);
  ParsedRequest reused;
  std::string chat;
  ApiError e;
  REQUIRE(parse_messages_request(with(R"("messages":[{"role":"user","content":"first"}],"stream":true,"metadata":{"user_id":"u"})"),
                                 reused, chat, e));
  REQUIRE(parse_messages_request(second, reused, chat, e));
  CHECK(chat == fresh.chat);
  CHECK_FALSE(reused.stream);
  CHECK(reused.user.empty());
  CHECK(reused.messages.size() == 1);
}
