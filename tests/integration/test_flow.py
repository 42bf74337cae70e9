"""Flow control on the OpenAI listener: API keys (401 in OpenAI's shape,
Authorization: Bearer and x-api-key, SIGHUP reload), priority bands and
429 + Retry-After for a full band and a shed request, the TTFT deadline's
early 429, a tenant's request rate, a tenant's pinned cache_salt, one freed
slot admitting one waiter (the slot claimed by the trial that admits it).
Real nats-server, one kvroute-mocker with one request slot (--max-seqs 1: one
stream makes the fleet busy) and kvroute on loopback.

Run: python3 tests/integration/test_flow.py --build-dir build
"""
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from fleet import FleetTestCase, run_unittest_main, wait_until  # noqa: E402

BUILD_DIR = "build"
KEY_ACME = "sk-acme-" + uuid.uuid4().hex
KEY_BETA = "sk-beta-" + uuid.uuid4().hex
PREFIX = "System: you are a careful assistant for an airline's rebooking desk. " * 20


def sha(key):
    return hashlib.sha256(key.encode()).hexdigest()


def completion(prompt, **kw):
    body = {"model": "mock-model", "prompt": prompt, "max_tokens": 2}
    body.update(kw)
    return body


def open_stream(port, body, key):
    """A streaming request on a raw socket, returned once its first token arrived."""
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body)
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Authorization: Bearer {key}\r\nContent-Length: {len(data)}\r\n\r\n{data}".encode())
    got = b""
    while b"data:" not in got:
        chunk = s.recv(4096)
        if not chunk:
            raise RuntimeError(f"stream closed early: {got!r}")
        got += chunk
    return s


