//! The agent's Prometheus metrics (text exposition format, prometheus-client):
//!
//! - `kubeairunway_kernel_cache_downloads_total{status="success|failure"}`: staging
//!   attempts (pull, digest verification and extraction);
//! - `kubeairunway_kernel_cache_download_duration_seconds`: how long a successful or
//!   failed staging took;
//! - `kubeairunway_kernel_cache_download_bytes_total`: bytes of cache content extracted;
//! - `kubeairunway_kernel_cache_compatibility_checks_total{result="compatible|incompatible"}`:
//!   per-GPU compatibility decisions, once per cache digest;
//! - `kubeairunway_kernel_cache_size_bytes{namespace,name,node}`: bytes on disk of each
//!   Ready cache;
//! - `kubeairunway_kernel_cache_node_gpus{node}`: GPUs detected;
//! - `kubeairunway_model_cache_downloads_total{status="success|failure",reason}`: model
//!   cache downloads ended (the reason of a failure: `GatedRepo`, `NoSpace`, ...);
//! - `kubeairunway_model_cache_download_bytes_total`: bytes received from the hub.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// The agent's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    node: String,
    downloads: Family<Labels, Counter>,
    duration: Histogram,
    bytes: Counter,
    compatibility: Family<Labels, Counter>,
    size: Family<Labels, Gauge>,
    gpus: Family<Labels, Gauge>,
    model_downloads: Family<Labels, Counter>,
    model_bytes: Counter,
}

impl Metrics {
    /// Create and register every metric, for node `node`.
    pub fn new(node: &str) -> Self {
        let mut registry = Registry::default();
        let downloads = Family::<Labels, Counter>::default();
        // 50 ms to about 7 hours.
        let duration = Histogram::new(exponential_buckets(0.05, 2.0, 20));
        let bytes = Counter::default();
        let compatibility = Family::<Labels, Counter>::default();
        let size = Family::<Labels, Gauge>::default();
        let gpus = Family::<Labels, Gauge>::default();
        let model_downloads = Family::<Labels, Counter>::default();
        let model_bytes = Counter::default();
        register_models(&mut registry, &model_downloads, &model_bytes);
        register_all(
            &mut registry,
            &downloads,
            &duration,
            &bytes,
            &compatibility,
            &size,
            &gpus,
        );
        Self {
            registry,
            node: node.to_string(),
            downloads,
            duration,
            bytes,
            compatibility,
            size,
            gpus,
            model_downloads,
            model_bytes,
        }
    }

    /// A model-cache download ended: the bytes received, or the failure's reason.
    pub fn model_download(&self, result: Result<u64, &str>) {
        let labels = match result {
            Ok(bytes) => {
                self.model_bytes.inc_by(bytes);
                vec![("status", "success".to_string()), ("reason", String::new())]
            }
            Err(reason) => vec![
                ("status", "failure".to_string()),
                ("reason", reason.to_string()),
            ],
        };
        self.model_downloads.get_or_create(&labels).inc();
    }

    /// A staging attempt ended.
    pub fn download(&self, success: bool, took: Duration, bytes: u64) {
        let status = if success { "success" } else { "failure" };
        self.downloads
            .get_or_create(&vec![("status", status.to_string())])
            .inc();
        self.duration.observe(took.as_secs_f64());
        self.bytes.inc_by(bytes);
    }

    /// Staging attempts so far with `status` (`success`, `failure`).
    pub fn downloads(&self, status: &str) -> u64 {
        self.downloads
            .get_or_create(&vec![("status", status.to_string())])
            .get()
    }

