//! The upstream API as the cluster serves it, and the check that a rendered object only
//! sets fields its schema has.
//!
//! An upstream kind is any kind the API server serves ([`UpstreamRef`]): a custom
//! resource, read from its CRD ([`UpstreamApi::detect`]), or a built-in (or aggregated)
//! kind, read from the cluster's OpenAPI v3 document of its group version
//! ([`UpstreamApi::from_openapi`]). Unit tests of `render` build one with
//! [`UpstreamApi::new`].

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::discovery::ApiResource;
use serde_json::Value;
use sha2::{Digest, Sha256};

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
    /// Where the schema comes from.
    pub source: SchemaSource,
    /// The chosen version's schema, only what [`UpstreamApi::missing_paths`] reads
    /// ([`structure`]).
    schema: Arc<Value>,
}

/// Where an [`UpstreamApi`]'s schema comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaSource {
    /// The kind's CustomResourceDefinition.
    Crd,
    /// The cluster's OpenAPI v3 document (built-in and aggregated kinds).
    OpenApi,
    /// Given by the caller ([`UpstreamApi::new`]: unit tests, previews).
    Given,
}

/// The reason the runtime gives while the API server serves none of the versions of
/// `wanted`: `UpstreamCRDMissing`, or `UpstreamAPIMissing` for a built-in kind.
pub fn not_served_reason(wanted: &UpstreamRef) -> &'static str {
    if wanted.is_built_in() {
        crate::conditions::reasons::UPSTREAM_API_MISSING
    } else {
        crate::conditions::reasons::UPSTREAM_CRD_MISSING
    }
}

/// What the runtime says while the API server serves none of the versions of `wanted`: a
/// built-in kind of Kubernetes has no CRD to install, so that is not suggested for one.
pub fn not_served_message(wanted: &UpstreamRef) -> String {
    if wanted.is_built_in() {
        let group = if wanted.group.is_empty() {
            "core".to_string()
        } else {
            wanted.group.clone()
        };
        return format!(
            "the API server does not serve {} of the {group} API group (versions {}), a built-in kind of Kubernetes: this cluster's Kubernetes is too old for it or has the API disabled",
            wanted.kind,
            wanted.versions.join(", ")
        );
    }
    format!(
        "the API server does not serve {} ({}, versions {}): install its CRD or enable its API",
        wanted.kind,
        wanted.crd_name(),
        wanted.versions.join(", ")
    )
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
    /// The OpenAPI document of the group version has no schema for the kind.
    #[error("the OpenAPI v3 document of {group_version} has no schema for {kind}")]
    NotInOpenApi {
        /// `group/version`.
        group_version: String,
        /// The kind.
        kind: String,
    },
}

impl UpstreamApi {
    /// The kind of `wanted` at `version` with `schema` as its OpenAPI v3 schema (with
    /// `properties` inline, no `$ref`): for unit tests of `render` and for previews
    /// without a cluster. `serde_json::json!({"type": "object",
    /// "x-kubernetes-preserve-unknown-fields": true})` accepts every field.
    pub fn new(wanted: &UpstreamRef, version: &str, schema: Value) -> Self {
        Self {
            group: wanted.group.clone(),
            kind: wanted.kind.clone(),
            plural: wanted.plural.clone(),
            version: version.to_string(),
            served_versions: vec![version.to_string()],
            storage_version: version.to_string(),
            schema_hash: short_hash(&serde_json::to_vec(&schema).unwrap_or_default()),
            source: SchemaSource::Given,
            schema: Arc::new(schema),
        }
    }

