"""A publisher with bus access cannot steer traffic with forged heartbeats
(real nats-server, mockers and kvroute; a forger's HTTP server counts what
reaches it).
- A heartbeat announcing a URL outside events.worker_url_allow: the worker
  never joins, 0 requests reach that URL.
- A heartbeat re-announcing a known worker's id with another (allowed) URL:
  refused, 0 requests reach the forger, the worker keeps its URL.
- 20,000 forged workers at unlisted URLs: legitimate requests keep succeeding
  (every one 200) and the fleet stays as it was.
- New worker ids beyond events.max_bus_workers are refused and counted; the
  known workers keep serving."""
import http.server
import json
import threading
import uuid

from busfleet import FleetTestCase, NatsRaw, completion, free_port, wait_until, run_unittest_main, FAST_MOCKER

BUILD_DIR = "build"
MAX_BUS_WORKERS = 8
REJECTED = "kvroute_events_heartbeats_rejected_total{{reason=\"{}\"}}"


class Forger:
    """An HTTP server posing as a worker: answers every completion with 200 and counts requests."""

    def __init__(self):
        self.count = 0
        forger = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                forger.count += 1
                body = json.dumps({"id": "x", "object": "text_completion", "model": "mock-model",
                                   "choices": [{"index": 0, "text": "forged", "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def heartbeat(worker_id, url):
    return json.dumps({"worker_id": worker_id, "url": url, "model": "mock-model", "block_size": 16,
                       "kv_events": False, "load": {"request_active_slots": 0, "request_total_slots": 1000,
                                                    "num_requests_waiting": 0, "kv_active_blocks": 0,
                                                    "kv_total_blocks": 100000}})


class HeartbeatTrust(FleetTestCase):
    tmp_prefix = "kvroute-hbtrust-"

    @classmethod
    def start(cls, f):
        cls.unlisted = Forger()
        cls.listed = Forger()  # an allowed host the attacker controls
        f.start_nats()
        for w in (1, 2):
            f.start_mocker(w, FAST_MOCKER)
        allow = ",".join([f.mocker_urls[1], f.mocker_urls[2], cls.listed.url])
        f.router_args = ["--events.worker_url_allow", allow, "--events.max_bus_workers", str(MAX_BUS_WORKERS)]
        f.start_router()
        f.wait_ready(2)

    @classmethod
    def stop(cls):
        for forger in ("unlisted", "listed"):
            if hasattr(cls, forger):
                getattr(cls, forger).close()

    def setUp(self):
        # Forged workers of an earlier test expire (events.worker_ttl_ms) first.
        self.assertTrue(wait_until(lambda: self.f.metric("kvroute_scheduler_workers") == 2, 10),
                        self.f.metric("kvroute_scheduler_workers"))

    def forge_while_serving(self, payloads, refused, requests=40):
        """Publishes `payloads` (cycled, every 50 ms) while sending `requests` requests; returns their statuses.
        The requests start once the router has refused a forged heartbeat (the `refused` reason's count
        rose): each request then meets the forgery, however slowly the machine runs."""
        before = self.f.metric(REJECTED.format(refused))
        stop = threading.Event()

        def publish():
            nats = NatsRaw(self.f.nats_port)
            while not stop.is_set():
                for p in payloads:
                    nats.pub("kvroute.workers", p)
                nats.flush()
                stop.wait(0.05)
            nats.close()
        t = threading.Thread(target=publish)
        t.start()
        try:
            self.assertTrue(wait_until(lambda: self.f.metric(REJECTED.format(refused)) > before, 10),
                            f"no heartbeat refused as {refused}")
            statuses = [self.f.post("/v1/completions", completion(uuid.uuid4().hex)).status for _ in range(requests)]
        finally:
            stop.set()
            t.join(10)
        return statuses

    def test_unlisted_url_never_joins(self):
        f = self.f
        before = f.metric(REJECTED.format("url_not_allowed"))
        statuses = self.forge_while_serving([heartbeat(77, self.unlisted.url)], "url_not_allowed")
        self.assertEqual(statuses, [200] * len(statuses))
        self.assertEqual(self.unlisted.count, 0, "requests reached an unlisted worker URL")
        self.assertGreater(f.metric(REJECTED.format("url_not_allowed")), before)
        self.assertEqual(f.metric("kvroute_scheduler_workers"), 2)

    def test_known_worker_keeps_its_url(self):
        f = self.f
        before = f.metric(REJECTED.format("url_changed"))
        statuses = self.forge_while_serving([heartbeat(1, self.listed.url)], "url_changed", requests=60)
        self.assertEqual(statuses, [200] * len(statuses))
        self.assertEqual(self.listed.count, 0, "requests for worker 1 reached the forger")
        self.assertGreater(f.metric(REJECTED.format("url_changed")), before)
        urls = {w["worker_id"]: w["url"] for w in f.admin("GET", "/admin/workers").json()}
        self.assertEqual(urls[1], f.mocker_urls[1])

    def test_flood_of_forged_workers_leaves_requests_succeeding(self):
        f = self.f
        before = f.metric(REJECTED.format("url_not_allowed"))
        statuses = []
        stop = threading.Event()

        def legitimate():  # about 20 requests a second for the whole flood
            while not stop.is_set():
                statuses.append(f.post("/v1/completions", completion(uuid.uuid4().hex)).status)
                stop.wait(0.05)
        t = threading.Thread(target=legitimate)
        t.start()
        try:
            nats = NatsRaw(f.nats_port)
            closed = free_port()  # nothing listens there
            for rounds in range(2):
                for i in range(20000):
                    nats.pub("kvroute.workers", heartbeat(1000 + i, f"http://127.0.0.1:{closed}/w{i}"))
                nats.flush()
            nats.close()
            # The legitimate requests go on until the router has refused the whole flood.
            refused = wait_until(lambda: f.metric(REJECTED.format("url_not_allowed")) >= before + 40000, 20)
        finally:
            stop.set()
            t.join(30)
        self.assertGreater(len(statuses), 5)
        self.assertEqual(statuses, [200] * len(statuses), f"{statuses.count(503)} of {len(statuses)} got 503")
        self.assertTrue(refused, f.metric(REJECTED.format("url_not_allowed")) - before)
        self.assertEqual(f.metric("kvroute_scheduler_workers"), 2)

    def test_new_workers_beyond_the_cap_are_refused(self):
        f = self.f
        before = f.metric(REJECTED.format("too_many_workers"))
        # Forged ids at the real workers' own (allowed) URLs.
        payloads = [heartbeat(5000 + i, f.mocker_urls[1 + i % 2]) for i in range(200)]
        statuses = self.forge_while_serving(payloads, "too_many_workers")
        self.assertEqual(statuses, [200] * len(statuses))
        self.assertLessEqual(f.metric("kvroute_events_bus_workers"), MAX_BUS_WORKERS)
        self.assertLessEqual(f.metric("kvroute_scheduler_workers"), MAX_BUS_WORKERS)
        self.assertGreaterEqual(f.metric(REJECTED.format("too_many_workers")), before + 200 - MAX_BUS_WORKERS)
        ids = {w["worker_id"] for w in f.admin("GET", "/admin/workers").json()}
        self.assertTrue({1, 2} <= ids, ids)  # the known workers kept their places
        self.assertEqual(self.listed.count + self.unlisted.count, 0)


if __name__ == "__main__":
    run_unittest_main(globals())
