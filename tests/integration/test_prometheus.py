"""Every PromQL expression of the Grafana dashboard, run through a real
Prometheus (Debian's `prometheus`) scraping a live kvroute: nats-server,
mockers and kvroute on loopback, Prometheus on a free loopback port scraping
/metrics once a second with the labels Kubernetes service discovery adds
(namespace, pod). While traffic flows (including one 503 and one worker
killed mid-fleet, so the failure panels have series), each expression of
helm/kvroute/dashboards/kvroute.json, with the dashboard's variables as
Grafana fills them ($namespace, $pod = All; $__rate_interval = 4 scrape
intervals; $__range = 5m), must return a non-empty result of finite numbers.
A second kvroute (pod kvroute-pd-0) fronts a small disaggregated fleet (2
prefill + 2 decode mockers, vLLM NIXL shape, no NATS) whose faults are made
before its traffic starts, so that every PD panel has series: a prefill
worker whose kv_transfer_params name a foreign host (params rejected, the
transfer left to its lease, a prefill retry) and a client that leaves while
its prefill answer is held (a release leg). The panels of features neither
fleet runs (shared KV pools, API-key authentication: NOT_RUN below) must be
valid PromQL that Prometheus accepts and finite where they have series;
their metric names are checked against the code by helm/tests/test_chart.py.

Run: python3 tests/integration/test_prometheus.py --build-dir build
"""
import argparse
import json
import socket
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from fleet import Fleet, free_port, start_fleet, wait_until  # noqa: E402
from test_pd_exchange import DECODE, PREFILL, start_pd_fleet, words  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DASHBOARD = os.path.join(HERE, "..", "..", "helm", "kvroute", "dashboards", "kvroute.json")
VARIABLES = {"$namespace": ".*", "$pod": ".*", "$__rate_interval": "4s", "$__range": "5m"}
# Metric prefixes of the features neither fleet runs: no kv_pools, no API keys.
NOT_RUN = ("kvroute_router_pool_", "kvroute_indexer_pool", "kvroute_router_auth_failures_total")
GOOD_PREFILL, BAD_PREFILL = PREFILL  # BAD_PREFILL reports a side channel on a host that is not its own


def dashboard_expressions():
    out = []

    def walk(o, title):
        if isinstance(o, dict):
            title = o.get("title", title)
            if "expr" in o:
                out.append((title, o["expr"]))
            for v in o.values():
                walk(v, title)
        elif isinstance(o, list):
            for v in o:
                walk(v, title)
    with open(DASHBOARD) as f:
        walk(json.load(f), "")
    return out


def substitute(expr):
    for k in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(k, VARIABLES[k])
    return expr


def prom_query(port, expr):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]


def start_prometheus(tmp, targets):
    """targets: (host:port, pod label) of each kvroute."""
    port = free_port()
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                "  - job_name: kvroute\n    static_configs:\n")
        for target, pod in targets:
            f.write(f"      - targets: ['{target}']\n        labels: {{namespace: kvroute-test, pod: {pod}}}\n")
    exe = shutil.which("prometheus") or "/usr/bin/prometheus"
    log = open(os.path.join(tmp, "prometheus.log"), "wb")
    proc = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL)
    return proc, port


def traffic_loop(f, stop):
    """Two prompts that share a prefix, ~10 requests/s, until `stop` is set."""
    i = 0
    while not stop.is_set():
        prompt = "prometheus test: a long shared system prompt that fills several KV blocks. " * 3 + f"q{i % 4}"
        try:
            f.post("/v1/completions", {"model": "mock-model", "prompt": prompt, "max_tokens": 4}, timeout=10)
        except OSError:
            pass
        i += 1
        stop.wait(0.1)


