//! Scale benchmark (figures, never assertions): N vLLM ModelDeployments through core and
//! the Dynamo provider on the test API server, against the same number of writes made by
//! a plain client in the same run.
//!
//! ```console
//! $ cargo bench -p kubeairunway-e2e --bench scale -- --n 1000 [--connections 8] [--steady 60s] \
//!       [--provider dynamo|kuberay|kaito|deployment] [--kernel-cache] [--bin-dir target/release] \
//!       [--raw-watches] [--lean-raw] [--no-again] [--cpu-profile 10s]
//! ```
//!
//! It starts a private test API server (etcd + the upstream apiserver code), installs the
//! platform's CRDs and the provider's upstream CRD (Dynamo's by default), then:
//! 1. **raw**, two baselines made by a plain client over `--connections` connections, each
//!    reaching the platform's end state: the statuses carry the fields and conditions core
//!    and the provider write, the objects are finished as the provider runtime applies them
//!    (labels, annotations, owner), so stored objects are the platform's size (printed);
//!    `--lean-raw` writes one condition per status and the objects as rendered instead:
//!    - *the platform's requests*: per ModelDeployment, the requests the platform makes for
//!      it, in the same order (create the ModelDeployment with the finalizer core's
//!      webhook gives it, core's status and event, the provider's create-only apply of
//!      each object rendered, the provider's event and status);
//!    - *the minimal writes*: the smallest useful set (create, one core status, the upstream
//!      apply, one provider status);
//!
//!    After each baseline its objects are removed and etcd's history is compacted and
//!    its database defragmented, so that every phase starts from the same store;
//! 2. **platform**: core (`kubeairunway-controller`, its webhooks installed from its chart
//!    and called by the API server) and `dynamo-provider` run as child processes, each
//!    with the flags its Deployment gives it; the same number of
//!    ModelDeployments is created over as many connections, and the clock stops when every
//!    one has its DynamoGraphDeployment and the provider's status. With `--kernel-cache`,
//!    the kernel-cache provider's two controllers run too, each of which caches every
//!    ModelDeployment: the kernel-cache controller (`KernelCacheReady` on those naming a
//!    cache) and the warmup controller (the ModelDeployments that Warmups target);
//! 3. **steady state**: nothing changes for `--steady`; requests and reconciles are
//!    counted again;
//! 4. **the minimal writes again** (unless `--no-again`): the controllers stopped, core's
//!    webhooks and the platform's objects removed, the store compacted, the minimal writes
//!    are timed once more. The machine's speed drifts within a run (a shared virtual
//!    machine's by up to a quarter); with a baseline on each side of the platform, the
//!    ratio to their mean is the one drift moves least.
//!
//! `--provider` runs another provider in Dynamo's place, with the same phases:
//! `kuberay-provider` (RayServices), `kaito-provider` (Workspaces and their inference
//! ConfigMaps; KAITO provisions nodes, so it is given a GPU instance type) or
//! `deployment-provider` (Deployments and Services, a built-in kind read from the API
//! server's OpenAPI document). The raw phase writes what that provider renders.
//!
//! With `--raw-watches`, the plain client's writes are made while watches like the
//! platform's are open (three of ModelDeployments, one of the provider's upstream kind): the
//! difference is what serving the watches costs the API server.
//!
//! With `--cpu-profile DURATION`, the API server's CPU is profiled (Go's pprof) for that
//! long from the start of each timed phase, into `apiserver-<phase>.pprof`.
//!
//! Requests are read from the API server's own `apiserver_request_total`, by verb and
//! resource, minus the benchmark's own; reconciles from the controllers' metrics; RSS
//! (current and peak) from `/proc/<pid>/status`; CPU time, of the machine and of each
//! process (the API server and etcd, each controller, this client), from `/proc` during
//! both timed phases: what bounds a phase when the machine's cores are all busy. The API
//! server's and etcd's CPU per ModelDeployment is compared between the platform and each
//! baseline: what the platform costs a cluster's control plane, whatever else shares this
//! machine's cores (the controllers, which on a cluster run on other nodes).
//!
//! The controllers are this binary, re-executed in a role (`SCALE_BENCH_ROLE`) that runs
//! what the controller's own `main` runs, unless `--bin-dir` names a directory holding the
//! built binaries (`kubeairunway-controller`, the provider's, `kernelcache-controller`,
//! `kernelcache-warmup`): then those run. Their RSS differs in
//! its file-backed part (the pages of code run, out of a binary that holds one controller
//! rather than all of them), which is why RSS is printed with its anonymous and
//! file-backed parts.
//!
//! Where the memory goes: with `--features heap-profile` (slow: use a small N and
//! `--profile dev`), each controller writes `dhat-<role>.json` into the working directory
//! when it stops: its heap at its peak, by allocation site (DHAT's format; open it in
//! DHAT's viewer, `dh_view.html`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: failing loudly is the point
#![allow(clippy::cast_precision_loss)] // counts far below 2^52, printed as figures

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use kubeairunway_cli::builtin::{BuiltIns, NodeProvisioningMode, ProviderFlags};
use kubeairunway_e2e::helm;
use kubeairunway_kernelcache_api::names::PROVIDER_NAME as KERNEL_CACHE;
use kubeairunway_sdk::api::{EngineType, InferenceProviderConfig, ModelDeployment};
use kubeairunway_sdk::process::Runtime;
use kubeairunway_sdk::runtime::ProviderFlags as _;
use kubeairunway_sdk::testing::ModelDeploymentBuilder;
use kubeairunway_sdk::{Provider, UpstreamApi, UpstreamRef};
use kubeairunway_testcluster::{Lifetime, TestCluster, install_crds};
use serde_json::{Value, json};

const ROLE: &str = "SCALE_BENCH_ROLE";
/// The namespace core's chart is rendered for.
const SYSTEM: &str = "kubeairunway-system";

struct Args {
    n: usize,
    connections: usize,
    steady: Duration,
    /// Run the kernel-cache controller too.
    kernel_cache: bool,
    /// Run the controllers' own binaries from here.
    bin_dir: Option<PathBuf>,
    /// Keep the platform's watches open during the plain client's writes.
    raw_watches: bool,
    /// The provider run with core.
    provider: Role,
    /// The raw writes carry lean content (one condition each, the rendered objects without
    /// the platform's labels, annotations and owner) rather than the platform's.
    lean_raw: bool,
    /// Time the minimal writes again after the platform (`--no-again`: not).
    again: bool,
    /// Sample the API server's CPU profile for this long from the start of each timed phase.
    cpu_profile: Option<Duration>,
}

