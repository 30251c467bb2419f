//! The process runtime every binary of the platform runs on (core, each provider, the
//! kernel-cache controller, agent and webhook; and third parties'): one set of flags with
//! the same names and duration syntax everywhere, logging, the stop signal, `/metrics`,
//! `/healthz` and `/readyz`, and Lease leader election.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use kubeairunway_sdk::process::{Options, Runtime};
//! # let options = Options::default();
//! let mut rt = Runtime::start("my-controller", options).await?;
//! let synced = rt.readiness().term_check("caches");
//! rt.run(move |term| {
//!     let synced = synced.clone();
//!     async move {
//!         // start reflectors and controllers; `synced.set()` once caches are ready;
//!         // return when `term.ended()` completes (leadership lost, or shutdown).
//!         term.ended().await;
//!         Ok(())
//!     }
//! })
//! .await
//! # }
//! ```
//!
//! Readiness (`/readyz`) is the conjunction of the checks the process registered: "process"
//! checks (a webhook certificate loaded) always count; "term" checks (caches synced) count
//! only while this replica leads, and are reset at the start of every term, so a standby
//! replica is ready and a leader is ready once its caches are.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::get;
use kube::Client;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::leader::{LeaderElector, LeaseSettings};

/// The duration syntax of every flag of the platform (`90s`, `5m`, `1h 30m`, `30d`):
/// `humantime`'s, for `value_parser = kubeairunway_sdk::process::parse_duration`. Zero is
/// refused: every duration flag is an interval or a timeout, and zero would spin or fire
/// at once.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 90s, 5m, 1h 30m)"))?;
    if d.is_zero() {
        return Err(format!("{s:?}: a duration must be positive"));
    }
    Ok(d)
}

/// Log format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

/// The default of `--metrics-bind-address`: `0.0.0.0:8080` ([`METRICS_ADDRESS`]) when it
/// is free, else a free port, logged: core and a provider started side by side on one
/// machine both serve their endpoints. An address given explicitly that is taken is an
/// error, as it always was (the charts always give one).
pub const AUTO_METRICS_ADDRESS: &str = "auto";
/// The address `auto` binds when it is free.
pub const METRICS_ADDRESS: &str = "0.0.0.0:8080";

/// Flags shared by every binary of the platform; flatten them into a binary's own with
/// `#[command(flatten)]`. Each is also read from the environment variable named.
#[derive(Clone, Debug, clap::Args)]
#[group(id = "ProcessOptions")]
pub struct Options {
    /// Address of `/metrics`, `/healthz` and `/readyz` (HTTP); empty to serve none;
    /// `auto`: `0.0.0.0:8080`, or a free port (logged) when another process holds 8080,
    /// as a second binary run on the same machine does.
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = AUTO_METRICS_ADDRESS)]
    pub metrics_bind_address: String,
    /// Log format (the level comes from `RUST_LOG`, default `info`).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Elect a leader among replicas with a `coordination.k8s.io/v1` Lease: only the
    /// leader reconciles; every replica serves its endpoints (and webhooks).
    #[arg(long, env = "LEADER_ELECT", default_value_t = false, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Name of the Lease (default: the component's name).
    #[arg(long, env = "LEADER_ELECT_RESOURCE_NAME")]
    pub leader_elect_resource_name: Option<String>,
    /// The namespace the component runs in: its Lease, its webhook Secret and Service.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// How long the others wait, from their own observation of the last renewal, before
    /// taking the Lease.
    #[arg(long, env = "LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal.
    #[arg(long, env = "LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often the leader renews and the others look.
    #[arg(long, env = "LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// This replica's name: its identity in the Lease and in the events it writes.
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub pod_name: String,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            metrics_bind_address: AUTO_METRICS_ADDRESS.into(),
            log_format: LogFormat::Json,
            leader_elect: false,
            leader_elect_resource_name: None,
            namespace: "default".into(),
            leader_elect_lease_duration: Duration::from_secs(15),
            leader_elect_renew_deadline: Duration::from_secs(10),
            leader_elect_retry_period: Duration::from_secs(2),
            pod_name: String::new(),
        }
    }
}

