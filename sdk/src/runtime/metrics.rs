//! Prometheus metrics of a provider, registered in the process's registry (served on
//! `/metrics` by [`crate::process`]).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::upstream::UpstreamState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    provider: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    provider: String,
    error_type: String,
}

/// The metrics of one provider runtime (no object names as label values).
#[derive(Debug)]
pub struct Metrics {
    provider: String,
    reconciliations: Family<OutcomeLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Family<ProviderLabel, Histogram>,
    upstream_ready: Family<ProviderLabel, Gauge>,
}

impl Metrics {
    /// Metrics labelled with `provider`, registered in `registry`.
    pub fn new(registry: &mut Registry, provider: &str) -> Self {
        let reconciliations = Family::<OutcomeLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration = Family::<ProviderLabel, Histogram>::new_with_constructor(
            crate::reconciles::reconciliation_duration_histogram,
        );
        let upstream_ready = Family::<ProviderLabel, Gauge>::default();
        registry.register(
            "kubeairunway_provider_reconciliations",
            "Reconciliations by outcome",
            reconciliations.clone(),
        );
        registry.register(
            "kubeairunway_reconciliation_errors",
            "Reconciliation errors by type",
            errors.clone(),
        );
        registry.register(
            crate::reconciles::RECONCILIATION_DURATION,
            "Time per reconciliation",
            duration.clone(),
        );
        registry.register(
            "kubeairunway_provider_upstream_ready",
            "1 when the upstream CRD is installed and supported",
            upstream_ready.clone(),
        );
        Self {
            provider: provider.to_string(),
            reconciliations,
            errors,
            duration,
            upstream_ready,
        }
    }

    /// Count one reconciliation and its duration.
    pub fn observe(&self, outcome: &str, took: Duration) {
        self.reconciliations
            .get_or_create(&OutcomeLabels {
                provider: self.provider.clone(),
                outcome: outcome.to_string(),
            })
            .inc();
        self.duration
            .get_or_create(&ProviderLabel {
                provider: self.provider.clone(),
            })
            .observe(took.as_secs_f64());
    }

    /// Count one error of `error_type` (`transient`, `terminal`, ...).
    pub fn error(&self, error_type: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                provider: self.provider.clone(),
                error_type: error_type.to_string(),
            })
            .inc();
    }

    fn set_upstream_ready(&self, ready: bool) {
        self.upstream_ready
            .get_or_create(&ProviderLabel {
                provider: self.provider.clone(),
            })
            .set(i64::from(ready));
    }
}

/// Keep the `upstream_ready` gauge in step with the detected upstream API.
pub(super) async fn follow_upstream(
    metrics: Arc<Metrics>,
    mut upstream: watch::Receiver<UpstreamState>,
) {
    loop {
        metrics.set_upstream_ready(matches!(&*upstream.borrow_and_update(), Some(Ok(_))));
        if upstream.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_labelled_by_provider_only() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry, "kaito");
        m.observe("applied", Duration::from_millis(3));
        m.error("transient");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains(r#"kubeairunway_provider_reconciliations_total{provider="kaito",outcome="applied"} 1"#), "{text}");
        assert!(text.contains(r#"kubeairunway_reconciliation_errors_total{provider="kaito",error_type="transient"} 1"#), "{text}");
        assert!(
            text.contains(
                "kubeairunway_reconciliation_duration_seconds_count{provider=\"kaito\"} 1"
            ),
            "{text}"
        );
    }
}