    /// The kind of `wanted` at `version`, which the API server serves among
    /// `served_versions` (from discovery), with its schema read from `document`: the
    /// cluster's OpenAPI v3 document of that group version (`/openapi/v3/apis/<group>/<version>`,
    /// `/openapi/v3/api/v1` for the core group), found by its
    /// `x-kubernetes-group-version-kind` and with every `$ref` resolved. The storage
    /// version of a built-in kind is not published; it reads as `version`.
    pub fn from_openapi(
        document: &Value,
        wanted: &UpstreamRef,
        version: &str,
        served_versions: Vec<String>,
    ) -> Result<Self, DetectError> {
        let schemas = document
            .pointer("/components/schemas")
            .and_then(Value::as_object);
        let is_kind = |schema: &Value| {
            schema
                .get("x-kubernetes-group-version-kind")
                .and_then(Value::as_array)
                .is_some_and(|gvks| {
                    gvks.iter().any(|g| {
                        g["group"].as_str().unwrap_or_default() == wanted.group
                            && g["version"] == version
                            && g["kind"] == wanted.kind.as_str()
                    })
                })
        };
        let found = schemas.and_then(|all| all.values().find(|s| is_kind(s)));
        let (Some(schemas), Some(found)) = (schemas, found) else {
            return Err(DetectError::NotInOpenApi {
                group_version: group_version(&wanted.group, version),
                kind: wanted.kind.clone(),
            });
        };
        let schema = openapi::inline(found, schemas);
        Ok(Self {
            group: wanted.group.clone(),
            kind: wanted.kind.clone(),
            plural: wanted.plural.clone(),
            version: version.to_string(),
            served_versions,
            storage_version: version.to_string(),
            schema_hash: short_hash(&serde_json::to_vec(&schema).unwrap_or_default()),
            source: SchemaSource::OpenApi,
            schema: Arc::new(structure(&schema)),
        })
    }

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
            source: SchemaSource::Crd,
            schema: Arc::new(structure(&schema)),
        })
    }

    /// `group/version` of the chosen version (`v1` for the core group).
    pub fn api_version(&self) -> String {
        group_version(&self.group, &self.version)
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

    /// The API resource of a rendered object: this one for the upstream kind, or else
    /// derived from the object's `apiVersion` and `kind` (ConfigMaps, Services and the
    /// like).
    pub fn resource_of(&self, object: &kube::api::DynamicObject) -> ApiResource {
        let types = object.types.clone().unwrap_or_default();
        let (group, version) = types
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", types.api_version.as_str()));
        if group == self.group && version == self.version && types.kind == self.kind {
            return self.api_resource();
        }
        ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            group,
            version,
            &types.kind,
        ))
    }

    /// Whether `object` is of this upstream kind and version.
    pub fn is_upstream_object(&self, object: &Value) -> bool {
        object.get("apiVersion").and_then(Value::as_str) == Some(self.api_version().as_str())
            && object.get("kind").and_then(Value::as_str) == Some(self.kind.as_str())
    }

    /// Field paths `object` sets that the installed schema does not have (sorted, list
    /// items written `[]`). `apiVersion`, `kind`, `metadata` and `status` are not checked.
    pub fn missing_paths(&self, object: &Value) -> Vec<String> {
        let mut found = Findings::default();
        self.check(object, &mut found);
        found.missing.into_iter().collect()
    }

    /// What is wrong with `partial` (a part of an object, such as a merge patch, shaped
    /// like the object from its root) for the installed schema: the paths it sets that
    /// the schema lacks, and those whose value is not of the schema's type (`null` values
    /// are not checked: in a merge patch they delete). `apiVersion`, `kind`, `metadata`
    /// and `status` are not checked.
    pub fn problems(&self, partial: &Value) -> Vec<SchemaProblem> {
        let mut found = Findings {
            types: true,
            ..Findings::default()
        };
        self.check(partial, &mut found);
        let missing = found.missing.into_iter().map(|path| SchemaProblem {
            path,
            wrong_type: None,
        });
        let mistyped = found
            .mistyped
            .into_iter()
            .map(|(path, want, got)| SchemaProblem {
                path,
                wrong_type: Some((want, got)),
            });
        let mut all: Vec<SchemaProblem> = missing.chain(mistyped).collect();
        all.sort();
        all
    }

    fn check(&self, object: &Value, found: &mut Findings) {
        if let Value::Object(map) = object {
            for (key, value) in map {
                if ["apiVersion", "kind", "metadata", "status"].contains(&key.as_str()) {
                    continue;
                }
                match self.schema.get("properties").and_then(|p| p.get(key)) {
                    Some(sub) => walk(sub, value, key, found),
                    None if keeps_unknown(&self.schema) => {}
                    None => {
                        found.missing.insert(key.clone());
                    }
                }
            }
        }
    }
}

/// A path of an object the installed schema refuses: it has no such field, or the value
/// there is of another type.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SchemaProblem {
    /// Dot path from the object's root, list items written `[]`.
    pub path: String,
    /// `(the schema's type, the value's type)` when the field exists but the value is of
    /// another type; `None` when the schema has no such field.
    pub wrong_type: Option<(&'static str, &'static str)>,
}

