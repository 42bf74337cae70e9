"""A restarted worker leaves no stale blocks: its new instance id (heartbeats
and events) drops what the old process held, even when the old process had
published exactly one event and the new one starts again at event id 1."""
import tempfile
import unittest
import uuid

from busfleet import Fleet, PREFIX, completion, index_matches, overlap_of, worker_blocks, wait_until, \
    run_unittest_main, ENTRIES, FAST_MOCKER

BUILD_DIR = "build"


class WorkerRestart(unittest.TestCase):
    def test_restarted_worker_has_no_stale_blocks(self):
        with tempfile.TemporaryDirectory() as d, Fleet(BUILD_DIR, d, ttl_ms=5000) as f:
            f.start_nats()
            for w in (1, 2):
                f.start_mocker(w, FAST_MOCKER)
            f.start_router()
            f.wait_ready(2)
            # Worker 2's old process publishes exactly one event.
            old_prompt = PREFIX + "old " + uuid.uuid4().hex
            r = f.mocker(2, "POST", "/v1/completions", completion(old_prompt))
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(f.mocker(2, "GET", "/mocker/stats").json()["last_event_id"], 1)
            self.assertTrue(wait_until(lambda: overlap_of(f, old_prompt, 2) > 0, 5))
            f.kill("mocker-2")
            f.start_mocker(2, FAST_MOCKER)  # same worker id, new process, new instance id
            # Its first event has event id 1 again.
            new_prompt = "new " + uuid.uuid4().hex + PREFIX
            r = f.mocker(2, "POST", "/v1/completions", completion(new_prompt))
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(f.mocker(2, "GET", "/mocker/stats").json()["last_event_id"], 1)
            self.assertTrue(wait_until(lambda: overlap_of(f, new_prompt, 2) > 0, 5))
            self.assertTrue(wait_until(lambda: index_matches(f), 2),
                            f"index {f.metric(ENTRIES)} vs workers {worker_blocks(f)}")
            self.assertEqual(overlap_of(f, old_prompt, 2), 0)
            self.assertGreaterEqual(f.metric("kvroute_indexer_worker_restarts_total"), 1)
            self.assertEqual(f.metric("kvroute_indexer_event_duplicates_total"), 0)


if __name__ == "__main__":
    run_unittest_main(globals())
