#include "router/api/responses_request.h"

#include <fmt/format.h>

#include <optional>
#include <unordered_map>

#include "common/json_escape.h"
#include "router/api/json_reader.h"

namespace kvroute {

namespace {

using api::JsonObject;
using api::JsonType;
using api::JsonValue;

// Bounds on what one body may hold (each also bounded by router.max_body_bytes).
// (arrays and objects: api::JsonReader::kMaxElements, 100,000).
constexpr size_t kMaxTools = 10'000;

// Reader levels: 0 the body, 1 `input` / `tools`, 2 one item or tool, 3 its
// content / summary, 4 one part.
enum Level { kBody = 0, kList = 1, kItem = 2, kParts = 3, kPart = 4 };

void append_string(std::string& out, std::string_view s) {
  out += '"';
  json_escape_append(out, s);
  out += '"';
}

// One chat message being built. Items that are chat messages already (user,
// system, developer) pass through as written (`raw`); assistant turns are built,
// because several items (reasoning, output text, function calls) merge into one.
struct Message {
  std::string_view raw;  // a view of the body
  std::string json;      // or the whole message, built here (a tool message)
  std::string role;
  std::optional<std::string> content, reasoning;
  std::vector<std::string> tool_calls;  // JSON of each call
  std::string flat;                      // text for the placeholder tokenizer
};

// The text parts of a content array, joined by "\n" (what routing's placeholder
// tokenizes; the chat template reads the parts themselves).
bool flatten_parts(api::JsonReader& reader, const JsonValue& content, std::string& flat, const std::string& param,
                   ApiError& err) {
  if (content.is(JsonType::String)) {
    flat.assign(content.str);
    return true;
  }
  if (content.null()) return true;
  if (!content.is(JsonType::Array)) return invalid_request(err, "content must be a string or an array of parts", param);
  std::vector<JsonValue> parts;
  if (!reader.array(content.raw, kParts, parts)) return invalid_request(err, "content could not be read", param);
  JsonObject part;
  bool first = true;
  for (size_t j = 0; j < parts.size(); ++j) {
    if (!parts[j].is(JsonType::Object))
      return invalid_request(err, "each content part must be an object", fmt::format("{}[{}]", param, j));
    if (!reader.object(parts[j].raw, kPart, part)) return invalid_request(err, "content part could not be read", param);
    const JsonValue* text = part.get("text");
    if (text == nullptr || !text->is(JsonType::String)) continue;  // images, files: no text to route on
    if (!first) flat += '\n';
    flat.append(text->str);
    first = false;
  }
  return true;
}

// The text of the first element of a list of {"text": ...} objects (a reasoning
// item's content or summary, an output message's content): vLLM takes only the first.
bool read_list(api::JsonReader& reader, const JsonValue& list, std::vector<JsonValue>& elems, const std::string& param,
               ApiError& err) {
  if (!list.is(JsonType::Array) || !reader.array(list.raw, kParts, elems))
    return invalid_request(err, "must be an array of objects with a string 'text'", param);
  return true;
}

bool first_text(api::JsonReader& reader, const std::vector<JsonValue>& elems, std::string& out, const std::string& param,
                ApiError& err) {
  if (elems.empty()) return true;
  if (elems[0].is(JsonType::String)) {
    out.assign(elems[0].str);
    return true;
  }
  JsonObject o;
  if (!elems[0].is(JsonType::Object) || !reader.object(elems[0].raw, kPart, o))
    return invalid_request(err, "must be an array of objects with a string 'text'", param + "[0]");
  const JsonValue* text = o.get("text");
  if (text == nullptr) return true;  // vLLM: item.get("text", "")
  if (!text->is(JsonType::String)) return invalid_request(err, "'text' must be a string", param + "[0].text");
  out.assign(text->str);
  return true;
}

Message* last_assistant(std::vector<Message>& msgs) {
  return !msgs.empty() && msgs.back().raw.empty() && msgs.back().json.empty() && msgs.back().role == "assistant"
             ? &msgs.back()
             : nullptr;
}

// One `input` item -> a new chat message, or a merge into the previous
// assistant message (vLLM's _construct_message_from_response_item).
// A reasoning item (dict form): its first content text, else its first
// summary text, on the last assistant message unless that has reasoning.
bool convert_reasoning(api::JsonReader& reader, const JsonObject& item, const std::string& param,
                       std::vector<Message>& msgs, ApiError& err) {
  std::string text;
  std::vector<JsonValue> content, summary;
  if (!item.absent("content") && !read_list(reader, *item.get("content"), content, param + ".content", err)) return false;
  if (!content.empty()) {
    if (!first_text(reader, content, text, param + ".content", err)) return false;
  } else if (!item.absent("summary")) {
    if (!read_list(reader, *item.get("summary"), summary, param + ".summary", err) ||
        !first_text(reader, summary, text, param + ".summary", err))
      return false;
  }
  if (Message* prev = last_assistant(msgs); prev != nullptr && !prev->reasoning) {
    prev->reasoning = std::move(text);
    return true;
  }
  Message m;
  m.role = "assistant";
  m.reasoning = std::move(text);
  msgs.push_back(std::move(m));
  return true;
}

// A message item: an assistant message (dict form: a string or its first
// part's text, merged into the last assistant message without content), or a
// user, system or developer message handed to the chat preprocessing as is.
bool convert_message(api::JsonReader& reader, const JsonValue& v, const JsonObject& item, const std::string& param,
                     std::vector<Message>& msgs, ApiError& err) {
  const JsonValue* role = item.get("role");
  if (role == nullptr || !role->is(JsonType::String)) return invalid_request(err, "a message item needs a string 'role'", param + ".role");
  const JsonValue* content = item.get("content");
  if (content == nullptr || !(content->is(JsonType::String) || content->is(JsonType::Array)))
    return invalid_request(err, "a message item needs 'content', a string or an array of parts", param + ".content");
  if (role->str == "assistant") {
    // Dict-form assistant message: a string, or the first part's text.
    std::string text;
    std::vector<JsonValue> parts;
    if (content->is(JsonType::String)) text.assign(content->str);
    else if (!read_list(reader, *content, parts, param + ".content", err) ||
             !first_text(reader, parts, text, param + ".content", err))
      return false;
    if (Message* prev = last_assistant(msgs); prev != nullptr && !prev->content) {
      prev->flat = text;
      prev->content = std::move(text);
      return true;
    }
    Message m;
    m.role = "assistant";
    m.flat = text;
    m.content = std::move(text);
    msgs.push_back(std::move(m));
    return true;
  }
  if (role->str != "user" && role->str != "system" && role->str != "developer")
    return invalid_request(err, "'role' must be one of user, assistant, system, developer", param + ".role");
  Message m;
  m.raw = v.raw;  // vLLM hands the item itself to the chat preprocessing
  m.role.assign(role->str);
  if (!flatten_parts(reader, *content, m.flat, param + ".content", err)) return false;
  msgs.push_back(std::move(m));
  return true;
}

bool convert_item(api::JsonReader& reader, const JsonValue& v, size_t i, std::vector<Message>& msgs, ApiError& err) {
  const std::string param = fmt::format("input[{}]", i);
  if (!v.is(JsonType::Object)) return invalid_request(err, "each input item must be an object", param);
  JsonObject item;
  if (!reader.object(v.raw, kItem, item)) return invalid_request(err, "input item could not be read", param);
  std::string_view type = "message";
  if (const JsonValue* t = item.get("type"); t != nullptr && !t->null()) {
    if (!t->is(JsonType::String)) return invalid_request(err, "'type' must be a string", param + ".type");
    type = t->str;
  }
  auto string_field = [&](std::string_view key, bool required, std::string& out) {
    const JsonValue* f = item.get(key);
    if (f == nullptr || f->null()) {
      if (required) return invalid_request(err, fmt::format("a {} item needs a string '{}'", type, key), param + "." + std::string(key));
      return true;
    }
    if (!f->is(JsonType::String)) return invalid_request(err, fmt::format("'{}' must be a string", key), param + "." + std::string(key));
    out.assign(f->str);
    return true;
  };

  if (type == "function_call") {
    std::string call_id, name, arguments, ns;
    if (!string_field("call_id", true, call_id) || !string_field("name", true, name) ||
        !string_field("arguments", true, arguments) || !string_field("namespace", false, ns))
      return false;
    if (!ns.empty()) name = ns + "__" + name;  // tool_parsers/utils.py flat_namespace_tool_name
    std::string call = "{\"id\":";
    append_string(call, call_id);
    call += ",\"type\":\"function\",\"function\":{\"name\":";
    append_string(call, name);
    call += ",\"arguments\":";
    append_string(call, arguments);
    call += "}}";
    if (Message* prev = last_assistant(msgs)) {
      prev->tool_calls.push_back(std::move(call));
      return true;
    }
    Message m;
    m.role = "assistant";
    m.tool_calls.push_back(std::move(call));
    msgs.push_back(std::move(m));
    return true;
  }
  if (type == "function_call_output") {
    std::string call_id;
    if (!string_field("call_id", true, call_id)) return false;
    const JsonValue* output = item.get("output");
    if (output == nullptr || !(output->is(JsonType::String) || output->is(JsonType::Array)))
      return invalid_request(err, "a function_call_output item needs 'output', a string or an array of parts", param + ".output");
    Message m;
    m.role = "tool";
    if (!flatten_parts(reader, *output, m.flat, param + ".output", err)) return false;
    std::string json = "{\"role\":\"tool\",\"content\":";
    json += output->raw;
    json += ",\"tool_call_id\":";
    append_string(json, call_id);
    json += '}';
    m.json = std::move(json);
    msgs.push_back(std::move(m));
    return true;
  }
  if (type == "reasoning") return convert_reasoning(reader, item, param, msgs, err);
  if (type != "message")
    return invalid_request(err, fmt::format("input items of type '{}' are not supported (kvroute routes message, function_call, "
                                 "function_call_output and reasoning items)",
                                 type),
                param + ".type");
  return convert_message(reader, v, item, param, msgs, err);
}

void write_message(const Message& m, std::string& out) {
  if (!m.raw.empty() || !m.json.empty()) {
    out += m.raw.empty() ? std::string_view(m.json) : m.raw;
    return;
  }
  out += "{\"role\":";
  append_string(out, m.role);
  if (m.content) {
    out += ",\"content\":";
    append_string(out, *m.content);
  }
  if (m.reasoning) {
    out += ",\"reasoning\":";
    append_string(out, *m.reasoning);
  }
  if (!m.tool_calls.empty()) {
    out += ",\"tool_calls\":[";
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      if (i) out += ',';
      out += m.tool_calls[i];
    }
    out += ']';
  }
  out += '}';
}

// A function tool as vLLM hands it to the template: FunctionTool.model_dump()
// without `type`, validated as FunctionDefinition (name, description,
// parameters, then the rest in order: strict, then the client's extra keys).
bool convert_tool(api::JsonReader& reader, const JsonValue& v, size_t i, std::string& out, bool& wrote, ApiError& err) {
  const std::string param = fmt::format("tools[{}]", i);
  JsonObject tool;
  if (!v.is(JsonType::Object) || !reader.object(v.raw, kItem, tool)) return invalid_request(err, "each tool must be an object", param);
  const JsonValue* type = tool.get("type");
  if (type == nullptr || !type->is(JsonType::String)) return invalid_request(err, "each tool needs a string 'type'", param + ".type");
  if (type->str != "function") return true;  // built-in tools (web_search, mcp, ...) are not rendered
  const JsonValue* name = tool.get("name");
  if (name == nullptr || !name->is(JsonType::String)) return invalid_request(err, "a function tool needs a string 'name'", param + ".name");
  const JsonValue* desc = tool.get("description");
  if (desc != nullptr && !desc->null() && !desc->is(JsonType::String))
    return invalid_request(err, "'description' must be a string", param + ".description");
  const JsonValue* params = tool.get("parameters");
  if (params != nullptr && !params->null() && !params->is(JsonType::Object))
    return invalid_request(err, "'parameters' must be an object", param + ".parameters");
  const JsonValue* strict = tool.get("strict");
  if (strict != nullptr && !strict->null() && !strict->is(JsonType::Bool))
    return invalid_request(err, "'strict' must be a boolean", param + ".strict");
  if (wrote) out += ',';
  wrote = true;
  out += "{\"type\":\"function\",\"function\":{\"name\":";
  out += name->raw;
  out += ",\"description\":";
  out += desc != nullptr ? desc->raw : "null";
  out += ",\"parameters\":";
  out += params != nullptr ? params->raw : "null";
  out += ",\"strict\":";
  out += strict != nullptr ? strict->raw : "null";
  // The other keys in order of first appearance, each with its last value (Python's
  // json.loads of a duplicate key); linear in the fields.
  std::unordered_map<std::string_view, size_t> last;
  for (size_t k = 0; k < tool.fields.size(); ++k) last[tool.fields[k].key] = k;
  for (const auto& f : tool.fields) {
    if (f.key == "type" || f.key == "name" || f.key == "description" || f.key == "parameters" || f.key == "strict") continue;
    auto it = last.find(f.key);
    if (it == last.end()) continue;  // written at its first appearance
    out += ',';
    append_string(out, f.key);
    out += ':';
    out += tool.fields[it->second].value.raw;
    last.erase(it);
  }
  out += "}}";
  return true;
}

// Whether the final message is to be continued (responses/utils.py
// should_continue_final_message): the last item is a message or reasoning item
// whose status is in_progress or incomplete.
bool continue_final(api::JsonReader& reader, const std::vector<JsonValue>& items) {
  if (items.empty() || !items.back().is(JsonType::Object)) return false;
  JsonObject last;
  if (!reader.object(items.back().raw, kItem, last)) return false;
  std::string_view type = "message";
  if (const JsonValue* t = last.get("type"); t != nullptr && t->is(JsonType::String)) type = t->str;
  if (type != "message" && type != "reasoning") return false;
  const JsonValue* status = last.get("status");
  return status != nullptr && status->is(JsonType::String) && (status->str == "in_progress" || status->str == "incomplete");
}

// The request's scalar fields into `out`: model, stream, cache_salt,
// max_output_tokens, priority, the session key, previous_response_id.
bool parse_scalars(const JsonObject& o, ParsedRequest& out, ApiError& err) {
  const JsonValue* model = o.get("model");
  if (model == nullptr || model->null()) return invalid_request(err, "you must provide a model parameter", "model");
  if (!model->is(JsonType::String)) return invalid_request(err, "'model' must be a string", "model");
  out.model.assign(model->str);
  if (const JsonValue* v = o.get("stream"); v != nullptr && !v->null()) {
    if (!v->is(JsonType::Bool)) return invalid_request(err, "'stream' must be a boolean", "stream");
    out.stream = v->boolean;
  }
  if (const JsonValue* v = o.get("cache_salt"); v != nullptr && !v->null()) {
    if (!v->is(JsonType::String) || v->str.empty())
      return invalid_request(err, "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt");
    out.cache_salt.assign(v->str);
  }
  if (const JsonValue* v = o.get("max_output_tokens"); v != nullptr && !v->null()) {
    const auto n = v->integer();
    if (!n || *n < 1) return invalid_request(err, "'max_output_tokens' must be a positive integer", "max_output_tokens");
    out.max_tokens = static_cast<uint64_t>(*n);
  }
  if (const JsonValue* v = o.get("priority"); v != nullptr && !v->null()) {
    const auto n = v->integer();
    if (!n) return invalid_request(err, "'priority' must be an integer", "priority");
    out.priority = *n;
  }
  // The session key: prompt_cache_key (OpenAI's cache-routing hint; vLLM ignores
  // it), else the end-user id.
  for (const char* key : {"user", "prompt_cache_key"}) {
    if (const JsonValue* v = o.get(key); v != nullptr && !v->null()) {
      if (!v->is(JsonType::String)) return invalid_request(err, fmt::format("'{}' must be a string", key), key);
      out.user.assign(v->str);
    }
  }
  if (const JsonValue* v = o.get("previous_response_id"); v != nullptr && !v->null()) {
    if (!v->is(JsonType::String)) return invalid_request(err, "'previous_response_id' must be a string", "previous_response_id");
    out.previous_response_id.assign(v->str);
  }
  if (!o.absent("previous_response") && !out.previous_response_id.empty())
    return invalid_request(err, "Cannot set both 'previous_response_id' and 'previous_response'.", "previous_response");
  if (!o.absent("prompt")) return invalid_request(err, "prompt template is not supported", "prompt");
  return true;
}

// The conversation vLLM builds: instructions as a system message, then the
// input (a string, or items converted one by one); `cont` when the final
// item continues an assistant message; reasoning.effort as written (JSON).
bool collect_messages(api::JsonReader& reader, const JsonObject& o, std::vector<Message>& msgs, bool& cont,
                      std::string& effort, bool& has_effort, ApiError& err) {
  std::string instructions;
  if (const JsonValue* v = o.get("instructions"); v != nullptr && !v->null()) {
    if (!v->is(JsonType::String)) return invalid_request(err, "'instructions' must be a string", "instructions");
    instructions.assign(v->str);
  }
  if (const JsonValue* v = o.get("reasoning"); v != nullptr && !v->null()) {
    JsonObject r;
    if (!v->is(JsonType::Object) || !reader.object(v->raw, kList, r)) return invalid_request(err, "'reasoning' must be an object", "reasoning");
    if (const JsonValue* e = r.get("effort"); e != nullptr && !e->null()) {
      if (!e->is(JsonType::String)) return invalid_request(err, "'effort' must be a string", "reasoning.effort");
      effort.assign(e->raw);  // as written (a JSON string)
      has_effort = true;
    }
  }

  // Messages: instructions, then the input.
  if (!instructions.empty()) {
    Message m;
    m.role = "system";
    m.content = instructions;
    m.flat = instructions;
    msgs.push_back(std::move(m));
  }
  const JsonValue* input = o.get("input");
  if (input == nullptr || input->null()) return invalid_request(err, "'input' is required", "input");
  if (input->is(JsonType::String)) {
    Message m;
    m.role = "user";
    m.content.emplace(input->str);
    m.flat.assign(input->str);
    msgs.push_back(std::move(m));
  } else if (input->is(JsonType::Array)) {
    std::vector<JsonValue> items;
    if (!reader.array(input->raw, kList, items)) return invalid_request(err, "'input' could not be read", "input");
    for (size_t i = 0; i < items.size(); ++i)
      if (!convert_item(reader, items[i], i, msgs, err)) return false;
    cont = continue_final(reader, items);
  } else {
    return invalid_request(err, "'input' must be a string or an array of items", "input");
  }
  if (msgs.empty()) return invalid_request(err, "'input' must not be empty", "input");
  return true;
}

// The OpenAI chat body vLLM renders: model, messages, function tools, the
// generation-prompt flags, reasoning_effort for the template. Also fills
// out.messages.
bool write_chat_body(api::JsonReader& reader, const JsonObject& o, std::vector<Message>& msgs, bool cont,
                     const std::string& effort, bool has_effort, ParsedRequest& out, std::string& chat_body,
                     ApiError& err) {
  chat_body = "{\"model\":";
  append_string(chat_body, out.model);
  chat_body += ",\"messages\":[";
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (i) chat_body += ',';
    write_message(msgs[i], chat_body);
    out.messages.push_back(ChatMessage{msgs[i].role, std::move(msgs[i].flat)});
  }
  chat_body += ']';
  if (const JsonValue* v = o.get("tools"); v != nullptr && !v->null()) {
    std::vector<JsonValue> tools;
    if (!v->is(JsonType::Array) || !reader.array(v->raw, kList, tools)) return invalid_request(err, "'tools' must be an array", "tools");
    if (tools.size() > kMaxTools) return invalid_request(err, fmt::format("'tools' holds more than {} tools", kMaxTools), "tools");
    std::string rendered;
    bool wrote = false;
    for (size_t i = 0; i < tools.size(); ++i)
      if (!convert_tool(reader, tools[i], i, rendered, wrote, err)) return false;
    if (wrote) chat_body += ",\"tools\":[" + rendered + "]";  // no function tool: None, as vLLM's `if not tools`
  }
  chat_body += cont ? ",\"add_generation_prompt\":false,\"continue_final_message\":true"
                    : ",\"add_generation_prompt\":true,\"continue_final_message\":false";
  if (has_effort) chat_body += ",\"chat_template_kwargs\":{\"reasoning_effort\":" + effort + "}";
  chat_body += '}';
  return true;
}

bool parse_fields(std::string_view body, ParsedRequest& out, std::string& chat_body, ApiError& err) {
  out.reset();
  out.kind = ApiKind::ChatCompletions;
  chat_body.clear();
  api::JsonReader& reader = api::thread_json_reader();
  std::string error;
  if (!reader.load(body, &error)) return invalid_request(err, std::move(error), "");
  JsonObject o;
  if (!reader.root(o)) return invalid_request(err, "The request body could not be read.", "");
  if (!parse_scalars(o, out, err)) return false;
  std::vector<Message> msgs;
  bool cont = false;
  std::string effort;  // reasoning.effort, passed to the template as reasoning_effort
  bool has_effort = false;
  if (!collect_messages(reader, o, msgs, cont, effort, has_effort, err)) return false;
  if (!write_chat_body(reader, o, msgs, cont, effort, has_effort, out, chat_body, err)) return false;
  out.body = chat_body;
  return true;
}

}  // namespace

bool parse_responses_request(std::string_view body, ParsedRequest& out, std::string& chat_body, ApiError& err) {
  return api::finish_body(parse_fields(body, out, chat_body, err), err);
}

}  // namespace kvroute
