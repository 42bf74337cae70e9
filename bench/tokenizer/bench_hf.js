// bench/tokenizer/bench_hf.js: single-thread encode throughput of Hugging Face
// `tokenizers` (npm 0.23, the Rust library behind a Node binding) on the same
// corpus as bench_tokenizer. Run by bench/tokenizer/run.sh with
// RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false; calls are awaited one at
// a time, so one thread tokenizes.
// Usage: node bench_hf.js MODELS_DIR CORPUS.jsonl MIN_SECONDS model...
// Prints one JSON object per model:
//   {"model", "per_string_mbps", "big_text_mbps", "bytes", "strings"}
// per_string: every corpus string encoded (add_special_tokens=false), after a
// warm-up pass, repeated until MIN_SECONDS; big_text: all strings joined by
// "\n" encoded as one text, repeated until MIN_SECONDS (at least twice).
const fs = require("fs");
const { Tokenizer } = require("tokenizers");
const [modelsDir, corpusPath, minSecondsArg, ...models] = process.argv.slice(2);
const minSeconds = Number(minSecondsArg);
const texts = fs.readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
const big = texts.join("\n");
const bigBytes = Buffer.byteLength(big, "utf8");
const now = () => Number(process.hrtime.bigint()) / 1e9;

(async () => {
  for (const m of models) {
    const tok = Tokenizer.fromFile(`${modelsDir}/${m}/tokenizer.json`);
    for (const t of texts) await tok.encode(t, null, { addSpecialTokens: false });  // warm-up (fills HF's word cache)
    let passes = 0;
    let t0 = now();
    let elapsed = 0;
    do {
      for (const t of texts) await tok.encode(t, null, { addSpecialTokens: false });
      ++passes;
      elapsed = now() - t0;
    } while (elapsed < minSeconds);
    const perString = (bytes * passes) / elapsed / 1e6;
    passes = 0;
    t0 = now();
    do {
      await tok.encode(big, null, { addSpecialTokens: false });
      ++passes;
      elapsed = now() - t0;
    } while (elapsed < minSeconds || passes < 2);
    const bigMbps = (bigBytes * passes) / elapsed / 1e6;
    console.log(JSON.stringify({ model: m, per_string_mbps: perString, big_text_mbps: bigMbps, bytes, strings: texts.length }));
  }
})();
