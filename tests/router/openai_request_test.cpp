#include "router/openai_request.h"

#include <doctest/doctest.h>

using namespace kvroute;

TEST_CASE("completions: text prompt, token-id prompt, batch") {
  ParsedRequest r;
  ApiError e;
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":"hello","stream":true})", r, e));
  CHECK(r.model == "m");
  CHECK(r.stream);
  CHECK(r.prompt_text == "hello");
  CHECK_FALSE(r.has_prompt_tokens);
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":[1,2,4294967295]})", r, e));
  CHECK(r.has_prompt_tokens);
  CHECK(r.prompt_tokens == std::vector<TokenId>{1, 2, 4294967295u});
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":["a","b"]})", r, e));
  CHECK(r.prompt_text == "a");
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":[[5,6],[7]]})", r, e));
  CHECK(r.prompt_tokens == std::vector<TokenId>{5, 6});
}

TEST_CASE("chat: content strings, parts and null are flattened") {
  ParsedRequest r;
  ApiError e;
  REQUIRE(parse_openai_request(
      ApiKind::ChatCompletions,
      R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]})",
      r, e));
  REQUIRE(r.messages.size() == 3);
  CHECK(r.messages[0].content == "s");
  CHECK(r.messages[1].content == "a\nb");
  CHECK(r.messages[2].content == "");
}

TEST_CASE("bad bodies give 400 with the offending param") {
  ParsedRequest r;
  ApiError e;
  auto bad = [&](ApiKind k, std::string_view body) {
    e = ApiError{};
    bool ok = parse_openai_request(k, body, r, e);
    CHECK_FALSE(ok);
    CHECK(e.status == 400);
    CHECK(e.type == "invalid_request_error");
    return e.param;
  };
  CHECK(bad(ApiKind::Completions, "{oops") == "");
  CHECK(bad(ApiKind::Completions, "[]") == "");
  CHECK(bad(ApiKind::Completions, R"({"prompt":"x"})") == "model");
  CHECK(bad(ApiKind::Completions, R"({"model":3,"prompt":"x"})") == "model");
  CHECK(bad(ApiKind::Completions, R"({"model":"m"})") == "prompt");
  CHECK(bad(ApiKind::Completions, R"({"model":"m","prompt":[-1]})") == "prompt");
  CHECK(bad(ApiKind::Completions, R"({"model":"m","prompt":"x","stream":"yes"})") == "stream");
  CHECK(bad(ApiKind::ChatCompletions, R"({"model":"m"})") == "messages");
  CHECK(bad(ApiKind::ChatCompletions, R"({"model":"m","messages":[]})") == "messages");
  CHECK(bad(ApiKind::ChatCompletions, R"({"model":"m","messages":[{"content":"x"}]})") == "messages[0].role");
  CHECK(bad(ApiKind::ChatCompletions, R"({"model":"m","messages":[{"role":"user","content":5}]})") ==
        "messages[0].content");
}

TEST_CASE("error body has OpenAI's shape") {
  ApiError e{404, "The model `x\"` does not exist.", "invalid_request_error", "model", "model_not_found"};
  CHECK(error_body(e) ==
        R"({"error":{"message":"The model `x\"` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}})");
  ApiError f{400, "m", "invalid_request_error", "", ""};
  CHECK(error_body(f) == R"({"error":{"message":"m","type":"invalid_request_error","param":null,"code":null}})");
}

TEST_CASE("batches: routed on the first prompt, every prompt checked and counted; n") {
  ParsedRequest r;
  ApiError e;
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":["a","b","c"],"n":2})", r, e));
  CHECK(r.prompt_text == "a");
  CHECK(r.prompts == 3);
  CHECK(r.n == 2);
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":[[5,6],[7]]})", r, e));
  CHECK(r.prompts == 2);
  CHECK(r.n == 1);
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":"one"})", r, e));
  CHECK(r.prompts == 1);
  // A mixed batch, a bad id in a later prompt, an empty later prompt, a bad n.
  CHECK_FALSE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":["a",[1]]})", r, e));
  CHECK(e.param == "prompt");
  CHECK_FALSE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":[[1],[2,-3]]})", r, e));
  CHECK(e.param == "prompt");
  CHECK_FALSE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":[[1],[]]})", r, e));
  CHECK_FALSE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":"x","n":0})", r, e));
  CHECK(e.param == "n");
  CHECK_FALSE(parse_openai_request(ApiKind::ChatCompletions,
                                   R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":1.5})", r, e));
  CHECK(e.param == "n");
  REQUIRE(parse_openai_request(ApiKind::ChatCompletions,
                               R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":4})", r, e));
  CHECK(r.n == 4);
}

