// The kubeairunway dashboard: a few views over the dashboard's JSON API. Every piece of
// data reaches the page through textContent (never as HTML), and every change carries the
// header the server asks of its own page (docs/dashboard.md).

const CHANGE = { "content-type": "application/json", "x-kubeairunway-dashboard": "1" };
const main = document.getElementById("main");
let live = null; // the open EventSource of the Deployments view

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function table(caption, headers, rows) {
  return el("table", {},
    el("caption", { text: caption }),
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col", text: h })))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c))))));
}

function notice(text) {
  const n = document.getElementById("notice");
  n.textContent = text;
  setTimeout(() => { if (n.textContent === text) n.textContent = ""; }, 4000);
}

async function call(method, url, body) {
  const response = await fetch(url, { method, headers: CHANGE, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  const data = text ? JSON.parse(text) : {};
  // In the cluster, a session that ended (or none yet) asks for a token again.
  if (response.status === 401 && data.signIn) {
    const ended = document.getElementById("who").childElementCount > 0;
    document.getElementById("who").replaceChildren();
    signInView(ended ? "The session ended: sign in again." : undefined);
    throw new Error(data.message);
  }
  if (!response.ok) throw Object.assign(new Error(data.message || `${response.status} ${response.statusText}`), { data });
  return data;
}

// ---- Signing in (the dashboard in the cluster acts as each user, with their token) ----

function signedIn(user) {
  const who = document.getElementById("who");
  who.replaceChildren(el("span", { text: user ? `Signed in as ${user}` : "Signed in" }),
    el("button", { type: "button", onclick: signOut, text: "Sign out" }));
}

async function signOut() {
  await fetch("/api/session", { method: "DELETE", headers: CHANGE });
  document.getElementById("who").replaceChildren();
  signInView();
}

function signInView(message) {
  view += 1;
  const token = el("input", { id: "token", type: "password", autocomplete: "off", spellcheck: "false", required: "" });
  const result = el("div", {}, message ? el("p", { class: "bad", role: "alert", text: message }) : []);
  const form = el("form", { class: "actions" },
    el("label", { for: "token" }, "Kubernetes bearer token", token),
    el("button", { type: "submit", class: "primary", text: "Sign in" }));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const response = await fetch("/api/session", { method: "POST", headers: CHANGE, body: JSON.stringify({ token: token.value }) });
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      result.replaceChildren(el("p", { class: "bad", role: "alert", text: data.message || `${response.status}` }));
      return;
    }
    signedIn(data.user);
    route();
  });
  show("Sign in",
    el("p", {}, "This dashboard acts as you: everything it shows and does is your own request to the API server, allowed or refused by your rights. Sign in with a token the API server accepts, for example from ",
      el("code", { text: "kubectl create token NAME" }), ". It is kept by the dashboard's server for this session only."),
    result, form);
}

let navigated = false; // focus moves to the new view on navigation, not on first load
let view = 0; // the current view's number: an answer for an older view is dropped

