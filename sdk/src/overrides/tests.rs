use super::*;
use crate::upstream::UpstreamRef;
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize, Default, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
struct Frontend {
    replicas: Option<i32>,
    resources: Option<Resources>,
}

#[derive(Deserialize, Default, Debug, PartialEq)]
#[serde(default)]
struct Resources {
    cpu: Option<String>,
    memory: Option<String>,
}

#[derive(Deserialize, Default, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
struct Overrides {
    router_mode: Option<String>,
    frontend: Option<Frontend>,
}

const TYPED: [&str; 2] = ["routerMode", "frontend"];

fn md(overrides: &Value) -> ModelDeployment {
    serde_json::from_value(json!({
        "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "m"},
        "spec": {"model": {"id": "a/b"}, "provider": {"overrides": overrides}},
    }))
    .unwrap()
}

/// A Workspace-like kind: fields at the root, a list of objects, a free-form field.
fn api() -> UpstreamApi {
    UpstreamApi::new(
        &UpstreamRef::new("example.com", "Widget", "widgets", &["v1"]),
        "v1",
        json!({"type": "object", "properties": {
            "resource": {"type": "object", "properties": {
                "count": {"type": "integer"},
                "labelSelector": {"type": "object", "properties": {
                    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}}}},
            "inference": {"type": "object", "properties": {
                "preset": {"type": "object", "properties": {"name": {"type": "string"}}},
                "adapters": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}}}},
                "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}),
    )
}

fn rendered() -> Value {
    json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "m", "annotations": {"kaito.sh/runtime": "vllm"}},
        "resource": {"count": 1, "labelSelector": {"matchLabels": {
            "kubeairunway.ai/model-deployment": "m", "gpu": "a100"}}},
        "inference": {"preset": {"name": "llama"}, "adapters": [{"name": "a"}, {"name": "b"}]},
    })
}

fn apply_to_rendered(patch: &Value) -> Result<Value, Refused> {
    let mut object = rendered();
    let Value::Object(patch) = patch else {
        unreachable!()
    };
    apply(&mut object, patch, &api()).map(|()| object)
}

#[test]
fn typed_keys_are_parsed_and_the_rest_is_the_patch() {
    let m = md(&json!({
        "routerMode": "kv",
        "frontend": {"resources": {"cpu": "4"}},
        "resource": {"count": 10},
    }));
    let o = parse::<Overrides>(&m, &TYPED).unwrap();
    assert_eq!(o.router_mode.as_deref(), Some("kv"));
    assert_eq!(
        o.frontend.unwrap().resources.unwrap().cpu.as_deref(),
        Some("4")
    );
    assert_eq!(
        patch(&m, &TYPED).map(Value::Object),
        Some(json!({"resource": {"count": 10}}))
    );
    assert_eq!(patch(&md(&json!({"routerMode": "kv"})), &TYPED), None);
}

#[test]
fn an_unknown_key_under_a_typed_one_is_refused_with_its_path() {
    let err = parse_value::<Overrides>(json!({
        "frontend": {"replicsa": 2, "resources": {"cpu": "4", "gpu": "1"}},
    }))
    .unwrap_err();
    assert_eq!(
        err.0,
        "unknown override provider.overrides.frontend.replicsa, provider.overrides.frontend.resources.gpu: this provider reads provider.overrides.frontend itself and has no such setting"
    );
}

#[test]
fn wrong_type_names_the_path() {
    let err = parse_value::<Overrides>(json!({"frontend": {"replicas": "two"}})).unwrap_err();
    assert_eq!(
        err.0,
        "invalid override provider.overrides.frontend.replicas: invalid type: string \"two\", expected i32"
    );
}

#[test]
fn absent_overrides_give_defaults() {
    let m: ModelDeployment = serde_json::from_value(json!({
        "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "m"}, "spec": {"model": {"id": "a/b"}},
    }))
    .unwrap();
    assert_eq!(
        parse::<Overrides>(&m, &TYPED).unwrap(),
        Overrides::default()
    );
    assert_eq!(patch(&m, &TYPED), None);
}

#[test]
fn objects_merge_deeply() {
    let merged = apply_to_rendered(&json!({
        "resource": {"count": 10, "labelSelector": {"matchLabels": {"zone": "b"}}},
        "metadata": {"labels": {"team": "x"}, "annotations": {"note": "y"}},
    }))
    .unwrap();
    assert_eq!(merged["resource"]["count"], 10);
    assert_eq!(
        merged["resource"]["labelSelector"]["matchLabels"],
        json!({"kubeairunway.ai/model-deployment": "m", "gpu": "a100", "zone": "b"})
    );
    assert_eq!(merged["inference"]["preset"]["name"], "llama", "untouched");
    assert_eq!(merged["metadata"]["labels"]["team"], "x");
    assert_eq!(
        merged["metadata"]["annotations"],
        json!({"kaito.sh/runtime": "vllm", "note": "y"})
    );
}

#[test]
fn null_deletes_a_field() {
    let merged = apply_to_rendered(&json!({
        "resource": {"labelSelector": {"matchLabels": {"gpu": null}}},
        "inference": {"preset": null},
    }))
    .unwrap();
    assert_eq!(
        merged["resource"]["labelSelector"]["matchLabels"],
        json!({"kubeairunway.ai/model-deployment": "m"})
    );
    assert!(merged["inference"].get("preset").is_none());
    assert_eq!(merged["inference"]["adapters"][0]["name"], "a");
}

#[test]
fn a_list_is_replaced_whole() {
    let merged = apply_to_rendered(&json!({"inference": {"adapters": [{"name": "c"}]}})).unwrap();
    assert_eq!(merged["inference"]["adapters"], json!([{"name": "c"}]));
}

