//! Core's gateway against the real API server with the real CRDs of the Gateway API
//! Inference Extension (v1.5.0) and the Gateway API (v1.5.1), from
//! `tests/fixtures/crds/upstream/` (provenance in its SOURCES.md), with the Deployment
//! provider running: without the CRDs `GatewayReady=False/CRDsNotAvailable`; the CRDs
//! installed after the gateway started are picked up; the InferencePool selects the pods
//! the provider renders on their port, its endpoint picker and the HTTPRoute are made,
//! owned by the ModelDeployment; a missing Gateway gives `NoGateway`; the URL once the
//! test (there is no gateway implementation) writes the Gateway's address; a user's
//! HTTPRoute (`httpRouteRef`) is checked; `enabled: false` removes everything. The core
//! chart's ValidatingAdmissionPolicy on the gateway's writes is enforced by the API server
//! while core runs under the chart's RBAC, and shown refusing what it fences.

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_core::gateway::controller::{self as gateway, Settings};
use kubeairunway_core::gateway::reasons;
use kubeairunway_deployment_provider::DeploymentProvider;
use kubeairunway_sdk::api::{EngineType, ModelDeployment};
use kubeairunway_sdk::conditions::GATEWAY_READY;
use kubeairunway_sdk::testing::{
    self, ModelDeploymentBuilder, condition, md_where, object_where, test_options,
};
use kubeairunway_sdk::{Provider, labels};
use serde_json::{Value, json};

fn kind(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

fn pools() -> ApiResource {
    kind("inference.networking.k8s.io", "v1", "InferencePool")
}

fn routes() -> ApiResource {
    kind("gateway.networking.k8s.io", "v1", "HTTPRoute")
}

fn gateways() -> ApiResource {
    kind("gateway.networking.k8s.io", "v1", "Gateway")
}

/// Create the Gateway `name` in `ns` with `listener`.
async fn create_gateway(client: &Client, ns: &str, name: &str, listener: Value) {
    let gw = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"gatewayClassName": "test", "listeners": [listener]}});
    apply(client, &gateways(), ns, &gw).await;
}

/// Write the Gateway's address, as its implementation would (there is none here).
async fn address_gateway(client: &Client, ns: &str, name: &str, address: Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &gateways());
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"addresses": [address]}})),
    )
    .await
    .unwrap();
}

/// The real CRDs, as bundled in the fixtures.
fn gateway_crds() -> Vec<CustomResourceDefinition> {
    [
        "inference.networking.k8s.io_inferencepools.yaml",
        "gateway.networking.k8s.io_gateways.yaml",
        "gateway.networking.k8s.io_httproutes.yaml",
    ]
    .iter()
    .map(|file| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/crds/upstream")
            .join(file);
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    })
    .collect()
}

fn ready_reason(md: &ModelDeployment) -> Option<(String, String)> {
    condition(md, GATEWAY_READY).map(|c| (c.status.clone(), c.reason.clone()))
}

async fn gateway_ready(
    client: &Client,
    ns: &str,
    name: &str,
    status: &str,
    reason: &str,
) -> ModelDeployment {
    md_where(
        client,
        ns,
        name,
        &format!("GatewayReady={status}/{reason}"),
        |m| ready_reason(m) == Some((status.to_string(), reason.to_string())),
    )
    .await
}

async fn apply(client: &Client, ar: &ApiResource, ns: &str, object: &Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
    let name = object["metadata"]["name"].as_str().unwrap();
    api.patch(
        name,
        &PatchParams::apply("gateway-e2e").force(),
        &Patch::Apply(object),
    )
    .await
    .unwrap();
}

async fn gone(client: &Client, ar: &ApiResource, ns: &str, name: &str) {
    object_where(
        client,
        ar,
        ns,
        name,
        &format!("{} {name} gone", ar.kind),
        Option::is_none,
    )
    .await;
}

/// Set `enabled: false` on `name` and wait until its pool and every object of its endpoint
/// picker are gone.
async fn disable(client: &Client, ns: &str, name: &str) {
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
    mds.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"gateway": {"enabled": false}}})),
    )
    .await
    .unwrap();
    gone(client, &pools(), ns, name).await;
    let epp = format!("{name}-epp");
    for ar in [
        kind("apps", "v1", "Deployment"),
        kind("", "v1", "Service"),
        kind("", "v1", "ServiceAccount"),
        kind("", "v1", "ConfigMap"),
        kind("rbac.authorization.k8s.io", "v1", "Role"),
        kind("rbac.authorization.k8s.io", "v1", "RoleBinding"),
    ] {
        gone(client, &ar, ns, &epp).await;
    }
}

