#!/usr/bin/env bash
# Regenerates docs/sim/: the results table and plots of kvroute-sim on the
# Mooncake trace (8 workers x 8,000 blocks of 512 tokens), at rate x1, x2, x3.
#   bash sim/report.sh        (after scripts/setup.sh; installs gnuplot-nox)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/sim/kvroute-sim
command -v gnuplot >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox >/dev/null
OUT=docs/sim
mkdir -p "$OUT"
ARGS=(--workers 8 --kv-blocks 8000 --seed 1)
: >"$OUT/rates.dat"
for rate in 1 2 3; do
  "$BIN" "${ARGS[@]}" --rate "$rate" --cdf-out "$OUT/ttft_cdf_x$rate.dat" 2>/dev/null >"$OUT/run_x$rate.txt"
  tail -1 "$OUT/run_x$rate.txt" | python3 -c "
import json, sys
r = json.load(sys.stdin)
for p in ['round_robin', 'random', 'least_loaded', 'dynamo_baseline', 'kvroute']:
    print($rate, p, r[p]['hit_rate'], r[p]['ttft_p50_ms'], r[p]['ttft_p99_ms'])" >>"$OUT/rates.dat"
done
gnuplot <<GP
set terminal pngcairo size 900,560 noenhanced
set output "$OUT/ttft_cdf_x1.png"
set title "TTFT CDF, Mooncake trace, 8 workers, rate x1 (kvroute-sim)"
set xlabel "time to first token (ms)"; set ylabel "fraction of requests"
set logscale x; set key bottom right; set grid
names = "round_robin random least_loaded dynamo_baseline kvroute"
plot for [i=0:4] "$OUT/ttft_cdf_x1.dat" index i using 1:2 with lines lw 2 title word(names, i+1)
GP
gnuplot <<GP
set terminal pngcairo size 1200,480 noenhanced
set output "$OUT/rate_sweep.png"
set multiplot layout 1,2
names = "round_robin random least_loaded dynamo_baseline kvroute"
set key top left; set grid; set xlabel "request rate (x trace)"; set xtics 1
set title "prefix hit rate"; set ylabel "hit rate"; set key right center
plot for [n in names] "< grep ' ".n." ' $OUT/rates.dat" using 1:3 with linespoints lw 2 title n
set title "TTFT p50"; set ylabel "ms"; set key top left
plot for [n in names] "< grep ' ".n." ' $OUT/rates.dat" using 1:4 with linespoints lw 2 title n
unset multiplot
GP
{
  echo "# kvroute-sim results"
  echo
  echo "Regenerate with \`bash sim/report.sh\`. Mooncake conversation trace (12,031 requests), 8 simulated"
  echo "engines (mocker/engine.h) with 8,000 KV blocks of 512 tokens each, 64 sequences, load reports every"
  echo "100 ms, seed 1. Rate x1 replays the trace's timing; x2 and x3 compress it."
  python3 - "$OUT/run_x3.txt" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
k, b, rr, ideal = r["kvroute"], r["dynamo_baseline"], r["round_robin"], r["ideal"]["hit_rate"]
print()
print("Targets at rate x3 (round-robin visibly stressed: TTFT p99 %.1f s):" % (rr["ttft_p99_ms"] / 1000))
print()
print("| kvroute vs | TTFT p50 | TTFT p99 | target |")
print("|---|---|---|---|")
print("| dynamo_baseline | %.2fx | %.2fx | <= 0.8x |" % (k["ttft_p50_ms"] / b["ttft_p50_ms"], k["ttft_p99_ms"] / b["ttft_p99_ms"]))
print("| round_robin | %.2fx | %.2fx | <= 0.5x |" % (k["ttft_p50_ms"] / rr["ttft_p50_ms"], k["ttft_p99_ms"] / rr["ttft_p99_ms"]))
print()
print("Hit rate: kvroute %.3f = %.2f of the infinite-cache ideal %.3f (target >= 0.90)." % (k["hit_rate"], k["hit_rate"] / ideal, ideal))
PY
  for rate in 1 2 3; do
    echo; echo "## rate x$rate"; echo; echo '```'
    sed -n '2,8p' "$OUT/run_x$rate.txt"
    echo '```'
  done
  echo
  echo "![TTFT CDF](ttft_cdf_x1.png)"
  echo
  echo "![hit rate and TTFT vs rate](rate_sweep.png)"
} >"$OUT/README.md"
echo "wrote $OUT/README.md, $OUT/ttft_cdf_x1.png, $OUT/rate_sweep.png"
