#!/usr/bin/env python3
"""Validates the kvroute Helm chart without helm.

Renders helm/kvroute with kvroute-helm-render (helm/tools/render) under several
value sets and checks: YAML validity, object heads, the expected objects,
probes, drain settings, basic schema of every kind emitted, selector/label
wiring, Secret/env wiring, the config mirror (values.yaml `config:` ==
ConfigMap kvroute.yaml == the daemon's `--print-config` key set; the daemon
loads the rendered file), the bundled nats.conf under a real nats-server with
kvroute connecting through the Secret's credentials (when nats-server is on
PATH), the Grafana dashboard and values.yaml documentation.

Usage: test_chart.py --render BIN [--kvroute-bin PATH]
  --kvroute-bin (or KVROUTE_BIN): the daemon; without it the checks that need
  it are skipped (counted as skipped). Run through helm/tests/test_chart.sh.
Ends with "N passed, M failed[, K skipped]"; exit status 1 if any failed.
"""
import argparse
import base64
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

HELM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(HELM, "kvroute")
HA = os.path.join(CHART, "values-ha.yaml")
GEN_DASHBOARD = os.path.join(HELM, "tools", "dashboard", "gen_dashboard.py")

# Metrics the daemon exports (names are final; see the brief / router_metrics.h).
METRICS = {
    "kvroute_router_requests_total", "kvroute_router_request_duration_seconds", "kvroute_router_ttfb_seconds",
    "kvroute_router_upstream_errors_total", "kvroute_router_retries_total", "kvroute_router_cancels_total",
    "kvroute_router_inflight_requests", "kvroute_router_decision_seconds", "kvroute_router_overlap_ratio",
    "kvroute_router_prompt_tokens_total", "kvroute_router_cached_tokens_total",
    "kvroute_router_worker_prompt_tokens_total", "kvroute_router_worker_cached_tokens_total",
    "kvroute_scheduler_decisions_total", "kvroute_scheduler_workers", "kvroute_scheduler_worker_kv_usage_ratio",
    "kvroute_scheduler_worker_active_requests", "kvroute_indexer_blocks", "kvroute_indexer_entries",
    "kvroute_indexer_bytes", "kvroute_indexer_events_total", "kvroute_indexer_event_gaps_total",
    "kvroute_indexer_resyncs_total", "kvroute_events_messages_total", "kvroute_events_rejected_total",
    "kvroute_events_queue_dropped_total", "kvroute_events_nats_connected", "kvroute_events_nats_reconnects_total",
    "kvroute_config_reloads_total", "kvroute_router_tokenized_requests_total", "kvroute_router_engine_tokenize_total",
    "kvroute_router_engine_tokenize_cache_total", "kvroute_scheduler_all_busy_total",
    "kvroute_scheduler_slots_full_total",
    # disaggregated prefill/decode (router/router_metrics.h)
    "kvroute_pd_requests_total", "kvroute_pd_retries_total", "kvroute_pd_params_rejected_total",
    "kvroute_pd_releases_total", "kvroute_pd_prefill_legs_total", "kvroute_pd_transfers_left_total",
    "kvroute_pd_client_gone_total", "kvroute_pd_leg_seconds",
    # shared KV pools (indexer.kv_pools) and authentication
    "kvroute_router_pool_hits_total", "kvroute_router_pool_hit_tokens_total", "kvroute_indexer_pool_blocks",
    "kvroute_indexer_pool_events_total", "kvroute_indexer_pool_events_refused_total",
    "kvroute_indexer_pools_emptied_total", "kvroute_indexer_pool_resyncs_total", "kvroute_indexer_pools_stale",
    "kvroute_router_auth_failures_total", "kvroute_admin_auth_failures_total",
}
HISTOGRAMS = {"kvroute_router_request_duration_seconds", "kvroute_router_ttfb_seconds",
              "kvroute_router_decision_seconds", "kvroute_router_overlap_ratio", "kvroute_pd_leg_seconds"}

# values.yaml `config:` defaults that deliberately differ from the daemon's.
CHART_DEFAULT_EXCEPTIONS = {
    "events.nats_url": "empty = the bundled NATS Service (or required when nats.enabled=false)",
    "events.worker_url_allow": "the private address ranges pods have (the daemon's default admits loopback only)",
    "admin.host": "0.0.0.0: the admin Service must reach the pod (the daemon defaults to loopback)",
}

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class Results:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def check(self, cond, name, detail=""):
        if cond:
            self.passed += 1
            print(f"PASS {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}" + (f": {detail}" if detail else ""))
        return cond

    def skip(self, name, why):
        self.skipped += 1
        print(f"SKIP {name}: {why}")


R = Results()


def render(render_bin, *args, release="kvroute", namespace="kvr", expect_fail=False):
    cmd = [render_bin, "-n", namespace, *args, release, CHART]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if expect_fail:
        return p
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return p.stdout


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (the API server would keep only one)."""


def _strict_mapping(loader, node, deep=False):
    keys = set()
    for k, _ in node.value:
        key = loader.construct_object(k, deep=deep)
        if key in keys:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", k.start_mark)
        keys.add(key)
    return loader.construct_mapping(node, deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)


def docs_of(text):
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d is not None]


def find(docs, kind, name=None):
    return [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, path + "."))
        else:
            out[path] = v
    return out


def list_text(v):
    """A YAML list of mappings (workers.static, discovery.dns) in the daemon's text form."""
    if not isinstance(v, list):
        return v
    def field(x):
        return ":".join(map(str, x)) if isinstance(x, list) else str(x)
    return ";".join(",".join(f"{k}={field(x)}" for k, x in e.items()) for e in v)


