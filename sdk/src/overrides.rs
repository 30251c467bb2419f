//! `spec.provider.overrides`: a provider's own typed settings, and a merge patch of its
//! primary upstream object for everything else.
//!
//! Each top-level key of the overrides is one of two things:
//!
//! - a setting the provider reads itself in `render` (Dynamo's `routerMode`), one of the
//!   keys it declares in [`crate::Provider::typed_overrides`] and parses with [`parse`]
//!   into a serde type: a key that type does not know, at any depth, or a value of the
//!   wrong type is a [`RenderError`] naming its path;
//! - any other key: part of a JSON merge patch (RFC 7386: objects merge, `null` deletes,
//!   anything else, lists included, replaces) of the primary rendered object, from its
//!   root, which [`apply`] merges (the runtime and `kubeairunway render` alike, in
//!   [`crate::render::finalize`]). The patch is checked against the installed upstream
//!   schema (a field it lacks or a value of another type is refused, naming its path),
//!   may not touch what the runtime owns ([`runtime_owned`]), and may not set the pod
//!   fields a tenant could take over a node with ([`unsafe_pod_fields`]).
//!
//! Nothing is ignored: every key is read, merged or refused.
//!
//! ```
//! use serde::Deserialize;
//! #[derive(Deserialize, Default)]
//! #[serde(rename_all = "camelCase", default)]
//! struct MyOverrides { replicas: Option<i32>, router_mode: Option<String> }
//!
//! let md: kubeairunway_sdk::ModelDeployment = serde_json::from_value(serde_json::json!({
//!     "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
//!     "metadata": {"name": "m"},
//!     "spec": {"model": {"id": "a/b"}, "provider": {"overrides": {
//!         "replicas": 2, "spec": {"size": 3}}}},
//! })).unwrap();
//! let typed = ["replicas", "routerMode"];
//! let o = kubeairunway_sdk::overrides::parse::<MyOverrides>(&md, &typed).unwrap();
//! assert_eq!(o.replicas, Some(2));
//! let patch = kubeairunway_sdk::overrides::patch(&md, &typed).unwrap();
//! assert_eq!(serde_json::Value::Object(patch), serde_json::json!({"spec": {"size": 3}}));
//! ```

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::api::ModelDeployment;
use crate::labels;
use crate::provider::RenderError;
use crate::upstream::UpstreamApi;

/// Where a user's overrides are, in messages.
const PREFIX: &str = "provider.overrides";

/// The overrides of `md`, if any.
fn overrides(md: &ModelDeployment) -> Option<&Map<String, Value>> {
    md.spec.provider.as_ref().and_then(|p| p.overrides.as_ref())
}

