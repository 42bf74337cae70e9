// Unit tests for tokenizer/jinja.* and tokenizer/chat_template.*. Expected strings are what
// @huggingface/jinja 0.5.11 renders for the same template and context (checked in node);
// tests/tokenizer/chat_reference.sh compares whole chat templates against it directly.
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

TEST_CASE("printing values the way @huggingface/jinja does") {
  CHECK(render("{{ 1 }}|{{ 1.0 }}|{{ 2.5 }}|{{ -0.0 }}|{{ true }}|{{ none }}|{{ undefined_x }}") == "1|1.0|2.5|-0.0|true||");
  CHECK(render("{{ [1, 'a', none, true, 1.0] }}|{{ {'a': 1, 'b': [2]} }}") == "[1, \"a\", null, true, 1]|{\"a\": 1, \"b\": [2]}");
  CHECK(render("{{ x }}|{{ y }}|{{ z }}|{{ big }}", R"({"x": 1.0, "y": 0.000001, "z": 1e-7, "big": 12345678901234567890})") ==
        "1|0.000001|1e-7|12345678901234567000");
  CHECK(render("{{ 10**21 }}|{{ 0.1 + 0.2 }}|{{ 123456789.125 }}|{{ 2.0**70 }}") == "1e+21|0.30000000000000004|123456789.125|1.1805916207174113e+21");
  CHECK(is_error(render("{{ 1e21 }}")));  // no exponent literals upstream
  CHECK(render("{{ (1, 2) }}").find("TupleValue") != std::string::npos);
}

TEST_CASE("arithmetic, comparison and logic operators") {
  CHECK(render("{{ 1/2 }}|{{ 4/2 }}|{{ 7//2 }}|{{ -7//2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2**10 }}|{{ 2**-1 }}") ==
        "0.5|2.0|3|-4|1|-1|1024|0.5");
  CHECK(render("{{ 'a' ~ 1 ~ 1.0 ~ true ~ [1,2] ~ {'x':1} }}|{{ 'a' + 1.5 }}|{{ 1 + 1.0 }}") ==
        "a11true1,2[object Map]|a1.5|2.0");
  CHECK(render("{{ [none, true] ~ '' }}|{{ [1.0, 2.5] ~ '' }}") == "undefined,true|1.0,2.5");
  CHECK(render("{{ 1 < 2 }}|{{ 1 == 1.0 }}|{{ '1' == 1 }}|{{ true == 1 }}|{{ none == u }}|{{ [1] == [1] }}|{{ not 0 }}") ==
        "true|true|true|true|true|false|true");
  CHECK(render("{{ 1 and 'x' }}|{{ 0 or 'y' }}|{{ 'a' if 0 else 'b' }}|{{ 'a' if 1 }}|{{ -x }}|{{ [1] + [2] }}", R"({"x":3})") ==
        "x|y|b|a|-3|[1, 2]");
  CHECK(render("{{ not true == false }}|{{ 1 + 2 * 3 - 4 / 2 }}|{{ 2 ** 3 ** 2 }}|{{ 10 - 2 - 3 }}") == "true|5.0|64|5");
  CHECK(render("{{ 'a' in 'cat' }}|{{ 1.0 in [1,2] }}|{{ 'k' in {'k':1} }}|{{ 'q' in nothing }}|{{ 3 not in [1] }}") ==
        "true|true|true|false|true");
  // Upstream quirks kept: strings do not compare with <, none cannot be added.
  CHECK(is_error(render("{{ 'a' < 'b' }}")));
  CHECK(is_error(render("{{ none + 1 }}")));
  CHECK(is_error(render("{{ undefined_a + 1 }}")));
}

TEST_CASE("string literals and escapes") {
  CHECK(render(R"({{ "esc\t\\ \x41\u00e9\u2603 'q' \"dq\"" }}|{{ 'con' 'cat' }})") == "esc\t\\ Aé☃ 'q' \"dq\"|concat");
  CHECK(render(R"({{ '\ud83c\udf89' }})") == "🎉");
  CHECK(is_error(render(R"({{ '\q' }})")));
}

