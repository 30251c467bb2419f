//! Detection of the installed upstream CRD, and the check that a rendered object only
//! sets fields the installed schema has (004 §3.12, §13.1).

use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::discovery::ApiResource;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::provider::UpstreamRef;

/// The upstream API as installed in the cluster, at the version the provider renders for.
#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamApi {
    /// API group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Plural resource name.
    pub plural: String,
    /// The version chosen for rendering: the provider's most preferred served version.
    pub version: String,
    /// Every served version of the installed CRD.
    pub served_versions: Vec<String>,
    /// The storage version of the installed CRD.
    pub storage_version: String,
    /// Short hash of the chosen version's schema, to tell schema changes apart.
    pub schema_hash: String,
    schema: Value,
}

/// Why no adapter fits the installed CRD.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DetectError {
    /// The CRD serves none of the versions the provider supports.
    #[error("installed {crd} serves versions [{served}]; this provider supports [{supported}]")]
    NoSupportedVersion {
        /// CRD name.
        crd: String,
        /// Served versions.
        served: String,
        /// Versions the provider has adapters for.
        supported: String,
    },
    /// The CRD is not the one asked for.
    #[error("CRD {found} is not {wanted}")]
    WrongCrd {
        /// Name found.
        found: String,
        /// Name wanted.
        wanted: String,
    },
}

impl UpstreamApi {
    /// Read an installed CRD and choose the provider's adapter version for it.
    pub fn detect(
        crd: &CustomResourceDefinition,
        wanted: &UpstreamRef,
    ) -> Result<Self, DetectError> {
        let found = crd.metadata.name.clone().unwrap_or_default();
        if found != wanted.crd_name() {
            return Err(DetectError::WrongCrd {
                found,
                wanted: wanted.crd_name(),
            });
        }
        let served: Vec<&_> = crd.spec.versions.iter().filter(|v| v.served).collect();
        let chosen = wanted
            .versions
            .iter()
            .find_map(|w| served.iter().find(|v| &v.name == w))
            .ok_or_else(|| DetectError::NoSupportedVersion {
                crd: found.clone(),
                served: served
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                supported: wanted.versions.join(", "),
            })?;
        let schema = chosen
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or(Value::Null);
        let schema_hash = short_hash(&serde_json::to_vec(&schema).unwrap_or_default());
        Ok(Self {
            group: crd.spec.group.clone(),
            kind: crd.spec.names.kind.clone(),
            plural: crd.spec.names.plural.clone(),
            version: chosen.name.clone(),
            served_versions: served.iter().map(|v| v.name.clone()).collect(),
            storage_version: crd
                .spec
                .versions
                .iter()
                .find(|v| v.storage)
                .map(|v| v.name.clone())
                .unwrap_or_default(),
            schema_hash,
            schema,
        })
    }

    /// `group/version` of the chosen version.
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// The chosen version as a kube [`ApiResource`].
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: self.api_version(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }

    /// Whether `object` is of this upstream kind and version.
    pub fn is_upstream_object(&self, object: &Value) -> bool {
        object.get("apiVersion").and_then(Value::as_str) == Some(self.api_version().as_str())
            && object.get("kind").and_then(Value::as_str) == Some(self.kind.as_str())
    }

    /// Field paths `object` sets that the installed schema does not have (sorted, list
    /// items written `[]`). `apiVersion`, `kind`, `metadata` and `status` are not checked.
    pub fn missing_paths(&self, object: &Value) -> Vec<String> {
        let mut missing = BTreeSet::new();
        if let Value::Object(map) = object {
            for (key, value) in map {
                if ["apiVersion", "kind", "metadata", "status"].contains(&key.as_str()) {
                    continue;
                }
                match self.schema.get("properties").and_then(|p| p.get(key)) {
                    Some(sub) => walk(sub, value, key, &mut missing),
                    None if keeps_unknown(&self.schema) => {}
                    None => {
                        missing.insert(key.clone());
                    }
                }
            }
        }
        missing.into_iter().collect()
    }
}

