"""kvroute-mocker's prefill/decode disaggregation, two mockers driven directly
(no router) over real HTTP on loopback: the vLLM NIXL shape (--role) and the
SGLang bootstrap-room shape (--disaggregation-mode).

Run: python3 tests/integration/test_mocker_pd.py --build-dir build
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from fleet import Fleet, read_line_matching, run_unittest_main, wait_until  # noqa: E402

BUILD_DIR = "build"
BLOCK = 16
PROMPT = "Disaggregated serving moves the KV cache from prefill to decode. " * 12


class PdFleet(Fleet):
    @classmethod
    def for_class(cls, test_class, prefix, start):
        """A class's shared fleet: `start(fleet)` runs; a failed start closes what it started."""
        test_class.tmp = tempfile.TemporaryDirectory(prefix=prefix)
        test_class.fleet = cls(BUILD_DIR, test_class.tmp.name)
        try:
            start(test_class.fleet)
        except BaseException:
            test_class.fleet.close()
            test_class.tmp.cleanup()
            raise

    def start_pd_mocker(self, name, args):
        """A mocker with PD flags; returns (http port, side-channel or bootstrap port)."""
        argv = [os.path.join(self.build_dir, "mocker", "kvroute-mocker"), "--port", "0",
                "--block-size", str(BLOCK), "--speedup", "20", *args]
        proc = self._spawn(name, argv)
        line = read_line_matching(proc, "listening on", 20)
        m = re.search(r" pd (\w+) (side_channel|bootstrap) [^:]+:(\d+) .*listening on http://[^:]+:(\d+)$", line)
        assert m, line
        return int(m.group(4)), int(m.group(3))

    def stats(self, port):
        return self.get("/mocker/stats", port=port).json()

    def pd(self, port):
        return self.stats(port)["pd"]

    def metric(self, port, name):
        for line in self.get("/metrics", port=port).body.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return None


def completion(prompt=PROMPT, max_tokens=4, **extra):
    body = {"model": "mock-model", "prompt": prompt, "max_tokens": max_tokens}
    body.update(extra)
    return body


PREFILL_LEG = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}


class VllmNixlTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        def start(f):
            cls.p_port, cls.p_side = f.start_pd_mocker("prefill", ["--role", "prefill", "--worker-id", "1"])
            cls.d_port, _ = f.start_pd_mocker("decode", ["--role", "decode", "--worker-id", "2",
                                                         "--kv-link-gbps", "100"])
        PdFleet.for_class(cls, "kvroute-pd-", start)

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()
        cls.tmp.cleanup()

    def prefill(self, prompt=PROMPT, port=None, headers=None):
        r = self.fleet.post("/v1/completions", completion(prompt, 1, kv_transfer_params=PREFILL_LEG),
                            port=port or self.p_port, headers=headers)
        self.assertEqual(r.status, 200, r.body)
        return r.json()

    def decode(self, params, prompt=PROMPT, port=None, **extra):
        return self.fleet.post("/v1/completions", completion(prompt, 4, kv_transfer_params=params, **extra),
                               port=port or self.d_port)

    def wait_released(self, port=None):
        port = port or self.p_port
        self.assertTrue(wait_until(lambda: self.fleet.pd(port)["held_blocks"] == 0, 20), self.fleet.pd(port))

    def test_prefill_returns_nixl_params_and_holds_blocks_until_the_pull(self):
        prompt = "params and pull. " + PROMPT
        before_p, before_d = self.fleet.pd(self.p_port), self.fleet.pd(self.d_port)
        j = self.prefill(prompt, headers={"X-Request-Id": "req-7"})
        self.assertEqual(j["choices"][0]["finish_reason"], "length")
        self.assertEqual(j["usage"]["completion_tokens"], 1)
        kv = j["kv_transfer_params"]
        # The newest NixlConnector's request_finished() dict.
        self.assertEqual(set(kv), {"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
                                   "remote_request_id", "remote_host", "remote_port", "tp_size", "dcp_size",
                                   "pp_size", "remote_num_tokens", "remote_blocks_expiry_time", "transfer_mode"})
        self.assertIs(kv["do_remote_prefill"], True)
        self.assertIs(kv["do_remote_decode"], False)
        self.assertEqual(kv["remote_host"], "127.0.0.1")
        self.assertEqual(kv["remote_port"], self.p_side)
        self.assertEqual(kv["remote_engine_id"], self.fleet.pd(self.p_port)["engine_id"])
        self.assertRegex(kv["remote_request_id"], r"^cmpl-req-7-[0-9a-f]{8}$")
        self.assertEqual(j["id"], "cmpl-req-7")  # vLLM's response id: cmpl-{X-Request-Id}
        self.assertEqual(kv["transfer_mode"], "pull")
        prompt_tokens = j["usage"]["prompt_tokens"]
        self.assertEqual(kv["remote_num_tokens"], prompt_tokens)
        blocks = prompt_tokens // BLOCK
        self.assertEqual(len(kv["remote_block_ids"]), 1)
        self.assertEqual(len(kv["remote_block_ids"][0]), blocks)
        held = self.fleet.pd(self.p_port)
        self.assertEqual(held["held_transfers"], before_p["held_transfers"] + 1)
        self.assertEqual(held["held_blocks"], before_p["held_blocks"] + blocks)
        self.assertEqual(self.fleet.metric(self.p_port, "kvroute_mocker_pd_held_blocks"), held["held_blocks"])

        r = self.fleet.post("/v1/completions", completion(prompt, 4, kv_transfer_params=kv), port=self.d_port,
                            headers={"X-Request-Id": "req-7"})
        self.assertEqual(r.status, 200, r.body)
        d = r.json()
        self.assertEqual(d["id"], "cmpl-req-7")
        self.assertEqual(d["usage"]["completion_tokens"], 4)
        self.assertNotIn("kv_transfer_params", d)
        # Every prompt block came over the link, and the decode worker caches (announces) them.
        self.assertEqual(d["usage"]["prompt_tokens_details"]["cached_tokens"], blocks * BLOCK)
        after_d = self.fleet.pd(self.d_port)
        self.assertEqual(after_d["transfers_completed"], before_d["transfers_completed"] + 1)
        self.assertEqual(after_d["blocks_pulled"], before_d["blocks_pulled"] + blocks)
        self.assertEqual(after_d["bytes_pulled"] - before_d["bytes_pulled"], blocks * BLOCK * 131072)
        self.assertEqual(self.fleet.metric(self.d_port, "kvroute_mocker_pd_transfers_completed_total"),
                         after_d["transfers_completed"])
        after_p = self.fleet.pd(self.p_port)
        self.assertEqual(after_p["transfers_served"], before_p["transfers_served"] + 1)
        self.wait_released()
        # Pulled once: a second decode with the same params is refused.
        r = self.decode(kv, prompt)
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["error"]["code"], "unknown_transfer")

    def test_decode_pulls_only_the_blocks_it_lacks(self):
        shared = "a prefix the decode worker has seen. " * 8
        prompt = shared + "and a new question for it"
        r = self.fleet.post("/v1/completions", completion(shared, 1), port=self.d_port)  # aggregated: caches the prefix
        self.assertEqual(r.status, 200)
        local = r.json()["usage"]["prompt_tokens"] // BLOCK
        kv = self.prefill(prompt)["kv_transfer_params"]
        before = self.fleet.pd(self.d_port)
        cached_before = self.fleet.stats(self.d_port)["kv_cached_blocks"]
        r = self.decode(kv, prompt)
        self.assertEqual(r.status, 200, r.body)
        after = self.fleet.pd(self.d_port)
        total = len(kv["remote_block_ids"][0])
        self.assertGreater(total, local)
        self.assertEqual(after["blocks_local"] - before["blocks_local"], local)
        self.assertEqual(after["blocks_pulled"] - before["blocks_pulled"], total - local)
        # The pulled blocks are stored (announced) on the decode worker, the local ones not again.
        self.assertEqual(self.fleet.stats(self.d_port)["kv_cached_blocks"] - cached_before, total - local)
        self.wait_released()

    def test_forged_and_missing_params_are_refused_with_400(self):
        prompt = "forgery. " + PROMPT
        kv = self.prefill(prompt)["kv_transfer_params"]
        before = self.fleet.pd(self.d_port)["rejected"]
        cases = [
            ({**kv, "remote_engine_id": "not-the-engine"}, "unknown_engine"),
            ({**kv, "remote_request_id": kv["remote_request_id"][:-1] + "x"}, "unknown_transfer"),
            ({**kv, "remote_block_ids": [[b + 100000 for b in kv["remote_block_ids"][0]]]}, "forged_blocks"),
            ({k: v for k, v in kv.items() if k != "remote_host"}, "missing"),
            ({**kv, "remote_host": "prefill.example.com"}, "bad_host"),
            ({**kv, "remote_port": "x"}, "malformed"),
        ]
        for params, code in cases:
            with self.subTest(code=code):
                r = self.decode(params, prompt)
                self.assertEqual(r.status, 400, r.body)
                err = r.json()["error"]
                self.assertEqual(err["code"], code)
                self.assertEqual(err["type"], "invalid_request_error")
                self.assertTrue(err["message"])
        after = self.fleet.pd(self.d_port)["rejected"]
        for _, code in cases:
            self.assertGreater(after.get(code, 0), before.get(code, 0), code)
        # None of them took the blocks: the genuine params still pull.
        self.assertEqual(self.fleet.pd(self.p_port)["side_channel_rejected"].get("forged_blocks", 0) > 0, True)
        r = self.decode(kv, prompt)
        self.assertEqual(r.status, 200, r.body)
        self.wait_released()

    def test_params_of_another_prompt_are_refused(self):
        prompt = "mismatch. " + PROMPT
        kv = self.prefill(prompt)["kv_transfer_params"]
        other = "MISMATCH. " + PROMPT  # as many tokens, other blocks
        r = self.decode(kv, other)
        self.assertEqual(r.status, 400, r.body)
        self.assertEqual(r.json()["error"]["code"], "prompt_mismatch")
        kv = self.prefill(prompt)["kv_transfer_params"]
        r = self.decode({**kv, "remote_block_ids": kv["remote_block_ids"][0][:-1]}, prompt)  # flat list, one short
        self.assertEqual(r.status, 400, r.body)
        self.assertEqual(r.json()["error"]["code"], "prompt_mismatch")
        # Either way the prefill worker's blocks are not left held.
        self.wait_released()

    def test_decode_without_params_is_served_aggregated(self):
        before = self.fleet.pd(self.d_port)
        r = self.fleet.post("/v1/completions", completion("no params here " * 10), port=self.d_port)
        self.assertEqual(r.status, 200, r.body)
        after = self.fleet.pd(self.d_port)
        self.assertEqual(after["transfers_completed"], before["transfers_completed"])
        self.assertEqual(after["rejected"], before["rejected"])

    def test_a_leg_sent_to_the_wrong_role_is_refused(self):
        r = self.fleet.post("/v1/completions", completion(kv_transfer_params=PREFILL_LEG), port=self.d_port)
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["error"]["code"], "wrong_role")
        kv = self.prefill("wrong role. " + PROMPT)["kv_transfer_params"]
        r = self.decode(kv, "wrong role. " + PROMPT, port=self.p_port)
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["error"]["code"], "wrong_role")
        r = self.decode(kv, "wrong role. " + PROMPT)
        self.assertEqual(r.status, 200)
        self.wait_released()

    def test_a_refused_decode_leg_frees_the_prefill_blocks(self):
        prompt = "refused elsewhere. " + PROMPT
        kv = self.prefill(prompt)["kv_transfer_params"]
        freed = self.fleet.pd(self.p_port)["transfers_freed"]
        r = self.fleet.post("/v1/completions", {"model": "other-model", "prompt": prompt, "kv_transfer_params": kv},
                            port=self.d_port)
        self.assertEqual(r.status, 404)
        self.wait_released()
        self.assertEqual(self.fleet.pd(self.p_port)["transfers_freed"], freed + 1)

    def test_chat_legs(self):
        messages = [{"role": "user", "content": "chat over a disaggregated pair. " * 20}]
        r = self.fleet.post("/v1/chat/completions", {"model": "mock-model", "messages": messages, "max_tokens": 1,
                                                     "kv_transfer_params": PREFILL_LEG},
                            port=self.p_port, headers={"X-Request-Id": "chat-1"})
        self.assertEqual(r.status, 200, r.body)
        kv = r.json()["kv_transfer_params"]
        self.assertRegex(kv["remote_request_id"], r"^chatcmpl-chat-1-[0-9a-f]{8}$")
        before = self.fleet.pd(self.d_port)["transfers_completed"]
        r = self.fleet.post("/v1/chat/completions", {"model": "mock-model", "messages": messages, "max_tokens": 3,
                                                     "stream": True, "kv_transfer_params": kv}, port=self.d_port)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.chunks[-1], "[DONE]")
        self.assertEqual(self.fleet.pd(self.d_port)["transfers_completed"], before + 1)
        self.wait_released()

    def test_bounds_on_kv_transfer_params(self):
        big = {"do_remote_prefill": True, "remote_engine_id": "e" * 300, "remote_request_id": "r",
               "remote_host": "127.0.0.1", "remote_port": 1, "remote_block_ids": [[1]]}
        r = self.decode(big)
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["error"]["code"], "too_large")
        r = self.decode({**big, "remote_engine_id": "e", "junk": "x" * (1 << 20)})
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["error"]["code"], "too_large")
        r = self.decode("not an object")
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["error"]["code"], "malformed")