TEST_CASE("whitespace control with trim_blocks and lstrip_blocks") {
  CHECK(render("  {% if true %}\n  yes\n  {% endif %}\n  done\n") == "  yes\n  done");
  CHECK(render("a  {%- if true -%}  b  {%- endif -%}  c\n{# comment #}\nd {#- c -#} e\n\n") == "abc\nde\n");
  CHECK(render("{% for i in [1,2,3] %}\n  {{ i }}\n{% endfor %}\n") == "  1\n  2\n  3\n");
  CHECK(render("x {{- ' y ' -}} z\n\n") == "x y z\n");
  CHECK(render("    {{ 'expr' }}\n    {# c #}\n    x") == "    expr\n    x");
  CHECK(render("line1\r\n  {% if true %}\r\n  x\r\n  {% endif %}\r\nend") == "line1\r\n\r\n  x\r\n\r\nend");
  CHECK(render("{% generation %}gen {{ 1 }}{% endgeneration %} tail") == "gen 1 tail");
}

TEST_CASE("for loops: loop variables, else, filters, unpacking, break/continue, scoping") {
  CHECK(render("{% for x in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}",
               R"({"items":["a","b","c"]})") == "1/0/3/true/false/3;2/1/2/false/false/3;3/2/1/false/true/3;");
  CHECK(render("{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.index }}{% endfor %}") ==
        "empty|2142");
  CHECK(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}", R"({"d":{"b":1,"a":2,"3":3}})") ==
        "3=3;b=1;a=2;|3ba");
  CHECK(render("{% for x in [1,2,3,4,5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}") == "13");
  CHECK(render("{% for x in [1,2] %}{% continue %}{% else %}ELSE{% endfor %}") == "ELSE");
  CHECK(render("{% set total = 0 %}{% for x in [1,2,3] %}{% set total = total + x %}{{ total }}{% endfor %}|{{ total }}") == "136|0");
  CHECK(is_error(render("{% for x in 'ab' %}{{ x }}{% endfor %}")));
  CHECK(is_error(render("{% break %}")));
}

TEST_CASE("set, block set, namespace") {
  CHECK(render("{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}|{{ ns }}|{{ ns.b }}") ==
        "4|{\"a\": 4, \"b\": \"x\"}|x");
  CHECK(render("{% set ns = namespace({'k': 2}) %}{{ ns.k }}") == "2");
  CHECK(render("{% set a, b = [1, 2] %}{{ a }}{{ b }}|{% set blk %}inner {{ a }}{% endset %}{{ blk }}|{% filter upper %}shout{% endfilter %}") ==
        "12|inner 1|SHOUT");
  CHECK(is_error(render("{% set d = {} %}{% set d.x = 1 %}")));
}

TEST_CASE("macros") {
  CHECK(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }}|{{ greet('Al', '?') }}|{{ greet(name='Cy', punct='.') }}") ==
        "Hi Bob!|Hi Al?|Hi Cy.");
  CHECK(render("{% macro f(x) %}{% if x > 0 %}{{ x }}{{ f(x - 1) }}{% endif %}{% endmacro %}{{ f(5) }}") == "54321");
  CHECK(render("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, a=3) }}") == "[1, 2]{\"a\": 3}");
  CHECK(render("{% macro m(a) %}{{ outer }}{% endmacro %}{% set outer = 'o' %}{{ m(1) }}") == "o");
  CHECK(is_error(render("{% macro m(a, b) %}{% endmacro %}{{ m(1, 2, 3) }}")));
}

