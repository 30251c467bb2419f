//! The core controller against the real API server: provider selection for every row of
//! core's decision table (explicit, capability match, priority, none) with the InferenceProviderConfigs the three built-in
//! providers ship, status by server-side apply, pause, a custom selector, provider-owned
//! status fields surviving core's applies, bad selection rules reported on their config,
//! and the ProviderSelected event.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kubeairunway_core::metrics::Metrics;
use kubeairunway_core::reconciler::{self, AWAITING_SELECTOR_MESSAGE, Settings};
use kubeairunway_e2e::rbac::ChartIdentity;
use kubeairunway_e2e::{apply_md, core_cluster, eventually, helm};
use kubeairunway_sdk::conditions::{self, ENGINE_SELECTED, PROVIDER_SELECTED, READY, VALIDATED};
use kubeairunway_sdk::{InferenceProviderConfig, ModelDeployment};
use serde_json::{Value, json};

const KAITO_CPU_RULE: &str =
    "!has(spec.resources) || !has(spec.resources.gpu) || spec.resources.gpu.count == 0";
const GPU_VLLM_RULE: &str = "has(spec.resources) && has(spec.resources.gpu) && spec.resources.gpu.count > 0 && spec.engine.type == 'vllm'";

/// The configs the built-in providers register (spec, as each provider's runtime writes
/// it), plus one third-party config whose rules are broken.
fn builtin_configs() -> Vec<(&'static str, Value)> {
    vec![
        (
            "kaito",
            json!({
                "capabilities": {"engines": [
                    {"name": "vllm", "servingModes": ["aggregated"], "gpuSupport": true, "cpuSupport": false},
                    {"name": "llamacpp", "servingModes": ["aggregated"], "gpuSupport": true, "cpuSupport": true},
                ]},
                "selectionRules": [
                    {"condition": KAITO_CPU_RULE, "priority": 100},
                    {"condition": "spec.engine.type == 'llamacpp'", "priority": 100},
                ],
                "documentation": "https://github.com/kubeairunway/kubeairunway/tree/main/providers/kaito",
            }),
        ),
        (
            "dynamo",
            json!({
                "capabilities": {"engines": (["vllm", "sglang", "trtllm"].map(|name|
                    json!({"name": name, "servingModes": ["aggregated", "disaggregated"], "gpuSupport": true, "cpuSupport": false})))},
                "selectionRules": [
                    {"condition": "spec.engine.type == 'trtllm'", "priority": 100},
                    {"condition": "spec.engine.type == 'sglang'", "priority": 100},
                    {"condition": "spec.serving.mode == 'disaggregated'", "priority": 90},
                    {"condition": GPU_VLLM_RULE, "priority": 50},
                ],
            }),
        ),
        (
            "kuberay",
            json!({
                "capabilities": {"engines": [{"name": "vllm", "servingModes": ["aggregated", "disaggregated"], "gpuSupport": true, "cpuSupport": false}]},
            }),
        ),
        (
            "core-e2e-broken",
            json!({
                // The deprecated provider-wide values, inherited by its engine.
                "capabilities": {"engines": [{"name": "vllm"}], "servingModes": ["aggregated"], "gpuSupport": true},
                "selectionRules": [
                    {"condition": "spec.engine.type ==", "priority": 1000},
                    {"condition": "spec.nothing.here == 1", "priority": 1000},
                ],
            }),
        ),
    ]
}

/// Register every config as its provider would (spec and a fresh heartbeat), once per
/// process; later calls only refresh the heartbeats.
pub async fn register_providers(client: &Client) {
    let api: Api<InferenceProviderConfig> = Api::all(client.clone());
    for (name, spec) in builtin_configs() {
        let manager = format!("{name}-provider");
        let pp = PatchParams::apply(&manager).force();
        let obj = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "InferenceProviderConfig",
            "metadata": {"name": name}, "spec": spec});
        api.patch(name, &pp, &Patch::Apply(&obj)).await.unwrap();
        let status = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "InferenceProviderConfig",
            "metadata": {"name": name},
            "status": {"ready": true, "version": format!("{name}-provider:v0.1.0"), "lastHeartbeat": Timestamp::now().to_string()}});
        api.patch_status(name, &pp, &Patch::Apply(&status))
            .await
            .unwrap();
    }
}

