//! An object as the platform's watch caches keep it: its metadata parsed (names, labels,
//! finalizers and resourceVersions are read on every watch event), everything else
//! (`spec`, `status`, `apiVersion`, `kind`, any other top-level field, and
//! `metadata.managedFields`) kept as its JSON text, parsed again only when a reconcile
//! reads the object, or in part by [`Compact::peek`].
//!
//! Why: a parsed object costs several times its JSON text. A `serde_json::Value` tree
//! allocates a B-tree node with room for eleven entries for every object that has a field
//! (the provider held about 12 kB of trees per Dynamo `DynamoGraphDeployment` of 1.5 kB of
//! JSON), and a typed ModelDeployment is a struct of about 2 kB, most of it optional
//! fields that are absent, plus its strings and status. Every controller holds one
//! ModelDeployment per ModelDeployment in the cluster, and a provider one object per kind
//! it renders. Measured with the scale benchmark's heap profile (`--features
//! heap-profile`, docs/benchmarks.md#where-the-memory-goes).
//!
//! The annotations are kept in the text too: on the objects a provider renders they are
//! long (the identity, the images, hashes), and a map of them parsed costs a B-tree node
//! of about 540 bytes; [`Compact::annotations`] reads them. The last-applied annotation is
//! dropped (no controller reads it).
//!
//! The text is held deflated against the first object of its kind ([`squeeze`]): objects
//! of one kind differ in little more than their names, so each holds a tenth or less of
//! its text.

mod squeeze;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::marker::PhantomData;

use kube::Resource;
use kube::api::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use squeeze::Squeezed;

/// The last-applied annotation of `kubectl apply`, which no cache keeps.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// An object of kind `K`, its metadata parsed and the rest kept as JSON text.
pub struct Compact<K> {
    /// The metadata without `managedFields` and `annotations`.
    metadata: ObjectMeta,
    /// The object as a JSON object's text, its `metadata` holding only `managedFields`
    /// (a field set parsed is a B-tree node per object that has a field) and
    /// `annotations`, deflated.
    body: Squeezed,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            body: self.body.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compact")
            .field("metadata", &self.metadata)
            .field("body", &self.body.text())
            .finish()
    }
}

/// Why a cached object could not be read back.
#[derive(Debug, thiserror::Error)]
#[error("reading the cached object {name}: {source}")]
pub struct Error {
    name: String,
    source: Unreadable,
}

#[derive(Debug, thiserror::Error)]
enum Unreadable {
    #[error("inflating its text: {0}")]
    Inflate(#[from] squeeze::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// `metadata.annotations` of an object's text, the rest skipped.
#[derive(Deserialize)]
struct Annotated {
    metadata: Option<AnnotationsOnly>,
}

#[derive(Deserialize)]
struct AnnotationsOnly {
    annotations: Option<BTreeMap<String, String>>,
}

impl Annotated {
    fn annotations(self) -> BTreeMap<String, String> {
        self.metadata
            .and_then(|m| m.annotations)
            .unwrap_or_default()
    }
}

/// The apiVersion and kind a text names (empty when it names none), read without
/// keeping anything else.
fn kind_of(text: &str) -> (Cow<'_, str>, Cow<'_, str>) {
    #[derive(Deserialize, Default)]
    struct Kind<'a> {
        #[serde(default, borrow, rename = "apiVersion")]
        api_version: Cow<'a, str>,
        #[serde(default, borrow)]
        kind: Cow<'a, str>,
    }
    let k: Kind<'_> = serde_json::from_str(text).unwrap_or_default();
    (k.api_version, k.kind)
}

impl<K: Resource + Serialize> Compact<K> {
    /// Keep `object` compactly.
    ///
    /// # Errors
    /// When `object` does not serialize as a JSON object (a bug in its type).
    pub fn new(mut object: K) -> Result<Self, serde_json::Error> {
        let mut metadata = std::mem::take(object.meta_mut());
        object.meta_mut().managed_fields = metadata.managed_fields.take();
        let mut annotations = metadata.annotations.take();
        if let Some(a) = annotations.as_mut() {
            a.remove(LAST_APPLIED);
        }
        object.meta_mut().annotations = annotations;
        let text = serde_json::to_string(&object)?;
        if !text.starts_with('{') {
            return Err(serde::ser::Error::custom(
                "an object serializes as a JSON object",
            ));
        }
        let (api_version, kind) = kind_of(&text);
        let body =
            Squeezed::new((&api_version, &kind), &text).map_err(serde::ser::Error::custom)?;
        Ok(Self {
            metadata,
            body,
            kind: PhantomData,
        })
    }
}

impl<K> Compact<K> {
    /// The whole object again, parsed from its text.
    ///
    /// # Errors
    /// Never for a `Compact` made from a `K` (the text was written from one).
    pub fn object(&self) -> Result<K, Error>
    where
        K: Resource + DeserializeOwned,
    {
        let unreadable = |source: Unreadable| Error {
            name: self.metadata.name.clone().unwrap_or_default(),
            source,
        };
        let text = self.body.text().map_err(|e| unreadable(e.into()))?;
        let mut object: K = serde_json::from_str(&text).map_err(|e| unreadable(e.into()))?;
        let managed_fields = object.meta_mut().managed_fields.take();
        let annotations = object.meta_mut().annotations.take();
        *object.meta_mut() = ObjectMeta {
            managed_fields,
            annotations,
            ..self.metadata.clone()
        };
        Ok(object)
    }

