"""Pins bench/replay.sh's measuring parts (CTest replay_compare, label unit):
- compare.py's verdicts: hit rate within 1 point, TTFT p50 within 15 %, exit 1 on a miss;
- its reading of the mockers' first-token log lines (matched by worker and prompt length, an ambiguous
  match left out), against a line a real kvroute-mocker writes with --log-level debug;
- kvroute-sim --requests-out: one line per completed request, whose TTFTs and cached tokens give the
  p50 and the hit rate kvroute-sim prints, and whose session names the request's conversation.

python3 compare_test.py --build-dir BUILD
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run_compare(tmp, live, sim, live_reqs, sim_reqs, logs=None, metrics="", speedup=2):
    lp, sp = os.path.join(tmp, "live.jsonl"), os.path.join(tmp, "sim.jsonl")
    with open(lp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in live_reqs)
    with open(sp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in sim_reqs)
    logdir = os.path.join(tmp, "logs")
    os.makedirs(logdir, exist_ok=True)
    for w in range(1, 9):
        with open(os.path.join(logdir, "mocker-%d.log" % w), "w") as f:
            f.write((logs or {}).get(w, ""))
    p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), json.dumps(live), json.dumps({"kvroute": sim}),
                        metrics, lp, sp, str(speedup), logdir], capture_output=True, text=True)
    return p.returncode, p.stdout, json.loads(p.stdout.strip().splitlines()[-1])


def sim_fig(hit, p50, p99=1000.0):
    return {"hit_rate": hit, "ttft_p50_ms": p50, "ttft_p99_ms": p99, "ttft_mape": 0.2, "cache_gap": 0.05}


def live_fig(hit, p50, p99=1000.0):
    return {"hit_rate": hit, "ttft_p50_ms": p50, "ttft_p99_ms": p99}


def mocker_line(prompt, cached, arrived, first, handed):
    # As a kvroute-mocker writes it (checked against a real one in test_mocker_line).
    return ("[2026-11-26 10:00:00.000] [debug] kvroute-mocker: first token of request 7: prompt %d tokens, %d cached; "
            "arrived %.3f, first token %.3f, handed on %.3f engine ms\n" % (prompt, cached, arrived, first, handed))


def test_verdicts(tmp):
    reqs = [{"i": 0, "tokens": 1000, "worker": 1, "ttft_ms": 100.0, "cached": 0, "blocks": 1}]
    sreqs = [{"i": 0, "worker": 0, "ttft_ms": 90.0, "cached": 0, "blocks": 1}]
    rc, out, j = run_compare(tmp, live_fig(0.200, 110), sim_fig(0.195, 100), reqs, sreqs)
    check(rc == 0 and j["hit_rate_pass"] and j["ttft_p50_pass"], "within both targets passes (rc %d)" % rc)
    check("0.50 points apart" in out and "live / sim 1.100" in out, "points and ratio printed:\n" + out)
    rc, out, j = run_compare(tmp, live_fig(0.215, 100), sim_fig(0.200, 100), reqs, sreqs)
    check(rc == 1 and not j["hit_rate_pass"] and j["ttft_p50_pass"], "1.5 points apart is a miss")
    rc, out, j = run_compare(tmp, live_fig(0.200, 120), sim_fig(0.200, 100), reqs, sreqs)
    check(rc == 1 and j["hit_rate_pass"] and not j["ttft_p50_pass"], "live p50 1.2x the simulated one is a miss")
    rc, out, j = run_compare(tmp, live_fig(0.200, 84), sim_fig(0.200, 100), reqs, sreqs)
    check(rc == 1 and not j["ttft_p50_pass"], "live p50 0.84x the simulated one is a miss")
    check(j["same_worker"] == 1, "mocker ids 1..8 are the simulator's engines 0..7")


def test_engine_side(tmp):
    # Request 0 on worker 2 (prompt 5000) matches one log line; request 1's prompt appears twice on
    # worker 3 (ambiguous: left out); request 2 has no line.
    live = [{"i": 0, "tokens": 5000, "worker": 2, "ttft_ms": 300.0, "cached": 0, "blocks": 9},
            {"i": 1, "tokens": 700, "worker": 3, "ttft_ms": 50.0, "cached": 0, "blocks": 1},
            {"i": 2, "tokens": 900, "worker": 4, "ttft_ms": 60.0, "cached": 0, "blocks": 1}]
    sim = [{"i": k, "worker": 0, "ttft_ms": 250.0, "cached": 0, "blocks": 1} for k in range(3)]
    logs = {2: "noise\n" + mocker_line(5000, 0, 1000.0, 1250.0, 1252.5),
            3: mocker_line(700, 0, 10.0, 40.0, 41.0) + mocker_line(700, 0, 500.0, 530.0, 531.0)}
    rc, out, j = run_compare(tmp, live_fig(0.1, 300), sim_fig(0.1, 250), live, sim, logs)
    check("(1 of 3 requests matched)" in out, "one unambiguous match:\n" + out)
    check(j["engine_ttft_p50_ms"] == 250.0, "engine TTFT = first token - arrival (%s)" % j["engine_ttft_p50_ms"])
    check(j["handed_on_late_p50_ms"] == 2.5, "handed on late = handed on - first token")
    check(j["client_overhead_p50_ms"] == 50.0, "client overhead = client TTFT - engine TTFT")


def test_mocker_line(tmp, build):
    """A real kvroute-mocker's first-token line, in the format compare.py reads."""
    sys.path.insert(0, HERE)
    import compare  # noqa: E402
    log = open(os.path.join(tmp, "mocker.log"), "w")
    m = subprocess.Popen([os.path.join(build, "mocker", "kvroute-mocker"), "--port", "0", "--block-size", "512",
                          "--log-level", "debug"], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        url = m.stdout.readline().split(" listening on ")[1].strip()
        body = json.dumps({"model": "mock-model", "prompt": list(range(1300)), "max_tokens": 2}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()
        deadline, found = time.time() + 60, None
        while time.time() < deadline and not found:
            with open(os.path.join(tmp, "mocker.log")) as f:
                found = next((compare.FIRST_TOKEN.search(l) for l in f if compare.FIRST_TOKEN.search(l)), None)
            time.sleep(0.05)
        check(found is not None, "the mocker logs each first token in compare.py's format")
        if found:
            prompt, cached, arrived, first, handed = found.groups()
            check(int(prompt) == 1300 and int(cached) == 0, "prompt and cached tokens logged")
            check(float(first) > float(arrived) and float(handed) >= float(first), "arrival < first token <= handed on")
    finally:
        m.terminate()
        m.wait()


def test_sim_requests_out(tmp, build):
    path = os.path.join(tmp, "sim_requests.jsonl")
    p = subprocess.run([os.path.join(build, "sim", "kvroute-sim"), "--trace",
                        os.path.join(ROOT, "traces", "mooncake_conversation_trace.jsonl"), "--requests", "150",
                        "--policies", "kvroute", "--workers", "4", "--requests-out", path],
                       capture_output=True, text=True, check=True)
    res = json.loads(p.stdout.strip().splitlines()[-1])["kvroute"]
    rows = [json.loads(l) for l in open(path)]
    check(len(rows) == 150 - res["rejected"], "one line per completed request (%d)" % len(rows))
    check(sorted(r["i"] for r in rows) == sorted(set(r["i"] for r in rows)), "each request once")
    ttft = sorted(r["ttft_ms"] for r in rows)
    p50 = ttft[min(len(ttft) - 1, int(0.5 * len(ttft)))]
    check(abs(p50 - res["ttft_p50_ms"]) <= 0.1, "its TTFTs give the printed p50 (%s vs %s)" % (p50, res["ttft_p50_ms"]))
    hit = sum(min(r["cached"] // 512, r["blocks"]) for r in rows) / sum(r["blocks"] for r in rows)
    check(abs(hit - res["hit_rate"]) <= 1e-4, "its cached tokens give the printed hit rate (%s vs %s)" % (hit, res["hit_rate"]))
    check(all(0 <= r["worker"] < 4 for r in rows), "workers are the engines 0..3")
    check(all(r["session"] == 0 for r in rows), "the trace's requests belong to no session")
    # A generated workload names each request's conversation: a session's turns grow its prompt.
    p = subprocess.run([os.path.join(build, "sim", "kvroute-sim"), "--workload", "agentic", "--requests", "300",
                        "--policies", "kvroute", "--workers", "4", "--requests-out", path],
                       capture_output=True, text=True, check=True)
    turns = {}
    for r in sorted((json.loads(l) for l in open(path)), key=lambda r: r["arrival_ms"]):
        turns.setdefault(r["session"], []).append(r["blocks"])
    check(0 not in turns and 1 < len(turns) < 300, "agentic requests carry their session (%d sessions)" % len(turns))
    check(all(b == sorted(b) for b in turns.values()), "a session's prompts grow turn by turn")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        test_verdicts(tmp)
        test_engine_side(tmp)
        test_mocker_line(tmp, os.path.abspath(a.build_dir))
        test_sim_requests_out(tmp, os.path.abspath(a.build_dir))
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
