"""The container image, built and run without a Docker daemon: runs
scripts/build_image.sh (mmdebstrap + umoci, needs root and the Debian mirror),
unpacks the OCI archive with umoci, checks the image config (non-root user,
entrypoint, ports, tag = the Helm chart's default image), then runs the
kvroute inside it with chroot as that user: it serves /health and routes one
request to a kvroute-mocker running outside the image (nats-server outside
too, all on loopback). CTest label `image`; about 30-60 s.

Run: python3 tests/integration/test_image.py --build-dir build
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from fleet import Fleet, read_line_matching  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def chart_image():
    """The image the Helm chart deploys by default: repository:tag (tag "" = appVersion)."""
    values = open(os.path.join(ROOT, "helm", "kvroute", "values.yaml")).read()
    repo = re.search(r"^image:\n(?:  .*\n)*?  repository: (\S+)", values, re.M).group(1)
    tag = re.search(r"^image:\n(?:  .*\n)*?  tag: \"?([^\"\n]*)\"?", values, re.M).group(1)
    app = re.search(r'^appVersion: "?([^"\n]+)"?', open(os.path.join(ROOT, "helm", "kvroute", "Chart.yaml")).read(),
                    re.M).group(1)
    return repo, tag or app


def image_config(layout, tag):
    index = json.load(open(os.path.join(layout, "index.json")))
    desc = [m for m in index["manifests"]
            if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
    assert desc, f"no image tagged {tag} in the archive: {index}"

    def blob(digest):
        algo, hexd = digest.split(":")
        return json.load(open(os.path.join(layout, "blobs", algo, hexd)))
    return blob(blob(desc[0]["digest"])["config"]["digest"])


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok - " + what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    args = ap.parse_args()
    build = os.path.abspath(args.build_dir)
    if os.geteuid() != 0:
        print("the image test needs root (mmdebstrap --mode=root, umoci unpack, chroot)")
        return 1
    repo, tag = chart_image()
    check(repo == "kvroute", f"the Helm chart's default image is kvroute:{tag} ({repo}:{tag})")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kvroute-image-") as tmp:
        out = os.path.join(tmp, "out")
        env = dict(os.environ, KVROUTE_BIN=os.path.join(build, "router", "kvroute"),
                   MOCKER_BIN=os.path.join(build, "mocker", "kvroute-mocker"))
        built = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_image.sh"), out], env=env, check=True,
                               timeout=600, stdout=subprocess.PIPE, text=True).stdout
        print(built, end="")
        # The Dockerfile's runtime stage installs the same libraries (those not already in debian:12-slim).
        shipped = set(re.search(r"packages: (\S+)", built).group(1).split(",")) - {"libc6", "libgcc-s1", "libstdc++6"}
        docker = open(os.path.join(ROOT, "Dockerfile")).read().split("FROM debian:12-slim", 1)[1]
        docker_pkgs = set(re.search(r"--no-install-recommends \\\n(.*?) \\\n", docker, re.S).group(1).split())
        check(shipped == docker_pkgs, f"the Dockerfile's runtime packages are the script's ({sorted(docker_pkgs)}); "
                                      f"if not, put {sorted(shipped)} in the Dockerfile's runtime stage")
        archive = os.path.join(out, "kvroute-oci.tar")
        check(os.path.getsize(archive) > 5 << 20, f"OCI archive built ({os.path.getsize(archive) >> 20} MiB, "
                                                    f"{time.time() - started:.0f} s)")
        layout = os.path.join(tmp, "layout")
        os.mkdir(layout)
        subprocess.run(["tar", "-xf", archive, "-C", layout], check=True)
        cfg = image_config(layout, tag)["config"]
        check(cfg.get("User") == "10001:10001", f"runs as a non-root user ({cfg.get('User')})")
        check(cfg.get("Entrypoint") == ["/usr/bin/kvroute"], f"entrypoint {cfg.get('Entrypoint')}")
        check({"8080/tcp", "8081/tcp"} <= set(cfg.get("ExposedPorts", {})), "exposes 8080 and 8081")
        bundle = os.path.join(tmp, "bundle")
        subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", bundle], check=True,
                       stdout=subprocess.DEVNULL)
        rootfs = os.path.join(bundle, "rootfs")
        os_release = open(os.path.join(rootfs, "etc", "os-release")).read()
        check('VERSION_ID="12"' in os_release, "Debian 12 inside")
        check(not os.listdir(os.path.join(rootfs, "usr", "share", "man")) if os.path.isdir(
            os.path.join(rootfs, "usr", "share", "man")) else True, "slim: no manual pages")

        with Fleet(build, tmp, speedup=50.0) as f:
            f.start_nats()
            f.start_mocker(1)  # outside the image
            args = ["chroot", "--userspec=10001:10001", rootfs, "/usr/bin/kvroute", "--router.host", "127.0.0.1",
                    "--router.port", "0", "--admin.port", "0", "--admin.token", f.admin_token,
                    "--events.nats_url", f.nats_url, "--events.worker_ttl_ms", "1500"]
            proc = f._spawn("kvroute", args)
            line = read_line_matching(proc, "listening on", 20)
            m = re.search(r"listening on http://[^:]+:(\d+) admin http://([^:]+):(\d+)", line)
            f.router_port, f.admin_port = int(m.group(1)), int(m.group(3))
            check(m.group(2) == "127.0.0.1", "the admin listener binds loopback (its default)")
            r = f.get("/health")
            check(r.status == 200, f"the kvroute inside the image serves /health ({r.status})")
            f.wait_ready(1)
            r = f.post("/v1/completions", {"model": "mock-model", "prompt": "hello from a chroot", "max_tokens": 3})
            check(r.status == 200 and r.header("x-kvroute-worker") == "1",
                  f"it routes a request to the mocker outside the image ({r.status}, worker "
                  f"{r.header('x-kvroute-worker')})")
            # The Dockerfile's HEALTHCHECK command, run inside the image.
            health = re.search(r'CMD \["bash", "-c", "(.*)"\]', open(os.path.join(ROOT, "Dockerfile")).read()).group(1)
            health = json.loads('"' + health + '"')
            hc = subprocess.run(["chroot", "--userspec=10001:10001", rootfs, "bash", "-c", health],
                                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "KVROUTE_ROUTER_PORT": str(f.router_port)},
                                timeout=10)
            check(hc.returncode == 0, "the Dockerfile's HEALTHCHECK passes against it")
            uid = open(f"/proc/{proc.pid}/status").read()
            uid = re.search(r"^Uid:\s+(\d+)", uid, re.M).group(1)
            check(uid == "10001", f"the process runs as uid {uid}")
    print(f"image test: {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
