#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, and runs
# every test (ctest -j2: unit, integration, faults, fuzz, image, bench-smoke). .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
KVROUTE_TEST_PACKAGES=1 bash scripts/setup.sh
# The official OpenAI and Anthropic SDKs for the client tests (npm registry, install time only).
if [ ! -d tests/integration/node/node_modules/openai ] || [ ! -d tests/integration/node/node_modules/@anthropic-ai/sdk ]; then
  command -v npm >/dev/null || { apt-get install -y -qq nodejs npm >/dev/null; }
  (cd tests/integration/node && npm ci --no-audit --no-fund --loglevel=error)
fi
# playwright-core drives Debian's chromium in the status page test (no browser download).
if [ ! -d tests/integration/browser/node_modules/playwright-core ]; then
  command -v npm >/dev/null || { apt-get install -y -qq nodejs npm >/dev/null; }
  (cd tests/integration/browser && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi
export PATH="$PATH:/usr/sbin:/sbin"   # nats-server lives in /usr/sbin
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 -j2 "$@"   # the suite passes under -j1 too