#[test]
fn paths_the_schema_lacks_or_types_it_refuses_are_named_and_nothing_is_merged() {
    let err = apply_to_rendered(&json!({
        "resource": {"count": "ten", "cuont": 1},
        "inference": {"adapters": [{"name": 1}], "template": {"anything": {"goes": 1}}},
        "spec": {"x": 1},
    }))
    .unwrap_err();
    assert_eq!(err.reason(), crate::conditions::reasons::INVALID_OVERRIDE);
    assert_eq!(
        err.to_string(),
        format!(
            "overrides are not accepted by the installed Widget example.com/v1 (schema {}): \
             provider.overrides.inference.adapters[].name (must be string, not integer), \
             provider.overrides.resource.count (must be integer, not string), \
             provider.overrides.resource.cuont (no such field), \
             provider.overrides.spec (no such field); nothing was applied",
            api().schema_hash
        )
    );
}

#[test]
fn what_the_runtime_owns_is_refused() {
    for (patch, path) in [
        (json!({"metadata": {"name": "other"}}), "metadata.name"),
        (
            json!({"metadata": {"namespace": "x"}}),
            "metadata.namespace",
        ),
        (
            json!({"metadata": {"ownerReferences": []}}),
            "metadata.ownerReferences",
        ),
        (
            json!({"metadata": {"finalizers": ["x"]}}),
            "metadata.finalizers",
        ),
        (json!({"metadata": {"labels": null}}), "metadata.labels"),
        (json!({"metadata": null}), "metadata"),
        (
            json!({"metadata": {"labels": {"kubeairunway.ai/provider": "x"}}}),
            "metadata.labels.kubeairunway.ai/provider",
        ),
        (
            json!({"metadata": {"annotations": {"kubeairunway.ai/identity": null}}}),
            "metadata.annotations.kubeairunway.ai/identity",
        ),
        (json!({"kind": "Other"}), "kind"),
        (json!({"apiVersion": "v2"}), "apiVersion"),
        (json!({"status": {}}), "status"),
        (
            json!({"resource": {"labelSelector": {"matchLabels": {"kubeairunway.ai/model-deployment": "x"}}}}),
            "resource.labelSelector.matchLabels.kubeairunway.ai/model-deployment",
        ),
        (
            json!({"resource": {"labelSelector": null}}),
            "resource.labelSelector.matchLabels.kubeairunway.ai/model-deployment",
        ),
        (
            json!({"resource": {"labelSelector": {"matchLabels": null}}}),
            "resource.labelSelector.matchLabels.kubeairunway.ai/model-deployment",
        ),
    ] {
        let err = apply_to_rendered(&patch).unwrap_err();
        assert_eq!(
            err,
            Refused::RuntimeOwned {
                paths: vec![path.to_string()]
            },
            "{patch}"
        );
        assert_eq!(
            err.reason(),
            crate::conditions::reasons::RUNTIME_OWNED_OVERRIDE
        );
        assert_eq!(
            err.to_string(),
            format!(
                "provider.overrides.{path} may not be overridden: the runtime owns it; nothing was applied"
            )
        );
    }
}

#[test]
fn a_primary_object_of_another_kind_is_never_merged_unchecked() {
    let mut object = json!({"apiVersion": "example.com/v1alpha1", "kind": "WidgetSet",
                            "metadata": {"name": "m"}, "spec": {}});
    let before = object.clone();
    let Value::Object(patch) = json!({"spec": {"replicas": 3}}) else {
        unreachable!()
    };
    let err = apply(&mut object, &patch, &api()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "provider.overrides cannot be merged into WidgetSet 'm': the provider holds the schema of Widget example.com/v1 only, and an override is never applied unchecked; nothing was applied"
    );
    assert_eq!(object, before);
}

/// The rules Warmup custom actions are held to (docs/security.md), for overrides, which
/// reach pod templates the provider creates with its own identity.
#[test]
fn pod_fields_that_take_over_a_node_are_refused() {
    let patch = json!({"inference": {"template": {"spec": {
        "hostNetwork": true,
        "hostPID": false,
        "serviceAccountName": "admin",
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        "containers": [{"name": "c", "securityContext": {
            "privileged": true,
            "capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}}}],
    }}}});
    let err = apply_to_rendered(&patch).unwrap_err();
    assert_eq!(err.reason(), crate::conditions::reasons::UNSAFE_OVERRIDE);
    let Refused::UnsafePodField { paths } = err else {
        panic!("{err}")
    };
    assert_eq!(
        paths,
        [
            "inference.template.spec.containers[].securityContext.capabilities.add",
            "inference.template.spec.containers[].securityContext.privileged",
            "inference.template.spec.hostNetwork",
            "inference.template.spec.serviceAccountName",
            "inference.template.spec.volumes[].hostPath",
        ]
    );
    let safe = json!({"inference": {"template": {"spec": {
        "hostNetwork": false,
        "containers": [{"name": "c", "securityContext": {
            "privileged": false, "capabilities": {"add": [], "drop": ["ALL"]}}}],
    }}}});
    assert!(apply_to_rendered(&safe).is_ok());
}

#[test]
fn label_and_annotation_values_are_strings() {
    let err = apply_to_rendered(&json!({"metadata": {
        "labels": {"team": 1, "tier": "gold", "old": null},
        "annotations": {"note": {"a": "b"}},
    }}))
    .unwrap_err();
    assert_eq!(err.reason(), crate::conditions::reasons::INVALID_OVERRIDE);
    let message = err.to_string();
    for named in [
        "provider.overrides.metadata.annotations.note (must be string, not object)",
        "provider.overrides.metadata.labels.team (must be string, not integer)",
    ] {
        assert!(message.contains(named), "{message}");
    }
}
