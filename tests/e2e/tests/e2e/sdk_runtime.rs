//! The SDK's provider runtime, end to end on the real API server, driving the example
//! third-party provider (`sdk/examples/chatserver`). Each test runs its own provider
//! instance under a name of its own, so tests never see each other's ModelDeployments.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::{Client, CustomResourceExt, ResourceExt};
use kubeairunway_sdk::api::{EngineType, ModelDeployment, Phase};
use kubeairunway_sdk::conditions::{
    PROVIDER_COMPATIBLE, PROVIDER_SELECTED, READY, RESOURCE_CREATED, STALE_STATUS, reasons,
};
use kubeairunway_sdk::labels;
use kubeairunway_sdk::testing::{
    self, ModelDeploymentBuilder, RunningProvider, condition, event_where, md_where, phase,
    test_options, wait_for,
};
use serde_json::json;

use crate::chatserver::{ChatServer, ChatServerProvider};

const WAIT: Duration = Duration::from_secs(60);

fn chatservers() -> ApiResource {
    ApiResource::erase::<ChatServer>(&())
}

async fn setup(provider: &str) -> (Client, String, RunningProvider) {
    let (cluster, client) = testing::cluster().await.unwrap();
    testing::install_crds(&client, &[ChatServer::crd()])
        .await
        .unwrap();
    let ns = cluster.namespace(provider);
    let running = testing::spawn(
        ChatServerProvider {
            name: provider.to_string(),
        },
        client.clone(),
        test_options(),
    );
    (client, ns, running)
}

fn llama(name: &str, ns: &str, provider: &str) -> ModelDeploymentBuilder {
    ModelDeploymentBuilder::new(name)
        .namespace(ns)
        .model("google/gemma-3-1b-it-qat-q8_0-gguf")
        .engine(EngineType::Llamacpp)
        .gpus(0)
        .image("ghcr.io/example/llama-server:1")
        .provider(provider)
}