impl Options {
    /// The Lease of `component`.
    pub fn lease(&self, component: &str) -> LeaseSettings {
        LeaseSettings {
            namespace: self.namespace.clone(),
            name: self
                .leader_elect_resource_name
                .clone()
                .unwrap_or_else(|| component.to_string()),
            identity: self.identity(component),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        }
    }

    /// This replica's identity: `--pod-name`, else the host name, else the component.
    pub fn identity(&self, component: &str) -> String {
        if !self.pod_name.is_empty() {
            return self.pod_name.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| component.to_string())
    }
}

/// Structured logs to stderr in `format`, filtered by `RUST_LOG` (default `info`).
/// Idempotent: the first call wins.
pub fn init_logging(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Make rustls's ring provider the process default (kube's TLS and the webhook servers
/// use it). Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn terminated() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

/// The one retry policy of the platform's controllers: after the `attempt`-th failure in a
/// row (from 1), wait 2 s doubling up to 5 min.
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(2u64.saturating_pow(attempt.clamp(1, 9))).min(Duration::from_secs(300))
}

/// The process's stop signal: cheap to clone, wait on it anywhere.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// A signal set when `signal` completes.
    pub fn on(signal: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            signal.await;
            tx.send_replace(true);
            // Keep the channel open: receivers see `true`, never a closed channel.
            std::future::pending::<()>().await;
        });
        Self(rx)
    }

    /// Whether the process is stopping.
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Completes once the process is stopping.
    pub async fn wait(&self) {
        let mut rx = self.0.clone();
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// The global allocator of every long-running binary of the platform: the system
/// allocator on MSVC targets, where jemalloc does not build.
#[cfg(target_env = "msvc")]
pub use std::alloc::System as Allocator;
/// The global allocator of every long-running binary of the platform (core, the providers,
/// the kernel-cache controller, agent and webhook, the CLI that runs them): jemalloc, where
/// it builds (not for MSVC targets), the system allocator elsewhere. Declare it in a
/// binary's `main.rs`:
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;
/// ```
///
/// Why: a controller keeps one long-lived cached object per object it watches and makes
/// short-lived ones on every watch event in between, and glibc's allocator, with an arena
/// per thread, leaves the holes between them resident. Measured with the scale benchmark
/// (docs/benchmarks.md#scale), debug build, from 10 to 2,000 ModelDeployments: the Dynamo provider's
/// resident memory grew by about 6 kB per ModelDeployment with glibc and 2.3 kB with
/// jemalloc, for about 4 kB of live heap; mimalloc started 28 MB higher.
#[cfg(not(target_env = "msvc"))]
pub use tikv_jemallocator::Jemalloc as Allocator;

/// Have jemalloc return freed memory to the system from a thread of its own. Without it,
/// jemalloc purges pages freed for ten seconds only when the process allocates again, and
/// a controller idle after a burst (a rollout of thousands of ModelDeployments, then
/// steady state with nothing to do) keeps the pages of the burst resident. Measured with
/// the scale benchmark (docs/benchmarks.md#scale): the Deployment provider at 2,000
/// ModelDeployments held 19.1 MB of anonymous memory after 20 s of steady state without
/// it and 17.1 MB with it. (Nothing to do with the system allocator, on MSVC.)
fn purge_freed_memory_in_the_background() {
    #[cfg(not(target_env = "msvc"))]
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(error = %e, "could not start jemalloc's background purging");
    }
}

/// How long a term's work may take to stop after the term ended before it is cancelled.
pub const TERM_GRACE: Duration = Duration::from_secs(5);

/// Reconciles a controller runs at once. Unbounded, a burst of N new objects starts N
/// reconciles, and each one's requests open an HTTP/1.1 connection of its own (with its
/// TLS state and buffers): measured with the scale benchmark's heap profile, core held
/// hundreds of connections at 2,000 ModelDeployments, and the API server paid a TLS
/// handshake for each. At 16 the controllers finished 21 s after the last of 10,000
/// creates (a saturated API server answers each request late); at 32 they keep up
/// (docs/benchmarks.md), for a few MB more.
pub const RECONCILE_CONCURRENCY: u16 = 32;

