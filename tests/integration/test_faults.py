"""Misbehaviour on either side: a worker killed mid-stream, a client that
sends half a body and stalls, oversized and malformed bodies, a flood of bad
connections. Each ends in the documented status, the daemon keeps serving, and
no in-flight accounting leaks.

Run: python3 tests/integration/test_faults.py --build-dir build
"""
import json
import os
import socket
import sys
import tempfile
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from fleet import run_unittest_main, start_fleet, wait_until  # noqa: E402

BUILD_DIR = "build"



class FaultTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvroute-faults-")
        cls.fleet = start_fleet(BUILD_DIR, cls.tmp.name, speedup=1.0,
                                router_args=("--router.client_read_timeout_ms", "500",
                                             "--router.max_body_bytes", "65536"))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()
        cls.tmp.cleanup()

    def assert_still_serving(self):
        r = self.fleet.post("/v1/completions", {"model": "mock-model", "prompt": "ok?", "max_tokens": 1})
        self.assertEqual(r.status, 200)
        self.assertTrue(wait_until(lambda: self.fleet.metric("kvroute_router_inflight_requests") == 0, 5),
                        "in-flight accounting leaked")

    def test_worker_killed_mid_stream_ends_with_error_event(self):
        f = self.fleet
        s = socket.create_connection(("127.0.0.1", f.router_port))
        body = json.dumps({"model": "mock-model", "prompt": uuid.uuid4().hex, "max_tokens": 5000, "stream": True})
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        got = b""
        while b"data:" not in got:
            got += s.recv(65536)
        worker = int(got.split(b"x-kvroute-worker: ")[1].split(b"\r\n")[0])
        f.kill(f"mocker-{worker}")
        s.settimeout(10)
        while not got.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        s.close()
        self.assertIn(b'"code":"upstream_failed"', got)
        self.assertIn(b"data: [DONE]", got)
        self.assertTrue(got.endswith(b"0\r\n\r\n"), "the chunked stream was not terminated")
        self.assertGreaterEqual(f.metric('kvroute_router_upstream_errors_total{reason="mid_stream"}'), 1)
        self.assert_still_serving()
        f.start_mocker(worker)  # back for the other tests
        f.wait_ready(3)

    def test_half_body_then_stall_is_cut_off(self):
        f = self.fleet
        s = socket.create_connection(("127.0.0.1", f.router_port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"model\": \"mock")
        s.settimeout(5)
        t0 = time.time()
        data = s.recv(65536)  # the router closes after client_read_timeout_ms
        self.assertEqual(data, b"")
        self.assertLess(time.time() - t0, 3)
        s.close()
        self.assert_still_serving()

    def test_oversized_and_malformed_bodies(self):
        f = self.fleet
        big = {"model": "mock-model", "prompt": "x" * 70000}
        r = f.post("/v1/completions", big)
        self.assertEqual(r.status, 413)
        self.assertEqual(r.json()["error"]["code"], "request_too_large")
        for bad in (b"", b"null", b"[1,2]", b'{"model": 5, "prompt": "x"}', b'{"model":"mock-model","prompt":{}}',
                    b'{"model":"mock-model","prompt":"x","stream":1}', "{\"model\":\"\u00e9\u0000\"".encode(),
                    b"\xff\xfe garbage"):
            r = f.post("/v1/completions", bad)
            self.assertEqual(r.status, 400, bad)
            self.assertEqual(r.json()["error"]["type"], "invalid_request_error")
        # Broken HTTP itself.
        s = socket.create_connection(("127.0.0.1", f.router_port))
        s.sendall(b"GARBAGE / HTTP/9.9\r\n\r\n")
        s.settimeout(5)
        self.assertIn(b"400", s.recv(65536))
        s.close()
        # Headers beyond the 16 KiB limit.
        s = socket.create_connection(("127.0.0.1", f.router_port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
        s.settimeout(5)
        self.assertIn(b"431", s.recv(65536))
        s.close()
        self.assert_still_serving()

    def test_abandoned_non_streaming_request_is_cancelled_at_the_worker(self):
        # A non-streaming request's client watch is armed by the sweeper once
        # the request has waited 20 ms: a client that leaves after that still
        # stops the worker.
        f = self.fleet
        def worker_cancels():
            return sum(f.mocker(w, "GET", "/mocker/stats").json()["cancels_total"] for w in f.mocker_urls)
        before = worker_cancels()
        router_before = f.metric("kvroute_router_cancels_total")
        s = socket.create_connection(("127.0.0.1", f.router_port))
        body = json.dumps({"model": "mock-model", "prompt": uuid.uuid4().hex, "max_tokens": 5000})
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        time.sleep(0.3)  # the worker is generating (5,000 tokens at speedup 1 take minutes)
        s.close()
        self.assertTrue(wait_until(lambda: worker_cancels() > before, 5), "the worker never saw the cancel")
        self.assertTrue(wait_until(lambda: f.metric("kvroute_router_cancels_total") > router_before, 5))
        self.assert_still_serving()

    def test_connection_flood_with_resets(self):
        f = self.fleet
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", f.router_port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 10\r\n\r\n{")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()  # RST
        self.assert_still_serving()


if __name__ == "__main__":
    run_unittest_main(globals())
