#include "router/engine_tokenizer.h"

#include <simdjson.h>
#include <xxhash.h>

#include <algorithm>

#include "common/json_escape.h"

namespace kvroute {

namespace ondemand = simdjson::ondemand;

std::string_view to_string(EngineTokenizeResult r) {
  switch (r) {
    case EngineTokenizeResult::Ok: return "ok";
    case EngineTokenizeResult::NoWorker: return "no_worker";
    case EngineTokenizeResult::Backoff: return "backoff";
    case EngineTokenizeResult::Connect: return "connect";
    case EngineTokenizeResult::Timeout: return "timeout";
    case EngineTokenizeResult::Rejected: return "rejected";
    case EngineTokenizeResult::Status: return "status";
    case EngineTokenizeResult::BadResponse: return "bad_response";
    case EngineTokenizeResult::TooLarge: return "too_large";
  }
  return "ok";
}

namespace {

// The chat request's fields vLLM's TokenizeChatRequest reads (besides `model`,
// which is always the request's): what its chat template is rendered from.
constexpr std::array<std::string_view, 8> kChatFields = {
    "messages",           "tools",         "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
    "add_special_tokens", "chat_template", "mm_processor_kwargs"};

// Raw JSON text of a value, exactly as the client wrote it.
bool raw_value(ondemand::value v, std::string_view& out) {
  ondemand::json_type t;
  if (v.type().get(t)) return false;
  if (t == ondemand::json_type::array) {
    ondemand::array a;
    return !v.get_array().get(a) && !a.raw_json().get(out);
  }
  if (t == ondemand::json_type::object) {
    ondemand::object o;
    return !v.get_object().get(o) && !o.raw_json().get(out);
  }
  out = v.raw_json_token();
  return true;
}

bool chat_body(const ParsedRequest& r, std::string& out) {
  thread_local ondemand::parser parser;
  const simdjson::padded_string padded(r.body);
  ondemand::document doc;
  ondemand::object obj;
  if (parser.iterate(padded).get(doc) || doc.get_object().get(obj)) return false;
  out = "{\"model\":\"";
  json_escape_append(out, r.model);
  out += '"';
  bool has_messages = false;
  for (auto field : obj) {
    std::string_view key;
    if (field.unescaped_key().get(key)) return false;
    if (std::find(kChatFields.begin(), kChatFields.end(), key) == kChatFields.end()) continue;
    std::string_view raw;
    if (!raw_value(field.value(), raw)) return false;
    has_messages |= key == "messages";
    out += ",\"";
    out += key;  // one of kChatFields: nothing to escape
    out += "\":";
    out += raw;
  }
  out += '}';
  return has_messages;
}

}  // namespace

bool engine_tokenize_body(const ParsedRequest& r, std::string& out) {
  out.clear();
  if (r.has_prompt_tokens) return false;
  if (r.kind == ApiKind::ChatCompletions) return chat_body(r, out);
  out += "{\"model\":\"";
  json_escape_append(out, r.model);
  out += "\",\"prompt\":\"";
  json_escape_append(out, r.prompt_text);
  out += "\",\"add_special_tokens\":";
  out += r.add_special_tokens.value_or(true) ? "true" : "false";
  out += '}';
  return true;
}

EngineTokenizeResult parse_engine_tokenize_response(std::string_view body, uint32_t max_tokens,
                                                    std::vector<TokenId>& out) {
  out.clear();
  if (body.size() > engine_tokenize_max_bytes(max_tokens)) return EngineTokenizeResult::TooLarge;
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(body.data(), body.size()).get(doc) || !doc.is_object()) return EngineTokenizeResult::BadResponse;
  simdjson::dom::array tokens;
  if (doc["tokens"].get_array().get(tokens)) return EngineTokenizeResult::BadResponse;
  if (tokens.size() > max_tokens) return EngineTokenizeResult::TooLarge;
  out.reserve(tokens.size());
  for (simdjson::dom::element t : tokens) {
    uint64_t id = 0;
    if (t.get_uint64().get(id) || id > 0xffffffffull) {
      out.clear();
      return EngineTokenizeResult::BadResponse;
    }
    out.push_back(static_cast<TokenId>(id));
  }
  auto count = doc["count"];
  uint64_t n = 0;
  if (!count.error() && (count.get_uint64().get(n) || n != out.size())) {
    out.clear();
    return EngineTokenizeResult::BadResponse;
  }
  return EngineTokenizeResult::Ok;
}

EngineTokenCache::Key EngineTokenCache::key_of(std::string_view tokenize_body) {
  const XXH128_hash_t h = XXH3_128bits(tokenize_body.data(), tokenize_body.size());
  return Key{h.low64, h.high64};
}

bool EngineTokenCache::get(const Key& key, std::vector<TokenId>& out) {
  if (budget_ == 0) return false;
  std::lock_guard lk(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  lru_.splice(lru_.begin(), lru_, it->second);
  out.assign(it->second->tokens.begin(), it->second->tokens.end());
  return true;
}

void EngineTokenCache::put(const Key& key, const std::vector<TokenId>& tokens) {
  if (cost(tokens) > budget_ / 8) return;
  std::lock_guard lk(mu_);
  if (index_.count(key)) return;
  lru_.push_front(Entry{key, tokens});
  index_.emplace(key, lru_.begin());
  bytes_ += cost(tokens);
  while (bytes_ > budget_ && !lru_.empty()) {
    bytes_ -= cost(lru_.back().tokens);
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

uint64_t EngineTokenCache::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

size_t EngineTokenCache::size() const {
  std::lock_guard lk(mu_);
  return index_.size();
}

bool EngineTokenizeBackoff::backs_off(EngineTokenizeResult r) {
  return r == EngineTokenizeResult::Connect || r == EngineTokenizeResult::Timeout ||
         r == EngineTokenizeResult::Status || r == EngineTokenizeResult::BadResponse;
}

std::string EngineTokenizeBackoff::key(std::string_view model, bool chat) {
  std::string k(model);
  k += chat ? "\x01" "chat" : "\x01" "prompt";
  return k;
}

bool EngineTokenizeBackoff::allow(std::string_view model, bool chat, Clock::time_point now) const {
  std::lock_guard lk(mu_);
  if (states_.empty()) return true;
  auto it = states_.find(key(model, chat));
  return it == states_.end() || now >= it->second.until;
}

void EngineTokenizeBackoff::on_failure(std::string_view model, bool chat, Clock::time_point now) {
  std::lock_guard lk(mu_);
  if (states_.size() >= kMaxKeys) states_.clear();
  State& s = states_[key(model, chat)];
  const auto wait = std::min<std::chrono::milliseconds>(kFirst * (1u << std::min<uint32_t>(s.failures, 16)), kMax);
  s.failures = std::min<uint32_t>(s.failures + 1, 64);
  s.until = now + wait;
}

void EngineTokenizeBackoff::on_success(std::string_view model, bool chat) {
  std::lock_guard lk(mu_);
  if (states_.empty()) return;
  auto it = states_.find(key(model, chat));
  if (it != states_.end()) states_.erase(it);
}

}  // namespace kvroute
