//! What every rendered object carries, whichever provider renders it: namespace, owner
//! reference, the platform's labels, and on pod templates the pod labels and
//! annotations of the ModelDeployment.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use crate::api::ModelDeployment;
use crate::labels;
use crate::provider::Provider;
use crate::upstream::UpstreamApi;

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

/// Hash of the identity fields: `model.id`, `model.source`, `engine.type`,
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

/// The replicas of each role of `md`, as recorded in [`labels::SCALE`]:
/// `replicas=<n>`, then `prefill=<n>` and `decode=<n>` when those roles are set.
pub fn scale(md: &ModelDeployment) -> String {
    let s = &md.spec.scaling;
    let mut roles = vec![format!("replicas={}", s.replicas)];
    for (role, scaling) in [("prefill", &s.prefill), ("decode", &s.decode)] {
        if let Some(c) = scaling {
            roles.push(format!("{role}={}", c.replicas));
        }
    }
    roles.join(",")
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

/// Put namespace, owner reference, labels and (on the primary object) the identity,
/// scale and immutable-fields annotations on a rendered object. Labels the provider set are kept
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
        annotations.insert(labels::SCALE.to_string(), scale(md));
        if let Some(hash) = hash {
            annotations.insert(labels::IMMUTABLE_HASH.to_string(), hash);
        }
    }
}

/// Hash of an object as finished (without its own [`labels::RENDERED_HASH`]
/// annotation): the runtime applies an object again only when it changes (or the live
/// object drifted).
pub fn rendered_hash(object: &DynamicObject) -> String {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(a) = value
        .pointer_mut("/metadata/annotations")
        .and_then(serde_json::Value::as_object_mut)
    {
        a.remove(labels::RENDERED_HASH);
    }
    crate::upstream::short_hash(value.to_string().as_bytes())
}

/// Every container image the objects name (what the runtime reports in
/// `status.provider.images` and records in [`labels::IMAGES`]): each non-empty string
/// under a key `image` in their specs (pod templates' containers and init containers, an upstream's own image
/// field), never in a ConfigMap's or Secret's data; sorted, each once.
pub fn images<'a>(objects: impl IntoIterator<Item = &'a DynamicObject>) -> Vec<String> {
    fn walk(value: &Value, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    match v {
                        Value::String(s) if key == "image" && !s.trim().is_empty() => {
                            out.insert(s.trim().to_string());
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for object in objects {
        if let Value::Object(map) = &object.data {
            map.iter()
                .filter(|(key, _)| {
                    !["data", "stringData", "binaryData", "status"].contains(&key.as_str())
                })
                .for_each(|(_, v)| walk(v, &mut out));
        }
    }
    out.into_iter().collect()
}

/// Why rendered objects cannot be applied: fields the installed upstream schema lacks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "installed {crd} {version} (schema {schema_hash}) has no field {}; nothing was applied",
    missing.join(", ")
)]
pub struct SchemaMismatch {
    /// The upstream CRD's name.
    pub crd: String,
    /// The version rendered for.
    pub version: String,
    /// Hash of that version's schema.
    pub schema_hash: String,
    /// The field paths the schema does not have (sorted).
    pub missing: Vec<String>,
}

/// Why [`finalize`] applies nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unappliable {
    /// `spec.provider.overrides` was refused.
    #[error(transparent)]
    Override(#[from] crate::overrides::Refused),
    /// The rendered objects set fields the installed schema lacks.
    #[error(transparent)]
    Schema(#[from] SchemaMismatch),
}

impl Unappliable {
    /// The `ProviderCompatible=False` reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Unappliable::Override(refused) => refused.reason(),
            Unappliable::Schema(_) => crate::conditions::reasons::UPSTREAM_SCHEMA_MISMATCH,
        }
    }
}

