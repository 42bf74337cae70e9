#!/usr/bin/env bash
# Regenerates kvroute-sim's disaggregated-fleet results in docs/sim/:
#   pd.md            sim/pd_notes.md, then `kvroute-sim pd` on 8 engines (8 aggregated vs 4P+4D, rates
#                    x0.5, x1, x1.5) and on 4 engines (4 vs 2P+2D, x0.25, x0.5, x0.75)
#   pd_tune.txt      `kvroute-sim pd-tune`: kvroute_pd's keys on the train slices, shown on test
#   pd_small.jsonl   the reduced table the sim_pd_table test pins (keep its arguments in sync with
#                    sim/CMakeLists.txt)
#   bash sim/pd_report.sh     (after building kvroute-sim; about 2 minutes on 2 cores, pd-tune 1 of them)
#   PD_TUNE_FROM=FILE bash sim/pd_report.sh   takes pd_tune.txt from FILE, the output of the pd-tune
#                             command below run apart on the same code, instead of running it again
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/sim/kvroute-sim
OUT=docs/sim
mkdir -p "$OUT"
# kvroute_pd's keys as pd-tune chooses them on the train slices (docs/sim/pd_tune.txt; 3,000 requests
# per workload before the trace's time split, for time); the tables below are on the test slices.
# sim/CMakeLists.txt's sim_pd_table passes the same keys: keep them in sync.
TUNED=(--set pd.min_uncached_tokens=512 --set pd.aggregate_time_ratio=0.7 --set pd.decode_busy_kv_usage=0.8 --set pd.decode_alpha=0.7)
if [ -n "${PD_TUNE_FROM:-}" ]; then
  grep -q '^best-sets: ' "$PD_TUNE_FROM" || { echo "pd_report.sh: $PD_TUNE_FROM is not a finished pd-tune's output" >&2; exit 1; }
  [ "$PD_TUNE_FROM" -ef "$OUT/pd_tune.txt" ] || cp "$PD_TUNE_FROM" "$OUT/pd_tune.txt"
else
  "$BIN" pd-tune --pd 4:4 --rates 0.5,1,1.5 --seed 1 --requests 3000 2>/dev/null >"$OUT/pd_tune.txt"
fi
chosen=$(sed -n 's/^best-sets: //p' "$OUT/pd_tune.txt")
if [[ "$chosen" != "${TUNED[*]}" ]]; then
  echo "pd_report.sh: pd-tune chose '$chosen', TUNED is '${TUNED[*]}': update TUNED and sim_pd_table" >&2
  exit 1
fi
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
  echo '## Tuning (train slices only)'
  echo
  echo '`kvroute-sim pd-tune --pd 4:4 --rates 0.5,1,1.5 --seed 1 --requests 3000` (docs/sim/pd_tune.txt):'
  echo
  echo '```'
  cat "$OUT/pd_tune.txt"
  echo '```'
} >"$OUT/pd.md"
