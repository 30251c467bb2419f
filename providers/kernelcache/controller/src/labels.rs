//! The ready labels on Nodes: `kernelcache.kubeairunway.ai/<namespace>.<name>=true` on
//! every node whose KernelCacheNode reports that kernel cache `Ready`, and
//! `modelcache.kubeairunway.ai/<namespace>.<name>=true` for a model cache `Ready` there,
//! and on no other. The controller sets them (not the node agents, which then need no
//! right to change a Node): by JSON merge patch of those labels only; labels without
//! one of [`LABEL_PREFIXES`] are never touched.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use kubeairunway_kernelcache_api::model::ModelCacheState;
use kubeairunway_kernelcache_api::names;
use kubeairunway_kernelcache_api::{CacheState, KernelCacheNode};

/// The prefix of the kernel caches' labels the controller manages on Nodes
/// (`names::ready_label`).
pub const LABEL_PREFIX: &str = names::KERNEL_LABEL_PREFIX;
/// The prefixes of every label the controller manages on Nodes (kernel and model caches).
pub const LABEL_PREFIXES: [&str; 2] = [names::KERNEL_LABEL_PREFIX, names::MODEL_LABEL_PREFIX];

/// Label changes: set to `"true"`, or remove.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelChanges {
    /// Labels to set to `"true"`.
    pub set: BTreeSet<String>,
    /// Labels to remove.
    pub remove: BTreeSet<String>,
}

impl LabelChanges {
    /// Nothing to change.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }

    /// The JSON merge patch (`{"metadata":{"labels":{k:"true", gone:null}}}`).
    pub fn merge_patch(&self) -> Value {
        let mut labels = Map::new();
        for k in &self.set {
            labels.insert(k.clone(), Value::String("true".into()));
        }
        for k in &self.remove {
            labels.insert(k.clone(), Value::Null);
        }
        json!({"metadata": {"labels": labels}})
    }
}

/// The ready labels a node should carry according to its KernelCacheNode (none without
/// one): its kernel caches and its model caches reported `Ready`.
pub fn ready_labels(report: Option<&KernelCacheNode>) -> BTreeSet<String> {
    report
        .and_then(|r| r.status.as_ref())
        .map(|s| {
            let kernels = s
                .caches
                .iter()
                .filter(|c| c.state == CacheState::Ready)
                .map(|c| names::ready_label(&c.namespace, &c.name));
            let models = s
                .model_caches
                .iter()
                .filter(|c| c.state == ModelCacheState::Ready)
                .map(|c| names::model_ready_label(&c.namespace, &c.name));
            kernels.chain(models).collect()
        })
        .unwrap_or_default()
}

/// The changes that make the managed labels on a node with `current` labels exactly
/// `ready` (each `"true"`).
pub fn label_changes(current: &BTreeMap<String, String>, ready: &BTreeSet<String>) -> LabelChanges {
    LabelChanges {
        set: ready
            .iter()
            .filter(|k| current.get(*k).map(String::as_str) != Some("true"))
            .cloned()
            .collect(),
        remove: current
            .keys()
            .filter(|k| LABEL_PREFIXES.iter().any(|p| k.starts_with(p)) && !ready.contains(*k))
            .cloned()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_kernelcache_api::model::NodeModelCache;
    use kubeairunway_kernelcache_api::{KernelCacheNodeSpec, KernelCacheNodeStatus, NodeCache};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn only_the_managed_labels_change() {
        let current = labels(&[
            ("kubernetes.io/hostname", "gpu-1"),
            ("kernelcache.kubeairunway.ai/ml.old", "true"),
            ("kernelcache.kubeairunway.ai/ml.kept", "true"),
            ("kernelcache.kubeairunway.ai/ml.odd", "false"),
            ("modelcache.kubeairunway.ai/ml.gone", "true"),
        ]);
        let ready: BTreeSet<String> = [
            "kernelcache.kubeairunway.ai/ml.kept",
            "kernelcache.kubeairunway.ai/ml.new",
            "kernelcache.kubeairunway.ai/ml.odd",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let c = label_changes(&current, &ready);
        assert_eq!(
            c.set.iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "kernelcache.kubeairunway.ai/ml.new",
                "kernelcache.kubeairunway.ai/ml.odd"
            ]
        );
        assert_eq!(
            c.remove.iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "kernelcache.kubeairunway.ai/ml.old",
                "modelcache.kubeairunway.ai/ml.gone"
            ]
        );
        assert_eq!(
            c.merge_patch(),
            json!({"metadata": {"labels": {
                "kernelcache.kubeairunway.ai/ml.new": "true",
                "kernelcache.kubeairunway.ai/ml.odd": "true",
                "kernelcache.kubeairunway.ai/ml.old": null,
                "modelcache.kubeairunway.ai/ml.gone": null,
            }}})
        );
        assert!(label_changes(&labels(&[("a", "b")]), &BTreeSet::new()).is_empty());
    }

    #[test]
    fn ready_caches_of_the_report_become_labels() {
        let mut report = KernelCacheNode::new(
            "gpu-1",
            KernelCacheNodeSpec {
                node_name: "gpu-1".into(),
                in_use: None,
                credentials_key: None,
                model_downloads: None,
            },
        );
        let model = |name: &str, state| NodeModelCache {
            namespace: "ml".into(),
            name: name.into(),
            state,
            ..NodeModelCache::default()
        };
        let cache = |name: &str, state| NodeCache {
            namespace: "ml".into(),
            name: name.into(),
            digest: "sha256:ab".into(),
            state,
            ..NodeCache::default()
        };
        report.status = Some(KernelCacheNodeStatus {
            caches: vec![
                cache("vadd", CacheState::Ready),
                cache("llama", CacheState::Staging),
                cache("rocm", CacheState::Incompatible),
                // Removed from the node's disk: no pod may count on it there.
                cache("evicted", CacheState::Evicted),
            ],
            model_caches: vec![
                model("qwen", ModelCacheState::Ready),
                model("llama", ModelCacheState::Downloading),
                model("gated", ModelCacheState::Failed),
            ],
            ..KernelCacheNodeStatus::default()
        });
        assert_eq!(
            ready_labels(Some(&report)),
            BTreeSet::from([
                "kernelcache.kubeairunway.ai/ml.vadd".to_string(),
                "modelcache.kubeairunway.ai/ml.qwen".to_string()
            ])
        );
        assert!(ready_labels(None).is_empty());
    }
}
