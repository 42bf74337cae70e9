// What the status page's browser tests share: Debian's headless chromium
// (playwright-core, no browser download) in a fresh profile, every request
// the page makes held to loopback (anything else is aborted and recorded),
// the page's script errors recorded, and check() printing one line per
// passed check.
//
// Env: CHROMIUM (default /usr/bin/chromium).
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const deadline = 20000;  // ms, every wait on the page

export function check(cond, what) {
  if (!cond) throw new Error("FAILED: " + what);
  console.log("ok - " + what);
}

// Runs `body({ context, page, consoleErrors, offLoopback })` in a fresh
// browser, then checks that no request left loopback and no script error was
// logged (`consoleErrors` may be emptied by `body` for errors it caused on
// purpose) and prints the object `body` returned as one JSON line (with
// `off_loopback` and `ok`); closes the browser and its profile whatever
// happened. The process exits with 1 (and the error) if anything failed.
export async function withBrowser(body) {
  const profile = mkdtempSync(join(tmpdir(), "kvroute-chromium-"));
  try {
    const context = await chromium.launchPersistentContext(profile, {
      executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      headless: true,
      viewport: { width: 1400, height: 1200 },
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"],
      // the fresh --user-data-dir is `profile` (playwright passes it)
    });
    try {
      const offLoopback = [];
      await context.route("**/*", (route) => {
        const host = new URL(route.request().url()).hostname;
        if (host === "127.0.0.1" || host === "localhost" || host === "[::1]") return route.continue();
        offLoopback.push(route.request().url());
        return route.abort();
      });
      const page = await context.newPage();
      const consoleErrors = [];
      page.on("pageerror", (e) => consoleErrors.push(String(e)));
      page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
      const summary = await body({ context, page, consoleErrors, offLoopback });
      check(offLoopback.length === 0, `no request left loopback (${offLoopback.join(" ") || "none"})`);
      check(consoleErrors.length === 0, `no script error on the page (${consoleErrors.join(" | ") || "none"})`);
      console.log(JSON.stringify({ ...summary, off_loopback: offLoopback.length, ok: true }));
    } finally {
      await context.close();
    }
  } catch (e) {
    console.error(e.stack || String(e));
    process.exitCode = 1;
  } finally {
    rmSync(profile, { recursive: true, force: true });
  }
}

// Opens the status page and logs in with `token` (the page asks for it first).
export async function login(page, adminUrl, token) {
  await page.goto(adminUrl + "/ui");
  await page.locator("#login").waitFor({ state: "visible", timeout: deadline });
  await page.fill("#token", token);
  await page.click("#login-form button");
}
