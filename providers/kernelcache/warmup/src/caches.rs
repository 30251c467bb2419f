//! Whether a node has a KernelCache staged or a ModelCache downloaded, from the node
//! agent's report: pure.
//!
//! The agent stages every usable cache whose `nodeSelector` selects its node
//! (`kubeairunway_kernelcache_agent::plan`); a warmup only waits for its report on the cache's current
//! (pinned) digest. It cannot make an agent stage a cache the cache does not target, so
//! that and the agent's `Failed` and `Incompatible` states end the node's warmup as
//! failed, with the agent's words. A KernelCache that does not exist is waited for (it
//! may be created after the Warmup, or the watch cache may not have seen it yet);
//! `globalTimeoutSeconds` bounds the wait. ModelCaches ([`model_on_node`]) likewise: the
//! report on the cache's current generation counts.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use kubeairunway_kernelcache_api::model::{ModelCache, ModelCacheState};
use kubeairunway_kernelcache_api::{CacheState, KernelCache, KernelCacheNode, selects};
use kubeairunway_sdk::api::warmup::reasons;

/// A KernelCache on one node, as far as the warmup is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnNode {
    /// Staged for the pinned digest.
    Ready,
    /// Not yet; why.
    Waiting(String),
    /// Never will be: `(reason, message)`.
    Failed(&'static str, String),
}

/// The state of KernelCache `name` (`cache`, absent when there is none) on `node`, whose
/// agent reported `report`.
pub fn on_node(
    name: &str,
    cache: Option<&KernelCache>,
    node: &Node,
    report: Option<&KernelCacheNode>,
) -> OnNode {
    let Some(cache) = cache else {
        return OnNode::Waiting(format!("there is no KernelCache '{name}' (yet)"));
    };
    if !selects(cache.spec.node_selector.as_ref(), node.labels()) {
        return OnNode::Failed(
            reasons::KERNEL_CACHE_NOT_TARGETED,
            format!("KernelCache '{name}' does not select this node (its nodeSelector)"),
        );
    }
    let status = cache.status.clone().unwrap_or_default();
    let (Some(_), Some(digest)) = (status.usable_image(), status.resolved_digest.as_deref()) else {
        return OnNode::Waiting(format!(
            "KernelCache '{name}' is not pinned and verified yet"
        ));
    };
    let Some(report) = report.and_then(|r| r.status.as_ref()) else {
        return OnNode::Waiting(format!(
            "no report from the kernel-cache agent on this node yet (KernelCache '{name}')"
        ));
    };
    let namespace = cache.metadata.namespace.as_deref().unwrap_or_default();
    let entry = report
        .caches
        .iter()
        .find(|c| c.namespace == namespace && c.name == name && c.digest == digest);
    let Some(entry) = entry else {
        return OnNode::Waiting(format!(
            "the agent has not reported KernelCache '{name}' at {digest} yet"
        ));
    };
    let message = entry.message.clone().unwrap_or_default();
    match entry.state {
        CacheState::Ready => OnNode::Ready,
        CacheState::Pending | CacheState::Staging => OnNode::Waiting(format!(
            "KernelCache '{name}' is {:?} on this node",
            entry.state
        )),
        CacheState::Failed => OnNode::Failed(
            reasons::KERNEL_CACHE_FAILED,
            format!("staging KernelCache '{name}' failed: {message}"),
        ),
        CacheState::Evicted => OnNode::Failed(
            reasons::KERNEL_CACHE_FAILED,
            format!("KernelCache '{name}' was {message}"),
        ),
        CacheState::Incompatible => {
            let why: Vec<String> = entry
                .incompatible_gpus
                .iter()
                .map(|g| format!("GPU {}: {}", g.index, g.message))
                .collect();
            OnNode::Failed(
                reasons::KERNEL_CACHE_INCOMPATIBLE,
                format!(
                    "KernelCache '{name}' fits no GPU of this node: {}",
                    if why.is_empty() {
                        message
                    } else {
                        why.join("; ")
                    }
                ),
            )
        }
    }
}

