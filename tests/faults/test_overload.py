"""Overload: arrivals at ~3x the fleet's capacity, two tenants at 10:1
traffic (equal weights), two priority bands (--high-fraction of the
arrivals high: the x-kvroute-priority header, which kvroute forwards to the
engines as vLLM's priority -1 when they run vLLM's priority scheduling
policy, --engine-policy; the normal band keeps --reserve-pct of every
worker's slots free for it, flow.bands reserve_pct).
Checks that nothing is lost (every request answered 200, or 429 with
Retry-After; no 5xx, no dropped connection), that the queue stays within
its bounds (count and bytes, sampled from /metrics), and that the small
tenant gets at least its weighted share of what was served (with equal
weights its share is half: its demand, 1/11, is below it, so it must be
served at least as well as the big tenant). Prints the high band's TTFT
p99 loaded against unloaded (the issue's target is within 1.5x; printed,
not asserted: see the report line).

Real nats-server, two kvroute-mockers (--slots request slots each) and kvroute.
Run: python3 tests/faults/test_overload.py --build-dir build [--duration 60]
     [--slots 8] [--reserve-pct 50] [--high-fraction 0.05] [--speedup 1]
     [--engine-policy priority|fcfs] [--load 3]
(bench/flow/overload.sh runs the 60 s one; CTest a 12 s one.)
"""
import argparse
import hashlib
import json
import os
import random
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from fleet import Fleet, wait_until  # noqa: E402

KEYS = {"big": "sk-big-overload", "small": "sk-small-overload"}
QUEUE_SIZE = 8
QUEUE_BYTES = 1 << 20
HIGH_QUEUED = 'kvroute_router_queue_wait_seconds_count{band="high",outcome="admitted"}'


