//! Credentials handed over to the node agents, sealed per node
//! ([`kubeairunway_kernelcache_artifact::sealed`]): a KernelCache's registry entry (from
//! its pull Secrets) and a ModelCache's hub token or registry entry (from its
//! `credentialsSecretRef`) are kept here in memory, and each node gets one Secret in the
//! credentials namespace holding, for every cache whose nodeSelector selects it, that
//! cache's data sealed to the key its agent published (`KernelCacheNode.spec.credentialsKey`).
//! A node its caches do not select, or whose agent published no key, gets nothing.
//!
//! The reconciles of the caches say what to hand over ([`Handover::hand_over`]); one loop
//! ([`Handover::run`]) writes the node Secrets from the watch caches of Nodes and node
//! reports (a node's labels or key changing reseals only that node's Secret). Secrets of
//! earlier versions (one per cache, in plaintext) are deleted at start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::{Client, ResourceExt};
use kubeairunway_sdk::reflect::Cache;
use serde_json::json;
use tokio::sync::Notify;
use tracing::{info, warn};

use kubeairunway_kernelcache_api::report::kube_error;
use kubeairunway_kernelcache_api::{KernelCacheNode, selects};
use kubeairunway_kernelcache_artifact::sealed::{
    NODE_ANNOTATION, NODE_SECRET_LABEL, node_secret_name, seal, valid_key,
};
use kubeairunway_kernelcache_artifact::secrets::SecretData;

/// The label on every Secret the controller writes in the credentials namespace.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "kernelcache-controller");
/// The annotation naming the cache (`namespace/name`) an object is for.
pub const FOR_ANNOTATION: &str = "cache.kubeairunway.ai/for";

/// How long the first writes wait for every cache with credentials to be handed over
/// once (so that a restart does not write partial node Secrets first).
const SETTLE: Duration = Duration::from_secs(30);
/// How often the node Secrets are compared with what they should hold (in memory: no
/// request unless one changes).
const PASS: Duration = Duration::from_secs(1);
/// How long a node whose Secret could not be written waits before the next attempt
/// (unless what it should hold changes).
const RETRY: Duration = Duration::from_secs(30);

/// The kind of cache an entry is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A KernelCache.
    Kernel,
    /// A ModelCache.
    Model,
}

/// A cache: kind, namespace, name.
pub type Owner = (Kind, String, String);

/// What one cache hands over.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The cache.
    pub owner: Owner,
    /// The entry's name in each node Secret (what the agent asks for: `handover_name`,
    /// `model_token_secret`).
    pub name: String,
    /// The cache's nodeSelector (none: every node).
    pub selector: Option<BTreeMap<String, String>>,
    /// The data the agent reads.
    pub data: SecretData,
}

/// A node as the sealing sees it.
#[derive(Clone, Debug)]
pub struct NodeView {
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// The key its agent published.
    pub key: Option<String>,
}

/// What one node's Secret should hold: the key sealed to and, per entry, a digest of its
/// data (sealing is randomised: what is compared is what was sealed, not the bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// The node's key.
    pub key: String,
    /// Entry name to the digest of its data.
    pub entries: BTreeMap<String, String>,
}

/// The node Secrets wanted: every node with a valid key and at least one entry whose
/// cache's nodeSelector selects it (pure).
pub fn desired(nodes: &[NodeView], entries: &BTreeMap<String, Entry>) -> BTreeMap<String, Want> {
    // Each entry's digest once, not once per node it selects.
    let digests: Vec<(&Entry, String)> = entries.values().map(|e| (e, digest(&e.data))).collect();
    let mut out = BTreeMap::new();
    for node in nodes {
        let Some(key) = node.key.as_deref().filter(|k| valid_key(k)) else {
            continue;
        };
        let selected: BTreeMap<String, String> = digests
            .iter()
            .filter(|(e, _)| selects(e.selector.as_ref(), &node.labels))
            .map(|(e, d)| (e.name.clone(), d.clone()))
            .collect();
        if !selected.is_empty() {
            out.insert(
                node.name.clone(),
                Want {
                    key: key.to_string(),
                    entries: selected,
                },
            );
        }
    }
    out
}

