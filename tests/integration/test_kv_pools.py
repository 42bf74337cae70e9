"""Shared KV pools end to end: real nats-server, three kvroute-mockers and
kvroute on loopback. Mockers 1 and 2 mount one pool (offload mode,
`--kv-pool-dir`, the same directory); mocker 3 mounts none. A prefix computed
on mocker 1 (which then stays busy decoding) is a pool hit for mocker 2: the
router sends the prefix there rather than to mocker 3, prices the hit at the
pool's load cost, reports it in explain, the location API, the status page and
metrics, and mocker 2 loads the blocks from the pool instead of recomputing
them (its `offload` counters).

A host tier (`HostTierTest` on NATS, `HostTierVllmTest` on vLLM's ZMQ
stream, where the host copies come by block hash only, as vLLM's
OffloadingConnector sends them): a mocker whose device evicts into its host
tier keeps the evicted blocks cached for the router (moved to the host tier in
its index) and reports no evictions; one without a host tier reports them."""
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(__file__))
from fleet import FleetTestCase, run_unittest_main, wait_until  # noqa: E402

BLOCK = 16
PREFIX_BLOCKS = 8
MEDIUM = "LMCache"
# 131,072 B per token at 12,500 MB/s: 10.5 us to load; 50 us to recompute at
# 20,000 tokens/s: a pool hit is worth 1 - 10.5/50 = 0.79 of a device hit.
POOL = ("name=shared,medium=lmcache,workers=1:2,bandwidth_mb_s=12500,kv_bytes_per_token=131072,"
        "prefill_tokens_per_s=20000")


