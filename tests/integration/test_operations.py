"""Operating kvroute: admin API and hot reload (PUT and SIGHUP), busy
thresholds with the wait queue, lost KV events and resync, failover from a
worker that hangs, metrics, and graceful shutdown. Real nats-server, mockers
and kvroute on loopback.

Run: python3 tests/integration/test_operations.py --build-dir build
"""
import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from fleet import run_unittest_main, start_fleet, wait_until  # noqa: E402

BUILD_DIR = "build"
ENTRIES = 'kvroute_indexer_entries{mode="exact"}'
PREFIX = "System: you are a careful assistant for an airline's rebooking desk. " * 30



def completion(prompt, **kw):
    body = {"model": "mock-model", "prompt": prompt, "max_tokens": 2}
    body.update(kw)
    return body


def open_stream(port, body):
    """Starts a streaming request on a raw socket and returns it once the first token arrived."""
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body)
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n{data}".encode())
    got = b""
    while b"data:" not in got:
        chunk = s.recv(4096)
        if not chunk:
            raise RuntimeError(f"stream closed early: {got!r}")
        got += chunk
    return s, got


class OpsFleet(unittest.TestCase):
    router_args = ()
    mocker_args = ()
    speedup = 20.0
    config_text = "scheduler:\n  gamma: 0.1\n"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvroute-ops-")
        cls.config_path = os.path.join(cls.tmp.name, "kvroute.yaml")
        with open(cls.config_path, "w") as f:
            f.write(cls.config_text)
        cls.fleet = start_fleet(BUILD_DIR, cls.tmp.name, speedup=cls.speedup, mocker_args=cls.mocker_args,
                                router_args=("--config", cls.config_path, *cls.router_args))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()
        if os.environ.get("KVROUTE_KEEP_LOGS"):
            print("logs kept in", cls.tmp.name)
        else:
            cls.tmp.cleanup()

    def holder_of(self, prefix):
        r = self.fleet.post("/v1/completions", completion(prefix))
        self.assertEqual(r.status, 200, r.body)
        self.assertTrue(wait_until(lambda: self.explain(prefix + " probe")["workers"][0] is not None and
                                   max(w["overlap_blocks"] for w in self.explain(prefix + " probe")["workers"]) > 0, 5))
        return int(r.header("x-kvroute-worker"))

    def explain(self, prompt):
        r = self.fleet.admin("POST", "/admin/route/explain", json.dumps(completion(prompt)))
        self.assertEqual(r.status, 200, r.body)
        return r.json()

    def gamma(self):
        text = self.fleet.admin("GET", "/admin/config").body.decode()
        return float(re.search(r"\n  gamma: ([0-9.e-]+)", text).group(1))


