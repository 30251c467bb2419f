//! The Dynamo provider end to end on a real API server, once per real
//! DynamoGraphDeployment CRD: the v1alpha1-only CRD of Dynamo 1.1, and the newer CRD
//! (v1alpha1 deprecated, v1beta1 storage; its conversion webhook is unreachable here, so
//! only v1beta1 objects are ever created and read on it). Each CRD gets a private
//! cluster, exactly one provider instance and the Dynamo operator stand-in
//! (`kubeairunway_e2e::operators::dynamo`: its webhook, its merge of our containers, the
//! engines' argument checks and its controller's status); the whole walk runs in one test
//! function.
//! Also: the chart lints and renders with least-privilege RBAC.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_dynamo_provider::{Dynamo, Settings};
use kubeairunway_e2e::operators::{self, dynamo::MANUAL_STATUS_LABEL, dynamo::StandIn};
use kubeairunway_e2e::{fixtures_dir, helm, read_crd};
use kubeairunway_sdk::api::{EngineType, ModelDeployment, Phase, ServingMode};
use kubeairunway_sdk::conditions::{PROVIDER_COMPATIBLE, READY};
use kubeairunway_sdk::testing::{
    self, ModelDeploymentBuilder, TestCluster, condition, md_where, message, phase, test_options,
    wait_for,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const OLD_CRD: &str = "nvidia.com_dynamographdeployments.v1alpha1-only.dynamo-1.1-branchcut.yaml";
const NEW_CRD: &str = "nvidia.com_dynamographdeployments.yaml";

fn dgd_resource(version: &str) -> ApiResource {
    ApiResource {
        group: "nvidia.com".into(),
        version: version.into(),
        api_version: format!("nvidia.com/{version}"),
        kind: "DynamoGraphDeployment".into(),
        plural: "dynamographdeployments".into(),
    }
}

fn upstream_crd(file: &str) -> CustomResourceDefinition {
    read_crd(&fixtures_dir().join("crds/upstream").join(file)).unwrap()
}

/// A private cluster with the platform's CRDs and `crd`.
async fn private_cluster(tag: &str, crd: &CustomResourceDefinition) -> (TestCluster, Client) {
    testing::private_cluster(&format!("dynamo-{tag}"), std::slice::from_ref(crd))
        .await
        .unwrap()
}

async fn dgd_where(
    client: &Client,
    version: &str,
    ns: &str,
    name: &str,
    what: &str,
    ready: impl Fn(&Option<DynamicObject>) -> bool,
) -> Option<DynamicObject> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &dgd_resource(version));
    wait_for(
        WAIT,
        &format!("DGD {ns}/{name}: {what}"),
        || api.get_opt(name),
        ready,
    )
    .await
    .unwrap()
}

fn ready_condition(status: &str, reason: &str, message: &str) -> Value {
    json!({
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": Timestamp::now().to_string(),
    })
}

/// The cases every CRD gets: each engine and mode, a custom image, storage; all must reach
/// Running under the stand-in operator with nothing refused or misserved.
fn cases() -> Vec<(&'static str, ModelDeployment)> {
    let disagg = |name: &str, engine: EngineType| {
        ModelDeploymentBuilder::new(name)
            .engine(engine)
            .gpus(0)
            .mode(ServingMode::Disaggregated)
            .spec(|s| {
                s.resources = None;
                s.scaling.prefill = serde_json::from_value(
                    json!({"replicas": 2, "gpu": {"count": 4}, "memory": "128Gi"}),
                )
                .unwrap();
                s.scaling.decode = serde_json::from_value(
                    json!({"replicas": 4, "gpu": {"count": 2}, "memory": "64Gi"}),
                )
                .unwrap();
                s.secrets =
                    serde_json::from_value(json!({"huggingFaceToken": "hf-token"})).unwrap();
            })
    };
    let storage = ModelDeploymentBuilder::new("storage")
        .spec(|s| {
            s.model.storage = serde_json::from_value(json!({"volumes": [
                {"name": "weights", "claimName": "model-cache", "purpose": "modelCache"},
            ]}))
            .unwrap();
        })
        .build();
    vec![
        ("agg", ModelDeploymentBuilder::new("agg").gpus(1).build()),
        (
            "disagg",
            disagg("disagg", EngineType::Vllm)
                .overrides(json!({"routerMode": "kv", "frontend": {"replicas": 2, "resources": {"cpu": "4", "memory": "8Gi"}}}))
                .build(),
        ),
        ("sglang", ModelDeploymentBuilder::new("sglang").engine(EngineType::Sglang).gpus(2).build()),
        ("sglang-pd", disagg("sglang-pd", EngineType::Sglang).build()),
        (
            "trtllm",
            ModelDeploymentBuilder::new("trtllm")
                .engine(EngineType::Trtllm)
                .spec(|s| {
                    s.engine.context_length = Some(4096);
                    s.engine.trust_remote_code = true;
                })
                .build(),
        ),
        ("trtllm-pd", disagg("trtllm-pd", EngineType::Trtllm).build()),
        (
            "custom",
            ModelDeploymentBuilder::new("custom").image("registry.example/dynamo:dev").build(),
        ),
        ("storage", storage),
    ]
}

