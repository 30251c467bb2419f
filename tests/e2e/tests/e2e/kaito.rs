//! The KAITO provider end to end on the real API server, once per real Workspace CRD
//! version (v0.12 and v0.10), each on a private cluster with exactly one provider
//! instance: every rendered Workspace is accepted by the real schema (strict field
//! validation), a status fixture walks KAITO's real states and the ModelDeployment
//! follows, and deletion removes the Workspace. Also the chart: lint, template, RBAC.

use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_e2e::{fixtures_dir, helm, read_crd};
use kubeairunway_kaito_provider::KaitoProvider;
use kubeairunway_sdk::api::{EngineType, InferenceProviderConfig, ModelDeployment, Phase};
use kubeairunway_sdk::conditions::{PROVIDER_COMPATIBLE, READY, RESOURCE_CREATED};
use kubeairunway_sdk::render::Role;
use kubeairunway_sdk::testing::{
    self, ModelDeploymentBuilder, condition, md_where, message, phase, test_options, wait_for,
};
use kubeairunway_sdk::{Provider, UpstreamApi, labels};
use kubeairunway_testcluster::TestCluster;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn workspaces() -> ApiResource {
    ApiResource {
        group: "kaito.sh".into(),
        version: "v1beta1".into(),
        api_version: "kaito.sh/v1beta1".into(),
        kind: "Workspace".into(),
        plural: "workspaces".into(),
    }
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
/// with strict field validation (unknown fields refused, not pruned), by a dry run.
async fn rendered_objects_are_accepted(client: &Client, api: &UpstreamApi) {
    let providers = [
        KaitoProvider::default(),
        KaitoProvider {
            inference_set: false,
            instance_type: Some("Standard_NC6s_v3".into()),
        },
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
    let (_cluster, client, api) = cluster(tag, crd_file).await;
    rendered_objects_are_accepted(&client, &api).await;

    let running = testing::spawn(KaitoProvider::default(), client.clone(), test_options());

    // Registration.
    let ipcs: Api<InferenceProviderConfig> = Api::all(client.clone());
    let ipc = wait_for(
        WAIT,
        "registration",
        || ipcs.get("kaito"),
        |c: &InferenceProviderConfig| c.status.as_ref().is_some_and(|s| s.ready == Some(true)),
    )
    .await
    .unwrap();
    let status = ipc.status.unwrap();
    assert_eq!(
        status.upstream_crd_version.as_deref(),
        Some("kaito.sh/v1beta1")
    );
    assert_eq!(
        status.upstream_schema_hash.as_deref(),
        Some(api.schema_hash.as_str())
    );

    // The seed's CPU llama.cpp example: a Workspace, owned, labelled, valid.
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
        json!({"state": "Pending", "conditions": [cond("WorkspaceSucceeded", "False", "workspacePending", "workspace is pending")]}),
        Phase::Deploying,
        "KAITO Workspace is Pending: workspace is pending",
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
        ("False", "DeploymentFailed")
    );
    let md = kaito_writes(
        &client,
        ns,
        "gemma-cpu",
        json!({"state": "Ready", "conditions": [
            cond("ResourceReady", "True", "workspaceResourceStatusSuccess", "resource is ready"),
            cond("InferenceReady", "True", "workspaceInferenceStatusSuccess", "inference is ready"),
            cond("WorkspaceSucceeded", "True", "workspaceSucceeded", "workspace succeeds"),
        ]}),
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

    // vLLM as a KAITO preset named after the model id.
    let vllm = deploy(&client, &gpu_vllm("qwen", "vllm").build()).await;
    let vllm_ws: Api<DynamicObject> = Api::namespaced_with(client.clone(), "vllm", &workspaces());
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
        ws.annotations().get("kaito.sh/runtime").map(String::as_str),
        Some("vllm")
    );
    assert_eq!(
        vllm.uid(),
        ws.owner_references().first().map(|o| o.uid.clone())
    );

    // What KAITO cannot serve is refused with the exact messages, and nothing is created.
    for (name, builder, msg) in [
        (
            "sglang",
            gpu_vllm("sglang", "refused").engine(EngineType::Sglang),
            "KAITO does not support sglang engine".to_string(),
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

#[tokio::test]
async fn kaito_v0_12_workspace_end_to_end() {
    Box::pin(walk("v012", "kaito.sh_workspaces.yaml")).await;
}

#[tokio::test]
async fn kaito_v0_10_workspace_end_to_end() {
    Box::pin(walk("v010", "kaito.sh_workspaces.v0.10.0.yaml")).await;
}

fn inference_sets() -> ApiResource {
    ApiResource {
        group: "kaito.sh".into(),
        version: "v1alpha1".into(),
        api_version: "kaito.sh/v1alpha1".into(),
        kind: "InferenceSet".into(),
        plural: "inferencesets".into(),
    }
}

/// Replicas > 1 with KAITO's real InferenceSet CRD installed (beside the v0.12 Workspace
/// CRD): an InferenceSet is created (not `resource.count`), accepted by the real schema,
/// its ready count followed, and deleted with the ModelDeployment.
#[tokio::test]
async fn kaito_inference_set_for_replicas() {
    let (_cluster, client, api) = cluster("iset", "kaito.sh_workspaces.yaml").await;
    let iset_crd =
        read_crd(&fixtures_dir().join("crds/upstream/kaito.sh_inferencesets.yaml")).unwrap();
    testing::install_crds(&client, &[iset_crd]).await.unwrap();
    let provider = KaitoProvider {
        inference_set: true,
        instance_type: Some("Standard_NC24ads_A100_v4".into()),
    };

    // Strict dry runs of every shape against the real InferenceSet schema.
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

    // KAITO's InferenceSet controller reports ready Workspaces; the runtime polls it.
    let slow = Duration::from_secs(60);
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), "iset");
    testing::write_upstream_status(
        &client,
        &inference_sets(),
        "iset",
        "qwen3",
        json!({"replicas": 3, "readyReplicas": 1}),
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
    assert_eq!(message(&md), "KAITO InferenceSet has 1/3 Workspaces ready");
    testing::write_upstream_status(
        &client,
        &inference_sets(),
        "iset",
        "qwen3",
        json!({"replicas": 3, "readyReplicas": 3}),
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
            ("instanceType", "Standard_NC6s_v3"),
        ],
    )
    .unwrap();
    let deployment = helm::of_kind(&objects, "Deployment")[0];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(
        container["image"]
            .as_str()
            .unwrap()
            .ends_with("kaito-provider:v9.9.9"),
        "{}",
        container["image"]
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--inference-set=disabled"), "{args:?}");
    assert!(
        args.contains(&"--instance-type=Standard_NC6s_v3"),
        "{args:?}"
    );
    let env = container["env"].as_array().unwrap();
    assert!(
        env.iter().any(|e| e["name"] == "POD_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name")
    );
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], 8080);

    let role = helm::of_kind(&objects, "ClusterRole")[0];
    let rules = role["rules"].as_array().unwrap();
    let expected = json!([
        {"apiGroups": ["kubeairunway.ai"], "resources": ["modeldeployments"], "verbs": ["get", "list", "watch", "patch", "update"]},
        {"apiGroups": ["kubeairunway.ai"], "resources": ["modeldeployments/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["kubeairunway.ai"], "resources": ["inferenceproviderconfigs", "inferenceproviderconfigs/status"], "verbs": ["get", "create", "patch", "update"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["kaito.sh"], "resources": ["workspaces", "inferencesets"], "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]);
    assert_eq!(&Value::Array(rules.clone()), &expected);
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

/// Create the ModelDeployment as a user would and select `kaito` as core would.
async fn deploy(client: &Client, md: &ModelDeployment) -> ModelDeployment {
    testing::deploy(client, md, "kaito").await.unwrap()
}
