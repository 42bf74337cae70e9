#!/usr/bin/env bash
# End to end for chat: `kvroute-tokenize` (kvroute's chat template + tokenizer, the code the
# router and the mocker run) against Python Jinja2 after vLLM's preprocessing (py_reference.py)
# + Hugging Face `tokenizers` on every
# conversation of chat_conversations.jsonl, for every reference model with a chat template.
# Token ids must be identical; a conversation the template rejects must be rejected by both.
# Usage: tests/tokenizer/tokenize_cli_reference.sh BUILD_DIR
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; BUILD="${1:-$ROOT/build}"
"$ROOT/tests/tokenizer/setup_reference.sh" >/dev/null
DATA="$ROOT/tests/reference/data"; WORK="$DATA/work"; mkdir -p "$WORK"
CONV="$ROOT/tests/tokenizer/chat_conversations.jsonl"
python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.strip(): print(json.dumps(json.loads(l)["request"]))' "$CONV" >"$WORK/chat_requests.jsonl"
export NODE_PATH="$DATA/node/node_modules"
rc=0; compared=0
for m in qwen3 llama3_1 deepseek_v3 gemma3 gpt4o gptoss llama2; do
  set +e
  /usr/bin/python3 "$ROOT/tests/tokenizer/py_reference.py" chat "$DATA/models/$m" "$CONV" "$WORK/cli_chat_$m.jsonl" >/dev/null; gen=$?
  set -e
  [[ $gen -eq 3 ]] && { echo "$m: skipped (no chat template)"; continue; }
  [[ $gen -ne 0 ]] && { echo "$m: reference rendering failed"; rc=1; continue; }
  node "$ROOT/tests/tokenizer/gen_chat_ids_reference.js" "$DATA/models/$m" "$WORK/cli_chat_$m.jsonl" "$WORK/cli_ids_$m.jsonl"
  "$BUILD/tokenizer/kvroute-tokenize" --tokenizer "$DATA/models/$m" --input "$WORK/chat_requests.jsonl" \
    >"$WORK/cli_out_$m.jsonl" || true   # exit 1 when some conversation is rejected; compared below
  python3 - "$m" "$WORK/cli_ids_$m.jsonl" "$WORK/cli_out_$m.jsonl" <<'PY' || rc=1
import json, sys
m, ref, out = sys.argv[1:]
ref = [json.loads(l) for l in open(ref) if l.strip()]
out = [json.loads(l) for l in open(out) if l.strip()]
assert len(ref) == len(out), f"{m}: {len(ref)} reference lines, {len(out)} kvroute-tokenize lines"
bad = 0
for i, (r, o) in enumerate(zip(ref, out)):
    if "error" in r:
        ok = isinstance(o, dict) and "error" in o
    else:
        ok = o == r["ids"]
    if not ok:
        bad += 1
        print(f"  [{m}] conversation {i + 1}: reference {str(r)[:200]} kvroute {str(o)[:200]}")
print(f"{m}: {len(ref) - bad}/{len(ref)} identical token ids")
sys.exit(1 if bad else 0)
PY
  compared=$((compared + 1))
done
[[ $compared -eq 0 ]] && { echo "no model with a chat template"; rc=1; }
exit $rc
