//! The provider runtime: all the I/O behind a [`Provider`].
//!
//! [`run`] registers the provider, watches its upstream CRD and the ModelDeployments it
//! serves, and reconciles each of them:
//!
//! 1. skip while paused (`kubeairunway.ai/reconcile-paused: "true"`);
//! 2. on deletion: delete the upstream objects, wait for them to go, and remove the
//!    finalizer `kubeairunway.ai/<name>-provider` (after `--finalizer-timeout` at the
//!    latest, with a `FinalizerTimeout` warning event);
//! 3. add the finalizer;
//! 4. `ProviderCompatible` from [`Provider::check`] and from the installed upstream CRD;
//! 5. render, check every rendered field path against the installed schema, recreate
//!    the primary object when an identity field changed, report drift, and
//!    server-side-apply everything (field manager `<name>-provider`, forced);
//! 6. observe the upstream status and server-side-apply ours.
//!
//! Which ModelDeployments: a watch with the server-side field selector
//! `status.provider.name=<name>`. The ModelDeployment CRD declares
//! `.status.provider.name` as a selectable field, so the API server filters and each
//! provider only ever receives (and caches) its own objects, however many other
//! providers' objects the cluster holds. (A label would need core to write metadata as
//! well as status; a client-side filter would make every provider watch and cache every
//! ModelDeployment.)

mod metrics;
mod reconcile;
mod registration;
mod status;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};

use crate::api::ModelDeployment;
use crate::labels;
use crate::leader::{LeaderElector, LeaseSettings};
use crate::provider::Provider;
use crate::upstream::UpstreamApi;

pub use metrics::Metrics;
pub use reconcile::{Error, reconcile_once};

/// Runtime settings; flatten into a provider's own flags with `#[command(flatten)]`.
#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// How long deletion waits for upstream objects to go before giving up.
    #[arg(
        long,
        env = "FINALIZER_TIMEOUT_SECONDS",
        default_value_t = 300,
        value_name = "SECONDS"
    )]
    pub finalizer_timeout_seconds: u64,
    /// How long the upstream status may stand still, while not Running, before the
    /// `StaleStatus` condition is set.
    #[arg(
        long,
        env = "STALE_STATUS_SECONDS",
        default_value_t = 300,
        value_name = "SECONDS"
    )]
    pub stale_status_seconds: u64,
    /// How often the InferenceProviderConfig heartbeat is refreshed.
    #[arg(
        long,
        env = "HEARTBEAT_SECONDS",
        default_value_t = 30,
        value_name = "SECONDS"
    )]
    pub heartbeat_seconds: u64,
    /// How often a Running deployment is re-checked without any change.
    #[arg(
        long,
        env = "RESYNC_SECONDS",
        default_value_t = 300,
        value_name = "SECONDS"
    )]
    pub resync_seconds: u64,
    /// Address of `/metrics`, `/healthz` and `/readyz`; empty to disable.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,
    /// Log as JSON lines.
    #[arg(long, env = "LOG_JSON")]
    pub log_json: bool,
    /// Elect a leader among replicas (a `coordination.k8s.io/v1` Lease): only the leader
    /// reconciles and heartbeats; every replica serves `/metrics` and the health checks.
    #[arg(long, env = "LEADER_ELECT", default_value_t = false, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader-election Lease (the provider's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,
    /// Name of the leader-election Lease; default `<name>-provider`.
    #[arg(long, env = "LEADER_ELECTION_LEASE")]
    pub leader_election_lease: Option<String>,
    /// This replica's identity in the Lease (its pod name).
    #[arg(long, env = "POD_NAME", default_value = "provider")]
    pub leader_election_identity: String,
    /// How long a Lease stays valid without renewal.
    #[arg(
        long,
        env = "LEADER_ELECTION_LEASE_SECONDS",
        default_value_t = 15,
        value_name = "SECONDS"
    )]
    pub leader_election_lease_seconds: u64,
    /// How often the leader renews the Lease (and others retry).
    #[arg(
        long,
        env = "LEADER_ELECTION_RENEW_SECONDS",
        default_value_t = 5,
        value_name = "SECONDS"
    )]
    pub leader_election_renew_seconds: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            finalizer_timeout_seconds: 300,
            stale_status_seconds: 300,
            heartbeat_seconds: 30,
            resync_seconds: 300,
            metrics_addr: "0.0.0.0:8080".to_string(),
            log_json: false,
            leader_elect: false,
            leader_election_namespace: "default".to_string(),
            leader_election_lease: None,
            leader_election_identity: "provider".to_string(),
            leader_election_lease_seconds: 15,
            leader_election_renew_seconds: 5,
        }
    }
}

impl Options {
    fn finalizer_timeout(&self) -> Duration {
        Duration::from_secs(self.finalizer_timeout_seconds)
    }
    fn stale_after(&self) -> Duration {
        Duration::from_secs(self.stale_status_seconds)
    }
    fn lease(&self, provider: &str) -> LeaseSettings {
        LeaseSettings {
            namespace: self.leader_election_namespace.clone(),
            name: self
                .leader_election_lease
                .clone()
                .unwrap_or_else(|| field_manager(provider)),
            identity: self.leader_election_identity.clone(),
            lease_duration: Duration::from_secs(self.leader_election_lease_seconds),
            renew_interval: Duration::from_secs(self.leader_election_renew_seconds),
        }
    }
}

