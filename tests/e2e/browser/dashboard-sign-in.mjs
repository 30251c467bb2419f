// The dashboard in the cluster, in a real headless Chromium: it asks for a token, refuses
// a wrong one with the API server's verdict, signs in with a good one (the session cookie
// out of the page's reach), lists, and signs out. Prints one JSON line of findings; exits
// 1 on a failed step. A tenant who may list one namespace only is asked for it, then
// shown it. Usage: node dashboard-sign-in.mjs URL NAMESPACE TOKEN TENANT_TOKEN
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.PLAYWRIGHT_CORE);
const [url, ns, token, tenant] = process.argv.slice(2);
const findings = { consoleErrors: [] };
// With SCREENSHOTS=DIR, the sign-in page is saved there (docs/images holds it).
const shot = async (page, file) => {
  if (process.env.SCREENSHOTS) await page.screenshot({ path: `${process.env.SCREENSHOTS}/${file}.png` });
};

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1366, height: 768 } });
  page.on("pageerror", (e) => findings.consoleErrors.push(String(e)));
  // A refused sign-in answers 401 (the browser logs it): that one is expected.
  // So does the tenant's list of every namespace (403), which asks for a namespace.
  page.on("console", (m) => {
    // (and the Providers page: their configs are cluster-scoped, out of a tenant's reach)
    const expected = m.text().includes("status of 401") || m.text().includes("status of 403");
    if (m.type() === "error" && !expected) findings.consoleErrors.push(m.text());
  });
  page.setDefaultTimeout(60000);

  await page.goto(`${url}/`);
  await page.getByRole("heading", { level: 1 }).waitFor();
  findings.first = await page.getByRole("heading", { level: 1 }).textContent();

  await page.getByLabel("Kubernetes bearer token").fill("not-a-token");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("main [role=alert]").waitFor();
  findings.wrongToken = await page.locator("main [role=alert]").textContent();
  await shot(page, "dashboard-sign-in");

  await page.getByLabel("Kubernetes bearer token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Deployments" }).waitFor();
  findings.after = await page.getByRole("heading", { level: 1 }).textContent();
  findings.who = await page.locator("#who").textContent();
  await page.getByRole("table", { name: "ModelDeployments (live)" }).waitFor();
  findings.rows = await page.getByRole("table", { name: "ModelDeployments (live)" })
    .locator("tbody tr td:first-child").allTextContents();
  findings.httpOnly = !(await page.evaluate(() => document.cookie.includes("kubeairunway-session")))
    && (await page.context().cookies()).some((c) => c.name === "kubeairunway-session" && c.httpOnly);

  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByRole("heading", { name: "Sign in" }).waitFor();
  findings.signedOut = await page.getByRole("heading", { level: 1 }).textContent();

  await page.getByLabel("Kubernetes bearer token").fill(tenant);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("main [role=alert]").waitFor();
  findings.tenantAsked = await page.locator("main [role=alert]").textContent();
  await page.getByLabel("Namespace").fill(ns);
  await page.getByRole("button", { name: "Show" }).click();
  await page.getByRole("table", { name: "ModelDeployments (live)" }).waitFor();
  findings.tenantRows = await page.getByRole("table", { name: "ModelDeployments (live)" })
    .locator("tbody tr td:first-child").allTextContents();
  // Away and back through the nav: the namespace chosen is kept.
  await page.getByRole("link", { name: "Providers" }).click();
  await page.getByRole("heading", { name: "Providers" }).waitFor();
  await page.locator("main [role=alert]").waitFor();
  findings.tenantProviders = await page.locator("main [role=alert]").textContent();
  await page.getByRole("link", { name: "Deployments" }).click();
  await page.getByRole("table", { name: "ModelDeployments (live)" }).waitFor();
  findings.tenantBack = decodeURIComponent(new URL(page.url()).hash);
} catch (e) {
  findings.error = String(e);
  findings.page = await browser.contexts()[0]?.pages()[0]?.locator("body").textContent().catch(() => null);
} finally {
  await browser.close();
}
console.log(JSON.stringify(findings));
process.exit(findings.error ? 1 : 0);