/// The state of ModelCache `name` (`cache`, absent when there is none) on `node`, whose
/// agent reported `report`: Ready once the agent reports it `Ready` for the cache's
/// current generation.
pub fn model_on_node(
    name: &str,
    cache: Option<&ModelCache>,
    node: &Node,
    report: Option<&KernelCacheNode>,
) -> OnNode {
    let Some(cache) = cache else {
        return OnNode::Waiting(format!("there is no ModelCache '{name}' (yet)"));
    };
    if !selects(cache.spec.node_selector.as_ref(), node.labels()) {
        return OnNode::Failed(
            reasons::MODEL_CACHE_NOT_TARGETED,
            format!("ModelCache '{name}' does not select this node (its nodeSelector)"),
        );
    }
    let Some(report) = report.and_then(|r| r.status.as_ref()) else {
        return OnNode::Waiting(format!(
            "no report from the cache agent on this node yet (ModelCache '{name}')"
        ));
    };
    let namespace = cache.metadata.namespace.as_deref().unwrap_or_default();
    let entry = report.model_caches.iter().find(|c| {
        c.namespace == namespace
            && c.name == name
            && c.observed_generation == cache.metadata.generation
    });
    let Some(entry) = entry else {
        return OnNode::Waiting(format!(
            "the agent has not reported ModelCache '{name}' (generation {}) yet",
            cache.metadata.generation.unwrap_or_default()
        ));
    };
    let message = entry.message.clone().unwrap_or_default();
    match entry.state {
        ModelCacheState::Ready => OnNode::Ready,
        ModelCacheState::Downloading => {
            let progress = match (entry.bytes_done, entry.bytes_total) {
                (Some(done), Some(total)) => format!(": {done} of {total} bytes"),
                _ => String::new(),
            };
            OnNode::Waiting(format!(
                "ModelCache '{name}' is downloading on this node{progress}"
            ))
        }
        ModelCacheState::Failed => OnNode::Failed(
            reasons::MODEL_CACHE_FAILED,
            format!(
                "downloading ModelCache '{name}' failed ({}): {message}",
                entry.reason.as_deref().unwrap_or("Failed")
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::needless_pass_by_value)] // JSON literals built in place
    use super::*;
    use serde_json::json;

    fn node(labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "gpu-1", "labels": labels}})).unwrap()
    }

    fn cache(selector: serde_json::Value, usable: bool) -> KernelCache {
        serde_json::from_value(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCache",
            "metadata": {"name": "vadd", "namespace": "ml"},
            "spec": {"image": "r/c:1", "nodeSelector": selector},
            "status": {"resolvedDigest": "sha256:aa", "pinnedImage": "r/c@sha256:aa",
                       "verification": {"mode": "key", "verified": usable}},
        }))
        .unwrap()
    }

    fn report(state: &str, digest: &str) -> KernelCacheNode {
        serde_json::from_value(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode",
            "metadata": {"name": "gpu-1"}, "spec": {"nodeName": "gpu-1"},
            "status": {"caches": [{"namespace": "ml", "name": "vadd", "digest": digest, "state": state,
                "message": "digest mismatch",
                "incompatibleGpus": [{"index": 0, "reason": "ArchMismatch", "message": "arch 80, cache wants 90"}]}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_node_waits_for_its_agent_and_fails_with_its_words() {
        let n = node(json!({"pool": "h100"}));
        let c = cache(json!({"pool": "h100"}), true);
        assert_eq!(
            on_node("vadd", Some(&c), &n, Some(&report("Ready", "sha256:aa"))),
            OnNode::Ready
        );
        assert!(matches!(
            on_node("vadd", Some(&c), &n, Some(&report("Staging", "sha256:aa"))),
            OnNode::Waiting(_)
        ));
        assert!(
            matches!(
                on_node("vadd", Some(&c), &n, Some(&report("Ready", "sha256:old"))),
                OnNode::Waiting(_)
            ),
            "another digest is an older pin"
        );
        assert!(
            matches!(on_node("vadd", Some(&c), &n, None), OnNode::Waiting(m) if m.contains("agent"))
        );
        assert_eq!(
            on_node("vadd", Some(&c), &n, Some(&report("Failed", "sha256:aa"))),
            OnNode::Failed(
                reasons::KERNEL_CACHE_FAILED,
                "staging KernelCache 'vadd' failed: digest mismatch".into()
            )
        );
        let OnNode::Failed(reason, message) = on_node(
            "vadd",
            Some(&c),
            &n,
            Some(&report("Incompatible", "sha256:aa")),
        ) else {
            panic!()
        };
        assert_eq!(reason, reasons::KERNEL_CACHE_INCOMPATIBLE);
        assert!(message.contains("arch 80, cache wants 90"), "{message}");
        assert!(matches!(
            on_node("vadd", Some(&cache(json!({"pool": "h100"}), false)), &n, None),
            OnNode::Waiting(m) if m.contains("verified")
        ));
        assert!(matches!(
            on_node("vadd", Some(&cache(json!({"pool": "a100"}), true)), &n, None),
            OnNode::Failed(r, _) if r == reasons::KERNEL_CACHE_NOT_TARGETED
        ));
        assert!(
            matches!(on_node("vadd", None, &n, None), OnNode::Waiting(m) if m.contains("no KernelCache 'vadd'")),
            "a cache not created yet is waited for"
        );
    }

    fn model(selector: serde_json::Value) -> ModelCache {
        serde_json::from_value(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "tiny", "namespace": "ml", "generation": 2},
            "spec": {"source": "hf://acme/tiny", "nodeSelector": selector},
        }))
        .unwrap()
    }

    fn model_report(state: &str, generation: i64) -> KernelCacheNode {
        serde_json::from_value(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "KernelCacheNode",
            "metadata": {"name": "gpu-1"}, "spec": {"nodeName": "gpu-1"},
            "status": {"modelCaches": [{"namespace": "ml", "name": "tiny", "observedGeneration": generation,
                "state": state, "reason": "NoSpace", "message": "needs 10 GB, 2 GB free",
                "bytesDone": 5, "bytesTotal": 10}]},
        }))
        .unwrap()
    }

    /// A ModelCache is warm on a node once the agent reports it Ready for the cache's
    /// current generation; a node it does not select, or a failed download, fails the
    /// node with the agent's words.
    #[test]
    fn a_node_waits_for_its_model_download_and_fails_with_its_words() {
        let n = node(json!({"pool": "h100"}));
        let c = model(json!({"pool": "h100"}));
        assert_eq!(
            model_on_node("tiny", Some(&c), &n, Some(&model_report("Ready", 2))),
            OnNode::Ready
        );
        assert!(
            matches!(
                model_on_node("tiny", Some(&c), &n, Some(&model_report("Ready", 1))),
                OnNode::Waiting(_)
            ),
            "a report of an older generation"
        );
        assert!(matches!(
            model_on_node("tiny", Some(&c), &n, Some(&model_report("Downloading", 2))),
            OnNode::Waiting(m) if m.contains("5 of 10 bytes")
        ));
        assert_eq!(
            model_on_node("tiny", Some(&c), &n, Some(&model_report("Failed", 2))),
            OnNode::Failed(
                reasons::MODEL_CACHE_FAILED,
                "downloading ModelCache 'tiny' failed (NoSpace): needs 10 GB, 2 GB free".into()
            )
        );
        assert!(matches!(
            model_on_node("tiny", Some(&model(json!({"pool": "a100"}))), &n, None),
            OnNode::Failed(r, _) if r == reasons::MODEL_CACHE_NOT_TARGETED
        ));
        assert!(
            matches!(model_on_node("tiny", Some(&c), &n, None), OnNode::Waiting(m) if m.contains("agent"))
        );
        assert!(
            matches!(model_on_node("tiny", None, &n, None), OnNode::Waiting(m) if m.contains("no ModelCache 'tiny'"))
        );
    }
}
