// Unit tests for tokenizer/jinja*.{h,cpp} and tokenizer/chat_template.*. Expected strings are
// what Python Jinja2 (python3-jinja2, configured as transformers does) renders;
// tests/tokenizer/jinja_python_reference.sh compares whole chat templates and one-line
// templates against it directly.
#include "tokenizer/jinja.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/chat_template.h"

namespace {

using kvroute::jinja::Template;

// Renders `tpl` with the JSON object `ctx`; returns the text, or "ERR: <message>".
std::string render(const std::string& tpl, const std::string& ctx = "{}",
                   const kvroute::jinja::RenderOptions& opt = {}) {
  std::string err, out;
  auto t = Template::parse(tpl, &err);
  if (!t) return "ERR: " + err;
  if (!t->render_json(ctx, &out, &err, opt)) return "ERR: " + err;
  return out;
}

bool is_error(const std::string& s) { return s.rfind("ERR: ", 0) == 0; }

}  // namespace

TEST_CASE("Python semantics where @huggingface/jinja differed") {
  const char* ctx = R"({"s": {"minimum": 0.0, "a": 2.0, "b": -0.0, "c": 1e-05, "d": 1e16, "big": 18446744073709551617,
                        "id": 9007199254740993, "inf": 1e400, "10": 1, "2": 2}, "r": "\n think \n\n"})";
  CHECK(render("{{ s | tojson }}", ctx) ==
        R"({"minimum": 0.0, "a": 2.0, "b": -0.0, "c": 1e-05, "d": 1e+16, "big": 18446744073709551617, "id": 9007199254740993, "inf": Infinity, "10": 1, "2": 2})");
  CHECK(render("[{{ r.strip('\n') }}]|[{{ r.lstrip('\n') }}]|[{{ r.rstrip('\n') }}]|[{{ r | trim }}]", ctx) ==
        "[ think ]|[ think \n\n]|[\n think ]|[think]");
  CHECK(render("{{ -7 % 3 }}|{{ 'ab' * 3 }}|{{ '%s=%d' % ('x', 5) }}|{{ True }}|{{ None }}|{{ {'a': [1, 'b']} }}") ==
        "2|ababab|x=5|True|None|{'a': [1, 'b']}");
  CHECK(render("{{ 'a😀b' | length }}|{{ 'hello wORLD' | title }}|{{ '1' == 1 }}|{{ 1 == 1.0 }}") == "3|Hello World|False|True");
  CHECK(render("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}") == "13");
  CHECK(is_error(render("{% break %}")));
}

TEST_CASE("known differences from Python Jinja2 (tokenizer/README.md)") {
  // Arithmetic on integers beyond 64 bits is done in doubles (Python: exact).
  CHECK(render("{{ big + 1 }}", R"({"big": 18446744073709551616})") == "1.8446744073709552e+19");
  // Dict literals with non-string keys are rejected (Python accepts them).
  CHECK(is_error(render("{{ {1: 2} }}")));
  // range() returns a list (Python prints range(0, 3)).
  CHECK(render("{{ range(3) }}") == "[0, 1, 2]");
}

