//! A provider whose upstream is a built-in kind, end to end on the real API server: the
//! shipped provider that needs no operator (`providers/deployment`, the
//! `deployment-provider` binary) serves a ModelDeployment with an `apps/v1` Deployment and
//! a `v1` Service, from ModelDeployment to Running. The test plays the
//! Deployment controller by writing the Deployment's status, as
//! `pkg/controller/deployment/sync.go@v1.36.0` (`syncDeploymentStatus`) does, and the
//! status reaches the ModelDeployment. A provider naming a kind nobody serves fails
//! loudly.

use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_sdk::api::{EngineType, InferenceProviderConfig, ModelDeployment, Phase};
use kubeairunway_sdk::conditions::{PROVIDER_COMPATIBLE, READY, UPSTREAM_READY, reasons};
use kubeairunway_sdk::testing::{
    self, ModelDeploymentBuilder, condition, md_where, object_where, phase, test_options, wait_for,
};
use kubeairunway_sdk::{
    Incompatible, Live, Observed, Provider, RenderError, Rendered, UpstreamApi, UpstreamRef,
    labels, workload,
};
use serde_json::{Value, json};

use kubeairunway_deployment_provider::DeploymentProvider;

const WAIT: Duration = Duration::from_secs(60);

fn deployments() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", "Deployment"))
}

fn services() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Service"))
}

fn qwen(name: &str, ns: &str, provider: &str) -> ModelDeploymentBuilder {
    ModelDeploymentBuilder::new(name)
        .namespace(ns)
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .gpus(1)
        .replicas(2)
        .provider(provider)
}

