"""Runs the official OpenAI Node SDK tests (node/openai_client.test.mjs) and
the agent SDKs' tests (node/agent_sdks.test.mjs: openai's Responses API,
@anthropic-ai/sdk's Messages API) against kvroute in front of three mockers, twice: with NATS heartbeats and
Dynamo JSON events, and with no NATS at all (workers.static, mockers in vLLM
mode: ZMQ KV events, vLLM /metrics). scripts/test.sh installs the SDK (npm
ci in tests/integration/node).

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


def run_sdk_tests(f, label):
    env = dict(os.environ, KVROUTE_URL=f"http://127.0.0.1:{f.router_port}",
               MOCKER_URLS=",".join(f.mocker_urls[i] for i in (1, 2, 3)))
    print(f"== OpenAI and Anthropic SDKs against kvroute: {label}", flush=True)
    r = subprocess.run(["node", "--test", "--test-reporter=spec", "openai_client.test.mjs", "agent_sdks.test.mjs"],
                       cwd=os.path.join(HERE, "node"), env=env, timeout=240)
    return r.returncode


def nats_fleet(build_dir, tmp):
    f = Fleet(build_dir, tmp, speedup=5.0)
    f.start_nats()
    for i in (1, 2, 3):
        f.start_mocker(i)
    f.start_router()
    f.wait_ready(3)
    return f


def static_vllm_fleet(build_dir, tmp):
    f = Fleet(build_dir, tmp, speedup=5.0)
    entries = []
    for i in (1, 2, 3):
        url, kv, replay = f.start_vllm_mocker(i)
        entries.append(f'    - {{id: {i}, url: "{url}", model: mock-model, kv_events: "{kv}", replay: "{replay}"}}')
    f.start_router_config("workers:\n  scrape_interval_ms: 100\n  static:\n" + "\n".join(entries) + "\n")
    f.wait_ready(3)
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    args = ap.parse_args()
    for package in ("openai", "@anthropic-ai/sdk"):
        if not os.path.isdir(os.path.join(HERE, "node", "node_modules", package)):
            print(f"the {package} npm package is missing: run scripts/test.sh (npm ci in tests/integration/node)")
            return 1
    build = os.path.abspath(args.build_dir)
    rc = 0
    for label, make in (("NATS fleet", nats_fleet), ("vLLM-mode fleet, no NATS", static_vllm_fleet)):
        with tempfile.TemporaryDirectory(prefix="kvroute-openai-") as tmp:
            f = make(build, tmp)
            try:
                rc |= run_sdk_tests(f, label)
            finally:
                f.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