fn digest(data: &SecretData) -> String {
    use sha2::Digest as _;
    let bytes = serde_json::to_vec(data).unwrap_or_default();
    kubeairunway_kernelcache_artifact::registry::hex(&sha2::Sha256::digest(bytes))
}

/// Whether the first writes may start (pure): every cache expected to hand something
/// over has been tried once, or waiting longer would hold back every node.
pub fn settled(expected: &BTreeSet<Owner>, tried: &BTreeSet<Owner>, waited: Duration) -> bool {
    waited >= SETTLE || expected.is_subset(tried)
}

/// What was last written for a node, or when writing it last failed.
#[derive(Clone, Debug)]
enum Written {
    Done(Want),
    Failed { want: Want, at: Instant },
}

/// The sealed handover of one controller.
pub struct Handover {
    api: Api<Secret>,
    namespace: String,
    entries: Mutex<BTreeMap<String, Entry>>,
    tried: Mutex<BTreeSet<Owner>>,
    written: Mutex<BTreeMap<String, Written>>,
    changed: Notify,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Handover {
    /// Hand over in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            entries: Mutex::default(),
            tried: Mutex::default(),
            written: Mutex::default(),
            changed: Notify::new(),
        }
    }

    /// The credentials namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `owner` hands `entry` over (none: nothing, its entry is taken back).
    pub fn hand_over(&self, owner: &Owner, name: &str, entry: Option<Entry>) {
        self.tried(owner);
        let changed = match self.entries.lock() {
            Ok(mut entries) => match entry {
                Some(e) if entries.get(name) != Some(&e) => {
                    entries.insert(name.to_string(), e);
                    true
                }
                Some(_) => false,
                None => entries.remove(name).is_some(),
            },
            Err(_) => false,
        };
        if changed {
            self.changed.notify_one();
        }
    }

    /// `owner`'s hand-over was tried (and failed: what it handed over before stays).
    pub fn tried(&self, owner: &Owner) {
        if let Ok(mut t) = self.tried.lock() {
            t.insert(owner.clone());
        }
    }

    /// Writes the node Secrets until dropped: once `expected` (the caches that hand
    /// something over, from the synced watch caches) have all been tried, or after
    /// [`SETTLE`], leftovers are deleted, then every change is written; entries of caches
    /// no longer expected are dropped.
    pub async fn run(
        &self,
        nodes: Cache<PartialObjectMeta<Node>>,
        reports: Cache<KernelCacheNode>,
        expected: impl Fn() -> BTreeSet<Owner>,
    ) {
        if !(nodes.synced().await && reports.synced().await) {
            return;
        }
        let started = Instant::now();
        loop {
            let tried = self.tried.lock().map(|t| t.clone()).unwrap_or_default();
            if settled(&expected(), &tried, started.elapsed()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut swept = false;
        loop {
            // A cache deleted, or no longer naming credentials, hands nothing over (its
            // reconcile may never run again).
            let expected = expected();
            self.keep_only(&expected);
            let want = desired(&views(&nodes, &reports), &self.entries());
            if !swept {
                swept = self.sweep(&want).await;
            }
            self.pass(want).await;
            tokio::select! {
                () = self.changed.notified() => {}
                () = tokio::time::sleep(PASS) => {}
            }
        }
    }

    /// Takes back the entries of caches not in `owners` (deleted, or naming no
    /// credentials any more), and forgets that they were tried.
    fn keep_only(&self, owners: &BTreeSet<Owner>) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|_, e| owners.contains(&e.owner));
        }
        if let Ok(mut t) = self.tried.lock() {
            t.retain(|o| owners.contains(o));
        }
    }

    fn entries(&self) -> BTreeMap<String, Entry> {
        self.entries.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Writes the node Secrets that differ from `want`, deletes those no longer wanted.
    async fn pass(&self, want: BTreeMap<String, Want>) {
        let written = self.written.lock().map(|w| w.clone()).unwrap_or_default();
        for (node, w) in &want {
            let due = match written.get(node) {
                Some(Written::Done(done)) => done != w,
                Some(Written::Failed { want, at }) => want != w || at.elapsed() >= RETRY,
                None => true,
            };
            if due {
                let outcome = match self.write(node, w).await {
                    Ok(()) => Written::Done(w.clone()),
                    Err(e) => {
                        warn!(node = %node, error = %e, "sealing credentials for a node");
                        Written::Failed {
                            want: w.clone(),
                            at: Instant::now(),
                        }
                    }
                };
                if let Ok(mut m) = self.written.lock() {
                    m.insert(node.clone(), outcome);
                }
            }
        }
        for node in written.keys().filter(|n| !want.contains_key(*n)) {
            match self.delete(&node_secret_name(node)).await {
                Ok(()) => {
                    if let Ok(mut m) = self.written.lock() {
                        m.remove(node);
                    }
                }
                Err(e) => warn!(node = %node, error = %e, "removing a node's sealed credentials"),
            }
        }
    }

    /// Seals `w`'s entries to its key and applies the node's Secret.
    async fn write(&self, node: &str, w: &Want) -> Result<(), String> {
        let entries = self.entries();
        let mut data = serde_json::Map::new();
        for name in w.entries.keys() {
            let Some(e) = entries.get(name) else { continue };
            let sealed = seal(&w.key, &e.data).map_err(|e| e.to_string())?;
            data.insert(
                name.clone(),
                json!(base64::engine::general_purpose::STANDARD.encode(sealed)),
            );
        }
        let secret = node_secret_name(node);
        let body = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret,
                "namespace": self.namespace,
                "labels": {MANAGED_BY.0: MANAGED_BY.1, NODE_SECRET_LABEL.0: NODE_SECRET_LABEL.1},
                "annotations": {NODE_ANNOTATION: node},
            },
            "type": "Opaque",
            "data": data,
        });
        self.api
            .patch(
                &secret,
                &PatchParams::apply(crate::settings::FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "sealing the credentials of node {node} ({}/{secret}): {}",
                    self.namespace,
                    kube_error(&e)
                )
            })
    }

    async fn delete(&self, secret: &str) -> Result<(), String> {
        match self.api.delete(secret, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(format!(
                "deleting {}/{secret}: {}",
                self.namespace,
                kube_error(&e)
            )),
        }
    }

    /// Deletes what this controller wrote in the namespace and no longer wants (one LIST
    /// at start): node Secrets of nodes not in `want`, and the per-cache plaintext
    /// Secrets of earlier versions. `false` when the list failed (tried again).
    async fn sweep(&self, want: &BTreeMap<String, Want>) -> bool {
        let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
        let list = match self
            .api
            .list(&ListParams::default().labels(&selector))
            .await
        {
            Ok(list) => list,
            Err(e) => {
                warn!(error = %kube_error(&e), "listing the credentials namespace");
                return false;
            }
        };
        let keep: BTreeSet<String> = want.keys().map(|n| node_secret_name(n)).collect();
        for s in list {
            let name = s.name_any();
            let node_secret = s.labels().get(NODE_SECRET_LABEL.0).map(String::as_str)
                == Some(NODE_SECRET_LABEL.1);
            let plaintext = s.annotations().contains_key(FOR_ANNOTATION);
            if (node_secret && !keep.contains(&name)) || (plaintext && !node_secret) {
                match self.delete(&name).await {
                    Ok(()) => info!(secret = %name, "removed credentials no node needs"),
                    Err(e) => warn!(error = %e, "removing handed-over credentials"),
                }
            }
        }
        true
    }
}