TEST_CASE("filters") {
  CHECK(render("{{ '  hi  ' | trim }}|{{ 'abc' | upper }}|{{ 'hello world-foo bar_baz' | title }}|{{ 'hELLO' | capitalize }}|{{ 'héllo🎉' | length }}|{{ {'a':1} | length }}") ==
        "hi|ABC|Hello World-Foo Bar_baz|HELLO|7|1");
  CHECK(render("{{ [3,1,2] | sort }}|{{ ['b','A','c'] | sort }}|{{ [1,2,3] | reverse }}|{{ [1,2,3] | first }}|{{ [1,2,3] | last }}|{{ [1,2,3] | join(', ') }}|{{ 'abc' | join('-') }}") ==
        "[1, 2, 3]|[\"A\", \"b\", \"c\"]|[3, 2, 1]|1|3|1, 2, 3|a-b-c");
  CHECK(render("{{ x | default('d') }}|{{ '' | default('d') }}|{{ '' | default('d', true) }}|{{ 5.0 | string }}|{{ [1] | string }}") ==
        "d||d|5.0|[1]");
  CHECK(render("{{ '42abc' | int }}|{{ 'x' | int(7) }}|{{ -3.5 | int }}|{{ '3.5e1x' | float }}|{{ true | int }}|{{ -5 | abs }}") ==
        "42|7|-4|35.0|1|5");
  CHECK(render("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\\n<' | tojson }}|{{ 'é\x7f' | tojson(ensure_ascii=true) }}|{{ d | tojson(separators=(',', ':')) }}",
               R"({"d":{"z":[1,2.5,{"q":null}],"a":"s"}})") ==
        "{\"z\": [1, 2.5, {\"q\": null}], \"a\": \"s\"}|{\n  \"z\": [\n    1,\n    2.5,\n    {\n      \"q\": null\n    }\n  ],\n  \"a\": \"s\"\n}|"
        "\"é\\\"\\n<\"|\"\\u00e9\\u007f\"|{\"z\":[1,2.5,{\"q\":null}],\"a\":\"s\"}");
  CHECK(render("{{ users | selectattr('active') | map(attribute='name') | join(',') }}|{{ users | rejectattr('active') | map(attribute='name') | list }}|{{ users | selectattr('role', 'equalto', 'admin') | map(attribute='name') | first }}",
               R"({"users":[{"name":"a","active":true,"role":"admin"},{"name":"b","active":false,"role":"user"},{"name":"c","active":true}]})") ==
        "a,c|[\"b\"]|a");
  CHECK(render("{{ 'a b a' | replace('a', 'x') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 'ab' | replace('', '-') }}|{{ 'x\\ny\\n\\nz' | indent(2) }}|{{ d | items }}|{{ d | dictsort }}",
               R"({"d":{"b":2,"a":1}})") == "x b x|bba|-a-b-|x\n  y\n\n  z|[[\"b\", 2], [\"a\", 1]]|[[\"a\", 1], [\"b\", 2]]");
  CHECK(render("{{ [1,2,2,1] | unique }}|{{ [1,2] | count }}|{{ 'abc' | safe }}") == "[1, 2]|2|abc");
  CHECK(is_error(render("{{ [1] | nosuchfilter }}")));
}

TEST_CASE("tests (is ...)") {
  CHECK(render("{{ x is defined }}|{{ y is undefined }}|{{ none is none }}|{{ 'a' is string }}|{{ {} is mapping }}|{{ [] is iterable }}|{{ {} is iterable }}|{{ 1.5 is number }}|{{ true is boolean }}|{{ 0 is false }}|{{ 3 is odd }}|{{ x is not none }}",
               R"({"x":1})") == "true|true|true|true|true|true|false|true|true|false|true|true");
  CHECK(render("{{ d.k is defined }}|{{ d.k is none }}|{{ x.y is defined }}", R"({"d":{"k":null}})") == "true|true|false");
  CHECK(is_error(render("{{ 1 is nosuchtest }}")));
}

TEST_CASE("slicing and indexing (code points for slices, UTF-16 units for length)") {
  CHECK(render("{{ s[1:3] }}|{{ s[::-1] }}|{{ s[-2:] }}|{{ s[:-1] }}|{{ s[::2] }}|{{ l[1:] }}|{{ l[::-1] }}|{{ l[-1] }}|{{ l[5] }}|{{ s[0] }}|{{ l[-2::-1] }}",
               R"({"s":"héllo🎉","l":[1,2,3]})") == "él|🎉olléh|o🎉|héllo|hlo|[2, 3]|[3, 2, 1]|3||h|[2, 1]");
}