class VllmModesTest(unittest.TestCase):
    """--role both ignores PD fields; --pd-bad-params recompute serves bad params aggregated; flags are checked."""

    def test_role_both_and_recompute(self):
        with tempfile.TemporaryDirectory(prefix="kvroute-pd-modes-") as tmp, PdFleet(BUILD_DIR, tmp) as fleet:
            proc = fleet._spawn("both", [os.path.join(BUILD_DIR, "mocker", "kvroute-mocker"), "--port", "0"])
            both = int(read_line_matching(proc, "listening on", 20).rsplit(":", 1)[1])
            r = fleet.post("/v1/completions", completion(kv_transfer_params=PREFILL_LEG), port=both)
            self.assertEqual(r.status, 200)
            self.assertNotIn("kv_transfer_params", r.json())
            self.assertNotIn("pd", fleet.stats(both))
            d_port, _ = fleet.start_pd_mocker("decode", ["--role", "decode", "--pd-bad-params", "recompute"])
            forged = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "r",
                      "remote_host": "127.0.0.1", "remote_port": 1, "remote_block_ids": [[1, 2]]}
            for params in (forged, {"do_remote_prefill": True}):
                r = fleet.post("/v1/completions", completion(kv_transfer_params=params), port=d_port)
                self.assertEqual(r.status, 200, r.body)
            pd = fleet.pd(d_port)
            self.assertEqual(pd["recomputed"], 2)
            self.assertEqual(pd["transfers_completed"], 0)
            self.assertEqual(pd["rejected"], {"prompt_mismatch": 1, "missing": 1})

    def test_data_parallel_ranks_share_one_side_channel(self):
        with tempfile.TemporaryDirectory(prefix="kvroute-pd-dp-") as tmp, PdFleet(BUILD_DIR, tmp) as fleet:
            dp = ["--data-parallel-size", "2", "--zmq-endpoint", "tcp://127.0.0.1:0"]
            p_port, p_side = fleet.start_pd_mocker("prefill", ["--role", "prefill", *dp])
            d_port, _ = fleet.start_pd_mocker("decode", ["--role", "decode", *dp])
            r = fleet.post("/v1/completions", completion(kv_transfer_params=PREFILL_LEG, max_tokens=1), port=p_port,
                           headers={"X-data-parallel-rank": "1"})
            self.assertEqual(r.status, 200)
            kv = r.json()["kv_transfer_params"]
            self.assertEqual(kv["remote_port"], p_side)
            self.assertEqual([x["requests"] for x in fleet.stats(p_port)["ranks"]], [0, 1])
            r = fleet.post("/v1/completions", completion(kv_transfer_params=kv), port=d_port,
                           headers={"X-data-parallel-rank": "0"})
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(fleet.pd(p_port)["held_blocks"], 0)
            self.assertEqual(fleet.stats(d_port)["ranks"][0]["kv_cached_blocks"], len(kv["remote_block_ids"][0]))

    def test_the_older_connectors_params(self):
        with tempfile.TemporaryDirectory(prefix="kvroute-pd-legacy-") as tmp, PdFleet(BUILD_DIR, tmp) as fleet:
            p_port, _ = fleet.start_pd_mocker("prefill", ["--role", "prefill", "--pd-nixl-params", "legacy"])
            d_port, _ = fleet.start_pd_mocker("decode", ["--role", "decode"])
            r = fleet.post("/v1/completions", completion(kv_transfer_params=PREFILL_LEG, max_tokens=1), port=p_port)
            kv = r.json()["kv_transfer_params"]
            self.assertEqual(set(kv), {"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
                                       "remote_request_id", "remote_host", "remote_port", "tp_size"})
            self.assertTrue(all(isinstance(b, int) for b in kv["remote_block_ids"]))
            r = fleet.post("/v1/completions", completion(kv_transfer_params=kv), port=d_port)
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(fleet.pd(d_port)["blocks_pulled"], len(kv["remote_block_ids"]))

    def test_conflicting_flags_exit_2(self):
        exe = os.path.join(BUILD_DIR, "mocker", "kvroute-mocker")
        for args in (["--role", "prefill", "--disaggregation-mode", "decode"],
                     ["--pd-side-channel-port", "5600"],
                     ["--disaggregation-mode", "decode", "--disaggregation-bootstrap-port", "8998"]):
            with self.subTest(args=args):
                p = subprocess.run([exe, *args], capture_output=True, timeout=20)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertTrue(p.stderr)


