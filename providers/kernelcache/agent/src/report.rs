//! The node's report: its `KernelCacheNode` (named after the node, server-side applied
//! with field manager `kernelcache-agent`), and which transitions deserve an Event.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::gpu::Detected;
use super::plan::{Entry, Key};
use kubeairunway_kernelcache_api::{CacheState, KernelCacheNode, KernelCacheNodeStatus, NodeCache};

/// The agent's field manager.
pub const FIELD_MANAGER: &str = "kernelcache-agent";

/// The status for `entries`; a cache keeps its `lastTransitionTime` from `previous` while
/// its state stays the same.
pub fn status(
    detected: &Detected,
    entries: &[Entry],
    previous: &BTreeMap<Key, NodeCache>,
    now: &Time,
) -> KernelCacheNodeStatus {
    let caches = entries
        .iter()
        .map(|e| {
            let before = previous.get(&e.key);
            let last_transition_time = match before {
                Some(b) if b.state == e.state => b.last_transition_time.clone(),
                _ => None,
            }
            .or_else(|| Some(now.clone()));
            NodeCache {
                namespace: e.key.namespace.clone(),
                name: e.key.name.clone(),
                digest: e.key.digest.clone(),
                state: e.state,
                compatible_gpus: e.compatible.clone(),
                incompatible_gpus: e.incompatible.clone(),
                size_bytes: e.size_bytes.map(|b| i64::try_from(b).unwrap_or(i64::MAX)),
                message: e.message.clone(),
                reason: e.reason.clone(),
                last_transition_time,
            }
        })
        .collect();
    KernelCacheNodeStatus {
        gpu_count: i32::try_from(detected.gpus.len()).unwrap_or(i32::MAX),
        gpu_detection: detected.message.clone(),
        gpus: detected.gpus.clone(),
        caches,
        // The agent adds what it accounts of the disk.
        disk: None,
        // Written by the model-cache loop, under its own field manager.
        model_caches: Vec::new(),
        last_updated: None,
    }
}

/// The caches of a status, by key.
pub fn by_key(status: &KernelCacheNodeStatus) -> BTreeMap<Key, NodeCache> {
    status
        .caches
        .iter()
        .map(|c| {
            (
                Key {
                    namespace: c.namespace.clone(),
                    name: c.name.clone(),
                    digest: c.digest.clone(),
                },
                c.clone(),
            )
        })
        .collect()
}

/// An Event worth publishing on the KernelCache: (reason, warning, note).
pub fn event(
    before: Option<&NodeCache>,
    now: &NodeCache,
    node: &str,
) -> Option<(&'static str, bool, String)> {
    if before.is_some_and(|b| b.state == now.state && b.message == now.message) {
        return None;
    }
    let detail = now.message.clone().unwrap_or_default();
    match now.state {
        CacheState::Ready if before.is_some_and(|b| b.state != CacheState::Ready) => Some((
            "Staged",
            false,
            format!("{} ready on node {node}", now.digest),
        )),
        CacheState::Evicted if before.is_none_or(|b| b.state != CacheState::Evicted) => Some((
            "Evicted",
            false,
            format!("{} on node {node}: {detail}", now.digest),
        )),
        CacheState::Failed => Some((
            "StagingFailed",
            true,
            format!("{} on node {node}: {detail}", now.digest),
        )),
        CacheState::Incompatible if before.is_none_or(|b| b.state != CacheState::Incompatible) => {
            let reasons: Vec<String> = now
                .incompatible_gpus
                .iter()
                .map(|g| g.message.clone())
                .collect();
            let why = if reasons.is_empty() {
                detail
            } else {
                reasons.join("; ")
            };
            Some((
                "Incompatible",
                false,
                format!("{} does not fit node {node}: {why}", now.digest),
            ))
        }
        _ => None,
    }
}

