"""kvroute's claims equal the engine's own, against kvroute-mocker workers in
vLLM mode in each event mode: positional (array_like) and map encodings,
with and without `extra_keys` (vLLM before the field: no cache_salt on the
wire), and a worker with two data-parallel ranks (`dp_size: 2`).

- cached tokens follow the engines' rule: at most prompt length - 1, whole
  blocks (a fully cached block-aligned prompt of L tokens: L - block_size);
  x-kvroute-cached-tokens equals usage.prompt_tokens_details.cached_tokens;
- tenants (cache_salt) stay apart in every mode: 16 checks, 0 wrong; the
  workers whose events carry no salt are marked salt-blind; per-worker index
  entries sum to /admin/index's;
- a request routed for a rank-1 hit is sent to rank 1 (X-data-parallel-rank),
  whatever rank header the client sent;
- 200 mixed requests (token ids, strings, chat, LoRA, two salts,
  block-aligned prompts) with a local tokenizer on both sides: the header
  equals the engine's cached tokens for every one.

Run: python3 tests/integration/test_engine_exact.py --build-dir build
"""
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from fleet import FleetTestCase, run_unittest_main, wait_until  # noqa: E402

BUILD_DIR = "build"
BLOCK = 16
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "reference", "data", "models")

# worker id -> (mocker flags, extra config fields)
MODES = {
    1: ([], ""),                                          # positional, extra_keys
    2: (["--zmq-encoding", "map"], ""),                   # map, extra_keys
    3: (["--no-extra-keys"], ""),                         # positional, no extra_keys
    4: (["--zmq-encoding", "map", "--no-extra-keys"], ""),  # map, no extra_keys
    5: (["--data-parallel-size", "2"], ", dp_size: 2"),   # two ranks
}


def mocker_get(f, i, path):
    host, port = f.mocker_urls[i].split("//")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path)
    body = json.loads(conn.getresponse().read())
    conn.close()
    return body


def fleet_blocks(f):
    return sum(mocker_get(f, i, "/mocker/stats")["kv_cached_blocks"] for i in f.mocker_urls)


def index_entries(f):
    return f.admin("GET", "/admin/index").json()["entries"]


def per_worker_entries(f):
    return {w["worker_id"]: w["index_entries"] for w in f.admin("GET", "/admin/status").json()["workers"]}


def synced(f, timeout=10):
    """Polls until the router's index holds, worker by worker, exactly the blocks each worker caches."""
    def same():
        have = per_worker_entries(f)
        return all(have.get(i) == mocker_get(f, i, "/mocker/stats")["kv_cached_blocks"] for i in f.mocker_urls)
    return wait_until(same, timeout, step=0.03)