class AdminAndReloadTest(OpsFleet):
    speedup = 1.0  # slow decode: streams stay in flight

    def test_admin_refuses_missing_or_wrong_token(self):
        f = self.fleet
        self.assertEqual(f.admin("GET", "/admin/config", token=None).status, 401)
        self.assertEqual(f.admin("GET", "/admin/config", token="wrong").status, 401)
        r = f.admin("PUT", "/admin/config", "scheduler:\n  gamma: 5\n", token="wrong")
        self.assertEqual(r.status, 401)
        self.assertEqual(r.json()["error"]["type"], "authentication_error")
        self.assertEqual(self.gamma(), 0.1)
        # The admin API is not served on the data-plane port.
        self.assertEqual(f.get("/admin/config").status, 404)

    def test_weight_change_by_put_and_sighup_changes_routing(self):
        f = self.fleet
        prefix = PREFIX + uuid.uuid4().hex
        holder = self.holder_of(prefix)
        # Two long streams keep the holder busy (2 of 256 request slots).
        streams = [open_stream(f.router_port, completion(prefix + f" stream {i}", max_tokens=2000, stream=True))[0]
                   for i in range(2)]
        try:
            # Explain runs the routing code path without sending anything, so
            # caches stay as they are between the steps below.
            self.assertEqual(self.explain(prefix + " next")["chosen"], holder)
            # A large slot weight makes the busy holder the dearest worker.
            r = f.admin("PUT", "/admin/config", "scheduler:\n  gamma: 100\n")
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(self.gamma(), 100)
            self.assertNotEqual(self.explain(prefix + " next")["chosen"], holder)

            # An invalid update is refused with the key and changes nothing.
            r = f.admin("PUT", "/admin/config", "scheduler:\n  gamma: -1\n  delta: 0.5\n")
            self.assertEqual(r.status, 400)
            self.assertIn("scheduler.gamma", r.json()["error"]["message"])
            r = f.admin("PUT", "/admin/config", "router:\n  threads: 7\n")
            self.assertEqual(r.status, 400)
            self.assertIn("cannot change at runtime", r.json()["error"]["message"])
            self.assertEqual(self.gamma(), 100)

            # SIGHUP re-reads the file (gamma 0.1): the holder wins again.
            f.procs["kvroute"].send_signal(signal.SIGHUP)
            self.assertTrue(wait_until(lambda: self.gamma() == 0.1, 5))
            self.assertEqual(self.explain(prefix + " next")["chosen"], holder)
            # And SIGHUP with gamma 100 in the file moves it away.
            with open(self.config_path, "w") as fh:
                fh.write("scheduler:\n  gamma: 100\n")
            f.procs["kvroute"].send_signal(signal.SIGHUP)
            self.assertTrue(wait_until(lambda: self.gamma() == 100, 5))
            self.assertNotEqual(self.explain(prefix + " next")["chosen"], holder)

            # A broken file on SIGHUP is rejected; the old config keeps serving.
            with open(self.config_path, "w") as fh:
                fh.write("scheduler:\n  gamma: lots\n")
            rejected = f.metric('kvroute_config_reloads_total{result="rejected"}')
            f.procs["kvroute"].send_signal(signal.SIGHUP)
            self.assertTrue(wait_until(
                lambda: f.metric('kvroute_config_reloads_total{result="rejected"}') > rejected, 5))
            self.assertEqual(self.gamma(), 100)
            # The real request follows the same decision.
            r = f.post("/v1/completions", completion(prefix + " next"))
            self.assertEqual(r.status, 200)
            self.assertNotEqual(int(r.header("x-kvroute-worker")), holder)
            with open(self.config_path, "w") as fh:
                fh.write("scheduler:\n  gamma: 0.1\n")
        finally:
            cancels = f.mocker(holder, "GET", "/mocker/stats").json()["cancels_total"]
            for s in streams:
                s.close()
        # The worker sees the aborted streams and frees their slots.
        self.assertTrue(wait_until(
            lambda: f.mocker(holder, "GET", "/mocker/stats").json()["cancels_total"] >= cancels + 2, 5))
        self.assertTrue(wait_until(lambda: f.metric("kvroute_router_inflight_requests") == 0, 5))


