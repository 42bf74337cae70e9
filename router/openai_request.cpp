#include "router/openai_request.h"

#include <fmt/format.h>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <simdjson.h>

#include "common/json_escape.h"
#include "common/json_numbers.h"

namespace kvroute {

namespace dom = simdjson::dom;

namespace {

dom::parser& thread_parser() {
  thread_local dom::parser p;
  return p;
}

}  // namespace

bool invalid_request(ApiError& err, std::string message, std::string param) {
  err.status = 400;
  err.type = "invalid_request_error";
  err.message = std::move(message);
  err.param = std::move(param);
  err.code.clear();
  return false;
}

namespace {

// Flattens a chat message's content the way vLLM does: a string as is, an
// array of parts as the concatenation of its text parts, null as "".
bool flatten_content(dom::element content, std::string& out, ApiError& err, size_t index) {
  const std::string param = fmt::format("messages[{}].content", index);
  if (content.is_null()) return true;
  if (content.is_string()) {
    out = std::string(content.get_string().value_unsafe());
    return true;
  }
  if (!content.is_array()) return invalid_request(err, "content must be a string, an array of parts, or null", param);
  dom::array parts = content.get_array().value_unsafe();
  bool first = true;
  for (dom::element part : parts) {
    if (!part.is_object()) return invalid_request(err, "each content part must be an object", param);
    dom::object po = part.get_object().value_unsafe();
    auto type = po.at_key("type");
    if (type.error() || !type.value_unsafe().is_string())
      return invalid_request(err, "each content part needs a string 'type'", param);
    if (type.value_unsafe().get_string().value_unsafe() != "text") continue;  // images etc. do not tokenize here
    auto text = po.at_key("text");
    if (text.error() || !text.value_unsafe().is_string())
      return invalid_request(err, "a text content part needs a string 'text'", param);
    if (!first) out += '\n';
    out += text.value_unsafe().get_string().value_unsafe();
    first = false;
  }
  return true;
}

constexpr uint64_t kMaxChoices = 128;

// Token ids of one prompt into out.prompt_tokens.
bool parse_tokens(dom::array arr, const char* name, ParsedRequest& out, ApiError& err) {
  out.has_prompt_tokens = true;
  out.prompt_tokens.reserve(arr.size());
  for (dom::element t : arr) {
    if (!t.is_uint64() || t.get_uint64().value_unsafe() > 0xffffffffull)
      return invalid_request(err, fmt::format("token ids in '{}' must be integers in [0, 2^32)", name), name);
    out.prompt_tokens.push_back(static_cast<TokenId>(t.get_uint64().value_unsafe()));
  }
  return true;
}

// A completion's `prompt` or an embedding's `input`: a string, token ids, or a
// batch (an array of strings or of token-id arrays, all of one kind). A batch
// is routed on its first prompt; the others are checked and counted.
bool parse_prompt(dom::element p, const char* name, ParsedRequest& out, ApiError& err) {
  if (p.is_string()) {
    out.prompt_text.assign(p.get_string().value_unsafe());
    return true;
  }
  const auto what = fmt::format("'{}' must be a string, an array of strings, token ids, or arrays of token ids", name);
  if (!p.is_array()) return invalid_request(err, what, name);
  dom::array arr = p.get_array().value_unsafe();
  if (arr.size() == 0) return invalid_request(err, fmt::format("'{}' must not be empty", name), name);
  dom::element first = arr.at(0).value_unsafe();
  if (!first.is_string() && !first.is_array()) return parse_tokens(arr, name, out, err);  // one prompt of ids
  for (dom::element e : arr) {
    if (e.is_string() != first.is_string() || e.is_array() != first.is_array()) return invalid_request(err, what, name);
    if (!e.is_array()) continue;
    const dom::array ids = e.get_array().value_unsafe();
    if (ids.size() == 0) return invalid_request(err, fmt::format("a prompt in '{}' must not be empty", name), name);
    for (dom::element t : ids)
      if (!t.is_uint64() || t.get_uint64().value_unsafe() > 0xffffffffull)
        return invalid_request(err, fmt::format("token ids in '{}' must be integers in [0, 2^32)", name), name);
  }
  out.prompts = static_cast<uint32_t>(std::min<size_t>(arr.size(), UINT32_MAX));
  if (first.is_string()) {
    out.prompt_text.assign(first.get_string().value_unsafe());
    return true;
  }
  return parse_tokens(first.get_array().value_unsafe(), name, out, err);
}

// A thread's parser keeps the capacity of the largest body it parsed (its
// string buffer and tape are several times the body): after a body larger
// than this it is replaced, so one 8 MiB body does not pin that much on every
// io thread for good.
constexpr size_t kKeptParserCapacity = 1 << 20;

bool parse_request_fields(ApiKind kind, std::string_view body, ParsedRequest& out, ApiError& err);

}  // namespace

bool parse_openai_request(ApiKind kind, std::string_view body, ParsedRequest& out, ApiError& err) {
  const bool ok = parse_request_fields(kind, body, out, err);  // copies what it needs out of the document
  if (thread_parser().capacity() > kKeptParserCapacity) thread_parser() = dom::parser();
  return ok;
}

size_t json_parser_capacity() { return thread_parser().capacity(); }

namespace {

// The output budget, as vLLM reads it: chat's `max_completion_tokens` over
// its `max_tokens`, unset = up to the context (nullopt); a completion's
// `max_tokens` defaults to 16; an embedding generates nothing. Only the
// proxy's wait for an answer that is not streamed reads it
// (router/proxy_policy.h); a value that is not a count is left to the engine
// to refuse.
std::optional<uint64_t> output_budget(ApiKind kind, dom::object o) {
  if (kind == ApiKind::Embeddings) return 0;
  auto count = [&](const char* key) -> std::optional<uint64_t> {
    if (auto mt = o.at_key(key); !mt.error() && mt.value_unsafe().is_uint64())
      return mt.value_unsafe().get_uint64().value_unsafe();
    return std::nullopt;
  };
  if (kind == ApiKind::ChatCompletions)
    if (auto n = count("max_completion_tokens")) return n;
  if (auto n = count("max_tokens")) return n;
  if (kind == ApiKind::Completions) return 16;
  return std::nullopt;
}

bool parse_request_fields(ApiKind kind, std::string_view body, ParsedRequest& out, ApiError& err) {
  out.reset();
  out.kind = kind;
  out.body = body;
  auto doc = thread_parser().parse(body.data(), body.size(), true);
  // Numbers beyond 64 bits / the double range are valid for Python's json (vLLM, SGLang):
  // the routing fields are read from a copy with them replaced; out.body keeps the original.
  thread_local std::string in_range;
  if ((doc.error() == simdjson::NUMBER_ERROR) &&
      replace_out_of_range_numbers(body, &in_range))
    doc = thread_parser().parse(in_range.data(), in_range.size(), true);
  if (in_range.capacity() > kKeptParserCapacity) std::string().swap(in_range);  // the document owns no view into it
  if (doc.error())
    return invalid_request(err, fmt::format("We could not parse the JSON body of your request ({}).",
                                 simdjson::error_message(doc.error())),
                "");
  dom::element root = doc.value_unsafe();
  if (!root.is_object()) return invalid_request(err, "The request body must be a JSON object.", "");
  dom::object o = root.get_object().value_unsafe();

  auto model = o.at_key("model");
  if (model.error()) return invalid_request(err, "you must provide a model parameter", "model");
  if (!model.value_unsafe().is_string()) return invalid_request(err, "'model' must be a string", "model");
  out.model.assign(model.value_unsafe().get_string().value_unsafe());

  if (auto stream = o.at_key("stream"); !stream.error() && !stream.value_unsafe().is_null()) {
    if (!stream.value_unsafe().is_bool()) return invalid_request(err, "'stream' must be a boolean", "stream");
    out.stream = stream.value_unsafe().get_bool().value_unsafe();
  }
  // vLLM's extension: whether the tokenizer adds special tokens (BOS).
  if (auto ast = o.at_key("add_special_tokens"); !ast.error() && !ast.value_unsafe().is_null()) {
    if (!ast.value_unsafe().is_bool())
      return invalid_request(err, "'add_special_tokens' must be a boolean", "add_special_tokens");
    out.add_special_tokens = ast.value_unsafe().get_bool().value_unsafe();
  }
  // vLLM's per-tenant prefix cache isolation: enters the first block's hash.
  if (auto salt = o.at_key("cache_salt"); !salt.error() && !salt.value_unsafe().is_null()) {
    if (!salt.value_unsafe().is_string() || salt.value_unsafe().get_string().value_unsafe().empty())
      return invalid_request(err, "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt");
    out.cache_salt.assign(salt.value_unsafe().get_string().value_unsafe());
  }
  if (auto pl = o.at_key("prompt_logprobs"); !pl.error() && !pl.value_unsafe().is_null()) out.prompt_logprobs = true;
  // vLLM's `priority` (lower is served earlier, default 0; vllm/entrypoints/
  // openai/chat_completion/protocol.py): the router's band (router/flow/).
  if (auto pr = o.at_key("priority"); !pr.error() && !pr.value_unsafe().is_null()) {
    if (!pr.value_unsafe().is_int64()) return invalid_request(err, "'priority' must be an integer", "priority");
    out.priority = pr.value_unsafe().get_int64().value_unsafe();
  }
  // OpenAI's end-user id: the session key when no x-session-id header is given.
  if (auto user = o.at_key("user"); !user.error() && !user.value_unsafe().is_null()) {
    if (!user.value_unsafe().is_string()) return invalid_request(err, "'user' must be a string", "user");
    out.user.assign(user.value_unsafe().get_string().value_unsafe());
  }

  if (auto n = o.at_key("n"); !n.error() && !n.value_unsafe().is_null()) {
    if (!n.value_unsafe().is_uint64() || n.value_unsafe().get_uint64().value_unsafe() < 1 ||
        n.value_unsafe().get_uint64().value_unsafe() > kMaxChoices)
      return invalid_request(err, fmt::format("'n' must be an integer from 1 to {}", kMaxChoices), "n");
    out.n = static_cast<uint32_t>(n.value_unsafe().get_uint64().value_unsafe());
  }

  out.max_tokens = output_budget(kind, o);
  if (kind == ApiKind::Completions || kind == ApiKind::Embeddings) {
    out.kind = ApiKind::Completions;  // tokenized and routed as a completion prompt
    const char* name = kind == ApiKind::Embeddings ? "input" : "prompt";
    auto prompt = o.at_key(name);
    if (prompt.error() || prompt.value_unsafe().is_null()) return invalid_request(err, fmt::format("'{}' is required", name), name);
    return parse_prompt(prompt.value_unsafe(), name, out, err);
  }

  auto messages = o.at_key("messages");
  if (messages.error()) return invalid_request(err, "'messages' is required", "messages");
  if (!messages.value_unsafe().is_array()) return invalid_request(err, "'messages' must be an array", "messages");
  dom::array msgs = messages.value_unsafe().get_array().value_unsafe();
  if (msgs.size() == 0) return invalid_request(err, "'messages' must not be empty", "messages");
  size_t i = 0;
  for (dom::element m : msgs) {
    if (!m.is_object()) return invalid_request(err, "each message must be an object", fmt::format("messages[{}]", i));
    dom::object mo = m.get_object().value_unsafe();
    ChatMessage cm;
    auto role = mo.at_key("role");
    if (role.error() || !role.value_unsafe().is_string())
      return invalid_request(err, "each message needs a string 'role'", fmt::format("messages[{}].role", i));
    cm.role = std::string(role.value_unsafe().get_string().value_unsafe());
    if (auto content = mo.at_key("content"); !content.error()) {
      if (!flatten_content(content.value_unsafe(), cm.content, err, i)) return false;
    }
    out.messages.push_back(std::move(cm));
    ++i;
  }
  return true;
}

}  // namespace

std::string error_body(const ApiError& e) {
  auto opt = [](const std::string& s) { return s.empty() ? std::string("null") : "\"" + json_escape(s) + "\""; };
  return fmt::format(R"({{"error":{{"message":"{}","type":"{}","param":{},"code":{}}}}})", json_escape(e.message),
                     json_escape(e.type), opt(e.param), opt(e.code));
}

}  // namespace kvroute
