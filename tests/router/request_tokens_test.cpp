// RoutingService::tokens_of with real tokenizer directories (a tiny BPE
// tokenizer.json and chat template written here): chat vs completion special
// tokens, the request's add_special_tokens, and every placeholder fallback.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <list>

#include "router/openai_request.h"
#include "router/routing.h"
#include "tokenizer/model_tokenizer.h"
#include "tokenizer/placeholder.h"

using namespace kvroute;
namespace fs = std::filesystem;

namespace {

// vocab: a=0 b=1 ab=2 ' '=3 c=4, <s>=5 (BOS added by the post-processor); one merge "a b".
constexpr const char* kTokenizerJson = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 5, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": true}],
  "normalizer": null, "pre_tokenizer": null, "decoder": null,
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [5], "tokens": ["<s>"]}}},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": {"a": 0, "b": 1, "ab": 2, " ": 3, "c": 4}, "merges": ["a b"]}
})";

// Renders "ab" + each user message; any other role raises.
constexpr const char* kTokenizerConfig = R"({"chat_template":
  "{% for m in messages %}{% if m.role == 'user' %}ab{{ m.content }}{% else %}{{ raise_exception('only user messages') }}{% endif %}{% endfor %}"})";

struct TempModels {
  fs::path root = fs::temp_directory_path() / ("kvroute-tok-test-" + std::to_string(::getpid()));
  TempModels() {
    fs::create_directories(root / "chat");
    fs::create_directories(root / "base");
    fs::create_directories(root / "broken");
    std::ofstream(root / "chat" / "tokenizer.json") << kTokenizerJson;
    std::ofstream(root / "chat" / "tokenizer_config.json") << kTokenizerConfig;
    std::ofstream(root / "base" / "tokenizer.json") << kTokenizerJson;
    std::ofstream(root / "base" / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
    std::ofstream(root / "broken" / "tokenizer.json") << kTokenizerJson;
    std::ofstream(root / "broken" / "tokenizer_config.json") << R"({"chat_template": "{% for m in %}"})";
  }
  ~TempModels() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  std::string dir(const char* name) const { return (root / name).string(); }
};

// ParsedRequest::body is a view: the bodies live as long as the test binary.
ParsedRequest parse(ApiKind kind, std::string body) {
  static std::list<std::string> bodies;
  ParsedRequest r;
  ApiError e;
  REQUIRE(parse_openai_request(kind, bodies.emplace_back(std::move(body)), r, e));
  return r;
}

}  // namespace

TEST_CASE("tokenizer.models spec parsing") {
  std::vector<std::pair<std::string, std::string>> items;
  std::string err;
  REQUIRE(TokenizerSet::parse_spec(" Qwen/Qwen3-8B = /m/qwen3 , llama=/m/llama,", items, &err));
  REQUIRE(items.size() == 2);
  CHECK(items[0] == std::pair<std::string, std::string>{"Qwen/Qwen3-8B", "/m/qwen3"});
  CHECK(items[1] == std::pair<std::string, std::string>{"llama", "/m/llama"});
  CHECK(TokenizerSet::parse_spec("", items, &err));
  CHECK(items.empty());
  CHECK_FALSE(TokenizerSet::parse_spec("just-a-dir", items, &err));
  CHECK(err.find("MODEL=DIR") != std::string::npos);
  CHECK_FALSE(TokenizerSet::parse_spec("=/dir", items, &err));
  CHECK_FALSE(TokenizerSet::parse_spec("m=", items, &err));
  CHECK_FALSE(TokenizerSet::parse_spec("m=/a,m=/b", items, &err));
  CHECK(err.find("twice") != std::string::npos);
}