class VllmLeaseTest(unittest.TestCase):
    """A short lease (3 s)."""

    @classmethod
    def setUpClass(cls):
        def start(f):
            cls.p_port, _ = f.start_pd_mocker("prefill", ["--role", "prefill", "--pd-lease-ms", "3000"])
            cls.d_port, _ = f.start_pd_mocker("decode", ["--role", "decode"])
        PdFleet.for_class(cls, "kvroute-pd-lease-", start)

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()
        cls.tmp.cleanup()

    def prefill(self, prompt):
        return self.fleet.post("/v1/completions", completion(prompt, 1, kv_transfer_params=PREFILL_LEG),
                               port=self.p_port)

    def test_the_lease_frees_unpulled_blocks_and_a_late_pull_is_expired(self):
        r = self.prefill("expiring. " + PROMPT)
        self.assertEqual(r.status, 200)
        kv = r.json()["kv_transfer_params"]
        self.assertGreater(self.fleet.pd(self.p_port)["held_blocks"], 0)
        self.assertTrue(wait_until(lambda: self.fleet.pd(self.p_port)["held_blocks"] == 0, 20))
        pd = self.fleet.pd(self.p_port)
        self.assertEqual(pd["held_transfers"], 0)
        self.assertGreaterEqual(pd["transfers_expired"], 1)
        self.assertEqual(self.fleet.metric(self.p_port, "kvroute_mocker_pd_transfers_expired_total"),
                         pd["transfers_expired"])
        r = self.fleet.post("/v1/completions", completion("expiring. " + PROMPT, 2, kv_transfer_params=kv),
                            port=self.d_port)
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["error"]["code"], "expired")
        self.assertGreaterEqual(self.fleet.pd(self.d_port)["rejected"]["expired"], 1)

    def test_a_streamed_prefill_leg_returns_no_params_and_holds_until_the_lease(self):
        self.assertTrue(wait_until(lambda: self.fleet.pd(self.p_port)["held_transfers"] == 0, 20))
        r = self.fleet.post("/v1/completions", completion("streamed prefill. " + PROMPT, 1, stream=True,
                                                          kv_transfer_params=PREFILL_LEG), port=self.p_port)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.chunks[-1], "[DONE]")
        self.assertFalse(any("kv_transfer_params" in c for c in r.chunks), r.chunks)
        self.assertEqual(self.fleet.pd(self.p_port)["held_transfers"], 1)
        self.assertTrue(wait_until(lambda: self.fleet.pd(self.p_port)["held_transfers"] == 0, 20))



