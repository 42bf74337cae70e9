#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, then runs the
# embedded default — a local nats-server, three kvroute-mocker workers and
# kvroute — and prints a request to paste. Ctrl-C stops everything.
#   --vllm              no NATS at all: the three mockers act as vLLM servers (ZMQ KV
#                       events + replay, vLLM /metrics) listed in kvroute's config
#                       (workers.static), as a real vLLM fleet is connected
#   --pd                a disaggregated vLLM fleet (NixlConnector protocol): 2 prefill +
#                       2 decode mockers (--role), listed with `role:` in kvroute's config
#   --pd-sglang         the same as an SGLang fleet (--disaggregation-mode; the prefill
#                       entries carry their `bootstrap_port:`)
#   KVROUTE_PORT        router port (default 8080, or a free one if taken)
#   KVROUTE_ADMIN_PORT  admin port: API and status page (default 8081, or a free one if taken)
#   KVROUTE_ADMIN_TOKEN admin token (default: a random one, printed)
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=nats
case "${1:-}" in
  --vllm) MODE=vllm ;;
  --pd) MODE=pd ;;
  --pd-sglang) MODE=pd-sglang ;;
  "") ;;
  *) echo "usage: scripts/demo.sh [--vllm | --pd | --pd-sglang]" >&2; exit 2 ;;
esac
[ "${KVROUTE_SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh   # tests/integration/test_demo.py skips it
export PATH="$PATH:/usr/sbin:/sbin"
BIN=${BUILD_DIR:-build}
RUN=${KVROUTE_RUN_DIR:-.run}
mkdir -p "$RUN"

free_port() {  # prints $1 if it is free, else a free ephemeral port
  python3 - "$1" <<'PY'
import socket, sys
want = int(sys.argv[1])
for port in (want, 0):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port)); print(s.getsockname()[1]); break
    except OSError:
        pass
    finally:
        s.close()
PY
}
wait_for() {  # url, seconds; gives up at once if the last process started (kvroute) exited
  for _ in $(seq 1 $((${2} * 10))); do
    curl -fs "$1" >/dev/null 2>&1 && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "demo: $1 did not come up; see $RUN/*.log" >&2; return 1
}

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