/// Parse the keys `typed` of `md`'s `spec.provider.overrides` into `T` (its `Default`
/// when none is set); the other keys are the merge patch ([`patch`]).
pub fn parse<T: DeserializeOwned + Default>(
    md: &ModelDeployment,
    typed: &[&str],
) -> Result<T, RenderError> {
    let Some(map) = overrides(md) else {
        return Ok(T::default());
    };
    let mine: Map<String, Value> = map
        .iter()
        .filter(|(k, _)| typed.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    parse_value(Value::Object(mine))
}

/// Parse an object of typed overrides into `T`: a key `T` does not know, or a value of the
/// wrong type, is an error naming its path.
pub fn parse_value<T: DeserializeOwned>(value: Value) -> Result<T, RenderError> {
    let mut unknown = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(value, &mut track);
    let parsed = serde_ignored::deserialize(de, |path| unknown.push(dotted(&path)));
    match parsed {
        Ok(_) if !unknown.is_empty() => Err(RenderError(format!(
            "unknown override {}: this provider reads {} itself and has no such setting",
            unknown
                .iter()
                .map(|p| format!("{PREFIX}.{p}"))
                .collect::<Vec<_>>()
                .join(", "),
            unknown
                .iter()
                .map(|p| p.split(['.', '[']).next().unwrap_or_default())
                .map(|top| format!("{PREFIX}.{top}"))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
                .join(", "),
        ))),
        Ok(v) => Ok(v),
        Err(e) => {
            let path = track.path().to_string();
            let at = if path == "." {
                String::new()
            } else {
                format!(".{path}")
            };
            Err(RenderError(format!("invalid override {PREFIX}{at}: {e}")))
        }
    }
}

/// The merge patch of `md`'s overrides: every key but the provider's `typed` ones;
/// `None` when that leaves nothing.
pub fn patch(md: &ModelDeployment, typed: &[&str]) -> Option<Map<String, Value>> {
    let patch: Map<String, Value> = overrides(md)?
        .iter()
        .filter(|(k, _)| !typed.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!patch.is_empty()).then_some(patch)
}

/// Why an override was refused; nothing was applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Fields the runtime owns (see [`runtime_owned`]).
    #[error(
        "{} may not be overridden: the runtime owns {}; nothing was applied",
        paths.iter().map(|p| format!("{PREFIX}.{p}")).collect::<Vec<_>>().join(", "),
        if paths.len() == 1 { "it" } else { "them" }
    )]
    RuntimeOwned {
        /// The paths, from the object's root.
        paths: Vec<String>,
    },
    /// Pod fields that would let a tenant take over a node or another identity (see
    /// [`unsafe_pod_fields`]).
    #[error(
        "{} may not be set: a pod field the Pod Security Standards' baseline keeps from tenants (host namespaces, privileged containers, added capabilities, host paths and ports, another service account or node); nothing was applied",
        paths.iter().map(|p| format!("{PREFIX}.{p}")).collect::<Vec<_>>().join(", ")
    )]
    UnsafePodField {
        /// The paths, from the object's root.
        paths: Vec<String>,
    },
    /// Paths the installed upstream schema refuses.
    #[error(
        "{} not accepted by the installed {kind} {version} (schema {schema_hash}): {}; nothing was applied",
        if problems.len() == 1 { "override is" } else { "overrides are" },
        problems.iter().map(|p| format!("{PREFIX}.{p}")).collect::<Vec<_>>().join(", ")
    )]
    Schema {
        /// The upstream kind.
        kind: String,
        /// Its version.
        version: String,
        /// Hash of its schema.
        schema_hash: String,
        /// The problems, each a path and what is wrong there.
        problems: Vec<crate::upstream::SchemaProblem>,
    },
    /// The merged object no longer reads as an object of the API (a cause the checks
    /// above do not name).
    #[error("{PREFIX} leave an object that does not read back: {message}; nothing was applied")]
    Unreadable {
        /// Why it does not read.
        message: String,
    },
    /// The primary object is not of the upstream kind, so no schema checks the patch.
    #[error(
        "{PREFIX} cannot be merged into {kind} '{name}': the provider holds the schema of {upstream} only, and an override is never applied unchecked; nothing was applied"
    )]
    Unchecked {
        /// The primary object's kind.
        kind: String,
        /// Its name.
        name: String,
        /// The upstream kind whose schema the provider holds.
        upstream: String,
    },
}

impl Refused {
    /// The condition reason: [`RUNTIME_OWNED_OVERRIDE`](crate::conditions::reasons::RUNTIME_OWNED_OVERRIDE),
    /// [`UNSAFE_OVERRIDE`](crate::conditions::reasons::UNSAFE_OVERRIDE) or
    /// [`INVALID_OVERRIDE`](crate::conditions::reasons::INVALID_OVERRIDE).
    pub fn reason(&self) -> &'static str {
        use crate::conditions::reasons;
        match self {
            Refused::RuntimeOwned { .. } => reasons::RUNTIME_OWNED_OVERRIDE,
            Refused::UnsafePodField { .. } => reasons::UNSAFE_OVERRIDE,
            Refused::Schema { .. } | Refused::Unreadable { .. } | Refused::Unchecked { .. } => {
                reasons::INVALID_OVERRIDE
            }
        }
    }
}

