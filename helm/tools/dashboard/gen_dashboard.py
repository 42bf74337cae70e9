#!/usr/bin/env python3
"""Generates helm/kvroute/dashboards/kvroute.json (Grafana 10 dashboard).

Edit the panels here, then run:  python3 helm/tools/dashboard/gen_dashboard.py
helm/tests/test_chart.py checks the committed JSON equals this script's output
and that every metric it queries is one the daemon exports.
"""
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'namespace=~"$namespace", pod=~"$pod"'
RATE = "$__rate_interval"

_panels = []
_y = 0
_x = 0


def row(title):
    global _y, _x
    if _x:
        _y += 8
        _x = 0
    _panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": _y}, "id": len(_panels) + 1})
    _y += 1


def target(expr, legend, ref):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def panel(title, exprs, unit="short", kind="timeseries", w=8, desc="", stack=False, minv=None, maxv=None):
    """exprs: list of (promql, legend)."""
    global _x, _y
    if _x + w > 24:
        _x = 0
        _y += 8
    defaults = {"unit": unit, "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                         "showPoints": "never", "spanNulls": False,
                                         "stacking": {"mode": "normal" if stack else "none", "group": "A"}}}
    if kind == "stat":
        defaults = {"unit": unit}
    if minv is not None:
        defaults["min"] = minv
    if maxv is not None:
        defaults["max"] = maxv
    p = {
        "id": len(_panels) + 1,
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": {"h": 8, "w": w, "x": _x, "y": _y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(exprs)],
    }
    if kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "justifyMode": "auto",
                        "orientation": "auto", "textMode": "auto"}
    _panels.append(p)
    _x += w


def rate(metric, by="", extra=""):
    sel = SEL + (", " + extra if extra else "")
    s = f"sum{f' by ({by})' if by else ''}(rate({metric}{{{sel}}}[{RATE}]))"
    return s


def quantile(q, metric, by="", extra=""):
    sel = SEL + (", " + extra if extra else "")
    grp = "le" + (", " + by if by else "")
    return f"histogram_quantile({q}, sum by ({grp}) (rate({metric}_bucket{{{sel}}}[{RATE}])))"


# ---- Requests ----
row("Requests")
panel("Requests by status", [(rate("kvroute_router_requests_total", "status"), "{{status}}")], "reqps",
      desc="kvroute_router_requests_total by HTTP status.", stack=True)
_5xx = rate("kvroute_router_requests_total", extra='status=~"5.."')
# `or vector(0)`: a fleet without any 5xx has no 5xx series; the ratio is 0, not "No data".
# Ratios divide by `(... > 0)`: a window without traffic (a fleet, or a worker,
# that got no request) drops out instead of plotting 0/0 = NaN.
panel("Error ratio (5xx)", [("(" + _5xx + " or vector(0)) / (" + rate("kvroute_router_requests_total") + " > 0)",
                             "5xx / all")],
      "percentunit", desc="Share of requests answered with a 5xx.", minv=0)
panel("In-flight requests", [(f"sum(kvroute_router_inflight_requests{{{SEL}}})", "all pods"),
                             (f"sum by (pod) (kvroute_router_inflight_requests{{{SEL}}})", "{{pod}}")],
      desc="Requests being handled now (streams included).")
panel("Request duration p50 / p99", [(quantile(0.5, "kvroute_router_request_duration_seconds"), "p50"),
                                     (quantile(0.99, "kvroute_router_request_duration_seconds"), "p99")], "s",
      desc="Whole request, first byte in to last byte out (streams included).")
panel("Time to first byte p50 / p99", [(quantile(0.5, "kvroute_router_ttfb_seconds"), "p50"),
                                       (quantile(0.99, "kvroute_router_ttfb_seconds"), "p99")], "s",
      desc="From sending the request to the worker until its first response byte (prefill).")
panel("Requests by model", [(rate("kvroute_router_requests_total", "model"), "{{model}}")], "reqps",
      desc="kvroute_router_requests_total by model.")
panel("Upstream errors by reason", [(rate("kvroute_router_upstream_errors_total", "reason"), "{{reason}}")],
      "ops", desc="Connect, send, header and relay failures towards workers.", stack=True)