/// The objects applied for `md`: `objects` as [`Provider::render`] returned them (primary
/// first), the primary with the overrides' merge patch merged in ([`crate::overrides`]),
/// each [`finish`]ed in its role (the primary with the provider's
/// [`Provider::immutable_fields`] for its kind, the others as supporting objects),
/// stamped with [`rendered_hash`], and checked against the installed upstream schema. The
/// runtime applies exactly this, and previews (`kubeairunway render`) print exactly this.
pub fn finalize<P: Provider + ?Sized>(
    provider: &P,
    md: &ModelDeployment,
    api: &UpstreamApi,
    mut objects: Vec<DynamicObject>,
) -> Result<Vec<DynamicObject>, Unappliable> {
    merge_overrides(provider, md, api, &mut objects)?;
    let primary_kind = objects
        .first()
        .and_then(|o| o.types.as_ref())
        .map(|t| t.kind.clone())
        .unwrap_or_default();
    for (i, object) in objects.iter_mut().enumerate() {
        let role = if i == 0 {
            Role::Primary {
                immutable_fields: provider.immutable_fields(&primary_kind),
            }
        } else {
            Role::Supporting
        };
        finish(object, md, provider.name(), role);
    }
    let rendered_images = images(&objects).join(",");
    if let Some(primary) = objects.first_mut() {
        primary
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::IMAGES.to_string(), rendered_images);
    }
    for object in &mut objects {
        let hash = rendered_hash(object);
        object
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::RENDERED_HASH.to_string(), hash);
    }
    let mut missing = BTreeSet::new();
    for object in &objects {
        let value = serde_json::to_value(object).unwrap_or_default();
        if api.is_upstream_object(&value) {
            missing.extend(api.missing_paths(&value));
        }
    }
    if missing.is_empty() {
        return Ok(objects);
    }
    Err(Unappliable::Schema(SchemaMismatch {
        crd: provider.upstream().crd_name(),
        version: api.version.clone(),
        schema_hash: api.schema_hash.clone(),
        missing: missing.into_iter().collect(),
    }))
}

/// Merge the merge patch of `md`'s overrides (all but the provider's typed keys) into the
/// primary object, checked ([`crate::overrides::apply`]).
fn merge_overrides<P: Provider + ?Sized>(
    provider: &P,
    md: &ModelDeployment,
    api: &UpstreamApi,
    objects: &mut [DynamicObject],
) -> Result<(), crate::overrides::Refused> {
    let (Some(patch), Some(primary)) = (
        crate::overrides::patch(md, provider.typed_overrides()),
        objects.first_mut(),
    ) else {
        return Ok(());
    };
    let mut value = serde_json::to_value(&*primary).unwrap_or_default();
    crate::overrides::apply(&mut value, &patch, api)?;
    *primary =
        serde_json::from_value(value).map_err(|e| crate::overrides::Refused::Unreadable {
            message: e.to_string(),
        })?;
    Ok(())
}