fn args() -> Args {
    let mut out = Args {
        n: 1000,
        connections: 8,
        steady: Duration::from_secs(60),
        kernel_cache: false,
        bin_dir: None,
        raw_watches: false,
        provider: Role::Dynamo,
        cpu_profile: None,
        lean_raw: false,
        again: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--n" => out.n = it.next().and_then(|v| v.parse().ok()).expect("--n N"),
            "--connections" => {
                out.connections = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--connections N");
            }
            "--steady" => {
                out.steady = it
                    .next()
                    .and_then(|v| humantime::parse_duration(&v).ok())
                    .expect("--steady DURATION");
            }
            "--kernel-cache" => out.kernel_cache = true,
            "--raw-watches" => out.raw_watches = true,
            "--lean-raw" => out.lean_raw = true,
            "--no-again" => out.again = false,
            "--cpu-profile" => {
                out.cpu_profile = Some(
                    it.next()
                        .and_then(|v| humantime::parse_duration(&v).ok())
                        .expect("--cpu-profile DURATION"),
                );
            }
            "--provider" => {
                out.provider = match it.next().as_deref() {
                    Some("dynamo") => Role::Dynamo,
                    Some("kuberay") => Role::KubeRay,
                    Some("kaito") => Role::Kaito,
                    Some("deployment") => Role::Deployment,
                    other => {
                        panic!("--provider dynamo|kuberay|kaito|deployment, not {other:?}")
                    }
                };
            }
            "--bin-dir" => {
                // `cargo bench` runs the benchmark in the package's directory: a relative
                // path is read from the workspace's root.
                let dir = PathBuf::from(it.next().expect("--bin-dir DIR"));
                out.bin_dir = Some(if dir.is_absolute() {
                    dir
                } else {
                    Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("../..")
                        .join(dir)
                });
            }
            _ => {} // `cargo bench` passes `--bench`
        }
    }
    out
}

#[cfg(feature = "heap-profile")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;
/// The controllers' allocator, as their binaries declare it.
#[cfg(not(feature = "heap-profile"))]
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Ok(role) = std::env::var(ROLE) {
        // With `--features heap-profile`, each controller writes `dhat-<role>.json` (its
        // heap at its peak, by allocation site) into the working directory when it stops.
        #[cfg(feature = "heap-profile")]
        let _profile = dhat::Profiler::builder()
            .file_name(format!("dhat-{role}.json"))
            // DHAT keeps 10 frames per allocation site unless `SCALE_BENCH_FRAMES` says
            // more (slower: 40 frames makes an N = 2000 run take half an hour).
            .trim_backtraces(
                std::env::var("SCALE_BENCH_FRAMES")
                    .ok()
                    .and_then(|f| f.parse().ok())
                    .or(Some(10)),
            )
            .build();
        let role = Role::named(&role)?;
        return rt.block_on(role.run_main());
    }
    let args = args();
    let dir = tempfile::tempdir()?;
    let cluster = TestCluster::start(dir.path(), Lifetime::TiedToProcess)?;
    rt.block_on(bench(&cluster, &args))
}

/// A controller of the benchmark.
#[derive(Clone, Copy, Debug)]
enum Role {
    Core,
    Dynamo,
    KubeRay,
    Kaito,
    Deployment,
    KernelCache,
    Warmup,
}

impl Role {
    fn named(name: &str) -> anyhow::Result<Self> {
        Ok(match name {
            "core" => Self::Core,
            "dynamo" => Self::Dynamo,
            "kuberay" => Self::KubeRay,
            "kaito" => Self::Kaito,
            "deployment" => Self::Deployment,
            "kernelcache" => Self::KernelCache,
            "warmup" => Self::Warmup,
            other => anyhow::bail!("unknown {ROLE} {other}"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Core => "core",
            Self::Dynamo => "dynamo",
            Self::KubeRay => "kuberay",
            Self::Kaito => "kaito",
            Self::Deployment => "deployment",
            Self::KernelCache => "kernelcache",
            Self::Warmup => "warmup",
        }
    }

    /// Its binary's name.
    fn binary(self) -> &'static str {
        match self {
            Self::Core => "kubeairunway-controller",
            Self::Dynamo => "dynamo-provider",
            Self::KubeRay => "kuberay-provider",
            Self::Kaito => "kaito-provider",
            Self::Deployment => "deployment-provider",
            Self::KernelCache => "kernelcache-controller",
            Self::Warmup => "kernelcache-warmup",
        }
    }

    /// Its flags, as its chart gives them (core's are its chart's, [`core_webhooks`]),
    /// with its metrics on `metrics`.
    fn flags(self, metrics: &str) -> Vec<String> {
        let mut flags = vec![
            "--log-format=text".to_string(),
            format!("--metrics-bind-address={metrics}"),
        ];
        match self {
            // Required; no Warmup runs here, so no pod is ever made from it.
            Self::Warmup => flags.push("--tools-image=tools.invalid/kernelcache:0".into()),
            Self::Core
            | Self::Dynamo
            | Self::KubeRay
            | Self::Kaito
            | Self::Deployment
            | Self::KernelCache => {}
        }
        flags.extend(self.provider_flags().iter().map(ToString::to_string));
        flags
    }

    /// Its own provider flags, which the raw phase renders with too: KAITO provisions a
    /// node per Workspace (its default) and so needs the GPU instance type to name.
    fn provider_flags(self) -> &'static [&'static str] {
        match self {
            Self::Kaito => &["--gpu-instance-type=Standard_NC24ads_A100_v4"],
            _ => &[],
        }
    }

