#!/usr/bin/env bash
# Regenerates docs/ceiling/, the goodput ceiling (sim/ceiling.h: the rates at which no router keeps
# TTFT p99 within 2 s on the engine model) of the six workloads on 8 workers against each policy's
# measured goodput:
#   README.md           sim/ceiling_notes.md (the argument and the findings, by hand), then the table
#   ceiling.txt         `kvroute-sim ceiling --workers 8 --seed 1 --goodput-steps 4 --check` (goodput's
#                       own steps, as sim/report.sh runs it; fails if a goodput lies above the ceiling)
#   ceiling_small.jsonl the reduced table the sim_ceiling_table test pins (keep its arguments in sync
#                       with sim/CMakeLists.txt)
#   bash sim/ceiling_report.sh   (after building kvroute-sim; about 2 minutes of CPU, one simulation at a time)
#   README_ONLY=1 bash sim/ceiling_report.sh   rebuilds README.md from the files already there
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/sim/kvroute-sim
OUT=docs/ceiling
mkdir -p "$OUT"
CMD=(ceiling --workers 8 --seed 1 --goodput-steps 4 --check)
if [ -z "${README_ONLY:-}" ]; then
  "$BIN" "${CMD[@]}" 2>/dev/null >"$OUT/ceiling.txt"
  "$BIN" ceiling --workloads api,bursts,agentic --requests 2000 --workers 4 --goodput-steps 3 --seed 1 \
    2>/dev/null | grep '^{' >"$OUT/ceiling_small.jsonl"
fi
{
  cat sim/ceiling_notes.md
  echo
  echo "## The table"
  echo
  echo "\`kvroute-sim ${CMD[*]}\` (regenerate with \`bash sim/ceiling_report.sh\`; the raw output with its"
  echo "JSON lines is [ceiling.txt](ceiling.txt)):"
  echo
  grep '^|' "$OUT/ceiling.txt"
} >"$OUT/README.md"