TEST_CASE("errors: raise_exception, malformed templates, limits") {
  CHECK(render("{{ raise_exception('boom: ' ~ 1) }}") == "ERR: boom: 1");
  CHECK(render("a{% if %}") .rfind("ERR: template syntax error", 0) == 0);
  CHECK(is_error(render("{% if true %}unterminated")));
  CHECK(is_error(render("{% for %}{% endfor %}")));
  CHECK(is_error(render("{{ 'unterminated }}")));
  CHECK(is_error(render("{% endfor %}")));
  CHECK(is_error(render("{{ x }", "{}")));
  CHECK(is_error(render("{% unknown %}")));
  CHECK(is_error(render("{{ \xff }}")));  // not UTF-8
  // Deep nesting in the template is refused at parse time, not by a stack overflow.
  std::string deep = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  CHECK(is_error(render(deep)));
  std::string chain = "{{ 1" ;
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  CHECK(is_error(render(chain + " }}")));
  // Unbounded recursion, loops and output growth are stopped with an error.
  CHECK(render("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}") == "ERR: Maximum recursion depth exceeded");
  CHECK(is_error(render("{% for i in range(100000000) %}{% endfor %}")));
  CHECK(is_error(render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}")));
  kvroute::jinja::RenderOptions small;
  small.limits.max_steps = 1000;
  CHECK(is_error(render("{% for i in range(10000) %}{{ i }}{% endfor %}", "{}", small)));
  small.limits = {};
  small.limits.max_output_bytes = 100;
  CHECK(is_error(render("{% for i in range(1000) %}{{ i }}{% endfor %}", "{}", small)));
  std::string nested = "{{ " + std::string(300, '[') + std::string(300, ']') + " }}";
  CHECK(is_error(render(nested)));
  // A context that is not an object, or not JSON.
  CHECK(is_error(render("x", "[1]")));
  CHECK(is_error(render("x", "{bad json")));
  CHECK(render("{{ true }}", R"({"true": 1})") == "True");  // a literal, as in Jinja2  // would redefine a global, as upstream refuses
}

TEST_CASE("concurrent renders share one parsed template") {
  std::string err;
  auto t = Template::parse("{% for i in range(n) %}{{ i }},{% endfor %}", &err);
  REQUIRE(t);
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&, k] {
      for (int r = 0; r < 200; ++r) {
        std::string out, e;
        std::string ctx = "{\"n\": " + std::to_string(k) + "}";
        std::string want;
        for (int i = 0; i < k; ++i) want += std::to_string(i) + ",";
        if (t->render_json(ctx, &out, &e) && out == want) ++ok[size_t(k)];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 8; ++k) CHECK(ok[size_t(k)] == 200);
}

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("kvroute_jinja_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::error_code ec; std::filesystem::remove_all(path, ec); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name, std::ios::binary) << text; }
  static int& counter() { static int c = 0; return c; }
};

const char* kEchoTemplate =
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% if m.tool_calls %}"
    "{% for c in m.tool_calls %}<{{ c.function.name }} {{ c.function.arguments | tojson }}>{% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}{% if tools %}T{{ tools | length }}{% endif %}"
    "{% if flag is defined %}F{{ flag }}{% endif %}{{ eos_token }}";

std::string json_string(const std::string& s) { return kvroute::jinja::to_json(kvroute::jinja::Value::string(s)); }

}  // namespace

TEST_CASE("ChatTemplate::load: tokenizer_config.json string, list with default, chat_template.jinja, errors") {
  std::string err;
  {
    TempDir d;
    d.write("tokenizer_config.json", std::string(R"({"model_max_length": 1000000000000000019884624838656, "bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": )") +
                                         json_string(kEchoTemplate) + "}");
    auto ct = kvroute::ChatTemplate::load(d.path.string(), &err);
    REQUIRE(ct);
    std::string out;
    REQUIRE(ct->render_request(R"({"messages":[{"role":"user","content":"hi"}]})", &out, &err));
    CHECK(out == "<s>[user]hi[assistant]</s>");
    REQUIRE(ct->render(R"({"messages":[{"role":"x","content":"y"}]})", &out, &err));
    CHECK(out == "[x]y");
  }
  {
    TempDir d;
    d.write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "TOOL"}, {"name": "default", "template": "DEFAULT"}]})");
    auto ct = kvroute::ChatTemplate::load(d.path.string(), &err);
    REQUIRE(ct);
    std::string out;
    REQUIRE(ct->render_request(R"({"messages":[]})", &out, &err));
    CHECK(out == "DEFAULT");
    d.write("chat_template.jinja", "JINJA FILE\n");
    ct = kvroute::ChatTemplate::load(d.path.string(), &err);
    REQUIRE(ct);
    REQUIRE(ct->render_request(R"({"messages":[]})", &out, &err));
    CHECK(out == "JINJA FILE");
  }
  {
    TempDir d;
    d.write("tokenizer_config.json", R"({"bos_token": "<s>"})");
    CHECK(kvroute::ChatTemplate::load(d.path.string(), &err) == nullptr);
    CHECK(err.find("no chat_template") != std::string::npos);
    d.write("chat_template.jinja", "{% if %}");
    CHECK(kvroute::ChatTemplate::load(d.path.string(), &err) == nullptr);
    CHECK(err.find("syntax error") != std::string::npos);
  }
}

