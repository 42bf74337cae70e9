#!/usr/bin/env bash
# Compares kvroute's HfTokenizer with Hugging Face `tokenizers` (npm) on the
# corpus of make_corpus.py (5,292 strings, 1.5 MB), for 7 tokenizers.
# Mismatches caused by Unicode-version differences are listed and counted
# separately (see compare_reference.cpp); any other mismatch fails the test.
# Usage: tests/tokenizer/run_reference.sh BUILD_DIR [--small]
#   (after building kvroute-tokenizer-compare; --small: ~1/8 of the corpus)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; BUILD="${1:-$ROOT/build-tok}"; shift || true
"$ROOT/tests/tokenizer/setup_reference.sh" >/dev/null
DATA="$ROOT/tests/reference/data"; mkdir -p "$DATA/work"
# A private directory per run: several builds' ctest runs may share this tree.
WORK="$(mktemp -d "$DATA/work/reference.XXXXXX")"; trap 'rm -rf "$WORK"' EXIT
AGE=/usr/share/unicode/DerivedAge.txt
[[ -f "$AGE" ]] || { echo "missing $AGE: install unicode-data (scripts/setup.sh)" >&2; exit 1; }
python3 "$ROOT/tests/tokenizer/make_corpus.py" "$@" > "$WORK/corpus.jsonl"
echo "corpus: $(wc -l < "$WORK/corpus.jsonl") strings, $(wc -c < "$WORK/corpus.jsonl") bytes (JSON)"
rc=0
for m in qwen3 llama3_1 deepseek_v3 gemma3 gpt4o gptoss llama2; do
  NODE_PATH="$DATA/node/node_modules" node "$ROOT/tests/tokenizer/gen_reference.js" "$DATA/models/$m" "$WORK/corpus.jsonl" "$WORK/ref_$m.jsonl"
  "$BUILD/tokenizer/kvroute-tokenizer-compare" "$DATA/models/$m" "$WORK/corpus.jsonl" "$WORK/ref_$m.jsonl" "$AGE" > "$WORK/compare_$m.txt" || rc=1
  grep -E '^(EXPLAINED|UNEXPLAINED|  want|  got)' "$WORK/compare_$m.txt" | sed "s/^/$m: /" | cut -c1-400 || true
  echo "$m: $(tail -1 "$WORK/compare_$m.txt")"
done
exit $rc
