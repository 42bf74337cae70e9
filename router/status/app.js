// kvroute status page: reads the admin API once a second with the admin token
// as a bearer header. The token is kept in sessionStorage (this tab only),
// never in a cookie or the URL. Plain DOM and canvas; no library.
"use strict";

const TOKEN_KEY = "kvroute-admin-token";
const $ = (id) => document.getElementById(id);
const openExplains = new Map();  // decision id -> explain JSON (kept while its entry is open)
let timer = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}

const fmtNum = (v, digits = 1) => (v == null || !isFinite(v) ? "—" : Number(v).toFixed(digits));
const fmtPct = (v) => {
  if (v == null || !isFinite(v)) return "—";
  const p = v * 100;
  return (p === 0 ? "0" : p >= 10 ? p.toFixed(0) : p >= 1 ? p.toFixed(1) : p.toPrecision(2)) + " %";
};
const fmtInt = (v) => (v == null ? "—" : Number(v).toLocaleString("en-US"));

async function api(path, options = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = Object.assign({ authorization: "Bearer " + token }, options.headers || {});
  const r = await fetch(path, Object.assign({}, options, { headers, cache: "no-store" }));
  if (r.status === 401) {
    // A refusal of a token the operator has since replaced (a refresh still in
    // flight at login) must not log the new token out.
    if (sessionStorage.getItem(TOKEN_KEY) !== token) throw new Error("unauthorized");
    let why = "";
    try { why = (await r.json()).error.message; } catch (e) { /* not JSON */ }
    showLogin("The admin API refused the token (401). " + why);
    throw new Error("unauthorized");
  }
  const body = await r.json();
  if (!r.ok) throw new Error(body.error ? body.error.message : "HTTP " + r.status);
  return body;
}

function showLogin(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  if (timer) clearInterval(timer);
  timer = null;
  $("main").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("updated").textContent = "not connected";
}

function start() {
  $("login").hidden = true;
  $("main").hidden = false;
  $("logout").hidden = false;
  refresh();
  timer = setInterval(refresh, 1000);
}

async function refresh() {
  try {
    const [status, history, decisions] = await Promise.all([
      api("/admin/status"), api("/admin/status/history"), api("/admin/decisions")]);
    renderTotals(status.totals);
    renderFleet(status.workers);
    if (status.flow) renderFlow(status.flow);
    if (status.pools) renderPools(status.pools);
    renderPd(status.pd);
    renderCharts(history);
    renderDecisions(decisions);
    $("updated").textContent = "updated " + new Date(status.unix_time * 1000).toLocaleTimeString();
  } catch (e) {
    if (e.message !== "unauthorized") $("updated").textContent = "update failed: " + e.message;
  }
}

function renderTotals(t) {
  const tiles = [
    ["requests/s", fmtNum(t.requests_per_s)], ["hit rate", fmtPct(t.hit_rate)],
    ["decision p50", fmtNum(t.decision_p50_us) + " µs"], ["decision p99", fmtNum(t.decision_p99_us) + " µs"],
    ["index entries", fmtInt(t.index_entries)], ["index blocks", fmtInt(t.index_blocks)],
    ["KV events/s", fmtNum(t.events_per_s)], ["workers", fmtInt(t.workers)], ["in flight", fmtInt(t.inflight)],
    ["routed since start", fmtInt(t.routed_total)]];
  $("totals").replaceChildren(...tiles.map(([k, v]) =>
    el("div", { class: "tile", "data-key": k }, el("div", { class: "v" }, v), el("div", { class: "k" }, k))));
}

// Workers by role (prefill, decode, then aggregated) when the fleet has PD
// roles: one heading row per group; otherwise in the report's order.
const ROLE_ORDER = { prefill: 0, decode: 1, both: 2 };
const ROLE_TITLE = { prefill: "prefill workers", decode: "decode workers", both: "aggregated workers" };
function renderFleet(workers) {
  const pd = workers.some((w) => w.role !== "both");
  if (pd) workers = [...workers].sort((a, b) => ROLE_ORDER[a.role] - ROLE_ORDER[b.role] || a.worker_id - b.worker_id);
  const rows = [];
  let group = null;
  for (const w of workers) {
    if (pd && w.role !== group) {
      group = w.role;
      const n = workers.filter((x) => x.role === group).length;
      rows.push(el("tr", { class: "role-group", "data-role-group": group },
        el("td", { colSpan: 10 }, `${ROLE_TITLE[group] || group} (${n})`)));
    }
    rows.push(fleetRow(w));
  }
  $("fleet").tBodies[0].replaceChildren(...rows);
}