function show(title, ...content) {
  if (live) { live.close(); live = null; }
  main.replaceChildren(el("h1", { text: title }), ...content.flat(Infinity));
  for (const a of document.querySelectorAll("nav a")) {
    const here = location.hash.split("?")[0];
    if (here === a.getAttribute("href") || here.startsWith(`${a.getAttribute("href")}/`)) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.title = `${title} · kubeairunway`;
  if (navigated) main.focus();
}

// ---- Deployments ----

// A user who may not list every namespace: the namespace they chose last.
let chosenNamespace = null;

// `only`: the namespace asked for by a user who may not list every namespace.
function deploymentsView(only) {
  const mine = view;
  const filter = el("select", { id: "ns-filter" }, el("option", { value: "", text: "all namespaces" }));
  const body = el("div", { "aria-live": "polite" }, el("p", { class: "message", text: "Loading…" }));
  const chooser = el("div", { class: "actions" }, el("label", { for: "ns-filter" }, "Namespace", filter));
  show("Deployments", chooser, body);
  let latest = [];
  const render = () => {
    const ns = only || filter.value;
    const rows = latest.filter((r) => !ns || r.namespace === ns);
    if (rows.length === 0) {
      body.replaceChildren(el("p", { class: "message" }, "No ModelDeployments. ", el("a", { href: "#/deploy", text: "Deploy one" })));
      return;
    }
    body.replaceChildren(table("ModelDeployments (live)",
      ["Name", "Namespace", "Model", "Phase", "Provider", "Engine", "Ready", "Endpoint", "Age"],
      rows.map((r) => [
        el("a", { href: `#/deployments/${encodeURIComponent(r.namespace)}/${encodeURIComponent(r.name)}`, text: r.name }),
        r.namespace, r.model,
        el("span", { class: `phase-${r.phase}`, title: r.message, text: r.phase }),
        r.provider, r.engine, r.replicas, r.endpoint, r.age,
      ])));
  };
  // Rights in some namespaces only: the page asks which one, and watches that one.
  const askNamespace = (message) => {
    const input = el("input", { id: "ns-only", value: only ?? "", required: "", spellcheck: "false" });
    const form = el("form", { class: "actions" }, el("label", { for: "ns-only" }, "Namespace", input),
      el("button", { type: "submit", text: "Show" }));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      location.hash = `#/deployments?namespace=${encodeURIComponent(input.value.trim())}`;
    });
    chooser.replaceChildren(form);
    body.replaceChildren(el("p", { class: "bad", role: "alert", text: message }));
  };
  filter.addEventListener("change", render);
  const query = only ? `?namespace=${encodeURIComponent(only)}` : "";
  // The rows as they are now (shown at once), then live from the stream.
  const showRows = (rows) => {
    latest = rows;
    const namespaces = [...new Set(latest.map((r) => r.namespace))].sort();
    const chosen = filter.value;
    filter.replaceChildren(el("option", { value: "", text: "all namespaces" }),
      ...namespaces.map((ns) => el("option", { value: ns, text: ns })));
    filter.value = namespaces.includes(chosen) ? chosen : "";
    render();
  };
  call("GET", `/api/deployments${query}`).then((rows) => {
    if (mine !== view) return;
    showRows(rows);
    if (only) {
      chosenNamespace = only;
      chooser.replaceChildren(el("p", { class: "message" }, `Namespace ${only} `,
        el("a", { href: "#/deployments?namespace=", text: "(another)" })));
    }
    live = new EventSource(`/api/deployments/stream${query}`);
    // A stream refused (the session ended) is found out by asking who we are.
    live.addEventListener("error", async () => {
      const s = await fetch("/api/session").then((r) => r.json()).catch(() => null);
      if (s && !s.signedIn) signInView("The session ended: sign in again.");
    });
    live.addEventListener("deployments", (e) => showRows(JSON.parse(e.data)));
  }).catch((e) => {
    if (mine !== view) return;
    // Back on the list (the nav, after a delete): the namespace chosen before.
    if (e.data?.namespaceNeeded && only === undefined && chosenNamespace) {
      location.hash = `#/deployments?namespace=${encodeURIComponent(chosenNamespace)}`;
      return;
    }
    if (e.data?.namespaceNeeded || only !== undefined) askNamespace(e.message);
    else body.replaceChildren(el("p", { class: "bad", role: "alert", text: e.message }));
  });
}

// ---- Deployment ----

