// Drives Debian's headless chromium (playwright-core, no browser download)
// against kvroute's status page on a live fleet and checks what an operator
// sees: the token prompt, every worker in the fleet table, the queue's wait
// (the oldest waiter, the p99 wait) while every worker is busy, totals that
// move after traffic, a latest decision opening its explain in words, and the
// paste-a-body explain box. Every request the page makes must go to loopback:
// anything else is aborted and fails the test.
//
// Env: KVROUTE_ADMIN_URL (http://127.0.0.1:PORT), KVROUTE_URL (the router),
// KVROUTE_ADMIN_TOKEN, WORKERS (comma-separated ids), SCREENSHOT (PNG path),
// CHROMIUM (default /usr/bin/chromium). Prints one JSON line; exit 0 = pass.
import { statSync } from "node:fs";

import { check, deadline, withBrowser } from "./browser.mjs";

const adminUrl = process.env.KVROUTE_ADMIN_URL;
const routerUrl = process.env.KVROUTE_URL;
const token = process.env.KVROUTE_ADMIN_TOKEN;
const workers = (process.env.WORKERS || "").split(",").filter(Boolean);
const screenshot = process.env.SCREENSHOT;

async function traffic(n, tag) {
  for (let i = 0; i < n; i++) {
    const r = await fetch(routerUrl + "/v1/completions", {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "mock-model", max_tokens: 4,
        prompt: `${tag}: a shared system prompt long enough to fill several KV blocks of sixteen tokens each, ` +
                `so that a second request with the same prefix finds it cached on one worker. request ${i % 3}` }),
    });
    check(r.status === 200 || i > 0, `traffic request ${tag} answered (${r.status})`);
    await r.text();
  }
}

const tile = (page, key) => page.locator(`.tile[data-key="${key}"] .v`).innerText();

// A streaming request that holds its worker's one slot (the mockers run with
// --max-seqs 1) until the returned function ends it.
async function hold(tag) {
  const ac = new AbortController();
  const r = await fetch(routerUrl + "/v1/completions", {
    method: "POST", headers: { "content-type": "application/json" }, signal: ac.signal,
    body: JSON.stringify({ model: "mock-model", max_tokens: 100000, stream: true, prompt: `${tag}: hold the slot` }),
  });
  check(r.status === 200, `a long stream holds a worker (${tag})`);
  const reader = r.body.getReader();
  await reader.read();  // its first token: it runs on its worker
  return () => { ac.abort(); reader.cancel().catch(() => {}); };
}

// Waits until the page shows a positive number in the normal band's cell of class `cls`.
const bandCellPositive = (page, cls) => page.waitForFunction((c) => {
  const td = document.querySelector(`#flow-bands tbody tr[data-band="normal"] td.${c}`);
  return td !== null && Number(td.textContent.replace(/,/g, "")) > 0;
}, cls, { timeout: deadline });