    /// A compatibility decision.
    pub fn compatibility_check(&self, compatible: bool) {
        let result = if compatible {
            "compatible"
        } else {
            "incompatible"
        };
        self.compatibility
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    /// The Ready caches and their sizes, replacing the previous set.
    pub fn cache_sizes(&self, sizes: &[(String, String, u64)]) {
        self.size.clear();
        for (namespace, name, bytes) in sizes {
            self.size
                .get_or_create(&vec![
                    ("namespace", namespace.clone()),
                    ("name", name.clone()),
                    ("node", self.node.clone()),
                ])
                .set(i64::try_from(*bytes).unwrap_or(i64::MAX));
        }
    }

    /// GPUs detected.
    pub fn gpus(&self, count: usize) {
        self.gpus
            .get_or_create(&vec![("node", self.node.clone())])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// The text exposition of these metrics alone.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// Register these metrics in the process's registry too (served on `/metrics`).
    pub fn register(&self, registry: &mut Registry) {
        register_models(registry, &self.model_downloads, &self.model_bytes);
        register_all(
            registry,
            &self.downloads,
            &self.duration,
            &self.bytes,
            &self.compatibility,
            &self.size,
            &self.gpus,
        );
    }
}

fn register_models(registry: &mut Registry, downloads: &Family<Labels, Counter>, bytes: &Counter) {
    registry.register(
        "kubeairunway_model_cache_downloads",
        "Model cache downloads ended, by status and failure reason",
        downloads.clone(),
    );
    registry.register(
        "kubeairunway_model_cache_download_bytes",
        "Bytes of model files received from the hub",
        bytes.clone(),
    );
}

fn register_all(
    registry: &mut Registry,
    downloads: &Family<Labels, Counter>,
    duration: &Histogram,
    bytes: &Counter,
    compatibility: &Family<Labels, Counter>,
    size: &Family<Labels, Gauge>,
    gpus: &Family<Labels, Gauge>,
) {
    // prometheus-client appends `_total` to counters.
    registry.register(
        "kubeairunway_kernel_cache_downloads",
        "Kernel cache staging attempts (pull, digest verification, extraction) by status",
        downloads.clone(),
    );
    registry.register(
        "kubeairunway_kernel_cache_download_duration_seconds",
        "Time to pull, verify and extract one kernel cache",
        duration.clone(),
    );
    registry.register(
        "kubeairunway_kernel_cache_download_bytes",
        "Bytes of kernel cache content extracted",
        bytes.clone(),
    );
    registry.register(
        "kubeairunway_kernel_cache_compatibility_checks",
        "GPU compatibility decisions per cache digest by result",
        compatibility.clone(),
    );
    registry.register(
        "kubeairunway_kernel_cache_size_bytes",
        "Bytes on disk of each ready kernel cache",
        size.clone(),
    );
    registry.register(
        "kubeairunway_kernel_cache_node_gpus",
        "GPUs detected on the node",
        gpus.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_with_their_labels() {
        let m = Metrics::new("gpu-1");
        m.download(true, Duration::from_millis(300), 1234);
        m.download(false, Duration::from_secs(2), 0);
        m.compatibility_check(true);
        m.cache_sizes(&[("ml".into(), "vadd".into(), 4096)]);
        m.gpus(8);
        m.model_download(Ok(99));
        m.model_download(Err("GatedRepo"));
        let text = m.encode();
        for line in [
            "kubeairunway_kernel_cache_downloads_total{status=\"success\"} 1",
            "kubeairunway_kernel_cache_downloads_total{status=\"failure\"} 1",
            "kubeairunway_kernel_cache_download_duration_seconds_count 2",
            "kubeairunway_kernel_cache_download_bytes_total 1234",
            "kubeairunway_kernel_cache_compatibility_checks_total{result=\"compatible\"} 1",
            "kubeairunway_kernel_cache_size_bytes{namespace=\"ml\",name=\"vadd\",node=\"gpu-1\"} 4096",
            "kubeairunway_kernel_cache_node_gpus{node=\"gpu-1\"} 8",
            "kubeairunway_model_cache_downloads_total{status=\"success\",reason=\"\"} 1",
            "kubeairunway_model_cache_downloads_total{status=\"failure\",reason=\"GatedRepo\"} 1",
            "kubeairunway_model_cache_download_bytes_total 99",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert_eq!(m.downloads("success"), 1);
        m.cache_sizes(&[]);
        assert!(!m.encode().contains("name=\"vadd\""));
    }
}
