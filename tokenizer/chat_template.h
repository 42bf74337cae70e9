// Chat templates: OpenAI chat request -> prompt text, the way vLLM renders it with a
// model's Jinja `chat_template` (tokenizer_config.json or chat_template.jinja), after vLLM's
// request preprocessing. The template language is tokenizer/jinja.h (Python Jinja2 semantics).
// Thread-safety: a ChatTemplate is immutable after load(); render*() may be called
// concurrently from any thread (the parsed template is shared read-only).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvroute {

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  // dir: a directory with tokenizer_config.json (chat_template as a string, or a list of
  // {"name","template"} where "default" is used), or a chat_template.jinja file in dir
  // (newer Hugging Face layout, preferred if present). bos_token/eos_token (string or
  // {"content":...} object) are passed to the template; a null token is not passed.
  // Returns nullptr + *error if there is no template or it does not parse.
  static std::unique_ptr<ChatTemplate> load(const std::string& dir, std::string* error);
  ~ChatTemplate();

  // Renders an OpenAI /v1/chat/completions body (untrusted JSON) as vLLM does: messages
  // rebuilt by vLLM's chat_utils (content in the template's detected format, "string" or
  // "openai"; tool-call arguments parsed; reasoning), tools as the protocol model dumps
  // them, documents, add_generation_prompt (default true), continue_final_message,
  // chat_template_kwargs over them. See tokenizer/README.md "The request".
  // Returns false and a client-facing message in *error (bad JSON, template raise_exception, limits).
  bool render_request(std::string_view body_json, std::string* out, std::string* error) const;
  // Lower level: renders with an explicit context object (JSON text), no preprocessing.
  bool render(std::string_view context_json, std::string* out, std::string* error) const;

 private:
  ChatTemplate();
  std::unique_ptr<jinja::Template> template_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;  // bos_token, eos_token, ... as configured
  bool openai_content_ = false;  // vLLM's content format: "openai" (true) or "string"
};

}  // namespace kvroute