/// The detected upstream API: `None` while the CRD is not installed, `Err` with the
/// reason when no adapter fits it.
pub type UpstreamState = Option<Result<UpstreamApi, String>>;

/// Shared state of one provider's runtime.
pub struct Context<P: Provider> {
    pub(crate) provider: Arc<P>,
    pub(crate) client: Client,
    pub(crate) options: Options,
    pub(crate) upstream: watch::Receiver<UpstreamState>,
    pub(crate) recorder: Recorder,
    pub(crate) metrics: Arc<Metrics>,
    /// Spec generation whose render warnings were already published, per object.
    pub(crate) warned: Mutex<HashMap<ObjectRef<ModelDeployment>, i64>>,
    /// Upstream status fingerprint and when it last changed, per object.
    pub(crate) upstream_seen: Mutex<HashMap<ObjectRef<ModelDeployment>, (u64, Instant)>>,
    /// Consecutive failures, for backoff.
    pub(crate) failures: Mutex<HashMap<ObjectRef<ModelDeployment>, u32>>,
}

impl<P: Provider> std::fmt::Debug for Context<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("provider", &self.provider.name())
            .finish_non_exhaustive()
    }
}

impl<P: Provider> Context<P> {
    /// A context for `provider`; `upstream` carries the detected upstream API.
    pub fn new(
        provider: Arc<P>,
        client: Client,
        options: Options,
        upstream: watch::Receiver<UpstreamState>,
    ) -> Self {
        let reporter = Reporter {
            controller: field_manager(provider.name()),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            metrics: Arc::new(Metrics::new(provider.name())),
            provider,
            client,
            options,
            upstream,
            warned: Mutex::default(),
            upstream_seen: Mutex::default(),
            failures: Mutex::default(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.provider.name()
    }

    pub(crate) fn field_manager(&self) -> String {
        field_manager(self.name())
    }

    pub(crate) fn finalizer(&self) -> String {
        finalizer(self.name())
    }
}

/// The field manager of a provider: `<name>-provider`.
pub fn field_manager(provider: &str) -> String {
    format!("{provider}-provider")
}

/// The finalizer of a provider: `kubeairunway.ai/<name>-provider`.
pub fn finalizer(provider: &str) -> String {
    format!("kubeairunway.ai/{provider}-provider")
}

/// Parse flags and environment, set up logging, connect to the cluster, and [`run`]
/// until SIGTERM or Ctrl-C. The whole `main` of a provider binary:
///
/// ```no_run
/// # async fn example(my_provider: impl kubeairunway_sdk::Provider) -> anyhow::Result<()> {
/// // in `#[tokio::main] async fn main() -> anyhow::Result<()>`:
/// kubeairunway_sdk::runtime::main(my_provider).await
/// # }
/// ```
pub async fn main<P: Provider>(provider: P) -> anyhow::Result<()> {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        options: Options,
    }
    let options = Cli::parse().options;
    let client = connect(&options).await?;
    run(provider, client, options).await
}

/// What every provider binary does before [`run`]: set up logging (`--log-json`), install
/// the TLS crypto provider, and connect to the cluster (in-cluster or `KUBECONFIG`).
pub async fn connect(options: &Options) -> anyhow::Result<Client> {
    init_tracing(options.log_json);
    install_crypto_provider();
    Ok(Client::try_default().await?)
}

/// Structured logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Make rustls's ring provider the process default (kube's TLS uses it).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Run `provider` until the process is asked to stop.
pub async fn run<P: Provider>(provider: P, client: Client, options: Options) -> anyhow::Result<()> {
    let shutdown = async {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
        }
        #[cfg(not(unix))]
        ctrl_c.await?;
        anyhow::Ok(())
    };
    run_until(provider, client, options, shutdown).await
}