#[tokio::test]
async fn pool_picker_and_route_follow_spec_gateway_on_the_deployment_provider() {
    let provider = "gateway-deploy";
    let (cluster, client) = testing::cluster().await.unwrap();
    let ns = cluster.namespace(provider);
    let _running = testing::spawn(
        DeploymentProvider::named(provider),
        client.clone(),
        test_options(),
    );
    testing::registered(&client, provider).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let installed_before = crds
        .get_opt("inferencepools.inference.networking.k8s.io")
        .await
        .unwrap()
        .is_some();
    let settings = Settings {
        gateway: Some((ns.clone(), "inference".into())),
        namespace: Some(ns.clone()),
    };
    let task = spawn_gateway(client.clone(), settings);

    let md = ModelDeploymentBuilder::new("qwen")
        .namespace(&ns)
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .gpus(1)
        .provider(provider)
        .spec(|s| {
            s.gateway = Some(
                serde_json::from_value(json!({"enabled": true, "modelName": "qwen3"})).unwrap(),
            );
        })
        .build();
    let md = testing::deploy(&client, &md, provider).await.unwrap();
    if !installed_before {
        // Without the CRDs: a condition, not an error loop.
        let m = gateway_ready(&client, &ns, "qwen", "False", reasons::CRDS_NOT_AVAILABLE).await;
        let message = &condition(&m, GATEWAY_READY).unwrap().message;
        assert!(
            message.contains("inferencepools.inference.networking.k8s.io/v1"),
            "{message}"
        );
    }
    // Installed after the gateway started: picked up.
    kubeairunway_testcluster::install_crds(&client, &gateway_crds())
        .await
        .unwrap();

    // The pool selects the pods the provider renders, on the port they serve.
    pool_selects_the_deployments_pods(&client, &ns, &md, provider).await;
    // The endpoint picker: h2c Service, its Deployment, and what it reads.
    picker_is_made_and_owned(&client, &ns, &md).await;
    // No Gateway yet, then one without and with an address.
    route_from_the_gateway(&client, &ns).await;
    // The user's route: ours goes; theirs is checked.
    let route_api = users_route_replaces_ours(&client, &ns).await;

    // enabled: false removes what the gateway made, and its status.
    disable(&client, &ns, "qwen").await;
    let m = md_where(&client, &ns, "qwen", "no gateway status", |m| {
        condition(m, GATEWAY_READY).is_none()
            && m.status.as_ref().is_some_and(|s| s.gateway.is_none())
    })
    .await;
    assert!(
        m.status.unwrap().endpoint.is_some(),
        "the provider's status stays"
    );
    // The user's route is theirs.
    assert!(route_api.get_opt("mine").await.unwrap().is_some());
    task.abort();
}

async fn pool_selects_the_deployments_pods(
    client: &Client,
    ns: &str,
    md: &ModelDeployment,
    provider: &str,
) {
    let pool = object_where(
        client,
        &pools(),
        ns,
        "qwen",
        "the InferencePool",
        Option::is_some,
    )
    .await
    .unwrap();
    let pods = DeploymentProvider::named(provider).serving_pods(md);
    assert_eq!(
        pool.data["spec"]["selector"]["matchLabels"],
        json!(pods.labels)
    );
    assert_eq!(
        pool.data["spec"]["selector"]["matchLabels"][labels::MODEL_DEPLOYMENT],
        "qwen"
    );
    assert_eq!(pool.data["spec"]["targetPorts"], json!([{"number": 8000}]));
    assert_eq!(pool.data["spec"]["endpointPickerRef"]["name"], "qwen-epp");
    assert_eq!(
        pool.data["spec"]["endpointPickerRef"]["port"]["number"],
        9002
    );
    assert_eq!(pool.owner_references()[0].uid, md.uid().unwrap());
    let deployment = object_where(
        client,
        &kind("apps", "v1", "Deployment"),
        ns,
        "qwen",
        "the model's Deployment",
        Option::is_some,
    )
    .await
    .unwrap();
    let template = &deployment.data["spec"]["template"];
    for (k, v) in &pods.labels {
        assert_eq!(template["metadata"]["labels"][k], json!(v), "{k}");
    }
    assert_eq!(
        template["spec"]["containers"][0]["ports"][0]["containerPort"],
        8000
    );
}

async fn picker_is_made_and_owned(client: &Client, ns: &str, md: &ModelDeployment) {
    let service = object_where(
        client,
        &kind("", "v1", "Service"),
        ns,
        "qwen-epp",
        "the EPP Service",
        Option::is_some,
    )
    .await
    .unwrap();
    assert_eq!(
        service.data["spec"]["ports"][0]["appProtocol"],
        "kubernetes.io/h2c"
    );
    for (ar, name) in [
        (kind("apps", "v1", "Deployment"), "qwen-epp"),
        (kind("", "v1", "ServiceAccount"), "qwen-epp"),
        (kind("", "v1", "ConfigMap"), "qwen-epp"),
        (kind("rbac.authorization.k8s.io", "v1", "Role"), "qwen-epp"),
        (
            kind("rbac.authorization.k8s.io", "v1", "RoleBinding"),
            "qwen-epp",
        ),
    ] {
        let o = object_where(client, &ar, ns, name, &ar.kind, Option::is_some)
            .await
            .unwrap();
        assert_eq!(
            o.owner_references()[0].uid,
            md.uid().unwrap(),
            "{}",
            ar.kind
        );
    }
}

