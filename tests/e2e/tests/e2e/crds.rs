//! Our generated CRDs on the real API server: established, and defaulting as the
//! reference CRD does.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
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

#[tokio::test]
async fn minimal_model_deployment_gets_the_reference_defaults() {
    let (cluster, client) = core_cluster().await.unwrap();
    let ns = cluster.namespace("defaults");
    let manifest = json!({
        "apiVersion": "kubeairunway.ai/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "minimal"},
        "spec": {
            "model": {"id": "Qwen/Qwen2.5-0.5B-Instruct"},
            "engine": {"type": "vllm"},
            "resources": {"gpu": {"count": 1}},
        },
    });
    apply_md(&client, &ns, "tests", &manifest).await.unwrap();
    let md = Api::<ModelDeployment>::namespaced(client, &ns)
        .get("minimal")
        .await
        .unwrap();
    let stored = serde_json::to_value(&md.spec).unwrap();
    assert_eq!(stored["model"]["source"], "huggingface");
    assert_eq!(stored["serving"]["mode"], "aggregated");
    assert_eq!(stored["scaling"]["replicas"], 1);
    assert_eq!(stored["engine"]["trustRemoteCode"], false);
    assert_eq!(stored["resources"]["gpu"]["type"], "nvidia.com/gpu");
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

    let bad: serde_json::Value = json!({
        "apiVersion": "kubeairunway.ai/v1alpha1",
        "kind": "InferenceProviderConfig",
        "metadata": {"name": "e2e-bad"},
        "spec": {"capabilities": {"engines": ["tgi"]}},
    });
    let err = api
        .patch("e2e-bad", &pp, &kube::api::Patch::Apply(&bad))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("spec.capabilities.engines[0]"),
        "{err}"
    );
}