/// Paths of `patch` that touch what the runtime owns on the primary object `rendered`
/// (as the provider rendered it, before the runtime's own metadata), sorted:
///
/// - `apiVersion`, `kind`, `status`, and in `metadata` everything but the entries of
///   `labels` and `annotations` (name, namespace, owner references, finalizers, ...): the
///   object's identity and what the runtime writes;
/// - any key under the platform's prefix (`kubeairunway.ai/`), at any depth: its labels
///   and annotations, on the object and on pod templates and selectors;
/// - any change the merge would make to a platform key `rendered` has (a `null` or a
///   list replacing a map or list that holds one).
pub fn runtime_owned(patch: &Map<String, Value>, rendered: &Value) -> Vec<String> {
    let mut owned = std::collections::BTreeSet::new();
    for (key, value) in patch {
        match key.as_str() {
            "apiVersion" | "kind" | "status" => {
                owned.insert(key.clone());
            }
            "metadata" => metadata_owned(value, &mut owned),
            _ => platform_keys(value, key, &mut owned),
        }
    }
    let mut merged = rendered.clone();
    json_patch::merge(&mut merged, &Value::Object(patch.clone()));
    let mut kept = Vec::new();
    platform_values(rendered, "", &mut kept);
    for (path, pointer, value) in kept {
        if merged.pointer(&pointer) != Some(value) {
            owned.insert(path);
        }
    }
    owned.into_iter().collect()
}

/// Pod fields a tenant may not set through an override, at any depth, with any value but
/// `false` or `null`: what the Pod Security Standards' baseline forbids (host namespaces,
/// privileged containers, host paths and ports, `/proc` mounts, sysctls, Windows host
/// processes) and another service account or node, the rules Warmup custom actions are
/// held to. The provider creates the object with its own identity, so admission policies
/// keyed on the user would not see them. Added capabilities are `capabilities.add`.
const UNSAFE_POD_FIELDS: [&str; 12] = [
    "privileged",
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "hostPath",
    "hostPort",
    "procMount",
    "sysctls",
    "hostProcess",
    "serviceAccountName",
    "serviceAccount",
    "nodeName",
];

/// Paths of `patch` that set an unsafe pod field ([`UNSAFE_POD_FIELDS`], or a non-empty
/// `capabilities.add`), sorted.
pub fn unsafe_pod_fields(patch: &Map<String, Value>) -> Vec<String> {
    fn walk(value: &Value, path: &str, parent: &str, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let sub = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    let harmless = matches!(v, Value::Null | Value::Bool(false))
                        || v.as_array().is_some_and(Vec::is_empty);
                    let unsafe_key = UNSAFE_POD_FIELDS.contains(&k.as_str())
                        || (parent == "capabilities" && k == "add");
                    if unsafe_key && !harmless {
                        out.push(sub);
                    } else {
                        walk(v, &sub, k, out);
                    }
                }
            }
            Value::Array(items) => items
                .iter()
                .for_each(|i| walk(i, &format!("{path}[]"), parent, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&Value::Object(patch.clone()), "", "", &mut out);
    out.sort();
    out.dedup();
    out
}

/// Label and annotation values of a patch that are not strings (the schema check leaves
/// `metadata` out: it is the same for every kind).
fn metadata_problems(patch: &Map<String, Value>) -> Vec<crate::upstream::SchemaProblem> {
    let mut out = Vec::new();
    for field in ["labels", "annotations"] {
        let entries = patch
            .get("metadata")
            .and_then(|m| m.get(field))
            .and_then(Value::as_object);
        for (key, value) in entries.into_iter().flatten() {
            if !(value.is_string() || value.is_null()) {
                out.push(crate::upstream::SchemaProblem {
                    path: format!("metadata.{field}.{key}"),
                    wrong_type: Some(("string", crate::upstream::json_type(value))),
                });
            }
        }
    }
    out
}

