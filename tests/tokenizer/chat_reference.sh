#!/usr/bin/env bash
# Compares kvroute's ChatTemplate (tokenizer/jinja*, chat_template.*) byte for byte with Python
# Jinja2 as transformers configures it after vLLM's preprocessing (py_reference.py) on the
# hand-written tests/tokenizer/chat_conversations.jsonl, for every reference model with a template.
# Usage: tests/tokenizer/chat_reference.sh BUILD_DIR   (after building kvroute-chat-compare)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; BUILD="${1:-$ROOT/build-jinja}"
"$ROOT/tests/tokenizer/setup_reference.sh" >/dev/null
DATA="$ROOT/tests/reference/data"; WORK="$DATA/work"; mkdir -p "$WORK"
CONV="$ROOT/tests/tokenizer/chat_conversations.jsonl"
rc=0; compared=0
for m in qwen3 llama3_1 deepseek_v3 gemma3 gpt4o gptoss llama2; do
  ref="$WORK/chat_ref_$m.jsonl"; rm -f "$ref"
  set +e
  /usr/bin/python3 "$ROOT/tests/tokenizer/py_reference.py" chat "$DATA/models/$m" "$CONV" "$ref" >/dev/null
  gen=$?
  set -e
  if [[ $gen -eq 3 ]]; then echo "$m: skipped (no chat_template in tokenizer_config.json)"; continue; fi
  if [[ $gen -ne 0 ]]; then echo "$m: reference generation failed"; rc=1; continue; fi
  set +e
  out="$("$BUILD/tokenizer/kvroute-chat-compare" "$DATA/models/$m" "$CONV" "$ref")"; st=$?
  set -e
  [[ $st -ne 0 ]] && rc=1
  grep -v '^[0-9]*/[0-9]* equal$' <<<"$out" | sed "s/^/  [$m] /" || true
  echo "$m: $(tail -1 <<<"$out")"
  compared=$((compared + 1))
done
if [[ $compared -eq 0 ]]; then echo "no model with a chat template"; rc=1; fi
exit $rc
