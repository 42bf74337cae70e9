#!/usr/bin/python3
"""Reference renderer for the Jinja differential test: Debian's python3-jinja2 configured as
transformers configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, the `generation` tag, `tojson` = json.dumps(ensure_ascii=False), globals
raise_exception and strftime_now), with vLLM's request preprocessing in front
(vllm/entrypoints/chat_utils.py and the OpenAI protocol models, rewritten from reading them).

Usage:
  py_reference.py chat MODEL_DIR CONVERSATIONS.jsonl OUT.jsonl   (exit 3: no chat template)
      CONVERSATIONS lines: {"name", "body": <request JSON text>} or {"name", "request": <object>};
      with "api": "responses" or "messages" the body is an OpenAI Responses or Anthropic Messages
      request, converted to the chat request first as vLLM converts it (responses_to_chat,
      messages_to_chat);
      OUT lines {"ok", "text"|"error"}
  py_reference.py templates CASES.jsonl OUT.jsonl
      CASES lines: {"template": str, "context": <JSON text>}
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

assert jinja2.__file__.startswith("/usr/lib/python3/"), "run with Debian's python3-jinja2 (/usr/bin/python3)"


# ---------------------------------------------------------------- transformers' environment
class AssistantTracker(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.datetime.now().strftime(format)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ---------------------------------------------------------------- vLLM: content format detection
def _is_var_access(node, varname):
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == varname


def _is_attr_access(node, varname, key):
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_var_access(node.node, varname) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var_access(node.node, varname) and node.attr == key
    return False


def _is_var_or_elems_access(node, varname, key=None):
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems_access(node.node, varname, key)
    return _is_attr_access(node, varname, key) if key else _is_var_access(node, varname)


def detect_content_format(env, source):
    try:
        ast = env.parse(source)
    except Exception:
        return "string"
    names = ["messages"]
    i = 0
    while i < len(names):
        for assign in ast.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems_access(assign.node, names[i]) and isinstance(assign.target, jinja2.nodes.Name):
                if assign.target.name != names[i]:
                    names.append(assign.target.name)
        i += 1
    message_vars = []
    for loop in ast.find_all(jinja2.nodes.For):
        if any(_is_var_or_elems_access(loop.iter, n) for n in names) and isinstance(loop.target, jinja2.nodes.Name):
            message_vars.append(loop.target.name)
    for loop in ast.find_all(jinja2.nodes.For):
        if any(_is_var_or_elems_access(loop.iter, m, "content") for m in message_vars):
            return "openai"
    return "string"


# ---------------------------------------------------------------- vLLM: message preprocessing
TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}
MEDIA = {"image_url": "image", "input_image": "image", "image_embeds": "image", "image_pil": "image",
         "audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio", "video_url": "video"}


def parse_part(part):
    """-> ("text", str) | ("media", modality) | None (skipped)."""
    if isinstance(part, str):
        return ("text", part)
    part_type = part.get("type")
    uuid = part.get("uuid")
    if isinstance(part_type, str) and uuid is None and (part_type in TEXT_KEYS or part_type in MEDIA or part_type == "tool_reference"):
        if part_type in TEXT_KEYS:
            content = part.get(TEXT_KEYS[part_type])
            if content is None and part_type in ("text", "refusal"):
                return None
            if not isinstance(content, str):
                raise ValueError("content part without text")
            return ("text", content)
        if part_type == "tool_reference":
            return ("text", part["name"])
        return ("media", MEDIA[part_type])
    if part_type is None or uuid is not None:
        for key in ("image_url", "image_pil", "image_embeds", "audio_embeds", "audio_url", "input_audio", "video_url"):
            if key in part:
                return ("media", MEDIA[key])
        raise ValueError("Missing 'type' field in multimodal part.")
    raise ValueError("Unsupported chat content part type")


def tool_call_model(call):
    # ChatCompletionMessageToolCallParam (TypedDict) as validated: id, function{arguments, name}, type.
    out = {}
    if "id" in call:
        out["id"] = call["id"]
    if isinstance(call.get("function"), dict):
        fn = call["function"]
        out["function"] = {k: fn[k] for k in ("arguments", "name") if k in fn}
    if "type" in call:
        out["type"] = call["type"]
    return out


def parse_message(message, content_format):
    role = message["role"]
    content = message.get("content")
    if content is None:
        content = []
    elif isinstance(content, str):
        content = [{"type": "text", "text": content}]
    parsed = [p for p in (parse_part(part) for part in content) if p is not None]
    if content_format == "openai":
        result = {"role": role, "content": [{"type": "text", "text": v} if k == "text" else {"type": v} for k, v in parsed]}
    else:
        if any(k == "media" for k, _ in parsed):
            raise ValueError("multimodal content needs the engine's multimodal processor")
        result = {"role": role, "content": "\n".join(v for _, v in parsed)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            result["tool_calls"] = [tool_call_model(c) for c in message["tool_calls"]]
        if message.get("reasoning") is not None:
            result["reasoning"] = message["reasoning"]
            result["reasoning_content"] = message["reasoning"]
    elif role == "tool":
        if "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        if isinstance(result["content"], list):
            items = result["content"]
            if not any(isinstance(i, dict) and i.get("type") != "text" for i in items):
                texts = [i.get("text", "") for i in items if isinstance(i, dict) and i.get("type") == "text"]
                result["content"] = "\n".join(texts) if texts else ""
    if "name" in message and isinstance(message["name"], str):
        result["name"] = message["name"]
    if "task" in message and isinstance(message["task"], str):
        result["task"] = message["task"]
    if role == "developer":
        result["tools"] = message.get("tools", None)
    return result


def postprocess(messages):
    for message in messages:
        if message["role"] == "assistant" and "tool_calls" in message:
            calls = message["tool_calls"]
            if not isinstance(calls, list):
                continue
            if len(calls) == 0:
                message.pop("tool_calls")
                continue
            for item in calls:
                args = item["function"].get("arguments")
                if isinstance(args, str):
                    try:
                        item["function"]["arguments"] = json.loads(args)
                    except json.JSONDecodeError:
                        item["function"]["arguments"] = {}
                elif not isinstance(args, (dict, list)):
                    item["function"]["arguments"] = {}


def tool_model_dump(tool):
    # ChatCompletionToolsParam(extra="allow").model_dump(): declared fields, then extras.
    fn = tool["function"]
    f = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
    f.update({k: v for k, v in fn.items() if k not in f})
    out = {"type": tool.get("type", "function"), "function": f}
    out.update({k: v for k, v in tool.items() if k not in out})
    return out


def special_tokens(model_dir):
    try:
        cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
    except OSError:
        return {}, None
    tokens = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        t = cfg.get(key)
        if isinstance(t, dict):
            t = t.get("content")
        if isinstance(t, str):
            tokens[key] = t
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):
        tpl = next((t["template"] for t in tpl if t.get("name") == "default"), None)
    return tokens, tpl


def render_request(env, template, content_format, tokens, body):
    req = json.loads(body)
    conversation = [parse_message(m, content_format) for m in req["messages"]]
    postprocess(conversation)
    add_generation_prompt = req.get("add_generation_prompt", True)
    continue_final_message = req.get("continue_final_message", False)
    if continue_final_message and add_generation_prompt:
        raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    tools = None if req.get("tools") is None else [tool_model_dump(t) for t in req["tools"]]
    kwargs = dict(add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                  tools=tools, documents=req.get("documents"))
    kwargs.update(req.get("chat_template_kwargs") or {})
    # transformers' apply_chat_template -> render_jinja_template
    tools = kwargs.pop("tools")
    documents = kwargs.pop("documents")
    add_generation_prompt = kwargs.pop("add_generation_prompt")
    continue_final_message = kwargs.pop("continue_final_message")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
    # apply_chat_template's own parameters are consumed, not passed to the template.
    for param in ("padding", "truncation", "max_length", "return_tensors", "return_dict",
                  "return_assistant_tokens_mask", "tokenizer_kwargs"):
        kwargs.pop(param, None)
    template_kwargs = {**tokens, **kwargs}
    rendered = template.render(messages=conversation, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **template_kwargs)
    if continue_final_message:
        final_message = conversation[-1]["content"]
        if isinstance(final_message, (list, tuple)):
            for block in reversed(final_message):
                if "text" in block:
                    final_message = block["text"]
                    break
            else:
                raise ValueError("no text to continue")
        if final_message.strip() not in rendered:
            raise ValueError("final message not in the prompt")
        loc = rendered.rindex(final_message.strip())
        if rendered[loc: loc + len(final_message.lstrip())] == final_message:
            rendered = rendered[: loc + len(final_message.lstrip())]
        else:
            rendered = rendered[: loc + len(final_message.strip())]
    return rendered


# ---------------------------------------------------------------- vLLM: Responses and Messages APIs
# Rewritten from reading vllm/entrypoints/openai/responses/serving.py (_make_request, commit
# 0001948bc769), responses/utils.py (construct_input_messages, construct_tool_dicts; 01ca842df5b1),
# responses/protocol.py (010a69cea9ac: function_call items become ResponseFunctionToolCall,
# should_continue_final_message), vllm/entrypoints/anthropic/serving.py
# (_convert_anthropic_to_openai_request, 0001948bc769) and anthropic/protocol.py (00589e563e77).
def responses_to_chat(req):
    messages = []
    if req.get("instructions"):
        messages.append({"role": "system", "content": req["instructions"]})
    items = req["input"]
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    else:
        for item in items:
            prev = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
            kind = item.get("type")
            if kind == "function_call":
                name = item["name"] if not item.get("namespace") else f"{item['namespace']}__{item['name']}"
                call = {"id": item["call_id"], "function": {"name": name, "arguments": item["arguments"]}, "type": "function"}
                if prev is not None:
                    prev.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "tool_calls": [call]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")})
            elif kind == "reasoning":
                text = ""
                if item.get("content"):
                    first = list(item["content"])[0]
                    text = first.get("text", "") if isinstance(first, dict) else first
                elif item.get("summary"):
                    first = list(item["summary"])[0]
                    text = first.get("text", "") if isinstance(first, dict) else first
                if prev is not None and prev.get("reasoning") is None:
                    prev["reasoning"] = text
                else:
                    messages.append({"role": "assistant", "reasoning": text})
            elif item.get("role") == "assistant":
                content = item.get("content")
                if isinstance(content, str):
                    text = content
                elif content:
                    first = list(content)[0]
                    text = first.get("text", "") if isinstance(first, dict) else first
                else:
                    text = ""
                if prev is not None and prev.get("content") is None:
                    prev["content"] = text
                else:
                    messages.append({"role": "assistant", "content": text})
            else:
                messages.append(item)
    tools = []
    for t in req.get("tools") or []:
        if t["type"] != "function":
            continue
        # FunctionTool.model_dump() without "type", validated as FunctionDefinition.
        dumped = {"name": t["name"], "parameters": t.get("parameters"), "strict": t.get("strict"),
                  "description": t.get("description")}
        dumped.update({k: v for k, v in t.items() if k not in dumped and k != "type"})
        fn = {"name": dumped["name"], "description": dumped["description"], "parameters": dumped["parameters"]}
        fn.update({k: v for k, v in dumped.items() if k not in fn})
        tools.append({"type": "function", "function": fn})
    last = items[-1] if isinstance(items, list) and items else None
    cont = (isinstance(last, dict) and last.get("type", "message") in ("message", "reasoning")
            and last.get("status") in ("in_progress", "incomplete"))
    chat = {"model": req["model"], "messages": messages, "add_generation_prompt": not cont,
            "continue_final_message": cont}
    if tools:
        chat["tools"] = tools
    effort = (req.get("reasoning") or {}).get("effort")
    if effort is not None:
        chat["chat_template_kwargs"] = {"reasoning_effort": effort}
    return chat


BILLING = "x-anthropic-billing-header"


def _image_url(source):
    if source.get("type") == "url":
        return source.get("url", "")
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def messages_to_chat(req):
    if not req.get("model") or not isinstance(req.get("max_tokens"), int) or req["max_tokens"] <= 0:
        raise ValueError("invalid Messages request")
    for m in req["messages"]:
        if m["role"] in ("ctx", "msg"):
            m["role"] = "user"
    out, system = [], []
    if req.get("system"):
        if isinstance(req["system"], str):
            system.append(req["system"])
        else:
            system += [b["text"] for b in req["system"] if b["type"] == "text" and b.get("text") and not b["text"].startswith(BILLING)]
    for m in req["messages"]:
        if m["role"] != "system":
            continue
        if isinstance(m["content"], str):
            system.append(m["content"])
        else:
            system += [b["text"] for b in m["content"] if b["type"] == "text" and b.get("text") and not b["text"].startswith(BILLING)]
    if system:
        out.append({"role": "system", "content": "".join(system)})
    for m in req["messages"]:
        if m["role"] == "system":
            continue
        msg = {"role": m["role"]}
        if isinstance(m["content"], str):
            msg["content"] = m["content"]
        else:
            parts, calls, reasoning = [], [], []
            for b in m["content"]:
                t = b["type"]
                if t == "text" and b.get("text"):
                    parts.append({"type": "text", "text": b["text"]})
                elif t == "image" and b.get("source"):
                    parts.append({"type": "image_url", "image_url": {"url": _image_url(b["source"])}})
                elif t == "thinking" and b.get("thinking") is not None:
                    reasoning.append(b["thinking"])
                elif t == "tool_use":
                    calls.append({"id": b.get("id") or "call_0", "type": "function",
                                  "function": {"name": b.get("name") or "", "arguments": json.dumps(b.get("input") or {})}})
                elif t == "tool_result" and m["role"] == "user":
                    texts, images, refs = [], [], []
                    content = b.get("content")
                    if isinstance(content, list):
                        for it in content:
                            if it.get("type") == "text":
                                texts.append(it.get("text", ""))
                            elif it.get("type") == "image":
                                url = _image_url(it.get("source", {}))
                                if url:
                                    images.append(url)
                            elif it.get("type") == "tool_reference":
                                name = it.get("tool_name") or it.get("name")
                                if name:
                                    refs.append({"type": "tool_reference", "name": name})
                        content = "\n".join(texts)
                    out.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": content or ""})
                    if images:
                        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
                    if refs:
                        out.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": refs})
                elif t == "tool_result":
                    parts.append({"type": "text", "text": f"Tool result: {str(b.get('content')) if b.get('content') else ''}"})
            if reasoning:
                msg["reasoning"] = "".join(reasoning)
            if calls:
                msg["tool_calls"] = calls
            if parts:
                msg["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
        if not (msg["role"] == "user" and "content" not in msg):
            out.append(msg)
    chat = {"model": req["model"], "messages": out}
    if req.get("tools") is not None:
        tools = []
        for t in req["tools"]:
            schema = t["input_schema"]
            if "type" not in schema:
                schema["type"] = "object"
            tools.append({"type": "function", "function": {"name": t["name"], "description": t.get("description"),
                                                           "parameters": schema, "defer_loading": t.get("defer_loading")}})
        chat["tools"] = tools
    if req.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = req["chat_template_kwargs"]
    return chat


def api_body(case):
    body = case["body"] if "body" in case else json.dumps(case["request"])
    api = case.get("api")
    if api is None:
        return body
    req = json.loads(body)
    return json.dumps(responses_to_chat(req) if api == "responses" else messages_to_chat(req))


def result(fn):
    try:
        return {"ok": True, "text": fn()}
    except Exception as e:  # a template error, a bad request: both must fail
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def main():
    env = environment()
    if sys.argv[1] == "chat":
        model_dir, conv_path, out_path = sys.argv[2:5]
        tokens, source = special_tokens(model_dir)
        jinja_path = os.path.join(model_dir, "chat_template.jinja")
        if os.path.exists(jinja_path):
            source = open(jinja_path).read()
        if not source:
            sys.exit(3)
        template = env.from_string(source)
        fmt = detect_content_format(env, source)
        with open(conv_path) as f, open(out_path, "w") as out:
            for line in f:
                if line.strip():
                    case = json.loads(line)
                    out.write(json.dumps(result(lambda: render_request(env, template, fmt, tokens, api_body(case)))) + "\n")
        print(f"content format: {fmt}")
    else:
        cases_path, out_path = sys.argv[2:4]
        with open(cases_path) as f, open(out_path, "w") as out:
            for line in f:
                if not line.strip():
                    continue
                case = json.loads(line)
                out.write(json.dumps(result(lambda: env.from_string(case["template"]).render(**json.loads(case["context"])))) + "\n")


if __name__ == "__main__":
    main()