/// Core's controller as its chart runs it: the chart's service account under the RBAC the
/// chart grants (applied from `helm template`), so a request the chart does not grant
/// fails the test when the returned identity is dropped. Without helm (outside CI), the
/// admin's client and no identity.
async fn core_identity(admin: &Client) -> (Client, Option<ChartIdentity>) {
    let Some(helm_bin) = helm::require() else {
        return (admin.clone(), None);
    };
    let objects = helm::template(&helm_bin, &helm::chart("kubeairunway"), &[]).unwrap();
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let cluster = kubeairunway_testcluster::shared();
    let identity = ChartIdentity::apply(
        cluster,
        admin,
        &objects,
        "core",
        "kubeairunway-system",
        account,
    )
    .await
    .unwrap();
    let client = identity.client(cluster).await.unwrap();
    (client, Some(identity))
}

/// Start core's controller for one namespace in this test's runtime, under its chart's
/// identity ([`core_identity`]): keep what it returns for as long as the test runs.
pub async fn start_controller(admin: &Client, ns: &str, selector: bool) -> Option<ChartIdentity> {
    start_controller_with(admin, ns, selector, Duration::from_secs(300)).await
}

/// [`start_controller`] with a finalizer timeout for providers that are gone.
pub async fn start_controller_with(
    admin: &Client,
    ns: &str,
    selector: bool,
    finalizer_timeout: Duration,
) -> Option<ChartIdentity> {
    let (client, identity) = core_identity(admin).await;
    let (cache, reflector_fut) = reconciler::provider_cache(client.clone());
    tokio::spawn(reflector_fut);
    assert!(cache.synced().await);
    let store = cache.store;
    let settings = Settings {
        enable_provider_selector: selector,
        namespace: Some(ns.to_string()),
        selection: kubeairunway_core::selection::Settings {
            heartbeat_max_age: Duration::from_secs(3600),
        },
        pending_requeue: Duration::from_secs(1),
        finalizer_timeout,
        ..Settings::default()
    };
    let (mds, events) = reconciler::model_deployments(&client, Some(ns));
    tokio::spawn(reconciler::run(
        client,
        mds,
        events,
        store,
        settings,
        Arc::new(Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        )),
        kubeairunway_sdk::process::Check::default(),
        futures::future::pending(),
    ));
    identity
}

#[allow(clippy::needless_pass_by_value)] // reads better at the call sites
fn md(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": name}, "spec": spec})
}

