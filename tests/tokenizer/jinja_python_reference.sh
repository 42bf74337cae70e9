#!/usr/bin/env bash
# Differential test of kvroute's chat templates against Python Jinja2 (Debian python3-jinja2)
# configured as transformers does, after vLLM's request preprocessing (py_reference.py):
#  1. byte-equal prompts on 320 generated requests per model (gen_conversations.py, seeded)
#     for every reference model with a chat template; a request one side rejects must be
#     rejected by the other;
#  2. one-line templates exercising each filter, test, operator and printing rule (jinja_cases.py);
#  3. token ids: kvroute-tokenize on the requests == HF `tokenizers` on the Python-rendered text;
#  4. OpenAI Responses and Anthropic Messages requests (gen_api_conversations.py, seeded): kvroute's
#     parsers (router/api/) + its renderer == vLLM's conversion rewritten in Python + Jinja2,
#     byte-equal prompts (JINJA_REF_API_COUNT per model, default 200; at least 80 rendered).
# Usage: tests/tokenizer/jinja_python_reference.sh BUILD_DIR   (reference data: setup_reference.sh)
#   JINJA_REF_COUNT (default 460: at least 300 rendered per model, checked) requests per model, JINJA_REF_SEED (default 0) offsets the seeds:
#   a longer run on other data, e.g. JINJA_REF_COUNT=1000 JINJA_REF_SEED=1000 ... BUILD_DIR
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; BUILD="${1:-$ROOT/build}"
T="$ROOT/tests/tokenizer"
"$T/setup_reference.sh" >/dev/null
/usr/bin/python3 -c 'import jinja2' 2>/dev/null || { echo "missing python3-jinja2 (scripts/setup.sh installs it)"; exit 1; }
DATA="$ROOT/tests/reference/data"; mkdir -p "$DATA/work"
WORK="$(mktemp -d "$DATA/work/jinja_py.XXXXXX")"; trap 'rm -rf "$WORK"' EXIT
export NODE_PATH="$DATA/node/node_modules"
rc=0; compared=0; seed=${JINJA_REF_SEED:-0}; count=${JINJA_REF_COUNT:-460}; min_rendered=${JINJA_REF_COUNT:+0}; min_rendered=${min_rendered:-300}
for m in qwen3 llama3_1 deepseek_v3 gemma3 gpt4o gptoss llama2; do
  seed=$((seed + 101))
  conv="$WORK/conv_$m.jsonl"
  python3 "$T/gen_conversations.py" "$seed" "$count" images > "$conv"
  set +e
  /usr/bin/python3 "$T/py_reference.py" chat "$DATA/models/$m" "$conv" "$WORK/ref_$m.jsonl" > "$WORK/fmt_$m.txt"; gen=$?
  set -e
  if [[ $gen -eq 3 ]]; then echo "$m: skipped (no chat template)"; continue; fi
  if [[ $gen -ne 0 ]]; then echo "$m: python reference failed"; rc=1; continue; fi
  out="$("$BUILD/tokenizer/kvroute-chat-compare" "$DATA/models/$m" "$conv" "$WORK/ref_$m.jsonl")" || rc=1
  grep '^DIFF\|^  ref\|^  kvroute' <<<"$out" | sed "s/^/  [$m] /" | cut -c1-400 || true
  rendered=$(grep -c '"ok": true' "$WORK/ref_$m.jsonl" || true)
  echo "$m ($(cat "$WORK/fmt_$m.txt")): $(tail -1 <<<"$out") prompts ($rendered rendered, the rest rejected by both)"
  if (( rendered < min_rendered )); then echo "$m: only $rendered prompts rendered (< $min_rendered)"; rc=1; fi
  # 3. token ids, end to end
  node "$T/gen_chat_ids_reference.js" "$DATA/models/$m" "$WORK/ref_$m.jsonl" "$WORK/ids_$m.jsonl"
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.strip(): print(json.loads(l)["body"])' "$conv" > "$WORK/bodies_$m.jsonl"
  "$BUILD/tokenizer/kvroute-tokenize" --tokenizer "$DATA/models/$m" --input "$WORK/bodies_$m.jsonl" > "$WORK/out_$m.jsonl" || true
  python3 - "$m" "$WORK/ids_$m.jsonl" "$WORK/out_$m.jsonl" <<'PY' || rc=1
import json, sys
m, ref, out = sys.argv[1:]
ref = [json.loads(l) for l in open(ref) if l.strip()]
out = [json.loads(l) for l in open(out) if l.strip()]
assert len(ref) == len(out), f"{m}: {len(ref)} reference lines, {len(out)} kvroute-tokenize lines"
bad = tokens = 0
for i, (r, o) in enumerate(zip(ref, out)):
    ok = ("error" in o) if "error" in r else (o == r["ids"])
    tokens += len(r.get("ids", []))
    if not ok:
        bad += 1
        print(f"  [{m}] request {i}: reference {str(r)[:150]} kvroute {str(o)[:150]}")
print(f"{m}: {len(ref) - bad}/{len(ref)} identical token ids ({tokens} tokens)")
sys.exit(1 if bad else 0)
PY
  # 4. Responses and Messages requests, converted as vLLM converts them
  api_count=${JINJA_REF_API_COUNT:-200}
  python3 "$T/gen_api_conversations.py" "$seed" "$api_count" images > "$WORK/api_$m.jsonl"
  /usr/bin/python3 "$T/py_reference.py" chat "$DATA/models/$m" "$WORK/api_$m.jsonl" "$WORK/api_ref_$m.jsonl" > /dev/null
  out="$("$BUILD/tests/router/kvroute-api-chat-compare" "$DATA/models/$m" "$WORK/api_$m.jsonl" "$WORK/api_ref_$m.jsonl")" || rc=1
  grep '^DIFF\|^  ref\|^  kvroute\|^  chat' <<<"$out" | sed "s/^/  [$m] /" | cut -c1-400 || true
  rendered=$(grep -c '"ok": true' "$WORK/api_ref_$m.jsonl" || true)
  echo "$m Responses/Messages: $(tail -1 <<<"$out") prompts ($rendered rendered, the rest rejected by both)"
  if (( rendered < 80 * api_count / 200 )); then echo "$m: only $rendered Responses/Messages prompts rendered"; rc=1; fi
  compared=$((compared + 1))
done
[[ $compared -eq 0 ]] && { echo "no model with a chat template"; rc=1; }
python3 "$T/jinja_cases.py" > "$WORK/cases.jsonl"
/usr/bin/python3 "$T/py_reference.py" templates "$WORK/cases.jsonl" "$WORK/cases_ref.jsonl"
out="$("$BUILD/tokenizer/kvroute-template-compare" "$WORK/cases.jsonl" "$WORK/cases_ref.jsonl")" || rc=1
grep -v '^[0-9]*/[0-9]* equal$' <<<"$out" | cut -c1-400 || true
echo "one-line templates: $(tail -1 <<<"$out")"
exit $rc
