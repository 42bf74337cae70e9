#!/usr/bin/env python3
"""Seeded generator of OpenAI Responses and Anthropic Messages requests for the Jinja
differential test (tests/tokenizer/jinja_python_reference.sh, stage 4): instructions /
system (string or blocks, Claude Code's billing block, system messages inside `messages`),
multi-turn, string input vs items vs content blocks, reasoning items and thinking blocks,
function calls and their outputs, tool_use and tool_result blocks (string, text parts,
images, tool references; inside a user and an assistant message), images, tools whose
schemas hold the numbers of gen_conversations.py (1e400, integers beyond 2^64, -0.0),
built-in tools, partial final messages (status incomplete), reasoning effort.
Usage: gen_api_conversations.py SEED COUNT > conversations.jsonl
Each line: {"name": "api_<seed>_<i>", "api": "responses"|"messages", "body": "<request JSON text>"}.
"""
import json
import random
import sys

from gen_conversations import edge_ws, number, schema, text


def maybe_ws(r):
    return edge_ws(r, text(r)) if r.random() < 0.3 else text(r)


def responses_request(r):
    items = []
    turns = r.randint(1, 4)
    for t in range(turns):
        c = r.random()
        if c < 0.4:
            items.append({"role": "user", "content": maybe_ws(r)})
        elif c < 0.7:
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text(r)}
                                                                        for _ in range(r.randint(1, 2))]})
        else:
            items.append({"role": r.choice(["developer", "system"]), "content": text(r)})
            items.append({"role": "user", "content": text(r)})
        if t == turns - 1 and r.random() < 0.5:
            break
        if r.random() < 0.4:
            item = {"type": "reasoning", "id": f"rs_{t}", "summary": []}
            if r.random() < 0.7:
                item["content"] = [{"type": "reasoning_text", "text": edge_ws(r, text(r))}]
            else:
                item["summary"] = [{"type": "summary_text", "text": text(r)}]
            items.append(item)
        if r.random() < 0.7:
            items.append({"type": "message", "role": "assistant", "id": f"msg_{t}", "status": "completed",
                          "content": [{"type": "output_text", "text": maybe_ws(r), "annotations": []}]})
        if r.random() < 0.4:
            calls = r.randint(1, 2)
            for k in range(calls):
                args = json.dumps({"q": text(r, 1, 2), "n": number(r)}).replace('"@@', "").replace('@@"', "")
                items.append({"type": "function_call", "call_id": f"call_{t}_{k}", "name": "get_weather",
                              "arguments": args if r.random() < 0.9 else "not json"})
            for k in range(calls):
                output = text(r) if r.random() < 0.7 else [{"type": "input_text", "text": text(r)}]
                items.append({"type": "function_call_output", "call_id": f"call_{t}_{k}", "output": output})
    body = {"model": "m", "input": items}
    if r.random() < 0.2:
        body["input"] = maybe_ws(r)
    elif r.random() < 0.1:
        items.append({"type": "message", "role": "assistant", "status": "incomplete",
                      "content": [{"type": "output_text", "text": text(r)}]})
    if r.random() < 0.5:
        body["instructions"] = maybe_ws(r)
    if r.random() < 0.5:
        tools = []
        for _ in range(r.randint(1, 3)):
            t = {"type": "function", "name": r.choice(["get_weather", "search", "calc"])}
            if r.random() < 0.7:
                t["description"] = text(r, 2, 5)
            if r.random() < 0.9:
                t["parameters"] = {"type": "object", "properties": {"q": schema(r), "n": schema(r)}}
            if r.random() < 0.3:
                t["strict"] = r.random() < 0.5
            tools.append(t)
        if r.random() < 0.3:
            tools.append({"type": "web_search"})
        body["tools"] = tools
    if r.random() < 0.2:
        body["reasoning"] = {"effort": r.choice(["low", "high"])}
    for key, value in (("stream", True), ("max_output_tokens", 64), ("user", "u1"), ("temperature", 0.5)):
        if r.random() < 0.3:
            body[key] = value
    return body


def block_text(r):
    return {"type": "text", "text": maybe_ws(r)}


