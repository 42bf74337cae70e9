"""Router restarted while the fleet is idle: its index equals the workers'
contents within 2 s, with no traffic (every known worker is asked for its
dump when it is first seen)."""
import tempfile
import time
import unittest
import uuid

from busfleet import Fleet, PREFIX, completion, index_matches, worker_blocks, wait_until, run_unittest_main, \
    ENTRIES, FAST_MOCKER

BUILD_DIR = "build"
APPLIED = 'kvroute_indexer_resyncs_total{result="applied"}'


class RouterRestartIdle(unittest.TestCase):
    def test_restarted_router_rebuilds_index_without_traffic(self):
        with tempfile.TemporaryDirectory() as d, Fleet(BUILD_DIR, d) as f:
            f.start_nats()
            for w in (1, 2, 3):
                f.start_mocker(w, FAST_MOCKER)
            f.start_router()
            f.wait_ready(3)
            for i in range(24):
                r = f.post("/v1/completions", completion(uuid.uuid4().hex + PREFIX))
                self.assertEqual(r.status, 200, r.body)
            self.assertTrue(wait_until(lambda: index_matches(f), 5), "first router never matched the workers")
            total = worker_blocks(f)
            self.assertGreater(total, 500)

            f.kill("kvroute")
            t0 = time.time()
            f.start_router()  # returns at its "listening" line
            ok = wait_until(lambda: index_matches(f), 10, step=0.02)
            took = time.time() - t0
            m = f.metrics()
            self.assertTrue(ok, f"index {m.get(ENTRIES)} vs workers {worker_blocks(f)}")
            print(f"\nrestarted router: index = workers' {total} blocks {took:.2f} s after start, no traffic; "
                  f"dumps applied {m.get(APPLIED)}")
            # Asked for dumps at start, not on the workers' next event (none
            # come: no traffic); slack for a loaded CI machine.
            self.assertLessEqual(took, 5.0)
            self.assertEqual(worker_blocks(f), total)  # no traffic meanwhile


if __name__ == "__main__":
    run_unittest_main(globals())
