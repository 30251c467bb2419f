//! The Caches and Warmups pages: kernel caches, model caches, each node's caches and GPUs,
//! and warmups, as the user may list them. Rows are pure functions of the objects.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use kubeairunway_kernelcache_api::model::{ModelCache, ModelCacheState};
use kubeairunway_kernelcache_api::{CacheState, KernelCache, KernelCacheNode};
use kubeairunway_sdk::api::Warmup;
use serde::Serialize;
use serde_json::{Value, json};

/// The `Ready` condition as `status: reason: message`, `-` without one.
fn ready(conditions: &[Condition]) -> String {
    conditions.iter().find(|c| c.type_ == "Ready").map_or_else(
        || "-".into(),
        |c| format!("{}: {}: {}", c.status, c.reason, c.message),
    )
}

/// Bytes in GB with one decimal, in integer arithmetic.
fn bytes(n: Option<i64>) -> String {
    n.map_or_else(
        || "-".into(),
        |b| {
            let tenths = (b + 50_000_000) / 100_000_000;
            format!("{}.{} GB", tenths / 10, tenths % 10)
        },
    )
}

/// A kernel cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheRow {
    /// `namespace/name`.
    pub name: String,
    /// The image, pinned by digest once resolved.
    pub image: String,
    /// Nodes where it is ready.
    pub ready_nodes: i32,
    /// Verification, in a few words.
    pub verification: String,
    /// The Ready condition.
    pub ready: String,
}

/// The row of a kernel cache.
pub fn kernel_cache_row(c: &KernelCache) -> KernelCacheRow {
    let status = c.status.clone().unwrap_or_default();
    KernelCacheRow {
        name: format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()),
        image: status.pinned_image.unwrap_or_else(|| c.spec.image.clone()),
        ready_nodes: status.ready_nodes.unwrap_or(0),
        verification: status.verification.map_or_else(
            || "-".into(),
            |v| match (v.verified, v.signer) {
                (true, Some(signer)) => format!("verified ({signer})"),
                (true, None) => "verified".into(),
                (false, _) => v.message.unwrap_or_else(|| "not verified".into()),
            },
        ),
        ready: ready(&status.conditions),
    }
}

/// A model cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheRow {
    /// `namespace/name`.
    pub name: String,
    /// `source@revision`.
    pub source: String,
    /// The resolved commit, shortened.
    pub commit: String,
    /// Its size.
    pub size: String,
    /// `ready/downloading/failed` nodes.
    pub nodes: String,
    /// The Ready condition.
    pub ready: String,
}

/// The row of a model cache.
pub fn model_cache_row(c: &ModelCache) -> ModelCacheRow {
    let status = c.status.clone().unwrap_or_default();
    ModelCacheRow {
        name: format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()),
        source: format!("{}@{}", c.spec.source, c.spec.revision()),
        commit: status
            .resolved_commit
            .map_or_else(|| "-".into(), |s| s.chars().take(12).collect()),
        size: bytes(status.size_bytes),
        nodes: format!(
            "{}/{}/{}",
            status.ready_nodes, status.downloading_nodes, status.failed_nodes
        ),
        ready: ready(&status.conditions),
    }
}

/// A node's caches and GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    /// Node name.
    pub name: String,
    /// GPUs: count and model.
    pub gpus: String,
    /// Disk: used of the budget.
    pub disk: String,
    /// Kernel caches: ready of all.
    pub kernel_caches: String,
    /// Model caches: ready of all.
    pub model_caches: String,
}

/// The row of a node's status object.
pub fn node_row(n: &KernelCacheNode) -> NodeRow {
    let status = n.status.clone().unwrap_or_default();
    let model = status.gpus.first().and_then(|g| g.name.clone());
    NodeRow {
        name: n.name_any(),
        gpus: match model {
            Some(m) => format!("{} x {m}", status.gpu_count),
            None => status.gpu_count.to_string(),
        },
        disk: status.disk.map_or_else(
            || "-".into(),
            |d| format!("{} of {}", bytes(Some(d.used_bytes)), bytes(d.budget_bytes)),
        ),
        kernel_caches: format!(
            "{}/{}",
            status
                .caches
                .iter()
                .filter(|c| c.state == CacheState::Ready)
                .count(),
            status.caches.len()
        ),
        model_caches: format!(
            "{}/{}",
            status
                .model_caches
                .iter()
                .filter(|c| c.state == ModelCacheState::Ready)
                .count(),
            status.model_caches.len()
        ),
    }
}

