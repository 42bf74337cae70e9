#!/usr/bin/env bash
# The overload run of router/flow/ at full length: arrivals at ~3x the fleet's
# capacity for 60 s (tests/faults/test_overload.py; CTest runs it for 12 s),
# two tenants at 10:1 traffic, two priority bands; prints what each tenant was
# served, 429s and their Retry-After, anything lost, the queue's peak against
# its bounds, and the high band's TTFT p99 loaded vs unloaded.
# Run: bash bench/flow/overload.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export PATH="$PATH:/usr/sbin"
exec python3 "$here/../../tests/faults/test_overload.py" --build-dir "${1:-build}" --duration "${2:-60}"
