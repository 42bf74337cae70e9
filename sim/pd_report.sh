#!/usr/bin/env bash
# Regenerates kvroute-sim's disaggregated-fleet results in docs/sim/:
#   pd.md            sim/pd_notes.md, then `kvroute-sim pd` on 8 engines (8 aggregated vs 4P+4D, rates
#                    x0.5, x1, x1.5) and on 4 engines (4 vs 2P+2D, x0.25, x0.5, x0.75)
#   pd_tune.txt      `kvroute-sim pd-tune`: kvroute_pd's thresholds on the trace's train slice, shown on test
#   pd_small.jsonl   the reduced table the sim_pd_table test pins (keep its arguments in sync with
#                    sim/CMakeLists.txt)
#   bash sim/pd_report.sh     (after building kvroute-sim; about 15 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/sim/kvroute-sim
OUT=docs/sim
mkdir -p "$OUT"
# kvroute_pd's keys as pd-tune chose them on the trace's train slice (docs/sim/pd_tune.txt); the tables
# below are on the test slice and the generated workloads.
TUNED=(--set pd.min_uncached_tokens=8192 --set pd.prefill_busy_tokens=65536)
"$BIN" pd-tune --pd 4:4 --rates 0.5,1,1.5 --seed 1 2>/dev/null >"$OUT/pd_tune.txt"
"$BIN" pd --pd 2:2 --requests 1500 --rates 1 --seed 1 "${TUNED[@]}" 2>/dev/null | grep '^{' >"$OUT/pd_small.jsonl"
{
  cat sim/pd_notes.md
  echo
  echo '## 8 engines: 8 aggregated vs 4 prefill + 4 decode'
  echo
  echo "\`kvroute-sim pd --pd 4:4 --rates 0.5,1,1.5 --seed 1 ${TUNED[*]}\`"
  echo
  "$BIN" pd --pd 4:4 --rates 0.5,1,1.5 --seed 1 "${TUNED[@]}" 2>/dev/null | grep -v '^{'
  echo
  echo '## 4 engines: 4 aggregated vs 2 prefill + 2 decode'
  echo
  echo "\`kvroute-sim pd --pd 2:2 --rates 0.25,0.5,0.75 --seed 1 ${TUNED[*]}\`"
  echo
  "$BIN" pd --pd 2:2 --rates 0.25,0.5,0.75 --seed 1 "${TUNED[@]}" 2>/dev/null | grep -v '^{'
  echo
  echo '## Tuning (train slice only)'
  echo
  echo '`kvroute-sim pd-tune --pd 4:4 --rates 0.5,1,1.5 --seed 1` (docs/sim/pd_tune.txt):'
  echo
  echo '```'
  cat "$OUT/pd_tune.txt"
  echo '```'
} >"$OUT/pd.md"