def same_value(a, b):
    """Equal as the daemon would read them (it parses every scalar from its text)."""
    a, b = list_text(a), list_text(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return str(a).lower() == str(b).lower()
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def kvroute_yaml(docs, fullname="kvroute"):
    cm = find(docs, "ConfigMap", fullname)
    return yaml.safe_load(cm[0]["data"]["kvroute.yaml"]) if cm else None


def pod_templates(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            yield d, d["spec"]["template"]


def subset(sel, labels):
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())


# ---- generic schema checks for every kind the chart emits ----

def check_schema(docs, label):
    names = set()
    for d in docs:
        kind, meta = d.get("kind"), d.get("metadata") or {}
        ident = f"{label}: {kind}/{meta.get('name')}"
        R.check(isinstance(d.get("apiVersion"), str) and isinstance(kind, str) and isinstance(meta.get("name"), str),
                f"{ident} has apiVersion, kind, metadata.name")
        R.check(DNS1123.match(meta.get("name", "")) and len(meta["name"]) <= 63, f"{ident} name is DNS-1123, <= 63")
        R.check((kind, meta.get("name")) not in names, f"{ident} is unique")
        names.add((kind, meta.get("name")))
        labels = meta.get("labels") or {}
        R.check(all(isinstance(v, str) and len(v) <= 63 for v in labels.values()), f"{ident} label values are strings")
        if kind in ("Deployment", "StatefulSet"):
            check_workload(d, ident)
        elif kind == "Service":
            check_service(d, docs, ident)
        elif kind == "ConfigMap":
            R.check(all(isinstance(v, str) for v in (d.get("data") or {}).values()), f"{ident} data are strings")
        elif kind == "Secret":
            ok = True
            for v in (d.get("data") or {}).values():
                try:
                    base64.b64decode(v, validate=True)
                except Exception:
                    ok = False
            R.check(ok, f"{ident} data are base64")
        elif kind == "PodDisruptionBudget":
            spec = d["spec"]
            R.check(("minAvailable" in spec) != ("maxUnavailable" in spec), f"{ident} has one of min/maxUnavailable")
            R.check(any(subset(spec["selector"]["matchLabels"], t["metadata"]["labels"]) for _, t in pod_templates(docs)
                        if _["kind"] == "Deployment"), f"{ident} selects the router pods")
        elif kind == "HorizontalPodAutoscaler":
            spec = d["spec"]
            R.check(d["apiVersion"] == "autoscaling/v2", f"{ident} is autoscaling/v2")
            tgt = spec["scaleTargetRef"]
            R.check(find(docs, tgt["kind"], tgt["name"]) != [], f"{ident} targets a rendered {tgt['kind']}")
            R.check(isinstance(spec["minReplicas"], int) and spec["minReplicas"] <= spec["maxReplicas"],
                    f"{ident} minReplicas <= maxReplicas")
            R.check(len(spec.get("metrics") or []) > 0, f"{ident} has metrics")
            dep = find(docs, "Deployment", tgt["name"])
            R.check(dep and "replicas" not in dep[0]["spec"], f"{ident}: the Deployment leaves replicas to the HPA")
        elif kind == "ServiceMonitor":
            spec = d["spec"]
            sel = spec["selector"]["matchLabels"]
            svcs = [s for s in find(docs, "Service") if subset(sel, s["metadata"]["labels"])]
            R.check(len(svcs) == 1, f"{ident} selects exactly one Service", str([s["metadata"]["name"] for s in svcs]))
            if svcs:
                pnames = {p["name"] for p in svcs[0]["spec"]["ports"]}
                R.check(all(e["port"] in pnames and e["path"] == "/metrics" for e in spec["endpoints"]),
                        f"{ident} scrapes /metrics on a named Service port")


def check_workload(d, ident):
    spec = d["spec"]
    tmpl = spec["template"]
    R.check(subset(spec["selector"]["matchLabels"], tmpl["metadata"]["labels"]), f"{ident} selector matches pod labels")
    pod = tmpl["spec"]
    volumes = {v["name"] for v in pod.get("volumes") or []}
    volumes |= {v["metadata"]["name"] for v in spec.get("volumeClaimTemplates") or []}
    for c in pod["containers"]:
        cid = f"{ident} container {c.get('name')}"
        R.check(isinstance(c.get("image"), str) and ":" in c["image"] and not c["image"].endswith(":"),
                f"{cid} has image with tag", str(c.get("image")))
        ports = c.get("ports") or []
        R.check(all(isinstance(p["containerPort"], int) and 0 < p["containerPort"] < 65536 for p in ports),
                f"{cid} ports are ints in range")
        R.check(all(len(p.get("name", "")) <= 15 for p in ports), f"{cid} port names <= 15 chars")
        pnames = {p["name"] for p in ports}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in c:
                port = c[probe]["httpGet"]["port"]
                R.check(port in pnames or isinstance(port, int), f"{cid} {probe} port {port} exists")
        R.check(all(m["name"] in volumes for m in c.get("volumeMounts") or []), f"{cid} mounts existing volumes")
        env_names = [e["name"] for e in c.get("env") or []]
        R.check(len(env_names) == len(set(env_names)), f"{cid} env names unique")


def check_service(d, docs, ident):
    spec = d["spec"]
    R.check(all(isinstance(p["port"], int) and 0 < p["port"] < 65536 for p in spec["ports"]), f"{ident} ports are ints")
    pods = [(w, t) for w, t in pod_templates(docs) if subset(spec.get("selector"), t["metadata"]["labels"])]
    R.check(len(pods) == 1, f"{ident} selects exactly one workload's pods")
    if pods:
        cports = {p["name"]: p["containerPort"] for c in pods[0][1]["spec"]["containers"] for p in c.get("ports") or []}
        R.check(all(p["targetPort"] in cports or p["targetPort"] in cports.values() for p in spec["ports"]),
                f"{ident} targetPorts name container ports")


# ---- kvroute-specific checks ----

def check_router(docs, vals, label, fullname="kvroute", namespace="kvr"):
    dep = find(docs, "Deployment", fullname)
    if not R.check(len(dep) == 1, f"{label}: Deployment {fullname}"):
        return
    dep = dep[0]
    R.check(all(d["metadata"].get("namespace") == namespace for d in docs
                if d["kind"] != "ConfigMap" or not d["metadata"]["name"].endswith("-dashboard")),
            f"{label}: objects in namespace {namespace}")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    cfg = vals["config"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    R.check(ports.get("http") == cfg["router"]["port"] and ports.get("admin") == cfg["admin"]["port"],
            f"{label}: container ports are config.router.port / config.admin.port", str(ports))
    R.check(c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}, f"{label}: liveness GET /health")
    R.check(c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}, f"{label}: readiness GET /ready")
    args = c.get("args") or []
    R.check(args[:2] == ["--config", "/etc/kvroute/kvroute.yaml"], f"{label}: --config /etc/kvroute/kvroute.yaml",
            str(args))
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vol = {v["name"]: v for v in pod["volumes"]}.get(mounts.get("/etc/kvroute"), {})
    R.check(vol.get("configMap", {}).get("name") == fullname and
            {"key": "kvroute.yaml", "path": "kvroute.yaml"} in vol["configMap"].get("items", []),
            f"{label}: /etc/kvroute/kvroute.yaml comes from ConfigMap {fullname}")
    pre = c.get("lifecycle", {}).get("preStop", {})
    sleep = pre.get("sleep", {}).get("seconds")
    if sleep is None and pre.get("exec"):
        cmd = pre["exec"]["command"]
        sleep = int(cmd[1]) if cmd[0] == "sleep" else None
    R.check(sleep is not None and sleep > 0, f"{label}: preStop sleeps before SIGTERM")
    grace = cfg["router"]["shutdown_grace_ms"] / 1000.0
    R.check(pod["terminationGracePeriodSeconds"] >= (sleep or 0) + grace,
            f"{label}: terminationGracePeriodSeconds >= preStop + router.shutdown_grace_ms",
            f"{pod['terminationGracePeriodSeconds']} vs {sleep} + {grace}")
    svcs = find(docs, "Service")
    by_listener = {s["metadata"]["labels"].get("kvroute.io/listener"): s for s in svcs}
    R.check("openai" in by_listener and by_listener["openai"]["spec"]["ports"][0]["targetPort"] == "http",
            f"{label}: OpenAI Service -> http")
    R.check("admin" in by_listener and by_listener["admin"]["spec"]["ports"][0]["targetPort"] == "admin",
            f"{label}: admin Service -> admin")
    R.check(find(docs, "ConfigMap", fullname) != [], f"{label}: config ConfigMap")
    dash = find(docs, "ConfigMap", fullname + "-dashboard")
    if R.check(len(dash) == 1 and dash[0]["metadata"]["labels"].get("grafana_dashboard") == "1",
               f"{label}: dashboard ConfigMap labelled grafana_dashboard: \"1\""):
        with open(os.path.join(CHART, "dashboards", "kvroute.json")) as f:
            R.check(json.loads(dash[0]["data"]["kvroute.json"]) == json.load(f),
                    f"{label}: dashboard ConfigMap holds dashboards/kvroute.json")
    # Config mirror: every values key reaches kvroute.yaml unchanged.
    rendered = flatten(kvroute_yaml(docs, fullname) or {})
    expected = flatten(cfg)
    R.check(set(rendered) == set(expected), f"{label}: kvroute.yaml has exactly the config: keys",
            str(set(rendered) ^ set(expected)))
    bad = [k for k in expected if k != "events.nats_url" and not same_value(rendered.get(k), expected[k])]
    R.check(not bad, f"{label}: every config: value reaches kvroute.yaml", str(bad))
    if vals["config"]["events"]["nats_url"]:
        R.check(rendered.get("events.nats_url") == expected["events.nats_url"], f"{label}: events.nats_url as set")
    return dep


