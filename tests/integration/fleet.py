"""Test harness: starts real processes (nats-server, kvroute-mocker, kvroute)
on loopback with free ports, and talks HTTP to them. Standard library only.

Every process is killed when the Fleet is closed (use it as a context manager).
"""
import http.client
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_nats_server():
    for cand in (shutil.which("nats-server"), "/usr/sbin/nats-server", "/usr/bin/nats-server"):
        if cand and os.path.exists(cand):
            return cand
    raise RuntimeError("nats-server not found (scripts/setup.sh installs it)")


def read_line_matching(proc, needle, timeout):
    """Reads proc.stdout until a line containing `needle`; returns that line."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.time() + timeout
    buf = b""
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before printing '{needle}'")
        for _key, _ in sel.select(timeout=0.1):
            chunk = os.read(proc.stdout.fileno(), 4096)
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                if needle in text:
                    return text
    raise RuntimeError(f"{proc.args[0]} did not print '{needle}' within {timeout}s")


def wait_until(pred, timeout, step=0.05):
    """Polls `pred` until it is truthy or `timeout` seconds pass; returns its last value."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    return pred()


def start_fleet(build_dir, workdir, workers=3, mocker_args=(), **kw):
    """nats-server + `workers` mockers (ids 1..N, `mocker_args`) + kvroute, ready; closes all on failure."""
    fleet = Fleet(build_dir, workdir, **kw)
    try:
        fleet.start_nats()
        for i in range(1, workers + 1):
            fleet.start_mocker(i, mocker_args)
        fleet.start_router()
        fleet.wait_ready(workers)
    except Exception:
        fleet.close()
        raise
    return fleet


def run_unittest_main(module_globals):
    """`--build-dir DIR` then unittest's own arguments; sets the module's BUILD_DIR."""
    import argparse
    import sys
    import unittest
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    args, rest = ap.parse_known_args()
    module_globals["BUILD_DIR"] = os.path.abspath(args.build_dir)
    unittest.main(argv=[sys.argv[0], "-v", *rest])


class FleetTestCase(unittest.TestCase):
    """One fleet shared by the tests of a class, as `cls.f`.

    setUpClass makes a temporary directory (`tmp_prefix`) and a Fleet built
    with `fleet_options`, then calls `start(f)`; when the start fails,
    everything it started is closed before the error goes on. The default
    start is nats-server, two mockers (ids 1 and 2, `mocker_args`) and kvroute,
    ready. A subclass with servers of its own closes them in `stop()`. The
    build directory is the test module's BUILD_DIR (set by run_unittest_main).
    """
    tmp_prefix = "kvroute-"
    fleet_options = {}
    mocker_args = ()

    @classmethod
    def start(cls, f):
        f.start_nats()
        for w in (1, 2):
            f.start_mocker(w, cls.mocker_args)
        f.start_router()
        f.wait_ready(2)

    @classmethod
    def stop(cls):
        pass

    @classmethod
    def setUpClass(cls):
        build_dir = sys.modules[cls.__module__].BUILD_DIR
        cls.tmp = tempfile.TemporaryDirectory(prefix=cls.tmp_prefix)
        cls.f = Fleet(build_dir, cls.tmp.name, **cls.fleet_options)
        try:
            cls.start(cls.f)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.f.close()
        cls.stop()
        cls.tmp.cleanup()


class Response:
    def __init__(self, status, headers, body, chunks=None, chunk_times=None):
        self.status = status
        self.headers = headers
        self.body = body
        self.chunks = chunks or []          # SSE data payloads, in order
        self.chunk_times = chunk_times or []  # arrival time of each

    def json(self):
        return json.loads(self.body)

    def header(self, name):
        return self.headers.get(name.lower())


