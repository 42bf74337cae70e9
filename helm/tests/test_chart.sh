#!/usr/bin/env bash
# Builds the chart renderer (helm/tools/render, Go, offline from Debian's Go
# packages) and runs helm/tests/test_chart.py.
#
#   helm/tests/test_chart.sh [KVROUTE_BIN]
#
# KVROUTE_BIN (argument or environment): the kvroute daemon; with it the test
# also checks that values.yaml mirrors exactly the keys of `kvroute --print-config`
# and that the daemon loads the rendered kvroute.yaml. Without it those checks
# are skipped.
# RENDER_BIN_DIR (environment): where to build the renderer
# (default helm/tools/render/bin).
# Needs: golang-go, golang-github-masterminds-sprig-dev, golang-k8s-sigs-yaml-dev,
# python3 with PyYAML (python3-yaml).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
helm_dir="$(dirname "$here")"
if [[ $# -ge 1 ]]; then export KVROUTE_BIN="$1"; fi

bin_dir="${RENDER_BIN_DIR:-$helm_dir/tools/render/bin}"
"$helm_dir/tools/render/build.sh" "$bin_dir"

# A python3 that has PyYAML (pyenv shims may lack it; Debian's has python3-yaml).
py=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import yaml' 2>/dev/null; then py="$cand"; break; fi
done
if [[ -z "$py" ]]; then
  echo "test_chart: no python3 with PyYAML (apt-get install python3-yaml)" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
if "$helm_dir/tools/render/build.sh" --test; then unit=ok; else unit=failed; fi
exec "$py" "$here/test_chart.py" --render "$bin_dir/kvroute-helm-render" --renderer-unit-tests "$unit"