def env_of(dep):
    return {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0].get("env") or []}


def load_values(*files, sets=()):
    vals = {}

    def merge(a, b):
        for k, v in b.items():
            if isinstance(v, dict) and isinstance(a.get(k), dict):
                merge(a[k], v)
            else:
                a[k] = v
    for f in files:
        with open(f) as fh:
            merge(vals, yaml.safe_load(fh) or {})
    for s in sets:
        k, v = s.split("=", 1)
        d = vals
        *head, last = k.split(".")
        for h in head:
            d = d.setdefault(h, {})
        d[last] = yaml.safe_load(v)
    return vals


# Keys whose value is free-form Kubernetes data (their children are not chart keys).
DATA_KEYS = {"resources", "podSecurityContext", "securityContext", "behavior", "labels", "annotations",
             "podAnnotations", "podLabels", "nodeSelector", "affinity", "tolerations", "topologySpreadConstraints",
             "imagePullSecrets", "extraEnv", "extraArgs", "updateStrategy"}


def check_values_documented():
    """Every chart key in values.yaml and values-ha.yaml has a comment line above it."""
    for path in (os.path.join(CHART, "values.yaml"), HA):
        lines = open(path).read().splitlines()
        missing = []
        stack = []  # (indent, key)
        for i, line in enumerate(lines):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            indent = len(line) - len(line.lstrip())
            while stack and stack[-1][0] >= indent:
                stack.pop()
            m = re.match(r"^\s*([A-Za-z_][\w.-]*):", line)
            if not m:
                continue  # list items
            key = m.group(1)
            is_data = any(k in DATA_KEYS for _, k in stack)
            stack.append((indent, key))
            if is_data:
                continue
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            if j < 0 or not lines[j].lstrip().startswith("#"):
                missing.append(f"{i + 1} {key}")
        R.check(not missing, f"{os.path.basename(path)}: a comment above every key", ", ".join(missing))