/// Every node with its labels and its agent's key, from the watch caches.
fn views(
    nodes: &Cache<PartialObjectMeta<Node>>,
    reports: &Cache<KernelCacheNode>,
) -> Vec<NodeView> {
    nodes
        .store
        .state()
        .iter()
        .map(|n| {
            let name = n.name_any();
            let key = reports
                .store
                .get(&kube::runtime::reflector::ObjectRef::new(&name))
                .and_then(|r| r.spec.credentials_key.clone());
            NodeView {
                labels: n.labels().clone(),
                name,
                key,
            }
        })
        .collect()
}

/// The data of a docker config handed over (`.dockerconfigjson`).
pub fn docker_config(config: Vec<u8>) -> SecretData {
    [(
        kubeairunway_kernelcache_api::names::DOCKER_CONFIG_KEY.to_string(),
        k8s_openapi::ByteString(config),
    )]
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_kernelcache_artifact::sealed::NodeKey;

    fn entry(name: &str, selector: Option<&[(&str, &str)]>, value: &str) -> (String, Entry) {
        (
            name.to_string(),
            Entry {
                owner: (Kind::Kernel, "ml".into(), name.into()),
                name: name.into(),
                selector: selector.map(|s| {
                    s.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                }),
                data: docker_config(value.as_bytes().to_vec()),
            },
        )
    }

    fn node(name: &str, labels: &[(&str, &str)], key: Option<String>) -> NodeView {
        NodeView {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            key,
        }
    }

    /// A node gets the entries of the caches whose nodeSelector selects it, only with a
    /// valid published key; a change of a cache's data or of the key is a change of what
    /// the node should hold.
    #[test]
    fn each_node_gets_only_the_entries_its_caches_select() {
        let (a, b) = (NodeKey::generate().public(), NodeKey::generate().public());
        let entries: BTreeMap<String, Entry> = [
            entry("h100-only", Some(&[("gpu", "h100")]), "one"),
            entry("everywhere", None, "two"),
        ]
        .into();
        let nodes = vec![
            node("gpu-a", &[("gpu", "h100")], Some(a.clone())),
            node("gpu-b", &[("gpu", "a10")], Some(b.clone())),
            node("no-agent", &[("gpu", "h100")], None),
            node("bad-key", &[("gpu", "h100")], Some("xyz".into())),
        ];
        let want = desired(&nodes, &entries);
        assert_eq!(want.keys().collect::<Vec<_>>(), ["gpu-a", "gpu-b"]);
        assert_eq!(want["gpu-a"].key, a);
        assert_eq!(
            want["gpu-a"].entries.keys().collect::<Vec<_>>(),
            ["everywhere", "h100-only"]
        );
        assert_eq!(
            want["gpu-b"].entries.keys().collect::<Vec<_>>(),
            ["everywhere"]
        );
        // Only caches selecting nobody: no Secret at all for that node.
        let only: BTreeMap<String, Entry> =
            [entry("h100-only", Some(&[("gpu", "h100")]), "one")].into();
        assert!(!desired(&nodes, &only).contains_key("gpu-b"));
        // The data changes: the node's want changes; the other entry does not.
        let changed: BTreeMap<String, Entry> = [
            entry("h100-only", Some(&[("gpu", "h100")]), "one"),
            entry("everywhere", None, "three"),
        ]
        .into();
        let after = desired(&nodes, &changed);
        assert_ne!(after["gpu-a"], want["gpu-a"]);
        assert_eq!(
            after["gpu-a"].entries["h100-only"],
            want["gpu-a"].entries["h100-only"]
        );
    }

    #[test]
    fn first_writes_wait_until_every_cache_was_tried_or_long_enough() {
        let o = |n: &str| (Kind::Model, "ml".to_string(), n.to_string());
        let expected: BTreeSet<Owner> = [o("a"), o("b")].into();
        let tried: BTreeSet<Owner> = [o("a")].into();
        assert!(!settled(&expected, &tried, Duration::from_secs(1)));
        assert!(settled(&expected, &tried, SETTLE));
        let all: BTreeSet<Owner> = [o("a"), o("b"), o("c")].into();
        assert!(settled(&expected, &all, Duration::ZERO));
    }
}
