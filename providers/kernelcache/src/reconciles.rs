//! The reconciliation durations of the kernel-cache controllers, named and bucketed as the
//! providers' runtime and core have theirs
//! ([`kubeairunway_sdk::process::RECONCILIATION_DURATION`]), so that one dashboard reads
//! them all: `kubeairunway_reconciliation_duration_seconds{provider="kernelcache",kind}`,
//! one observation per reconciliation of an object of `kind`.

use std::time::Instant;

use kubeairunway_sdk::process::{RECONCILIATION_DURATION, reconciliation_duration_histogram};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::controller::PROVIDER_NAME;

type Labels = Vec<(&'static str, String)>;

/// Reconciliation durations, by kind of object reconciled.
#[derive(Clone, Debug)]
pub struct Durations(Family<Labels, Histogram, fn() -> Histogram>);

impl Default for Durations {
    fn default() -> Self {
        Self(Family::new_with_constructor(
            reconciliation_duration_histogram,
        ))
    }
}

impl Durations {
    /// Register them in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            RECONCILIATION_DURATION,
            "Time per reconciliation, by kind of object reconciled",
            self.0.clone(),
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
            .0
            .get_or_create(&vec![
                ("provider", PROVIDER_NAME.to_string()),
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
        let durations = Durations::default();
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