impl std::fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.wrong_type {
            None => write!(f, "{} (no such field)", self.path),
            Some((want, got)) => write!(f, "{} (must be {want}, not {got})", self.path),
        }
    }
}

/// `group/version`, or `version` alone for the core group.
fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// Schemas of the OpenAPI v3 documents the API server publishes.
mod openapi {
    use serde_json::{Map, Value};

    /// How deep a schema is inlined; below, anything is accepted.
    const MAX_DEPTH: usize = 64;

    /// The types that decode from a number or a string.
    const INT_OR_STRING: [&str; 2] = [
        "io.k8s.apimachinery.pkg.api.resource.Quantity",
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
    ];

    /// `schema` with every `$ref` (and Kubernetes' `allOf: [{$ref}]` wrapping) replaced by
    /// the referenced schema from `schemas`, and descriptions dropped. A reference back
    /// into a schema being inlined (a recursive type) accepts anything below it.
    pub(super) fn inline(schema: &Value, schemas: &Map<String, Value>) -> Value {
        let mut path = Vec::new();
        resolve(schema, schemas, &mut path)
    }

    fn resolve(schema: &Value, schemas: &Map<String, Value>, path: &mut Vec<String>) -> Value {
        let Value::Object(map) = schema else {
            return schema.clone();
        };
        if path.len() > MAX_DEPTH {
            return anything();
        }
        let mut out = Map::new();
        let mut refs: Vec<&str> = map
            .get("$ref")
            .and_then(Value::as_str)
            .into_iter()
            .collect();
        for part in map
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match part.get("$ref").and_then(Value::as_str) {
                Some(r) => refs.push(r),
                None => merge(&mut out, resolve(part, schemas, path)),
            }
        }
        for r in refs {
            let name = r.trim_start_matches("#/components/schemas/");
            if path.iter().any(|p| p == name) {
                return anything();
            }
            // A quantity or an IntOrString takes a number or a string (their own JSON
            // decoding), whatever type the document gives them.
            if INT_OR_STRING.contains(&name) {
                merge(
                    &mut out,
                    serde_json::json!({"x-kubernetes-int-or-string": true}),
                );
                continue;
            }
            let Some(target) = schemas.get(name) else {
                return anything();
            };
            path.push(name.to_string());
            let resolved = resolve(target, schemas, path);
            path.pop();
            merge(&mut out, resolved);
        }
        for (key, value) in map {
            match key.as_str() {
                "$ref"
                | "allOf"
                | "description"
                | "default"
                | "x-kubernetes-group-version-kind" => {}
                "properties" | "patternProperties" => {
                    let props = value
                        .as_object()
                        .map(|p| {
                            p.iter()
                                .map(|(k, v)| (k.clone(), resolve(v, schemas, path)))
                                .collect::<Map<_, _>>()
                        })
                        .unwrap_or_default();
                    out.insert(key.clone(), Value::Object(props));
                }
                "items" | "additionalProperties" if value.is_object() => {
                    out.insert(key.clone(), resolve(value, schemas, path));
                }
                _ => {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
        Value::Object(out)
    }

    fn merge(into: &mut Map<String, Value>, from: Value) {
        if let Value::Object(from) = from {
            for (k, v) in from {
                into.entry(k).or_insert(v);
            }
        }
    }

    fn anything() -> Value {
        serde_json::json!({"x-kubernetes-preserve-unknown-fields": true})
    }
}

/// The first 8 bytes of the SHA-256 of `data`, as 16 hex digits.
pub fn short_hash(data: &[u8]) -> String {
    use std::fmt::Write;
    Sha256::digest(data)
        .iter()
        .take(8)
        .fold(String::with_capacity(16), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// The keywords of a schema [`walk`] reads.
const STRUCTURE: [&str; 7] = [
    "properties",
    "additionalProperties",
    "items",
    "type",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
];

/// `schema` with only the keywords [`walk`] reads, at every level. The provider keeps its
/// upstream schema for as long as it runs: Dynamo's, whole, is about 1,100 JSON objects
/// with their descriptions, validations and enums (1.2 MB of heap); what is left is the
/// tree of field names with their types. An OpenAPI `format: int-or-string` (the
/// built-in kinds' IntOrString, a `type: string` that takes numbers too) is kept as
/// `x-kubernetes-int-or-string`, the CRDs' spelling, without the type.
fn structure(schema: &Value) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let int_or_string = map.get("format").and_then(Value::as_str) == Some("int-or-string");
    let mut kept = serde_json::Map::new();
    for key in STRUCTURE {
        let Some(value) = map.get(key) else { continue };
        if key == "type" && int_or_string {
            kept.insert("x-kubernetes-int-or-string".to_string(), Value::Bool(true));
            continue;
        }
        let value = match (key, value) {
            ("properties", Value::Object(fields)) => Value::Object(
                fields
                    .iter()
                    .map(|(name, field)| (name.clone(), structure(field)))
                    .collect(),
            ),
            ("additionalProperties" | "items", _) => structure(value),
            _ => value.clone(),
        };
        kept.insert(key.to_string(), value);
    }
    Value::Object(kept)
}

fn keeps_unknown(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

/// What [`walk`] found: fields the schema lacks and, when `types`, values of another type
/// (`(path, the schema's type, the value's type)`).
#[derive(Default)]
struct Findings {
    types: bool,
    missing: BTreeSet<String>,
    mistyped: BTreeSet<(String, &'static str, &'static str)>,
}

/// The JSON type of `value`, as a schema's `type` names it (`integer` for a whole number).
pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `Some((want, got))` when `value` is not of `schema`'s type. Null is not checked, nor a
/// value where the schema has no type or takes an integer or a string.
fn wrong_type(schema: &Value, value: &Value) -> Option<(&'static str, &'static str)> {
    const TYPES: [&str; 6] = ["object", "array", "string", "integer", "number", "boolean"];
    let want = schema.get("type").and_then(Value::as_str)?;
    let want = TYPES.into_iter().find(|t| *t == want)?;
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let got = json_type(value);
    let fits =
        got == want || got == "null" || int_or_string || (want, got) == ("number", "integer");
    (!fits).then_some((want, got))
}

fn walk(schema: &Value, value: &Value, path: &str, found: &mut Findings) {
    if found.types
        && let Some((want, got)) = wrong_type(schema, value)
    {
        found.mistyped.insert((path.to_string(), want, got));
        return;
    }
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
                    walk(sub, v, &sub_path, found);
                } else if let Some(additional) = schema.get("additionalProperties") {
                    if additional.is_object() {
                        walk(additional, v, &sub_path, found);
                    } else if additional == &Value::Bool(false) {
                        found.missing.insert(sub_path);
                    }
                } else if !keeps_unknown(schema) {
                    found.missing.insert(sub_path);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    walk(item_schema, item, &format!("{path}[]"), found);
                }
            }
        }
        _ => {}
    }
}

