// Fuzz target: the engine's POST /tokenize, both directions
// (router/engine_tokenizer.h). Every input is read
//   - as an engine's answer (parse_engine_tokenize_response, 64 tokens at
//     most): a success holds at most 64 ids and the ids written back as
//     {"count","tokens"} read back the same; a failure leaves no ids;
//   - as a client's request body, both kinds (parse_openai_request, then
//     engine_tokenize_body, which re-reads a chat body with simdjson's
//     on-demand parser to copy its fields): the /tokenize body built is valid
//     JSON naming the request's model, with its prompt (completions) or a
//     `messages` array (chat).
#include <simdjson.h>

#include <string>

#include "common/json_numbers.h"
#include "router/engine_tokenizer.h"
#include "router/openai_request.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

constexpr uint32_t kMaxTokens = 64;

void check_answer(std::string_view body) {
  static thread_local std::vector<TokenId> out = {1, 2, 3};  // whatever the previous input left
  const EngineTokenizeResult r = parse_engine_tokenize_response(body, kMaxTokens, out);
  if (r != EngineTokenizeResult::Ok) {
    FUZZ_CHECK(r == EngineTokenizeResult::BadResponse || r == EngineTokenizeResult::TooLarge);
    FUZZ_CHECK(out.empty());
    return;
  }
  FUZZ_CHECK(out.size() <= kMaxTokens);
  std::string again = "{\"count\":" + std::to_string(out.size()) + ",\"tokens\":[";
  for (size_t i = 0; i < out.size(); ++i) again += (i ? "," : "") + std::to_string(out[i]);
  again += "]}";
  std::vector<TokenId> back;
  FUZZ_CHECK(parse_engine_tokenize_response(again, kMaxTokens, back) == EngineTokenizeResult::Ok);
  FUZZ_CHECK(back == out);
}

void check_request(ApiKind kind, std::string_view body) {
  ParsedRequest parsed;
  ApiError err;
  if (!parse_openai_request(kind, body, parsed, err)) return;
  std::string out;
  if (!engine_tokenize_body(parsed, out)) {
    FUZZ_CHECK(parsed.has_prompt_tokens || kind == ApiKind::ChatCompletions);
    return;
  }
  FUZZ_CHECK(!parsed.has_prompt_tokens);
  // Numbers a 64-bit reader refuses (1e400) are valid JSON and kept as the
  // client wrote them: read the copy with them replaced, as the router does.
  std::string readable;
  if (!replace_out_of_range_numbers(out, &readable)) readable = out;
  static thread_local simdjson::dom::parser json;
  simdjson::dom::element doc;
  FUZZ_CHECK(!json.parse(readable).get(doc));
  std::string_view model;
  FUZZ_CHECK(!doc["model"].get_string().get(model) && model == parsed.model);
  if (kind == ApiKind::ChatCompletions) {
    FUZZ_CHECK(doc["messages"].is_array());
  } else {
    std::string_view prompt;
    FUZZ_CHECK(!doc["prompt"].get_string().get(prompt) && prompt == parsed.prompt_text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  check_answer(body);
  check_request(ApiKind::Completions, body);
  check_request(ApiKind::ChatCompletions, body);
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  return {
      R"({"count":3,"max_model_len":32768,"tokens":[151644,8948,198],"token_strs":null})",
      R"({"tokens":[],"count":0})",
      R"({"model":"Qwen/Qwen3-8B","prompt":"Once upon a time \u00e9\n","max_tokens":16})",
      R"({"model":"m","prompt":"x","add_special_tokens":false})",
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true,)"
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"x":1e400}}}],)"
      R"("chat_template_kwargs":{"enable_thinking":false},"stream":true})",
      R"({"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"a"}]}],"continue_final_message":false})",
  };
}