async fn route_from_the_gateway(client: &Client, ns: &str) {
    gateway_ready(client, ns, "qwen", "False", reasons::NO_GATEWAY).await;
    let http = json!({"name": "http", "protocol": "HTTP", "port": 8080});
    create_gateway(client, ns, "inference", http).await;
    let route = object_where(
        client,
        &routes(),
        ns,
        "qwen",
        "the HTTPRoute",
        Option::is_some,
    )
    .await
    .unwrap();
    assert_eq!(route.data["spec"]["parentRefs"][0]["name"], "inference");
    assert_eq!(
        route.data["spec"]["rules"][0]["backendRefs"][0]["kind"],
        "InferencePool"
    );
    assert_eq!(
        route.data["spec"]["rules"][0]["backendRefs"][0]["name"],
        "qwen"
    );
    assert_eq!(
        route.data["spec"]["rules"][0]["matches"][0]["headers"][0]["value"],
        "qwen3"
    );
    gateway_ready(
        client,
        ns,
        "qwen",
        "False",
        reasons::GATEWAY_ADDRESS_PENDING,
    )
    .await;

    // The test plays the gateway implementation: the Gateway gets an address.
    address_gateway(
        client,
        ns,
        "inference",
        json!({"type": "IPAddress", "value": "10.1.2.3"}),
    )
    .await;
    let m = gateway_ready(client, ns, "qwen", "True", reasons::GATEWAY_CONFIGURED).await;
    let status = m.status.unwrap().gateway.unwrap();
    assert_eq!(status.url.as_deref(), Some("http://10.1.2.3:8080/v1"));
    assert_eq!(status.model_name.as_deref(), Some("qwen3"));
    assert_eq!(
        status.gateway.as_deref(),
        Some(format!("{ns}/inference").as_str())
    );
}

async fn users_route_replaces_ours(client: &Client, ns: &str) -> Api<DynamicObject> {
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
    let spec = |gateway: Value| json!({"spec": {"gateway": gateway}});
    mds.patch(
        "qwen",
        &PatchParams::default(),
        &Patch::Merge(spec(json!({"httpRouteRef": "mine"}))),
    )
    .await
    .unwrap();
    gateway_ready(client, ns, "qwen", "False", reasons::HTTP_ROUTE_NOT_FOUND).await;
    gone(client, &routes(), ns, "qwen").await;
    let mine = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "mine", "namespace": ns},
        "spec": {"parentRefs": [{"name": "inference"}],
                 "rules": [{"backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "qwen"}]}]}});
    let route_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &routes());
    route_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(mine).unwrap(),
        )
        .await
        .unwrap();
    let m = gateway_ready(client, ns, "qwen", "True", reasons::GATEWAY_CONFIGURED).await;
    assert_eq!(
        m.status.unwrap().gateway.unwrap().http_route.as_deref(),
        Some("mine")
    );
    route_api
}

/// The gateway under the RBAC the core chart grants core (its service account, on an API
/// server of its own, from no CRDs to the whole lifecycle): no request is denied, and every
/// gateway grant is used but the reads core holds only to grant them to the endpoint
/// picker's Role (the API server lets core write a Role only with what it grants).
#[tokio::test]
async fn the_gateway_needs_exactly_what_the_core_chart_grants() {
    use kubeairunway_e2e::{helm, rbac};

    let Some(helm_bin) = helm::require() else {
        return;
    };
    let objects = helm::template(&helm_bin, &helm::chart("kubeairunway"), &[]).unwrap();
    let system = "kubeairunway-system";
    let (cluster, admin) = testing::private_cluster("gateway-rbac", &[]).await.unwrap();
    cluster.ensure_namespace(system);
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let identity = rbac::ChartIdentity::apply(&cluster, &admin, &objects, "core", system, account)
        .await
        .unwrap();
    let core = identity.client(&cluster).await.unwrap();
    let ns = cluster.namespace("gateway-rbac");
    // The chart's fence on the gateway's writes, enforced before core starts: every write
    // of core's below passes it.
    let fence = enforce_gateway_policy(&admin, &core, &objects, &ns).await;
    let settings = Settings {
        gateway: None,
        namespace: None,
    };
    let task = spawn_gateway(core, settings);

    // A ModelDeployment whose provider reported its serving pods (the test writes that
    // status as a provider would).
    let mds: Api<ModelDeployment> = Api::namespaced(admin.clone(), &ns);
    let md = ModelDeploymentBuilder::new("m")
        .namespace(&ns)
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .gpus(1)
        .spec(|s| s.gateway = Some(serde_json::from_value(json!({"enabled": true})).unwrap()))
        .build();
    mds.create(&PostParams::default(), &md).await.unwrap();
    mds.patch_status(
        "m",
        &PatchParams::apply("gateway-e2e-provider"),
        &Patch::Apply(json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "status": {"selector": "app=m", "endpoint": {"service": "m", "port": 80, "targetPort": 8000}}})),
    )
    .await
    .unwrap();
    gateway_ready(&admin, &ns, "m", "False", reasons::CRDS_NOT_AVAILABLE).await;
    kubeairunway_testcluster::install_crds(&admin, &gateway_crds())
        .await
        .unwrap();
    let http = json!({"name": "http", "protocol": "HTTP", "port": 80});
    create_gateway(&admin, &ns, "only", http).await;
    address_gateway(
        &admin,
        &ns,
        "only",
        json!({"type": "Hostname", "value": "gw.example"}),
    )
    .await;
    let m = gateway_ready(&admin, &ns, "m", "True", reasons::GATEWAY_CONFIGURED).await;
    assert_eq!(
        m.status.unwrap().gateway.unwrap().url.as_deref(),
        Some("http://gw.example/v1"),
        "the only Gateway, its default port left out"
    );
    // Steady state: a Gateway that moves changes the status alone. Core reads its caches
    // and applies no object again (each carries the hash of what was applied), so the
    // reconciles this causes make no request but the status patch.
    let user = kubeairunway_testcluster::service_account_user(system, account);
    a_moved_gateway_costs_one_status_patch(&cluster, &admin, &ns, &user).await;
    // Its own route goes for the user's, then everything goes.
    let spec = |gateway: Value| json!({"spec": {"gateway": gateway}});
    mds.patch(
        "m",
        &PatchParams::default(),
        &Patch::Merge(spec(json!({"httpRouteRef": "mine"}))),
    )
    .await
    .unwrap();
    gone(&admin, &routes(), &ns, "m").await;
    disable(&admin, &ns, "m").await;
    md_where(&admin, &ns, "m", "GatewayReady removed", |m| {
        condition(m, GATEWAY_READY).is_none()
    })
    .await;
    task.abort();

    // Core's requests, less the test's probe of the policy (made under core's name).
    let events: Vec<_> = cluster
        .audit_events()
        .unwrap()
        .into_iter()
        .filter(|e| e.object_ref.as_ref().and_then(|r| r.name.as_deref()) != Some(PROBE))
        .collect();
    let rules = rbac::granted_rules(&objects, system, account);
    let measured = rbac::measure(&rules, &events, &user);
    assert!(
        measured.denied.is_empty(),
        "requests the chart does not allow: {:#?}",
        measured.denied
    );
    assert!(
        events.iter().any(|e| e.user.username == user
            && ["create", "patch"].contains(&e.verb.as_str())
            && e.resource_path().as_deref() == Some("configmaps")
            && e.response_status.as_ref().is_some_and(|s| s.code == 201)),
        "core's gateway wrote a ConfigMap while {fence} was enforced"
    );
    // The gateway's grants (core's others are measured by core_webhook's test); the reads
    // core holds only so that it may grant them to the endpoint picker's Role.
    let gateway_groups = [
        "\"apiextensions.k8s.io\"",
        "\"gateway.networking.k8s.io\"",
        "\"inference.networking.k8s.io\"",
        "\"inference.networking.x-k8s.io\"",
        "\"apps\"",
        "\"rbac.authorization.k8s.io\"",
        "[\"\"]/[\"serviceaccounts\"",
        "[\"\"]/[\"configmaps\"",
        "[\"\"]/[\"services\"",
        "[\"\"]/[\"pods\"",
    ];
    let held_for_the_picker = [
        ": get [\"inference.networking.k8s.io\"]/[\"inferencepools\"] names []",
        ": get [\"\"]/[\"pods\"] names []",
        ": list [\"\"]/[\"pods\"] names []",
        ": watch [\"\"]/[\"pods\"] names []",
    ];
    let unused: Vec<_> = measured
        .unused
        .iter()
        .filter(|r| gateway_groups.iter().any(|g| r.contains(g)))
        .filter(|r| !held_for_the_picker.iter().any(|h| r.ends_with(h)))
        .filter(|r| !r.contains("inference.networking.x-k8s.io"))
        .collect();
    assert!(
        unused.is_empty(),
        "gateway rules no request used: {unused:#?}"
    );
}

