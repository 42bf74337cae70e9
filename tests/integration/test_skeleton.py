"""Walking-skeleton integration test: real nats-server, three kvroute-mocker
workers and kvroute over loopback HTTP.

Run: python3 tests/integration/test_skeleton.py --build-dir build
"""
import json
import os
import sys
import tempfile
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from fleet import run_unittest_main, start_fleet, wait_until  # noqa: E402

BUILD_DIR = "build"
ENTRIES = 'kvroute_indexer_entries{mode="exact"}'
BLOCK = 16
# Placeholder tokenizer: 4 bytes per token, so 64 bytes per 16-token block.
SHARED_PREFIX = "You are a meticulous assistant for a logistics company. " * 40  # ~2.2 KB, ~35 blocks


def completion(prompt, **kw):
    body = {"model": "mock-model", "prompt": prompt, "max_tokens": 4}
    body.update(kw)
    return body



class FleetCase(unittest.TestCase):
    workers = 3
    ttl_ms = 1500

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvroute-it-")
        cls.fleet = start_fleet(BUILD_DIR, cls.tmp.name, block_size=BLOCK, ttl_ms=cls.ttl_ms, workers=cls.workers)

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()
        cls.tmp.cleanup()

    def overlap_on(self, worker, prompt):
        """The cached prefix (blocks) the router's index sees on `worker` for `prompt`."""
        r = self.fleet.admin("POST", "/admin/route/explain", json.dumps(completion(prompt)))
        self.assertEqual(r.status, 200, r.body)
        return max([w["overlap_blocks"] for w in r.json()["workers"] if str(w["worker_id"]) == str(worker)] or [0])

    def wait_indexed(self, worker, prompt, blocks):
        """Waits until the index shows `blocks` of `prompt` cached on `worker`
        (its KV events arrive asynchronously; other tests' entries do not count)."""
        return wait_until(lambda: self.overlap_on(worker, prompt) >= blocks, 5)


