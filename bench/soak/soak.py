"""Soak run of kvroute (see bench/soak.sh). Uses tests/integration/fleet.py
for the processes. Errors are counted by kind; a stream cut because its
worker was killed after the first byte ends with an OpenAI error event
(documented: router/README.md) and is counted in errors_documented, every
other failure in errors. --hostile adds one hostile event publisher on the
bus: a heartbeating fake worker (declared capacity 5,000 blocks, its URL a
real mocker's) that publishes, all run long, stored chains of ids crafted to
collide under an unkeyed hash, more blocks than it declared, removals of
blocks it never stored, absurd event ids and garbage."""
import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "faults"))
from busfleet import Fleet, NatsRaw, restart_nats_plain, wait_until  # noqa: E402
from test_bus_index_flood import crafted_ids, stored_msg  # noqa: E402

PREFIXES = [f"Tenant {k}: you are a meticulous assistant for invoices and refunds. " * 25 for k in range(8)]


def proc_stats(pid):
    with open(f"/proc/{pid}/status") as fh:
        rss_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    return rss_kb / 1024.0, len(os.listdir(f"/proc/{pid}/fd"))


class Client(threading.Thread):
    def __init__(self, fleet, stop, counts, lock):
        super().__init__(daemon=True)
        self.f, self.stop, self.counts, self.lock = fleet, stop, counts, lock

    def one(self):
        stream = random.random() < 0.5
        body = {"model": "mock-model", "prompt": random.choice(PREFIXES) + uuid.uuid4().hex,
                "max_tokens": random.randint(4, 32), "stream": stream}
        try:
            r = self.f.post("/v1/completions", body, timeout=30)
        except OSError as e:
            return "connection"
        if r.status != 200:
            return f"http_{r.status}"
        if stream:
            if not r.chunks or r.chunks[-1] != "[DONE]":
                return "stream_unterminated"
            if any('"error"' in c for c in r.chunks[:-1]):
                return "stream_cut"  # documented: worker died after the first byte
        return "ok"

    def run(self):
        while not self.stop.is_set():
            kind = self.one()
            with self.lock:
                self.counts[kind] = self.counts.get(kind, 0) + 1