panel("Retries and cancels", [(rate("kvroute_router_retries_total"), "retries"),
                              (rate("kvroute_router_cancels_total"), "client cancels")], "ops",
      desc="Retries happen only before the first response byte; cancels are clients that went away.")
panel("Requests by route", [(rate("kvroute_router_requests_total", "route"), "{{route}}")], "reqps",
      desc="kvroute_router_requests_total by route.")

# ---- Routing decision and cache hits ----
row("Routing decision and KV cache hits")
panel("Prefix cache hit rate", [(f'{rate("kvroute_router_cached_tokens_total")} / '
                                 f'({rate("kvroute_router_prompt_tokens_total")} > 0)', "cached / prompt tokens")],
      "percentunit", desc="Prompt tokens the chosen worker already held, over all prompt tokens.",
      minv=0, maxv=1)
panel("Hit rate per worker", [(f'{rate("kvroute_router_worker_cached_tokens_total", "worker")} / '
                               f'({rate("kvroute_router_worker_prompt_tokens_total", "worker")} > 0)',
                               "worker {{worker}}")],
      "percentunit", minv=0, maxv=1, desc="Cached over prompt tokens of requests routed to each worker.")
panel("Prompt tokens per worker", [(rate("kvroute_router_worker_prompt_tokens_total", "worker"), "worker {{worker}}")],
      "short", stack=True, desc="Prompt tokens/s sent to each worker: shows routing skew.")
panel("Decision time p99 by stage", [(quantile(0.99, "kvroute_router_decision_seconds", "stage"), "{{stage}}")], "s",
      desc="tokenize, hash, find_matches, score.")
panel("Decision time p50 by stage", [(quantile(0.5, "kvroute_router_decision_seconds", "stage"), "{{stage}}")], "s",
      desc="tokenize, hash, find_matches, score.")
panel("Overlap ratio p50 / p90", [(quantile(0.5, "kvroute_router_overlap_ratio"), "p50"),
                                  (quantile(0.9, "kvroute_router_overlap_ratio"), "p90")], "percentunit",
      minv=0, maxv=1, desc="Share of a request's blocks cached on the chosen worker.")

panel("Requests by tokenization", [(rate("kvroute_router_tokenized_requests_total", "source"), "{{source}}")],
      "reqps", stack=True,
      desc="Where routed requests' token ids came from: client, local (tokenizer.models), engine (the worker's "
           "POST /tokenize), placeholder (cache overlap approximate: see kvroute_router_tokenizer_fallbacks_total).")
panel("Engine /tokenize calls by result", [(rate("kvroute_router_engine_tokenize_total", "result"), "{{result}}")],
      "ops", stack=True, desc="tokenizer.remote round trips: ok, or why the request fell back to the placeholder.")
panel("Engine /tokenize cache", [(rate("kvroute_router_engine_tokenize_cache_total", "result"), "{{result}}")],
      "ops", stack=True, desc="Exact answers reused (hit) instead of a round trip (miss).")

# ---- Scheduler ----
row("Scheduler and workers")
panel("Decisions by outcome", [(rate("kvroute_scheduler_decisions_total", "outcome"), "{{outcome}}")], "ops",
      stack=True, desc="best_overlap, balance, no_worker (503 or queued).")
panel("Workers known", [(f"max(kvroute_scheduler_workers{{{SEL}}})", "max over pods"),
                        (f"min(kvroute_scheduler_workers{{{SEL}}})", "min over pods")],
      desc="Workers with live heartbeats; max != min means replicas disagree.")
panel("No-worker decisions", [(rate("kvroute_scheduler_decisions_total", extra='outcome="no_worker"'), "no_worker")],
      "ops", desc="Requests that found no worker with a free slot and KV block.")
panel("Busy-fleet decisions", [(rate("kvroute_scheduler_all_busy_total"), "every worker busy"),
                               (rate("kvroute_scheduler_slots_full_total"), "slot test lifted")],
      "ops", desc="Requests sent to a busy worker because every worker was busy (its engine queues them), and "
                  "requests ranked with the slot test lifted because the model's workers had nearly all their "
                  "slots taken (scheduler.busy_slot_fleet_usage).")
