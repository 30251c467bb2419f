//! Reading ModelDeployments a person wrote: YAML (one or more documents, or a `List` as
//! `kubectl get -o yaml` prints it), checked the way the cluster would check them: the
//! typed schema (unknown fields are dropped by the API server, so they warn), defaults
//! as the mutating webhook applies them, and the validation rules with their messages.
//!
//! YAML is read as kubectl reads it (YAML 1.1): an unquoted `yes`, `on` or `true` is a
//! boolean, and a boolean where a string belongs is refused, with a hint to quote it.

use kubeairunway_core::validation;
use kubeairunway_sdk::{API_VERSION, ModelDeployment};
use serde_json::Value;

/// A ModelDeployment read from a document, or why it is not one that can be applied.
#[derive(Debug)]
pub struct Document {
    /// Where it came from: `file` or `file#N` when the file has several documents.
    pub origin: String,
    /// The ModelDeployment and its warnings, or the problems found.
    pub result: Result<Loaded, Vec<String>>,
}

/// A valid ModelDeployment.
#[derive(Debug)]
pub struct Loaded {
    /// The ModelDeployment, defaults applied.
    pub md: ModelDeployment,
    /// What the cluster would warn about (unknown fields, ignored settings).
    pub warnings: Vec<String>,
}

/// Read every ModelDeployment in `text`; those without a namespace get `namespace`.
pub fn read(text: &str, origin: &str, namespace: &str) -> anyhow::Result<Vec<Document>> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    let mut items = Vec::new();
    for doc in docs {
        if doc.get("kind").and_then(Value::as_str) == Some("List") {
            items.extend(
                doc.get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            );
        } else {
            items.push(doc);
        }
    }
    let several = items.len() > 1;
    Ok(items
        .into_iter()
        .enumerate()
        .map(|(i, doc)| Document {
            origin: if several {
                format!("{origin}#{}", i + 1)
            } else {
                origin.to_string()
            },
            result: load(doc, namespace),
        })
        .collect())
}