    /// What the controller's binary runs in its `main`, from this process's flags.
    async fn run_main(self) -> anyhow::Result<()> {
        use clap::Parser;
        match self {
            Self::Core => {
                use kubeairunway_core::app;
                let cli = app::Cli::try_parse()?;
                let rt = Runtime::start(app::COMPONENT, cli.process.clone()).await?;
                app::run(cli, rt).await
            }
            Self::Dynamo => {
                let cli = kubeairunway_dynamo_provider::cli::Cli::try_parse()?;
                let rt = Runtime::start(self.binary(), cli.options.process.clone()).await?;
                kubeairunway_sdk::runtime::run(cli.flags.provider(), rt, cli.options).await
            }
            Self::KubeRay => {
                let cli = kubeairunway_kuberay_provider::cli::Cli::try_parse()?;
                let rt = Runtime::start(self.binary(), cli.options.process.clone()).await?;
                kubeairunway_sdk::runtime::run(cli.flags.provider(), rt, cli.options).await
            }
            Self::Kaito => {
                let cli = kubeairunway_kaito_provider::cli::Cli::try_parse()?;
                let rt = Runtime::start(self.binary(), cli.options.process.clone()).await?;
                let provider = cli.flags.provider_for(&rt.client()).await?;
                kubeairunway_sdk::runtime::run(provider, rt, cli.options).await
            }
            Self::Deployment => {
                let cli = kubeairunway_deployment_provider::cli::Cli::try_parse()?;
                let rt = Runtime::start(self.binary(), cli.options.process.clone()).await?;
                kubeairunway_sdk::runtime::run(cli.flags.provider(), rt, cli.options).await
            }
            Self::KernelCache => {
                use kubeairunway_kernelcache_controller::app;
                let cli = app::Cli::try_parse()?;
                let rt = Runtime::start(app::COMPONENT, cli.process.clone()).await?;
                app::run(cli, rt).await
            }
            Self::Warmup => {
                use kubeairunway_kernelcache_warmup::app;
                let cli = app::Cli::try_parse()?;
                let rt = Runtime::start(app::COMPONENT, cli.process.clone()).await?;
                app::run(
                    cli,
                    rt,
                    Arc::new(kubeairunway_kernelcache_warmup::metrics::Metrics::default()),
                )
                .await
            }
        }
    }
}

/// The built-in providers configured as the benchmark runs `role`'s binary (its
/// [`Role::provider_flags`] on top of the defaults).
fn builtins(role: Role) -> anyhow::Result<BuiltIns> {
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        providers: ProviderFlags,
    }
    let args = std::iter::once("scale").chain(role.provider_flags().iter().copied());
    let flags = <Flags as clap::Parser>::try_parse_from(args)?;
    // No InferenceSet CRD is installed, so `--inference-set=auto` reads as off.
    Ok(BuiltIns::new(
        &flags.providers,
        None,
        NodeProvisioningMode::Auto,
    ))
}

/// The built-in provider of `role`.
fn provider(builtins: &BuiltIns, role: Role) -> anyhow::Result<&dyn Provider> {
    builtins
        .get(role.name())
        .with_context(|| format!("{} is no built-in provider", role.name()))
}

/// The upstream API `wanted` as the API server serves it: of `crd` (installed), or else of
/// a built-in kind (the Deployment provider's Deployments) from the server's OpenAPI v3
/// document, as the provider's runtime reads it.
async fn upstream_api(
    client: &Client,
    wanted: &UpstreamRef,
    crd: Option<&CustomResourceDefinition>,
) -> anyhow::Result<UpstreamApi> {
    if let Some(crd) = crd {
        return Ok(UpstreamApi::detect(crd, wanted)?);
    }
    let version = wanted.versions.first().context("no version")?;
    let document = client
        .request::<serde_json::Value>(
            http::Request::get(wanted.openapi_path(version)).body(Vec::new())?,
        )
        .await?;
    Ok(UpstreamApi::from_openapi(
        &document,
        wanted,
        version,
        vec![version.clone()],
    )?)
}

/// `provider`'s objects for `md` in the order its runtime applies them: what supports the
/// primary object first, the primary (of `api`'s kind) last; `finished`, as the runtime
/// applies them (labels, annotations, owner: `render::finalize`), else as rendered.
fn rendered_in_order(
    provider: &dyn Provider,
    md: &ModelDeployment,
    api: &UpstreamApi,
    finished: bool,
) -> anyhow::Result<Vec<DynamicObject>> {
    let rendered = provider
        .render(md, api)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .objects;
    anyhow::ensure!(!rendered.is_empty(), "nothing rendered");
    let mut objects = if finished {
        kubeairunway_sdk::render::finalize(provider, md, api, rendered)
            .map_err(|e| anyhow::anyhow!("{e}"))?
    } else {
        rendered
    };
    let primary = objects.remove(0);
    objects.push(primary);
    Ok(objects)
}

struct Controller {
    name: &'static str,
    child: Child,
    metrics: String,
    /// Where its metrics and health endpoints listen.
    address: std::net::SocketAddr,
}

impl Drop for Controller {
    /// Stop the controller as its pod would be stopped: SIGTERM, then SIGKILL after a grace
    /// period (a heap profile is written while it stops).
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `role`'s controller with `extra` flags: its binary from `bin_dir`, or else this
/// binary in the role.
fn spawn(
    role: Role,
    cluster: &TestCluster,
    bin_dir: Option<&Path>,
    extra: &[String],
) -> anyhow::Result<Controller> {
    let port = free_port()?;
    let log = std::fs::File::create(cluster.dir().join(format!("{}.log", role.name())))?;
    let mut command = if let Some(dir) = bin_dir {
        Command::new(dir.join(role.binary()))
    } else {
        let mut command = Command::new(std::env::current_exe()?);
        command.env(ROLE, role.name());
        command
    };
    let child = command
        .args(role.flags(&format!("127.0.0.1:{port}")))
        .args(extra)
        .env("KUBECONFIG", cluster.kubeconfig())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    Ok(Controller {
        name: role.name(),
        child,
        metrics: format!("http://127.0.0.1:{port}/metrics"),
        address: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
    })
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Core's webhooks as its chart installs them (Service and webhook configurations),
/// for core to serve on `port`: the API server calls them for every ModelDeployment
/// created (the mutating one gives it its defaults and the finalizer of the provider core
/// will select). Returns core's flags from its chart's Deployment and the Service's name.
async fn core_webhooks(client: &Client, port: u16) -> anyhow::Result<(Vec<String>, String)> {
    let helm_bin = helm::binary().context(
        "the benchmark installs core's webhooks from its chart with helm: run scripts/install-helm.sh",
    )?;
    let objects = helm::template(&helm_bin, &helm::chart("kubeairunway"), &[])?;
    kubeairunway_testcluster::ensure_namespace(client, SYSTEM).await?;
    helm::apply_kinds(
        client,
        &objects,
        &[
            "Service",
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
        ],
    )
    .await?;
    let name_of = |kind: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind)
            .and_then(|o| o["metadata"]["name"].as_str())
            .with_context(|| format!("core's chart renders no {kind}"))
    };
    let container = helm::container(&objects, name_of("Deployment")?, "controller")
        .context("core's chart has no controller container")?;
    let mut args: Vec<String> = helm::args_with(
        container,
        &[("webhook-bind-address", format!("127.0.0.1:{port}"))],
    )
    .into_iter()
    .filter(|a| !a.starts_with("--metrics-bind-address=") && !a.starts_with("--log-format="))
    .collect();
    // The Downward API values of the chart's env.
    args.push(format!("--namespace={SYSTEM}"));
    args.push("--pod-name=core-0".into());
    Ok((args, name_of("Service")?.to_string()))
}

