#include "router/api/responses_request.h"

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
  p.ok = parse_responses_request(body, p.r, p.chat, p.e);
  return p;
}

// The error's param and that error_body() is OpenAI's shape.
std::string refused(std::string_view body) {
  Parsed p = parse(body);
  REQUIRE_FALSE(p.ok);
  CHECK(p.e.status == 400);
  CHECK_FALSE(p.e.message.empty());
  simdjson::dom::parser json;
  simdjson::dom::element doc = json.parse(error_body(p.e)).value();
  CHECK(doc["error"]["type"].get_string().value() == "invalid_request_error");
  CHECK(doc["error"]["message"].get_string().value() == p.e.message);
  return p.e.param;
}

}  // namespace

TEST_CASE("responses: a string input is one user message after the instructions") {
  Parsed p = parse(R"({"model":"m","instructions":"Be terse.","input":"hi","stream":true,"max_output_tokens":64,
                      "priority":-3,"cache_salt":"tenant-a","user":"u"})");
  REQUIRE(p.ok);
  CHECK(p.r.kind == ApiKind::ChatCompletions);
  CHECK(p.r.model == "m");
  CHECK(p.r.stream);
  CHECK(p.r.max_tokens == 64u);
  CHECK(p.r.priority == -3);
  CHECK(p.r.cache_salt == "tenant-a");
  CHECK(p.r.user == "u");
  REQUIRE(p.r.messages.size() == 2);
  CHECK(p.r.messages[0].role == "system");
  CHECK(p.r.messages[0].content == "Be terse.");
  CHECK(p.r.messages[1].role == "user");
  CHECK(p.r.messages[1].content == "hi");
  CHECK(p.r.body.data() == p.chat.data());
  CHECK(p.chat ==
        R"({"model":"m","messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"hi"}],)"
        R"("add_generation_prompt":true,"continue_final_message":false})");
}

TEST_CASE("responses: empty instructions add no system message; items pass through as written") {
  Parsed p = parse(R"({"model":"m","instructions":"","input":[{"role":"developer","content":"d"},)"
                   R"({"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"},{"type":"input_text","text":"b"}]}]})");
  REQUIRE(p.ok);
  REQUIRE(p.r.messages.size() == 2);
  CHECK(p.r.messages[0].role == "developer");
  CHECK(p.r.messages[1].content == "a\nb");
  CHECK(p.chat.find(R"([{"role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text")") !=
        std::string::npos);
}

TEST_CASE("responses: reasoning, output text and function calls merge into one assistant message") {
  Parsed p = parse(R"({"model":"m","input":[{"role":"user","content":"q"},
      {"type":"reasoning","id":"rs","summary":[{"type":"summary_text","text":"sum"}],"content":[{"type":"reasoning_text","text":"think"}]},
      {"type":"message","role":"assistant","content":[{"type":"output_text","text":"one"},{"type":"output_text","text":"two"}]},
      {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},
      {"type":"function_call","call_id":"c2","name":"g","namespace":"ns","arguments":"{}"},
      {"type":"function_call_output","call_id":"c1","output":"42"},
      {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"x"}]},
      {"type":"reasoning","id":"rs2","summary":[{"type":"summary_text","text":"only summary"}]},
      {"type":"reasoning","id":"rs3","summary":[]}]})");
  REQUIRE(p.ok);
  REQUIRE(p.r.messages.size() == 6);
  CHECK(p.r.messages[1].role == "assistant");
  CHECK(p.r.messages[1].content == "one");  // vLLM keeps the first output text only
  CHECK(p.chat.find(R"({"role":"assistant","content":"one","reasoning":"think","tool_calls":[)"
                    R"({"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},)"
                    R"({"id":"c2","type":"function","function":{"name":"ns__g","arguments":"{}"}}]})") != std::string::npos);
  CHECK(p.chat.find(R"({"role":"tool","content":"42","tool_call_id":"c1"})") != std::string::npos);
  CHECK(p.chat.find(R"({"role":"tool","content":[{"type":"input_text","text":"x"}],"tool_call_id":"c2"})") != std::string::npos);
  CHECK(p.r.messages[3].content == "x");
  // A reasoning item after a tool message starts an assistant message; the next one
  // (its reasoning already set) starts another.
  CHECK(p.chat.find(R"({"role":"assistant","reasoning":"only summary"},{"role":"assistant","reasoning":""}])") !=
        std::string::npos);
}

