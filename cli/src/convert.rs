//! `kubeairunway convert -f FILE`: AI Runway's `airunway.ai/v1alpha1` ModelDeployments and
//! InferenceProviderConfigs as ours (`kubeairunway.ai/v1alpha1`), naming anything that does
//! not carry over.
//!
//! The two APIs share their shape (ours follows AI Runway's fields), so a document carries
//! over by its group; what does not is found by reading it into our types, as the API
//! server would: every field our schema lacks is named and left out (the API server would
//! drop it silently), a value of the wrong type refuses the document, and a provider that
//! is not one of the platform's is named. What the cluster writes (`status`, uid,
//! resourceVersion, managedFields, ...) is not carried: core and the providers write it
//! anew.
//!
//! [`convert`] is pure; [`run`] reads the files and prints.

use std::path::PathBuf;

use kubeairunway_sdk::{InferenceProviderConfig, ModelDeployment};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::Terminal;
use crate::builtin::NAMES;
use crate::output::{self, Format};

/// AI Runway's API version.
pub const AIRUNWAY_API_VERSION: &str = "airunway.ai/v1alpha1";

/// Metadata the cluster writes, never carried.
const SERVER_METADATA: [&str; 7] = [
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
];

/// AI Runway providers the platform has none of, and what serves the same here.
const OTHER_PROVIDERS: [(&str, &str); 1] = [(
    "llmd",
    "llm-d is not a provider here: the Deployment provider (`deployment`) serves vLLM with a \
     plain Deployment and Service",
)];

/// `convert`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// AI Runway manifests (YAML, several documents or a List allowed; `-` reads standard
    /// input).
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Output format of the converted documents (what was not carried goes to standard
    /// error).
    #[arg(short, long, value_enum, default_value = "yaml")]
    pub output: Format,
    /// Exit 1 when anything was not carried over.
    #[arg(long)]
    pub strict: bool,
}

/// One document converted.
#[derive(Clone, Debug, PartialEq)]
pub struct Converted {
    /// `Kind/name`.
    pub name: String,
    /// The document as ours, or why it cannot be.
    pub result: Result<Value, String>,
    /// What was not carried over (paths and why), and notes about what was.
    pub losses: Vec<String>,
}

/// Convert one AI Runway document.
pub fn convert(doc: &Value) -> Converted {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = format!(
        "{kind}/{}",
        doc.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("(no name)")
    );
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut out = Converted {
        name,
        result: Err(String::new()),
        losses: Vec::new(),
    };
    if api_version != AIRUNWAY_API_VERSION {
        out.result = Err(format!(
            "not an AI Runway document ({AIRUNWAY_API_VERSION}): apiVersion {api_version:?}"
        ));
        return out;
    }
    let mut ours = doc.clone();
    ours["apiVersion"] = Value::from(kubeairunway_sdk::API_VERSION);
    strip_server_fields(&mut ours, &mut out.losses);
    let read = match kind {
        "ModelDeployment" => carried::<ModelDeployment>(&mut ours, kind),
        "InferenceProviderConfig" => carried::<InferenceProviderConfig>(&mut ours, kind),
        _ => Err(format!(
            "a {kind}: only ModelDeployments and InferenceProviderConfigs convert"
        )),
    };
    match read {
        Ok(pruned) => {
            out.losses.extend(
                pruned
                    .into_iter()
                    .map(|path| format!("{path}: not carried over (no such field here)")),
            );
            if kind == "ModelDeployment" {
                out.losses.extend(provider_note(&ours));
            }
            out.result = Ok(ours);
        }
        Err(e) => out.result = Err(e),
    }
    out
}

/// Drop what the cluster writes; `status` is named once.
fn strip_server_fields(doc: &mut Value, losses: &mut Vec<String>) {
    if let Some(object) = doc.as_object_mut()
        && object.remove("status").is_some()
    {
        losses.push("status: not carried over (core and the provider write it anew)".into());
    }
    if let Some(metadata) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in SERVER_METADATA {
            metadata.remove(key);
        }
    }
}

/// Prune `doc` to what our CRD of `kind` declares, as the API server prunes what it
/// stores; the paths pruned. Then read it into our type `T`: a value of the wrong type
/// refuses the document, naming the field.
fn carried<T: DeserializeOwned>(doc: &mut Value, kind: &str) -> Result<Vec<String>, String> {
    let schema =
        kubeairunway_sdk::api::crds::schema(kind).ok_or_else(|| format!("no CRD of {kind}"))?;
    let mut pruned = Vec::new();
    prune(doc, schema, "", &mut pruned);
    serde_path_to_error::deserialize::<_, T>(doc.clone())
        .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
    Ok(pruned)
}

/// Remove from `value` every field `schema` (OpenAPI v3, structural) does not declare,
/// keeping what `x-kubernetes-preserve-unknown-fields` keeps; record the paths removed.
fn prune(value: &mut Value, schema: &Value, path: &str, pruned: &mut Vec<String>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                // The root's apiVersion, kind and metadata are the API server's own.
                let own = |key: &str| {
                    path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&key)
                };
                map.retain(|key, _| {
                    let keep = preserve || own(key) || properties.contains_key(key);
                    if !keep {
                        pruned.push(join(key));
                    }
                    keep
                });
                for (key, field) in map.iter_mut() {
                    if let Some(field_schema) = properties.get(key) {
                        prune(field, field_schema, &join(key), pruned);
                    }
                }
            } else if let Some(values) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for (key, field) in map.iter_mut() {
                    prune(field, values, &join(key), pruned);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(item, item_schema, &format!("{path}[{i}]"), pruned);
                }
            }
        }
        _ => {}
    }
}