NATS_PORT=$(free_port 4222)
ROUTER_PORT=$(free_port "${KVROUTE_PORT:-8080}")
# ---- admin listener and status page: a token, a free port ----
ADMIN_PORT=$(free_port "${KVROUTE_ADMIN_PORT:-8081}")
[ "$ADMIN_PORT" = "$ROUTER_PORT" ] && ADMIN_PORT=$(free_port 0)
export KVROUTE_ADMIN_TOKEN=${KVROUTE_ADMIN_TOKEN:-$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')}
# ---- end admin
if [ "$MODE" = nats ]; then
  nats-server -a 127.0.0.1 -p "$NATS_PORT" >"$RUN/nats.log" 2>&1 &
  pids+=($!)
  for i in 1 2 3; do
    "$BIN/mocker/kvroute-mocker" --worker-id "$i" --port 0 --nats-url "nats://127.0.0.1:$NATS_PORT" \
      >"$RUN/mocker-$i.log" 2>&1 &
    pids+=($!)
  done
  NATS_URL="nats://127.0.0.1:$NATS_PORT"
  WHAT="nats on $NATS_PORT, 3 simulated workers"
elif [ "$MODE" = vllm ]; then
  # vLLM mode: each mocker prints "kvroute-mocker zmq kv_events E replay R listening on URL".
  CONFIG="$RUN/kvroute-vllm.yaml"
  printf 'workers:\n  static:\n' >"$CONFIG"
  for i in 1 2 3; do
    "$BIN/mocker/kvroute-mocker" --worker-id "$i" --port 0 --zmq-endpoint tcp://127.0.0.1:0 \
      --zmq-replay-endpoint tcp://127.0.0.1:0 >"$RUN/mocker-$i.out" 2>"$RUN/mocker-$i.log" &
    pids+=($!)
    for _ in $(seq 1 100); do grep -q "listening on" "$RUN/mocker-$i.out" 2>/dev/null && break; sleep 0.1; done
    read -r _ _ _ kv _ replay _ _ url < "$RUN/mocker-$i.out"
    printf '    - {id: %s, url: "%s", model: mock-model, kv_events: "%s", replay: "%s"}\n' \
      "$i" "$url" "$kv" "$replay" >>"$CONFIG"
  done
  NATS_URL=""
  WHAT="no NATS: 3 simulated vLLM workers from $CONFIG"
elif [ "$MODE" = pd ] || [ "$MODE" = pd-sglang ]; then
  # Disaggregated: workers 1-2 prefill, 3-4 decode, vLLM-mode KV events. Each
  # prints "kvroute-mocker pd ROLE side_channel|bootstrap H:P zmq kv_events E replay R listening on URL".
  CONFIG="$RUN/kvroute-$MODE.yaml"
  printf 'workers:\n  static:\n' >"$CONFIG"
  for i in 1 2 3 4; do
    role=prefill; [ "$i" -gt 2 ] && role=decode
    if [ "$MODE" = pd ]; then
      pd_flags=(--role "$role")
    else
      pd_flags=(--disaggregation-mode "$role")
      [ "$role" = prefill ] && pd_flags+=(--disaggregation-bootstrap-port 0)
    fi
    "$BIN/mocker/kvroute-mocker" --worker-id "$i" --port 0 --zmq-endpoint tcp://127.0.0.1:0 \
      --zmq-replay-endpoint tcp://127.0.0.1:0 "${pd_flags[@]}" >"$RUN/mocker-$i.out" 2>"$RUN/mocker-$i.log" &
    pids+=($!)
    for _ in $(seq 1 100); do grep -q "listening on" "$RUN/mocker-$i.out" 2>/dev/null && break; sleep 0.1; done
    read -r _ _ _ _ side _ _ kv _ replay _ _ url < "$RUN/mocker-$i.out"
    extra=""
    [ "$MODE" = pd-sglang ] && [ "$role" = prefill ] && extra=", bootstrap_port: ${side##*:}"
    printf '    - {id: %s, url: "%s", model: mock-model, kv_events: "%s", replay: "%s", role: %s%s}\n' \
      "$i" "$url" "$kv" "$replay" "$role" "$extra" >>"$CONFIG"
  done
  protocol=vllm_nixl; [ "$MODE" = pd-sglang ] && protocol=sglang
  printf 'pd:\n  protocol: %s\n' "$protocol" >>"$CONFIG"
  NATS_URL=""
  WHAT="no NATS: 2 prefill + 2 decode simulated ${MODE#pd-} workers from $CONFIG"
  [ "$MODE" = pd ] && WHAT="no NATS: 2 prefill + 2 decode simulated vLLM (NIXL) workers from $CONFIG"
  # A long uncached prompt is split (x-kvroute-pd: disaggregated, the prefill
  # worker in x-kvroute-prefill-worker); a short one runs whole on a decode
  # worker (pd.min_uncached_tokens, 512 by default).
  WHAT="$WHAT; requests of 512 uncached tokens or more are split between a prefill and a decode worker (see the x-kvroute-pd and x-kvroute-prefill-worker response headers)"
fi
# The token reaches kvroute through KVROUTE_ADMIN_TOKEN (not argv: ps would show it).
"$BIN/router/kvroute" ${CONFIG:+--config "$CONFIG"} --router.host 127.0.0.1 --router.port "$ROUTER_PORT" \
  --admin.port "$ADMIN_PORT" --events.nats_url "$NATS_URL" >"$RUN/kvroute.log" 2>&1 &
pids+=($!)
wait_for "http://127.0.0.1:$ROUTER_PORT/ready" 30
wait_for "http://127.0.0.1:$ADMIN_PORT/ui" 10

cat <<MSG

kvroute is up on http://127.0.0.1:$ROUTER_PORT ($WHAT; logs in $RUN/).
Try it (run twice: the second answer shows cached tokens):

curl -si http://127.0.0.1:$ROUTER_PORT/v1/chat/completions -H 'content-type: application/json' \\
  -d '{"model":"mock-model","messages":[{"role":"system","content":"You are a helpful assistant that answers in one short paragraph about distributed systems and caching."},{"role":"user","content":"Why does prefix caching make LLM serving faster?"}],"max_tokens":32}'

Status page: http://127.0.0.1:$ADMIN_PORT/ui
Admin token: $KVROUTE_ADMIN_TOKEN
(the page asks for the token once and keeps it in that browser tab; the admin API takes it as
 curl -s http://127.0.0.1:$ADMIN_PORT/admin/workers -H "authorization: Bearer $KVROUTE_ADMIN_TOKEN")

Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}"
echo "demo: a process exited; see $RUN/*.log" >&2