function fleetRow(w) {
  return el("tr", { "data-worker-id": w.worker_id, "data-role": w.role },
    el("td", {}, "worker " + w.worker_id), el("td", {}, w.model), el("td", {}, w.source), el("td", {}, w.role),
    el("td", { class: "state-" + w.state }, w.state.replace("_", " "),
      w.salt_blind ? el("span", { class: "salt-blind", title: "its KV events carry no cache_salt: tenants' root blocks are attributed from the router's own dispatches" }, " salt-blind") : ""),
    el("td", { class: "num" }, fmtPct(w.kv_usage_reported)), el("td", { class: "num" }, fmtPct(w.kv_usage_predicted)),
    el("td", { class: "num" }, fmtInt(w.inflight)), el("td", { class: "num" }, fmtPct(w.hit_rate)),
    el("td", { class: "num" }, fmtInt(w.index_entries)));
}

// A disaggregated fleet (router/http/pd_exchange.h): how requests were run and
// what went wrong with their legs, since start (the kvroute_pd_* counters).
function renderPd(pd) {
  $("pd-section").hidden = !pd;
  if (!pd) return;
  const sum = (o) => Object.values(o || {}).reduce((a, b) => a + b, 0);
  const req = pd.requests || {};
  $("pd-roles").textContent = `(${pd.roles.prefill} prefill, ${pd.roles.decode} decode, ${pd.roles.both} aggregated workers)`;
  const tiles = [
    ["split", fmtInt(req.disaggregated || 0)], ["run whole", fmtInt(req.aggregated || 0)],
    ["fallback after prefill failure", fmtInt(req.fallback || 0)], ["failed (503)", fmtInt(req.failed || 0)],
    ["prefill failures", fmtInt(pd.prefill_failures)], ["transfers released", fmtInt(sum(pd.releases))],
    ["transfers left to the engine", fmtInt(sum(pd.transfers_left))], ["clients gone", fmtInt(sum(pd.client_gone))]];
  $("pd-tiles").replaceChildren(...tiles.map(([k, v]) =>
    el("div", { class: "tile", "data-key": "pd " + k }, el("div", { class: "v" }, v), el("div", { class: "k" }, k))));
  const words = (o) => Object.entries(o || {}).map(([k, v]) => `${k.replace("_", " ")} ${v}`).join(", ") || "none";
  $("pd-detail").textContent = `prefill legs: ${words(pd.prefill_legs)}; transfers left by reason: ` +
    `${words(pd.transfers_left)}; clients gone by phase: ${words(pd.client_gone)}`;
}

// The wait queue by band and each tenant's figures (router/flow/).
function renderFlow(f) {
  const bands = f.bands.map((b) => `${b.name} ${fmtInt(b.queued)}`).join(", ");
  $("flow-summary").textContent =
    `(queued ${fmtInt(f.queued)}: ${bands}; ${fmtInt(f.queued_bytes)} bytes; ` +
    (f.authenticated ? `${fmtInt(f.keys)} API keys)` : "no API keys: open listener)");
  // The queue wait: each band's oldest waiter and p99 of the waits that ended; null = none.
  $("flow-bands").tBodies[0].replaceChildren(...f.bands.map((b) => el("tr", { "data-band": b.name },
    el("td", {}, b.name), el("td", { class: "num" }, fmtInt(b.queued)),
    el("td", { class: "num oldest-wait" }, fmtNum(b.oldest_wait_ms)),
    el("td", { class: "num wait-p99" }, fmtNum(b.wait_p99_ms)))));
  const rows = f.tenants.map((t) => el("tr", { "data-tenant": t.name },
    el("td", {}, t.name), el("td", { class: "num" }, fmtInt(t.weight)), el("td", { class: "num" }, fmtInt(t.rps)),
    el("td", { class: "num" }, fmtInt(t.tps)), el("td", {}, t.cache_salt_pinned ? "yes" : "no"),
    el("td", { class: "num" }, fmtInt(t.queued)), el("td", { class: "num oldest-wait" }, fmtNum(t.oldest_wait_ms)),
    el("td", {}, Object.entries(t.outcomes).map(([k, v]) => `${k} ${v}`).join(", "))));
  $("flow-tenants").tBodies[0].replaceChildren(...rows);
}

// Shared KV pools (indexer.kv_pools): what each holds and the hits loaded from it.
function renderPools(pools) {
  $("pools-section").hidden = false;
  const rows = pools.map((p) => el("tr", { "data-pool": p.name },
    el("td", {}, p.name), el("td", {}, p.medium), el("td", {}, p.workers.join(", ")),
    el("td", { class: "num" }, fmtNum(p.weight)), el("td", { class: "num" }, fmtInt(p.blocks)),
    el("td", { class: "num" }, fmtInt(p.hits)), el("td", { class: "num" }, fmtInt(p.hit_tokens))));
  $("pools").tBodies[0].replaceChildren(...rows);
}

