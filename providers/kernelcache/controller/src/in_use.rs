//! The kernel caches in use on each node, from the serving pods the controller watches
//! (those with the `kubeairunway.ai/model-deployment` label, kept slim), recorded in the
//! node's `KernelCacheNode.spec.inUse` for its agent: the agents read no pods, so a
//! compromised node learns nothing of other tenants' pods. The agent evicts only caches
//! not in use there.

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use kube::ResourceExt;
use serde_json::{Value, json};

use kubeairunway_kernelcache_api::names::INJECTED_ANNOTATION;

/// The caches the pods on `node` use, sorted and each once: the value of the pod
/// webhook's annotation (`<namespace>/<name>@<digest>`) of every pod bound to the node
/// and not finished (a pod being deleted still runs). A pod names only a cache of its
/// own namespace: an annotation naming another namespace's is ignored, so no tenant can
/// keep another's caches on a node.
pub fn on_node<'a>(pods: impl IntoIterator<Item = &'a Pod>, node: &str) -> Vec<String> {
    let mut out: Vec<String> = pods
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|p| {
            let value = p.annotations().get(INJECTED_ANNOTATION)?;
            let namespace = p.namespace()?;
            let (cache_namespace, _) = value.split_once('/')?;
            (cache_namespace == namespace).then(|| value.clone())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The pod as it is cached: its name, namespace, the webhook's annotation, its node and
/// its phase; nothing else of a tenant's pod is kept.
pub fn slim(pod: &mut Pod) {
    let injected = pod.annotations().get(INJECTED_ANNOTATION).cloned();
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.annotations =
        injected.map(|v| std::iter::once((INJECTED_ANNOTATION.to_string(), v)).collect());
    pod.spec = Some(PodSpec {
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ..PodSpec::default()
    });
    pod.status = Some(PodStatus {
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
        ..PodStatus::default()
    });
}

/// The server-side apply body that records `in_use` on the KernelCacheNode `name`.
pub fn apply_body(name: &str, in_use: &[String]) -> Value {
    json!({
        "apiVersion": "cache.kubeairunway.ai/v1alpha1",
        "kind": "KernelCacheNode",
        "metadata": {"name": name},
        "spec": {"inUse": in_use},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, node: Option<&str>, phase: &str, injected: Option<&str>) -> Pod {
        let mut annotations = serde_json::Map::new();
        if let Some(v) = injected {
            annotations.insert(INJECTED_ANNOTATION.into(), v.into());
        }
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": ns, "annotations": annotations,
                         "labels": {"kubeairunway.ai/model-deployment": "llama"}},
            "spec": {"nodeName": node, "containers": [{"name": "vllm", "image": "vllm"}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn the_caches_of_unfinished_pods_bound_to_the_node_are_in_use() {
        let pods = vec![
            pod("ml", Some("gpu-1"), "Running", Some("ml/vadd@sha256:1")),
            pod("ml", Some("gpu-1"), "Pending", Some("ml/other@sha256:2")),
            // The same cache twice: once.
            pod("ml", Some("gpu-1"), "Running", Some("ml/vadd@sha256:1")),
            pod("ml", Some("gpu-1"), "Succeeded", Some("ml/done@sha256:3")),
            pod("ml", Some("gpu-1"), "Failed", Some("ml/crashed@sha256:4")),
            pod(
                "ml",
                Some("gpu-2"),
                "Running",
                Some("ml/elsewhere@sha256:5"),
            ),
            pod("ml", None, "Pending", Some("ml/unscheduled@sha256:6")),
            pod("ml", Some("gpu-1"), "Running", None),
            // A tenant cannot hold another namespace's cache on the node.
            pod("evil", Some("gpu-1"), "Running", Some("ml/victim@sha256:7")),
        ];
        assert_eq!(
            on_node(&pods, "gpu-1"),
            ["ml/other@sha256:2", "ml/vadd@sha256:1"]
        );
        assert!(on_node(&pods, "gpu-3").is_empty());
    }

    #[test]
    fn a_cached_pod_keeps_only_what_the_record_needs() {
        let mut p = pod("ml", Some("gpu-1"), "Running", Some("ml/vadd@sha256:1"));
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("secret-ish".into(), "x".into());
        slim(&mut p);
        assert!(p.metadata.labels.is_none());
        assert_eq!(p.annotations().len(), 1);
        assert!(p.spec.as_ref().unwrap().containers.is_empty());
        assert_eq!(on_node([&p], "gpu-1"), ["ml/vadd@sha256:1"]);
        assert_eq!(apply_body("gpu-1", &[])["spec"], json!({"inUse": []}));
    }
}
