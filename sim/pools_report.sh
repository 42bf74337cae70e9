#!/usr/bin/env bash
# Regenerates the KV tiers' results in docs/sim/:
#   pools.md           sim/pools_notes.md (findings, by hand), then `kvroute-sim pools` on the agentic workload (12,000 requests, 8 engines, rates x1
#                      and x2): TTFT p50/p99 and hit rate without tiers, with a host tier, with a shared
#                      pool at 5, 12.5 and 50 GB/s, with both, and with both and the pool written
#                      through at 12.5 GB/s, for kvroute and dynamo
#   pools_small.jsonl  the reduced table the sim_pools_table test pins (keep its arguments in sync with
#                      sim/CMakeLists.txt)
#   bash sim/pools_report.sh     (after building kvroute-sim; 3.5 minutes of CPU: 10 minutes on 2 cores
#                                 shared with other jobs)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/sim/kvroute-sim
OUT=docs/sim
mkdir -p "$OUT"
"$BIN" pools --requests 2000 --workers 4 --seed 1 2>/dev/null | grep '^{' >"$OUT/pools_small.jsonl"
{
  cat sim/pools_notes.md
  echo "Regenerate with \`bash sim/pools_report.sh\` (the model: sim/README.md, \"KV tiers\")."
  echo "Command: \`kvroute-sim pools --rates 1,2 --seed 1\`."
  echo
  "$BIN" pools --rates 1,2 --seed 1 2>/dev/null | grep -v '^{'
} >"$OUT/pools.md.tmp"
mv "$OUT/pools.md.tmp" "$OUT/pools.md"
