//! The KAITO provider end to end on the real API server, once per real Workspace CRD
//! version (v0.12 and v0.10), each on a private cluster with exactly one provider
//! instance: every rendered Workspace is accepted by the real schema (strict field
//! validation) and by KAITO's webhook, which the API server calls
//! (`kubeairunway_e2e::operators::kaito`); a refusal of that webhook comes back as
//! `ResourceRejected` in its words; a status fixture walks KAITO's real states and the
//! ModelDeployment follows; deletion removes the Workspace. Also the chart: lint,
//! template, RBAC.

use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_e2e::operators::kaito::{
    self as standin, Cluster, InferenceSetController, NodeProvisioner, inference_set_resource,
    workspace_resource,
};
use kubeairunway_e2e::{fixtures_dir, helm, read_crd};
use kubeairunway_kaito_provider::{KaitoProvider, NodeProvisioning};
use kubeairunway_sdk::api::{EngineType, ModelDeployment, Phase};
use kubeairunway_sdk::conditions::{PROVIDER_COMPATIBLE, READY, RESOURCE_CREATED, reasons};
use kubeairunway_sdk::render::Role;
use kubeairunway_sdk::testing::{
    self, ModelDeploymentBuilder, condition, md_where, message, phase, test_options, wait_for,
};
use kubeairunway_sdk::{Provider, UpstreamApi, labels};
use kubeairunway_testcluster::TestCluster;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// The provider as a cluster with KAITO's node auto-provisioning (its default) runs it.
fn nap_provider(inference_set: bool) -> KaitoProvider {
    KaitoProvider {
        inference_set,
        nodes: NodeProvisioning::auto("Standard_NC6s_v3", "Standard_D8s_v3"),
    }
}

fn workspaces() -> ApiResource {
    workspace_resource()
}

/// KAITO as the provider's cluster runs it: node auto-provisioning, its model catalog.
fn kaito() -> Cluster {
    Cluster::new(NodeProvisioner::AzureGpu).with_catalog()
}

/// A private cluster with the platform's CRDs and one real Workspace CRD.
async fn cluster(tag: &str, crd_file: &str) -> (TestCluster, Client, UpstreamApi) {
    let crd = read_crd(&fixtures_dir().join("crds/upstream").join(crd_file)).unwrap();
    let api = UpstreamApi::detect(&crd, &KaitoProvider::default().upstream()).unwrap();
    let (cluster, client) = testing::private_cluster(&format!("kaito-{tag}"), &[crd])
        .await
        .unwrap();
    // The namespaces the tests write into directly (deploy creates its own).
    for ns in ["schema", "iset"] {
        cluster.ensure_namespace(ns);
    }
    (cluster, client, api)
}

fn cpu_llamacpp(name: &str, ns: &str) -> ModelDeploymentBuilder {
    ModelDeploymentBuilder::new(name)
        .namespace(ns)
        .model("google/gemma-3-1b-it-qat-q8_0-gguf")
        .engine(EngineType::Llamacpp)
        .gpus(0)
        .image("ghcr.io/sozercan/llama-cpp-runner:latest")
        .provider("kaito")
        .spec(|s| {
            let r = s.resources.get_or_insert_with(Default::default);
            r.cpu = Some("8".into());
            r.memory = Some("16Gi".into());
        })
}

fn gpu_vllm(name: &str, ns: &str) -> ModelDeploymentBuilder {
    ModelDeploymentBuilder::new(name)
        .namespace(ns)
        .model("Qwen/Qwen2.5-0.5B-Instruct")
        .engine(EngineType::Vllm)
        .gpus(1)
        .provider("kaito")
}

