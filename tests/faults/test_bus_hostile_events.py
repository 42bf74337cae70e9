"""The bus is not trusted blindly.
- One well-formed event with event_id 2^64-1 for a real worker: the worker
  keeps serving (affinity back once its single dump is applied) and at most 5
  resync requests are sent.
- Events for worker ids the router does not know are dropped and counted,
  never indexed."""
import json
import time
import uuid

from busfleet import FleetTestCase, NatsRaw, PREFIX, completion, index_matches, worker_blocks, wait_until, \
    run_unittest_main, ENTRIES, FAST_MOCKER

BUILD_DIR = "build"
RESYNC_REQ = 'kvroute_indexer_resyncs_total{result="requested"}'


def stored(worker, event_id, blocks, base=1):
    return json.dumps({"worker_id": worker, "event": {
        "event_id": event_id, "data": {"stored": {"parent_hash": None, "blocks": [
            {"block_hash": base + i, "tokens_hash": base * 1000003 + i} for i in range(blocks)]}}}})


class HostileEvents(FleetTestCase):
    mocker_args = FAST_MOCKER

    def holder(self, prefix):
        r = self.f.post("/v1/completions", completion(prefix + " first"))
        self.assertEqual(r.status, 200, r.body)
        return int(r.header("x-kvroute-worker"))

    def test_absurd_event_id_is_one_gap_not_a_storm(self):
        f = self.f
        prefix = PREFIX + uuid.uuid4().hex
        holder = self.holder(prefix)
        self.assertTrue(wait_until(lambda: index_matches(f), 5))
        before = f.metric(RESYNC_REQ)
        nats = NatsRaw(f.nats_port)
        nats.pub("kvroute.kv_events", stored(holder, 2 ** 64 - 1, 3, base=777))
        nats.flush()
        nats.close()
        self.assertTrue(wait_until(lambda: f.metric("kvroute_indexer_events_discarded_total") >= 1, 5),
                        "the absurd event was never discarded")
        # The worker keeps serving, and its prefix comes back to it.
        t_end = time.time() + 3
        served = 0
        while time.time() < t_end:
            r = f.post("/v1/completions", completion(prefix + " " + uuid.uuid4().hex[:6]))
            self.assertEqual(r.status, 200, r.body)
            served += int(r.header("x-kvroute-worker")) == holder
            time.sleep(0.05)
        sent = f.metric(RESYNC_REQ) - before
        print(f"\nevent_id 2^64-1: {sent:.0f} resync request(s) in 3 s; holder served {served} requests")
        self.assertLessEqual(sent, 5)
        self.assertGreater(served, 10)
        self.assertEqual(f.metric("kvroute_indexer_stale_owners"), 0)
        self.assertTrue(wait_until(lambda: index_matches(f), 3),
                        f"index {f.metric(ENTRIES)} vs workers {worker_blocks(f)}")

    def test_unknown_worker_ids_are_not_indexed(self):
        f = self.f
        self.assertTrue(wait_until(lambda: index_matches(f), 5))
        entries = f.metric(ENTRIES)
        dropped = f.metric("kvroute_events_unknown_worker_events_total")
        nats = NatsRaw(f.nats_port)
        for i in range(10):
            nats.pub("kvroute.kv_events", stored(900 + i, 1, 5000, base=10 ** 6 * (i + 1)))
        nats.flush()
        nats.close()
        self.assertTrue(wait_until(lambda: f.metric("kvroute_events_unknown_worker_events_total") >= dropped + 10, 5))
        self.assertEqual(f.metric(ENTRIES), entries)
        self.assertTrue(index_matches(f))


if __name__ == "__main__":
    run_unittest_main(globals())