/// The configuration of every controller of the platform: [`RECONCILE_CONCURRENCY`].
pub fn controller_config() -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(RECONCILE_CONCURRENCY)
}

/// What is logged (a warning) when a term's work is cancelled `TERM_GRACE` after its
/// term ended: a wait in that work that does not end with the term, to be found and fixed.
pub const TERM_CANCELLED: &str = "the term's work did not stop after the term ended; cancelled";

/// One readiness check, set by its owner when ready.
#[derive(Clone, Debug, Default)]
pub struct Check(Arc<AtomicBool>);

impl Check {
    /// Mark ready.
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Mark not ready.
    pub fn clear(&self) {
        self.0.store(false, Ordering::Release);
    }

    /// Whether ready.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The checks behind `/readyz`.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    process: Arc<Mutex<BTreeMap<String, Check>>>,
    term: Arc<Mutex<BTreeMap<String, Check>>>,
    leading: Arc<AtomicBool>,
}

impl Readiness {
    /// A check that always counts (a certificate loaded, a cache every replica keeps).
    pub fn process_check(&self, name: &str) -> Check {
        Self::add(&self.process, name)
    }

    /// A check that counts only while this replica leads, cleared at every new term
    /// (the leader's caches).
    pub fn term_check(&self, name: &str) -> Check {
        Self::add(&self.term, name)
    }

    fn add(map: &Mutex<BTreeMap<String, Check>>, name: &str) -> Check {
        map.lock()
            .map(|mut m| m.entry(name.to_string()).or_default().clone())
            .unwrap_or_default()
    }