/// Every shape of rendered object: the Workspace is accepted by the installed schema
/// with strict field validation (unknown fields refused, not pruned), by a dry run, before
/// KAITO's webhook is served (it would judge the bring-your-own renderings by a KAITO that
/// auto-provisions nodes, and look for ConfigMaps a dry run does not create).
async fn rendered_objects_are_accepted(client: &Client, api: &UpstreamApi) {
    let providers = [
        KaitoProvider {
            inference_set: false,
            nodes: NodeProvisioning::Byo,
        },
        nap_provider(false),
    ];
    let full_llama = cpu_llamacpp("llama-full", "schema").spec(|s| {
        *s = serde_json::from_value(json!({
            "model": {"id": "google/gemma-3-1b-it-qat-q8_0-gguf"},
            "engine": {"type": "llamacpp", "args": {"threads": "4"}},
            "image": "ghcr.io/sozercan/llama-cpp-runner:latest",
            "resources": {"gpu": {"count": 1}, "cpu": "4", "memory": "8Gi"},
            "env": [{"name": "A", "value": "1"}],
            "secrets": {"huggingFaceToken": "hf"},
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
            "podTemplate": {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "n"}}},
        }))
        .unwrap();
    });
    let vllm_options = gpu_vllm("vllm-options", "schema").spec(|s| {
        s.engine.context_length = Some(8192);
        s.engine.trust_remote_code = true;
        s.engine.args = Some([("gpu-memory-utilization".to_string(), "0.9".to_string())].into());
        s.secrets = Some(serde_json::from_value(json!({"huggingFaceToken": "hf"})).unwrap());
        s.node_selector = Some([("pool".to_string(), "gpu".to_string())].into());
    });
    let mds = [
        cpu_llamacpp("llama-cpu", "schema").build(),
        full_llama.build(),
        gpu_vllm("vllm-plain", "schema").build(),
        vllm_options.build(),
    ];
    let ws: Api<DynamicObject> = Api::namespaced_with(client.clone(), "schema", &workspaces());
    let pp = PatchParams::apply("schema-check")
        .validation_strict()
        .dry_run();
    let mut checked = 0;
    for provider in &providers {
        for md in &mds {
            let mut md = md.clone();
            md.metadata.uid = Some("00000000-0000-0000-0000-000000000001".into());
            let rendered = provider.render(&md, api).unwrap();
            for (i, mut object) in rendered.objects.into_iter().enumerate() {
                let role = if i == 0 {
                    let kind = object.types.as_ref().unwrap().kind.clone();
                    Role::Primary {
                        immutable_fields: provider.immutable_fields(&kind),
                    }
                } else {
                    Role::Supporting
                };
                kubeairunway_sdk::render::finish(&mut object, &md, "kaito", role);
                let value = serde_json::to_value(&object).unwrap();
                if !api.is_upstream_object(&value) {
                    assert_eq!(value["kind"], "ConfigMap");
                    continue;
                }
                assert!(api.missing_paths(&value).is_empty(), "{}", md.name_any());
                ws.patch(&object.name_any(), &pp, &Patch::Apply(&object))
                    .await
                    .unwrap_or_else(|e| panic!("{} refused: {e}", md.name_any()));
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 8);
}

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Play KAITO: write the Workspace status, then wait until the ModelDeployment shows
/// `want` with `message`.
async fn kaito_writes(
    client: &Client,
    ns: &str,
    name: &str,
    status: Value,
    want: Phase,
    message_is: &str,
) -> ModelDeployment {
    testing::write_upstream_status(client, &workspaces(), ns, name, status)
        .await
        .unwrap();
    md_where(client, ns, name, &format!("{want} / {message_is}"), |m| {
        phase(m) == Some(want) && message(m) == message_is
    })
    .await
}

async fn walk(tag: &str, crd_file: &str) {
    let (cluster, client, api) = cluster(tag, crd_file).await;
    rendered_objects_are_accepted(&client, &api).await;
    let _webhooks = standin::serve_webhooks(&cluster, &client, kaito(), false)
        .await
        .unwrap();
    a_missing_config_map_is_refused(&client).await;
    let running = testing::spawn(nap_provider(false), client.clone(), test_options());

    // Registration.
    let ipc = testing::registered(&client, "kaito").await;
    let status = ipc.status.unwrap();
    assert_eq!(
        status.upstream_crd_version.as_deref(),
        Some("kaito.sh/v1beta1")
    );
    assert_eq!(
        status.upstream_schema_hash.as_deref(),
        Some(api.schema_hash.as_str())
    );

    // The CPU llama.cpp sample (config/samples/cpu-llamacpp.yaml): a Workspace, owned,
    // labelled, valid.
    let ns = "llama";
    let md = deploy(
        &client,
        &cpu_llamacpp("gemma-cpu", ns)
            .label("kubeairunway.ai/team", "a")
            .build(),
    )
    .await;
    let ws_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &workspaces());
    let ws = wait_for(
        WAIT,
        "the Workspace",
        || ws_api.get_opt("gemma-cpu"),
        Option::is_some,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(ws.owner_references()[0].uid, md.uid().unwrap());
    assert_eq!(
        ws.labels().get(labels::PROVIDER).map(String::as_str),
        Some("kaito")
    );
    assert_eq!(
        ws.labels().get("kubeairunway.ai/team").map(String::as_str),
        Some("a")
    );
    assert!(ws.data.get("spec").is_none(), "Workspace has no spec");
    assert_eq!(
        ws.data["resource"]["labelSelector"]["matchLabels"]["kubernetes.io/os"],
        "linux"
    );
    let template = &ws.data["inference"]["template"];
    assert_eq!(
        template["metadata"]["labels"][labels::MODEL_DEPLOYMENT],
        "gemma-cpu"
    );
    assert_eq!(
        template["spec"]["containers"][0]["ports"][0]["containerPort"],
        5000
    );

    let md = md_where(&client, ns, "gemma-cpu", "Deploying", |m| {
        phase(m) == Some(Phase::Deploying)
    })
    .await;
    assert_eq!(condition(&md, RESOURCE_CREATED).unwrap().status, "True");
    assert_eq!(condition(&md, PROVIDER_COMPATIBLE).unwrap().status, "True");
    let status = md.status.as_ref().unwrap();
    assert_eq!(
        status.provider.as_ref().unwrap().resource_kind.as_deref(),
        Some("Workspace")
    );

    // KAITO's real states, in the order a Workspace goes through them.
    kaito_writes(
        &client,
        ns,
        "gemma-cpu",
        json!({"state": "Pending"}),
        Phase::Deploying,
        "KAITO Workspace is Pending",
    )
    .await;
    let md = kaito_writes(
        &client,
        ns,
        "gemma-cpu",
        standin::workspace_pending(),
        Phase::Deploying,
        "KAITO Workspace is Pending: Inference workload is not ready",
    )
    .await;
    assert_eq!(condition(&md, READY).unwrap().status, "False");
    kaito_writes(
        &client,
        ns,
        "gemma-cpu",
        json!({"state": "NotReady", "conditions": [
            cond("ResourceReady", "True", "workspaceResourceStatusSuccess", "resource is ready"),
            cond("InferenceReady", "False", "InferenceNotReady", "inference is not ready: 0/1 pods"),
            cond("WorkspaceSucceeded", "False", "workspacePending", "workspace is pending"),
        ]}),
        Phase::Deploying,
        "KAITO Workspace is NotReady: inference is not ready: 0/1 pods",
    )
    .await;
    let md = kaito_writes(
        &client,
        ns,
        "gemma-cpu",
        json!({"state": "NotReady", "conditions": [
            cond("ResourceReady", "True", "workspaceResourceStatusSuccess", "resource is ready"),
            cond("InferenceReady", "False", "ImagePullError", "Back-off pulling image \"ghcr.io/sozercan/llama-cpp-runner:latest\""),
            cond("WorkspaceSucceeded", "False", "workspacePending", "workspace is pending"),
        ]}),
        Phase::Failed,
        "Back-off pulling image \"ghcr.io/sozercan/llama-cpp-runner:latest\"",
    )
    .await;
    let ready = condition(&md, READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "ImagePullError"),
        "KAITO's own reason for the failure"
    );
    let md = kaito_writes(
        &client,
        ns,
        "gemma-cpu",
        standin::workspace_ready(),
        Phase::Running,
        "KAITO Workspace is ready",
    )
    .await;
    let status = md.status.as_ref().unwrap();
    let endpoint = status.endpoint.as_ref().unwrap();
    assert_eq!(
        (endpoint.service.as_deref(), endpoint.port),
        (Some("gemma-cpu"), Some(80))
    );
    let replicas = status.replicas.as_ref().unwrap();
    assert_eq!((replicas.desired, replicas.ready), (Some(1), Some(1)));
    assert_eq!(condition(&md, READY).unwrap().status, "True");

    // vLLM as a KAITO preset named after the model id, with a context length and a token
    // Secret: its inference ConfigMap is applied before the Workspace, which KAITO's
    // webhook (called by the API server) refuses while the ConfigMap does not exist.
    vllm_walk(&client, tag).await;
    // A Workspace KAITO's webhook refuses is Failed with the webhook's words, until the
    // spec changes to one it admits.
    refused_by_the_webhook(&client).await;

    // What KAITO cannot serve is refused with the exact messages, and nothing is created.
    for (name, builder, msg) in [
        (
            "sglang",
            gpu_vllm("sglang", "refused").engine(EngineType::Sglang),
            "spec.engine.type is sglang, which provider kaito does not support: it serves the engines vllm, llamacpp".to_string(),
        ),
        (
            "three",
            gpu_vllm("three", "refused").replicas(3),
            String::new(),
        ),
    ] {
        deploy(&client, &builder.build()).await;
        let md = md_where(&client, "refused", name, "Failed", |m| {
            phase(m) == Some(Phase::Failed)
        })
        .await;
        let c = condition(&md, PROVIDER_COMPATIBLE).unwrap();
        assert_eq!(c.status, "False");
        if msg.is_empty() {
            assert!(c.message.contains("InferenceSet"), "{}", c.message);
        } else {
            assert_eq!(c.message, msg);
        }
        let refused: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), "refused", &workspaces());
        assert!(refused.get_opt(name).await.unwrap().is_none());
    }

    // Deletion removes the Workspace, then the ModelDeployment.
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), ns);
    mds.delete("gemma-cpu", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        WAIT,
        "the Workspace to go",
        || ws_api.get_opt("gemma-cpu"),
        Option::is_none,
    )
    .await
    .unwrap();
    wait_for(
        WAIT,
        "the ModelDeployment to go",
        || mds.get_opt("gemma-cpu"),
        Option::is_none,
    )
    .await
    .unwrap();
    running.stop().await.unwrap();
}

