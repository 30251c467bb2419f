//! Our generated CRDs on the real API server: established, and defaulting as the
//! reference CRD does.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kubeairunway_e2e::{apply_md, core_cluster};
use kubeairunway_sdk::{InferenceProviderConfig, ModelDeployment};
use serde_json::json;

#[tokio::test]
async fn core_crds_are_established_with_their_names() {
    let (_, client) = core_cluster().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    for (name, short) in [
        ("modeldeployments.kubeairunway.ai", "md"),
        ("inferenceproviderconfigs.kubeairunway.ai", "ipc"),
    ] {
        let crd = crds.get(name).await.unwrap();
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"),
            "{name} not established: {conditions:?}"
        );
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_string()]));
    }
}

/// The defaults the reference CRD gives a minimal ModelDeployment, as JSON pointers into
/// its `spec` and their values.
const REFERENCE_DEFAULTS: [(&str, &str); 5] = [
    ("/model/source", "\"huggingface\""),
    ("/serving/mode", "\"aggregated\""),
    ("/scaling/replicas", "1"),
    ("/engine/trustRemoteCode", "false"),
    ("/resources/gpu/type", "\"nvidia.com/gpu\""),
];

/// A minimal ModelDeployment manifest (in API group `group`).
fn minimal(group: &str) -> serde_json::Value {
    json!({
        "apiVersion": format!("{group}/v1alpha1"),
        "kind": "ModelDeployment",
        "metadata": {"name": "minimal"},
        "spec": {
            "model": {"id": "Qwen/Qwen2.5-0.5B-Instruct"},
            "engine": {"type": "vllm"},
            "resources": {"gpu": {"count": 1}},
        },
    })
}

/// The reference defaults that `spec`, as the API server stored it, does not hold (a
/// missing field, or another value), each with what it holds instead.
fn missing_defaults(spec: &serde_json::Value) -> Vec<String> {
    REFERENCE_DEFAULTS
        .iter()
        .filter_map(|(pointer, want)| {
            let want: serde_json::Value = serde_json::from_str(want).unwrap();
            let got = spec.pointer(pointer);
            (got != Some(&want)).then(|| format!("{pointer}: want {want}, stored {got:?}"))
        })
        .collect()
}

/// The ModelDeployment `name` in `ns` as the API server returns it, untyped: a typed read
/// would fill every field the API server left out with its serde default, and the test
/// could not tell a default the API server applied from one it did not.
async fn stored_spec(client: kube::Client, group: &str, ns: &str, name: &str) -> serde_json::Value {
    let mut ar = ApiResource::erase::<ModelDeployment>(&());
    ar.group = group.into();
    ar.api_version = format!("{group}/v1alpha1");
    let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &ar);
    api.get(name).await.unwrap().data["spec"].clone()
}

#[tokio::test]
async fn minimal_model_deployment_gets_the_reference_defaults() {
    let (cluster, client) = core_cluster().await.unwrap();
    let ns = cluster.namespace("defaults");
    apply_md(&client, &ns, "tests", &minimal(kubeairunway_sdk::GROUP))
        .await
        .unwrap();
    let stored = stored_spec(client, kubeairunway_sdk::GROUP, &ns, "minimal").await;
    assert_eq!(missing_defaults(&stored), Vec::<String>::new(), "{stored}");
}

/// The defaults test can fail: the same CRD without the default of
/// `engine.trustRemoteCode`, served under a group of its own, stores the minimal
/// ModelDeployment without that field, and the check names it. A typed read of the same
/// object would still show `false` (the serde default), which is why the check reads JSON.
#[tokio::test]
async fn a_crd_missing_a_default_fails_the_defaults_check() {
    let (cluster, client) = core_cluster().await.unwrap();
    let group = "nodefault.kubeairunway.ai";
    let mut crd = serde_json::to_value(&kubeairunway_sdk::api::crds::all()[0]).unwrap();
    assert_eq!(crd["spec"]["names"]["kind"], "ModelDeployment");
    crd["metadata"]["name"] = format!("modeldeployments.{group}").into();
    crd["spec"]["group"] = group.into();
    let engine = crd
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/engine/properties/trustRemoteCode")
        .and_then(serde_json::Value::as_object_mut)
        .unwrap();
    assert!(engine.remove("default").is_some(), "the CRD defaults it");
    let crd: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    kubeairunway_testcluster::install_crds(&client, &[crd])
        .await
        .unwrap();

    let ns = cluster.namespace("nodefault");
    let mut manifest = minimal(group);
    manifest["metadata"]["namespace"] = ns.clone().into();
    let mut ar = ApiResource::erase::<ModelDeployment>(&());
    ar.group = group.into();
    ar.api_version = format!("{group}/v1alpha1");
    Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ar)
        .patch(
            "minimal",
            &PatchParams::apply("tests"),
            &Patch::Apply(&manifest),
        )
        .await
        .unwrap();
    let stored = stored_spec(client, group, &ns, "minimal").await;
    let missing = missing_defaults(&stored);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert!(
        missing[0].starts_with("/engine/trustRemoteCode:"),
        "{missing:?}"
    );
    let typed: kubeairunway_sdk::ModelDeploymentSpec = serde_json::from_value(stored).unwrap();
    assert!(
        !typed.engine.trust_remote_code,
        "a typed read fills the missing field with its serde default"
    );
}

