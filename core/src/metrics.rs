//! core's Prometheus metrics (the names docs/core.md lists), in the text exposition format
//! (prometheus-client).
//!
//! Counters and the duration histogram are updated by the reconciler. The gauges that
//! describe the current ModelDeployments (`kubeairunway_modeldeployment_total`,
//! `kubeairunway_provider_selection`, and the per-deployment `kubeairunway_deployment_*`
//! named by object) are computed from the controller's cache at scrape time, so
//! deleted objects disappear from them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::compact::Compact;
use kubeairunway_sdk::selection::EXPLICIT_REASON;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// The controller's metrics: counters and durations updated by the reconciler, and the
/// gauges computed from its cache on each scrape ([`CacheGauges`]).
#[derive(Debug)]
pub struct Metrics {
    reconcile_duration: Family<Labels, Histogram, fn() -> Histogram>,
    reconcile_errors: Family<Labels, Counter>,
    gauges: Arc<CacheGauges>,
}

/// The gauges that describe the current ModelDeployments, computed from the controller's
/// cache at scrape time (a [`Collector`]), so deleted objects disappear from them.
#[derive(Debug, Default)]
pub struct CacheGauges {
    store: RwLock<Option<Store<Compact<ModelDeployment>>>>,
}

impl Metrics {
    /// Create every metric and register it in `registry` (the process's).
    pub fn new(registry: &mut Registry) -> Self {
        let reconcile_duration =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
                kubeairunway_sdk::reconciles::reconciliation_duration_histogram,
            );
        let reconcile_errors = Family::<Labels, Counter>::default();
        registry.register(
            kubeairunway_sdk::reconciles::RECONCILIATION_DURATION,
            "Time to reconcile one ModelDeployment, by selected provider",
            reconcile_duration.clone(),
        );
        // prometheus-client appends `_total` to counters.
        registry.register(
            "kubeairunway_reconciliation_errors",
            "Failed reconciliations by provider and error type",
            reconcile_errors.clone(),
        );
        let gauges = Arc::new(CacheGauges::default());
        registry.register_collector(Box::new(gauges.clone()));
        Self {
            reconcile_duration,
            reconcile_errors,
            gauges,
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
    pub fn set_store(&self, store: Option<Store<Compact<ModelDeployment>>>) {
        if let Ok(mut s) = self.gauges.store.write() {
            *s = store;
        }
    }
}

/// The gauge families for `mds`.
struct Gauges {
    modeldeployments: Family<Labels, Gauge>,
    provider_selection: Family<Labels, Gauge>,
    deployment_replicas: Family<Labels, Gauge>,
    deployment_phase: Family<Labels, Gauge>,
}

/// Each ModelDeployment's status is read from its cached text alone (the spec is not
/// parsed): a scrape reads every ModelDeployment of the cluster.
fn gauges(mds: &[Arc<Compact<ModelDeployment>>]) -> Gauges {
    let g = Gauges {
        modeldeployments: Family::default(),
        provider_selection: Family::default(),
        deployment_replicas: Family::default(),
        deployment_phase: Family::default(),
    };
    let mut by_phase: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut by_provider: BTreeMap<(String, String), i64> = BTreeMap::new();
    for md in mds {
        let ns = md.namespace().unwrap_or_default();
        let status = md.status().unwrap_or_default();
        let phase = status.phase.map_or("Unknown", |p| p.as_str()).to_string();
        *by_phase.entry((ns.clone(), phase.clone())).or_default() += 1;
        if let Some(p) = md.selected_provider() {
            let reason = status
                .provider
                .as_ref()
                .and_then(|p| p.selected_reason.as_deref())
                .map_or("custom", |r| {
                    if r == EXPLICIT_REASON {
                        "explicit"
                    } else if r.starts_with("matched capabilities") {
                        "auto"
                    } else {
                        "custom"
                    }
                });
            *by_provider.entry((p, reason.to_string())).or_default() += 1;
        }
        let name = md.name_any();
        g.deployment_phase
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
                    g.deployment_replicas
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
    for ((ns, phase), n) in by_phase {
        g.modeldeployments
            .get_or_create(&vec![("namespace", ns), ("phase", phase)])
            .set(n);
    }
    for ((provider, reason), n) in by_provider {
        g.provider_selection
            .get_or_create(&vec![("provider", provider), ("reason", reason)])
            .set(n);
    }
    g
}

impl Collector for CacheGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let store = self.store.read().ok().and_then(|s| s.clone());
        let mds = store.map(|s| s.state()).unwrap_or_default();
        let g = gauges(&mds);
        for (name, help, family) in [
            (
                "kubeairunway_modeldeployment_total",
                "ModelDeployments by namespace and phase",
                &g.modeldeployments,
            ),
            (
                "kubeairunway_provider_selection",
                "ModelDeployments by selected provider and how it was selected (auto, explicit, custom)",
                &g.provider_selection,
            ),
            (
                "kubeairunway_deployment_replicas",
                "Replicas of each ModelDeployment by state (desired, ready, available)",
                &g.deployment_replicas,
            ),
            (
                "kubeairunway_deployment_phase",
                "Phase of each ModelDeployment (1 for the current phase)",
                &g.deployment_phase,
            ),
        ] {
            family.encode(encoder.encode_descriptor(name, help, None, family.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::ModelDeployment;

    #[test]
    fn exposes_every_documented_metric_name() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        m.observe_reconcile("none", 0.01);
        m.count_error("none", "apply");
        let mut md: ModelDeployment =
            ModelDeployment::new("a", kubeairunway_sdk::ModelDeploymentSpec::default());
        md.metadata.namespace = Some("ns".into());
        md.status = Some(serde_json::from_value(serde_json::json!({
            "phase": "Running", "provider": {"name": "p", "selectedReason": "explicit provider selection"},
            "replicas": {"desired": 2, "ready": 1}
        })).unwrap());
        let (store, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(
            Compact::new(md).unwrap(),
        ));
        m.set_store(Some(store));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
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