class VllmHeldBoundTest(unittest.TestCase):
    def test_held_transfers_are_bounded(self):
        with tempfile.TemporaryDirectory(prefix="kvroute-pd-bound-") as tmp, PdFleet(BUILD_DIR, tmp) as fleet:
            p_port, _ = fleet.start_pd_mocker("prefill", ["--role", "prefill", "--pd-max-held", "2"])
            d_port, _ = fleet.start_pd_mocker("decode", ["--role", "decode"])
            prefill = lambda prompt: fleet.post(  # noqa: E731
                "/v1/completions", completion(prompt, 1, kv_transfer_params=PREFILL_LEG), port=p_port)
            held = []
            for i in range(2):
                r = prefill(f"hold {i}. " + PROMPT)
                self.assertEqual(r.status, 200)
                held.append((f"hold {i}. " + PROMPT, r.json()["kv_transfer_params"]))
            r = prefill("one too many. " + PROMPT)
            self.assertEqual(r.status, 503)
            self.assertEqual(r.json()["error"]["code"], "held_full")
            self.assertEqual(fleet.pd(p_port)["rejected"]["held_full"], 1)
            # Aggregated requests still run; pulls make room again.
            self.assertEqual(fleet.post("/v1/completions", completion("plain"), port=p_port).status, 200)
            for prompt, kv in held:
                r = fleet.post("/v1/completions", completion(prompt, 2, kv_transfer_params=kv), port=d_port)
                self.assertEqual(r.status, 200, r.body)
            self.assertEqual(fleet.pd(p_port)["held_transfers"], 0)
            self.assertEqual(prefill("room again. " + PROMPT).status, 200)