async function deploymentView(ns, name) {
  const mine = view;
  show(`${ns}/${name}`, el("p", { class: "message", text: "Loading…" }));
  let data;
  try {
    data = await call("GET", `/api/deployments/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`);
  } catch (e) {
    if (mine === view) show(`${ns}/${name}`, el("p", { class: "bad", role: "alert", text: e.message }));
    return;
  }
  if (mine !== view) return;
  const x = data.explanation;
  const replicas = el("input", { id: "replicas", type: "number", min: "0", value: String(data.spec?.scaling?.replicas ?? 1) });
  const facts = [
    ["Phase", el("span", { class: `phase-${x.phase}`, text: x.phase ?? "Pending" })],
    ["Message", x.message ?? "-"],
    ["Provider", `${x.provider ?? "-"}${x.selectedReason ? ` (${x.selectedReason})` : ""}`],
    ["Engine", x.engine ?? x.engineNow],
    ["Replicas", x.replicas ?? "-"],
    ["Endpoint", x.endpoint ?? "-"],
  ];
  show(`${ns}/${name}`,
    el("dl", {}, facts.map(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)])),
    el("div", { class: "actions" },
      el("label", { for: "replicas" }, "Replicas", replicas),
      el("button", { type: "button", onclick: async () => {
        try { await call("PUT", `/api/deployments/${encodeURIComponent(ns)}/${encodeURIComponent(name)}/scale`, { replicas: Number(replicas.value) }); notice(`scaled to ${replicas.value}`); }
        catch (e) { notice(e.message); }
      } }, "Scale"),
      el("button", { type: "button", onclick: async () => {
        if (!confirm(`Delete ${ns}/${name}?`)) return;
        try { await call("DELETE", `/api/deployments/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`); notice(`deleting ${name}`); location.hash = "#/deployments"; }
        catch (e) { notice(e.message); }
      } }, "Delete")),
    cachesTable(data.spec ?? {}, x.conditions),
    table("Conditions", ["Type", "Status", "Reason", "Age", "Message"],
      x.conditions.map((c) => [c.type, el("span", { class: c.status === "True" ? "ok" : "warn", text: c.status }), c.reason, c.age, c.message])),
    table(`Provider selection: ${x.selectionNow}`, ["Provider", "Health", "Capabilities", "Score", "Standing"],
      x.selection.map((v) => [v.name, v.health, v.capabilities, v.score ?? "-", v.standing])),
    table("Upstream object", ["Object", "API", "State"],
      x.upstream ? [[x.upstream.object, x.upstream.apiVersion ?? "-", x.upstream.state.join("; ")]] : []),
    table("Events", ["Age", "Type", "Reason", "Message"],
      x.events.map((e) => [e.age, e.type, e.reason, e.message])),
    podsSection(ns, name),
    chatSection(ns, name),
    el("h2", { text: "Manifest" }), el("pre", { text: data.manifest }));
}

// The serving pods (by the selector the provider reports) and, on demand, a pod's log.
// What the deployment asked of caches and warmup, and what their conditions say now.
function cachesTable(spec, conditions) {
  const said = (type, otherwise) => {
    const c = conditions.find((c) => c.type === type);
    return c ? `${c.status}: ${c.reason}${c.message ? `: ${c.message}` : ""}` : otherwise;
  };
  const warmup = spec.warmup ? (spec.warmup.name ? `Warmup ${spec.warmup.name}` : "inline") : "none";
  return table("Caches and warmup", ["", "Asked", "Now"], [
    ["Kernel cache", spec.kernelCache?.name ?? "none",
      said("KernelCacheReady", spec.kernelCache ? "not reported yet (is the kernel-cache provider installed?)" : "-")],
    ["Model cache", spec.model?.cacheRef?.name ?? "a Ready ModelCache of its model, if any",
      said("ModelCacheReady", "none: serving pods download the model themselves")],
    ["Warmup", warmup, said("WarmedUp", spec.warmup ? "not reported yet" : "-")],
  ]);
}

function podsSection(ns, name) {
  const base = `/api/deployments/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`;
  const section = el("section", { "aria-label": "Pods" }, el("p", { class: "message", text: "Loading pods…" }));
  const log = el("pre", { id: "log", "aria-live": "polite", "aria-label": "Log" });
  call("GET", `${base}/pods`).then((pods) => {
    section.replaceChildren(table("Pods", ["Name", "Phase", "Node", "Ready", "Restarts", "Age", "Log"],
      pods.map((p) => [p.name, p.phase, p.node, p.ready, String(p.restarts), p.age,
        el("button", { type: "button", "aria-label": `Log of ${p.name}`, onclick: async () => {
          log.textContent = "Loading…";
          const r = await call("GET", `${base}/pods/${encodeURIComponent(p.name)}/logs?container=${encodeURIComponent(p.containers[0] ?? "")}`);
          log.textContent = r.text ?? `No log: ${r.error}`;
        } }, "Log")])), log);
  }).catch((e) => section.replaceChildren(el("p", { class: "bad", role: "alert", text: e.message })));
  return section;
}