def check_dashboard():
    path = os.path.join(CHART, "dashboards", "kvroute.json")
    try:
        with open(path) as f:
            text = f.read()
        dash = json.loads(text)
    except Exception as e:  # noqa: BLE001
        R.check(False, "dashboard is valid JSON", str(e))
        return
    R.check(True, "dashboard is valid JSON")
    R.check(dash.get("schemaVersion", 0) >= 36, "dashboard has a Grafana 10 schemaVersion")
    tvars = dash.get("templating", {}).get("list", [])
    R.check(any(v.get("type") == "datasource" and v.get("query") == "prometheus" for v in tvars),
            "dashboard has a Prometheus datasource variable")
    exprs = []
    ids = []
    for p in dash["panels"]:
        ids.append(p["id"])
        if p["type"] == "row":
            continue
        R.check(p.get("datasource", {}).get("uid") == "${datasource}", f"panel '{p['title']}' uses $datasource")
        for t in p.get("targets", []):
            exprs.append(t["expr"])
    R.check(len(ids) == len(set(ids)), "dashboard panel ids are unique")
    used = set()
    for e in exprs:
        for m in re.findall(r"kvroute_[a-z_]+", e):
            base = re.sub(r"_(bucket|sum|count)$", "", m)
            if base not in METRICS:
                base = m
            used.add(base)
    unknown = used - METRICS
    R.check(not unknown, "dashboard references only exported metrics", str(sorted(unknown)))
    R.check(not (METRICS - used), "dashboard covers every exported metric", str(sorted(METRICS - used)))
    # The families declared in the daemon's sources for PD, the shared pools and
    # authentication are all in METRICS (so all on the dashboard).
    repo = os.path.dirname(HELM)
    declared = set()
    for rel in ("router/router_metrics.h", "router/admin_api.cpp", "indexer/indexer_metrics.cpp",
                "router/flow/flow_control.cpp"):
        with open(os.path.join(repo, rel)) as f:
            declared |= set(re.findall(r'"(kvroute_[a-z_]+)"', f.read()))
    wanted = {m for m in declared if m.startswith("kvroute_pd_") or "_pool" in m or "auth_failures" in m}
    R.check(len(wanted) >= 16 and not (wanted - METRICS),
            "every PD, pool and auth metric the daemon declares is on the dashboard", str(sorted(wanted - METRICS)))
    bad_hist = [e for e in exprs if "histogram_quantile" in e and "_bucket" not in e]
    R.check(not bad_hist, "histogram_quantile queries use _bucket series")
    gen = subprocess.run([sys.executable, GEN_DASHBOARD, "--stdout"], capture_output=True, text=True)
    R.check(gen.returncode == 0 and gen.stdout == text, "dashboards/kvroute.json is gen_dashboard.py's output",
            "run: python3 helm/tools/dashboard/gen_dashboard.py")


