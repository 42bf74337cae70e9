#!/usr/bin/env bash
# Compares kvroute's HfTokenizer with Hugging Face `tokenizers` (npm) on the corpus, for 7 tokenizers.
# Usage: tests/tokenizer/run_reference.sh BUILD_DIR   (after building kvroute-tokenizer-compare)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; BUILD="${1:-$ROOT/build-tok}"
"$ROOT/tests/tokenizer/setup_reference.sh" >/dev/null
DATA="$ROOT/tests/reference/data"; WORK="$DATA/work"; mkdir -p "$WORK"
python3 "$ROOT/tests/tokenizer/make_corpus.py" > "$WORK/corpus.jsonl"
rc=0
for m in qwen3 llama3_1 deepseek_v3 gemma3 gpt4o gptoss llama2; do
  NODE_PATH="$DATA/node/node_modules" node "$ROOT/tests/tokenizer/gen_reference.js" "$DATA/models/$m" "$WORK/corpus.jsonl" "$WORK/ref_$m.jsonl"
  out="$("$BUILD/tokenizer/kvroute-tokenizer-compare" "$DATA/models/$m" "$WORK/corpus.jsonl" "$WORK/ref_$m.jsonl")" || rc=1
  echo "$m: $(tail -1 <<<"$out")"
done
exit $rc