TEST_CASE("loading: a missing dir or a broken template is an error naming the model") {
  TempModels t;
  TokenizerSet set;
  std::string err;
  CHECK_FALSE(set.load("m=" + t.dir("nonexistent"), &err));
  CHECK(err.find("model 'm'") != std::string::npos);
  CHECK_FALSE(set.load("b=" + t.dir("broken"), &err));
  CHECK(err.find("chat template") != std::string::npos);
  TokenizerSet ok;
  REQUIRE(ok.load("chat=" + t.dir("chat") + ",base=" + t.dir("base"), &err));
  CHECK(ok.size() == 2);
  REQUIRE(ok.find("chat") != nullptr);
  CHECK(ok.find("chat")->chat_template() != nullptr);
  REQUIRE(ok.find("base") != nullptr);
  CHECK(ok.find("base")->chat_template() == nullptr);  // no chat_template key: a base model
  CHECK(ok.find("other") == nullptr);
}

TEST_CASE("tokens_of: the model's tokenizer, special tokens as vLLM, and each fallback") {
  TempModels t;
  TokenizerSet set;
  std::string err;
  REQUIRE(set.load("chat=" + t.dir("chat") + ",base=" + t.dir("base"), &err));
  TokenizerFallback why = TokenizerFallback::TemplateError;
  std::string detail;

  SUBCASE("completion: BOS added; the request can turn it off") {
    auto r = parse(ApiKind::Completions, R"({"model":"chat","prompt":"ab ab"})");
    CHECK(RoutingService::tokens_of(r, &set, &why) == std::vector<TokenId>{5, 2, 3, 2});
    CHECK(why == TokenizerFallback::None);
    r = parse(ApiKind::Completions, R"({"model":"chat","prompt":"ab ab","add_special_tokens":false})");
    CHECK(RoutingService::tokens_of(r, &set, &why) == std::vector<TokenId>{2, 3, 2});
  }
  SUBCASE("chat: template, then no special tokens unless asked") {
    auto r = parse(ApiKind::ChatCompletions, R"({"model":"chat","messages":[{"role":"user","content":"c"}]})");
    CHECK(RoutingService::tokens_of(r, &set, &why) == std::vector<TokenId>{2, 4});
    CHECK(why == TokenizerFallback::None);
    r = parse(ApiKind::ChatCompletions,
              R"({"model":"chat","add_special_tokens":true,"messages":[{"role":"user","content":"c"}]})");
    CHECK(RoutingService::tokens_of(r, &set, &why) == std::vector<TokenId>{5, 2, 4});
  }
  SUBCASE("chat the template rejects: placeholder, with the template's message") {
    auto r = parse(ApiKind::ChatCompletions, R"({"model":"chat","messages":[{"role":"system","content":"c"}]})");
    const auto ids = RoutingService::tokens_of(r, &set, &why, &detail);
    CHECK(why == TokenizerFallback::TemplateError);
    CHECK(detail.find("only user messages") != std::string::npos);
    CHECK(ids == placeholder_tokenize(placeholder_chat_prompt(r.messages)));
  }
  SUBCASE("chat for a model without a template: placeholder; its completions still use the tokenizer") {
    auto r = parse(ApiKind::ChatCompletions, R"({"model":"base","messages":[{"role":"user","content":"c"}]})");
    RoutingService::tokens_of(r, &set, &why);
    CHECK(why == TokenizerFallback::NoChatTemplate);
    r = parse(ApiKind::Completions, R"({"model":"base","prompt":"c"})");
    CHECK(RoutingService::tokens_of(r, &set, &why) == std::vector<TokenId>{5, 4});
    CHECK(why == TokenizerFallback::None);
  }
  SUBCASE("a model with no tokenizer, and no tokenizers at all") {
    auto r = parse(ApiKind::Completions, R"({"model":"other","prompt":"hello world"})");
    CHECK(RoutingService::tokens_of(r, &set, &why) == placeholder_tokenize("hello world"));
    CHECK(why == TokenizerFallback::NoTokenizer);
    CHECK(RoutingService::tokens_of(r, nullptr, &why) == placeholder_tokenize("hello world"));
    CHECK(why == TokenizerFallback::NoTokenizer);
  }
  SUBCASE("client token ids are used as given") {
    auto r = parse(ApiKind::Completions, R"({"model":"chat","prompt":[7,8,9]})");
    CHECK(RoutingService::tokens_of(r, &set, &why) == std::vector<TokenId>{7, 8, 9});
    CHECK(why == TokenizerFallback::None);
  }
}