async fn wait_md(
    api: &Api<ModelDeployment>,
    name: &str,
    what: &str,
    check: impl Fn(&ModelDeployment) -> bool,
) -> ModelDeployment {
    eventually(60, what, || async {
        api.get(name).await.ok().filter(|m| check(m))
    })
    .await
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn reason(md: &ModelDeployment) -> String {
    md.status
        .as_ref()
        .and_then(|s| s.provider.as_ref())
        .and_then(|p| p.selected_reason.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn core_selects_every_row_of_the_decision_table() {
    let (cluster, client) = core_cluster().await.unwrap();
    register_providers(&client).await;
    let ns = cluster.namespace("core-table");
    let _core = start_controller(&client, &ns, true).await;

    let gpu = json!({"gpu": {"count": 1}});
    let rows: Vec<(&str, Value, &str, String)> = vec![
        (
            "cpu-llamacpp",
            json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
            "kaito",
            format!("matched capabilities: engine=llamacpp, gpu=false, mode=aggregated; rule `{KAITO_CPU_RULE}` priority 100"),
        ),
        (
            "cpu-zero-gpus",
            json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}, "resources": {"gpu": {"count": 0}}}),
            "kaito",
            format!("matched capabilities: engine=llamacpp, gpu=false, mode=aggregated; rule `{KAITO_CPU_RULE}` priority 100"),
        ),
        (
            "trtllm",
            json!({"model": {"id": "a/b"}, "engine": {"type": "trtllm"}, "resources": gpu}),
            "dynamo",
            "matched capabilities: engine=trtllm, gpu=true, mode=aggregated; rule `spec.engine.type == 'trtllm'` priority 100".into(),
        ),
        (
            "sglang",
            json!({"model": {"id": "a/b"}, "engine": {"type": "sglang"}, "resources": gpu}),
            "dynamo",
            "matched capabilities: engine=sglang, gpu=true, mode=aggregated; rule `spec.engine.type == 'sglang'` priority 100".into(),
        ),
        (
            "gpu-llamacpp",
            json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}, "resources": gpu}),
            "kaito",
            "matched capabilities: engine=llamacpp, gpu=true, mode=aggregated; rule `spec.engine.type == 'llamacpp'` priority 100".into(),
        ),
        (
            "disaggregated",
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
                   "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 2}}}}),
            "dynamo",
            "matched capabilities: engine=vllm, gpu=true, mode=disaggregated; rule `spec.serving.mode == 'disaggregated'` priority 90".into(),
        ),
        (
            "gpu-vllm",
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": gpu}),
            "dynamo",
            format!("matched capabilities: engine=vllm, gpu=true, mode=aggregated; rule `{GPU_VLLM_RULE}` priority 50"),
        ),
        (
            "named-kuberay",
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": gpu, "provider": {"name": "kuberay"}}),
            "kuberay",
            "explicit provider selection".into(),
        ),
        // No engine: core chooses it (vLLM with its default GPU; llama.cpp for GGUF), and
        // the rules see it as spec.engine.type.
        (
            "auto-engine",
            json!({"model": {"id": "Qwen/Qwen3-0.6B"}}),
            "dynamo",
            format!("matched capabilities: engine=vllm, gpu=true, mode=aggregated; rule `{GPU_VLLM_RULE}` priority 50"),
        ),
        (
            "auto-gguf",
            json!({"model": {"id": "Qwen/Qwen3-0.6B-GGUF"}}),
            "kaito",
            format!("matched capabilities: engine=llamacpp, gpu=false, mode=aggregated; rule `{KAITO_CPU_RULE}` priority 100"),
        ),
    ];
    for (name, spec, _, _) in &rows {
        apply_md(&client, &ns, "user", &md(name, spec.clone()))
            .await
            .unwrap();
    }
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    for (name, spec, provider, want_reason) in &rows {
        let got = wait_md(&api, name, "a selected provider", |m| {
            m.selected_provider().is_some()
        })
        .await;
        assert_eq!(got.selected_provider(), Some(*provider), "{name}");
        assert_eq!(&reason(&got), want_reason, "{name}");
        let status = got.status.clone().unwrap();
        assert!(conditions::is_true(&status.conditions, VALIDATED), "{name}");
        let sel = conditions::find(&status.conditions, PROVIDER_SELECTED).unwrap();
        assert_eq!(sel.status, "True", "{name}");
        assert_eq!(&sel.message, want_reason, "{name}");
        let engine = conditions::find(&status.conditions, ENGINE_SELECTED).unwrap();
        assert_eq!(engine.status, "True", "{name}");
        // The spec's engine, or the one in the selection reason.
        let want_engine = spec["engine"]["type"].as_str().or_else(|| {
            let after = want_reason.split_once("engine=")?.1;
            after.split(',').next()
        });
        assert_eq!(
            status
                .engine
                .as_ref()
                .and_then(|e| e.type_.map(kubeairunway_sdk::api::EngineType::as_str)),
            want_engine,
            "{name}: status.engine"
        );
        // Core gave the phase up once a provider was selected.
        assert_eq!(status.phase, None, "{name}: {status:?}");
    }

    // The ProviderSelected event (events.k8s.io/v1).
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), &ns);
    let ev = eventually(10, "ProviderSelected event", || async {
        events
            .list(&ListParams::default())
            .await
            .ok()
            .and_then(|l| {
                l.items.into_iter().find(|e| {
                    e.reason.as_deref() == Some("ProviderSelected")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gpu-vllm")
                })
            })
    })
    .await
    .unwrap();
    assert_eq!(
        ev.note.as_deref(),
        Some(format!("Selected provider 'dynamo': matched capabilities: engine=vllm, gpu=true, mode=aggregated; rule `{GPU_VLLM_RULE}` priority 50").as_str())
    );

    // The broken config's rules were skipped and reported on it.
    let ipcs: Api<InferenceProviderConfig> = Api::all(client.clone());
    let broken = eventually(10, "rule errors on core-e2e-broken", || async {
        ipcs.get("core-e2e-broken").await.ok().filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| conditions::find(&s.conditions, "SelectionRulesValid"))
                .is_some_and(|c| c.status == "False")
        })
    })
    .await
    .unwrap();
    let c = conditions::find(&broken.status.unwrap().conditions, "SelectionRulesValid")
        .unwrap()
        .clone();
    assert_eq!(c.reason, "InvalidSelectionRule");
    assert!(
        c.message
            .contains("rule 0 `spec.engine.type ==`: does not compile"),
        "{}",
        c.message
    );
    assert!(
        c.message
            .contains("rule 1 `spec.nothing.here == 1`: evaluation failed"),
        "{}",
        c.message
    );
}