await withBrowser(async ({ context, page, consoleErrors }) => {
  // Requests in flight and 401 answers, so the wrong-token step can wait for
  // every refusal it caused (and the browser's log line for each) to settle.
  const inflight = new Set();
  let refused = 0;
  page.on("request", (r) => inflight.add(r));
  page.on("requestfinished", (r) => inflight.delete(r));
  page.on("requestfailed", (r) => inflight.delete(r));
  page.on("response", (r) => { if (r.status() === 401) refused++; });
  const settle = async () => {
    const until = Date.now() + deadline;
    const logged = () => consoleErrors.filter((e) => /401/.test(e)).length;
    while (inflight.size > 0 || logged() < refused) {
      if (Date.now() > until) throw new Error(`FAILED: the refused requests settle (${inflight.size} in flight, ${logged()} of ${refused} logged)`);
      await new Promise((done) => setTimeout(done, 20));
    }
  };

  // 1. No token yet: the page asks for it; a wrong one is refused.
  await page.goto(adminUrl + "/ui");
  await page.locator("#login").waitFor({ state: "visible", timeout: deadline });
  check(await page.locator("#main").isHidden(), "the page asks for the admin token first");
  await page.fill("#token", "wrong-token");
  await page.click("#login-form button");
  await page.locator("#login-error").filter({ hasText: "401" }).waitFor({ timeout: deadline });
  check(true, "a wrong token is refused with a message");
  await settle();

  // 2. The right token: every worker shows up. (The 401s above were logged
  // by the browser on purpose; from here on no error is expected.)
  consoleErrors.length = 0;
  await page.fill("#token", token);
  await page.click("#login-form button");
  for (const id of workers)
    await page.locator(`#fleet tbody tr[data-worker-id="${id}"]`).waitFor({ timeout: deadline });
  const rows = await page.locator("#fleet tbody tr").count();
  check(rows === workers.length, `the fleet table shows every worker (${rows} of ${workers.length})`);
  const firstRow = await page.locator("#fleet tbody tr").first().innerText();
  check(/mock-model/.test(firstRow) && /\bok\b/.test(firstRow), `a fleet row has model and state: ${firstRow.replace(/\s+/g, " ")}`);
  check(/\bboth\b/.test(firstRow), `a fleet row has the worker's role: ${firstRow.replace(/\s+/g, " ")}`);
  // An aggregated fleet: no role headings, no PD section (status_page_pd.mjs has a disaggregated one).
  check(await page.locator("#fleet tbody tr.role-group").count() === 0, "no role headings in an aggregated fleet");
  check(await page.locator("#pd-section").isHidden(), "no PD section in an aggregated fleet");
  // Flow control: the implied tenant "default" (no keys: an open listener) and the queue by band.
  await page.locator('#flow-tenants tbody tr[data-tenant="default"]').waitFor({ timeout: deadline });
  const flowSummary = await page.locator("#flow-summary").innerText();
  check(/no API keys/.test(flowSummary) && /normal/.test(flowSummary), `the flow section shows the queue and the open listener: ${flowSummary}`);
  // The queue wait: every worker busy (a stream holds each one's only slot),
  // one more request waits in the queue; the page shows how long its band's
  // and its tenant's oldest waiter has waited, then, once a slot frees and
  // it is admitted, the band's p99 wait.
  const ends = [];
  for (const id of workers) ends.push(await hold(`hold-${id}`));
  const queued = fetch(routerUrl + "/v1/completions", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "mock-model", max_tokens: 4, prompt: "browser-test: queued behind the streams" }),
  });
  await bandCellPositive(page, "oldest-wait");
  const oldest = await page.locator('#flow-bands tbody tr[data-band="normal"]').innerText();
  check(/\b1\b/.test(oldest), `the band's row shows the waiting request and its oldest wait: ${oldest.replace(/\s+/g, " ")}`);
  const tenantWait = await page.locator('#flow-tenants tbody tr[data-tenant="default"] td.oldest-wait').innerText();
  check(Number(tenantWait) > 0, `the tenant's row shows its oldest wait (${tenantWait} ms)`);
  ends.shift()();  // a slot frees: the queued request is admitted
  const answered = await queued;
  await answered.text();
  check(answered.status === 200, `the queued request is admitted when a slot frees (${answered.status})`);
  await bandCellPositive(page, "wait-p99");
  const after = await page.locator('#flow-bands tbody tr[data-band="normal"]').innerText();
  check(true, `the band's p99 queue wait shows once a wait ended: ${after.replace(/\s+/g, " ")}`);
  for (const end of ends) end();

  const stored = await page.evaluate(() => sessionStorage.getItem("kvroute-admin-token"));
  check(stored === token, "the token is kept in sessionStorage (this tab only)");
  const cookies = await context.cookies();
  check(cookies.length === 0, "no cookie is set");

  // 3. Traffic moves the totals and adds decisions.
  const before = Number((await tile(page, "routed since start")).replace(/,/g, ""));
  await traffic(6, "browser-test");
  await page.waitForFunction((n) => {
    const v = document.querySelector('.tile[data-key="routed since start"] .v');
    return v && Number(v.textContent.replace(/,/g, "")) >= n;
  }, before + 6, { timeout: deadline });
  check(true, `the totals update after traffic (routed ${before} -> >= ${before + 6})`);
  await page.waitForFunction(() => {
    const v = document.querySelector('.tile[data-key="hit rate"] .v');
    return v && v.textContent !== "—";
  }, null, { timeout: deadline });
  check(true, `the hit rate tile shows ${await tile(page, "hit rate")}`);
  await page.locator("#decisions li").first().waitFor({ timeout: deadline });
  // The mockers' text prompts are tokenized by the workers' own /tokenize (no tokenizer.models).
  const head = await page.locator("#decisions li .head").first().innerText();
  check(/ tokens \(engine\) → worker /.test(head), `a decision says which tokenization it used: "${head}"`);

  // 4. A decision opens its explain, in words.
  await page.locator("#decisions li .head").first().click();
  const reason = page.locator("#decisions li.open .explain .reason").first();
  await reason.waitFor({ timeout: deadline });
  const text = await reason.innerText();
  check(/^(Chose|Drew) worker \d+: holds \d+ of \d+ blocks/.test(text), `a decision's explain says why: "${text.slice(0, 90)}..."`);
  const why = await page.locator("#decisions li.open .explain td.why").first().innerText();
  check(/chosen/.test(why), `its rank-1 row says: "${why.slice(0, 60)}..."`);
  // It stays open across refreshes.
  const updated = await page.locator("#updated").innerText();
  await page.waitForFunction((u) => document.querySelector("#updated").textContent !== u, updated, { timeout: 5000 });
  check(await page.locator("#decisions li.open .explain").count() >= 1, "the page refreshes by itself and the open explain stays open");

  // 5. Paste a body, see its explain.
  await page.fill("#explain-body", JSON.stringify({ model: "mock-model", prompt: "browser-test: a shared system prompt long enough to fill several KV blocks of sixteen tokens each, so that a second request with the same prefix finds it cached on one worker. request 0" }));
  await page.click("#explain-run");
  const pasted = page.locator("#explain-out .reason");
  await pasted.waitFor({ timeout: deadline });
  const ptext = await pasted.innerText();
  check(/holds [1-9]\d* of \d+ blocks/.test(ptext), `the pasted body's explain finds the cached prefix: "${ptext.slice(0, 90)}..."`);
  const ranks = await page.locator("#explain-out tbody tr td:first-child").allInnerTexts();
  check(ranks[0] === "1", `workers ordered by rank from 1 (${ranks.join(",")})`);

  // 6. The charts have data.
  const chartInk = await page.evaluate(() => {
    const c = document.getElementById("chart-rps");
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let blue = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i + 2] > 150 && d[i] < 100) blue++;
    return blue;
  });
  check(chartInk > 0, `the requests/s chart is drawn (${chartInk} line pixels)`);

  if (screenshot) {
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: screenshot, fullPage: true });
    check(statSync(screenshot).size > 10000, `screenshot saved to ${screenshot}`);
  }
  return { test: "status_page", workers: rows };
});
