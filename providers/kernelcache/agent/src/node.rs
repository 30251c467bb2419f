//! This node as the agent sees it: its uid (the owner of its KernelCacheNode) and its
//! labels (for `nodeSelector`s), read from a watch of the one Node named after it
//! (`metadata.name` field selector, metadata only), behind a small seam ([`NodeApi`]).
//!
//! The agent never writes the Node: the controller sets the ready labels from the
//! KernelCacheNode reports (the controller's `labels` module), so a node's agent needs no
//! right to change any Node. Nor does the agent need the Node to work: without one (not
//! served, not permitted, not created yet) it reports anyway, and says why it could not
//! read it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt};
use kubeairunway_kernelcache_api::report::kube_error;

/// What the agent needs to know about its Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The Node's uid (for the KernelCacheNode's owner reference), when known.
    pub uid: Option<String>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// Reading this node.
pub trait NodeApi: Send + Sync {
    /// The node's uid and labels, or why they are unknown.
    fn get(&self) -> BoxFuture<'_, Result<NodeInfo, String>>;
}

/// The Kubernetes Node named after this node, kept current by a watch.
pub struct KubeNode {
    name: String,
    store: Store<PartialObjectMeta<Node>>,
    /// The watch's last error, until it recovers.
    error: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for KubeNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeNode")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Drop for KubeNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KubeNode {
    /// Watch the Node `name` (its metadata only).
    pub fn watch(client: Client, name: &str) -> Self {
        let (store, writer) = reflector::store();
        let error = Arc::new(Mutex::new(None));
        let api: Api<PartialObjectMeta<Node>> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let seen = Arc::clone(&error);
        let node = name.to_string();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config)
                .default_backoff()
                .reflect(writer)
                .boxed();
            while let Some(event) = events.next().await {
                let now = match event {
                    Ok(_) => None,
                    Err(e) => {
                        let message = format!("watching Node {node}: {}", describe(&e));
                        tracing::warn!(error = %message, "reading this node's labels");
                        Some(message)
                    }
                };
                if let Ok(mut last) = seen.lock() {
                    *last = now;
                }
            }
        });
        Self {
            name: name.to_string(),
            store,
            error,
            task,
        }
    }
}

/// A watcher error with the API server's own words (kube's Display of some errors
/// is empty).
fn describe(e: &watcher::Error) -> String {
    let text = match e {
        watcher::Error::InitialListFailed(k)
        | watcher::Error::WatchStartFailed(k)
        | watcher::Error::WatchFailed(k) => kube_error(k),
        watcher::Error::WatchError(s) => format!("{} ({})", s.message, s.reason),
        watcher::Error::NoResourceVersion => e.to_string(),
    };
    if text.trim().is_empty() {
        format!("{e:?}")
    } else {
        text
    }
}

impl NodeApi for KubeNode {
    fn get(&self) -> BoxFuture<'_, Result<NodeInfo, String>> {
        let found = self.store.get(&ObjectRef::new(&self.name));
        let error = self.error.lock().ok().and_then(|e| e.clone());
        Box::pin(async move {
            match (found, error) {
                (Some(node), _) => Ok(NodeInfo {
                    uid: node.uid(),
                    labels: node.labels().clone(),
                }),
                (None, Some(error)) => Err(error),
                (None, None) => Err(format!("Node {} not found", self.name)),
            }
        })
    }
}

/// A node whose labels are given (tests, and clusters where the agent may not read
/// Nodes: `nodeSelector`s are then evaluated against these).
#[derive(Clone, Debug, Default)]
pub struct Fixed(pub BTreeMap<String, String>);

impl NodeApi for Fixed {
    fn get(&self) -> BoxFuture<'_, Result<NodeInfo, String>> {
        let labels = self.0.clone();
        Box::pin(async move { Ok(NodeInfo { uid: None, labels }) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    /// The error `get` gives once the watch has failed (it says "not found" until then).
    async fn failed(node: &KubeNode) -> String {
        loop {
            match node.get().await {
                Err(e) if e != "Node gpu-1 not found" => return e,
                Ok(_) => panic!("the Node was read"),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    #[tokio::test]
    async fn without_the_node_api_the_agent_says_what_failed() {
        // An API server that refuses the Node (RBAC) answers with a Status.
        let (client, mut server) = kubeairunway_sdk::testing::mock::pair();
        let node = KubeNode::watch(client, "gpu-1");
        server
            .answer(
                |method, uri, _| {
                    assert_eq!(method, http::Method::GET);
                    assert!(
                        uri.starts_with("/api/v1/nodes?")
                            && uri.contains("fieldSelector=metadata.name%3Dgpu-1"),
                        "{uri}"
                    );
                },
                403,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": "nodes is forbidden: User \"system:serviceaccount:k:agent\" cannot list resource \"nodes\"",
                    "reason": "Forbidden", "code": 403}),
            )
            .await
            .unwrap();
        let e = tokio::time::timeout(Duration::from_secs(30), failed(&node))
            .await
            .unwrap();
        assert_eq!(
            e,
            "watching Node gpu-1: 403 Forbidden: nodes is forbidden: User \"system:serviceaccount:k:agent\" cannot list resource \"nodes\""
        );

        // A server without the Node API answers 404 without a Status: the error still
        // names what failed and the code, never an empty text.
        let (client, mut server) = kubeairunway_sdk::testing::mock::pair();
        let node = KubeNode::watch(client, "gpu-1");
        server
            .answer(|_, _, _| {}, 404, json!("404 page not found"))
            .await
            .unwrap();
        let e = tokio::time::timeout(Duration::from_secs(30), failed(&node))
            .await
            .unwrap();
        assert!(e.starts_with("watching Node gpu-1: "), "{e}");
        assert!(e.contains("404"), "{e}");
    }
}
