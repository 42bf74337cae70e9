#!/usr/bin/env bash
# Regenerates docs/sim/: kvroute-sim's target table (kvroute vs dynamo, llmd,
# round_robin on the Mooncake trace's test slice and the generated agentic,
# api and bursts workloads, at rate x1, x2, x3), the tuning run (train slice
# -> held-out results), per-rate tables on the trace, plots, and the reduced
# table that the sim_targets test pins (docs/sim/targets_small.jsonl).
#   bash sim/report.sh        (after scripts/setup.sh; installs gnuplot-nox)
#   README_ONLY=1 bash sim/report.sh   rebuilds docs/sim/README.md from the files already there
#                                      (after editing sim/report_notes.md)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/sim/kvroute-sim
command -v gnuplot >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox >/dev/null
OUT=docs/sim
mkdir -p "$OUT"
# The engines: kvroute-sim's default profile (h100-llama3-8b) with its own KV capacity (875 blocks of 512 tokens).
ARGS=(--workers 8 --seed 1)
POLICIES=round_robin,random,least_loaded,dynamo_v01,dynamo,llmd,kvroute
NAMES="round_robin random least_loaded dynamo_v01 dynamo llmd kvroute"
if [ -z "${README_ONLY:-}" ]; then
"$BIN" targets "${ARGS[@]}" --rates 1,2,3 2>/dev/null >"$OUT/targets.txt"
# The reduced table the test suite holds (tests: sim_targets); keep its arguments in sync with sim/CMakeLists.txt.
"$BIN" targets --workers 4 --kv-blocks 2000 --requests 2000 --rates 1,3 --seed 1 2>/dev/null | grep '^{' >"$OUT/targets_small.jsonl"
"$BIN" tune "${ARGS[@]}" --rates 1,2,3 2>/dev/null >"$OUT/tune.txt"
"$BIN" goodput "${ARGS[@]}" --goodput-steps 4 2>/dev/null >"$OUT/goodput.txt"
# Session affinity, with and without, on the one workload that has sessions (agentic).
: >"$OUT/affinity.txt"
for rate in 1 2 3; do
  for on in false true; do
    "$BIN" "${ARGS[@]}" --workload agentic --policies kvroute --rate "$rate" --set scheduler.session_affinity=$on \
      2>/dev/null | tail -1 | python3 -c "
import json, sys
k = json.load(sys.stdin)['kvroute']
print('| x$rate | $on | %.3f | %.1f | %.1f | %.1f |' % (k['hit_rate'], k['ttft_p50_ms'], k['ttft_p99_ms'], k['e2e_p50_ms']))" >>"$OUT/affinity.txt"
  done
done
: >"$OUT/rates.dat"
for rate in 1 2 3; do
  "$BIN" "${ARGS[@]}" --slice test --policies "$POLICIES" --rate "$rate" --cdf-out "$OUT/ttft_cdf_x$rate.dat" 2>/dev/null >"$OUT/run_x$rate.txt"
  tail -1 "$OUT/run_x$rate.txt" | python3 -c "
import json, sys
r = json.load(sys.stdin)
for p in '$NAMES'.split():
    print($rate, p, r[p]['hit_rate'], r[p]['ttft_p50_ms'], r[p]['ttft_p99_ms'])" >>"$OUT/rates.dat"