TEST_CASE("embeddings: input parsed and tokenized like a completion prompt") {
  ParsedRequest r;
  ApiError e;
  REQUIRE(parse_openai_request(ApiKind::Embeddings, R"({"model":"m","input":"hello"})", r, e));
  CHECK(r.kind == ApiKind::Completions);
  CHECK(r.prompt_text == "hello");
  REQUIRE(parse_openai_request(ApiKind::Embeddings, R"({"model":"m","input":["x","y"]})", r, e));
  CHECK(r.prompt_text == "x");
  CHECK(r.prompts == 2);
  REQUIRE(parse_openai_request(ApiKind::Embeddings, R"({"model":"m","input":[3,4]})", r, e));
  CHECK(r.prompt_tokens == std::vector<TokenId>{3, 4});
  CHECK_FALSE(parse_openai_request(ApiKind::Embeddings, R"({"model":"m","prompt":"x"})", r, e));
  CHECK(e.param == "input");
}

TEST_CASE("JSON numbers beyond 64 bits or the double range never reject a request (Python's json reads them)") {
  ParsedRequest r;
  ApiError e;
  const std::string body =
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f",)"
      R"("parameters":{"maximum":1e400,"minimum":-1e400,"id":18446744073709551616,"n":-123456789012345678901234567890}}}]})";
  REQUIRE(parse_openai_request(ApiKind::ChatCompletions, body, r, e));
  CHECK(r.model == "m");
  CHECK(r.body == body);  // the template renders from the original text, numbers intact
  // Token ids out of range stay an error.
  CHECK_FALSE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":[18446744073709551616]})", r, e));
  CHECK(e.param == "prompt");
}

TEST_CASE("the user field is the session key; a non-string user is a 400") {
  ParsedRequest r;
  ApiError e;
  REQUIRE(parse_openai_request(ApiKind::ChatCompletions,
                               R"({"model":"m","messages":[{"role":"user","content":"hi"}],"user":"alice-7"})", r, e));
  CHECK(r.user == "alice-7");
  r.reset();
  CHECK(r.user.empty());
  CHECK_FALSE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":"x","user":42})", r, e));
  CHECK(e.status == 400);
  CHECK(e.param == "user");
}

TEST_CASE("the thread's JSON parser gives back what a large body made it grow to") {
  ParsedRequest r;
  ApiError e;
  std::string big = R"({"model":"m","prompt":")" + std::string(8 << 20, 'a') + R"("})";
  REQUIRE(parse_openai_request(ApiKind::Completions, big, r, e));
  CHECK(r.prompt_text.size() == size_t{8} << 20);  // read before the parser shrank
  CHECK(json_parser_capacity() <= size_t{1} << 20);
  // Ordinary bodies keep their parser (no reallocation per request).
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":"hello"})", r, e));
  const size_t kept = json_parser_capacity();
  CHECK(kept > 0);
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":"again"})", r, e));
  CHECK(json_parser_capacity() == kept);
}

TEST_CASE("a reused request forgets the previous request's prompt_logprobs") {
  ParsedRequest r;
  ApiError e;
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":"a","prompt_logprobs":1})", r, e));
  CHECK(r.prompt_logprobs);
  REQUIRE(parse_openai_request(ApiKind::Completions, R"({"model":"m","prompt":"a"})", r, e));
  CHECK_FALSE(r.prompt_logprobs);
}

TEST_CASE("the output budget, as vLLM reads it") {
  ParsedRequest r;
  ApiError e;
  const auto budget = [&](ApiKind kind, const char* body) {
    REQUIRE(parse_openai_request(kind, body, r, e));
    return r.max_tokens;
  };
  // A completion: max_tokens, 16 when unset (vLLM's CompletionRequest default).
  CHECK(budget(ApiKind::Completions, R"({"model":"m","prompt":"x","max_tokens":300})") == 300u);
  CHECK(budget(ApiKind::Completions, R"({"model":"m","prompt":"x"})") == 16u);
  // Chat: max_completion_tokens over max_tokens; unset = up to the context.
  const char* chat_both = R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":50,"max_completion_tokens":70})";
  CHECK(budget(ApiKind::ChatCompletions, chat_both) == 70u);
  CHECK(budget(ApiKind::ChatCompletions, R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":50})") == 50u);
  CHECK_FALSE(budget(ApiKind::ChatCompletions, R"({"model":"m","messages":[{"role":"user","content":"x"}]})").has_value());
  // A completion's max_completion_tokens is not vLLM's: its default stands.
  CHECK(budget(ApiKind::Completions, R"({"model":"m","prompt":"x","max_completion_tokens":70})") == 16u);
  // Not a count: left to the engine to refuse (the route does not fail on it).
  CHECK_FALSE(budget(ApiKind::ChatCompletions, R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"9"})").has_value());
  // An embedding generates nothing.
  CHECK(budget(ApiKind::Embeddings, R"({"model":"m","input":"x"})") == 0u);
}
