//! The CRDs of `kubeairunway.ai`, as the API server should get them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use super::{InferenceProviderConfig, ModelDeployment};

/// The CRDs of the core API group, ready to apply: [`ModelDeployment`] and
/// [`InferenceProviderConfig`]. Prefer this over `ModelDeployment::crd()`, which still
/// carries `nullable` markers (see [`without_nullable`]).
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        without_nullable(ModelDeployment::crd()),
        without_nullable(InferenceProviderConfig::crd()),
    ]
}

/// The OpenAPI v3 schema of the CRD of `kind` in [`all`] (its one version), computed once.
pub fn schema(kind: &str) -> Option<&'static serde_json::Value> {
    static SCHEMAS: std::sync::LazyLock<Vec<(String, serde_json::Value)>> =
        std::sync::LazyLock::new(|| {
            all()
                .into_iter()
                .filter_map(|crd| {
                    let schema = crd
                        .spec
                        .versions
                        .first()?
                        .schema
                        .as_ref()?
                        .open_api_v3_schema
                        .as_ref()?;
                    Some((
                        crd.spec.names.kind.clone(),
                        serde_json::to_value(schema).ok()?,
                    ))
                })
                .collect()
        });
    SCHEMAS.iter().find(|(k, _)| k == kind).map(|(_, s)| s)
}

/// Make a derived CRD's schema say what Kubernetes means:
///
/// - drop every `nullable: true` that kube's schema generator adds for `Option` fields:
///   our types leave unset fields out and never write `null`, and without `nullable` the
///   API server prunes a user's `null` instead of storing it, so "absent" means one thing
///   to the CEL rules (`has()`) and to every controller;
/// - object references whose `name` Kubernetes allows to be empty (the `name` of
///   `configMapKeyRef` and `secretKeyRef`) get `default: ""` instead of being required,
///   as in Kubernetes' own schemas, so manifests that omit it are accepted and parse.
pub fn without_nullable(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let mut value = serde_json::to_value(&crd).unwrap_or_default();
    normalize(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

fn normalize(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            if map.get("nullable") == Some(&Value::Bool(true)) {
                map.remove("nullable");
            }
            let empty_name_allowed = map
                .get("properties")
                .and_then(|p| p.get("name"))
                .and_then(|n| n.get("description"))
                .and_then(Value::as_str)
                .is_some_and(|d| d.contains("allowed to be empty"));
            if empty_name_allowed {
                if let Some(Value::Array(required)) = map.get_mut("required") {
                    required.retain(|r| r != "name");
                }
                if let Some(Value::Object(name)) =
                    map.get_mut("properties").and_then(|p| p.get_mut("name"))
                {
                    name.insert("default".into(), Value::String(String::new()));
                }
            }
            map.values_mut().for_each(normalize);
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_key_ref_name_may_be_omitted() {
        let crd = serde_json::to_value(&all()[0]).unwrap();
        let value_from = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["env"]["items"]["properties"]["valueFrom"]["properties"];
        for selector in ["secretKeyRef", "configMapKeyRef"] {
            assert_eq!(
                value_from[selector]["required"],
                serde_json::json!(["key"]),
                "{selector}"
            );
            assert_eq!(
                value_from[selector]["properties"]["name"]["default"], "",
                "{selector}"
            );
        }
    }

    #[test]
    fn no_nullable_left() {
        for crd in all() {
            let text = serde_json::to_string(&crd).unwrap();
            assert!(
                !text.contains("\"nullable\""),
                "{:?} still has nullable",
                crd.metadata.name
            );
        }
    }
}