/// A note when the ModelDeployment names a provider the platform does not have.
fn provider_note(md: &Value) -> Option<String> {
    let name = md.pointer("/spec/provider/name").and_then(Value::as_str)?;
    if NAMES.contains(&name) {
        return None;
    }
    let known = OTHER_PROVIDERS
        .iter()
        .find(|(other, _)| *other == name)
        .map_or_else(
            || {
                format!(
                    "no provider {name:?} is built in (built in: {})",
                    NAMES.join(", ")
                )
            },
            |(_, why)| (*why).to_string(),
        );
    Some(format!(
        "spec.provider.name: {name:?} carried over as written; {known}"
    ))
}

/// Read the files, convert every document, print them; what was not carried goes to
/// standard error.
pub fn run(args: &Args, term: &mut Terminal) -> anyhow::Result<i32> {
    let mut converted = Vec::new();
    for file in &args.files {
        let (text, origin) = crate::render::read_input(file)?;
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            if doc.get("kind").and_then(Value::as_str) == Some("List") {
                let items = doc["items"].as_array().cloned().unwrap_or_default();
                converted.extend(items.iter().map(convert));
            } else {
                converted.push(convert(&doc));
            }
        }
    }
    let (mut failed, mut lossy) = (false, false);
    let mut objects = Vec::new();
    for c in converted {
        match c.result {
            Ok(object) => objects.push(object),
            Err(e) => {
                failed = true;
                term.err(&format!("{}: not converted: {e}\n", c.name));
            }
        }
        for loss in &c.losses {
            lossy |= loss.contains("not carried over (no such field");
            term.err(&format!("{}: {loss}\n", c.name));
        }
    }
    let text = match args.output {
        Format::Json => output::json(&objects)?,
        _ => objects
            .iter()
            .map(output::yaml)
            .collect::<anyhow::Result<Vec<_>>>()?
            .join("---\n"),
    };
    term.out(&text);
    Ok(i32::from(failed || (args.strict && lossy)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn md(spec: &Value) -> Value {
        json!({"apiVersion": AIRUNWAY_API_VERSION, "kind": "ModelDeployment",
               "metadata": {"name": "m", "uid": "u-1", "resourceVersion": "9"},
               "spec": spec, "status": {"phase": "Running"}})
    }

    #[test]
    fn a_model_deployment_carries_over_by_its_group_without_what_the_cluster_wrote() {
        let c = convert(&md(
            &json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"},
                                     "resources": {"gpu": {"count": 1}}}),
        ));
        let ours = c.result.unwrap();
        assert_eq!(ours["apiVersion"], "kubeairunway.ai/v1alpha1");
        assert_eq!(ours["metadata"], json!({"name": "m"}));
        assert!(ours.get("status").is_none());
        assert_eq!(ours["spec"]["engine"]["type"], "vllm");
        assert_eq!(
            c.losses,
            ["status: not carried over (core and the provider write it anew)"]
        );
    }

    #[test]
    fn a_field_ours_lacks_is_named_and_left_out() {
        let mut ipc = json!({"apiVersion": AIRUNWAY_API_VERSION, "kind": "InferenceProviderConfig",
            "metadata": {"name": "llmd"},
            "spec": {"capabilities": {"engines": [{"name": "vllm", "servingModes": ["aggregated"],
                                                    "gpuSupport": true, "requiresCRD": false}]}}});
        let c = convert(&ipc);
        let ours = c.result.unwrap();
        assert!(
            ours["spec"]["capabilities"]["engines"][0]
                .get("requiresCRD")
                .is_none()
        );
        assert_eq!(
            ours["spec"]["capabilities"]["engines"][0]["gpuSupport"],
            true
        );
        assert_eq!(
            c.losses,
            ["spec.capabilities.engines[0].requiresCRD: not carried over (no such field here)"]
        );
        // A value of the wrong type is refused, naming the field.
        ipc["spec"]["capabilities"]["engines"][0]["gpuSupport"] = json!("yes");
        let refused = convert(&ipc).result.unwrap_err();
        assert!(
            refused.starts_with("spec.capabilities.engines[0]"),
            "{refused}"
        );
    }

    #[test]
    fn a_provider_the_platform_lacks_is_named() {
        let c = convert(&md(
            &json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"},
                                     "provider": {"name": "llmd"}}),
        ));
        assert!(
            c.losses
                .iter()
                .any(|l| l.contains("llm-d is not a provider here")),
            "{:?}",
            c.losses
        );
        let other = convert(&md(
            &json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"},
                                         "provider": {"name": "acme"}}),
        ));
        assert!(
            other
                .losses
                .iter()
                .any(|l| l.contains("no provider \"acme\" is built in")),
            "{:?}",
            other.losses
        );
    }

    #[test]
    fn other_documents_are_refused_with_the_reason() {
        let ours = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
                          "metadata": {"name": "m"}});
        assert!(
            convert(&ours)
                .result
                .unwrap_err()
                .contains("not an AI Runway document")
        );
        let secret = json!({"apiVersion": AIRUNWAY_API_VERSION, "kind": "Secret",
                            "metadata": {"name": "s"}});
        assert!(
            convert(&secret)
                .result
                .unwrap_err()
                .contains("only ModelDeployments")
        );
    }
}
