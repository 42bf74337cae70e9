"""Holds N concurrent SSE streams through a router and counts failures.
Usage: streams.py PORT N MAX_TOKENS  -> prints one JSON line
{"streams_requested", "completed", "stream_errors", "peak_established", "seconds"}.
A stream counts as established when its 200 status line and its first SSE
event have arrived (the worker is streaming to the client through the
router), not when its request was sent; peak_established is the most
established at once.
"""
import asyncio
import json
import sys
import time


async def one(port, body, counters, gate):
    established = False
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        counters["errors"] += 1
        return
    try:
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            counters["errors"] += 1
            return
        buf = b""
        while b"data: " not in buf:  # headers, then the first event
            chunk = await reader.read(65536)
            if not chunk:
                counters["errors"] += 1
                return
            buf += chunk
        established = True
        counters["open"] += 1
        counters["peak"] = max(counters["peak"], counters["open"])
        while b"data: [DONE]" not in buf:
            chunk = await reader.read(65536)
            if not chunk:
                counters["errors"] += 1
                return
            buf = buf[-64:] + chunk
        counters["completed"] += 1
    except Exception:
        counters["errors"] += 1
    finally:
        if established:
            counters["open"] -= 1
        writer.close()


async def main(port, n, max_tokens):
    body = json.dumps({"model": "mock-model", "prompt": "stream me", "max_tokens": max_tokens,
                       "stream": True}).encode()
    counters = {"errors": 0, "completed": 0, "open": 0, "peak": 0}
    t0 = time.time()
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one(port, body, counters, None)))
        if i % 500 == 499:
            await asyncio.sleep(0.05)  # ramp up without a SYN flood
    await asyncio.gather(*tasks)
    print(json.dumps({"streams_requested": n, "completed": counters["completed"],
                      "stream_errors": counters["errors"], "peak_established": counters["peak"],
                      "seconds": round(time.time() - t0, 2)}))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