/// Wait until the API server calls core's mutating webhook: a ModelDeployment created
/// (as a dry run, so nothing is stored) comes back with a provider's finalizer.
async fn wait_webhooks(client: &Client, provider: Role) -> anyhow::Result<()> {
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), "scale");
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let probe = mds.create(&dry, &vllm("probe", "scale", provider)).await;
        if probe.is_ok_and(|md| !md.finalizers().is_empty()) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "core's mutating webhook was never called"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A vLLM ModelDeployment for `provider`: Dynamo is selected by core's rules; the others
/// are named, as only they run here (KubeRay has no selection rules, KAITO's take CPU-only
/// and llama.cpp ModelDeployments, the Deployment provider's comes below every other).
fn vllm(name: &str, ns: &str, provider: Role) -> ModelDeployment {
    let md = ModelDeploymentBuilder::new(name)
        .namespace(ns)
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .gpus(1);
    match provider {
        Role::Dynamo => md,
        _ => md.provider(provider.name()),
    }
    .build()
}

/// Run `work(client, i)` for i in 0..n over `connections` clients, each its own
/// connection, and return the elapsed time.
async fn fan_out<F, Fut>(
    cluster: &TestCluster,
    n: usize,
    connections: usize,
    work: F,
) -> anyhow::Result<Duration>
where
    F: Fn(Client, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let work = Arc::new(work);
    let next = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(cluster.client().await?);
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        let (work, next) = (work.clone(), next.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return anyhow::Ok(());
                }
                work(client.clone(), i).await?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(started.elapsed())
}