def image(r):
    if r.random() < 0.5:
        return {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/x.png"}}
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def messages_request(r, images):
    msgs = []
    turns = r.randint(1, 4)
    pending = []  # tool_use ids awaiting results
    for t in range(turns):
        if pending:
            blocks = []
            for k, tid in enumerate(pending):
                c = r.random()
                if c < 0.4:
                    content = text(r)
                elif c < 0.8:
                    content = [{"type": "text", "text": text(r)} for _ in range(r.randint(1, 2))]
                    if images and r.random() < 0.3:
                        content.append(image(r))
                    if r.random() < 0.2:
                        content.append({"type": "tool_reference", "tool_name": "search"})
                else:
                    content = None
                block = {"type": "tool_result", "tool_use_id": tid}
                if content is not None:
                    block["content"] = content
                blocks.append(block)
            if r.random() < 0.5:
                blocks.append(block_text(r))
            msgs.append({"role": "user", "content": blocks})
            pending = []
        elif r.random() < 0.5:
            msgs.append({"role": r.choice(["user", "user", "ctx"]), "content": maybe_ws(r)})
        else:
            blocks = [block_text(r) for _ in range(r.randint(1, 2))]
            if images and r.random() < 0.3:
                blocks.append(image(r))
            msgs.append({"role": "user", "content": blocks})
        if r.random() < 0.1:
            msgs.append({"role": "system", "content": text(r)})
        if t == turns - 1 and r.random() < 0.6:
            break
        if r.random() < 0.4:
            msgs.append({"role": "assistant", "content": maybe_ws(r)})
            continue
        blocks = []
        if r.random() < 0.4:
            blocks.append({"type": "thinking", "thinking": edge_ws(r, text(r)), "signature": "sig"})
        if r.random() < 0.1:
            blocks.append({"type": "redacted_thinking", "data": "abc"})
        if r.random() < 0.7:
            blocks.append(block_text(r))
        if r.random() < 0.08:
            blocks.append({"type": "tool_result", "tool_use_id": "x",
                           "content": r.choice([text(r), [{"type": "text", "text": text(r)}], [{"n": 1.5, "b": None}]])})
        if r.random() < 0.5:
            for k in range(r.randint(1, 2)):
                tid = f"toolu_{t}_{k}"
                inp = {"city": text(r, 1, 2), "n": number(r), "nested": {"x": number(r)}} if r.random() < 0.8 else {}
                blocks.append({"type": "tool_use", "id": tid, "name": "get_weather", "input": inp})
                pending.append(tid)
        msgs.append({"role": "assistant", "content": blocks})
    body = {"model": "m", "max_tokens": 128, "messages": msgs}
    c = r.random()
    if c < 0.3:
        body["system"] = maybe_ws(r)
    elif c < 0.6:
        blocks = [block_text(r) for _ in range(r.randint(1, 3))]
        if r.random() < 0.5:
            blocks.insert(0, {"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0.0; cch=abc123;"})
        body["system"] = blocks
    if r.random() < 0.5 or pending:
        tools = []
        for name in ("get_weather", "search")[: r.randint(1, 2)]:
            t = {"name": name, "input_schema": schema(r) if r.random() < 0.3 else {"properties": {"q": schema(r)}}}
            if r.random() < 0.7:
                t["description"] = text(r, 2, 5)
            if r.random() < 0.2:
                t["defer_loading"] = r.random() < 0.5
            tools.append(t)
        body["tools"] = tools
    if r.random() < 0.2:
        body["chat_template_kwargs"] = {"enable_thinking": r.random() < 0.5}
    for key, value in (("stream", True), ("stop_sequences", ["\n\n"]), ("metadata", {"user_id": "u1"}),
                       ("temperature", 0.5), ("top_k", 5)):
        if r.random() < 0.3:
            body[key] = value
    return body


def main():
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    images = len(sys.argv) > 3 and sys.argv[3] == "images"
    r = random.Random(seed)
    for i in range(count):
        api = "responses" if i % 2 == 0 else "messages"
        req = responses_request(r) if api == "responses" else messages_request(r, images)
        body = json.dumps(req, ensure_ascii=r.random() < 0.3).replace('"@@', "").replace('@@"', "")
        print(json.dumps({"name": f"api_{seed}_{i}", "api": api, "body": body}, ensure_ascii=False))


if __name__ == "__main__":
    main()
