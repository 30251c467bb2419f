//! `kubeairunway up`: the whole platform in one command.
//!
//! 1. a cluster: the local test API server (started, built first if needed, or reused),
//!    or `--kubeconfig`;
//! 2. CRDs: ours and the kernel cache's; on the local server also the bundled upstream
//!    CRDs (the providers' and the gateway's); on a real cluster a provider whose upstream kind is not served (its CRD is
//!    absent) is skipped, with how to install it; the Deployment provider's upstream is
//!    the built-in Deployment kind, served everywhere;
//! 3. core, every provider and the kernel-cache controller, in this process
//!    ([`crate::controllers`]), logging to `<state-dir>/up.log`;
//! 4. the samples of `config/samples`;
//! 5. the live `kubectl get md` table, with the upstream object each ModelDeployment got,
//!    until Ctrl-C (or `kubeairunway down`); with `--once`, until every sample has its
//!    upstream object.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_sdk::api::{EngineType, Phase};
use kubeairunway_sdk::conditions::{self, PROVIDER_SELECTED, RESOURCE_CREATED};
use kubeairunway_sdk::{InferenceProviderConfig, ModelDeployment};
use serde::{Deserialize, Serialize};

use crate::Terminal;
use crate::builtin::{BuiltIns, NodeProvisioningMode, ProviderFlags};
use crate::cluster::{self, Target};
use crate::controllers::Controllers;
use crate::crds::{self, FIELD_MANAGER};
use crate::output::{Table, or_dash};
use crate::providers::install_lines;

/// `up`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run against this cluster instead of the local test API server. Upstream CRDs are
    /// not installed there: a provider whose upstream CRD is missing is skipped.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Exit once every sample has its upstream object, instead of running until Ctrl-C.
    #[arg(long)]
    pub once: bool,
    /// With --once: give up (exit 1) after this long.
    #[arg(long, default_value = "3m", value_parser = kubeairunway_sdk::process::parse_duration)]
    pub timeout: Duration,
    /// Do not apply the samples.
    #[arg(long)]
    pub no_samples: bool,
    /// The built-in providers' settings.
    #[command(flatten)]
    pub providers: ProviderFlags,
}

/// What a running `up` leaves in `<state-dir>/up.json`, for `down`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The process running `up`.
    pub pid: u32,
    /// The API server.
    pub server: String,
    /// Its kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    /// Whether it is the local API server.
    pub local: bool,
    /// The log file.
    pub log: PathBuf,
}

/// `<state-dir>/up.json`.
pub fn state_file(state_dir: &Path) -> PathBuf {
    state_dir.join("up.json")
}

