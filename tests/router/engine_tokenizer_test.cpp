// router/engine_tokenizer.h: the /tokenize request bodies (vLLM's shapes), the
// bounded reading of an engine's answer, the cache of exact answers and the
// per-model backoff.
#include "router/engine_tokenizer.h"

#include <doctest/doctest.h>

#include <list>
#include <string>

using namespace kvroute;

namespace {

ParsedRequest parse(ApiKind kind, std::string body) {
  static std::list<std::string> bodies;  // ParsedRequest::body is a view
  ParsedRequest r;
  ApiError e;
  REQUIRE(parse_openai_request(kind, bodies.emplace_back(std::move(body)), r, e));
  return r;
}

}  // namespace

TEST_CASE("the /tokenize body: vLLM's TokenizeCompletionRequest and TokenizeChatRequest") {
  std::string body;
  SUBCASE("a text completion: model, prompt (escaped), add_special_tokens (default true)") {
    auto r = parse(ApiKind::Completions, R"({"model":"Qwen/Qwen3-8B","prompt":"a \"q\"\n\u00e9","max_tokens":5})");
    REQUIRE(engine_tokenize_body(r, body));
    CHECK(body == "{\"model\":\"Qwen/Qwen3-8B\",\"prompt\":\"a \\\"q\\\"\\n\xc3\xa9\",\"add_special_tokens\":true}");
    r = parse(ApiKind::Completions, R"({"model":"m","prompt":"x","add_special_tokens":false})");
    REQUIRE(engine_tokenize_body(r, body));
    CHECK(body == R"({"model":"m","prompt":"x","add_special_tokens":false})");
  }
  SUBCASE("chat: the template's fields copied byte for byte, generation fields dropped") {
    auto r = parse(ApiKind::ChatCompletions,
                   R"({"model":"m","stream":true,"max_tokens":9,"messages":[{"role":"user","content":"hi"}],)"
                   R"("tools":[{"type":"function","function":{"name":"f","parameters":{"x":1e400,"y":-0.0}}}],)"
                   R"("chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":true,"n":2})");
    REQUIRE(engine_tokenize_body(r, body));
    CHECK(body == R"({"model":"m","messages":[{"role":"user","content":"hi"}],)"
                  R"("tools":[{"type":"function","function":{"name":"f","parameters":{"x":1e400,"y":-0.0}}}],)"
                  R"("chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":true})");
  }
  SUBCASE("client token ids: nothing to ask") {
    auto r = parse(ApiKind::Completions, R"({"model":"m","prompt":[1,2,3]})");
    CHECK_FALSE(engine_tokenize_body(r, body));
  }
}

TEST_CASE("an engine's /tokenize answer is read within its bounds") {
  std::vector<TokenId> out;
  CHECK(parse_engine_tokenize_response(R"({"count":3,"max_model_len":4096,"tokens":[1,2,4294967295]})", 10, out) ==
        EngineTokenizeResult::Ok);
  CHECK(out == std::vector<TokenId>{1, 2, 4294967295u});
  CHECK(parse_engine_tokenize_response(R"({"tokens":[7]})", 10, out) == EngineTokenizeResult::Ok);  // count optional
  CHECK(parse_engine_tokenize_response(R"({"tokens":[]})", 10, out) == EngineTokenizeResult::Ok);
  CHECK(out.empty());
  // Hostile or broken answers never leave partial ids behind.
  for (const char* bad : {R"({"count":2,"tokens":[1,2,3]})", R"({"tokens":[1,-2]})", R"({"tokens":[1,2.5]})",
                          R"({"tokens":[4294967296]})", R"({"tokens":"1 2"})", R"({"count":1})", R"([1,2])",
                          R"({"tokens":[1,2)", "", R"({"tokens":[1],"count":"1"})"}) {
    CAPTURE(bad);
    CHECK(parse_engine_tokenize_response(bad, 10, out) == EngineTokenizeResult::BadResponse);
    CHECK(out.empty());
  }
  CHECK(parse_engine_tokenize_response(R"({"tokens":[1,2,3]})", 2, out) == EngineTokenizeResult::TooLarge);
  CHECK(out.empty());
  const std::string huge = R"({"pad":")" + std::string(engine_tokenize_max_bytes(2), 'x') + R"(","tokens":[1]})";
  CHECK(parse_engine_tokenize_response(huge, 2, out) == EngineTokenizeResult::TooLarge);
  CHECK(to_string(EngineTokenizeResult::BadResponse) == "bad_response");
}

