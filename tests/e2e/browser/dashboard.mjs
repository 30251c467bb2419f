// Drives the dashboard in a real headless Chromium (Debian's, through playwright-core):
// deploy a model through the form after its preview, watch it appear live, open it, scale
// it and delete it. Prints one JSON line of findings for the Rust test to check; exits 1
// on a failed step. Usage: node dashboard.mjs URL NAMESPACE [VIEWER_URL] (a dashboard run
// by a user who may only read ModelDeployments).
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.PLAYWRIGHT_CORE);
const [url, ns, viewerUrl] = process.argv.slice(2);
const name = "tiny";
const findings = { consoleErrors: [], steps: [] };
const step = (s) => findings.steps.push(s);
// With SCREENSHOTS=DIR, each page is saved there as it is checked (docs/images holds them).
const shot = async (page, file, fullPage = false) => {
  if (process.env.SCREENSHOTS) await page.screenshot({ path: `${process.env.SCREENSHOTS}/${file}.png`, fullPage });
};

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1366, height: 768 } });
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().includes("status of 404")) findings.consoleErrors.push(m.text());
  });
  page.on("pageerror", (e) => findings.consoleErrors.push(String(e)));
  page.on("dialog", (d) => d.accept());
  // The chat's refusal is expected here (the test API server serves no service proxy) and
  // checked below; any other failed request is an error.
  page.on("response", (r) => {
    if (r.status() >= 400 && !r.url().endsWith("/chat")) findings.consoleErrors.push(`${r.status()} ${r.url()}`);
  });
  page.setDefaultTimeout(60000);

  // Keyboard: the first Tab reaches the skip link.
  await page.goto(`${url}/#/deploy`);
  await page.keyboard.press("Tab");
  findings.firstTab = await page.evaluate(() => document.activeElement?.textContent);

  // Every form control has a label; every button a name.
  findings.unlabelled = await page.evaluate(() =>
    [...document.querySelectorAll("input, select, textarea")].filter((e) => e.labels.length === 0).map((e) => e.id));
  findings.unnamedButtons = await page.evaluate(() =>
    [...document.querySelectorAll("button")].filter((b) => !b.textContent.trim()).length);

  await page.getByLabel("Name", { exact: true }).fill(name);
  await page.getByLabel("Namespace").fill(ns);
  await page.getByLabel("Model (Hugging Face id)").fill("google/gemma-3-1b-it-qat-q8_0-gguf");
  await page.getByLabel("Engine").selectOption("llamacpp");
  await page.getByLabel("GPUs per replica").fill("0");
  await page.getByLabel("Image (optional)").fill("ghcr.io/sozercan/llama-cpp-runner:latest");
  findings.manifestFromForm = await page.getByLabel(/^Manifest/).inputValue();
  await page.getByRole("button", { name: "Preview" }).click();
  await page.locator("#dry-run").waitFor();
  findings.dryRun = await page.locator("#dry-run").textContent();
  findings.preview = await page.getByRole("region", { name: "Preview" }).textContent();
  findings.selection = await page.locator("#selection").textContent();
  findings.objects = await page.locator("pre.object").allTextContents();
  await shot(page, "dashboard-deploy", true);
  step("previewed");

  // A kernel cache and an inline warmup pass the API server's checks too.
  await page.getByLabel("Kernel cache (optional KernelCache name)").fill("vllm-kernels");
  await page.locator("#f-warmup").selectOption("inline (preload images)");
  await page.getByRole("button", { name: "Preview" }).click();
  await page.waitForFunction(() => document.querySelector("#dry-run") && document.querySelector("#manifest").value.includes("apiVersion: kubeairunway.ai/v1alpha1\n"));
  findings.cacheAndWarmup = [await page.locator("#dry-run").textContent(), await page.getByLabel(/^Manifest/).inputValue()];
  await page.getByLabel("Kernel cache (optional KernelCache name)").fill("");
  await page.locator("#f-warmup").selectOption("none");

  // The YAML view the other way: an edit there, then Preview, updates the form.
  const manifest = await page.getByLabel(/^Manifest/).inputValue();
  await page.getByLabel(/^Manifest/).fill(manifest.replace(/replicas: 1\b/, "replicas: 3"));
  await page.getByRole("button", { name: "Preview" }).click();
  await page.waitForFunction(() => document.querySelector("#f-replicas").value === "3");
  await page.getByLabel("Replicas").fill("1");
  await page.getByRole("button", { name: "Preview" }).click();
  await page.locator("#dry-run").waitFor();
  await page.waitForFunction(() => !document.querySelector("button.primary").disabled);
  step("yaml both ways");

  await page.getByRole("button", { name: "Deploy" }).click();
  await page.waitForURL(`**/#/deployments/${ns}/${name}`);
  step("deployed");

  // Live: the row appears and follows the status without a reload.
  await page.goto(`${url}/#/deployments`);
  await page.locator(`#ns-filter option[value="${ns}"]`).waitFor({ state: "attached" });
  await page.getByLabel("Namespace").selectOption(ns);
  const row = page.getByRole("row", { name: new RegExp(`^${name} `) });
  await row.waitFor();
  // Its provider has reported (phase Deploying, with the selector its pods are found by):
  // the Deployment page reads its pods once, when it opens.
  await page.waitForFunction((n) => [...document.querySelectorAll("tbody tr")]
    .some((tr) => tr.cells[0].textContent === n && tr.cells[4].textContent === "kaito"
      && tr.cells[3].textContent === "Deploying"), name, { timeout: 120000 });
  findings.row = await row.locator("td").allTextContents();
  await shot(page, "dashboard-deployments");
  step("listed live");

  await page.getByRole("link", { name, exact: true }).click();
  await page.getByRole("table", { name: "Conditions" }).waitFor();
  findings.conditions = await page.getByRole("table", { name: "Conditions" }).locator("tbody tr td:first-child").allTextContents();
  findings.selectionTable = await page.getByRole("table", { name: /^Provider selection/ }).locator("tbody tr td:first-child").allTextContents();
  findings.cachesTable = await page.getByRole("table", { name: "Caches and warmup" }).locator("tbody tr td").allTextContents();
  // Its pods (the one the test made with KAITO's label), a pod's log (this API server
  // serves none: the page says so), and the chat's refusal by the service proxy.
  await page.getByRole("table", { name: "Pods" }).getByRole("cell", { name: "tiny-0", exact: true }).waitFor();
  findings.pods = await page.getByRole("table", { name: "Pods" }).locator("tbody tr td").allTextContents();
  await page.getByRole("button", { name: "Log of tiny-0" }).click();
  await page.waitForFunction(() => document.querySelector("#log").textContent.startsWith("No log"));
  findings.log = await page.locator("#log").textContent();
  await page.getByLabel("Message").fill("hi");
  await page.getByRole("button", { name: "Send" }).click();
  await page.locator("#chat-answer [role=alert]").waitFor();
  findings.chat = await page.locator("#chat-answer").textContent();
  await page.locator("h1").scrollIntoViewIfNeeded();
  await shot(page, "dashboard-deployment");
  step("pods, log, chat");
  await page.getByLabel("Replicas").fill("2");
  await page.getByRole("button", { name: "Scale" }).click();
  await page.getByRole("status").filter({ hasText: "scaled to 2" }).waitFor();
  step("scaled");
  await page.getByRole("button", { name: "Delete" }).click();
  await page.waitForURL("**/#/deployments");
  step("deleted");

  await page.goto(`${url}/#/providers`);
  await page.getByRole("table", { name: "Providers" }).waitFor();
  findings.providers = await page.getByRole("table", { name: "Providers" }).locator("tbody tr td:first-child").allTextContents();
  step("providers");

  // Models: the fit against the cluster's GPUs (an H100 node the test made), then Deploy
  // from the catalogue prefills the form.
  await page.goto(`${url}/#/models`);
  await page.getByRole("table", { name: "Cluster GPUs" }).getByRole("cell", { name: "gpu-node-h100" }).waitFor();
  await page.getByRole("table", { name: /^Models: .* 80 GB GPUs$/ }).waitFor();
  findings.gpuMemoryChosen = await page.getByLabel("GPU memory").inputValue();
  const seventy = () => page.getByRole("row", { name: /^meta-llama\/Llama-3.1-70B-Instruct / }).locator("td").nth(5).textContent();
  findings.seventyOn80 = await seventy();
  await page.getByLabel("GPU memory").selectOption("24");
  await page.getByRole("table", { name: /24 GB GPUs$/ }).waitFor();
  findings.seventyOn24 = await seventy();
  // Hugging Face search (the test's stand-in of the hub), and a result's fit.
  await page.getByLabel("Search Hugging Face").fill("qwen3");
  await page.getByRole("button", { name: "Search" }).click();
  await page.getByRole("table", { name: "Hugging Face: qwen3" }).waitFor();
  findings.hubFound = await page.getByRole("table", { name: "Hugging Face: qwen3" }).locator("tbody tr td:first-child").allTextContents();
  await page.getByRole("button", { name: "Fit of Qwen/Qwen3-0.6B" }).click();
  await page.getByRole("table", { name: "Hugging Face: qwen3" }).getByRole("link", { name: "Deploy Qwen/Qwen3-0.6B" }).waitFor();
  findings.hubFit = (await page.getByRole("table", { name: "Hugging Face: qwen3" }).locator("tbody tr td").nth(2).textContent()).trim();
  await shot(page, "dashboard-models", true);
  await page.getByRole("table", { name: /^Models: / }).getByRole("link", { name: "Deploy Qwen/Qwen3-0.6B" }).click();
  await page.getByLabel("Model (Hugging Face id)").waitFor();
  findings.prefilled = [await page.getByLabel("Name", { exact: true }).inputValue(),
    await page.getByLabel("Model (Hugging Face id)").inputValue(), await page.getByLabel("GPUs per replica").inputValue()];
  step("models");

  await page.goto(`${url}/#/caches`);
  await page.getByRole("table", { name: "Model caches" }).waitFor();
  findings.modelCaches = await page.getByRole("table", { name: "Model caches" }).locator("tbody tr td").allTextContents();
  findings.nodes = await page.getByRole("table", { name: "Nodes" }).locator("tbody tr td").allTextContents();
  await shot(page, "dashboard-caches");
  step("caches");

  // A field the API server refuses: its own message, and Deploy stays disabled.
  const fillDeploy = async (base, deployName) => {
    await page.goto(`${base}/#/deploy`);
    await page.getByLabel("Name", { exact: true }).fill(deployName);
    await page.getByLabel("Namespace").fill(ns);
    await page.getByLabel("Model (Hugging Face id)").fill("Qwen/Qwen3-0.6B");
    await page.getByRole("button", { name: "Preview" }).click();
    await page.locator("#dry-run").waitFor();
    return [await page.locator("#dry-run").textContent(), await page.getByRole("button", { name: "Deploy" }).isDisabled()];
  };
  [findings.invalid, findings.invalidDeployDisabled] = await fillDeploy(url, "Not_A_Name");
  step("invalid field");

  if (viewerUrl) {
    // A user who may only read: the list works, a deployment is refused with the API
    // server's words before anything is written.
    [findings.viewerDryRun, findings.viewerDeployDisabled] = await fillDeploy(viewerUrl, "denied");
    await page.goto(`${viewerUrl}/#/deployments`);
    // The live list answered (rows, or none left): the viewer's watch works.
    await page.locator("main table, main p.message:has-text('No ModelDeployments')").first().waitFor();
    findings.viewerListed = !(await page.locator("main [role=alert]").count());
    step("viewer");
  }
} catch (e) {
  findings.error = String(e);
  findings.page = await browser.contexts()[0]?.pages()[0]?.locator("main").textContent().catch(() => null);
} finally {
  await browser.close();
}
console.log(JSON.stringify(findings));
process.exit(findings.error ? 1 : 0);