/// Whether `object` is owned by `md` (an owner reference with its uid).
pub fn owned_by(object: &impl Resource, md: &ModelDeployment) -> bool {
    let uid = md.uid();
    object
        .owner_references()
        .iter()
        .any(|o| Some(&o.uid) == uid.as_ref())
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
        assert_eq!(obj.annotations()[labels::SCALE], "replicas=1");
        assert!(!obj.annotations().contains_key(labels::IMMUTABLE_HASH));
    }

    #[test]
    fn scale_names_the_replicas_of_each_role_set() {
        assert_eq!(
            scale(&md(json!({"scaling": {"replicas": 3}}))),
            "replicas=3"
        );
        assert_eq!(
            scale(&md(
                json!({"scaling": {"replicas": 1, "prefill": {"replicas": 2}, "decode": {"replicas": 4}}})
            )),
            "replicas=1,prefill=2,decode=4"
        );
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

    struct Widgets;

    impl Provider for Widgets {
        fn name(&self) -> &'static str {
            "widgets"
        }
        fn config(&self) -> crate::InferenceProviderConfigSpec {
            crate::InferenceProviderConfigSpec::default()
        }
        fn upstream(&self) -> crate::UpstreamRef {
            crate::UpstreamRef::new("example.com", "Widget", "widgets", &["v1"])
        }
        fn check(&self, _: &ModelDeployment) -> Result<(), crate::Incompatible> {
            Ok(())
        }
        fn render(
            &self,
            _: &ModelDeployment,
            _: &UpstreamApi,
        ) -> Result<crate::Rendered, crate::RenderError> {
            Ok(crate::Rendered::default())
        }
        fn observe(&self, _: &ModelDeployment, _: &crate::Live) -> crate::Observed {
            crate::Observed::deploying("")
        }
        fn immutable_fields(&self, kind: &str) -> &'static [&'static str] {
            if kind == "Widget" {
                &["spec.size"]
            } else {
                &[]
            }
        }
    }

    fn widget_api() -> UpstreamApi {
        let crd = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                         "type": "object",
                         "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]},
        }))
        .unwrap();
        UpstreamApi::detect(&crd, &Widgets.upstream()).unwrap()
    }

    fn objects(spec: &serde_json::Value) -> Vec<DynamicObject> {
        vec![
            serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "m"}, "spec": spec})).unwrap(),
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m-config"}, "data": {"a": "b"}})).unwrap(),
        ]
    }

    #[test]
    fn finalize_finishes_each_object_in_its_role_and_checks_the_schema() {
        let m = md(json!({}));
        let done = finalize(&Widgets, &m, &widget_api(), objects(&json!({"size": 1}))).unwrap();
        let (primary, supporting) = (&done[0], &done[1]);
        assert!(primary.annotations().contains_key(labels::IDENTITY));
        assert!(primary.annotations().contains_key(labels::IMMUTABLE_HASH));
        assert_eq!(primary.annotations()[labels::SCALE], "replicas=1");
        assert_eq!(
            primary.annotations()[labels::IMAGES],
            "",
            "widgets name no image"
        );
        assert_eq!(
            primary.annotations()[labels::RENDERED_HASH],
            rendered_hash(primary),
            "the hash covers the records"
        );
        assert!(!supporting.annotations().contains_key(labels::IDENTITY));
        assert!(!supporting.annotations().contains_key(labels::IMAGES));
        for o in &done {
            assert_eq!(o.metadata.namespace.as_deref(), Some("ns"));
            assert_eq!(
                o.labels().get(labels::PROVIDER).map(String::as_str),
                Some("widgets")
            );
        }

        let err = finalize(
            &Widgets,
            &m,
            &widget_api(),
            objects(&json!({"size": 1, "colour": "red"})),
        )
        .unwrap_err();
        let Unappliable::Schema(err) = err else {
            panic!("{err}")
        };
        assert_eq!(err.missing, ["spec.colour"]);
        assert_eq!(
            err.to_string(),
            format!(
                "installed widgets.example.com v1 (schema {}) has no field spec.colour; nothing was applied",
                widget_api().schema_hash
            )
        );
    }

    #[test]
    fn images_are_every_image_in_the_specs_sorted_once() {
        let objects: Vec<DynamicObject> = [
            json!({"apiVersion": "example.com/v1", "kind": "Server", "metadata": {"name": "a"},
                   "spec": {"image": "llama.cpp:b1", "template": {"spec": {
                       "initContainers": [{"name": "i", "image": "busybox:1"}],
                       "containers": [{"name": "c", "image": "llama.cpp:b1"}, {"name": "s", "image": " "}]}}}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}, "data": {"image": "not-an-image"}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "c"},
                   "spec": {"template": {"spec": {"containers": [{"name": "v", "image": "vllm/vllm-openai:v0.11.0"}]}}},
                   "status": {"image": "not-rendered"}}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
        assert_eq!(
            images(&objects),
            ["busybox:1", "llama.cpp:b1", "vllm/vllm-openai:v0.11.0"]
        );
    }
}
