#!/usr/bin/env python3
"""Faults in a disaggregated fleet (2 prefill + 2 decode kvroute-mockers,
vLLM NIXL shape, no NATS), each on a fresh fleet: a prefill worker killed
while it holds prefill legs, a decode worker killed before its first byte,
clients leaving right around their prefill, and every prefill worker gone.
Where a retry is possible the client sees no error, and the prefill mockers'
held-transfer count returns to 0: within the (short) lease where a dead decode
worker never claimed its transfer, at once where the router claims or aborts
it itself (a long lease proves no leak waited for it).

Run: python3 tests/faults/test_pd_faults.py --build-dir build
"""
import json
import os
import socket
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from fleet import Fleet, run_unittest_main, wait_until  # noqa: E402
from test_pd_exchange import DECODE, PREFILL, start_pd_fleet, words  # noqa: E402

BUILD_DIR = "build"


class PdFaultsTest(unittest.TestCase):
    protocol = "vllm_nixl"
    extra_pd = ""  # more pd.* lines of the router's config

    def fleet(self, lease_ms, speedup=20.0, prefill_timeout_ms=20000, protocol=None):
        protocol = protocol or self.protocol
        self.tmp = tempfile.TemporaryDirectory(prefix="kvroute-pd-faults-")
        self.f = Fleet(BUILD_DIR, self.tmp.name, speedup=speedup)
        try:
            connector = ["--pd-connector", "mooncake"] if protocol == "vllm_mooncake" else []
            flags = (lambda role: ["--role", role, "--pd-lease-ms", str(lease_ms), *connector]) \
                if protocol != "sglang" else \
                (lambda role: ["--disaggregation-mode", role, "--disaggregation-waiting-timeout-ms", "3000"] +
                 (["--disaggregation-bootstrap-port", "0", "--disaggregation-bootstrap-timeout-ms", "3000"]
                  if role == "prefill" else []))
            start_pd_fleet(self.f, protocol, flags,
                           f"  prefill_timeout_ms: {prefill_timeout_ms}\n" + self.extra_pd +
                           # Faults, not placement, are the subject: no parked KV from a
                           # request answered while the fleet came up, and no prefix another
                           # concurrent request has in flight, steers the decode legs.
                           "scheduler:\n  parked_kv_seconds: 0\n  inflight_prefix_weight: 0\n")
        except BaseException:
            self.tearDown()
            raise
        return self.f

    def tearDown(self):
        if getattr(self, "f", None):
            self.f.close()
            self.f = None
        if getattr(self, "tmp", None):
            self.tmp.cleanup()
            self.tmp = None

    def stats(self, i):
        return self.f.mocker(i, "GET", "/mocker/stats").json()

    def open_request(self, body):
        """A POST /v1/completions of `body` (bytes) on a raw socket the test may close at any point."""
        s = socket.create_connection(("127.0.0.1", self.f.router_port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        return s

    def held(self, workers=PREFILL):
        return sum(self.stats(i)["pd"]["held_transfers"] for i in workers)

    def send_concurrently(self, n, tag):
        """n split-sized requests at once; returns the threads and their results (filled as they end)."""
        results = [None] * n

        def one(k):
            try:
                results[k] = self.f.post("/v1/completions", {"model": "mock-model", "prompt": words(f"{tag}{k}x", 200),
                                                             "max_tokens": 4}, timeout=60)
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                results[k] = e
        threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        return threads, results

    def assert_all_split_ok(self, threads, results):
        for t in threads:
            t.join(90)
        for r in results:
            self.assertFalse(isinstance(r, Exception), r)
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(r.header("x-kvroute-pd"), "disaggregated")

    def test_prefill_worker_killed_mid_request(self):
        f = self.fleet(lease_ms=3000)
        f.mocker(1, "POST", "/mocker/hang", {"enabled": True})  # its prefill legs stay in flight
        threads, results = self.send_concurrently(6, "pkill")
        self.assertTrue(wait_until(lambda: self.stats(1)["requests_total"] >= 1, 30))
        f.kill("mocker-1")
        self.assert_all_split_ok(threads, results)
        self.assertEqual({int(r.header("x-kvroute-prefill-worker")) for r in results}, {2})
        self.assertTrue(wait_until(lambda: self.held((2,)) == 0, 15), self.held((2,)))
        self.assertGreaterEqual(f.metric('kvroute_pd_retries_total{leg="prefill"}'), 1)
        # The killed worker's leg ends "closed"; or, when it ran on a pooled
        # connection, it is retried once on a fresh one, which is refused
        # ("connect"): either way the kill is seen as a failed prefill leg.
        self.assertGreaterEqual(f.metric('kvroute_pd_prefill_legs_total{result="closed"}') +
                                f.metric('kvroute_pd_prefill_legs_total{result="connect"}'), 1)

    def test_decode_worker_killed_before_first_byte(self):
        f = self.fleet(lease_ms=3000)
        f.mocker(3, "POST", "/mocker/hang", {"enabled": True})  # accepts its decode legs, never answers
        threads, results = self.send_concurrently(6, "dkill")
        self.assertTrue(wait_until(lambda: self.stats(3)["requests_total"] >= 1, 30))
        f.kill("mocker-3")
        self.assert_all_split_ok(threads, results)
        self.assertEqual({int(r.header("x-kvroute-worker")) for r in results}, {4})
        # Each answer followed a transfer decode worker 4 verified (a fresh prefill for the retried ones).
        self.assertEqual(self.stats(4)["pd"]["transfers_completed"], 6)
        # The transfers the dead worker never claimed end with the prefill mockers' lease.
        self.assertTrue(wait_until(lambda: self.held() == 0, 20), self.held())
        self.assertGreaterEqual(f.metric('kvroute_pd_retries_total{leg="decode"}'), 1)
        # Counted: decode legs the dead worker had received (closed by its death, or
        # by the router's first-byte timeout before it).
        self.assertGreaterEqual(f.metric('kvroute_pd_transfers_left_total{reason="worker_closed"}') +
                                f.metric('kvroute_pd_transfers_left_total{reason="timeout"}'), 1)

    def test_client_gone_during_the_decode_head_is_counted(self):
        f = self.fleet(lease_ms=3000)
        for i in DECODE:
            f.mocker(i, "POST", "/mocker/hang", {"enabled": True})  # decode legs accepted, never answered
        body = json.dumps({"model": "mock-model", "prompt": words("dhead", 200), "max_tokens": 4}).encode()
        s = self.open_request(body)
        self.assertTrue(wait_until(lambda: sum(self.stats(i)["requests_total"] for i in DECODE) >= 1, 30))
        s.close()
        self.assertTrue(wait_until(lambda: f.metric('kvroute_pd_client_gone_total{phase="decode_head"}') == 1, 20),
                        {k: v for k, v in f.metrics().items() if k.startswith("kvroute_pd_") and "bucket" not in k})
        self.assertEqual(f.metric('kvroute_pd_client_gone_total{phase="prefill"}'), 0)

    def test_client_gone_around_its_prefill_leaks_nothing(self):
        # A slow engine (speedup 1): a long prompt's prefill takes a while; a
        # long lease (60 s): a transfer left to it would still be held below.
        f = self.fleet(lease_ms=60000, speedup=1.0)
        body = json.dumps({"model": "mock-model", "prompt": words("gone", 1500), "max_tokens": 64}).encode()
        prefill_legs = lambda: sum(self.stats(i)["pd"]["prefill_legs"] for i in PREFILL)  # noqa: E731
        for k, delay in enumerate((0.02, 0.1, 0.3, 0.6, 1.0, 1.5)):
            req = body.replace(b"gone", f"gone{k}x".encode())
            s = self.open_request(req)
            time.sleep(delay)
            s.close()
        self.assertTrue(wait_until(lambda: f.metric('kvroute_router_cancels_total') >= 3, 30),
                        f.metric('kvroute_router_cancels_total'))
        # Clients that leave at once, with a short prompt: its prefill is over
        # before the router's client watch arms (20 ms), so the router finds
        # the client gone with a transfer in hand, and a release leg (a decode
        # leg with max_tokens 1, answer discarded) claims it.
        short = json.dumps({"model": "mock-model", "prompt": words("quick", 80), "max_tokens": 64}).encode()
        for k in range(8):
            req = short.replace(b"quick", f"quick{k}x".encode())
            s = self.open_request(req)
            s.close()
        self.assertTrue(wait_until(lambda: f.metric('kvroute_pd_releases_total{result="ok"}') >= 1, 20),
                        {k: v for k, v in f.metrics().items() if k.startswith("kvroute_pd_") and "bucket" not in k})
        # Each release here follows a client that left during or after its prefill, counted as such.
        self.assertGreaterEqual(f.metric('kvroute_pd_client_gone_total{phase="after_prefill"}') +
                                f.metric('kvroute_pd_client_gone_total{phase="prefill"}'),
                                f.metric('kvroute_pd_releases_total{result="ok"}'))
        self.assertGreater(prefill_legs(), 0)
        # Claimed (a release leg, or the decode leg already sent) or aborted: nothing waits for the lease.
        self.assertTrue(wait_until(lambda: self.held() == 0, 15), self.held())
        r = f.post("/v1/completions", {"model": "mock-model", "prompt": words("after", 200), "max_tokens": 2})
        self.assertEqual(r.status, 200, r.body)

    def test_client_gone_as_its_prefill_answers_leaks_nothing(self):
        # The window between an engine finishing a prefill (its KV held for
        # the transfer) and the router reading the answer that names it: the
        # prefill mockers hold their answers (POST /mocker/pd/hold_answers)
        # while the client leaves and the router notices; then the answers
        # go. A router that cut the leg never reads its answer and the KV
        # would wait for the lease (60 s here).
        f = self.fleet(lease_ms=60000)
        for i in PREFILL:
            self.assertEqual(f.mocker(i, "POST", "/mocker/pd/hold_answers", {"enabled": True}).status, 200)
        body = json.dumps({"model": "mock-model", "prompt": words("window", 200), "max_tokens": 8}).encode()
        s = self.open_request(body)
        answers_held = lambda: sum(self.stats(i)["pd"]["answers_held"] for i in PREFILL)  # noqa: E731
        self.assertTrue(wait_until(lambda: answers_held() == 1 and self.held() == 1, 30),
                        [self.stats(i)["pd"] for i in PREFILL])
        s.close()
        self.assertTrue(wait_until(lambda: f.metric('kvroute_pd_client_gone_total{phase="prefill"}') == 1, 20),
                        {k: v for k, v in f.metrics().items() if k.startswith("kvroute_pd_") and "bucket" not in k})
        for i in PREFILL:
            f.mocker(i, "POST", "/mocker/pd/hold_answers", {"enabled": False})
        self.assertTrue(wait_until(lambda: self.held() == 0, 15), [self.stats(i)["pd"] for i in PREFILL])
        # Claimed by a release leg (a decode leg with max_tokens 1) and counted as released.
        self.assertTrue(wait_until(lambda: f.metric('kvroute_pd_releases_total{result="ok"}') == 1, 15))
        self.assertEqual(sum(self.stats(i)["pd"]["transfers_served"] for i in PREFILL), 1)
        self.assertEqual(f.metric('kvroute_pd_client_gone_total{phase="after_prefill"}'), 0)
        self.assertTrue(wait_until(lambda: f.metric('kvroute_router_cancels_total') == 1, 15))

    def test_a_failed_release_is_counted_as_left(self):
        # As above, but the decode workers are gone by the time the held answer
        # arrives: the release leg fails and the transfer is left to its lease.
        f = self.fleet(lease_ms=60000)
        for i in PREFILL:
            f.mocker(i, "POST", "/mocker/pd/hold_answers", {"enabled": True})
        body = json.dumps({"model": "mock-model", "prompt": words("norel", 200), "max_tokens": 8}).encode()
        s = self.open_request(body)
        self.assertTrue(wait_until(lambda: sum(self.stats(i)["pd"]["answers_held"] for i in PREFILL) == 1, 30))
        for i in DECODE:
            f.kill(f"mocker-{i}")
        s.close()
        self.assertTrue(wait_until(lambda: f.metric('kvroute_pd_client_gone_total{phase="prefill"}') == 1, 20))
        for i in PREFILL:
            f.mocker(i, "POST", "/mocker/pd/hold_answers", {"enabled": False})
        self.assertTrue(wait_until(lambda: f.metric('kvroute_pd_releases_total{result="failed"}') == 1, 20),
                        {k: v for k, v in f.metrics().items() if k.startswith("kvroute_pd_") and "bucket" not in k})
        self.assertEqual(f.metric('kvroute_pd_transfers_left_total{reason="release_failed"}'), 1)
        self.assertEqual(self.held(), 1)  # left to the prefill worker's lease

    def test_no_prefill_worker_answers(self):
        # Both prefill workers accept legs and never answer: each leg times out
        # (pd.prefill_timeout_ms), then the request runs whole on its decode worker.
        f = self.fleet(lease_ms=3000, prefill_timeout_ms=800)
        for i in PREFILL:
            f.mocker(i, "POST", "/mocker/hang", {"enabled": True})
        r = f.post("/v1/completions", {"model": "mock-model", "prompt": words("nopf", 200), "max_tokens": 3})
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("x-kvroute-pd"), "fallback")
        self.assertIn(int(r.header("x-kvroute-worker")), DECODE)
        self.assertEqual(f.metric('kvroute_pd_requests_total{outcome="fallback",reason="timeout"}'), 1)
        self.assertEqual(f.metric('kvroute_pd_prefill_legs_total{result="timeout"}'), 2)
        # pd.on_prefill_failure fail (reloaded): 503 in the API's own shape.
        rr = f.admin("PUT", "/admin/config", json.dumps({"pd": {"on_prefill_failure": "fail"}}))
        self.assertEqual(rr.status, 200, rr.body)
        r = f.post("/v1/chat/completions", {"model": "mock-model", "max_tokens": 3,
                                            "messages": [{"role": "user", "content": words("nopf2", 200)}]})
        self.assertEqual(r.status, 503, r.body)
        self.assertEqual(r.json()["error"]["code"], "prefill_unavailable")
        self.assertEqual(self.held(), 0)


class MooncakePdFaultsTest(PdFaultsTest):
    """The vLLM faults with the MooncakeConnector's legs (router-minted transfer ids)."""
    protocol = "vllm_mooncake"


class MooncakeConcurrentPdFaultsTest(PdFaultsTest):
    """The vLLM Mooncake faults with pd.mooncake_concurrent_legs: the decode
    leg goes out beside the prefill leg (vLLM's proxy), and the decode
    mocker's pull waits on the prefill mocker for the transfer, at most its
    --pd-lease-ms (vLLM's VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT)."""
    protocol = "vllm_mooncake"
    extra_pd = "  mooncake_concurrent_legs: true\n"

    def pulls(self, key):
        return sum(self.stats(i)["pd"][key] for i in PREFILL)

    def test_the_decode_leg_goes_out_beside_the_prefill_leg(self):
        # The prefill mockers hold their answers (the KV is held already): a
        # router that waited for the prefill answer before the decode leg
        # would wait here until pd.prefill_timeout_ms; concurrent legs answer.
        f = self.fleet(lease_ms=60000)
        for i in PREFILL:
            f.mocker(i, "POST", "/mocker/pd/hold_answers", {"enabled": True})
        r = f.post("/v1/completions", {"model": "mock-model", "prompt": words("beside", 200), "max_tokens": 4},
                   timeout=15)
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("x-kvroute-pd"), "disaggregated")
        self.assertEqual(self.pulls("answers_held"), 1)  # the prefill answer is still held
        self.assertEqual(self.pulls("transfers_served"), 1)
        self.assertEqual(self.held(), 0)
        for i in PREFILL:
            f.mocker(i, "POST", "/mocker/pd/hold_answers", {"enabled": False})
        self.assertTrue(wait_until(lambda: f.metric('kvroute_pd_prefill_legs_total{result="ok"}') == 1, 15))

    def test_no_prefill_worker_answers(self):
        # Both prefill workers accept legs and never answer: each attempt's
        # prefill leg times out (pd.prefill_timeout_ms 800), which ends its
        # decode leg's wait at once; both decode attempts spent: 503. Had the
        # router left a decode leg waiting, the decode mocker's pull would have
        # failed after the prefill mockers' 3 s bound and answered 400
        # unknown_transfer instead. Nothing is held; the decode engines' pulls
        # end at the bound (vLLM's decode engine keeps its KV blocks that long:
        # the router cannot shorten it).
        f = self.fleet(lease_ms=3000, prefill_timeout_ms=800)
        for i in PREFILL:
            f.mocker(i, "POST", "/mocker/hang", {"enabled": True})
        t0 = time.monotonic()
        r = f.post("/v1/completions", {"model": "mock-model", "prompt": words("cnopf", 200), "max_tokens": 3})
        self.assertEqual(r.status, 503, r.body)
        self.assertEqual(r.json()["error"]["code"], "prefill_unavailable")
        self.assertLess(time.monotonic() - t0, 3.0)
        self.assertEqual(f.metric('kvroute_pd_prefill_legs_total{result="timeout"}'), 2)
        self.assertEqual(f.metric('kvroute_pd_requests_total{outcome="failed",reason="prefill_failed"}'), 1)
        self.assertEqual(f.metric('kvroute_pd_retries_total{leg="prefill"}'), 1)
        self.assertEqual(self.held(), 0)
        self.assertTrue(wait_until(lambda: self.pulls("pulls_waiting") == 0, 15),
                        [self.stats(i)["pd"] for i in PREFILL])
        self.assertEqual(self.pulls("pulls_timed_out"), self.pulls("pulls_waited"))
        # The router holds no decode slot for them.
        self.assertTrue(wait_until(lambda: f.metric('kvroute_router_inflight_requests') == 0, 10))
        for i in PREFILL:
            f.mocker(i, "POST", "/mocker/hang", {"enabled": False})
        r = f.post("/v1/completions", {"model": "mock-model", "prompt": words("cafter", 200), "max_tokens": 2})
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("x-kvroute-pd"), "disaggregated")

    def test_client_gone_around_its_prefill_leaks_nothing(self):
        # A slow engine (speedup 1), a long lease (60 s): clients leave while
        # their decode leg waits for the prefill. The router closes the decode
        # leg and leaves the prefill leg to its answer; the decode engine's
        # pull claims the transfer once the prefill is done. Nothing waits for
        # the lease.
        f = self.fleet(lease_ms=60000, speedup=1.0)
        body = json.dumps({"model": "mock-model", "prompt": words("cgone", 1500), "max_tokens": 64}).encode()
        for k, delay in enumerate((0.05, 0.3, 0.6, 1.0)):
            req = body.replace(b"cgone", f"cgone{k}x".encode())
            s = self.open_request(req)
            time.sleep(delay)
            s.close()
        self.assertTrue(wait_until(lambda: f.metric('kvroute_router_cancels_total') >= 3, 30),
                        {k: v for k, v in f.metrics().items() if k.startswith("kvroute_pd_") and "bucket" not in k})
        self.assertGreaterEqual(f.metric('kvroute_pd_client_gone_total{phase="decode_head"}'), 1)
        self.assertTrue(wait_until(lambda: self.held() == 0 and self.pulls("pulls_waiting") == 0, 20),
                        [self.stats(i)["pd"] for i in PREFILL])
        self.assertEqual(self.pulls("pulls_timed_out"), 0)
        self.assertEqual(self.pulls("transfers_expired"), 0)
        r = f.post("/v1/completions", {"model": "mock-model", "prompt": words("cgafter", 200), "max_tokens": 2})
        self.assertEqual(r.status, 200, r.body)

    def test_client_gone_as_its_prefill_answers_leaks_nothing(self):
        self.skipTest("the decode leg went out with the prefill leg and pulled the KV: no prefill answer names "
                      "a transfer left for the router to release (test_the_decode_leg_goes_out_beside_the_"
                      "prefill_leg holds the answers)")

    def test_a_failed_release_is_counted_as_left(self):
        self.skipTest("no release leg waits for a prefill answer: the decode leg went out with the prefill leg")