TEST_CASE("the cache keeps exact answers within its byte budget, least recently used out first") {
  // Entries of 10 ids cost 40 bytes plus the overhead: room for 16.
  constexpr uint64_t kEntry = 10 * sizeof(TokenId) + 96;
  EngineTokenCache cache(16 * kEntry + 10);
  auto key = [](int i) { return EngineTokenCache::key_of(R"({"model":"m","prompt":")" + std::to_string(i) + "\"}"); };
  auto ids = [](int i) { return std::vector<TokenId>(10, static_cast<TokenId>(i)); };
  CHECK(key(1) != key(2));
  std::vector<TokenId> out;
  CHECK_FALSE(cache.get(key(0), out));
  for (int i = 0; i < 16; ++i) cache.put(key(i), ids(i));
  CHECK(cache.size() == 16);
  REQUIRE(cache.get(key(0), out));  // 0 is now the most recent
  CHECK(out == ids(0));
  cache.put(key(16), ids(16));  // evicts 1, the least recently used
  CHECK_FALSE(cache.get(key(1), out));
  CHECK(cache.get(key(0), out));
  CHECK(cache.get(key(16), out));
  CHECK(out == ids(16));
  CHECK(cache.size() == 16);
  CHECK(cache.bytes() <= 16 * kEntry + 10);
  // An answer larger than an eighth of the budget is not kept; no budget, no cache.
  cache.put(key(100), std::vector<TokenId>(100, 0));
  CHECK_FALSE(cache.get(key(100), out));
  EngineTokenCache off(0);
  off.put(key(0), ids(0));
  CHECK_FALSE(off.get(key(0), out));
}

TEST_CASE("after failures a model's engine is skipped for a doubling while, per kind; a success clears it") {
  using namespace std::chrono_literals;
  EngineTokenizeBackoff b;
  const auto t0 = EngineTokenizeBackoff::Clock::time_point{} + 1h;
  CHECK(b.allow("m", false, t0));
  b.on_failure("m", false, t0);
  CHECK_FALSE(b.allow("m", false, t0 + 50ms));
  CHECK(b.allow("m", true, t0 + 50ms));  // chat is asked on its own
  CHECK(b.allow("other", false, t0 + 50ms));
  CHECK(b.allow("m", false, t0 + 100ms));
  b.on_failure("m", false, t0 + 100ms);  // second in a row: 200 ms
  CHECK_FALSE(b.allow("m", false, t0 + 250ms));
  CHECK(b.allow("m", false, t0 + 300ms));
  for (int i = 0; i < 20; ++i) b.on_failure("m", false, t0 + 300ms);
  CHECK_FALSE(b.allow("m", false, t0 + 300ms + 9s));
  CHECK(b.allow("m", false, t0 + 300ms + 10s));  // capped at 10 s
  b.on_success("m", false);
  CHECK(b.allow("m", false, t0 + 301ms));
  // The engine's failures back off; a request it refuses or one too large is that request's.
  CHECK(EngineTokenizeBackoff::backs_off(EngineTokenizeResult::Timeout));
  CHECK(EngineTokenizeBackoff::backs_off(EngineTokenizeResult::Connect));
  CHECK(EngineTokenizeBackoff::backs_off(EngineTokenizeResult::Status));
  CHECK(EngineTokenizeBackoff::backs_off(EngineTokenizeResult::BadResponse));
  CHECK_FALSE(EngineTokenizeBackoff::backs_off(EngineTokenizeResult::Rejected));
  CHECK_FALSE(EngineTokenizeBackoff::backs_off(EngineTokenizeResult::TooLarge));
  CHECK_FALSE(EngineTokenizeBackoff::backs_off(EngineTokenizeResult::Backoff));
}