/// The defaults core's mutating webhook and selection fill in (`defaults::apply`) are
/// exactly those the API server fills in from the installed CRD: a sparse spec stored
/// (without any webhook) and read back raw equals the same spec defaulted by
/// `defaults::apply`. A default added on one side only fails here.
#[tokio::test]
async fn the_webhook_s_defaults_are_the_crd_s() {
    let (cluster, client) = core_cluster().await.unwrap();
    let ns = cluster.namespace("crd-defaults");
    let sparse = json!({
        "model": {"id": "a/b", "storage": {"volumes": [{"name": "w", "mountPath": "/w"}]}},
        "engine": {"type": "vllm"},
        "resources": {"gpu": {"count": 1}},
        "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {}},
        "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"key": "k"}}}],
    });
    let manifest = json!({
        "apiVersion": "kubeairunway.ai/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "sparse"},
        "spec": sparse,
    });
    let stored = apply_md(&client, &ns, "tests", &manifest).await.unwrap();
    let mut defaulted = sparse.clone();
    kubeairunway_sdk::defaults::apply(&mut defaulted);
    assert_eq!(stored.data["spec"], defaulted);
    assert_ne!(defaulted, sparse, "the sparse spec has defaults to fill");
}

#[tokio::test]
async fn provider_config_is_cluster_scoped_and_round_trips() {
    let (_, client) = core_cluster().await.unwrap();
    let api: Api<InferenceProviderConfig> = Api::all(client);
    let ipc: InferenceProviderConfig = serde_json::from_value(json!({
        "apiVersion": "kubeairunway.ai/v1alpha1",
        "kind": "InferenceProviderConfig",
        "metadata": {"name": "e2e-roundtrip"},
        "spec": {
            "capabilities": {"engines": ["vllm", "llamacpp"], "servingModes": ["aggregated"], "cpuSupport": true, "gpuSupport": true},
            "selectionRules": [{"condition": "spec.engine.type == 'llamacpp'", "priority": 100}, {"condition": "true"}],
        },
    }))
    .unwrap();
    let pp = kube::api::PatchParams::apply("tests").force();
    api.patch("e2e-roundtrip", &pp, &kube::api::Patch::Apply(&ipc))
        .await
        .unwrap();
    let back = api.get("e2e-roundtrip").await.unwrap();
    assert_eq!(back.spec.selection_rules.len(), 2);
    assert_eq!(
        back.spec.selection_rules[1].priority, 0,
        "priority defaults to 0"
    );
    assert!(back.spec.serves());
    // Read in the earlier shape (bare engine names), written back per engine.
    let caps = back.spec.capabilities.unwrap();
    assert_eq!(
        caps.engine_names(),
        [
            kubeairunway_sdk::api::EngineType::Vllm,
            kubeairunway_sdk::api::EngineType::Llamacpp
        ]
    );
    assert!(
        caps.engine(kubeairunway_sdk::api::EngineType::Vllm)
            .unwrap()
            .cpu_support
    );

    let bad = |engines: serde_json::Value| {
        json!({
            "apiVersion": "kubeairunway.ai/v1alpha1",
            "kind": "InferenceProviderConfig",
            "metadata": {"name": "e2e-bad"},
            "spec": {"capabilities": {"engines": engines}},
        })
    };
    for (engines, field) in [
        (
            json!([{"name": "tgi"}]),
            "spec.capabilities.engines[0].name",
        ),
        // The earlier shape is read, but no longer written (server-side apply refuses it
        // before validation, as kube-apiserver's structured merge does).
        (
            json!(["vllm"]),
            ".spec.capabilities.engines: element 0: associative list with keys may not have non-map elements",
        ),
        (
            json!([{"name": "vllm", "apiFormats": ["grpc"]}]),
            "spec.capabilities.engines[0].apiFormats[0]",
        ),
        // More than the engine's own server serves.
        (
            json!([{"name": "sglang", "apiFormats": ["openai-chat", "openai-responses"]}]),
            "spec.capabilities.engines[0].apiFormats: Invalid value: apiFormats names a format the engine's own server does not serve (vllm: openai-chat, openai-responses, anthropic-messages; sglang: openai-chat, anthropic-messages;",
        ),
    ] {
        let err = api
            .patch("e2e-bad", &pp, &kube::api::Patch::Apply(&bad(engines)))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
}