class FlowTest(FleetTestCase):
    tmp_prefix = "kvroute-flow-"
    fleet_options = {"speedup": 20.0}

    @classmethod
    def start(cls, f):
        cls.fleet = f
        cls.keys = os.path.join(f.workdir, "keys.txt")
        with open(cls.keys, "w") as out:
            out.write(f"# acme and beta\n{sha(KEY_ACME)} acme\n{sha(KEY_BETA)} beta\n")
        cls.config = os.path.join(f.workdir, "kvroute.yaml")
        with open(cls.config, "w") as out:
            out.write("scheduler:\n  queue_size: 2\n  queue_timeout_ms: 20000\n  reject_when_busy: true\n"
                      "flow:\n  keys_file: " + cls.keys + "\n  retry_after_s: 2\n  forward_priority: true\n"
                      "  tenants:\n    - {name: acme, weight: 2, cache_salt: acme-salt}\n"
                      "    - {name: beta, rps: 1, burst: 1}\n    - {name: gamma}\n")
        f.router_args = ["--config", cls.config]
        f.start_nats()
        # vLLM's priority policy: a request's `priority` orders its waiting
        # queue (with fcfs, vLLM and the mocker refuse a priority other than 0).
        f.start_mocker(1, extra=["--max-seqs", "1", "--scheduling-policy", "priority"])
        f.start_router()
        f.wait_ready(1)

    def post(self, body, key=KEY_ACME, header="authorization", extra=None):
        headers = {}
        if key is not None:
            headers = {"authorization": f"Bearer {key}"} if header == "authorization" else {"x-api-key": key}
        headers.update(extra or {})
        return self.fleet.post("/v1/completions", body, headers=headers)

    def queue_up(self, names, send, threads):
        """send(name) for each name on a thread of its own (appended to
        `threads`), each once the one before it is waiting in the queue."""
        for name in names:
            threads.append(threading.Thread(target=send, args=(name,)))
            threads[-1].start()
            n = len(threads)
            self.assertTrue(wait_until(lambda: self.fleet.metric("kvroute_router_queued_requests") == n, 10))

    def idle(self):
        self.assertTrue(wait_until(lambda: self.fleet.metric("kvroute_router_inflight_requests") == 0, 20))

    def test_keys_both_headers_401_and_reload(self):
        r = self.post(completion("no key"), key=None)
        self.assertEqual(r.status, 401)
        err = r.json()["error"]
        self.assertEqual((err["type"], err["code"]), ("invalid_request_error", "invalid_api_key"))
        r = self.post(completion("bad key"), key="sk-nope")
        self.assertEqual(r.status, 401)
        self.assertEqual(r.json()["error"]["code"], "invalid_api_key")
        self.assertEqual(self.post(completion("bearer"), key=KEY_ACME).status, 200)
        self.assertEqual(self.post(completion("x-api-key"), key=KEY_ACME, header="x-api-key").status, 200)
        self.assertGreaterEqual(self.fleet.metric('kvroute_router_auth_failures_total{reason="invalid"}'), 1)
        # Rotate: a new key for gamma; SIGHUP re-reads the file.
        new_key = "sk-gamma-" + uuid.uuid4().hex
        with open(self.keys, "w") as f:
            f.write(f"{sha(KEY_ACME)} acme\n{sha(KEY_BETA)} beta\n{sha(new_key)} gamma\n")
        self.assertEqual(self.post(completion("before"), key=new_key).status, 401)
        self.fleet.procs["kvroute"].send_signal(signal.SIGHUP)
        self.assertTrue(wait_until(lambda: self.post(completion("after"), key=new_key).status == 200, 10))

    def test_bands_full_queue_shed_and_order(self):
        self.idle()
        hold = open_stream(self.fleet.router_port, completion("hold " + uuid.uuid4().hex, max_tokens=5000,
                                                              stream=True), KEY_ACME)
        results = {}

        def send(name):
            results[name] = self.post(completion(name + " " + uuid.uuid4().hex))

        threads = []
        try:
            # Two normal-band requests fill the queue (queue_size 2).
            self.queue_up(("normal-a", "normal-b"), send, threads)
            # Explain shows where a request would stand: its band, how many of
            # its model wait ahead of it (a higher band jumps the normal ones).
            q = self.fleet.admin("POST", "/admin/route/explain", json.dumps(completion("where"))).json()["queue"]
            self.assertEqual((q["band"], q["ahead"], q["queued"]), ("normal", 2, 2))
            # ... and how long the oldest of them has waited (it entered
            # before normal-b, whose entry the wait above saw).
            time.sleep(0.05)
            oldest = q["oldest_wait_ms"]
            self.assertGreater(oldest, 0)
            q2 = self.fleet.admin("POST", "/admin/route/explain", json.dumps(completion("where"))).json()["queue"]
            self.assertGreater(q2["oldest_wait_ms"], oldest)  # the same request, waiting longer
            q = self.fleet.admin("POST", "/admin/route/explain",
                                 json.dumps(completion("where", priority=-1))).json()["queue"]
            self.assertEqual((q["band"], q["ahead"], q["queued"]), ("high", 0, 2))
            self.assertIsNone(q["oldest_wait_ms"])  # nobody of its band or above waits
            # A third normal one: its band is full, nobody below it: 429 with Retry-After.
            r = self.post(completion("normal-c"))
            self.assertEqual(r.status, 429, r.body)
            self.assertEqual(r.header("retry-after"), "2")
            self.assertEqual(r.json()["error"]["code"], "queue_full")
            # A high-band request (vLLM priority -1) sheds the newest normal one.
            high_body = completion("high " + uuid.uuid4().hex, priority=-1)
            threads.append(threading.Thread(target=lambda: results.__setitem__("high", self.post(high_body))))
            threads[-1].start()
            self.assertTrue(wait_until(lambda: "normal-b" in results, 10))
            self.assertEqual(results["normal-b"].status, 429)
            self.assertEqual(results["normal-b"].json()["error"]["code"], "queue_shed")
            self.assertEqual(results["normal-b"].header("retry-after"), "2")
            # The header names a band too; an unknown one is a 400.
            self.assertEqual(self.post(completion("bad band"), extra={"x-kvroute-priority": "urgent"}).status, 400)
        finally:
            hold.close()
        for t in threads:
            t.join(20)
        # The freed slot went to the high band first.
        self.assertEqual(results["high"].status, 200)
        self.assertEqual(results["normal-a"].status, 200)
        self.assertGreaterEqual(self.fleet.metric('kvroute_router_queue_rejected_total{band="normal",reason="shed"}'), 1)
        self.assertGreaterEqual(
            self.fleet.metric('kvroute_router_queue_wait_seconds_count{band="high",outcome="admitted"}'), 1)

    def test_one_freed_slot_admits_one_waiter(self):
        # Two requests wait for the worker's one slot; the stream holding it
        # ends. The first waiter is admitted: its trial routes it and claims
        # the slot at once, possibly on the io thread that freed the slot
        # (the handover), before its own thread sends it. The second's trial
        # follows at once (an admission chains to the next head) and must
        # find the slot taken: if it were sent too, the engine would hold it
        # in its waiting queue until the first ends (x-mocker-queued-ms, in
        # the engine's own time: not slowed by a loaded machine). Two rounds
        # of three connections: the router hands connections to its two io
        # threads in turn, so in one of them the first waiter sits on the
        # other thread than the stream that frees the slot.
        for round_ in range(2):
            self.idle()
            hold = open_stream(self.fleet.router_port, completion("hold " + uuid.uuid4().hex, max_tokens=5000,
                                                                  stream=True), KEY_ACME)
            results = {}

            def send(name):
                results[name] = self.post(completion(f"{name} {uuid.uuid4().hex}", max_tokens=1000, stream=True))

            threads = []
            try:
                self.queue_up(("first", "second"), send, threads)
            finally:
                hold.close()
            for t in threads:
                t.join(30)
            for name in ("first", "second"):
                r = results[name]
                self.assertEqual(r.status, 200, r.body)
                # ~1,000 decode steps if it had been sent while the other ran; at most a step or two if not
                # (streams: the mocker sends the header with their head).
                self.assertLess(float(r.header("x-mocker-queued-ms")), 50, f"round {round_}: {name}")

    def test_band_forwarded_as_engine_priority(self):
        # flow.forward_priority: a request the header puts in the high band
        # reaches the engine with the band's priority (-1), which an engine
        # run with vLLM's priority policy serves first; one whose body
        # already says so, or a normal one, is forwarded as it came.
        self.idle()
        stats = lambda: self.fleet.mocker(1, "GET", "/mocker/stats").json()  # noqa: E731
        self.assertEqual(stats()["scheduling_policy"], "priority")
        r = self.post(completion("header high " + uuid.uuid4().hex), extra={"x-kvroute-priority": "high"})
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(stats()["last_priority"], -1)
        self.assertEqual(self.post(completion("normal " + uuid.uuid4().hex)).status, 200)
        self.assertEqual(stats()["last_priority"], 0)
        self.assertEqual(self.post(completion("body high " + uuid.uuid4().hex, priority=-5)).status, 200)
        self.assertEqual(stats()["last_priority"], -5)
        # The header moves a body's -1 down to the normal band: the engine sees 0.
        r = self.post(completion("demoted " + uuid.uuid4().hex, priority=-1), extra={"x-kvroute-priority": "normal"})
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(stats()["last_priority"], 0)

    def test_ttft_deadline_answered_early(self):
        self.idle()
        hold = open_stream(self.fleet.router_port, completion("hold " + uuid.uuid4().hex, max_tokens=5000,
                                                              stream=True), KEY_ACME)
        try:
            t0 = time.time()
            r = self.post(completion("deadline " + uuid.uuid4().hex), extra={"x-kvroute-ttft-deadline-ms": "1"})
            self.assertEqual(r.status, 429, r.body)
            self.assertEqual(r.json()["error"]["code"], "ttft_deadline")
            self.assertIsNotNone(r.header("retry-after"))
            self.assertLess(time.time() - t0, 5)  # not the 20 s queue timeout
            self.assertEqual(self.post(completion("bad"), extra={"x-kvroute-ttft-deadline-ms": "soon"}).status, 400)
        finally:
            hold.close()

    def test_tenant_request_rate(self):
        self.idle()
        codes = [self.post(completion(f"rate {i}"), key=KEY_BETA) for i in range(3)]
        limited = [r for r in codes if r.status == 429]
        self.assertTrue(limited, [r.status for r in codes])
        self.assertEqual(limited[0].json()["error"]["code"], "rate_limited")
        self.assertGreaterEqual(int(limited[0].header("retry-after")), 1)
        self.assertGreaterEqual(
            self.fleet.metric('kvroute_router_tenant_requests_total{tenant="beta",outcome="rate_limited"}'), 1)
        status = self.fleet.admin("GET", "/admin/status").json()
        beta = [t for t in status["flow"]["tenants"] if t["name"] == "beta"][0]
        self.assertGreaterEqual(beta["outcomes"]["rate_limited"], 1)

    def test_pinned_salt_separates_tenants(self):
        self.idle()
        prompt = "shared " + uuid.uuid4().hex + PREFIX
        # gamma (no pinned salt) fills the cache with the prompt, unsalted.
        self.assertEqual(self.post(completion(prompt), key=self.gamma_key()).status, 200)
        time.sleep(0.3)  # the KV events reach the index
        again = self.post(completion(prompt), key=self.gamma_key())
        self.assertGreater(int(again.header("x-kvroute-cached-tokens")), 0)
        # acme's salt is pinned: the same prompt shares nothing with gamma,
        # even when acme's client sends no salt or gamma's (none) explicitly.
        r = self.post(completion(prompt))
        self.assertEqual(r.status, 200)
        self.assertEqual(int(r.header("x-kvroute-cached-tokens")), 0)
        time.sleep(0.3)
        # acme's second request hits acme's own (salted) cache, whatever salt its client claims.
        r = self.post(completion(prompt, cache_salt="gamma-pretend"))
        self.assertGreater(int(r.header("x-kvroute-cached-tokens")), 0)

    def gamma_key(self):
        # gamma's key exists once the reload test ran; otherwise add it now.
        key = "sk-gamma-fixed"
        with open(self.keys) as f:
            text = f.read()
        if sha(key) not in text:
            with open(self.keys, "a") as f:
                f.write(f"{sha(key)} gamma\n")
            self.fleet.procs["kvroute"].send_signal(signal.SIGHUP)
            self.assertTrue(wait_until(lambda: self.post(completion("k"), key=key).status == 200, 10))
        return key


if __name__ == "__main__":
    run_unittest_main(globals())
