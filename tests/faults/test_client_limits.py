"""Hostile clients never stall, bloat or confuse the router (real kvroute,
nats-server and mockers over loopback; raw sockets where the client misbehaves).
- A Transfer-Encoding whose final coding is not chunked is 400 and the
  connection closes: its body is never parsed as a next request.
- A model name with a newline cannot forge a line of the access log.
- Request bodies in flight have a global budget: a body that does not fit is
  refused with 503 before it is read (sized or chunked), and the budget comes
  back when a request ends.
- The concurrency limit is checked before a body is read.
- Connections beyond router.max_connections get 503 and are closed at once.
- The soft descriptor limit is raised to the hard one at start.
- A prompt no worker could ever hold (more KV blocks than the largest
  worker's capacity) is 400 at once: no worker sees it, no load is counted."""
import json
import os
import resource
import socket
import time
import uuid

from busfleet import FleetTestCase, wait_until, run_unittest_main

BUILD_DIR = "build"
KV_BLOCKS = 256  # per mocker: 4,096 tokens at block size 16
BUDGET = 1 << 20


def completion(prompt, **kw):
    body = {"model": "mock-model", "prompt": prompt, "max_tokens": 2}
    body.update(kw)
    return body


def head(path, length=None, extra=""):
    h = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
    if length is not None:
        h += f"Content-Length: {length}\r\n"
    return (h + "\r\n").encode()


def read_all(s, timeout=10):
    """Everything the peer sends until it closes (or `timeout` passes: socket.timeout)."""
    s.settimeout(timeout)
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return got
        got += chunk


