"""A real fleet with no NATS process at all: kvroute in front of three
kvroute-mocker workers in vLLM mode (vLLM's ZMQ KV event frames and replay
socket, vLLM-named /metrics), known to the router from its config
(`workers.static`) or by DNS discovery (a name resolving to 127.0.0.1-3,
served by a DNS server started here, python3-dnslib).

Each test asserts one property of the issue "Real fleets plug in":
prefix affinity; x-kvroute-cached-tokens equal to the worker's own
usage.prompt_tokens_details.cached_tokens; the index equal to the workers'
contents (also after a router restart with no traffic, within 2 s); a killed
worker out of rotation within 1 s of its scrape failing; a restarted worker's
old blocks dropped; cache_salt tenants never sharing cache; DNS records added
and removed.

Run: python3 tests/integration/test_real_fleet.py --build-dir build
"""
import http.client
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from fleet import FleetTestCase, free_port, run_unittest_main, wait_until  # noqa: E402

BUILD_DIR = "build"
BLOCK = 16
SCRAPE_MS = 100


def prompt(tag, words=160):
    """A long prompt (placeholder tokenizer: about one token per word)."""
    return " ".join(f"{tag}-{i % 37}" for i in range(words))


def completion(f, text, salt=None, max_tokens=4):
    body = {"model": "mock-model", "prompt": text, "max_tokens": max_tokens}
    if salt:
        body["cache_salt"] = salt
    r = f.post("/v1/completions", body)
    assert r.status == 200, (r.status, r.body[:300])
    usage = r.json()["usage"]
    return (int(r.header("x-kvroute-worker")), int(r.header("x-kvroute-cached-tokens")),
            usage["prompt_tokens_details"]["cached_tokens"])


def mocker_stats(f, i):
    """GET /mocker/stats at the mocker's own address (DNS mockers share a port on 127.0.0.1-3)."""
    host, port = f.mocker_urls[i].split("//")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/mocker/stats")
    body = json.loads(conn.getresponse().read())
    conn.close()
    return body


def fleet_blocks(f, ids):
    return sum(mocker_stats(f, i)["kv_cached_blocks"] for i in ids)


def index_entries(f):
    return f.admin("GET", "/admin/index").json()["entries"]


def index_matches(f, ids, timeout):
    """Polls until the router's index holds exactly the workers' cached blocks."""
    return wait_until(lambda: index_entries(f) == fleet_blocks(f, ids), timeout, step=0.05)


def workers_by_id(f):
    return {w["worker_id"]: w for w in f.admin("GET", "/admin/workers").json()}


def static_config(endpoints):
    lines = ["workers:", f"  scrape_interval_ms: {SCRAPE_MS}", "  static:"]
    for i, (url, kv, replay) in sorted(endpoints.items()):
        lines += [f"    - {{id: {i}, url: \"{url}\", model: mock-model, kv_events: \"{kv}\", replay: \"{replay}\"}}"]
    return "\n".join(lines) + "\n"


