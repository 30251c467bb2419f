//! Engine auto-selection end to end, on an API server of its own with core and every
//! built-in provider running (as `kubeairunway up` runs them): AI Runway's README example,
//! a ModelDeployment with a model id and nothing else, is accepted, core chooses its
//! engine and records it (`status.engine`, `EngineSelected`), selects a provider over that
//! engine, and the provider creates the upstream object for it; a spec no engine fits
//! gets `EngineSelected=False` and no provider. A config stored in the earlier shape (bare
//! engine names) is rewritten per engine by its provider after the CRD is upgraded.

use std::time::Duration;

use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use kubeairunway_cli::builtin::{BuiltIns, NAMES, NodeProvisioningMode, ProviderFlags};
use kubeairunway_cli::controllers::Controllers;
use kubeairunway_cli::crds;
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::api::{EngineType, ModelDeploymentStatus};
use kubeairunway_sdk::conditions::{
    self, ENGINE_SELECTED, PROVIDER_SELECTED, RESOURCE_CREATED, reasons,
};
use kubeairunway_sdk::testing::{self, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

fn md(name: &str, spec: &Value) -> Value {
    json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": name}, "spec": spec})
}

/// Wait until ModelDeployment `name`'s status satisfies `ready`.
async fn wait_status(
    api: &Api<ModelDeployment>,
    name: &str,
    what: &str,
    ready: impl Fn(&ModelDeploymentStatus) -> bool,
) -> ModelDeployment {
    wait_for(
        WAIT,
        &format!("{name}: {what}"),
        || api.get(name),
        |m| m.status.as_ref().is_some_and(&ready),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn the_ai_runway_readme_example_gets_an_engine_a_provider_and_an_upstream_object() {
    let upstream = crds::all_bundled().unwrap();
    let (_cluster, client) = testing::private_cluster("core-engine", &upstream)
        .await
        .unwrap();
    let controllers = Controllers::start(
        &client,
        BuiltIns::new(&ProviderFlags::default(), None, NodeProvisioningMode::Byo),
        &NAMES,
    )
    .unwrap();
    // Engine and provider are chosen among the providers registered when core first sees
    // the ModelDeployment: apply nothing before all have registered.
    let mut dynamo_api = String::new();
    for provider in NAMES {
        let config = testing::registered(&client, provider).await;
        if provider == "dynamo" {
            dynamo_api = config.status.unwrap().upstream_crd_version.unwrap();
        }
    }
    let ns = "default";
    // AI Runway's README, under our group: a model id, nothing else.
    let readme = md("my-model", &json!({"model": {"id": "Qwen/Qwen3-0.6B"}}));
    // Disaggregated serving on KAITO, which serves no engine disaggregated.
    let unservable = md(
        "no-engine",
        &json!({"model": {"id": "a/b"}, "provider": {"name": "kaito"},
               "serving": {"mode": "disaggregated"},
               "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 1}}}}),
    );
    for manifest in [&readme, &unservable] {
        kubeairunway_e2e::apply_md(&client, ns, "user", manifest)
            .await
            .unwrap();
    }

    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
    let got = wait_status(&api, "my-model", "its upstream object created", |s| {
        conditions::is_true(&s.conditions, RESOURCE_CREATED)
    })
    .await;
    let status = got.status.clone().unwrap();
    let engine = status.engine.clone().unwrap();
    assert_eq!(engine.type_, Some(EngineType::Vllm));
    let reason = "first of vllm, sglang, trtllm, llamacpp that a provider serves \
                  (gpu=true (one by default), mode=aggregated): provider dynamo";
    assert_eq!(engine.selected_reason.as_deref(), Some(reason));
    let selected = conditions::find(&status.conditions, ENGINE_SELECTED).unwrap();
    assert_eq!(
        (
            selected.status.as_str(),
            selected.reason.as_str(),
            selected.message.as_str()
        ),
        ("True", reasons::AUTO_SELECTED, reason)
    );
    assert!(conditions::is_true(&status.conditions, PROVIDER_SELECTED));
    assert_eq!(got.selected_provider(), Some("dynamo"));
    assert!(
        got.spec.engine.type_.is_none(),
        "the spec is the user's: the engine is in status"
    );

    // The upstream object, for vLLM with the engine's one GPU.
    let provider = status.provider.unwrap();
    assert_eq!(
        provider.resource_kind.as_deref(),
        Some("DynamoGraphDeployment")
    );
    let (group, version) = dynamo_api.split_once('/').unwrap();
    let graphs = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(group, version, "DynamoGraphDeployment"),
            "dynamographdeployments",
        ),
    );
    let graph = graphs
        .get(provider.resource_name.as_deref().unwrap())
        .await
        .unwrap();
    let text = serde_json::to_string(&graph.data).unwrap();
    assert!(text.contains(r#""backendFramework":"vllm""#), "{text}");
    assert!(text.contains(r#""nvidia.com/gpu":"1""#), "{text}");

    // No engine fits: said so, and no provider is selected.
    let none = wait_status(&api, "no-engine", "EngineSelected", |s| {
        conditions::find(&s.conditions, ENGINE_SELECTED).is_some()
    })
    .await;
    let status = none.status.clone().unwrap();
    let selected = conditions::find(&status.conditions, ENGINE_SELECTED).unwrap();
    assert_eq!(
        (selected.status.as_str(), selected.reason.as_str()),
        ("False", reasons::NO_ENGINE)
    );
    assert!(
        selected.message.starts_with(
            "No engine of provider kaito fits (gpu=true, mode=disaggregated): \
             vllm: serving mode disaggregated not supported with vllm"
        ),
        "{}",
        selected.message
    );
    assert_eq!(status.message.as_deref(), Some(selected.message.as_str()));
    assert_eq!(none.selected_provider(), None);
    assert!(status.engine.is_none());
    controllers.stop().await;
}

/// An InferenceProviderConfig stored by an earlier version (bare engine names, the
/// provider-wide lists, under the earlier CRD) is rewritten per engine by its provider
/// once the CRD is upgraded: registration works over the stored legacy shape.
#[tokio::test]
async fn a_config_stored_with_bare_engine_names_is_rewritten_per_engine() {
    let upstream = crds::all_bundled().unwrap();
    let (_cluster, client) = testing::private_cluster("core-engine-legacy", &upstream)
        .await
        .unwrap();
    // The earlier CRD (flat capabilities), with a config as its providers wrote it.
    let earlier = kubeairunway_e2e::read_crd(
        &kubeairunway_e2e::fixtures_dir()
            .join("crds/reference/kubeairunway.ai_inferenceproviderconfigs.yaml"),
    )
    .unwrap();
    kubeairunway_testcluster::install_crds(&client, &[earlier])
        .await
        .unwrap();
    let configs: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<kubeairunway_sdk::InferenceProviderConfig>(&()),
    );
    let legacy = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "InferenceProviderConfig",
        "metadata": {"name": "kaito"},
        "spec": {"capabilities": {"engines": ["vllm", "llamacpp"], "servingModes": ["aggregated"],
                                  "cpuSupport": true, "gpuSupport": true}}});
    configs
        .patch(
            "kaito",
            &kube::api::PatchParams::apply("kaito-provider").force(),
            &kube::api::Patch::Apply(&legacy),
        )
        .await
        .unwrap();
    // Upgrade: today's CRD, then the provider starts.
    kubeairunway_testcluster::install_crds(&client, &kubeairunway_sdk::api::crds::all())
        .await
        .unwrap();
    let builtins = BuiltIns::new(&ProviderFlags::default(), None, NodeProvisioningMode::Byo);
    let wanted = kubeairunway_sdk::Provider::config(&builtins.kaito).capabilities;
    let controllers = Controllers::start(&client, builtins, &["kaito"]).unwrap();
    let config = testing::registered(&client, "kaito").await;
    assert_eq!(config.spec.capabilities, wanted);
    let stored = configs.get("kaito").await.unwrap();
    assert!(
        stored.data["spec"]["capabilities"]
            .get("servingModes")
            .is_none(),
        "the provider-wide lists are released: {:?}",
        stored.data
    );
    controllers.stop().await;
}