/// KAITO's Workspace webhook is live at the API server: a Workspace naming an inference
/// ConfigMap that does not exist is refused in KAITO's words
/// (api/v1beta1/inference_config_validation.go:56-70@v0.12.0), so a Workspace the
/// provider applies before its ConfigMap could not be created.
async fn a_missing_config_map_is_refused(client: &Client) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "schema", &workspaces());
    let ws: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kaito.sh/v1beta1", "kind": "Workspace",
        "metadata": {"name": "no-config", "annotations": {"kaito.sh/runtime": "vllm"}},
        "resource": {"instanceType": "Standard_NC6s_v3",
                     "labelSelector": {"matchLabels": {"kubernetes.io/os": "linux"}}},
        "inference": {"preset": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "config": "missing-config"},
    }))
    .unwrap();
    let err = api
        .create(&kube::api::PostParams::default(), &ws)
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(
        status.message,
        "admission webhook \"validation.workspace.kaito.sh\" denied the request: validation \
         failed: ConfigMap 'missing-config' specified in 'config' not found in namespace \
         'schema': config"
    );
}

fn with_token(builder: ModelDeploymentBuilder, secret: &str) -> ModelDeploymentBuilder {
    let secret = secret.to_string();
    builder.spec(move |s| {
        s.secrets = Some(serde_json::from_value(json!({"huggingFaceToken": secret})).unwrap());
    })
}

/// The vLLM part of the walk: the ConfigMap-before-Workspace order through KAITO's real
/// webhook, the Workspace, and a new token Secret on a running deployment, which
/// changes `inference.preset` (immutable to KAITO's webhook,
/// workspace_validation.go:895-897@v0.12.0): a new Workspace (a new UID), not a patch the
/// API server refuses.
async fn vllm_walk(client: &Client, tag: &str) {
    let ns = "vllm";
    let qwen = |secret: &str| {
        with_token(gpu_vllm("qwen", ns), secret)
            .spec(|s| s.engine.context_length = Some(8192))
            .build()
    };
    let vllm = deploy(client, &qwen("hf-token-a")).await;
    let md = md_where(client, ns, "qwen", "the Workspace applied", |m| {
        condition(m, RESOURCE_CREATED).is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(phase(&md), Some(Phase::Deploying));
    let vllm_ws: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &workspaces());
    let ws = wait_for(
        WAIT,
        "the vLLM Workspace",
        || vllm_ws.get_opt("qwen"),
        Option::is_some,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        ws.data["inference"]["preset"]["name"],
        "Qwen/Qwen2.5-0.5B-Instruct"
    );
    assert_eq!(
        ws.data["inference"]["preset"]["presetOptions"]["modelAccessSecret"],
        "hf-token-a"
    );
    assert_eq!(ws.data["inference"]["config"], "qwen-inference-config");
    assert_eq!(
        ws.annotations().get("kaito.sh/runtime").map(String::as_str),
        Some("vllm")
    );
    assert_eq!(
        vllm.uid(),
        ws.owner_references().first().map(|o| o.uid.clone())
    );
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), ns);
    let config = config_maps.get("qwen-inference-config").await.unwrap();
    assert!(
        config.data.unwrap()["inference_config.yaml"].contains("max-model-len: 8192"),
        "the context length KAITO's webhook checked"
    );
    let first_uid = ws.uid().unwrap();
    kaito_writes(
        client,
        ns,
        "qwen",
        standin::workspace_ready(),
        Phase::Running,
        "KAITO Workspace is ready",
    )
    .await;

    // A new token Secret on the running deployment.
    deploy(client, &qwen("hf-token-b")).await;
    let ws = wait_for(
        WAIT,
        "a new Workspace with the new token",
        || vllm_ws.get_opt("qwen"),
        |w: &Option<DynamicObject>| {
            w.as_ref()
                .is_some_and(|w| w.uid().as_deref() != Some(first_uid.as_str()))
        },
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        ws.data["inference"]["preset"]["presetOptions"]["modelAccessSecret"],
        "hf-token-b"
    );
    let md = md_where(client, ns, "qwen", "the new Workspace applied", |m| {
        condition(m, RESOURCE_CREATED).is_some_and(|c| c.status == "True")
            && message(m) != "KAITO Workspace is ready"
    })
    .await;
    assert_eq!(phase(&md), Some(Phase::Deploying), "{}", message(&md));
    kaito_writes(
        client,
        ns,
        "qwen",
        standin::workspace_ready(),
        Phase::Running,
        "KAITO Workspace is ready",
    )
    .await;

    // KAITO v0.12's post-load benchmark, failed for good, holds the Workspace NotReady.
    if tag == "v012" {
        let error = "pod vllm/qwen-0: no KAITO_BENCHMARK_RESULT line found in pod logs";
        let md = kaito_writes(
            client,
            ns,
            "qwen",
            standin::workspace_benchmark_failed(error),
            Phase::Failed,
            &format!(
                "KAITO's post-load benchmark failed, so KAITO holds the Workspace NotReady \
                 (its inference server is up): {error}"
            ),
        )
        .await;
        assert_eq!(
            md.status
                .as_ref()
                .unwrap()
                .endpoint
                .as_ref()
                .unwrap()
                .service
                .as_deref(),
            Some("qwen")
        );
    }
}