class StaticFleet(FleetTestCase):
    """workers.static, three vLLM-mode mockers, no NATS. Tests run in name order."""
    tmp_prefix = "kvroute-realfleet-"
    fleet_options = {"block_size": BLOCK, "speedup": 20.0}

    @classmethod
    def start(cls, f):
        cls.endpoints = {}
        for i in (1, 2, 3):
            cls.endpoints[i] = f.start_vllm_mocker(i)
        f.start_router_config(static_config(cls.endpoints))
        f.wait_ready(3)

    def test_1_no_nats_process_and_workers_from_config(self):
        self.assertNotIn("nats", self.f.procs)
        ws = workers_by_id(self.f)
        self.assertEqual(sorted(ws), [1, 2, 3])
        for w in ws.values():
            self.assertEqual(w["source"], "static")
            self.assertEqual(w["health"], "ok")
        # Load comes from the scraped vLLM /metrics (not a heartbeat).
        self.assertTrue(wait_until(lambda: all(0 <= w["load_age_ms"] < 5000 for w in workers_by_id(self.f).values()),
                                   5))

    def test_2_affinity_and_cached_tokens_equal_the_workers(self):
        f = self.f
        text = prompt("affinity")
        first, cached0, worker_cached0 = completion(f, text)
        self.assertEqual(cached0, 0)
        self.assertEqual(worker_cached0, 0)
        self.assertTrue(index_matches(f, (1, 2, 3), 5), "index never caught up with the workers")
        for _ in range(4):
            w, cached, worker_cached = completion(f, text)
            self.assertEqual(w, first, "a shared prefix left its worker")
            self.assertGreater(cached, 0)
            self.assertEqual(cached, worker_cached, "router's cached tokens differ from the worker's")

    def test_3_cache_salt_tenants_never_share(self):
        f = self.f
        text = prompt("tenant")
        w_a, _, _ = completion(f, text, salt="tenant-a")
        self.assertTrue(index_matches(f, (1, 2, 3), 5))
        w_a2, cached_a, worker_cached_a = completion(f, text, salt="tenant-a")
        self.assertEqual(w_a2, w_a)
        self.assertGreater(cached_a, 0)
        self.assertEqual(cached_a, worker_cached_a)
        # Tenant b: the same prompt; nothing of tenant a's cache may be claimed,
        # on whichever worker it lands.
        _, cached_b, worker_cached_b = completion(f, text, salt="tenant-b")
        self.assertEqual(cached_b, 0)
        self.assertEqual(worker_cached_b, 0)
        # No salt at all is a third namespace.
        _, cached_none, worker_cached_none = completion(f, text)
        self.assertEqual((cached_none, worker_cached_none), (0, 0))

    def test_3b_kv_lookup_names_the_worker_holding_the_prompt(self):
        f = self.f
        text = prompt("lookup")
        w, _, _ = completion(f, text)
        self.assertTrue(index_matches(f, (1, 2, 3), 5))
        r = f.admin("POST", "/v1/kv/lookup", json.dumps({"model": "mock-model", "prompt": text}))
        self.assertEqual(r.status, 200, r.body)
        ans = r.json()
        self.assertEqual([h["worker_id"] for h in ans["workers"]], [w])
        held = ans["workers"][0]["matched_tokens"]
        self.assertGreater(held, 0)
        self.assertEqual(ans["layout_info"], {str(w): ["device", held]})
        # The engine then serves from its cache exactly what the lookup said it
        # holds (all but the last token when the whole prompt is held, as vLLM).
        w2, _, worker_cached = completion(f, text)
        self.assertEqual(w2, w)
        self.assertEqual(worker_cached, held if held < ans["prompt_tokens"] else held - ans["block_size"])
        # Another tenant's salt names another cache; no token, no answer.
        salted = f.admin("POST", "/v1/kv/lookup", json.dumps({"model": "mock-model", "prompt": text,
                                                              "cache_salt": "tenant-x"}))
        self.assertEqual(salted.json()["workers"], [])
        self.assertEqual(f.admin("POST", "/v1/kv/lookup", json.dumps({"tokens": [1]}), token=None).status, 401)

    def test_4_index_equals_the_workers_contents(self):
        f = self.f
        for k in range(6):
            completion(f, prompt(f"mix{k}", 60 + 16 * k))
        self.assertTrue(index_matches(f, (1, 2, 3), 5))
        self.assertGreater(index_entries(f), 0)

    def test_5_router_restarted_while_idle_rebuilds_the_index(self):
        f = self.f
        self.assertTrue(index_matches(f, (1, 2, 3), 5))
        want = fleet_blocks(f, (1, 2, 3))
        self.assertGreater(want, 0)
        f.kill("kvroute")
        f.start_router_config(static_config(self.endpoints))
        started = time.time()
        # No request is sent: the router asks each engine's replay socket.
        ok = wait_until(lambda: index_entries(f) == want, 2.0, step=0.05)
        took = time.time() - started
        self.assertTrue(ok, f"index {index_entries(f)} != fleet {want} after {took:.2f}s")
        print(f"\n  router restart: index equal to the fleet ({want} blocks) {took:.3f}s after start", flush=True)
        f.wait_ready(3)

    def test_6_killed_worker_leaves_rotation_at_its_next_scrape(self):
        f = self.f
        f.kill("mocker-3")
        killed = time.time()
        out = wait_until(lambda: workers_by_id(f)[3]["health"] != "ok", 6, step=0.02)
        took = time.time() - killed
        self.assertTrue(out, "the killed worker stayed a candidate")
        # Its next scrape is at most one interval away; then out at once
        # (refused). The bound leaves a loaded CI machine 3 s of slack; the
        # failure it guards against is a worker kept until a heartbeat TTL.
        self.assertLess(took, SCRAPE_MS / 1000 + 3.0)
        print(f"\n  killed worker out of the candidates {took:.3f}s after SIGKILL", flush=True)
        for k in range(9):
            w, _, _ = completion(f, prompt(f"after-kill-{k}", 40))
            self.assertNotEqual(w, 3)

    def test_7_restarted_worker_old_blocks_dropped(self):
        f = self.f
        url, kv, replay = self.endpoints[3]
        port = int(url.rsplit(":", 1)[1])
        zmq_port = int(kv.rsplit(":", 1)[1])
        replay_port = int(replay.rsplit(":", 1)[1])
        self.endpoints[3] = f.start_vllm_mocker(3, port=port, zmq_port=zmq_port, replay_port=replay_port)
        self.assertTrue(wait_until(lambda: workers_by_id(f)[3]["health"] == "ok", 5))
        # The restarted engine holds nothing: the index must not keep the old blocks.
        self.assertEqual(fleet_blocks(f, (3,)), 0)
        self.assertTrue(index_matches(f, (1, 2, 3), 3),
                        f"index {index_entries(f)} != fleet {fleet_blocks(f, (1, 2, 3))}")

    def test_8_admin_api_adds_and_removes_a_worker(self):
        f = self.f
        url, kv, replay = f.start_vllm_mocker(4)
        r = f.admin("POST", "/admin/workers",
                    f'{{"id": 4, "url": "{url}", "model": "mock-model", "kv_events": "{kv}", "replay": "{replay}"}}')
        self.assertEqual(r.status, 201, r.body)
        self.assertTrue(wait_until(lambda: 4 in workers_by_id(f) and workers_by_id(f)[4]["source"] == "admin", 3))
        self.assertEqual(f.admin("POST", "/admin/workers", '{"url": "ftp://x", "model": "m"}').status, 400)
        self.assertEqual(f.admin("DELETE", "/admin/workers/4").status, 200)
        self.assertNotIn(4, workers_by_id(f))
        self.assertEqual(f.admin("DELETE", "/admin/workers/4").status, 404)