/// The first 8 bytes of the SHA-256 of `data`, as 16 hex digits.
pub(crate) fn short_hash(data: &[u8]) -> String {
    use std::fmt::Write;
    Sha256::digest(data)
        .iter()
        .take(8)
        .fold(String::with_capacity(16), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

fn keeps_unknown(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

fn walk(schema: &Value, value: &Value, path: &str, missing: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            if keeps_unknown(schema) && schema.get("properties").is_none() {
                return;
            }
            if schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true))
                && schema.get("properties").is_none()
            {
                return;
            }
            for (key, v) in map {
                let sub_path = format!("{path}.{key}");
                if let Some(sub) = schema.get("properties").and_then(|p| p.get(key)) {
                    walk(sub, v, &sub_path, missing);
                } else if let Some(additional) = schema.get("additionalProperties") {
                    if additional.is_object() {
                        walk(additional, v, &sub_path, missing);
                    } else if additional == &Value::Bool(false) {
                        missing.insert(sub_path);
                    }
                } else if !keeps_unknown(schema) {
                    missing.insert(sub_path);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    walk(item_schema, item, &format!("{path}[]"), missing);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(versions: &Value) -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": versions,
            },
        }))
        .unwrap()
    }

    fn version(name: &str, storage: bool, schema: &Value) -> Value {
        json!({"name": name, "served": true, "storage": storage, "schema": {"openAPIV3Schema": schema}})
    }

    fn widget_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "size": {"type": "integer"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "items": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                },
            },
        })
    }

    #[test]
    fn picks_the_most_preferred_served_version() {
        let c = crd(&json!([
            version("v1alpha1", false, &widget_schema()),
            version("v1beta1", true, &widget_schema())
        ]));
        let want = UpstreamRef::new("example.com", "Widget", "widgets", &["v1beta1", "v1alpha1"]);
        let api = UpstreamApi::detect(&c, &want).unwrap();
        assert_eq!(api.version, "v1beta1");
        assert_eq!(api.storage_version, "v1beta1");
        assert_eq!(api.api_version(), "example.com/v1beta1");
        let only_old = UpstreamRef::new("example.com", "Widget", "widgets", &["v1alpha1"]);
        assert_eq!(
            UpstreamApi::detect(&c, &only_old).unwrap().version,
            "v1alpha1"
        );
    }

    #[test]
    fn refuses_when_no_adapter_fits() {
        let c = crd(&json!([version("v2", true, &widget_schema())]));
        let want = UpstreamRef::new("example.com", "Widget", "widgets", &["v1beta1", "v1alpha1"]);
        let err = UpstreamApi::detect(&c, &want).unwrap_err();
        assert_eq!(
            err.to_string(),
            "installed widgets.example.com serves versions [v2]; this provider supports [v1beta1, v1alpha1]"
        );
    }

    #[test]
    fn schema_hash_tells_schemas_apart() {
        let want = UpstreamRef::new("example.com", "Widget", "widgets", &["v1"]);
        let a = UpstreamApi::detect(&crd(&json!([version("v1", true, &widget_schema())])), &want)
            .unwrap();
        let b = UpstreamApi::detect(
            &crd(&json!([version("v1", true, &json!({"type": "object"}))])),
            &want,
        )
        .unwrap();
        assert_eq!(a.schema_hash.len(), 16);
        assert_ne!(a.schema_hash, b.schema_hash);
    }

    #[test]
    fn missing_paths_lists_fields_the_schema_lacks() {
        let want = UpstreamRef::new("example.com", "Widget", "widgets", &["v1"]);
        let api = UpstreamApi::detect(&crd(&json!([version("v1", true, &widget_schema())])), &want)
            .unwrap();
        let object = json!({
            "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "labels": {"a": "b"}},
            "spec": {
                "size": 1,
                "colour": "red",
                "labels": {"x": "y"},
                "items": [{"name": "a"}, {"name": "b", "weight": 2}],
                "free": {"anything": {"goes": true}},
            },
            "extra": {},
        });
        assert_eq!(
            api.missing_paths(&object),
            ["extra", "spec.colour", "spec.items[].weight"]
        );
        assert!(api.is_upstream_object(&object));
    }
}
