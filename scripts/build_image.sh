#!/usr/bin/env bash
# Builds kvroute's container image without a Docker daemon and without any
# registry but Debian's: an OCI image archive holding the same image as the
# Dockerfile's runtime stage (Debian 12 "bookworm" minbase with the slim
# image's path exclusions, the shared libraries kvroute links, the kvroute
# and kvroute-mocker binaries, user kvroute 10001:10001, entrypoint kvroute).
#
#   scripts/build_image.sh [OUT_DIR]        (default: build/image; needs root)
#     KVROUTE_BIN   kvroute binary to ship   (default: build/router/kvroute)
#     MOCKER_BIN    kvroute-mocker to ship   (default: build/mocker/kvroute-mocker)
#     IMAGE_TAG     tag (default: appVersion of helm/kvroute/Chart.yaml)
#
# Output: OUT_DIR/kvroute-oci.tar, an OCI image layout (tar) whose one image
# is named kvroute:IMAGE_TAG, the Helm chart's default image. Load it with
#   podman load -i OUT_DIR/kvroute-oci.tar
#   skopeo copy oci-archive:OUT_DIR/kvroute-oci.tar:IMAGE_TAG docker-daemon:kvroute:IMAGE_TAG
#
# How: mmdebstrap builds the root file system from this machine's apt sources
# (the runtime packages are the Debian packages owning the libraries `ldd`
# lists), then umoci packs it as one layer and writes the image config. The
# OCI config has no HEALTHCHECK field (a Docker extension): the Dockerfile's
# health check is the Helm chart's liveness probe (GET /health) there.
# Takes ~1-2 minutes (the packages are downloaded from the Debian mirror).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-build/image}")
BIN=$(realpath "${KVROUTE_BIN:-build/router/kvroute}")
MOCKER=$(realpath "${MOCKER_BIN:-build/mocker/kvroute-mocker}")
TAG=${IMAGE_TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' helm/kvroute/Chart.yaml)}
[ "$(id -u)" -eq 0 ] || { echo "build_image: needs root (mmdebstrap --mode=root, umoci unpack)" >&2; exit 2; }
for tool in mmdebstrap umoci; do
  command -v "$tool" >/dev/null || { echo "build_image: $tool missing (scripts/setup.sh installs it)" >&2; exit 2; }
done

# The Debian packages that own the shared libraries both binaries link
# directly (ELF NEEDED); apt brings their own dependencies.
runtime_packages() {
  for b in "$BIN" "$MOCKER"; do
    needed=$(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    ldd "$b" | awk -v n=" $(echo $needed) " 'index(n, " " $1 " ") && $3 ~ /^\// {print $3}'
  done | sort -u | while read -r lib; do
    dpkg -S "$lib" 2>/dev/null || dpkg -S "$(realpath "$lib")" 2>/dev/null || true
  done | cut -d: -f1 | sort -u | paste -sd, -
}
PACKAGES=$(runtime_packages)
echo "build_image: kvroute:$TAG from $BIN; packages: $PACKAGES"

WORK="$OUT/work"
rm -rf "$WORK" "$OUT/kvroute-oci.tar"
mkdir -p "$WORK"
umoci init --layout "$WORK/oci"
umoci new --image "$WORK/oci:$TAG"
umoci unpack --image "$WORK/oci:$TAG" "$WORK/bundle" >/dev/null

MIRROR=()
[ -f /etc/apt/sources.list.d/debian.sources ] && MIRROR=(/etc/apt/sources.list.d/debian.sources)
# Slim: no documentation, manuals or locales (as debian:bookworm-slim), no apt lists.
mmdebstrap --mode=root --variant=minbase --include="$PACKAGES" --dpkgopt=force-unsafe-io \
  --aptopt='Acquire::Check-Valid-Until "false"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook="copy-in $BIN $MOCKER /usr/bin/" \
  --customize-hook='strip --strip-debug "$1/usr/bin/kvroute" "$1/usr/bin/kvroute-mocker" 2>/dev/null || true' \
  --customize-hook='echo "kvroute:x:10001:10001:kvroute:/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd"' \
  --customize-hook='echo "kvroute:x:10001:" >> "$1/etc/group"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*' \
  bookworm "$WORK/bundle/rootfs" "${MIRROR[@]}" 2>"$WORK/mmdebstrap.log" \
  || { tail -20 "$WORK/mmdebstrap.log" >&2; exit 1; }

umoci repack --image "$WORK/oci:$TAG" "$WORK/bundle"
umoci config --image "$WORK/oci:$TAG" --os linux --architecture amd64 \
  --config.user 10001:10001 --config.workingdir / \
  --config.entrypoint /usr/bin/kvroute \
  --config.exposedports 8080/tcp --config.exposedports 8081/tcp \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.label org.opencontainers.image.title=kvroute \
  --config.label org.opencontainers.image.version="$TAG" \
  --config.label org.opencontainers.image.description="KV-cache-aware router for OpenAI-compatible LLM workers"
umoci gc --layout "$WORK/oci"
tar -C "$WORK/oci" -cf "$OUT/kvroute-oci.tar" .
rm -rf "$WORK/bundle"
echo "build_image: wrote $OUT/kvroute-oci.tar (kvroute:$TAG, $(du -h "$OUT/kvroute-oci.tar" | cut -f1))"
