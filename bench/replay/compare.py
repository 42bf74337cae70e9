"""bench/replay.sh's verdict: a live replay (replay.py) against kvroute-sim on
the same requests and fleet.

Targets: live hit rate within 1 point of the simulated one; live TTFT p50
within 15 % of the simulated one. Also printed, without a target: TTFT p99 as
a ratio, kvroute's predicted-TTFT MAPE (live: its per-worker online model
against the first bytes it saw, scraped from /metrics) and the simulator's,
the decision-quality gap, the client's pacing and event-loop lag (wall ms, and
x SPEEDUP in engine ms: what this machine's CPU adds to every live TTFT), and,
request by request, how many requests went to the same worker as in the
simulation and the median live - sim TTFT of those that did with the same
cached tokens (the part of the gap that is not routing).

python3 compare.py LIVE_JSON SIM_JSON METRICS_TEXT LIVE_REQUESTS SIM_REQUESTS SPEEDUP [MOCKER_LOG_DIR]
(MOCKER_LOG_DIR: mocker-1.log .. mocker-8.log written with --log-level debug: each first token's engine times)
Exit 1 if a target is missed. Last line: one JSON object.
"""
import json
import os
import re
import sys

HIT_POINTS = 1.0   # target: |live - sim| hit rate, in points
P50_SHARE = 0.15   # target: |live / sim - 1| TTFT p50


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def pct(v, p):
    """The same percentile as replay.py and kvroute-sim: the value at index floor(p * n)."""
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def load_requests(path):
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            out[r["i"]] = r
    return out


FIRST_TOKEN = re.compile(r"first token of request \d+: prompt (\d+) tokens, (\d+) cached; arrived ([\d.]+), "
                         r"first token ([\d.]+), handed on ([\d.]+) engine ms")


def engine_side(log_dir, live_req):
    """Each live request's times inside its mocker (its debug log: arrival, first token, handed on),
    matched by worker and prompt length; requests whose match is ambiguous are left out."""
    by_key = {}
    for worker in range(1, 9):
        try:
            with open(os.path.join(log_dir, "mocker-%d.log" % worker)) as f:
                for line in f:
                    m = FIRST_TOKEN.search(line)
                    if m:
                        key = (worker, int(m.group(1)))
                        by_key.setdefault(key, []).append(tuple(float(x) for x in m.groups()[1:]))
        except OSError:
            pass
    out = {}
    for i, r in live_req.items():
        hits = by_key.get((r.get("worker"), r.get("tokens")), [])
        if len(hits) == 1:
            cached, arrived, first, handed = hits[0]
            out[i] = {"engine_ttft": first - arrived, "late": handed - first}
    return out


