#!/usr/bin/env bash
# Regenerates the capacity plan in docs/plan/ (README "Size a fleet's KV cache"):
#   README.md         sim/plan_notes.md (findings, by hand), then `kvroute-sim plan` on the Mooncake trace's test slice (8 workers, h100-llama3-8b):
#                     hit rate and TTFT by device, host tier and pool size, LRU vs workload-aware
#                     eviction, and the smallest fleet meeting TTFT p90 <= 2 s at the trace's rate
#   capacity.dat      the grid, for the plots
#   hit_rate.png, ttft.png   the curves
#   plan_small.jsonl  the reduced table the sim_plan_table test pins (keep its arguments in sync with
#                     sim/CMakeLists.txt)
#   bash sim/plan_report.sh   (after building kvroute-sim; about 2 min 15 s of CPU, 2 min 20 s wall on 2 cores
#                             at load average 3; up to 12 minutes shared with other jobs, load average 10)
# Another trace: TRACE=path/to/trace.jsonl OUT=plan-out bash sim/plan_report.sh (the Mooncake JSONL shape,
# traces/README.md): the same tables and plots in OUT, without the Mooncake notes and the pinned table.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/sim/kvroute-sim
OUT=${OUT:-docs/plan}
mkdir -p "$OUT"
TRACE_ARGS=()
[ -n "${TRACE:-}" ] && TRACE_ARGS=(--trace "$TRACE")
command -v gnuplot >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox >/dev/null
if [ -z "${TRACE:-}" ]; then
  "$BIN" plan --requests 3000 --workers 4 --plan-device 1 --plan-host 0,2 --plan-pool 0,1 \
    --seed 1 2>/dev/null | grep '^{' >"$OUT/plan_small.jsonl"
fi
{
  [ -z "${TRACE:-}" ] && cat sim/plan_notes.md
  echo "Regenerate with \`bash sim/plan_report.sh\`. Command: \`kvroute-sim plan ${TRACE_ARGS[*]} --seed 1 --dat-out $OUT/capacity.dat\`."
  echo
  "$BIN" plan "${TRACE_ARGS[@]}" --seed 1 --dat-out "$OUT/capacity.dat" 2>/dev/null | grep -v '^{'
  echo
  echo '![hit rate by tier size](hit_rate.png)'
  echo
  echo '![TTFT by tier size](ttft.png)'
} >"$OUT/README.md.tmp"
mv "$OUT/README.md.tmp" "$OUT/README.md"
gnuplot <<GP
set terminal pngcairo size 1200,480 noenhanced
set output "$OUT/hit_rate.png"
set multiplot layout 1,2 title "kvroute-sim plan: prefix hit rate by host tier and pool size (Mooncake trace, test slice)"
set grid; set key bottom right; set xlabel "host tier per worker (x device)"; set ylabel "hit rate"
do for [d in "0.5 1"] {
  set title sprintf("device = %s x the profile's (h100-llama3-8b)", d)
  plot for [p in "0 1 4"] "< awk '\$1==".d." && \$3==".p." && \$4==0' $OUT/capacity.dat" using 2:5 with linespoints lw 2 title "pool ".p."x, lru", \
       for [p in "1 4"] "< awk '\$1==".d." && \$3==".p." && \$4==1' $OUT/capacity.dat" using 2:5 with linespoints lw 2 dt 2 title "pool ".p."x, workload-aware", \
       "< awk '\$1==".d." && \$3==0 && \$4==1' $OUT/capacity.dat" using 2:5 with linespoints lw 2 dt 2 title "no pool, workload-aware"
}
unset multiplot
GP
gnuplot <<GP
set terminal pngcairo size 1200,480 noenhanced
set output "$OUT/ttft.png"
set multiplot layout 1,2 title "kvroute-sim plan: TTFT by host tier and pool size (device = the profile's, Mooncake trace, test slice)"
set grid; set key top right; set xlabel "host tier per worker (x device)"; set ylabel "ms"
set title "TTFT p50"
plot for [p in "0 1 4"] "< awk '\$1==1 && \$3==".p." && \$4==0' $OUT/capacity.dat" using 2:6 with linespoints lw 2 title "pool ".p."x, lru", \
     for [p in "0 1 4"] "< awk '\$1==1 && \$3==".p." && \$4==1' $OUT/capacity.dat" using 2:6 with linespoints lw 2 dt 2 title "pool ".p."x, workload-aware"
set title "TTFT p90 (the SLO's percentile)"
plot for [p in "0 1 4"] "< awk '\$1==1 && \$3==".p." && \$4==0' $OUT/capacity.dat" using 2:7 with linespoints lw 2 title "pool ".p."x, lru", \
     for [p in "0 1 4"] "< awk '\$1==1 && \$3==".p." && \$4==1' $OUT/capacity.dat" using 2:7 with linespoints lw 2 dt 2 title "pool ".p."x, workload-aware"
unset multiplot
GP