panel("KV usage per worker (reported)", [(f'max by (worker) (kvroute_scheduler_worker_kv_usage_ratio{{{SEL}, source="reported"}})',
                                          "worker {{worker}}")], "percentunit", minv=0, maxv=1,
      desc="kv_active_blocks / kv_total_blocks from heartbeats.")
panel("KV usage per worker (predicted)", [(f'max by (worker) (kvroute_scheduler_worker_kv_usage_ratio{{{SEL}, source="predicted"}})',
                                           "worker {{worker}}")], "percentunit", minv=0, maxv=1,
      desc="Reported load plus this router's own in-flight requests.")
panel("Active requests per worker", [(f"max by (worker, source) (kvroute_scheduler_worker_active_requests{{{SEL}}})",
                                      "worker {{worker}} {{source}}")],
      desc="Request slots in use, reported and predicted.")

# ---- Indexer ----
row("Indexer")
panel("Index size", [(f"max(kvroute_indexer_blocks{{{SEL}}})", "blocks"),
                     (f"max(kvroute_indexer_entries{{{SEL}}})", "(block, worker) entries")],
      desc="Radix-tree blocks and (block, worker) entries.")
panel("Index memory", [(f"max by (pod) (kvroute_indexer_bytes{{{SEL}}})", "{{pod}}")], "bytes")
panel("Events applied by type and result", [(rate("kvroute_indexer_events_total", "type, result"), "{{type}} {{result}}")],
      "ops")
panel("Event gaps", [(rate("kvroute_indexer_event_gaps_total"), "gaps")], "ops",
      desc="Lost events (event_id gaps): the worker's entries are not trusted until a resync.")
panel("Resyncs by result", [(rate("kvroute_indexer_resyncs_total", "result"), "{{result}}")], "ops")

# ---- Events / NATS ----
row("Events and NATS")
panel("NATS connected", [(f"min(kvroute_events_nats_connected{{{SEL}}})", "all pods connected")], kind="stat", w=4,
      desc="1 when every router pod is connected to NATS.")
panel("NATS reconnects", [(f"sum(increase(kvroute_events_nats_reconnects_total{{{SEL}}}[$__range]))", "reconnects")],
      kind="stat", w=4)
panel("Event messages", [(rate("kvroute_events_messages_total"), "messages")], "ops")
panel("Rejected events by reason", [(rate("kvroute_events_rejected_total", "reason"), "{{reason}}")], "ops", stack=True)
panel("Queue drops", [(rate("kvroute_events_queue_dropped_total"), "dropped")], "ops",
      desc="Event messages dropped because the index writer queue was full (events.queue_capacity).", w=12)
panel("Config reloads by result", [(f"sum by (result) (increase(kvroute_config_reloads_total{{{SEL}}}[$__range]))",
                                    "{{result}}")], kind="stat", w=12)


# ---- Disaggregated prefill/decode ----
row("Disaggregated prefill/decode")
panel("PD requests by outcome", [(rate("kvroute_pd_requests_total", "outcome"), "{{outcome}}")], "reqps", stack=True,
      desc="Requests to a fleet with prefill/decode roles: disaggregated (two legs), aggregated (the decision ran it "
           "whole), fallback (whole after its prefill failed), failed (503, pd.on_prefill_failure fail).")
panel("PD decisions by reason", [(rate("kvroute_pd_requests_total", "reason"), "{{reason}}")], "reqps", stack=True,
      desc="Why a request was split or run whole (pd.policy, min_uncached_tokens, busy pools), or why its prefill failed.")
panel("Prefill legs by result", [(rate("kvroute_pd_prefill_legs_total", "result"), "{{result}}")], "ops", stack=True,
      desc="ok, or how a prefill leg failed (connect, timeout, closed, status_4xx/5xx/429, cancelled: the client left).")
panel("PD leg latency p50 / p99", [(quantile(0.5, "kvroute_pd_leg_seconds", "leg"), "p50 {{leg}}"),
                                   (quantile(0.99, "kvroute_pd_leg_seconds", "leg"), "p99 {{leg}}")], "s",
      desc="prefill: sent to its whole answer; decode: sent to its first byte.")
panel("PD retries by leg", [(rate("kvroute_pd_retries_total", "leg"), "{{leg}}")], "ops",
      desc="Legs sent to a further worker after a failure.")