/// A Workspace KAITO's webhook refuses: `microsoft/phi-4` with a context length above
/// its catalog token limit (inference_config_validation.go:88-112@v0.12.0). The apply is
/// refused at the API server; the ModelDeployment is Failed, `ResourceRejected`, with
/// KAITO's words; nothing is created but the ConfigMap; a spec within the limit is
/// applied at once (a spec change retries).
async fn refused_by_the_webhook(client: &Client) {
    let ns = "too-long";
    let phi = |context_length: i32| {
        ModelDeploymentBuilder::new("phi")
            .namespace(ns)
            .model(standin::PHI_4)
            .engine(EngineType::Vllm)
            .gpus(1)
            .provider("kaito")
            .spec(move |s| s.engine.context_length = Some(context_length))
            .build()
    };
    deploy(client, &phi(32768)).await;
    let md = md_where(client, ns, "phi", "Failed", |m| {
        phase(m) == Some(Phase::Failed)
    })
    .await;
    let expected = "the API server refused Workspace 'phi': admission webhook \
        \"validation.workspace.kaito.sh\" denied the request: validation failed: invalid value: \
        max-model-len 32768 exceeds model's maximum supported context window 16384 \
        (ModelTokenLimit): max-model-len";
    assert_eq!(message(&md), expected);
    for type_ in [RESOURCE_CREATED, READY] {
        let c = condition(&md, type_).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", reasons::RESOURCE_REJECTED, expected),
            "{type_}"
        );
    }
    let ws: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &workspaces());
    assert!(ws.get_opt("phi").await.unwrap().is_none());

    deploy(client, &phi(16384)).await;
    wait_for(WAIT, "the Workspace", || ws.get_opt("phi"), Option::is_some)
        .await
        .unwrap();
    let md = md_where(client, ns, "phi", "Deploying", |m| {
        phase(m) == Some(Phase::Deploying)
    })
    .await;
    assert_eq!(condition(&md, RESOURCE_CREATED).unwrap().status, "True");
}

#[tokio::test]
async fn kaito_v0_12_workspace_end_to_end() {
    Box::pin(walk("v012", "kaito.sh_workspaces.yaml")).await;
}

#[tokio::test]
async fn kaito_v0_10_workspace_end_to_end() {
    Box::pin(walk("v010", "kaito.sh_workspaces.v0.10.0.yaml")).await;
}

fn inference_sets() -> ApiResource {
    inference_set_resource()
}

