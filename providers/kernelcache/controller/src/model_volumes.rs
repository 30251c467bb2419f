//! The volume serving pods mount a ModelCache through: a local PersistentVolume on the
//! nodes where the cache is ready, pre-bound to a PersistentVolumeClaim in the cache's
//! namespace (KServe's choice for its LocalModelCache). What they are is decided here,
//! purely ([`desired`]); `model_caches` applies and deletes them.
//!
//! - `nodeAffinity` requires the controller's ready label of the cache
//!   (`modelcache.kubeairunway.ai/<ns>.<name> In [true]`): the scheduler places a pod using
//!   the claim only on a node where the download is complete.
//! - `local.path` is the cache's repository folder as the agent lays it out,
//!   `<root>/hub/models--{org}--{name}` (the same on every node: the chart gives every agent
//!   and the controller one root). Only that folder, never the whole root: other
//!   namespaces' models are not in the volume.
//! - `ReadOnlyMany`, `Retain` (the files are the agent's to remove), the class
//!   [`MODEL_STORAGE_CLASS`] (no provisioner), `claimRef` to the claim, which names the
//!   volume back (`volumeName`). Only pods in the cache's namespace can use the claim.
//! - The claim's request is `1` byte: a claim's request can only grow, the cache's size can
//!   change with its commit, and a pre-bound claim binds to any volume at least as large.
//!   The volume's capacity is the cache's size (`1` until known).

use kube::ResourceExt;
use kubeairunway_kernelcache_api::model::{ModelCache, ModelCacheStatus};
use kubeairunway_kernelcache_api::names::{
    MODEL_STORAGE_CLASS, hub_folder, model_claim, model_ready_label, model_volume,
};
use serde_json::{Value, json};

use crate::handover::{FOR_ANNOTATION, MANAGED_BY};

/// The label (value `true`) of every model-cache PersistentVolume the controller made:
/// the start-up sweep finds those of deleted caches by it.
pub const VOLUME_LABEL: &str = "cache.kubeairunway.ai/model-volume";
/// The label of a model-cache PersistentVolume naming its ModelCache's namespace (the
/// name, up to 253 characters, is in the `cache.kubeairunway.ai/for` annotation).
pub const NAMESPACE_LABEL: &str = "cache.kubeairunway.ai/model-cache-namespace";

/// The volume and claim of one ModelCache, as server-side apply bodies.
#[derive(Clone, Debug, PartialEq)]
pub struct Volumes {
    /// The PersistentVolume's name (cluster-scoped).
    pub volume_name: String,
    /// The PersistentVolumeClaim's name, in the cache's namespace.
    pub claim_name: String,
    /// The PersistentVolume.
    pub volume: Value,
    /// The PersistentVolumeClaim.
    pub claim: Value,
}

/// The volume and claim `cache` should have, given its new `status` and the agents'
/// `root` (`HF_HOME` on every node); `None` while no node is ready, for a bad source, or an
/// object without namespace or uid. The volume is the folder of the model the cache
/// provides (an `oci://` source's model id included).
pub fn desired(cache: &ModelCache, status: &ModelCacheStatus, root: &str) -> Option<Volumes> {
    if status.ready_nodes < 1 {
        return None;
    }
    let Ok(repo) = cache.spec.model() else {
        return None;
    };
    let namespace = cache.namespace().filter(|n| !n.is_empty())?;
    let uid = cache.metadata.uid.clone()?;
    let name = cache.name_any();
    let volume_name = model_volume(&namespace, &name);
    let claim_name = model_claim(&namespace, &name);
    let path = format!("{}/hub/{}", root.trim_end_matches('/'), hub_folder(&repo));
    let capacity = status
        .size_bytes
        .filter(|b| *b > 0)
        .map_or_else(|| "1".to_string(), |b| b.to_string());
    let volume = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name,
            "labels": {
                MANAGED_BY.0: MANAGED_BY.1,
                VOLUME_LABEL: "true",
                NAMESPACE_LABEL: namespace,
            },
            "annotations": {FOR_ANNOTATION: format!("{namespace}/{name}")},
        },
        "spec": {
            "capacity": {"storage": capacity},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": MODEL_STORAGE_CLASS,
            "volumeMode": "Filesystem",
            "local": {"path": path},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": namespace,
                "name": claim_name,
            },
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{
                "key": model_ready_label(&namespace, &name),
                "operator": "In",
                "values": ["true"],
            }]}]}},
        },
    });
    let claim = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name,
            "namespace": namespace,
            "labels": {MANAGED_BY.0: MANAGED_BY.1},
            "annotations": {FOR_ANNOTATION: format!("{namespace}/{name}")},
            "ownerReferences": [{
                "apiVersion": "cache.kubeairunway.ai/v1alpha1",
                "kind": "ModelCache",
                "name": name,
                "uid": uid,
                "controller": true,
            }],
        },
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": MODEL_STORAGE_CLASS,
            "volumeMode": "Filesystem",
            "volumeName": volume_name,
            "resources": {"requests": {"storage": "1"}},
        },
    });
    Some(Volumes {
        volume_name,
        claim_name,
        volume,
        claim,
    })
}