class HostilePublisher(threading.Thread):
    """One hostile worker on the bus (reconnects after NATS restarts); counts messages sent."""

    def __init__(self, fleet, stop, worker=99):
        super().__init__(daemon=True)
        self.f, self.stop, self.worker, self.sent = fleet, stop, worker, 0
        self.ids = crafted_ids(1 << 20)
        self.hb = json.dumps({"worker_id": worker, "url": fleet.mocker_urls[4], "model": "mock-model", "dp_size": 1,
                              "kv_events": True, "block_size": 16,
                              "load": {"request_active_slots": 0, "request_total_slots": 64,
                                       "num_requests_waiting": 0, "kv_active_blocks": 0, "kv_total_blocks": 5000}})

    def messages(self, k):
        i = (k * 256) % len(self.ids)
        kind = k % 5
        if kind in (0, 1):  # crafted ids, more than declared
            return stored_msg(self.worker, self.ids[i:i + 256], 10 ** 12 + i)
        if kind == 2:  # removals of blocks never stored
            return json.dumps({"worker_id": self.worker, "event": {"data": {"removed": {
                "block_hashes": [random.getrandbits(63) for _ in range(64)]}}}})
        if kind == 3:  # an absurd event id
            return json.dumps({"worker_id": self.worker, "event": {"event_id": 2 ** 64 - 1 - k, "data": {
                "stored": {"parent_hash": None, "blocks": [{"block_hash": 7, "tokens_hash": 9}]}}}})
        return "{\"worker_id\": " + str(self.worker) + ", \"event\": garbage"

    def run(self):
        k = 0
        while not self.stop.is_set():
            try:
                nats = NatsRaw(self.f.nats_port)
                while not self.stop.is_set():
                    nats.pub("kvroute.workers", self.hb)
                    for _ in range(10):  # ~100 messages/s, ~70% of them 256-block chains
                        nats.pub("kvroute.kv_events", self.messages(k))
                        k += 1
                        self.sent += 1
                    nats.flush()
                    self.stop.wait(0.1)
                nats.close()
            except OSError:
                self.stop.wait(0.5)  # NATS restarting


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--hostile", action="store_true", help="one hostile event publisher beside the fleet")
    a = ap.parse_args()
    build = os.path.abspath(a.build_dir)
    with tempfile.TemporaryDirectory() as d, Fleet(build, d, ttl_ms=2500, speedup=50.0,
                                                 router_args=["--log.access_log", "false"]) as f:
        f.start_nats()
        for w in (1, 2, 3, 4):
            f.start_mocker(w)
        f.start_router()
        f.wait_ready(4)
        pid = f.procs["kvroute"].pid
        stop, lock, counts = threading.Event(), threading.Lock(), {}
        clients = [Client(f, stop, counts, lock) for _ in range(a.concurrency)]
        for c in clients:
            c.start()
        hostile = HostilePublisher(f, stop) if a.hostile else None
        if hostile:
            hostile.start()
        t0 = time.time()
        warm = min(30.0, a.duration * 0.1)
        time.sleep(warm)
        rss0, fds0 = proc_stats(pid)
        events = [(0.4, "kill worker 2"), (0.5, "restart NATS"), (0.7, "kill worker 3")]
        for frac, what in events:
            time.sleep(max(0.0, t0 + a.duration * frac - time.time()))
            w = 2 if "2" in what else 3
            if what.startswith("kill"):
                f.kill(f"mocker-{w}")
                time.sleep(1.0)
                f.start_mocker(w)
            else:
                f.kill("nats")
                time.sleep(1.0)
                restart_nats_plain(f)
            with lock:
                done = sum(counts.values())
            print(f"[{time.time() - t0:6.1f}s] {what}; {done} requests so far", flush=True)
        time.sleep(max(0.0, t0 + a.duration - time.time()))
        rss_loaded, fds_loaded = proc_stats(pid)  # under the same load as the start figures
        stop.set()
        for c in clients:
            c.join(timeout=60)
        if hostile:
            hostile.join(timeout=30)
            m = f.metrics()
            refused = m.get('kvroute_indexer_blocks_refused_total{reason="worker_limit"}', 0)
            rejected = sum(v for k, v in m.items() if k.startswith("kvroute_events_rejected_total"))
            share_drops = m.get("kvroute_events_queue_worker_dropped_total", 0)
            print(f"hostile publisher: {hostile.sent} messages; index refused {refused:.0f} blocks, "
                  f"events rejected {rejected:.0f}, queue drops for its share {share_drops:.0f}")
        elapsed = time.time() - t0
        time.sleep(2.0)  # idle: let connections settle
        rss1, fds1 = proc_stats(pid)
        total = sum(counts.values())
        documented = counts.get("stream_cut", 0)
        errors = total - counts.get("ok", 0) - documented
        print(f"{total} requests in {elapsed:.0f} s ({total / elapsed:.0f}/s), by outcome {counts}")
        print(f"router RSS {rss0:.1f} -> {rss_loaded:.1f} MB under load ({rss1:.1f} idle), "
              f"fds {fds0} -> {fds_loaded} under load ({fds1} idle, clients gone)")
        print(json.dumps({"requests": total, "errors": errors, "errors_documented": documented,
                          "rss_mb_start": round(rss0, 1), "rss_mb_end": round(rss_loaded, 1), "fds_start": fds0,
                          "fds_end": fds_loaded, "rss_mb_idle": round(rss1, 1), "fds_idle": fds1, "duration_s": round(elapsed, 1), "rate_per_s": round(total / elapsed, 1),
                          "concurrency": a.concurrency, "hostile": bool(a.hostile),
                          "hostile_messages": hostile.sent if hostile else 0}))


if __name__ == "__main__":
    main()