def main():
    live, sim_all, metrics = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    sim = sim_all["kvroute"]
    live_req, sim_req, speedup = load_requests(sys.argv[4]), load_requests(sys.argv[5]), float(sys.argv[6])

    mape = metric(metrics, "kvroute_scheduler_ttft_mape_ratio")
    cached, best = metric(metrics, "kvroute_router_cached_tokens_total"), metric(metrics,
                                                                             "kvroute_router_best_cached_tokens_total")
    gap = 1 - cached / best if best > 0 else 0.0
    hit_points = (live["hit_rate"] - sim["hit_rate"]) * 100
    p50_ratio = live["ttft_p50_ms"] / sim["ttft_p50_ms"] if sim["ttft_p50_ms"] > 0 else float("inf")
    p99_ratio = live["ttft_p99_ms"] / sim["ttft_p99_ms"] if sim["ttft_p99_ms"] > 0 else float("inf")
    hit_ok = abs(hit_points) <= HIT_POINTS
    p50_ok = abs(p50_ratio - 1) <= P50_SHARE

    # Request by request: the worker ids differ by one (mockers 1..8, sim engines 0..7).
    both = [i for i in live_req if i in sim_req and "worker" in live_req[i]]
    same_worker = [i for i in both if live_req[i]["worker"] == sim_req[i]["worker"] + 1]
    same_cache = [i for i in same_worker if live_req[i]["cached"] == sim_req[i]["cached"]]
    diffs = [live_req[i]["ttft_ms"] - sim_req[i]["ttft_ms"] for i in same_cache]
    pacing, loop = live.get("pacing_lag_wall_ms", {}), live.get("loop_lag_wall_ms", {})
    # Inside the mockers: the engine's own TTFT (arrival at the engine to its
    # first token, engine ms: what kvroute-sim computes, with this run's
    # routing), how late the mocker's timer handed the token on, and the rest
    # of the client's TTFT (client -> kvroute -> mocker and back, this
    # machine's CPU: wall time x SPEEDUP).
    eng = engine_side(sys.argv[7], live_req) if len(sys.argv) > 7 else {}
    engine_ttft = [e["engine_ttft"] for e in eng.values()]
    late = [e["late"] for e in eng.values()]
    overhead = [live_req[i]["ttft_ms"] - e["engine_ttft"] for i, e in eng.items()]
    engine_p50 = pct(engine_ttft, 0.5)
    # Means over all requests (engine ms): the client's TTFT and kvroute's
    # (request sent to the worker -> its first byte, kvroute_router_ttfb_seconds).
    ttfb_n = metric(metrics, "kvroute_router_ttfb_seconds_count")
    router_mean = metric(metrics, "kvroute_router_ttfb_seconds_sum") / ttfb_n * 1000 * speedup if ttfb_n else float("nan")
    client_mean = sum(r["ttft_ms"] for r in live_req.values()) / max(1, len(live_req))

    print("predicted-TTFT MAPE: live %.3f (kvroute's online model vs observed first bytes), sim %.3f"
          % (mape, sim["ttft_mape"]))
    print("decision-quality gap (1 - cached / best reachable tokens): live %.3f, sim %.3f" % (gap, sim["cache_gap"]))
    print("client lag (wall ms): pacing p50 %.2f p99 %.2f, event loop p50 %.2f p99 %.2f; x%g = %.0f / %.0f engine ms"
          " at p50 / p99 of the event loop's lag" % (pacing.get("p50", 0), pacing.get("p99", 0), loop.get("p50", 0),
                                                     loop.get("p99", 0), speedup, loop.get("p50", 0) * speedup,
                                                     loop.get("p99", 0) * speedup))
    print("request by request: %d of %d on the same worker as simulated, %d of them with the same cached tokens:"
          " live - sim TTFT median %.1f engine ms" % (len(same_worker), len(both), len(same_cache), median(diffs)))
    if eng:
        print("inside the mockers (%d of %d requests matched): engine TTFT p50 %.1f p99 %.1f ms (sim p50 %.1f: "
              "engine / sim %.3f); first tokens handed on late by p50 %.1f p99 %.1f engine ms; client TTFT - engine "
              "TTFT p50 %.1f p99 %.1f engine ms (= %.1f / %.1f wall ms: transport and this machine's CPU)"
              % (len(eng), len(live_req), engine_p50, pct(engine_ttft, 0.99), sim["ttft_p50_ms"],
                 engine_p50 / sim["ttft_p50_ms"], pct(late, 0.5), pct(late, 0.99), pct(overhead, 0.5),
                 pct(overhead, 0.99), pct(overhead, 0.5) / speedup, pct(overhead, 0.99) / speedup))
    print("mean TTFT over all requests: client %.1f, kvroute (sent to the worker -> its first byte) %.1f engine ms:"
          " client -> kvroute and the first byte back add %.1f wall ms"
          % (client_mean, router_mean, (client_mean - router_mean) / speedup))
    print("hit rate: live %.4f, sim %.4f: %.2f points apart (target within %.0f): %s"
          % (live["hit_rate"], sim["hit_rate"], abs(hit_points), HIT_POINTS, "pass" if hit_ok else "MISS"))
    print("TTFT p50: live %.1f ms, sim %.1f ms: live / sim %.3f (target within %.0f %%): %s"
          % (live["ttft_p50_ms"], sim["ttft_p50_ms"], p50_ratio, P50_SHARE * 100, "pass" if p50_ok else "MISS"))
    print("TTFT p99: live %.1f ms, sim %.1f ms: live / sim %.3f (no target)"
          % (live["ttft_p99_ms"], sim["ttft_p99_ms"], p99_ratio))
    print(json.dumps({"live": live, "sim": sim, "hit_rate_diff": round(hit_points / 100, 4),
                      "ttft_p50_ratio": round(p50_ratio, 4), "ttft_p99_ratio": round(p99_ratio, 4),
                      "hit_rate_pass": hit_ok, "ttft_p50_pass": p50_ok, "ttft_mape_live": round(mape, 4),
                      "cache_gap_live": round(gap, 4), "same_worker": len(same_worker), "compared": len(both),
                      "same_worker_same_cache_ttft_diff_ms": round(median(diffs), 1),
                      "engine_ttft_p50_ms": round(engine_p50, 1), "engine_ttft_p99_ms": round(pct(engine_ttft, 0.99), 1),
                      "engine_ttft_p50_ratio": round(engine_p50 / sim["ttft_p50_ms"], 4) if engine_ttft else None,
                      "handed_on_late_p50_ms": round(pct(late, 0.5), 1),
                      "client_overhead_p50_ms": round(pct(overhead, 0.5), 1),
                      "client_overhead_p99_ms": round(pct(overhead, 0.99), 1)}))
    return 0 if hit_ok and p50_ok else 1


if __name__ == "__main__":
    sys.exit(main())