// A chat with the model through the API server's service proxy, streamed as it answers.
function chatSection(ns, name) {
  const base = `/api/deployments/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`;
  const input = el("textarea", { id: "chat-input", rows: "3", class: "chat" });
  const answer = el("pre", { id: "chat-answer", "aria-live": "polite", "aria-label": "Answer" });
  const send = async () => {
    answer.textContent = "";
    const response = await fetch(`${base}/chat`, { method: "POST", headers: CHANGE,
      body: JSON.stringify({ messages: [{ role: "user", content: input.value }] }) });
    if (!response.ok) {
      const data = await response.json().catch(() => ({}));
      answer.replaceChildren(el("span", { class: "bad", role: "alert", text: data.message || `${response.status}` }));
      return;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      pending += decoder.decode(value, { stream: true });
      const lines = pending.split("\n");
      pending = lines.pop();
      for (const line of lines) {
        const data = line.startsWith("data: ") ? line.slice(6).trim() : "";
        if (!data || data === "[DONE]") continue;
        try { answer.textContent += JSON.parse(data).choices?.[0]?.delta?.content ?? ""; } catch { /* not JSON: skip */ }
      }
    }
  };
  return el("section", { "aria-label": "Chat" }, el("h2", { text: "Chat" }),
    el("label", { for: "chat-input" }, "Message", input),
    el("div", { class: "actions" }, el("button", { type: "button", onclick: send }, "Send")),
    answer);
}

// ---- Deploy ----

const FIELDS = [
  ["name", "Name", "text", "qwen"],
  ["namespace", "Namespace", "text", "default"],
  ["model", "Model (Hugging Face id)", "text", "Qwen/Qwen3-0.6B"],
  ["engine", "Engine", ["auto", "vllm", "sglang", "trtllm", "llamacpp"]],
  ["gpus", "GPUs per replica", "number", "1"],
  ["replicas", "Replicas", "number", "1"],
  ["mode", "Serving mode", ["aggregated", "disaggregated"]],
  ["provider", "Provider", ["auto", "deployment", "dynamo", "kaito", "kuberay"]],
  ["image", "Image (optional)", "text", ""],
  ["kernelCache", "Kernel cache (optional KernelCache name)", "text", ""],
  ["warmup", "Warmup", ["none", "inline (preload images)", "named Warmup"]],
  ["warmupName", "Warmup name (for a named Warmup)", "text", ""],
];

function manifestOf(f) {
  const spec = { model: { id: f.model }, scaling: { replicas: Number(f.replicas) } };
  if (f.engine !== "auto") spec.engine = { type: f.engine };
  spec.resources = { gpu: { count: Number(f.gpus) } };
  if (f.mode !== "aggregated") spec.serving = { mode: f.mode };
  if (f.provider !== "auto") spec.provider = { name: f.provider };
  if (f.image) spec.image = f.image;
  if (f.kernelCache) spec.kernelCache = { name: f.kernelCache };
  if (f.warmup === "named Warmup" && f.warmupName) spec.warmup = { name: f.warmupName };
  else if (f.warmup === "inline (preload images)") spec.warmup = {};
  return { apiVersion: "kubeairunway.ai/v1alpha1", kind: "ModelDeployment", metadata: { name: f.name, namespace: f.namespace }, spec };
}

// YAML of plain objects, arrays and scalars (what manifestOf makes).
function yaml(value, indent = "") {
  if (Array.isArray(value)) return value.map((v) => `${indent}- ${yaml(v, indent + "  ").trimStart()}`).join("\n");
  if (value && typeof value === "object") {
    return Object.entries(value).map(([k, v]) => (v && typeof v === "object" && Object.keys(v).length > 0)
      ? `${indent}${k}:\n${yaml(v, indent + "  ")}` : `${indent}${k}: ${JSON.stringify(v)}`).join("\n");
  }
  return `${indent}${JSON.stringify(value)}`;
}

