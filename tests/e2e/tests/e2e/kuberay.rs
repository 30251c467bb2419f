//! The KubeRay provider end to end on the real API server, once per real RayService CRD
//! (KubeRay 1.7.0 and 1.3.0), each on a private cluster with exactly one provider
//! instance and the KubeRay operator played by its stand-in
//! (`kubeairunway_e2e::operators::kuberay`): every rendered shape is accepted by the real
//! schema with strict field validation and by the operator's validation; the stored
//! RayService is exactly what was rendered (plus the CRD's defaults); the operator's
//! controller loop writes the status as the release does (first deployment in
//! `pendingServiceStatus`, promotion to `activeServiceStatus`, zero-downtime upgrades,
//! `ValidationFailed`) and the ModelDeployment follows; refusals; deletion through
//! KubeRay's finalizer. Also the provider's Helm chart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::admission::AdmissionRequest;
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_e2e::admission::{self, Registration, ValidatingWebhook};
use kubeairunway_e2e::operators::kuberay::{self as ray, Action, App, Clusters, KubeRay};
use kubeairunway_kuberay_provider::KubeRayProvider;
use kubeairunway_sdk::api::{
    ComponentScaling, EngineType, GpuSpec, ModelDeployment, Phase, ServingMode,
};
use kubeairunway_sdk::conditions::{PROVIDER_COMPATIBLE, READY, RESOURCE_CREATED};
use kubeairunway_sdk::render::Role;
use kubeairunway_sdk::testing::{
    self, ModelDeploymentBuilder, condition, event_where, md_where, message, phase, test_options,
    wait_for,
};
use kubeairunway_sdk::{Provider, UpstreamApi};
use kubeairunway_testcluster::TestCluster;
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

// ---------------------------------------------------------------------------------------
// The KubeRay operator at work on the API server

/// What the stand-in loop keeps.
#[derive(Default)]
struct State {
    clusters: BTreeMap<(String, String), Clusters>,
    /// Ray Serve reports the test made, not yet applied to a cluster.
    reports: Vec<Report>,
    events: Vec<((String, String), String)>,
}

/// Which of a RayService's clusters a report is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// The cluster being prepared (first deployment or upgrade).
    Pending,
    /// The serving cluster.
    Active,
}

/// Ray Serve on one cluster reports application `llm` and its ready worker pods.
struct Report {
    key: (String, String),
    slot: Slot,
    app: App,
    ready_workers: i64,
}

/// The KubeRay operator's controller loop, played against the API server: every 100 ms it
/// reconciles every RayService with the stand-in's rules (finalizer, validation, clusters,
/// status written by replacing the status subresource, as `r.Status().Update` does).
struct Operator {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Operator {
    fn start(client: Client, version: KubeRay) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let task = tokio::spawn(operate(client, version, state.clone()));
        Self { state, task }
    }

