#!/usr/bin/env bash
# bench/soak.sh: DURATION seconds (default 600) of mixed streaming and
# non-streaming traffic at the highest rate CONCURRENCY closed-loop clients
# (default 16) reach, through kvroute in front of 4 kvroute-mockers on a real
# nats-server, with worker kills (and restarts) and a NATS restart in the
# middle. Prints progress and the figures; the last line is one JSON object:
# {"requests","errors","errors_documented","rss_mb_start","rss_mb_end","fds_start","fds_end",...}
#   DURATION=60 bash bench/soak.sh        # a shorter run
#   HOSTILE=1 bash bench/soak.sh          # plus one hostile event publisher on the bus (soak.py --hostile)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin"
exec python3 bench/soak/soak.py --build-dir "${BUILD_DIR:-build}" --duration "${DURATION:-600}" \
  --concurrency "${CONCURRENCY:-16}" ${HOSTILE:+--hostile}