#[tokio::test]
async fn core_waits_while_paused_and_when_nothing_fits() {
    let (cluster, client) = core_cluster().await.unwrap();
    register_providers(&client).await;
    let ns = cluster.namespace("core-pause");
    let _core = start_controller(&client, &ns, true).await;
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);

    let mut paused = md(
        "paused",
        json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
    );
    paused["metadata"]["annotations"] = json!({"kubeairunway.ai/reconcile-paused": "true"});
    apply_md(&client, &ns, "user", &paused).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        api.get("paused").await.unwrap().status.is_none(),
        "paused object got a status"
    );

    paused["metadata"]["annotations"] = json!({"kubeairunway.ai/reconcile-paused": "false"});
    apply_md(&client, &ns, "user", &paused).await.unwrap();
    let got = wait_md(&api, "paused", "selection after unpause", |m| {
        m.selected_provider().is_some()
    })
    .await;
    assert_eq!(got.selected_provider(), Some("kaito"));

    // An explicitly named provider that is not registered: Pending, never selected.
    apply_md(
        &client,
        &ns,
        "user",
        &md(
            "unknown",
            json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}, "provider": {"name": "nonesuch"}}),
        ),
    )
    .await
    .unwrap();
    let got = wait_md(&api, "unknown", "Pending", |m| {
        m.status.as_ref().and_then(|s| s.phase).is_some()
    })
    .await;
    let status = got.status.unwrap();
    assert_eq!(
        status.phase.map(kubeairunway_sdk::api::Phase::as_str),
        Some("Pending")
    );
    assert_eq!(
        status.message.as_deref(),
        Some("Provider 'nonesuch' CRD not installed in cluster")
    );

    // Valid, but no provider fits: Pending, and the message says why, per provider.
    apply_md(
        &client,
        &ns,
        "user",
        &md(
            "nofit",
            json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}, "serving": {"mode": "disaggregated"},
                   "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 1}}}}),
        ),
    )
    .await
    .unwrap();
    let got = wait_md(&api, "nofit", "Pending", |m| {
        m.status.as_ref().and_then(|s| s.phase).is_some()
    })
    .await;
    let status = got.status.clone().unwrap();
    assert_eq!(
        status.phase.map(kubeairunway_sdk::api::Phase::as_str),
        Some("Pending")
    );
    let message = status.message.unwrap();
    assert!(
        message.starts_with("No provider fits (engine=llamacpp, gpu=true, mode=disaggregated): "),
        "{message}"
    );
    for why in [
        "dynamo: engine llamacpp not supported",
        "kaito: serving mode disaggregated not supported with llamacpp",
        "kuberay: engine llamacpp not supported",
    ] {
        assert!(message.contains(why), "{why} missing in {message}");
    }
    let sel = conditions::find(&status.conditions, PROVIDER_SELECTED).unwrap();
    assert_eq!(
        (sel.status.as_str(), sel.reason.as_str()),
        ("False", "NoSuitableProvider")
    );
    assert_eq!(got.selected_provider(), None);

    // Waiting is quiet: requeued every second here, yet no write changes the object.
    let rv = api.get("nofit").await.unwrap().metadata.resource_version;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        api.get("nofit").await.unwrap().metadata.resource_version,
        rv
    );
}

