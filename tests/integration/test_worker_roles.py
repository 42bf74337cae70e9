#!/usr/bin/env python3
"""Worker roles (both | prefill | decode) and SGLang bootstrap ports from the
router-known worker sources, shown where an operator looks: /admin/workers,
route explain (with the disaggregated decision's terms, and the decode gate's
and the prediction rule's once their pd.* keys are on), the status JSON and
the kvroute_fleet_role_workers gauge.

No NATS: vLLM-mode mockers as workers.static entries, one more added through
POST /admin/workers. (Heartbeat roles are pinned by tests/events/wire_test.cpp.)
"""
import json
import re
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet import Fleet, run_unittest_main, wait_until  # noqa: E402

BUILD_DIR = "build"


class WorkerRolesTest(unittest.TestCase):
    def test_roles_from_static_and_admin_are_shown_everywhere(self):
        with tempfile.TemporaryDirectory() as tmp, Fleet(BUILD_DIR, tmp) as f:
            entries = []
            roles = {1: None, 2: "prefill", 3: "decode"}
            for i, role in roles.items():
                url, kv, replay = f.start_vllm_mocker(i)
                extra = f", role: {role}" if role else ""
                if role == "prefill":
                    extra += ", bootstrap_port: 9001"
                entries.append(f'    - {{id: {i}, url: "{url}", model: mock-model, kv_events: "{kv}", '
                               f'replay: "{replay}"{extra}}}')
            f.start_router_config("workers:\n  scrape_interval_ms: 100\n  static:\n" + "\n".join(entries) + "\n")
            f.wait_ready(3)
            url4, _, _ = f.start_vllm_mocker(4)
            r = f.admin("POST", "/admin/workers",
                        json.dumps({"id": 4, "url": url4, "model": "mock-model", "role": "decode"}))
            self.assertIn(r.status, (200, 201), r.body)
            f.wait_ready(4)

            workers = {int(w["worker_id"]): w for w in f.admin("GET", "/admin/workers").json()}
            self.assertEqual({i: w["role"] for i, w in workers.items()},
                             {1: "both", 2: "prefill", 3: "decode", 4: "decode"})
            self.assertEqual(workers[2]["bootstrap_port"], 9001)
            self.assertEqual(workers[1]["bootstrap_port"], 8998)

            # A bad role through the admin API is refused, naming the field; nothing is added.
            r = f.admin("POST", "/admin/workers", json.dumps({"id": 5, "url": "http://127.0.0.1:1", "model": "m",
                                                              "role": "leader"}))
            self.assertEqual(r.status, 400, r.body)
            self.assertIn(b"role", r.body)
            self.assertNotIn(5, [int(w["worker_id"]) for w in f.admin("GET", "/admin/workers").json()])

            self.assertTrue(wait_until(lambda: f.metric('kvroute_fleet_role_workers{role="decode"}') == 2, 10))
            self.assertEqual(f.metric('kvroute_fleet_role_workers{role="prefill"}'), 1)
            self.assertEqual(f.metric('kvroute_fleet_role_workers{role="both"}'), 1)

            status = f.admin("GET", "/admin/status").json()
            self.assertEqual({int(w["worker_id"]): w["role"] for w in status["workers"]},
                             {1: "both", 2: "prefill", 3: "decode", 4: "decode"})

            body = json.dumps({"model": "mock-model", "prompt": "roles " * 40, "max_tokens": 1})
            ex = f.admin("POST", "/admin/route/explain", body).json()
            self.assertEqual({int(w["worker_id"]): w["role"] for w in ex["workers"]},
                             {1: "both", 2: "prefill", 3: "decode", 4: "decode"})
            # The disaggregated decision's terms: prefill workers priced, never decoding.
            pd = ex["pd"]
            self.assertEqual([int(w["worker_id"]) for w in pd["prefill_workers"]], [2])
            self.assertEqual(sorted(int(w["worker_id"]) for w in pd["decode_workers"]), [1, 3, 4])
            self.assertIn(int(pd["decode"]), (1, 3, 4))
            self.assertGreater(pd["prefill_workers"][0]["predicted_ttft_ms"], 0)
            self.assertEqual(pd["policy"], "conditional")
            if int(pd["decode"]) == 1:
                self.assertEqual(pd["reason"], "aggregated_worker")
            else:  # a 240-token prompt nobody holds: fewer uncached tokens than the default 512
                self.assertEqual(pd["reason"], "few_uncached_tokens")
            self.assertFalse(pd["disaggregate"])

    def test_explain_shows_decode_gate_and_predictions_when_configured(self):
        # One prefill and one decode worker, every prompt worth splitting
        # (min_uncached_tokens 0), the decode gate and the prediction rule on.
        with tempfile.TemporaryDirectory() as tmp, Fleet(BUILD_DIR, tmp) as f:
            entries = []
            for i, role in ((2, "prefill"), (3, "decode")):
                url, kv, replay = f.start_vllm_mocker(i)
                entries.append(f'    - {{id: {i}, url: "{url}", model: mock-model, kv_events: "{kv}", '
                               f'replay: "{replay}", role: {role}}}')
            f.start_router_config("workers:\n  scrape_interval_ms: 100\n  static:\n" + "\n".join(entries) + "\n"
                                  "pd:\n  min_uncached_tokens: 0\n  decode_busy_kv_usage: 0.75\n"
                                  "  aggregate_time_ratio: 0.5\n  transfer_ms_per_1k_tokens: 1000\n"
                                  "  decode_alpha: 0.6\n")
            f.wait_ready(2)
            body = json.dumps({"model": "mock-model", "prompt": "gate " * 40, "max_tokens": 1})

            def explain():
                return f.admin("POST", "/admin/route/explain", body).json()["pd"]

            # The KV total comes with the worker's first load report (scraped
            # every 100 ms), which may follow readiness: until then the usage is null.
            self.assertTrue(wait_until(lambda: explain()["decode_kv_usage"] is not None, 10))
            pd = explain()
            self.assertEqual(int(pd["decode"]), 3)
            self.assertEqual(pd["decode_alpha"], 0.6)  # the decode side's own alpha
            self.assertEqual([int(w["worker_id"]) for w in pd["prefill_workers"]], [2])
            self.assertEqual((pd["decode_busy_kv_usage"], pd["aggregate_time_ratio"], pd["transfer_ms_per_1k_tokens"]),
                             (0.75, 0.5, 1000))
            # The mocker reports its KV total: the usage with the request's blocks is known, and small.
            self.assertGreater(pd["decode_kv_usage"], 0)
            self.assertLess(pd["decode_kv_usage"], 0.75)
            self.assertFalse(pd["decode_busy"])
            # The prediction: the transfer of what the decode worker lacks at
            # 1000 ms per 1k tokens, added to the prefill worker's TTFT.
            uncached = pd["decode_uncached_tokens"]
            self.assertGreater(uncached, 0)
            self.assertAlmostEqual(pd["transfer_ms"], uncached * 1000 / 1000)
            self.assertAlmostEqual(pd["predicted_split_ms"],
                                   pd["prefill_workers"][0]["predicted_ttft_ms"] + pd["transfer_ms"])
            self.assertGreater(pd["predicted_aggregated_ms"], 0)
            faster = pd["predicted_aggregated_ms"] <= 0.5 * pd["predicted_split_ms"]
            self.assertEqual(pd["reason"], "aggregated_faster" if faster else "disaggregated")

            # A gate below any real usage: the decode worker is busy, never runs it whole; split instead.
            self.assertEqual(f.admin("PUT", "/admin/config", "pd:\n  decode_busy_kv_usage: 0.000000001\n").status, 200)
            self.assertTrue(wait_until(lambda: explain()["decode_busy_kv_usage"] == 1e-9, 10))
            pd = explain()
            self.assertTrue(pd["decode_busy"])
            self.assertGreater(pd["decode_kv_usage"], 1e-9)
            self.assertEqual((pd["reason"], pd["disaggregate"], int(pd["prefill"])), ("disaggregated", True, 2))
            self.assertGreater(pd["predicted_split_ms"], pd["transfer_ms"])

            # pd.decode_alpha back to -1 (reloaded): the decode side takes the scheduler's alpha.
            self.assertEqual(f.admin("PUT", "/admin/config", "pd:\n  decode_alpha: -1\n").status, 200)
            self.assertTrue(wait_until(lambda: explain()["decode_alpha"] != 0.6, 10))
            text = f.admin("GET", "/admin/config").body.decode()
            alphas = {float(re.search(rf"\n  {k}: ([0-9.e-]+)", text).group(1))
                      for k in ("alpha_balanced", "alpha_imbalanced")}
            self.assertIn(explain()["decode_alpha"], alphas)

            # The rule off: no predicted times (they would mean nothing).
            self.assertEqual(f.admin("PUT", "/admin/config", "pd:\n  aggregate_time_ratio: 0\n").status, 200)
            self.assertTrue(wait_until(lambda: "aggregate_time_ratio" not in explain(), 10))
            pd = explain()
            for key in ("predicted_aggregated_ms", "predicted_split_ms", "transfer_ms", "transfer_ms_per_1k_tokens"):
                self.assertNotIn(key, pd)
            self.assertTrue(pd["decode_busy"])

if __name__ == "__main__":
    run_unittest_main(globals())