    /// A part of the object's body, read into a type that names only the fields wanted
    /// (any other field is skipped without being kept): for reading a few fields of many
    /// cached objects without parsing each whole. `None` when the body does not fit `T`.
    pub fn peek<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_str(&self.body.text().ok()?).ok()
    }

    /// The object's annotations (but the last-applied one), read from its text: they are
    /// not in [`Compact::meta`]. (This method is what `compact.annotations()` calls, not
    /// `ResourceExt::annotations`, which would read the parsed metadata.)
    pub fn annotations(&self) -> BTreeMap<String, String> {
        self.peek::<Annotated>()
            .map(Annotated::annotations)
            .unwrap_or_default()
    }
}

/// What of a cached ModelDeployment is read most often, without parsing its spec.
impl Compact<crate::ModelDeployment> {
    /// `spec.model` alone (the rest is skipped, not parsed).
    pub fn model(&self) -> Option<crate::api::ModelSpec> {
        #[derive(Deserialize)]
        struct Only {
            spec: Spec,
        }
        #[derive(Deserialize)]
        struct Spec {
            model: crate::api::ModelSpec,
        }
        Some(self.peek::<Only>()?.spec.model)
    }

    /// The status condition of type `type_`, if any (the rest is skipped, not parsed).
    pub fn condition(
        &self,
        type_: &str,
    ) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
        #[derive(Deserialize)]
        struct Only {
            status: Option<Status>,
        }
        #[derive(Deserialize)]
        struct Status {
            #[serde(default)]
            conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
        }
        self.peek::<Only>()?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)
    }

    /// Its status alone (the spec is skipped, not parsed).
    pub fn status(&self) -> Option<crate::api::ModelDeploymentStatus> {
        #[derive(Deserialize)]
        struct StatusOnly {
            status: Option<crate::api::ModelDeploymentStatus>,
        }
        self.peek::<StatusOnly>().and_then(|s| s.status)
    }

    /// [`crate::ModelDeployment::selected_provider`]: `status.provider.name`, when set.
    pub fn selected_provider(&self) -> Option<String> {
        self.annotations_and_selected_provider().1
    }

    /// [`Compact::annotations`] and [`Self::selected_provider`] from one reading of the
    /// text: what the controllers' predicates hash on every watch event.
    pub fn annotations_and_selected_provider(&self) -> (BTreeMap<String, String>, Option<String>) {
        #[derive(Deserialize)]
        struct Both {
            metadata: Option<AnnotationsOnly>,
            status: Option<Status>,
        }
        #[derive(Deserialize)]
        struct Status {
            provider: Option<Provider>,
        }
        #[derive(Deserialize)]
        struct Provider {
            name: Option<String>,
        }
        let Some(both) = self.peek::<Both>() else {
            return (BTreeMap::new(), None);
        };
        let provider = both
            .status
            .and_then(|s| s.provider?.name)
            .filter(|n| !n.is_empty());
        let annotated = Annotated {
            metadata: both.metadata,
        };
        (annotated.annotations(), provider)
    }
}

