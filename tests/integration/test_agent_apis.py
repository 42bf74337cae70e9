"""The agent APIs through kvroute: the OpenAI Responses API (POST
/v1/responses) and Anthropic's Messages API (POST /v1/messages), streamed and
not, with prefix-aware routing (x-kvroute-cached-tokens rises on a repeated
prefix), errors kvroute makes in each API's own shape (before routing, no
worker, a worker failing mid-stream), previous_response_id affinity, and the
passthrough routes (/tokenize, /detokenize, /v1/rerank, /v1/score,
/v1/messages/count_tokens) routed by model, and the README's curl examples
("APIs served"). Real nats-server, mockers and kvroute on loopback.

Run: python3 tests/integration/test_agent_apis.py --build-dir build
"""
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import unittest
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from fleet import run_unittest_main, start_fleet, wait_until  # noqa: E402

BUILD_DIR = "build"
README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
MODEL = "mock-model"
PREFIX = "System: you plan trips across the alps by train and explain each change of trains. " * 20


def sse_request(port, path, body, headers=None, on_event=None, timeout=30):
    """POSTs `body`; returns (status, headers, [(event, data)]) for an SSE answer
    (data parsed as JSON when it is JSON), else (status, headers, parsed body).
    `on_event(n)` is called after the n-th event (n from 1)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hdrs = {"content-type": "application/json"}
    hdrs.update(headers or {})
    conn.request("POST", path, body=json.dumps(body).encode(), headers=hdrs)
    resp = conn.getresponse()
    hmap = {k.lower(): v for k, v in resp.getheaders()}
    if not hmap.get("content-type", "").startswith("text/event-stream"):
        payload = resp.read()
        conn.close()
        return resp.status, hmap, json.loads(payload)
    events, event = [], None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.decode().rstrip("\r\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
            try:
                data = json.loads(data)
            except ValueError:
                pass
            events.append((event, data))
            event = None
            if on_event:
                on_event(len(events))
    conn.close()
    return resp.status, hmap, events


def responses_body(text, **kw):
    body = {"model": MODEL, "instructions": PREFIX, "input": text, "max_output_tokens": 4}
    body.update(kw)
    return body


def messages_body(text, **kw):
    body = {"model": MODEL, "system": PREFIX, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    body.update(kw)
    return body


class AgentApis(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvroute-agent-")
        cls.f = start_fleet(BUILD_DIR, cls.tmp.name, workers=2)

    @classmethod
    def tearDownClass(cls):
        cls.f.close()
        cls.tmp.cleanup()

    def post(self, path, body, **kw):
        return sse_request(self.f.router_port, path, body, **kw)

    def cached_after_repeats(self, path, make_body):
        """Sends requests sharing PREFIX (new suffix each time) until one reports
        cached tokens in x-kvroute-cached-tokens (KV events arrive
        asynchronously); returns that header's value."""
        def attempt():
            status, headers, _ = self.post(path, make_body(f"question {uuid.uuid4()}"))
            self.assertEqual(status, 200)
            return int(headers["x-kvroute-cached-tokens"])
        return wait_until(attempt, 15, step=0.1)

    # ---- Responses

    def test_responses_non_streaming(self):
        status, headers, r = self.post("/v1/responses", responses_body("hello"))
        self.assertEqual(status, 200, r)
        self.assertEqual(r["object"], "response")
        self.assertTrue(r["id"].startswith("resp_"))
        self.assertEqual(r["output"][0]["type"], "message")
        self.assertEqual(r["output"][0]["content"][0]["type"], "output_text")
        self.assertEqual(r["usage"]["output_tokens"], 4)
        self.assertIn("x-kvroute-worker", headers)
        self.assertIn("x-kvroute-cached-tokens", headers)
        self.assertGreater(self.cached_after_repeats("/v1/responses", responses_body), 0)

    def test_responses_streaming_events(self):
        status, headers, events = self.post("/v1/responses", responses_body("stream please", stream=True,
                                                                            max_output_tokens=5))
        self.assertEqual(status, 200)
        self.assertTrue(headers["content-type"].startswith("text/event-stream"))
        names = [e for e, _ in events]
        self.assertEqual(names[:4], ["response.created", "response.in_progress", "response.output_item.added",
                                     "response.content_part.added"])
        self.assertEqual(names.count("response.output_text.delta"), 5)
        self.assertEqual(names[-4:], ["response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.completed"])
        for name, data in events:
            self.assertEqual(data["type"], name)
        self.assertEqual([d["sequence_number"] for _, d in events], list(range(len(events))))
        text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
        self.assertEqual(events[-1][1]["response"]["output"][0]["content"][0]["text"], text)

    def test_responses_errors_in_openai_shape(self):
        status, _, r = self.post("/v1/responses", {"model": MODEL})  # no input
        self.assertEqual(status, 400)
        self.assertEqual(r["error"]["type"], "invalid_request_error")
        self.assertEqual(r["error"]["param"], "input")
        status, _, r = self.post("/v1/responses", responses_body("x", model="no-such-model"))
        self.assertEqual(status, 404)
        self.assertEqual(r["error"]["code"], "model_not_found")

    # ---- Messages

    def test_messages_non_streaming(self):
        status, headers, r = self.post("/v1/messages", messages_body("hello"),
                                       headers={"anthropic-version": "2023-06-01", "x-api-key": "k"})
        self.assertEqual(status, 200, r)
        self.assertEqual(r["type"], "message")
        self.assertEqual(r["role"], "assistant")
        self.assertEqual(r["content"][0]["type"], "text")
        self.assertEqual(r["stop_reason"], "max_tokens")
        self.assertEqual(r["usage"]["output_tokens"], 4)
        self.assertIn("x-kvroute-cached-tokens", headers)
        self.assertGreater(self.cached_after_repeats("/v1/messages", messages_body), 0)

    def test_messages_streaming_events(self):
        status, _, events = self.post("/v1/messages", messages_body("stream please", stream=True, max_tokens=3))
        self.assertEqual(status, 200)
        names = [e for e, _ in events]
        self.assertEqual(names, ["message_start", "content_block_start"] + ["content_block_delta"] * 3 +
                         ["content_block_stop", "message_delta", "message_stop"])
        for name, data in events:
            self.assertEqual(data["type"], name)
        self.assertEqual(events[0][1]["message"]["content"], [])
        self.assertEqual(events[-2][1]["delta"]["stop_reason"], "max_tokens")
        self.assertEqual(events[-2][1]["usage"]["output_tokens"], 3)

    def test_messages_errors_in_anthropic_shape(self):
        status, _, r = self.post("/v1/messages", {"model": MODEL, "messages": []})  # no max_tokens
        self.assertEqual(status, 400)
        self.assertEqual(r["type"], "error")
        self.assertEqual(r["error"]["type"], "invalid_request_error")
        self.assertIsInstance(r["error"]["message"], str)
        status, _, r = self.post("/v1/messages", messages_body("x", model="no-such-model"))
        self.assertEqual(status, 404)
        self.assertEqual(r, {"type": "error", "error": {"type": "not_found_error", "message": r["error"]["message"]}})
        # Refused before the body is read (413 over router.max_body_bytes): Anthropic's shape too.
        conn = http.client.HTTPConnection("127.0.0.1", self.f.router_port, timeout=10)
        conn.putrequest("POST", "/v1/messages")
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(1 << 40))
        conn.endheaders()
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        self.assertEqual(resp.status, 413)
        self.assertEqual(body["type"], "error")
        self.assertEqual(body["error"]["type"], "request_too_large")

    # ---- previous_response_id

    def test_previous_response_id_goes_to_its_worker(self):
        before = self.f.metric('kvroute_router_previous_response_total{result="pinned"}')
        for i in range(8):
            stream = i % 2 == 1
            first = {"model": MODEL, "input": f"conversation {uuid.uuid4()} starts here", "max_output_tokens": 2,
                     "stream": stream}
            status, headers, r = self.post("/v1/responses", first)
            self.assertEqual(status, 200)
            rid = r[0][1]["response"]["id"] if stream else r["id"]
            worker = headers["x-kvroute-worker"]
            follow = {"model": MODEL, "input": f"and continues {uuid.uuid4()}", "max_output_tokens": 2,
                      "previous_response_id": rid}
            status, headers, r = self.post("/v1/responses", follow)
            self.assertEqual(status, 200, f"follow-up of {rid} (first on worker {worker}): {r}")
            self.assertEqual(headers["x-kvroute-worker"], worker)
        self.assertEqual(self.f.metric('kvroute_router_previous_response_total{result="pinned"}') - before, 8)

    def test_unknown_previous_response_id_is_routed_and_refused_by_the_worker(self):
        before = self.f.metric('kvroute_router_previous_response_total{result="unknown"}')
        status, _, r = self.post("/v1/responses", responses_body("x", previous_response_id="resp_nobody-has-it"))
        self.assertEqual(status, 404)
        self.assertIn("resp_nobody-has-it", r["error"]["message"])
        self.assertEqual(self.f.metric('kvroute_router_previous_response_total{result="unknown"}') - before, 1)

    def test_retrieve_goes_to_its_worker_and_unknown_id_is_404(self):
        # GET /v1/responses/{id}: kvroute stores nothing; the worker that
        # produced the response answers (the other would answer 404).
        for _ in range(4):
            status, headers, r = self.post("/v1/responses", responses_body(f"keep {uuid.uuid4()}"))
            self.assertEqual(status, 200)
            got = self.f.get(f"/v1/responses/{r['id']}")
            self.assertEqual(got.status, 200, got.body)
            self.assertEqual(got.json()["id"], r["id"])
            self.assertEqual(got.header("x-kvroute-worker"), headers["x-kvroute-worker"])
        # An id kvroute never saw: its own 404 in OpenAI's shape, no worker asked.
        before = self.f.metric('kvroute_router_response_retrieve_total{result="unknown"}')
        got = self.f.get("/v1/responses/resp_nobody-has-it?stream=false")
        self.assertEqual(got.status, 404)
        err = got.json()["error"]
        self.assertEqual((err["type"], err["param"], err["code"]), ("invalid_request_error", "response_id", None))
        self.assertIn("resp_nobody-has-it", err["message"])
        self.assertIsNone(got.header("x-kvroute-worker"))
        self.assertEqual(self.f.metric('kvroute_router_response_retrieve_total{result="unknown"}') - before, 1)
        self.assertGreaterEqual(self.f.metric('kvroute_router_response_retrieve_total{result="routed"}'), 4)

    # ---- passthrough routes

    def test_tokenize_is_routed_by_model(self):
        status, headers, r = self.post("/tokenize", {"model": MODEL, "prompt": "hello there"})
        self.assertEqual(status, 200, r)
        self.assertGreater(r["count"], 0)
        self.assertIn("x-kvroute-worker", headers)
        status, _, r = self.post("/tokenize", {"prompt": "no model"})
        self.assertEqual(status, 400)
        self.assertEqual(r["error"]["param"], "model")
        status, _, r = self.post("/tokenize", {"model": "no-such-model", "prompt": "x"})
        self.assertEqual(status, 404)
        self.assertEqual(r["error"]["code"], "model_not_found")

    def test_passthrough_routes_reach_the_workers_and_balance(self):
        # Ranked by load alone, and a passthrough call allocates no KV: the
        # parked KV of a worker that just answered a long prompt, which keeps
        # new prompts off it for a while (config/README.md,
        # scheduler.parked_kv_seconds), does not keep these calls off it.
        status, headers, _ = self.post("/v1/completions", {"model": MODEL, "prompt": "parked prompt " * 4000,
                                                           "max_tokens": 1})
        self.assertEqual(status, 200)
        holder = int(headers["x-kvroute-worker"])

        def parked_on_holder_only():
            # Applied on the router's fleet thread, just after the answer; ten
            # times the earlier tests' prompts, which fade.
            ws = {int(w["worker_id"]): w["parked_blocks"] for w in self.f.admin("GET", "/admin/workers").json()}
            return ws[holder] > 0 and all(ws[holder] > 2 * p for i, p in ws.items() if i != holder)
        self.assertTrue(wait_until(parked_on_holder_only, 30), "the long prompt was not parked on its worker")
        workers = set()
        for _ in range(20):
            status, headers, r = self.post("/detokenize", {"model": MODEL, "tokens": [1, 2, 3]})
            self.assertEqual(status, 200, r)
            self.assertIsInstance(r["prompt"], str)
            workers.add(headers["x-kvroute-worker"])
        self.assertEqual(len(workers), 2, "passthrough requests all went to one worker")
        status, _, r = self.post("/v1/rerank", {"model": MODEL, "query": "q", "documents": ["a", "bb"]})
        self.assertEqual(status, 200, r)
        self.assertEqual(len(r["results"]), 2)
        status, _, r = self.post("/v1/score", {"model": MODEL, "text_1": "q", "text_2": ["a", "bb"]})
        self.assertEqual(status, 200, r)
        self.assertEqual(len(r["data"]), 2)
        status, _, r = self.post("/v1/messages/count_tokens",
                                 {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(status, 200, r)
        self.assertGreater(r["input_tokens"], 0)
        status, _, r = self.post("/v1/messages/count_tokens", {"messages": []})
        self.assertEqual(status, 400)
        self.assertEqual(r["type"], "error")


    # ---- the README's examples

    def test_readme_curl_examples_answer(self):
        text = open(README).read()
        section = text.split("## APIs served", 1)[1].split("\n## ", 1)[0]
        block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
        commands = [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
        paths = set()
        for cmd in commands:
            self.assertTrue(cmd.startswith("curl -fsS"), cmd)
            paths.add(re.search(r"localhost:8080(\S+)", cmd).group(1))
            run = cmd.replace("localhost:8080", f"127.0.0.1:{self.f.router_port}")
            r = subprocess.run(["bash", "-c", run], capture_output=True, timeout=30)
            self.assertEqual(r.returncode, 0, f"{cmd}: {r.stderr.decode()}")
            self.assertTrue(r.stdout, cmd)
        for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                      "/v1/messages/count_tokens", "/v1/embeddings", "/v1/rerank", "/v1/score", "/tokenize",
                      "/detokenize", "/v1/models"):
            self.assertIn(route, paths)


class MidStreamFailure(unittest.TestCase):
    """A worker that dies mid-stream: each API's own error event ends the
    stream; then, no worker left, kvroute's 503 in the API's shape."""

    def run_cut(self, path, body):
        with tempfile.TemporaryDirectory(prefix="kvroute-agent-cut-") as tmp:
            f = start_fleet(BUILD_DIR, tmp, workers=1, speedup=1.0)
            try:
                killed = threading.Event()

                def on_event(n):
                    if n == 5 and not killed.is_set():
                        killed.set()
                        f.kill("mocker-1")
                status, _, events = sse_request(f.router_port, path, body, on_event=on_event)
                self.assertTrue(killed.is_set())
                self.assertEqual(status, 200)
                # With its only worker gone, the next request is kvroute's 503, in the route's shape.
                status, headers, error = sse_request(f.router_port, path, dict(body, stream=False))
                self.assertEqual(status, 503)
                self.assertEqual(headers.get("retry-after"), "1")
                return events, error
            finally:
                f.close()

    def test_responses_stream_ends_with_an_error_event(self):
        events, error = self.run_cut("/v1/responses", {"model": MODEL, "input": "long",
                                                       "max_output_tokens": 100000, "stream": True})
        self.assertEqual(error["error"]["type"], "service_unavailable")
        name, data = events[-1]
        self.assertEqual(name, "error")
        self.assertEqual(data["type"], "error")
        self.assertEqual(data["code"], "upstream_failed")
        self.assertIn("message", data)

    def test_messages_stream_ends_with_an_error_event(self):
        events, error = self.run_cut("/v1/messages", {"model": MODEL, "max_tokens": 100000, "stream": True,
                                                      "messages": [{"role": "user", "content": "long"}]})
        self.assertEqual(error, {"type": "error", "error": {"type": "overloaded_error",
                                                            "message": error["error"]["message"]}})
        name, data = events[-1]
        self.assertEqual(name, "error")
        self.assertEqual(data, {"type": "error", "error": {"type": "api_error", "message": data["error"]["message"]}})


if __name__ == "__main__":
    run_unittest_main(globals())
