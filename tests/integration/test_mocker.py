"""kvroute-mocker on its own (no NATS): OpenAI shapes, streaming, cache hits,
errors and cancellation, over real HTTP on loopback.

Run: python3 tests/integration/test_mocker.py --build-dir build
"""
import json
import os
import socket
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from fleet import Fleet, read_line_matching, run_unittest_main  # noqa: E402

BUILD_DIR = "build"


class MockerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvroute-mocker-")
        cls.fleet = Fleet(BUILD_DIR, cls.tmp.name)
        args = [os.path.join(BUILD_DIR, "mocker", "kvroute-mocker"), "--port", "0", "--worker-id", "5",
                "--block-size", "16", "--speedup", "10"]
        proc = cls.fleet._spawn("mocker", args)
        line = read_line_matching(proc, "listening on", 20)
        cls.port = int(line.rsplit(":", 1)[1])

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()
        cls.tmp.cleanup()

    def post(self, path, body):
        return self.fleet.post(path, body, port=self.port)

    def test_completion_and_cache_hit(self):
        prompt = "A long shared prompt about caches. " * 20
        r = self.post("/v1/completions", {"model": "mock-model", "prompt": prompt, "max_tokens": 5})
        self.assertEqual(r.status, 200)
        j = r.json()
        self.assertEqual(j["object"], "text_completion")
        self.assertEqual(j["choices"][0]["finish_reason"], "length")
        self.assertEqual(j["usage"]["completion_tokens"], 5)
        self.assertEqual(j["usage"]["prompt_tokens"], (len(prompt) + 3) // 4)
        self.assertEqual(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        r2 = self.post("/v1/completions", {"model": "mock-model", "prompt": prompt + " again", "max_tokens": 2})
        cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        self.assertGreater(cached, 0)
        self.assertEqual(cached % 16, 0)

    def test_token_id_prompt(self):
        r = self.post("/v1/completions", {"model": "mock-model", "prompt": list(range(100)), "max_tokens": 1})
        self.assertEqual(r.json()["usage"]["prompt_tokens"], 100)

    def test_chat_and_streaming(self):
        body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
        r = self.post("/v1/chat/completions", body)
        j = r.json()
        self.assertEqual(j["object"], "chat.completion")
        self.assertEqual(j["choices"][0]["message"]["role"], "assistant")
        self.assertTrue(j["choices"][0]["message"]["content"])
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        r = self.post("/v1/chat/completions", body)
        self.assertEqual(r.header("transfer-encoding"), "chunked")
        self.assertEqual(r.chunks[-1], "[DONE]")
        chunks = [json.loads(c) for c in r.chunks[:-1]]
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
        content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
        self.assertEqual(len(content), 6)
        self.assertEqual(chunks[-2]["choices"][0]["finish_reason"], "length")
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 6)

    def test_errors(self):
        self.assertEqual(self.post("/v1/completions", b"{nope").status, 400)
        r = self.post("/v1/completions", {"model": "mock-model", "prompt": "x", "max_tokens": 0})
        self.assertEqual(r.status, 400)
        self.assertEqual(r.json()["error"]["param"], "max_tokens")
        self.assertEqual(self.post("/v1/completions", {"model": "other", "prompt": "x"}).status, 404)
        self.assertEqual(self.fleet.get("/health", port=self.port).status, 200)

    def test_disconnect_cancels_generation(self):
        before = self.fleet.get("/mocker/stats", port=self.port).json()["cancels_total"]
        s = socket.create_connection(("127.0.0.1", self.port))
        body = json.dumps({"model": "mock-model", "prompt": "long one", "max_tokens": 100000, "stream": True})
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        got = b""
        while b"data:" not in got:
            chunk = s.recv(4096)
            self.assertTrue(chunk, "connection closed before the first token")
            got += chunk
        s.close()
        deadline = time.time() + 5
        while time.time() < deadline:
            st = self.fleet.get("/mocker/stats", port=self.port).json()
            if st["cancels_total"] > before and st["active"] == 0:
                break
            time.sleep(0.05)
        self.assertGreater(st["cancels_total"], before)
        self.assertEqual(st["active"], 0)
        self.assertEqual(st["kv_active_blocks"], 0)


if __name__ == "__main__":
    run_unittest_main(globals())
