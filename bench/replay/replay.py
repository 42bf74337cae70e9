"""Live replay: sends a Mooncake-format trace over HTTP to a running kvroute
(in front of kvroute-mockers), time-scaled, as streaming completions with
token-id prompts synthesized from the hash ids (512 tokens per id: equal ids,
equal tokens). Measures TTFT at the first SSE chunk and the hit rate from each
answer's usage.prompt_tokens_details.cached_tokens, and prints the same
figures as kvroute-sim (engine milliseconds: wall time x --speedup).

python3 replay.py --url http://127.0.0.1:PORT --trace FILE --requests N --speedup S [--rate R]
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


def prompt_tokens(req):
    full = min(len(req["hash_ids"]), req["input_length"] // 512)
    toks = []
    for h in req["hash_ids"][:full]:
        toks.extend((h * 7919 + i) % 150000 for i in range(512))
    # the partial tail: unique per request, never cached
    tail = req["input_length"] - len(toks)
    toks.extend(200000 + (req["timestamp"] * 31 + i) % 100000 for i in range(max(0, tail)))
    return toks


async def one(host, port, req, results, speedup):
    body = json.dumps({"model": "mock-model", "prompt": prompt_tokens(req), "max_tokens": req["output_length"],
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    t0 = time.perf_counter()
    ttft = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            results["errors"] += 1
            return
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # headers
        data = b""
        while True:  # chunked transfer encoding
            size = int((await reader.readline()).split(b";")[0] or b"0", 16)
            if size == 0:
                break
            chunk = await reader.readexactly(size)
            await reader.readexactly(2)
            if ttft is None and b"data: " in chunk:
                ttft = (time.perf_counter() - t0) * 1000 * speedup
            data += chunk
        writer.close()
        usage = None
        for line in data.split(b"\n"):
            if line.startswith(b"data: {") and b'"usage"' in line:
                usage = json.loads(line[6:])["usage"]
        if ttft is None or usage is None:
            results["errors"] += 1
            return
        results["ttft"].append(ttft)
        results["e2e"].append((time.perf_counter() - t0) * 1000 * speedup)
        full = min(len(req["hash_ids"]), req["input_length"] // 512)
        results["blocks"] += full
        results["hit_blocks"] += min(full, usage["prompt_tokens_details"]["cached_tokens"] // 512)
    except (OSError, ValueError, asyncio.IncompleteReadError):
        results["errors"] += 1


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else 0.0


async def main(a):
    host, port = a.url.split("//")[1].split(":")
    trace = load(a.trace, a.requests)
    results = {"ttft": [], "e2e": [], "blocks": 0, "hit_blocks": 0, "errors": 0}
    start = time.perf_counter()
    tasks = []
    for req in trace:
        due = req["timestamp"] / a.rate / a.speedup / 1000.0
        delay = start + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(host, int(port), req, results, a.speedup)))
    await asyncio.gather(*tasks)
    out = {"requests": len(trace), "errors": results["errors"],
           "hit_rate": round(results["hit_blocks"] / max(1, results["blocks"]), 4),
           "ttft_p50_ms": round(pct(results["ttft"], 0.5), 1), "ttft_p90_ms": round(pct(results["ttft"], 0.9), 1),
           "ttft_p99_ms": round(pct(results["ttft"], 0.99), 1), "e2e_p50_ms": round(pct(results["e2e"], 0.5), 1),
           "wall_s": round(time.perf_counter() - start, 1)}
    print(json.dumps(out))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--speedup", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=1.0)
    asyncio.run(main(ap.parse_args()))
