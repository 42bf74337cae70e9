#!/usr/bin/env bash
# Builds kvroute-helm-render offline: GOPATH mode over Debian's Go sources in
# /usr/share/gocode (golang-go, golang-github-masterminds-sprig-dev,
# golang-k8s-sigs-yaml-dev). No module download.
#
#   helm/tools/render/build.sh [OUT_DIR]     # default helm/tools/render/bin
#   helm/tools/render/build.sh --test        # go test (the renderer's own unit tests)
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$src/bin}"
for d in /usr/share/gocode/src/github.com/Masterminds/sprig /usr/share/gocode/src/sigs.k8s.io/yaml; do
  if [[ ! -d "$d" ]]; then
    echo "kvroute-helm-render: $d missing: apt-get install golang-go golang-github-masterminds-sprig-dev golang-k8s-sigs-yaml-dev" >&2
    exit 1
  fi
done
export GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOPROXY=off
export GOCACHE="${GOCACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/go-build}"
cd "$src"
if [[ "$out" == "--test" ]]; then
  exec go test .
fi
mkdir -p "$out"
go build -o "$out/kvroute-helm-render" .
