#!/usr/bin/env python3
"""kvroute running disaggregated requests through 2 prefill + 2 decode
kvroute-mockers (no NATS; vLLM-mode mockers as workers.static entries): the
vLLM NIXL shape (prefill leg, then the decode leg with the prefill answer's
kv_transfer_params), the vLLM Mooncake shape (prefill leg with a router-minted
transfer_id, then the decode leg naming the prefill worker's bootstrap server
and engine id) and the SGLang shape (both legs at once, one bootstrap
room). Every decode answer of a split request is preceded by a transfer the
decode mocker verified (its own counter, strict mode: forged or missing
params are 400), the prefill side keeps prefix affinity, short uncached
requests run whole on their decode worker, client transfer fields never
reach a worker, and the OpenAI Node SDK tests pass through the fleet.

Run: python3 tests/integration/test_pd_exchange.py --build-dir build
"""
import json
import os
import re
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet import FleetTestCase, read_line_matching, run_unittest_main, wait_until  # noqa: E402

BUILD_DIR = "build"
HERE = os.path.dirname(os.path.abspath(__file__))
PREFILL = (1, 2)
DECODE = (3, 4)
MIN_UNCACHED = 64  # pd.min_uncached_tokens: prompts below run whole


def words(tag, n):
    """A prompt of about n placeholder tokens nobody has seen (one word a token)."""
    return " ".join(f"{tag}{i}" for i in range(n))


def start_pd_mocker(f, i, flags):
    """A vLLM-mode mocker with PD flags: (url, kv_events, replay, side channel or bootstrap port)."""
    args = [os.path.join(f.build_dir, "mocker", "kvroute-mocker"), "--worker-id", str(i), "--host", "127.0.0.1",
            "--port", "0", "--block-size", str(f.block_size), "--speedup", str(f.speedup),
            "--zmq-endpoint", "tcp://127.0.0.1:0", "--zmq-replay-endpoint", "tcp://127.0.0.1:0", *flags]
    proc = f._spawn(f"mocker-{i}", args)
    line = read_line_matching(proc, "listening on", 20)
    m = re.search(r" pd \w+ (?:side_channel|bootstrap) [^ ]+:(\d+) .*kv_events (\S+) replay (\S+) listening on (\S+)",
                  line)
    assert m, line
    f.mocker_urls[i] = m.group(4)
    return m.group(4), m.group(2), m.group(3), int(m.group(1))


def start_pd_fleet(f, protocol, mocker_flags, extra_config="", extra_flags=None, prefill_entry=""):
    """Mockers 1-2 prefill, 3-4 decode, as workers.static entries with their roles, and kvroute (no NATS).
    extra_flags: more flags for some mockers, by worker id; prefill_entry: more keys of the prefill entries."""
    entries = []
    for i in PREFILL + DECODE:
        role = "prefill" if i in PREFILL else "decode"
        url, kv, replay, pd_port = start_pd_mocker(f, i, mocker_flags(role) + list((extra_flags or {}).get(i, ())))
        extra = f", role: {role}"
        if protocol in ("sglang", "vllm_mooncake") and role == "prefill":
            extra += f", bootstrap_port: {pd_port}"
        if role == "prefill":
            extra += prefill_entry
        entries.append(f'    - {{id: {i}, url: "{url}", model: mock-model, kv_events: "{kv}", '
                       f'replay: "{replay}"{extra}}}')
    f.start_router_config(
        "workers:\n  scrape_interval_ms: 100\n  static:\n" + "\n".join(entries) + "\n"
        f"pd:\n  protocol: {protocol}\n  min_uncached_tokens: {MIN_UNCACHED}\n" + extra_config)
    f.wait_ready(4)


