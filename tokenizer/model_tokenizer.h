// A model's tokenization as its engine does it (vLLM): chat requests through
// the model's chat template, then its tokenizer without added special tokens;
// completion prompts through the tokenizer with them. TokenizerSet maps model
// names to their tokenizer directories (config key tokenizer.models); models
// without one fall back to the placeholder (tokenizer/placeholder.h), and the
// caller counts that.
//
// Thread-safety: both classes are immutable after load(); every const method
// may be called concurrently from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/types.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/hf_tokenizer.h"

namespace kvroute {

// Why a request was tokenized by the placeholder instead of its model's tokenizer.
enum class TokenizerFallback : uint8_t {
  None,            ///< the model's own tokenizer (and template) were used
  NoTokenizer,     ///< no tokenizer is configured for the model
  NoChatTemplate,  ///< a chat request, and the model's directory has no chat template
  TemplateError,   ///< the chat template failed on this request (bad input, raise_exception)
  EngineError,     ///< no local tokenizer, and the engine's /tokenize failed or was in backoff
};
// Metric label: "none", "no_tokenizer", "no_chat_template", "template_error", "engine_error".
std::string_view to_string(TokenizerFallback f);

class ModelTokenizer {
 public:
  // dir holds tokenizer.json, and tokenizer_config.json / chat_template.jinja
  // for the chat template (optional). nullptr + *error when tokenizer.json
  // cannot be loaded; a template that does not parse is an error too.
  static std::unique_ptr<ModelTokenizer> load(const std::string& dir, std::string* error);

  const HfTokenizer& tokenizer() const { return *tokenizer_; }
  const ChatTemplate* chat_template() const { return template_.get(); }

  // A completion prompt: the tokenizer with special tokens (BOS), as vLLM.
  void encode_prompt(std::string_view text, bool add_special_tokens, std::vector<TokenId>& out) const;
  // A /v1/chat/completions body: template, then the tokenizer. False + *error
  // when the model has no template or the template fails on this body.
  bool encode_chat(std::string_view body_json, bool add_special_tokens, std::vector<TokenId>& out,
                   std::string* error) const;
  // The rendered prompt text of a chat body (for kvroute-tokenize --show-prompt and tests).
  bool render_chat(std::string_view body_json, std::string& prompt, std::string* error) const;

 private:
  std::unique_ptr<HfTokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> template_;
};

class TokenizerSet {
 public:
  // Parses "model=dir,model=dir" (tokenizer.models; spaces around items are
  // ignored; '=' may not appear in a model name). False + *error for a
  // malformed list or a model named twice.
  static bool parse_spec(std::string_view spec, std::vector<std::pair<std::string, std::string>>& out,
                         std::string* error);
  // Loads every tokenizer of the spec. False + *error naming the model and dir.
  bool load(std::string_view spec, std::string* error);
  // Adds one model (tests, kvroute-mocker --tokenizer).
  void add(std::string model, std::unique_ptr<ModelTokenizer> tokenizer);

  const ModelTokenizer* find(std::string_view model) const;
  size_t size() const { return models_.size(); }

 private:
  std::map<std::string, std::unique_ptr<ModelTokenizer>, std::less<>> models_;
};

}  // namespace kvroute