TEST_CASE("ChatTemplate::render_request preprocesses messages as vLLM does") {
  TempDir d;
  d.write("chat_template.jinja", kEchoTemplate);
  d.write("tokenizer_config.json", R"({"bos_token": null, "eos_token": {"content": "<e>"}})");
  std::string err, out;
  auto ct = kvroute::ChatTemplate::load(d.path.string(), &err);
  REQUIRE(ct);
  // Text and refusal parts joined with "\n"; null content -> ""; arguments string parsed.
  REQUIRE(ct->render_request(R"({"messages":[
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"refusal","refusal":"r"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"x\": [1, 2.0]}"}},
                                                    {"id":"2","type":"function","function":{"name":"g","arguments":""}}]}],
      "add_generation_prompt": false, "tools": [{"type":"function","function":{"name":"t"}}], "chat_template_kwargs": {"flag": true}})",
                             &out, &err));
  CHECK(out == "[user]a\nr\nb[assistant]<f {\"x\": [1, 2.0]}><g {}>T1FTrue<e>");
  // continue_final_message cuts the prompt after the last message's content.
  REQUIRE(ct->render_request(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"par"}],
      "add_generation_prompt": false, "continue_final_message": true})", &out, &err));
  CHECK(out == "[user]q[assistant]par");
  // Client errors.
  CHECK_FALSE(ct->render_request(R"({"messages":[{"role":"user","content":"q"}], "continue_final_message": true})", &out, &err));
  CHECK_FALSE(ct->render_request("{not json", &out, &err));
  CHECK_FALSE(ct->render_request(R"({"messages": "x"})", &out, &err));
  CHECK_FALSE(ct->render_request(R"({"messages":[{"content":"no role"}]})", &out, &err));
  CHECK(ct->render_request(R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]}]})", &out, &err));  // invalid arguments -> {} (vLLM)
}

TEST_CASE("ChatTemplate: raise_exception reaches the client message") {
  TempDir d;
  d.write("chat_template.jinja", "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok");
  std::string err, out;
  auto ct = kvroute::ChatTemplate::load(d.path.string(), &err);
  REQUIRE(ct);
  CHECK_FALSE(ct->render_request(R"({"messages":[{"role":"system","content":"s"}]})", &out, &err));
  CHECK(err == "System role not supported");
  REQUIRE(ct->render_request(R"({"messages":[{"role":"user","content":"u"}]})", &out, &err));
  CHECK(out == "ok");
}

TEST_CASE("size limits apply while strings are built, not after") {
  kvroute::jinja::RenderOptions opt;
  opt.limits.max_output_bytes = 1 << 16;
  // 2,000 references to one 1 KiB string: the JSON text would be 2 MiB.
  CHECK(render("{% set s = '" + std::string(1024, 'x') + "' %}{% set ns = namespace(l=[]) %}"
               "{% for i in range(2000) %}{% set ns.l = ns.l + [s] %}{% endfor %}{{ ns.l | tojson }}", "{}", opt) == "ERR: Output too large");
  CHECK(render("{{ s | replace('a', s) }}", "{\"s\": \"" + std::string(1000, 'a') + "\"}", opt) == "ERR: Output too large");
  CHECK(render("{{ 'a\\nb' | indent(5000) }}") == "ERR: indent width too large");  // a kvroute limit
  CHECK(is_error(render("{{ [1,2][5 % 0] }}")));  // NaN index reads element 0, as Array.prototype.at does
}
