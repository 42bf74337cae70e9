# kvroute's container image. Two stages: build on Debian 12 with the same
# packages scripts/setup.sh installs, then a Debian 12 slim runtime with only
# the shared libraries kvroute links, run as a non-root user.
#   docker build -t kvroute:0.1.0 .
# Without a Docker daemon, scripts/build_image.sh builds the same image offline
# (mmdebstrap + umoci) as an OCI archive; the Helm chart's default image is
# kvroute:<appVersion> (helm/kvroute/Chart.yaml).

FROM debian:12 AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      g++ cmake ninja-build pkg-config libboost-dev libnats-dev libsimdjson-dev libfmt-dev doctest-dev \
      libyaml-cpp-dev libcli11-dev libxxhash-dev libspdlog-dev libpcre2-dev \
      libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libc-ares-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
 && cmake --build /build --target kvroute kvroute-mocker \
 && strip /build/router/kvroute /build/mocker/kvroute-mocker

FROM debian:12-slim
# The Debian packages owning the libraries kvroute and kvroute-mocker link
# directly (scripts/build_image.sh computes the same list from the binaries;
# tests/integration/test_image.py checks the two agree).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libc-ares2 libfmt9 libnats3.4 libpcre2-8-0 libsimdjson14 libspdlog1.10 libxxhash0 libyaml-cpp0.7 libzmq5 \
 && rm -rf /var/lib/apt/lists/* \
 && echo "kvroute:x:10001:10001:kvroute:/nonexistent:/usr/sbin/nologin" >> /etc/passwd \
 && echo "kvroute:x:10001:" >> /etc/group
COPY --from=build /build/router/kvroute /build/mocker/kvroute-mocker /usr/bin/
USER 10001:10001
# 8081: the admin listener binds 127.0.0.1 unless configured (admin.host): publish it with
# -e KVROUTE_ADMIN_HOST=0.0.0.0 (and an admin token); the Helm chart sets it.
EXPOSE 8080 8081
# GET /health on the router port (KVROUTE_ROUTER_PORT, default 8080) with
# bash's /dev/tcp: the slim image has no curl. Any HTTP version's 200 passes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${KVROUTE_ROUTER_PORT:-8080} && printf 'GET /health HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/usr/bin/kvroute"]