#[tokio::test]
async fn example_provider_end_to_end() {
    let provider = "chat-e2e";
    let (client, ns, running) = setup(provider).await;

    // Registration: the InferenceProviderConfig with a ready status and the detected API.
    let ipc = testing::registered(&client, provider).await;
    let status = ipc.status.unwrap();
    assert_eq!(
        status.upstream_crd_version.as_deref(),
        Some("example.kubeairunway.ai/v1")
    );
    assert_eq!(
        status.upstream_schema_hash.as_ref().map(String::len),
        Some(16)
    );
    assert!(status.last_heartbeat.is_some());
    assert_eq!(
        ipc.spec.selection_rules[0].condition,
        "spec.engine.type == 'llamacpp'"
    );

    // Core writes its own fields before the provider acts; they must survive.
    let md = deploy(
        &client,
        &llama("llama", &ns, provider)
            .label("kubeairunway.ai/team", "a")
            .label("app", "x")
            .build(),
    )
    .await;
    let server = chatserver_where(&client, &ns, "llama", "the ChatServer", Option::is_some)
        .await
        .unwrap();
    let owner = &server.owner_references()[0];
    assert_eq!(owner.uid, md.uid().unwrap());
    assert_eq!(
        (
            owner.controller,
            owner.block_owner_deletion,
            owner.kind.as_str()
        ),
        (Some(true), Some(true), "ModelDeployment")
    );
    assert_eq!(
        server.labels().get(labels::MANAGED_BY).map(String::as_str),
        Some("kubeairunway")
    );
    assert_eq!(
        server
            .labels()
            .get("kubeairunway.ai/team")
            .map(String::as_str),
        Some("a")
    );
    assert!(
        !server.labels().contains_key("app"),
        "only kubeairunway.ai/ labels propagate"
    );
    assert_eq!(
        server.data["spec"]["podLabels"][labels::MODEL_DEPLOYMENT],
        "llama"
    );

    let md = md_where(&client, &ns, "llama", "Deploying", |m| {
        phase(m) == Some(Phase::Deploying)
    })
    .await;
    assert!(
        md.finalizers()
            .contains(&"kubeairunway.ai/chat-e2e-provider".to_string())
    );
    assert_eq!(condition(&md, PROVIDER_COMPATIBLE).unwrap().status, "True");
    assert_eq!(condition(&md, RESOURCE_CREATED).unwrap().status, "True");
    assert_eq!(condition(&md, READY).unwrap().status, "False");
    assert_eq!(
        md.status
            .as_ref()
            .unwrap()
            .provider
            .as_ref()
            .unwrap()
            .resource_kind
            .as_deref(),
        Some("ChatServer")
    );
    assert!(
        !event_where(&client, &ns, "llama", "ResourceCreated")
            .await
            .is_empty()
    );

    // Status flows back from the upstream object.
    testing::write_upstream_status(
        &client,
        &chatservers(),
        &ns,
        "llama",
        json!({"phase": "Ready", "readyReplicas": 1}),
    )
    .await
    .unwrap();
    let md = md_where(&client, &ns, "llama", "Running", |m| {
        phase(m) == Some(Phase::Running)
    })
    .await;
    let status = md.status.clone().unwrap();
    assert_eq!(
        status.endpoint.as_ref().unwrap().service.as_deref(),
        Some("llama")
    );
    assert_eq!(status.endpoint.as_ref().unwrap().port, Some(8080));
    assert_eq!(status.replicas.as_ref().unwrap().ready, Some(1));
    assert_eq!(condition(&md, READY).unwrap().status, "True");
    assert_eq!(status.observed_generation, md.metadata.generation);
    // Core's fields survived the provider's writes.
    assert_eq!(
        status.provider.as_ref().unwrap().name.as_deref(),
        Some(provider)
    );
    assert_eq!(
        status.provider.as_ref().unwrap().selected_reason.as_deref(),
        Some("explicit provider selection")
    );
    assert_eq!(condition(&md, PROVIDER_SELECTED).unwrap().status, "True");

    // Drift: someone edits the ChatServer; the provider restores it and says so.
    let servers: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &chatservers());
    let edit = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..Default::default()
    };
    servers
        .patch(
            "llama",
            &edit,
            &Patch::Merge(json!({"spec": {"replicas": 7}})),
        )
        .await
        .unwrap();
    chatserver_where(&client, &ns, "llama", "the edit to be undone", |s| {
        s.as_ref().is_some_and(|s| s.data["spec"]["replicas"] == 1)
    })
    .await;
    let drift = event_where(&client, &ns, "llama", "DriftDetected").await;
    assert!(drift[0].contains("spec.replicas"), "{drift:?}");

    // Deletion removes the upstream object, then the ModelDeployment.
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    mds.delete("llama", &DeleteParams::default()).await.unwrap();
    chatserver_where(
        &client,
        &ns,
        "llama",
        "the ChatServer to go",
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
async fn finalizer_gives_up_after_its_timeout() {
    let provider = "chat-finalizer";
    let (client, ns, _running) = setup(provider).await;
    deploy(&client, &llama("held", &ns, provider).build()).await;
    chatserver_where(&client, &ns, "held", "the ChatServer", Option::is_some).await;

    // An upstream finalizer that never goes away (an operator that is down).
    let servers: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &chatservers());
    servers
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
        )
        .await
        .unwrap();
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    mds.delete("held", &DeleteParams::default()).await.unwrap();

    let md = md_where(&client, &ns, "held", "Terminating", |m| {
        phase(m) == Some(Phase::Terminating)
    })
    .await;
    assert!(
        md.finalizers()
            .contains(&"kubeairunway.ai/chat-finalizer-provider".to_string()),
        "still waiting"
    );
    wait_for(
        Duration::from_secs(20),
        "the ModelDeployment to be released",
        || mds.get_opt("held"),
        Option::is_none,
    )
    .await
    .unwrap();
    let timeout = event_where(&client, &ns, "held", "FinalizerTimeout").await;
    assert!(timeout[0].contains("ChatServer/held"), "{timeout:?}");
    // The orphan is still there, marked for deletion; release it.
    let orphan = servers.get("held").await.unwrap();
    assert!(orphan.metadata.deletion_timestamp.is_some());
    servers
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn identity_change_recreates_the_upstream_object() {
    let provider = "chat-identity";
    let (client, ns, _running) = setup(provider).await;
    let md = llama("ident", &ns, provider).build();
    deploy(&client, &md).await;
    let first = chatserver_where(&client, &ns, "ident", "the ChatServer", Option::is_some)
        .await
        .unwrap();

    // A config field is updated in place...
    let mut scaled = md.clone();
    scaled.spec.scaling.replicas = 2;
    deploy(&client, &scaled).await;
    let same = chatserver_where(&client, &ns, "ident", "replicas 2", |s| {
        s.as_ref().is_some_and(|s| s.data["spec"]["replicas"] == 2)
    })
    .await
    .unwrap();
    assert_eq!(same.uid(), first.uid());

    // ...an identity field recreates the object.
    let mut moved = scaled.clone();
    moved.spec.model.id = Some("bartowski/Llama-3.2-1B-Instruct-GGUF".into());
    deploy(&client, &moved).await;
    let second = chatserver_where(&client, &ns, "ident", "a new ChatServer", |s| {
        s.as_ref()
            .is_some_and(|s| s.uid() != first.uid() && s.metadata.deletion_timestamp.is_none())
    })
    .await
    .unwrap();
    assert_eq!(
        second.data["spec"]["model"],
        "bartowski/Llama-3.2-1B-Instruct-GGUF"
    );
    assert!(
        !event_where(&client, &ns, "ident", "Recreating")
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn a_change_of_an_immutable_upstream_field_recreates_the_object() {
    // ChatServer's CRD refuses any change of spec.port (`self == oldSelf`); the provider
    // declares it immutable, so the runtime recreates the server instead of failing.
    let provider = "chat-immutable";
    let (client, ns, _running) = setup(provider).await;
    let md = llama("imm", &ns, provider)
        .overrides(json!({"port": 8080}))
        .build();
    deploy(&client, &md).await;
    let first = chatserver_where(&client, &ns, "imm", "the ChatServer", Option::is_some)
        .await
        .unwrap();
    assert!(first.annotations().contains_key(labels::IMMUTABLE_HASH));

    let moved = llama("imm", &ns, provider)
        .overrides(json!({"port": 9000}))
        .build();
    deploy(&client, &moved).await;
    let second = chatserver_where(&client, &ns, "imm", "a new ChatServer on 9000", |s| {
        s.as_ref().is_some_and(|s| {
            s.uid() != first.uid()
                && s.metadata.deletion_timestamp.is_none()
                && s.data["spec"]["port"] == 9000
        })
    })
    .await
    .unwrap();
    assert_ne!(second.uid(), first.uid());
    let recreating = event_where(&client, &ns, "imm", "Recreating").await;
    assert!(
        recreating
            .iter()
            .any(|m| m.contains("a field the upstream cannot update changed")),
        "{recreating:?}"
    );
    let md = md_where(&client, &ns, "imm", "deploying again", |m| {
        phase(m) == Some(Phase::Deploying)
    })
    .await;
    assert_ne!(
        condition(&md, RESOURCE_CREATED).map(|c| c.reason.as_str()),
        Some(reasons::RESOURCE_REJECTED)
    );
}

#[tokio::test]
async fn an_object_the_api_server_refuses_fails_with_its_words_and_recovers_when_fixed() {
    // ChatServer's CRD refuses `--port` among the engine arguments.
    let provider = "chat-refused";
    let (client, ns, _running) = setup(provider).await;
    let bad = llama("ref", &ns, provider)
        .spec(|s| {
            s.engine.args = Some([("port".to_string(), "9000".to_string())].into());
        })
        .build();
    deploy(&client, &bad).await;
    let md = md_where(&client, &ns, "ref", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    let created = condition(&md, RESOURCE_CREATED).unwrap();
    assert_eq!(
        (created.status.as_str(), created.reason.as_str()),
        ("False", reasons::RESOURCE_REJECTED)
    );
    assert!(
        created
            .message
            .contains("set the port with provider.overrides.port, not as an engine argument"),
        "{}",
        created.message
    );
    assert!(
        !event_where(&client, &ns, "ref", reasons::RESOURCE_REJECTED)
            .await
            .is_empty()
    );

    // The user fixes the spec: the next reconcile applies it.
    deploy(&client, &llama("ref", &ns, provider).build()).await;
    chatserver_where(&client, &ns, "ref", "the ChatServer", Option::is_some).await;
    md_where(&client, &ns, "ref", "Deploying", |m| {
        phase(m) == Some(Phase::Deploying)
    })
    .await;
}

#[tokio::test]
async fn spec_fields_the_provider_ignores_are_named_in_its_condition_and_an_event() {
    let provider = "chat-ignored";
    let (client, ns, _running) = setup(provider).await;
    let md = llama("ign", &ns, provider)
        .spec(|s| {
            s.node_selector = Some([("pool".to_string(), "cpu".to_string())].into());
        })
        .build();
    deploy(&client, &md).await;
    let md = md_where(
        &client,
        &ns,
        "ign",
        "compatible, with ignored fields",
        |m| condition(m, PROVIDER_COMPATIBLE).is_some_and(|c| c.status == "True"),
    )
    .await;
    let compatible = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(compatible.reason, reasons::COMPATIBLE_WITH_IGNORED_FIELDS);
    assert!(
        compatible
            .message
            .ends_with("chat-ignored ignores spec.nodeSelector"),
        "{}",
        compatible.message
    );
    assert_eq!(
        event_where(&client, &ns, "ign", reasons::UNSUPPORTED_FIELD).await,
        ["spec.nodeSelector is ignored: a ChatServer has no node selector"]
    );
    chatserver_where(&client, &ns, "ign", "the ChatServer", Option::is_some).await;
}

#[tokio::test]
async fn a_model_deployment_moved_to_another_provider_is_released_by_the_first() {
    // The provider that is no longer selected stops seeing the ModelDeployment; it must
    // still delete what it made and drop its finalizer, or deletion hangs forever.
    let (client, ns, _first) = setup("chat-first").await;
    let _second = testing::spawn(
        ChatServerProvider {
            name: "chat-second".into(),
        },
        client.clone(),
        test_options(),
    );
    deploy(&client, &llama("moved", &ns, "chat-first").build()).await;
    chatserver_where(&client, &ns, "moved", "the first provider's server", |s| {
        s.as_ref().is_some_and(|s| {
            s.labels().get(labels::PROVIDER).map(String::as_str) == Some("chat-first")
        })
    })
    .await;
    md_where(&client, &ns, "moved", "the first finalizer", |m| {
        m.finalizers()
            .contains(&"kubeairunway.ai/chat-first-provider".to_string())
    })
    .await;

    // The user names the other provider.
    deploy(&client, &llama("moved", &ns, "chat-second").build()).await;
    let md = md_where(&client, &ns, "moved", "only the second finalizer", |m| {
        m.finalizers() == ["kubeairunway.ai/chat-second-provider"]
    })
    .await;
    assert_eq!(md.selected_provider(), Some("chat-second"));
    chatserver_where(&client, &ns, "moved", "the second provider's server", |s| {
        s.as_ref().is_some_and(|s| {
            s.labels().get(labels::PROVIDER).map(String::as_str) == Some("chat-second")
                && s.metadata.deletion_timestamp.is_none()
        })
    })
    .await;
    assert!(
        event_where(&client, &ns, "moved", "Released")
            .await
            .iter()
            .any(|m| m.contains("chat-first released this ModelDeployment")),
    );

    // Deletion no longer waits for the first provider.
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    mds.delete("moved", &DeleteParams::default()).await.unwrap();
    wait_for(
        WAIT,
        "the ModelDeployment to go",
        || mds.get_opt("moved"),
        Option::is_none,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn an_object_of_the_rendered_name_owned_by_no_model_deployment_is_never_taken_over() {
    let provider = "chat-foreign";
    let (client, ns, _running) = setup(provider).await;
    // Someone else's ChatServer under the name the provider would render.
    let servers: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &chatservers());
    let theirs: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.kubeairunway.ai/v1", "kind": "ChatServer",
        "metadata": {"name": "taken", "namespace": ns},
        "spec": {"model": "theirs", "servedName": "theirs", "replicas": 1, "image": "theirs:1",
                 "port": 1234, "args": [], "podLabels": {}, "podAnnotations": {}},
    }))
    .unwrap();
    servers
        .create(&kube::api::PostParams::default(), &theirs)
        .await
        .unwrap();
    deploy(&client, &llama("taken", &ns, provider).build()).await;
    let md = md_where(&client, &ns, "taken", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    let created = condition(&md, RESOURCE_CREATED).unwrap();
    assert_eq!(created.reason, reasons::RESOURCE_CONFLICT);
    assert!(
        created
            .message
            .contains("ChatServer 'taken' already exists and is not owned by this ModelDeployment (it has no owner)"),
        "{}",
        created.message
    );
    let still = servers.get("taken").await.unwrap();
    assert_eq!(still.data["spec"]["model"], "theirs", "left alone");
    assert!(still.owner_references().is_empty());

    // Once it is gone, the provider creates its own.
    servers
        .delete("taken", &DeleteParams::default())
        .await
        .unwrap();
    chatserver_where(&client, &ns, "taken", "the provider's server", |s| {
        s.as_ref().is_some_and(|s| !s.owner_references().is_empty())
    })
    .await;
}

#[tokio::test]
async fn overrides_are_typed_or_merged_and_checked_and_wrong_types_fail() {
    let provider = "chat-overrides";
    let (client, ns, _running) = setup(provider).await;
    // `port` is ChatServer's typed key; `spec.replicas` is merged into the ChatServer.
    let md = llama("ov", &ns, provider)
        .overrides(json!({"port": 9000, "spec": {"replicas": 3}}))
        .build();
    deploy(&client, &md).await;
    chatserver_where(&client, &ns, "ov", "port 9000, 3 replicas", |s| {
        s.as_ref()
            .is_some_and(|s| s.data["spec"]["port"] == 9000 && s.data["spec"]["replicas"] == 3)
    })
    .await;

    // Keys the ChatServer CRD has not got are refused, each named; nothing is applied.
    let typo = llama("ov", &ns, provider)
        .overrides(json!({"port": 9000, "prot": 1, "nested": {"deep": true}}))
        .build();
    deploy(&client, &typo).await;
    let md = md_where(&client, &ns, "ov", "InvalidOverride", |m| {
        condition(m, PROVIDER_COMPATIBLE).is_some_and(|c| c.reason == "InvalidOverride")
    })
    .await;
    let refused = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert!(
        refused.message.starts_with(
            "overrides are not accepted by the installed ChatServer example.kubeairunway.ai/v1"
        ) && refused.message.ends_with(
            "provider.overrides.nested (no such field), provider.overrides.prot (no such field); nothing was applied"
        ),
        "{}",
        refused.message
    );
    let warnings = event_where(&client, &ns, "ov", "InvalidOverride").await;
    assert_eq!(warnings, std::slice::from_ref(&refused.message));

    let bad = llama("ov", &ns, provider)
        .overrides(json!({"port": "high"}))
        .build();
    deploy(&client, &bad).await;
    let md = md_where(&client, &ns, "ov", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    let compatible = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(
        (compatible.status.as_str(), compatible.reason.as_str()),
        ("False", "InvalidConfiguration")
    );
    assert!(
        compatible
            .message
            .starts_with("invalid override provider.overrides.port:"),
        "{}",
        compatible.message
    );
}

#[tokio::test]
async fn incompatible_specs_fail_with_the_providers_message() {
    let provider = "chat-incompatible";
    let (client, ns, _running) = setup(provider).await;
    deploy(
        &client,
        &llama("gpu", &ns, provider)
            .engine(EngineType::Vllm)
            .gpus(1)
            .build(),
    )
    .await;
    let md = md_where(&client, &ns, "gpu", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    // Refused by the runtime from ChatServer's registered capabilities (llama.cpp only),
    // naming the field, its value and what the provider serves.
    let refusal = "spec.engine.type is vllm, which provider chat-incompatible does not support: it serves the engines llamacpp";
    let c = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("False", "IncompatibleConfiguration", refusal)
    );
    assert_eq!(md.status.unwrap().message.as_deref(), Some(refusal));
    let servers: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &chatservers());
    assert!(servers.get_opt("gpu").await.unwrap().is_none());
}

#[tokio::test]
async fn two_providers_never_touch_each_others_deployments() {
    let (client, ns, _a) = setup("chat-a").await;
    let _b = testing::spawn(
        ChatServerProvider {
            name: "chat-b".into(),
        },
        client.clone(),
        test_options(),
    );
    deploy(&client, &llama("for-a", &ns, "chat-a").build()).await;
    deploy(&client, &llama("for-b", &ns, "chat-b").build()).await;
    let paused = llama("paused", &ns, "chat-a").build();
    let mut paused_md = paused.clone();
    paused_md.metadata.annotations =
        Some([(labels::RECONCILE_PAUSED.to_string(), "true".to_string())].into());
    deploy(&client, &paused_md).await;

    for (name, owner, other) in [("for-a", "chat-a", "chat-b"), ("for-b", "chat-b", "chat-a")] {
        let server = chatserver_where(&client, &ns, name, "its ChatServer", Option::is_some)
            .await
            .unwrap();
        assert_eq!(
            server.labels().get(labels::PROVIDER).map(String::as_str),
            Some(owner)
        );
        let md = md_where(&client, &ns, name, "its provider's status", |m| {
            condition(m, RESOURCE_CREATED).is_some()
        })
        .await;
        assert_eq!(
            md.finalizers(),
            [format!("kubeairunway.ai/{owner}-provider")]
        );
        let managers: Vec<String> = md
            .managed_fields()
            .iter()
            .filter_map(|f| f.manager.clone())
            .collect();
        assert!(
            managers.contains(&format!("{owner}-provider")),
            "{managers:?}"
        );
        assert!(
            !managers.contains(&format!("{other}-provider")),
            "{managers:?}"
        );
    }
    // The paused one is left alone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let servers: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &chatservers());
    assert!(servers.get_opt("paused").await.unwrap().is_none());
    let md: ModelDeployment = Api::namespaced(client.clone(), &ns)
        .get("paused")
        .await
        .unwrap();
    assert!(md.finalizers().is_empty());
}

#[tokio::test]
async fn with_leader_election_only_the_leader_reconciles_and_a_standby_takes_over() {
    use k8s_openapi::api::coordination::v1::Lease;
    let provider = "chat-leader";
    let (cluster, client) = testing::cluster().await.unwrap();
    testing::install_crds(&client, &[ChatServer::crd()])
        .await
        .unwrap();
    let ns = cluster.namespace(provider);
    let replica = |identity: &str| {
        let mut options = test_options();
        options.process.leader_elect = true;
        options.process.namespace.clone_from(&ns);
        options.process.pod_name = identity.to_string();
        // Long enough that a loaded machine never loses a renewal; a stopped leader
        // releases the Lease, so the takeover below does not wait for it.
        options.process.leader_elect_lease_duration = Duration::from_secs(15);
        options.process.leader_elect_renew_deadline = Duration::from_secs(10);
        options.process.leader_elect_retry_period = Duration::from_secs(1);
        testing::spawn(
            ChatServerProvider {
                name: provider.to_string(),
            },
            client.clone(),
            options,
        )
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder = |lease: &Lease| {
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default()
    };
    let first = replica("replica-1");
    let lease = wait_for(
        WAIT,
        "replica-1 to lead",
        || leases.get("chat-leader-provider"),
        |l: &Lease| holder(l) == "replica-1",
    )
    .await
    .unwrap();
    assert_eq!(holder(&lease), "replica-1");
    let _second = replica("replica-2");
    deploy(&client, &llama("one", &ns, provider).build()).await;
    chatserver_where(
        &client,
        &ns,
        "one",
        "the leader's ChatServer",
        Option::is_some,
    )
    .await;
    // The standby never became leader while the first one renewed.
    assert_eq!(
        holder(&leases.get("chat-leader-provider").await.unwrap()),
        "replica-1"
    );

    // The leader stops (and releases the Lease): the standby takes over and reconciles.
    first.stop().await.unwrap();
    wait_for(
        WAIT,
        "replica-2 to lead",
        || leases.get("chat-leader-provider"),
        |l: &Lease| holder(l) == "replica-2",
    )
    .await
    .unwrap();
    deploy(&client, &llama("two", &ns, provider).build()).await;
    chatserver_where(
        &client,
        &ns,
        "two",
        "the new leader's ChatServer",
        Option::is_some,
    )
    .await;
}

#[tokio::test]
async fn stale_upstream_status_is_reported() {
    let provider = "chat-stale";
    let (client, ns, _running) = setup(provider).await;
    deploy(&client, &llama("stuck", &ns, provider).build()).await;
    // Nobody writes the ChatServer's status: after the stale threshold (3 s in tests) the
    // condition says so; once the upstream moves and the deployment runs, it goes.
    let md = md_where(&client, &ns, "stuck", "StaleStatus", |m| {
        condition(m, STALE_STATUS).is_some()
    })
    .await;
    assert_eq!(condition(&md, STALE_STATUS).unwrap().status, "True");
    assert_eq!(phase(&md), Some(Phase::Deploying));
    testing::write_upstream_status(
        &client,
        &chatservers(),
        &ns,
        "stuck",
        json!({"phase": "Ready", "readyReplicas": 1}),
    )
    .await
    .unwrap();
    let md = md_where(&client, &ns, "stuck", "Running", |m| {
        phase(m) == Some(Phase::Running)
    })
    .await;
    assert!(condition(&md, STALE_STATUS).is_none());
}

/// An installed upstream CRD that lacks a field the provider renders: nothing is applied,
/// and `ProviderCompatible=False` lists the missing paths; installing a CRD that has the
/// field lets the provider go on by itself. Runs on a cluster of its own (it replaces the
/// ChatServer CRD).
#[tokio::test]
async fn unknown_upstream_schema_is_refused_with_the_missing_paths() {
    let mut narrow = serde_json::to_value(ChatServer::crd()).unwrap();
    let spec =
        &mut narrow["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    spec["properties"]
        .as_object_mut()
        .unwrap()
        .remove("podAnnotations");
    spec["required"]
        .as_array_mut()
        .unwrap()
        .retain(|r| r != "podAnnotations");
    let narrow: CustomResourceDefinition = serde_json::from_value(narrow).unwrap();
    let (_cluster, client) = testing::private_cluster("schema", &[narrow]).await.unwrap();

    let provider = "chat-schema";
    let _running = testing::spawn(
        ChatServerProvider {
            name: provider.into(),
        },
        client.clone(),
        test_options(),
    );
    deploy(&client, &llama("narrow", "default", provider).build()).await;
    let md = md_where(&client, "default", "narrow", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    let c = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "UpstreamSchemaMismatch")
    );
    assert!(
        c.message.contains("has no field spec.podAnnotations"),
        "{}",
        c.message
    );
    let servers: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &chatservers());
    assert!(
        servers.get_opt("narrow").await.unwrap().is_none(),
        "nothing applied"
    );

    testing::install_crds(&client, &[ChatServer::crd()])
        .await
        .unwrap();
    let md = md_where(&client, "default", "narrow", "compatible again", |m| {
        condition(m, PROVIDER_COMPATIBLE).is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(phase(&md), Some(Phase::Deploying));
    assert!(servers.get_opt("narrow").await.unwrap().is_some());
}

async fn chatserver_where(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    ready: impl Fn(&Option<DynamicObject>) -> bool,
) -> Option<DynamicObject> {
    testing::object_where(client, &chatservers(), ns, name, what, ready).await
}

/// Create the ModelDeployment as a user would and select its named provider as core would.
async fn deploy(client: &Client, md: &ModelDeployment) -> ModelDeployment {
    testing::deploy(client, md, md.spec.provider_name().unwrap())
        .await
        .unwrap()
}

/// What `kubectl scale`, an HPA and KEDA use: the scale subresource of ModelDeployment
/// (spec.scaling.replicas, the ready replicas, the serving pods' selector the provider
/// writes), and `status.url` with its printer column, as the real API server serves them.
#[tokio::test]
async fn the_scale_subresource_and_status_url_are_served_by_the_api_server() {
    let provider = "chat-scale";
    let (client, ns, running) = setup(provider).await;
    deploy(&client, &llama("scaled", &ns, provider).build()).await;
    chatserver_where(&client, &ns, "scaled", "the ChatServer", Option::is_some).await;
    testing::write_upstream_status(
        &client,
        &chatservers(),
        &ns,
        "scaled",
        json!({"phase": "Ready", "readyReplicas": 1}),
    )
    .await
    .unwrap();
    let md = md_where(&client, &ns, "scaled", "Running with a URL", |m| {
        phase(m) == Some(Phase::Running) && m.status.as_ref().is_some_and(|s| s.url.is_some())
    })
    .await;
    let status = md.status.unwrap();
    assert_eq!(
        status.url.as_deref(),
        Some(format!("http://scaled.{ns}.svc.cluster.local:8080/v1").as_str())
    );
    let selector = format!("{}=scaled", labels::MODEL_DEPLOYMENT);
    assert_eq!(status.selector.as_deref(), Some(selector.as_str()));

    // GET .../scale: the paths of the CRD's scale subresource, resolved by the server.
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    let scale = mds.get_scale("scaled").await.unwrap();
    assert_eq!(scale.spec.as_ref().unwrap().replicas, Some(1));
    let scale_status = scale.status.as_ref().unwrap();
    assert_eq!(scale_status.replicas, 1);
    assert_eq!(scale_status.selector.as_deref(), Some(selector.as_str()));

    // PATCH .../scale as `kubectl scale --replicas=3` does: spec.scaling.replicas changes,
    // and the provider renders the new count.
    mds.patch_scale(
        "scaled",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    assert_eq!(mds.get("scaled").await.unwrap().spec.scaling.replicas, 3);
    chatserver_where(&client, &ns, "scaled", "replicas 3", |s| {
        s.as_ref().is_some_and(|s| s.data["spec"]["replicas"] == 3)
    })
    .await;
    // The CRD's own validation holds through the subresource.
    let refused = mds
        .patch_scale(
            "scaled",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": -1}})),
        )
        .await;
    assert!(
        refused.is_err(),
        "negative replicas must be refused: {refused:?}"
    );

    // The URL column, as `kubectl get -o wide` asks for it (server-side printing).
    let request = http::Request::get(format!(
        "/apis/kubeairunway.ai/v1alpha1/namespaces/{ns}/modeldeployments/scaled"
    ))
    .header(
        "Accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .body(Vec::new())
    .unwrap();
    let table: serde_json::Value = client.request(request).await.unwrap();
    let columns = table["columnDefinitions"].as_array().unwrap();
    let url_column = columns
        .iter()
        .position(|c| c["name"] == "URL")
        .unwrap_or_else(|| panic!("no URL column: {columns:?}"));
    assert_eq!(columns[url_column]["priority"], 1, "shown with -o wide");
    assert_eq!(
        table["rows"][0]["cells"][url_column],
        format!("http://scaled.{ns}.svc.cluster.local:8080/v1")
    );
    running.stop().await.unwrap();
}