/// The state of the `up` that runs (or ran and died) with `state_dir`.
pub fn read_state(state_dir: &Path) -> Option<State> {
    let text = std::fs::read_to_string(state_file(state_dir)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Whether `pid` is a running `kubeairunway` (or `kubectl-airunway`) process.
pub fn is_up_process(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("airunway"))
}

/// Removes `up.json` when `up` ends, however it ends.
struct StateGuard(PathBuf);

impl Drop for StateGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A ModelDeployment sample and where it came from.
#[derive(Clone, Debug)]
struct Sample {
    namespace: String,
    name: String,
    path: String,
    manifest: serde_json::Value,
}

fn samples() -> Vec<Sample> {
    kubeairunway_config::samples::all()
        .into_iter()
        .filter(|s| s.rejection.is_none())
        .map(|s| Sample {
            namespace: s.manifest["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string(),
            name: s.manifest["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            path: s.path(),
            manifest: s.manifest,
        })
        .collect()
}

fn step(term: &mut Terminal, n: usize, what: &str) {
    term.err(&format!("[{n}/5] {what}\n"));
}

/// Run `up`.
pub async fn run(args: Args, state_dir: &Path, term: &mut Terminal) -> anyhow::Result<i32> {
    if let Some(s) = read_state(state_dir)
        && s.pid != std::process::id()
        && is_up_process(s.pid)
    {
        anyhow::bail!(
            "`kubeairunway up` already runs (pid {}) against {}: stop it with `kubeairunway {}down`",
            s.pid,
            s.server,
            if state_dir == cluster::default_state_dir() {
                String::new()
            } else {
                format!("--state-dir {} ", state_dir.display())
            }
        );
    }
    let log = state_dir.join("up.log");
    crate::logging::init(&log)?;

    step(term, 1, "cluster");
    let target = match &args.kubeconfig {
        Some(path) => {
            let (client, server) = cluster::client_for(path).await?;
            cluster::check_reachable(&client, &server, "check --kubeconfig").await?;
            term.err(&format!("  using the cluster at {server}\n"));
            Target {
                client,
                server,
                kubeconfig: Some(path.clone()),
                local: false,
            }
        }
        None => cluster::local(state_dir, term).await?,
    };
    std::fs::create_dir_all(state_dir)?;
    let state = State {
        pid: std::process::id(),
        server: target.server.clone(),
        kubeconfig: target.kubeconfig.clone(),
        local: target.local,
        log: log.clone(),
    };
    std::fs::write(state_file(state_dir), serde_json::to_string_pretty(&state)?)?;
    let _state = StateGuard(state_file(state_dir));

    step(term, 2, "CRDs");
    let (builtins, providers) = install_crds(&target, &args.providers, term).await?;

    step(term, 3, "controllers");
    let mut controllers = Controllers::start(&target.client, builtins, &providers)?;
    term.err(&format!(
        "  running {} in this process; logs: {}\n",
        controllers.names().join(", "),
        log.display()
    ));
    let registered = tokio::select! {
        r = wait_registered(&target.client, &providers, term) => r,
        Some((name, r)) = controllers.exited() => Err(anyhow::anyhow!(
            "{name} stopped: {}; see {}",
            r.err().map_or_else(|| "without an error".into(), |e| format!("{e:#}")),
            log.display()
        )),
    };
    if let Err(e) = registered {
        controllers.stop().await;
        return Err(e);
    }

    step(term, 4, "samples");
    let samples = if args.no_samples {
        Vec::new()
    } else {
        samples()
    };
    for s in &samples {
        apply_sample(&target.client, s).await?;
        term.err(&format!(
            "  applied {}/{} ({})\n",
            s.namespace, s.name, s.path
        ));
    }

    step(term, 5, "ModelDeployments (kubectl get md)");
    let outcome = watch(&target, &samples, &args, &mut controllers, term).await;
    let results = controllers.stop().await;
    for (name, r) in results {
        if let Err(e) = r {
            term.err(&format!("  {name} ended with an error: {e:#}\n"));
        }
    }
    let code = outcome?;
    if target.local {
        term.err(&format!(
            "controllers stopped; the local API server keeps running (`kubeairunway down` stops it):\n  export KUBECONFIG={}\n",
            target
                .kubeconfig
                .as_deref()
                .unwrap_or(Path::new("?"))
                .display()
        ));
    } else {
        term.err("controllers stopped; what they created stays in the cluster\n");
    }
    Ok(code)
}

/// Install the CRDs; returns the providers to run (those whose upstream CRD is there).
async fn install_crds(
    target: &Target,
    flags: &ProviderFlags,
    term: &mut Terminal,
) -> anyhow::Result<(BuiltIns, Vec<&'static str>)> {
    let started = Instant::now();
    let client = &target.client;
    let mut ours = kubeairunway_sdk::api::crds::all();
    ours.extend(kubeairunway_kernelcache_api::crds());
    let mut installed: Vec<String> = ours.iter().map(ResourceExt::name_any).collect();
    crds::install(client, &ours).await?;
    if target.local {
        let upstream = crds::all_bundled()?;
        installed.extend(upstream.iter().map(ResourceExt::name_any));
        crds::install(client, &upstream).await?;
    }
    term.err(&format!(
        "  established {} ({:.1}s)\n",
        installed.join(", "),
        started.elapsed().as_secs_f64()
    ));

    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let inference_set = crd_api
        .get_opt(kubeairunway_kaito_provider::INFERENCE_SET_CRD)
        .await?;
    // Nothing provisions nodes on the local API server.
    let nodes = if target.local {
        NodeProvisioningMode::Byo
    } else {
        NodeProvisioningMode::Auto
    };
    let builtins = BuiltIns::new(flags, inference_set.as_ref(), nodes);
    let mut providers = Vec::new();
    for name in crate::builtin::NAMES {
        let Some(p) = builtins.get(name) else {
            continue;
        };
        let upstream = p.upstream();
        let crd = upstream.crd_name();
        if crd_api.get_opt(&crd).await?.is_some() || served(client, &upstream).await? {
            providers.push(name);
            continue;
        }
        term.err(&format!(
            "  skipping {name}: its upstream CRD {crd} is not installed in this cluster. To install it:\n"
        ));
        for line in p
            .config()
            .installation
            .as_ref()
            .map(install_lines)
            .unwrap_or_default()
        {
            term.err(&format!("    {line}\n"));
        }
    }
    Ok((builtins, providers))
}

/// Whether the API server serves the kind of `upstream` (a built-in kind such as `apps/v1`
/// Deployment, which no CRD defines), by API discovery.
async fn served(client: &Client, upstream: &kubeairunway_sdk::UpstreamRef) -> anyhow::Result<bool> {
    let group = match kube::discovery::group(client, &upstream.group).await {
        Ok(group) => group,
        Err(kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(_))) => {
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    Ok(upstream.versions.iter().any(|v| {
        group
            .versioned_resources(v)
            .iter()
            .any(|(r, _)| r.plural == upstream.plural && r.kind == upstream.kind)
    }))
}

/// Wait until each provider of `names` is registered and ready.
async fn wait_registered(
    client: &Client,
    names: &[&str],
    term: &mut Terminal,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let api: Api<InferenceProviderConfig> = Api::all(client.clone());
    let deadline = started + Duration::from_secs(90);
    loop {
        let mut ready = Vec::new();
        for name in names {
            if let Some(c) = api.get_opt(name).await?
                && let Some(s) = c.status.as_ref().filter(|s| s.ready == Some(true))
            {
                ready.push(format!(
                    "{name} ({})",
                    s.upstream_crd_version.as_deref().unwrap_or("?")
                ));
            }
        }
        if ready.len() == names.len() {
            term.err(&format!(
                "  providers ready: {} ({:.1}s)\n",
                if ready.is_empty() {
                    "none".to_string()
                } else {
                    ready.join(", ")
                },
                started.elapsed().as_secs_f64()
            ));
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "providers not ready after 90s (ready: {}); see the log",
                ready.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn apply_sample(client: &Client, s: &Sample) -> anyhow::Result<()> {
    let ar = ApiResource::erase::<ModelDeployment>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &s.namespace, &ar);
    let obj: DynamicObject = serde_json::from_value(s.manifest.clone())?;
    api.patch(
        &s.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&obj),
    )
    .await
    .with_context(|| format!("applying the sample {}", s.path))?;
    Ok(())
}

/// A ModelDeployment's row of the live table, and where it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The cells: NAME PHASE PROVIDER ENGINE READY ENDPOINT UPSTREAM.
    pub cells: Vec<String>,
    /// Its upstream object exists (`ResourceCreated=True`).
    pub has_upstream: bool,
    /// It cannot move on by itself: Failed, or no provider can be selected.
    pub stuck: Option<String>,
}

/// The columns of the live table.
pub const COLUMNS: [&str; 7] = [
    "NAME", "PHASE", "PROVIDER", "ENGINE", "READY", "ENDPOINT", "UPSTREAM",
];

/// The row of `md` (`None`: not found).
pub fn row(name: &str, md: Option<&ModelDeployment>) -> Row {
    let Some(md) = md else {
        return Row {
            cells: vec![name.to_string(), "(not found)".into()],
            has_upstream: false,
            stuck: Some("not found".into()),
        };
    };
    let status = md.status.clone().unwrap_or_default();
    let condition = |t: &str| conditions::find(&status.conditions, t).cloned();
    let has_upstream = condition(RESOURCE_CREATED).is_some_and(|c| c.status == "True");
    let provider = status.provider.clone().unwrap_or_default();
    let upstream = match (&provider.resource_kind, &provider.resource_name) {
        (Some(kind), Some(name)) if has_upstream => format!("{kind}/{name}"),
        _ => "-".into(),
    };
    let stuck = match (status.phase, condition(PROVIDER_SELECTED)) {
        (Some(Phase::Failed), _) => Some(status.message.clone().unwrap_or_default()),
        (_, Some(c)) if c.status == "False" => Some(c.message),
        _ => None,
    };
    Row {
        cells: vec![
            md.name_any(),
            or_dash(status.phase),
            or_dash(provider.name),
            or_dash(md.resolved_engine().map(EngineType::as_str)),
            or_dash(status.replicas.and_then(|r| r.ready)),
            or_dash(status.endpoint.map(|e| {
                format!(
                    "{}:{}",
                    e.service.unwrap_or_default(),
                    e.port.map_or_else(String::new, |p| p.to_string())
                )
            })),
            upstream,
        ],
        has_upstream,
        stuck,
    }
}

/// How long every sample still without an upstream object must look stuck (Failed, or no
/// provider selected) before `--once` gives up: longer than core's 30 s retry of a
/// selection, so that providers that register late are still chosen.
const STUCK_FOR: Duration = Duration::from_secs(45);

/// Resolves on Ctrl-C or SIGTERM (what `down` sends).
async fn interrupted() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

/// Print the table each time it changes until interrupted, or with `--once` until every sample has its
/// upstream object. Returns the exit code.
async fn watch(
    target: &Target,
    samples: &[Sample],
    args: &Args,
    controllers: &mut Controllers,
    term: &mut Terminal,
) -> anyhow::Result<i32> {
    let started = Instant::now();
    let mut printed: Vec<Vec<String>> = Vec::new();
    let mut noted = false;
    let mut stuck_since: Option<Instant> = None;
    let stop = interrupted();
    tokio::pin!(stop);
    loop {
        let mut rows = Vec::new();
        for s in samples {
            let api: Api<ModelDeployment> = Api::namespaced(target.client.clone(), &s.namespace);
            let md = api.get_opt(&s.name).await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, name = %s.name, "reading a sample");
                None
            });
            rows.push(row(&s.name, md.as_ref()));
        }
        let mut table = Table::new(&COLUMNS);
        for r in &rows {
            table.row(r.cells.clone());
        }
        let cells: Vec<Vec<String>> = rows.iter().map(|r| r.cells.clone()).collect();
        if cells != printed {
            term.out(&format!(
                "{}{}",
                if printed.is_empty() { "" } else { "\n" },
                table.render()
            ));
            printed = cells;
        }
        let done = rows.iter().all(|r| r.has_upstream);
        if done && !noted {
            noted = true;
            term.err(&notes(target, started.elapsed()));
            if args.once {
                return Ok(0);
            }
            term.err("Running until Ctrl-C (or `kubeairunway down`); the table is printed again when it changes.\n");
        }
        if args.once {
            let waiting: Vec<(&Sample, &Row)> = samples
                .iter()
                .zip(&rows)
                .filter(|(_, r)| !r.has_upstream)
                .collect();
            let all_stuck = waiting.iter().all(|(_, r)| r.stuck.is_some());
            stuck_since = if all_stuck {
                stuck_since.or(Some(Instant::now()))
            } else {
                None
            };
            let given_up = stuck_since.is_some_and(|t| t.elapsed() > STUCK_FOR);
            if given_up || started.elapsed() > args.timeout {
                for (s, r) in waiting {
                    term.err(&format!(
                        "{}/{} has no upstream object: {}\n",
                        s.namespace,
                        s.name,
                        r.stuck.clone().unwrap_or_else(|| "still waiting".into())
                    ));
                }
                term.err("`kubeairunway explain md NAME` says why\n");
                return Ok(crate::terminal::FAILURE);
            }
        }
        tokio::select! {
            () = &mut stop => {
                term.err("\ninterrupted: stopping the controllers\n");
                return Ok(0);
            }
            Some((name, r)) = controllers.exited() => {
                anyhow::bail!(
                    "{name} stopped: {}",
                    r.err().map_or_else(|| "without an error".into(), |e| format!("{e:#}"))
                );
            }
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// What to know once every sample has its upstream object.
fn notes(target: &Target, took: Duration) -> String {
    let mut out = format!(
        "\nEvery sample has its upstream object ({:.1}s after the samples were applied).\n",
        took.as_secs_f64()
    );
    if target.local {
        out.push_str(
            "They stay without status: the local API server runs no KAITO, Dynamo or KubeRay operator (and has no nodes), so no model is served and the phases stay Deploying. To serve models, on a cluster with GPU nodes install the operators and the providers, then run `kubeairunway up --kubeconfig PATH`:\n",
        );
        for p in BuiltIns::defaults().all() {
            let lines = p
                .config()
                .installation
                .as_ref()
                .map(install_lines)
                .unwrap_or_default();
            if let Some((first, rest)) = lines.split_first() {
                let _ = writeln!(out, "  {}: {first}", p.name());
                for line in rest {
                    let _ = writeln!(out, "    {line}");
                }
            } else {
                let doc = p.config().documentation.unwrap_or_default();
                let _ = writeln!(out, "  {}: see {doc}", p.name());
            }
        }
        if let Some(kubeconfig) = &target.kubeconfig {
            let _ = writeln!(
                out,
                "Look around:\n  export KUBECONFIG={}\n  kubectl get md\n  kubeairunway explain md llama-8b\n  kubeairunway providers\n  kubeairunway dashboard   (the web UI on http://127.0.0.1:3001/)",
                kubeconfig.display()
            );
        }
    } else {
        out.push_str(
            "Their operators take it from here; `kubeairunway explain md NAME` shows how far each got.\n",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn md(status: &serde_json::Value) -> ModelDeployment {
        serde_json::from_value(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "llama-8b", "namespace": "default"},
            "spec": {"model": {"id": "a/b"}, "engine": {"type": "vllm"}},
            "status": status,
        }))
        .unwrap()
    }

    fn cond(t: &str, s: &str, message: &str) -> serde_json::Value {
        json!({"type": t, "status": s, "reason": "R", "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    #[test]
    fn rows_show_the_upstream_object_once_it_is_created() {
        let deploying = md(&json!({
            "phase": "Deploying",
            "provider": {"name": "dynamo", "resourceKind": "DynamoGraphDeployment", "resourceName": "llama-8b"},
            "endpoint": {"service": "llama-8b-frontend", "port": 8000},
            "conditions": [cond(RESOURCE_CREATED, "True", "")],
        }));
        let r = row("llama-8b", Some(&deploying));
        assert_eq!(
            r.cells,
            [
                "llama-8b",
                "Deploying",
                "dynamo",
                "vllm",
                "-",
                "llama-8b-frontend:8000",
                "DynamoGraphDeployment/llama-8b"
            ]
        );
        assert!(r.has_upstream && r.stuck.is_none());

        let nothing_fits = md(&json!({
            "phase": "Pending",
            "conditions": [cond(PROVIDER_SELECTED, "False", "No provider fits")],
        }));
        let r = row("llama-8b", Some(&nothing_fits));
        assert_eq!(r.cells[6], "-");
        assert_eq!(r.stuck.as_deref(), Some("No provider fits"));
        assert!(!row("x", None).has_upstream);
    }
}
