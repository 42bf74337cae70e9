"""The admin listener as an operator meets it: it binds loopback unless
admin.host says otherwise (empty: where the router binds), and a second
kvroute whose admin port is taken exits with a message that names admin.port
(not a bare exit 1).

Run: python3 tests/integration/test_admin_listener.py --build-dir build
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from fleet import Fleet, read_line_matching, run_unittest_main  # noqa: E402

BUILD_DIR = "build"


class AdminListenerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kvroute-admin-")
        self.fleet = Fleet(BUILD_DIR, self.tmp.name)
        self.fleet.start_nats()

    def tearDown(self):
        self.fleet.close()
        self.tmp.cleanup()

    def kvroute(self, name, *flags, router_host="127.0.0.1"):
        args = [os.path.join(BUILD_DIR, "router", "kvroute"), "--router.host", router_host, "--router.port", "0",
                "--events.nats_url", self.fleet.nats_url, *flags]
        return self.fleet._spawn(name, args)

    def test_admin_on_loopback_serves_the_status_page(self):
        line = read_line_matching(self.kvroute("first", "--admin.port", "0"), "listening on", 20)
        m = re.search(r"listening on http://([^:]+):\d+ admin http://([^:]+):(\d+)", line)
        self.assertEqual(m.group(2), "127.0.0.1", line)
        # The status page is there.
        r = self.fleet.request("GET", "/ui", port=int(m.group(3)))
        self.assertEqual(r.status, 200)

    def test_admin_stays_on_loopback_unless_configured(self):
        # The router on another address (127.0.0.2, still loopback): the admin
        # listener does not follow it by default; admin.host "" makes it follow.
        line = read_line_matching(self.kvroute("own", "--admin.port", "0", router_host="127.0.0.2"),
                                  "listening on", 20)
        m = re.search(r"listening on http://([^:]+):\d+ admin http://([^:]+):(\d+)", line)
        self.assertEqual((m.group(1), m.group(2)), ("127.0.0.2", "127.0.0.1"), line)
        line = read_line_matching(self.kvroute("follow", "--admin.port", "0", "--admin.host", "",
                                               router_host="127.0.0.2"), "listening on", 20)
        m = re.search(r"listening on http://([^:]+):\d+ admin http://([^:]+):(\d+)", line)
        self.assertEqual((m.group(1), m.group(2)), ("127.0.0.2", "127.0.0.2"), line)

    def test_second_kvroute_with_the_admin_port_taken_says_so(self):
        line = read_line_matching(self.kvroute("first", "--admin.port", "0"), "listening on", 20)
        admin_port = re.search(r"admin http://[^:]+:(\d+)", line).group(1)
        second = self.kvroute("second", "--admin.port", admin_port)
        self.assertEqual(second.wait(timeout=20), 1)
        err = open(os.path.join(self.tmp.name, "second.log")).read()
        self.assertIn(f"admin.port: cannot open the admin listener on 127.0.0.1:{admin_port}", err)
        self.assertIn("set admin.port", err)
        # The first one is untouched.
        self.assertIsNone(self.fleet.procs["first"].poll())


if __name__ == "__main__":
    run_unittest_main(globals())
