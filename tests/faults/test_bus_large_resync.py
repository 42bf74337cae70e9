"""A 50,000-block worker is resynced completely, in chunks under a small
server max_payload (256 KiB), by a router started after the cache was filled."""
import tempfile
import time
import unittest

from busfleet import Fleet, fill_direct, start_nats_conf, worker_blocks, index_matches, wait_until, \
    run_unittest_main, ENTRIES, FAST_MOCKER

BUILD_DIR = "build"


class LargeResync(unittest.TestCase):
    def test_50k_block_worker_resynced_in_chunks(self):
        with tempfile.TemporaryDirectory() as d, Fleet(BUILD_DIR, d, speedup=1000.0) as f:
            start_nats_conf(f, "max_payload: 262144")
            f.start_mocker(1, ("--kv-blocks", "60000", "--max-batched-tokens", "40000", *FAST_MOCKER))
            fill_direct(f, 1, prompts=25, tokens_each=2000 * 16)
            self.assertEqual(worker_blocks(f), 50000)
            t0 = time.time()
            f.start_router()
            ok = wait_until(lambda: index_matches(f), 20, step=0.05)
            took = time.time() - t0
            m = f.metrics()
            chunks = m.get('kvroute_events_resync_chunks_total{result="sent"}', 0)
            print(f"\n50,000-block worker: index complete {took:.2f} s after router start, "
                  f"{chunks:.0f} chunk requests (max_payload 256 KiB), entries {m.get(ENTRIES)}")
            self.assertTrue(ok, f"index {m.get(ENTRIES)} vs 50000")
            self.assertEqual(m.get(ENTRIES), 50000)
            self.assertGreaterEqual(chunks, 5)  # ~1.07 MB of dump in <= 256 KiB replies
            self.assertEqual(m.get('kvroute_indexer_resyncs_total{result="failed"}', 0), 0)


if __name__ == "__main__":
    run_unittest_main(globals())
