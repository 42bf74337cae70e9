#!/usr/bin/env bash
# bench/proxy.sh: what kvroute adds in front of workers, against nginx.
#
# Measures, in one run on this machine:
#   (a) wrk -> one mocker directly,
#   (b) wrk -> kvroute -> 3 mockers,
#   (c) wrk -> nginx (Debian, plain round-robin reverse proxy, keepalive) -> the same 3 mockers,
#   (d) the floor of kvroute's design: bench/proxy/floor_proxy.cpp (Asio + Beast, round-robin,
#       nothing of kvroute's own; the same socket calls per request as kvroute; allocates
#       nothing per request once warm, which it counts and reports),
# with the same small non-streaming completion (1 prompt token block, max_tokens 1):
#   - latency: one connection, one request at a time, ROUNDS rounds (default 5) of
#     LAT_SECONDS (default 4) per target, the order rotating each round; p50/p99 are
#     medians over the rounds; added latency = kvroute (or nginx, floor) - direct.
#     At one connection the latency is the proxy's own cost, not queueing;
#   - throughput: 16 connections (2 wrk threads), saturating the machine, ROUNDS
#     rounds of kvroute, nginx and the floor, 5 s each, the order rotating each
#     round; throughput ratio = median over the rounds of req/s kvroute / req/s nginx.
#     Everything shares the 2
#     cores, so this is CPU per request of the whole path: wrk + proxy + mockers.
#     Like for like: kvroute and the floor proxy run THREADS io threads (default 1)
#     and nginx THREADS worker processes, and each proxy runs in a session of its
#     own, as a service would. (nginx daemonizes into its own session; with the
#     kernel's autogroup scheduling a proxy left in the benchmark's session would
#     share one CPU share with wrk and the mockers and be preempted by them.)
# Then a streaming run: N concurrent SSE streams through kvroute (default
# 10,000); a stream counts once established (200 and its first event arrived,
# bench/proxy/streams.py), with errors and kvroute's peak RSS.
# Mockers run with --speedup 1000 (the engine's time is nearly free) for the latency runs.
#
# Run: bash bench/proxy.sh [STREAMS]    (after scripts/setup.sh; installs wrk and nginx-light)
# THREADS=1 is the best setting of both proxies on this 2-core machine, where
# wrk and the mockers need the cores too (two nginx workers lose to one, two
# kvroute io threads to one); THREADS=2 compares them at two.
# The last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/.."
STREAMS=${1:-10000}
THREADS=${THREADS:-1}
ROUNDS=${ROUNDS:-5}
BIN=${BUILD_DIR:-build}
export PATH="$PATH:/usr/sbin:/sbin"
for p in wrk nginx; do command -v $p >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light >/dev/null; done
# kvroute holds 2 sockets per proxied stream: the descriptor limit bounds the streams.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
echo "open-file limit: $(ulimit -n)"
W=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; [ -f "$W/nginx.pid" ] && kill "$(cat "$W/nginx.pid")" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 100); do curl -fs "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "no $1" >&2; exit 1; }

NATS=$(free_port)
nats-server -a 127.0.0.1 -p "$NATS" >"$W/nats.log" 2>&1 & pids+=($!)
MPORTS=()
start_mockers() {  # extra mocker flags
  for i in 1 2 3; do
    local port; port=$(free_port)
    "$BIN/mocker/kvroute-mocker" --worker-id "$i" --port "$port" --nats-url "nats://127.0.0.1:$NATS" "$@" \
      >"$W/mocker-$i.log" 2>&1 & pids+=($!)
    MPORTS+=("$port")
  done
  for p in "${MPORTS[@]}"; do wait_http "http://127.0.0.1:$p/health"; done
}
start_mockers --speedup 1000 --max-seqs 4096
RPORT=$(free_port); APORT=$(free_port)
setsid "$BIN/router/kvroute" --router.host 127.0.0.1 --router.port "$RPORT" --admin.host 127.0.0.1 \
  --admin.port "$APORT" --router.threads "$THREADS" --log.access_log false \
  --events.nats_url "nats://127.0.0.1:$NATS" >"$W/kvroute.log" 2>&1 &
KVPID=$!; pids+=($KVPID)
for _ in $(seq 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$RPORT/ready")" = 200 ] && break; sleep 0.1; done