/// Write the Deployment's status as its controller would (status subresource).
async fn controller_writes(client: &Client, ns: &str, name: &str, status: Value) {
    testing::write_upstream_status(client, &deployments(), ns, name, status)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_plain_deployment_serves_a_model_deployment_to_running() {
    let provider = "deploy-e2e";
    let (cluster, client) = testing::cluster().await.unwrap();
    let ns = cluster.namespace(provider);
    let running = testing::spawn(
        DeploymentProvider::named(provider),
        client.clone(),
        test_options(),
    );

    // The built-in kind is found by discovery, its schema in the OpenAPI v3 document.
    let ipc = testing::registered(&client, provider).await;
    let status = ipc.status.unwrap();
    assert_eq!(status.upstream_crd_version.as_deref(), Some("apps/v1"));
    assert_eq!(
        status.upstream_schema_hash.as_ref().map(String::len),
        Some(16)
    );

    let md = testing::deploy(&client, &qwen("qwen", &ns, provider).build(), provider)
        .await
        .unwrap();

    // The Service and the Deployment, owned by the ModelDeployment.
    let service = object_where(
        &client,
        &services(),
        &ns,
        "qwen",
        "the Service",
        Option::is_some,
    )
    .await
    .unwrap();
    assert_eq!(
        service.data["spec"]["selector"][labels::MODEL_DEPLOYMENT],
        "qwen"
    );
    assert_eq!(service.data["spec"]["ports"][0]["targetPort"], "http");
    let deployment = object_where(
        &client,
        &deployments(),
        &ns,
        "qwen",
        "the Deployment",
        Option::is_some,
    )
    .await
    .unwrap();
    assert_eq!(deployment.owner_references()[0].uid, md.uid().unwrap());
    let spec = &deployment.data["spec"];
    assert_eq!(spec["replicas"], 2);
    let pod = &spec["template"];
    assert_eq!(pod["metadata"]["labels"][labels::MODEL_DEPLOYMENT], "qwen");
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["image"], "vllm/vllm-openai:v0.11.0");
    assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], "1");
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        &args[..4],
        [
            "--model",
            "Qwen/Qwen3-0.6B",
            "--served-model-name",
            "Qwen3-0.6B"
        ]
    );

    // Before the Deployment controller has looked at it.
    let md = md_where(&client, &ns, "qwen", "Deploying", |m| {
        phase(m) == Some(Phase::Deploying)
    })
    .await;
    assert_eq!(condition(&md, PROVIDER_COMPATIBLE).unwrap().status, "True");
    assert_eq!(condition(&md, READY).unwrap().status, "False");
    let generation = deployment.metadata.generation.unwrap();

    // One of two replicas ready and available: still deploying, with the counts.
    controller_writes(
        &client,
        &ns,
        "qwen",
        json!({"observedGeneration": generation, "replicas": 2, "updatedReplicas": 2,
               "readyReplicas": 1, "availableReplicas": 1, "unavailableReplicas": 1,
               "conditions": [
                   {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                    "message": "Deployment does not have minimum availability."},
                   {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                    "message": "ReplicaSet \"qwen-7d9\" is progressing."}]}),
    )
    .await;
    let md = md_where(&client, &ns, "qwen", "one replica available", |m| {
        m.status
            .as_ref()
            .and_then(|s| s.replicas.as_ref())
            .is_some_and(|r| r.available == Some(1))
    })
    .await;
    assert_eq!(phase(&md), Some(Phase::Deploying));
    let replicas = md.status.as_ref().unwrap().replicas.clone().unwrap();
    assert_eq!((replicas.desired, replicas.ready), (Some(2), Some(1)));
    assert_eq!(
        md.status.as_ref().unwrap().message.as_deref(),
        Some("waiting for the model server to roll out: 1 of 2 updated replicas available")
    );

    // The rollout completes: Running, ready, with the Service as the endpoint.
    controller_writes(
        &client,
        &ns,
        "qwen",
        json!({"observedGeneration": generation, "replicas": 2, "updatedReplicas": 2,
               "readyReplicas": 2, "availableReplicas": 2, "unavailableReplicas": null,
               "conditions": [
                   {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                    "message": "Deployment has minimum availability."},
                   {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                    "message": "ReplicaSet \"qwen-7d9\" has successfully progressed."}]}),
    )
    .await;
    let md = md_where(&client, &ns, "qwen", "Running", |m| {
        phase(m) == Some(Phase::Running)
    })
    .await;
    let status = md.status.clone().unwrap();
    assert_eq!(condition(&md, READY).unwrap().status, "True");
    let endpoint = status.endpoint.unwrap();
    assert_eq!(
        (endpoint.service.as_deref(), endpoint.port),
        (Some("qwen"), Some(80))
    );
    let replicas = status.replicas.unwrap();
    assert_eq!(
        (replicas.desired, replicas.ready, replicas.available),
        (Some(2), Some(2), Some(2))
    );

    // A later rollout that stops making progress fails with the controller's reason.
    controller_writes(
        &client,
        &ns,
        "qwen",
        json!({"conditions": [
                   {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                    "message": "Deployment has minimum availability."},
                   {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                    "message": "ReplicaSet \"qwen-8f1\" has timed out progressing."}]}),
    )
    .await;
    let md = md_where(&client, &ns, "qwen", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    let ready = condition(&md, READY).unwrap();
    assert_eq!(
        (ready.reason.as_str(), ready.message.as_str()),
        (
            workload::PROGRESS_DEADLINE_EXCEEDED,
            "ReplicaSet \"qwen-8f1\" has timed out progressing."
        )
    );

    // Deletion removes both objects, then the finalizer.
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    mds.delete("qwen", &DeleteParams::default()).await.unwrap();
    wait_for(
        WAIT,
        "the ModelDeployment to go",
        || mds.get_opt("qwen"),
        Option::is_none,
    )
    .await
    .unwrap();
    object_where(
        &client,
        &deployments(),
        &ns,
        "qwen",
        "no Deployment",
        Option::is_none,
    )
    .await;
    object_where(
        &client,
        &services(),
        &ns,
        "qwen",
        "no Service",
        Option::is_none,
    )
    .await;
    running.stop().await.unwrap();
}

