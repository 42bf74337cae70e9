"""scripts/demo.sh as an operator runs it: it prints a status page URL and an
admin token that work (the page loads; the token opens the admin API, which
shows the three demo workers and never echoes the token back).

Run: python3 tests/integration/test_demo.py --build-dir build
"""
import argparse
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from fleet import wait_until  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def read_until(proc, needle, timeout):
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    out, deadline = b"", time.time() + timeout
    while time.time() < deadline and needle.encode() not in out:
        if proc.poll() is not None:
            break
        for _ in sel.select(timeout=0.2):
            out += os.read(proc.stdout.fileno(), 65536)
    return out.decode(errors="replace")


def get(url, token=None):
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", e.read().decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    args = ap.parse_args()
    for mode in ([], ["--vllm"]):
        run_demo(args, mode)
    passed = 2
    for mode in (["--pd"], ["--pd-sglang"]):
        passed += run_pd_demo(args, mode)
    print(f"{passed} passed, 0 failed")
    return 0


def run_pd_demo(args, mode):
    """scripts/demo.sh --pd / --pd-sglang: 2 prefill + 2 decode mockers with roles in kvroute's config;
    a long uncached prompt is split: the answer names its prefill and decode workers, and a decode
    mocker verified the transfer (its own counter). Returns 1 when run, 0 when skipped because kvroute
    does not read `role:`."""
    print(f"# scripts/demo.sh {' '.join(mode)}")
    with tempfile.TemporaryDirectory(prefix="kvroute-demo-") as tmp:
        env = dict(os.environ, BUILD_DIR=os.path.abspath(args.build_dir), KVROUTE_SKIP_SETUP="1",
                   KVROUTE_RUN_DIR=tmp, KVROUTE_PORT="0", KVROUTE_ADMIN_PORT="0")
        proc = subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "demo.sh"), *mode], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            text = read_until(proc, "Press Ctrl-C", 60)
            config = open(os.path.join(tmp, f"kvroute-{mode[0][2:]}.yaml")).read()
            roles = re.findall(r"role: (\w+)", config)
            assert roles == ["prefill", "prefill", "decode", "decode"], config
            if mode == ["--pd-sglang"]:
                assert len(re.findall(r"role: prefill, bootstrap_port: \d+", config)) == 2, config
            if "Press Ctrl-C" not in text:
                log = open(os.path.join(tmp, "kvroute.log")).read()
                if "unknown field 'role'" in log:
                    print("skip - the mockers run with roles, but this kvroute does not read `role:` yet")
                    return 0
                raise AssertionError(f"demo.sh {mode} did not come up:\n{text}\n{log}")
            assert "are split between a prefill and a decode worker" in text, text
            router = re.search(r"kvroute is up on (http://127\.0\.0\.1:\d+)", text).group(1)
            decode_urls = re.findall(r'url: "([^"]+)"[^\n]*role: decode', config)
            key = "transfers_completed" if mode == ["--pd"] else "rooms_completed"
            transfers = lambda: sum(json.loads(get(u + "/mocker/stats")[2])["pd"][key]  # noqa: E731
                                    for u in decode_urls)
            body = json.dumps({"model": "mock-model", "prompt": "a long uncached demo prompt " * 600,
                               "max_tokens": 2}).encode()
            req = urllib.request.Request(router + "/v1/completions", data=body,
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200
                assert r.headers["x-kvroute-pd"] == "disaggregated", dict(r.headers)
                assert r.headers["x-kvroute-prefill-worker"] in ("1", "2"), dict(r.headers)
                assert r.headers["x-kvroute-worker"] in ("3", "4"), dict(r.headers)
            deadline = time.time() + 10
            while transfers() != 1 and time.time() < deadline:
                time.sleep(0.05)
            assert transfers() == 1, transfers()  # the decode mocker verified the transfer
            print(f"ok - {mode[0]}: 2 prefill + 2 decode workers; a long prompt split, its transfer verified")
            return 1
        finally:
            try:
                os.killpg(proc.pid, signal.SIGINT)
                proc.wait(timeout=20)
            except ProcessLookupError:  # the demo gave up by itself
                proc.wait()
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run_demo(args, mode):
    """scripts/demo.sh [mode]: the embedded default (NATS) or --vllm (no NATS)."""
    print(f"# scripts/demo.sh {' '.join(mode)}")
    with tempfile.TemporaryDirectory(prefix="kvroute-demo-") as tmp:
        env = dict(os.environ, BUILD_DIR=os.path.abspath(args.build_dir), KVROUTE_SKIP_SETUP="1",
                   KVROUTE_RUN_DIR=tmp, KVROUTE_PORT="0", KVROUTE_ADMIN_PORT="0")
        env.pop("KVROUTE_ADMIN_TOKEN", None)
        proc = subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "demo.sh"), *mode], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            text = read_until(proc, "Press Ctrl-C", 60)
            url = re.search(r"Status page: (http://127\.0\.0\.1:\d+/ui)", text)
            token = re.search(r"Admin token: (\S+)", text)
            assert url and token, f"demo.sh printed no status page URL and token:\n{text}"
            url, token = url.group(1), token.group(1)
            print(f"ok - demo.sh prints {url} and a token of {len(token)} characters")
            status, ctype, body = get(url)
            assert status == 200 and ctype.startswith("text/html") and "/ui/app.js" in body, (status, ctype)
            print("ok - the status page URL serves the page")
            base = url.rsplit("/ui", 1)[0]
            assert get(base + "/admin/status")[0] == 401
            workers = lambda: json.loads(get(base + "/admin/status", token)[2]).get("workers", [])  # noqa: E731
            assert wait_until(lambda: len(workers()) == 3, 20), workers()
            print("ok - the printed token opens the admin API: 3 workers")
            status, _, cfg = get(base + "/admin/config", token)
            assert status == 200 and token not in cfg and "<redacted>" in cfg, cfg
            print("ok - GET /admin/config does not return the token")
            if mode == ["--vllm"]:
                assert "no NATS" in text, text
                ws = json.loads(get(base + "/admin/workers", token)[2])
                assert sorted(w["source"] for w in ws) == ["static"] * 3, ws
                router = re.search(r"kvroute is up on (http://127\.0\.0\.1:\d+)", text).group(1)
                body = json.dumps({"model": "mock-model", "prompt": "demo " * 80, "max_tokens": 2}).encode()
                cached = []

                def send():
                    req = urllib.request.Request(router + "/v1/completions", data=body,
                                                 headers={"content-type": "application/json"})
                    with urllib.request.urlopen(req, timeout=10) as r:
                        cached.append(int(r.headers["x-kvroute-cached-tokens"]))
                    return cached[-1]

                send()
                # Polls until the first answer's KV events have reached the index.
                assert cached[0] == 0 and wait_until(lambda: send() > 0, 10), cached
                print("ok - --vllm: no NATS, 3 static vLLM-mode workers, the second request is cached")
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


if __name__ == "__main__":
    sys.exit(main())
