// Ground-truth token ids from Hugging Face `tokenizers` (npm, Rust binding).
// Usage: NODE_PATH=tests/reference/data/node/node_modules node gen_reference.js MODEL_DIR CORPUS.jsonl OUT.jsonl
// CORPUS: one JSON string per line. OUT: per line {"special":[ids],"plain":[ids],
// "special_offsets":[[start,end]...],"plain_offsets":[...]} (add_special_tokens
// true / false; offsets in code points of the text), in corpus order.
const fs = require("fs");
const { Tokenizer } = require("tokenizers");
const [modelDir, corpusPath, outPath] = process.argv.slice(2);
const tok = Tokenizer.fromFile(modelDir + "/tokenizer.json");
const lines = fs.readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.length);
(async () => {
  const out = [];
  for (const l of lines) {
    const text = JSON.parse(l);
    const a = await tok.encode(text, null, { addSpecialTokens: true });
    const b = await tok.encode(text, null, { addSpecialTokens: false });
    out.push(JSON.stringify({ special: Array.from(a.getIds()), plain: Array.from(b.getIds()),
                              special_offsets: a.getOffsets(), plain_offsets: b.getOffsets() }));
  }
  fs.writeFileSync(outPath, out.join("\n") + "\n");
})();