function deployView(prefill = new URLSearchParams()) {
  const inputs = {};
  const form = el("form", { class: "deploy", "aria-label": "ModelDeployment" },
    FIELDS.map(([key, label, type, value]) => {
      const id = `f-${key}`;
      const input = Array.isArray(type)
        ? el("select", { id, name: key }, type.map((o) => el("option", { value: o, text: o })))
        : el("input", { id, name: key, type, value, ...(value ? { required: "" } : {}), ...(type === "number" ? { min: "0" } : {}) });
      inputs[key] = input;
      return el("label", { for: id }, label, input);
    }));
  const text = el("textarea", { id: "manifest", spellcheck: "false" });
  const result = el("section", { "aria-live": "polite", "aria-label": "Preview" });
  const deploy = el("button", { type: "button", class: "primary", disabled: "" }, "Deploy");
  const values = () => Object.fromEntries(Object.entries(inputs).map(([k, i]) => [k, i.value]));
  const sync = () => { text.value = yaml(manifestOf(values())) + "\n"; deploy.disabled = true; };
  form.addEventListener("input", sync);
  text.addEventListener("input", () => { deploy.disabled = true; });
  const fill = (md) => {
    inputs.name.value = md.metadata?.name ?? "";
    inputs.namespace.value = md.metadata?.namespace ?? "";
    inputs.model.value = md.spec?.model?.id ?? "";
    inputs.engine.value = md.spec?.engine?.type ?? "auto";
    inputs.gpus.value = md.spec?.resources?.gpu?.count ?? 0;
    inputs.replicas.value = md.spec?.scaling?.replicas ?? 1;
    inputs.mode.value = md.spec?.serving?.mode ?? "aggregated";
    inputs.provider.value = md.spec?.provider?.name ?? "auto";
    inputs.image.value = md.spec?.image ?? "";
    inputs.kernelCache.value = md.spec?.kernelCache?.name ?? "";
    inputs.warmupName.value = md.spec?.warmup?.name ?? "";
    inputs.warmup.value = md.spec?.warmup?.name ? "named Warmup" : md.spec?.warmup ? "inline (preload images)" : "none";
  };
  const preview = async () => {
    result.replaceChildren(el("p", { class: "message", text: "Checking…" }));
    let p;
    try { p = await call("POST", "/api/preview", { manifest: text.value }); }
    catch (e) { result.replaceChildren(el("p", { class: "bad", role: "alert", text: e.message })); return; }
    fill(p.modelDeployment);
    text.value = p.manifest;
    const r = p.render;
    result.replaceChildren(...[
      el("h2", { text: "Preview" }),
      el("p", { class: p.dryRun.ok ? "ok" : "bad", id: "dry-run", text: `Validation: ${p.dryRun.message}` }),
      r.error ? el("p", { class: "bad", id: "render-error", text: `Render: ${r.error}` }) : [
        el("p", { id: "selection", text: `Engine ${r.engine}; provider ${r.provider}: ${r.reason}` }),
        r.warnings.length ? el("ul", { "aria-label": "Warnings" }, r.warnings.map((w) => el("li", { class: "warn", text: w }))) : [],
        el("h3", { text: `What ${r.provider} will apply (${r.objects.length})` }),
        r.objects.map((o) => el("pre", { class: "object", text: o })),
      ]].flat(Infinity));
    deploy.disabled = !p.dryRun.ok;
  };
  deploy.addEventListener("click", async () => {
    try {
      const created = await call("POST", "/api/deployments", { manifest: text.value });
      notice(`created ${created.namespace}/${created.name}`);
      location.hash = `#/deployments/${encodeURIComponent(created.namespace)}/${encodeURIComponent(created.name)}`;
    } catch (e) { result.prepend(el("p", { class: "bad", role: "alert", text: e.message })); }
  });
  if (prefill.get("model")) {
    inputs.model.value = prefill.get("model");
    inputs.name.value = prefill.get("model").split("/").pop().toLowerCase().replace(/[^a-z0-9-]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 40);
  }
  if (prefill.get("gpus")) inputs.gpus.value = prefill.get("gpus");
  if (prefill.get("engine")) inputs.engine.value = prefill.get("engine");
  show("Deploy a model", form,
    el("label", { for: "manifest" }, "Manifest (YAML; edit it, then Preview to update the form)", text),
    el("div", { class: "actions" }, el("button", { type: "button", onclick: preview }, "Preview"), deploy),
    result);
  sync();
}

// ---- Providers ----

async function providersView() {
  const mine = view;
  show("Providers", el("p", { class: "message", text: "Loading…" }));
  try {
    const entries = await call("GET", "/api/providers");
    if (mine !== view) return;
    const health = (p) => !p.registered ? "not installed" : p.ready ? `ready (heartbeat ${p.heartbeatAge ?? "-"} ago)` : "not ready";
    show("Providers", table("Providers", ["Name", "Health", "Version", "Upstream API", "Serves", "Documentation"],
      entries.map((p) => [p.name, el("span", { class: p.ready ? "ok" : "warn", text: health(p) }), p.version ?? "-",
        p.upstreamCRDVersion ?? "-", p.serves, p.documentation ?? "-"])));
  } catch (e) {
    if (mine === view) show("Providers", el("p", { class: "bad", role: "alert", text: e.message }));
  }
}

