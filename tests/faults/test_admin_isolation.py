"""Admin work never stalls the data plane, and the admin API refuses what
would stop routing or lock the operator out (real nats-server, mockers and
kvroute).
- 5 MB YAML documents PUT to /admin/config again and again while a client
  sends about 20 requests a second: the client's latency stays within a bound
  set by a baseline measured in the same test (the YAML is parsed on the admin
  thread, never on an io thread of the data plane).
  The parse's memory is given back afterwards (RSS back within 100 MB of
  where it was).
- An admin body over admin.max_body_bytes is 413 naming the key.
- Each value that would disable routing or lock the operator out is 400
  naming the key, and nothing changes."""
import socket
import threading
import time
import uuid

from busfleet import FleetTestCase, completion, run_unittest_main, wait_until, FAST_MOCKER

BUILD_DIR = "build"


def big_yaml(size):
    """A YAML document of about `size` bytes that parses fully before its unknown key is refused."""
    line = "  - {name: entry, url: \"http://127.0.0.1:1\", weight: 0.5, tags: [a, b, c]}\n"
    return "scheduler:\n  gamma: 0.1\nunknown_section:\n" + line * (size // len(line))


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:")) / 1024


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


class AdminIsolation(FleetTestCase):
    tmp_prefix = "kvroute-admin-"
    fleet_options = {"router_args": ("--admin.max_body_bytes", str(8 << 20))}
    mocker_args = FAST_MOCKER

    def client_latencies(self, seconds):
        """About 20 requests a second for `seconds`, each on a new connection (so on every io thread)."""
        out = []
        end = time.time() + seconds
        while time.time() < end:
            t0 = time.time()
            r = self.f.post("/v1/completions", completion(uuid.uuid4().hex))
            self.assertEqual(r.status, 200, r.body)
            out.append(time.time() - t0)
            time.sleep(max(0.0, 0.05 - (time.time() - t0)))
        return out

    def test_large_config_put_does_not_stall_clients(self):
        f = self.f
        doc = big_yaml(5 << 20)
        pid = f.procs["kvroute"].pid
        rss_before = rss_mb(pid)
        # How long one PUT takes (parse and refusal), alone.
        t0 = time.time()
        r = f.admin("PUT", "/admin/config", doc)
        put_seconds = time.time() - t0
        self.assertEqual(r.status, 400, r.body[:300])
        self.assertIn(b"unknown_section", r.body)
        baseline = self.client_latencies(3)
        puts = []
        stop = threading.Event()

        def admin_load():
            while not stop.is_set():
                t = time.time()
                puts.append((f.admin("PUT", "/admin/config", doc).status, time.time() - t))
        t = threading.Thread(target=admin_load)
        t.start()
        try:
            time.sleep(0.2)  # the first PUT is being parsed
            during = self.client_latencies(max(3.0, 2.5 * put_seconds))
        finally:
            stop.set()
            t.join(120)
        self.assertTrue(puts and all(s == 400 for s, _ in puts), puts)
        base_p99, during_p99, during_max = percentile(baseline, 0.99), percentile(during, 0.99), max(during)
        print(f"\nPUT of {len(doc) >> 20} MB YAML: {put_seconds * 1e3:.0f} ms alone, {len(puts)} during the run; "
              f"client latency p99 {base_p99 * 1e3:.1f} ms before, {during_p99 * 1e3:.1f} ms during "
              f"(max {during_max * 1e3:.1f} ms), {len(during)} requests")
        # A parse on an io thread holds every request of that thread for the
        # whole parse (put_seconds); off it, a client waits at most a few
        # scheduling slices more than before.
        # The parse's memory (about 80 times the document) is given back after each PUT.
        self.assertTrue(wait_until(lambda: rss_mb(pid) < rss_before + 100, 10),
                        f"RSS {rss_mb(pid):.0f} MB after the PUTs, {rss_before:.0f} MB before")
        bound = 3 * base_p99 + 0.1
        self.assertLess(during_p99, bound, f"p99 {during_p99:.3f} s > {bound:.3f} s (PUT alone {put_seconds:.3f} s)")
        self.assertLess(during_max, max(bound, put_seconds / 2), "a request waited for a whole parse")

    def test_admin_body_limit(self):
        f = self.f
        try:
            self.assertEqual(f.admin("PUT", "/admin/config", "admin:\n  max_body_bytes: 65536\n").status, 200)
            r = f.admin("PUT", "/admin/config", big_yaml(200_000))
            self.assertEqual(r.status, 413, r.body[:300])
            self.assertIn(b"admin.max_body_bytes", r.body)
        finally:
            self.assertEqual(f.admin("PUT", "/admin/config", f"admin:\n  max_body_bytes: {8 << 20}\n").status, 200)

    def test_admin_connections_are_capped(self):
        f = self.f
        socks = [socket.create_connection(("127.0.0.1", f.admin_port), timeout=10) for _ in range(300)]
        try:
            refused = set()

            def settled():  # the connections beyond the 256th are answered 503 and closed
                for i, s in enumerate(socks):
                    if i in refused:
                        continue
                    s.setblocking(False)
                    try:
                        if s.recv(65536).startswith(b"HTTP/1.1 503"):
                            refused.add(i)
                    except BlockingIOError:
                        pass
                return len(refused) >= 300 - 256
            self.assertTrue(wait_until(settled, 10), len(refused))
            time.sleep(0.2)
            settled()
            self.assertEqual(len(refused), 300 - 256)
        finally:
            for s in socks:
                s.close()
        self.assertTrue(wait_until(lambda: f.admin("GET", "/admin/workers").status == 200, 10))

    def test_fatal_values_are_refused_naming_the_key(self):
        f = self.f
        before = f.admin("GET", "/admin/config").body
        for yaml_text, key in (("scheduler:\n  busy_kv_usage: 0\n", b"scheduler.busy_kv_usage"),
                               ("scheduler:\n  busy_slot_usage: 0\n", b"scheduler.busy_slot_usage"),
                               ("admin:\n  token: ''\n", b"admin.token"),
                               ("router:\n  first_byte_timeout_ms: 1\n", b"router.first_byte_timeout_ms"),
                               ("router:\n  client_read_timeout_ms: 1\n", b"router.client_read_timeout_ms"),
                               ("router:\n  idle_timeout_ms: 1\n", b"router.idle_timeout_ms"),
                               ("router:\n  connect_timeout_ms: 1\n", b"router.connect_timeout_ms")):
            r = f.admin("PUT", "/admin/config", yaml_text)
            self.assertEqual(r.status, 400, (yaml_text, r.body))
            self.assertIn(key, r.body)
        self.assertEqual(f.admin("GET", "/admin/config").body, before)  # the operator still gets in; nothing changed
        r = f.post("/v1/completions", completion("still routing " + uuid.uuid4().hex))
        self.assertEqual(r.status, 200, r.body)


if __name__ == "__main__":
    run_unittest_main(globals())