/// Replicas > 1 with KAITO's real InferenceSet CRD installed (beside the v0.12 Workspace
/// CRD): an InferenceSet is created (not `resource.count`), accepted by the real schema
/// and KAITO's webhooks, its Workspaces created by KAITO's controller (played) through
/// the Workspace webhook, its ready count followed, and deleted with the ModelDeployment.
#[tokio::test]
async fn kaito_inference_set_for_replicas() {
    let (cluster, client, api) = cluster("iset", "kaito.sh_workspaces.yaml").await;
    let iset_crd =
        read_crd(&fixtures_dir().join("crds/upstream/kaito.sh_inferencesets.yaml")).unwrap();
    testing::install_crds(&client, &[iset_crd]).await.unwrap();
    let provider = nap_provider(true);
    let _webhooks = standin::serve_webhooks(&cluster, &client, kaito(), true)
        .await
        .unwrap();
    let controller = InferenceSetController::spawn(client.clone(), kaito());

    // Strict dry runs of every shape against the real InferenceSet schema and webhook.
    let isets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "iset", &inference_sets());
    let strict = PatchParams::apply("schema-check")
        .validation_strict()
        .dry_run();
    for md in [
        gpu_vllm("vllm3", "iset").replicas(3).build(),
        cpu_llamacpp("llama2", "iset").replicas(2).build(),
    ] {
        let mut md = md;
        md.metadata.uid = Some("00000000-0000-0000-0000-000000000002".into());
        let mut object = provider.render(&md, &api).unwrap().objects.remove(0);
        let role = Role::Primary {
            immutable_fields: provider.immutable_fields("InferenceSet"),
        };
        kubeairunway_sdk::render::finish(&mut object, &md, "kaito", role);
        assert_eq!(object.types.as_ref().unwrap().kind, "InferenceSet");
        isets
            .patch(&object.name_any(), &strict, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("{} refused: {e}", md.name_any()));
    }

    let running = testing::spawn(provider, client.clone(), test_options());
    deploy(&client, &gpu_vllm("qwen3", "iset").replicas(3).build()).await;
    let iset = wait_for(
        WAIT,
        "the InferenceSet",
        || isets.get_opt("qwen3"),
        Option::is_some,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(iset.data["spec"]["replicas"], 3);
    assert_eq!(
        iset.data["spec"]["template"]["inference"]["preset"]["name"],
        "Qwen/Qwen2.5-0.5B-Instruct"
    );
    let ws: Api<DynamicObject> = Api::namespaced_with(client.clone(), "iset", &workspaces());
    assert!(
        ws.get_opt("qwen3").await.unwrap().is_none(),
        "no Workspace with resource.count"
    );
    // KAITO's controller creates the set's Workspaces, which its webhook admits (their
    // inference ConfigMap exists).
    let of_the_set = kube::api::ListParams::default()
        .labels(&format!("{}=qwen3", standin::CREATED_BY_INFERENCE_SET));
    let children = wait_for(
        WAIT,
        "three Workspaces of the set",
        || ws.list(&of_the_set),
        |l: &kube::api::ObjectList<DynamicObject>| l.items.len() == 3,
    )
    .await
    .unwrap();
    assert_eq!(
        children.items[0].data["inference"]["config"],
        "qwen3-inference-config"
    );
    assert_eq!(controller.problems(), Vec::<String>::new());

    // KAITO's InferenceSet controller reports ready Workspaces; the runtime polls it.
    let slow = Duration::from_secs(60);
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), "iset");
    testing::write_upstream_status(
        &client,
        &inference_sets(),
        "iset",
        "qwen3",
        standin::inference_set_status(3, 1, None),
    )
    .await
    .unwrap();
    let md = wait_for(
        slow,
        "1/3 ready",
        || mds.get("qwen3"),
        |m: &ModelDeployment| {
            m.status
                .as_ref()
                .and_then(|s| s.replicas.as_ref())
                .and_then(|r| r.ready)
                == Some(1)
        },
    )
    .await
    .unwrap();
    assert_eq!(phase(&md), Some(Phase::Deploying));
    assert_eq!(
        message(&md),
        "KAITO InferenceSet: inferenceset is not ready, 1/3 replicas are ready"
    );
    testing::write_upstream_status(
        &client,
        &inference_sets(),
        "iset",
        "qwen3",
        standin::inference_set_status(3, 3, None),
    )
    .await
    .unwrap();
    let md = wait_for(
        slow,
        "Running",
        || mds.get("qwen3"),
        |m: &ModelDeployment| phase(m) == Some(Phase::Running),
    )
    .await
    .unwrap();
    let replicas = md.status.as_ref().unwrap().replicas.as_ref().unwrap();
    assert_eq!((replicas.desired, replicas.ready), (Some(3), Some(3)));
    let endpoint = md.status.as_ref().unwrap().endpoint.as_ref().unwrap();
    assert_eq!(
        (endpoint.service.as_deref(), endpoint.port),
        (Some("qwen3-iset"), Some(80))
    );
    // A failed InferenceSet is Failed with KAITO's own message.
    testing::write_upstream_status(
        &client,
        &inference_sets(),
        "iset",
        "qwen3",
        standin::inference_set_status(3, 3, Some("failed to create OCIRepository: forbidden")),
    )
    .await
    .unwrap();
    let md = wait_for(
        slow,
        "Failed",
        || mds.get("qwen3"),
        |m: &ModelDeployment| phase(m) == Some(Phase::Failed),
    )
    .await
    .unwrap();
    assert_eq!(message(&md), "failed to create OCIRepository: forbidden");
    assert_eq!(
        md.status
            .as_ref()
            .unwrap()
            .provider
            .as_ref()
            .unwrap()
            .resource_kind
            .as_deref(),
        Some("InferenceSet")
    );

    mds.delete("qwen3", &DeleteParams::default()).await.unwrap();
    wait_for(
        WAIT,
        "the InferenceSet to go",
        || isets.get_opt("qwen3"),
        Option::is_none,
    )
    .await
    .unwrap();

    // Scaling a one-replica Workspace deployment out moves it to an InferenceSet, and the
    // Workspace is pruned; scaling back in does the reverse.
    deploy(&client, &gpu_vllm("scale", "iset").build()).await;
    wait_for(
        WAIT,
        "the Workspace",
        || ws.get_opt("scale"),
        Option::is_some,
    )
    .await
    .unwrap();
    deploy(&client, &gpu_vllm("scale", "iset").replicas(2).build()).await;
    wait_for(
        WAIT,
        "the InferenceSet",
        || isets.get_opt("scale"),
        Option::is_some,
    )
    .await
    .unwrap();
    wait_for(
        WAIT,
        "the Workspace to be pruned",
        || ws.get_opt("scale"),
        Option::is_none,
    )
    .await
    .unwrap();
    deploy(&client, &gpu_vllm("scale", "iset").replicas(1).build()).await;
    wait_for(
        WAIT,
        "the Workspace again",
        || ws.get_opt("scale"),
        Option::is_some,
    )
    .await
    .unwrap();
    wait_for(
        WAIT,
        "the InferenceSet to be pruned",
        || isets.get_opt("scale"),
        Option::is_none,
    )
    .await
    .unwrap();
    running.stop().await.unwrap();
    assert_eq!(
        controller.problems(),
        Vec::<String>::new(),
        "KAITO's webhook refused Workspaces of a set"
    );
}

