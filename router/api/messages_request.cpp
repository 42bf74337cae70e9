#include "router/api/messages_request.h"

#include <fmt/format.h>

#include <ctime>
#include <memory>

#include "common/json_escape.h"
#include "router/api/json_reader.h"
#include "tokenizer/jinja.h"

namespace kvroute {

namespace {

using api::JsonObject;
using api::JsonType;
using api::JsonValue;

// (arrays and objects: api::JsonReader::kMaxElements, 100,000).
constexpr size_t kMaxTools = 10'000;

// Claude Code's per-request attribution block, which vLLM drops from the system
// prompt (it would defeat prefix caching).
constexpr std::string_view kBillingHeader = "x-anthropic-billing-header";

// Reader levels: 0 the body; 1 `messages`, `system`, `tools`; 2 one message or
// tool; 3 a message's content; 4 one block; 5 a block's content, source or
// input_schema; 6 one element of a tool result's content; 7 its source.
enum Level { kBody = 0, kList = 1, kMessage = 2, kBlocks = 3, kBlock = 4, kInner = 5, kInnerItem = 6, kInnerSource = 7 };

bool fail(ApiError& err, std::string message) {
  err.status = 400;
  err.type = "invalid_request_error";
  err.message = std::move(message);
  err.param.clear();
  err.code.clear();
  return false;
}

void append_string(std::string& out, std::string_view s) {
  out += '"';
  json_escape_append(out, s);
  out += '"';
}

std::string_view trim_right(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A string (or anything else written as is): the URL of an image never reaches
// the prompt's text, so a non-string is kept as its JSON text.
std::string_view text_or_raw(const JsonValue* v) {
  if (v == nullptr) return {};
  return v->is(JsonType::String) ? v->str : trim_right(v->raw);
}

// vLLM's _convert_image_source_to_url: a "url" source's url, else a data URI.
std::string image_url(const JsonObject& source) {
  const JsonValue* type = source.get("type");
  if (type != nullptr && type->is(JsonType::String) && type->str == "url") return std::string(text_or_raw(source.get("url")));
  const JsonValue* media = source.get("media_type");
  std::string url = "data:";
  url += media ? text_or_raw(media) : "image/jpeg";
  url += ";base64,";
  url += text_or_raw(source.get("data"));
  return url;
}

// Python's str() of a JSON value, as vLLM writes `str(block.content)` for a tool
// result inside an assistant message: rendered by kvroute's Jinja (`{{ v }}`
// prints str(v), tokenizer/jinja.h), which reads numbers as Python does.
bool python_str(std::string_view raw, std::string& out) {
  static const std::unique_ptr<jinja::Template> print = [] {
    std::string error;
    return jinja::Template::parse("{{ v }}", &error);
  }();
  std::string context = "{\"v\":";
  context += raw;
  context += '}';
  std::string error;
  return print && print->render_json(context, &out, &error);
}

// One chat message being built: written whole (`whole`: tool messages), or from
// its parts.
struct Message {
  std::string role;
  std::string whole;
  bool has_content = false;
  std::string content;  // JSON: a string or an array of parts
  bool has_reasoning = false;
  std::string reasoning;
  std::string tool_calls;  // JSON array elements, comma-separated
  std::string flat;        // text for the placeholder tokenizer
};

void write_message(const Message& m, std::string& out) {
  if (!m.whole.empty()) {
    out += m.whole;
    return;
  }
  out += "{\"role\":";
  append_string(out, m.role);
  if (m.has_content) {
    out += ",\"content\":";
    out += m.content;
  }
  if (m.has_reasoning) {
    out += ",\"reasoning\":";
    append_string(out, m.reasoning);
  }
  if (!m.tool_calls.empty()) {
    out += ",\"tool_calls\":[";
    out += m.tool_calls;
    out += ']';
  }
  out += '}';
}

Message tool_message(std::string_view call_id, std::string_view content_json, std::string flat) {
  Message m;
  m.role = "tool";
  m.whole = "{\"role\":\"tool\",\"tool_call_id\":";
  append_string(m.whole, call_id);
  m.whole += ",\"content\":";
  m.whole += content_json;
  m.whole += '}';
  m.flat = std::move(flat);
  return m;
}

// Each block's fields as AnthropicContentBlock types them (pydantic refuses the
// request otherwise; so does kvroute).
bool check_block(const JsonObject& b, const std::string& where, ApiError& err) {
  static constexpr std::string_view kTypes[] = {"text",           "image",    "tool_use",         "tool_result",
                                                "tool_reference", "thinking", "redacted_thinking"};
  const JsonValue* type = b.get("type");
  if (type == nullptr || !type->is(JsonType::String)) return fail(err, where + ".type: Field required (a string)");
  bool known = false;
  for (auto t : kTypes) known |= type->str == t;
  if (!known)
    return fail(err, fmt::format("{}.type: Input should be 'text', 'image', 'tool_use', 'tool_result', "
                                 "'tool_reference', 'thinking' or 'redacted_thinking'",
                                 where));
  for (const char* key : {"text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data"})
    if (!b.absent(key) && !b.get(key)->is(JsonType::String))
      return fail(err, fmt::format("{}.{}: Input should be a valid string", where, key));
  for (const char* key : {"source", "input"})
    if (!b.absent(key) && !b.get(key)->is(JsonType::Object))
      return fail(err, fmt::format("{}.{}: Input should be a valid dictionary", where, key));
  if (!b.absent("is_error") && !b.get("is_error")->is(JsonType::Bool))
    return fail(err, where + ".is_error: Input should be a valid boolean");
  if (!b.absent("content") && !b.get("content")->is(JsonType::String) && !b.get("content")->is(JsonType::Array))
    return fail(err, where + ".content: Input should be a valid string or a list of objects");
  return true;
}

std::string_view string_or_empty(const JsonValue* v) {
  return v != nullptr && v->is(JsonType::String) ? v->str : std::string_view();
}

// A tool_result in a user message (vLLM's _convert_user_tool_result): a tool
// message with its text, then a user message with its images, then a tool
// message with its tool references.
bool user_tool_result(api::JsonReader& reader, const JsonObject& b, const std::string& where, std::vector<Message>& out,
                      ApiError& err) {
  std::string text;
  std::string images, refs;  // JSON array elements
  const JsonValue* content = b.get("content");
  if (content != nullptr && content->is(JsonType::String)) {
    text.assign(content->str);
  } else if (content != nullptr && content->is(JsonType::Array)) {
    std::vector<JsonValue> items;
    if (!reader.array(content->raw, kInner, items)) return fail(err, where + ".content could not be read");
    JsonObject item, source;
    bool first = true;
    for (size_t k = 0; k < items.size(); ++k) {
      const std::string at = fmt::format("{}.content.{}", where, k);
      if (!items[k].is(JsonType::Object) || !reader.object(items[k].raw, kInnerItem, item))
        return fail(err, at + ": Input should be a valid dictionary");
      const std::string_view t = string_or_empty(item.get("type"));
      if (t == "text") {
        const JsonValue* tx = item.get("text");
        if (tx != nullptr && !tx->is(JsonType::String)) return fail(err, at + ".text: Input should be a valid string");
        if (!first) text += '\n';
        text.append(string_or_empty(tx));
        first = false;
      } else if (t == "image") {
        const JsonValue* src = item.get("source");
        source.fields.clear();
        if (src != nullptr && (!src->is(JsonType::Object) || !reader.object(src->raw, kInnerSource, source)))
          return fail(err, at + ".source: Input should be a valid dictionary");
        const std::string url = image_url(source);
        if (url.empty()) continue;
        if (!images.empty()) images += ',';
        images += "{\"type\":\"image_url\",\"image_url\":{\"url\":";
        append_string(images, url);
        images += "}}";
      } else if (t == "tool_reference") {
        auto truthy = [](const JsonValue* v) {
          return v != nullptr && !v->null() && !(v->is(JsonType::String) && v->str.empty());
        };
        const JsonValue* name = truthy(item.get("tool_name")) ? item.get("tool_name") : item.get("name");
        if (!truthy(name)) continue;
        if (!name->is(JsonType::String)) return fail(err, at + ".name: Input should be a valid string");
        if (!refs.empty()) refs += ',';
        refs += "{\"type\":\"tool_reference\",\"name\":";
        append_string(refs, name->str);
        refs += '}';
      }
    }
  }
  const std::string_view call_id = string_or_empty(b.get("tool_use_id"));
  std::string text_json;
  append_string(text_json, text);
  out.push_back(tool_message(call_id, text_json, text));
  if (!images.empty()) {
    Message m;
    m.role = "user";
    m.has_content = true;
    m.content = "[" + images + "]";
    out.push_back(std::move(m));
  }
  if (!refs.empty()) out.push_back(tool_message(call_id, "[" + refs + "]", ""));
  return true;
}

// The text of system blocks (top-level `system` or a system message): text
// blocks with text, without Claude Code's billing block.
bool system_blocks(api::JsonReader& reader, const JsonValue& blocks, const std::string& where, std::string& out,
                   size_t& parts, ApiError& err) {
  std::vector<JsonValue> items;
  if (!reader.array(blocks.raw, kBlocks, items)) return fail(err, where + " could not be read");
  JsonObject b;
  for (size_t j = 0; j < items.size(); ++j) {
    const std::string at = fmt::format("{}.{}", where, j);
    if (!items[j].is(JsonType::Object) || !reader.object(items[j].raw, kBlock, b))
      return fail(err, at + ": Input should be a valid dictionary");
    if (!check_block(b, at, err)) return false;
    const std::string_view text = string_or_empty(b.get("text"));
    if (b.get("type")->str != "text" || text.empty() || text.starts_with(kBillingHeader)) continue;
    out.append(text);
    ++parts;
  }
  return true;
}

// One non-system message with content blocks (vLLM's _convert_message_content
// and _convert_block): tool results of a user message become tool messages
// before it; the message keeps its text, images, reasoning and tool calls.
bool convert_blocks(api::JsonReader& reader, std::string_view role, const JsonValue& content, const std::string& where,
                    std::vector<Message>& out, ApiError& err) {
  std::vector<JsonValue> blocks;
  if (!reader.array(content.raw, kBlocks, blocks)) return fail(err, where + " could not be read");
  Message m;
  m.role.assign(role);
  std::string parts;  // content parts, JSON array elements
  size_t n_parts = 0;
  std::string single_text;  // the text when the only part is text
  bool only_text = true;
  JsonObject b, source;
  for (size_t j = 0; j < blocks.size(); ++j) {
    const std::string at = fmt::format("{}.{}", where, j);
    if (!blocks[j].is(JsonType::Object) || !reader.object(blocks[j].raw, kBlock, b))
      return fail(err, at + ": Input should be a valid dictionary");
    if (!check_block(b, at, err)) return false;
    const std::string_view type = b.get("type")->str;
    auto add_text = [&](std::string_view text) {
      if (n_parts++) parts += ',';
      parts += "{\"type\":\"text\",\"text\":";
      append_string(parts, text);
      parts += '}';
      single_text.assign(text);
      if (!m.flat.empty()) m.flat += '\n';
      m.flat.append(text);
    };
    if (type == "text") {
      if (const std::string_view text = string_or_empty(b.get("text")); !text.empty()) add_text(text);
    } else if (type == "image") {
      const JsonValue* src = b.get("source");
      if (src == nullptr || src->null()) continue;
      if (!reader.object(src->raw, kInner, source)) return fail(err, at + ".source: Input should be a valid dictionary");
      if (source.fields.empty()) continue;  // `and block.source`: a non-empty source
      if (n_parts++) parts += ',';
      parts += "{\"type\":\"image_url\",\"image_url\":{\"url\":";
      append_string(parts, image_url(source));
      parts += "}}";
      only_text = false;
    } else if (type == "thinking") {
      if (const JsonValue* t = b.get("thinking"); t != nullptr && !t->null()) {
        m.reasoning.append(t->str);
        m.has_reasoning = true;
      }
    } else if (type == "tool_use") {
      std::string call = "{\"id\":";
      const std::string_view id = string_or_empty(b.get("id"));
      append_string(call, id.empty() ? fmt::format("call_{}", static_cast<long long>(std::time(nullptr))) : id);
      call += ",\"type\":\"function\",\"function\":{\"name\":";
      append_string(call, string_or_empty(b.get("name")));
      // vLLM writes json.dumps(input or {}) and reads it back: the same object.
      call += ",\"arguments\":";
      call += b.absent("input") ? std::string_view("{}") : trim_right(b.get("input")->raw);
      call += "}}";
      if (!m.tool_calls.empty()) m.tool_calls += ',';
      m.tool_calls += call;
    } else if (type == "tool_result") {
      if (role == "user") {
        if (!user_tool_result(reader, b, at, out, err)) return false;
        continue;
      }
      // In an assistant message: "Tool result: " + str(content).
      std::string text = "Tool result: ";
      const JsonValue* c = b.get("content");
      if (c != nullptr && c->is(JsonType::String)) {
        text.append(c->str);
      } else if (c != nullptr && c->is(JsonType::Array) && trim_right(c->raw) != "[]") {
        std::string printed;
        if (!python_str(c->raw, printed)) return fail(err, at + ".content could not be printed");
        text += printed;
      }
      add_text(text);
    }
    // redacted_thinking and tool_reference blocks carry nothing for the prompt.
  }
  if (n_parts > 0) {
    m.has_content = true;
    if (n_parts == 1 && only_text) {
      append_string(m.content, single_text);
    } else {
      m.content = "[" + parts + "]";
    }
  } else if (m.tool_calls.empty() && !m.has_reasoning) {
    if (role == "user") return true;  // nothing left of it (tool results only): not sent
  }
  out.push_back(std::move(m));
  return true;
}

// A tool as vLLM converts it: ChatCompletionToolsParam with a function of name,
// description, parameters (input_schema, "type": "object" added when missing)
// and defer_loading.
bool convert_tool(api::JsonReader& reader, const JsonValue& v, size_t i, std::string& out, ApiError& err) {
  const std::string at = fmt::format("tools.{}", i);
  JsonObject tool, schema;
  if (!v.is(JsonType::Object) || !reader.object(v.raw, kMessage, tool))
    return fail(err, at + ": Input should be a valid dictionary");
  const JsonValue* name = tool.get("name");
  if (name == nullptr || !name->is(JsonType::String)) return fail(err, at + ".name: Field required (a string)");
  const JsonValue* desc = tool.get("description");
  if (desc != nullptr && !desc->null() && !desc->is(JsonType::String))
    return fail(err, at + ".description: Input should be a valid string");
  const JsonValue* input_schema = tool.get("input_schema");
  if (input_schema == nullptr || !input_schema->is(JsonType::Object) || !reader.object(input_schema->raw, kInner, schema))
    return fail(err, at + ".input_schema: Field required (a dictionary)");
  for (const char* key : {"strict", "defer_loading"})
    if (!tool.absent(key) && !tool.get(key)->is(JsonType::Bool))
      return fail(err, fmt::format("{}.{}: Input should be a valid boolean", at, key));
  if (i) out += ',';
  out += "{\"type\":\"function\",\"function\":{\"name\":";
  out += name->raw;
  out += ",\"description\":";
  out += desc != nullptr ? trim_right(desc->raw) : "null";
  out += ",\"parameters\":";
  std::string_view raw = trim_right(input_schema->raw);
  if (schema.get("type") != nullptr) {
    out += raw;
  } else {
    raw.remove_suffix(1);  // the closing brace
    out += raw;
    out += schema.fields.empty() ? "\"type\":\"object\"}" : ",\"type\":\"object\"}";
  }
  out += ",\"defer_loading\":";
  out += tool.absent("defer_loading") ? std::string_view("null") : trim_right(tool.get("defer_loading")->raw);
  out += "}}";
  return true;
}

// The request's scalar fields: model, max_tokens, stream, metadata.user_id
// into `out`; the sampling and tool_choice fields are only checked (the
// engine reads them from the client's body).
bool parse_scalars(api::JsonReader& reader, const JsonObject& o, ParsedRequest& out, ApiError& err) {
  const JsonValue* model = o.get("model");
  if (model == nullptr || !model->is(JsonType::String)) return fail(err, "model: Field required (a string)");
  if (model->str.empty()) return fail(err, "model: Model is required");
  out.model.assign(model->str);
  const JsonValue* max_tokens = o.get("max_tokens");
  if (max_tokens == nullptr) return fail(err, "max_tokens: Field required");
  const auto mt = max_tokens->integer();
  if (!mt) return fail(err, "max_tokens: Input should be a valid integer");
  if (*mt <= 0) return fail(err, "max_tokens: max_tokens must be positive");
  out.max_tokens = static_cast<uint64_t>(*mt);
  if (const JsonValue* v = o.get("stream"); v != nullptr && !v->null()) {
    if (!v->is(JsonType::Bool)) return fail(err, "stream: Input should be a valid boolean");
    out.stream = v->boolean;
  }
  if (const JsonValue* v = o.get("metadata"); v != nullptr && !v->null()) {
    JsonObject meta;
    if (!v->is(JsonType::Object) || !reader.object(v->raw, kList, meta))
      return fail(err, "metadata: Input should be a valid dictionary");
    // Anthropic's end-user id: the session key for session affinity.
    if (const JsonValue* u = meta.get("user_id"); u != nullptr && !u->null()) {
      if (!u->is(JsonType::String)) return fail(err, "metadata.user_id: Input should be a valid string");
      out.user.assign(u->str);
    }
  }
  if (const JsonValue* v = o.get("stop_sequences"); v != nullptr && !v->null()) {
    std::vector<JsonValue> stops;
    if (!v->is(JsonType::Array) || !reader.array(v->raw, kList, stops))
      return fail(err, "stop_sequences: Input should be a valid list");
    for (size_t k = 0; k < stops.size(); ++k)
      if (!stops[k].is(JsonType::String)) return fail(err, fmt::format("stop_sequences.{}: Input should be a valid string", k));
  }
  for (const char* key : {"temperature", "top_p"})
    if (!o.absent(key) && !o.get(key)->is(JsonType::Number))
      return fail(err, fmt::format("{}: Input should be a valid number", key));
  if (!o.absent("top_k") && !o.get("top_k")->integer()) return fail(err, "top_k: Input should be a valid integer");
  if (const JsonValue* v = o.get("tool_choice"); v != nullptr && !v->null()) {
    JsonObject tc;
    if (!v->is(JsonType::Object) || !reader.object(v->raw, kList, tc)) return fail(err, "tool_choice: Input should be a valid dictionary");
    const std::string_view t = string_or_empty(tc.get("type"));
    if (t != "auto" && t != "any" && t != "tool" && t != "none")
      return fail(err, "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'");
    if (!tc.absent("name") && !tc.get("name")->is(JsonType::String)) return fail(err, "tool_choice.name: Input should be a valid string");
    if (t == "tool" && string_or_empty(tc.get("name")).empty())
      return fail(err, "tool_choice: tool_choice.name is required when type is 'tool'");
  }
  if (!o.absent("chat_template_kwargs") && !o.get("chat_template_kwargs")->is(JsonType::Object))
    return fail(err, "chat_template_kwargs: Input should be a valid dictionary");
  return true;
}

// The conversation: the system prompt (`system` and every system message's
// text, in `system`, with the count of its parts) and the other messages,
// converted as vLLM converts them.
bool collect_messages(api::JsonReader& reader, const JsonObject& o, std::string& system, size_t& system_parts,
                      std::vector<Message>& msgs, ApiError& err) {
  // The system prompt: the top-level `system`, then every system message's text.
  // vLLM joins the parts with "" and sends a system message when there is any
  // part (an empty system message's "" is a part).
  if (const JsonValue* v = o.get("system"); v != nullptr && !v->null()) {
    if (v->is(JsonType::String)) {
      system.assign(v->str);
      system_parts += !v->str.empty();  // `if anthropic_request.system:`
    } else if (v->is(JsonType::Array)) {
      if (!system_blocks(reader, *v, "system", system, system_parts, err)) return false;
    } else {
      return fail(err, "system: Input should be a valid string or a list of blocks");
    }
  }
  const JsonValue* messages = o.get("messages");
  if (messages == nullptr || !messages->is(JsonType::Array)) return fail(err, "messages: Field required (a list)");
  std::vector<JsonValue> list;
  if (!reader.array(messages->raw, kList, list)) return fail(err, "messages could not be read");
  if (list.empty()) return fail(err, "messages: at least one message is required");
  JsonObject m;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = fmt::format("messages.{}", i);
    if (!list[i].is(JsonType::Object) || !reader.object(list[i].raw, kMessage, m))
      return fail(err, at + ": Input should be a valid dictionary");
    const JsonValue* role = m.get("role");
    if (role == nullptr || !role->is(JsonType::String)) return fail(err, at + ".role: Field required (a string)");
    std::string_view r = role->str;
    if (r == "ctx" || r == "msg") r = "user";  // Claude Code's non-standard roles (protocol.py normalize_role)
    if (r != "user" && r != "assistant" && r != "system")
      return fail(err, at + ".role: Input should be 'user', 'assistant' or 'system'");
    const JsonValue* content = m.get("content");
    if (content == nullptr || !(content->is(JsonType::String) || content->is(JsonType::Array)))
      return fail(err, at + ".content: Field required (a string or a list of blocks)");
    if (r == "system") {
      if (content->is(JsonType::String)) {
        system.append(content->str);
        ++system_parts;
      } else if (!system_blocks(reader, *content, at + ".content", system, system_parts, err)) {
        return false;
      }
      continue;
    }
    if (content->is(JsonType::String)) {
      Message msg;
      msg.role.assign(r);
      msg.has_content = true;
      append_string(msg.content, content->str);
      msg.flat.assign(content->str);
      msgs.push_back(std::move(msg));
      continue;
    }
    if (!convert_blocks(reader, r, *content, at + ".content", msgs, err)) return false;
  }
  return true;
}

// The OpenAI chat body vLLM renders: the model, the system message (when the
// system prompt has any part) and the messages, the tools, the template's
// kwargs. Also fills out.messages.
bool write_chat_body(api::JsonReader& reader, const JsonObject& o, std::string system, bool has_system,
                     std::vector<Message>& msgs, ParsedRequest& out, std::string& chat_body, ApiError& err) {
  chat_body = "{\"model\":";
  append_string(chat_body, out.model);
  chat_body += ",\"messages\":[";
  bool first = true;
  if (has_system) {
    Message s;
    s.role = "system";
    s.has_content = true;
    append_string(s.content, system);
    s.flat = std::move(system);
    write_message(s, chat_body);
    out.messages.push_back(ChatMessage{s.role, std::move(s.flat)});
    first = false;
  }
  for (auto& msg : msgs) {
    if (!first) chat_body += ',';
    first = false;
    write_message(msg, chat_body);
    out.messages.push_back(ChatMessage{std::move(msg.role), std::move(msg.flat)});
  }
  chat_body += ']';
  if (const JsonValue* v = o.get("tools"); v != nullptr && !v->null()) {
    std::vector<JsonValue> tools;
    if (!v->is(JsonType::Array) || !reader.array(v->raw, kList, tools)) return fail(err, "tools: Input should be a valid list");
    if (tools.size() > kMaxTools) return fail(err, fmt::format("tools: more than {} tools", kMaxTools));
    chat_body += ",\"tools\":[";
    for (size_t i = 0; i < tools.size(); ++i)
      if (!convert_tool(reader, tools[i], i, chat_body, err)) return false;
    chat_body += ']';
  }
  if (!o.absent("chat_template_kwargs")) {
    chat_body += ",\"chat_template_kwargs\":";
    chat_body += trim_right(o.get("chat_template_kwargs")->raw);
  }
  chat_body += '}';
  return true;
}

bool parse_fields(std::string_view body, ParsedRequest& out, std::string& chat_body, ApiError& err) {
  out.reset();
  out.kind = ApiKind::ChatCompletions;
  chat_body.clear();
  api::JsonReader& reader = api::thread_json_reader();
  std::string error;
  if (!reader.load(body, &error)) return fail(err, std::move(error));
  JsonObject o;
  if (!reader.root(o)) return fail(err, "The request body could not be read.");
  if (!parse_scalars(reader, o, out, err)) return false;
  std::string system;
  size_t system_parts = 0;
  std::vector<Message> msgs;
  if (!collect_messages(reader, o, system, system_parts, msgs, err)) return false;
  const bool has_system = system_parts > 0;
  if (msgs.empty() && !has_system) return fail(err, "messages: the request has no message to send");
  if (!write_chat_body(reader, o, std::move(system), has_system, msgs, out, chat_body, err)) return false;
  out.body = chat_body;
  return true;
}

}  // namespace

bool parse_messages_request(std::string_view body, ParsedRequest& out, std::string& chat_body, ApiError& err) {
  return api::finish_body(parse_fields(body, out, chat_body, err), err);
}

std::string anthropic_error_body(const ApiError& e) {
  std::string_view type = "api_error";
  switch (e.status) {
    case 400: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503:
    case 529: type = "overloaded_error"; break;
    default: type = e.status < 500 ? "invalid_request_error" : "api_error";
  }
  std::string out = "{\"type\":\"error\",\"error\":{\"type\":\"";
  out += type;
  out += "\",\"message\":";
  append_string(out, e.message);
  out += "}}";
  return out;
}

}  // namespace kvroute