TEST_CASE("string methods and dict methods") {
  CHECK(render("{{ s.startswith('  he') }}|{{ s.endswith(('x','\\n')) }}|{{ s.strip() }}|{{ s.split('l') }}|{{ s.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ ' a  b c '.split(none, 1) }}",
               R"({"s":"  hello \n"})") == "true|true|hello|[\"  he\", \"\", \"o \\n\"]|[\"hello\"]|[\"a\", \"b,c\"]|[\"a\", \"b c \"]");
  CHECK(render("{{ '\\n\\tx\\n'.strip('\\n') }}|{{ 'x</think>y'.split('</think>')[-1] }}|{{ 'abc'.capitalize() }}") == "x|y|Abc");
  CHECK(render("{{ {'a':1}.get('a') }}|{{ {'a':1}.get('b') }}|{{ {'a':1}.get('b', 5) }}|{{ d.keys() }}|{{ d.values() }}", R"({"d":{"x":1,"y":[2]}})") ==
        "1||5|[\"x\", \"y\"]|[1, [2]]");
  // Extensions beyond upstream (Python semantics): rsplit, find.
  CHECK(render("{{ 'a.b.c'.rsplit('.', 1) }}|{{ 'héllo'.find('l') }}") == "[\"a.b\", \"c\"]|2");
}

TEST_CASE("context JSON follows JS property order and number semantics") {
  CHECK(render("{{ d }}", R"({"d":{"10":1,"01":2,"2":3,"-1":4,"x":5,"4294967295":6,"4294967294":7}})") ==
        "{\"2\": 3, \"10\": 1, \"4294967294\": 7, \"01\": 2, \"-1\": 4, \"x\": 5, \"4294967295\": 6}");
  CHECK(render("{{ d }}", R"({"d":{"a":1,"b":2,"a":3}})") == "{\"a\": 3, \"b\": 2}");
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
  CHECK(is_error(render("x", R"({"true": 1})")));  // would redefine a global, as upstream refuses
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
  // Parts joined with "\n" (non-text parts dropped); null content -> ""; arguments string parsed.
  REQUIRE(ct->render_request(R"({"messages":[
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"x\": [1, 2.0]}"}},
                                                    {"id":"2","type":"function","function":{"name":"g","arguments":""}}]}],
      "add_generation_prompt": false, "tools": [{"type":"function"}], "chat_template_kwargs": {"flag": true}})",
                             &out, &err));
  CHECK(out == "[user]a\nb[assistant]<f {\"x\": [1, 2]}><g {}>T1Ftrue<e>");
  // continue_final_message cuts the prompt after the last message's content.
  REQUIRE(ct->render_request(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"par"}],
      "add_generation_prompt": false, "continue_final_message": true})", &out, &err));
  CHECK(out == "[user]q[assistant]par");
  // Client errors.
  CHECK_FALSE(ct->render_request(R"({"messages":[{"role":"user","content":"q"}], "continue_final_message": true})", &out, &err));
  CHECK_FALSE(ct->render_request("{not json", &out, &err));
  CHECK_FALSE(ct->render_request(R"({"messages": "x"})", &out, &err));
  CHECK_FALSE(ct->render_request(R"({"messages":[{"content":"no role"}]})", &out, &err));
  CHECK_FALSE(ct->render_request(R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]}]})", &out, &err));
  CHECK(err.find("arguments") != std::string::npos);
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
  CHECK(render("{{ 'a\\nb' | indent(1025) }}") == "ERR: indent width out of range");  // a kvroute limit
  CHECK(render("{{ [1,2][5 % 0] }}") == "1");  // NaN index reads element 0, as Array.prototype.at does
}