class Fleet:
    def __init__(self, build_dir, workdir, block_size=16, ttl_ms=1500, speedup=20.0, router_args=()):
        self.build_dir = build_dir
        self.workdir = workdir
        self.block_size = block_size
        self.ttl_ms = ttl_ms
        self.speedup = speedup
        self.router_args = list(router_args)
        self.procs = {}
        self.logs = []  # each process's stderr file, closed with the fleet
        self.mocker_urls = {}
        self.nats_port = None
        self.router_port = None
        self.admin_port = None
        self.admin_token = "it-admin-token"

    # -- processes --------------------------------------------------------
    def _spawn(self, name, args, stdout=subprocess.PIPE):
        log = open(os.path.join(self.workdir, f"{name}.log"), "wb")
        self.logs.append(log)
        proc = subprocess.Popen(args, stdout=stdout, stderr=log, stdin=subprocess.DEVNULL)
        self.procs[name] = proc
        return proc

    def start_nats(self):
        self.nats_port = free_port()
        self._spawn("nats", [find_nats_server(), "-a", "127.0.0.1", "-p", str(self.nats_port)],
                    stdout=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.nats_port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nats-server did not start")

    @property
    def nats_url(self):
        return f"nats://127.0.0.1:{self.nats_port}"

    def start_mocker(self, worker_id, extra=()):
        args = [os.path.join(self.build_dir, "mocker", "kvroute-mocker"), "--worker-id", str(worker_id),
                "--port", "0", "--nats-url", self.nats_url, "--block-size", str(self.block_size),
                "--speedup", str(self.speedup), "--heartbeat-ms", "200", *extra]
        proc = self._spawn(f"mocker-{worker_id}", args)
        line = read_line_matching(proc, "listening on", 20)
        self.mocker_urls[worker_id] = line.split("listening on", 1)[1].strip()
        return self.mocker_urls[worker_id]

    def admin(self, method, path, body=None, token="default"):
        tok = self.admin_token if token == "default" else token
        headers = {"authorization": f"Bearer {tok}"} if tok is not None else {}
        data = body.encode() if isinstance(body, str) else body
        return self.request(method, path, data, port=self.admin_port, headers=headers)

    def mocker_port(self, worker_id):
        return int(self.mocker_urls[worker_id].rsplit(":", 1)[1])

    def mocker(self, worker_id, method, path, body=None):
        return self.request(method, path, body, port=self.mocker_port(worker_id))

    def start_vllm_mocker(self, worker_id, host="127.0.0.1", port=0, zmq_port=0, replay_port=0, extra=()):
        """A mocker in vLLM mode (ZMQ KV events + replay, vLLM /metrics, no NATS).
        Returns (url, kv_events endpoint, replay endpoint)."""
        args = [os.path.join(self.build_dir, "mocker", "kvroute-mocker"), "--worker-id", str(worker_id),
                "--host", host, "--port", str(port), "--block-size", str(self.block_size),
                "--speedup", str(self.speedup),
                "--zmq-endpoint", f"tcp://{host}:{zmq_port}", "--zmq-replay-endpoint", f"tcp://{host}:{replay_port}",
                *extra]
        proc = self._spawn(f"mocker-{worker_id}", args)
        line = read_line_matching(proc, "listening on", 20)
        m = re.search(r"kv_events (\S+) replay (\S+) listening on (\S+)", line)
        self.mocker_urls[worker_id] = m.group(3)
        return m.group(3), m.group(1), m.group(2)

    def start_router_config(self, yaml_text, extra=()):
        """kvroute with a YAML config file and no NATS (events.nats_url empty)."""
        path = os.path.join(self.workdir, "kvroute.yaml")
        with open(path, "w") as f:
            f.write(yaml_text)
        args = [os.path.join(self.build_dir, "router", "kvroute"), "--config", path, "--router.host", "127.0.0.1",
                "--router.port", "0", "--events.nats_url", "", "--indexer.block_size", str(self.block_size),
                "--admin.host", "127.0.0.1", "--admin.port", "0", "--admin.token", self.admin_token, *extra]
        proc = self._spawn("kvroute", args)
        line = read_line_matching(proc, "listening on", 20)
        m = re.search(r"listening on http://[^:]+:(\d+) admin http://[^:]+:(\d+)", line)
        self.router_port, self.admin_port = int(m.group(1)), int(m.group(2))
        return path

    def start_router(self):
        args = [os.path.join(self.build_dir, "router", "kvroute"), "--router.host", "127.0.0.1",
                "--router.port", "0", "--events.nats_url", self.nats_url,
                "--events.worker_ttl_ms", str(self.ttl_ms), "--indexer.block_size", str(self.block_size),
                "--admin.host", "127.0.0.1", "--admin.port", "0", "--admin.token", self.admin_token,
                *self.router_args]
        proc = self._spawn("kvroute", args)
        line = read_line_matching(proc, "listening on", 20)
        m = re.search(r"listening on http://[^:]+:(\d+) admin http://[^:]+:(\d+)", line)
        self.router_port, self.admin_port = int(m.group(1)), int(m.group(2))

    def kill(self, name, sig=signal.SIGKILL):
        proc = self.procs[name]
        proc.send_signal(sig)
        proc.wait(timeout=10)

    def close(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if proc.stdout:
                proc.stdout.close()
        for log in self.logs:
            log.close()
        self.logs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- HTTP -------------------------------------------------------------
    def request(self, method, path, body=None, port=None, timeout=30, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", port or self.router_port, timeout=timeout)
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        hdrs = {"content-type": "application/json"}
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        hmap = {k.lower(): v for k, v in resp.getheaders()}
        if hmap.get("content-type", "").startswith("text/event-stream"):
            chunks, times = [], []
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if line.startswith(b"data: "):
                    chunks.append(line[6:].decode())
                    times.append(time.time())
            conn.close()
            return Response(resp.status, hmap, b"", chunks, times)
        payload = resp.read()
        conn.close()
        return Response(resp.status, hmap, payload)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def wait_ready(self, workers, timeout=20):
        """Waits until /ready is 200 and `workers` workers are known."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.get("/ready").status == 200 and self.metric("kvroute_scheduler_workers") >= workers:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"router not ready with {workers} workers within {timeout}s")

    def metrics(self):
        """Parses /metrics into {'name{labels}': value}."""
        out = {}
        for line in self.get("/metrics").body.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        return out

    def metric(self, name):
        return self.metrics().get(name, 0.0)