done
gnuplot <<GP
set terminal pngcairo size 900,560 noenhanced
set output "$OUT/ttft_cdf_x1.png"
set title "TTFT CDF, Mooncake trace test slice, 8 workers, rate x1 (kvroute-sim)"
set xlabel "time to first token (ms)"; set ylabel "fraction of requests"
set logscale x; set key bottom right; set grid
names = "$NAMES"
plot for [i=0:6] "$OUT/ttft_cdf_x1.dat" index i using 1:2 with lines lw 2 title word(names, i+1)
GP
gnuplot <<GP
set terminal pngcairo size 1200,480 noenhanced
set output "$OUT/rate_sweep.png"
set multiplot layout 1,2
names = "$NAMES"
set key top left; set grid; set xlabel "request rate (x trace)"; set xtics 1
set title "prefix hit rate"; set ylabel "hit rate"; set key right center
plot for [n in names] "< grep ' ".n." ' $OUT/rates.dat" using 1:3 with linespoints lw 2 title n
set title "TTFT p50"; set ylabel "ms"; set key top left
plot for [n in names] "< grep ' ".n." ' $OUT/rates.dat" using 1:4 with linespoints lw 2 title n
unset multiplot
GP
fi
{
  echo "# kvroute-sim results"
  echo
  echo "Regenerate with \`bash sim/report.sh\`. 8 simulated engines (mocker/engine.h) on the engine profile"
  echo "h100-llama3-8b (mocker/profile.h: step times fitted to H100 measurements of a Llama-3-8B-shaped model,"
  echo "chunked prefill with vLLM's 8,192-token step budget) with that profile's KV capacity, 875 blocks of 512"
  echo "tokens each (448,308 tokens: an H100's memory at vLLM's 0.9 utilisation, less the weights and a 2 GiB"
  echo "reserve), 64 sequences, load reports every 100 ms, seed 1. Rate x1 replays"
  echo "each workload's own timing; x2 and x3 compress it. The Mooncake conversation trace is split in time:"
  echo "\`kvroute-sim tune\` chose the defaults on its first half (train); every figure below is on its"
  echo "second half (test) or on a generated workload (sim/workload.h) that tuning never saw."
  echo
  echo "## Targets"
  echo
  echo "kvroute (defaults) vs the peers (sim/policies.h cites the source each follows). Targets: TTFT p50"
  echo "and p99 <= 0.8x dynamo and llmd, <= 0.5x round_robin at the stressed level (x3), hit rate >= 0.9"
  echo "of the infinite-cache ideal, never worse than dynamo. **MISS** marks a target not met, and says"
  echo "whether it is floor-bound (the causal engine floor below is above the target: no router can meet"
  echo "it) or reachable (the floor is below the target), with both figures."
  echo
  # The target table: the first run of table lines in targets.txt; the floor table is the second.
  awk '/^\|/{p=1; print; next} p{exit}' "$OUT/targets.txt"
  echo
  python3 - "$OUT/targets.txt" <<'PY'
import sys
lines = open(sys.argv[1]).read().split('\n\n')[0].splitlines()
cells = [l for l in lines if l.startswith('| ') and not l.startswith('| workload')]
miss = sum(l.count('MISS') for l in cells) + sum(l.count('| NO |') for l in cells)
bound = sum(l.count('floor-bound') for l in cells)
reach = sum(l.count('(reachable') for l in cells)
print("Missed targets: %d (of %d cells' targets): %d floor-bound, %d reachable TTFT targets, the rest hit rate"
      " and never-worse-than-dynamo. Every miss is listed in the table above." % (miss, len(cells) * 6, bound, reach))
PY
  echo
  echo "## The causal engine floor"
  echo
  echo "sim/floor.h: each request's TTFT with one infinite cache and nothing queued, from the engine's step"
  echo "model (the prefill of its uncached tokens on the profile, chunked by the step budget as the engine"
  echo "chunks it; no decode step, since a request admitted to an idle engine has its first token when its"
  echo "prefill ends). Causal: a block is available only from the end of the chunk that completes it in the"
  echo "earliest-finishing request computing it, and each request takes the better of"
  echo "computing its whole prompt or waiting for an available prefix and computing the rest. Every request's"
  echo "TTFT is at least its floor (the router dispatches on arrival and engines admit FIFO), so each"
  echo "percentile of the floor bounds the same percentile of any router's TTFT. The acausal floor (the old"
  echo "one: a block counts as cached as soon as an earlier request wanted it) is shown for comparison; they"
  echo "differ in bursts, where many requests want a document someone is still computing."
  echo "The last column states the decode interference the floors leave out (sim/floor.h decode_interference):"
  echo "by Little's law the fleet carries on average at least the decoding requests that the workload's"
  echo "outputs keep busy at one batch-1 decode step per token; spread over the workers, that many decodes"
  echo "share each prefill step on average and add the given ms to it. Not a bound on any one request (a"
  echo "router may place it where nothing decodes), but unavoidable for the fleet on average."
  echo
  awk '/^\|/{if (seen_blank) print; next} /^$/{seen_blank=1}' "$OUT/targets.txt"
  echo
  cat sim/report_notes.md
  echo
  echo "## Goodput"
  echo
  echo "\`kvroute-sim goodput\` (sim/README.md): per workload and policy, the highest arrival rate (x the"
  echo "workload's own) with TTFT p99 <= 2 s, inter-token latency p99 <= 1 s and nothing rejected, by bisection."
  echo
  grep '^|' "$OUT/goodput.txt"
  echo
  echo "## Session affinity (agentic sessions, kvroute defaults with and without)"
  echo
  echo "| rate | session_affinity | hit rate | TTFT p50 ms | TTFT p99 ms | e2e p50 ms |"
  echo "|---|---|---|---|---|---|"
  cat "$OUT/affinity.txt"
  echo
  echo "Off by default (scheduler.session_affinity). On the h100-llama3-8b profile's capacity, with nothing"
  echo "rejected, it is the difference between an overloaded fleet and a working one at x1 (hit rate 0.51 -> 0.81,"
  echo "TTFT p50 143 s -> 304 ms, p99 818 -> 10.8 s) and cuts p50 by 3x at x2 and x3 (521 -> 166 s, 700 -> 243 s),"
  echo "below both peers there; the default was chosen on the old engine model and is left to a tune that"
  echo "weighs sessions (the trace's train slice has none)."
  echo
  echo "## Tuning (train slice) and held-out results"
  echo
  echo '```'
  cat "$OUT/tune.txt"
  echo '```'
  for rate in 1 2 3; do
    echo; echo "## Trace test slice, rate x$rate, every policy"; echo; echo '```'
    sed -n '2,11p' "$OUT/run_x$rate.txt"
    echo '```'
  done
  echo
  echo "gap: 1 - cached blocks achieved / the longest cached prefix among eligible workers (index view);"
  echo "mape: the TTFT model's mean absolute percentage error over the run (scheduler/ttft_model.h)."
  echo
  echo "![TTFT CDF](ttft_cdf_x1.png)"
  echo
  echo "![hit rate and TTFT vs rate](rate_sweep.png)"
} >"$OUT/README.md"
echo "wrote $OUT/README.md, $OUT/targets.txt, $OUT/targets_small.jsonl, $OUT/tune.txt, plots"