    /// Ray Serve on the `slot` cluster of `ns/name` reports application `llm` in
    /// `status`, with `ready_workers` worker pods ready; returns once the loop has taken it
    /// in (when the operator has made that cluster).
    async fn report(
        &self,
        ns: &str,
        name: &str,
        slot: Slot,
        (status, msg): (&str, &str),
        ready_workers: i64,
    ) {
        let key = (ns.to_string(), name.to_string());
        self.state.lock().unwrap().reports.push(Report {
            key: key.clone(),
            slot,
            app: App::new(status, msg),
            ready_workers,
        });
        let deadline = tokio::time::Instant::now() + WAIT;
        while self
            .state
            .lock()
            .unwrap()
            .reports
            .iter()
            .any(|r| r.key == key)
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {slot:?} cluster of {ns}/{name} to report on"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn events(&self, ns: &str, name: &str) -> Vec<String> {
        let key = (ns.to_string(), name.to_string());
        let state = self.state.lock().unwrap();
        state
            .events
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, e)| e.clone())
            .collect()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn operate(client: Client, version: KubeRay, state: Arc<Mutex<State>>) {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &rayservices());
    loop {
        if let Ok(list) = all.list(&ListParams::default()).await {
            let mut seen = BTreeSet::new();
            for object in list.items {
                seen.insert((object.namespace().unwrap_or_default(), object.name_any()));
                reconcile_one(&client, version, &state, object).await;
            }
            state
                .lock()
                .unwrap()
                .clusters
                .retain(|k, _| seen.contains(k));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn reconcile_one(
    client: &Client,
    version: KubeRay,
    state: &Arc<Mutex<State>>,
    object: DynamicObject,
) {
    let key = (object.namespace().unwrap_or_default(), object.name_any());
    let value = serde_json::to_value(&object).unwrap();
    let (reconciled, next) = {
        let mut s = state.lock().unwrap();
        // Reports are facts about the world: they apply at once to the newest cluster.
        let reports = std::mem::take(&mut s.reports);
        for report in reports {
            let clusters = s
                .clusters
                .get_mut(&report.key)
                .filter(|_| report.key == key);
            let cluster = clusters.and_then(|c| match report.slot {
                Slot::Pending => c.pending.as_mut(),
                Slot::Active => c.active.as_mut(),
            });
            match cluster {
                Some(c) => {
                    c.serve = Some([("llm".to_string(), report.app)].into());
                    c.ready_workers = report.ready_workers;
                }
                None => s.reports.push(report),
            }
        }
        let mut next = s.clusters.get(&key).cloned().unwrap_or_default();
        let r = ray::reconcile(version, &value, &mut next, &Timestamp::now().to_string());
        (r, next)
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &key.0, &rayservices());
    let mut finalizers: Vec<String> = object.finalizers().to_vec();
    let written = match &reconciled.action {
        Action::Nothing => Ok(()),
        Action::AddFinalizer | Action::RemoveFinalizer => {
            finalizers.retain(|f| f != ray::FINALIZER);
            if reconciled.action == Action::AddFinalizer {
                finalizers.push(ray::FINALIZER.to_string());
            }
            let patch = json!({"metadata": {
                "finalizers": finalizers,
                "resourceVersion": object.resource_version(),
            }});
            api.patch(&key.1, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop)
        }
        Action::WriteStatus(status) => {
            let mut with_status = object.clone();
            with_status.data["status"] = status.clone();
            api.replace_status(&key.1, &PostParams::default(), &with_status)
                .await
                .map(drop)
        }
    };
    // A write that lost a race is redone from the fresh object in the next pass.
    if written.is_ok() {
        let mut s = state.lock().unwrap();
        s.clusters.insert(key.clone(), next);
        s.events
            .extend(reconciled.events.into_iter().map(|e| (key.clone(), e)));
    }
}

// ---------------------------------------------------------------------------------------
// KubeRay's admission webhook, served for real

/// The webhook's Service, as KubeRay's manifests name it (`config/webhook/service.yaml`
/// with the `kuberay-` prefix of `config/default-with-webhooks`).
const WEBHOOK_SERVICE: &str = "kuberay-webhook-service";
const WEBHOOK_NAMESPACE: &str = "ray-system";
/// The name of the RayService webhook (`pkg/webhooks/v1/rayservice_webhook.go:28@v1.7.0`).
const WEBHOOK_NAME: &str = "vrayservice.kb.io";

/// KubeRay 1.7's optional RayService webhook (v1.3 has none), served through the shared
/// helper (loopback HTTPS, routed Service, ValidatingWebhookConfiguration with the CA
/// bundle; CREATE and UPDATE of `ray.io/v1` rayservices, failurePolicy Fail, as
/// `config/webhook/manifests.yaml@v1.7.0` registers it). Its verdict is the stand-in's
/// [`ray::webhook`], in the words `apierrors.NewInvalid` gives it
/// (`rayservice_webhook.go:49-63@v1.7.0`).
async fn serve_webhook(
    cluster: &TestCluster,
    client: &Client,
    version: KubeRay,
) -> ValidatingWebhook {
    let verdict = move |req: &AdmissionRequest<DynamicObject>| {
        let Some(object) = req.object.as_ref() else {
            return Ok(());
        };
        let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
        ray::webhook(version, &value).map_err(|refusal| {
            let name = admission::object_name(req);
            format!("RayService.ray.io {name:?} is invalid: metadata.name: Invalid value: {name:?}: {refusal}")
        })
    };
    let resource = rayservices();
    let registration = Registration {
        name: WEBHOOK_NAME,
        namespace: WEBHOOK_NAMESPACE,
        service: WEBHOOK_SERVICE,
        resource: &resource,
    };
    let webhook = admission::serve_validating(cluster, client, registration, Arc::new(verdict))
        .await
        .unwrap();
    // The admission plugin reads configurations through an informer: wait until a dry
    // run of a name KubeRay refuses comes back refused.
    let probe_name = "a".repeat(ray::MAX_NAME_LENGTH + 1);
    let rs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), WEBHOOK_NAMESPACE, &rayservices());
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": probe_name, "namespace": WEBHOOK_NAMESPACE},
        "spec": {"rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
            "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}}}},
    }))
    .unwrap();
    kubeairunway_e2e::eventually(30, "the RayService webhook to be called", || {
        let (rs, probe) = (rs.clone(), probe.clone());
        async move {
            let dry = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            match rs.create(&dry, &probe).await {
                Err(kube::Error::Api(e)) if e.message.contains(WEBHOOK_NAME) => Some(()),
                _ => None,
            }
        }
    })
    .await
    .unwrap();
    webhook
}