TEST_CASE("responses: a partial final message is continued") {
  Parsed p = parse(R"({"model":"m","input":[{"role":"user","content":"q"},)"
                   R"({"type":"message","role":"assistant","status":"incomplete","content":[{"type":"output_text","text":"The answer is"}]}]})");
  REQUIRE(p.ok);
  CHECK(p.chat.find(R"("add_generation_prompt":false,"continue_final_message":true)") != std::string::npos);
  Parsed q = parse(R"({"model":"m","input":[{"role":"user","content":"q","status":"completed"}]})");
  REQUIRE(q.ok);
  CHECK(q.chat.find(R"("add_generation_prompt":true)") != std::string::npos);
}

TEST_CASE("responses: function tools as vLLM dumps them, numbers byte for byte; built-in tools not rendered") {
  Parsed p = parse(R"({"model":"m","input":"x","tools":[{"type":"web_search"},)"
                   R"({"type":"function","name":"f","parameters":{"max":1e400,"big":18446744073709551616,"z":-0.0},"extra":1.50},)"
                   R"({"type":"function","name":"g","description":"d","strict":true}],"reasoning":{"effort":"high"}})");
  REQUIRE(p.ok);
  CHECK(p.chat.find(R"("tools":[{"type":"function","function":{"name":"f","description":null,)"
                    R"("parameters":{"max":1e400,"big":18446744073709551616,"z":-0.0},"strict":null,"extra":1.50}},)"
                    R"({"type":"function","function":{"name":"g","description":"d","parameters":null,"strict":true}}])") !=
        std::string::npos);
  CHECK(p.chat.find(R"("chat_template_kwargs":{"reasoning_effort":"high"})") != std::string::npos);
  Parsed q = parse(R"({"model":"m","input":"x","tools":[{"type":"web_search"},{"type":"namespace","name":"ns","tools":[]}]})");
  REQUIRE(q.ok);
  CHECK(q.chat.find("\"tools\"") == std::string::npos);  // no function tool: tools=None, as vLLM
  // A repeated key: its first place, its last value (Python's json.loads).
  Parsed d = parse(R"({"model":"m","input":"x","tools":[{"type":"function","name":"f","b":1,"a":2,"b":3}]})");
  REQUIRE(d.ok);
  CHECK(d.chat.find(R"("strict":null,"b":3,"a":2}})") != std::string::npos);
}

TEST_CASE("responses: the session key and previous_response_id") {
  Parsed p = parse(R"({"model":"m","input":"x","user":"u","prompt_cache_key":"conv-7","previous_response_id":"resp_1"})");
  REQUIRE(p.ok);
  CHECK(p.r.user == "conv-7");
  CHECK(p.r.previous_response_id == "resp_1");
}

