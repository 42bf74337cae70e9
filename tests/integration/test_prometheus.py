"""Every PromQL expression of the Grafana dashboard, run through a real
Prometheus (Debian's `prometheus`) scraping a live kvroute: nats-server,
mockers and kvroute on loopback, Prometheus on a free loopback port scraping
/metrics once a second with the labels Kubernetes service discovery adds
(namespace, pod). While traffic flows (including one 503 and one worker
killed mid-fleet, so the failure panels have series), each expression of
helm/kvroute/dashboards/kvroute.json, with the dashboard's variables as
Grafana fills them ($namespace, $pod = All; $__rate_interval = 4 scrape
intervals; $__range = 5m), must return a non-empty result of finite numbers.
The panels of features this aggregated fleet does not run (disaggregated
prefill/decode, shared KV pools, API-key authentication: NOT_RUN below) must
be valid PromQL that Prometheus accepts and finite where they have series;
their metric names are checked against the code by helm/tests/test_chart.py.

Run: python3 tests/integration/test_prometheus.py --build-dir build
"""
import argparse
import json
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
from fleet import free_port, start_fleet, wait_until  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DASHBOARD = os.path.join(HERE, "..", "..", "helm", "kvroute", "dashboards", "kvroute.json")
VARIABLES = {"$namespace": ".*", "$pod": ".*", "$__rate_interval": "4s", "$__range": "5m"}
# Metric prefixes of the features this fleet does not run: no roles, no kv_pools, no API keys.
NOT_RUN = ("kvroute_pd_", "kvroute_router_pool_", "kvroute_indexer_pool", "kvroute_router_auth_failures_total")


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
    port = free_port()
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                "  - job_name: kvroute\n    static_configs:\n"
                f"      - targets: ['{targets}']\n        labels: {{namespace: kvroute-test, pod: kvroute-0}}\n")
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
        with fleet as f:
            prom, port = start_prometheus(tmp, f"127.0.0.1:{f.router_port}")
            stop = threading.Event()
            loop = threading.Thread(target=traffic_loop, args=(f, stop), daemon=True)
            try:
                def up():
                    try:
                        res = prom_query(port, 'up{job="kvroute"}')["result"]
                        return res and res[0]["value"][1] == "1"
                    except OSError:
                        return False
                if not wait_until(up, 30, step=0.25):
                    print(open(os.path.join(tmp, "prometheus.log")).read()[-2000:])
                    raise RuntimeError("Prometheus did not scrape kvroute within 30 s")
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