class BusyQueueTest(OpsFleet):
    def test_every_worker_busy_still_served_unless_rejecting(self):
        f = self.fleet
        workers = [int(w["worker_id"]) for w in f.admin("GET", "/admin/workers").json()]
        busy = workers[0]
        for w in workers[1:]:
            self.assertEqual(f.admin("POST", f"/admin/workers/{w}/drain").status, 200)
        # Three long streams on the one worker left: 3 of 256 slots, over a 1 % busy threshold.
        streams = [open_stream(f.router_port, completion(f"busy stream {i} " + uuid.uuid4().hex + PREFIX,
                                                         max_tokens=2000, stream=True))[0] for i in range(3)]
        try:
            self.assertEqual(f.admin("PUT", "/admin/config", "scheduler:\n  busy_slot_usage: 0.01\n").status, 200)
            placed = f.metric("kvroute_scheduler_all_busy_total")
            # Default: the busy worker still takes the request (its engine queues it).
            r = f.post("/v1/completions", completion("served anyway " + uuid.uuid4().hex))
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(int(r.header("x-kvroute-worker")), busy)
            self.assertEqual(f.metric("kvroute_scheduler_all_busy_total"), placed + 1)
            # Opt-in shedding: 503 at once.
            self.assertEqual(f.admin("PUT", "/admin/config",
                                     "scheduler:\n  busy_slot_usage: 0.01\n  reject_when_busy: true\n").status, 200)
            r = f.post("/v1/completions", completion("shed " + uuid.uuid4().hex))
            self.assertEqual(r.status, 503)
            self.assertEqual(r.json()["error"]["code"], "workers_busy")
        finally:
            for s in streams:
                s.close()
            f.admin("PUT", "/admin/config", "scheduler:\n  busy_slot_usage: 1\n  reject_when_busy: false\n")
            for w in workers[1:]:
                f.admin("POST", f"/admin/workers/{w}/undrain")
        self.assertTrue(wait_until(lambda: f.metric("kvroute_router_inflight_requests") == 0, 10))

    def test_thresholds_queue_then_503(self):
        f = self.fleet
        # No worker is eligible (every one drained): no queue -> 503 at once.
        workers = [int(w["worker_id"]) for w in f.admin("GET", "/admin/workers").json()]
        for w in workers:
            self.assertEqual(f.admin("POST", f"/admin/workers/{w}/drain").status, 200)
        r = f.post("/v1/completions", completion("anything"))
        self.assertEqual(r.status, 503)
        self.assertEqual(r.header("retry-after"), "1")
        self.assertEqual(r.json()["error"]["code"], "workers_busy")
        # With a queue: wait up to the timeout, then 503.
        f.admin("PUT", "/admin/config", "scheduler:\n  queue_size: 4\n  queue_timeout_ms: 400\n")
        t0 = time.time()
        r = f.post("/v1/completions", completion("anything"))
        waited = time.time() - t0
        self.assertEqual(r.status, 503)
        self.assertGreaterEqual(waited, 0.39)
        self.assertIn("within 400 ms", r.json()["error"]["message"])
        # A queued request proceeds as soon as a worker is eligible again.
        f.admin("PUT", "/admin/config", "scheduler:\n  queue_timeout_ms: 10000\n")
        result = {}
        th = threading.Thread(target=lambda: result.update(r=f.post("/v1/completions", completion("queued"))))
        t0 = time.time()
        th.start()
        self.assertTrue(wait_until(lambda: f.metric("kvroute_router_queued_requests") == 1, 5))
        for w in workers:
            f.admin("POST", f"/admin/workers/{w}/undrain")
        th.join(10)
        self.assertEqual(result["r"].status, 200)
        self.assertLess(time.time() - t0, 5)
        self.assertGreaterEqual(f.metric('kvroute_router_rejected_total{reason="queue_timeout"}'), 1)


class NearlyFullFleetQueueTest(OpsFleet):
    """A router queue with the fleet's slots nearly all taken: the slot test is
    lifted (a full worker holding the prompt still takes it, its engine queues
    it), and the request waits in the router's queue only once every slot is
    taken."""
    speedup = 1.0  # slow decode: streams stay in flight
    mocker_args = ("--max-seqs", "2")  # 3 workers x 2 request slots
    config_text = ("scheduler:\n  gamma: 0.1\n  queue_size: 4\n  queue_timeout_ms: 60000\n"
                   "  busy_slot_fleet_usage: 0.8\n")

    def test_full_holder_keeps_its_prompt_and_a_full_fleet_queues(self):
        f = self.fleet
        prefix = PREFIX + uuid.uuid4().hex
        holder = self.holder_of(prefix)
        streams = []
        try:
            # Two streams over the prompt fill the holder's slots; three others
            # take 3 of the other workers' 4 slots (the holder, full, is
            # skipped while the fleet's share is under 0.8): 5 of 6 taken.
            for i in range(2):
                s, _ = open_stream(f.router_port, completion(prefix + f" stream {i}", max_tokens=4000, stream=True))
                streams.append(s)
            for i in range(3):
                s, _ = open_stream(f.router_port, completion(f"other {i} " + uuid.uuid4().hex, max_tokens=4000,
                                                             stream=True))
                streams.append(s)
            self.assertTrue(wait_until(lambda: f.metric("kvroute_router_inflight_requests") == 5, 5))
            # 5 of 6 is over 0.8: lifted, the full holder takes the prompt's next request.
            e = self.explain(prefix + " next")
            self.assertTrue(e["slots_full"], e)
            self.assertEqual(e["chosen"], holder, e)
            # The last slot taken: the fleet is busy as a whole, nobody is chosen.
            s, _ = open_stream(f.router_port, completion("last " + uuid.uuid4().hex, max_tokens=4000, stream=True))
            streams.append(s)
            self.assertTrue(wait_until(lambda: f.metric("kvroute_router_inflight_requests") == 6, 5))
            e = self.explain(prefix + " next")
            self.assertIsNone(e["chosen"], e)
            self.assertEqual(e["error"]["error"]["code"], "workers_busy", e)
            self.assertIn("request slots taken as a whole", e["reason"])
            # A request now waits in the router's queue until a slot frees. Once
            # one does (5 of 6 again, lifted), the full holder takes it: its
            # engine queues it until one of the holder's own streams ends.
            result = {}
            th = threading.Thread(target=lambda: result.update(r=f.post("/v1/completions", completion(prefix + " q"))))
            th.start()
            self.assertTrue(wait_until(lambda: f.metric("kvroute_router_queued_requests") == 1, 5))
            streams.pop().close()
            self.assertTrue(wait_until(lambda: f.metric("kvroute_router_queued_requests") == 0, 5))
            for s in streams:
                s.close()
            th.join(30)
            self.assertEqual(result["r"].status, 200, result["r"].body)
            self.assertEqual(int(result["r"].header("x-kvroute-worker")), holder)
            self.assertGreater(int(result["r"].header("x-kvroute-cached-tokens")), 0)
            self.assertEqual(f.metric("kvroute_router_retries_total"), 0)
        finally:
            for s in streams:
                s.close()
        self.assertTrue(wait_until(lambda: f.metric("kvroute_router_inflight_requests") == 0, 20))