class SglangPdFaultsTest(PdFaultsTest):
    """The same faults in the SGLang shape (both legs at once, bootstrap rooms);
    the mockers' bootstrap and waiting timeouts short (3 s; SGLang's are 300 s)."""

    def fleet(self, lease_ms, speedup=20.0, prefill_timeout_ms=20000, protocol="sglang"):
        return super().fleet(lease_ms, speedup, prefill_timeout_ms, protocol)

    def test_prefill_worker_killed_mid_request(self):
        f = self.fleet(lease_ms=0)
        f.mocker(1, "POST", "/mocker/hang", {"enabled": True})  # its prefill legs never join their rooms
        threads, results = self.send_concurrently(6, "spkill")
        self.assertTrue(wait_until(lambda: self.stats(1)["requests_total"] >= 1, 30))
        f.kill("mocker-1")
        # The decode legs waiting in the dead worker's rooms are cancelled by
        # their failed prefill legs and retried with a fresh room on worker 2.
        self.assert_all_split_ok(threads, results)
        self.assertEqual({int(r.header("x-kvroute-prefill-worker")) for r in results}, {2})
        self.assertTrue(wait_until(lambda: self.held((2,)) == 0, 15), self.held((2,)))
        self.assertGreaterEqual(f.metric('kvroute_pd_retries_total{leg="decode"}'), 1)

    def test_decode_worker_killed_before_first_byte(self):
        f = self.fleet(lease_ms=0)
        f.mocker(3, "POST", "/mocker/hang", {"enabled": True})  # accepts its decode legs, never answers
        threads, results = self.send_concurrently(6, "sdkill")
        self.assertTrue(wait_until(lambda: self.stats(3)["requests_total"] >= 1, 30))
        f.kill("mocker-3")
        self.assert_all_split_ok(threads, results)
        self.assertEqual({int(r.header("x-kvroute-worker")) for r in results}, {4})
        # The prefill legs of the dead worker's rooms were closed with their attempt: no room left waiting.
        self.assertTrue(wait_until(lambda: self.held() == 0, 15), self.held())

    def test_client_gone_as_its_prefill_answers_leaks_nothing(self):
        self.skipTest("SGLang's prefill answers after its KV was pushed to the decode leg (disaggregation/"
                      "prefill.py: the inflight queue returns a request once its transfer finished): "
                      "an answer names nothing held, and hold_answers holds vLLM legs only")

    def test_a_failed_release_is_counted_as_left(self):
        self.skipTest("no release legs in SGLang: both legs go at once")

    def test_client_gone_around_its_prefill_leaks_nothing(self):
        f = self.fleet(lease_ms=0, speedup=1.0)
        body = json.dumps({"model": "mock-model", "prompt": words("sgone", 1500), "max_tokens": 64,
                           "stream": True}).encode()
        for k, delay in enumerate((0.02, 0.1, 0.3, 0.6)):
            req = body.replace(b"sgone", f"sgone{k}x".encode())
            s = self.open_request(req)
            time.sleep(delay)
            s.close()
        self.assertTrue(wait_until(lambda: f.metric('kvroute_router_cancels_total') >= 1, 30))
        # No KV is held for nobody (held_transfers counts prefilled rooms not
        # taken): a prefill leg ends with its client. (A room a decode leg
        # registered before its client left holds no KV; the mocker's decode
        # leg does not notice its client leaving and times out at 3 s here.)
        self.assertTrue(wait_until(lambda: self.held() == 0, 20),
                        [self.stats(i)["pd"] for i in PREFILL + DECODE])
        r = f.post("/v1/completions", {"model": "mock-model", "prompt": words("safter", 200), "max_tokens": 2})
        self.assertEqual(r.status, 200, r.body)

    def test_no_prefill_worker_answers(self):
        # SGLang has no fallback: a decode server cannot run the request alone.
        f = self.fleet(lease_ms=0, prefill_timeout_ms=800)
        for i in PREFILL:
            f.mocker(i, "POST", "/mocker/hang", {"enabled": True})
        r = f.post("/v1/completions", {"model": "mock-model", "prompt": words("snopf", 200), "max_tokens": 3})
        self.assertEqual(r.status, 503, r.body)
        self.assertEqual(r.json()["error"]["code"], "prefill_unavailable")


if __name__ == "__main__":
    run_unittest_main(globals())