/// A warmup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmupRow {
    /// `namespace/name`.
    pub name: String,
    /// Its phase.
    pub phase: String,
    /// `succeeded/desired` nodes.
    pub nodes: String,
    /// Failed nodes.
    pub failed: i32,
    /// What it targets.
    pub target: String,
}

/// The row of a warmup.
pub fn warmup_row(w: &Warmup) -> WarmupRow {
    let status = w.status.clone().unwrap_or_default();
    WarmupRow {
        name: format!("{}/{}", w.namespace().unwrap_or_default(), w.name_any()),
        phase: status
            .phase
            .map_or_else(|| "Pending".into(), |p| p.as_str().into()),
        nodes: format!("{}/{}", status.succeeded_nodes, status.desired_nodes),
        failed: status.failed_nodes,
        target: w
            .spec
            .target_model_deployment
            .as_ref()
            .map_or_else(|| "nodes".into(), |t| format!("ModelDeployment {}", t.name)),
    }
}

/// Every object of `K` the user may list, as rows; a kind this cluster does not serve, or
/// the user may not list, is a note instead.
async fn rows<K, R>(client: &Client, row: fn(&K) -> R) -> Value
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    R: Serialize,
{
    let api: Api<K> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => json!({ "rows": list.items.iter().map(row).collect::<Vec<_>>() }),
        Err(kube::Error::Api(s)) => json!({ "rows": [], "note": s.message }),
        Err(e) => json!({ "rows": [], "note": e.to_string() }),
    }
}

/// Everything the Caches page shows.
pub async fn overview(client: &Client) -> Value {
    let (kernel, model, nodes, warmups) = tokio::join!(
        rows(client, kernel_cache_row),
        rows(client, model_cache_row),
        rows(client, node_row),
        rows(client, warmup_row),
    );
    json!({ "kernelCaches": kernel, "modelCaches": model, "nodes": nodes, "warmups": warmups })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_each_status() {
        let m: ModelCache = serde_json::from_value(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "qwen", "namespace": "ml"},
            "spec": {"source": "hf://Qwen/Qwen3-0.6B"},
            "status": {"resolvedCommit": "0123456789abcdef0123", "sizeBytes": 1_500_000_000_i64,
                "readyNodes": 2, "downloadingNodes": 1, "failedNodes": 0,
                "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "2 nodes",
                    "lastTransitionTime": "2026-11-27T00:00:00Z"}]}}))
        .unwrap();
        let r = model_cache_row(&m);
        assert_eq!(
            (
                r.name.as_str(),
                r.source.as_str(),
                r.commit.as_str(),
                r.size.as_str(),
                r.nodes.as_str(),
                r.ready.as_str()
            ),
            (
                "ml/qwen",
                "hf://Qwen/Qwen3-0.6B@main",
                "0123456789ab",
                "1.5 GB",
                "2/1/0",
                "True: Ready: 2 nodes"
            )
        );
        let n: KernelCacheNode = serde_json::from_value(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode",
            "metadata": {"name": "gpu-1"}, "spec": {"nodeName": "gpu-1"},
            "status": {"gpuCount": 2, "gpus": [{"index": 0, "name": "NVIDIA H100", "backend": "cuda", "arch": "sm_90", "warpSize": 32}],
                "caches": [{"namespace": "ml", "name": "k", "digest": "sha256:x", "state": "Ready"},
                           {"namespace": "ml", "name": "j", "digest": "sha256:y", "state": "Staging"}],
                "modelCaches": [{"namespace": "ml", "name": "qwen", "state": "Ready"}]}}))
        .unwrap();
        let r = node_row(&n);
        assert_eq!(
            (
                r.gpus.as_str(),
                r.kernel_caches.as_str(),
                r.model_caches.as_str(),
                r.disk.as_str()
            ),
            ("2 x NVIDIA H100", "1/2", "1/1", "-")
        );
    }
}
