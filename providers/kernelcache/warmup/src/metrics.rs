//! The warmup controller's metrics:
//! - `kubeairunway_warmup_duration_seconds{result="completed|failed"}`: from start to
//!   finish of each Warmup;
//! - `kubeairunway_warmup_nodes_total{outcome="succeeded|failed|retried"}`: node
//!   outcomes (`retried`: an attempt failed and the node is tried again);
//! - `kubeairunway_warmup_pods_created_total`;
//! - `kubeairunway_warmup_reconcile_errors_total`;
//! - `kubeairunway_reconciliation_duration_seconds{provider="kernelcache",kind="Warmup"}`
//!   (`kubeairunway_sdk::reconciles`).

use kubeairunway_kernelcache_api::names::PROVIDER_NAME;
use kubeairunway_sdk::api::WarmupPhase;
use kubeairunway_sdk::reconciles::{Durations, Timing};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

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
            reconciles: Durations::new(PROVIDER_NAME),
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
