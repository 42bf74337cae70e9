#!/usr/bin/env bash
# bench/tokenizer/run.sh: kvroute's HfTokenizer vs Hugging Face `tokenizers`
# (npm 0.23, Rust) on the same corpus, from one script, one thread each:
#   1. exactness: tests/tokenizer/run_reference.sh (7 tokenizers, full corpus)
#   2. HF throughput: bench_hf.js (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false)
#   3. kvroute throughput + 8k-token chat prompt latency: bench_tokenizer
# The last line is one JSON object (exact_match_ratio, explained_mismatches,
# speed_ratio_vs_hf_node = geometric mean over the tokenizers of the big-text
# MB/s ratio against HF `tokenizers` through its Node binding; see
# bench_tokenizer.cpp). An exactness failure (an unexplained mismatch, or
# run_reference.sh failing for any other reason) fails the run: exit 1, after
# the figures are printed.
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
  EXACT_RC=0
  "$ROOT/tests/tokenizer/run_reference.sh" "$BUILD" > "$WORK/exact_full.txt" || EXACT_RC=$?
  grep -v ': EXPLAINED' "$WORK/exact_full.txt" | tee "$WORK/exact.txt" || true
fi
echo "== HF tokenizers (node, one thread)"
NODE_PATH="$DATA/node/node_modules" node "$ROOT/bench/tokenizer/bench_hf.js" "$DATA/models" "$WORK/corpus.jsonl" "$MIN" "${MODELS[@]}" | tee "$WORK/hf.jsonl"
echo "== kvroute"
BENCH_RC=0
"$BUILD/bench/tokenizer/bench_tokenizer" --models "$DATA/models" --corpus "$WORK/corpus.jsonl" --hf "$WORK/hf.jsonl" \
  --exact "$WORK/exact.txt" --min-seconds "$MIN" "${EXTRA[@]}" "${MODELS[@]}" || BENCH_RC=$?
if (( ${EXACT_RC:-0} != 0 || BENCH_RC != 0 )); then
  echo "exactness failed (run_reference.sh exit ${EXACT_RC:-0}, bench_tokenizer exit $BENCH_RC)" >&2
  exit 1
fi