/// `metadata` of a patch: only non-platform entries of `labels` and `annotations`.
fn metadata_owned(value: &Value, owned: &mut std::collections::BTreeSet<String>) {
    let Value::Object(meta) = value else {
        owned.insert("metadata".to_string());
        return;
    };
    for (key, v) in meta {
        let path = format!("metadata.{key}");
        match (key.as_str(), v) {
            ("labels" | "annotations", Value::Object(entries)) => {
                for k in entries.keys() {
                    if k.starts_with(labels::PROPAGATED_PREFIX) {
                        owned.insert(format!("{path}.{k}"));
                    }
                }
            }
            _ => {
                owned.insert(path);
            }
        }
    }
}

/// Keys under the platform's prefix anywhere in `value` (at `path`).
fn platform_keys(value: &Value, path: &str, owned: &mut std::collections::BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let sub = format!("{path}.{k}");
                if k.starts_with(labels::PROPAGATED_PREFIX) {
                    owned.insert(sub);
                } else {
                    platform_keys(v, &sub, owned);
                }
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|i| platform_keys(i, &format!("{path}[]"), owned)),
        _ => {}
    }
}

/// Every value under a platform key of `value` outside its `metadata`: `(dot path, JSON
/// pointer, value)`.
fn platform_values<'a>(
    value: &'a Value,
    pointer: &str,
    out: &mut Vec<(String, String, &'a Value)>,
) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if pointer.is_empty() && k == "metadata" {
                    continue;
                }
                let sub = format!("{pointer}/{}", k.replace('~', "~0").replace('/', "~1"));
                if k.starts_with(labels::PROPAGATED_PREFIX) {
                    out.push((dotted_pointer(&sub), sub, v));
                } else {
                    platform_values(v, &sub, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                platform_values(item, &format!("{pointer}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// `/a/b~1c/0` as `a.b/c[0]`.
fn dotted_pointer(pointer: &str) -> String {
    let mut out = String::new();
    for part in pointer.split('/').skip(1) {
        let part = part.replace("~1", "/").replace("~0", "~");
        if part.bytes().all(|b| b.is_ascii_digit()) && !part.is_empty() {
            out.push('[');
            out.push_str(&part);
            out.push(']');
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&part);
        }
    }
    out
}

/// Merge the overrides patch into the primary rendered object `primary` (as the provider
/// rendered it), after checking it: the primary of the upstream kind, every path and
/// value one the installed schema of `api` accepts, nothing the runtime owns
/// ([`runtime_owned`]) and no unsafe pod field ([`unsafe_pod_fields`]). On a refusal
/// `primary` is left as it was.
pub fn apply(
    primary: &mut Value,
    patch: &Map<String, Value>,
    api: &UpstreamApi,
) -> Result<(), Refused> {
    if !api.is_upstream_object(primary) {
        let field = |k: &str| primary.get(k).and_then(Value::as_str).unwrap_or_default();
        return Err(Refused::Unchecked {
            kind: field("kind").to_string(),
            name: primary
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            upstream: format!("{} {}", api.kind, api.api_version()),
        });
    }
    let mut problems = api.problems(&Value::Object(patch.clone()));
    problems.extend(metadata_problems(patch));
    problems.sort();
    if !problems.is_empty() {
        return Err(Refused::Schema {
            kind: api.kind.clone(),
            version: api.api_version(),
            schema_hash: api.schema_hash.clone(),
            problems,
        });
    }
    let paths = runtime_owned(patch, primary);
    if !paths.is_empty() {
        return Err(Refused::RuntimeOwned { paths });
    }
    let paths = unsafe_pod_fields(patch);
    if !paths.is_empty() {
        return Err(Refused::UnsafePodField { paths });
    }
    json_patch::merge(primary, &Value::Object(patch.clone()));
    Ok(())
}

/// `a.b[2].c` for an ignored key's path (serde_ignored marks `Option` layers with `?`).
fn dotted(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", dotted(parent)),
        Path::Map { parent, key } => {
            let p = dotted(parent);
            if p.is_empty() {
                key.clone()
            } else {
                format!("{p}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => dotted(parent),
    }
}

#[cfg(test)]
mod tests;
