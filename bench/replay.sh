#!/usr/bin/env bash
# bench/replay.sh: live replay of the Mooncake trace through a real kvroute in
# front of 8 kvroute-mockers (real NATS, HTTP on loopback), next to kvroute-sim
# on the same requests and fleet, so simulation and reality can be compared.
#   bash bench/replay.sh [REQUESTS=1000] [SPEEDUP=2]
# SPEEDUP 2 by default: every request also costs wall time outside the engines
# (the client, kvroute and the mockers parsing ~90 kB prompts and relaying
# every token), which the client's TTFT multiplies by SPEEDUP; on a 2-core
# machine shared with other work, 10x made that overhead the larger part of
# the median (bench/README.md has both runs), 2x keeps it near 10 %.
# Environment (each given to the mockers and to kvroute-sim alike):
#   PROFILE=h100-llama3-8b  engine profile (mocker/profile.h)
#   KV_BLOCKS=              per worker, 512-token blocks (default: the profile's, 875 for the 8B)
#   MAX_SEQS=64  MAX_BATCHED_TOKENS=8192   sequences per engine, tokens per engine step
#   REPORT_MS=100           load report period in engine ms: the mockers' heartbeat is
#                           REPORT_MS / SPEEDUP wall ms (at least 10), the simulator's --report-ms the same
#   BUILD_DIR=build  TRACE=traces/mooncake_conversation_trace.jsonl  KEEP=DIR (keep logs and per-request files)
#   ACCESS_LOG=false        true: kvroute's access log (each request's ttfb_ms) in DIR/kvroute.log
# Engine time runs SPEEDUP x faster than wall time in the mockers; the client
# scales its arrivals and its TTFTs by the same factor (engine ms).
#
# Prints live vs simulated: hit rate (points apart; target within 1 point),
# TTFT p50 (live / sim; target within 15 %) and p99 (ratio, no target), each
# with a pass/miss verdict; kvroute's predicted-TTFT MAPE next to the
# simulator's; the client's own pacing lag and event-loop lag (wall ms: what
# this machine's CPU adds, scaled by SPEEDUP into engine ms); the engines' own
# TTFT from the mockers' debug log (arrival at the engine -> first token) and
# the mean TTFT along the path (client, kvroute, engine), which split a gap
# into the engine model and the wall-time overhead; and, request by request,
# the share routed to the same worker as in the simulation.
# Exit 1 if a target is missed.
# Last line: one JSON object {"live": {...}, "sim": {...}, "hit_rate_diff": ..., "ttft_p50_ratio": ..., ...}.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}; SPEEDUP=${2:-2}
BIN=${BUILD_DIR:-build}
TRACE=${TRACE:-traces/mooncake_conversation_trace.jsonl}
PROFILE=${PROFILE:-h100-llama3-8b}
MAX_SEQS=${MAX_SEQS:-64}; MAX_BATCHED_TOKENS=${MAX_BATCHED_TOKENS:-8192}; REPORT_MS=${REPORT_MS:-100}
# The heartbeat is whole wall milliseconds: the simulator reports at the same engine-time period.
HB_MS=$(python3 -c "print(max(10, round($REPORT_MS / $SPEEDUP)))")
SIM_REPORT_MS=$(python3 -c "print($HB_MS * $SPEEDUP)")
KV_FLAG=(); [ -n "${KV_BLOCKS:-}" ] && KV_FLAG=(--kv-blocks "$KV_BLOCKS")
export PATH="$PATH:/usr/sbin:/sbin"
W=${KEEP:-$(mktemp -d)}; mkdir -p "$W"; pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$W"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NATS=$(free_port)
nats-server -a 127.0.0.1 -p "$NATS" >"$W/nats.log" 2>&1 & pids+=($!)
# The mockers connect at start: nats-server listens first.
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$NATS") 2>/dev/null && break; sleep 0.1; done
for i in $(seq 1 8); do
  "$BIN/mocker/kvroute-mocker" --worker-id "$i" --port 0 --nats-url "nats://127.0.0.1:$NATS" \
    --block-size 512 --engine-profile "$PROFILE" "${KV_FLAG[@]}" --max-seqs "$MAX_SEQS" \
    --max-batched-tokens "$MAX_BATCHED_TOKENS" --speedup "$SPEEDUP" --heartbeat-ms "$HB_MS" --log-level debug \
    >"$W/mocker-$i.log" 2>&1 & pids+=($!)
done
RPORT=$(free_port); APORT=$(free_port)
"$BIN/router/kvroute" --router.host 127.0.0.1 --router.port "$RPORT" --admin.host 127.0.0.1 --admin.port "$APORT" \
  --indexer.block_size 512 --log.access_log ${ACCESS_LOG:-false} --events.nats_url "nats://127.0.0.1:$NATS" >"$W/kvroute.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  n=$(curl -s "http://127.0.0.1:$RPORT/metrics" | awk '/^kvroute_scheduler_workers /{print $2}' || true)  # not up yet: curl fails
  [ "${n:-0}" = 8 ] && break; sleep 0.1
done
SIM_OUT=$("$BIN/sim/kvroute-sim" --trace "$TRACE" --requests "$N" --policies kvroute --workers 8 \
  --engine-profile "$PROFILE" "${KV_FLAG[@]}" --max-seqs "$MAX_SEQS" --max-batched-tokens "$MAX_BATCHED_TOKENS" \
  --report-ms "$SIM_REPORT_MS" --requests-out "$W/sim_requests.jsonl" 2>/dev/null)
SIM=$(tail -1 <<<"$SIM_OUT")
SIM_KV=$(head -1 <<<"$SIM_OUT" | sed -n 's/.* x \([0-9]*\) blocks of 512.*/\1/p')
# Both fleets the same size: each mocker's KV capacity as it reports it.
for i in $(seq 1 8); do
  url=$(sed -n 's/^kvroute-mocker listening on \(http:[^ ]*\).*/\1/p' "$W/mocker-$i.log")
  kv=$(curl -s "$url/mocker/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["kv_total_blocks"])')
  [ "$kv" = "$SIM_KV" ] || { echo "replay.sh: a mocker has $kv KV blocks, the simulator $SIM_KV" >&2; exit 2; }
done
LIVE=$(python3 bench/replay/replay.py --url "http://127.0.0.1:$RPORT" --trace "$TRACE" --requests "$N" \
  --speedup "$SPEEDUP" --requests-out "$W/live_requests.jsonl")
METRICS=$(curl -s "http://127.0.0.1:$RPORT/metrics")
echo "fleet: 8 x $PROFILE, $SIM_KV blocks of 512 tokens, $MAX_SEQS seqs, $MAX_BATCHED_TOKENS tokens/step;" \
  "load reports every $SIM_REPORT_MS engine ms ($HB_MS wall ms heartbeats); speedup $SPEEDUP; $N requests"
echo "live: $LIVE"
echo "sim:  $SIM"
python3 bench/replay/compare.py "$LIVE" "$SIM" "$METRICS" "$W/live_requests.jsonl" "$W/sim_requests.jsonl" "$SPEEDUP" "$W"