/// The ModelCache (`namespace`, `name`) a model-cache object was made for, from its
/// `cache.kubeairunway.ai/for` annotation.
pub fn made_for(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Option<(String, String)> {
    let (namespace, name) = annotations.get(FOR_ANNOTATION)?.split_once('/')?;
    Some((namespace.to_string(), name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_kernelcache_api::model::ModelCacheSpec;

    fn cache(source: &str) -> ModelCache {
        let mut c = ModelCache::new(
            "qwen",
            ModelCacheSpec {
                source: source.into(),
                ..ModelCacheSpec::default()
            },
        );
        c.metadata.namespace = Some("ml".into());
        c.metadata.uid = Some("u-1".into());
        c
    }

    fn ready(n: i32, size: Option<i64>) -> ModelCacheStatus {
        ModelCacheStatus {
            ready_nodes: n,
            size_bytes: size,
            ..ModelCacheStatus::default()
        }
    }

    #[test]
    fn a_ready_cache_gets_a_local_volume_on_its_ready_nodes_bound_to_its_claim() {
        let v = desired(
            &cache("hf://Qwen/Qwen3-0.6B"),
            &ready(2, Some(1234)),
            "/var/lib/mc/",
        )
        .unwrap();
        assert_eq!(v.volume_name, model_volume("ml", "qwen"));
        assert!(v.volume_name.starts_with("modelcache-"));
        assert_eq!(v.claim_name, "modelcache-qwen");
        let spec = &v.volume["spec"];
        assert_eq!(
            spec["local"]["path"],
            "/var/lib/mc/hub/models--Qwen--Qwen3-0.6B"
        );
        assert_eq!(
            spec["nodeAffinity"]["required"]["nodeSelectorTerms"],
            json!([{"matchExpressions": [{
                "key": "modelcache.kubeairunway.ai/ml.qwen",
                "operator": "In",
                "values": ["true"],
            }]}])
        );
        assert_eq!(spec["accessModes"], json!(["ReadOnlyMany"]));
        assert_eq!(spec["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(spec["storageClassName"], MODEL_STORAGE_CLASS);
        assert_eq!(spec["capacity"]["storage"], "1234");
        assert_eq!(
            spec["claimRef"],
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "ml", "name": "modelcache-qwen"})
        );
        assert_eq!(v.volume["metadata"]["labels"][NAMESPACE_LABEL], "ml");
        let claim = &v.claim;
        assert_eq!(claim["metadata"]["namespace"], "ml");
        assert_eq!(claim["spec"]["volumeName"], v.volume_name);
        assert_eq!(claim["spec"]["storageClassName"], MODEL_STORAGE_CLASS);
        assert_eq!(claim["spec"]["accessModes"], json!(["ReadOnlyMany"]));
        assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1");
        assert_eq!(claim["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(
            claim["metadata"]["ownerReferences"][0]["kind"],
            "ModelCache"
        );
        let annotations = serde_json::from_value(claim["metadata"]["annotations"].clone()).unwrap();
        assert_eq!(made_for(&annotations), Some(("ml".into(), "qwen".into())));
    }

    #[test]
    fn no_volume_before_a_node_is_ready_nor_for_bad_sources() {
        let root = "/r";
        assert!(desired(&cache("hf://Qwen/Qwen3-0.6B"), &ready(0, None), root).is_none());
        // An oci:// source's volume is the folder of the model id it is published as.
        let oci = format!("oci://r.example/acme/m@sha256:{}", "a".repeat(64));
        let volumes = desired(&cache(&oci), &ready(1, None), root).unwrap();
        assert_eq!(
            volumes.volume["spec"]["local"]["path"],
            "/r/hub/models--acme--m"
        );
        assert!(desired(&cache("hf://bad"), &ready(1, None), root).is_none());
        let mut no_uid = cache("hf://Qwen/Qwen3-0.6B");
        no_uid.metadata.uid = None;
        assert!(desired(&no_uid, &ready(1, None), root).is_none());
        let unknown = desired(&cache("hf://Qwen/Qwen3-0.6B"), &ready(1, None), root).unwrap();
        assert_eq!(unknown.volume["spec"]["capacity"]["storage"], "1");
    }

    #[test]
    fn long_names_keep_the_claim_a_valid_name_and_the_label_short() {
        let mut c = cache("hf://o/m");
        c.metadata.name = Some("c".repeat(253));
        let v = desired(&c, &ready(1, None), "/r").unwrap();
        assert!(v.claim_name.len() <= 253);
        let key = v.volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]
            ["matchExpressions"][0]["key"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(key.split_once('/').unwrap().1.len() <= 63);
    }
}