/// The name of the ConfigMap a test sends as core to see the chart's gateway policy at work.
const PROBE: &str = "gateway-policy-probe";

/// Apply the core chart's policy on the gateway's writes (`gateway-policy.yaml`) and wait
/// until the API server enforces it: until it refuses core (`core`, its service account's
/// client) an unlabelled ConfigMap in `ns` (a dry run). The policy's name.
async fn enforce_gateway_policy(
    admin: &Client,
    core: &Client,
    objects: &[Value],
    ns: &str,
) -> String {
    let (name, message) = kubeairunway_e2e::policy::enforce_by_configmap(
        admin,
        core,
        objects,
        "-gateway-objects",
        ns,
        PROBE,
    )
    .await
    .unwrap();
    assert!(
        message
            .ends_with("core's gateway writes only objects labelled kubeairunway.ai/gateway-for"),
        "{message}"
    );
    name
}

/// The core chart's policy on the gateway's writes, at work on core's service account:
/// an unlabelled object, one in kube-system, a label removed and another's object changed
/// or deleted are refused with the policy's messages; a labelled object is created,
/// changed and deleted; another service account and the cluster admin are not fenced.
#[tokio::test]
async fn the_core_chart_fences_the_gateways_writes() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::rbac::v1::Role;
    use kube::api::DeleteParams;
    use kubeairunway_e2e::{helm, policy, rbac};

    let Some(helm_bin) = helm::require() else {
        return;
    };
    let objects = helm::template(&helm_bin, &helm::chart("kubeairunway"), &[]).unwrap();
    let system = "kubeairunway-system";
    let (cluster, admin) = testing::private_cluster("gateway-policy", &[])
        .await
        .unwrap();
    cluster.ensure_namespace(system);
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let identity = rbac::ChartIdentity::apply(&cluster, &admin, &objects, "core", system, account)
        .await
        .unwrap();
    let core = identity.client(&cluster).await.unwrap();
    let ns = cluster.namespace("gateway-policy");
    let fence = enforce_gateway_policy(&admin, &core, &objects, &ns).await;
    let config_map = |name: &str, labelled: bool| -> ConfigMap {
        let labels = if labelled {
            json!({"kubeairunway.ai/gateway-for": "m"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    };
    let pp = PostParams::default();
    let unlabelled = "core's gateway writes only objects labelled kubeairunway.ai/gateway-for";
    let not_made = "core's gateway changes and deletes only the objects it made";

    // Core: an unlabelled object refused, in any of the fenced kinds; in kube-system
    // nothing, labelled or not.
    let as_core: Api<ConfigMap> = Api::namespaced(core.clone(), &ns);
    policy::assert_denied(
        &as_core.create(&pp, &config_map("plain", false)).await,
        &fence,
        unlabelled,
    );
    let role: Role =
        serde_json::from_value(json!({"metadata": {"name": "plain"}, "rules": []})).unwrap();
    policy::assert_denied(
        &Api::<Role>::namespaced(core.clone(), &ns)
            .create(&pp, &role)
            .await,
        &fence,
        unlabelled,
    );
    policy::assert_denied(
        &Api::<ConfigMap>::namespaced(core.clone(), "kube-system")
            .create(&pp, &config_map("labelled", true))
            .await,
        &fence,
        "core's gateway never writes in kube-system",
    );
    // A labelled one admitted, changed while labelled, not stripped of its label, deleted.
    as_core
        .create(&pp, &config_map("labelled", true))
        .await
        .unwrap();
    as_core
        .patch(
            "labelled",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v"}})),
        )
        .await
        .unwrap();
    policy::assert_denied(
        &as_core
            .patch(
                "labelled",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"kubeairunway.ai/gateway-for": null}}}),
                ),
            )
            .await,
        &fence,
        unlabelled,
    );
    as_core
        .delete("labelled", &DeleteParams::default())
        .await
        .unwrap();
    // Another's unlabelled object: core may neither label it (take it over) nor delete it.
    let as_admin: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    as_admin
        .create(&pp, &config_map("users", false))
        .await
        .unwrap();
    policy::assert_denied(
        &as_core
            .patch(
                "users",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"kubeairunway.ai/gateway-for": "m"}}}),
                ),
            )
            .await,
        &fence,
        not_made,
    );
    policy::assert_denied(
        &as_core.delete("users", &DeleteParams::default()).await,
        &fence,
        not_made,
    );
    assert!(as_admin.get_opt("users").await.unwrap().is_some());

    // Not core: another service account allowed by RBAC, and the admin, in kube-system.
    let other = json!([{"kind": "ServiceAccount", "name": "other", "namespace": ns}]);
    rbac::grant(
        &admin,
        &ns,
        "configmaps",
        other,
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]),
    )
    .await
    .unwrap();
    Api::<ConfigMap>::namespaced(
        cluster
            .client_as_service_account(&ns, "other")
            .await
            .unwrap(),
        &ns,
    )
    .create(&pp, &config_map("others", false))
    .await
    .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
        .create(&pp, &config_map("admins", false))
        .await
        .unwrap();
}

