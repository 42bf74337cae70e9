#!/usr/bin/env python3
"""Seeded generator of tricky OpenAI chat requests for the Jinja differential test
(tests/tokenizer/jinja_python_reference.sh): system prompts, multi-turn, tools whose
schemas hold Python floats (0.0, 1e-05, 1e+16, -0.0), integers beyond 2^53 and 2^64,
numeric keys and nested schemas, reasoning with edge whitespace, content parts (text,
image), null content, tool calls (arguments as JSON strings, objects, invalid, empty),
tool results, continue_final_message, chat_template_kwargs, and out-of-range JSON
numbers (1e400) anywhere in the body.
Usage: gen_conversations.py SEED COUNT > conversations.jsonl
Each line: {"name": "gen_<seed>_<i>", "body": "<request JSON text>"}.
"""
import json
import random
import sys

WORDS = ["hello", "world", "naïve", "café", "数据", "日本語", "😀", "🎉", "ß", "Ǆ", "straße", "O'Brien", '"quoted"',
         "back\\slash", "tab\there", "a\u3000b", "x\x1cy", "line\r\nbreak", "<tag>", "{{ not jinja }}", "{% raw %}",
         "50%", "%s", "λ", "Ωmega", "İstanbul", "ﬁ", "\u2028", "\u00a0nbsp", "end."]
FLOATS = ["0.0", "-0.0", "1e-05", "1e+16", "1e16", "2.0", "2.5", "1E5", "0.1", "123456789.125", "1e-7", "3.14159",
          "1.7976931348623157e308", "5e-324", "1e400", "-1e400", "100.0", "1.5e300"]
INTS = ["0", "-0", "1", "-7", "9007199254740993", "18446744073709551616", "12345678901234567890123", "-9223372036854775809",
        "42", "9223372036854775807"]


def text(r, lo=1, hi=8):
    return " ".join(r.choice(WORDS) for _ in range(r.randint(lo, hi)))


def edge_ws(r, s):
    pre = r.choice(["", "\n", "\n\n", " ", "\t", "\u3000", " \n "])
    post = r.choice(["", "\n", "\n\n", " ", "\t", "\u3000", "\n  "])
    return pre + s + post


def number(r):
    return "@@" + r.choice(FLOATS + INTS) + "@@"


def schema(r, depth=0):
    kind = r.choice(["string", "number", "integer", "object", "array", "boolean"] if depth < 2 else ["string", "number"])
    s = {"type": kind}
    if r.random() < 0.5:
        s["description"] = text(r, 1, 4)
    if kind in ("number", "integer"):
        if r.random() < 0.7:
            s["minimum"] = number(r)
        if r.random() < 0.5:
            s["maximum"] = number(r)
        if r.random() < 0.3:
            s["default"] = number(r)
    if kind == "object":
        props = {}
        for k in range(r.randint(1, 4)):
            key = r.choice(["city", "unit", "10", "2", "1", "0", "x", "ключ", "b", "a"]) + ("" if r.random() < 0.7 else str(k))
            props[key] = schema(r, depth + 1)
        s["properties"] = props
        s["required"] = list(props)[: r.randint(0, len(props))]
    if kind == "array":
        s["items"] = schema(r, depth + 1)
    if kind == "string" and r.random() < 0.3:
        s["enum"] = [text(r, 1, 1) for _ in range(3)]
    return s


def tool(r):
    fn = {"name": r.choice(["get_weather", "search", "calc", "lookup_ïd"])}
    if r.random() < 0.7:
        fn["description"] = text(r, 2, 6)
    if r.random() < 0.9:
        fn["parameters"] = schema(r) if r.random() < 0.3 else {"type": "object", "properties": {"q": schema(r), "n": schema(r)}, "required": ["q"]}
    if r.random() < 0.15:
        fn["strict"] = True
    t = {"type": "function", "function": fn} if r.random() < 0.9 else {"function": fn}
    if r.random() < 0.1:
        t["extra_field"] = number(r)
    return t


def arguments(r):
    c = r.random()
    obj = {"q": text(r, 1, 3), "n": number(r), "10": number(r), "2": [number(r), None, True], "nested": {"z": number(r), "a": text(r, 1, 2)}}
    if c < 0.55:
        return json.dumps(obj, ensure_ascii=r.random() < 0.5).replace('"@@', '').replace('@@"', '')
    if c < 0.75:
        return obj
    return r.choice(["", "not json", "   ", "null", "[1, 2.0]", "{\"a\": 1e400}", None, "5"])


def content(r, parts_ok):
    c = r.random()
    if c < 0.1:
        return None
    if c < 0.3 and parts_ok:
        parts = []
        for _ in range(r.randint(1, 3)):
            k = r.random()
            if k < 0.75:
                parts.append({"type": "text", "text": text(r)})
            elif k < 0.85:
                parts.append({"type": "text", "text": None})
            else:
                parts.append({"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}})
        return parts
    return edge_ws(r, text(r)) if r.random() < 0.3 else text(r)


def conversation(r, images):
    msgs = []
    alternate = r.random() < 0.5  # no tool-role messages: templates that insist on user/assistant turns
    if r.random() < 0.5:
        msgs.append({"role": "system", "content": content(r, False) or text(r)})
    turns = r.randint(1, 4)
    for t in range(turns):
        msgs.append({"role": "user", "content": content(r, images) or text(r)})
        if t == turns - 1 and r.random() < 0.6:
            break
        a = {"role": "assistant", "content": content(r, False)}
        if r.random() < 0.4:
            a["reasoning"] = edge_ws(r, text(r))
        if r.random() < 0.4:
            calls = []
            for k in range(r.randint(1, 2)):
                calls.append({"id": f"call_{k}", "type": "function", "function": {"name": "get_weather", "arguments": arguments(r)}})
            a["tool_calls"] = calls
            msgs.append(a)
            for k in range(0 if alternate else len(calls)):
                tm = {"role": "tool", "tool_call_id": f"call_{k}", "content": text(r) if r.random() < 0.8 else [{"type": "text", "text": text(r)}, {"type": "text", "text": text(r)}]}
                msgs.append(tm)
            continue
        msgs.append(a)
    body = {"model": "m", "messages": msgs}
    if r.random() < 0.5:
        body["tools"] = [tool(r) for _ in range(r.randint(1, 3))]
    c = r.random()
    if c < 0.12:
        body["messages"].append({"role": "assistant", "content": edge_ws(r, text(r))})
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    elif c < 0.2:
        body["add_generation_prompt"] = False
    if r.random() < 0.3:
        body["chat_template_kwargs"] = {"enable_thinking": r.random() < 0.5}
        if r.random() < 0.2:
            body["chat_template_kwargs"].update({"max_length": 7, "custom_flag": number(r), "tools": None})
    if r.random() < 0.1:
        body["metadata"] = {"big": number(r), "inf": "@@1e400@@"}
    return body


def main():
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    images = len(sys.argv) > 3 and sys.argv[3] == "images"
    r = random.Random(seed)
    for i in range(count):
        body = json.dumps(conversation(r, images), ensure_ascii=r.random() < 0.3)
        body = body.replace('"@@', "").replace('@@"', "")
        print(json.dumps({"name": f"gen_{seed}_{i}", "body": body}, ensure_ascii=False))


if __name__ == "__main__":
    main()