panel("Transfer params rejected", [(rate("kvroute_pd_params_rejected_total", "reason"), "{{reason}}")], "ops",
      desc="Prefill answers whose kv_transfer_params (or Mooncake bootstrap /query answers) were not used.")
panel("Transfers released / left", [(rate("kvroute_pd_releases_total", "result"), "released {{result}}"),
                                    (rate("kvroute_pd_transfers_left_total", "reason"), "left: {{reason}}")], "ops",
      desc="Release legs that claimed a prefilled transfer whose client left; transfers whose decode leg failed "
           "after the decode worker received it (worker_closed: held until the prefill engine's lease ends).")
panel("PD clients gone by phase", [(rate("kvroute_pd_client_gone_total", "phase"), "{{phase}}")], "ops", stack=True,
      desc="Split requests whose client left: during the prefill leg, after it, or while the decode worker computed "
           "its first byte.")

# ---- Shared KV pools and admin ----
row("Shared KV pools and authentication")
panel("Pool hits", [(rate("kvroute_router_pool_hits_total", "pool"), "{{pool}}")], "reqps",
      desc="Routed requests whose worker loads part of the prompt from a shared pool (indexer.kv_pools).")
panel("Pool hit tokens", [(rate("kvroute_router_pool_hit_tokens_total", "pool"), "{{pool}}")], "short",
      desc="Prompt tokens/s loaded from a shared pool instead of recomputed.")
panel("Pool index size", [(f"max by (pool) (kvroute_indexer_pool_blocks{{{SEL}}})", "{{pool}}")],
      desc="Blocks each shared pool holds in the index.")
panel("Pool events", [(rate("kvroute_indexer_pool_events_total"), "applied"),
                      (rate("kvroute_indexer_pool_events_refused_total", "reason"), "refused {{reason}}")], "ops",
      desc="Members' KV events with their pool's medium, and those kept out of the pools.")
panel("Pools emptied", [(f"sum by (pool) (increase(kvroute_indexer_pools_emptied_total{{{SEL}}}[$__range]))",
                         "{{pool}}")], kind="stat",
      desc="A pool's entries dropped at once (its last member left or the pool cleared).")
panel("Pool resyncs", [(rate("kvroute_indexer_pool_resyncs_total"), "replaced by a dump"),
                      ("sum by (pool) (kvroute_indexer_pools_stale{" + SEL + "})", "stale {{pool}}")], "short",
      desc="Pools replaced by a member's resync dump (the events since replayed after it), and pools whose hits "
           "count as none while a member that lost KV events awaits its dump.")
panel("Authentication failures", [(rate("kvroute_router_auth_failures_total", "reason"), "OpenAI API {{reason}}"),
                                  (rate("kvroute_admin_auth_failures_total"), "admin API")], "ops",
      desc="Requests refused 401: the OpenAI listener's API keys (missing, invalid) and the admin token.")


def var(name, label, query):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "definition": query,
            "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "refresh": 2, "sort": 1, "hide": 0, "regex": "", "options": []}


dashboard = {
    "title": "kvroute",
    "uid": "kvroute-overview",
    "description": "kvroute KV-cache-aware router: requests, routing decisions, cache hits, scheduler, index, NATS events.",
    "tags": ["kvroute", "llm", "inference"],
    "timezone": "browser",
    "editable": True,
    "graphTooltip": 1,
    "schemaVersion": 39,
    "version": 1,
    "refresh": "30s",
    "time": {"from": "now-1h", "to": "now"},
    "timepicker": {},
    "fiscalYearStartMonth": 0,
    "liveNow": False,
    "links": [],
    "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                              "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                              "name": "Annotations & Alerts", "type": "dashboard"}]},
    "templating": {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1, "regex": ""},
        var("namespace", "Namespace", "label_values(kvroute_router_requests_total, namespace)"),
        var("pod", "Pod", 'label_values(kvroute_router_requests_total{namespace=~"$namespace"}, pod)'),
    ]},
    "panels": _panels,
}


def render():
    return json.dumps(dashboard, indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "kvroute", "dashboards", "kvroute.json")
    if len(sys.argv) > 1 and sys.argv[1] == "--stdout":
        sys.stdout.write(render())
    else:
        with open(os.path.normpath(out), "w") as f:
            f.write(render())