    /// The checks that are not ready, by name (empty: ready).
    pub fn pending(&self) -> Vec<String> {
        let collect = |map: &Mutex<BTreeMap<String, Check>>| -> Vec<String> {
            map.lock()
                .map(|m| {
                    m.iter()
                        .filter(|(_, c)| !c.is_set())
                        .map(|(n, _)| n.clone())
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut out = collect(&self.process);
        if self.leading.load(Ordering::Acquire) {
            out.extend(collect(&self.term));
        }
        out
    }

    fn start_term(&self) {
        if let Ok(m) = self.term.lock() {
            m.values().for_each(Check::clear);
        }
        self.leading.store(true, Ordering::Release);
    }

    fn end_term(&self) {
        self.leading.store(false, Ordering::Release);
    }
}

/// One term of leadership (the whole life of the process without leader election).
#[derive(Clone, Debug)]
pub struct Term {
    leading: watch::Receiver<bool>,
    shutdown: Shutdown,
}

impl Term {
    /// A term that ends when `leading` turns false or `shutdown` is set (tests of a
    /// term's work).
    #[cfg(test)]
    pub(crate) fn new(leading: watch::Receiver<bool>, shutdown: Shutdown) -> Self {
        Self { leading, shutdown }
    }

    /// Completes when the term is over: leadership lost, or the process stopping. Stop
    /// every writer by then.
    pub async fn ended(&self) {
        let mut lost = self.leading.clone();
        tokio::select! {
            _ = lost.wait_for(|l| !*l) => {}
            () = self.shutdown.wait() => {}
        }
    }

    /// The process's stop signal.
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }
}

/// The running process: its client, flags, metrics registry, readiness and stop signal.
pub struct Runtime {
    component: String,
    options: Options,
    client: Client,
    registry: Registry,
    readiness: Readiness,
    shutdown: Shutdown,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("component", &self.component)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Set up logging (`--log-format`), TLS, the stop signal (SIGTERM, Ctrl-C) and the
    /// cluster client (in-cluster, or `KUBECONFIG`).
    pub async fn start(component: &str, options: Options) -> anyhow::Result<Self> {
        init_logging(options.log_format);
        install_crypto_provider();
        purge_freed_memory_in_the_background();
        let client = Client::try_default()
            .await
            .context("connecting to the cluster (in-cluster config or KUBECONFIG)")?;
        Ok(Self::with_client(
            component,
            options,
            client,
            Shutdown::on(terminated()),
        ))
    }

    /// A runtime on a given client and stop signal (tests, several components in one
    /// process). Logging is left as it is.
    pub fn with_client(
        component: &str,
        options: Options,
        client: Client,
        shutdown: Shutdown,
    ) -> Self {
        Self {
            component: component.to_string(),
            options,
            client,
            registry: Registry::default(),
            readiness: Readiness::default(),
            shutdown,
        }
    }

    /// The component's name (`kubeairunway-controller`, `dynamo-provider`, ...).
    pub fn component(&self) -> &str {
        &self.component
    }

    /// The flags.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The cluster client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The metrics registry served on `/metrics`: register before [`Runtime::run`].
    pub fn registry(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The readiness checks behind `/readyz`.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// The stop signal.
    pub fn shutdown(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// This replica's identity (events, Lease).
    pub fn identity(&self) -> String {
        self.options.identity(&self.component)
    }

    /// Serve the endpoints, then run `lead` for each term of leadership until the process
    /// stops: once, for the whole life of the process, without `--leader-elect`; with it,
    /// each time this replica takes the Lease, until it loses it. `lead` must return once
    /// its term has ended ([`Term::ended`]). The Lease is released on shutdown, so a
    /// standby takes over at once.
    pub async fn run<F, Fut>(self, mut lead: F) -> anyhow::Result<()>
    where
        F: FnMut(Term) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        let Runtime {
            component,
            options,
            client,
            registry,
            readiness,
            shutdown,
        } = self;
        serve_endpoints(
            &options.metrics_bind_address,
            registry,
            readiness.clone(),
            shutdown.clone(),
        )
        .await?;
        let (lead_tx, mut leading) = watch::channel(!options.leader_elect);
        // Without election this replica leads until shutdown: the sender is kept here.
        let mut _always_leading = None;
        let election = if options.leader_elect {
            let settings = options.lease(&component);
            settings
                .validate()
                .map_err(|e| anyhow::anyhow!("leader election: {e}"))?;
            let elector = LeaderElector::new(client, settings);
            let stop = shutdown.clone();
            Some(tokio::spawn(
                elector.run(lead_tx, async move { stop.wait().await }),
            ))
        } else {
            _always_leading = Some(lead_tx);
            None
        };
        let mut result = Ok(());
        loop {
            tokio::select! {
                () = shutdown.wait() => break,
                r = leading.wait_for(|l| *l) => if r.is_err() { break },
            }
            readiness.start_term();
            let term = Term {
                leading: leading.clone(),
                shutdown: shutdown.clone(),
            };
            // A term's work must stop when the term ends (another replica may lead by
            // then): what has not returned a grace period after the end is dropped, which
            // cancels it (its tasks, controllers and requests in flight) rather than
            // leaving this replica stuck in a term it no longer holds.
            let ended = {
                let term = term.clone();
                async move {
                    term.ended().await;
                    tokio::time::sleep(TERM_GRACE).await;
                }
            };
            let outcome = tokio::select! {
                outcome = lead(term) => outcome,
                () = ended => {
                    tracing::warn!(component = %component, grace = ?TERM_GRACE, "{TERM_CANCELLED}");
                    Ok(())
                }
            };
            readiness.end_term();
            if let Err(e) = outcome {
                tracing::error!(component = %component, error = %format!("{e:#}"), "stopping");
                result = Err(e);
                break;
            }
            if shutdown.is_set() {
                break;
            }
            tracing::info!(component = %component, "not leading; standing by");
        }
        if let Some(election) = election {
            if result.is_err() {
                election.abort();
            } else {
                let _ = election.await;
            }
        }
        result
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `addr` (nothing when empty) until
/// `shutdown`.
pub async fn serve_endpoints(
    addr: &str,
    registry: Registry,
    readiness: Readiness,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    if addr.is_empty() {
        return Ok(());
    }
    let listener = if addr == AUTO_METRICS_ADDRESS {
        match tokio::net::TcpListener::bind(METRICS_ADDRESS).await {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                let l = tokio::net::TcpListener::bind("0.0.0.0:0")
                    .await
                    .context("binding a free port for the endpoints")?;
                tracing::warn!(
                    taken = METRICS_ADDRESS,
                    serving = %l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                    "another process serves on the default endpoints address: /metrics, /healthz and /readyz are on a free port (set --metrics-bind-address to choose one)"
                );
                l
            }
            Err(e) => return Err(e).with_context(|| format!("binding {METRICS_ADDRESS}")),
        }
    } else {
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("--metrics-bind-address {addr:?}"))?;
        tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?
    };
    let state = Arc::new((registry, readiness));
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<Arc<(Registry, Readiness)>>| async move {
                let mut out = String::new();
                let _ = prometheus_client::encoding::text::encode(&mut out, &s.0);
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    out,
                )
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<Arc<(Registry, Readiness)>>| async move {
                let pending = s.1.pending();
                if pending.is_empty() {
                    (StatusCode::OK, "ok".to_string())
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not ready: {}", pending.join(", ")),
                    )
                }
            }),
        )
        .with_state(state);
    let addr = listener
        .local_addr()
        .map_or_else(|_| addr.to_string(), |a| a.to_string());
    tracing::info!(address = %addr, "serving /metrics, /healthz and /readyz");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.wait().await })
            .await
        {
            tracing::error!(error = %e, "metrics server failed");
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two binaries on one machine with the default address both serve their endpoints
    /// (the second on a free port); an address given explicitly that is taken is an error.
    #[tokio::test]
    async fn the_default_endpoints_address_makes_room_and_an_explicit_one_does_not() {
        let shutdown = Shutdown::on(std::future::pending());
        for _ in 0..2 {
            serve_endpoints(
                AUTO_METRICS_ADDRESS,
                Registry::default(),
                Readiness::default(),
                shutdown.clone(),
            )
            .await
            .unwrap();
        }
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = serve_endpoints(
            &taken.local_addr().unwrap().to_string(),
            Registry::default(),
            Readiness::default(),
            shutdown,
        )
        .await
        .unwrap_err();
        assert!(err.to_string().starts_with("binding 127.0.0.1:"), "{err}");
    }

    #[test]
    fn readiness_counts_term_checks_only_while_leading() {
        let r = Readiness::default();
        let cert = r.process_check("webhook certificate");
        let caches = r.term_check("caches");
        assert_eq!(r.pending(), ["webhook certificate"]);
        cert.set();
        assert!(r.pending().is_empty(), "a standby is ready");
        r.start_term();
        assert_eq!(r.pending(), ["caches"]);
        caches.set();
        assert!(r.pending().is_empty());
        r.end_term();
        r.start_term();
        assert_eq!(r.pending(), ["caches"], "a new term starts unsynced");
    }

    #[test]
    fn flags_have_the_same_names_and_durations_everywhere() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            options: Options,
        }
        let cli = Cli::try_parse_from([
            "x",
            "--leader-elect=true",
            "--leader-elect-lease-duration=1m 30s",
            "--log-format=text",
        ])
        .unwrap();
        assert!(cli.options.leader_elect);
        assert_eq!(
            cli.options.leader_elect_lease_duration,
            Duration::from_secs(90)
        );
        assert_eq!(cli.options.log_format, LogFormat::Text);
        assert!(Cli::try_parse_from(["x", "--leader-elect-lease-duration=soon"]).is_err());
        assert!(Cli::try_parse_from(["x", "--leader-elect-lease-duration=0s"]).is_err());
        let lease = cli.options.lease("dynamo-provider");
        assert_eq!(lease.name, "dynamo-provider");
        assert!(lease.validate().is_ok());
    }
}