class ClientLimits(FleetTestCase):
    tmp_prefix = "kvroute-clients-"
    fleet_options = {"speedup": 1.0, "router_args": (
        "--router.max_body_bytes", str(BUDGET), "--router.max_body_bytes_in_flight", str(BUDGET),
        "--router.client_read_timeout_ms", "20000")}
    mocker_args = ("--kv-blocks", str(KV_BLOCKS))

    @classmethod
    def start(cls, f):
        # The router starts with a soft descriptor limit below the hard one.
        cls.nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        soft = min(1024, cls.nofile[1])
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, cls.nofile[1]))
        try:
            super().start(f)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, cls.nofile)

    def connect(self):
        return socket.create_connection(("127.0.0.1", self.f.router_port), timeout=10)

    def assert_serving(self):
        r = self.f.post("/v1/completions", completion("still serving? " + uuid.uuid4().hex))
        self.assertEqual(r.status, 200, r.body)

    def put_config(self, yaml_text):
        r = self.f.admin("PUT", "/admin/config", yaml_text)
        self.assertEqual(r.status, 200, r.body)

    # -- framing ------------------------------------------------------------
    def test_transfer_encoding_not_ending_in_chunked_is_400_and_closes(self):
        smuggled = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        for coding in ("gzip", "identity", "xchunked", "chunked, gzip"):
            s = self.connect()
            s.sendall(head("/v1/completions", extra=f"Transfer-Encoding: {coding}\r\n") + smuggled)
            got = read_all(s)
            s.close()
            self.assertTrue(got.startswith(b"HTTP/1.1 400"), (coding, got[:200]))
            self.assertIn(b"bad_transfer_encoding", got, coding)
            self.assertEqual(got.count(b"HTTP/1.1 "), 1, f"{coding}: the body was answered as a request: {got!r}")
        self.assert_serving()

    # -- logs ---------------------------------------------------------------
    def test_model_with_newline_cannot_forge_a_log_line(self):
        forged = "FORGED-" + uuid.uuid4().hex
        r = self.f.post("/v1/completions", {"model": f"m\n2026-01-01T00:00:00.000 info {forged} \r\x1b[2J",
                                            "prompt": "x"})
        self.assertEqual(r.status, 404, r.body)
        log = os.path.join(self.tmp.name, "kvroute.log")

        def logged():
            with open(log, "rb") as fh:
                return [line for line in fh.read().split(b"\n") if forged.encode() in line]
        lines = wait_until(logged, 10)
        self.assertTrue(lines, "the access line never appeared")
        for line in lines:
            self.assertIn(b"access", line)
            self.assertFalse(line.startswith(b"2026-01-01"), line)
            self.assertNotIn(b"\r", line)
            self.assertNotIn(b"\x1b", line)
            self.assertIn(b"\\n2026-01-01", line)

    # -- the body budget ----------------------------------------------------
    def test_body_budget_refuses_unread_bodies_and_comes_back(self):
        f = self.f
        holder = self.connect()  # announces most of the budget and sends little of it
        holder.sendall(head("/v1/completions", 1_000_000) + b'{"model": "mock-model", "prompt": "')
        self.assertTrue(wait_until(lambda: f.metric("kvroute_router_body_bytes") == 1_000_000, 5),
                        f.metric("kvroute_router_body_bytes"))
        self.assertEqual(f.metric("kvroute_router_body_bytes_limit"), BUDGET)
        rejected = f.metric('kvroute_router_rejected_total{reason="body_budget"}')
        # A sized body that does not fit: 503 at once, its body never awaited.
        s = self.connect()
        t0 = time.time()
        s.sendall(head("/v1/completions", 100_000))
        got = read_all(s)
        s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 503"), got[:200])
        self.assertIn(b"body_budget_exhausted", got)
        self.assertLess(time.time() - t0, 5)
        # A chunked body that grows past what is left: 503 while it arrives.
        s = self.connect()
        s.sendall(head("/v1/completions", extra="Transfer-Encoding: chunked\r\n"))
        try:
            for _ in range(8):
                s.sendall(b"%x\r\n" % 32768 + b" " * 32768 + b"\r\n")
        except OSError:
            pass  # the router answered and closed
        got = read_all(s)
        s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 503"), got[:200])
        self.assertIn(b"body_budget_exhausted", got)
        self.assertGreaterEqual(f.metric('kvroute_router_rejected_total{reason="body_budget"}'), rejected + 2)
        # Small requests still pass while the budget has room for them.
        self.assert_serving()
        holder.close()
        self.assertTrue(wait_until(lambda: f.metric("kvroute_router_body_bytes") == 0, 5), "the budget leaked")
        r = f.post("/v1/completions", completion("y" * 500_000))
        self.assertIn(r.status, (200, 400), r.body)  # admitted: the body was read and routed
        self.assertNotEqual(r.status, 503)

    # -- the concurrency limit ----------------------------------------------
    def test_concurrency_limit_is_checked_before_the_body(self):
        f = self.f
        self.put_config("router:\n  max_concurrent_requests: 1\n")
        busy = self.connect()
        try:
            body = json.dumps(completion(uuid.uuid4().hex, max_tokens=3000, stream=True))
            busy.sendall(head("/v1/completions", len(body)) + body.encode())
            busy.settimeout(10)
            self.assertIn(b"200", busy.recv(65536))  # streaming: in flight for a while (speedup 1)
            s = self.connect()
            t0 = time.time()
            s.sendall(head("/v1/completions", 50_000))  # no body follows
            got = read_all(s)
            s.close()
            self.assertTrue(got.startswith(b"HTTP/1.1 503"), got[:200])
            self.assertIn(b"too_many_requests", got)
            self.assertLess(time.time() - t0, 5)
        finally:
            busy.close()
            self.put_config("router:\n  max_concurrent_requests: 20000\n")
        self.assertTrue(wait_until(lambda: f.metric("kvroute_router_inflight_requests") == 0, 10))
        self.assert_serving()

    # -- connections --------------------------------------------------------
    def test_connections_beyond_the_cap_get_503_and_close(self):
        f = self.f

        def metric(name):
            try:  # /metrics is served on the capped listener too: refused while it is full
                return f.metric(name)
            except (OSError, ValueError):
                return None
        self.assertTrue(wait_until(lambda: (metric("kvroute_router_connections") or 99) <= 1, 10))
        refused = f.metric('kvroute_router_rejected_total{reason="connection_limit"}')
        self.put_config("router:\n  max_connections: 12\n")
        idle = []
        try:
            # 12 connections, each proven open by an answer on it (a connection
            # of a metrics scrape the router has not yet seen closed may still
            # hold a place: then a 503, and the place is asked for again).
            deadline = time.time() + 10
            while len(idle) < 12 and time.time() < deadline:
                s = self.connect()
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                s.settimeout(10)
                if b" 200 " in s.recv(65536):
                    idle.append(s)
                else:
                    s.close()
                    time.sleep(0.05)
            self.assertEqual(len(idle), 12)
            extra = self.connect()
            got = read_all(extra)
            extra.close()
            self.assertTrue(got.startswith(b"HTTP/1.1 503"), got[:200])
            self.assertIn(b"too_many_connections", got)
            # The operator still gets in: the admin listener is not counted.
            self.assertEqual(f.admin("GET", "/admin/workers").status, 200)
            for s in idle[:4]:
                s.close()
            idle = idle[4:]
            self.assertTrue(wait_until(
                lambda: (metric('kvroute_router_rejected_total{reason="connection_limit"}') or 0) >= refused + 1, 5))
            self.assertEqual(f.metric("kvroute_router_connections_limit"), 12)
            self.assert_serving()
        finally:
            for s in idle:
                s.close()
            self.put_config("router:\n  max_connections: 0\n")

    def test_descriptor_limit_raised_to_the_hard_limit(self):
        pid = self.f.procs["kvroute"].pid
        with open(f"/proc/{pid}/limits") as fh:
            line = next(l for l in fh if l.startswith("Max open files"))
        soft, hard = line.split()[3:5]
        self.assertEqual(soft, hard, line)
        self.assertEqual(self.f.metric("kvroute_router_open_files_limit"), float(soft))
        with open(os.path.join(self.tmp.name, "kvroute.log"), "rb") as fh:
            self.assertIn(b"open files limit (RLIMIT_NOFILE)", fh.read())

    # -- prompts larger than any worker's KV --------------------------------
    def test_prompt_no_worker_can_hold_is_400_without_touching_workers(self):
        f = self.f

        def received():
            return sum(f.mocker(w, "GET", "/mocker/stats").json()["requests_total"] for w in f.mocker_urls)
        before = received()
        tokens = [(i * 7919) % 50000 + 1 for i in range(16 * KV_BLOCKS + 64)]
        t0 = time.time()
        r = f.post("/v1/completions", {"model": "mock-model", "prompt": tokens, "max_tokens": 1})
        self.assertEqual(r.status, 400, r.body)
        self.assertEqual(r.json()["error"]["code"], "context_length_exceeded")
        self.assertLess(time.time() - t0, 2)
        self.assertEqual(received(), before, "a worker received the request")
        self.assertGreaterEqual(f.metric('kvroute_router_rejected_total{reason="prompt_exceeds_kv"}'), 1)
        # A prompt that fits is served as before.
        r = f.post("/v1/completions", {"model": "mock-model", "prompt": tokens[:16 * 64], "max_tokens": 1})
        self.assertEqual(r.status, 200, r.body)


if __name__ == "__main__":
    run_unittest_main(globals())