class ResyncTest(OpsFleet):
    def test_lost_events_are_detected_and_resynced(self):
        f = self.fleet
        # Only worker 2 takes traffic.
        for w in (1, 3):
            self.assertEqual(f.admin("POST", f"/admin/workers/{w}/drain").status, 200)
        # Its next KV event is lost on the way.
        self.assertEqual(f.mocker(2, "POST", "/mocker/drop_events", {"count": 1}).status, 200)
        lost = "lost " + uuid.uuid4().hex + PREFIX  # unique from the first block on
        self.assertEqual(f.post("/v1/completions", completion(lost)).status, 200)
        time.sleep(0.2)
        self.assertEqual(self.explain(lost + " probe")["workers"][1]["overlap_blocks"], 0)  # index never heard
        gaps = f.metric("kvroute_indexer_event_gaps_total")
        # (Dumps were already applied when the workers were first seen: count from here.)
        applied = f.metric('kvroute_indexer_resyncs_total{result="applied"}')
        # The next event shows the gap: the router asks worker 2 for a dump.
        self.assertEqual(f.post("/v1/completions", completion("next " + uuid.uuid4().hex + PREFIX)).status, 200)
        self.assertTrue(wait_until(lambda: f.metric('kvroute_indexer_resyncs_total{result="applied"}') > applied and
                                   f.metric("kvroute_indexer_stale_owners") == 0, 5),
                        {k: v for k, v in f.metrics().items() if "resync" in k or "gap" in k or "events" in k})
        self.assertGreater(f.metric("kvroute_indexer_event_gaps_total"), gaps)
        self.assertEqual(f.metric("kvroute_indexer_stale_owners"), 0)
        # After the resync the index knows the prefix whose event was lost.
        ex = self.explain(lost + " probe")
        w2 = [w for w in ex["workers"] if w["worker_id"] == 2][0]
        self.assertGreater(w2["overlap_blocks"], 0)
        r = f.post("/v1/completions", completion(lost + " again"))
        self.assertGreater(int(r.header("x-kvroute-cached-tokens")), 0)
        # And it holds exactly what the workers hold.
        total = sum(f.mocker(w, "GET", "/mocker/stats").json()["kv_cached_blocks"] for w in (1, 2, 3))
        self.assertTrue(wait_until(lambda: f.metric(ENTRIES) == total, 3),
                        f"index {f.metric(ENTRIES)} vs workers {total}")
        for w in (1, 3):
            f.admin("POST", f"/admin/workers/{w}/undrain")