def daemon_print_config(kvroute_bin, config_path=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVROUTE_")}
    cmd = [kvroute_bin] + (["--config", config_path] if config_path else []) + ["--print-config"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return yaml.safe_load(p.stdout)


def check_against_daemon(kvroute_bin, default_docs, gamma_docs):
    if not kvroute_bin:
        R.skip("config keys == kvroute --print-config", "set KVROUTE_BIN (or --kvroute-bin) to the daemon")
        return
    if not os.access(kvroute_bin, os.X_OK):
        R.check(False, "KVROUTE_BIN is executable", kvroute_bin)
        return
    defaults = flatten(daemon_print_config(kvroute_bin))
    vals = flatten(load_values(os.path.join(CHART, "values.yaml"))["config"])
    missing, extra = sorted(set(defaults) - set(vals)), sorted(set(vals) - set(defaults))
    R.check(not missing and not extra, "values.yaml config: keys == kvroute --print-config keys",
            f"missing in values.yaml: {missing}; not in the daemon: {extra}")
    differ = [f"{k}: chart {vals[k]!r} daemon {defaults[k]!r}" for k in vals
              if k in defaults and k not in CHART_DEFAULT_EXCEPTIONS and not same_value(vals[k], defaults[k])]
    R.check(not differ, "values.yaml config: defaults == daemon defaults (except documented ones)", "; ".join(differ))
    # The daemon loads the rendered kvroute.yaml and reports the same values.
    for label, docs, want in (("default", default_docs, {}), ("--set gamma", gamma_docs, {"scheduler.gamma": 0.42})):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(kvroute_yaml(docs), f)
            path = f.name
        try:
            eff = flatten(daemon_print_config(kvroute_bin, path))
            rendered = flatten(kvroute_yaml(docs))
            bad = [k for k in rendered if not same_value(eff.get(k), rendered[k])]
            R.check(not bad, f"{label}: kvroute --config <rendered kvroute.yaml> loads every value", str(bad))
            for k, v in want.items():
                R.check(same_value(eff.get(k), v), f"{label}: daemon sees {k}={v}", str(eff.get(k)))
        except RuntimeError as e:
            R.check(False, f"{label}: kvroute accepts the rendered kvroute.yaml", str(e))
        finally:
            os.unlink(path)


def free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def check_with_nats(kvroute_bin, cred_docs):
    """The bundled nats.conf is valid for nats-server, and kvroute, given the
    rendered kvroute.yaml and the Secret's nats-url, connects to that server
    with the credentials (and fails with a wrong password)."""
    import shutil
    import signal
    import time
    nats = shutil.which("nats-server")
    if not nats:
        R.skip("nats.conf accepted by nats-server", "nats-server not on PATH")
        return
    conf = find(cred_docs, "ConfigMap", "kvroute-nats")[0]["data"]["nats.conf"]
    secret = {k: base64.b64decode(v).decode() for k, v in find(cred_docs, "Secret", "kvroute")[0]["data"].items()}
    tmp = tempfile.mkdtemp(prefix="kvroute-helm-")
    conf_path = os.path.join(tmp, "nats.conf")
    with open(conf_path, "w") as f:
        f.write(conf)
    env = dict(os.environ, POD_NAME="kvroute-nats-0", NATS_USER=secret["nats-user"], NATS_PASSWORD=secret["nats-password"])
    p = subprocess.run([nats, "-t", "-c", conf_path], capture_output=True, text=True, env=env)
    R.check(p.returncode == 0, "nats.conf (JetStream, auth) accepted by nats-server -t", p.stderr.strip())
    if not kvroute_bin or not os.access(kvroute_bin, os.X_OK):
        R.skip("kvroute connects to the bundled NATS with the Secret's credentials", "needs KVROUTE_BIN")
        return
    port = free_port()
    local_conf = os.path.join(tmp, "nats-local.conf")
    with open(local_conf, "w") as f:  # the pod's paths -> the temp dir
        f.write(conf.replace("store_dir: /data", f"store_dir: {tmp}/js")
                .replace("/var/run/nats/nats.pid", f"{tmp}/nats.pid"))
    srv = subprocess.Popen([nats, "-c", local_conf, "-a", "127.0.0.1", "-p", str(port), "-m", str(free_port())],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cfg_path = os.path.join(tmp, "kvroute.yaml")
    with open(cfg_path, "w") as f:
        f.write(find(cred_docs, "ConfigMap", "kvroute")[0]["data"]["kvroute.yaml"])
    try:
        import socket
        deadline = time.time() + 10
        while time.time() < deadline and srv.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        if not R.check(srv.poll() is None, "bundled nats.conf runs in nats-server",
                       srv.stderr.read() if srv.poll() is not None else ""):
            return
        for label, url, want in (("Secret's nats-url", secret["nats-url"], True),
                                 ("wrong password", secret["nats-url"].replace(":" + secret["nats-password"] + "@", ":nope@"),
                                  False)):
            url = re.sub(r"@[^/]+$", f"@127.0.0.1:{port}", url)  # the Service name -> the local server
            kenv = {k: v for k, v in os.environ.items() if not k.startswith("KVROUTE_")}
            kenv["KVROUTE_EVENTS_NATS_URL"] = url
            k = subprocess.Popen([kvroute_bin, "--config", cfg_path, "--router.port", "0", "--admin.port", "0",
                                  "--router.host", "127.0.0.1", "--admin.host", "127.0.0.1",
                                  "--events.connect_timeout_ms", "1500"],
                                 env=kenv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = ""
            deadline = time.time() + 10
            import select
            while time.time() < deadline and k.poll() is None:
                r, _, _ = select.select([k.stdout], [], [], 0.2)
                if r:
                    line = k.stdout.readline()
                    if "listening" in line:
                        break
            started = "listening" in line
            if k.poll() is None:
                k.send_signal(signal.SIGTERM)
            try:
                k.wait(timeout=10)
            except subprocess.TimeoutExpired:
                k.kill()
                k.wait()
            R.check(started == want, f"kvroute with the rendered kvroute.yaml and the {label}: "
                                     f"{'connects' if want else 'refused'}", (k.stderr.read() or "")[-300:])
    finally:
        srv.terminate()
        srv.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def render_values(rb, values, expect_fail=False):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as vf:
        yaml.safe_dump(values, vf)
    try:
        return render(rb, "-f", vf.name, expect_fail=expect_fail)
    finally:
        os.unlink(vf.name)


def check_pools(rb, kvroute_bin):
    """pools: role-labelled prefill/decode pools rendered into discovery.dns / workers.static."""
    prefill = {"name": "prefill", "role": "prefill", "model": "qwen", "host": "sgl-prefill.llm.svc", "port": 30000,
               "bootstrap_port": 9001, "kv_events_port": 5557}
    decode = {"name": "decode", "role": "decode", "model": "qwen", "dp_size": 2,
              "workers": [{"url": "http://decode-0:8000", "kv_events": "tcp://decode-0:5557"},
                          {"url": "http://decode-1:8000"}]}
    own = {"host": "agg.llm.svc", "port": 8000, "model": "qwen"}
    cfg = kvroute_yaml(docs_of(render_values(rb, {"nats": {"enabled": False}, "pools": [prefill, decode],
                                                  "config": {"discovery": {"dns": [own]}}})))
    dns, static = cfg["discovery"]["dns"], cfg["workers"]["static"]
    R.check(dns[0] == own and len(dns) == 2, "pools: config's own dns entry kept first", str(dns))
    R.check(dns[-1] == {k: v for k, v in prefill.items() if k != "name"}, "pools: a host pool is one dns entry "
            "with its role and bootstrap_port", str(dns[-1]))
    R.check([w.get("url") for w in static] == ["http://decode-0:8000", "http://decode-1:8000"] and
            all(w.get("role") == "decode" and w.get("model") == "qwen" and w.get("dp_size") == 2 for w in static) and
            static[0].get("kv_events") == "tcp://decode-0:5557" and "kv_events" not in static[1],
            "pools: a workers pool is one static entry per worker, with the pool's role and shared fields",
            str(static))
    if kvroute_bin:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(cfg, f)
            path = f.name
        try:
            eff = flatten(daemon_print_config(kvroute_bin, path))
            st, dn = str(eff.get("workers.static")), str(eff.get("discovery.dns"))
            R.check("role=decode" in st and "role=prefill" in dn and "bootstrap_port=9001" in dn,
                    "pools: the daemon loads the roles and the bootstrap port", st + " | " + dn)
        except RuntimeError as e:
            R.check(False, "pools: kvroute accepts the rendered kvroute.yaml", str(e))
        finally:
            os.unlink(path)
    else:
        R.skip("pools: the daemon loads the roles", "no KVROUTE_BIN")
    # Mistakes fail naming the pool and the key.
    bad = (
        ({**decode, "role": "decoder"}, "pools[0] (decode).role"),
        ({k: v for k, v in decode.items() if k != "role"}, "pools[0] (decode).role"),
        ({**decode, "bootstrap_port": 8998}, "pools[0] (decode).bootstrap_port"),
        ({k: v for k, v in decode.items() if k != "model"}, "pools[0] (decode).model"),
        ({"name": "p", "role": "prefill", "model": "qwen"}, "host (a headless Service) or workers"),
        ({"name": "p", "role": "prefill", "model": "qwen", "host": "h"}, "pools[0] (p).port"),
        ({**decode, "host": "h", "port": 1}, "host and workers are exclusive"),
        ({**decode, "workers": [{"kv_events": "tcp://x:1"}]}, "pools[0] (decode).workers[0].url"),
    )
    for pool, key in bad:
        p = render_values(rb, {"nats": {"enabled": False}, "pools": [pool]}, expect_fail=True)
        R.check(p.returncode != 0 and key in p.stderr, f"pools: {key} refused by name", p.stderr.strip()[-200:])
    p = render_values(rb, {"nats": {"enabled": False}, "pools": [decode, decode]}, expect_fail=True)
    R.check(p.returncode != 0 and "two pools are named" in p.stderr, "pools: duplicate names refused",
            p.stderr.strip()[-200:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", required=True, help="kvroute-helm-render binary")
    ap.add_argument("--kvroute-bin", default=os.environ.get("KVROUTE_BIN", ""))
    ap.add_argument("--renderer-unit-tests", choices=("ok", "failed", "not-run"), default="not-run")
    a = ap.parse_args()
    if a.renderer_unit_tests == "not-run":
        R.skip("renderer unit tests (go test)", "run through test_chart.sh")
    else:
        R.check(a.renderer_unit_tests == "ok", "renderer unit tests (go test helm/tools/render)")
    rb = a.render
    values_yaml = os.path.join(CHART, "values.yaml")

    # 1. Default values.
    out = render(rb)
    docs = docs_of(out)
    R.check(out.startswith("---\n# Source: kvroute/templates/"), "default: helm-template style output")
    check_schema(docs, "default")
    vals = load_values(values_yaml)
    dep = check_router(docs, vals, "default")
    kinds = sorted(d["kind"] for d in docs)
    R.check(kinds.count("Service") == 4, "default: Services (OpenAI, admin, NATS, NATS headless)", str(kinds))
    R.check(find(docs, "Secret", "kvroute") != [], "default: Secret")
    R.check(find(docs, "StatefulSet", "kvroute-nats") != [], "default: bundled NATS StatefulSet")
    nats_cm = find(docs, "ConfigMap", "kvroute-nats")
    R.check(nats_cm and "jetstream {" in nats_cm[0]["data"]["nats.conf"], "default: NATS JetStream on")
    R.check(kvroute_yaml(docs)["events"]["nats_url"] == "nats://kvroute-nats:4222",
            "default: events.nats_url = the bundled NATS Service")
    R.check(not find(docs, "HorizontalPodAutoscaler") and not find(docs, "PodDisruptionBudget")
            and not find(docs, "ServiceMonitor"), "default: no HPA, PDB, ServiceMonitor")
    if dep:
        env = env_of(dep)
        R.check(env.get("KVROUTE_ADMIN_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "kvroute",
                "default: KVROUTE_ADMIN_TOKEN from the Secret")
        R.check("KVROUTE_EVENTS_NATS_URL" not in env, "default: no NATS credentials env without credentials")
    R.check(render(rb) == out, "default: rendering is deterministic")

    # 2. HA values.
    out = render(rb, "-f", HA, release="kv", namespace="infer")
    ha = docs_of(out)
    check_schema(ha, "ha")
    hvals = load_values(values_yaml, HA)
    dep = check_router(ha, hvals, "ha", fullname="kv-kvroute", namespace="infer")
    R.check(len(find(ha, "PodDisruptionBudget")) == 1, "ha: PodDisruptionBudget")
    hpa = find(ha, "HorizontalPodAutoscaler")
    R.check(len(hpa) == 1 and hpa[0]["spec"]["minReplicas"] >= 3, "ha: HPA with minReplicas >= 3")
    R.check(len(find(ha, "ServiceMonitor")) == 1, "ha: ServiceMonitor")
    R.check(not find(ha, "StatefulSet"), "ha: no bundled NATS")
    R.check(kvroute_yaml(ha, "kv-kvroute")["events"]["nats_url"].startswith("nats://nats."), "ha: external NATS URL")
    R.check(not find(ha, "Secret"), "ha: existing Secret, none rendered")
    if dep:
        pod = dep["spec"]["template"]["spec"]
        R.check("preferredDuringSchedulingIgnoredDuringExecution" in pod.get("affinity", {}).get("podAntiAffinity", {}),
                "ha: pod anti-affinity across nodes")
        R.check(dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0},
                "ha: rolling update starts new routers before stopping old ones")
        env = env_of(dep)
        R.check(all(env.get(n, {}).get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "kvroute-secrets"
                    for n in ("KVROUTE_ADMIN_TOKEN", "KVROUTE_EVENTS_NATS_URL")),
                "ha: admin token and NATS URL env from secret.existingSecret")

    # 3. --set reaches the ConfigMap.
    gamma = docs_of(render(rb, "--set", "config.scheduler.gamma=0.42"))
    R.check(same_value(kvroute_yaml(gamma)["scheduler"]["gamma"], 0.42), "--set config.scheduler.gamma=0.42 reaches kvroute.yaml")
    other = docs_of(render(rb, "--set", "config.router.max_attempts=5,config.log.level=debug,config.indexer.approximate=true"))
    k = kvroute_yaml(other)
    R.check(k["router"]["max_attempts"] == 5 and k["log"]["level"] == "debug" and k["indexer"]["approximate"] is True,
            "--set ints, strings and bools reach kvroute.yaml with their types")
    R.check(find(gamma, "Deployment")[0]["spec"]["template"]["metadata"]["annotations"]["checksum/config"] !=
            find(docs, "Deployment")[0]["spec"]["template"]["metadata"]["annotations"]["checksum/config"],
            "a config change changes the pod template (rolls the pods)")
    grace = docs_of(render(rb, "--set", "config.router.shutdown_grace_ms=120000"))
    R.check(find(grace, "Deployment")[0]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 125,
            "terminationGracePeriodSeconds follows router.shutdown_grace_ms")

    # 4. Credentials: Secret keys, env, bundled NATS authorization.
    cred = docs_of(render(rb, "--set", "secret.adminToken=s3cret,secret.natsUser=kv,secret.natsPassword=pw-1"))
    check_schema(cred, "credentials")
    sec = find(cred, "Secret", "kvroute")[0]["data"]
    dec = {k: base64.b64decode(v).decode() for k, v in sec.items()}
    R.check(dec.get("admin-token") == "s3cret", "credentials: Secret admin-token")
    R.check(dec.get("nats-url") == "nats://kv:pw-1@kvroute-nats:4222", "credentials: Secret nats-url with credentials",
            str(dec.get("nats-url")))
    env = env_of(find(cred, "Deployment")[0])
    ref = env.get("KVROUTE_EVENTS_NATS_URL", {}).get("valueFrom", {}).get("secretKeyRef", {})
    R.check(ref.get("name") == "kvroute" and ref.get("key") == "nats-url", "credentials: KVROUTE_EVENTS_NATS_URL from Secret")
    cm_text = find(cred, "ConfigMap", "kvroute")[0]["data"]["kvroute.yaml"]
    R.check("pw-1" not in cm_text and "s3cret" not in cm_text and "@" not in cm_text,
            "credentials: no credentials in the ConfigMap")
    conf = find(cred, "ConfigMap", "kvroute-nats")[0]["data"]["nats.conf"]
    nenv = {e["name"] for e in find(cred, "StatefulSet")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    R.check("authorization {" in conf and {"NATS_USER", "NATS_PASSWORD"} <= nenv,
            "credentials: bundled NATS requires them")
    ext = docs_of(render(rb, "--set", "nats.enabled=false,config.events.nats_url=nats://n.example:4222,"
                                      "secret.natsUser=u,secret.natsPassword=p"))
    dec = {k: base64.b64decode(v).decode() for k, v in find(ext, "Secret")[0]["data"].items()}
    R.check(dec.get("nats-url") == "nats://u:p@n.example:4222" and not find(ext, "StatefulSet"),
            "credentials: external NATS URL with credentials, no bundled NATS")

    # 5. Optional objects and variants.
    opt = docs_of(render(rb, "--set", "serviceAccount.create=true,pdb.enabled=true,pdb.maxUnavailable=1,"
                                      "nats.jetstream.persistence.enabled=true,lifecycle.nativeSleepAction=true,"
                                      "podAntiAffinity=hard,dashboard.enabled=false"))
    check_schema(opt, "optional")
    R.check(find(opt, "ServiceAccount") and find(opt, "Deployment")[0]["spec"]["template"]["spec"]["serviceAccountName"]
            == "kvroute", "optional: ServiceAccount created and used")
    R.check(find(opt, "PodDisruptionBudget")[0]["spec"] .get("maxUnavailable") == 1, "optional: PDB maxUnavailable")
    R.check(find(opt, "StatefulSet")[0]["spec"].get("volumeClaimTemplates"), "optional: NATS PVC")
    R.check(not find(opt, "ConfigMap", "kvroute-dashboard"), "optional: dashboard off")
    c = find(opt, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    R.check(c["lifecycle"]["preStop"].get("sleep", {}).get("seconds") == 5, "optional: native preStop sleep")
    aff = find(opt, "Deployment")[0]["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    R.check("requiredDuringSchedulingIgnoredDuringExecution" in aff, "optional: hard pod anti-affinity")

    # 5b. No NATS at all: workers from the config (vLLM/SGLang over ZMQ).
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as vf:
        yaml.safe_dump({"nats": {"enabled": False}, "config": {"workers": {"static": [
            {"url": "http://vllm-0:8000", "model": "qwen", "kv_events": "tcp://vllm-0:5557"}]}}}, vf)
    try:
        nonats = docs_of(render(rb, "-f", vf.name))
    finally:
        os.unlink(vf.name)
    R.check(not find(nonats, "StatefulSet"), "no NATS: no NATS StatefulSet")
    R.check(kvroute_yaml(nonats)["events"]["nats_url"] in ("", None), "no NATS: events.nats_url empty",
            str(kvroute_yaml(nonats)["events"]))
    R.check(kvroute_yaml(nonats)["workers"]["static"][0]["kv_events"] == "tcp://vllm-0:5557",
            "no NATS: workers.static rendered")
    if a.kvroute_bin:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(kvroute_yaml(nonats), f)
            path = f.name
        try:
            eff = flatten(daemon_print_config(a.kvroute_bin, path))
            R.check("url=http://vllm-0:8000" in str(eff.get("workers.static")), "no NATS: the daemon loads the list",
                    str(eff.get("workers.static")))
        except RuntimeError as e:
            R.check(False, "no NATS: kvroute accepts the rendered kvroute.yaml", str(e))
        finally:
            os.unlink(path)

    # 5c. Role-labelled pools of a disaggregated fleet: a DNS pool (SGLang prefill with its
    # bootstrap port) and a static pool, appended to config's own lists; the daemon loads them.
    check_pools(rb, a.kvroute_bin)

    # 6. Misconfigurations fail with a message naming the key.
    for sets, key in (("config.admin.token=x", "config.admin.token"),
                      ("nats.enabled=false", "config.events.nats_url"),
                      ("config.router.port=0", "config.router.port"),
                      ("secret.natsUser=u", "secret.natsPassword"),
                      ("secret.natsUser=u,secret.natsPassword=p@ss", "secret.natsPassword"),
                      ("podAntiAffinity=always", "podAntiAffinity")):
        p = render(rb, "--set", sets, expect_fail=True)
        R.check(p.returncode != 0 and key in p.stderr, f"--set {sets} fails naming {key}", p.stderr.strip()[:200])

    # 7. NOTES.txt renders.
    notes = render(rb, "--notes")
    R.check("kvroute" in notes and "/v1/chat/completions" in notes, "NOTES.txt renders")

    # 8. Dashboard, values documentation, the daemon's key set.
    check_dashboard()
    check_values_documented()
    check_against_daemon(a.kvroute_bin, docs, gamma)
    check_with_nats(a.kvroute_bin, cred)

    summary = f"{R.passed} passed, {R.failed} failed"
    if R.skipped:
        summary += f", {R.skipped} skipped"
    print(summary)
    return 1 if R.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a crash is a failure, with the summary line still printed
        import traceback
        traceback.print_exc()
        print(f"{R.passed} passed, {R.failed + 1} failed")
        sys.exit(1)