/// The whole walk for one installed CRD; `version` is the adapter it must choose.
async fn walk(tag: &str, crd: CustomResourceDefinition, version: &'static str) {
    let (cluster, client) = private_cluster(tag, &crd).await;
    let settings = Settings {
        failed_after: Duration::from_secs(2),
        ..Settings::default()
    };
    let _running = testing::spawn(Dynamo::new(settings), client.clone(), test_options());
    // Dynamo itself, as it treats what we render (see kubeairunway_e2e::operators::dynamo):
    // its webhook, called by the API server, and its controller.
    let _webhook = operators::dynamo::serve_webhook(&cluster, &client, &dgd_resource(version))
        .await
        .unwrap();
    refusals_come_from_the_webhook(&client, version).await;
    let operator = StandIn::spawn(
        client.clone(),
        dgd_resource(version),
        version,
        BTreeSet::from(["model-cache".to_string()]),
    );
    let dgds = |ns: &str| -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), ns, &dgd_resource(version))
    };

    // Registration says which upstream version was detected.
    let config = testing::registered(&client, "dynamo").await;
    assert_eq!(
        config.status.unwrap().upstream_crd_version,
        Some(format!("nvidia.com/{version}")),
        "the adapter is chosen from the installed CRD"
    );

    // Every engine and mode renders an object the real API server accepts, at the
    // version the adapter was chosen for, that Dynamo admits, runs and serves.
    for (prefix, md) in &cases() {
        let ns = format!("{tag}-{prefix}");
        let mut md = md.clone();
        md.metadata.namespace = Some(ns.clone());
        deploy(&client, &md).await;
        let live = dgd_where(
            &client,
            version,
            &ns,
            &md.name_any(),
            "created",
            Option::is_some,
        )
        .await
        .unwrap();
        let expected = serde_json::to_value(
            &kubeairunway_sdk::Provider::render(&Dynamo::default(), &md, &detected(&crd))
                .unwrap()
                .objects[0],
        )
        .unwrap();
        assert_eq!(
            live.data["spec"]["backendFramework"],
            expected["spec"]["backendFramework"]
        );
        let components = if version == "v1beta1" {
            "components"
        } else {
            "services"
        };
        assert_eq!(
            live.data["spec"][components], expected["spec"][components],
            "{prefix}: as rendered"
        );
        let md = md_where(&client, &ns, &md.name_any(), "Running", |m| {
            phase(m) == Some(Phase::Running)
        })
        .await;
        assert_eq!(
            condition(&md, PROVIDER_COMPATIBLE).map(|c| c.status.as_str()),
            Some("True")
        );
        let status = md.status.clone().unwrap();
        assert_eq!(status.message.as_deref(), Some("All resources are ready"));
        let endpoint = status.endpoint.unwrap();
        assert_eq!(
            (endpoint.service, endpoint.port),
            (Some(format!("{}-frontend", md.name_any())), Some(8000))
        );
    }
    assert_eq!(
        operator.problems(),
        Vec::<String>::new(),
        "refused or misserved"
    );

    // A wrong override type or router mode fails with the path.
    let bad_ns = format!("{tag}-bad");
    let bad = ModelDeploymentBuilder::new("bad")
        .namespace(&bad_ns)
        .overrides(json!({"routerMode": "none"}))
        .build();
    deploy(&client, &bad).await;
    let md = md_where(&client, &bad_ns, "bad", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    assert!(
        message(&md).contains("provider.overrides.routerMode"),
        "{}",
        message(&md)
    );
    assert!(dgds(&bad_ns).get_opt("bad").await.unwrap().is_none());

    // On Dynamo 1.1 a claim that does not exist fails the graph, with its name.
    if version == "v1alpha1" {
        let ns = format!("{tag}-noclaim");
        let md = ModelDeploymentBuilder::new("noclaim")
            .namespace(&ns)
            .spec(|s| {
                s.model.storage = serde_json::from_value(json!({"volumes": [
                    {"name": "weights", "claimName": "missing-claim", "purpose": "modelCache"},
                ]}))
                .unwrap();
            })
            .build();
        deploy(&client, &md).await;
        let md = md_where(&client, &ns, "noclaim", "Failed", |m| {
            phase(m) == Some(Phase::Failed)
        })
        .await;
        assert_eq!(
            message(&md),
            "failed to reconcile top-level PVCs: persistentvolumeclaims \"missing-claim\" not found"
        );
    }

    // The status walk the test writes itself: initializing -> pending -> successful, and
    // a failure that persists.
    let ns = format!("{tag}-manual");
    deploy(
        &client,
        &ModelDeploymentBuilder::new("manual")
            .namespace(&ns)
            .label(MANUAL_STATUS_LABEL, "true")
            .build(),
    )
    .await;
    dgd_where(&client, version, &ns, "manual", "created", Option::is_some).await;
    let resource = dgd_resource(version);
    let write = |status: Value| {
        let client = client.clone();
        let resource = resource.clone();
        let ns = ns.clone();
        async move {
            testing::write_upstream_status(&client, &resource, &ns, "manual", status)
                .await
                .unwrap();
        }
    };
    write(json!({"state": "initializing"})).await;
    let md = md_where(&client, &ns, "manual", "initializing", |m| {
        message(m) == "DynamoGraphDeployment is initializing"
    })
    .await;
    assert_eq!(phase(&md), Some(Phase::Deploying));

    write(json!({"state": "pending", "conditions": [ready_condition("False", "some_resources_are_not_ready", "Resources not ready: manual-vllmworker: Component deployment not ready - Available condition not true")]})).await;
    let md = md_where(&client, &ns, "manual", "pending", |m| {
        message(m).starts_with("Resources not ready: manual-vllmworker")
    })
    .await;
    assert_eq!(phase(&md), Some(Phase::Deploying));
    assert_eq!(
        condition(&md, READY).map(|c| c.status.as_str()),
        Some("False")
    );

    let per_component = if version == "v1beta1" {
        "components"
    } else {
        "services"
    };
    write(json!({
        "state": "successful",
        "conditions": [ready_condition("True", "all_resources_are_ready", "All resources are ready")],
        per_component: {
            "Frontend": operators::dynamo::replica_status(version, "manual-frontend", 2, 2),
            "VllmWorker": operators::dynamo::scaling_group_status(version, "manual-vllmworker", 1, 1),
        },
    }))
    .await;
    let md = md_where(&client, &ns, "manual", "Running", |m| {
        phase(m) == Some(Phase::Running)
    })
    .await;
    let status = md.status.clone().unwrap();
    assert_eq!(status.message.as_deref(), Some("All resources are ready"));
    let replicas = status.replicas.unwrap();
    assert_eq!((replicas.desired, replicas.ready), (Some(1), Some(1)));
    assert_eq!(
        condition(&md, READY).map(|c| c.status.as_str()),
        Some("True")
    );

    write(json!({"state": "failed", "conditions": [ready_condition("False", "failed_to_reconcile_the_resources", "image pull failed")]})).await;
    let md = md_where(&client, &ns, "manual", "a transient failure", |m| {
        message(m).contains("may be transient") || phase(m) == Some(Phase::Failed)
    })
    .await;
    assert!(
        message(&md).ends_with("image pull failed"),
        "{}",
        message(&md)
    );
    let md = md_where(&client, &ns, "manual", "Failed once it persists", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    assert_eq!(message(&md), "image pull failed");
    assert_eq!(
        condition(&md, READY).map(|c| c.reason.as_str()),
        Some("failed_to_reconcile_the_resources")
    );

    // What Dynamo's capabilities exclude is refused by the runtime, naming the field.
    // Named in the spec: core would never choose Dynamo for llama.cpp by its rules.
    let llama = ModelDeploymentBuilder::new("llama")
        .namespace(&format!("{tag}-llama"))
        .provider("dynamo")
        .engine(EngineType::Llamacpp)
        .gpus(0)
        .build();
    deploy(&client, &llama).await;
    let md = md_where(&client, &format!("{tag}-llama"), "llama", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    let c = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(
        (c.status.as_str(), c.message.as_str()),
        (
            "False",
            "spec.engine.type is llamacpp, which provider dynamo does not support: it serves the engines vllm, sglang, trtllm"
        )
    );
    assert!(
        dgds(&format!("{tag}-llama"))
            .get_opt("llama")
            .await
            .unwrap()
            .is_none()
    );

    // Deletion removes the upstream object.
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    mds.delete("manual", &DeleteParams::default())
        .await
        .unwrap();
    dgd_where(&client, version, &ns, "manual", "deleted", Option::is_none).await;
    wait_for(
        WAIT,
        "ModelDeployment gone",
        || mds.get_opt("manual"),
        Option::is_none,
    )
    .await
    .unwrap();

    // A CRD whose schema lacks a field we render: ProviderCompatible=False with the path,
    // and nothing applied.
    let mut narrow = serde_json::to_value(&crd).unwrap();
    for v in narrow["spec"]["versions"].as_array_mut().unwrap() {
        if v["name"] == version {
            v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                .as_object_mut()
                .unwrap()
                .remove("backendFramework");
        }
    }
    let narrow: CustomResourceDefinition = serde_json::from_value(narrow).unwrap();
    testing::install_crds(&client, &[narrow]).await.unwrap();
    let ns = format!("{tag}-narrow");
    deploy(
        &client,
        &ModelDeploymentBuilder::new("narrow").namespace(&ns).build(),
    )
    .await;
    let md = md_where(&client, &ns, "narrow", "schema mismatch", |m| {
        condition(m, PROVIDER_COMPATIBLE).is_some_and(|c| c.status == "False")
    })
    .await;
    let c = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(c.reason, "UpstreamSchemaMismatch");
    assert!(c.message.contains("spec.backendFramework"), "{}", c.message);
    assert_eq!(phase(&md), Some(Phase::Failed));
    assert!(
        dgds(&ns).get_opt("narrow").await.unwrap().is_none(),
        "nothing applied"
    );
    assert_eq!(
        operator.problems(),
        Vec::<String>::new(),
        "refused or misserved"
    );
}

/// Objects Dynamo's webhook denies are refused by the API server with its words: a custom
/// image without `runtimeVersionOverride` on v1beta1, a graph without services on
/// v1alpha1 (a claim to create without a storage class never reaches the webhook there:
/// the 1.1 CRD's own rule refuses it).
async fn refusals_come_from_the_webhook(client: &Client, version: &str) {
    let ns = "dynamo-system";
    let spec = if version == "v1beta1" {
        json!({"backendFramework": "vllm", "components": [{"name": "Frontend", "type": "frontend",
            "podTemplate": {"spec": {"containers": [{"name": "main", "image": "registry.example/dynamo:dev"}]}}}]})
    } else {
        json!({"backendFramework": "vllm", "services": {}})
    };
    let dgd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("nvidia.com/{version}"), "kind": "DynamoGraphDeployment",
        "metadata": {"name": "refused"}, "spec": spec,
    }))
    .unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &dgd_resource(version));
    let err = api
        .create(&kube::api::PostParams::default(), &dgd)
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    let expected = if version == "v1beta1" {
        "admission webhook \"vdynamographdeployment.kb.io\" denied the request: DynamoGraphDeployment.nvidia.com \"refused\" is invalid: spec.components[0].runtimeVersionOverride: Required value: is required when the specified main container image has no parseable semantic-version tag"
    } else {
        "admission webhook \"vdynamographdeployment.kb.io\" denied the request: spec.services must have at least one service"
    };
    assert_eq!(status.message, expected);
}