def stream_request(port, body, key, timeout=30, headers=None, timing=None):
    """POST a streaming completion; returns (status, retry_after, ttft_s, error).
    `timing` (a dict, optional) gets the mocker's x-mocker-queued-ms (ms the
    request waited in the engine before its first step)."""
    data = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    t0 = time.time()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
                  f"Authorization: Bearer {key}\r\n{extra}Content-Length: {len(data)}\r\n"
                  "Connection: close\r\n\r\n".encode() + data)
        got = b""
        ttft = None
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
            if ttft is None and b"data:" in got:
                ttft = time.time() - t0
        s.close()
    except OSError as e:
        return None, None, None, str(e)
    head = got.split(b"\r\n\r\n", 1)[0].decode(errors="replace")
    if not head.startswith("HTTP/1.1 "):
        return None, None, None, "no response"
    status = int(head.split(" ")[1])
    retry = None
    for line in head.split("\r\n")[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "retry-after":
            retry = v.strip()
        if k.strip().lower() == "x-mocker-queued-ms" and timing is not None:
            timing["engine_queued_ms"] = float(v.strip())
        if k.strip().lower() == "x-mocker-ttft-ms" and timing is not None:
            timing["mocker_ttft_ms"] = float(v.strip())
    if status == 200 and b"[DONE]" not in got:
        return status, retry, ttft, "stream cut"
    return status, retry, ttft, None


def p50(values):
    v = sorted(values)
    return v[len(v) // 2] if v else float("nan")


def p99(values):
    v = sorted(values)
    return v[min(len(v) - 1, int(0.99 * len(v)))] if v else float("nan")


def run(build_dir, duration, slots_per_worker=8, reserve_pct=50, high_fraction=0.05, speedup=1.0, max_tokens=96,
        engine_policy="priority", load=3.0):
    tmp = tempfile.TemporaryDirectory(prefix="kvroute-overload-")
    keys = os.path.join(tmp.name, "keys.txt")
    with open(keys, "w") as f:
        for tenant, key in KEYS.items():
            f.write(f"{hashlib.sha256(key.encode()).hexdigest()} {tenant}\n")
    cfg = os.path.join(tmp.name, "kvroute.yaml")
    with open(cfg, "w") as f:
        f.write(f"scheduler:\n  queue_size: {QUEUE_SIZE}\n  queue_timeout_ms: 1000\n  reject_when_busy: true\n"
                f"flow:\n  keys_file: {keys}\n  queue_max_bytes: {QUEUE_BYTES}\n"
                f"  bands: \"name=high,max_priority=-1;name=normal,reserve_pct={reserve_pct}\"\n"
                "  tenants:\n    - {name: big, weight: 1}\n    - {name: small, weight: 1}\n"
                f"  forward_priority: {'true' if engine_policy == 'priority' else 'false'}\n")
    fleet = Fleet(build_dir, tmp.name, speedup=speedup, router_args=["--config", cfg])
    try:
        fleet.start_nats()
        for i in (1, 2):
            fleet.start_mocker(i, extra=["--max-seqs", str(slots_per_worker), "--scheduling-policy", engine_policy])
        fleet.start_router()
        fleet.wait_ready(2)
        port = fleet.router_port
        rng = random.Random(7)

        def body(i, high):
            # The band comes from the x-kvroute-priority header (high_headers):
            # with the priority policy kvroute forwards it to the engine as
            # vLLM's priority (flow.forward_priority); with fcfs the engine
            # never sees one (vLLM refuses a priority other than 0 then).
            return {"model": "mock-model", "prompt": f"request {i} " + "word " * 64, "max_tokens": max_tokens,
                    "stream": True}

        def high_headers(high):
            return {"x-kvroute-priority": "high"} if high else None

        # Unloaded: the high band's TTFT and the service time, one at a time.
        unloaded, service, unloaded_engine, unloaded_mocker = [], [], [], []
        for i in range(30):
            t0 = time.time()
            timing = {}
            status, _, ttft, err = stream_request(port, body(-i, True), KEYS["small"], headers=high_headers(True),
                                                  timing=timing)
            assert status == 200 and err is None, (status, err)
            unloaded.append(ttft)
            unloaded_engine.append(timing.get("engine_queued_ms", float("nan")))
            unloaded_mocker.append(timing.get("mocker_ttft_ms", float("nan")))
            service.append(time.time() - t0)
        # More unloaded TTFT samples (one token each: the TTFT is the same), so
        # its p99 is a percentile of 100, not the largest of 30.
        for i in range(70):
            b = body(-100 - i, True)
            b["max_tokens"] = 1
            timing = {}
            status, _, ttft, err = stream_request(port, b, KEYS["small"], headers=high_headers(True), timing=timing)
            assert status == 200 and err is None, (status, err)
            unloaded.append(ttft)
            unloaded_engine.append(timing.get("engine_queued_ms", float("nan")))
            unloaded_mocker.append(timing.get("mocker_ttft_ms", float("nan")))
        slots = 2 * slots_per_worker
        capacity = slots / (sorted(service)[len(service) // 2])
        rate = load * capacity
        print(f"unloaded: high-band TTFT p99 {p99(unloaded) * 1e3:.1f} ms, service p50 "
              f"{sorted(service)[len(service) // 2] * 1e3:.1f} ms -> capacity ~{capacity:.1f} req/s; "
              f"arrivals {rate:.1f} req/s for {duration} s")

        results = []
        lock = threading.Lock()
        stop_sampling = threading.Event()
        samples = []

        def sampler():
            while not stop_sampling.is_set():
                m = fleet.metrics()
                samples.append((m.get("kvroute_router_queued_requests", 0), m.get("kvroute_router_queue_bytes", 0)))
                time.sleep(0.2)

        timings = []  # (high, engine_queued_ms, ttft_s) of each 200

        def one(i, tenant, high):
            timing = {}
            r = stream_request(port, body(i, high), KEYS[tenant], headers=high_headers(high), timing=timing)
            with lock:
                results.append((tenant, high) + r)
                if r[0] == 200 and r[2] is not None and "engine_queued_ms" in timing:
                    timings.append((high, timing["engine_queued_ms"], r[2], timing.get("mocker_ttft_ms", float("nan"))))

        st = threading.Thread(target=sampler)
        st.start()
        threads = []
        t_end = time.time() + duration
        i = 0
        next_at = time.time()
        while time.time() < t_end:
            next_at += rng.expovariate(rate)
            delay = next_at - time.time()
            if delay > 0:
                time.sleep(delay)
            tenant = "small" if rng.random() < 1 / 11 else "big"
            high = rng.random() < high_fraction
            th = threading.Thread(target=one, args=(i, tenant, high))
            th.start()
            threads.append(th)
            i += 1
        for th in threads:
            th.join(60)
        stop_sampling.set()
        st.join()

        lost = [r for r in results if r[2] is None or r[5] is not None]
        bad = [r for r in results if r[2] is not None and r[2] not in (200, 429)]
        no_retry = [r for r in results if r[2] == 429 and not r[3]]
        by = {}
        for tenant, high, status, _, ttft, _ in results:
            d = by.setdefault(tenant, [0, 0])
            d[0] += 1
            d[1] += status == 200
        loaded_high = [r[4] for r in results if r[1] and r[2] == 200 and r[4] is not None]
        max_q = max((s[0] for s in samples), default=0)
        max_b = max((s[1] for s in samples), default=0)
        ratio = p99(loaded_high) / p99(unloaded)
        print(f"sent {len(results)} (of {i}): " + ", ".join(
            f"{t} {d[1]}/{d[0]} served ({d[1] / max(d[0], 1):.0%})" for t, d in sorted(by.items())))
        served = sum(d[1] for d in by.values())
        small_sent = by.get("small", [0, 0])[0] / max(len(results), 1)
        small_share = by.get("small", [0, 0])[1] / max(served, 1)
        entitled = min(small_sent, 0.5)  # equal weights: half of what is served, or all it asks if less
        print(f"small tenant: {small_share:.1%} of what was served; weighted share {entitled:.1%} "
              f"(min(its {small_sent:.1%} of the requests, weight 1 of 2)): "
              f"{'met' if small_share >= entitled else 'NOT met'}")
        print(f"200 {sum(r[2] == 200 for r in results)}, 429 with Retry-After "
              f"{sum(r[2] == 429 and bool(r[3]) for r in results)}, 429 without Retry-After {len(no_retry)}, "
              f"other status {len(bad)}, lost (no answer or a cut stream) {len(lost)}")
        print(f"queue max {max_q:.0f} of {QUEUE_SIZE}, bytes max {max_b:.0f} of {QUEUE_BYTES}")
        high_all = [r for r in results if r[1]]
        print(f"high band: {len(high_all)} sent, {sum(r[2] == 200 for r in high_all)} served, "
              f"{sum(r[2] == 429 for r in high_all)} 429; TTFT p50 {p50(loaded_high) * 1e3:.1f} ms; router: "
              f"{fleet.metric(HIGH_QUEUED) or 0:.0f} "
              f"high-band requests waited in the queue")
        # Where the high band's TTFT goes: the engine's wait before its first
        # step (the step in progress, then its waiting queue: the mocker's
        # x-mocker-queued-ms), and the rest (the prefill step, the router, the
        # client and the machine).
        hq = [t[1] for t in timings if t[0]]
        nq = [t[1] for t in timings if not t[0]]
        rest = [t[2] * 1e3 - t[1] for t in timings if t[0]]
        unloaded_rest = [u * 1e3 - q for u, q in zip(unloaded, unloaded_engine)]
        # Outside the mocker: the client's TTFT minus the mocker's own (the
        # router, the client, loopback; each a process on the shared CPUs).
        outside = [t[2] * 1e3 - t[3] for t in timings if t[0]]
        unloaded_outside = [u * 1e3 - m for u, m in zip(unloaded, unloaded_mocker)]
        hm = [t[3] for t in timings if t[0]]
        print(f"high band engine wait (x-mocker-queued-ms): loaded p50 {p50(hq):.1f} p99 {p99(hq):.1f} ms "
              f"(unloaded p50 {p50(unloaded_engine):.1f} p99 {p99(unloaded_engine):.1f}); normal band loaded p50 "
              f"{p50(nq):.1f} p99 {p99(nq):.1f} ms; high band TTFT minus engine wait: loaded p50 {p50(rest):.1f} "
              f"p99 {p99(rest):.1f} ms (unloaded p50 {p50(unloaded_rest):.1f} p99 {p99(unloaded_rest):.1f}); "
              f"engine policy {engine_policy}")
        print(f"high band TTFT inside the mocker (x-mocker-ttft-ms): loaded p50 {p50(hm):.1f} p99 {p99(hm):.1f} ms "
              f"(unloaded p50 {p50(unloaded_mocker):.1f} p99 {p99(unloaded_mocker):.1f}); outside it (router, client, "
              f"loopback): loaded p50 {p50(outside):.1f} p99 {p99(outside):.1f} ms (unloaded p50 "
              f"{p50(unloaded_outside):.1f} p99 {p99(unloaded_outside):.1f})")
        print(f"high band TTFT p99: loaded {p99(loaded_high) * 1e3:.1f} ms vs unloaded {p99(unloaded) * 1e3:.1f} ms "
              f"= {ratio:.2f}x (target <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'})")
        print(json.dumps({"test": "overload", "duration_s": duration, "sent": len(results), "lost": len(lost),
                          "other_status": len(bad), "no_retry_after": len(no_retry),
                          "served_big": by.get("big", [0, 0])[1], "sent_big": by.get("big", [0, 0])[0],
                          "served_small": by.get("small", [0, 0])[1], "sent_small": by.get("small", [0, 0])[0],
                          "queue_max": max_q, "queue_bytes_max": max_b, "high_ttft_p99_ratio": round(ratio, 2),
                          "slots_per_worker": slots_per_worker, "reserve_pct": reserve_pct,
                          "high_fraction": high_fraction, "small_share": round(small_share, 4),
                          "small_entitled": round(entitled, 4), "engine_policy": engine_policy,
                          "high_engine_wait_p99_ms": round(p99(hq), 2),
                          "high_ttft_minus_engine_wait_p99_ms": round(p99(rest), 2),
                          "high_mocker_ttft_p99_ms": round(p99(hm), 2), "high_outside_mocker_p99_ms": round(p99(outside), 2)}))
        failures = []
        if lost:
            failures.append(f"{len(lost)} requests lost: {lost[:3]}")
        if bad:
            failures.append(f"{len(bad)} answered neither 200 nor 429: {bad[:3]}")
        if no_retry:
            failures.append(f"{len(no_retry)} 429 without Retry-After")
        if max_q > QUEUE_SIZE or max_b > QUEUE_BYTES:
            failures.append("queue over its bounds")
        if by.get("small", [0, 0])[0] and small_share < entitled:
            failures.append(f"the small tenant got {small_share:.1%} of what was served, under its weighted share "
                            f"{entitled:.1%}")
        if load >= 2 and not any(r[2] == 429 for r in results):
            failures.append("no 429 at all: the fleet was not overloaded")
        return failures
    finally:
        fleet.close()
        tmp.cleanup()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--duration", type=float, default=12)
    ap.add_argument("--slots", type=int, default=8, help="request slots per mocker (2 mockers)")
    ap.add_argument("--reserve-pct", type=int, default=50, help="the normal band's reserve_pct (flow.bands)")
    ap.add_argument("--high-fraction", type=float, default=0.05, help="share of arrivals in the high band")
    ap.add_argument("--speedup", type=float, default=1.0, help="the mockers' --speedup")
    ap.add_argument("--engine-policy", choices=["priority", "fcfs"], default="priority",
                    help="the mockers' --scheduling-policy (vLLM's); priority: kvroute forwards the band as vLLM's "
                         "priority (flow.forward_priority)")
    ap.add_argument("--load", type=float, default=3.0,
                    help="arrivals as a multiple of the measured capacity (3: the overload; e.g. 0.15 with "
                         "--high-fraction 1: the high band alone at its rate under the overload)")
    ap.add_argument("--max-tokens", type=int, default=96,
                    help="tokens per answer: longer answers, fewer arrivals for the same 3x (a lighter client)")
    args = ap.parse_args()
    failures = run(os.path.abspath(args.build_dir), args.duration, args.slots, args.reserve_pct, args.high_fraction,
                   args.speedup, args.max_tokens, args.engine_policy, args.load)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)
