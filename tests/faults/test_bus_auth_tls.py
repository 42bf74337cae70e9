"""NATS with authentication and TLS: a nats-server requiring TLS (certificate
made at test time with openssl) and user/password. kvroute configured with
events.nats_user/nats_password/nats_tls_ca_file connects and routes; without
credentials, or without trusting the CA, it is refused at start-up."""
import json
import os
import subprocess
import tempfile
import time
import unittest

from busfleet import Fleet, NatsRaw, completion, start_nats_conf, wait_until, run_unittest_main

BUILD_DIR = "build"


def make_certs(d):
    """A CA and a server certificate for 127.0.0.1 signed by it."""
    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=kvroute test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "san.ext"), "w") as fh:
        fh.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    return {k: os.path.join(d, k) for k in ("ca.pem", "server.pem", "server.key")}


def start_mocker_without_nats(f, worker_id):
    from busfleet import read_line_matching
    args = [os.path.join(BUILD_DIR, "mocker", "kvroute-mocker"), "--worker-id", str(worker_id), "--port", "0",
            "--speedup", "20"]
    proc = f._spawn(f"mocker-{worker_id}", args)
    line = read_line_matching(proc, "listening on", 20)
    f.mocker_urls[worker_id] = line.split("listening on", 1)[1].strip()
    return f.mocker_urls[worker_id]


class NatsAuthTls(unittest.TestCase):
    def router_exit(self, f, args):
        """Starts kvroute expecting it to refuse; returns (exit code, stderr)."""
        cmd = [os.path.join(BUILD_DIR, "router", "kvroute"), "--router.host", "127.0.0.1", "--router.port", "0",
               "--admin.port", "0", "--events.nats_url", f"tls://127.0.0.1:{f.nats_port}",
               "--events.connect_timeout_ms", "3000", *args]
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, timeout=30)
        return p.returncode, p.stderr.decode(errors="replace"), time.time() - t0

    def test_tls_and_user_password(self):
        with tempfile.TemporaryDirectory() as d, Fleet(BUILD_DIR, d) as f:
            c = make_certs(d)
            start_nats_conf(f, f"""
tls {{ cert_file: "{c['server.pem']}", key_file: "{c['server.key']}", timeout: 2 }}
authorization {{ user: kvr, password: "s3cret-pw" }}
""")
            # A worker without NATS of its own: its heartbeat is published here over TLS.
            mocker_url = start_mocker_without_nats(f, 1)
            f.router_args = ["--events.nats_user", "kvr", "--events.nats_password", "s3cret-pw",
                             "--events.nats_tls_ca_file", c["ca.pem"]]
            # start_router builds the URL from nats_url (nats://); TLS is required by the server and
            # implied on our side by nats_tls_ca_file.
            f.start_router()
            nats = NatsRaw(f.nats_port, user="kvr", password="s3cret-pw", cafile=c["ca.pem"])
            hb = {"worker_id": 1, "url": mocker_url, "model": "mock-model", "block_size": 16, "kv_events": False}

            def ready():
                nats.pub("kvroute.workers", json.dumps(hb))
                nats.flush()
                return f.get("/ready").status == 200
            self.assertTrue(wait_until(ready, 10, step=0.2), "router never saw the heartbeat over TLS")
            r = f.post("/v1/completions", completion("hello over tls " * 20))
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(r.header("x-kvroute-worker"), "1")
            self.assertEqual(f.metric("kvroute_events_nats_connected"), 1)
            nats.close()

            # Refused: no credentials; wrong password; CA not trusted.
            code, err, took = self.router_exit(f, ["--events.nats_tls_ca_file", c["ca.pem"]])
            self.assertNotEqual(code, 0)
            self.assertIn("uthorization", err)
            code, err, took = self.router_exit(f, ["--events.nats_tls_ca_file", c["ca.pem"], "--events.nats_user",
                                                   "kvr", "--events.nats_password", "wrong"])
            self.assertNotEqual(code, 0)
            self.assertIn("uthorization", err)
            code, err, took = self.router_exit(f, ["--events.nats_tls", "true", "--events.nats_user", "kvr",
                                                   "--events.nats_password", "s3cret-pw"])
            self.assertNotEqual(code, 0, "a server certificate from an untrusted CA must be refused")
            print(f"\nTLS + user/password: routed over TLS; refusals: no credentials, wrong password, untrusted CA "
                  f"(last refused in {took:.2f} s)")
            # And a plaintext client is refused by the server.
            with self.assertRaises(Exception):
                NatsRaw(f.nats_port, user="kvr", password="s3cret-pw", cafile="/nonexistent-ca.pem")


if __name__ == "__main__":
    run_unittest_main(globals())