/// An operator-backed provider: KAITO (its Workspace CRD v0.12.0, no KAITO needed, since
/// the provider reports the endpoint as soon as the Workspace exists). The pool selects
/// what KAITO labels a Workspace's pods, `kaito.sh/workspace=<name>`
/// (pkg/workspace/manifests/manifests.go:293@v0.12.0 for a llama.cpp template), on the
/// port KAITO's Service targets (5000), as the provider reports them; the route and URL
/// follow.
#[tokio::test]
async fn the_pool_selects_kaitos_workspace_pods() {
    use kubeairunway_e2e::{fixtures_dir, read_crd};
    use kubeairunway_kaito_provider::{KaitoProvider, NodeProvisioning};

    let crd = read_crd(&fixtures_dir().join("crds/upstream/kaito.sh_workspaces.yaml")).unwrap();
    let (cluster, client) = testing::private_cluster("gateway-kaito", &[crd])
        .await
        .unwrap();
    kubeairunway_testcluster::install_crds(&client, &gateway_crds())
        .await
        .unwrap();
    let ns = cluster.namespace("gateway-kaito");
    let provider = KaitoProvider {
        inference_set: false,
        nodes: NodeProvisioning::Byo,
    };
    let _running = testing::spawn(provider.clone(), client.clone(), test_options());
    testing::registered(&client, "kaito").await;
    let settings = Settings {
        gateway: None,
        namespace: Some(ns.clone()),
    };
    let task = spawn_gateway(client.clone(), settings);
    let https = json!({"name": "https", "protocol": "HTTPS", "port": 443,
        "tls": {"certificateRefs": [{"name": "edge-cert"}]}});
    create_gateway(&client, &ns, "edge", https).await;
    address_gateway(
        &client,
        &ns,
        "edge",
        json!({"type": "Hostname", "value": "ai.example.com"}),
    )
    .await;

    let md = ModelDeploymentBuilder::new("gemma")
        .namespace(&ns)
        .model("google/gemma-3-1b-it-qat-q8_0-gguf")
        .engine(EngineType::Llamacpp)
        .gpus(0)
        .image("ghcr.io/sozercan/llama-cpp-runner:latest")
        .provider("kaito")
        .spec(|s| s.gateway = Some(serde_json::from_value(json!({"enabled": true})).unwrap()))
        .build();
    let md = testing::deploy(&client, &md, "kaito").await.unwrap();
    let pool = object_where(
        &client,
        &pools(),
        &ns,
        "gemma",
        "the InferencePool",
        Option::is_some,
    )
    .await
    .unwrap();
    assert_eq!(
        pool.data["spec"]["selector"]["matchLabels"],
        json!({"kaito.sh/workspace": "gemma"})
    );
    assert_eq!(
        pool.data["spec"]["selector"]["matchLabels"],
        json!(provider.serving_pods(&md).labels)
    );
    assert_eq!(pool.data["spec"]["targetPorts"], json!([{"number": 5000}]));
    let m = gateway_ready(&client, &ns, "gemma", "True", reasons::GATEWAY_CONFIGURED).await;
    let status = m.status.unwrap();
    assert_eq!(status.selector.as_deref(), Some("kaito.sh/workspace=gemma"));
    let gateway = status.gateway.unwrap();
    assert_eq!(gateway.url.as_deref(), Some("https://ai.example.com/v1"));
    assert_eq!(gateway.model_name.as_deref(), md.spec.served_model_name());
    let route = object_where(
        &client,
        &routes(),
        &ns,
        "gemma",
        "the HTTPRoute",
        Option::is_some,
    )
    .await
    .unwrap();
    assert_eq!(route.data["spec"]["parentRefs"][0]["name"], "edge");
    // The scale subresource selects the same pods.
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    let scale = mds.get_scale("gemma").await.unwrap();
    assert_eq!(
        scale.status.unwrap().selector.as_deref(),
        Some("kaito.sh/workspace=gemma")
    );
    task.abort();
}