NPORT=$(free_port)
cat >"$W/nginx.conf" <<NGINX
worker_processes $THREADS;
pid $W/nginx.pid;
error_log $W/nginx.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  upstream mockers { server 127.0.0.1:${MPORTS[0]}; server 127.0.0.1:${MPORTS[1]}; server 127.0.0.1:${MPORTS[2]}; keepalive 64; }
  server {
    listen 127.0.0.1:$NPORT;
    location / { proxy_pass http://mockers; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
  }
}
NGINX
nginx -c "$W/nginx.conf" -p "$W"
wait_http "http://127.0.0.1:$NPORT/health"

# The floor of kvroute's design: Asio + Beast with nothing of kvroute's own
# (bench/proxy/floor_proxy.cpp), in front of the same mockers.
FPORT=$(free_port)
setsid "$BIN/bench/proxy/kvroute-floor-proxy" "$FPORT" "$THREADS" "${MPORTS[@]}" >"$W/floor.log" 2>&1 &
FLOORPID=$!; pids+=($FLOORPID)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$FPORT") 2>/dev/null && break; sleep 0.1; done

cat >"$W/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"mock-model","prompt":"a short prompt of a few tokens","max_tokens":1}'
LUA
run_wrk() {  # name port threads connections seconds -> prints "rps p50_us p99_us non2xx"
  wrk -t"$3" -c"$4" -d"$5"s --latency -s "$W/post.lua" "http://127.0.0.1:$2/v1/completions" >"$W/wrk-$1.txt"
  python3 - "$W/wrk-$1.txt" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
def us(s):
    m = re.match(r"([\d.]+)(us|ms|s)", s)
    if not m:
        sys.exit("cannot parse wrk output:\n" + t)
    v, u = m.groups()
    return float(v) * {"us": 1, "ms": 1e3, "s": 1e6}[u]
p50 = us(re.search(r"^\s+50%\s+(\S+)", t, re.M).group(1)); p99 = us(re.search(r"^\s+99%\s+(\S+)", t, re.M).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
print(rps, p50, p99, errs.group(1) if errs else 0)
PY
}
# Rounds rotate the order of the targets (round r starts at target r mod n), so
# no target always runs first or last, right after another one's burst.
rotate() {  # round items... -> the items rotated left by round mod count
  local r=$1; shift; local a=("$@"); local n=${#a[@]} i
  for ((i = 0; i < n; i++)); do printf '%s ' "${a[$(((i + r) % n))]}"; done
}
# Latency at one connection, ROUNDS rounds of LAT_SECONDS each per target; the
# figures are the medians over rounds (one run is at the mercy of one burst
# of a neighbour on this shared machine).
LAT_SECONDS=${LAT_SECONDS:-4}
declare -A PORT_OF=([direct]="${MPORTS[0]}" [kvroute]="$RPORT" [nginx]="$NPORT" [floor]="$FPORT")
declare -A L50 L99 LERR
for round in $(seq "$ROUNDS"); do
  for t in $(rotate "$round" direct kvroute nginx floor); do
    read -r _ p50 p99 e < <(run_wrk "$t-1" "${PORT_OF[$t]}" 1 1 "$LAT_SECONDS")
    L50[$t]="${L50[$t]:-} $p50"; L99[$t]="${L99[$t]:-} $p99"; LERR[$t]=$(( ${LERR[$t]:-0} + e ))
  done
  echo "latency round $round: p50 us direct ${L50[direct]##* } kvroute ${L50[kvroute]##* } nginx ${L50[nginx]##* } floor ${L50[floor]##* }"
done
read -r D_RPS D_L50 D_L99 D_ERR2 < <(run_wrk direct "${MPORTS[0]}" 2 16 5)
# Throughput: ROUNDS rounds of (kvroute, nginx, floor) in rotated order, 5 s
# each; the ratio is the median of the per-round ratios (this machine is
# shared: a neighbour's burst then spoils one round, not the figure).
# Each proxy's CPU per request (user + system, all its threads or workers,
# from /proc/PID/stat around the round) is printed too: on a shared machine it
# is steadier than req/s, and it is what the ratio comes from.
cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
NGINX_WORKER_PIDS=$(pgrep -P "$(cat "$W/nginx.pid")" | tr '\n' ' ')
TICK_US=$((1000000 / $(getconf CLK_TCK)))
RATIOS=(); K_ALL=(); N_ALL=(); K_CPU=(); N_CPU=(); F_ALL=(); F_CPU=(); K_ERR2=0; N_ERR2=0
declare -A PIDS_OF=([kvroute]="$KVPID" [nginx]="$NGINX_WORKER_PIDS" [floor]="$FLOORPID")
declare -A RPS CPU ERRS
for round in $(seq "$ROUNDS"); do
  for t in $(rotate "$round" kvroute nginx floor); do
    # shellcheck disable=SC2086
    c0=$(cpu_ticks ${PIDS_OF[$t]})
    read -r rps l50 l99 e < <(run_wrk "$t" "${PORT_OF[$t]}" 2 16 5)
    # shellcheck disable=SC2086
    c1=$(cpu_ticks ${PIDS_OF[$t]})
    RPS[$t]=$rps; ERRS[$t]=$(( ${ERRS[$t]:-0} + e ))
    CPU[$t]=$(python3 -c "print(round(($c1 - $c0) * $TICK_US / ($rps * 5), 1))")
    [ "$t" = kvroute ] && { K_L50=$l50; K_L99=$l99; }
    [ "$t" = nginx ] && { N_L50=$l50; N_L99=$l99; }
  done
  K_RPS=${RPS[kvroute]}; N_RPS=${RPS[nginx]}; F_RPS=${RPS[floor]}
  RATIOS+=("$(python3 -c "print(round($K_RPS / $N_RPS, 3))")")
  K_CPU+=("${CPU[kvroute]}"); N_CPU+=("${CPU[nginx]}"); F_CPU+=("${CPU[floor]}")
  echo "throughput round $round (order: $(rotate "$round" kvroute nginx floor)): kvroute $K_RPS req/s (${K_CPU[-1]} us CPU/request)," \
       "nginx $N_RPS req/s (${N_CPU[-1]} us CPU/request), ratio ${RATIOS[-1]};" \
       "floor $F_RPS req/s (${F_CPU[-1]} us CPU/request)"
  K_ALL+=("$K_RPS"); N_ALL+=("$N_RPS"); F_ALL+=("$F_RPS")
done
K_ERR2=${ERRS[kvroute]}; N_ERR2=${ERRS[nginx]}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
# shellcheck disable=SC2086
D_P50=$(median ${L50[direct]}); D_P99=$(median ${L99[direct]}); D_ERR=${LERR[direct]}
# shellcheck disable=SC2086
K_P50=$(median ${L50[kvroute]}); K_P99=$(median ${L99[kvroute]}); K_ERR=${LERR[kvroute]}
# shellcheck disable=SC2086
N_P50=$(median ${L50[nginx]}); N_P99=$(median ${L99[nginx]}); N_ERR=${LERR[nginx]}
# shellcheck disable=SC2086
FL_P50=$(median ${L50[floor]}); FL_P99=$(median ${L99[floor]})
K_CPU_MED=$(median "${K_CPU[@]}"); N_CPU_MED=$(median "${N_CPU[@]}")
F_RPS=$(median "${F_ALL[@]}"); F_CPU_MED=$(median "${F_CPU[@]}")
RATIO=$(median "${RATIOS[@]}")
K_RPS=$(median "${K_ALL[@]}"); N_RPS=$(median "${N_ALL[@]}")
# c1 columns: medians over the latency rounds; c16: req/s is the median round,
# latencies are the last round's.
printf '%-8s %14s %14s %12s %16s %16s %8s\n' target c1_p50_us c1_p99_us c16_req/s c16_p50_us c16_p99_us non2xx
printf '%-8s %14.0f %14.0f %12.0f %16.0f %16.0f %8s\n' \
  direct "$D_P50" "$D_P99" "$D_RPS" "$D_L50" "$D_L99" "$((D_ERR + D_ERR2))" \
  kvroute "$K_P50" "$K_P99" "$K_RPS" "$K_L50" "$K_L99" "$((K_ERR + K_ERR2))" \
  nginx "$N_P50" "$N_P99" "$N_RPS" "$N_L50" "$N_L99" "$((N_ERR + N_ERR2))"
# The floor allocates nothing per request once warm: it counts its heap
# allocations (replaced operator new) and prints them when stopped.
kill -TERM "$FLOORPID"; wait "$FLOORPID" 2>/dev/null || true
FLOOR_ALLOCS=$(sed -n 's/.*per request: \([-0-9.]*\).*/\1/p' "$W/floor.log")
echo "floor proxy: $(cat "$W/floor.log")"

# Streaming: slow decode so every stream stays open while all are established.
kill "${pids[@]:1}" 2>/dev/null || true; wait "${pids[@]:1}" 2>/dev/null || true; pids=("${pids[0]}"); MPORTS=()
start_mockers --speedup 1 --max-seqs 20000 --kv-blocks 10000000 --engine-profile dynamo-mocker --decode-base-ms 1000 --decode-kv-ms 0
"$BIN/router/kvroute" --router.host 127.0.0.1 --router.port "$RPORT" --admin.host 127.0.0.1 --admin.port "$APORT" \
  --router.threads 2 --log.access_log false --events.nats_url "nats://127.0.0.1:$NATS" >"$W/kvroute2.log" 2>&1 &
KVPID=$!; pids+=($KVPID)
for _ in $(seq 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$RPORT/ready")" = 200 ] && break; sleep 0.1; done
PEAK_FILE="$W/peak"; echo 0 >"$PEAK_FILE"
( while kill -0 "$KVPID" 2>/dev/null; do
    r=$(awk '/VmRSS/{print $2}' "/proc/$KVPID/status" 2>/dev/null || echo 0)
    [ "${r:-0}" -gt "$(cat "$PEAK_FILE")" ] && echo "$r" >"$PEAK_FILE"; sleep 0.2; done ) & pids+=($!)
# 20 tokens at 1 s each: every stream is still open when the last one starts.
STREAM_JSON=$(python3 bench/proxy/streams.py "$RPORT" "$STREAMS" 20)
echo "streams: $STREAM_JSON"
RSS_MB=$(( $(cat "$PEAK_FILE") / 1024 ))
python3 - "$D_P50" "$D_P99" "$K_P50" "$K_P99" "$K_RPS" "$N_RPS" "$STREAM_JSON" "$RSS_MB" "$N_P50" "$N_P99" "$RATIO" \
  "${RATIOS[*]}" "$K_CPU_MED" "$N_CPU_MED" "$F_RPS" "$F_CPU_MED" "$THREADS" "$FL_P50" "$FL_P99" "${FLOOR_ALLOCS:--1}" \
  "$ROUNDS" <<'PY'
import json, sys
d50, d99, k50, k99, krps, nrps = map(float, sys.argv[1:7])
s = json.loads(sys.argv[7])
n50, n99 = map(float, sys.argv[9:11])
ratio, rounds = float(sys.argv[11]), [float(x) for x in sys.argv[12].split()]
kcpu, ncpu = float(sys.argv[13]), float(sys.argv[14])
frps, fcpu = float(sys.argv[15]), float(sys.argv[16])
threads = int(sys.argv[17])
fl50, fl99, floor_allocs, rounds_n = float(sys.argv[18]), float(sys.argv[19]), float(sys.argv[20]), int(sys.argv[21])
print(json.dumps({"added_latency_p50_us": round(k50 - d50, 1), "added_latency_p99_us": round(k99 - d99, 1),
                  "nginx_added_latency_p50_us": round(n50 - d50, 1), "nginx_added_latency_p99_us": round(n99 - d99, 1),
                  "throughput_ratio_vs_nginx": ratio, "throughput_ratio_rounds": rounds, "proxy_threads": threads,
                  "kvroute_rps_median": krps, "nginx_rps_median": nrps,
                  "kvroute_cpu_us_per_request": kcpu, "nginx_cpu_us_per_request": ncpu,
                  "floor_rps_median": frps, "floor_cpu_us_per_request": fcpu,
                  "floor_added_latency_p50_us": round(fl50 - d50, 1), "floor_added_latency_p99_us": round(fl99 - d99, 1),
                  "floor_allocations_per_request": floor_allocs, "rounds": rounds_n, "latency": "median over rounds",
                  "streams_requested": s["streams_requested"], "concurrent_streams": s["peak_established"],
                  "streams_completed": s["completed"],
                  "stream_errors": s["stream_errors"], "router_rss_mb": int(sys.argv[8])}))
PY