class FailoverAndMetricsTest(OpsFleet):
    router_args = ("--router.first_byte_timeout_ms", "500")

    def test_hanging_worker_fails_over(self):
        f = self.fleet
        prefix = PREFIX + uuid.uuid4().hex
        holder = self.holder_of(prefix)
        self.assertEqual(f.mocker(holder, "POST", "/mocker/hang", {"enabled": True}).status, 200)
        try:
            errors = f.metric('kvroute_router_upstream_errors_total{reason="first_byte"}')
            t0 = time.time()
            r = f.post("/v1/completions", completion(prefix + " failover"))
            self.assertEqual(r.status, 200)
            self.assertNotEqual(int(r.header("x-kvroute-worker")), holder)
            self.assertGreaterEqual(time.time() - t0, 0.45)
            self.assertEqual(f.metric('kvroute_router_upstream_errors_total{reason="first_byte"}'), errors + 1)
            self.assertGreaterEqual(f.metric("kvroute_router_retries_total"), 1)
        finally:
            f.mocker(holder, "POST", "/mocker/hang", {"enabled": False})
        self.assertTrue(wait_until(lambda: f.metric("kvroute_router_inflight_requests") == 0, 5))

    def test_metrics_exposition_and_hit_rate(self):
        f = self.fleet
        text = f.get("/metrics").body.decode()
        sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
                            r'(-?[0-9.e+-]+|\+Inf|-Inf|NaN)$')
        types = {}
        for line in text.splitlines():
            if line.startswith("# TYPE"):
                _, _, name, kind = line.split(" ")
                self.assertNotIn(name, types, f"duplicate TYPE for {name}")
                types[name] = kind
            elif line and not line.startswith("#"):
                self.assertRegex(line, sample)
                name = re.match(r"[a-zA-Z0-9_:]+", line).group(0)
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                self.assertTrue(name in types or base in types, f"sample without TYPE: {line}")
        for n in types:
            self.assertTrue(n.startswith("kvroute_"), n)

        def hit_rate():
            m = f.metrics()
            return m["kvroute_router_cached_tokens_total"] / max(1, m["kvroute_router_prompt_tokens_total"])
        before = hit_rate()
        prefix = PREFIX + uuid.uuid4().hex
        f.post("/v1/completions", completion(prefix + " 0"))
        wait_until(lambda: f.metric(ENTRIES) > 0, 3)
        time.sleep(0.2)
        for i in range(1, 8):
            f.post("/v1/completions", completion(prefix + f" {i}"))
        self.assertGreater(hit_rate(), before)
        m = f.metrics()
        self.assertGreater(m['kvroute_scheduler_decisions_total{outcome="best_overlap"}'], 0)
        self.assertGreater(m['kvroute_router_decision_seconds_count{stage="find_matches"}'], 0)
        self.assertGreater(m['kvroute_router_requests_total{route="completions",status="200",model="mock-model"}'], 0)
        self.assertEqual(m["kvroute_events_nats_connected"], 1)


class GracefulShutdownTest(OpsFleet):
    speedup = 1.0
    router_args = ("--router.shutdown_grace_ms", "20000")

    def test_sigterm_drains_streams_and_stops_accepting(self):
        f = self.fleet
        # ~60 tokens at ~8-20 ms each: the stream outlives the SIGTERM by a second or so.
        s, got = open_stream(f.router_port, completion(PREFIX + uuid.uuid4().hex, max_tokens=60, stream=True))
        f.procs["kvroute"].send_signal(signal.SIGTERM)

        def refused():  # draining: the listener is closed at once (router/README.md)
            try:
                socket.create_connection(("127.0.0.1", f.router_port), timeout=1).close()
                return False
            except (ConnectionRefusedError, ConnectionResetError):
                # Reset: the connect met the listener as it closed (its
                # handshake never completed, so nothing accepted it).
                return True
        self.assertTrue(wait_until(refused, 2, step=0.01), "the listener still accepts while draining")
        s.settimeout(20)
        while b"[DONE]" not in got:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        s.close()
        self.assertIn(b"[DONE]", got, "the stream was cut by the shutdown")
        self.assertEqual(got.count(b'"finish_reason":"length"'), 1)
        f.procs["kvroute"].wait(timeout=20)
        self.assertEqual(f.procs["kvroute"].returncode, 0)


if __name__ == "__main__":
    run_unittest_main(globals())
