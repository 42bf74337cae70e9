"""Live replay: sends a Mooncake-format trace over HTTP to a running kvroute
(in front of kvroute-mockers), time-scaled, as streaming completions with
token-id prompts synthesized from the hash ids (512 tokens per id: equal ids,
equal tokens). Measures TTFT at the first SSE chunk and the hit rate from each
answer's usage.prompt_tokens_details.cached_tokens, and prints the same
figures as kvroute-sim (engine milliseconds: wall time x --speedup).

Every request body is encoded before the clock starts (a 14k-token prompt is
~90 kB of JSON: encoding it on the event loop would delay the other streams'
first bytes). The client's own lateness is measured and printed: `pacing_lag`
(how late each request was sent after its due time) and `loop_lag` (how late
a 1 ms timer fired on the event loop while streams ran), both in wall ms: on
a shared machine they show how much of a TTFT gap is this client's CPU.

python3 replay.py --url http://127.0.0.1:PORT --trace FILE --requests N --speedup S [--rate R]
                  [--requests-out FILE]   (one JSON line per request: i, due/sent ms, ttft, worker, cached)
"""
import argparse
import asyncio
import json
import time


def load(path, n):
    out = []
    with open(path) as f:
        for line in f:
            if len(out) >= n:
                break
            out.append(json.loads(line))
    return out


def full_blocks(req):
    """Complete 512-token blocks of the prompt that carry a trace hash id (as kvroute-sim counts them)."""
    return min(len(req["hash_ids"]), req["input_length"] // 512)


def prompt_tokens(req, index):
    toks = []
    for h in req["hash_ids"][:full_blocks(req)]:
        toks.extend((h * 7919 + i) % 150000 for i in range(512))
    # The partial tail: unique per request (keyed by its index in the trace), never cached.
    tail = req["input_length"] - len(toks)
    toks.extend(200000 + (index * 1009 + i) % 100000 for i in range(max(0, tail)))
    return toks


def dechunk(raw):
    """An HTTP/1.1 chunked body's payload."""
    out, pos = [], 0
    while True:
        eol = raw.index(b"\r\n", pos)
        size = int(raw[pos:eol].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(raw[eol + 2:eol + 2 + size])
        pos = eol + 2 + size + 2


def body(req, index):
    return json.dumps({"model": "mock-model", "prompt": prompt_tokens(req, index), "max_tokens": req["output_length"],
                       "stream": True, "stream_options": {"include_usage": True}}).encode()


async def one(host, port, index, req, payload, results, speedup, start):
    rec = {"i": index, "due_ms": round(req["timestamp"], 1), "tokens": req["input_length"], "blocks": full_blocks(req)}
    t0 = time.perf_counter()
    rec["sent_ms"] = round((t0 - start) * 1000 * speedup, 1)
    ttft = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            results["errors"] += 1
            results["error_kinds"][status.decode(errors="replace").strip()[:40]] = \
                results["error_kinds"].get(status.decode(errors="replace").strip()[:40], 0) + 1
            return
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"x-kvroute-worker:"):
                rec["worker"] = int(line.split(b":")[1])
        # The body as it comes, in large reads (Connection: close ends it):
        # one Python call per read rather than per token keeps this client's
        # CPU off the other streams' first bytes. De-chunked at the end.
        pieces = []
        while piece := await reader.read(1 << 16):
            if ttft is None and b"data: " in piece:
                ttft = (time.perf_counter() - t0) * 1000 * speedup
            pieces.append(piece)
        writer.close()
        usage = None
        for line in dechunk(b"".join(pieces)).split(b"\n"):
            if line.startswith(b"data: {") and b'"usage"' in line:
                usage = json.loads(line[6:])["usage"]
        if ttft is None or usage is None:
            results["errors"] += 1
            results["error_kinds"]["no first token or usage"] = results["error_kinds"].get("no first token or usage", 0) + 1
            return
        rec["ttft_ms"] = round(ttft, 1)
        rec["e2e_ms"] = round((time.perf_counter() - t0) * 1000 * speedup, 1)
        rec["cached"] = usage["prompt_tokens_details"]["cached_tokens"]
        results["ttft"].append(ttft)
        results["e2e"].append(rec["e2e_ms"])
        results["blocks"] += rec["blocks"]
        results["hit_blocks"] += min(rec["blocks"], rec["cached"] // 512)
        results["records"].append(rec)
    except (OSError, ValueError, asyncio.IncompleteReadError) as e:
        results["errors"] += 1
        results["error_kinds"][type(e).__name__] = results["error_kinds"].get(type(e).__name__, 0) + 1


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else 0.0


async def watch_loop(lags, stop):
    """How late a 1 ms sleep wakes up: the event loop's own backlog (wall ms)."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - t) * 1000 - 1.0)


async def main(a):
    host, port = a.url.split("//")[1].split(":")
    trace = load(a.trace, a.requests)
    payloads = [body(req, i) for i, req in enumerate(trace)]
    results = {"ttft": [], "e2e": [], "blocks": 0, "hit_blocks": 0, "errors": 0, "error_kinds": {}, "records": []}
    pacing, loop_lags, stop = [], [], asyncio.Event()
    watcher = asyncio.create_task(watch_loop(loop_lags, stop))
    start = time.perf_counter()
    tasks = []
    for i, req in enumerate(trace):
        due = req["timestamp"] / a.rate / a.speedup / 1000.0
        delay = start + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pacing.append(max(0.0, (time.perf_counter() - start - due) * 1000))
        tasks.append(asyncio.create_task(one(host, int(port), i, req, payloads[i], results, a.speedup, start)))
    await asyncio.gather(*tasks)
    stop.set()
    await watcher
    out = {"requests": len(trace), "errors": results["errors"], "error_kinds": results["error_kinds"],
           "hit_rate": round(results["hit_blocks"] / max(1, results["blocks"]), 4),
           "ttft_p50_ms": round(pct(results["ttft"], 0.5), 1), "ttft_p90_ms": round(pct(results["ttft"], 0.9), 1),
           "ttft_p99_ms": round(pct(results["ttft"], 0.99), 1), "e2e_p50_ms": round(pct(results["e2e"], 0.5), 1),
           "wall_s": round(time.perf_counter() - start, 1),
           "pacing_lag_wall_ms": {"p50": round(pct(pacing, 0.5), 2), "p99": round(pct(pacing, 0.99), 2)},
           "loop_lag_wall_ms": {"p50": round(pct(loop_lags, 0.5), 2), "p99": round(pct(loop_lags, 0.99), 2)}}
    if a.requests_out:
        with open(a.requests_out, "w") as f:
            for rec in sorted(results["records"], key=lambda r: r["i"]):
                f.write(json.dumps(rec) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--speedup", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--requests-out", default="")
    asyncio.run(main(ap.parse_args()))
