// Fuzz target: parse_openai_request (router/openai_request.h), the body of a
// client's /v1/completions or /v1/chat/completions request. Every input is
// parsed as both kinds.
// Contract checked on every input:
//   - an error is a 400 with a message, and error_body() of it is valid JSON;
//   - a success sets exactly what its kind promises (token ids or text for
//     completions, at least one message for chat) and keeps a view of the body;
//   - parsing into a ParsedRequest reused across inputs (as a connection
//     reuses one) gives the same result as parsing into a fresh one.
#include <simdjson.h>

#include <string>

#include "router/openai_request.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

bool same(const ParsedRequest& a, const ParsedRequest& b) {
  if (a.kind != b.kind || a.model != b.model || a.stream != b.stream || a.prompt_tokens != b.prompt_tokens ||
      a.has_prompt_tokens != b.has_prompt_tokens || a.prompt_text != b.prompt_text || a.body != b.body ||
      a.add_special_tokens != b.add_special_tokens || a.cache_salt != b.cache_salt ||
      a.messages.size() != b.messages.size())
    return false;
  for (size_t i = 0; i < a.messages.size(); ++i)
    if (a.messages[i].role != b.messages[i].role || a.messages[i].content != b.messages[i].content) return false;
  return true;
}

void check_error(const ApiError& err) {
  FUZZ_CHECK(err.status == 400);
  FUZZ_CHECK(!err.message.empty());
  static thread_local simdjson::dom::parser json;
  FUZZ_CHECK(!json.parse(error_body(err)).error());
}

void check_one(ApiKind kind, std::string_view body) {
  static thread_local ParsedRequest reused;  // keeps whatever the previous input left in it
  ApiError err;
  const bool ok = parse_openai_request(kind, body, reused, err);
  if (!ok) {
    check_error(err);
    return;
  }
  FUZZ_CHECK(reused.kind == kind);
  FUZZ_CHECK(reused.body.data() == body.data() && reused.body.size() == body.size());
  if (kind == ApiKind::ChatCompletions) {
    FUZZ_CHECK(!reused.messages.empty() && !reused.has_prompt_tokens && reused.prompt_text.empty());
  } else {
    FUZZ_CHECK(reused.messages.empty());
    FUZZ_CHECK(reused.has_prompt_tokens || reused.prompt_tokens.empty());
  }
  ParsedRequest fresh;
  ApiError err2;
  FUZZ_CHECK(parse_openai_request(kind, body, fresh, err2));
  FUZZ_CHECK(same(fresh, reused));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  check_one(ApiKind::Completions, body);
  check_one(ApiKind::ChatCompletions, body);
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  return {
      R"({"model":"Qwen/Qwen3-8B","prompt":"Once upon a time","max_tokens":16,"stream":true})",
      R"({"model":"m","prompt":[1,2,3,4294967295],"add_special_tokens":false,"stream":null})",
      R"({"model":"m","prompt":"tenant prompt","cache_salt":"tenant-a"})",
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"cache_salt":null})",
      R"({"model":"m","prompt":[[5,6,7],[8]],"temperature":0.7})",
      R"({"model":"m","prompt":["first","second"],"n":2})",
      R"({"model":"m","messages":[{"role":"system","content":"You are terse."},)"
      R"({"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"x"}},)"
      R"({"type":"text","text":"there \u00e9\n"}]},{"role":"assistant","content":null},{"role":"tool"}],)"
      R"("stream":false,"add_special_tokens":true})",
      R"({"model":"m","messages":[{"role":"user","content":"hello"}],"stream_options":{"include_usage":true}})",
  };
}