impl Compact<crate::ModelDeployment> {
    /// `spec.gateway` alone (the rest of the spec is skipped, not parsed).
    pub fn gateway(&self) -> Option<crate::api::GatewaySpec> {
        #[derive(Deserialize)]
        struct Only {
            spec: Spec,
        }
        #[derive(Deserialize)]
        struct Spec {
            gateway: Option<crate::api::GatewaySpec>,
        }
        self.peek::<Only>()?.spec.gateway
    }

    /// `spec.kernelCache.name`: the KernelCache it names, if any (the rest of the spec is
    /// skipped, not parsed).
    pub fn kernel_cache_name(&self) -> Option<String> {
        #[derive(Deserialize)]
        struct Named {
            spec: Spec,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Spec {
            kernel_cache: Option<Reference>,
        }
        #[derive(Deserialize)]
        struct Reference {
            name: String,
        }
        Some(self.peek::<Named>()?.spec.kernel_cache?.name)
    }
}

impl<'de, K> Deserialize<'de> for Compact<K>
where
    K: Resource + Serialize + Deserialize<'de>,
{
    /// Read as a `K` (so that whatever is cached is known to be one), then kept compactly.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let object = K::deserialize(deserializer)?;
        Self::new(object).map_err(serde::de::Error::custom)
    }
}

