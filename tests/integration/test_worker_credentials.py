"""What credentials a worker sees (router/http/worker_credential.h): with API
keys in force the client's `Authorization` / `x-api-key` never reach a
worker, and a worker started with `--api-key` (as vLLM's) is served with
kvroute's own key (router.worker_api_key_file or router.worker_api_key_env),
which no log, config dump or explain shows (a bad key on SIGHUP keeps the
old one and is counted); without keys the client's fields
stay with kvroute unless router.forward_client_credentials says otherwise.
Real nats-server, kvroute-mocker (it records the credential fields it
received: GET /mocker/stats "credentials") and kvroute on loopback.

Run: python3 tests/integration/test_worker_credentials.py --build-dir build
"""
import hashlib
import json
import os
import signal
import sys
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from fleet import FleetTestCase, run_unittest_main, wait_until  # noqa: E402

BUILD_DIR = "build"
CLIENT_KEY = "sk-client-" + uuid.uuid4().hex
WORKER_KEY = "sk-worker-" + uuid.uuid4().hex
WORKER_KEY_2 = "sk-worker-rotated-" + uuid.uuid4().hex
ENV_KEY = "sk-worker-env-" + uuid.uuid4().hex
ENV_NAME = "KVROUTE_TEST_WORKER_KEY_" + uuid.uuid4().hex[:8].upper()
BODY = {"model": "mock-model", "prompt": "Which credentials does a worker see?", "max_tokens": 2}
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "and on the chat route?"}], "max_tokens": 2}


def credentials(f, worker):
    return f.mocker(worker, "GET", "/mocker/stats").json()["credentials"]


def seen(f, workers=(1,)):
    """Authorization and x-api-key values every worker received so far (counts, last values)."""
    return [credentials(f, w) for w in workers]


class KeysAndWorkerKeyFile(FleetTestCase):
    """API keys in force, workers need a key: kvroute's own from a file."""
    tmp_prefix = "kvroute-creds-"

    @classmethod
    def start(cls, f):
        keys = os.path.join(f.workdir, "keys.txt")
        with open(keys, "w") as out:
            out.write(f"{hashlib.sha256(CLIENT_KEY.encode()).hexdigest()} default\n")
        cls.key_file = os.path.join(f.workdir, "worker.key")
        with open(cls.key_file, "w") as out:
            out.write(WORKER_KEY + "\n")
        f.router_args = ["--flow.keys_file", keys, "--router.worker_api_key_file", cls.key_file]
        f.start_nats()
        f.start_mocker(1, ["--api-key", WORKER_KEY])
        f.start_router()
        f.wait_ready(1)

    def test_client_key_never_reaches_the_worker(self):
        for path, body in (("/v1/completions", BODY), ("/v1/chat/completions", CHAT)):
            for headers in ({"authorization": f"Bearer {CLIENT_KEY}"}, {"x-api-key": CLIENT_KEY},
                            {"authorization": f"Bearer {CLIENT_KEY}", "x-api-key": CLIENT_KEY}):
                r = self.f.post(path, body, headers=headers)
                self.assertEqual(r.status, 200, (path, headers, r.body[:300]))
                c = credentials(self.f, 1)
                self.assertEqual(c["last_authorization"], f"Bearer {WORKER_KEY}", (path, headers))
                self.assertEqual(c["x_api_key"], 0, (path, headers))
                self.assertEqual(c["unauthorized_total"], 0)
        self.assertNotIn(CLIENT_KEY, json.dumps(credentials(self.f, 1)))

    def test_worker_key_never_shown(self):
        r = self.f.post("/v1/completions", BODY, headers={"authorization": f"Bearer {CLIENT_KEY}"})
        self.assertEqual(r.status, 200)
        shown = [self.f.admin("GET", "/admin/config").body.decode(),
                 self.f.admin("POST", "/admin/route/explain", json.dumps(BODY)).body.decode(),
                 self.f.admin("GET", "/admin/status").body.decode()]
        with open(os.path.join(self.f.workdir, "kvroute.log"), errors="replace") as log:
            shown.append(log.read())
        for text in shown:
            self.assertNotIn(WORKER_KEY, text)
            self.assertNotIn(CLIENT_KEY, text)
        self.assertIn(self.key_file, shown[0])  # where it is read from is shown, the key is not

    def test_sighup_rotates_the_worker_key(self):
        with open(self.key_file, "w") as out:
            out.write(WORKER_KEY_2 + "\n")
        self.f.procs["kvroute"].send_signal(signal.SIGHUP)
        ok = wait_until(lambda: self.f.post("/v1/completions", BODY, headers={"authorization": f"Bearer {CLIENT_KEY}"})
                        and credentials(self.f, 1)["last_authorization"] == f"Bearer {WORKER_KEY_2}", 20)
        with open(self.key_file, "w") as out:  # back, for the other tests of the class
            out.write(WORKER_KEY + "\n")
        self.f.procs["kvroute"].send_signal(signal.SIGHUP)
        self.assertTrue(ok, credentials(self.f, 1))
        self.assertTrue(wait_until(
            lambda: self.f.post("/v1/completions", BODY, headers={"authorization": f"Bearer {CLIENT_KEY}"}).status
            == 200 and credentials(self.f, 1)["last_authorization"] == f"Bearer {WORKER_KEY}", 20))


    def test_bad_key_on_sighup_is_counted_and_the_old_key_stays(self):
        name = "kvroute_router_worker_key_reload_failures_total"
        before = self.f.metric(name)
        with open(self.key_file, "w") as out:
            out.write("not a key\n")
        try:
            self.f.procs["kvroute"].send_signal(signal.SIGHUP)
            counted = wait_until(lambda: self.f.metric(name) >= before + 1, 20)
        finally:
            with open(self.key_file, "w") as out:  # back, for the other tests of the class
                out.write(WORKER_KEY + "\n")
        self.assertTrue(counted, self.f.metric(name))
        r = self.f.post("/v1/completions", BODY, headers={"authorization": f"Bearer {CLIENT_KEY}"})
        self.assertEqual(r.status, 200, r.body[:300])
        self.assertEqual(credentials(self.f, 1)["last_authorization"], f"Bearer {WORKER_KEY}")


