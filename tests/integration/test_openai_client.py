"""Runs the official OpenAI Node SDK tests (node/openai_client.test.mjs)
against kvroute in front of three mockers (real NATS, loopback HTTP).
scripts/test.sh installs the SDK (npm install in tests/integration/node).

Run: python3 tests/integration/test_openai_client.py --build-dir build
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from fleet import Fleet  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(HERE, "node", "node_modules", "openai")):
        print("the openai npm package is missing: run scripts/test.sh (npm install in tests/integration/node)")
        return 1
    with tempfile.TemporaryDirectory(prefix="kvroute-openai-") as tmp:
        with Fleet(os.path.abspath(args.build_dir), tmp, speedup=5.0) as f:
            f.start_nats()
            for i in (1, 2, 3):
                f.start_mocker(i)
            f.start_router()
            f.wait_ready(3)
            env = dict(os.environ, KVROUTE_URL=f"http://127.0.0.1:{f.router_port}",
                       MOCKER_URLS=",".join(f.mocker_urls[i] for i in (1, 2, 3)))
            r = subprocess.run(["node", "--test", "--test-reporter=spec", "openai_client.test.mjs"],
                               cwd=os.path.join(HERE, "node"), env=env, timeout=240)
            return r.returncode


if __name__ == "__main__":
    sys.exit(main())
