"""Strings and chat routed exactly without a local tokenizer: kvroute asks the
engine's own POST /tokenize (tokenizer.remote: auto, the default).

Fleet: three kvroute-mocker workers in vLLM mode serving `qwen3` with Qwen3's
real tokenizer and chat template (--tokenizer) and a LoRA adapter
`qwen3-support` (--lora-modules), plus a fourth serving `qwen3-dead` whose
/tokenize a test hook breaks; kvroute configured only as the README's
"Connect vLLM" says (workers.static with url, model, kv_events, replay, lora;
no tokenizer.models, no NATS).

Each test asserts what a client sees: requests sharing a prefix land on the
worker caching it, and x-kvroute-cached-tokens equals the worker's own
usage.prompt_tokens_details.cached_tokens (> 0); a failing /tokenize is
answered (the request is served) and counted and logged, never silent.

Needs the reference tokenizers (tests/tokenizer/setup_reference.sh, npm, run
here if missing).

Run: python3 tests/integration/test_engine_tokenize.py --build-dir build
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from fleet import Fleet, run_unittest_main, wait_until  # noqa: E402

BUILD_DIR = "build"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "reference", "data", "models")
BLOCK = 16
SYSTEM = ("You are the dispatch assistant of a regional courier. Quote the depot code, keep answers short, "
          "and never invent a tracking number. ") * 10  # ~250 tokens: many 16-token blocks


def ensure_reference():
    if not os.path.exists(os.path.join(MODELS, "qwen3", ".done")):
        subprocess.run(["bash", os.path.join(ROOT, "tests", "tokenizer", "setup_reference.sh")], check=True)


class EngineTokenizeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ensure_reference()
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvroute-enginetok-")
        qwen = os.path.join(MODELS, "qwen3")
        f = Fleet(BUILD_DIR, cls.tmp.name, block_size=BLOCK, speedup=50.0)
        cls.f = f
        try:
            lines = ["workers:", "  scrape_interval_ms: 100", "  static:"]
            for i in (1, 2, 3):
                url, kv, replay = f.start_vllm_mocker(
                    i, extra=["--model", "qwen3", "--tokenizer", qwen, "--lora-modules", "qwen3-support"])
                lines.append(f'    - {{id: {i}, url: "{url}", model: qwen3, kv_events: "{kv}", replay: "{replay}", '
                             f'lora: [qwen3-support]}}')
            url, kv, replay = f.start_vllm_mocker(4, extra=["--model", "qwen3-dead", "--tokenizer", qwen])
            lines.append(f'    - {{id: 4, url: "{url}", model: qwen3-dead, kv_events: "{kv}", replay: "{replay}"}}')
            f.start_router_config("\n".join(lines) + "\n")
            f.wait_ready(4)
        except Exception:
            f.close()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.f.close()
        cls.tmp.cleanup()

    # -- helpers -------------------------------------------------------------
    def stats(self, i):
        return self.f.mocker(i, "GET", "/mocker/stats").json()

    def index_caught_up(self):
        """The router's index holds exactly the workers' cached blocks."""
        total = sum(self.stats(i)["kv_cached_blocks"] for i in (1, 2, 3, 4))
        return self.f.admin("GET", "/admin/index").json()["entries"] == total

    def send(self, path, body):
        r = self.f.post(path, body)
        self.assertEqual(r.status, 200, r.body[:300])
        usage = r.json()["usage"]
        return (r.header("x-kvroute-worker"), int(r.header("x-kvroute-cached-tokens")),
                usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"])

    def assert_prefix_shared(self, path, bodies):
        """The first body warms one worker; each later one (same prefix, other tail) goes there, and the
        router's cached-token claim is the worker's own count."""
        first, _, _, _ = self.send(path, bodies[0])
        self.assertTrue(wait_until(self.index_caught_up, 10), "the index never caught up with the workers")
        for body in bodies[1:]:
            worker, claimed, engine_cached, prompt_tokens = self.send(path, body)
            self.assertEqual(worker, first, "a request sharing the prefix left the worker caching it")
            self.assertGreater(engine_cached, 0)
            self.assertEqual(claimed, engine_cached, "x-kvroute-cached-tokens differs from the engine's")
            self.assertLess(engine_cached, prompt_tokens)
            self.assertTrue(wait_until(self.index_caught_up, 10))

    def metric(self, name):
        return self.f.metric(name)

    # -- tests ---------------------------------------------------------------
    def test_string_prompts_sharing_a_prefix(self):
        before = self.metric('kvroute_router_tokenized_requests_total{model="qwen3",source="engine"}')
        shared = SYSTEM + uuid.uuid4().hex + " Question: "
        bodies = [{"model": "qwen3", "prompt": shared + f"where is parcel {i}?", "max_tokens": 2} for i in range(4)]
        self.assert_prefix_shared("/v1/completions", bodies)
        self.assertEqual(self.metric('kvroute_router_tokenized_requests_total{model="qwen3",source="engine"}'),
                         before + 4)
        self.assertEqual(self.metric('kvroute_router_tokenizer_fallbacks_total{model="qwen3",reason="engine_error"}'),
                         0)

    def test_chat_prompts_sharing_a_prefix(self):
        system = SYSTEM + uuid.uuid4().hex
        bodies = [{"model": "qwen3", "max_tokens": 2,
                   "messages": [{"role": "system", "content": system},
                                {"role": "user", "content": f"Where is parcel {i}? Answer in one line."}]}
                  for i in range(4)]
        self.assert_prefix_shared("/v1/chat/completions", bodies)

    def test_lora_string_prompts_sharing_a_prefix(self):
        shared = SYSTEM + uuid.uuid4().hex + " Ticket: "
        bodies = [{"model": "qwen3-support", "prompt": shared + f"refund request {i}", "max_tokens": 2}
                  for i in range(3)]
        self.assert_prefix_shared("/v1/completions", bodies)
        self.assertGreaterEqual(
            self.metric('kvroute_router_tokenized_requests_total{model="qwen3-support",source="engine"}'), 3)

    def test_repeated_prompt_is_answered_from_the_cache(self):
        body = {"model": "qwen3", "prompt": SYSTEM + uuid.uuid4().hex, "max_tokens": 2}
        calls = lambda: sum(self.stats(i)["tokenize_total"] for i in (1, 2, 3))  # noqa: E731
        hits = self.metric('kvroute_router_engine_tokenize_cache_total{result="hit"}')
        self.send("/v1/completions", body)
        asked = calls()
        for _ in range(3):
            self.send("/v1/completions", body)
        self.assertEqual(calls(), asked, "a repeated prompt asked the engine again")
        self.assertEqual(self.metric('kvroute_router_engine_tokenize_cache_total{result="hit"}'), hits + 3)
        # Never a prefix: the same prompt and more is a new question for the engine.
        self.send("/v1/completions", dict(body, prompt=body["prompt"] + " and more"))
        self.assertEqual(calls(), asked + 1)

    def test_too_large_answer_is_refused(self):
        f = self.f
        too_large = 'kvroute_router_engine_tokenize_total{result="too_large"}'
        fallback = 'kvroute_router_tokenizer_fallbacks_total{model="qwen3-dead",reason="engine_error"}'
        self.assertEqual(f.mocker(4, "POST", "/mocker/tokenize", {"mode": "ok"}).status, 200)
        self.assertEqual(f.admin("PUT", "/admin/config", '{"tokenizer": {"remote_max_tokens": 8}}').status, 200)
        try:
            before, fell_back = self.metric(too_large), self.metric(fallback)
            # Served all the same, on the placeholder (an earlier test's backoff may skip the engine first).
            self.assertTrue(self.send_until_grows(too_large, {"model": "qwen3-dead", "max_tokens": 2}, 30))
            self.assertGreater(self.metric(fallback), fell_back)
        finally:
            self.assertEqual(f.admin("PUT", "/admin/config", '{"tokenizer": {"remote_max_tokens": 1048576}}').status,
                             200)

    def send_until_grows(self, name, body, timeout):
        """Sends `body` until metric `name` grows (the model's backoff may skip the engine for a while)."""
        start, deadline = self.metric(name), time.time() + timeout
        while time.time() < deadline:
            self.send("/v1/completions", dict(body, prompt=SYSTEM + uuid.uuid4().hex))
            if self.metric(name) > start:
                return True
            time.sleep(0.2)
        return False

    def test_dead_tokenize_falls_back_loudly(self):
        f = self.f
        body = {"model": "qwen3-dead", "max_tokens": 2}
        for mode, result in (("error", "status"), ("hang", "timeout")):
            self.assertEqual(f.mocker(4, "POST", "/mocker/tokenize", {"mode": mode}).status, 200)
            # Every request is served all the same (on placeholder tokens), and counted.
            self.assertTrue(self.send_until_grows(f'kvroute_router_engine_tokenize_total{{result="{result}"}}',
                                                  body, 20), f"no /tokenize failure counted as {result}")
            self.assertGreater(
                self.metric('kvroute_router_tokenizer_fallbacks_total{model="qwen3-dead",reason="engine_error"}'), 0)
        self.assertGreater(self.metric("kvroute_router_engine_tokenize_seconds_count"), 0)
        # A request the engine refuses (4xx) is that request's: counted, and no backoff for the others.
        self.assertEqual(f.mocker(4, "POST", "/mocker/tokenize", {"mode": "reject"}).status, 200)
        rejected = 'kvroute_router_engine_tokenize_total{result="rejected"}'
        self.assertTrue(self.send_until_grows(rejected, body, 30))  # once the hang's backoff ran out
        before, skipped = self.metric(rejected), self.metric('kvroute_router_engine_tokenize_total{result="backoff"}')
        for _ in range(3):
            self.send("/v1/completions", dict(body, prompt=SYSTEM + uuid.uuid4().hex))
        self.assertEqual(self.metric(rejected), before + 3)
        self.assertEqual(self.metric('kvroute_router_engine_tokenize_total{result="backoff"}'), skipped)
        with open(os.path.join(f.workdir, "kvroute.log"), "rb") as log:
            text = log.read().decode(errors="replace")
        self.assertIn("model 'qwen3-dead': routed on placeholder tokens (engine_error", text)
        self.assertIn("POST /tokenize failed (status)", text)
        # Healthy again: exact again once the backoff is over.
        self.assertEqual(f.mocker(4, "POST", "/mocker/tokenize", {"mode": "ok"}).status, 200)
        self.assertTrue(self.send_until_grows(
            'kvroute_router_tokenized_requests_total{model="qwen3-dead",source="engine"}', body, 30))

    def test_mocker_serves_tokenize_as_vllm(self):
        """The engine side: vLLM's /tokenize shapes, the ids the worker itself computes for generation."""
        f, qwen = self.f, os.path.join(MODELS, "qwen3")
        text = "Rotterdam depot RTM-4, parcel 17. " * 3
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is parcel 17?"}]
        cli = subprocess.run([os.path.join(BUILD_DIR, "tokenizer", "kvroute-tokenize"), "--tokenizer", qwen],
                             input=json.dumps({"text": text}) + "\n" + json.dumps({"messages": messages}) + "\n",
                             capture_output=True, text=True, check=True).stdout.splitlines()
        want_text, want_chat = json.loads(cli[0]), json.loads(cli[1])
        for body, want in (({"model": "qwen3", "prompt": text}, want_text), ({"prompt": text}, want_text),
                           ({"model": "qwen3-support", "prompt": text}, want_text),
                           ({"model": "qwen3", "messages": messages, "add_generation_prompt": True}, want_chat)):
            r = f.mocker(1, "POST", "/tokenize", body)
            self.assertEqual(r.status, 200, r.body)
            j = r.json()
            self.assertEqual(j["tokens"], want, body)
            self.assertEqual(j["count"], len(want))
            self.assertGreater(j["max_model_len"], 0)
        gen = f.mocker(1, "POST", "/v1/completions", {"model": "qwen3", "prompt": text, "max_tokens": 1})
        self.assertEqual(gen.json()["usage"]["prompt_tokens"], len(want_text))
        self.assertEqual(f.mocker(1, "POST", "/tokenize", {"model": "other", "prompt": "x"}).status, 404)

    def test_explain_and_status_page_say_which_tokenization(self):
        f = self.f
        body = {"model": "qwen3", "prompt": SYSTEM + uuid.uuid4().hex, "max_tokens": 2}
        calls = sum(self.stats(i)["tokenize_total"] for i in (1, 2, 3))
        r = f.admin("POST", "/admin/route/explain", json.dumps(body))
        self.assertEqual(r.status, 200, r.body)
        explain = r.json()
        self.assertEqual(explain["tokenization"], "engine")  # explain tokenizes as the data plane does
        self.assertIn("POST /tokenize", explain["reason"])
        self.assertEqual(sum(self.stats(i)["tokenize_total"] for i in (1, 2, 3)), calls + 1)
        # Token ids from the client are the client's; the status page's decisions carry the source.
        r = f.admin("POST", "/admin/route/explain", json.dumps({"model": "qwen3", "prompt": [1, 2, 3]}))
        self.assertEqual(r.json()["tokenization"], "client")
        def decided():  # the log keeps one decision per 200 ms: send until one is kept
            self.send("/v1/completions", body)
            return any(d.get("tokenization") == "engine" and d["model"] == "qwen3"
                       for d in f.admin("GET", "/admin/decisions").json())
        self.assertTrue(wait_until(decided, 10, step=0.25))

    def test_remote_off_warns_per_model_at_startup(self):
        path = os.path.join(self.f.workdir, "kvroute.yaml")
        p = subprocess.Popen([os.path.join(BUILD_DIR, "router", "kvroute"), "--config", path, "--router.host",
                              "127.0.0.1", "--router.port", "0", "--admin.port", "0", "--events.nats_url", "",
                              "--tokenizer.remote", "off"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            self.assertIn(b"listening on", p.stdout.readline())
        finally:
            p.terminate()
            _, err = p.communicate(timeout=20)
        text = err.decode(errors="replace")
        for model in ("qwen3", "qwen3-support", "qwen3-dead"):
            self.assertIn(f"model '{model}': no tokenizer.models entry and tokenizer.remote is off", text)


if __name__ == "__main__":
    run_unittest_main(globals())
