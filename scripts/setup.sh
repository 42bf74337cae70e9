#!/usr/bin/env bash
# Installs kvroute's Debian build and run dependencies (idempotent: only what
# is missing) and builds it. Used by scripts/demo.sh and scripts/test.sh.
#   BUILD_DIR   build directory (default: build)
#   BUILD_TYPE  CMake build type (default: RelWithDebInfo)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  g++ cmake ninja-build pkg-config curl python3
  libboost-dev libnats-dev nats-server libsimdjson-dev libfmt-dev doctest-dev
  libyaml-cpp-dev libcli11-dev libxxhash-dev libspdlog-dev
  # helm/ chart renderer and its test (Go text/template + sprig, as Helm)
  golang-go golang-github-masterminds-sprig-dev golang-k8s-sigs-yaml-dev python3-yaml
  # events/ ZMQ KV events from vLLM/SGLang (libzmq + cppzmq, msgpack-c), their
  # reference publisher in the tests (python3-zmq, python3-msgpack)
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev python3-zmq python3-msgpack
  # fleet/ DNS discovery (c-ares: A/AAAA records, custom servers) and its test DNS server
  libc-ares-dev python3-dnslib
  # tokenizer/ (PCRE2 with JIT for the pre-tokenizer regexes)
  libpcre2-dev
  # tests/faults: certificates for the NATS TLS test, made at test time
  openssl
  # tokenizer tests: corpus sources (tests/tokenizer/make_corpus.py) and Unicode data
  unicode-data wamerican fortunes fortunes-de fortunes-es fortunes-ru fortunes-it fortunes-cs fortunes-zh
  # tests/fuzz/ (scripts/fuzz.sh): clang 14 with libFuzzer and the ASan/UBSan runtimes
  clang-14 libclang-rt-14-dev
  # tokenizer tests: the Python Jinja2 reference (tests/tokenizer/jinja_python_reference.sh)
  python3-jinja2
)
# Test-only (scripts/test.sh sets KVROUTE_TEST_PACKAGES=1): the status page in
# headless chromium, a real Prometheus scraping kvroute, the offline OCI image
# build (mmdebstrap + umoci).
if [ "${KVROUTE_TEST_PACKAGES:-0}" = 1 ]; then
  PACKAGES+=(chromium prometheus mmdebstrap umoci)
fi
PACKAGES+=(${KVROUTE_EXTRA_PACKAGES:-})

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build "$BUILD_DIR" -j2
