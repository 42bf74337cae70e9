#include "tokenizer/request_tokens.h"

namespace kvroute {

std::string_view to_string(TokenSource s) {
  switch (s) {
    case TokenSource::Client: return "client";
    case TokenSource::Local: return "local";
    case TokenSource::Engine: return "engine";
    case TokenSource::Placeholder: return "placeholder";
  }
  return "client";
}

std::span<const TokenId> tokenize_request(const RequestPrompt& r, std::vector<TokenId>& buffer,
                                          const ModelTokenizer* mt, TokenSource* source,
                                          TokenizerFallback* fallback, std::string* detail) {
  auto why = [&](TokenizerFallback f) {
    if (fallback) *fallback = f;
  };
  why(TokenizerFallback::None);
  *source = TokenSource::Client;
  if (r.has_prompt_tokens) return r.prompt_tokens;
  *source = TokenSource::Local;
  if (mt && r.completions) {
    mt->encode_prompt(r.prompt_text, r.add_special_tokens.value_or(true), buffer);
    return buffer;
  }
  if (mt && mt->chat_template()) {
    std::string err;
    if (mt->encode_chat(r.body, r.add_special_tokens.value_or(false), buffer, &err)) return buffer;
    why(TokenizerFallback::TemplateError);  // the client's error, as the engine will say: never asked
    if (detail) *detail = std::move(err);
  } else if (r.has_engine_tokens) {
    *source = TokenSource::Engine;
    return r.engine_tokens;
  } else if (r.engine_failed) {
    why(TokenizerFallback::EngineError);
  } else {
    why(mt ? TokenizerFallback::NoChatTemplate : TokenizerFallback::NoTokenizer);
  }
  *source = TokenSource::Placeholder;
  if (r.chat) {
    thread_local std::string prompt;  // per-thread scratch: no allocation per request
    static const std::vector<ChatMessage> kNone;
    placeholder_chat_prompt(r.messages ? *r.messages : kNone, prompt);
    placeholder_tokenize(prompt, buffer);
  } else {
    placeholder_tokenize(r.prompt_text, buffer);
  }
  return buffer;
}

}  // namespace kvroute