#[test]
fn kaito_chart_lints_and_renders_least_privilege_rbac() {
    let Some(helm) = helm::require() else { return };
    let chart = helm::chart("kaito-provider");
    helm::lint(&helm, &chart).unwrap();
    let objects = helm::template(
        &helm,
        &chart,
        &[
            ("image.tag", "v9.9.9"),
            ("inferenceSet", "disabled"),
            ("nodeProvisioning.gpuInstanceType", "Standard_NC6s_v3"),
            ("nodeProvisioning.cpuInstanceType", "Standard_D8s_v3"),
        ],
    )
    .unwrap();
    let deployment = helm::of_kind(&objects, "Deployment")[0];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        "ghcr.io/kubeairunway/kubeairunway:v9.9.9"
    );
    assert_eq!(container["command"], json!(["/kaito-provider"]));
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--inference-set=disabled"), "{args:?}");
    for arg in [
        "--node-provisioning=auto",
        "--gpu-instance-type=Standard_NC6s_v3",
        "--cpu-instance-type=Standard_D8s_v3",
    ] {
        assert!(args.contains(&arg), "{arg} in {args:?}");
    }
    let env = container["env"].as_array().unwrap();
    assert!(
        env.iter().any(|e| e["name"] == "POD_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name")
    );
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(container["ports"][0]["containerPort"], 8080);

    // What the ClusterRole grants is measured against what the provider uses in
    // providers_rbac.rs; here: no wildcard.
    let role = helm::of_kind(&objects, "ClusterRole")[0];
    let rules = role["rules"].as_array().unwrap();
    assert!(!serde_json::to_string(rules).unwrap().contains('*'));
    let binding = helm::of_kind(&objects, "ClusterRoleBinding")[0];
    let sa = helm::of_kind(&objects, "ServiceAccount")[0];
    assert_eq!(binding["subjects"][0]["name"], sa["metadata"]["name"]);
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        sa["metadata"]["name"]
    );
}

/// The name of the ConfigMap a test sends as the KAITO provider to see its chart's policy
/// at work (excluded from the provider's measured requests).
pub(crate) const POLICY_PROBE: &str = "kaito-policy-probe";

/// Apply the KAITO chart's policy on the provider's ConfigMaps (`configmap-policy.yaml`)
/// and wait until the API server enforces it: until it refuses the provider (`provider`,
/// its service account's client) an unlabelled ConfigMap in `ns` (a dry run named
/// [`POLICY_PROBE`]). The policy's name.
pub(crate) async fn enforce_configmap_policy(
    admin: &Client,
    provider: &Client,
    objects: &[Value],
    ns: &str,
) -> String {
    let (name, message) = kubeairunway_e2e::policy::enforce_by_configmap(
        admin,
        provider,
        objects,
        "-configmaps",
        ns,
        POLICY_PROBE,
    )
    .await
    .unwrap();
    assert!(
        message.ends_with(
            "kaito-provider writes only ConfigMaps labelled kubeairunway.ai/provider=kaito"
        ),
        "{message}"
    );
    name
}

/// The KAITO chart's policy on the provider's ConfigMaps, at work on its service account:
/// an unlabelled ConfigMap, another provider's, one in kube-system, a label changed and
/// another's ConfigMap changed or deleted are refused with the policy's messages; one
/// labelled `kubeairunway.ai/provider=kaito` is created, changed and deleted; the cluster
/// admin is not fenced. The provider's own ConfigMaps pass it in `providers_rbac`.
#[tokio::test]
async fn kaito_chart_fences_the_providers_configmaps() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::PostParams;
    use kubeairunway_e2e::{policy, rbac};

    let Some(helm_bin) = helm::require() else {
        return;
    };
    let objects = helm::template(&helm_bin, &helm::chart("kaito-provider"), &[]).unwrap();
    let system = "kubeairunway-system";
    let (cluster, admin) = testing::private_cluster("kaito-policy", &[]).await.unwrap();
    cluster.ensure_namespace(system);
    let account =
        helm::of_kind(&objects, "Deployment")[0]["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap()
            .to_string();
    let identity = rbac::ChartIdentity::apply(
        &cluster,
        &admin,
        &objects,
        "kaito-provider",
        system,
        &account,
    )
    .await
    .unwrap();
    let provider = identity.client(&cluster).await.unwrap();
    let ns = cluster.namespace("kaito-policy");
    let fence = enforce_configmap_policy(&admin, &provider, &objects, &ns).await;
    let config_map = |name: &str, owner: Option<&str>| -> ConfigMap {
        let labels = owner.map_or(json!({}), |o| json!({"kubeairunway.ai/provider": o}));
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    };
    let pp = PostParams::default();
    let unlabelled =
        "kaito-provider writes only ConfigMaps labelled kubeairunway.ai/provider=kaito";
    let not_made = "kaito-provider changes and deletes only the ConfigMaps it created";
    let label = |value: Value| {
        Patch::Merge(json!({"metadata": {"labels": {"kubeairunway.ai/provider": value}}}))
    };

    let as_provider: Api<ConfigMap> = Api::namespaced(provider.clone(), &ns);
    for (name, owner) in [("plain", None), ("dynamos", Some("dynamo"))] {
        policy::assert_denied(
            &as_provider.create(&pp, &config_map(name, owner)).await,
            &fence,
            unlabelled,
        );
    }
    policy::assert_denied(
        &Api::<ConfigMap>::namespaced(provider.clone(), "kube-system")
            .create(&pp, &config_map("kaitos", Some("kaito")))
            .await,
        &fence,
        "kaito-provider never writes ConfigMaps in kube-system",
    );
    as_provider
        .create(&pp, &config_map("kaitos", Some("kaito")))
        .await
        .unwrap();
    as_provider
        .patch(
            "kaitos",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v"}})),
        )
        .await
        .unwrap();
    policy::assert_denied(
        &as_provider
            .patch("kaitos", &PatchParams::default(), &label(json!("dynamo")))
            .await,
        &fence,
        unlabelled,
    );
    as_provider
        .delete("kaitos", &DeleteParams::default())
        .await
        .unwrap();
    let as_admin: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    as_admin
        .create(&pp, &config_map("users", None))
        .await
        .unwrap();
    policy::assert_denied(
        &as_provider
            .patch("users", &PatchParams::default(), &label(json!("kaito")))
            .await,
        &fence,
        not_made,
    );
    policy::assert_denied(
        &as_provider.delete("users", &DeleteParams::default()).await,
        &fence,
        not_made,
    );
    Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
        .create(&pp, &config_map("admins", None))
        .await
        .unwrap();
}

