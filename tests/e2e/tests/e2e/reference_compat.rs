//! A manifest valid for AI Runway's `kubeairunway.ai` ModelDeployment and
//! InferenceProviderConfig CRDs must be valid for ours: every property path of the
//! reference schemas exists in ours with a compatible type, the same or more enum values,
//! no extra required fields, and limits no tighter. (Our CEL rules are the intended
//! difference: they encode the validation rules of the specification.)

use kubeairunway_e2e::{fixtures_dir, read_crd};
use serde_json::Value;

fn openapi(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    serde_json::to_value(crd).unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn kind_of(schema: &Value) -> String {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "int-or-string".into();
    }
    schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("any")
        .into()
}

/// Compare `reference` with `ours` at `path`; push every incompatibility to `problems`.
/// Returns the number of property paths visited.
fn compare(path: &str, reference: &Value, ours: &Value, problems: &mut Vec<String>) -> usize {
    let mut visited = 1;
    if ours.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        && ours.get("properties").is_none()
    {
        return visited; // ours keeps anything
    }
    if reference.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        problems.push(format!(
            "{path}: reference keeps unknown fields, ours does not"
        ));
    }
    let (rk, ok) = (kind_of(reference), kind_of(ours));
    if rk != ok {
        problems.push(format!("{path}: type {rk} in the reference, {ok} in ours"));
    }
    if let Some(values) = reference.get("enum").and_then(Value::as_array) {
        let ours_enum = ours.get("enum").and_then(Value::as_array);
        for v in values {
            if ours_enum.is_some_and(|e| !e.contains(v)) {
                problems.push(format!("{path}: enum value {v} missing"));
            }
        }
    }
    let required = |s: &Value| -> Vec<String> {
        s.get("required")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let reference_required = required(reference);
    for r in required(ours) {
        if !reference_required.contains(&r) {
            problems.push(format!("{path}: ours requires {r}, the reference does not"));
        }
    }
    for (limit, tighter_when_smaller) in [
        ("maxItems", true),
        ("maxLength", true),
        ("minimum", false),
        ("minLength", false),
    ] {
        if let Some(o) = ours.get(limit).and_then(Value::as_f64) {
            match reference.get(limit).and_then(Value::as_f64) {
                Some(r) if (tighter_when_smaller && o < r) || (!tighter_when_smaller && o > r) => {
                    problems.push(format!(
                        "{path}: {limit} {o} is tighter than the reference's {r}"
                    ));
                }
                None => problems.push(format!("{path}: ours adds {limit} {o}")),
                _ => {}
            }
        }
    }
    if let Some(p) = ours.get("pattern")
        && reference.get("pattern") != Some(p)
    {
        problems.push(format!("{path}: ours adds pattern {p}"));
    }
    if let Some(props) = reference.get("properties").and_then(Value::as_object) {
        for (key, sub) in props {
            if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&key.as_str()) {
                continue; // the API server itself handles these for every kind
            }
            match ours.get("properties").and_then(|p| p.get(key)) {
                Some(o) => visited += compare(&format!("{path}.{key}"), sub, o, problems),
                None => problems.push(format!("{path}.{key}: missing in ours")),
            }
        }
    }
    if let Some(items) = reference.get("items") {
        match ours.get("items") {
            Some(o) => visited += compare(&format!("{path}[]"), items, o, problems),
            None => problems.push(format!("{path}[]: ours has no items schema")),
        }
    }
    if let Some(add) = reference
        .get("additionalProperties")
        .filter(|a| a.is_object())
    {
        match ours.get("additionalProperties").filter(|a| a.is_object()) {
            Some(o) => visited += compare(&format!("{path}{{}}"), add, o, problems),
            None => problems.push(format!("{path}: reference is a map, ours is not")),
        }
    }
    visited
}

/// `allowed`: differences we make on purpose, each with its reason in the caller.
fn check(
    reference_file: &str,
    ours: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    min_paths: usize,
    allowed: &[&str],
) {
    let reference = read_crd(&fixtures_dir().join("crds/reference").join(reference_file)).unwrap();
    assert_eq!(reference.spec.group, ours.spec.group);
    assert_eq!(reference.spec.names.kind, ours.spec.names.kind);
    assert_eq!(reference.spec.scope, ours.spec.scope);
    let mut problems = Vec::new();
    let visited = compare("", &openapi(&reference), &openapi(ours), &mut problems);
    problems.retain(|p| !allowed.contains(&p.as_str()));
    assert!(
        problems.is_empty(),
        "{reference_file} is not compatible with ours:\n{}",
        problems.join("\n")
    );
    assert!(
        visited >= min_paths,
        "only {visited} paths compared: the walk is broken"
    );
}

#[test]
fn model_deployment_accepts_every_reference_manifest() {
    check(
        "kubeairunway.ai_modeldeployments.yaml",
        &kubeairunway_sdk::api::crds::all()[0],
        120,
        &[],
    );
}

#[test]
fn provider_config_accepts_every_reference_manifest() {
    // A config without a spec registers nothing; kube's derive makes `spec` required.
    // Selection rules are bounded on purpose (`kubeairunway_sdk::selection::budget`: any
    // provider may write any config, and core evaluates every rule for every
    // ModelDeployment): at most 64 rules of 1 to 4096 characters.
    check(
        "kubeairunway.ai_inferenceproviderconfigs.yaml",
        &kubeairunway_sdk::api::crds::all()[1],
        40,
        &[
            ": ours requires spec, the reference does not",
            ".spec.selectionRules: ours adds maxItems 64",
            ".spec.selectionRules[].condition: ours adds maxLength 4096",
            ".spec.selectionRules[].condition: ours adds minLength 1",
            // Engines are per-engine objects, AI Runway's own shape since its #214; a
            // stored config of bare names still reads (`Capabilities`).
            ".spec.capabilities.engines[]: type string in the reference, object in ours",
            ".spec.capabilities.engines[]: ours requires name, the reference does not",
            // Each engine once (a list-map keyed by name): four at most, which bounds the
            // cost of the rule on each engine's API formats.
            ".spec.capabilities.engines: ours adds maxItems 4",
        ],
    );
}

#[test]
fn the_walk_reports_a_missing_field() {
    let reference = serde_json::json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}});
    let ours = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let mut problems = Vec::new();
    compare("", &reference, &ours, &mut problems);
    assert_eq!(
        problems,
        [
            ".a: type string in the reference, integer in ours",
            ".b: missing in ours"
        ]
    );
}
