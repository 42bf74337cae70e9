#!/usr/bin/env bash
# bench/tokenizer/run.sh: kvroute's HfTokenizer vs Hugging Face `tokenizers`
# (npm 0.23, Rust) on the same corpus, from one script, one thread each:
#   1. exactness: tests/tokenizer/run_reference.sh (7 tokenizers, full corpus)
#   2. HF throughput: bench_hf.js (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false)
#   3. kvroute throughput + 8k-token chat prompt latency: bench_tokenizer
# The last line is one JSON object (exact_match_ratio, explained_mismatches,
# speed_ratio_vs_hf = geometric mean over the tokenizers of the big-text
# MB/s ratio; see bench_tokenizer.cpp).
# Usage: bench/tokenizer/run.sh [--quick] [BUILD_DIR]
#   --quick: small corpus, qwen3 + llama2, short runs, no exactness step (~20 s)
# Needs: a build with bench_tokenizer and kvroute-tokenizer-compare
# (ninja -C BUILD_DIR bench_tokenizer kvroute-tokenizer-compare), node, npm data.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
QUICK=0
if [[ "${1:-}" == "--quick" ]]; then QUICK=1; shift; fi
BUILD="${1:-$ROOT/build-tok}"
"$ROOT/tests/tokenizer/setup_reference.sh" >/dev/null
DATA="$ROOT/tests/reference/data"; mkdir -p "$DATA/work"
# A private directory per run: concurrent runs (ctest in several builds) must not share files.
WORK="$(mktemp -d "$DATA/work/bench.XXXXXX")"; trap 'rm -rf "$WORK"' EXIT
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
if ((QUICK)); then
  MODELS=(qwen3 llama2); MIN=0.2; EXTRA=(--quick)
  python3 "$ROOT/tests/tokenizer/make_corpus.py" --small > "$WORK/corpus.jsonl"
  : > "$WORK/exact.txt"
else
  MODELS=(qwen3 llama3_1 deepseek_v3 gemma3 gpt4o gptoss llama2); MIN=1.0; EXTRA=()
  python3 "$ROOT/tests/tokenizer/make_corpus.py" > "$WORK/corpus.jsonl"
  echo "== exactness (tests/tokenizer/run_reference.sh)"
  "$ROOT/tests/tokenizer/run_reference.sh" "$BUILD" | grep -v ': EXPLAINED' | tee "$WORK/exact.txt" || true
fi
echo "== HF tokenizers (node, one thread)"
NODE_PATH="$DATA/node/node_modules" node "$ROOT/bench/tokenizer/bench_hf.js" "$DATA/models" "$WORK/corpus.jsonl" "$MIN" "${MODELS[@]}" | tee "$WORK/hf.jsonl"
echo "== kvroute"
"$BUILD/bench/tokenizer/bench_tokenizer" --models "$DATA/models" --corpus "$WORK/corpus.jsonl" --hf "$WORK/hf.jsonl" \
  --exact "$WORK/exact.txt" --min-seconds "$MIN" "${EXTRA[@]}" "${MODELS[@]}"
