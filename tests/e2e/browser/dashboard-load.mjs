// Times the dashboard's Deployments page in a real headless Chromium (through
// playwright-core): for each load, from the browser's own clock, DOMContentLoaded, the
// first row shown and all N rows shown. Prints one JSON line (an array, one entry per
// load). Usage: node dashboard-load.mjs URL N LOADS
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.PLAYWRIGHT_CORE);
const [url, n, loads] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox"] });
const results = [];
try {
  for (let i = 0; i < Number(loads); i++) {
    const page = await browser.newPage({ viewport: { width: 1366, height: 768 } });
    // Marks the first row and the last as the page adds them, on the page's clock.
    await page.addInitScript((want) => {
      const seen = () => document.querySelectorAll("main tbody tr").length;
      new MutationObserver(() => {
        const rows = seen();
        if (rows > 0 && window.__firstRow === undefined) window.__firstRow = performance.now();
        if (rows >= want && window.__allRows === undefined) window.__allRows = performance.now();
      }).observe(document, { childList: true, subtree: true });
    }, Number(n));
    await page.goto(`${url}/#/deployments`);
    await page.waitForFunction(() => window.__allRows !== undefined, null, { timeout: 120000 });
    results.push(await page.evaluate(() => ({
      domContentLoaded: performance.getEntriesByType("navigation")[0].domContentLoadedEventEnd,
      firstRow: window.__firstRow,
      allRows: window.__allRows,
    })));
    await page.close();
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(results));