/// Create the ModelDeployment as a user would and select `kaito` as core would.
async fn deploy(client: &Client, md: &ModelDeployment) -> ModelDeployment {
    testing::deploy(client, md, "kaito").await.unwrap()
}

/// Defect: the Workspace was applied before its inference ConfigMap, and KAITO's webhook
/// refuses a vLLM Workspace whose ConfigMap does not exist yet
/// (api/v1beta1/inference_config_validation.go:56-70@v0.12.0). One reconcile step of the
/// real provider against a mock API server whose Workspace admission is the stand-in's
/// webhook rule, fed with the ConfigMaps applied so far: a Workspace applied first is
/// answered 400 with KAITO's words and the test fails.
#[tokio::test]
async fn kaito_inference_config_map_is_applied_before_the_workspace() {
    use kubeairunway_sdk::runtime::{Context, reconcile_once};
    use kubeairunway_sdk::testing::mock;

    let (client, mut server) = mock::pair();
    let provider = nap_provider(false);
    let crd = read_crd(&fixtures_dir().join("crds/upstream/kaito.sh_workspaces.yaml")).unwrap();
    let api = UpstreamApi::detect(&crd, &provider.upstream()).unwrap();
    let (_tx, upstream) = tokio::sync::watch::channel(Some(Ok(api)));
    let ctx = Context::new(
        std::sync::Arc::new(provider),
        client,
        test_options(),
        upstream,
    );
    let mut md = gpu_vllm("qwen", "ns")
        .spec(|s| s.engine.context_length = Some(4096))
        .build();
    md.metadata.uid = Some("uid-1".into());
    md.metadata.finalizers = Some(vec!["kubeairunway.ai/kaito-provider".into()]);
    md.status = Some(serde_json::from_value(json!({"provider": {"name": "kaito"}})).unwrap());
    let answered = serde_json::to_value(&md).unwrap();

    let reconcile =
        tokio::spawn(async move { reconcile_once(&md, &ctx).await.map_err(|e| e.to_string()) });
    let mut cluster = Cluster::new(NodeProvisioner::AzureGpu);
    let mut applies = Vec::new();
    let mut refusals = Vec::new();
    loop {
        let step = server
            .respond(|method, uri, body| {
                let path = uri.split('?').next().unwrap_or_default().to_string();
                let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "reason": "NotFound", "code": 404, "message": "not found"});
                match *method {
                    http::Method::GET => (404, not_found),
                    http::Method::PATCH if path.ends_with("/status") => (200, answered.clone()),
                    http::Method::PATCH if path.contains("/configmaps/") => {
                        let data = serde_json::from_value(body["data"].clone()).unwrap();
                        cluster.put_config_map("ns", body["metadata"]["name"].as_str().unwrap(), data);
                        applies.push(path);
                        (200, body.clone())
                    }
                    http::Method::PATCH => {
                        applies.push(path);
                        match standin::admit_workspace(None, body, &cluster) {
                            Ok(()) => (200, body.clone()),
                            Err(refusal) => {
                                refusals.push(refusal.to_string());
                                (400, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                             "reason": "BadRequest", "code": 400,
                                             "message": refusal.to_string()}))
                            }
                        }
                    }
                    _ => (201, body.clone()),
                }
            })
            .await;
        if step.is_err() {
            break;
        }
    }
    reconcile.await.unwrap().unwrap();
    assert_eq!(refusals, Vec::<String>::new(), "KAITO's webhook refused");
    assert_eq!(
        applies,
        [
            "/api/v1/namespaces/ns/configmaps/qwen-inference-config",
            "/apis/kaito.sh/v1beta1/namespaces/ns/workspaces/qwen",
        ]
    );
}

