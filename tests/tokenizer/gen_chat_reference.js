// Ground truth for chat templates: @huggingface/jinja (the engine of transformers.js).
// Usage: NODE_PATH=tests/reference/data/node/node_modules node gen_chat_reference.js MODEL_DIR CONVERSATIONS.jsonl OUT.jsonl
// CONVERSATIONS: per line {"name", "request": <OpenAI /v1/chat/completions body>}.
// OUT: per line {"ok": true, "text"} or {"ok": false, "error"}, in order.
// Exit code 3 (and no OUT) when the model has no chat template.
// The request is preprocessed the way kvroute's ChatTemplate::render_request does it (vLLM's
// rules), so that the comparison is about template rendering:
//   content: string kept; null/missing -> ""; array of parts -> "text" parts joined with "\n"
//   assistant tool_calls[].function.arguments: JSON string -> parsed; null/missing/"" -> {}
//   context: messages, tools, documents, add_generation_prompt (default true), bos_token,
//   eos_token (omitted when null), then chat_template_kwargs entries
//   continue_final_message: prompt cut after the final message content.
const fs = require("fs");
const { Template } = require("@huggingface/jinja");
const [modelDir, convPath, outPath] = process.argv.slice(2);

function loadTemplate() {
  const jinjaPath = modelDir + "/chat_template.jinja";
  const cfgPath = modelDir + "/tokenizer_config.json";
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  let tpl = null;
  if (fs.existsSync(jinjaPath)) tpl = fs.readFileSync(jinjaPath, "utf8");
  else if (typeof cfg.chat_template === "string") tpl = cfg.chat_template;
  else if (Array.isArray(cfg.chat_template)) {
    const d = cfg.chat_template.find((t) => t && t.name === "default");
    if (d) tpl = d.template;
  }
  const tokenText = (t) => (typeof t === "string" ? t : t && typeof t.content === "string" ? t.content : null);
  return { tpl, bos: tokenText(cfg.bos_token), eos: tokenText(cfg.eos_token) };
}

function contentText(c) {
  if (c === undefined || c === null) return "";
  if (typeof c === "string") return c;
  if (!Array.isArray(c)) throw new Error("message content must be a string, an array of parts or null");
  const texts = [];
  for (const p of c) {
    if (typeof p === "string") { texts.push(p); continue; }
    if (!p || typeof p !== "object" || p.type !== "text") continue;
    if (typeof p.text !== "string") throw new Error('text content part without a string "text"');
    texts.push(p.text);
  }
  return texts.join("\n");
}

function toolCalls(calls) {
  if (!Array.isArray(calls)) throw new Error("tool_calls must be an array");
  return calls.map((call) => {
    if (!call || typeof call !== "object" || Array.isArray(call)) throw new Error("tool_calls entries must be objects");
    const copy = { ...call };
    const fn = call.function;
    if (fn && typeof fn === "object" && !Array.isArray(fn)) {
      const f = { ...fn };
      const a = fn.arguments;
      if (a === undefined || a === null || a === "") f.arguments = {};
      else if (typeof a === "string") f.arguments = JSON.parse(a);
      copy.function = f;
    }
    return copy;
  });
}

function render(t, body) {
  const messages = body.messages.map((m) => {
    const msg = { role: m.role, content: contentText(m.content) };
    if (m.name !== undefined) msg.name = m.name;
    if (m.tool_call_id !== undefined) msg.tool_call_id = m.tool_call_id;
    if (m.reasoning_content !== undefined) msg.reasoning_content = m.reasoning_content;
    if (m.tool_calls !== undefined && m.tool_calls !== null && m.role === "assistant") msg.tool_calls = toolCalls(m.tool_calls);
    return msg;
  });
  const addGen = body.add_generation_prompt === undefined ? true : body.add_generation_prompt;
  const cont = body.continue_final_message === true;
  if (cont && addGen) throw new Error("Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  const ctx = { messages };
  if (body.tools !== undefined && body.tools !== null) ctx.tools = body.tools;
  if (body.documents !== undefined && body.documents !== null) ctx.documents = body.documents;
  ctx.add_generation_prompt = addGen;
  if (t.bos !== null) ctx.bos_token = t.bos;
  if (t.eos !== null) ctx.eos_token = t.eos;
  Object.assign(ctx, body.chat_template_kwargs || {});
  let out = new Template(t.tpl).render(ctx);
  const last = messages.length ? messages[messages.length - 1].content : "";
  if (cont && last !== "") {
    let p = out.lastIndexOf(last), len = last.length;
    if (p < 0) {
      const s = last.replace(/^[ \t\n\v\f\r]+|[ \t\n\v\f\r]+$/g, "");
      p = out.lastIndexOf(s);
      len = s.length;
    }
    if (p < 0) throw new Error("continue_final_message: the final message is not in the rendered prompt");
    out = out.slice(0, p + len);
  }
  return out;
}

const t = loadTemplate();
if (t.tpl === null) process.exit(3);
const lines = fs.readFileSync(convPath, "utf8").split("\n").filter((l) => l.length);
const out = lines.map((l) => {
  const conv = JSON.parse(l);
  try {
    return JSON.stringify({ ok: true, text: render(t, conv.request) });
  } catch (e) {
    return JSON.stringify({ ok: false, error: String(e && e.message !== undefined ? e.message : e) });
  }
});
fs.writeFileSync(outPath, out.join("\n") + "\n");
