//! Prometheus metrics of 004 §9, in the text exposition format (prometheus-client).
//!
//! Counters and the duration histogram are updated by the reconciler. The gauges that
//! describe the current ModelDeployments (`kubeairunway_modeldeployment_total`,
//! `kubeairunway_provider_selection`, and the per-deployment `kubeairunway_deployment_*`
//! that §9 names by object) are computed from the controller's cache at scrape time, so
//! deleted objects disappear from them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use kubeairunway_sdk::ModelDeployment;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The controller's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    modeldeployments: Family<Labels, Gauge>,
    reconcile_duration: Family<Labels, Histogram, fn() -> Histogram>,
    reconcile_errors: Family<Labels, Counter>,
    provider_selection: Family<Labels, Gauge>,
    deployment_replicas: Family<Labels, Gauge>,
    deployment_phase: Family<Labels, Gauge>,
    store: RwLock<Option<Store<ModelDeployment>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Create and register every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let modeldeployments = Family::<Labels, Gauge>::default();
        let reconcile_duration =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
                duration_histogram,
            );
        let reconcile_errors = Family::<Labels, Counter>::default();
        let provider_selection = Family::<Labels, Gauge>::default();
        let deployment_replicas = Family::<Labels, Gauge>::default();
        let deployment_phase = Family::<Labels, Gauge>::default();
        registry.register(
            "kubeairunway_modeldeployment_total",
            "ModelDeployments by namespace and phase",
            modeldeployments.clone(),
        );
        registry.register(
            "kubeairunway_reconciliation_duration_seconds",
            "Time to reconcile one ModelDeployment, by selected provider",
            reconcile_duration.clone(),
        );
        // prometheus-client appends `_total` to counters.
        registry.register(
            "kubeairunway_reconciliation_errors",
            "Failed reconciliations by provider and error type",
            reconcile_errors.clone(),
        );
        registry.register(
            "kubeairunway_provider_selection",
            "ModelDeployments by selected provider and how it was selected (auto, explicit, custom)",
            provider_selection.clone(),
        );
        registry.register(
            "kubeairunway_deployment_replicas",
            "Replicas of each ModelDeployment by state (desired, ready, available)",
            deployment_replicas.clone(),
        );
        registry.register(
            "kubeairunway_deployment_phase",
            "Phase of each ModelDeployment (1 for the current phase)",
            deployment_phase.clone(),
        );
        Self {
            registry,
            modeldeployments,
            reconcile_duration,
            reconcile_errors,
            provider_selection,
            deployment_replicas,
            deployment_phase,
            store: RwLock::new(None),
        }
    }

    /// Record one reconciliation's duration.
    pub fn observe_reconcile(&self, provider: &str, seconds: f64) {
        self.reconcile_duration
            .get_or_create(&vec![("provider", provider.to_string())])
            .observe(seconds);
    }

    /// Count one failed reconciliation.
    pub fn count_error(&self, provider: &str, error_type: &str) {
        self.reconcile_errors
            .get_or_create(&vec![
                ("provider", provider.to_string()),
                ("error_type", error_type.to_string()),
            ])
            .inc();
    }

    /// Use this cache for the scrape-time gauges (set by the leader's controller).
    pub fn set_store(&self, store: Option<Store<ModelDeployment>>) {
        if let Ok(mut s) = self.store.write() {
            *s = store;
        }
    }

    /// Recompute the gauges from ModelDeployments.
    pub fn refresh(&self, mds: &[Arc<ModelDeployment>]) {
        let mut by_phase: BTreeMap<(String, String), i64> = BTreeMap::new();
        let mut by_provider: BTreeMap<(String, String), i64> = BTreeMap::new();
        self.deployment_replicas.clear();
        self.deployment_phase.clear();
        for md in mds {
            let ns = md.namespace().unwrap_or_default();
            let status = md.status.clone().unwrap_or_default();
            let phase = status.phase.map_or("Unknown", |p| p.as_str()).to_string();
            *by_phase.entry((ns.clone(), phase.clone())).or_default() += 1;
            if let Some(p) = md.selected_provider() {
                let reason = status
                    .provider
                    .as_ref()
                    .and_then(|p| p.selected_reason.as_deref())
                    .map_or("custom", |r| {
                        if r == crate::reconciler::EXPLICIT_REASON {
                            "explicit"
                        } else if r.starts_with("matched capabilities") {
                            "auto"
                        } else {
                            "custom"
                        }
                    });
                *by_provider
                    .entry((p.to_string(), reason.to_string()))
                    .or_default() += 1;
            }
            let name = md.name_any();
            self.deployment_phase
                .get_or_create(&vec![
                    ("name", name.clone()),
                    ("namespace", ns.clone()),
                    ("phase", phase),
                ])
                .set(1);
            if let Some(r) = status.replicas {
                for (state, v) in [
                    ("desired", r.desired),
                    ("ready", r.ready),
                    ("available", r.available),
                ] {
                    if let Some(v) = v {
                        self.deployment_replicas
                            .get_or_create(&vec![
                                ("name", name.clone()),
                                ("namespace", ns.clone()),
                                ("state", state.to_string()),
                            ])
                            .set(i64::from(v));
                    }
                }
            }
        }
        self.modeldeployments.clear();
        for ((ns, phase), n) in by_phase {
            self.modeldeployments
                .get_or_create(&vec![("namespace", ns), ("phase", phase)])
                .set(n);
        }
        self.provider_selection.clear();
        for ((provider, reason), n) in by_provider {
            self.provider_selection
                .get_or_create(&vec![("provider", provider), ("reason", reason)])
                .set(n);
        }
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let store = self.store.read().ok().and_then(|s| s.clone());
        if let Some(store) = store {
            self.refresh(&store.state());
        }
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_the_names_of_004_section_9() {
        let m = Metrics::new();
        m.observe_reconcile("none", 0.01);
        m.count_error("none", "apply");
        let mut md: ModelDeployment =
            ModelDeployment::new("a", kubeairunway_sdk::ModelDeploymentSpec::default());
        md.metadata.namespace = Some("ns".into());
        md.status = Some(serde_json::from_value(serde_json::json!({
            "phase": "Running", "provider": {"name": "p", "selectedReason": "explicit provider selection"},
            "replicas": {"desired": 2, "ready": 1}
        })).unwrap());
        m.refresh(&[Arc::new(md)]);
        let text = m.encode();
        for want in [
            "kubeairunway_modeldeployment_total{namespace=\"ns\",phase=\"Running\"} 1",
            "kubeairunway_reconciliation_duration_seconds_count{provider=\"none\"} 1",
            "kubeairunway_reconciliation_errors_total{provider=\"none\",error_type=\"apply\"} 1",
            "kubeairunway_provider_selection{provider=\"p\",reason=\"explicit\"} 1",
            "kubeairunway_deployment_replicas{name=\"a\",namespace=\"ns\",state=\"ready\"} 1",
            "kubeairunway_deployment_phase{name=\"a\",namespace=\"ns\",phase=\"Running\"} 1",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }
}
