// Ground truth for whole chat requests: the prompt Python Jinja2 rendered
// (py_reference.py output) encoded by Hugging Face `tokenizers` without
// added special tokens, as vLLM does for chat.
// Usage: NODE_PATH=... node gen_chat_ids_reference.js MODEL_DIR CHAT_REF.jsonl OUT.jsonl
// OUT: per line {"ids": [...]} or {"error": true} (the template raised), in order.
const fs = require("fs");
const { Tokenizer } = require("tokenizers");
const [modelDir, refPath, outPath] = process.argv.slice(2);
const tok = Tokenizer.fromFile(modelDir + "/tokenizer.json");
const lines = fs.readFileSync(refPath, "utf8").split("\n").filter((l) => l.length);
(async () => {
  const out = [];
  for (const l of lines) {
    const r = JSON.parse(l);
    if (!r.ok) { out.push(JSON.stringify({ error: true })); continue; }
    const e = await tok.encode(r.text, null, { addSpecialTokens: false });
    out.push(JSON.stringify({ ids: Array.from(e.getIds()) }));
  }
  fs.writeFileSync(outPath, out.join("\n") + "\n");
})();