class RoutingTest(FleetCase):
    def test_shared_prefix_lands_on_one_worker_with_cached_tokens(self):
        f = self.fleet
        prefix = SHARED_PREFIX + uuid.uuid4().hex  # unique to this test
        first = f.post("/v1/completions", completion(prefix + " question 0"))
        self.assertEqual(first.status, 200, first.body)
        holder = first.header("x-kvroute-worker")
        self.assertIsNotNone(holder)
        self.assertEqual(first.header("x-kvroute-cached-tokens"), "0")
        # The worker publishes its stored blocks; wait until the index has them.
        self.assertTrue(self.wait_indexed(holder, prefix + " question 1", len(prefix) // 64 - 1),
                        "stored events did not reach the index")
        for i in range(1, 6):
            r = f.post("/v1/completions", completion(prefix + f" question {i}"))
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(r.header("x-kvroute-worker"), holder, f"request {i} left the prefix holder")
            cached = int(r.header("x-kvroute-cached-tokens"))
            self.assertGreater(cached, 0)
            # The worker itself confirms the hit.
            usage = r.json()["usage"]
            self.assertGreater(usage["prompt_tokens_details"]["cached_tokens"], 0)
            self.assertLessEqual(cached, usage["prompt_tokens"])

    def set_parked_kv_seconds(self, seconds):
        r = self.fleet.admin("PUT", "/admin/config", json.dumps({"scheduler": {"parked_kv_seconds": seconds}}))
        self.assertEqual(r.status, 200, r.body)

    def parked_blocks(self):
        r = self.fleet.admin("GET", "/admin/workers")
        self.assertEqual(r.status, 200, r.body)
        return {str(w["worker_id"]): w["parked_blocks"] for w in r.json()}

    def test_distinct_prefixes_spread_over_all_workers(self):
        # Without the parked KV (the prompts answered on a worker, expected
        # back) nothing but load tells idle workers apart: distinct prefixes
        # sent one after another spread over all of them.
        f = self.fleet
        self.set_parked_kv_seconds(0)
        try:
            # Off clears it (applied on the fleet thread, just after the answer).
            self.assertTrue(wait_until(lambda: set(self.parked_blocks().values()) == {0}, 5), self.parked_blocks())
            seen = {}
            for i in range(30):
                r = f.post("/v1/completions", completion(uuid.uuid4().hex * 20 + f" {i}"))
                self.assertEqual(r.status, 200, r.body)
                seen[r.header("x-kvroute-worker")] = seen.get(r.header("x-kvroute-worker"), 0) + 1
            self.assertEqual(set(seen), {"1", "2", "3"}, f"distribution {seen}")
        finally:
            self.set_parked_kv_seconds(10)

    def test_new_contexts_pass_over_the_worker_holding_answered_prompts(self):
        # The default parked KV: a worker that just answered a long prompt
        # holds it for that prompt's next turn, so new short contexts go to
        # the others while its parked figure is the largest.
        f = self.fleet
        self.set_parked_kv_seconds(0)  # start from nothing parked anywhere
        self.assertTrue(wait_until(lambda: set(self.parked_blocks().values()) == {0}, 5), self.parked_blocks())
        self.set_parked_kv_seconds(3600)  # no fading within the test
        try:
            long_prompt = uuid.uuid4().hex + SHARED_PREFIX * 4  # ~140 blocks, its own from the first
            first = f.post("/v1/completions", completion(long_prompt))
            self.assertEqual(first.status, 200, first.body)
            holder = first.header("x-kvroute-worker")
            # Parked when the router ends the request, just after its last byte.
            self.assertTrue(wait_until(lambda: self.parked_blocks()[holder] >= len(long_prompt) // 64, 5),
                            self.parked_blocks())
            for i in range(4):  # ~10 blocks each: the others stay below the holder
                r = f.post("/v1/completions", completion(uuid.uuid4().hex * 10 + f" {i}"))
                self.assertEqual(r.status, 200, r.body)
                self.assertNotEqual(r.header("x-kvroute-worker"), holder, f"request {i}: {self.parked_blocks()}")
        finally:
            self.set_parked_kv_seconds(10)

    def test_chat_streaming_passthrough(self):
        f = self.fleet
        body = {"model": "mock-model", "stream": True, "max_tokens": 12,
                "messages": [{"role": "system", "content": SHARED_PREFIX},
                             {"role": "user", "content": "stream please " + uuid.uuid4().hex}]}
        r = f.post("/v1/chat/completions", body)
        self.assertEqual(r.status, 200)
        self.assertTrue(r.header("content-type").startswith("text/event-stream"))
        self.assertIsNotNone(r.header("x-kvroute-worker"))
        self.assertEqual(r.chunks[-1], "[DONE]")
        self.assertGreaterEqual(len(r.chunks), 3, r.chunks)
        import json
        deltas = [json.loads(c)["choices"][0]["delta"].get("content", "") for c in r.chunks[:-1]]
        self.assertTrue("".join(deltas).strip(), "no content streamed")

    def test_models_health_and_errors(self):
        f = self.fleet
        self.assertEqual(f.get("/health").status, 200)
        models = f.get("/v1/models").json()
        self.assertEqual(models["object"], "list")
        self.assertEqual([m["id"] for m in models["data"]], ["mock-model"])
        bad = f.post("/v1/completions", b"{nope")
        self.assertEqual(bad.status, 400)
        self.assertEqual(bad.json()["error"]["type"], "invalid_request_error")
        missing = f.post("/v1/chat/completions", {"model": "mock-model"})
        self.assertEqual(missing.status, 400)
        self.assertEqual(missing.json()["error"]["param"], "messages")
        unknown = f.post("/v1/completions", {"model": "no-such-model", "prompt": "x"})
        self.assertEqual(unknown.status, 404)
        self.assertEqual(unknown.json()["error"]["code"], "model_not_found")
        self.assertEqual(f.get("/nope").status, 404)
        # The daemon still serves after all of that.
        self.assertEqual(f.post("/v1/completions", completion("still alive")).status, 200)


class WorkerDeathTest(FleetCase):
    def test_dead_worker_leaves_index_and_traffic_moves(self):
        f = self.fleet
        prefix = SHARED_PREFIX + uuid.uuid4().hex
        r = f.post("/v1/completions", completion(prefix + " q0"))
        self.assertEqual(r.status, 200)
        holder = r.header("x-kvroute-worker")
        blocks = len(prefix) // 64
        self.assertTrue(self.wait_indexed(holder, prefix + " q1", blocks - 1))
        # Only the holder has served traffic: every index entry is its.
        entries_before = f.metric(ENTRIES)
        self.assertGreaterEqual(entries_before, blocks)

        killed_at = time.time()
        f.kill(f"mocker-{holder}")
        # Before the TTL the dead worker is still the best-ranked one: the
        # router must fail over without a client-visible error.
        for i in range(5):
            r = f.post("/v1/completions", completion(prefix + f" after-kill {i}"))
            self.assertEqual(r.status, 200, r.body)
            self.assertNotEqual(r.header("x-kvroute-worker"), holder)

        expired = wait_until(lambda: f.metric("kvroute_events_workers_expired_total") >= 1, 10)
        gone_after = time.time() - killed_at
        self.assertTrue(expired, "dead worker never expired")
        # Expired by the TTL, not by some later sweep: within the TTL plus a
        # margin for a loaded CI machine (the 5 failover requests above run
        # inside this interval too).
        self.assertLessEqual(gone_after, self.ttl_ms / 1000 + 4.0)
        self.assertEqual(f.metric("kvroute_scheduler_workers"), 2)
        # The holder's entries are gone; what remains is exactly what the
        # live workers published (they hold the failed-over requests' blocks).
        live_blocks = sum(f.get("/mocker/stats", port=int(url.rsplit(":", 1)[1])).json()["kv_cached_blocks"]
                          for wid, url in f.mocker_urls.items() if str(wid) != holder)
        self.assertTrue(wait_until(lambda: f.metric(ENTRIES) == live_blocks, 3),
                        f"index has {f.metric(ENTRIES)} entries, live workers hold {live_blocks}")
        for i in range(10):
            r = f.post("/v1/completions", completion(uuid.uuid4().hex * 10))
            self.assertEqual(r.status, 200)
            self.assertNotEqual(r.header("x-kvroute-worker"), holder)
        print(f"\nworker death -> out of index and candidates in {gone_after:.2f}s (ttl {self.ttl_ms} ms)")


if __name__ == "__main__":
    run_unittest_main(globals())
