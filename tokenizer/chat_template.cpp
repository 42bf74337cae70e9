// ChatTemplate: loads a model's chat template and renders OpenAI chat requests with the
// vLLM message preprocessing (see chat_template.h).
#include "tokenizer/chat_template.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_internal.h"

namespace kvroute {
namespace {

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

using jinja::Array;
using jinja::Type;
using jinja::Value;

const Value* field(const Value& obj, const char* key) {
  if (obj.type != Type::Object) return nullptr;
  const Value* v = obj.o->get(key);
  return v && v->type != Type::Undefined ? v : nullptr;
}
bool is_null(const Value* v) { return !v || v->type == Type::Null; }
Value str(std::string s) { return Value::string(std::move(s)); }

// vLLM's _parse_chat_message_content_mm_part + _parse_chat_message_content_part: one
// content part -> its text (kind 't'), a media placeholder (kind 'm', *text = modality),
// or nothing (kind 0: a text/refusal part without content).
bool parse_part(const Value& part, char* kind, std::string* text, std::string* error) {
  *kind = 0;
  if (part.type == Type::String) { *kind = 't'; *text = part.str(); return true; }
  if (part.type != Type::Object) { *error = "each content part must be a string or an object"; return false; }
  const Value* type = part.o->get("type");
  bool has_uuid = !is_null(part.o->get("uuid"));
  static const char* kTextKinds[][2] = {{"text", "text"}, {"input_text", "text"}, {"output_text", "text"},
                                        {"refusal", "refusal"}, {"thinking", "thinking"}};
  static const char* kMedia[][2] = {{"image_url", "image"}, {"input_image", "image"}, {"image_embeds", "image"},
                                    {"image_pil", "image"}, {"audio_url", "audio"}, {"input_audio", "audio"},
                                    {"audio_embeds", "audio"}, {"video_url", "video"}};
  if (type && type->type == Type::String && !has_uuid) {
    for (auto& [t, key] : kTextKinds) {
      if (type->str() != t) continue;
      const Value* v = part.o->get(key);
      if (is_null(v)) {
        if (type->str() == "text" || type->str() == "refusal") return true;  // skipped, as vLLM
        *error = std::string("content part of type '") + t + "' has no text";
        return false;
      }
      if (v->type != Type::String) { *error = std::string("content part '") + t + "' must hold a string"; return false; }
      *kind = 't';
      *text = v->str();
      return true;
    }
    for (auto& [t, modality] : kMedia) {
      if (type->str() == t) { *kind = 'm'; *text = modality; return true; }
    }
    if (type->str() == "tool_reference") {
      const Value* n = part.o->get("name");
      if (n && n->type == Type::String) { *kind = 't'; *text = n->str(); return true; }
      *error = "tool_reference part without a name";
      return false;
    }
    *error = "Unsupported chat content part type: '" + type->str() + "'";
    return false;
  }
  if (is_null(type) || has_uuid) {
    static const char* kKeys[][2] = {{"image_url", "image"}, {"image_pil", "image"}, {"image_embeds", "image"},
                                     {"audio_embeds", "audio"}, {"audio_url", "audio"}, {"input_audio", "audio"},
                                     {"video_url", "video"}};
    for (auto& [k, modality] : kKeys) if (part.o->get(k)) { *kind = 'm'; *text = modality; return true; }
    *error = "Missing 'type' field in multimodal part.";
    return false;
  }
  *error = "Invalid 'type' field in multimodal part.";
  return false;
}

// Message content as vLLM hands it to the template: "string" format joins the text parts
// with "\n"; "openai" format keeps a list of {"type": "text", "text"} / {"type": modality}.
bool message_content(const Value* content, bool openai, Value* out, std::string* error) {
  Array parts;
  if (is_null(content)) {
  } else if (content->type == Type::String) {
    parts.push_back(*content);
  } else if (content->type == Type::Array) {
    parts = content->arr();
  } else {
    *error = "message content must be a string, an array of parts or null";
    return false;
  }
  std::string joined;
  Array items;
  bool first = true;
  for (const Value& part : parts) {
    char kind;
    std::string text;
    if (!parse_part(part, &kind, &text, error)) return false;
    if (!kind) continue;
    if (openai) {
      auto o = std::make_shared<jinja::Object>();
      if (kind == 't') { o->set("type", str("text")); o->set("text", str(std::move(text))); }
      else o->set("type", str(std::move(text)));
      items.push_back(Value::object(std::move(o)));
      continue;
    }
    if (kind == 'm') { *error = "multimodal content needs the engine's multimodal processor"; return false; }
    if (!first) joined += '\n';
    joined += text;
    first = false;
  }
  *out = openai ? Value::array(std::move(items)) : str(std::move(joined));
  return true;
}

// A tool call as the request model validates it (TypedDict fields in declaration order:
// id, function{arguments, name}, type; other keys dropped), arguments then parsed as
// vLLM's _postprocess_messages does (a JSON string -> its value, invalid -> {}).
Value tool_call(const Value& call) {
  if (call.type != Type::Object) return call;
  auto o = std::make_shared<jinja::Object>();
  if (const Value* id = call.o->get("id")) o->set("id", *id);
  if (const Value* fn = call.o->get("function"); fn && fn->type == Type::Object) {
    auto f = std::make_shared<jinja::Object>();
    const Value* args = fn->o->get("arguments");
    Value parsed = Value::new_object();
    if (args && args->type == Type::String) {
      std::string perr;
      if (!jinja::value_from_json(args->str(), &parsed, &perr)) parsed = Value::new_object();
    } else if (args && (args->type == Type::Object || args->type == Type::Array)) {
      parsed = *args;
    }
    f->set("arguments", std::move(parsed));
    if (const Value* name = fn->o->get("name")) f->set("name", *name);
    o->set("function", Value::object(std::move(f)));
  }
  if (const Value* type = call.o->get("type")) o->set("type", *type);
  return Value::object(std::move(o));
}

// vLLM's _parse_chat_message_content for one message.
bool conversation_message(const Value& m, bool openai, Value* out, std::string* error) {
  if (m.type != Type::Object) { *error = "each message must be an object"; return false; }
  const Value* role = field(m, "role");
  if (!role || role->type != Type::String) { *error = "each message needs a string \"role\""; return false; }
  const std::string& r = role->str();
  auto msg = std::make_shared<jinja::Object>();
  msg->set("role", *role);
  Value content;
  if (!message_content(field(m, "content"), openai, &content, error)) return false;
  if (r == "tool" && content.type == Type::Array) {
    bool all_text = true;
    std::string joined;
    for (size_t i = 0; i < content.arr().size(); ++i) {
      const Value* t = content.arr()[i].o->get("type");
      if (!t || t->str() != "text") { all_text = false; break; }
      if (i) joined += '\n';
      joined += content.arr()[i].o->get("text")->str();
    }
    if (all_text) content = str(std::move(joined));
  }
  msg->set("content", std::move(content));
  if (r == "assistant") {
    if (const Value* calls = field(m, "tool_calls"); !is_null(calls)) {
      if (calls->type != Type::Array) { *error = "tool_calls must be an array"; return false; }
      if (!calls->arr().empty()) {
        Array items;
        for (const Value& c : calls->arr()) items.push_back(tool_call(c));
        msg->set("tool_calls", Value::array(std::move(items)));
      }
    }
    if (const Value* reasoning = field(m, "reasoning"); !is_null(reasoning)) {
      msg->set("reasoning", *reasoning);
      msg->set("reasoning_content", *reasoning);
    }
  } else if (r == "tool") {
    if (const Value* id = field(m, "tool_call_id")) msg->set("tool_call_id", *id);
  }
  if (const Value* name = field(m, "name"); name && name->type == Type::String) msg->set("name", *name);
  if (const Value* task = field(m, "task"); task && task->type == Type::String) msg->set("task", *task);
  if (r == "developer") {
    const Value* tools = field(m, "tools");
    msg->set("tools", tools ? *tools : Value::null());
  }
  *out = Value::object(std::move(msg));
  return true;
}

// ChatCompletionToolsParam(...).model_dump(): type, function{name, description, parameters,
// extra keys in request order}, then the tool's extra keys (extra="allow").
bool normalize_tool(const Value& tool, Value* out, std::string* error) {
  if (tool.type != Type::Object) { *error = "each tool must be an object"; return false; }
  const Value* type = tool.o->get("type");
  if (type && !(type->type == Type::String && type->str() == "function")) { *error = "tool type must be \"function\""; return false; }
  const Value* fn = tool.o->get("function");
  if (!fn || fn->type != Type::Object) { *error = "each tool needs a \"function\" object"; return false; }
  const Value* name = fn->o->get("name");
  if (!name || name->type != Type::String) { *error = "tool function needs a string \"name\""; return false; }
  const Value* desc = fn->o->get("description");
  if (desc && desc->type != Type::String && desc->type != Type::Null) { *error = "tool description must be a string"; return false; }
  const Value* params = fn->o->get("parameters");
  if (params && params->type != Type::Object && params->type != Type::Null) { *error = "tool parameters must be an object"; return false; }
  auto f = std::make_shared<jinja::Object>();
  f->set("name", *name);
  f->set("description", desc ? *desc : Value::null());
  f->set("parameters", params ? *params : Value::null());
  for (auto& [k, v] : fn->o->items) if (k != "name" && k != "description" && k != "parameters") f->set(k, v);
  auto t = std::make_shared<jinja::Object>();
  t->set("type", str("function"));
  t->set("function", Value::object(std::move(f)));
  for (auto& [k, v] : tool.o->items) if (k != "type" && k != "function") t->set(k, v);
  *out = Value::object(std::move(t));
  return true;
}

bool read_bool(const Value& body, const char* key, bool def, bool* out, std::string* error) {
  *out = def;
  const Value* v = field(body, key);
  if (is_null(v)) return true;
  if (v->type != Type::Bool) { *error = std::string("\"") + key + "\" must be a boolean"; return false; }
  *out = v->b;
  return true;
}

// transformers: cut the prompt right after the final message's text.
bool continue_final(const Value& last_content, std::string* out, std::string* error) {
  std::string final_text;
  if (last_content.type == Type::String) {
    final_text = last_content.str();
  } else if (last_content.type == Type::Array) {
    bool found = false;
    for (auto it = last_content.arr().rbegin(); it != last_content.arr().rend(); ++it) {
      const Value* t = it->type == Type::Object ? it->o->get("text") : nullptr;
      if (t && t->type == Type::String) { final_text = t->str(); found = true; break; }
    }
    if (!found) { *error = "continue_final_message is set but we could not find any text to continue in the final message!"; return false; }
  } else {
    *error = "continue_final_message: the final message has no text";
    return false;
  }
  std::string_view stripped = jinja::py_strip(final_text, true, true);
  size_t loc = out->rfind(stripped);
  if (loc == std::string::npos) {
    *error = "continue_final_message is set but the final message does not appear in the chat after applying the chat template!";
    return false;
  }
  std::string_view lstripped = jinja::py_strip(final_text, true, false);
  if (lstripped.size() == final_text.size() && out->compare(loc, final_text.size(), final_text) == 0)
    out->resize(loc + final_text.size());
  else
    out->resize(loc + stripped.size());
  return true;
}

}  // namespace

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;

std::unique_ptr<ChatTemplate> ChatTemplate::load(const std::string& dir, std::string* error) {
  std::string source, cfg_text;
  bool have_source = read_file(dir + "/chat_template.jinja", &source);
  auto ct = std::unique_ptr<ChatTemplate>(new ChatTemplate());
  Value cfg;
  std::string jerr;
  // Parsed with the template JSON reader: tokenizer_config.json may hold integers beyond
  // 64 bits (model_max_length), which it reads as doubles like JSON.parse.
  if (read_file(dir + "/tokenizer_config.json", &cfg_text)) {
    if (!jinja::value_from_json(cfg_text, &cfg, &jerr)) { *error = dir + "/tokenizer_config.json: " + jerr; return nullptr; }
  }
  auto token_text = [&](const char* key) -> std::optional<std::string> {
    const Value* t = field(cfg, key);
    if (t && t->type == Type::String) return t->str();
    if (t) if (const Value* c = field(*t, "content"); c && c->type == Type::String) return c->str();
    return std::nullopt;
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
    if (auto t = token_text(key)) ct->special_tokens_.emplace_back(key, *t);
  if (!have_source) {
    if (const Value* t = field(cfg, "chat_template")) {
      if (t->type == Type::String) {
        source = t->str();
        have_source = true;
      } else if (t->type == Type::Array) {
        for (const Value& item : t->arr()) {
          const Value* name = field(item, "name");
          const Value* tpl = field(item, "template");
          if (name && name->type == Type::String && name->str() == "default" && tpl && tpl->type == Type::String) {
            source = tpl->str();
            have_source = true;
          }
        }
        if (!have_source) { *error = dir + ": chat_template list has no \"default\" entry"; return nullptr; }
      }
    }
  }
  if (!have_source) { *error = dir + ": no chat_template.jinja and no chat_template in tokenizer_config.json"; return nullptr; }
  std::string perr;
  ct->template_ = jinja::Template::parse(source, &perr);
  if (!ct->template_) { *error = dir + ": " + perr; return nullptr; }
  ct->openai_content_ = ct->template_->iterates_message_content();
  return ct;
}

bool ChatTemplate::render(std::string_view context_json, std::string* out, std::string* error) const {
  return template_->render_json(context_json, out, error);
}

bool ChatTemplate::render_request(std::string_view body_json, std::string* out, std::string* error) const {
  Value body;
  if (!jinja::value_from_json(body_json, &body, error)) return false;
  if (body.type != Type::Object) { *error = "request body must be a JSON object"; return false; }
  const Value* messages = field(body, "messages");
  if (!messages || messages->type != Type::Array) { *error = "\"messages\" must be an array"; return false; }
  Array msgs;
  for (const Value& m : messages->arr()) {
    Value msg;
    if (!conversation_message(m, openai_content_, &msg, error)) return false;
    msgs.push_back(std::move(msg));
  }
  bool add_generation_prompt, continue_final_message;
  if (!read_bool(body, "add_generation_prompt", true, &add_generation_prompt, error)) return false;
  if (!read_bool(body, "continue_final_message", false, &continue_final_message, error)) return false;
  if (continue_final_message && add_generation_prompt) {
    *error = "Cannot set both `continue_final_message` and `add_generation_prompt` to True.";
    return false;
  }
  Value tools = Value::null();
  if (const Value* t = field(body, "tools"); !is_null(t)) {
    if (t->type != Type::Array) { *error = "\"tools\" must be an array"; return false; }
    Array items;
    for (const Value& tool : t->arr()) {
      Value n;
      if (!normalize_tool(tool, &n, error)) return false;
      items.push_back(std::move(n));
    }
    tools = Value::array(std::move(items));
  }
  const Value* docs = field(body, "documents");
  // vLLM's kwargs (add_generation_prompt, continue_final_message, tools, documents), then
  // chat_template_kwargs over them; transformers adds the special tokens under the kwargs.
  Value ctx = Value::new_object();
  ctx.o->set("messages", Value::array(std::move(msgs)));
  ctx.o->set("tools", std::move(tools));
  ctx.o->set("documents", docs ? *docs : Value::null());
  ctx.o->set("add_generation_prompt", Value::boolean(add_generation_prompt));
  for (auto& [k, v] : special_tokens_) ctx.o->set(k, str(v));
  if (const Value* kw = field(body, "chat_template_kwargs"); !is_null(kw)) {
    if (kw->type != Type::Object) { *error = "\"chat_template_kwargs\" must be an object"; return false; }
    for (const auto& [k, v] : kw->o->items) {
      if (k == "chat_template" || k == "tokenize") { *error = "Found unexpected chat template kwargs from request: {'" + k + "'}"; return false; }
      if (k == "messages" || k == "conversation") { *error = "chat_template_kwargs may not set \"" + k + "\""; return false; }
      if (k == "continue_final_message") { continue_final_message = jinja::truthy(v); continue; }
      // apply_chat_template's own parameters are consumed by it, not passed to the template.
      static const char* kParams[] = {"padding", "truncation", "max_length", "return_tensors", "return_dict",
                                      "return_assistant_tokens_mask", "tokenizer_kwargs"};
      if (std::any_of(std::begin(kParams), std::end(kParams), [&](const char* p) { return k == p; })) continue;
      ctx.o->set(k, v);
    }
  }
  if (continue_final_message && jinja::truthy(*ctx.o->get("add_generation_prompt"))) {
    *error = "continue_final_message and add_generation_prompt are not compatible.";
    return false;
  }
  if (!template_->render(ctx, out, error)) return false;
  const Array& rendered_msgs = ctx.o->get("messages")->arr();
  if (continue_final_message && !rendered_msgs.empty()) {
    const Value* content = rendered_msgs.back().type == Type::Object ? rendered_msgs.back().o->get("content") : nullptr;
    if (!continue_final(content ? *content : Value::null(), out, error)) return false;
  }
  return true;
}

}  // namespace kvroute