class VllmMooncakeTest(unittest.TestCase):
    """vLLM's MooncakeConnector shape (--pd-connector mooncake): the router mints
    transfer_id, the prefill answer carries no params, the decode leg names the
    prefill worker's bootstrap server and engine id (from its GET /query).
    A pull that comes before its prefill waits for it, at most the prefill
    worker's --pd-lease-ms (vLLM's VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, short
    here)."""
    WAIT_MS = 4000

    @classmethod
    def setUpClass(cls):
        def start(f):
            cls.p_port, cls.p_boot = f.start_pd_mocker(
                "prefill", ["--role", "prefill", "--pd-connector", "mooncake", "--worker-id", "1",
                            "--data-parallel-size", "2", "--zmq-endpoint", "tcp://127.0.0.1:0",
                            "--pd-lease-ms", str(cls.WAIT_MS)])
            cls.d_port, _ = f.start_pd_mocker("decode", ["--role", "decode", "--pd-connector", "mooncake",
                                                         "--worker-id", "2"])
        PdFleet.for_class(cls, "kvroute-pd-mc-", start)

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()
        cls.tmp.cleanup()

    def query(self):
        r = self.fleet.get("/query", port=self.p_boot)
        self.assertEqual(r.status, 200, r.body)
        return r.json()

    def prefill(self, prompt, transfer_id, rank=0):
        params = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}
        return self.fleet.post("/v1/completions", completion(prompt, 1, kv_transfer_params=params),
                               port=self.p_port, headers={"X-data-parallel-rank": str(rank)})

    def decode(self, prompt, transfer_id, engine_id, addr=None):
        params = {"do_remote_decode": False, "do_remote_prefill": True, "transfer_id": transfer_id,
                  "remote_engine_id": engine_id,
                  "remote_bootstrap_addr": addr or f"http://127.0.0.1:{self.p_boot}"}
        return self.fleet.post("/v1/completions", completion(prompt, 4, kv_transfer_params=params),
                               port=self.d_port)

    def test_query_lists_each_rank_with_its_engine_id(self):
        q = self.query()
        self.assertEqual(sorted(q), ["0", "1"])
        base = self.fleet.pd(self.p_port)["engine_id"]
        self.assertEqual(q["0"]["engine_id"], f"{base}_dp0")
        self.assertEqual(q["1"]["engine_id"], f"{base}_dp1")
        self.assertTrue(q["0"]["worker_addr"]["0"]["0"].startswith("tcp://127.0.0.1:"))

    def test_transfer_by_router_minted_id_is_verified_and_frees_the_blocks(self):
        prompt = "mooncake transfer. " + PROMPT
        q = self.query()
        before = self.fleet.pd(self.d_port)["transfers_completed"]
        r = self.prefill(prompt, "xfer-a1", rank=1)
        self.assertEqual(r.status, 200, r.body)
        self.assertIsNone(r.json().get("kv_transfer_params"))  # request_finished() returns None
        self.assertEqual(self.fleet.pd(self.p_port)["held_transfers"], 1)
        self.assertGreater(self.fleet.pd(self.p_port)["held_blocks"], 0)
        # Rank 0's engine id for rank 1's transfer: refused, the transfer stays held.
        bad = self.decode(prompt, "xfer-a1", q["0"]["engine_id"])
        self.assertEqual(bad.status, 400, bad.body)
        self.assertEqual(bad.json()["error"]["code"], "unknown_engine")
        self.assertEqual(self.fleet.pd(self.p_port)["held_transfers"], 1)
        ok = self.decode(prompt, "xfer-a1", q["1"]["engine_id"])
        self.assertEqual(ok.status, 200, ok.body)
        self.assertEqual(ok.json()["usage"]["completion_tokens"], 4)
        self.assertEqual(self.fleet.pd(self.d_port)["transfers_completed"], before + 1)
        self.assertEqual(self.fleet.pd(self.p_port)["held_transfers"], 0)
        self.assertEqual(self.fleet.pd(self.p_port)["held_blocks"], 0)
        # A second pull of the same transfer id: nothing is held under it any more
        # (and no prefill comes: it waits out the bound, then fails).
        timed_out = self.fleet.pd(self.p_port)["pulls_timed_out"]
        again = self.decode(prompt, "xfer-a1", q["1"]["engine_id"])
        self.assertEqual(again.status, 400, again.body)
        self.assertEqual(again.json()["error"]["code"], "unknown_transfer")
        self.assertEqual(self.fleet.pd(self.p_port)["pulls_timed_out"], timed_out + 1)
        self.assertEqual(self.fleet.pd(self.p_port)["pulls_waiting"], 0)

    def test_a_pull_before_its_prefill_waits_for_it(self):
        """Concurrent legs (vLLM's proxy sends both at once): the decode side
        asks for a transfer its prefill has not made yet, and the prefill
        worker answers once the prefill holds it (send_kv_to_decode)."""
        prompt = "mooncake decode first. " + PROMPT
        q = self.query()
        waited = self.fleet.pd(self.p_port)["pulls_waited"]
        out = {}
        t = threading.Thread(target=lambda: out.update(d=self.decode(prompt, "xfer-c1", q["0"]["engine_id"])))
        t.start()
        self.assertTrue(wait_until(lambda: self.fleet.pd(self.p_port)["pulls_waiting"] == 1, 10))
        self.assertEqual(self.prefill(prompt, "xfer-c1").status, 200)
        t.join(30)
        self.assertEqual(out["d"].status, 200, out["d"].body)
        self.assertEqual(out["d"].json()["usage"]["completion_tokens"], 4)
        pd = self.fleet.pd(self.p_port)
        self.assertEqual((pd["pulls_waited"], pd["pulls_waiting"], pd["held_transfers"]), (waited + 1, 0, 0))

    def test_missing_keys_are_refused(self):
        prompt = "mooncake missing. " + PROMPT
        r = self.fleet.post("/v1/completions",
                            completion(prompt, 1, kv_transfer_params={"do_remote_decode": True}), port=self.p_port)
        self.assertEqual(r.status, 400, r.body)
        self.assertEqual(r.json()["error"]["code"], "missing")
        for drop in ("transfer_id", "remote_engine_id", "remote_bootstrap_addr"):
            params = {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "e",
                      "remote_bootstrap_addr": f"http://127.0.0.1:{self.p_boot}"}
            del params[drop]
            r = self.fleet.post("/v1/completions", completion(prompt, 4, kv_transfer_params=params), port=self.d_port)
            self.assertEqual(r.status, 400, (drop, r.body))
            self.assertEqual(r.json()["error"]["code"], "missing", drop)

    def test_decode_refused_before_its_pull_frees_the_transfer(self):
        prompt = "mooncake free. " + PROMPT
        q = self.query()
        self.assertEqual(self.prefill(prompt, "xfer-f1").status, 200)
        freed = self.fleet.pd(self.p_port)["transfers_freed"]
        # Another model: refused before the pull; the decode side frees the transfer (the empty pull).
        params = {"do_remote_decode": False, "do_remote_prefill": True, "transfer_id": "xfer-f1",
                  "remote_engine_id": q["0"]["engine_id"], "remote_bootstrap_addr": f"http://127.0.0.1:{self.p_boot}"}
        r = self.fleet.post("/v1/completions", {"model": "other", "prompt": prompt, "max_tokens": 4,
                                                "kv_transfer_params": params}, port=self.d_port)
        self.assertEqual(r.status, 404, r.body)
        self.assertTrue(wait_until(lambda: self.fleet.pd(self.p_port)["transfers_freed"] == freed + 1, 10))
        self.assertEqual(self.fleet.pd(self.p_port)["held_blocks"], 0)


class SglangPair:
    """An SGLang-mode pair: both legs carry the same bootstrap fields and meet in the room."""
    TIMEOUT_MS = 20000  # the rendezvous waits this long; generous for a loaded machine

    @classmethod
    def setUpClass(cls):
        t = str(cls.TIMEOUT_MS)

        def start(f):
            cls.p_port, cls.bootstrap = f.start_pd_mocker(
                "prefill", ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0",
                            "--disaggregation-bootstrap-timeout-ms", t, "--disaggregation-waiting-timeout-ms", t])
            cls.d_port, _ = f.start_pd_mocker(
                "decode", ["--disaggregation-mode", "decode", "--disaggregation-waiting-timeout-ms", t])
        PdFleet.for_class(cls, "kvroute-pd-sgl-", start)
        cls.next_room = 4611686018427387904

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()
        cls.tmp.cleanup()

    def room(self):
        type(self).next_room += 1
        return type(self).next_room

    def body(self, room, prompt=PROMPT, max_tokens=5):
        return completion(prompt, max_tokens, bootstrap_host="127.0.0.1", bootstrap_port=self.bootstrap,
                          bootstrap_room=room)

    def both_legs(self, room, decode_first, prompt=PROMPT):
        """Sends both legs concurrently (one of them first); returns (prefill, decode) responses."""
        out = {}

        def leg(name, port):
            out[name] = self.fleet.post("/v1/completions", self.body(room, prompt), port=port)

        first, second = (("d", self.d_port), ("p", self.p_port)) if decode_first else \
            (("p", self.p_port), ("d", self.d_port))
        t = threading.Thread(target=leg, args=first)
        t.start()
        time.sleep(0.05)  # ordering only; the rendezvous itself waits as long as needed
        leg(*second)
        t.join(30)
        return out["p"], out["d"]