TEST_CASE("responses: each refusal names its param") {
  CHECK(refused("not json") == "");
  CHECK(refused("[1]") == "");
  CHECK(refused(R"({"input":"x"})") == "model");
  CHECK(refused(R"({"model":5,"input":"x"})") == "model");
  CHECK(refused(R"({"model":"m"})") == "input");
  CHECK(refused(R"({"model":"m","input":5})") == "input");
  CHECK(refused(R"({"model":"m","input":[]})") == "input");
  CHECK(refused(R"({"model":"m","input":"x","stream":"yes"})") == "stream");
  CHECK(refused(R"({"model":"m","input":"x","cache_salt":""})") == "cache_salt");
  CHECK(refused(R"({"model":"m","input":"x","max_output_tokens":0})") == "max_output_tokens");
  CHECK(refused(R"({"model":"m","input":"x","max_output_tokens":1.5})") == "max_output_tokens");
  CHECK(refused(R"({"model":"m","input":"x","priority":"high"})") == "priority");
  CHECK(refused(R"({"model":"m","input":"x","user":1})") == "user");
  CHECK(refused(R"({"model":"m","input":"x","prompt":{"id":"p"}})") == "prompt");
  CHECK(refused(R"({"model":"m","input":"x","previous_response_id":"a","previous_response":{}})") == "previous_response");
  CHECK(refused(R"({"model":"m","input":"x","instructions":1})") == "instructions");
  CHECK(refused(R"({"model":"m","input":"x","reasoning":{"effort":1}})") == "reasoning.effort");
  CHECK(refused(R"({"model":"m","input":[1]})") == "input[0]");
  CHECK(refused(R"({"model":"m","input":[{"content":"x"}]})") == "input[0].role");
  CHECK(refused(R"({"model":"m","input":[{"role":"tool","content":"x"}]})") == "input[0].role");
  CHECK(refused(R"({"model":"m","input":[{"role":"user","content":5}]})") == "input[0].content");
  CHECK(refused(R"({"model":"m","input":[{"role":"user","content":[1]}]})") == "input[0].content[0]");
  CHECK(refused(R"({"model":"m","input":[{"type":"item_reference","id":"x"}]})") == "input[0].type");
  CHECK(refused(R"({"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]})") == "input[0].call_id");
  CHECK(refused(R"({"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":{}}]})") ==
        "input[0].arguments");
  CHECK(refused(R"({"model":"m","input":[{"type":"function_call_output","call_id":"c"}]})") == "input[0].output");
  CHECK(refused(R"({"model":"m","input":[{"type":"reasoning","summary":"s"}]})") == "input[0].summary");
  CHECK(refused(R"({"model":"m","input":[{"type":"reasoning","content":[{"text":1}]}]})") == "input[0].content[0].text");
  CHECK(refused(R"({"model":"m","input":"x","tools":{}})") == "tools");
  CHECK(refused(R"({"model":"m","input":"x","tools":[{"name":"f"}]})") == "tools[0].type");
  CHECK(refused(R"({"model":"m","input":"x","tools":[{"type":"function"}]})") == "tools[0].name");
  CHECK(refused(R"({"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":[]}]})") ==
        "tools[0].parameters");
  CHECK(refused(R"({"model":"m","input":"x","tools":[{"type":"function","name":"f","strict":"yes"}]})") ==
        "tools[0].strict");
}

TEST_CASE("responses: bounds on items and tools") {
  std::string body = R"({"model":"m","input":[)";
  for (int i = 0; i < 100'001; ++i) body += i ? R"(,{"role":"user","content":"x"})" : R"({"role":"user","content":"x"})";
  body += "]}";
  CHECK(refused(body) == "input");
  Parsed p = parse(body);
  CHECK(p.e.message == "'input' could not be read (a JSON array or object of more than 100000 elements)");
  // An object of too many fields: its own bound, the same message.
  std::string params = R"({"model":"m","input":[{"role":"user","content":"x")";
  for (int i = 0; i < 100'001; ++i) params += ",\"k" + std::to_string(i) + "\":0";
  params += "}]}";
  Parsed q = parse(params);
  REQUIRE_FALSE(q.ok);
  CHECK(q.e.message.find("more than 100000 elements") != std::string::npos);
  CHECK(q.e.param == "input[0]");
  std::string tools = R"({"model":"m","input":"x","tools":[)";
  for (int i = 0; i < 10'001; ++i) tools += i ? R"(,{"type":"web_search"})" : R"({"type":"web_search"})";
  tools += "]}";
  CHECK(refused(tools) == "tools");
}

TEST_CASE("responses: a reused request gives what a fresh one gives") {
  Parsed fresh = parse(R"({"model":"m","input":"second"})");
  ParsedRequest reused;
  std::string chat;
  ApiError e;
  REQUIRE(parse_responses_request(R"({"model":"x","input":"first","priority":2,"previous_response_id":"r","user":"u",)"
                                  R"("cache_salt":"s","max_output_tokens":5,"stream":true})",
                                  reused, chat, e));
  REQUIRE(parse_responses_request(R"({"model":"m","input":"second"})", reused, chat, e));
  CHECK(chat == fresh.chat);
  CHECK(reused.model == "m");
  CHECK_FALSE(reused.priority);
  CHECK_FALSE(reused.max_tokens);
  CHECK(reused.previous_response_id.empty());
  CHECK(reused.user.empty());
  CHECK(reused.cache_salt.empty());
  CHECK_FALSE(reused.stream);
  CHECK(reused.messages.size() == 1);
}
