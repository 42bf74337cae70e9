"""What the engine's POST /tokenize costs a request, against kvroute's own
tokenizer: the added latency of tokenizer.remote as a ratio.

One kvroute process, two models served by kvroute-mocker workers in vLLM mode
with Qwen3's real tokenizer and chat template (--tokenizer): `local-model` is
in kvroute's tokenizer.models (the fast path: chat template + tokenizer in the
router), `remote-model` is not (kvroute asks the worker's /tokenize before
routing; remote_cache_bytes 0, so every request pays the round trip: a
repeated prompt would be answered from the cache instead). The same prompts
go to both models: ROUNDS rounds of REQUESTS requests per model, one client
connection, the two phases' order alternating per round.

Figures per phase, medians over rounds:
  - local_tokenize_us: kvroute's tokenize stage per request, from
    kvroute_router_decision_seconds{stage="tokenize"} (template + tokenizer);
  - engine_tokenize_us: one /tokenize round trip, from
    kvroute_router_engine_tokenize_seconds (connect included when the pooled
    connection is gone; the mocker's own tokenization included, as an
    engine's is);
  - engine_vs_local_ratio = engine_tokenize_us / local_tokenize_us;
  - client latency p50/p99 per model (request to full response, mocker at
    --speedup 1000 so its simulated prefill is small) and added_ms_p50.

Prompts: seeded (SEED 7) chat requests (a ~1,500-token system prompt shared
by all, a unique user turn each) and text completions of the same size.

Run: python3 bench/tokenizer/engine_tokenize.py --build-dir build [--requests 200] [--rounds 3]
(needs the reference tokenizers: tests/tokenizer/setup_reference.sh)
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from fleet import Fleet  # noqa: E402

QWEN = os.path.join(ROOT, "tests", "reference", "data", "models", "qwen3")
WORDS = ("depot parcel route courier invoice customs pallet freight manifest delivery window driver "
         "warehouse dock seal label tracking scan hub transfer").split()


def prompts(n, seed=7):
    rnd = random.Random(seed)
    system = " ".join(rnd.choice(WORDS) for _ in range(1200))
    out = []
    for i in range(n):
        tail = " ".join(rnd.choice(WORDS) for _ in range(40)) + f" #{i}"
        if i % 2 == 0:
            out.append(("/v1/chat/completions", {"messages": [{"role": "system", "content": system},
                                                              {"role": "user", "content": tail}]}))
        else:
            out.append(("/v1/completions", {"prompt": system + " " + tail}))
    return out


def snapshot(f):
    m = f.metrics()
    return {
        "tok_sum": m.get('kvroute_router_decision_seconds_sum{stage="tokenize"}', 0.0),
        "tok_count": m.get('kvroute_router_decision_seconds_count{stage="tokenize"}', 0.0),
        "eng_sum": m.get("kvroute_router_engine_tokenize_seconds_sum", 0.0),
        "eng_count": m.get("kvroute_router_engine_tokenize_seconds_count", 0.0),
        "eng_ok": m.get('kvroute_router_engine_tokenize_total{result="ok"}', 0.0),
    }


def phase(f, model, reqs):
    before = snapshot(f)
    lat = []
    for path, body in reqs:
        b = dict(body, model=model, max_tokens=1)
        t0 = time.perf_counter()
        r = f.post(path, b)
        lat.append((time.perf_counter() - t0) * 1e3)
        if r.status != 200:
            raise RuntimeError(f"{model}: {r.status} {r.body[:200]}")
    after = snapshot(f)
    d = {k: after[k] - before[k] for k in after}
    return lat, d


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(QWEN, ".done")):
        subprocess.run(["bash", os.path.join(ROOT, "tests", "tokenizer", "setup_reference.sh")], check=True)
    reqs = prompts(a.requests)
    with tempfile.TemporaryDirectory(prefix="kvroute-bench-enginetok-") as tmp:
        f = Fleet(a.build_dir, tmp, block_size=16, speedup=1000.0)
        try:
            lines = ["workers:", "  static:"]
            for i, model in ((1, "local-model"), (2, "remote-model")):
                url, kv, replay = f.start_vllm_mocker(i, extra=["--model", model, "--tokenizer", QWEN])
                lines.append(f'    - {{id: {i}, url: "{url}", model: {model}, kv_events: "{kv}", replay: "{replay}"}}')
            lines += ["tokenizer:", f"  models: local-model={QWEN}", "  remote_cache_bytes: 0", "log:",
                      "  access_log: false"]
            f.start_router_config("\n".join(lines) + "\n")
            f.wait_ready(2)
            phase(f, "local-model", reqs[:10])  # warm both paths (connections, per-thread caches)
            phase(f, "remote-model", reqs[:10])
            rows = []
            for r in range(a.rounds):
                order = ("local-model", "remote-model") if r % 2 == 0 else ("remote-model", "local-model")
                res = {m: phase(f, m, reqs) for m in order}
                (llat, ld), (rlat, rd) = res["local-model"], res["remote-model"]
                if rd["eng_ok"] != len(reqs):
                    raise RuntimeError(f"remote phase: {rd['eng_ok']} of {len(reqs)} /tokenize calls succeeded")
                row = {
                    "local_tokenize_us": ld["tok_sum"] / ld["tok_count"] * 1e6,
                    "engine_tokenize_us": rd["eng_sum"] / rd["eng_count"] * 1e6,
                    "local_p50_ms": pct(llat, 0.5), "local_p99_ms": pct(llat, 0.99),
                    "remote_p50_ms": pct(rlat, 0.5), "remote_p99_ms": pct(rlat, 0.99),
                }
                row["engine_vs_local_ratio"] = row["engine_tokenize_us"] / row["local_tokenize_us"]
                row["added_ms_p50"] = row["remote_p50_ms"] - row["local_p50_ms"]
                rows.append(row)
                print(f"round {r + 1}: local tokenize {row['local_tokenize_us']:.0f} us, engine /tokenize "
                      f"{row['engine_tokenize_us']:.0f} us (x{row['engine_vs_local_ratio']:.2f}); client p50 "
                      f"local {row['local_p50_ms']:.2f} ms, remote {row['remote_p50_ms']:.2f} ms "
                      f"(+{row['added_ms_p50']:.2f} ms); p99 {row['local_p99_ms']:.2f} / "
                      f"{row['remote_p99_ms']:.2f} ms", flush=True)
        finally:
            f.close()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"median of {a.rounds} rounds x {a.requests} requests per model: engine /tokenize "
          f"{med['engine_tokenize_us']:.0f} us vs local tokenizer {med['local_tokenize_us']:.0f} us = "
          f"x{med['engine_vs_local_ratio']:.2f}; added client latency p50 {med['added_ms_p50']:.2f} ms")
    print(json.dumps({"bench": "engine_tokenize", "requests": a.requests, "rounds": a.rounds,
                      **{k: round(v, 3) for k, v in med.items()},
                      "ratio_spread": [round(r["engine_vs_local_ratio"], 2) for r in rows]}))


if __name__ == "__main__":
    main()
