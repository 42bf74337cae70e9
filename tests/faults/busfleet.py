"""Helpers for the bus fault tests: a raw NATS client (plain or
TLS, with user/password) to inject hostile messages, nats-server with a
config file, direct cache fills on mockers, and the index-vs-workers check.
Reuses tests/integration/fleet.py for processes and HTTP. Standard library only.
"""
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from fleet import Fleet, FleetTestCase, find_nats_server, free_port, wait_until, run_unittest_main, read_line_matching  # noqa: E402,F401

ENTRIES = 'kvroute_indexer_entries{mode="exact"}'
PREFIX = "System: you are a careful assistant for an airline's rebooking desk. " * 30


def completion(prompt, **kw):
    body = {"model": "mock-model", "prompt": prompt, "max_tokens": 2}
    body.update(kw)
    return body


class NatsRaw:
    """A minimal NATS publisher over the text protocol (no library needed)."""

    def __init__(self, port, user=None, password=None, cafile=None, timeout=5):
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.f = sock.makefile("rb")
        info = json.loads(self.f.readline().decode().split(" ", 1)[1])
        self.sock = sock
        if info.get("tls_required"):
            ctx = ssl.create_default_context(cafile=cafile)
            self.sock = ctx.wrap_socket(sock, server_hostname="127.0.0.1")
            self.f = self.sock.makefile("rb")
        opts = {"verbose": False, "pedantic": False, "tls_required": bool(info.get("tls_required")),
                "name": "fault-test", "lang": "python", "version": "0", "protocol": 1}
        if user is not None:
            opts.update(user=user, **{"pass": password})
        self.sock.sendall(b"CONNECT " + json.dumps(opts).encode() + b"\r\n")
        self.flush()

    def pub(self, subject, payload):
        data = payload.encode() if isinstance(payload, str) else payload
        self.sock.sendall(f"PUB {subject} {len(data)}\r\n".encode() + data + b"\r\n")

    def flush(self):
        """PING/PONG round trip: everything published before has reached the server."""
        self.sock.sendall(b"PING\r\n")
        while True:
            line = self.f.readline()
            if not line:
                raise ConnectionError("NATS closed the connection")
            if line.startswith(b"-ERR"):
                raise ConnectionError(line.decode().strip())
            if line.startswith(b"PONG"):
                return
            # INFO / PING from the server: answer pings
            if line.startswith(b"PING"):
                self.sock.sendall(b"PONG\r\n")

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def start_nats_conf(fleet, conf_body, port=None):
    """nats-server with a config file (listen line added); returns its port."""
    fleet.nats_port = port or free_port()
    path = os.path.join(fleet.workdir, f"nats-{fleet.nats_port}.conf")
    with open(path, "w") as fh:
        fh.write(f"listen: 127.0.0.1:{fleet.nats_port}\n{conf_body}\n")
    fleet._spawn("nats", [find_nats_server(), "-c", path], stdout=subprocess.DEVNULL)
    wait_port(fleet.nats_port)
    return fleet.nats_port


def restart_nats_plain(fleet):
    """nats-server again on the fleet's port (after it was killed)."""
    fleet._spawn("nats", [find_nats_server(), "-a", "127.0.0.1", "-p", str(fleet.nats_port)],
                 stdout=subprocess.DEVNULL)
    wait_port(fleet.nats_port)


def wait_port(port, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def worker_blocks(fleet, ids=None):
    """Sum of kv_cached_blocks the mockers report (what the index should hold)."""
    ids = ids if ids is not None else list(fleet.mocker_urls)
    return sum(fleet.mocker(w, "GET", "/mocker/stats").json()["kv_cached_blocks"] for w in ids)


def index_matches(fleet, ids=None):
    """True when the router's exact index holds exactly the workers' blocks and no owner is stale."""
    m = fleet.metrics()
    return m.get(ENTRIES) == worker_blocks(fleet, ids) and m.get("kvroute_indexer_stale_owners", 0) == 0


def fill_direct(fleet, worker_id, prompts, tokens_each, seed=None):
    """Sends `prompts` token-id prompts straight to a mocker (bypassing the router)."""
    base = seed if seed is not None else int(uuid.uuid4().int % 100000)
    for p in range(prompts):
        toks = [(base * 7919 + p * 104729 + i * 31) % 50000 + 1 for i in range(tokens_each)]
        r = fleet.mocker(worker_id, "POST", "/v1/completions",
                         json.dumps({"model": "mock-model", "prompt": toks, "max_tokens": 1}).encode())
        if r.status != 200:
            raise RuntimeError(f"fill of worker {worker_id} failed: {r.status} {r.body[:200]}")


def explain(fleet, prompt):
    r = fleet.admin("POST", "/admin/route/explain", json.dumps(completion(prompt)))
    if r.status != 200:
        raise RuntimeError(f"explain: {r.status} {r.body[:200]}")
    return r.json()


def overlap_of(fleet, prompt, worker_id):
    for w in explain(fleet, prompt)["workers"]:
        if int(w["worker_id"]) == worker_id:
            return w["overlap_blocks"]
    return 0


FAST_MOCKER = ("--engine-profile", "dynamo-mocker", "--prefill-a", "0", "--prefill-b", "0.0001", "--prefill-c", "0.1")


def start_extra_router(fleet, name, extra=()):
    """Another kvroute on the same NATS (a replica); returns its HTTP port."""
    import re
    args = [os.path.join(fleet.build_dir, "router", "kvroute"), "--router.host", "127.0.0.1", "--router.port", "0",
            "--events.nats_url", fleet.nats_url, "--events.worker_ttl_ms", str(fleet.ttl_ms),
            "--indexer.block_size", str(fleet.block_size), "--admin.host", "127.0.0.1", "--admin.port", "0",
            "--admin.token", fleet.admin_token, *fleet.router_args, *extra]
    proc = fleet._spawn(name, args)
    line = read_line_matching(proc, "listening on", 20)
    return int(re.search(r"listening on http://[^:]+:(\d+)", line).group(1))
