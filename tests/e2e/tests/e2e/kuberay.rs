//! The KubeRay provider end to end on the real API server, once per real RayService CRD
//! (KubeRay 1.7 and 1.3), each on a private cluster with exactly one provider instance:
//! registration, rendered RayServices accepted by the real schema, status written the
//! way the KubeRay operator writes it and followed by the ModelDeployment, refusals, and
//! deletion. Also the provider's Helm chart.

use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_kuberay_provider::KubeRayProvider;
use kubeairunway_sdk::api::{
    ComponentScaling, EngineType, GpuSpec, InferenceProviderConfig, ModelDeployment, Phase,
    ServingMode,
};
use kubeairunway_sdk::conditions::{PROVIDER_COMPATIBLE, READY, RESOURCE_CREATED};
use kubeairunway_sdk::testing::{
    self, ModelDeploymentBuilder, condition, event_where, md_where, message, phase, test_options,
    wait_for,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn rayservices() -> ApiResource {
    ApiResource {
        group: "ray.io".into(),
        version: "v1".into(),
        api_version: "ray.io/v1".into(),
        kind: "RayService".into(),
        plural: "rayservices".into(),
    }
}

/// A condition as KubeRay writes it.
fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1})
}

/// Write the RayService status as the KubeRay operator does (>= 1.3: conditions).
async fn ray_status(client: &Client, ns: &str, name: &str, status: Value) {
    testing::write_upstream_status(client, &rayservices(), ns, name, status)
        .await
        .unwrap();
}

fn active(app_status: &str, app_message: &str, ready_workers: i64) -> Value {
    json!({
        "rayClusterName": "llama-raycluster-abcde",
        "applicationStatuses": {"llm": {
            "status": app_status,
            "message": app_message,
            "serveDeploymentStatuses": {"LLMServer:llama": {"status": "HEALTHY", "message": ""}},
        }},
        "rayClusterStatus": {"desiredWorkerReplicas": 1, "readyWorkerReplicas": ready_workers},
    })
}