async fn bench(cluster: &TestCluster, args: &Args) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let builtins = Arc::new(builtins(args.provider)?);
    let wanted = provider(&builtins, args.provider)?.upstream();
    // The real upstream CRD, as the CLI bundles it (none for a built-in kind).
    let upstream_crd = kubeairunway_cli::crds::bundled(&wanted.crd_name())?;
    let mut crds = kubeairunway_sdk::api::crds::all();
    crds.extend(upstream_crd.clone());
    if args.kernel_cache {
        crds.extend(kubeairunway_kernelcache_api::crds());
    }
    install_crds(&client, &crds).await?;
    // The API server refuses objects in a namespace that does not exist.
    for ns in ["raw", "scale"] {
        kubeairunway_testcluster::ensure_namespace(&client, ns).await?;
    }
    let api = Arc::new(upstream_api(&client, &wanted, upstream_crd.as_ref()).await?);
    // What one ModelDeployment renders: the kinds the raw phase writes and removes.
    let sample = rendered_in_order(
        provider(&builtins, args.provider)?,
        &vllm("sample", "raw", args.provider),
        &api,
        false,
    )?;
    let kinds: Vec<ApiResource> = sample.iter().map(|o| api.resource_of(o)).collect();
    println!(
        "scale benchmark: N = {}, {} connections, on {} cores",
        args.n,
        args.connections,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );

    // 1. The plain client's writes (with `--raw-watches`, while the watches the platform's
    // run has open are open too: what serving them costs the API server).
    let watches = if args.raw_watches {
        platform_watches(&client, &api, args.provider.name())
    } else {
        tokio::task::JoinSet::new()
    };
    let mut baselines = Vec::new();
    for baseline in [Baseline::Platform, Baseline::Minimal] {
        let (raw, server) =
            timed_baseline(cluster, args, &api, &builtins, &kinds, baseline, "").await?;
        // The plain client's objects go before the next phase: the providers would
        // otherwise cache them, and reconcile the plain client's ModelDeployments, whose
        // objects (not the provider's writes) it would refuse as someone else's and
        // retry for the whole run.
        remove(cluster, args, "raw", "raw", &kinds).await?;
        baselines.push((baseline, raw, server));
    }
    drop(watches);

    // 2. The platform.
    let mut roles = vec![Role::Core, args.provider];
    if args.kernel_cache {
        roles.extend([Role::KernelCache, Role::Warmup]);
    }
    let webhook_port = free_port()?;
    let (core_flags, service) = core_webhooks(&client, webhook_port).await?;
    let controllers = roles
        .into_iter()
        .map(|role| {
            let extra: &[String] = if matches!(role, Role::Core) {
                &core_flags
            } else {
                &[]
            };
            spawn(role, cluster, args.bin_dir.as_deref(), extra)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Routed once core is ready, as the endpoints controller would.
    kubeairunway_e2e::ready(controllers[0].address, 120).await?;
    cluster
        .route_service(&client, SYSTEM, &service, 443, webhook_port)
        .await?;
    wait_registered(&client, args.provider.name(), |c| c.status?.ready).await?;
    wait_webhooks(&client, args.provider).await?;
    if args.kernel_cache {
        // Registered once it leads, as its caches fill.
        wait_registered(&client, KERNEL_CACHE, |c| Some(c.status.is_some())).await?;
    }
    let before = request_counts(&client).await?;
    let cpu_before = cpu_use(cluster, &controllers);
    let profile = cpu_profile(&client, args, "platform");
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn(count_done(
        client.clone(),
        args.provider.name(),
        args.n,
        done_tx,
    ));
    let (n, provider) = (args.n, args.provider);
    let started = Instant::now();
    let created = fan_out(cluster, n, args.connections, move |client, i| async move {
        let md = vllm(&format!("md-{i}"), "scale", provider);
        let mds: Api<ModelDeployment> = Api::namespaced(client, "scale");
        mds.create(&PostParams::default(), &md).await?;
        Ok(())
    })
    .await?;
    done_rx.await?;
    let end_to_end = started.elapsed();
    let cpu_after = cpu_use(cluster, &controllers);
    watch.abort();
    finish_profile(profile).await;
    let after = request_counts(&client).await?;
    println!(
        "platform: {n} ModelDeployments created in {:.1} s, all deployed after {:.1} s",
        created.as_secs_f64(),
        end_to_end.as_secs_f64()
    );
    for (baseline, raw, _) in &baselines {
        println!(
            "ratio end-to-end / {} made raw: {:.2}x",
            baseline.name(),
            end_to_end.as_secs_f64() / raw.as_secs_f64()
        );
    }
    let server = print_cpu(
        "the platform's rollout",
        &cpu_before,
        &cpu_after,
        end_to_end,
    );
    // What the API server spends, whatever else runs on the machine (on a cluster the
    // controllers run elsewhere; here they share its cores).
    let per_md = |cpu: f64| cpu * 1e3 / n as f64;
    for (baseline, _, raw_server) in &baselines {
        println!(
            "API server and etcd CPU per ModelDeployment: the platform {:.1} ms, {} made raw {:.1} ms: {:.2}x",
            per_md(server),
            baseline.name(),
            per_md(*raw_server),
            server / raw_server
        );
    }
    let mut rollout = diff(&before, &after);
    // The benchmark's own requests: the creates and its one watch.
    subtract(&mut rollout, "POST modeldeployments", n);
    report(
        "requests per ModelDeployment during the rollout",
        &rollout,
        n,
    );
    sample_size(&client, "scale", "md-0", &kinds).await?;
    let reconciles_rollout = reconciles(&controllers).await?;

    // 3. Steady state.
    let before = request_counts(&client).await?;
    tokio::time::sleep(args.steady).await;
    let after = request_counts(&client).await?;
    let steady = diff(&before, &after);
    report(
        &format!(
            "requests per ModelDeployment in {} of steady state",
            humantime::format_duration(args.steady)
        ),
        &steady,
        n,
    );
    let reconciles_steady = reconciles(&controllers).await?;
    for ((name, during), (_, total)) in reconciles_rollout.iter().zip(&reconciles_steady) {
        println!(
            "{name}: {:.2} reconciles per ModelDeployment during the rollout, {:.2} in steady state",
            *during / n as f64,
            (*total - *during) / n as f64
        );
    }
    for c in &controllers {
        let m = memory(c.child.id());
        println!(
            "{}: RSS {:.1} MB (anonymous {:.1}, file-backed {:.1}; peak {:.1} MB)",
            c.name,
            m.rss as f64 / 1e6,
            m.anonymous as f64 / 1e6,
            m.file as f64 / 1e6,
            m.peak as f64 / 1e6
        );
    }

    // 4. The minimal writes again, after the platform: the machine's speed drifts within
    // a run, and a baseline on each side of the platform shows how far.
    if args.again {
        drop(controllers);
        remove_webhooks(&client).await?;
        remove(cluster, args, "scale", "md", &kinds).await?;
        let (again, server_again) = timed_baseline(
            cluster,
            args,
            &api,
            &builtins,
            &kinds,
            Baseline::Minimal,
            " again",
        )
        .await?;
        let before = baselines
            .iter()
            .find(|(b, ..)| matches!(b, Baseline::Minimal))
            .map_or(again, |(_, raw, _)| *raw);
        let mean = (before + again).as_secs_f64() / 2.0;
        println!(
            "ratio end-to-end / the minimal writes made raw after the platform: {:.2}x; / the mean of both: {:.2}x",
            end_to_end.as_secs_f64() / again.as_secs_f64(),
            end_to_end.as_secs_f64() / mean
        );
        println!(
            "API server and etcd CPU per ModelDeployment: the platform {:.1} ms, the minimal writes made raw after it {:.1} ms: {:.2}x",
            per_md(server),
            per_md(server_again),
            server / server_again
        );
    }
    Ok(())
}

/// Remove the admission webhooks of core's chart (core is stopped: the API server would
/// refuse every ModelDeployment it cannot call them for).
async fn remove_webhooks(client: &Client) -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let (dp, lp) = (DeleteParams::default(), ListParams::default());
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .delete_collection(&dp, &lp)
        .await?;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete_collection(&dp, &lp)
        .await?;
    Ok(())
}

/// The size of one ModelDeployment and of the objects rendered for it as stored (JSON),
/// and of their `managedFields`: what every later write, watch event and validation of
/// them costs the API server grows with it.
async fn sample_size(
    client: &Client,
    ns: &str,
    name: &str,
    kinds: &[ApiResource],
) -> anyhow::Result<()> {
    let md_kind = ApiResource::erase::<ModelDeployment>(&());
    let mut sizes = Vec::new();
    for kind in std::iter::once(&md_kind).chain(kinds) {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, kind);
        let object = api.get(name).await?;
        let managed = serde_json::to_vec(&object.metadata.managed_fields)?.len();
        sizes.push(format!(
            "{} {} bytes (managedFields {managed})",
            kind.kind,
            serde_json::to_vec(&object)?.len()
        ));
    }
    println!("stored {ns}/{name}: {}", sizes.join(", "));
    Ok(())
}

/// With `--cpu-profile`, the API server's CPU profile (Go's pprof, from its
/// `/debug/pprof/profile`) of the phase's first seconds, written to
/// `apiserver-<phase>.pprof` in the working directory (`go tool pprof -top` reads it).
fn cpu_profile(
    client: &Client,
    args: &Args,
    phase: &str,
) -> Option<tokio::task::JoinHandle<anyhow::Result<PathBuf>>> {
    let seconds = args.cpu_profile?.as_secs().max(1);
    let (client, path) = (
        client.clone(),
        PathBuf::from(format!("apiserver-{phase}.pprof")),
    );
    Some(tokio::spawn(async move {
        let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
            .body(Vec::new())?;
        let body = client.request_stream(request).await?;
        let mut bytes = Vec::new();
        futures::io::AsyncReadExt::read_to_end(&mut Box::pin(body), &mut bytes).await?;
        std::fs::write(&path, bytes)?;
        Ok(path)
    }))
}