#[tokio::test]
async fn core_custom_selector_and_provider_fields_survive() {
    let (cluster, client) = core_cluster().await.unwrap();
    register_providers(&client).await;
    let ns = cluster.namespace("core-custom");
    let _core = start_controller(&client, &ns, false).await;
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);

    apply_md(
        &client,
        &ns,
        "user",
        &md(
            "team",
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}),
        ),
    )
    .await
    .unwrap();
    let got = wait_md(&api, "team", "Pending awaiting a selector", |m| {
        m.status.as_ref().and_then(|s| s.message.as_deref()) == Some(AWAITING_SELECTOR_MESSAGE)
    })
    .await;
    let status = got.status.unwrap();
    assert_eq!(
        status.phase.map(kubeairunway_sdk::api::Phase::as_str),
        Some("Pending")
    );
    let sel = conditions::find(&status.conditions, PROVIDER_SELECTED).unwrap();
    assert_eq!(
        (sel.status.as_str(), sel.reason.as_str()),
        ("False", "AwaitingSelection")
    );

    // A custom selector (its own field manager) picks kuberay; it takes ProviderSelected
    // over with force, as a selector replacing core's does.
    let now = Timestamp::now();
    let selected = conditions::new(
        None,
        PROVIDER_SELECTED,
        true,
        "TeamPolicy",
        "team x uses kuberay",
        Some(1),
        now,
    );
    let body = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "team"},
        "status": {"provider": {"name": "kuberay", "selectedReason": "team policy"}, "conditions": [selected]}});
    api.patch_status(
        "team",
        &PatchParams::apply("team-selector").force(),
        &Patch::Apply(&body),
    )
    .await
    .unwrap();
    let got = wait_md(&api, "team", "core to give the phase up", |m| {
        m.status.as_ref().is_some_and(|s| s.phase.is_none())
    })
    .await;
    assert_eq!(got.selected_provider(), Some("kuberay"));
    assert_eq!(reason(&got), "team policy");

    // The provider writes its own fields; core's later applies keep them.
    let ready = conditions::new(
        None,
        READY,
        true,
        "DeploymentReady",
        "serving",
        Some(1),
        now,
    );
    let body = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "team"},
        "status": {"phase": "Running", "endpoint": {"service": "team-serve-svc", "port": 8000},
                   "replicas": {"desired": 1, "ready": 1}, "provider": {"resourceName": "team", "resourceKind": "RayService"},
                   "conditions": [ready]}});
    api.patch_status(
        "team",
        &PatchParams::apply("kuberay-provider"),
        &Patch::Apply(&body),
    )
    .await
    .unwrap();
    // Make core reconcile again: a label change.
    let mut relabel = md(
        "team",
        json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}),
    );
    relabel["metadata"]["labels"] = json!({"touched": "yes"});
    apply_md(&client, &ns, "user", &relabel).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = api.get("team").await.unwrap();
    let status = got.status.clone().unwrap();
    assert_eq!(
        status.phase.map(kubeairunway_sdk::api::Phase::as_str),
        Some("Running")
    );
    assert_eq!(
        status.endpoint.unwrap().service.as_deref(),
        Some("team-serve-svc")
    );
    assert_eq!(status.replicas.unwrap().ready, Some(1));
    let p = status.provider.unwrap();
    assert_eq!(p.name.as_deref(), Some("kuberay"));
    assert_eq!(p.resource_kind.as_deref(), Some("RayService"));
    assert!(conditions::is_true(&status.conditions, READY));
    assert!(conditions::is_true(&status.conditions, VALIDATED));
    assert_eq!(
        conditions::find(&status.conditions, PROVIDER_SELECTED)
            .unwrap()
            .reason,
        "TeamPolicy"
    );
    // Core owns none of the provider's fields, nor the phase.
    let core_fields = got
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .find(|m| m.manager.as_deref() == Some("kubeairunway-controller"))
        .unwrap();
    let fields = core_fields.fields_v1.unwrap().0;
    let status_fields = &fields["f:status"];
    assert!(status_fields.get("f:phase").is_none(), "{fields}");
    assert!(status_fields.get("f:provider").is_none(), "{fields}");
}

