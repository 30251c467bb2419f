//! This node's labels: read (for `nodeSelector`s) and the agent's ready labels written,
//! behind a small seam ([`NodeApi`]): the Kubernetes Node in a cluster, an in-memory
//! record in tests (the test API server does not serve Nodes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

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

/// A node held in memory: labels given up front, every patch recorded. For tests, and
/// for running where the Node cannot be read.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    labels: Arc<Mutex<BTreeMap<String, String>>>,
    patches: Arc<Mutex<Vec<Value>>>,
}

impl Recorded {
    /// A node with `labels`.
    pub fn new(labels: BTreeMap<String, String>) -> Self {
        Self {
            labels: Arc::new(Mutex::new(labels)),
            patches: Arc::default(),
        }
    }

    /// The labels now.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.labels.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Set a label (as a cluster admin would).
    pub fn set_label(&self, key: &str, value: &str) {
        if let Ok(mut l) = self.labels.lock() {
            l.insert(key.into(), value.into());
        }
    }

    /// The merge patches applied so far.
    pub fn patches(&self) -> Vec<Value> {
        self.patches.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

impl NodeApi for Recorded {
    fn get(&self) -> BoxFuture<'_, anyhow::Result<NodeInfo>> {
        let labels = self.labels();
        Box::pin(async move { Ok(NodeInfo { uid: None, labels }) })
    }

    fn patch_labels(&self, changes: LabelChanges) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let mut labels = self
                .labels
                .lock()
                .map_err(|_| anyhow::anyhow!("node labels lock poisoned"))?;
            for k in &changes.set {
                labels.insert(k.clone(), "true".into());
            }
            for k in &changes.remove {
                labels.remove(k);
            }
            self.patches
                .lock()
                .map_err(|_| anyhow::anyhow!("patch record lock poisoned"))?
                .push(changes.merge_patch());
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::testing::mock;

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

    #[tokio::test]
    async fn the_node_is_read_and_patched_with_an_exact_merge_patch() {
        let (client, mut server) = mock::pair();
        let node = KubeNode::new(client, "gpu-1");
        let answer = tokio::spawn(async move {
            server
                .answer(
                    |method, uri, _| {
                        assert_eq!(method, http::Method::GET);
                        assert_eq!(uri, "/api/v1/nodes/gpu-1");
                    },
                    200,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {
                        "name": "gpu-1", "uid": "u-1", "labels": {"pool": "gpu"}}}),
                )
                .await
                .unwrap();
            server
                .answer(
                    |method, uri, body| {
                        assert_eq!(method, http::Method::PATCH);
                        assert_eq!(uri, "/api/v1/nodes/gpu-1?");
                        assert_eq!(
                            body,
                            &json!({"metadata": {"labels": {
                                "kernelcache.kubeairunway.ai/ml.vadd": "true",
                                "kernelcache.kubeairunway.ai/ml.gone": null,
                            }}})
                        );
                    },
                    200,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}}),
                )
                .await
                .unwrap();
        });
        let info = node.get().await.unwrap();
        assert_eq!(info.uid.as_deref(), Some("u-1"));
        assert_eq!(info.labels, labels(&[("pool", "gpu")]));
        node.patch_labels(LabelChanges {
            set: ["kernelcache.kubeairunway.ai/ml.vadd".to_string()].into(),
            remove: ["kernelcache.kubeairunway.ai/ml.gone".to_string()].into(),
        })
        .await
        .unwrap();
        answer.await.unwrap();
    }

    #[tokio::test]
    async fn the_recorded_node_applies_and_keeps_patches() {
        let node = Recorded::new(labels(&[("pool", "gpu")]));
        node.patch_labels(LabelChanges {
            set: ["kernelcache.kubeairunway.ai/ml.vadd".to_string()].into(),
            remove: BTreeSet::new(),
        })
        .await
        .unwrap();
        assert_eq!(
            node.get().await.unwrap().labels,
            labels(&[
                ("kernelcache.kubeairunway.ai/ml.vadd", "true"),
                ("pool", "gpu")
            ])
        );
        assert_eq!(node.patches().len(), 1);
    }
}