class WorkerKeyFromEnvironment(FleetTestCase):
    """No API keys; the worker key from an environment variable."""
    tmp_prefix = "kvroute-creds-env-"

    @classmethod
    def start(cls, f):
        os.environ[ENV_NAME] = ENV_KEY
        f.router_args = ["--router.worker_api_key_env", ENV_NAME]
        f.start_nats()
        f.start_mocker(1, ["--api-key", ENV_KEY])
        f.start_router()
        f.wait_ready(1)

    @classmethod
    def stop(cls):
        os.environ.pop(ENV_NAME, None)

    def test_worker_gets_the_environment_key_not_the_clients(self):
        r = self.f.post("/v1/completions", BODY, headers={"authorization": f"Bearer {CLIENT_KEY}", "x-api-key": "k2"})
        self.assertEqual(r.status, 200, r.body[:300])
        c = credentials(self.f, 1)
        self.assertEqual(c["last_authorization"], f"Bearer {ENV_KEY}")
        self.assertEqual(c["x_api_key"], 0)


class NoKeysDefault(FleetTestCase):
    """No API keys, no worker key: the client's fields stay with kvroute."""
    tmp_prefix = "kvroute-creds-none-"

    @classmethod
    def start(cls, f):
        f.start_nats()
        f.start_mocker(1)
        f.start_router()
        f.wait_ready(1)

    def test_client_fields_not_forwarded(self):
        r = self.f.post("/v1/messages", {"model": "mock-model", "max_tokens": 2,
                                         "messages": [{"role": "user", "content": "hi"}]},
                        headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"})
        self.assertEqual(r.status, 200, r.body[:300])
        r = self.f.post("/v1/completions", BODY, headers={"authorization": f"Bearer {CLIENT_KEY}"})
        self.assertEqual(r.status, 200)
        c = credentials(self.f, 1)
        self.assertEqual((c["authorization"], c["x_api_key"]), (0, 0), c)

    def test_forwarding_refused_with_keys(self):
        # router.forward_client_credentials with flow.keys_file: a config error naming the key.
        import subprocess
        out = subprocess.run([os.path.join(BUILD_DIR, "router", "kvroute"), "--flow.keys_file", "/dev/null",
                              "--router.forward_client_credentials", "true", "--events.nats_url", "",
                              "--router.port", "0", "--admin.port", "0"],
                             capture_output=True, text=True, timeout=30)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("router.forward_client_credentials", out.stderr)
        self.assertIn("flow.keys_file", out.stderr)  # refused for what it would do, not as an unknown key


class ForwardClientCredentials(FleetTestCase):
    """No API keys and router.forward_client_credentials: a transparent proxy."""
    tmp_prefix = "kvroute-creds-fwd-"

    @classmethod
    def start(cls, f):
        f.router_args = ["--router.forward_client_credentials", "true"]
        f.start_nats()
        f.start_mocker(1, ["--api-key", CLIENT_KEY])
        f.start_router()
        f.wait_ready(1)

    def test_client_fields_forwarded(self):
        r = self.f.post("/v1/completions", BODY, headers={"authorization": f"Bearer {CLIENT_KEY}", "x-api-key": "k2"})
        self.assertEqual(r.status, 200, r.body[:300])
        c = credentials(self.f, 1)
        self.assertEqual(c["last_authorization"], f"Bearer {CLIENT_KEY}")
        self.assertEqual(c["last_x_api_key"], "k2")
        r = self.f.post("/v1/completions", BODY, headers={"authorization": "Bearer wrong"})
        self.assertEqual(r.status, 401)  # the worker's answer, relayed


if __name__ == "__main__":
    run_unittest_main(globals())