/// Server-side apply the KernelCacheNode itself (`spec.nodeName`, and
/// `spec.credentialsKey`, the public key the controller seals this node's credentials to;
/// owned by the Node when its uid is known).
pub async fn apply_node(
    api: &Api<KernelCacheNode>,
    node: &str,
    node_uid: Option<&str>,
    credentials_key: &str,
) -> kube::Result<()> {
    let mut metadata = json!({"name": node});
    if let Some(uid) = node_uid {
        metadata["ownerReferences"] = json!([{
            "apiVersion": "v1", "kind": "Node", "name": node, "uid": uid,
        }]);
    }
    let body = json!({
        "apiVersion": "cache.kubeairunway.ai/v1alpha1",
        "kind": "KernelCacheNode",
        "metadata": metadata,
        "spec": {"nodeName": node, "credentialsKey": credentials_key},
    });
    api.patch(
        node,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Server-side apply the status.
pub async fn apply_status(
    api: &Api<KernelCacheNode>,
    node: &str,
    status: &KernelCacheNodeStatus,
) -> kube::Result<()> {
    kubeairunway_kernelcache_api::report::apply(api, node, FIELD_MANAGER, status).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_kernelcache_api::IncompatibleGpu;

    fn entry(state: CacheState) -> Entry {
        Entry {
            key: Key {
                namespace: "ml".into(),
                name: "vadd".into(),
                digest: "sha256:ab".into(),
            },
            state,
            compatible: vec![0],
            incompatible: Vec::new(),
            size_bytes: Some(10),
            message: None,
            reason: None,
        }
    }

    fn time(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn transition_times_survive_until_the_state_changes() {
        let d = Detected::default();
        let t1 = time("2026-01-01T00:00:00Z");
        let t2 = time("2026-01-02T00:00:00Z");
        let first = status(&d, &[entry(CacheState::Staging)], &BTreeMap::new(), &t1);
        assert_eq!(first.caches[0].last_transition_time, Some(t1.clone()));
        assert_eq!(first.caches[0].size_bytes, Some(10));
        let same = status(&d, &[entry(CacheState::Staging)], &by_key(&first), &t2);
        assert_eq!(same.caches[0].last_transition_time, Some(t1));
        let changed = status(&d, &[entry(CacheState::Ready)], &by_key(&first), &t2);
        assert_eq!(changed.caches[0].last_transition_time, Some(t2));
    }

    #[test]
    fn events_mark_staged_failed_and_incompatible_transitions_once() {
        let t = time("2026-01-01T00:00:00Z");
        let d = Detected::default();
        let staging = &status(&d, &[entry(CacheState::Staging)], &BTreeMap::new(), &t).caches[0];
        let ready = &status(&d, &[entry(CacheState::Ready)], &BTreeMap::new(), &t).caches[0];
        assert_eq!(
            event(Some(staging), ready, "gpu-1"),
            Some(("Staged", false, "sha256:ab ready on node gpu-1".into()))
        );
        assert_eq!(event(Some(ready), ready, "gpu-1"), None);
        assert_eq!(event(None, ready, "gpu-1"), None, "found on disk at start");
        let mut inc = ready.clone();
        inc.state = CacheState::Incompatible;
        inc.incompatible_gpus = vec![IncompatibleGpu {
            index: 0,
            reason: "ArchMismatch".into(),
            message: "cache built for cuda arch 75; GPU 0 (H100) is 90".into(),
        }];
        assert_eq!(
            event(None, &inc, "gpu-1").unwrap().2,
            "sha256:ab does not fit node gpu-1: cache built for cuda arch 75; GPU 0 (H100) is 90"
        );
        let mut evicted = ready.clone();
        evicted.state = CacheState::Evicted;
        evicted.message = Some("evicted from this node to make room for ml/b@sha256:cd".into());
        assert_eq!(
            event(Some(ready), &evicted, "gpu-1"),
            Some((
                "Evicted",
                false,
                "sha256:ab on node gpu-1: evicted from this node to make room for ml/b@sha256:cd"
                    .into()
            ))
        );
        assert_eq!(event(Some(&evicted), &evicted, "gpu-1"), None);
        let mut failed = ready.clone();
        failed.state = CacheState::Failed;
        failed.message = Some("registry: 404".into());
        assert_eq!(
            event(Some(staging), &failed, "gpu-1"),
            Some((
                "StagingFailed",
                true,
                "sha256:ab on node gpu-1: registry: 404".into()
            ))
        );
    }
}
