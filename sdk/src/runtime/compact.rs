//! An owned object as the owned-object caches keep it: its metadata parsed (names,
//! labels and resourceVersions are read on every watch event), everything else (`spec`,
//! `status`, any other top-level field) kept as its JSON text and parsed again only when
//! a reconcile reads the object.
//!
//! Why: a `serde_json::Value` tree costs many times its JSON text (every object with at
//! least one field allocates a B-tree node with room for eleven), and a provider holds one
//! object per ModelDeployment per kind it renders. Measured with the scale benchmark's
//! heap profile (`--features heap-profile`): the provider held about 12 kB of trees per
//! Dynamo `DynamoGraphDeployment` of 1.5 kB of JSON.

use std::borrow::Cow;

use kube::api::{DynamicObject, ObjectMeta, TypeMeta};
use kube::core::DynamicResourceScope;
use kube::discovery::ApiResource;
use serde::{Deserialize, Deserializer};

/// An object of a dynamic kind, its body kept as JSON text.
#[derive(Clone, Debug)]
pub(crate) struct Compact {
    types: Option<TypeMeta>,
    metadata: ObjectMeta,
    /// The top-level fields besides `apiVersion`, `kind` and `metadata`, as a JSON object.
    body: Box<str>,
}

impl From<DynamicObject> for Compact {
    fn from(object: DynamicObject) -> Self {
        Self {
            types: object.types,
            metadata: object.metadata,
            body: object.data.to_string().into_boxed_str(),
        }
    }
}

impl Compact {
    /// The whole object again.
    pub(crate) fn object(&self) -> DynamicObject {
        DynamicObject {
            types: self.types.clone(),
            metadata: self.metadata.clone(),
            // The text was written from a JSON value by `From`: it parses.
            data: serde_json::from_str(&self.body).unwrap_or_default(),
        }
    }
}

impl<'de> Deserialize<'de> for Compact {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        DynamicObject::deserialize(deserializer).map(Self::from)
    }
}

impl kube::Resource for Compact {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
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
    use serde_json::json;

    #[test]
    fn an_object_comes_back_whole_from_its_compact_form() {
        let original = json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "m", "namespace": "ns", "resourceVersion": "7",
                         "labels": {"kubeairunway.ai/model-deployment": "m"}},
            "spec": {"services": {"Frontend": {"replicas": 1, "envs": [{"name": "A", "value": "1"}]}}},
            "status": {"state": "pending"},
            "extra": [1, 2.5, null]
        });
        let compact: Compact = serde_json::from_value(original.clone()).unwrap();
        assert_eq!(compact.resource_version().as_deref(), Some("7"));
        assert_eq!(compact.labels()["kubeairunway.ai/model-deployment"], "m");
        assert!(!compact.body.contains("metadata") && compact.body.contains("pending"));
        assert_eq!(serde_json::to_value(compact.object()).unwrap(), original);
    }
}
