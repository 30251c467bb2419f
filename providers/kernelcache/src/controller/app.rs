//! The `kernelcache-controller` process: its flags and metrics, and the controllers on the
//! SDK's process runtime (logging, endpoints, leader election).
//!
//! Metrics:
//! - `kubeairunway_kernel_cache_verifications_total{mode,result="verified|refused"}`;
//! - `kubeairunway_kernel_cache_resolutions_total{result="success|failure"}`;
//! - `kubeairunway_kernel_cache_reconcile_errors_total`;
//! - `kubeairunway_reconciliation_duration_seconds{provider="kernelcache",kind}`
//!   ([`crate::reconciles`]): of a `KernelCache`, a `ModelDeployment` (its
//!   `KernelCacheReady` condition) or a `Node` (its ready labels).

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use kubeairunway_sdk::process::Runtime;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tracing::info;

use super::Settings;
use crate::agent::secrets::KubeSecrets;
use crate::api::VerificationMode;
use crate::reconciles::{Durations, Timing};

type Labels = Vec<(&'static str, String)>;

/// The controller's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    verifications: Family<Labels, Counter>,
    resolutions: Family<Labels, Counter>,
    errors: Counter,
    durations: Durations,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let metrics = Self {
            registry: Registry::default(),
            verifications: Family::default(),
            resolutions: Family::default(),
            errors: Counter::default(),
            durations: Durations::default(),
        };
        metrics.register(&mut registry);
        Self {
            registry,
            ..metrics
        }
    }
}

impl Metrics {
    /// One verification.
    pub fn verification(&self, mode: VerificationMode, verified: bool) {
        let mode = format!("{mode:?}").to_lowercase();
        let result = if verified { "verified" } else { "refused" };
        self.verifications
            .get_or_create(&vec![("mode", mode), ("result", result.into())])
            .inc();
    }

    /// One tag resolution.
    pub fn resolution(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.resolutions
            .get_or_create(&vec![("result", result.into())])
            .inc();
    }

    /// One failed reconciliation.
    pub fn reconcile_error(&self) {
        self.errors.inc();
    }

    /// Time a reconciliation of an object of `kind` until the returned guard is dropped.
    pub fn reconciling(&self, kind: &'static str) -> Timing<'_> {
        self.durations.reconciling(kind)
    }
}

impl Metrics {
    /// Register these metrics in the process's registry too (served on `/metrics`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubeairunway_kernel_cache_verifications",
            "Signature verifications of pinned cache images, by policy mode and result",
            self.verifications.clone(),
        );
        registry.register(
            "kubeairunway_kernel_cache_resolutions",
            "Tag to digest resolutions, by result",
            self.resolutions.clone(),
        );
        registry.register(
            "kubeairunway_kernel_cache_reconcile_errors",
            "KernelCache reconciliations that failed and are retried",
            self.errors.clone(),
        );
        self.durations.register(registry);
    }

    /// The text exposition of these metrics alone.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Flags of `kernelcache-controller` (each also from an environment variable).
#[derive(Clone, Debug, Parser)]
#[command(
    name = "kernelcache-controller",
    version,
    about = "kubeairunway kernel-cache controller: pins and verifies cache images, aggregates node status"
)]
pub struct Cli {
    /// The cluster-scoped KernelCachePolicy to verify with.
    #[arg(long, env = "POLICY", default_value = "default")]
    pub policy: String,
    /// A registry spoken to over plain HTTP (repeatable; air-gapped mirrors, tests).
    #[arg(
        long = "plain-http-registry",
        env = "PLAIN_HTTP_REGISTRIES",
        value_delimiter = ','
    )]
    pub plain_http_registries: Vec<String>,
    /// The namespace where registry credentials are handed over to the node agents (the
    /// agents read Secrets there only).
    #[arg(long, env = "CREDENTIALS_NAMESPACE")]
    pub credentials_namespace: Option<String>,
    /// How often each cache is looked at without a change (tag moves, heartbeat).
    #[arg(long, env = "RESYNC", default_value = "5m", value_parser = kubeairunway_sdk::process::parse_duration)]
    pub resync: Duration,
    /// Flags every binary shares: metrics address, log format, leader election.
    #[command(flatten)]
    pub process: kubeairunway_sdk::process::Options,
}

/// The component's name: its Lease, its events' reporter.
pub const COMPONENT: &str = "kernelcache-controller";

impl Cli {
    /// The controller's settings.
    pub fn settings(&self) -> Settings {
        Settings {
            policy: self.policy.clone(),
            plain_http: self.plain_http_registries.clone(),
            resync: self.resync,
            instance: Some(self.process.identity(COMPONENT)),
            credentials_namespace: self.credentials_namespace.clone(),
        }
    }
}

/// The whole `main` of `kernelcache-controller`: the process runtime (flags, logging,
/// endpoints, leader election) around [`run`].
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = Runtime::start(COMPONENT, cli.process.clone()).await?;
    run(cli, rt).await
}

/// Run the controller in `rt` (its metrics, readiness and leader terms) as `cli` says:
/// the binary's `main` and `kubeairunway up` both run it this way.
pub async fn run(cli: Cli, mut rt: Runtime) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    metrics.register(rt.registry());
    let client = rt.client();
    let secrets = Arc::new(KubeSecrets(client.clone()));
    let settings = cli.settings();
    // Ready while leading once the leader's watch caches are filled (cleared each term).
    let synced = rt.readiness().term_check("kernel-cache watch caches");
    rt.run(|term| {
        info!("leading: starting the controllers");
        super::run(
            client.clone(),
            settings.clone(),
            secrets.clone(),
            metrics.clone(),
            synced.clone(),
            async move {
                term.ended().await;
            },
        )
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_metrics() {
        let cli = Cli::try_parse_from([
            "kernelcache-controller",
            "--plain-http-registry=127.0.0.1:5000",
            "--resync=30s",
        ])
        .unwrap();
        let s = cli.settings();
        assert_eq!(s.policy, "default");
        assert_eq!(s.plain_http, ["127.0.0.1:5000"]);
        assert_eq!(s.resync, Duration::from_secs(30));
        let m = Metrics::default();
        m.verification(VerificationMode::Key, true);
        m.verification(VerificationMode::Key, false);
        m.resolution(true);
        drop(m.reconciling("ModelDeployment"));
        let text = m.encode();
        assert!(
            text.contains(
                r#"kubeairunway_kernel_cache_verifications_total{mode="key",result="verified"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"kubeairunway_kernel_cache_resolutions_total{result="success"} 1"#)
        );
        assert!(
            text.contains(
                r#"kubeairunway_reconciliation_duration_seconds_count{provider="kernelcache",kind="ModelDeployment"} 1"#
            ),
            "{text}"
        );
    }
}
