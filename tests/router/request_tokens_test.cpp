// RoutingService::tokens_of with real tokenizer directories (a tiny BPE
// tokenizer.json and chat template written here): chat vs completion special
// tokens, the request's add_special_tokens, and every placeholder fallback.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <list>

#include "common/clock.h"
#include "indexer/radix_indexer.h"
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

TEST_CASE("tokenize_request: the engine's tokens when no local tokenizer can, and which source was used") {
  TempModels t;
  TokenizerSet set;
  std::string err;
  REQUIRE(set.load("chat=" + t.dir("chat") + ",base=" + t.dir("base"), &err));
  TokenizerFallback why = TokenizerFallback::None;
  TokenSource source = TokenSource::Client;
  std::vector<TokenId> buffer;
  std::string detail;

  SUBCASE("no local tokenizer: the engine's ids; without them the placeholder says why") {
    auto r = parse(ApiKind::Completions, R"({"model":"other","prompt":"hello world"})");
    r.engine_tokens = {11, 12, 13};
    r.has_engine_tokens = true;
    auto ids = RoutingService::tokenize_request(r, buffer, set.find(r.model), &source, &why, &detail);
    CHECK(std::vector<TokenId>(ids.begin(), ids.end()) == std::vector<TokenId>{11, 12, 13});
    CHECK(source == TokenSource::Engine);
    CHECK(why == TokenizerFallback::None);
    r.has_engine_tokens = false;
    r.engine_failed = true;
    ids = RoutingService::tokenize_request(r, buffer, nullptr, &source, &why, &detail);
    CHECK(std::vector<TokenId>(ids.begin(), ids.end()) == placeholder_tokenize("hello world"));
    CHECK(source == TokenSource::Placeholder);
    CHECK(why == TokenizerFallback::EngineError);
    r.engine_failed = false;
    RoutingService::tokenize_request(r, buffer, nullptr, &source, &why, &detail);
    CHECK(why == TokenizerFallback::NoTokenizer);
  }
  SUBCASE("a local tokenizer wins over engine ids; chat without a template takes the engine's") {
    auto r = parse(ApiKind::Completions, R"({"model":"chat","prompt":"ab ab"})");
    r.engine_tokens = {99};
    r.has_engine_tokens = true;
    auto ids = RoutingService::tokenize_request(r, buffer, set.find("chat"), &source, &why, &detail);
    CHECK(std::vector<TokenId>(ids.begin(), ids.end()) == std::vector<TokenId>{5, 2, 3, 2});
    CHECK(source == TokenSource::Local);
    auto c = parse(ApiKind::ChatCompletions, R"({"model":"base","messages":[{"role":"user","content":"c"}]})");
    c.engine_tokens = {7, 8};
    c.has_engine_tokens = true;
    ids = RoutingService::tokenize_request(c, buffer, set.find("base"), &source, &why, &detail);
    CHECK(std::vector<TokenId>(ids.begin(), ids.end()) == std::vector<TokenId>{7, 8});
    CHECK(source == TokenSource::Engine);
    CHECK(why == TokenizerFallback::None);
  }
  SUBCASE("client ids") {
    auto r = parse(ApiKind::Completions, R"({"model":"other","prompt":[1,2]})");
    RoutingService::tokenize_request(r, buffer, nullptr, &source, &why, &detail);
    CHECK(source == TokenSource::Client);
  }
}

TEST_CASE("a LoRA adapter uses its base model's local tokenizer; who needs the engine's /tokenize") {
  TempModels t;
  TokenizerSet set;
  std::string err;
  REQUIRE(set.load("chat=" + t.dir("chat") + ",base=" + t.dir("base"), &err));
  ManualClock clock;
  WorkerRegistry registry{clock};
  RadixIndexer index;
  SeededRandom random{1};
  ConfigStore config{Config{}};
  RoutingService routing{index, registry, config, random, &set};
  WorkerAnnouncement a;
  a.id = WorkerId{1};
  a.url = "http://127.0.0.1:9";
  a.model = "chat";
  a.lora_adapters = {"chat-support"};
  a.source = WorkerSource::Static;
  registry.upsert(a);
  WorkerAnnouncement b = a;
  b.id = WorkerId{2};
  b.model = "remote";
  b.lora_adapters = {"remote-support"};
  registry.upsert(b);

  CHECK(routing.local_tokenizer("chat") == set.find("chat"));
  CHECK(routing.local_tokenizer("chat-support") == set.find("chat"));  // inherited
  CHECK(routing.local_tokenizer("remote-support") == nullptr);
  CHECK(routing.local_tokenizer("unknown") == nullptr);
  CHECK(registry.lora_base("chat-support") == "chat");
  CHECK(registry.lora_base("chat") == "");

  // The adapter's prompt tokenized exactly as the base model's, and routed so.
  auto r = parse(ApiKind::Completions, R"({"model":"chat-support","prompt":"ab ab"})");
  RouteResult out = routing.route(r);
  CHECK(out.token_source == TokenSource::Local);
  CHECK(out.isl_tokens == 4);

  Config cfg;
  CHECK_FALSE(routing.needs_engine_tokens(cfg, r));
  auto remote = parse(ApiKind::Completions, R"({"model":"remote-support","prompt":"x"})");
  CHECK(routing.needs_engine_tokens(cfg, remote));
  auto ids = parse(ApiKind::Completions, R"({"model":"remote","prompt":[1,2,3]})");
  CHECK_FALSE(routing.needs_engine_tokens(cfg, ids));
  auto chat_base = parse(ApiKind::ChatCompletions, R"({"model":"base","messages":[{"role":"user","content":"c"}]})");
  CHECK(routing.needs_engine_tokens(cfg, chat_base));  // its directory has no chat template
  cfg.tokenizer.remote = "off";
  CHECK_FALSE(routing.needs_engine_tokens(cfg, remote));
  // Off: routed on the placeholder, and said so.
  out = routing.route(remote);
  CHECK(out.token_source == TokenSource::Placeholder);
  CHECK(out.tokenizer_fallback == TokenizerFallback::NoTokenizer);
}
