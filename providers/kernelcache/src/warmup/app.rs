//! The `kernelcache-warmup` process: its flags and metrics, the controllers on the SDK's
//! process runtime (logging, `/metrics` `/healthz` `/readyz`, leader election).
//!
//! Metrics:
//! - `kubeairunway_warmup_duration_seconds{result="completed|failed"}`: from start to
//!   finish of each Warmup;
//! - `kubeairunway_warmup_nodes_total{outcome="succeeded|failed|retried"}`: node
//!   outcomes (`retried`: an attempt failed and the node is tried again);
//! - `kubeairunway_warmup_pods_created_total`;
//! - `kubeairunway_warmup_reconcile_errors_total`;
//! - `kubeairunway_reconciliation_duration_seconds{provider="kernelcache",kind="Warmup"}`
//!   ([`crate::reconciles`]).

use std::sync::Arc;

use clap::Parser;
use kubeairunway_sdk::process::Runtime;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tracing::info;

use super::Settings;
use super::api::WarmupPhase;
use crate::reconciles::{Durations, Timing};

type Labels = Vec<(&'static str, String)>;

/// Buckets of the warmup duration: 5 s to 4 h.
const DURATION_BUCKETS: [f64; 12] = [
    5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0,
];

/// The warmup controller's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    durations: Family<Labels, Histogram>,
    nodes: Family<Labels, Counter>,
    pods: Counter,
    errors: Counter,
    reconciles: Durations,
}

fn histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Self {
            registry: Registry::default(),
            durations: Family::new_with_constructor(histogram as fn() -> Histogram),
            nodes: Family::default(),
            pods: Counter::default(),
            errors: Counter::default(),
            reconciles: Durations::default(),
        };
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        Self {
            registry,
            ..metrics
        }
    }
}

impl Metrics {
    /// Register these metrics in the process's registry too (served on `/metrics`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubeairunway_warmup_duration_seconds",
            "Time from the start of a Warmup to its end, by result",
            self.durations.clone(),
        );
        registry.register(
            "kubeairunway_warmup_nodes",
            "Nodes warmed, failed for good, or retried after a failed attempt",
            self.nodes.clone(),
        );
        registry.register(
            "kubeairunway_warmup_pods_created",
            "Warmup pods created",
            self.pods.clone(),
        );
        registry.register(
            "kubeairunway_warmup_reconcile_errors",
            "Reconciliations that failed and are retried",
            self.errors.clone(),
        );
        self.reconciles.register(registry);
    }

    /// A Warmup finished after `seconds`.
    pub fn finished(&self, phase: WarmupPhase, seconds: f64) {
        let result = if phase == WarmupPhase::Completed {
            "completed"
        } else {
            "failed"
        };
        self.durations
            .get_or_create(&vec![("result", result.to_string())])
            .observe(seconds);
    }

    /// A node outcome: `succeeded`, `failed` or `retried`.
    pub fn node(&self, outcome: &str) {
        self.nodes
            .get_or_create(&vec![("outcome", outcome.to_string())])
            .inc();
    }

    /// A pod created.
    pub fn pod_created(&self) {
        self.pods.inc();
    }

    /// A failed reconciliation.
    pub fn reconcile_error(&self) {
        self.errors.inc();
    }

    /// Time a reconciliation of a Warmup until the returned guard is dropped.
    pub fn reconciling(&self) -> Timing<'_> {
        self.reconciles.reconciling("Warmup")
    }

    /// The text exposition of these metrics alone.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The component's name: its Lease, its events' reporter.
pub const COMPONENT: &str = "kernelcache-warmup";

/// Flags of `kernelcache-warmup` (each also from an environment variable).
#[derive(Clone, Debug, Parser)]
#[command(
    name = "kernelcache-warmup",
    version,
    about = "kubeairunway warmup controller: warms nodes (images, kernel caches, custom pods) before models run there"
)]
pub struct Cli {
    /// The image holding `/kernelcache-noop` (this provider's image): warmup pods copy the
    /// static no-op from it to run any image without a shell.
    #[arg(long, env = "TOOLS_IMAGE")]
    pub tools_image: String,
    /// Flags every binary shares: metrics address, log format, leader election.
    #[command(flatten)]
    pub process: kubeairunway_sdk::process::Options,
}

impl Cli {
    /// The controller's settings.
    pub fn settings(&self) -> Settings {
        Settings {
            tools_image: self.tools_image.clone(),
            instance: Some(self.process.identity(COMPONENT)),
        }
    }
}

/// Run the controllers on `rt` until the process stops: only while this replica leads;
/// ready once its caches are filled.
pub async fn run(cli: Cli, mut rt: Runtime, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    metrics.register(rt.registry());
    let client = rt.client();
    let settings = cli.settings();
    let readiness = rt.readiness();
    rt.run(move |term| {
        info!("leading: starting the warmup controller");
        let synced = readiness.term_check("caches");
        super::run(
            client.clone(),
            settings.clone(),
            metrics.clone(),
            synced,
            async move { term.ended().await },
        )
    })
    .await
}

/// The whole `main` of `kernelcache-warmup`.
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = Runtime::start(COMPONENT, cli.process.clone()).await?;
    run(cli, rt, Arc::new(Metrics::default())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_metrics() {
        assert!(
            Cli::try_parse_from(["kernelcache-warmup"]).is_err(),
            "the tools image is required"
        );
        let cli = Cli::try_parse_from([
            "kernelcache-warmup",
            "--tools-image=ghcr.io/x/kc:1",
            "--leader-elect=true",
        ])
        .unwrap();
        assert_eq!(cli.settings().tools_image, "ghcr.io/x/kc:1");
        assert!(cli.process.leader_elect);
        let m = Metrics::default();
        m.finished(WarmupPhase::Completed, 42.0);
        m.node("succeeded");
        m.node("succeeded");
        m.node("retried");
        m.pod_created();
        let text = m.encode();
        assert!(
            text.contains(r#"kubeairunway_warmup_duration_seconds_count{result="completed"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"kubeairunway_warmup_duration_seconds_bucket{le="60.0",result="completed"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"kubeairunway_warmup_nodes_total{outcome="succeeded"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kubeairunway_warmup_nodes_total{outcome="retried"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("kubeairunway_warmup_pods_created_total 1"),
            "{text}"
        );
    }
}