class PdFleetCase(FleetTestCase):
    """2 prefill + 2 decode mockers of one PD protocol behind kvroute; the
    tests both protocols share are PdExchangeTests'."""
    tmp_prefix = "kvroute-pd-exchange-"
    protocol = "vllm_nixl"
    extra_config = ""
    prefill_entry = ""

    @classmethod
    def mocker_flags(cls, role):
        return ["--role", role, "--pd-lease-ms", "60000"]

    @classmethod
    def start(cls, f):
        start_pd_fleet(f, cls.protocol, cls.mocker_flags, cls.extra_config, prefill_entry=cls.prefill_entry)

    # -- helpers ---------------------------------------------------------
    def pd_stats(self, i):
        return self.f.mocker(i, "GET", "/mocker/stats").json()["pd"]

    def transfers(self):
        """Transfers the decode mockers verified (pulled or handed over in a room)."""
        key = "rooms_completed" if self.protocol == "sglang" else "transfers_completed"
        return sum(self.pd_stats(i)[key] for i in DECODE)

    def rooms_waiting(self):
        return sum(self.pd_stats(i)["rooms_waiting"] for i in PREFILL)

    def held(self):
        return sum(self.pd_stats(i)["held_transfers"] for i in PREFILL)

    def complete(self, prompt, **extra):
        body = {"model": "mock-model", "prompt": prompt, "max_tokens": 4}
        body.update(extra)
        return self.f.post("/v1/completions", body)

    def assert_split(self, r):
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("x-kvroute-pd"), "disaggregated")
        self.assertIn(int(r.header("x-kvroute-prefill-worker")), PREFILL)
        self.assertIn(int(r.header("x-kvroute-worker")), DECODE)