/// Dynamo manages its own pool: with `spec.gateway` the provider renders Dynamo's endpoint
/// picker and a frontend sidecar on each worker; the operator (its stand-in, with its
/// admission webhook) makes the InferencePool `<graph>-pool` over the workers; core's
/// gateway then makes only the HTTPRoute, to that pool. The pool's selector matches the
/// labels the operator puts on the worker pods and not the picker's
/// (`kubeairunway_e2e::operators::dynamo::pod_labels`, cited there).
#[tokio::test]
async fn dynamo_manages_its_own_pool_and_the_route_goes_to_it() {
    use kubeairunway_dynamo_provider::Dynamo;
    use kubeairunway_e2e::operators::dynamo::{StandIn, pod_labels, serve_webhook};
    use kubeairunway_e2e::{fixtures_dir, read_crd};

    let version = "v1beta1";
    let crd =
        read_crd(&fixtures_dir().join("crds/upstream/nvidia.com_dynamographdeployments.yaml"))
            .unwrap();
    let (cluster, client) = testing::private_cluster("gateway-dynamo", &[crd])
        .await
        .unwrap();
    kubeairunway_testcluster::install_crds(&client, &gateway_crds())
        .await
        .unwrap();
    let dgds = kind("nvidia.com", version, "DynamoGraphDeployment");
    let _webhook = serve_webhook(&cluster, &client, &dgds).await.unwrap();
    let operator = StandIn::spawn(
        client.clone(),
        dgds.clone(),
        version,
        std::collections::BTreeSet::new(),
    );
    let _running = testing::spawn(Dynamo::default(), client.clone(), test_options());
    testing::registered(&client, "dynamo").await;
    let ns = cluster.namespace("gateway-dynamo");
    let task = spawn_gateway(
        client.clone(),
        Settings {
            gateway: None,
            namespace: Some(ns.clone()),
        },
    );
    let http = json!({"name": "http", "protocol": "HTTP", "port": 80});
    create_gateway(&client, &ns, "edge", http).await;
    address_gateway(
        &client,
        &ns,
        "edge",
        json!({"type": "IPAddress", "value": "10.0.0.7"}),
    )
    .await;

    let md = ModelDeploymentBuilder::new("qwen")
        .namespace(&ns)
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .gpus(1)
        .provider("dynamo")
        // Named as not applicable: there is no standalone frontend with the gateway.
        .overrides(json!({"routerMode": "kv"}))
        .spec(|s| s.gateway = Some(serde_json::from_value(json!({"enabled": true})).unwrap()))
        .build();
    testing::deploy(&client, &md, "dynamo").await.unwrap();
    let dgd = object_where(
        &client,
        &dgds,
        &ns,
        "qwen",
        "the DynamoGraphDeployment",
        Option::is_some,
    )
    .await
    .unwrap();
    let dgd = serde_json::to_value(&dgd).unwrap();
    let pool = object_where(
        &client,
        &pools(),
        &ns,
        "qwen-pool",
        "Dynamo's InferencePool",
        Option::is_some,
    )
    .await
    .unwrap();
    let selector: std::collections::BTreeMap<String, String> =
        serde_json::from_value(pool.data["spec"]["selector"]["matchLabels"].clone()).unwrap();
    let selects = |component: &str| {
        let labels = pod_labels(version, &dgd, component);
        selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    assert!(
        selects("VllmWorker"),
        "{selector:?} selects the worker pods"
    );
    assert!(
        !selects("Epp"),
        "{selector:?} does not select the picker's pods"
    );
    assert_eq!(pool.data["spec"]["targetPorts"], json!([{"number": 8000}]));

    let m = gateway_ready(&client, &ns, "qwen", "True", reasons::GATEWAY_CONFIGURED).await;
    let status = m.status.clone().unwrap();
    let endpoint = status.endpoint.clone().unwrap();
    assert_eq!(endpoint.inference_pool.as_deref(), Some("qwen-pool"));
    assert_eq!((endpoint.service, endpoint.target_port), (None, Some(8000)));
    assert_eq!(
        status.gateway.unwrap().url.as_deref(),
        Some("http://10.0.0.7/v1")
    );
    let route = object_where(
        &client,
        &routes(),
        &ns,
        "qwen",
        "the HTTPRoute",
        Option::is_some,
    )
    .await
    .unwrap();
    assert_eq!(
        route.data["spec"]["rules"][0]["backendRefs"][0]["name"],
        "qwen-pool"
    );
    assert_eq!(
        route.data["spec"]["rules"][0]["backendRefs"][0]["kind"],
        "InferencePool"
    );
    // Core made neither a pool nor a picker of its own.
    for (ar, name) in [
        (pools(), "qwen"),
        (kind("apps", "v1", "Deployment"), "qwen-epp"),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
        assert!(
            api.get_opt(name).await.unwrap().is_none(),
            "{} {name}",
            ar.kind
        );
    }
    let compatible = condition(&m, kubeairunway_sdk::conditions::PROVIDER_COMPATIBLE).unwrap();
    assert!(
        compatible.message.contains("provider.overrides.routerMode"),
        "{compatible:?}"
    );
    assert_eq!(
        operator.problems(),
        Vec::<String>::new(),
        "refused or misserved"
    );
    task.abort();
}

/// KubeRay: the InferencePool core makes selects the head pod KubeRay runs Serve on (the
/// labels it gives that pod, `kubeairunway_e2e::operators::kuberay::head_pod_labels`,
/// cited there) and not a worker's, on Serve's port. A route the Gateway's implementation
/// refuses turns `GatewayReady` false until it is accepted.
#[tokio::test]
async fn the_pool_selects_kuberays_serving_pods() {
    use kubeairunway_e2e::operators::kuberay::head_pod_labels;
    use kubeairunway_e2e::{fixtures_dir, read_crd};
    use kubeairunway_kuberay_provider::KubeRayProvider;

    let crd = read_crd(&fixtures_dir().join("crds/upstream/ray.io_rayservices.yaml")).unwrap();
    let (cluster, client) = testing::private_cluster("gateway-kuberay", &[crd])
        .await
        .unwrap();
    kubeairunway_testcluster::install_crds(&client, &gateway_crds())
        .await
        .unwrap();
    let ns = cluster.namespace("gateway-kuberay");
    let provider = KubeRayProvider::default();
    let _running = testing::spawn(provider.clone(), client.clone(), test_options());
    testing::registered(&client, "kuberay").await;
    let task = spawn_gateway(
        client.clone(),
        Settings {
            gateway: None,
            namespace: Some(ns.clone()),
        },
    );
    create_gateway(
        &client,
        &ns,
        "edge",
        json!({"name": "http", "protocol": "HTTP", "port": 8080}),
    )
    .await;
    address_gateway(
        &client,
        &ns,
        "edge",
        json!({"type": "Hostname", "value": "ray.example.com"}),
    )
    .await;

    let md = ModelDeploymentBuilder::new("llm")
        .namespace(&ns)
        .model("Qwen/Qwen3-0.6B")
        .engine(EngineType::Vllm)
        .gpus(1)
        .provider("kuberay")
        .spec(|s| s.gateway = Some(serde_json::from_value(json!({"enabled": true})).unwrap()))
        .build();
    let md = testing::deploy(&client, &md, "kuberay").await.unwrap();
    let rayservices = kind("ray.io", "v1", "RayService");
    let rs = object_where(
        &client,
        &rayservices,
        &ns,
        "llm",
        "the RayService",
        Option::is_some,
    )
    .await
    .unwrap();
    let rs = serde_json::to_value(&rs).unwrap();
    let pool = object_where(
        &client,
        &pools(),
        &ns,
        "llm",
        "the InferencePool",
        Option::is_some,
    )
    .await
    .unwrap();
    let selector: std::collections::BTreeMap<String, String> =
        serde_json::from_value(pool.data["spec"]["selector"]["matchLabels"].clone()).unwrap();
    assert_eq!(selector, provider.serving_pods(&md).labels);
    let head = head_pod_labels(&rs, "llm-raycluster-abcde");
    assert!(
        selector.iter().all(|(k, v)| head.get(k) == Some(v)),
        "{selector:?} selects the head pod {head:?}"
    );
    let mut worker = head.clone();
    worker.remove("ray.io/serve");
    assert!(
        !selector.iter().all(|(k, v)| worker.get(k) == Some(v)),
        "{selector:?} does not select a pod without Serve"
    );
    assert_eq!(pool.data["spec"]["targetPorts"], json!([{"number": 8000}]));
    let m = gateway_ready(&client, &ns, "llm", "True", reasons::GATEWAY_CONFIGURED).await;
    let gateway = m.status.unwrap().gateway.unwrap();
    assert_eq!(
        gateway.url.as_deref(),
        Some("http://ray.example.com:8080/v1")
    );

    // The Gateway's implementation refuses the route (as it writes its status, Gateway API
    // v1.5.1 RouteParentStatus), then accepts it: GatewayReady follows.
    let route_status = |accepted: &str, reason: &str| {
        json!({"status": {"parents": [{
            "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                "namespace": ns, "name": "edge"},
            "controllerName": "example.com/gateway-controller",
            "conditions": [{"type": "Accepted", "status": accepted, "reason": reason,
                "message": "as the implementation says", "observedGeneration": 1,
                "lastTransitionTime": "2026-11-27T00:00:00Z"}]}]}})
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &routes());
    api.patch_status(
        "llm",
        &PatchParams::default(),
        &Patch::Merge(route_status("False", "NotAllowedByListeners")),
    )
    .await
    .unwrap();
    let m = gateway_ready(&client, &ns, "llm", "False", reasons::NOT_ACCEPTED).await;
    let message = condition(&m, GATEWAY_READY).unwrap().message.clone();
    assert!(message.contains("NotAllowedByListeners"), "{message}");
    api.patch_status(
        "llm",
        &PatchParams::default(),
        &Patch::Merge(route_status("True", "Accepted")),
    )
    .await
    .unwrap();
    gateway_ready(&client, &ns, "llm", "True", reasons::GATEWAY_CONFIGURED).await;
    task.abort();
}

/// `kubeairunway render --gateway NS/NAME` prints the gateway's objects after the
/// provider's, and each passes a strict server-side dry run against the real CRDs (unknown
/// fields refused, not pruned) and the built-in kinds' schemas.
#[tokio::test]
async fn render_prints_gateway_objects_the_real_crds_accept() {
    use kubeairunway_cli::Terminal;

    let (cluster, client) = testing::cluster().await.unwrap();
    kubeairunway_testcluster::install_crds(&client, &gateway_crds())
        .await
        .unwrap();
    let ns = cluster.namespace("gateway-render");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("md.yaml");
    std::fs::write(
        &file,
        "apiVersion: kubeairunway.ai/v1alpha1\nkind: ModelDeployment\nmetadata: {name: qwen}\n\
         spec:\n  model: {id: Qwen/Qwen3-0.6B}\n  engine: {type: vllm}\n  resources: {gpu: {count: 1}}\n\
         \x20 provider: {name: deployment}\n  gateway: {enabled: true, modelName: qwen3}\n",
    )
    .unwrap();
    let gateway = format!("{ns}/edge");
    let args = [
        "kubeairunway",
        "render",
        "-f",
        file.to_str().unwrap(),
        "-n",
        &ns,
        "--gateway",
        &gateway,
        "-o",
        "json",
    ];
    let (mut term, captured) = Terminal::capture();
    let code = kubeairunway_cli::run(
        args.iter().map(std::ffi::OsString::from).collect(),
        &mut term,
    )
    .await;
    assert_eq!(code, 0, "{}", captured.err());
    let list: Value = serde_json::from_str(&captured.out()).unwrap();
    let items = list["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    for kind in [
        "InferencePool",
        "HTTPRoute",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "ConfigMap",
    ] {
        assert!(kinds.contains(&kind), "{kinds:?}");
    }
    let pp = PatchParams::apply("gateway-render")
        .validation_strict()
        .dry_run();
    let mut checked = 0;
    for item in items.iter().filter(|o| {
        o["metadata"]["labels"][kubeairunway_core::gateway::render::GATEWAY_FOR] == "qwen"
    }) {
        let (group, version) = match item["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", item["apiVersion"].as_str().unwrap()),
        };
        let ar = kind(group, version, item["kind"].as_str().unwrap());
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
        let name = item["metadata"]["name"].as_str().unwrap();
        api.patch(name, &pp, &Patch::Apply(item))
            .await
            .unwrap_or_else(|e| panic!("{} {name}: {e}", ar.kind));
        checked += 1;
    }
    assert_eq!(checked, 8, "pool, six picker objects, route");
}

