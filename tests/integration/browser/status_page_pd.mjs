// The status page of a disaggregated fleet (2 prefill + 2 decode mockers) in
// Debian's headless chromium (playwright-core): the fleet table grouped by
// role, the PD section with the roles and the counters of split and whole
// requests moving after traffic. Every request the page makes must go to
// loopback.
//
// Env: KVROUTE_ADMIN_URL, KVROUTE_URL, KVROUTE_ADMIN_TOKEN, PREFILL and DECODE
// (comma-separated worker ids), CHROMIUM (default /usr/bin/chromium). Prints
// one JSON line; exit 0 = pass.
import { check, deadline, login, withBrowser } from "./browser.mjs";

const adminUrl = process.env.KVROUTE_ADMIN_URL;
const routerUrl = process.env.KVROUTE_URL;
const token = process.env.KVROUTE_ADMIN_TOKEN;
const prefill = (process.env.PREFILL || "").split(",").filter(Boolean);
const decode = (process.env.DECODE || "").split(",").filter(Boolean);

const words = (tag, n) => Array.from({ length: n }, (_, i) => `${tag}${i}`).join(" ");

async function complete(prompt) {
  const r = await fetch(routerUrl + "/v1/completions", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "mock-model", max_tokens: 2, prompt }),
  });
  await r.text();
  check(r.status === 200, `a request answered (${r.status}, ${r.headers.get("x-kvroute-pd")})`);
  return r.headers.get("x-kvroute-pd");
}

const tileValue = (key) => (k) => {
  const v = document.querySelector(`.tile[data-key="${k}"] .v`);
  return v ? Number(v.textContent.replace(/,/g, "")) : NaN;
};

await withBrowser(async ({ page }) => {
  await login(page, adminUrl, token);

  // 1. The fleet table, grouped by role: prefill workers first, then decode.
  for (const id of [...prefill, ...decode])
    await page.locator(`#fleet tbody tr[data-worker-id="${id}"]`).waitFor({ timeout: deadline });
  const groups = await page.locator("#fleet tbody tr.role-group").allInnerTexts();
  check(groups.length === 2 && /prefill workers \(2\)/.test(groups[0]) && /decode workers \(2\)/.test(groups[1]),
        `the fleet table is grouped by role: ${groups.join(" | ")}`);
  const order = await page.locator("#fleet tbody tr").evaluateAll((rows) =>
    rows.map((r) => r.getAttribute("data-role-group") || r.getAttribute("data-role")));
  check(order.join(",") === "prefill,prefill,prefill,decode,decode,decode",
        `each worker under its role's heading (${order.join(",")})`);
  for (const id of prefill) {
    const row = await page.locator(`#fleet tbody tr[data-worker-id="${id}"]`).innerText();
    check(/\bprefill\b/.test(row), `worker ${id}'s row shows its role: ${row.replace(/\s+/g, " ")}`);
  }

  // 2. The PD section: the roles, then counters that move with traffic.
  await page.locator("#pd-section").waitFor({ state: "visible", timeout: deadline });
  const roles = await page.locator("#pd-roles").innerText();
  check(/2 prefill, 2 decode, 0 aggregated/.test(roles), `the PD section counts the roles: ${roles}`);
  const split0 = await page.evaluate(tileValue("pd split"), "pd split");
  const whole0 = await page.evaluate(tileValue("pd run whole"), "pd run whole");
  check(Number.isFinite(split0) && Number.isFinite(whole0), `split and run-whole tiles (${split0}, ${whole0})`);
  let split = 0, whole = 0;
  for (let i = 0; i < 3; i++) if ((await complete(words(`pdui${i}x`, 200))) === "disaggregated") split++;
  if ((await complete(words("pdshort", 8))) === "aggregated") whole++;
  check(split === 3 && whole === 1, `traffic: ${split} split, ${whole} run whole`);
  await page.waitForFunction(([s, w]) => {
    const v = (k) => Number((document.querySelector(`.tile[data-key="${k}"] .v`) || {}).textContent);
    return v("pd split") >= s && v("pd run whole") >= w;
  }, [split0 + split, whole0 + whole], { timeout: deadline });
  check(true, `the PD tiles count the traffic (split ${split0} -> >= ${split0 + split}, run whole ${whole0} -> >= ${whole0 + whole})`);
  const failures = await page.evaluate(tileValue("pd prefill failures"), "pd prefill failures");
  check(failures === 0, `no prefill failure is shown (${failures})`);
  const detail = await page.locator("#pd-detail").innerText();
  check(/prefill legs: .*ok [1-9]/.test(detail), `the legs' results are listed: ${detail}`);

  return { test: "status_page_pd", split, whole };
});
