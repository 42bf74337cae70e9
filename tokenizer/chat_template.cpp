// ChatTemplate: loads a model's chat template and renders OpenAI chat requests with the
// vLLM message preprocessing (see chat_template.h).
#include "tokenizer/chat_template.h"

#include <cctype>
#include <fstream>
#include <sstream>

#include "tokenizer/jinja.h"

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

using jinja::Type;
using jinja::Value;

const Value* field(const Value& obj, const char* key) {
  if (obj.type != Type::Object) return nullptr;
  const Value* v = obj.o->get(key);
  return v && v->type != Type::Undefined ? v : nullptr;
}

// vLLM's content normalization for text models: a string stays; null or missing -> "";
// an array of parts -> the text of its "text" parts joined with "\n".
bool content_text(const Value* content, std::string* out, std::string* error) {
  out->clear();
  if (!content || content->type == Type::Null) return true;
  if (content->type == Type::String) { *out = content->str(); return true; }
  if (content->type != Type::Array) { *error = "message content must be a string, an array of parts or null"; return false; }
  bool first = true;
  for (const Value& part : content->arr()) {
    if (part.type == Type::String) {  // tolerated: a bare string part
      if (!first) *out += '\n';
      *out += part.str();
      first = false;
      continue;
    }
    const Value* type = field(part, "type");
    const Value* text = field(part, "text");
    if (!type || type->type != Type::String || type->str() != "text") continue;
    if (!text || text->type != Type::String) { *error = "text content part without a string \"text\""; return false; }
    if (!first) *out += '\n';
    *out += text->str();
    first = false;
  }
  return true;
}

bool preprocess_tool_calls(const Value& calls, Value* out, std::string* error) {
  if (calls.type != Type::Array) { *error = "tool_calls must be an array"; return false; }
  jinja::Array items;
  for (const Value& call : calls.arr()) {
    if (call.type != Type::Object) { *error = "tool_calls entries must be objects"; return false; }
    auto copy = std::make_shared<jinja::Object>(*call.o);
    if (const Value* fn = field(call, "function"); fn && fn->type == Type::Object) {
      auto fcopy = std::make_shared<jinja::Object>(*fn->o);
      const Value* args = field(*fn, "arguments");
      if (!args || args->type == Type::Null || (args->type == Type::String && args->str().empty())) {
        fcopy->set("arguments", Value::new_object());
      } else if (args->type == Type::String) {
        Value parsed;
        std::string perr;
        if (!jinja::value_from_json(args->str(), &parsed, &perr)) {
          *error = "tool_calls function.arguments is not valid JSON: " + perr;
          return false;
        }
        fcopy->set("arguments", std::move(parsed));
      }
      copy->set("function", Value::object(std::move(fcopy)));
    }
    items.push_back(Value::object(std::move(copy)));
  }
  *out = Value::array(std::move(items));
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
  ct->bos_token_ = token_text("bos_token");
  ct->eos_token_ = token_text("eos_token");
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

  jinja::Array msgs;
  std::string last_content;
  for (const Value& m : messages->arr()) {
    if (m.type != Type::Object) { *error = "each message must be an object"; return false; }
    const Value* role = field(m, "role");
    if (!role || role->type != Type::String) { *error = "each message needs a string \"role\""; return false; }
    auto msg = std::make_shared<jinja::Object>();
    msg->set("role", *role);
    std::string text;
    if (!content_text(field(m, "content"), &text, error)) return false;
    last_content = text;
    msg->set("content", Value::string(std::move(text)));
    if (const Value* name = field(m, "name")) msg->set("name", *name);
    if (const Value* id = field(m, "tool_call_id")) msg->set("tool_call_id", *id);
    if (const Value* rc = field(m, "reasoning_content")) msg->set("reasoning_content", *rc);
    if (const Value* calls = field(m, "tool_calls"); calls && calls->type != Type::Null && role->str() == "assistant") {
      Value pre;
      if (!preprocess_tool_calls(*calls, &pre, error)) return false;
      msg->set("tool_calls", std::move(pre));
    }
    msgs.push_back(Value::object(std::move(msg)));
  }

  bool add_generation_prompt = true, continue_final = false;
  if (const Value* v = field(body, "add_generation_prompt")) {
    if (v->type != Type::Bool) { *error = "\"add_generation_prompt\" must be a boolean"; return false; }
    add_generation_prompt = v->b;
  }
  if (const Value* v = field(body, "continue_final_message")) {
    if (v->type != Type::Bool) { *error = "\"continue_final_message\" must be a boolean"; return false; }
    continue_final = v->b;
  }
  if (continue_final && add_generation_prompt) {
    *error = "Cannot set both `continue_final_message` and `add_generation_prompt` to True.";
    return false;
  }

  Value ctx = Value::new_object();
  ctx.o->set("messages", Value::array(std::move(msgs)));
  if (const Value* tools = field(body, "tools"); tools && tools->type != Type::Null) ctx.o->set("tools", *tools);
  if (const Value* docs = field(body, "documents"); docs && docs->type != Type::Null) ctx.o->set("documents", *docs);
  ctx.o->set("add_generation_prompt", Value::boolean(add_generation_prompt));
  if (bos_token_) ctx.o->set("bos_token", Value::string(*bos_token_));
  if (eos_token_) ctx.o->set("eos_token", Value::string(*eos_token_));
  if (const Value* kw = field(body, "chat_template_kwargs"); kw && kw->type != Type::Null) {
    if (kw->type != Type::Object) { *error = "\"chat_template_kwargs\" must be an object"; return false; }
    for (const auto& [k, v] : kw->o->items) ctx.o->set(k, v);
  }

  if (!template_->render(ctx, out, error)) return false;
  if (continue_final && !messages->arr().empty() && !last_content.empty()) {
    // transformers: cut the prompt right after the final message's content (retried
    // with the content stripped, for templates that trim it).
    size_t p = out->rfind(last_content);
    size_t len = last_content.size();
    if (p == std::string::npos) {
      std::string_view t = last_content;
      while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
      while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
      p = out->rfind(t);
      len = t.size();
    }
    if (p == std::string::npos) { *error = "continue_final_message: the final message is not in the rendered prompt"; return false; }
    out->resize(p + len);
  }
  return true;
}

}  // namespace kvroute