/// Move the Gateway `only` (its address) and check that core (`user`) made no request
/// for it but patches of the status of `m` in `ns`.
async fn a_moved_gateway_costs_one_status_patch(
    cluster: &kubeairunway_testcluster::TestCluster,
    admin: &Client,
    ns: &str,
    user: &str,
) {
    let seen = cluster.audit_events().unwrap().len();
    address_gateway(
        admin,
        ns,
        "only",
        json!({"type": "Hostname", "value": "gw2.example"}),
    )
    .await;
    md_where(admin, ns, "m", "the new URL", |m| {
        m.status
            .as_ref()
            .and_then(|s| s.gateway.as_ref())
            .and_then(|g| g.url.as_deref())
            == Some("http://gw2.example/v1")
    })
    .await;
    let since: Vec<String> = cluster.audit_events().unwrap()[seen..]
        .iter()
        .filter(|e| e.user.username == user && e.stage == "ResponseComplete" && e.verb != "watch")
        .map(|e| {
            format!(
                "{} {} {:?}",
                e.verb,
                e.request_uri,
                e.response_status.as_ref().map(|s| s.code)
            )
        })
        .collect();
    assert!(!since.is_empty(), "the status was patched");
    assert!(
        since
            .iter()
            .all(|r| r.starts_with("patch ") && r.contains("/modeldeployments/m/status")),
        "{since:#?}"
    );
}

/// The gateway as core runs it, over core's ModelDeployment cache (driven here, as core's
/// reconciler would).
fn spawn_gateway(client: kube::Client, settings: Settings) -> tokio::task::JoinHandle<()> {
    let (mds, events) =
        kubeairunway_core::reconciler::model_deployments(&client, settings.namespace.as_deref());
    tokio::spawn(async move {
        tokio::join!(
            kubeairunway_sdk::reflect::drive("ModelDeployment", events),
            gateway::run(client, settings, mds, std::future::pending())
        );
    })
}