// ---- Models ----

async function modelsView() {
  const mine = view;
  const context = el("input", { id: "fit-context", type: "number", min: "1", value: "8192" });
  const dtype = el("select", { id: "fit-dtype" }, ["bf16", "fp8", "int4", "fp32"].map((d) => el("option", { value: d, text: d })));
  const memory = el("select", { id: "fit-memory" }, [16, 24, 40, 48, 80, 141].map((g) => el("option", { value: String(g), text: `${g} GB` })));
  memory.value = "80";
  const models = el("div", { "aria-live": "polite" });
  const gpus = el("div");
  const gb = (mb) => (mb / 1000).toFixed(1);
  const refresh = async () => {
    const q = new URLSearchParams({ context: context.value, dtype: dtype.value, gpuMemoryGb: memory.value });
    let rows;
    try { rows = await call("GET", `/api/models?${q}`); } catch (e) {
      models.replaceChildren(el("p", { class: "bad", role: "alert", text: e.message })); return;
    }
    if (mine !== view) return;
    models.replaceChildren(table(`Models: GPU memory at ${context.value} tokens, ${dtype.value} weights, ${memory.value} GB GPUs`,
      ["Model", "Parameters (B)", "Weights (GB)", "KV cache (GB)", "Total (GB)", "GPUs", ""],
      rows.map((m) => {
        const gpusNeeded = m.gpus === null ? "more than 8" : String(m.gpus);
        const q = new URLSearchParams({ model: m.id, gpus: m.gguf ? "0" : String(m.gpus ?? 8), engine: m.gguf ? "llamacpp" : "auto" });
        return [m.id, m.params, gb(m.weightsMb), gb(m.kvMb), gb(m.totalMb), gpusNeeded,
          el("a", { href: `#/deploy?${q}`, "aria-label": `Deploy ${m.id}`, text: "Deploy" })];
      })));
  };
  for (const input of [context, dtype, memory]) input.addEventListener("change", refresh);
  // Hugging Face search (through the dashboard, which asks the hub): each result's fit on
  // demand, from its parameter count and config.json.
  const query = el("input", { id: "hub-q", type: "search", placeholder: "e.g. qwen3" });
  const searchButton = el("button", { type: "submit", text: "Search" });
  const found = el("div", { "aria-live": "polite" });
  const fitOf = async (id, cells) => {
    const q = new URLSearchParams({ id, context: context.value, dtype: dtype.value, gpuMemoryGb: memory.value });
    try {
      const m = await call("GET", `/api/hub/fit?${q}`);
      const gpusNeeded = m.gpus === null ? "more than 8" : String(m.gpus);
      const deploy = new URLSearchParams({ model: m.id, gpus: String(m.gpus ?? 8), engine: "auto" });
      cells.replaceChildren(`${m.params} B parameters, ${gb(m.totalMb)} GB: ${gpusNeeded} GPU(s) `,
        el("a", { href: `#/deploy?${deploy}`, "aria-label": `Deploy ${m.id}`, text: "Deploy" }));
    } catch (e) { cells.replaceChildren(el("span", { class: "bad", role: "alert", text: e.message })); }
  };
  const search = el("form", { class: "actions", role: "search", "aria-label": "Hugging Face" },
    el("label", { for: "hub-q" }, "Search Hugging Face", query), searchButton);
  search.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!query.value.trim()) return;
    found.replaceChildren(el("p", { class: "message", text: "Searching…" }));
    let r;
    try { r = await call("GET", `/api/hub/search?${new URLSearchParams({ q: query.value })}`); } catch (e) {
      found.replaceChildren(el("p", { class: "bad", role: "alert", text: e.message })); return;
    }
    if (mine !== view) return;
    if (!r.models.length) {
      found.replaceChildren(el("p", { class: "message", text: r.note ? `Hugging Face: ${r.note}` : "No model found." }));
      return;
    }
    found.replaceChildren(table(`Hugging Face: ${query.value}`, ["Model", "Downloads", "Fit"],
      r.models.map((m) => {
        const cells = el("span");
        const button = el("button", { type: "button", "aria-label": `Fit of ${m.id}`, text: "Fit" });
        button.addEventListener("click", () => fitOf(m.id, cells));
        cells.replaceChildren(button);
        return [m.id, String(m.downloads), cells];
      })));
  });
  show("Models",
    el("div", { class: "actions" },
      el("label", { for: "fit-context" }, "Context length (tokens)", context),
      el("label", { for: "fit-dtype" }, "Weights", dtype),
      el("label", { for: "fit-memory" }, "GPU memory", memory)),
    models, search, found, gpus,
    el("p", { class: "message", text: "Weights by dtype plus the KV cache of one sequence at the context length (16-bit), 10% overhead, at 0.9 of each GPU's memory; GPUs in powers of two for tensor parallelism. An estimate for choosing GPUs." }));
  call("GET", "/api/gpus").then((g) => {
    if (mine !== view) return;
    const largest = Math.max(0, ...g.nodes.map((n) => n.memoryMb ?? 0));
    if (largest > 0) {
      const fits = [...memory.options].map((o) => Number(o.value)).filter((v) => v * 1000 <= largest * 1.1);
      if (fits.length) memory.value = String(fits[fits.length - 1]);
    }
    gpus.replaceChildren(table("Cluster GPUs", ["Node", "GPUs", "Product", "Memory per GPU (GB)"],
      g.nodes.map((n) => [n.node, String(n.count), n.product, n.memoryMb ? gb(n.memoryMb) : "-"])),
      g.note ? el("p", { class: "message", text: `Nodes: ${g.note}` }) : []);
    refresh();
  }).catch(() => refresh());
}