/// The Deployment provider, pointed at a kind no API server serves.
struct NotServed(DeploymentProvider);

impl Provider for NotServed {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn config(&self) -> kubeairunway_sdk::api::InferenceProviderConfigSpec {
        self.0.config()
    }
    fn upstream(&self) -> UpstreamRef {
        UpstreamRef::new(
            "serving.example.invalid",
            "ModelServer",
            "modelservers",
            &["v1"],
        )
    }
    fn check(&self, md: &ModelDeployment) -> Result<(), Incompatible> {
        self.0.check(md)
    }
    fn render(&self, md: &ModelDeployment, api: &UpstreamApi) -> Result<Rendered, RenderError> {
        self.0.render(md, api)
    }
    fn observe(&self, md: &ModelDeployment, live: &Live) -> Observed {
        self.0.observe(md, live)
    }
}

#[tokio::test]
async fn a_kind_the_api_server_does_not_serve_fails_loudly() {
    let provider = "unserved-e2e";
    let (cluster, client) = testing::cluster().await.unwrap();
    let ns = cluster.namespace(provider);
    let _running = testing::spawn(
        NotServed(DeploymentProvider::named(provider)),
        client.clone(),
        test_options(),
    );
    let expected = "the API server does not serve ModelServer (modelservers.serving.example.invalid, \
                    versions v1): install its CRD or enable its API";

    // The InferenceProviderConfig says so, and is not ready: core will not select it.
    let ipcs: Api<InferenceProviderConfig> = Api::all(client.clone());
    let ipc = wait_for(
        WAIT,
        "a registration that is not ready",
        || ipcs.get_opt(provider),
        |c: &Option<InferenceProviderConfig>| {
            c.as_ref()
                .and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.ready == Some(false))
        },
    )
    .await
    .unwrap()
    .unwrap();
    let status = ipc.status.unwrap();
    let upstream = status
        .conditions
        .iter()
        .find(|c| c.type_ == UPSTREAM_READY)
        .unwrap();
    assert_eq!(
        (
            upstream.status.as_str(),
            upstream.reason.as_str(),
            upstream.message.as_str()
        ),
        ("False", reasons::UPSTREAM_CRD_MISSING, expected)
    );
    assert_eq!(status.upstream_crd_version, None);

    // A ModelDeployment selected for it anyway is not compatible, and says why.
    testing::deploy(&client, &qwen("lost", &ns, provider).build(), provider)
        .await
        .unwrap();
    let md = md_where(&client, &ns, "lost", "ProviderCompatible=False", |m| {
        condition(m, PROVIDER_COMPATIBLE).is_some_and(|c| c.status == "False")
    })
    .await;
    let compatible = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(compatible.reason, reasons::UPSTREAM_CRD_MISSING);
    assert_eq!(compatible.message, format!("{expected}; waiting for it"));
    assert_eq!(phase(&md), Some(Phase::Pending));
}