def start_pd(build_dir, tmp):
    """The disaggregated fleet; BAD_PREFILL's kv_transfer_params name 10.9.9.9 (refused: not the worker's host)."""
    workdir = os.path.join(tmp, "pd")
    os.mkdir(workdir)
    f = Fleet(build_dir, workdir, speedup=50.0)
    try:
        start_pd_fleet(f, "vllm_nixl", lambda role: ["--role", role, "--pd-lease-ms", "60000"],
                       extra_flags={BAD_PREFILL: ["--pd-side-channel-host", "10.9.9.9"]})
    except BaseException:
        f.close()
        raise
    return f


def pd_send(f, prompt):
    return f.post("/v1/completions", {"model": "mock-model", "prompt": prompt, "max_tokens": 4}, timeout=30)


def make_pd_failures(f):
    """Series for every PD panel: a refused transfer, a prefill retry, a released transfer."""
    # Only BAD_PREFILL: its params are refused (params_rejected, a transfer left to its lease) and
    # the request runs whole (fallback); its prefix is now cached there.
    assert f.admin("POST", f"/admin/workers/{GOOD_PREFILL}/drain").status == 200
    r = pd_send(f, words("cached", 200))
    assert r.status == 200 and r.header("x-kvroute-pd") == "fallback", (r.status, r.header("x-kvroute-pd"))
    assert f.admin("POST", f"/admin/workers/{GOOD_PREFILL}/undrain").status == 200
    # The prefix (with a new tail: split again) ranks BAD_PREFILL first once its KV events are in:
    # refused again, then the next prefill worker (a retry).
    tails = iter(range(10**6))
    assert wait_until(lambda: pd_send(f, words("cached", 200) + " " + words(f"tail{next(tails)}x", 100))
                      .header("x-kvroute-pd") == "disaggregated" and
                      f.metric('kvroute_pd_retries_total{leg="prefill"}') >= 1, 30, step=0.2), \
        "no prefill leg was retried"
    # A client that leaves while its prefill answer is held: the transfer is released.
    assert f.admin("POST", f"/admin/workers/{BAD_PREFILL}/drain").status == 200
    f.mocker(GOOD_PREFILL, "POST", "/mocker/pd/hold_answers", {"enabled": True})
    body = json.dumps({"model": "mock-model", "prompt": words("gone", 200), "max_tokens": 4}).encode()
    s = socket.create_connection(("127.0.0.1", f.router_port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert wait_until(lambda: f.mocker(GOOD_PREFILL, "GET", "/mocker/stats").json()["pd"]["answers_held"] == 1, 20)
    s.close()
    assert wait_until(lambda: f.metric('kvroute_pd_client_gone_total{phase="prefill"}') == 1, 20)
    f.mocker(GOOD_PREFILL, "POST", "/mocker/pd/hold_answers", {"enabled": False})
    assert wait_until(lambda: f.metric('kvroute_pd_releases_total{result="ok"}') == 1, 20), "no release leg"
    assert f.admin("POST", f"/admin/workers/{BAD_PREFILL}/undrain").status == 200
    assert f.metric('kvroute_pd_transfers_left_total{reason="params_rejected"}') >= 1


def pd_traffic_loop(f, stop):
    """Split-sized prompts, ~5 requests/s, until `stop` is set."""
    i = 0
    while not stop.is_set():
        try:
            pd_send(f, words(f"t{i}x", 120))
        except OSError:
            pass
        i += 1
        stop.wait(0.2)


def make_failures(f):
    """A 503 (every worker drained) and an upstream error (a worker killed while still registered)."""
    for w in (1, 2, 3, 4):
        assert f.admin("POST", f"/admin/workers/{w}/drain").status == 200
    r = f.post("/v1/completions", {"model": "mock-model", "prompt": "nobody", "max_tokens": 1})
    assert r.status == 503, r.status
    assert f.admin("POST", "/admin/workers/4/undrain").status == 200
    f.kill("mocker-4")  # its registration outlives it by events.worker_ttl_ms
    f.post("/v1/completions", {"model": "mock-model", "prompt": "to a dead worker", "max_tokens": 1})
    for w in (1, 2, 3):
        assert f.admin("POST", f"/admin/workers/{w}/undrain").status == 200
    errors = sum(v for k, v in f.metrics().items() if k.startswith("kvroute_router_upstream_errors_total"))
    assert errors > 0, "killing a worker produced no upstream error"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    args = ap.parse_args()
    if not (shutil.which("prometheus") or os.path.exists("/usr/bin/prometheus")):
        print("prometheus is missing: run scripts/test.sh (it installs Debian's prometheus)")
        return 1
    exprs = dashboard_expressions()
    assert len(exprs) >= 30, f"only {len(exprs)} expressions found in {DASHBOARD}"
    with tempfile.TemporaryDirectory(prefix="kvroute-prom-") as tmp:
        fleet = start_fleet(os.path.abspath(args.build_dir), tmp, workers=4, speedup=50.0, ttl_ms=5000)
        with fleet as f, start_pd(os.path.abspath(args.build_dir), tmp) as pd:
            prom, port = start_prometheus(tmp, [(f"127.0.0.1:{f.router_port}", "kvroute-0"),
                                                (f"127.0.0.1:{pd.router_port}", "kvroute-pd-0")])
            stop = threading.Event()
            loops = [threading.Thread(target=traffic_loop, args=(f, stop), daemon=True),
                     threading.Thread(target=pd_traffic_loop, args=(pd, stop), daemon=True)]
            try:
                def up():
                    try:
                        res = prom_query(port, 'up{job="kvroute"}')["result"]
                        return len(res) == 2 and all(r["value"][1] == "1" for r in res)
                    except OSError:
                        return False
                if not wait_until(up, 30, step=0.25):
                    print(open(os.path.join(tmp, "prometheus.log")).read()[-2000:])
                    raise RuntimeError("Prometheus did not scrape both kvroutes within 30 s")
                make_pd_failures(pd)
                for loop in loops:
                    loop.start()
                # Before any failure: the error ratio is 0, not "No data".
                ratio = [e for t, e in exprs if t == "Error ratio (5xx)"]
                assert ratio, "no error ratio panel"
                assert wait_until(lambda: prom_query(port, substitute(ratio[0]))["result"], 15, step=0.5), \
                    "the error ratio is empty on a fleet without 5xx"
                make_failures(f)
                f.procs["kvroute"].send_signal(signal.SIGHUP)  # a config reload for the reloads panel
                # Enough scrapes for every rate window (4 s) with traffic in it.
                assert wait_until(lambda: float(prom_query(port, 'count_over_time(up{job="kvroute"}[1m])')
                                                 ["result"][0]["value"][1]) >= 8, 30, step=0.5)
                # The PD fleet's traffic began after its faults: both legs in the latest rate window.
                def pd_legs():
                    res = prom_query(port, 'sum(rate(kvroute_pd_leg_seconds_count{leg="decode"}[4s]))')["result"]
                    return res and float(res[0]["value"][1]) > 0
                assert wait_until(pd_legs, 30, step=0.5), "no PD traffic in Prometheus"
                failures = []
                for title, expr in exprs:
                    q = substitute(expr)
                    data = prom_query(port, q)["result"]
                    values = [float(s["value"][1]) for s in data]
                    bad = [v for v in values if not math.isfinite(v)]
                    optional = any(m in q for m in NOT_RUN)  # a query Prometheus refused raised above
                    if (not data and not optional) or bad:
                        failures.append(f"{title}: {q} -> {'empty' if not data else f'{len(bad)} non-finite'}")
                    ok = (data or optional) and not bad
                    print(f"{'ok  ' if ok else 'FAIL'} {len(data):3d} series  {title}: {q[:110]}")
            finally:
                stop.set()
                for loop in loops:
                    if loop.is_alive():
                        loop.join(timeout=15)
                prom.terminate()
                prom.wait(timeout=20)
            print(f"{len(exprs) - len(failures)} passed, {len(failures)} failed")
            for line in failures:
                print("  " + line)
            return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
