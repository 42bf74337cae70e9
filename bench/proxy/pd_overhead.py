#!/usr/bin/env python3
"""The router's added latency for a disaggregated request (two legs) against
the aggregated path, as a ratio measured in one run.

Four targets, one keep-alive connection each, one request at a time (the
proxy's own cost, not queueing), ROUNDS rounds of N requests to each, the
targets interleaved request by request, their order rotating each round:
  (a) direct aggregated: the client -> one mocker (role both);
  (b) kvroute aggregated: the client -> kvroute -> that mocker;
  (c) direct PD: the client runs both vLLM NIXL legs itself against a prefill
      and a decode mocker (prefill leg, then the decode leg with its
      kv_transfer_params): the engines' floor for a split request;
  (d) kvroute PD: the client -> kvroute (pd.policy always) -> the same two mockers.
Added latency: aggregated = p50(b) - p50(a); PD = p50(d) - p50(c); the figure
is PD / aggregated (the issue's target: <= 2).
(c) is run by this Python client, which pays its own per-request cost twice
there and once in (d), so PD's figure is a lower bound; its upper bound takes
one whole client round trip (GET /health to a mocker: client, loopback, the
mocker's parse, all of which the router's second leg pays as well) off the
floor. p50 per round; medians over the
rounds. Mockers run --speedup 1000 (the engines' time is nearly free), one
64-token prompt that every worker caches after the first request, max_tokens 1.
Everything shares this machine's cores with whatever else runs on it.

Run: python3 bench/proxy/pd_overhead.py --build-dir build [--rounds 5] [--n 400]
The last line is one JSON object.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
from fleet import Fleet  # noqa: E402
from test_pd_exchange import start_pd_mocker  # noqa: E402

PROMPT = " ".join(f"bench{i}" for i in range(64))
BODY = {"model": "mock-model", "prompt": PROMPT, "max_tokens": 1}
PREFILL_LEG = {**BODY, "stream": False, "kv_transfer_params": {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
    "remote_host": None, "remote_port": None}}


class Conn:
    def __init__(self, url):
        host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
        self.c = http.client.HTTPConnection(host, int(port), timeout=30)

    def post(self, body, headers=None):
        self.c.request("POST", "/v1/completions", body=json.dumps(body),
                       headers={"content-type": "application/json", **(headers or {})})
        r = self.c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{r.status} {data[:200]}")
        return data


def one_direct_pd(p, d, k):
    rid = {"x-request-id": f"bench-{k}"}
    params = json.loads(p.post(PREFILL_LEG, rid))["kv_transfer_params"]
    d.post({**BODY, "kv_transfer_params": params}, rid)


def timed(fn, n):
    lat = []
    for k in range(n):
        t = time.perf_counter()
        fn(k)
        lat.append(time.perf_counter() - t)
    lat.sort()
    return lat[len(lat) // 2] * 1e6


def router(f, name, yaml_text):
    path = os.path.join(f.workdir, f"{name}.yaml")
    with open(path, "w") as out:
        out.write(yaml_text)
    import re
    import subprocess
    from fleet import read_line_matching
    proc = f._spawn(name, [os.path.join(f.build_dir, "router", "kvroute"), "--config", path, "--router.host",
                           "127.0.0.1", "--router.port", "0", "--events.nats_url", "", "--indexer.block_size", "16",
                           "--admin.host", "127.0.0.1", "--admin.port", "0", "--admin.token", "bench",
                           "--router.threads", "1"])
    line = read_line_matching(proc, "listening on", 20)
    return "http://127.0.0.1:" + re.search(r"listening on http://[^:]+:(\d+)", line).group(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=400)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvroute-pd-bench-") as tmp:
        f = Fleet(os.path.abspath(args.build_dir), tmp, speedup=1000.0)
        try:
            agg_url, agg_kv, agg_replay = f.start_vllm_mocker(1)
            p_url, p_kv, p_replay, _ = start_pd_mocker(f, 2, ["--role", "prefill"])
            d_url, d_kv, d_replay, _ = start_pd_mocker(f, 3, ["--role", "decode"])
            entry = '    - {{id: {}, url: "{}", model: mock-model, kv_events: "{}", replay: "{}"{}}}\n'
            agg_router = router(f, "kvroute-agg", "workers:\n  static:\n" +
                                entry.format(1, agg_url, agg_kv, agg_replay, ""))
            pd_router = router(f, "kvroute-pd", "workers:\n  static:\n" +
                               entry.format(2, p_url, p_kv, p_replay, ", role: prefill") +
                               entry.format(3, d_url, d_kv, d_replay, ", role: decode") +
                               "pd:\n  policy: always\n")
            time.sleep(1.0)  # the routers' first scrapes
            direct_agg, via_agg = Conn(agg_url), Conn(agg_router)
            direct_p, direct_d, via_pd = Conn(p_url), Conn(d_url), Conn(pd_router)
            # A split through kvroute, checked once.
            via_pd.c.request("POST", "/v1/completions", body=json.dumps(BODY),
                             headers={"content-type": "application/json"})
            r = via_pd.c.getresponse()
            r.read()
            assert r.status == 200 and r.getheader("x-kvroute-pd") == "disaggregated", (r.status, r.getheaders())
            health = Conn(d_url)

            def get_health(k):
                health.c.request("GET", "/health")
                health.c.getresponse().read()
            targets = {
                "direct_health": get_health,
                "direct_agg": lambda k: direct_agg.post(BODY),
                "kvroute_agg": lambda k: via_agg.post(BODY),
                "direct_pd": lambda k: one_direct_pd(direct_p, direct_d, k),
                "kvroute_pd": lambda k: via_pd.post(BODY),
            }
            for fn in targets.values():  # warm-up
                timed(fn, 50)
            names = list(targets)
            p50 = {n: [] for n in names}
            for rnd in range(args.rounds):
                # Interleaved request by request (the order rotating), so a
                # burst of load on the shared machine hits every target alike.
                lat = {n: [] for n in names}
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                for k in range(args.n):
                    for n in order:
                        t = time.perf_counter()
                        targets[n](k)
                        lat[n].append(time.perf_counter() - t)
                for n in names:
                    p50[n].append(statistics.median(lat[n]) * 1e6)
            med = {n: statistics.median(v) for n, v in p50.items()}
            added_agg = med["kvroute_agg"] - med["direct_agg"]
            added_pd = med["kvroute_pd"] - med["direct_pd"]
            # Upper bound: the floor without one whole client round trip
            # (GET /health: client, loopback, the mocker's parse), which the
            # router's second leg pays too.
            added_pd_upper = med["kvroute_pd"] - (med["direct_pd"] - med["direct_health"])
            ratios = [(p50["kvroute_pd"][i] - p50["direct_pd"][i]) / (p50["kvroute_agg"][i] - p50["direct_agg"][i])
                      for i in range(args.rounds)]
            for n in names:
                print(f"{n:13s} p50 per round (us): " + " ".join(f"{x:.0f}" for x in p50[n]))
            print(f"added latency, aggregated: {added_agg:.0f} us; PD (two legs): {added_pd:.0f} us "
                  f"(upper bound {added_pd_upper:.0f} us); ratio {added_pd / added_agg:.2f}, upper bound "
                  f"{added_pd_upper / added_agg:.2f} (per round: {' '.join(f'{x:.2f}' for x in ratios)})")
            print(json.dumps({"p50_us": {n: round(v, 1) for n, v in med.items()},
                              "added_aggregated_us": round(added_agg, 1), "added_pd_us": round(added_pd, 1),
                              "ratio": round(added_pd / added_agg, 3),
                              "added_pd_upper_us": round(added_pd_upper, 1),
                              "ratio_upper": round(added_pd_upper / added_agg, 3),
                              "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3)}))
        finally:
            f.close()


if __name__ == "__main__":
    main()