// One line chart per canvas; `series` is a list of [values, color]; nulls are gaps.
function drawChart(canvas, t, series, fixedMax) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, pad = 22;
  ctx.clearRect(0, 0, W, H);
  let max = fixedMax || 0;
  for (const [values] of series) for (const v of values) if (v != null && v > max) max = v;
  if (!max) max = 1;
  // The last 15 minutes, or since the daemon started (at least a minute).
  const now = t.length ? t[t.length - 1] : 0;
  const span = Math.min(900, Math.max(60, t.length ? now - t[0] : 60));
  const x = (ti) => pad + (W - pad - 4) * (1 - (now - ti) / span);
  const y = (v) => H - pad + 4 - (H - pad) * (v / max);
  ctx.strokeStyle = "#d9dde6"; ctx.fillStyle = "#6b7385"; ctx.font = "10px sans-serif";
  ctx.beginPath(); ctx.moveTo(pad, y(0)); ctx.lineTo(W - 4, y(0)); ctx.moveTo(pad, y(max)); ctx.lineTo(W - 4, y(max)); ctx.stroke();
  ctx.fillText(max >= 10 ? String(Math.round(max)) : max.toPrecision(2), 1, y(max) + 3);
  ctx.fillText("0", 1, y(0) + 3);
  ctx.fillText(span >= 900 ? "-15 min" : span >= 120 ? `-${Math.round(span / 60)} min` : `-${Math.round(span)} s`, pad, H - 2);
  ctx.fillText("now", W - 26, H - 2);
  for (const [values, color] of series) {
    ctx.strokeStyle = color; ctx.lineWidth = 1.5; ctx.beginPath();
    let pen = false;
    values.forEach((v, i) => {
      if (v == null) { pen = false; return; }
      if (pen) ctx.lineTo(x(t[i]), y(v)); else ctx.moveTo(x(t[i]), y(v));
      pen = true;
    });
    ctx.stroke();
  }
}

function renderCharts(h) {
  drawChart($("chart-rps"), h.t, [[h.requests_per_s, "#2856c8"]]);
  drawChart($("chart-hit"), h.t, [[h.hit_rate, "#1a7f37"]], 1);
  drawChart($("chart-lat"), h.t, [[h.decision_p50_us, "#2856c8"], [h.decision_p99_us, "#c0262d"]]);
  drawChart($("chart-events"), h.t, [[h.events_per_s, "#7a3fc0"]]);
  drawChart($("chart-index"), h.t, [[h.index_entries, "#b35900"]]);
  drawChart($("chart-inflight"), h.t, [[h.inflight, "#1d2330"]]);
}

function renderDecisions(list) {
  const items = list.map((d) => {
    const head = el("div", { class: "head" },
      new Date(d.unix_time * 1000).toLocaleTimeString(), " · ", d.model, " · ", fmtInt(d.isl_tokens),
      " tokens (" + d.tokenization + ") → worker " + d.chosen + " (" + fmtInt(d.cached_tokens) + " cached)");
    if (d.tokenization === "placeholder") head.classList.add("placeholder");
    const li = el("li", { "data-decision-id": d.id }, head);
    head.addEventListener("click", () => toggleDecision(d.id, li));
    if (openExplains.has(d.id)) {
      li.classList.add("open");
      li.append(renderExplain(openExplains.get(d.id)));
    }
    return li;
  });
  $("decisions").replaceChildren(...items);
}

async function toggleDecision(id, li) {
  if (openExplains.has(id)) {
    openExplains.delete(id);
    li.classList.remove("open");
    li.querySelector(".explain")?.remove();
    return;
  }
  try {
    const explain = await api("/admin/decisions/" + id);
    openExplains.set(id, explain);
    li.classList.add("open");
    li.append(renderExplain(explain));
  } catch (e) {
    li.append(el("div", { class: "explain error" }, e.message));
  }
}

function renderExplain(x) {
  const box = el("div", { class: "explain" });
  box.append(el("p", { class: "reason" }, x.reason));
  if (x.error) box.append(el("p", { class: "error" }, x.error.error ? x.error.error.message : ""));
  const head = el("tr", {}, ...["rank", "worker", "holds (blocks)", "cached tokens", "KV usage (predicted)", "cost",
    "why"].map((h) => el("th", {}, h)));
  const rows = x.workers.map((w) => el("tr", { class: w.rank === 1 ? "chosen" : w.excluded ? "excluded" : "" },
    el("td", {}, w.rank == null ? "—" : w.rank), el("td", {}, "worker " + w.worker_id),
    el("td", { class: "num" }, w.overlap_blocks + " / " + x.request_blocks),
    el("td", { class: "num" }, fmtInt(w.cached_tokens)), el("td", { class: "num" }, fmtPct(w.predicted_load.kv_usage)),
    el("td", { class: "num" }, fmtNum(w.cost, 3)), el("td", { class: "why" }, w.reason)));
  box.append(el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
  return box;
}

async function explainPasted() {
  const out = $("explain-out");
  try {
    const x = await api("/admin/route/explain", { method: "POST", body: $("explain-body").value,
                                                   headers: { "content-type": "application/json" } });
    out.replaceChildren(renderExplain(x));
  } catch (e) {
    out.replaceChildren(el("p", { class: "error" }, e.message));
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    start();
  });
  $("logout").addEventListener("click", () => showLogin(""));
  $("explain-run").addEventListener("click", explainPasted);
  if (sessionStorage.getItem(TOKEN_KEY)) start(); else showLogin("");
});