class DnsServer:
    """A real DNS server (dnslib) on a free UDP port: `name` resolves to `addrs`."""

    def __init__(self, name, addrs):
        from dnslib import A, QTYPE, RR
        from dnslib.server import BaseResolver, DNSLogger, DNSServer
        self.addrs = list(addrs)
        outer = self

        class Resolver(BaseResolver):
            def resolve(self, request, handler):
                reply = request.reply()
                q = request.q
                if str(q.qname).rstrip(".") == name and q.qtype in (QTYPE.A, QTYPE.ANY):
                    for a in outer.addrs:
                        reply.add_answer(RR(q.qname, QTYPE.A, rdata=A(a), ttl=1))
                elif str(q.qname).rstrip(".") != name:
                    reply.header.rcode = 3  # NXDOMAIN
                return reply

        self.port = free_udp_port()
        quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
        self.server = DNSServer(Resolver(), port=self.port, address="127.0.0.1", logger=quiet)
        self.server.start_thread()

    def stop(self):
        self.server.stop()


def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free_on_all(port, hosts):
    for h in hosts:
        with socket.socket() as s:
            try:
                s.bind((h, port))
            except OSError:
                return False
    return True


def common_free_port(hosts):
    for _ in range(50):
        p = free_port()
        if port_free_on_all(p, hosts):
            return p
    raise RuntimeError("no port free on every loopback address")


class DnsFleet(FleetTestCase):
    """discovery.dns: one name, three A records (127.0.0.1-3), same ports."""

    HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
    tmp_prefix = "kvroute-dnsfleet-"
    fleet_options = {"block_size": BLOCK, "speedup": 20.0}
    dns = None

    @classmethod
    def start(cls, f):
        http_port, zmq_port, replay_port = (common_free_port(cls.HOSTS) for _ in range(3))
        for i, h in enumerate(cls.HOSTS, start=1):
            f.start_vllm_mocker(i, host=h, port=http_port, zmq_port=zmq_port, replay_port=replay_port)
        cls.dns = DnsServer("workers.kvroute.test", cls.HOSTS)
        cfg = (f"workers: {{scrape_interval_ms: {SCRAPE_MS}}}\n"
               "discovery:\n"
               "  dns_interval_ms: 200\n"
               f"  dns_servers: \"127.0.0.1:{cls.dns.port}\"\n"
               f"  dns: [{{host: workers.kvroute.test, port: {http_port}, model: mock-model, "
               f"kv_events_port: {zmq_port}, replay_port: {replay_port}}}]\n")
        f.start_router_config(cfg)
        f.wait_ready(3)

    @classmethod
    def stop(cls):
        if cls.dns:
            cls.dns.stop()

    def test_1_every_record_is_a_worker_with_affinity(self):
        f = self.f
        ws = workers_by_id(f)
        self.assertEqual(len(ws), 3)
        self.assertEqual({w["source"] for w in ws.values()}, {"dns"})
        self.assertEqual(sorted(w["url"].split("//")[1].split(":")[0] for w in ws.values()), list(self.HOSTS))
        text = prompt("dns-affinity")
        first, _, _ = completion(f, text)
        self.assertTrue(index_matches(f, (1, 2, 3), 5))
        for _ in range(3):
            w, cached, worker_cached = completion(f, text)
            self.assertEqual(w, first)
            self.assertGreater(cached, 0)
            self.assertEqual(cached, worker_cached)

    def test_2_a_record_that_disappears_removes_its_worker_and_blocks(self):
        f = self.f
        for k in range(6):
            completion(f, prompt(f"dns-mix{k}", 50 + 16 * k))
        self.assertTrue(index_matches(f, (1, 2, 3), 5))
        self.dns.addrs = ["127.0.0.1", "127.0.0.2"]
        self.assertTrue(wait_until(lambda: len(workers_by_id(f)) == 2, 5), "the removed record's worker stayed")
        self.assertTrue(index_matches(f, (1, 2), 3), "the removed worker's blocks stayed in the index")
        self.dns.addrs = list(self.HOSTS)
        self.assertTrue(wait_until(lambda: len(workers_by_id(f)) == 3, 5))
        self.assertTrue(index_matches(f, (1, 2, 3), 3), "the returning worker's cache was not replayed")


if __name__ == "__main__":
    run_unittest_main(globals())