/// Check one document.
fn load(mut doc: Value, namespace: &str) -> Result<Loaded, Vec<String>> {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != "ModelDeployment" || api_version != API_VERSION {
        return Err(vec![format!(
            "this is {}, not a ModelDeployment ({API_VERSION})",
            if kind.is_empty() {
                "a document without a kind".to_string()
            } else {
                format!("a {kind} ({api_version})")
            }
        )]);
    }
    if doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(vec!["metadata.name: Required value".to_string()]);
    }
    if doc
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
        && let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.insert("namespace".into(), Value::String(namespace.to_string()));
    }
    if let Some(spec) = doc.get_mut("spec") {
        kubeairunway_sdk::defaults::apply(spec);
    }

    let mut unknown = Vec::new();
    let mut note = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
    let typed: Result<ModelDeployment, _> =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(doc, &mut note));
    let md = typed.map_err(|e| {
        let inner = e.inner().to_string();
        let hint = if inner.contains("invalid type: boolean") {
            " (YAML reads unquoted yes, no, on, off, y, n, true and false as booleans: quote the value)"
        } else {
            ""
        };
        vec![format!("{}: {inner}{hint}", e.path())]
    })?;
    let mut warnings: Vec<String> = unknown
        .into_iter()
        .filter(|p| p != "apiVersion" && p != "kind")
        .map(|p| format!("unknown field \"{p}\": the API server drops it"))
        .collect();

    let v = validation::validate(&md.spec);
    if !v.is_valid() {
        return Err(v
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect());
    }
    warnings.extend(v.warnings);
    Ok(Loaded { md, warnings })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    fn one(text: &str) -> Result<Loaded, Vec<String>> {
        let mut docs = read(text, "md.yaml", "team").unwrap();
        assert_eq!(docs.len(), 1);
        docs.remove(0).result
    }

    const HEAD: &str =
        "apiVersion: kubeairunway.ai/v1alpha1\nkind: ModelDeployment\nmetadata: {name: m}\n";

    #[test]
    fn a_valid_manifest_gets_its_namespace_and_defaults() {
        let loaded = one(&format!(
            "{HEAD}spec:\n  model: {{id: a/b}}\n  engine: {{type: vllm}}\n  resources: {{gpu: {{count: 1}}}}\n"
        ))
        .unwrap();
        assert_eq!(loaded.md.namespace().as_deref(), Some("team"));
        assert_eq!(loaded.md.spec.scaling.replicas, 1);
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    }

    /// `kubeairunway render` shows the default core's webhook writes: a GPU engine with no
    /// GPU request gets one GPU.
    #[test]
    fn a_gpu_engine_without_a_gpu_request_renders_with_one_gpu() {
        let loaded = one(&format!(
            "{HEAD}spec:\n  model: {{id: a/b}}\n  engine: {{type: vllm}}\n"
        ))
        .unwrap();
        assert_eq!(loaded.md.spec.gpu_count(), 1);
        assert_eq!(
            loaded.md.spec.resources.unwrap().gpu.unwrap().type_,
            "nvidia.com/gpu"
        );
    }

    #[test]
    fn invalid_specs_give_the_validation_messages() {
        let errors = one(&format!(
            "{HEAD}spec:\n  model: {{id: a/b}}\n  engine: {{type: vllm}}\n  resources: {{gpu: {{count: 0}}}}\n"
        ))
        .unwrap_err();
        assert_eq!(
            errors,
            ["spec.resources.gpu.count: vLLM engine requires GPU (set resources.gpu.count > 0)"]
        );
    }

    #[test]
    fn unquoted_yaml_booleans_are_refused_with_a_hint() {
        let errors = one(&format!(
            "{HEAD}spec:\n  model: {{id: a/b}}\n  engine: {{type: llamacpp, args: {{enforce-eager: yes}}}}\n"
        ))
        .unwrap_err();
        assert!(
            errors[0].starts_with("spec.engine.args.enforce-eager: invalid type: boolean"),
            "{errors:?}"
        );
        assert!(errors[0].contains("quote the value"), "{errors:?}");
        let quoted = one(&format!(
            "{HEAD}spec:\n  model: {{id: a/b}}\n  engine: {{type: llamacpp, args: {{enforce-eager: \"yes\"}}}}\n"
        ))
        .unwrap();
        assert_eq!(quoted.md.spec.engine.args.unwrap()["enforce-eager"], "yes");
    }

    #[test]
    fn unknown_fields_warn_and_other_kinds_are_refused() {
        let loaded = one(&format!(
            "{HEAD}spec:\n  model: {{id: a/b}}\n  engine: {{type: llamacpp}}\n  colour: red\n"
        ))
        .unwrap();
        assert_eq!(
            loaded.warnings,
            ["unknown field \"spec.colour\": the API server drops it"]
        );
        let errors = one("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n").unwrap_err();
        assert_eq!(
            errors,
            ["this is a ConfigMap (v1), not a ModelDeployment (kubeairunway.ai/v1alpha1)"]
        );
        let errors = one("apiVersion: kubeairunway.ai/v1alpha1\nkind: ModelDeployment\nspec: {}\n")
            .unwrap_err();
        assert_eq!(errors, ["metadata.name: Required value"]);
    }

    #[test]
    fn lists_and_several_documents_are_read_in_order() {
        let text = format!(
            "apiVersion: v1\nkind: List\nitems:\n- {{apiVersion: kubeairunway.ai/v1alpha1, kind: ModelDeployment, metadata: {{name: a}}, spec: {{model: {{id: a/b}}, engine: {{type: llamacpp}}}}}}\n---\n{HEAD}spec: {{model: {{id: a/b}}, engine: {{type: llamacpp}}}}\n"
        );
        let docs = read(&text, "f.yaml", "default").unwrap();
        let names: Vec<String> = docs
            .iter()
            .map(|d| d.result.as_ref().unwrap().md.name_any())
            .collect();
        assert_eq!(names, ["a", "m"]);
        assert_eq!(docs[1].origin, "f.yaml#2");
    }
}