/// With `provider.overrides.autoscaled`, the replica count is the autoscaler's: a later
/// apply (after a spec change) leaves it alone, and the status follows it. The test plays
/// the autoscaler, whose writes through the Deployment's scale subresource set
/// `spec.replicas` (`pkg/controller/podautoscaler/horizontal.go@v1.36.0`).
#[tokio::test]
async fn an_autoscaled_deployment_keeps_the_replicas_its_autoscaler_sets() {
    let provider = "autoscale-e2e";
    let (cluster, client) = testing::cluster().await.unwrap();
    let ns = cluster.namespace(provider);
    let _running = testing::spawn(
        DeploymentProvider::named(provider),
        client.clone(),
        test_options(),
    );
    let builder = ModelDeploymentBuilder::new("auto")
        .namespace(&ns)
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .gpus(1)
        .provider(provider)
        .overrides(json!({"autoscaled": true}));
    testing::deploy(&client, &builder.clone().build(), provider)
        .await
        .unwrap();
    let deployment = object_where(
        &client,
        &deployments(),
        &ns,
        "auto",
        "the Deployment",
        Option::is_some,
    )
    .await
    .unwrap();
    assert!(
        deployment.data["spec"].get("replicas").is_none(),
        "not rendered"
    );

    // The autoscaler scales to 3; the controller rolls it out.
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &deployments());
    let scaled = api
        .patch(
            "auto",
            &PatchParams {
                field_manager: Some("horizontal-pod-autoscaler".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    controller_writes(
        &client,
        &ns,
        "auto",
        json!({"observedGeneration": scaled.metadata.generation, "replicas": 3, "updatedReplicas": 3,
               "readyReplicas": 3, "availableReplicas": 3}),
    )
    .await;
    let md = md_where(&client, &ns, "auto", "Running with 3 replicas", |m| {
        phase(m) == Some(Phase::Running)
            && m.status
                .as_ref()
                .and_then(|s| s.replicas.as_ref())
                .is_some_and(|r| r.desired == Some(3))
    })
    .await;
    assert_eq!(condition(&md, READY).unwrap().status, "True");

    // A spec change is applied, and the autoscaler's count stays.
    let changed = builder
        .spec(|s| s.engine.args = Some([("enforce-eager".into(), "true".into())].into()))
        .build();
    testing::deploy(&client, &changed, provider).await.unwrap();
    let deployment = object_where(
        &client,
        &deployments(),
        &ns,
        "auto",
        "the new arguments",
        |d| {
            d.as_ref().is_some_and(|d| {
                d.data["spec"]["template"]["spec"]["containers"][0]["args"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == "--enforce-eager"))
            })
        },
    )
    .await
    .unwrap();
    assert_eq!(deployment.data["spec"]["replicas"], 3);
}

/// The Deployment provider with one field the real `apps/v1` schema lacks, deep in the pod template.
struct WithBogusField(DeploymentProvider);

impl Provider for WithBogusField {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn config(&self) -> kubeairunway_sdk::api::InferenceProviderConfigSpec {
        self.0.config()
    }
    fn upstream(&self) -> UpstreamRef {
        self.0.upstream()
    }
    fn check(&self, md: &ModelDeployment) -> Result<(), Incompatible> {
        self.0.check(md)
    }
    fn render(&self, md: &ModelDeployment, api: &UpstreamApi) -> Result<Rendered, RenderError> {
        let mut rendered = self.0.render(md, api)?;
        rendered.objects[0].data["spec"]["template"]["spec"]["containers"][0]["gpuCount"] =
            json!(1);
        Ok(rendered)
    }
    fn observe(&self, md: &ModelDeployment, live: &Live) -> Observed {
        self.0.observe(md, live)
    }
}

/// A built-in kind's schema is the API server's own OpenAPI v3 document, references
/// resolved: a field it lacks, four references deep, is refused before anything is applied.
#[tokio::test]
async fn a_field_the_built_in_schema_lacks_is_refused() {
    let provider = "bogus-e2e";
    let (cluster, client) = testing::cluster().await.unwrap();
    let ns = cluster.namespace(provider);
    let _running = testing::spawn(
        WithBogusField(DeploymentProvider::named(provider)),
        client.clone(),
        test_options(),
    );
    testing::deploy(&client, &qwen("bogus", &ns, provider).build(), provider)
        .await
        .unwrap();
    let md = md_where(&client, &ns, "bogus", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    let compatible = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(compatible.reason, reasons::UPSTREAM_SCHEMA_MISMATCH);
    assert!(
        compatible
            .message
            .contains("has no field spec.template.spec.containers[].gpuCount"),
        "{}",
        compatible.message
    );
    // Nothing was applied: not even the Service, which the schema check does not cover.
    let services: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &services());
    assert!(services.get_opt("bogus").await.unwrap().is_none());
}
