#!/usr/bin/python3
"""Reference renderer for the Jinja differential test: Debian's python3-jinja2 configured as
transformers configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, the `generation` tag, `tojson` = json.dumps(ensure_ascii=False), globals
raise_exception and strftime_now), with vLLM's request preprocessing in front
(vllm/entrypoints/chat_utils.py and the OpenAI protocol models, rewritten from reading them).

Usage:
  py_reference.py chat MODEL_DIR CONVERSATIONS.jsonl OUT.jsonl   (exit 3: no chat template)
      CONVERSATIONS lines: {"name", "body": <request JSON text>} or {"name", "request": <object>};
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
                    body = case["body"] if "body" in case else json.dumps(case["request"])
                    out.write(json.dumps(result(lambda: render_request(env, template, fmt, tokens, body))) + "\n")
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