/// The whole walk for one RayService CRD version, on a private cluster.
async fn walk(crd_file: &str, tag: &str) {
    let crd = kubeairunway_e2e::read_crd(
        &kubeairunway_e2e::fixtures_dir()
            .join("crds/upstream")
            .join(crd_file),
    )
    .unwrap();
    let (_cluster, client) = testing::private_cluster(&format!("kuberay-{tag}"), &[crd])
        .await
        .unwrap();
    let running = testing::spawn(KubeRayProvider::default(), client.clone(), test_options());

    // Registration.
    let ipcs: Api<InferenceProviderConfig> = Api::all(client.clone());
    let ipc = wait_for(
        WAIT,
        "registration",
        || ipcs.get("kuberay"),
        |c: &InferenceProviderConfig| c.status.as_ref().is_some_and(|s| s.ready == Some(true)),
    )
    .await
    .unwrap();
    assert_eq!(
        ipc.status.unwrap().upstream_crd_version.as_deref(),
        Some("ray.io/v1")
    );
    assert!(ipc.spec.selection_rules.is_empty());

    // An aggregated deployment with everything set: the RayService is accepted.
    let ns = "serve";
    let md = deploy(
        &client,
        &ModelDeploymentBuilder::new("llama")
            .namespace(ns)
            .provider("kuberay")
            .model("meta-llama/Llama-3.1-8B-Instruct")
            .gpus(2)
            .label("kubeairunway.ai/team", "a")
            .overrides(json!({"head": {"resources": {"cpu": "2"},
                                       "rayStartParams": {"num-cpus": "0"}},
                              "heda": {}}))
            .spec(|s| {
                s.engine.context_length = Some(4096);
                s.engine.args = Some([("gpu-memory-utilization".into(), "0.85".into())].into());
                s.secrets = Some(kubeairunway_sdk::api::SecretsSpec {
                    hugging_face_token: Some("hf".into()),
                });
                s.node_selector = Some([("pool".into(), "gpu".into())].into());
            })
            .build(),
    )
    .await;
    let rs = rayservice_where(&client, ns, "llama", "the RayService", Option::is_some)
        .await
        .unwrap();
    let owner = &rs.owner_references()[0];
    assert_eq!(owner.uid, md.uid().unwrap());
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    assert_eq!(
        rs.labels().get("kubeairunway.ai/team").map(String::as_str),
        Some("a")
    );
    let serve: Value =
        serde_saphyr::from_str(rs.data["spec"]["serveConfigV2"].as_str().unwrap()).unwrap();
    let config = &serve["applications"][0]["args"]["llm_configs"][0];
    assert_eq!(
        config["model_loading_config"]["model_source"],
        "meta-llama/Llama-3.1-8B-Instruct"
    );
    assert_eq!(config["engine_kwargs"]["tensor_parallel_size"], 2);
    assert_eq!(config["engine_kwargs"]["max_model_len"], 4096);
    assert_eq!(config["engine_kwargs"]["gpu_memory_utilization"], 0.85);
    let cluster_spec = &rs.data["spec"]["rayClusterConfig"];
    assert_eq!(
        cluster_spec["headGroupSpec"]["rayStartParams"],
        json!({"num-cpus": "0"})
    );
    let worker = &cluster_spec["workerGroupSpecs"][0];
    assert_eq!(worker["rayStartParams"], json!({}));
    assert_eq!(
        worker["template"]["metadata"]["labels"]["kubeairunway.ai/model-deployment"],
        "llama"
    );
    assert_eq!(
        worker["template"]["spec"]["nodeSelector"],
        json!({"pool": "gpu"})
    );
    assert_eq!(
        worker["template"]["spec"]["containers"][0]["envFrom"],
        json!([{"secretRef": {"name": "hf"}}])
    );

    let md = md_where(&client, ns, "llama", "Deploying", |m| {
        phase(m) == Some(Phase::Deploying)
            && condition(m, RESOURCE_CREATED).is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(condition(&md, PROVIDER_COMPATIBLE).unwrap().status, "True");
    let status = md.status.clone().unwrap();
    assert_eq!(
        status.provider.as_ref().unwrap().resource_kind.as_deref(),
        Some("RayService")
    );
    let endpoint = status.endpoint.unwrap();
    assert_eq!(
        (endpoint.service.as_deref(), endpoint.port),
        (Some("llama-serve-svc"), Some(8000))
    );
    let warnings = event_where(&client, ns, "llama", "UnknownOverride").await;
    assert!(
        warnings[0].contains("provider.overrides.heda"),
        "{warnings:?}"
    );

    // The operator starts the cluster: Ready=False, Initializing.
    ray_status(
        &client,
        ns,
        "llama",
        json!({
            "serviceStatus": "",
            "conditions": [cond("Ready", "False", "Initializing", "RayService is initializing")],
            "activeServiceStatus": active("DEPLOYING", "", 0),
        }),
    )
    .await;
    let md = md_where(&client, ns, "llama", "Initializing", |m| {
        message(m).contains("Initializing")
    })
    .await;
    assert_eq!(phase(&md), Some(Phase::Deploying));
    assert_eq!(message(&md), "Initializing: RayService is initializing");

    // Serving: Ready=True.
    ray_status(
        &client,
        ns,
        "llama",
        json!({
            "serviceStatus": "Running",
            "numServeEndpoints": 2,
            "conditions": [
                cond("Ready", "True", "NonZeroServeEndpoints", "Number of serve endpoints is greater than 0"),
                cond("UpgradeInProgress", "False", "NoPendingCluster", "Active Ray cluster exists and no pending Ray cluster"),
            ],
            "activeServiceStatus": active("RUNNING", "", 1),
        }),
    )
    .await;
    let md = md_where(&client, ns, "llama", "Running", |m| {
        phase(m) == Some(Phase::Running)
    })
    .await;
    assert_eq!(condition(&md, READY).unwrap().status, "True");
    assert_eq!(message(&md), "Number of serve endpoints is greater than 0");
    let replicas = md.status.as_ref().unwrap().replicas.clone().unwrap();
    assert_eq!((replicas.desired, replicas.ready), (Some(1), Some(1)));

    // A zero-downtime upgrade.
    ray_status(
        &client,
        ns,
        "llama",
        json!({"conditions": [
            cond("Ready", "True", "NonZeroServeEndpoints", "Number of serve endpoints is greater than 0"),
            cond("UpgradeInProgress", "True", "BothActivePendingClustersExist", "Both active and pending Ray clusters exist"),
        ]}),
    )
    .await;
    let md = md_where(&client, ns, "llama", "Deploying (upgrade)", |m| {
        phase(m) == Some(Phase::Deploying)
    })
    .await;
    assert_eq!(
        message(&md),
        "UpgradeInProgress: Both active and pending Ray clusters exist"
    );

    // The application fails to deploy.
    ray_status(
        &client,
        ns,
        "llama",
        json!({
            "conditions": [
                cond("Ready", "False", "ZeroServeEndpoints", "Number of serve endpoints dropped to 0"),
                cond("UpgradeInProgress", "False", "NoPendingCluster", ""),
            ],
            "activeServiceStatus": active("DEPLOY_FAILED", "Failed to load model: CUDA out of memory", 1),
        }),
    )
    .await;
    let md = md_where(&client, ns, "llama", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    assert_eq!(
        message(&md),
        "Ray Serve application llm is DEPLOY_FAILED: Failed to load model: CUDA out of memory"
    );
    assert_eq!(condition(&md, READY).unwrap().status, "False");

    // KubeRay refuses the spec.
    ray_status(
        &client,
        ns,
        "llama",
        json!({
            "conditions": [cond("Ready", "False", "ValidationFailed", "spec.rayClusterConfig is invalid")],
            "activeServiceStatus": active("RUNNING", "", 1),
        }),
    )
    .await;
    md_where(&client, ns, "llama", "ValidationFailed", |m| {
        phase(m) == Some(Phase::Failed) && message(m).starts_with("ValidationFailed")
    })
    .await;

    // KubeRay before 1.3 (no conditions): serviceStatus decides.
    let old = "old";
    deploy(
        &client,
        &ModelDeploymentBuilder::new("legacy")
            .namespace(old)
            .provider("kuberay")
            .build(),
    )
    .await;
    rayservice_where(&client, old, "legacy", "the RayService", Option::is_some).await;
    ray_status(&client, old, "legacy", json!({"serviceStatus": "Running"})).await;
    md_where(&client, old, "legacy", "Running from serviceStatus", |m| {
        phase(m) == Some(Phase::Running)
    })
    .await;

    // Disaggregated: prefill and decode worker groups, accepted by the schema.
    let pd = "pd";
    let role = |replicas, count| ComponentScaling {
        replicas,
        gpu: Some(GpuSpec {
            count,
            ..GpuSpec::default()
        }),
        memory: Some("48Gi".into()),
    };
    deploy(
        &client,
        &ModelDeploymentBuilder::new("split")
            .namespace(pd)
            .provider("kuberay")
            .mode(ServingMode::Disaggregated)
            .spec(|s| {
                s.resources = None;
                s.scaling.prefill = Some(role(1, 1));
                s.scaling.decode = Some(role(2, 2));
            })
            .build(),
    )
    .await;
    let split = rayservice_where(&client, pd, "split", "the P/D RayService", Option::is_some)
        .await
        .unwrap();
    let groups: Vec<&str> = split.data["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["groupName"].as_str().unwrap())
        .collect();
    assert_eq!(groups, ["prefill", "decode"]);
    assert!(
        split.data["spec"]["serveConfigV2"]
            .as_str()
            .unwrap()
            .contains("ray.serve.llm:build_pd_openai_app")
    );

    // Refusals: an engine KubeRay cannot run, and a name KubeRay cannot take.
    let bad = "refused";
    deploy(
        &client,
        &ModelDeploymentBuilder::new("sg")
            .namespace(bad)
            .provider("kuberay")
            .engine(EngineType::Sglang)
            .build(),
    )
    .await;
    let long_name = "a-model-deployment-name-longer-than-kuberay-takes";
    assert!(long_name.len() > 47);
    deploy(
        &client,
        &ModelDeploymentBuilder::new(long_name)
            .namespace(bad)
            .provider("kuberay")
            .build(),
    )
    .await;
    let sg = md_where(&client, bad, "sg", "sglang refused", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    let c = condition(&sg, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(
        (c.status.as_str(), c.message.as_str()),
        ("False", "KubeRay does not support sglang engine")
    );
    let long = md_where(&client, bad, long_name, "long name refused", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    assert!(
        condition(&long, PROVIDER_COMPATIBLE)
            .unwrap()
            .message
            .contains("at most 47 characters"),
        "{:?}",
        long.status
    );
    let refused: Api<DynamicObject> = Api::namespaced_with(client.clone(), bad, &rayservices());
    assert!(refused.get_opt("sg").await.unwrap().is_none());
    assert!(refused.get_opt(long_name).await.unwrap().is_none());

    // Deletion removes the RayService, then the ModelDeployment.
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
    mds.delete("llama", &DeleteParams::default()).await.unwrap();
    rayservice_where(
        &client,
        ns,
        "llama",
        "the RayService to go",
        Option::is_none,
    )
    .await;
    wait_for(
        WAIT,
        "the ModelDeployment to go",
        || mds.get_opt("llama"),
        Option::is_none,
    )
    .await
    .unwrap();

    running.stop().await.unwrap();
}

#[tokio::test]
async fn kuberay_1_7_end_to_end() {
    Box::pin(walk("ray.io_rayservices.yaml", "v17")).await;
}

#[tokio::test]
async fn kuberay_1_3_end_to_end() {
    Box::pin(walk("ray.io_rayservices.v1.3.0.yaml", "v13")).await;
}

#[test]
fn chart_lints_and_renders_least_privilege_rbac() {
    use kubeairunway_e2e::helm;
    let Some(bin) = helm::require() else {
        return;
    };
    let chart = helm::chart("kuberay-provider");
    helm::lint(&bin, &chart).unwrap();
    let objects = helm::template(
        &bin,
        &chart,
        &[("image.tag", "v9"), ("ray.version", "2.49.1-py311-cu128")],
    )
    .unwrap();

    let roles = helm::of_kind(&objects, "ClusterRole");
    assert_eq!(roles.len(), 1);
    assert_eq!(
        roles[0]["rules"],
        json!([
            {"apiGroups": ["kubeairunway.ai"], "resources": ["modeldeployments"],
             "verbs": ["get", "list", "watch", "patch", "update"]},
            {"apiGroups": ["kubeairunway.ai"], "resources": ["modeldeployments/status"],
             "verbs": ["get", "patch", "update"]},
            {"apiGroups": ["kubeairunway.ai"],
             "resources": ["inferenceproviderconfigs", "inferenceproviderconfigs/status"],
             "verbs": ["get", "create", "patch", "update"]},
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["ray.io"], "resources": ["rayservices"],
             "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ])
    );
    let bindings = helm::of_kind(&objects, "ClusterRoleBinding");
    assert_eq!(bindings.len(), 1);
    let accounts = helm::of_kind(&objects, "ServiceAccount");
    assert_eq!(accounts.len(), 1);
    assert_eq!(
        bindings[0]["subjects"][0]["name"],
        accounts[0]["metadata"]["name"]
    );
    assert_eq!(bindings[0]["roleRef"]["name"], roles[0]["metadata"]["name"]);

    let deployments = helm::of_kind(&objects, "Deployment");
    assert_eq!(deployments.len(), 1);
    let pod = &deployments[0]["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], accounts[0]["metadata"]["name"]);
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        "ghcr.io/kubeairunway/kuberay-provider:v9"
    );
    assert_eq!(container["command"], json!(["/kuberay-provider"]));
    assert_eq!(
        container["args"],
        json!([
            "--ray-version=2.49.1-py311-cu128",
            "--ray-image=rayproject/ray-llm",
            "--finalizer-timeout-seconds=300",
            "--stale-status-seconds=300",
            "--heartbeat-seconds=30",
            "--resync-seconds=300",
            "--metrics-addr=0.0.0.0:8080",
            "--leader-elect=true",
            "--log-json",
        ])
    );
    assert_eq!(
        container["env"][0],
        json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": 8080})
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": 8080})
    );
    assert!(container["resources"]["requests"].is_object());
}

async fn rayservice_where(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    ready: impl Fn(&Option<DynamicObject>) -> bool,
) -> Option<DynamicObject> {
    testing::object_where(client, &rayservices(), ns, name, what, ready).await
}

/// Create the ModelDeployment as a user would and select `kuberay` as core would.
async fn deploy(client: &Client, md: &ModelDeployment) -> ModelDeployment {
    testing::deploy(client, md, "kuberay").await.unwrap()
}