/// The upstream kind a provider renders as its primary object: any kind the API server
/// serves, found by API discovery:
///
/// - a custom resource, whose CRD (`<plural>.<group>`) the runtime watches: served and
///   storage versions and the schema come from it, and a CRD installed, changed or
///   removed later is noticed at once;
/// - a built-in kind (`apps/v1` Deployment, core `v1` Service: group `""`) or one served
///   by an aggregated API server, whose schema comes from the cluster's OpenAPI v3
///   document (`/openapi/v3/apis/<group>/<version>`, `/openapi/v3/api/v1`).
///
/// When the API server serves none of [`UpstreamRef::versions`] the provider's
/// InferenceProviderConfig is not ready (condition `UpstreamReady=False`, a warning in
/// the log) and its ModelDeployments get `ProviderCompatible=False` saying so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamRef {
    /// API group, e.g. `kaito.sh`, `apps`; `""` for the core group (`v1`).
    pub group: String,
    /// Kind, e.g. `Workspace`.
    pub kind: String,
    /// Plural resource name, e.g. `workspaces`.
    pub plural: String,
    /// Versions the provider has adapters for, most preferred first. The runtime picks the
    /// first one the installed CRD serves.
    pub versions: Vec<String>,
}

impl UpstreamRef {
    /// `group`, `kind`, `plural`, and versions in order of preference.
    pub fn new(group: &str, kind: &str, plural: &str, versions: &[&str]) -> Self {
        Self {
            group: group.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
            versions: versions.iter().map(ToString::to_string).collect(),
        }
    }

    /// The path of the API server's OpenAPI v3 document of this kind's group at
    /// `version` (`/openapi/v3/apis/<group>/<version>`, `/openapi/v3/api/<version>` for
    /// the core group): where a built-in kind's schema is read.
    pub fn openapi_path(&self, version: &str) -> String {
        if self.group.is_empty() {
            format!("/openapi/v3/api/{version}")
        } else {
            format!("/openapi/v3/apis/{}/{version}", self.group)
        }
    }

