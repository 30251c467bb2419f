//! The dashboard in a real browser: Debian's headless Chromium driven by playwright-core
//! (`tests/e2e/browser/dashboard.mjs`; `scripts/test.sh` installs both), against the
//! dashboard served by this test on a private test API server where core and every
//! built-in provider run. A model is previewed (server dry run, selection, the exact
//! objects), deployed through the form, seen live in the list, opened (its pods, a pod's
//! log, the chat, which this API server cannot proxy), scaled and deleted; the Caches page
//! shows a ModelCache with the controller's verdict;
//! no console error; every control labelled. The server's guards are checked with plain
//! requests.

use std::time::Duration;

use kube::Api;
use kubeairunway_cli::builtin::{BuiltIns, NAMES, NodeProvisioningMode, ProviderFlags};
use kubeairunway_cli::controllers::Controllers;
use kubeairunway_cli::{crds, dashboard};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::testing::{self, wait_for};
use serde_json::Value;

async fn request(port: u16, method: &str, path: &str, host: &str, marked: bool) -> u16 {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
    );
    if marked {
        req.push_str("x-kubeairunway-dashboard: 1\r\n");
    }
    req.push_str("\r\n{}");
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, req.as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut out)
        .await
        .unwrap();
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_model_is_previewed_deployed_watched_scaled_and_deleted_in_a_real_browser() {
    let upstream = crds::all_bundled().unwrap();
    let (cluster, client) = testing::private_cluster("dashboard", &upstream)
        .await
        .unwrap();
    let ns = cluster.namespace("dashboard");
    let inference_set = upstream.iter().find(|c| {
        kube::ResourceExt::name_any(*c) == kubeairunway_kaito_provider::INFERENCE_SET_CRD
    });
    let _controllers = Controllers::start(
        &client,
        BuiltIns::new(
            &ProviderFlags::default(),
            inference_set,
            NodeProvisioningMode::Byo,
        ),
        &NAMES,
    )
    .unwrap();
    for provider in NAMES {
        testing::registered(&client, provider).await;
    }
    // The Models page searches a loopback stand-in of the Hugging Face hub: Qwen3-0.6B's
    // config.json (the hub's figures) and parameter count.
    let hub = kubeairunway_modelcache_hub::testing::StandIn::start().await;
    let qwen_config =
        br#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "head_dim": 128,
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "max_position_embeddings": 40960}"#;
    hub.commit(
        "Qwen/Qwen3-0.6B",
        "main",
        &kubeairunway_modelcache_hub::testing::commit_id("qwen3"),
        vec![kubeairunway_modelcache_hub::testing::StandInFile::regular(
            "config.json",
            qwen_config,
        )],
    );
    hub.describe("Qwen/Qwen3-0.6B", 751_632_384, 1_000_000);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(dashboard::api::serve_with(
        listener,
        client.clone(),
        Some(kubeairunway_modelcache_hub::HubOptions {
            endpoint: hub.url.clone(),
            ..kubeairunway_modelcache_hub::HubOptions::default()
        }),
        std::future::pending(),
    ));

    // The guards: another Host (DNS rebinding) and a change without the page's header
    // (cross-site request forgery) are refused before anything is done.
    let host = format!("127.0.0.1:{port}");
    assert_eq!(
        request(port, "GET", "/api/deployments", "evil.example", false).await,
        403
    );
    assert_eq!(
        request(port, "POST", "/api/deployments", &host, false).await,
        403
    );
    assert_eq!(
        request(port, "POST", "/api/deployments", &host, true).await,
        422,
        "let through, then refused: no manifest"
    );

    // A pod as KAITO labels a Workspace's pods (the selector the provider reports).
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "tiny-0", "labels": {"kaito.sh/workspace": "tiny"}},
        "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "model", "image": "runner"}]}}))
    .unwrap();
    pods.create(&kube::api::PostParams::default(), &pod)
        .await
        .unwrap();

    // A model cache, which the kernel-cache controller (running among the controllers)
    // reports on: no agent runs here, so no node has it.
    kubeairunway_testcluster::install_crds(&client, &kubeairunway_kernelcache_api::crds())
        .await
        .unwrap();
    let caches: Api<kubeairunway_kernelcache_api::model::ModelCache> =
        Api::namespaced(client.clone(), &ns);
    let cache = serde_json::from_value(serde_json::json!({
        "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "gemma"}, "spec": {"source": "hf://google/gemma-3-1b-it"}}))
    .unwrap();
    caches
        .create(&kube::api::PostParams::default(), &cache)
        .await
        .unwrap();
    // The Caches page reads once when it opens: the controller's verdict must be in
    // (its watch starts once the CRD above exists, after a back-off under load).
    wait_for(
        Duration::from_secs(180),
        "the model cache's Ready condition",
        || caches.get("gemma"),
        |c| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "NoNodes")
            })
        },
    )
    .await
    .unwrap();

    // A GPU node, as the kubelet and NVIDIA's GPU feature discovery describe it.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = serde_json::from_value(serde_json::json!({"metadata": {"name": "gpu-node-h100",
        "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}}}))
    .unwrap();
    nodes
        .create(&kube::api::PostParams::default(), &node)
        .await
        .unwrap();
    let allocatable = serde_json::json!({"status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"}}});
    nodes
        .patch_status(
            "gpu-node-h100",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(allocatable),
        )
        .await
        .unwrap();

    // A second dashboard, run by a user who holds only the core chart's `view` role (its
    // ClusterRole aggregated into `view`; this API server does not aggregate, so it is
    // bound directly): reads work, a deployment is refused with the API server's words.
    let viewer_server = viewer_dashboard(&cluster, &client).await;
    let viewer_url = viewer_server
        .as_ref()
        .map_or_else(String::new, |(url, _)| url.clone());

    let findings = kubeairunway_e2e::browser::run(
        "dashboard.mjs",
        &[&format!("http://{host}"), &ns, &viewer_url],
        Duration::from_secs(480),
    )
    .await;
    assert_eq!(
        findings["consoleErrors"],
        serde_json::json!([]),
        "{findings:#}"
    );
    assert_eq!(findings["firstTab"], "Skip to content");
    assert_eq!(findings["unlabelled"], serde_json::json!([]));
    assert_eq!(findings["unnamedButtons"], 0);
    assert!(
        findings["manifestFromForm"]
            .as_str()
            .unwrap()
            .contains("id: \"google/gemma-3-1b-it-qat-q8_0-gguf\""),
        "{findings:#}"
    );
    assert_eq!(
        findings["dryRun"],
        "Validation: the API server accepts it (dry run)"
    );
    let verdict = &findings["cacheAndWarmup"][0];
    let manifest = findings["cacheAndWarmup"][1].as_str().unwrap();
    assert_eq!(verdict, "Validation: the API server accepts it (dry run)");
    assert!(
        manifest.contains("kernelCache:\n    name: vllm-kernels")
            && manifest.contains("warmup: {}"),
        "{manifest}"
    );
    let selection = findings["selection"].as_str().unwrap();
    assert!(
        selection.starts_with("Engine llamacpp (explicit); provider kaito:"),
        "{selection}"
    );
    let objects = findings["objects"].as_array().unwrap();
    assert!(
        objects
            .iter()
            .any(|o| o.as_str().unwrap().contains("kind: Workspace")),
        "{objects:?}"
    );
    let row = findings["row"].as_array().unwrap();
    assert_eq!(
        (row[0].as_str(), row[1].as_str(), row[4].as_str()),
        (Some("tiny"), Some(ns.as_str()), Some("kaito"))
    );
    let conditions: Vec<&str> = findings["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(conditions.contains(&"ProviderSelected"), "{conditions:?}");
    assert!(!findings["selectionTable"].as_array().unwrap().is_empty());
    // It named no kernel cache, no model cache holds its model, no warmup: said so.
    assert_eq!(
        findings["cachesTable"],
        serde_json::json!([
            "Kernel cache",
            "none",
            "-",
            "Model cache",
            "a Ready ModelCache of its model, if any",
            "none: serving pods download the model themselves",
            "Warmup",
            "none",
            "-"
        ]),
        "{findings:#}"
    );
    let pod_cells: Vec<&str> = findings["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        &pod_cells[..4],
        ["tiny-0", "Pending", "gpu-node-1", "0/1"],
        "{pod_cells:?}"
    );
    assert!(
        findings["log"].as_str().unwrap().starts_with("No log: "),
        "{findings:#}"
    );
    let chat = findings["chat"].as_str().unwrap();
    assert!(chat.starts_with("through the service proxy: "), "{chat}");
    let providers: Vec<&str> = findings["providers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for p in NAMES {
        assert!(providers.contains(&p), "{providers:?}");
    }
    // The fit: the largest GPU of the cluster chosen; 70B in bf16 needs 4 of 80 GB, 8 of 24.
    assert_eq!(findings["gpuMemoryChosen"], "80", "{findings:#}");
    assert_eq!(
        (
            findings["seventyOn80"].as_str(),
            findings["seventyOn24"].as_str()
        ),
        (Some("4"), Some("8"))
    );
    assert_eq!(
        findings["prefilled"],
        serde_json::json!(["qwen3-0-6b", "Qwen/Qwen3-0.6B", "1"])
    );
    // Found on the hub, its fit from the hub's figures: 0.7 B parameters, one 80 GB GPU.
    assert_eq!(findings["hubFound"], serde_json::json!(["Qwen/Qwen3-0.6B"]));
    let hub_fit = findings["hubFit"].as_str().unwrap();
    assert!(
        hub_fit.starts_with("0.7 B parameters, ") && hub_fit.contains(": 1 GPU(s)"),
        "{hub_fit}"
    );
    assert!(
        hub.log()
            .iter()
            .any(|l| l.path == "/api/models/Qwen/Qwen3-0.6B"),
        "the parameter count was asked of the hub"
    );
    let cache_row: Vec<&str> = findings["modelCaches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let expected_name = format!("{ns}/gemma");
    assert_eq!(
        &cache_row[..2],
        [expected_name.as_str(), "hf://google/gemma-3-1b-it@main"],
        "{findings:#}"
    );
    assert!(
        cache_row[5].starts_with("False: NoNodes: "),
        "{cache_row:?}"
    );

    // A field the API server refuses: its message, and Deploy stays disabled.
    let invalid = findings["invalid"].as_str().unwrap();
    assert!(
        invalid.starts_with("Validation: ") && invalid.contains("metadata.name"),
        "{invalid}"
    );
    assert_eq!(findings["invalidDeployDisabled"], true);
    if viewer_server.is_some() {
        let denied = findings["viewerDryRun"].as_str().unwrap();
        assert!(
            denied.contains("forbidden") && denied.contains("viewer"),
            "the API server's refusal, naming the user: {denied}"
        );
        assert_eq!(findings["viewerDeployDisabled"], true);
        assert_eq!(findings["viewerListed"], true, "{findings:#}");
        let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
        assert!(
            mds.get_opt("denied").await.unwrap().is_none(),
            "nothing written"
        );
    }

    // What the browser did happened in the cluster: created (core selected a provider for
    // it), then deleted.
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    wait_for(
        Duration::from_secs(60),
        "tiny deleted",
        || mds.get_opt("tiny"),
        |m| {
            m.as_ref()
                .is_none_or(|m| m.metadata.deletion_timestamp.is_some())
        },
    )
    .await
    .unwrap();
    let events =
        kubeairunway_sdk::testing::event_where(&client, &ns, "tiny", "ProviderSelected").await;
    assert!(!events.is_empty());
    server.abort();
    if let Some((_, task)) = viewer_server {
        task.abort();
    }
}

/// A dashboard served with the identity of `viewer`, bound to the core chart's `-view`
/// ClusterRole: its URL and task. `None` when helm is missing outside CI.
async fn viewer_dashboard(
    cluster: &kubeairunway_testcluster::TestCluster,
    admin: &kube::Client,
) -> Option<(String, tokio::task::JoinHandle<anyhow::Result<()>>)> {
    use kube::api::{Patch, PatchParams};
    use kubeairunway_e2e::helm;
    let helm_bin = helm::require()?;
    let objects = helm::template(&helm_bin, &helm::chart("kubeairunway"), &[]).unwrap();
    let role = helm::of_kind(&objects, "ClusterRole")
        .into_iter()
        .find(|r| {
            r["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("-view"))
        })
        .expect("the core chart's view role")
        .clone();
    let role_name = role["metadata"]["name"].as_str().unwrap().to_string();
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    roles
        .patch(
            &role_name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&role),
        )
        .await
        .unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(admin.clone());
    bindings
        .patch(
            "dashboard-viewer",
            &PatchParams::apply("test").force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "dashboard-viewer"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer"}],
            })),
        )
        .await
        .unwrap();
    let viewer = cluster.client_as("viewer", None).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let task = tokio::spawn(dashboard::api::serve(
        listener,
        viewer,
        std::future::pending(),
    ));
    Some((url, task))
}