class KvPoolTest(FleetTestCase):
    tmp_prefix = "kvroute-pools-"

    @classmethod
    def start(cls, f):
        cls.pool_dir = os.path.join(f.workdir, "pool")
        f.router_args += ["--indexer.kv_pools", POOL]
        f.start_nats()
        member = ["--kv-pool-dir", cls.pool_dir, "--kv-pool-medium", MEDIUM, "--kv-pool-gbps", "100",
                  "--max-seqs", "1"]
        f.start_mocker(1, member)
        f.start_mocker(2, member)
        f.start_mocker(3, ["--max-seqs", "1"])
        f.start_router()
        f.wait_ready(3)

    def stats(self, w):
        return json.loads(self.f.mocker(w, "GET", "/mocker/stats").body)

    def explain(self, body):
        return self.f.admin("POST", "/admin/route/explain", json.dumps(body)).json()

    def test_a_prefix_computed_on_one_member_is_a_pool_hit_on_the_other(self):
        f = self.f
        prefix = [5000 + i for i in range(PREFIX_BLOCKS * BLOCK)]
        # Mocker 1 computes the prefix and keeps decoding (its one slot stays
        # taken: busy) on a stream the test holds open.
        busy = socket.create_connection(("127.0.0.1", f.mocker_port(1)), timeout=30)
        body = json.dumps({"model": "mock-model", "prompt": prefix + [1, 2, 3], "max_tokens": 200000,
                           "stream": True}).encode()
        busy.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            self.assertTrue(busy.recv(1), "mocker 1 did not start the long request")
            stored = wait_until(lambda: self.stats(1)["offload"]["pool_stored_blocks"] >= PREFIX_BLOCKS, 10)
            self.assertTrue(stored, self.stats(1))
            self.assertEqual(len([n for n in os.listdir(self.pool_dir) if len(n) == 16]), PREFIX_BLOCKS)

            request = {"model": "mock-model", "prompt": prefix + [7, 8, 9, 10], "max_tokens": 2}

            # The router sees mocker 1 busy and the pool's blocks for mocker 2 (not 3).
            def pool_hit_seen():
                e = self.explain(request)
                by = {w["worker_id"]: w for w in e["workers"]}
                return (by[1]["excluded"] == "no_free_slot" and by[2]["overlap_by_tier"]["pool"] == PREFIX_BLOCKS
                        and e) or None
            e = wait_until(pool_hit_seen, 15, step=0.1)
            self.assertTrue(e, self.explain(request))
            by = {w["worker_id"]: w for w in e["workers"]}
            self.assertEqual(by[3]["overlap_blocks"], 0)
            self.assertEqual(e["workers"][0]["worker_id"], 2)
            # Priced at the pool's load cost: 0.79 of a device hit, not free, not a recompute.
            self.assertAlmostEqual(by[2]["cached_tokens"], PREFIX_BLOCKS * BLOCK * (1 - 131072 / 12.5e9 * 20000),
                                   places=3)

            # The location API names the pool.
            look = f.admin("POST", "/v1/kv/lookup", json.dumps({"model": "mock-model", "prompt": request["prompt"]}))
            self.assertEqual(look.status, 200, look.body)
            holders = {w["worker_id"]: w for w in look.json()["workers"]}
            self.assertEqual(holders[2]["tiers"]["pool"], PREFIX_BLOCKS * BLOCK)
            self.assertEqual(holders[2]["pool"], "shared")
            self.assertEqual(look.json()["layout_info"]["2"][0], "shared")
            self.assertNotIn(3, holders)

            before = self.stats(2)["offload"]
            r = f.post("/v1/completions", request)
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(r.header("x-kvroute-worker"), "2")
            self.assertEqual(int(r.header("x-kvroute-cached-tokens")), PREFIX_BLOCKS * BLOCK)
            # Mocker 2 loaded the prefix from the pool; only the tail was computed.
            after = self.stats(2)["offload"]
            self.assertEqual(after["pool_loaded_blocks"] - before["pool_loaded_blocks"], PREFIX_BLOCKS)
            self.assertEqual(after["computed_blocks"] - before["computed_blocks"], 0)
            self.assertGreater(after["load_ms"], before["load_ms"])
            self.assertEqual(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"], PREFIX_BLOCKS * BLOCK)

            # Metrics and the status page count the pool hit apart.
            self.assertEqual(f.metric('kvroute_router_pool_hits_total{pool="shared"}'), 1)
            self.assertEqual(f.metric('kvroute_router_pool_hit_tokens_total{pool="shared"}'), PREFIX_BLOCKS * BLOCK)
            self.assertGreaterEqual(f.metric("kvroute_indexer_pool_events_total"), 1)
            self.assertEqual(f.metric('kvroute_indexer_pool_blocks{pool="shared"}'), PREFIX_BLOCKS)
            pools = f.admin("GET", "/admin/status").json()["pools"]
            self.assertEqual([p["name"] for p in pools], ["shared"])
            self.assertEqual(pools[0]["hits"], 1)
            self.assertEqual(pools[0]["workers"], [1, 2])
        finally:
            busy.close()


class HostTier:
    """A worker whose device evicts into its host tier (4) and one without (5): the test, in either event mode."""

    def test_blocks_offloaded_to_the_host_stay_cached_and_are_no_evictions(self):
        f = self.f
        prompts = [[90000 + 1000 * k + i for i in range(30 * BLOCK)] for k in range(3)]
        # On each worker directly: three 30-block prompts on a 40-block device,
        # each pushing the one before out of it.
        for w in (4, 5):
            for ids in prompts:
                r = f.mocker(w, "POST", "/v1/completions",
                             json.dumps({"model": "mock-model", "prompt": ids, "max_tokens": 1}))
                self.assertEqual(r.status, 200, r.body)
        self.assertGreaterEqual(json.loads(f.mocker(4, "GET", "/mocker/stats").body)["offload"]["host_offloaded_blocks"],
                                20)

        def overlap(ids):
            e = f.admin("POST", "/admin/route/explain", json.dumps({"model": "mock-model", "prompt": ids})).json()
            return {w["worker_id"]: w["overlap_by_tier"] for w in e["workers"]}

        def evicted():
            return {w["worker_id"]: w["evicted_blocks"] for w in f.admin("GET", "/admin/workers").json()}
        # Worker 5 lost the first prompt; the router counts its evictions.
        self.assertTrue(wait_until(lambda: evicted()[5] >= 20, 10), evicted())
        # Worker 4 has it on its host tier, as the router's index knows, and lost nothing.
        self.assertTrue(wait_until(lambda: overlap(prompts[0])[4]["host_pinned"] >= 20, 10), overlap(prompts[0]))
        self.assertEqual(overlap(prompts[0])[5]["device"] + overlap(prompts[0])[5]["host_pinned"], 0)
        self.assertEqual(evicted()[4], 0)
        self.assertEqual(f.metric('kvroute_scheduler_worker_evicted_blocks{worker="4"}'), 0)


class HostTierTest(HostTier, FleetTestCase):
    """Events as Dynamo-style JSON on NATS."""
    tmp_prefix = "kvroute-host-tier-"

    @classmethod
    def start(cls, f):
        f.start_nats()
        f.start_mocker(4, ["--kv-blocks", "40", "--kv-host-blocks", "400"])
        f.start_mocker(5, ["--kv-blocks", "40"])
        f.start_router()
        f.wait_ready(2)


class HostTierVllmTest(HostTier, FleetTestCase):
    """Events as vLLM's ZMQ batches: the host copies announced as vLLM's OffloadingConnector does, by block
    hash only (medium CPU, no parent, no tokens)."""
    tmp_prefix = "kvroute-host-tier-vllm-"

    @classmethod
    def start(cls, f):
        url4, kv4, replay4 = f.start_vllm_mocker(4, extra=["--kv-blocks", "40", "--kv-host-blocks", "400"])
        url5, kv5, replay5 = f.start_vllm_mocker(5, extra=["--kv-blocks", "40"])
        f.start_router_config(
            "workers:\n  scrape_interval_ms: 100\n  static:\n"
            f'    - {{id: 4, url: "{url4}", model: mock-model, kv_events: "{kv4}", replay: "{replay4}"}}\n'
            f'    - {{id: 5, url: "{url5}", model: mock-model, kv_events: "{kv5}", replay: "{replay5}"}}\n')
        f.wait_ready(2)


if __name__ == "__main__":
    run_unittest_main(globals())
