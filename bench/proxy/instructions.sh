#!/usr/bin/env bash
# bench/proxy/instructions.sh: user-space instructions kvroute executes per
# proxied request, counted by callgrind. Exact and repeatable where timings on
# this shared machine are not (and the VM exposes no hardware counters), so it
# is the figure to compare two builds of the hot path with.
#
# Starts nats-server, 3 mockers (--speedup 1000) and kvroute under
# `valgrind --tool=callgrind`; warms up with 3 s of wrk, zeroes the counters,
# runs 5 s of `wrk -t1 -c4` with the same small completion as bench/proxy.sh,
# dumps, and divides the instructions by the requests kvroute counted.
#
# Run: bash bench/proxy/instructions.sh [KVROUTE_BINARY]   (needs valgrind and wrk)
# The last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BUILD_DIR:-build}
KVROUTE=${1:-$BIN/router/kvroute}
for p in valgrind wrk; do
  command -v $p >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind wrk >/dev/null
done
W=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() { for _ in $(seq 300); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" = 200 ] && return 0; sleep 0.2; done; echo "no $1" >&2; exit 1; }

NATS=$(free_port)
nats-server -a 127.0.0.1 -p "$NATS" >"$W/nats.log" 2>&1 & pids+=($!)
for i in 1 2 3; do
  port=$(free_port)
  "$BIN/mocker/kvroute-mocker" --worker-id "$i" --port "$port" --nats-url "nats://127.0.0.1:$NATS" --speedup 1000 \
    --max-seqs 4096 >"$W/mocker-$i.log" 2>&1 & pids+=($!)
done
RPORT=$(free_port)
valgrind --tool=callgrind --callgrind-out-file="$W/callgrind.out" "$KVROUTE" --router.host 127.0.0.1 \
  --router.port "$RPORT" --admin.host 127.0.0.1 --admin.port 0 --router.threads 2 --log.access_log false \
  --events.nats_url "nats://127.0.0.1:$NATS" >"$W/kvroute.log" 2>&1 &
KVPID=$!; pids+=($KVPID)
wait_ready "http://127.0.0.1:$RPORT/ready"
cat >"$W/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"mock-model","prompt":"a short prompt of a few tokens","max_tokens":1}'
LUA
served() {
  curl -s "http://127.0.0.1:$RPORT/metrics" |
    awk '/^kvroute_router_requests_total\{route="completions",status="200"/{n += $2} END{print n + 0}'
}
wrk -t1 -c4 -d3s -s "$W/post.lua" "http://127.0.0.1:$RPORT/v1/completions" >/dev/null
callgrind_control -z "$KVPID" >/dev/null 2>&1
before=$(served)
wrk -t1 -c4 -d5s -s "$W/post.lua" "http://127.0.0.1:$RPORT/v1/completions" >/dev/null
after=$(served)
callgrind_control -d "$KVPID" >/dev/null 2>&1
requests=$((after - before))
total=$(callgrind_annotate "$W/callgrind.out.1" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",", "", $1); print $1}')
[ "$requests" -gt 0 ] && [ -n "$total" ] || { echo "no measurement (requests=$requests)" >&2; exit 1; }
echo "kvroute: $requests requests, $total user-space instructions"
python3 -c "import json; print(json.dumps({'requests': $requests, 'instructions': $total, 'instructions_per_request': round($total / $requests)}))"
