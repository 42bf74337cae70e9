#include "tokenizer/model_tokenizer.h"

#include <simdjson.h>

#include <filesystem>

namespace kvroute {

namespace {
// chat_template.jinja, or a non-null "chat_template" in tokenizer_config.json.
bool has_chat_template(const std::filesystem::path& base) {
  std::error_code ec;
  if (std::filesystem::exists(base / "chat_template.jinja", ec)) return true;
  const auto cfg = base / "tokenizer_config.json";
  if (!std::filesystem::exists(cfg, ec)) return false;
  simdjson::padded_string text;
  if (simdjson::padded_string::load(cfg.string()).get(text)) return true;  // unreadable: ChatTemplate::load reports it
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  // The DOM parser refuses some real configs (e.g. a 31-digit model_max_length):
  // then look for the key in the text; ChatTemplate::load parses it properly.
  if (parser.parse(text).get(doc)) return std::string_view(text).find("\"chat_template\"") != std::string_view::npos;
  auto t = doc["chat_template"];
  return !t.error() && !t.value_unsafe().is_null();
}
}  // namespace

std::string_view to_string(TokenizerFallback f) {
  switch (f) {
    case TokenizerFallback::None: return "none";
    case TokenizerFallback::NoTokenizer: return "no_tokenizer";
    case TokenizerFallback::NoChatTemplate: return "no_chat_template";
    case TokenizerFallback::TemplateError: return "template_error";
    case TokenizerFallback::EngineError: return "engine_error";
  }
  return "none";
}

std::unique_ptr<ModelTokenizer> ModelTokenizer::load(const std::string& dir, std::string* error) {
  auto mt = std::unique_ptr<ModelTokenizer>(new ModelTokenizer());
  std::string err;
  mt->tokenizer_ = HfTokenizer::load(dir, &err);
  if (!mt->tokenizer_) {
    if (error) *error = err;
    return nullptr;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path base = fs::is_directory(dir, ec) ? fs::path(dir) : fs::path(dir).parent_path();
  if (has_chat_template(base)) {
    // A template that is present but does not load is a configuration error;
    // none at all is normal (base models).
    err.clear();
    mt->template_ = ChatTemplate::load(base.string(), &err);
    if (!mt->template_) {
      if (error) *error = "chat template: " + err;
      return nullptr;
    }
  }
  return mt;
}

void ModelTokenizer::encode_prompt(std::string_view text, bool add_special_tokens, std::vector<TokenId>& out) const {
  tokenizer_->encode(text, add_special_tokens, out);
}

bool ModelTokenizer::render_chat(std::string_view body_json, std::string& prompt, std::string* error) const {
  if (!template_) {
    if (error) *error = "the model has no chat template";
    return false;
  }
  return template_->render_request(body_json, &prompt, error);
}

bool ModelTokenizer::encode_chat(std::string_view body_json, bool add_special_tokens, std::vector<TokenId>& out,
                                 std::string* error) const {
  std::string prompt;
  if (!render_chat(body_json, prompt, error)) return false;
  tokenizer_->encode(prompt, add_special_tokens, out);
  return true;
}

namespace {
std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}
}  // namespace

bool TokenizerSet::parse_spec(std::string_view spec, std::vector<std::pair<std::string, std::string>>& out,
                              std::string* error) {
  out.clear();
  auto fail = [&](std::string m) {
    if (error) *error = std::move(m);
    return false;
  };
  while (!trim(spec).empty()) {
    const size_t comma = spec.find(',');
    const std::string_view item = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return fail("'" + std::string(item) + "' is not MODEL=DIR (items are separated by commas)");
    const std::string model(trim(item.substr(0, eq)));
    const std::string dir(trim(item.substr(eq + 1)));
    if (model.empty() || dir.empty()) return fail("'" + std::string(item) + "' needs a model name and a directory");
    for (const auto& [m, d] : out)
      if (m == model) return fail("model '" + model + "' is listed twice");
    out.emplace_back(model, dir);
  }
  return true;
}

bool TokenizerSet::load(std::string_view spec, std::string* error) {
  std::vector<std::pair<std::string, std::string>> items;
  if (!parse_spec(spec, items, error)) return false;
  for (auto& [model, dir] : items) {
    std::string err;
    auto t = ModelTokenizer::load(dir, &err);
    if (!t) {
      if (error) *error = "model '" + model + "': cannot load the tokenizer in '" + dir + "': " + err;
      return false;
    }
    add(std::move(model), std::move(t));
  }
  return true;
}

void TokenizerSet::add(std::string model, std::unique_ptr<ModelTokenizer> tokenizer) {
  models_[std::move(model)] = std::move(tokenizer);
}

const ModelTokenizer* TokenizerSet::find(std::string_view model) const {
  auto it = models_.find(model);
  return it == models_.end() ? nullptr : it->second.get();
}

}  // namespace kvroute
