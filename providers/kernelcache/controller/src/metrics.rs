//! The kernel-cache controller's metrics:
//! - `kubeairunway_kernel_cache_verifications_total{mode,result="verified|refused"}`;
//! - `kubeairunway_kernel_cache_resolutions_total{result="success|failure"}`;
//! - `kubeairunway_kernel_cache_reconcile_errors_total`;
//! - `kubeairunway_reconciliation_duration_seconds{provider="kernelcache",kind}`
//!   (`kubeairunway_sdk::reconciles`): of a `KernelCache`, a `ModelDeployment` (its
//!   `KernelCacheReady` condition) or a `Node` (its ready labels).

use kubeairunway_kernelcache_api::VerificationMode;
use kubeairunway_kernelcache_api::names::PROVIDER_NAME;
use kubeairunway_sdk::reconciles::{Durations, Timing};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

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
            durations: Durations::new(PROVIDER_NAME),
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
