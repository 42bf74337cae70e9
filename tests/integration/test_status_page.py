"""The status page (/ui on the admin listener) in Debian's headless chromium,
driven by playwright-core (browser/status_page.mjs), against a live fleet:
nats-server, three mockers and kvroute on loopback; then (browser/
status_page_pd.mjs) against a disaggregated fleet: 2 prefill + 2 decode
vLLM-mode mockers, no NATS (the roles, the PD section and its counters). scripts/test.sh installs
chromium (apt) and playwright-core (npm ci in tests/integration/browser).

Run: python3 tests/integration/test_status_page.py --build-dir build [--screenshot docs/status-page.png]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from fleet import Fleet, start_fleet  # noqa: E402
from test_pd_exchange import DECODE, PREFILL, start_pd_fleet  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BROWSER_DIR = os.path.join(HERE, "browser")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--screenshot", help="also save the page as this PNG (docs/status-page.png)")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(chromium):
        print("chromium is missing: run scripts/test.sh (it installs Debian's chromium)")
        return 1
    if not os.path.isdir(os.path.join(BROWSER_DIR, "node_modules", "playwright-core")):
        print("playwright-core is missing: run scripts/test.sh (npm ci in tests/integration/browser)")
        return 1
    with tempfile.TemporaryDirectory(prefix="kvroute-ui-") as tmp:
        # One request slot per mocker and a wait queue: three streams make
        # the fleet busy and a fourth request waits (the page's queue wait).
        fleet = start_fleet(os.path.abspath(args.build_dir), tmp, workers=3, speedup=20.0,
                            mocker_args=["--max-seqs", "1"],
                            router_args=["--scheduler.queue_size", "8", "--scheduler.queue_timeout_ms", "20000"])
        with fleet as f:
            screenshot = os.path.abspath(args.screenshot) if args.screenshot else os.path.join(tmp, "page.png")
            env = dict(os.environ, KVROUTE_ADMIN_URL=f"http://127.0.0.1:{f.admin_port}",
                       KVROUTE_URL=f"http://127.0.0.1:{f.router_port}", KVROUTE_ADMIN_TOKEN=f.admin_token,
                       WORKERS="1,2,3", SCREENSHOT=screenshot, CHROMIUM=chromium)
            r = subprocess.run(["node", "status_page.mjs"], cwd=BROWSER_DIR, env=env, timeout=180)
            if r.returncode != 0:
                print(open(os.path.join(tmp, "kvroute.log")).read()[-3000:])
                return r.returncode
    with tempfile.TemporaryDirectory(prefix="kvroute-ui-pd-") as tmp:
        fleet = Fleet(os.path.abspath(args.build_dir), tmp, speedup=20.0)
        with fleet as f:
            start_pd_fleet(f, "vllm_nixl", lambda role: ["--role", role])
            env = dict(os.environ, KVROUTE_ADMIN_URL=f"http://127.0.0.1:{f.admin_port}",
                       KVROUTE_URL=f"http://127.0.0.1:{f.router_port}", KVROUTE_ADMIN_TOKEN=f.admin_token,
                       PREFILL=",".join(map(str, PREFILL)), DECODE=",".join(map(str, DECODE)), CHROMIUM=chromium)
            r = subprocess.run(["node", "status_page_pd.mjs"], cwd=BROWSER_DIR, env=env, timeout=180)
            if r.returncode != 0:
                print(open(os.path.join(tmp, "kvroute.log")).read()[-3000:])
            return r.returncode


if __name__ == "__main__":
    sys.exit(main())