class SglangTest(SglangPair, unittest.TestCase):
    def test_the_legs_meet_in_their_room_in_either_order(self):
        for decode_first in (False, True):
            with self.subTest(decode_first=decode_first):
                prompt = f"sglang room {decode_first}. " + PROMPT
                before_d, before_p = self.fleet.pd(self.d_port), self.fleet.pd(self.p_port)
                p, d = self.both_legs(self.room(), decode_first, prompt)
                self.assertEqual(p.status, 200, p.body)
                self.assertEqual(d.status, 200, d.body)
                self.assertEqual(p.json()["usage"]["completion_tokens"], 1)  # the prefill server's one token
                dj = d.json()
                self.assertEqual(dj["usage"]["completion_tokens"], 5)
                blocks = dj["usage"]["prompt_tokens"] // BLOCK
                self.assertEqual(dj["usage"]["prompt_tokens_details"]["cached_tokens"], blocks * BLOCK)
                after_d, after_p = self.fleet.pd(self.d_port), self.fleet.pd(self.p_port)
                self.assertEqual(after_d["transfers_completed"], before_d["transfers_completed"] + 1)
                self.assertEqual(after_d["rooms_completed"], before_d["rooms_completed"] + 1)
                self.assertEqual(after_d["blocks_pulled"] - before_d["blocks_pulled"], blocks)
                self.assertEqual(after_p["rooms_completed"], before_p["rooms_completed"] + 1)
                self.assertEqual(after_p["held_blocks"], 0)
                self.assertEqual(after_p["rooms_waiting"], 0)

    def test_blocks_the_decode_worker_caches_are_not_transferred(self):
        prompt = "sglang twice. " + PROMPT
        p, d = self.both_legs(self.room(), False, prompt)
        self.assertEqual((p.status, d.status), (200, 200))
        before = self.fleet.pd(self.d_port)
        p, d = self.both_legs(self.room(), False, prompt)
        self.assertEqual((p.status, d.status), (200, 200))
        after = self.fleet.pd(self.d_port)
        blocks = d.json()["usage"]["prompt_tokens"] // BLOCK
        self.assertEqual(after["blocks_local"] - before["blocks_local"], blocks)
        self.assertEqual(after["blocks_pulled"], before["blocks_pulled"])

    def test_a_second_prefill_leg_for_a_room_is_refused(self):
        room = self.room()
        first = {}
        t = threading.Thread(target=lambda: first.setdefault(
            "r", self.fleet.post("/v1/completions", self.body(room), port=self.p_port)))
        t.start()
        self.assertTrue(wait_until(lambda: self.fleet.pd(self.p_port)["rooms_waiting"] >= 1, 10))
        r = self.fleet.post("/v1/completions", self.body(room), port=self.p_port)
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["error"]["code"], "duplicate_room")
        d = self.fleet.post("/v1/completions", self.body(room), port=self.d_port)  # the first one completes
        t.join(30)
        self.assertEqual((first["r"].status, d.status), (200, 200))

    def test_a_prefill_leg_whose_client_leaves_closes_its_room(self):
        body = json.dumps(self.body(self.room())).encode()
        sock = socket.create_connection(("127.0.0.1", self.p_port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.assertTrue(wait_until(lambda: self.fleet.pd(self.p_port)["rooms_waiting"] == 1, 10))
        sock.close()
        # Well before the 20 s bootstrap timeout: the leg noticed its client leave.
        self.assertTrue(wait_until(lambda: self.fleet.pd(self.p_port)["rooms_waiting"] == 0, 10))
        self.assertEqual(self.fleet.pd(self.p_port)["held_blocks"], 0)

    def test_requests_without_a_room_and_hostile_fields_are_refused(self):
        for port in (self.p_port, self.d_port):
            r = self.fleet.post("/v1/completions", completion(), port=port)
            self.assertEqual(r.status, 400)
            self.assertIn("without bootstrap room id", r.json()["error"]["message"])
        cases = [({"bootstrap_room": -1}, "malformed"), ({"bootstrap_room": [1, 2]}, "malformed"),
                 ({"bootstrap_host": "decode.example.com"}, "bad_host"), ({"bootstrap_port": 0}, "malformed")]
        for fields, code in cases:
            with self.subTest(fields=fields):
                body = {**self.body(self.room()), **fields}
                r = self.fleet.post("/v1/completions", body, port=self.d_port)
                self.assertEqual(r.status, 400, r.body)
                self.assertEqual(r.json()["error"]["code"], code)

    def test_a_dead_bootstrap_server_fails_the_decode_leg(self):
        body = {**self.body(self.room()), "bootstrap_port": 1}
        r = self.fleet.post("/v1/completions", body, port=self.d_port)
        self.assertEqual(r.status, 500)
        self.assertEqual(r.json()["error"]["code"], "unreachable")
        self.assertIn("it might be dead", r.json()["error"]["message"])


class SglangTimeoutTest(SglangPair, unittest.TestCase):
    """Short timeouts (1.5 s): a leg whose other half never comes fails as SGLang's does."""
    TIMEOUT_MS = 1500

    def test_a_decode_leg_whose_room_never_fills_fails_as_sglang(self):
        before = self.fleet.pd(self.d_port)["rejected"].get("room_timeout", 0)
        t0 = time.time()
        r = self.fleet.post("/v1/completions", self.body(self.room()), port=self.d_port)
        self.assertEqual(r.status, 500, r.body)
        err = r.json()["error"]
        self.assertEqual(err["code"], "room_timeout")
        self.assertIn("KVPoll.WaitingForInput", err["message"])
        self.assertGreaterEqual(time.time() - t0, 1.4)  # the waiting timeout, 1.5 s
        self.assertEqual(self.fleet.pd(self.d_port)["rejected"]["room_timeout"], before + 1)
        self.assertTrue(wait_until(lambda: self.fleet.pd(self.p_port)["rooms_waiting"] == 0, 10))

    def test_a_prefill_leg_whose_decode_never_comes_fails_and_holds_nothing(self):
        r = self.fleet.post("/v1/completions", self.body(self.room()), port=self.p_port)
        self.assertEqual(r.status, 500, r.body)
        self.assertIn("KVPoll.Bootstrapping", r.json()["error"]["message"])
        pd = self.fleet.pd(self.p_port)
        self.assertEqual(pd["held_blocks"], 0)
        self.assertEqual(pd["rooms_waiting"], 0)


class SglangRoomReleaseTest(unittest.TestCase):
    def test_a_prefill_leg_refused_after_its_rendezvous_closes_its_room(self):
        # A prompt too large for the prefill worker's KV cache is refused at
        # admission, after the legs met: the room must close then (and the
        # decode leg fail at once), not stay open until the waiting timeout.
        with tempfile.TemporaryDirectory(prefix="kvroute-pd-room-release-") as tmp, PdFleet(BUILD_DIR, tmp) as fleet:
            p_port, bootstrap = fleet.start_pd_mocker(
                "prefill", ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0",
                            "--kv-blocks", "4", "--disaggregation-waiting-timeout-ms", "60000"])
            d_port, _ = fleet.start_pd_mocker(
                "decode", ["--disaggregation-mode", "decode", "--disaggregation-waiting-timeout-ms", "60000"])
            body = completion(bootstrap_host="127.0.0.1", bootstrap_port=bootstrap, bootstrap_room=77)
            out = {}
            t = threading.Thread(target=lambda: out.setdefault("d", fleet.post("/v1/completions", body, port=d_port)))
            t0 = time.time()
            t.start()
            self.assertTrue(wait_until(lambda: fleet.pd(p_port)["rooms_waiting"] == 1, 10))
            p = fleet.post("/v1/completions", body, port=p_port)
            self.assertEqual(p.status, 400, p.body)
            self.assertEqual(p.json()["error"]["code"], "context_length_exceeded")
            self.assertTrue(wait_until(lambda: fleet.pd(p_port)["rooms_waiting"] == 0, 10),
                            fleet.pd(p_port)["rooms_waiting"])
            t.join(30)
            self.assertFalse(t.is_alive())
            self.assertEqual(out["d"].status, 500, out["d"].body)
            self.assertLess(time.time() - t0, 30)  # well before the 60 s waiting timeout
            self.assertEqual(fleet.pd(p_port)["held_blocks"], 0)


class SglangRoomBoundTest(unittest.TestCase):
    def test_rooms_waiting_are_bounded(self):
        with tempfile.TemporaryDirectory(prefix="kvroute-pd-rooms-") as tmp, PdFleet(BUILD_DIR, tmp) as fleet:
            p_port, bootstrap = fleet.start_pd_mocker(
                "prefill", ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0",
                            "--pd-max-rooms", "1", "--disaggregation-bootstrap-timeout-ms", "3000"])
            body = completion(bootstrap_host="127.0.0.1", bootstrap_port=bootstrap)
            holder = threading.Thread(target=lambda: fleet.post("/v1/completions", {**body, "bootstrap_room": 1},
                                                                port=p_port))
            holder.start()
            self.assertTrue(wait_until(lambda: fleet.pd(p_port)["rooms_waiting"] == 1, 10))
            r = fleet.post("/v1/completions", {**body, "bootstrap_room": 2}, port=p_port)
            self.assertEqual(r.status, 503)
            self.assertEqual(r.json()["error"]["code"], "rooms_full")
            holder.join(30)
            self.assertEqual(fleet.pd(p_port)["rooms_waiting"], 0)


if __name__ == "__main__":
    run_unittest_main(globals())