impl<K: Resource> Resource for Compact<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use kube::api::DynamicObject;
    use serde_json::json;

    impl<K> Compact<K> {
        fn text(&self) -> String {
            self.body.text().unwrap()
        }
    }

    #[test]
    fn a_dynamic_object_comes_back_whole() {
        let original = json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "m", "namespace": "ns", "resourceVersion": "7",
                         "labels": {"kubeairunway.ai/model-deployment": "m"}},
            "spec": {"services": {"Frontend": {"replicas": 1, "envs": [{"name": "A", "value": "1"}]}}},
            "status": {"state": "pending"},
            "extra": [1, 2.5, null]
        });
        let compact: Compact<DynamicObject> = serde_json::from_value(original.clone()).unwrap();
        assert_eq!(compact.resource_version().as_deref(), Some("7"));
        assert_eq!(compact.labels()["kubeairunway.ai/model-deployment"], "m");
        assert!(!compact.text().contains("resourceVersion") && compact.text().contains("pending"));
        assert_eq!(
            serde_json::to_value(compact.object().unwrap()).unwrap(),
            original
        );
    }

    #[test]
    fn a_model_deployment_comes_back_whole_and_its_status_is_read_alone() {
        let original = json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns", "generation": 3,
                         "finalizers": ["kubeairunway.ai/dynamo"]},
            "spec": {"model": {"id": "Qwen/Qwen3-0.6B"}, "engine": {"type": "vllm"},
                     "resources": {"gpu": {"count": 1}}},
            "status": {"phase": "Deploying", "provider": {"name": "dynamo"}}
        });
        let md: crate::ModelDeployment = serde_json::from_value(original.clone()).unwrap();
        let compact: Compact<crate::ModelDeployment> = serde_json::from_value(original).unwrap();
        assert_eq!(compact.meta().generation, Some(3));
        assert_eq!(
            serde_json::to_value(compact.object().unwrap()).unwrap(),
            serde_json::to_value(&md).unwrap()
        );
        assert_eq!(compact.selected_provider().as_deref(), Some("dynamo"));
        let mut annotated = md.clone();
        annotated.metadata.annotations = Some(BTreeMap::from([("a".into(), "1".into())]));
        assert_eq!(
            Compact::new(annotated)
                .unwrap()
                .annotations_and_selected_provider(),
            (
                BTreeMap::from([("a".to_string(), "1".to_string())]),
                Some("dynamo".to_string())
            )
        );
        assert_eq!(compact.kernel_cache_name(), None);
        let mut named = md.clone();
        named.spec.kernel_cache =
            Some(serde_json::from_value(json!({"name": "llama-kernels"})).unwrap());
        assert_eq!(
            Compact::new(named).unwrap().kernel_cache_name().as_deref(),
            Some("llama-kernels")
        );
        assert_eq!(
            serde_json::to_value(compact.status()).unwrap(),
            serde_json::to_value(&md.status).unwrap()
        );
        let mut unselected = md.clone();
        unselected.status = None;
        let unselected = Compact::new(unselected).unwrap();
        assert_eq!(unselected.selected_provider(), None);
        assert!(unselected.status().is_none());
        let mut empty = md;
        empty
            .status
            .as_mut()
            .unwrap()
            .provider
            .as_mut()
            .unwrap()
            .name = Some(String::new());
        assert_eq!(Compact::new(empty).unwrap().selected_provider(), None);
    }

    #[test]
    fn annotations_are_kept_in_the_text_and_the_last_applied_one_is_dropped() {
        let original = json!({
            "apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": "m", "namespace": "ns",
                         "annotations": {"kubeairunway.ai/images": "a,b",
                                         "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {}
        });
        let compact: Compact<DynamicObject> = serde_json::from_value(original).unwrap();
        assert!(compact.meta().annotations.is_none());
        let want = BTreeMap::from([("kubeairunway.ai/images".to_string(), "a,b".to_string())]);
        assert_eq!(compact.annotations(), want);
        assert_eq!(compact.object().unwrap().metadata.annotations, Some(want));
        assert!(!compact.text().contains("last-applied"));
        let bare: Compact<DynamicObject> =
            serde_json::from_value(json!({"metadata": {"name": "b"}})).unwrap();
        assert!(bare.annotations().is_empty());
    }

    #[test]
    fn managed_fields_are_kept_as_text_and_come_back() {
        let original = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u",
                         "managedFields": [{"manager": "core", "operation": "Apply", "apiVersion": "v1",
                                            "fieldsType": "FieldsV1",
                                            "fieldsV1": {"f:data": {"f:a": {}}}}]},
            "data": {"a": "1"}
        });
        let compact: Compact<DynamicObject> = serde_json::from_value(original.clone()).unwrap();
        assert!(compact.meta().managed_fields.is_none());
        assert_eq!(compact.meta().uid.as_deref(), Some("u"));
        assert!(compact.text().contains("f:data"));
        assert_eq!(
            serde_json::to_value(compact.object().unwrap()).unwrap(),
            original
        );
    }

    #[test]
    fn an_object_of_metadata_only_comes_back() {
        let compact: Compact<DynamicObject> = Compact::new(DynamicObject::new(
            "x",
            &kube::discovery::ApiResource::erase::<crate::ModelDeployment>(&()),
        ))
        .unwrap();
        let back = compact.object().unwrap();
        assert_eq!(back.name_any(), "x");
        assert_eq!(back.types.unwrap().kind, "ModelDeployment");
    }

    #[test]
    fn what_is_not_the_kind_is_refused_when_read_from_a_watch() {
        let not_a_model_deployment = json!({"metadata": {"name": "m"}, "spec": {"model": 7}});
        assert!(
            serde_json::from_value::<Compact<crate::ModelDeployment>>(not_a_model_deployment)
                .is_err()
        );
    }

    /// `spec.model` and one condition are read without the rest.
    #[test]
    fn the_model_and_a_condition_are_peeked() {
        let md: crate::ModelDeployment = serde_json::from_value(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m"},
            "spec": {"model": {"id": "acme/tiny", "cacheRef": {"name": "c"}}},
            "status": {"conditions": [{"type": "ModelCacheReady", "status": "True", "reason": "R",
                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
        .unwrap();
        let compact = Compact::new(md).unwrap();
        let model = compact.model().unwrap();
        assert_eq!(model.id.as_deref(), Some("acme/tiny"));
        assert_eq!(model.cache_ref.unwrap().name, "c");
        assert_eq!(compact.condition("ModelCacheReady").unwrap().status, "True");
        assert_eq!(compact.condition("KernelCacheReady"), None);
    }
}