/// With the webhook, the API server refuses what KubeRay's webhook refuses, in KubeRay's
/// words; an invalid initializing timeout never reaches the controller.
async fn the_webhook_refuses(client: &Client) {
    let ns = "serve";
    let rs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &rayservices());
    let patch = json!({"metadata": {"annotations": {ray::INITIALIZING_TIMEOUT: "soon"}}});
    let err = rs
        .patch("llama", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("not refused by the API server: {err}")
    };
    assert!(
        status.message.contains(&format!(
            "admission webhook \"{WEBHOOK_NAME}\" denied the request"
        )) && status
            .message
            .contains("annotation ray.io/initializing-timeout has invalid format"),
        "{}",
        status.message
    );
}

// ---------------------------------------------------------------------------------------
// Helpers

fn upstream_crd(version: KubeRay) -> CustomResourceDefinition {
    kubeairunway_e2e::read_crd(
        &kubeairunway_e2e::fixtures_dir()
            .join("crds/upstream")
            .join(version.crd_file()),
    )
    .unwrap()
}

/// The RayService the provider renders for `md`, as the runtime applies it.
fn rendered(md: &ModelDeployment, api: &UpstreamApi) -> DynamicObject {
    let provider = KubeRayProvider::default();
    let mut md = md.clone();
    md.metadata.uid = Some("00000000-0000-0000-0000-000000000003".into());
    let mut object = provider.render(&md, api).unwrap().objects.remove(0);
    let role = Role::Primary {
        immutable_fields: provider.immutable_fields("RayService"),
    };
    kubeairunway_sdk::render::finish(&mut object, &md, "kuberay", role);
    object
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

fn role(replicas: i32, count: i32) -> ComponentScaling {
    ComponentScaling {
        replicas,
        gpu: Some(GpuSpec {
            count,
            ..GpuSpec::default()
        }),
        memory: Some("48Gi".into()),
    }
}

/// Every shape the provider renders, for the schema and the operator's rules.
fn shapes(ns: &str) -> Vec<ModelDeployment> {
    let full: ModelDeployment = serde_json::from_value(json!({
        "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "full", "namespace": ns, "labels": {"kubeairunway.ai/team": "a"}},
        "spec": {
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama"},
            "provider": {"name": "kuberay", "overrides": {"head": {
                "resources": {"cpu": "2", "memory": "8Gi"},
                "rayStartParams": {"dashboard-host": "0.0.0.0"},
            }}},
            "engine": {"type": "vllm", "contextLength": 8192, "trustRemoteCode": true,
                       "args": {"gpu-memory-utilization": "0.9", "enforce-eager": "true"}},
            "scaling": {"replicas": 2},
            "resources": {"gpu": {"count": 2, "type": "amd.com/gpu"}, "memory": "64Gi", "cpu": "8"},
            "image": "registry.example.com/ray-llm:custom",
            "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
            "podTemplate": {"metadata": {"labels": {"tier": "gold"}, "annotations": {"note": "n"}}},
            "secrets": {"huggingFaceToken": "hf-token"},
            "nodeSelector": {"gpu": "mi300"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "gateway": {"enabled": true},
        },
    }))
    .unwrap();
    let mut full = full;
    full.spec.model.storage = Some(
        serde_json::from_value(json!({"volumes": [
            {"name": "weights", "claimName": "hf-cache", "purpose": "modelCache"},
            {"name": "compile", "purpose": "compilationCache", "size": "10Gi"},
            {"name": "data", "claimName": "data", "mountPath": "/data", "readOnly": true},
        ]}))
        .unwrap(),
    );
    vec![
        ModelDeploymentBuilder::new("minimal")
            .namespace(ns)
            .provider("kuberay")
            .build(),
        full,
        ModelDeploymentBuilder::new("split")
            .namespace(ns)
            .provider("kuberay")
            .mode(ServingMode::Disaggregated)
            .spec(|s| {
                s.resources = None;
                s.scaling.prefill = Some(role(2, 1));
                s.scaling.decode = Some(role(1, 4));
            })
            .build(),
        ModelDeploymentBuilder::new("a-forty-seven-character-model-deployment-name-x")
            .namespace(ns)
            .provider("kuberay")
            .build(),
    ]
}

/// Strict server-side validation of every shape against the installed CRD (a dry run:
/// unknown fields are refused, not pruned), and the operator's own validation.
async fn every_shape_is_accepted(client: &Client, version: KubeRay, api: &UpstreamApi) {
    let ns = "schema";
    testing::ensure_namespace(client, ns).await.unwrap();
    let rs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &rayservices());
    let strict = PatchParams::apply("schema-check")
        .validation_strict()
        .dry_run();
    for md in shapes(ns) {
        let object = rendered(&md, api);
        let value = serde_json::to_value(&object).unwrap();
        assert!(api.missing_paths(&value).is_empty(), "{}", md.name_any());
        rs.patch(&object.name_any(), &strict, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("{} refused by the schema: {e}", md.name_any()));
        assert_eq!(ray::webhook(version, &value), Ok(()), "{}", md.name_any());
        assert_eq!(ray::validate(version, &value), Ok(()), "{}", md.name_any());
    }
}

fn cond_reason(md: &ModelDeployment, type_: &str) -> String {
    condition(md, type_)
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The walk

/// The whole walk for one KubeRay release, on a private cluster.
async fn walk(version: KubeRay) {
    let crd = upstream_crd(version);
    let api = UpstreamApi::detect(&crd, &KubeRayProvider::default().upstream()).unwrap();
    let (cluster, client) = testing::private_cluster(
        &format!("kuberay-{}", version.tag()),
        std::slice::from_ref(&crd),
    )
    .await
    .unwrap();
    let operator = Operator::start(client.clone(), version);
    let running = testing::spawn(KubeRayProvider::default(), client.clone(), test_options());

    // Registration.
    let ipc = testing::registered(&client, "kuberay").await;
    assert_eq!(
        ipc.status.unwrap().upstream_crd_version.as_deref(),
        Some("ray.io/v1")
    );
    assert!(ipc.spec.selection_rules.is_empty());

    // First KubeRay as its Helm chart installs it (no webhook): the controller validates.
    Box::pin(serving_walk(&client, &operator, version, &crd, &api)).await;
    // Then with KubeRay's optional webhook (1.7 only; 1.3 has none for RayServices):
    // everything else is admitted through it.
    let _webhook = match version {
        KubeRay::V1_7_0 => Some(serve_webhook(&cluster, &client, version).await),
        KubeRay::V1_3_0 => None,
    };
    every_shape_is_accepted(&client, version, &api).await;
    first_deployment_failure(&client, &operator).await;
    disaggregated_and_long_names(&client, &operator, version).await;
    storage_and_ignored_fields(&client).await;
    refusals(&client).await;
    if version == KubeRay::V1_7_0 {
        the_webhook_refuses(&client).await;
    }

    // Deletion goes through KubeRay's finalizer (v1.7.0) and removes the RayService, then
    // the ModelDeployment.
    let ns = "serve";
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

/// An aggregated deployment from creation to serving, an upgrade, a failed application,
/// and (1.7.0) a RayService KubeRay refuses.
async fn serving_walk(
    client: &Client,
    operator: &Operator,
    version: KubeRay,
    crd: &CustomResourceDefinition,
    api: &UpstreamApi,
) {
    applied_as_rendered(client, crd, api).await;
    let cluster = comes_up(client, operator, version).await;
    upgrades(client, operator, &cluster).await;
    application_fails(client, operator).await;
    kuberay_refuses_the_rayservice(client, operator, version).await;
}

/// The RayService is applied, owned, labelled and stored exactly as rendered.
async fn applied_as_rendered(client: &Client, crd: &CustomResourceDefinition, api: &UpstreamApi) {
    let ns = "serve";
    let md = ModelDeploymentBuilder::new("llama")
        .namespace(ns)
        .provider("kuberay")
        .model("meta-llama/Llama-3.1-8B-Instruct")
        .gpus(2)
        .label("kubeairunway.ai/team", "a")
        .overrides(json!({"head": {"resources": {"cpu": "2"},
                                   "rayStartParams": {"dashboard-host": "0.0.0.0"}}}))
        .spec(|s| {
            s.engine.context_length = Some(4096);
            s.engine.args = Some([("gpu-memory-utilization".into(), "0.85".into())].into());
            s.secrets = Some(kubeairunway_sdk::api::SecretsSpec {
                hugging_face_token: Some("hf".into()),
            });
            s.node_selector = Some([("pool".into(), "gpu".into())].into());
        })
        .build();
    let created = deploy(client, &md).await;
    let rs = rayservice_where(client, ns, "llama", "the RayService", Option::is_some)
        .await
        .unwrap();
    let owner = &rs.owner_references()[0];
    assert_eq!(owner.uid, created.uid().unwrap());
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    assert_eq!(
        rs.labels().get("kubeairunway.ai/team").map(String::as_str),
        Some("a")
    );
    // The stored spec is what was rendered, plus the CRD's defaults: nothing pruned,
    // nothing rewritten.
    let expected = kubeairunway_e2e::with_crd_defaults(
        crd,
        "v1",
        &serde_json::to_value(rendered(&created, api)).unwrap(),
    );
    assert_eq!(rs.data["spec"], expected["spec"], "stored as rendered");

    let md = md_where(client, ns, "llama", "Deploying", |m| {
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
}

/// KubeRay brings the first cluster up and promotes it; returns its name.
async fn comes_up(client: &Client, operator: &Operator, version: KubeRay) -> String {
    let ns = "serve";
    // KubeRay prepares the first cluster: Ready=False, Initializing.
    md_where(client, ns, "llama", "Initializing", |m| {
        message(m) == "Initializing: RayService is initializing"
            && phase(m) == Some(Phase::Deploying)
    })
    .await;
    // Ray Serve deploys the application on it, then runs it: the Services switch to
    // the cluster and its statuses move to the active slot.
    operator
        .report(ns, "llama", Slot::Pending, ("DEPLOYING", ""), 0)
        .await;
    operator
        .report(ns, "llama", Slot::Pending, ("RUNNING", ""), 1)
        .await;
    let md = md_where(client, ns, "llama", "Running", |m| {
        phase(m) == Some(Phase::Running)
    })
    .await;
    assert_eq!(condition(&md, READY).unwrap().status, "True");
    assert_eq!(message(&md), "Number of serve endpoints is greater than 0");
    let replicas = md.status.as_ref().unwrap().replicas.clone().unwrap();
    assert_eq!((replicas.desired, replicas.ready), (Some(1), Some(1)));
    let live = rayservice_where(client, ns, "llama", "promoted", Option::is_some)
        .await
        .unwrap();
    let cluster = live.data["status"]["activeServiceStatus"]["rayClusterName"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(cluster.starts_with(&ray::ray_cluster_name(version, "llama", "")));
    cluster
}

/// A change of the cluster (here its env) is a zero-downtime upgrade: a pending cluster
/// beside the serving `cluster`, promoted once it serves.
async fn upgrades(client: &Client, operator: &Operator, cluster: &str) {
    let ns = "serve";
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
    let mut changed = mds.get("llama").await.unwrap();
    changed.status = None;
    changed.metadata.managed_fields = None;
    changed.metadata.resource_version = None;
    changed.spec.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "VLLM_LOGGING_LEVEL".into(),
        value: Some("DEBUG".into()),
        value_from: None,
    }]);
    deploy(client, &changed).await;
    let md = md_where(client, ns, "llama", "Deploying (upgrade)", |m| {
        phase(m) == Some(Phase::Deploying)
    })
    .await;
    assert_eq!(
        message(&md),
        "UpgradeInProgress: Both active and pending Ray clusters exist"
    );
    operator
        .report(ns, "llama", Slot::Pending, ("RUNNING", ""), 1)
        .await;
    md_where(client, ns, "llama", "Running after the upgrade", |m| {
        phase(m) == Some(Phase::Running)
    })
    .await;
    let live = rayservice_where(client, ns, "llama", "upgraded", |o| {
        o.as_ref()
            .is_some_and(|o| o.data["status"]["activeServiceStatus"]["rayClusterName"] != cluster)
    })
    .await
    .unwrap();
    assert_eq!(
        live.data["status"]["pendingServiceStatus"]["rayClusterName"],
        Value::Null
    );
}

/// The serving application fails, then recovers.
async fn application_fails(client: &Client, operator: &Operator) {
    let ns = "serve";
    let oom = ("DEPLOY_FAILED", "Failed to load model: CUDA out of memory");
    operator.report(ns, "llama", Slot::Active, oom, 1).await;
    let md = md_where(client, ns, "llama", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    assert_eq!(
        message(&md),
        "Ray Serve application llm is DEPLOY_FAILED: Failed to load model: CUDA out of memory"
    );
    assert_eq!(condition(&md, READY).unwrap().status, "False");
    operator
        .report(ns, "llama", Slot::Active, ("RUNNING", ""), 1)
        .await;
    md_where(client, ns, "llama", "Running again", |m| {
        phase(m) == Some(Phase::Running)
    })
    .await;
}

/// KubeRay 1.7.0's controller refuses a RayService with an invalid initializing timeout
/// (an annotation of another writer): Ready=False, ValidationFailed. 1.3.0 has no such
/// rule.
async fn kuberay_refuses_the_rayservice(client: &Client, operator: &Operator, version: KubeRay) {
    let ns = "serve";
    let rs_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &rayservices());
    let annotate = |value: Option<&str>| json!({"metadata": {"annotations": {ray::INITIALIZING_TIMEOUT: value}}});
    rs_api
        .patch(
            "llama",
            &PatchParams::default(),
            &Patch::Merge(annotate(Some("soon"))),
        )
        .await
        .unwrap();
    if version == KubeRay::V1_7_0 {
        let md = md_where(client, ns, "llama", "ValidationFailed", |m| {
            phase(m) == Some(Phase::Failed)
        })
        .await;
        assert!(
            message(&md).starts_with("ValidationFailed: The RayService metadata is invalid"),
            "{}",
            message(&md)
        );
        assert_eq!(cond_reason(&md, READY), "ValidationFailed");
        assert!(
            operator
                .events(ns, "llama")
                .iter()
                .any(|e| e.starts_with("InvalidRayServiceSpec: The RayService metadata is invalid")),
            "{:?}",
            operator.events(ns, "llama")
        );
        // KubeRay writes nothing else until the RayService is valid again.
        rs_api
            .patch(
                "llama",
                &PatchParams::default(),
                &Patch::Merge(annotate(None)),
            )
            .await
            .unwrap();
    }
}

/// A first deployment whose application fails keeps its statuses in
/// `pendingServiceStatus`; the ModelDeployment must say Failed with Ray Serve's message.
async fn first_deployment_failure(client: &Client, operator: &Operator) {
    let ns = "first";
    deploy(
        client,
        &ModelDeploymentBuilder::new("broken")
            .namespace(ns)
            .provider("kuberay")
            .build(),
    )
    .await;
    md_where(client, ns, "broken", "Initializing", |m| {
        message(m).starts_with("Initializing")
    })
    .await;
    let unauthorized = (
        "DEPLOY_FAILED",
        "Failed to download model: 401 Unauthorized",
    );
    operator
        .report(ns, "broken", Slot::Pending, unauthorized, 1)
        .await;
    let md = md_where(client, ns, "broken", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    assert_eq!(
        message(&md),
        "Ray Serve application llm is DEPLOY_FAILED: Failed to download model: 401 Unauthorized"
    );
    let replicas = md.status.as_ref().unwrap().replicas.clone().unwrap();
    assert_eq!((replicas.desired, replicas.ready), (Some(1), Some(1)));
}

/// Disaggregated serving comes up like any other; a 47-character name serves under the
/// serve Service the release really creates (1.3.0 shortens it).
async fn disaggregated_and_long_names(client: &Client, operator: &Operator, version: KubeRay) {
    let ns = "pd";
    deploy(
        client,
        &ModelDeploymentBuilder::new("split")
            .namespace(ns)
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
    let split = rayservice_where(client, ns, "split", "the P/D RayService", Option::is_some)
        .await
        .unwrap();
    let groups: Vec<&str> = split.data["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["groupName"].as_str().unwrap())
        .collect();
    assert_eq!(groups, ["prefill", "decode"]);
    md_where(client, ns, "split", "Initializing", |m| {
        message(m).starts_with("Initializing")
    })
    .await;
    operator
        .report(ns, "split", Slot::Pending, ("RUNNING", ""), 3)
        .await;
    let md = md_where(client, ns, "split", "Running", |m| {
        phase(m) == Some(Phase::Running)
    })
    .await;
    let replicas = md.status.as_ref().unwrap().replicas.clone().unwrap();
    assert_eq!((replicas.desired, replicas.ready), (Some(3), Some(3)));

    let long = "a-forty-seven-character-model-deployment-name-x";
    assert_eq!(long.len(), 47);
    deploy(
        client,
        &ModelDeploymentBuilder::new(long)
            .namespace(ns)
            .provider("kuberay")
            .build(),
    )
    .await;
    let serve = ray::serve_service_name(version, long);
    let md = md_where(client, ns, long, "the real serve Service", |m| {
        m.status
            .as_ref()
            .and_then(|s| s.endpoint.as_ref())
            .is_some_and(|e| e.service.as_deref() == Some(serve.as_str()))
    })
    .await;
    assert_eq!(phase(&md), Some(Phase::Deploying));
}

/// Storage volumes reach every Ray pod; what no one acts on (the gateway, claim
/// settings) is named in `ProviderCompatible` and a warning event.
async fn storage_and_ignored_fields(client: &Client) {
    let ns = "storage";
    let md = ModelDeploymentBuilder::new("cached")
        .namespace(ns)
        .provider("kuberay")
        .spec(|s| {
            s.gateway = Some(serde_json::from_value(json!({"enabled": true})).unwrap());
            s.model.storage = Some(
                serde_json::from_value(json!({"volumes": [
                    {"name": "weights", "purpose": "modelCache", "size": "100Gi"},
                ]}))
                .unwrap(),
            );
        })
        .build();
    deploy(client, &md).await;
    let rs = rayservice_where(client, ns, "cached", "the RayService", Option::is_some)
        .await
        .unwrap();
    let cluster = &rs.data["spec"]["rayClusterConfig"];
    for pod in [
        &cluster["headGroupSpec"]["template"],
        &cluster["workerGroupSpecs"][0]["template"],
    ] {
        assert_eq!(
            pod["spec"]["volumes"],
            json!([{"name": "weights", "persistentVolumeClaim": {"claimName": "cached-weights"}}])
        );
        let container = &pod["spec"]["containers"][0];
        assert_eq!(
            container["volumeMounts"],
            json!([{"name": "weights", "mountPath": "/model-cache"}])
        );
        assert_eq!(
            container["env"],
            json!([{"name": "HF_HOME", "value": "/model-cache"}])
        );
    }
    let md = md_where(client, ns, "cached", "ignored fields named", |m| {
        condition(m, PROVIDER_COMPATIBLE).is_some_and(|c| c.reason == "CompatibleWithIgnoredFields")
    })
    .await;
    let c = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(c.status, "True");
    assert!(
        c.message
            .contains("spec.model.storage.volumes[weights].size"),
        "{}",
        c.message
    );
    // spec.gateway is core's gateway's: not named.
    assert!(!c.message.contains("spec.gateway"), "{}", c.message);
    let notes = event_where(client, ns, "cached", "UnsupportedField").await;
    assert!(
        notes.iter().any(|n| n.contains("spec.model.storage")),
        "{notes:?}"
    );
}

/// What KubeRay's validation refuses in the head container: 1.3 would only refuse the
/// RayCluster in an event and never start (validation.go:69-72@v1.3.0).
async fn refused_env(client: &Client, ns: &str) {
    deploy(
        client,
        &ModelDeploymentBuilder::new("redis")
            .namespace(ns)
            .provider("kuberay")
            .spec(|s| {
                s.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
                    name: "REDIS_USERNAME".into(),
                    value: Some("ray".into()),
                    value_from: None,
                }]);
            })
            .build(),
    )
    .await;
    let redis = md_where(client, ns, "redis", "env refused", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    assert!(
        condition(&redis, PROVIDER_COMPATIBLE)
            .unwrap()
            .message
            .contains("REDIS_USERNAME"),
        "{:?}",
        redis.status
    );
}

/// What KubeRay cannot serve is refused before anything is applied.
async fn refusals(client: &Client) {
    let ns = "refused";
    deploy(
        client,
        &ModelDeploymentBuilder::new("sg")
            .namespace(ns)
            .provider("kuberay")
            .engine(EngineType::Sglang)
            .build(),
    )
    .await;
    let too_long = "a-model-deployment-name-longer-than-kuberay-takes";
    assert!(too_long.len() > ray::MAX_NAME_LENGTH);
    let not_a_label = "llama.v2";
    for name in [too_long, not_a_label] {
        deploy(
            client,
            &ModelDeploymentBuilder::new(name)
                .namespace(ns)
                .provider("kuberay")
                .build(),
        )
        .await;
    }
    let sg = md_where(client, ns, "sg", "sglang refused", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    let c = condition(&sg, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(
        (c.status.as_str(), c.message.as_str()),
        (
            "False",
            "spec.engine.type is sglang, which provider kuberay does not support: it serves the engines vllm"
        )
    );
    let long = md_where(client, ns, too_long, "long name refused", |m| {
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
    let dotted = md_where(client, ns, not_a_label, "dotted name refused", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    assert!(
        condition(&dotted, PROVIDER_COMPATIBLE)
            .unwrap()
            .message
            .contains("DNS-1035"),
        "{:?}",
        dotted.status
    );
    refused_env(client, ns).await;
    let refused: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &rayservices());
    for name in ["sg", too_long, not_a_label, "redis"] {
        assert!(refused.get_opt(name).await.unwrap().is_none(), "{name}");
    }
}

#[tokio::test]
async fn kuberay_1_7_end_to_end() {
    Box::pin(walk(KubeRay::V1_7_0)).await;
}

#[tokio::test]
async fn kuberay_1_3_end_to_end() {
    Box::pin(walk(KubeRay::V1_3_0)).await;
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
    // What it grants is measured against what the provider uses in providers_rbac.rs;
    // here: no wildcard.
    assert!(
        !serde_json::to_string(&roles[0]["rules"])
            .unwrap()
            .contains('*')
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
    assert_eq!(container["image"], "ghcr.io/kubeairunway/kubeairunway:v9");
    assert_eq!(container["command"], json!(["/kuberay-provider"]));
    assert_eq!(
        container["args"],
        json!([
            "--ray-version=2.49.1-py311-cu128",
            "--ray-image=rayproject/ray-llm",
            "--finalizer-timeout=5m",
            "--stale-status-after=5m",
            "--heartbeat-interval=30s",
            "--resync-period=5m",
            "--cluster-domain=cluster.local",
            "--metrics-bind-address=0.0.0.0:8080",
            "--log-format=json",
            "--leader-elect=true",
            "--leader-elect-resource-name=kuberay-provider",
            "--leader-elect-lease-duration=15s",
            "--leader-elect-renew-deadline=10s",
            "--leader-elect-retry-period=2s",
        ])
    );
    assert_eq!(
        container["env"][0],
        json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": "metrics"})
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "metrics"})
    );
    assert!(container["resources"]["requests"].is_object());
}
