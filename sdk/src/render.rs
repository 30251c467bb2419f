//! What every rendered object carries, whichever provider renders it: namespace, owner
//! reference, the platform's labels (004 §4.12), and on pod templates the pod labels and
//! annotations of the ModelDeployment.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use kube::{Resource, ResourceExt};

use crate::api::ModelDeployment;
use crate::labels;

/// Labels for every serving pod: `spec.podTemplate.metadata.labels` plus
/// `kubeairunway.ai/model-deployment: <name>` (which the platform relies on and the user
/// cannot override).
pub fn pod_labels(md: &ModelDeployment) -> BTreeMap<String, String> {
    let mut out = md
        .spec
        .pod_template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    out.insert(labels::MODEL_DEPLOYMENT.to_string(), md.name_any());
    out
}

/// Annotations for every serving pod: `spec.podTemplate.metadata.annotations`.
pub fn pod_annotations(md: &ModelDeployment) -> BTreeMap<String, String> {
    md.spec
        .pod_template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default()
}

/// Labels for an upstream object: the ModelDeployment's `kubeairunway.ai/` labels, and
/// `managed-by`, `provider` and `model-deployment`.
pub fn object_labels(md: &ModelDeployment, provider: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = md
        .labels()
        .iter()
        .filter(|(k, _)| k.starts_with(labels::PROPAGATED_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert(
        labels::MANAGED_BY.to_string(),
        labels::MANAGED_BY_VALUE.to_string(),
    );
    out.insert(labels::PROVIDER.to_string(), provider.to_string());
    out.insert(labels::MODEL_DEPLOYMENT.to_string(), md.name_any());
    out
}

/// Hash of the identity fields (004 §4.11): `model.id`, `model.source`, `engine.type`,
/// `provider.name`, `serving.mode`. A change means delete and recreate.
pub fn identity(md: &ModelDeployment) -> String {
    let s = &md.spec;
    let fields = serde_json::json!([
        s.model.id,
        s.model.source,
        s.engine.type_,
        s.provider_name(),
        s.serving.mode,
    ]);
    crate::upstream::short_hash(fields.to_string().as_bytes())
}

/// Hash of the values `object` has at `paths` (dot paths; an absent value counts as
/// `null`), or `None` when there are no paths. Stored on the primary object as
/// [`labels::IMMUTABLE_HASH`]: a change means the upstream would refuse an update.
pub fn immutable_hash(object: &serde_json::Value, paths: &[&str]) -> Option<String> {
    if paths.is_empty() {
        return None;
    }
    let values: Vec<&serde_json::Value> = paths
        .iter()
        .map(|path| {
            path.split('.')
                .try_fold(object, |v, key| v.get(key))
                .unwrap_or(&serde_json::Value::Null)
        })
        .collect();
    let text = serde_json::to_string(&values).unwrap_or_default();
    Some(crate::upstream::short_hash(text.as_bytes()))
}

/// The owner reference of objects created for `md` (`controller: true`,
/// `blockOwnerDeletion: true`).
pub fn owner_reference(md: &ModelDeployment) -> Option<OwnerReference> {
    let mut owner = md.controller_owner_ref(&())?;
    owner.block_owner_deletion = Some(true);
    Some(owner)
}

/// How [`finish`] treats an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role<'a> {
    /// The primary object, with the paths its upstream declares immutable.
    Primary {
        /// [`crate::Provider::immutable_fields`] for its kind.
        immutable_fields: &'a [&'a str],
    },
    /// An object the primary depends on.
    Supporting,
}

