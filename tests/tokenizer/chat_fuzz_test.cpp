// Robustness of the untrusted-input path of chat requests: seeded random
// mutations of OpenAI chat bodies (byte flips, truncation, splices of JSON
// fragments) rendered through a tool-calling chat template, and random
// templates built from Jinja fragments. Every outcome must be a rendered
// prompt or an error message — never a crash, a hang or unbounded output.
// Run under ASan/UBSan for full value (see tests/README); deterministic seeds.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

using namespace kvroute;

namespace {

// A Qwen-like template: system prompt with tools, tool calls, tool results,
// generation prompt, a macro, a namespace and slicing.
constexpr const char* kTemplate = R"JINJA({%- macro render_args(a) -%}{{ a | tojson }}{%- endmacro -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- if tools -%}<|sys|>Tools:{%- for t in tools %}
{{ t | tojson }}{%- endfor %}<|end|>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' and m.tool_calls -%}<|a|>{{ m.content | trim }}{%- for c in m.tool_calls %}
<call>{{ c.function.name }} {{ render_args(c.function.arguments) }}</call>{%- endfor %}<|end|>
{% elif m.role == 'tool' -%}<|tool|>{{ m.content[:200] }}<|end|>
{% else -%}<|{{ m.role }}|>{{ m.content }}{% if loop.index0 == ns.last_user %} (last){% endif %}<|end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|a|>{%- if enable_thinking is defined and not enable_thinking %}<think></think>{% endif -%}{%- endif -%})JINJA";

const std::vector<std::string> kSeeds = {
    R"({"messages":[{"role":"user","content":"hello"}]})",
    R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"refusal","refusal":"r"},{"type":"text","text":"b"}]}],"chat_template_kwargs":{"enable_thinking":false}})",
    R"({"messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":"{\"city\":\"Paris\",\"n\":[1,2.5,null]}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}],"tools":[{"type":"function","function":{"name":"get","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]})",
};

const std::vector<std::string> kFragments = {
    "{", "}", "[", "]", ",", ":", "\"", "null", "true", "1e309", "-0", "\"\\u0000\"", "\"\\ud800\"",
    "{\"role\":\"user\"}", "\"content\":", "\"tool_calls\":[", "\"arguments\":\"{]\"", "[[[[[[[[", "\xff\xfe",
    "\"messages\":", "{\"type\":\"text\"}", "12345678901234567890123", "\"add_generation_prompt\":false"};

std::string mutate(std::string s, std::mt19937_64& rng) {
  const int ops = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < ops; ++i) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 4) {
      case 0:  // flip a byte
        if (!s.empty()) s[pos % s.size()] = static_cast<char>(rng());
        break;
      case 1:  // truncate
        s.resize(pos);
        break;
      case 2:  // splice a fragment in
        s.insert(pos, kFragments[rng() % kFragments.size()]);
        break;
      default:  // duplicate a slice (deep nesting, long strings)
        if (!s.empty()) {
          const size_t len = rng() % std::min<size_t>(s.size() - pos % s.size(), 64);
          const std::string piece = s.substr(pos % s.size(), len);
          for (int k = 0; k < 8; ++k) s.insert(pos % s.size(), piece);
        }
    }
  }
  return s;
}

}  // namespace

TEST_CASE("mutated chat bodies: a prompt or an error, never a crash") {
  const auto dir = std::filesystem::temp_directory_path() / ("kvroute-chat-fuzz-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "chat_template.jinja") << kTemplate;
  }
  std::string err;
  auto tpl = ChatTemplate::load(dir.string(), &err);
  std::filesystem::remove_all(dir);
  REQUIRE_MESSAGE(tpl, err);

  // The seeds themselves render.
  for (const auto& s : kSeeds) {
    std::string out;
    REQUIRE_MESSAGE(tpl->render_request(s, &out, &err), err);
    CHECK(out.find("<|a|>") != std::string::npos);
  }
  std::mt19937_64 rng(20261123);
  size_t rendered = 0, rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::string body = mutate(kSeeds[rng() % kSeeds.size()], rng);
    std::string out;
    err.clear();
    if (tpl->render_request(body, &out, &err)) {
      ++rendered;
      CHECK(out.size() < (16u << 20));
    } else {
      ++rejected;
      CHECK_FALSE(err.empty());  // a clear message for the client
    }
  }
  MESSAGE("rendered " << rendered << ", rejected " << rejected);
  CHECK(rendered > 100);   // the mutations keep many bodies valid...
  CHECK(rejected > 1000);  // ...and break many
}

TEST_CASE("random templates from Jinja fragments: parse or fail cleanly; renders are bounded") {
  const std::vector<std::string> parts = {
      "{% for x in messages %}", "{% endfor %}", "{% if x %}", "{% elif y %}", "{% else %}", "{% endif %}",
      "{{ x }}", "{{ messages[::-1] }}", "{{ x | tojson }}", "{% set ns = namespace(a=1) %}", "{% set ns.a = ns.a * 2 %}",
      "{{ ns.a }}", "{% macro m(a) %}{{ m(a) }}{% endmacro %}", "{{ m(1) }}", "{{ 'ab' * 1000 }}", "{{ raise_exception('r') }}",
      "{%- ", " -%}", "{{", "}}", "text", "{{ loop.index }}", "{{ (x or 'q') | upper }}", "{% for i in range(100000) %}",
      "{{ x.content.split(' ') | length }}", "{% break %}", "{{ 1/0 }}", "{{ 'a'[5:1:-1] }}"};
  std::mt19937_64 rng(7);
  const std::string ctx = R"({"messages":[{"role":"user","content":"a b c"},{"role":"assistant","content":"d"}],"y":true})";
  size_t parsed = 0, rendered = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string src;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) src += parts[rng() % parts.size()];
    std::string err, out;
    auto t = jinja::Template::parse(src, &err);
    if (!t) {
      CHECK_FALSE(err.empty());
      continue;
    }
    ++parsed;
    if (t->render_json(ctx, &out, &err)) {
      ++rendered;
      CHECK(out.size() <= (16u << 20));
    } else {
      CHECK_FALSE(err.empty());
    }
  }
  MESSAGE("parsed " << parsed << ", rendered " << rendered);
  CHECK(parsed > 100);
}