/// Wait for a phase's profile and say where it is.
async fn finish_profile(profile: Option<tokio::task::JoinHandle<anyhow::Result<PathBuf>>>) {
    if let Some(profile) = profile {
        match profile.await {
            Ok(Ok(path)) => println!("API server CPU profile: {}", path.display()),
            Ok(Err(e)) => println!("API server CPU profile failed: {e:#}"),
            Err(e) => println!("API server CPU profile failed: {e}"),
        }
    }
}

/// Time `baseline`'s raw writes (the phase's name given `suffix`), printing the CPU used,
/// the requests made and the stored objects' sizes: its duration and the CPU the API
/// server and etcd used.
async fn timed_baseline(
    cluster: &TestCluster,
    args: &Args,
    api: &Arc<UpstreamApi>,
    builtins: &Arc<BuiltIns>,
    kinds: &[ApiResource],
    baseline: Baseline,
    suffix: &str,
) -> anyhow::Result<(Duration, f64)> {
    let client = cluster.client().await?;
    let name = format!("{}{suffix}", baseline.name());
    let cpu_before = cpu_use(cluster, &[]);
    let profile = cpu_profile(
        &client,
        args,
        &format!("{}{}", baseline.slug(), suffix.replace(' ', "-")),
    );
    let raw = raw_writes(cluster, args, api.clone(), builtins.clone(), baseline).await?;
    let server = print_cpu(
        &format!("the raw requests ({name})"),
        &cpu_before,
        &cpu_use(cluster, &[]),
        raw,
    );
    finish_profile(profile).await;
    let per = baseline.requests(kinds.len());
    println!(
        "raw requests ({name}): {} ({per} per ModelDeployment, {} objects rendered) in {:.1} s ({:.0}/s)",
        per * args.n,
        kinds.len(),
        raw.as_secs_f64(),
        (per * args.n) as f64 / raw.as_secs_f64()
    );
    sample_size(&client, "raw", "raw-0", kinds).await?;
    Ok((raw, server))
}

/// Watches like those open during the platform's run, their events read and dropped: of
/// ModelDeployments core's, the provider's and the benchmark's own, and the provider's of
/// its upstream kind (DynamoGraphDeployments, RayServices).
fn platform_watches(
    client: &Client,
    api: &UpstreamApi,
    provider: &str,
) -> tokio::task::JoinSet<()> {
    let mut watches = tokio::task::JoinSet::new();
    // Core's sees every ModelDeployment; the provider's and the benchmark's only those
    // whose status names the provider.
    let selected = ModelDeployment::selected_for(provider);
    for config in [
        watcher::Config::default(),
        watcher::Config::default().fields(&selected),
        watcher::Config::default().fields(&selected),
    ] {
        let mds: Api<ModelDeployment> = Api::all(client.clone());
        watches.spawn(watcher(mds, config).for_each(|_| async {}));
    }
    let dgds: Api<DynamicObject> = Api::all_with(client.clone(), &api.api_resource());
    watches.spawn(watcher(dgds, watcher::Config::default()).for_each(|_| async {}));
    watches
}

/// Delete the ModelDeployments `<prefix>-<i>` of `ns` (their finalizers first, then the
/// ModelDeployments) and every object of `kinds` in `ns`, and wait until they are gone; then
/// compact etcd's history and defragment it, so that the next phase starts from the same
/// store, not one holding the history of what this phase created and removed.
async fn remove(
    cluster: &TestCluster,
    args: &Args,
    ns: &'static str,
    prefix: &'static str,
    kinds: &[ApiResource],
) -> anyhow::Result<()> {
    fan_out(
        cluster,
        args.n,
        args.connections,
        move |client, i| async move {
            let mds: Api<ModelDeployment> = Api::namespaced(client, ns);
            let none = json!({"metadata": {"finalizers": null}});
            mds.patch(
                &format!("{prefix}-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&none),
            )
            .await?;
            Ok(())
        },
    )
    .await?;
    let client = cluster.client().await?;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
    let objects: Vec<Api<DynamicObject>> = kinds
        .iter()
        .map(|kind| Api::namespaced_with(client.clone(), ns, kind))
        .collect();
    let (dp, lp) = (DeleteParams::default(), ListParams::default());
    mds.delete_collection(&dp, &lp).await?;
    for api in &objects {
        api.delete_collection(&dp, &lp).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut left = mds.list_metadata(&lp.clone().limit(1)).await?.items.len();
        for api in &objects {
            left += api.list_metadata(&lp.clone().limit(1)).await?.items.len();
        }
        if left == 0 {
            return cluster.compact_store();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the objects of {ns} were never deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the plain client writes per ModelDeployment.
#[derive(Clone, Copy, Debug)]
enum Baseline {
    /// The requests the platform makes (as the API server's audit log shows them), in the
    /// same order: creating it with the finalizer core's webhook gives it, core's status
    /// and event, for each object rendered (supporting objects first, the primary last)
    /// the provider's apply that only creates, then the provider's event and status.
    Platform,
    /// The smallest useful set: creating it, one core status, the upstream applies and
    /// one provider status.
    Minimal,
}

impl Baseline {
    fn name(self) -> &'static str {
        match self {
            Self::Platform => "the platform's requests",
            Self::Minimal => "the minimal writes",
        }
    }

    /// The phase's name in file names.
    fn slug(self) -> &'static str {
        match self {
            Self::Platform => "raw-platform",
            Self::Minimal => "raw-minimal",
        }
    }

    /// Requests per ModelDeployment, where the provider renders `objects`.
    fn requests(self, objects: usize) -> usize {
        match self {
            Self::Platform => 5 + objects,
            Self::Minimal => 3 + objects,
        }
    }
}

/// Per ModelDeployment, the requests of `baseline`, made by a plain client.
async fn raw_writes(
    cluster: &TestCluster,
    args: &Args,
    api: Arc<UpstreamApi>,
    builtins: Arc<BuiltIns>,
    baseline: Baseline,
) -> anyhow::Result<Duration> {
    let (role, lean) = (args.provider, args.lean_raw);
    let events = matches!(baseline, Baseline::Platform);
    fan_out(cluster, args.n, args.connections, move |client, i| {
        let (api, builtins) = (api.clone(), builtins.clone());
        async move {
            let name = format!("raw-{i}");
            let mut md = vllm(&name, "raw", role);
            md.metadata.finalizers = Some(vec!["kubeairunway.ai/raw".into()]);
            let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), "raw");
            let created = mds.create(&PostParams::default(), &md).await?;
            md.metadata.uid = created.metadata.uid.clone();
            let core_status = if lean {
                lean_status(
                    "ProviderSelected",
                    "True",
                    "AutoSelected",
                    json!({"provider": {"name": role.name(), "selectedReason": "raw"}}),
                )
            } else {
                core_status(role)
            };
            mds.patch_status(
                &name,
                &PatchParams::apply("raw-core").force(),
                &Patch::Apply(&core_status),
            )
            .await?;
            if events {
                raw_event(&client, &created, "ProviderSelected").await?;
            }
            let objects = rendered_in_order(provider(&builtins, role)?, &md, &api, !lean)?;
            let images = kubeairunway_sdk::render::images(&objects);
            for mut object in objects {
                object.metadata.namespace = Some("raw".into());
                if events {
                    // Create-only, as the provider's first write.
                    object.metadata.resource_version = Some("1".into());
                }
                let objects: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), "raw", &api.resource_of(&object));
                let object_name = object.name_any();
                objects
                    .patch(
                        &object_name,
                        &PatchParams::apply("raw-provider").force(),
                        &Patch::Apply(&object),
                    )
                    .await?;
            }
            if events {
                raw_event(&client, &created, "ResourceCreated").await?;
            }
            let kind = &api.api_resource().kind;
            let provider_status = if lean {
                lean_status(
                    "Ready",
                    "False",
                    "DeploymentProgressing",
                    json!({"phase": "Deploying", "message": "raw",
                    "provider": {"resourceName": name, "resourceKind": kind}}),
                )
            } else {
                provider_status(&created, kind, &images)
            };
            mds.patch_status(
                &name,
                &PatchParams::apply("raw-provider").force(),
                &Patch::Apply(&provider_status),
            )
            .await?;
            Ok(())
        }
    })
    .await
}