// ---- Caches and warmups ----

async function cachesView() {
  const mine = view;
  show("Caches and warmups", el("p", { class: "message", text: "Loading…" }));
  let c;
  try { c = await call("GET", "/api/caches"); } catch (e) {
    if (mine === view) show("Caches and warmups", el("p", { class: "bad", role: "alert", text: e.message }));
    return;
  }
  if (mine !== view) return;
  const part = (caption, headers, data, cells) => [
    table(caption, headers, data.rows.map(cells)),
    data.note ? el("p", { class: "message", text: `${caption}: ${data.note}` }) : [],
  ];
  show("Caches and warmups",
    part("Model caches", ["Name", "Source", "Commit", "Size", "Nodes ready/downloading/failed", "Ready"], c.modelCaches,
      (r) => [r.name, r.source, r.commit, r.size, r.nodes, r.ready]),
    part("Kernel caches", ["Name", "Image", "Ready nodes", "Verification", "Ready"], c.kernelCaches,
      (r) => [r.name, r.image, String(r.readyNodes), r.verification, r.ready]),
    part("Nodes", ["Node", "GPUs", "Disk", "Kernel caches ready", "Model caches ready"], c.nodes,
      (r) => [r.name, r.gpus, r.disk, r.kernelCaches, r.modelCaches]),
    part("Warmups", ["Name", "Phase", "Nodes done", "Failed", "Target"], c.warmups,
      (r) => [r.name, r.phase, r.nodes, String(r.failed), r.target]));
}

function route() {
  view += 1;
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/").map(decodeURIComponent);
  if (parts[0] === "deployments" && parts.length === 3) return deploymentView(parts[1], parts[2]);
  if (parts[0] === "deploy") return deployView(new URLSearchParams(query ?? ""));
  if (parts[0] === "models") return modelsView();
  if (parts[0] === "providers") return providersView();
  if (parts[0] === "caches") return cachesView();
  // `?namespace=` (empty): choose a namespace again.
  const params = new URLSearchParams(query ?? "");
  return deploymentsView(params.has("namespace") ? params.get("namespace") : undefined);
}

window.addEventListener("hashchange", () => { navigated = true; route(); });
// The local dashboard acts as the kubeconfig's identity; in the cluster, as the user:
// the page is shown at once, and replaced by the sign-in page when nobody is signed in.
route();
fetch("/api/session").then((r) => r.json()).then((s) => {
  if (s.mode === "sign-in" && !s.signedIn && !document.getElementById("token")) signInView();
  else if (s.mode === "sign-in") signedIn(s.user);
}).catch(() => {});