def send(f, body, kind="completions", headers=None):
    r = f.post(f"/v1/{kind}", body, headers=headers)
    assert r.status == 200, (r.status, r.body[:300])
    return (int(r.header("x-kvroute-worker")), int(r.header("x-kvroute-cached-tokens")),
            r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def pin(f, worker):
    """Drains every worker but `worker`: the next requests can only go there."""
    for i in f.mocker_urls:
        f.admin("POST", f"/admin/workers/{i}/{'undrain' if i == worker else 'drain'}")


def unpin(f):
    for i in f.mocker_urls:
        f.admin("POST", f"/admin/workers/{i}/undrain")


def config(endpoints, extra_fields, lora=""):
    lines = ["workers:", "  scrape_interval_ms: 100", "  static:"]
    for i, (url, kv, replay) in sorted(endpoints.items()):
        lines.append(f"    - {{id: {i}, url: \"{url}\", model: mock-model, kv_events: \"{kv}\", replay: \"{replay}\""
                     f"{extra_fields.get(i, '')}{lora}}}")
    return "\n".join(lines) + "\n"


class EventModes(FleetTestCase):
    """Five vLLM-mode workers, one per event mode; the placeholder tokenizer, prompts as token ids."""
    tmp_prefix = "kvroute-exact-"
    fleet_options = {"block_size": BLOCK, "speedup": 20.0}

    @classmethod
    def start(cls, f):
        endpoints = {}
        for i, (flags, _) in MODES.items():
            endpoints[i] = f.start_vllm_mocker(i, extra=flags)
        f.start_router_config(config(endpoints, {i: x for i, (_, x) in MODES.items()}))
        f.wait_ready(len(MODES))

    def tearDown(self):
        unpin(self.f)

    def test_1_cached_tokens_follow_the_engine_rule(self):
        f = self.f
        wrong = []
        for w in MODES:
            pin(f, w)
            for length, want in ((4 * BLOCK, 3 * BLOCK), (4 * BLOCK + 6, 4 * BLOCK), (BLOCK, 0), (BLOCK + 1, BLOCK)):
                ids = [1000 * w + length * 7 + k for k in range(length)]
                body = {"model": "mock-model", "prompt": ids, "max_tokens": 2}
                first = send(f, body)
                self.assertEqual(first[0], w)
                self.assertTrue(synced(f), "index never caught up with the workers")
                got = send(f, body)
                print(f"worker {w} prompt {length}: header {got[1]} engine {got[2]} (rule: {want})")
                if got[1] != got[2] or got[2] != want:
                    wrong.append((w, length, got))
            # prompt_logprobs: vLLM does not read its prefix cache for it; nothing is claimed.
            ids = [1000 * w + 4 * BLOCK * 7 + k for k in range(4 * BLOCK)]
            got = send(f, {"model": "mock-model", "prompt": ids, "max_tokens": 2, "prompt_logprobs": 1})
            print(f"worker {w} prompt_logprobs: header {got[1]} engine {got[2]}")
            if got[1] != got[2] or got[2] != 0:
                wrong.append((w, "prompt_logprobs", got))
        print(f"cached-token claims wrong: {len(wrong)} of {5 * len(MODES)}: {wrong}")
        self.assertEqual(wrong, [])

    def test_2_tenants_apart_in_every_event_mode(self):
        f = self.f
        checks = wrong = 0
        for w in (1, 2, 3, 4):
            pin(f, w)
            ids = [5000 + 100 * w + k for k in range(5 * BLOCK + 3)]

            def ask(salt):
                body = {"model": "mock-model", "prompt": ids, "max_tokens": 2}
                if salt:
                    body["cache_salt"] = salt
                got = send(f, body)
                synced(f)  # asserted below, after the checks
                return got

            ask("tenant-a")  # cold
            for salt in (None, "tenant-b", "tenant-a", "tenant-b"):
                _, header, engine = ask(salt)
                checks += 1
                ok = header == engine
                wrong += not ok
                print(f"worker {w} salt {salt}: header {header} engine {engine}{'' if ok else '  WRONG'}")
        print(f"tenant checks: {checks}, wrong: {wrong}")
        self.assertEqual(checks, 16)
        self.assertEqual(wrong, 0)
        # The workers whose events carry no salt are salt-blind, the others not.
        workers = {w["worker_id"]: w for w in f.admin("GET", "/admin/status").json()["workers"]}
        self.assertEqual(sorted(w for w, v in workers.items() if v["salt_blind"]), [3, 4])
        self.assertEqual(f.metric("kvroute_events_salt_blind_workers"), 2)
        self.assertGreater(f.metric('kvroute_events_salt_roots_total{how="attributed"}'), 0)
        explain = f.admin("POST", "/admin/route/explain",
                          json.dumps({"model": "mock-model", "prompt": [1, 2, 3]})).json()
        self.assertEqual(sorted(explain["salt_blind_workers"]), [3, 4])
        # The index equals the workers' caches, and its per-worker entries sum to its own count.
        self.assertTrue(synced(f))
        self.assertEqual(index_entries(f), fleet_blocks(f))
        self.assertEqual(sum(per_worker_entries(f).values()), index_entries(f))

    def test_3_rank_one_hit_goes_to_rank_one(self):
        f = self.f
        pin(f, 5)
        ids = [9000 + k for k in range(6 * BLOCK)]
        body = {"model": "mock-model", "prompt": ids, "max_tokens": 2}
        # Put the prompt into rank 1's cache, behind the router's back.
        port = f.mocker_port(5)
        r = f.request("POST", "/v1/completions", body, port=port, headers={"X-data-parallel-rank": "1"})
        self.assertEqual(r.status, 200)
        self.assertTrue(synced(f))
        before = mocker_get(f, 5, "/mocker/stats")
        for client_rank in (None, "0"):  # a client's own rank header does not override the routing
            w, header, engine = send(f, body, headers={"X-data-parallel-rank": client_rank} if client_rank else None)
            print(f"dp worker: client rank {client_rank}: header {header} engine {engine}")
            self.assertEqual(w, 5)
            self.assertEqual(engine, header, "the request did not reach the rank holding its prefix")
            self.assertEqual(header, 5 * BLOCK)
        after = mocker_get(f, 5, "/mocker/stats")
        self.assertEqual(after["ranks"][1]["requests"] - before["ranks"][1]["requests"], 2)
        self.assertEqual(after["ranks"][0]["requests"], before["ranks"][0]["requests"])
        self.assertEqual(after["steered_total"] - before["steered_total"], 2)
        # A prompt no rank holds names no rank: the engine's own balancer picks.
        self.assertEqual(send(f, {"model": "mock-model", "prompt": [77000 + k for k in range(40)], "max_tokens": 1})[1],
                         0)
        self.assertEqual(mocker_get(f, 5, "/mocker/stats")["steered_total"], after["steered_total"])


class SmallCacheAffinity(FleetTestCase):
    """A worker with a small KV cache keeps the prompt it holds: the usage it
    reported while that prompt's request ran is not held against it once the
    request is over (worker 1: 40 blocks, worker 2: 4,000; real time)."""
    tmp_prefix = "kvroute-small-"
    fleet_options = {"block_size": BLOCK, "speedup": 1.0}

    @classmethod
    def start(cls, f):
        endpoints = {}
        endpoints[1] = f.start_vllm_mocker(1, extra=["--kv-blocks", "40"])
        endpoints[2] = f.start_vllm_mocker(2, extra=["--kv-blocks", "4000"])
        f.start_router_config(config(endpoints, {}).replace("scrape_interval_ms: 100", "scrape_interval_ms: 500"))
        f.wait_ready(2)

    def test_small_cache_worker_keeps_affinity(self):
        f = self.f
        kept = 0
        for trial in range(6):
            ids = [20000 + 1000 * trial + k for k in range(30 * BLOCK)]  # 30 of the small worker's 40 blocks
            pin(f, 1)
            # Long enough (100 tokens, real time) for scrapes to see it running.
            self.assertEqual(send(f, {"model": "mock-model", "prompt": ids, "max_tokens": 100})[0], 1)
            unpin(f)
            w, header, engine = send(f, {"model": "mock-model", "prompt": ids, "max_tokens": 1})
            print(f"trial {trial}: worker {w}, header {header}, engine {engine}")
            kept += w == 1
            synced(f)
        print(f"affinity kept in {kept} of 6 trials")
        self.assertEqual(kept, 6)


    def test_small_cache_worker_reports_its_evictions(self):
        f = self.f
        pin(f, 1)
        try:
            # Three 30-block prompts on a 40-block cache: each pushes the one before out.
            for k in range(3):
                ids = [90000 + 1000 * k + i for i in range(30 * BLOCK)]
                self.assertEqual(send(f, {"model": "mock-model", "prompt": ids, "max_tokens": 1})[0], 1)
        finally:
            unpin(f)

        def evicted():
            return {w["worker_id"]: w["evicted_blocks"] for w in f.admin("GET", "/admin/workers").json()}
        # The worker's removal events (vLLM's BlockRemoved over ZMQ) reach the registry, never the other's.
        self.assertTrue(wait_until(lambda: evicted()[1] >= 20, 10), evicted())
        self.assertEqual(evicted()[2], 0)
        self.assertGreater(f.metric('kvroute_scheduler_worker_evicted_blocks{worker="1"}'), 0)
        # A new prompt is priced for them on worker 1 only.
        explain = f.admin("POST", "/admin/route/explain",
                          json.dumps({"model": "mock-model", "prompt": list(range(70000, 70000 + 4 * BLOCK))})).json()
        shares = {c["worker_id"]: c["terms"]["eviction_share"] for c in explain["workers"]}
        self.assertGreater(shares[1], 0.4)
        self.assertEqual(shares[2], 0)


class Operations(FleetTestCase):
    """Reloads, states and messages an operator meets (two vLLM-mode workers, LoRA on both)."""
    tmp_prefix = "kvroute-ops-"
    fleet_options = {"block_size": BLOCK, "speedup": 20.0}

    @classmethod
    def start(cls, f):
        endpoints = {}
        for i in (1, 2):
            endpoints[i] = f.start_vllm_mocker(i, extra=["--lora-modules", "lora-a"])
        f.start_router_config(
            config(endpoints, {}, lora=", lora: [lora-a]").replace("scrape_interval_ms: 100",
                                                                   "scrape_interval_ms: 20000"),
            extra=["--events.worker_ttl_ms", "600000", "--workers.eject_after_failures", "1000",
                   "--workers.scrape_timeout_ms", "100", "--router.first_byte_timeout_ms", "400",
                   "--router.first_byte_timeout_min_ms", "400"])
        f.wait_ready(2)

    def load_ages(self):
        return [w["load_age_ms"] for w in self.f.admin("GET", "/admin/workers").json()]

    def test_1_no_nats_line_without_nats(self):
        # The line follows the listeners' start, so /ready may answer before it is written.
        def log_text():
            with open(os.path.join(self.tmp.name, "kvroute.log")) as log:
                return log.read()
        self.assertTrue(wait_until(lambda: "no NATS" in log_text(), 10), log_text())
        self.assertNotIn("nats (none)", log_text())

    def test_2_reloaded_scrape_interval_applies_at_once(self):
        f = self.f
        # Scraped at start, then every 20 s: the load report ages.
        self.assertTrue(wait_until(lambda: min(self.load_ages()) > 1500, 10))
        r = f.admin("PUT", "/admin/config", json.dumps({"workers": {"scrape_interval_ms": 100}}))
        self.assertEqual(r.status, 200, r.body)
        # The 20 s wait is not served out: fresh reports within a second or two.
        self.assertTrue(wait_until(lambda: max(self.load_ages()) < 500, 3), self.load_ages())

    def test_3_scraped_worker_stale_after_missed_scrapes(self):
        f = self.f
        f.admin("PUT", "/admin/config", json.dumps({"workers": {"scrape_interval_ms": 100}}))
        proc = f.procs["mocker-2"]
        proc.send_signal(signal.SIGSTOP)  # its scrapes time out (not refused): late load, not down
        try:
            def state():
                return {w["worker_id"]: w["state"] for w in f.admin("GET", "/admin/status").json()["workers"]}[2]
            # Three 100 ms intervals, not half of the 600 s heartbeat TTL.
            self.assertTrue(wait_until(lambda: state() == "stale", 5), state())
        finally:
            proc.send_signal(signal.SIGCONT)
        self.assertTrue(wait_until(lambda: {w["worker_id"]: w["state"] for w in
                                            f.admin("GET", "/admin/status").json()["workers"]}[2] == "ok", 10))

    def test_5_access_log_ttfb_counts_failed_over_attempts(self):
        f = self.f
        ids = [31000 + k for k in range(8 * BLOCK)]
        body = {"model": "mock-model", "prompt": ids, "max_tokens": 1}
        pin(f, 1)
        self.assertEqual(send(f, body)[0], 1)  # worker 1 holds the prompt: it is tried first
        unpin(f)
        self.assertTrue(synced(f))
        f.mocker(1, "POST", "/mocker/hang", {"enabled": True})
        try:
            w, _, _ = send(f, body)  # worker 1 misses the 400 ms first-byte timeout: worker 2 answers
        finally:
            f.mocker(1, "POST", "/mocker/hang", {"enabled": False})
        self.assertEqual(w, 2)
        log = os.path.join(self.tmp.name, "kvroute.log")
        line = wait_until(lambda: [x for x in open(log).read().splitlines() if " access " in x and "attempts=2" in x],
                          5)[-1]
        ttfb, duration = (float(re.search(rf"{k}=([0-9.]+)", line).group(1)) for k in ("ttfb_ms", "duration_ms"))
        print(f"failed-over request: ttfb_ms {ttfb}, duration_ms {duration}")
        self.assertGreaterEqual(ttfb, 400)  # the first attempt's wait is the client's too
        self.assertLessEqual(ttfb, duration)

    def test_6_engine_of_another_block_size_is_said_in_the_log(self):
        f = self.f
        f.block_size = 2 * BLOCK  # this engine runs blocks twice the router's indexer.block_size
        try:
            url, kv, replay = f.start_vllm_mocker(9)
        finally:
            f.block_size = BLOCK
        r = f.admin("POST", "/admin/workers",
                    f'{{"id": 9, "url": "{url}", "model": "mock-model", "kv_events": "{kv}", "replay": "{replay}"}}')
        self.assertEqual(r.status, 201, r.body)
        try:
            # Blocks stored on the engine itself: its events reach the router and are skipped.
            body = {"model": "mock-model", "prompt": [41000 + k for k in range(8 * BLOCK)], "max_tokens": 1}
            self.assertEqual(f.request("POST", "/v1/completions", body, port=f.mocker_port(9)).status, 200)
            def log_text():
                with open(os.path.join(self.tmp.name, "kvroute.log")) as log:
                    return log.read()
            scraped = f"worker 9: its /metrics give block_size {2 * BLOCK} but indexer.block_size is {BLOCK}"
            skipped = f"KV events skipped: block_size {2 * BLOCK}, not indexer.block_size {BLOCK}"
            self.assertTrue(wait_until(lambda: scraped in log_text() and skipped in log_text(), 10), log_text()[-3000:])
            self.assertGreater(f.metric('kvroute_events_zmq_skipped_total{reason="block_size_mismatch"}'), 0)
        finally:
            self.assertEqual(f.admin("DELETE", "/admin/workers/9").status, 200)

    def test_4_lora_whose_workers_are_drained_says_so(self):
        f = self.f
        for i in (1, 2):
            f.admin("POST", f"/admin/workers/{i}/drain")
        try:
            r = f.post("/v1/completions", {"model": "lora-a", "prompt": "hello there", "max_tokens": 1})
            self.assertEqual(r.status, 503)
            err = r.json()["error"]
            self.assertIn("drained", err["message"])
            self.assertIn("lora-a", err["message"])
            self.assertNotIn("capacity", err["message"])
        finally:
            for i in (1, 2):
                f.admin("POST", f"/admin/workers/{i}/undrain")


def ensure_reference():
    if not os.path.exists(os.path.join(MODELS, "qwen3", ".done")):
        subprocess.run(["bash", os.path.join(ROOT, "tests", "tokenizer", "setup_reference.sh")], check=True)


class MixedTraffic(FleetTestCase):
    """Three workers (positional, map, map without extra_keys), the qwen3 tokenizer on both sides, a LoRA."""
    tmp_prefix = "kvroute-mixed-"
    fleet_options = {"block_size": BLOCK, "speedup": 50.0}

    @classmethod
    def start(cls, f):
        ensure_reference()
        qwen = os.path.join(MODELS, "qwen3")
        endpoints = {}
        modes = {1: [], 2: ["--zmq-encoding", "map"], 3: ["--zmq-encoding", "map", "--no-extra-keys"]}
        for i, flags in modes.items():
            endpoints[i] = f.start_vllm_mocker(
                i, extra=[*flags, "--tokenizer", qwen, "--lora-modules", "lora-a"])
        f.start_router_config(config(endpoints, {}, lora=", lora: [lora-a]"),
                                  extra=["--tokenizer.models", f"mock-model={qwen},lora-a={qwen}"])
        f.wait_ready(3)

    def test_200_mixed_requests_claim_what_the_engine_serves(self):
        f = self.f
        rng = random.Random(23)
        systems = [("You are a careful assistant for the depot team. Cite the depot code and never invent "
                    "a shipment number. ") * k for k in (3, 5, 8)]
        questions = [f"Where is shipment {n} headed, and when does it arrive?" for n in range(12)]
        mismatches, hits, kinds = [], 0, {}
        for n in range(200):
            model = "lora-a" if rng.random() < 0.2 else "mock-model"
            salt = rng.choice([None, None, "tenant-a", "tenant-b"])
            kind = rng.choice(["ids", "aligned", "text", "chat", "chat"])
            system, question = rng.choice(systems), rng.choice(questions)
            body = {"model": model, "max_tokens": 2}
            if kind == "ids":
                body["prompt"] = [(7 * k + len(system)) % 5000 for k in range(rng.choice([40, 90, 150]))]
            elif kind == "aligned":
                body["prompt"] = [(11 * k + len(system)) % 5000 for k in range(BLOCK * rng.choice([3, 6, 9]))]
            elif kind == "text":
                body["prompt"] = system + question
            else:
                body["messages"] = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            if salt:
                body["cache_salt"] = salt
            _, header, engine = send(f, body, "chat/completions" if kind == "chat" else "completions")
            kinds[kind] = kinds.get(kind, 0) + 1
            hits += engine > 0
            if header != engine:
                mismatches.append((n, kind, model, salt, header, engine))
            self.assertTrue(synced(f), "index never caught up with the workers")
        print(f"mixed requests: 200 {kinds}, engine cache hits {hits}, mismatches {len(mismatches)}: {mismatches[:10]}")
        self.assertGreater(hits, 50)  # the prompts share prefixes: the comparison is not about zeros
        self.assertEqual(len(mismatches), 0)


if __name__ == "__main__":
    run_unittest_main(globals())
