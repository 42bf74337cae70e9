#!/usr/bin/env bash
# The overload run of router/flow/ at full length: arrivals at ~3x the fleet's
# capacity for 60 s (tests/faults/test_overload.py; CTest runs it for 12 s),
# two tenants at 10:1 traffic, two priority bands (5 % high; the normal band
# keeps 50 % of every worker's slots for it, flow.bands reserve_pct); prints
# 200 / 429 with Retry-After / other / lost, the small tenant's share against
# its weighted share, the queue's peak against its bounds, and the high band's
# TTFT p99 loaded vs unloaded.
# Run: bash bench/flow/overload.sh [BUILD_DIR] [SECONDS] (further flags of
# test_overload.py after them, e.g. --reserve-pct 0 for the no-reserve run)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export PATH="$PATH:/usr/sbin"
exec python3 "$here/../../tests/faults/test_overload.py" --build-dir "${1:-build}" --duration "${2:-60}" "${@:3}"