/// Defect: `secrets.huggingFaceToken` renders into `inference.preset`, which KAITO's webhook
/// refuses to update ("field is immutable", workspace_validation.go:895-897@v0.12.0), so a
/// new token Secret patched in place failed. One reconcile step against a mock API server
/// holding the Workspace of the old token, whose Workspace UPDATE admission is the
/// stand-in's webhook rule: the provider's immutable fields make the runtime delete the
/// Workspace to create it anew instead of patching it.
#[tokio::test]
async fn kaito_a_new_token_secret_recreates_the_workspace_instead_of_patching_the_preset() {
    use kubeairunway_sdk::runtime::{Context, reconcile_once};
    use kubeairunway_sdk::testing::mock;

    let provider = nap_provider(false);
    let crd = read_crd(&fixtures_dir().join("crds/upstream/kaito.sh_workspaces.yaml")).unwrap();
    let api = UpstreamApi::detect(&crd, &provider.upstream()).unwrap();
    let with_token = |secret: &str| {
        let mut md = gpu_vllm("qwen", "ns")
            .spec(|s| {
                s.secrets =
                    Some(serde_json::from_value(json!({"huggingFaceToken": secret})).unwrap());
            })
            .build();
        md.metadata.uid = Some("uid-1".into());
        md.metadata.finalizers = Some(vec!["kubeairunway.ai/kaito-provider".into()]);
        md.status = Some(serde_json::from_value(json!({"provider": {"name": "kaito"}})).unwrap());
        md
    };
    // The Workspace as the runtime applied it for the first token.
    let old = with_token("hf-old");
    let mut live = provider.render(&old, &api).unwrap().objects.remove(0);
    kubeairunway_sdk::render::finish(
        &mut live,
        &old,
        "kaito",
        Role::Primary {
            immutable_fields: provider.immutable_fields("Workspace"),
        },
    );
    let mut live = serde_json::to_value(&live).unwrap();
    live["metadata"]["uid"] = json!("ws-1");
    let live_object: kube::api::DynamicObject = serde_json::from_value(live.clone()).unwrap();
    let workspaces = api.api_resource();
    let md = with_token("hf-new");
    let answered = serde_json::to_value(&md).unwrap();

    let (client, mut server) = mock::pair();
    let (_tx, upstream) = tokio::sync::watch::channel(Some(Ok(api)));
    let ctx = Context::new(
        std::sync::Arc::new(provider),
        client,
        test_options(),
        upstream,
    )
    .with_live_of(&workspaces, vec![live_object]);
    let reconcile =
        tokio::spawn(async move { reconcile_once(&md, &ctx).await.map_err(|e| e.to_string()) });
    let cluster = Cluster::new(NodeProvisioner::AzureGpu);
    let (mut refusals, mut deleted) = (Vec::new(), Vec::new());
    loop {
        let step = server
            .respond(|method, uri, body| {
                let path = uri.split('?').next().unwrap_or_default().to_string();
                let workspace = path.ends_with("/workspaces/qwen");
                match *method {
                    http::Method::GET if workspace => (200, live.clone()),
                    http::Method::GET => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "reason": "NotFound", "code": 404, "message": "not found"}),
                    ),
                    http::Method::PATCH if path.ends_with("/status") => (200, answered.clone()),
                    http::Method::PATCH if workspace => {
                        match standin::admit_workspace(Some(&live), body, &cluster) {
                            Ok(()) => (200, body.clone()),
                            Err(refusal) => {
                                refusals.push(refusal.to_string());
                                (400, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                             "reason": "BadRequest", "code": 400,
                                             "message": refusal.to_string()}))
                            }
                        }
                    }
                    http::Method::DELETE if workspace => {
                        deleted.push(path);
                        (200, live.clone())
                    }
                    _ => (200, body.clone()),
                }
            })
            .await;
        if step.is_err() {
            break;
        }
    }
    reconcile.await.unwrap().unwrap();
    assert_eq!(refusals, Vec::<String>::new(), "KAITO's webhook refused");
    assert_eq!(
        deleted,
        ["/apis/kaito.sh/v1beta1/namespaces/ns/workspaces/qwen"]
    );
}

/// `provider.overrides` on KAITO, which has no typed settings: every key is merged into
/// the Workspace (JSON merge patch) and checked against the installed CRD first. On the
/// real API server: `resource.count: 10` and a label reach the stored Workspace and
/// `null` deletes a rendered field; a path the Workspace schema lacks or a value of
/// another type fails the ModelDeployment with `InvalidOverride` naming each, and the
/// Workspace stays as last applied; an override of a field the runtime owns fails with
/// `RuntimeOwnedOverride` naming it.
#[tokio::test]
async fn kaito_overrides_merge_into_the_workspace_checked_against_its_schema() {
    let (_cluster, client, _api) = cluster("overrides", "kaito.sh_workspaces.yaml").await;
    let _running = testing::spawn(nap_provider(false), client.clone(), test_options());
    let ns = "overrides";
    let with = |overrides: Value| cpu_llamacpp("gemma", ns).overrides(overrides).build();
    deploy(
        &client,
        &with(json!({
            "resource": {"count": 10, "labelSelector": {"matchLabels": {"kubernetes.io/os": null}}},
            "metadata": {"labels": {"team": "search"}},
        })),
    )
    .await;
    let ws = testing::object_where(&client, &workspaces(), ns, "gemma", "count 10", |w| {
        w.as_ref()
            .is_some_and(|w| w.data["resource"]["count"] == 10)
    })
    .await
    .unwrap();
    assert_eq!(ws.labels().get("team").map(String::as_str), Some("search"));
    let selector = &ws.data["resource"]["labelSelector"];
    assert!(
        selector["matchLabels"].get("kubernetes.io/os").is_none(),
        "deleted: {selector}"
    );
    assert_eq!(
        ws.data["inference"]["template"]["metadata"]["labels"][labels::MODEL_DEPLOYMENT],
        "gemma",
        "the platform's label, kept"
    );
    let md = md_where(&client, ns, "gemma", "compatible", |m| {
        condition(m, PROVIDER_COMPATIBLE).is_some_and(|c| c.status == "True")
    })
    .await;
    assert_ne!(phase(&md), Some(Phase::Failed));

    deploy(
        &client,
        &with(json!({"resource": {"count": "ten", "cuont": 1}})),
    )
    .await;
    let md = md_where(&client, ns, "gemma", "InvalidOverride", |m| {
        condition(m, PROVIDER_COMPATIBLE).is_some_and(|c| c.reason == reasons::INVALID_OVERRIDE)
    })
    .await;
    let refused = condition(&md, PROVIDER_COMPATIBLE).unwrap();
    assert_eq!(refused.status, "False");
    assert!(
        refused.message.contains(
            "provider.overrides.resource.count (must be integer, not string), \
             provider.overrides.resource.cuont (no such field)"
        ),
        "{}",
        refused.message
    );
    assert_eq!(phase(&md), Some(Phase::Failed));
    let ws_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &workspaces());
    assert_eq!(
        ws_api.get("gemma").await.unwrap().data["resource"]["count"],
        10,
        "nothing applied"
    );

    deploy(
        &client,
        &with(json!({"metadata": {"name": "other", "labels": {"kubeairunway.ai/provider": "x"}}})),
    )
    .await;
    let md = md_where(&client, ns, "gemma", "RuntimeOwnedOverride", |m| {
        condition(m, PROVIDER_COMPATIBLE)
            .is_some_and(|c| c.reason == reasons::RUNTIME_OWNED_OVERRIDE)
    })
    .await;
    assert_eq!(
        condition(&md, PROVIDER_COMPATIBLE).unwrap().message,
        "provider.overrides.metadata.labels.kubeairunway.ai/provider, provider.overrides.metadata.name may not be overridden: the runtime owns them; nothing was applied"
    );
}