/// A status with one condition and `fields` (`--lean-raw`).
fn lean_status(type_: &str, status: &str, reason: &str, mut fields: Value) -> Value {
    fields["conditions"] = json!([{"type": type_, "status": status, "reason": reason,
        "message": "raw", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
    json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "status": fields})
}

/// A condition as the platform writes it.
fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
        "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Core's status for a ModelDeployment naming its engine and selected automatically: the
/// fields and conditions core writes, with messages of the same length.
fn core_status(role: Role) -> Value {
    let reason = format!(
        "matched capabilities: engine=vllm, gpu=true, mode=aggregated; rule `spec.engine.type == 'vllm' && has(spec.resources) && has(spec.resources.gpu) && spec.resources.gpu.count > 0` priority 50 ({})",
        role.name()
    );
    json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "status": {
        "conditions": [
            condition("Validated", "True", "ValidationPassed", "Spec validation passed"),
            condition("EngineSelected", "True", "ExplicitSelection", "explicit engine selection"),
            condition("ProviderSelected", "True", "AutoSelected", &reason),
        ],
        "engine": {"type": "vllm", "selectedReason": "explicit engine selection"},
        "provider": {"name": role.name(), "selectedReason": reason},
    }})
}

/// The provider's status once it has applied the upstream object of `kind`: the fields and
/// conditions the provider runtime writes, with messages of the same length.
fn provider_status(md: &ModelDeployment, kind: &str, images: &[String]) -> Value {
    let (name, ns) = (md.name_any(), md.namespace().unwrap_or_default());
    let waiting = "waiting for the upstream operator to report status";
    json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "status": {
        "conditions": [
            condition("ProviderCompatible", "True", "CompatibilityVerified", &format!("the provider serves this spec with {kind}")),
            condition("ResourceCreated", "True", "ResourceCreated", &format!("{kind} '{name}' is applied")),
            condition("Ready", "False", "DeploymentProgressing", waiting),
        ],
        "endpoint": {"service": format!("{name}-frontend"), "port": 8000},
        "message": waiting,
        "observedGeneration": 1,
        "phase": "Deploying",
        "provider": {"images": images, "resourceKind": kind, "resourceName": name},
        "selector": format!("nvidia.com/dynamo-component-type=worker,nvidia.com/dynamo-graph-deployment-name={name}"),
        "url": format!("http://{name}-frontend.{ns}.svc.cluster.local:8000/v1"),
    }})
}

/// An event about `md`, as a controller's event recorder writes it.
async fn raw_event(client: &Client, md: &ModelDeployment, reason: &str) -> anyhow::Result<()> {
    let events: Api<Event> = Api::namespaced(client.clone(), "raw");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{}.", md.name_any())},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "raw", "reportingInstance": "raw",
        "action": "Reconcile", "reason": reason, "type": "Normal", "note": "raw",
        "regarding": {"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
                      "namespace": "raw", "name": md.name_any(), "uid": md.uid()},
    }))?;
    events.create(&PostParams::default(), &event).await?;
    Ok(())
}

/// Wait until the InferenceProviderConfig `name` is there and `ready` says so of it.
async fn wait_registered(
    client: &Client,
    name: &str,
    ready: impl Fn(InferenceProviderConfig) -> Option<bool>,
) -> anyhow::Result<()> {
    let configs: Api<InferenceProviderConfig> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if configs
            .get_opt(name)
            .await?
            .and_then(&ready)
            .unwrap_or(false)
        {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{name} never became ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Watch the ModelDeployments of the run and report when `n` of them carry the
/// provider's status (its resource name), which it writes after applying the
/// DynamoGraphDeployment.
async fn count_done(
    client: Client,
    provider: &'static str,
    n: usize,
    done: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let mds: Api<ModelDeployment> = Api::namespaced(client, "scale");
    let mut deployed = std::collections::HashSet::new();
    // Only those the provider was selected for: the benchmark's own watch is served by
    // the API server during the platform's run, and of the three writes of each
    // ModelDeployment, the create is of no use to it.
    let selected = ModelDeployment::selected_for(provider);
    let stream = watcher(mds, watcher::Config::default().fields(&selected)).applied_objects();
    let mut stream = std::pin::pin!(stream);
    while let Some(md) = stream.next().await {
        let md = md?;
        let has_status = md
            .status
            .as_ref()
            .and_then(|s| s.provider.as_ref())
            .and_then(|p| p.resource_name.as_ref())
            .is_some();
        if has_status {
            deployed.insert(md.name_any());
        }
        if deployed.len() >= n {
            let _ = done.send(());
            return Ok(());
        }
    }
    Ok(())
}

type Counts = BTreeMap<String, f64>;

/// `apiserver_request_total` summed by verb and resource (with subresource), without
/// long-running WATCH requests.
async fn request_counts(client: &Client) -> anyhow::Result<Counts> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut out = Counts::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let verb = label("verb");
        if verb == "WATCH" {
            continue;
        }
        let resource = match label("subresource").as_str() {
            "" => label("resource"),
            sub => format!("{}/{sub}", label("resource")),
        };
        *out.entry(format!("{verb} {resource}")).or_default() += value.parse::<f64>()?;
    }
    Ok(out)
}

