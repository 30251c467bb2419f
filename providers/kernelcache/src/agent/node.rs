//! This node's labels: read (for `nodeSelector`s) and the agent's ready labels written
//! to the Kubernetes Node ([`KubeNode`], behind the [`NodeApi`] seam of the agent's
//! inputs). The end-to-end tests run the agent against a real Node of the test API server.

use std::collections::{BTreeMap, BTreeSet};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Map, Value, json};

/// The prefix of every label the agent manages (`inject::ready_label`).
pub const LABEL_PREFIX: &str = "kernelcache.kubeairunway.ai/";

/// What the agent needs to know about its Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The Node's uid (for the KernelCacheNode's owner reference), when known.
    pub uid: Option<String>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

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

/// The changes that make the agent's labels on a node with `current` labels exactly
/// `ready` (each `"true"`); labels without [`LABEL_PREFIX`] are never touched.
pub fn label_changes(current: &BTreeMap<String, String>, ready: &BTreeSet<String>) -> LabelChanges {
    LabelChanges {
        set: ready
            .iter()
            .filter(|k| current.get(*k).map(String::as_str) != Some("true"))
            .cloned()
            .collect(),
        remove: current
            .keys()
            .filter(|k| k.starts_with(LABEL_PREFIX) && !ready.contains(*k))
            .cloned()
            .collect(),
    }
}

/// Reading and labelling this node.
pub trait NodeApi: Send + Sync {
    /// The node's uid and labels.
    fn get(&self) -> BoxFuture<'_, anyhow::Result<NodeInfo>>;
    /// Apply label changes.
    fn patch_labels(&self, changes: LabelChanges) -> BoxFuture<'_, anyhow::Result<()>>;
}

/// The Kubernetes Node named after this node.
#[derive(Clone)]
pub struct KubeNode {
    api: Api<Node>,
    name: String,
}

impl std::fmt::Debug for KubeNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeNode")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl KubeNode {
    /// The Node `name`.
    pub fn new(client: Client, name: &str) -> Self {
        Self {
            api: Api::all(client),
            name: name.to_string(),
        }
    }
}

impl NodeApi for KubeNode {
    fn get(&self) -> BoxFuture<'_, anyhow::Result<NodeInfo>> {
        Box::pin(async move {
            let node = self.api.get(&self.name).await?;
            Ok(NodeInfo {
                uid: node.uid(),
                labels: node.labels().clone(),
            })
        })
    }

    fn patch_labels(&self, changes: LabelChanges) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            self.api
                .patch(
                    &self.name,
                    &PatchParams::default(),
                    &Patch::Merge(changes.merge_patch()),
                )
                .await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn only_the_agents_labels_change() {
        let current = labels(&[
            ("kubernetes.io/hostname", "gpu-1"),
            ("kernelcache.kubeairunway.ai/ml.old", "true"),
            ("kernelcache.kubeairunway.ai/ml.kept", "true"),
            ("kernelcache.kubeairunway.ai/ml.odd", "false"),
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
            ["kernelcache.kubeairunway.ai/ml.old"]
        );
        assert!(label_changes(&labels(&[("a", "b")]), &BTreeSet::new()).is_empty());
    }
}