    /// Whether this is a built-in kind of Kubernetes, served by the API server itself.
    pub fn is_built_in(&self) -> bool {
        // Kubernetes' own groups are the core group, groups without a dot (`apps`,
        // `batch`, `policy`, ...) and those under `k8s.io`, which CRDs may not claim
        // without an approval annotation.
        self.group.is_empty() || !self.group.contains('.') || self.group.ends_with(".k8s.io")
    }

    /// The name a CRD of this kind has, `<plural>.<group>` (the resource's name in
    /// messages: `deployments.apps`; the core group's kinds are just `services`).
    pub fn crd_name(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// The detected upstream API: `None` while the API server does not serve the kind, `Err`
/// with the reason when no adapter fits it.
pub type UpstreamState = Option<Result<UpstreamApi, String>>;

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

    /// The shape of the OpenAPI v3 document kube-apiserver (and the test API server)
    /// publishes at `/openapi/v3/apis/apps/v1`: schemas by Go type name, `allOf: [{$ref}]`
    /// around referenced types, `x-kubernetes-group-version-kind` on top-level kinds.
    fn apps_v1_document() -> Value {
        json!({"components": {"schemas": {
            "io.k8s.api.apps.v1.Deployment": {
                "type": "object",
                "properties": {
                    "apiVersion": {"type": "string"},
                    "metadata": {"default": {}, "allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]},
                    "spec": {"description": "Spec.", "default": {}, "allOf": [{"$ref": "#/components/schemas/io.k8s.api.apps.v1.DeploymentSpec"}]},
                },
                "x-kubernetes-group-version-kind": [{"group": "apps", "kind": "Deployment", "version": "v1"}],
            },
            "io.k8s.api.apps.v1.DeploymentSpec": {
                "type": "object",
                "properties": {
                    "replicas": {"type": "integer"},
                    "template": {"allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.PodTemplateSpec"}]},
                },
            },
            "io.k8s.api.core.v1.PodTemplateSpec": {
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": {
                    "containers": {"type": "array", "items": {"allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.Container"}]}},
                    "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                }}},
            },
            "io.k8s.api.core.v1.Container": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "args": {"type": "array", "items": {"type": "string"}},
                               "self": {"allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.Container"}]}},
            },
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object", "properties": {"name": {"type": "string"}}},
        }}})
    }

    #[test]
    fn built_in_kinds_are_read_from_the_openapi_document() {
        let want = UpstreamRef::new("apps", "Deployment", "deployments", &["v1"]);
        let api =
            UpstreamApi::from_openapi(&apps_v1_document(), &want, "v1", vec!["v1".into()]).unwrap();
        assert_eq!(api.api_version(), "apps/v1");
        assert_eq!(api.source, SchemaSource::OpenApi);
        let object = json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": 1, "colour": "red", "template": {"spec": {
                "containers": [{"name": "c", "args": ["--x"], "port": 1, "self": {"name": "again", "anything": {"goes": 1}}}],
                "nodeSelector": {"a": "b"},
            }}},
        });
        assert_eq!(
            api.missing_paths(&object),
            ["spec.colour", "spec.template.spec.containers[].port"],
            "refs resolved, a recursive reference accepts anything below it"
        );
        let service = UpstreamRef::new("", "Service", "services", &["v1"]);
        assert_eq!(
            UpstreamApi::from_openapi(&apps_v1_document(), &service, "v1", vec![])
                .unwrap_err()
                .to_string(),
            "the OpenAPI v3 document of v1 has no schema for Service"
        );
        assert_eq!(service.crd_name(), "services");
        assert_eq!(
            not_served_message(&want),
            "the API server does not serve Deployment of the apps API group (versions v1), a built-in kind of Kubernetes: this cluster's Kubernetes is too old for it or has the API disabled"
        );
        assert!(!not_served_message(&service).contains("CRD"));
        assert!(
            not_served_message(&UpstreamRef::new(
                "kaito.sh",
                "Workspace",
                "workspaces",
                &["v1beta1"]
            ))
            .ends_with("install its CRD or enable its API")
        );
    }

    #[test]
    fn an_upstream_api_for_unit_tests() {
        let want = UpstreamRef::new("example.com", "Widget", "widgets", &["v1"]);
        let api = UpstreamApi::new(
            &want,
            "v1",
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        assert_eq!(api.api_version(), "example.com/v1");
        assert!(
            api.missing_paths(
                &json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"a": 1}})
            )
            .is_empty()
        );
    }

    #[test]
    fn only_the_structure_of_a_schema_is_kept_and_it_finds_the_same_missing_paths() {
        let full = json!({"type": "object", "description": "d", "required": ["spec"],
            "properties": {"spec": {"type": "object", "description": "s",
                "x-kubernetes-validations": [{"rule": "true"}],
                "properties": {
                    "n": {"type": "integer", "minimum": 1, "description": "n"},
                    "tags": {"type": "array", "items": {"type": "string", "enum": ["a"]}},
                    "env": {"type": "object", "additionalProperties": {"type": "object",
                        "properties": {"v": {"type": "string"}}}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "pod": {"type": "object", "x-kubernetes-embedded-resource": true}}}}});
        let kept = structure(&full);
        assert_eq!(
            kept,
            json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
                "n": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "env": {"type": "object", "additionalProperties": {"type": "object", "properties": {"v": {"type": "string"}}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "pod": {"type": "object", "x-kubernetes-embedded-resource": true}}}}})
        );
        let object = json!({"spec": {"n": 1, "x": 1, "tags": ["a", 2], "env": {"e": {"v": "1", "w": 2}},
            "free": {"any": 1}, "pod": {"any": 1}}, "extra": 1});
        let mut a = Findings {
            types: true,
            ..Findings::default()
        };
        let mut b = Findings {
            types: true,
            ..Findings::default()
        };
        walk(&full, &object, "", &mut a);
        walk(&kept, &object, "", &mut b);
        assert_eq!((&a.missing, &a.mistyped), (&b.missing, &b.mistyped));
        assert_eq!(
            a.missing.into_iter().collect::<Vec<_>>(),
            [".extra", ".spec.env.e.w", ".spec.x"]
        );
        assert_eq!(
            a.mistyped.into_iter().collect::<Vec<_>>(),
            [(".spec.tags[]".to_string(), "string", "integer")]
        );
    }

    #[test]
    fn problems_name_unknown_and_mistyped_paths() {
        let want = UpstreamRef::new("example.com", "Widget", "widgets", &["v1"]);
        let api = UpstreamApi::detect(&crd(&json!([version("v1", true, &widget_schema())])), &want)
            .unwrap();
        let partial = json!({"metadata": {"name": 1}, "spec": {
            "size": "ten", "colour": "red", "labels": {"a": 1}, "items": [{"name": null}],
            "free": {"anything": [1]}}});
        let found: Vec<String> = api
            .problems(&partial)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            [
                "spec.colour (no such field)",
                "spec.labels.a (must be string, not integer)",
                "spec.size (must be integer, not string)",
            ]
        );
        assert!(
            api.problems(&json!({"spec": {"size": 3.0, "items": []}}))
                .is_empty()
        );
        assert_eq!(
            api.problems(&json!({"spec": {"size": 3.5, "items": {}}}))
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "spec.items (must be array, not object)",
                "spec.size (must be integer, not number)"
            ]
        );
    }

    #[test]
    fn quantities_and_int_or_strings_take_numbers_and_strings() {
        let document = json!({"components": {"schemas": {
            "io.k8s.api.apps.v1.Deployment": {"type": "object",
                "properties": {"spec": {"type": "object", "properties": {
                    "cpu": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.api.resource.Quantity"}]},
                    "port": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.util.intstr.IntOrString"}]},
                    "surge": {"type": "string", "format": "int-or-string"},
                    "name": {"type": "string"}}}},
                "x-kubernetes-group-version-kind": [{"group": "apps", "kind": "Deployment", "version": "v1"}]},
            "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
            "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
        }}});
        let want = UpstreamRef::new("apps", "Deployment", "deployments", &["v1"]);
        let api = UpstreamApi::from_openapi(&document, &want, "v1", vec!["v1".into()]).unwrap();
        for value in [json!(2), json!("2")] {
            let partial = json!({"spec": {"cpu": value, "port": value, "surge": value}});
            assert!(api.problems(&partial).is_empty(), "{partial}");
        }
        assert_eq!(
            api.problems(&json!({"spec": {"name": 2}}))[0].to_string(),
            "spec.name (must be string, not integer)"
        );
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
