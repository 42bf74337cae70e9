#!/usr/bin/env bash
# bench/replay.sh: live replay of the Mooncake trace through a real kvroute in
# front of 8 kvroute-mockers (real NATS, HTTP on loopback), next to kvroute-sim
# on the same requests and fleet, so simulation and reality can be compared.
# Fleet: 8 workers, KV blocks of 512 tokens, 2,000 blocks each, 64 sequences
# (as kvroute-sim's defaults); engine time runs SPEEDUP x faster than wall time.
#   bash bench/replay.sh [REQUESTS=1000] [SPEEDUP=10]
# Prints kvroute's predicted-TTFT MAPE (its per-worker online model against the
# first bytes it saw, scraped from /metrics) next to the simulator's, and
# whether live and simulated hit rates are within 1 point (exit 1 if not).
# Last line: one JSON object {"live": {...}, "sim": {...}, "hit_rate_diff": ..., "ttft_mape_live": ...}.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}; SPEEDUP=${2:-10}
BIN=${BUILD_DIR:-build}
TRACE=${TRACE:-traces/mooncake_conversation_trace.jsonl}
export PATH="$PATH:/usr/sbin:/sbin"
W=$(mktemp -d); pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NATS=$(free_port)
nats-server -a 127.0.0.1 -p "$NATS" >"$W/nats.log" 2>&1 & pids+=($!)
sleep 0.3
for i in $(seq 1 8); do
  "$BIN/mocker/kvroute-mocker" --worker-id "$i" --port 0 --nats-url "nats://127.0.0.1:$NATS" --block-size 512 \
    --kv-blocks 2000 --max-seqs 64 --max-batched-tokens 65536 --speedup "$SPEEDUP" --heartbeat-ms 100 \
    >"$W/mocker-$i.log" 2>&1 & pids+=($!)
done
RPORT=$(free_port); APORT=$(free_port)
"$BIN/router/kvroute" --router.host 127.0.0.1 --router.port "$RPORT" --admin.host 127.0.0.1 --admin.port "$APORT" \
  --indexer.block_size 512 --log.access_log false --events.nats_url "nats://127.0.0.1:$NATS" >"$W/kvroute.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  n=$(curl -s "http://127.0.0.1:$RPORT/metrics" | awk '/^kvroute_scheduler_workers /{print $2}' || true)  # not up yet: curl fails
  [ "${n:-0}" = 8 ] && break; sleep 0.1
done
LIVE=$(python3 bench/replay/replay.py --url "http://127.0.0.1:$RPORT" --trace "$TRACE" --requests "$N" --speedup "$SPEEDUP")
METRICS=$(curl -s "http://127.0.0.1:$RPORT/metrics")
SIM=$("$BIN/sim/kvroute-sim" --trace "$TRACE" --requests "$N" --policies kvroute --workers 8 --kv-blocks 2000 \
  --max-seqs 64 --max-batched-tokens 65536 2>/dev/null | tail -1)
echo "live: $LIVE"
echo "sim:  $SIM"
python3 - "$LIVE" "$SIM" "$METRICS" <<'PY'
import json, sys
live = json.loads(sys.argv[1]); sim = json.loads(sys.argv[2])["kvroute"]
def metric(name):
    for line in sys.argv[3].splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")
mape = metric("kvroute_scheduler_ttft_mape_ratio")
cached, best = metric("kvroute_router_cached_tokens_total"), metric("kvroute_router_best_cached_tokens_total")
gap = 1 - cached / best if best > 0 else 0.0
diff = live["hit_rate"] - sim["hit_rate"]
print("predicted-TTFT MAPE: live %.3f (kvroute's online model vs observed first bytes), sim %.3f" % (mape, sim["ttft_mape"]))
print("decision-quality gap (1 - cached / best reachable tokens): live %.3f, sim %.3f" % (gap, sim["cache_gap"]))
print("hit rate: live %.4f, sim %.4f: %.2f points apart (%s)" % (live["hit_rate"], sim["hit_rate"], abs(diff) * 100,
      "within 1 point" if abs(diff) <= 0.01 else "MORE than 1 point"))
print(json.dumps({"live": live, "sim": sim, "hit_rate_diff": round(diff, 4), "ttft_mape_live": round(mape, 4),
                  "cache_gap_live": round(gap, 4)}))
sys.exit(0 if abs(diff) <= 0.01 else 1)
PY