#[tokio::test]
async fn the_finalizer_of_an_uninstalled_provider_is_removed_after_the_timeout() {
    let (cluster, client) = core_cluster().await.unwrap();
    register_providers(&client).await;
    let ns = cluster.namespace("core-gone");
    let mut manifest = md(
        "held",
        json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
    );
    // `ghost` has no InferenceProviderConfig (uninstalled); `kaito` is registered and alive.
    manifest["metadata"]["finalizers"] = json!([
        "kubeairunway.ai/ghost-provider",
        "kubeairunway.ai/kaito-provider"
    ]);
    apply_md(&client, &ns, "user", &manifest).await.unwrap();
    // Served by `ghost` (a custom selector chose it), before core starts.
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    api.patch_status(
        "held",
        &PatchParams::apply("custom-selector"),
        &Patch::Apply(
            json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "status": {"provider": {"name": "ghost", "selectedReason": "chosen elsewhere"}}}),
        ),
    )
    .await
    .unwrap();
    let _core = start_controller_with(&client, &ns, true, Duration::from_secs(2)).await;
    api.delete("held", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let held = eventually(30, "the ghost's finalizer removed", || async {
        api.get_opt("held")
            .await
            .ok()
            .flatten()
            .filter(|m| m.finalizers() == ["kubeairunway.ai/kaito-provider"])
    })
    .await
    .unwrap();
    let since = held.metadata.deletion_timestamp.clone().unwrap().0;
    assert!(
        Timestamp::now().duration_since(since) >= k8s_openapi::jiff::SignedDuration::from_secs(2),
        "not before the finalizer timeout"
    );
    let notes =
        kubeairunway_sdk::testing::event_where(&client, &ns, "held", "FinalizerTimeout").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("provider ghost is not installed or not running")),
        "{notes:?}"
    );
    // A live provider's finalizer is its own business: still there a while later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = api.get("held").await.unwrap();
    assert_eq!(still.finalizers(), ["kubeairunway.ai/kaito-provider"]);
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

/// Core's mutating webhook writes the finalizer of the provider it expects core to select.
/// A wrong guess holds nothing: core removes it when it selects another provider, and
/// when a ModelDeployment no provider ever served is deleted.
#[tokio::test]
async fn finalizers_of_providers_that_never_served_are_removed() {
    let (cluster, client) = core_cluster().await.unwrap();
    register_providers(&client).await;
    let ns = cluster.namespace("core-unserved");
    let _core = start_controller(&client, &ns, true).await;
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);

    // Expected to go to dynamo; selected for kaito.
    let mut guessed = md(
        "guessed",
        json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
    );
    guessed["metadata"]["finalizers"] = json!([
        "kubeairunway.ai/dynamo-provider",
        "kubeairunway.ai/kaito-provider",
        "user.example/keep"
    ]);
    apply_md(&client, &ns, "user", &guessed).await.unwrap();
    // Core drops the wrong guess as it selects, then writes the selection: wait for both.
    let got = wait_md(&api, "guessed", "the wrong guess dropped", |m| {
        m.finalizers() == ["kubeairunway.ai/kaito-provider", "user.example/keep"]
            && m.selected_provider().is_some()
    })
    .await;
    assert_eq!(got.selected_provider(), Some("kaito"));

    // No provider fits, so none is ever selected: deleted, it goes at once.
    let mut unserved = md(
        "unserved",
        json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}, "serving": {"mode": "disaggregated"},
               "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 1}}}}),
    );
    unserved["metadata"]["finalizers"] = json!(["kubeairunway.ai/kaito-provider"]);
    apply_md(&client, &ns, "user", &unserved).await.unwrap();
    wait_md(&api, "unserved", "Pending", |m| {
        m.status.as_ref().and_then(|s| s.phase).is_some()
    })
    .await;
    api.delete("unserved", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually(30, "the unserved ModelDeployment gone", || async {
        api.get_opt("unserved").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();

    api.patch(
        "guessed",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}
