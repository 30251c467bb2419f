//! Reconciliation durations, named and bucketed the same in every controller of the
//! platform (core's, the providers' runtime, the kernel-cache controllers'), so that one
//! dashboard reads them all: `kubeairunway_reconciliation_duration_seconds{provider,kind}`.

use std::time::Instant;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The name every controller of the platform gives its histogram of reconciliation
/// durations (core's, the providers' runtime, the kernel-cache controllers'), so that one
/// query reads them all.
pub const RECONCILIATION_DURATION: &str = "kubeairunway_reconciliation_duration_seconds";

/// A histogram of [`RECONCILIATION_DURATION`]: the same buckets everywhere (1 ms to about
/// 33 s), so that the controllers' histograms can be summed.
pub fn reconciliation_duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

type Labels = Vec<(&'static str, String)>;

/// Reconciliation durations of one provider's controllers (`provider`), by kind of object
/// reconciled (`kind`): one observation per reconciliation.
#[derive(Clone, Debug)]
pub struct Durations {
    provider: &'static str,
    family: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Durations {
    /// The durations of `provider`'s reconciliations.
    pub fn new(provider: &'static str) -> Self {
        Self {
            provider,
            family: Family::new_with_constructor(reconciliation_duration_histogram),
        }
    }

    /// Register them in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            RECONCILIATION_DURATION,
            "Time per reconciliation, by kind of object reconciled",
            self.family.clone(),
        );
    }

    /// Time a reconciliation of an object of `kind` until the returned guard is dropped.
    pub fn reconciling(&self, kind: &'static str) -> Timing<'_> {
        Timing {
            durations: self,
            kind,
            started: Instant::now(),
        }
    }
}

/// Times one reconciliation: its duration is recorded when this is dropped, however the
/// reconciliation ends (done, failed, or its future dropped at shutdown).
#[derive(Debug)]
#[must_use = "the reconciliation is timed until this is dropped"]
pub struct Timing<'a> {
    durations: &'a Durations,
    kind: &'static str,
    started: Instant,
}

impl Drop for Timing<'_> {
    fn drop(&mut self) {
        self.durations
            .family
            .get_or_create(&vec![
                ("provider", self.durations.provider.to_string()),
                ("kind", self.kind.to_string()),
            ])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reconciliation_is_one_observation_of_its_kind() {
        let durations = Durations::new("kernelcache");
        let mut registry = Registry::default();
        durations.register(&mut registry);
        drop(durations.reconciling("ModelDeployment"));
        drop(durations.reconciling("ModelDeployment"));
        drop(durations.reconciling("Node"));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for (kind, count) in [("ModelDeployment", 2), ("Node", 1)] {
            let line = format!(
                r#"kubeairunway_reconciliation_duration_seconds_count{{provider="kernelcache",kind="{kind}"}} {count}"#
            );
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        assert!(!text.contains(r#"kind="KernelCache""#), "{text}");
    }
}
