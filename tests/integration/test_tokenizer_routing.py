"""Real tokenizers in the data path: kvroute and kvroute-mocker both load the
models' Hugging Face tokenizer.json and chat template (tokenizer.models /
--tokenizer), so the router's block hashes are the worker's.

Fleet: nats-server; workers 1-2 serve `qwen3` (Qwen3's tokenizer and template),
worker 3 serves `gemma3` (Gemma 3's), worker 4 serves `plain-model` (no
tokenizer on either side: kvroute asks its /tokenize, the worker answers with
its placeholder tokens); kvroute with
`tokenizer.models=qwen3=...,gemma3=...`.

Needs the reference tokenizers (tests/tokenizer/setup_reference.sh, npm, run
here if missing).

Run: python3 tests/integration/test_tokenizer_routing.py --build-dir build
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from fleet import Fleet, run_unittest_main, wait_until  # noqa: E402

BUILD_DIR = "build"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "reference", "data", "models")
SYSTEM = ("You are the routing assistant of a large logistics company. Answer precisely, cite the depot code, "
          "and never invent a shipment number. ") * 12  # ~300 tokens: many 16-token blocks


def ensure_reference():
    if not os.path.exists(os.path.join(MODELS, "qwen3", ".done")) or \
            not os.path.exists(os.path.join(MODELS, "gemma3", ".done")):
        subprocess.run(["bash", os.path.join(ROOT, "tests", "tokenizer", "setup_reference.sh")], check=True)


def tokenize_cli(model_dir, lines):
    """kvroute-tokenize on JSON lines -> list of id lists."""
    out = subprocess.run([os.path.join(BUILD_DIR, "tokenizer", "kvroute-tokenize"), "--tokenizer", model_dir],
                         input="\n".join(json.dumps(x) for x in lines) + "\n", capture_output=True, text=True,
                         check=True)
    return [json.loads(x) for x in out.stdout.splitlines()]


class TokenizerRoutingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ensure_reference()
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvroute-tok-")
        qwen, gemma = os.path.join(MODELS, "qwen3"), os.path.join(MODELS, "gemma3")
        f = Fleet(BUILD_DIR, cls.tmp.name, block_size=16, speedup=50.0,
                  router_args=["--tokenizer.models", f"qwen3={qwen}, gemma3={gemma}"])
        cls.fleet = f
        try:
            f.start_nats()
            f.start_mocker(1, ["--model", "qwen3", "--tokenizer", qwen])
            f.start_mocker(2, ["--model", "qwen3", "--tokenizer", qwen])
            f.start_mocker(3, ["--model", "gemma3", "--tokenizer", gemma])
            f.start_mocker(4, ["--model", "plain-model"])
            f.start_router()
            f.wait_ready(4)
        except Exception:
            f.close()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()
        cls.tmp.cleanup()

    def fallbacks(self, model, reason):
        return self.fleet.metric(f'kvroute_router_tokenizer_fallbacks_total{{model="{model}",reason="{reason}"}}')

    def test_chat_prefix_is_cached_and_router_agrees_with_worker(self):
        f = self.fleet
        system = SYSTEM + uuid.uuid4().hex
        bodies = [{"model": "qwen3", "max_tokens": 2,
                   "messages": [{"role": "system", "content": system},
                                {"role": "user", "content": f"Where is parcel {i}?"}]} for i in range(4)]
        ids = tokenize_cli(os.path.join(MODELS, "qwen3"), bodies)
        self.assertEqual(ids[0][:3], [151644, 8948, 198])  # <|im_start|>system\n: Qwen3's template, no BOS
        first = f.post("/v1/chat/completions", bodies[0])
        self.assertEqual(first.status, 200, first.body)
        usage = first.json()["usage"]
        # The worker tokenized exactly what kvroute-tokenize computes.
        self.assertEqual(usage["prompt_tokens"], len(ids[0]))
        holder = first.header("x-kvroute-worker")
        self.assertIn(holder, ("1", "2"))
        # Blocks the worker stored reach the index; the next requests share the system prompt.
        shared = 0
        while shared < min(len(ids[0]), len(ids[1])) and ids[0][shared] == ids[1][shared]:
            shared += 1
        self.assertGreater(shared, 200)
        self.assertTrue(wait_until(lambda: f.metric('kvroute_indexer_entries{mode="exact"}') >= len(ids[0]) // 16,
                                   5))
        for i in range(1, 4):
            r = f.post("/v1/chat/completions", bodies[i])
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(r.header("x-kvroute-worker"), holder)
            routed_cached = int(r.header("x-kvroute-cached-tokens"))
            worker_cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            self.assertEqual(r.json()["usage"]["prompt_tokens"], len(ids[i]))
            # Same tokens, same hashes: the router's predicted hit is the worker's real one.
            self.assertEqual(routed_cached, shared // 16 * 16)
            self.assertEqual(routed_cached, worker_cached)
        self.assertEqual(self.fallbacks("qwen3", "no_tokenizer"), 0)
        self.assertEqual(self.fallbacks("qwen3", "template_error"), 0)

    def test_completion_adds_bos(self):
        text = "The depot code for Rotterdam is RTM-4. " * 5
        ids = tokenize_cli(os.path.join(MODELS, "gemma3"), [{"text": text}])[0]
        self.assertEqual(ids[0], 2)  # Gemma's <bos>, added for completions as vLLM does
        r = self.fleet.post("/v1/completions", {"model": "gemma3", "prompt": text, "max_tokens": 2})
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("x-kvroute-worker"), "3")
        self.assertEqual(r.json()["usage"]["prompt_tokens"], len(ids))

    def test_template_error_is_forwarded_and_counted(self):
        # Gemma 3's template raises on two user turns in a row; vLLM (and the mocker) answer 400.
        before = self.fallbacks("gemma3", "template_error")
        body = {"model": "gemma3", "max_tokens": 2,
                "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
        r = self.fleet.post("/v1/chat/completions", body)
        self.assertEqual(r.status, 400, r.body)
        self.assertIn("alternate", r.json()["error"]["message"])
        self.assertEqual(self.fallbacks("gemma3", "template_error"), before + 1)
        # The daemon keeps serving that model.
        ok = self.fleet.post("/v1/chat/completions",
                             {"model": "gemma3", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(ok.status, 200, ok.body)

    def test_model_without_tokenizer_asks_its_engine_or_falls_back_loudly(self):
        f = self.fleet
        body = {"model": "plain-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]}
        engine = 'kvroute_router_tokenized_requests_total{model="plain-model",source="engine"}'
        before_engine, before_fallback = f.metric(engine), self.fallbacks("plain-model", "no_tokenizer")
        # tokenizer.remote auto (the default): the worker's own POST /tokenize.
        r = f.post("/v1/chat/completions", body)
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("x-kvroute-worker"), "4")
        self.assertEqual(f.metric(engine), before_engine + 1)
        self.assertEqual(self.fallbacks("plain-model", "no_tokenizer"), before_fallback)
        # tokenizer.remote off (reloadable): the placeholder, counted.
        self.assertEqual(f.admin("PUT", "/admin/config", '{"tokenizer": {"remote": "off"}}').status, 200)
        try:
            r = f.post("/v1/chat/completions", body)
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(self.fallbacks("plain-model", "no_tokenizer"), before_fallback + 1)
            self.assertEqual(f.metric('kvroute_router_tokenized_requests_total{model="plain-model",source="placeholder"}'),
                             1)
        finally:
            self.assertEqual(f.admin("PUT", "/admin/config", '{"tokenizer": {"remote": "auto"}}').status, 200)

    def test_unloadable_tokenizer_dir_stops_startup(self):
        p = subprocess.run([os.path.join(BUILD_DIR, "router", "kvroute"), "--router.port", "0", "--admin.port", "0",
                            "--tokenizer.models", "m=/nonexistent/dir"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("tokenizer.models", p.stderr)
        self.assertIn("/nonexistent/dir", p.stderr)
        p = subprocess.run([os.path.join(BUILD_DIR, "router", "kvroute"), "--router.port", "0", "--admin.port", "0",
                            "--tokenizer.models", "no-equals-sign"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("MODEL=DIR", p.stderr)


if __name__ == "__main__":
    run_unittest_main(globals())