fn detected(crd: &CustomResourceDefinition) -> kubeairunway_sdk::UpstreamApi {
    kubeairunway_sdk::UpstreamApi::detect(
        crd,
        &kubeairunway_sdk::Provider::upstream(&Dynamo::default()),
    )
    .unwrap()
}

#[tokio::test]
async fn dynamo_1_1_v1alpha1_crd_end_to_end() {
    Box::pin(walk("old", upstream_crd(OLD_CRD), "v1alpha1")).await;
}

#[tokio::test]
async fn dynamo_v1beta1_crd_end_to_end() {
    Box::pin(walk("new", upstream_crd(NEW_CRD), "v1beta1")).await;
}

#[test]
fn chart_lints_and_renders_least_privilege_rbac() {
    let Some(helm) = helm::require() else { return };
    let chart = helm::chart("dynamo-provider");
    helm::lint(&helm, &chart).unwrap();
    let objects = helm::template(
        &helm,
        &chart,
        &[
            ("image.tag", "1.2.3"),
            ("dynamoVersion", "2.0.0"),
            ("failedThreshold", "2m"),
        ],
    )
    .unwrap();

    let roles = helm::of_kind(&objects, "ClusterRole");
    assert_eq!(roles.len(), 1);
    // What it grants is measured against what the provider uses in providers_rbac.rs;
    // here: no wildcard.
    assert!(
        !serde_json::to_string(&roles[0]).unwrap().contains('*'),
        "no wildcards"
    );
    // The one namespaced permission: its leader-election Lease.
    let lease_roles = helm::of_kind(&objects, "Role");
    assert_eq!(lease_roles.len(), 1);
    assert_eq!(
        lease_roles[0]["metadata"]["namespace"],
        "kubeairunway-system"
    );
    assert_eq!(
        lease_roles[0]["rules"],
        json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["dynamo-provider"], "verbs": ["get", "update"]},
        ])
    );

    let bindings = helm::of_kind(&objects, "ClusterRoleBinding");
    let accounts = helm::of_kind(&objects, "ServiceAccount");
    assert_eq!((bindings.len(), accounts.len()), (1, 1));
    assert_eq!(bindings[0]["roleRef"]["name"], roles[0]["metadata"]["name"]);
    assert_eq!(
        bindings[0]["subjects"][0]["name"],
        accounts[0]["metadata"]["name"]
    );
    assert_eq!(
        bindings[0]["subjects"][0]["namespace"],
        "kubeairunway-system"
    );

    let deployments = helm::of_kind(&objects, "Deployment");
    assert_eq!(deployments.len(), 1);
    let pod = &deployments[0]["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], accounts[0]["metadata"]["name"]);
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        "ghcr.io/kubeairunway/kubeairunway:1.2.3"
    );
    assert_eq!(
        container["args"],
        json!([
            "--dynamo-version=2.0.0",
            "--failed-threshold=2m",
            "--finalizer-timeout=5m",
            "--stale-status-after=5m",
            "--heartbeat-interval=30s",
            "--resync-period=5m",
            "--cluster-domain=cluster.local",
            "--metrics-bind-address=0.0.0.0:8080",
            "--log-format=json",
            "--leader-elect=true",
            "--leader-elect-resource-name=dynamo-provider",
            "--leader-elect-lease-duration=15s",
            "--leader-elect-renew-deadline=10s",
            "--leader-elect-retry-period=2s",
        ])
    );
    assert_eq!(container["command"], json!(["/dynamo-provider"]));
    assert_eq!(container["env"][0]["name"], "POD_NAME");
    assert_eq!(
        container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["ports"][0]["containerPort"], 8080);
}

/// Create the ModelDeployment as a user would and select `dynamo` as core would.
async fn deploy(client: &Client, md: &ModelDeployment) -> ModelDeployment {
    testing::deploy(client, md, "dynamo").await.unwrap()
}