/// Run `provider` until `shutdown` completes (tests pass their own signal).
///
/// With `--leader-elect`, the replica campaigns for the Lease and runs the writers (the
/// heartbeat and the ModelDeployment controller) only while it leads; losing the Lease
/// stops them until it leads again. The upstream CRD watch and the metrics server run on
/// every replica.
pub async fn run_until<P: Provider>(
    provider: P,
    client: Client,
    options: Options,
    shutdown: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
) -> anyhow::Result<()> {
    let provider = Arc::new(provider);
    let (upstream_tx, upstream_rx) = watch::channel::<UpstreamState>(None);
    let ctx = Arc::new(Context::new(
        provider.clone(),
        client.clone(),
        options.clone(),
        upstream_rx.clone(),
    ));
    let name = provider.name().to_string();
    tracing::info!(provider = %name, "starting provider runtime");

    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(registration::watch_upstream_crd(
        provider.clone(),
        client.clone(),
        upstream_tx,
    ));
    if let Ok(addr) = options.metrics_addr.parse::<SocketAddr>() {
        tasks.spawn(metrics::serve(
            addr,
            ctx.metrics.clone(),
            upstream_rx.clone(),
        ));
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    tasks.spawn(async move {
        if let Err(e) = shutdown.await {
            tracing::warn!(error = %e, "shutdown signal failed");
        }
        stop_tx.send_replace(true);
        // Keep the channel open for the replicas still waiting on it.
        std::future::pending::<()>().await;
    });
    // Without election this replica always leads (the sender is kept, so that
    // `leading` never closes); with it, the elector publishes whether it leads.
    let (lead_tx, mut leading) = watch::channel(!options.leader_elect);
    let (election, _always) = if options.leader_elect {
        let elector = LeaderElector::new(client.clone(), options.lease(&name));
        let stop = became(stop_rx.clone(), true);
        (Some(tokio::spawn(elector.run(lead_tx, stop))), None)
    } else {
        (None, Some(lead_tx))
    };

    loop {
        tokio::select! {
            () = became(stop_rx.clone(), true) => break,
            r = leading.wait_for(|l| *l) => if r.is_err() { break },
        }
        let term_over = {
            let (stop, lost) = (stop_rx.clone(), leading.clone());
            async move {
                tokio::select! {
                    () = became(stop, true) => {}
                    () = became(lost, false) => {}
                }
            }
        };
        lead(&ctx, term_over).await;
        if *stop_rx.borrow() {
            break;
        }
        tracing::info!(provider = %name, "not leading; reconciliation paused");
    }
    if let Some(election) = election {
        // The elector releases the Lease on shutdown, so a standby takes over at once.
        let _ = election.await;
    }
    tasks.abort_all();
    tracing::info!(provider = %name, "provider runtime stopped");
    Ok(())
}

/// Completes once `rx` holds `value` (or its sender is gone).
async fn became(mut rx: watch::Receiver<bool>, value: bool) {
    let _ = rx.wait_for(|v| *v == value).await;
}

/// One term of leadership: the heartbeat, the upstream-object watch and the
/// ModelDeployment controller, until `over` completes.
async fn lead<P: Provider>(
    ctx: &Arc<Context<P>>,
    over: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (provider, client, name) = (
        ctx.provider.clone(),
        ctx.client.clone(),
        ctx.name().to_string(),
    );
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(registration::heartbeat(
        provider.clone(),
        client.clone(),
        ctx.options.clone(),
        ctx.upstream.clone(),
    ));

    // Reconcile everything again whenever the detected upstream API changes; and
    // reconcile a ModelDeployment whenever one of its upstream objects changes.
    let (owned_tx, owned_rx) = mpsc::channel::<ObjectRef<ModelDeployment>>(256);
    tasks.spawn(watch_owned(
        provider.clone(),
        client.clone(),
        ctx.upstream.clone(),
        owned_tx,
    ));
    let upstream_changed = upstream_changes(ctx.upstream.clone());

    let mds: Api<ModelDeployment> = Api::all(client);
    let selector = format!("status.provider.name={name}");
    Controller::new(
        mds,
        watcher::Config::default().fields(&selector).any_semantic(),
    )
    .reconcile_on(tokio_stream_from(owned_rx))
    .reconcile_all_on(upstream_changed)
    .graceful_shutdown_on(over)
    .run(
        reconcile::reconcile::<P>,
        reconcile::error_policy::<P>,
        ctx.clone(),
    )
    .for_each(|res| async move {
        if let Err(e) = res {
            tracing::debug!(error = %e, "reconcile loop");
        }
    })
    .await;
    tasks.abort_all();
}

/// One item each time the detected upstream API changes.
fn upstream_changes(
    rx: watch::Receiver<UpstreamState>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok().map(|()| ((), rx))
    })
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Watch the upstream objects this provider created (by label) and map each to its
/// ModelDeployment; restarted whenever the detected upstream version changes.
async fn watch_owned<P: Provider>(
    provider: Arc<P>,
    client: Client,
    mut upstream: watch::Receiver<UpstreamState>,
    tx: mpsc::Sender<ObjectRef<ModelDeployment>>,
) {
    loop {
        let current = upstream.borrow_and_update().clone();
        let watch_task = current.and_then(Result::ok).map(|api| {
            let client = client.clone();
            let tx = tx.clone();
            let selector = format!("{}={}", labels::PROVIDER, provider.name());
            tokio::spawn(async move {
                let objects: Api<DynamicObject> = Api::all_with(client, &api.api_resource());
                let stream = watcher(objects, watcher::Config::default().labels(&selector))
                    .default_backoff()
                    .touched_objects();
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    let Ok(obj) = event else { continue };
                    let Some(ns) = obj.namespace() else { continue };
                    if let Some(md) = obj.labels().get(labels::MODEL_DEPLOYMENT) {
                        let _ = tx.send(ObjectRef::new(md).within(&ns)).await;
                    }
                }
            })
        });
        let changed = upstream.changed().await;
        if let Some(t) = watch_task {
            t.abort();
        }
        if changed.is_err() {
            return;
        }
    }
}