class PdExchangeTests:
    """The tests both protocols share (a mixin: not collected on its own)."""
    def test_every_split_answer_follows_a_verified_transfer(self):
        before = self.transfers()
        split = 0
        for k in range(6):
            stream = k % 2 == 1
            if k < 3:
                r = self.complete(words(f"split{k}x", 200), stream=stream)
            else:
                r = self.f.post("/v1/chat/completions", {
                    "model": "mock-model", "max_tokens": 4, "stream": stream,
                    "messages": [{"role": "user", "content": words(f"chat{k}x", 200)}]})
            self.assert_split(r)
            split += 1
            if stream:
                self.assertEqual(r.chunks[-1], "[DONE]")
                self.assertGreaterEqual(len(r.chunks), 5)
            else:
                self.assertEqual(r.json()["usage"]["completion_tokens"], 4)
        # The decode mockers' own counter: one verified transfer per split request.
        self.assertTrue(wait_until(lambda: self.transfers() - before == split, 10),
                        (self.transfers() - before, split))
        self.assertTrue(wait_until(lambda: self.held() == 0, 10), self.held())
        # Every exchange ended: no bootstrap room stays open on a prefill worker.
        self.assertTrue(wait_until(lambda: self.rooms_waiting() == 0, 10), self.rooms_waiting())
        m = self.f.metrics()
        self.assertGreaterEqual(m.get('kvroute_pd_requests_total{outcome="disaggregated",reason="disaggregated"}', 0),
                                split)
        self.assertGreaterEqual(m.get('kvroute_pd_prefill_legs_total{result="ok"}', 0), split)
        self.assertGreater(m.get('kvroute_pd_leg_seconds_count{leg="prefill"}', 0), 0)
        self.assertGreater(m.get('kvroute_pd_leg_seconds_count{leg="decode"}', 0), 0)

    def test_short_uncached_request_runs_whole_on_a_decode_worker(self):
        if self.protocol == "sglang":
            # An SGLang decode server cannot run a request alone: short ones are split too.
            before = self.transfers()
            self.assert_split(self.complete(words("sglshort", MIN_UNCACHED // 2)))
            self.assertTrue(wait_until(lambda: self.transfers() - before == 1, 10))
            return
        before = self.transfers()
        r = self.complete(words("short", MIN_UNCACHED // 2))
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("x-kvroute-pd"), "aggregated")
        self.assertIsNone(r.header("x-kvroute-prefill-worker"))
        self.assertIn(int(r.header("x-kvroute-worker")), DECODE)
        self.assertEqual(self.transfers(), before)
        self.assertGreaterEqual(
            self.f.metric('kvroute_pd_requests_total{outcome="aggregated",reason="few_uncached_tokens"}'), 1)

    def test_client_transfer_fields_never_reach_a_worker(self):
        # Forwarded, these would send the decode mocker to a host the client
        # picked (strict mode: 400 bad_host / unreachable) or into another room.
        forged = {"kv_transfer_params": {"do_remote_prefill": True, "do_remote_decode": False,
                                         "remote_engine_id": "x", "remote_request_id": "y",
                                         "remote_host": "10.255.255.1", "remote_port": 9,
                                         "remote_block_ids": [[1, 2]]},
                  "bootstrap_host": "10.255.255.1", "bootstrap_port": 9, "bootstrap_room": 7}
        for prompt in (words("forgeshort", 20), words("forgelong", 200)):
            r = self.f.post("/v1/completions", {"model": "mock-model", "prompt": prompt, "max_tokens": 2, **forged},
                            headers={"x-request-id": "client-id", "x-prefiller-host-port": "10.255.255.1:9"})
            self.assertEqual(r.status, 200, r.body)
            # A PD-role engine's answer id is cmpl-{X-Request-Id} (vLLM's): the router's id, not the client's.
            self.assertTrue(r.json()["id"].startswith("cmpl-kvroute-"), r.json()["id"])

    def test_prefill_side_keeps_prefix_affinity(self):
        prefill_of = {}
        for fam in range(3):
            prefix = words(f"family{fam}p", 160)
            first = self.complete(prefix + " " + words(f"family{fam}s0q", 100))
            self.assert_split(first)
            p = int(first.header("x-kvroute-prefill-worker"))
            # The prefill worker's KV events reach the index: explain prices it with the prefix cached.
            probe = json.dumps({"model": "mock-model", "prompt": prefix + " " + words(f"family{fam}probe", 100)})

            def cached():
                ex = self.f.admin("POST", "/admin/route/explain", probe).json()
                return any(int(w["worker_id"]) == p and w["cached_tokens"] >= 128 for w in ex["pd"]["prefill_workers"])
            self.assertTrue(wait_until(cached, 10))
            for k in range(1, 3):
                r = self.complete(prefix + " " + words(f"family{fam}s{k}q", 100))
                self.assert_split(r)
                self.assertEqual(int(r.header("x-kvroute-prefill-worker")), p, f"family {fam} request {k}")
            prefill_of[fam] = p

    def test_explain_shows_the_legs(self):
        ex = self.f.admin("POST", "/admin/route/explain",
                          json.dumps({"model": "mock-model", "prompt": words("explainme", 200)})).json()
        self.assertTrue(ex["pd"]["disaggregate"])
        self.assertIn(int(ex["pd"]["prefill"]), PREFILL)
        self.assertIn(int(ex["pd"]["decode"]), DECODE)
        self.assertEqual(ex["pd"]["protocol"], self.protocol)
        legs = ex["pd"]["legs"]  # what the proxy sends: a split, its two workers
        self.assertTrue(legs["split"])
        self.assertIn(legs["prefill"], PREFILL)
        self.assertIn(legs["decode"], DECODE)
        short = self.f.admin("POST", "/admin/route/explain",
                             json.dumps({"model": "mock-model", "prompt": words("xs", 10)})).json()
        # A short uncached prompt runs whole on vLLM's decode worker; SGLang's decode cannot run it alone.
        self.assertEqual(short["pd"]["legs"]["split"], self.protocol == "sglang")
        self.assertIn(short["pd"]["legs"]["decode"], DECODE)

    def test_openai_node_sdk_through_the_pd_fleet(self):
        if not os.path.isdir(os.path.join(HERE, "node", "node_modules", "openai")):
            self.skipTest("the openai npm package is missing: run npm ci in tests/integration/node")
        env = dict(os.environ, KVROUTE_URL=f"http://127.0.0.1:{self.f.router_port}",
                   MOCKER_URLS=",".join(self.f.mocker_urls[i] for i in PREFILL + DECODE))
        before = self.transfers()
        r = subprocess.run(["node", "--test", "--test-reporter=spec", "openai_client.test.mjs"],
                           cwd=os.path.join(HERE, "node"), env=env, timeout=240, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-2000:])
        # Some of the SDK's requests were split, each with its transfer.
        self.assertGreater(self.transfers(), before)
        self.assertTrue(wait_until(lambda: self.held() == 0, 10), self.held())


class VllmNixlExchangeTest(PdExchangeTests, PdFleetCase):
    protocol = "vllm_nixl"


class VllmMooncakeExchangeTest(PdExchangeTests, PdFleetCase):
    """vLLM MooncakeConnector: the prefill leg with a router-minted transfer_id,
    then the decode leg naming the prefill worker's bootstrap server and the
    engine id its GET /query lists (the prefill mockers run 2 DP ranks, so the
    engine id must be the rank's that prefilled)."""
    protocol = "vllm_mooncake"
    prefill_entry = ", dp_size: 2"

    @classmethod
    def mocker_flags(cls, role):
        flags = ["--role", role, "--pd-connector", "mooncake", "--pd-lease-ms", "60000"]
        if role == "prefill":
            flags += ["--data-parallel-size", "2"]
        return flags

    def test_transfer_ids_are_minted_per_prefill_leg(self):
        served = sum(self.pd_stats(i)["transfers_served"] for i in PREFILL)
        for k in range(3):
            self.assert_split(self.complete(words(f"mcmint{k}x", 200)))
        # Three legs, three distinct transfers served (a reused id would be refused as held already).
        self.assertTrue(wait_until(
            lambda: sum(self.pd_stats(i)["transfers_served"] for i in PREFILL) - served == 3, 10))
        self.assertEqual(sum(self.pd_stats(i)["rejected"].get("held_full", 0) for i in PREFILL), 0)

    def test_unpinned_prefill_legs_take_the_data_parallel_ranks_in_turn(self):
        """A prompt cached nowhere steers to no rank: its prefill leg still names
        one (the decode leg needs that rank's engine id), and the legs go round
        the ranks /query lists, as vLLM's proxy sends them, rather than all to
        the lowest. 12 legs over 2 prefill workers and 2 io threads: some
        thread sends a worker two legs in a row."""
        def by_rank():
            ranks = [0, 0]
            for i in PREFILL:
                for r in self.f.mocker(i, "GET", "/mocker/stats").json()["ranks"]:
                    ranks[r["rank"]] += r["requests"]
            return ranks
        before = by_rank()
        for k in range(12):
            self.assert_split(self.complete(words(f"mcrank{k}x", 200)))
        after = by_rank()
        self.assertEqual(sum(after) - sum(before), 12, (before, after))
        self.assertGreater(after[0] - before[0], 0, (before, after))
        self.assertGreater(after[1] - before[1], 0, (before, after))


class VllmMooncakeConcurrentExchangeTest(VllmMooncakeExchangeTest):
    """The Mooncake legs with pd.mooncake_concurrent_legs: the decode leg goes
    out beside the prefill leg (vLLM's proxy) and the decode mocker's pull
    waits on the prefill mocker for the transfer; every shared test holds."""
    extra_config = "  mooncake_concurrent_legs: true\n"


class SglangExchangeTest(PdExchangeTests, PdFleetCase):
    protocol = "sglang"

    @classmethod
    def mocker_flags(cls, role):
        flags = ["--disaggregation-mode", role]
        if role == "prefill":
            flags += ["--disaggregation-bootstrap-port", "0"]
        return flags


if __name__ == "__main__":
    run_unittest_main(globals())