/// Put namespace, owner reference, labels and (on the primary object) the identity and
/// immutable-fields annotations on a rendered object. Labels the provider set are kept
/// unless they clash with the platform's.
pub fn finish(object: &mut DynamicObject, md: &ModelDeployment, provider: &str, role: Role<'_>) {
    object.metadata.namespace = md.namespace();
    object.metadata.owner_references = owner_reference(md).map(|o| vec![o]);
    let mut l = object.metadata.labels.take().unwrap_or_default();
    l.extend(object_labels(md, provider));
    object.metadata.labels = Some(l);
    if let Role::Primary { immutable_fields } = role {
        let hash = serde_json::to_value(&*object)
            .ok()
            .and_then(|value| immutable_hash(&value, immutable_fields));
        let annotations = object
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        annotations.insert(labels::IDENTITY.to_string(), identity(md));
        if let Some(hash) = hash {
            annotations.insert(labels::IMMUTABLE_HASH.to_string(), hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn md(extra: serde_json::Value) -> ModelDeployment {
        let mut v = json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u-1",
                         "labels": {"kubeairunway.ai/team": "a", "app": "x"}},
            "spec": {"model": {"id": "a/b"}, "engine": {"type": "vllm"},
                     "podTemplate": {"metadata": {"labels": {"tier": "gold", "kubeairunway.ai/model-deployment": "spoof"},
                                                  "annotations": {"note": "n"}}}},
        });
        if let serde_json::Value::Object(m) = extra {
            for (k, val) in m {
                v["spec"][k] = val;
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pod_metadata_carries_the_model_deployment_label() {
        let m = md(json!({}));
        assert_eq!(pod_labels(&m).get("tier").map(String::as_str), Some("gold"));
        assert_eq!(
            pod_labels(&m)
                .get(labels::MODEL_DEPLOYMENT)
                .map(String::as_str),
            Some("m")
        );
        assert_eq!(
            pod_annotations(&m).get("note").map(String::as_str),
            Some("n")
        );
    }

    #[test]
    fn only_platform_labels_propagate_to_the_object() {
        let l = object_labels(&md(json!({})), "kaito");
        assert_eq!(l.get("kubeairunway.ai/team").map(String::as_str), Some("a"));
        assert!(!l.contains_key("app"));
        assert_eq!(
            l.get(labels::MANAGED_BY).map(String::as_str),
            Some("kubeairunway")
        );
        assert_eq!(l.get(labels::PROVIDER).map(String::as_str), Some("kaito"));
    }

    #[test]
    fn identity_changes_only_with_identity_fields() {
        let base = identity(&md(json!({})));
        assert_eq!(
            base,
            identity(&md(json!({"scaling": {"replicas": 3}, "image": "x"})))
        );
        assert_ne!(base, identity(&md(json!({"engine": {"type": "sglang"}}))));
        assert_ne!(base, identity(&md(json!({"model": {"id": "c/d"}}))));
        assert_ne!(
            base,
            identity(&md(json!({"serving": {"mode": "disaggregated"}})))
        );
        assert_ne!(base, identity(&md(json!({"provider": {"name": "other"}}))));
    }

    #[test]
    fn finish_sets_owner_namespace_and_labels() {
        let m = md(json!({}));
        let mut obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "m", "labels": {"own": "1"}}
        }))
        .unwrap();
        finish(
            &mut obj,
            &m,
            "example",
            Role::Primary {
                immutable_fields: &[],
            },
        );
        assert_eq!(obj.metadata.namespace.as_deref(), Some("ns"));
        let owner = &obj.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        assert_eq!(owner.uid, "u-1");
        assert_eq!(obj.labels().get("own").map(String::as_str), Some("1"));
        assert!(obj.annotations().contains_key(labels::IDENTITY));
        assert!(!obj.annotations().contains_key(labels::IMMUTABLE_HASH));
    }

    #[test]
    fn immutable_hash_follows_the_values_at_the_paths() {
        let a = json!({"inference": {"preset": {"name": "x", "presetOptions": {"modelAccessSecret": "s1"}}},
                       "resource": {"count": 1}});
        let mut b = a.clone();
        b["resource"]["count"] = json!(2);
        let paths = ["inference.preset"];
        assert_eq!(immutable_hash(&a, &paths), immutable_hash(&b, &paths));
        let mut c = a.clone();
        c["inference"]["preset"]["presetOptions"]["modelAccessSecret"] = json!("s2");
        assert_ne!(immutable_hash(&a, &paths), immutable_hash(&c, &paths));
        let mut removed = a.clone();
        removed["inference"]["preset"]["presetOptions"] = json!(null);
        assert_ne!(immutable_hash(&a, &paths), immutable_hash(&removed, &paths));
        assert_eq!(immutable_hash(&a, &[]), None);
    }
}
