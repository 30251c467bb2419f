//! Prometheus metrics of a provider, and the `/metrics`, `/healthz`, `/readyz` endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use super::UpstreamState;

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
    registry: Registry,
    reconciliations: Family<OutcomeLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Family<ProviderLabel, Histogram>,
    upstream_ready: Family<ProviderLabel, Gauge>,
}

impl Metrics {
    /// Metrics labelled with `provider`.
    pub fn new(provider: &str) -> Self {
        let mut registry = Registry::default();
        let reconciliations = Family::<OutcomeLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration = Family::<ProviderLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
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
            "kubeairunway_reconciliation_duration_seconds",
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
            registry,
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

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `addr` until the task is dropped.
pub(super) async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    mut upstream: watch::Receiver<UpstreamState>,
) {
    let m = metrics.clone();
    tokio::spawn(async move {
        loop {
            m.set_upstream_ready(matches!(&*upstream.borrow_and_update(), Some(Ok(_))));
            if upstream.changed().await.is_err() {
                return;
            }
        }
    });
    let app = Router::new()
        .route("/metrics", get(render))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .with_state(metrics);
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "metrics server stopped");
            }
        }
        Err(e) => tracing::warn!(%addr, error = %e, "cannot serve metrics"),
    }
}

async fn render(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_labelled_by_provider_only() {
        let m = Metrics::new("kaito");
        m.observe("applied", Duration::from_millis(3));
        m.error("transient");
        let text = m.encode();
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