fn diff(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

fn subtract(counts: &mut Counts, key: &str, n: usize) {
    if let Some(v) = counts.get_mut(key) {
        *v -= n as f64;
    }
    counts.retain(|_, v| *v > 0.0);
}

fn report(title: &str, counts: &Counts, n: usize) {
    println!("{title}:");
    if counts.is_empty() {
        println!("  none");
    }
    let mut by_verb: BTreeMap<&str, f64> = BTreeMap::new();
    for (key, v) in counts {
        println!("  {key:<48} {:>8.3}", v / n as f64);
        *by_verb
            .entry(key.split(' ').next().unwrap_or_default())
            .or_default() += v;
    }
    let verbs: Vec<String> = by_verb
        .iter()
        .map(|(verb, v)| format!("{verb} {:.3}", v / n as f64))
        .collect();
    println!("  by verb: {}", verbs.join(", "));
}

/// Reconciles so far, per controller, of any kind of object (from each one's
/// `kubeairunway_reconciliation_duration_seconds`; the warmup controller reconciles
/// Warmups, of which there are none here).
async fn reconciles(controllers: &[Controller]) -> anyhow::Result<Vec<(&'static str, f64)>> {
    let http = reqwest::Client::new();
    let mut out = Vec::new();
    for c in controllers {
        let text = http.get(&c.metrics).send().await?.text().await?;
        let total: f64 = text
            .lines()
            .filter(|l| l.starts_with("kubeairunway_reconciliation_duration_seconds_count"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        out.push((c.name, total));
    }
    Ok(out)
}

/// CPU time used so far, in seconds: by the machine (the busy time of all its cores) and
/// by each process measured.
struct CpuUse {
    machine: f64,
    parts: Vec<(String, f64)>,
}

/// The CPU time used so far by the machine, the API server and etcd, `controllers`, and
/// this process (the client; not its children, the controllers).
fn cpu_use(cluster: &TestCluster, controllers: &[Controller]) -> CpuUse {
    let tick = clock_tick();
    let server: f64 = ["apiserver", "etcd"]
        .iter()
        .filter_map(|name| std::fs::read_to_string(cluster.dir().join(format!("{name}.pid"))).ok())
        .filter_map(|pid| pid.trim().parse().ok())
        .map(|pid| process_cpu(pid, true, tick))
        .sum();
    let mut parts = vec![("API server and etcd".to_string(), server)];
    for c in controllers {
        parts.push((c.name.to_string(), process_cpu(c.child.id(), false, tick)));
    }
    parts.push((
        "this client".into(),
        process_cpu(std::process::id(), false, tick),
    ));
    CpuUse {
        machine: machine_cpu(tick),
        parts,
    }
}

/// Print the CPU used during a phase of `elapsed`, in cores (CPU seconds per second);
/// returns the CPU seconds of the API server and etcd.
fn print_cpu(phase: &str, before: &CpuUse, after: &CpuUse, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let parts: Vec<String> = after
        .parts
        .iter()
        .zip(&before.parts)
        .map(|((name, a), (_, b))| format!("{name} {:.2}", (a - b) / secs))
        .collect();
    println!(
        "CPU during {phase}: {:.2} of {cores} cores busy; {}",
        (after.machine - before.machine) / secs,
        parts.join(", ")
    );
    after
        .parts
        .first()
        .zip(before.parts.first())
        .map_or(0.0, |((_, a), (_, b))| a - b)
}

/// Seconds per clock tick of `/proc`'s CPU times (`getconf CLK_TCK`; 100 per second
/// where that cannot be read).
fn clock_tick() -> f64 {
    let hz = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse::<f64>().ok())
        .unwrap_or(100.0);
    1.0 / hz
}

/// Busy CPU seconds of the machine so far: every core's time but idle and I/O wait.
fn machine_cpu(tick: f64) -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is within user).
    let busy: f64 = ticks.iter().take(8).sum::<f64>()
        - ticks.get(3).unwrap_or(&0.0)
        - ticks.get(4).unwrap_or(&0.0);
    busy * tick
}

/// CPU seconds (user and system) used so far by process `pid`, and by its descendants
/// with `tree` (the API server runs under a watchdog shell).
fn process_cpu(pid: u32, tree: bool, tick: f64) -> f64 {
    let proc = Path::new("/proc").join(pid.to_string());
    let stat = std::fs::read_to_string(proc.join("stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the state, the 3rd
    // field: utime and stime are the 14th and 15th.
    let own: f64 = stat.rsplit_once(')').map_or(0.0, |(_, rest)| {
        rest.split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|v| v.parse::<f64>().ok())
            .sum()
    });
    let children: f64 = if tree {
        std::fs::read_to_string(proc.join("task").join(pid.to_string()).join("children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|c| c.parse().ok())
            .map(|c| process_cpu(c, true, tick))
            .sum()
    } else {
        0.0
    };
    own * tick + children
}

/// A process's resident memory, in bytes.
struct Memory {
    rss: u64,
    /// Of `rss`, the process's own pages (heap, stacks).
    anonymous: u64,
    /// Of `rss`, the pages of files mapped (its binary's code and data read).
    file: u64,
    peak: u64,
}

/// A process's resident memory now, and its peak.
fn memory(pid: u32) -> Memory {
    let status = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status"))
        .unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    Memory {
        rss: field("VmRSS:"),
        anonymous: field("RssAnon:"),
        file: field("RssFile:"),
        peak: field("VmHWM:"),
    }
}
