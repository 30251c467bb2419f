//! Dashboard page load (figures, never assertions): the Deployments page with N
//! ModelDeployments, in Debian's headless Chromium driven by playwright-core, timed by the
//! browser itself.
//!
//! ```console
//! $ cargo bench -p kubeairunway-e2e --bench dashboard -- [--n 1000] [--loads 5]
//! ```
//!
//! It starts a private test API server, creates N ModelDeployments (each with a provider's
//! status: phase, replicas, endpoint), serves the dashboard with the admin's identity, and
//! loads `#/deployments` `--loads` times in one browser (a fresh page each time, so every
//! load lists and streams anew). For each load the browser reports, from its own clock
//! (`performance.now()` from the navigation's start): the document's `DOMContentLoaded`, the
//! first row shown and all N rows shown (the live list, server-sent events from the
//! dashboard's watch cache). Browser tools: `tests/e2e/browser/install.sh` (what
//! scripts/test.sh runs).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: failing loudly is the point

use std::path::PathBuf;
use std::time::Instant;

use futures::StreamExt;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubeairunway_sdk::ModelDeployment;
use serde_json::{Value, json};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let n = arg("--n", 1000);
    let loads = arg("--loads", 5);
    let (core, chromium) = kubeairunway_e2e::browser::tools();
    let (cluster, client) = kubeairunway_sdk::testing::private_cluster("dashboard-bench", &[])
        .await
        .unwrap();
    let ns = cluster.namespace("bench");
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let mds = mds.clone();
            async move {
                let name = format!("model-{i:05}");
                let md: ModelDeployment = serde_json::from_value(json!({
                    "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
                    "metadata": {"name": name},
                    "spec": {"model": {"id": "Qwen/Qwen3-0.6B"}, "engine": {"type": "vllm"},
                             "resources": {"gpu": {"count": 1}}}}))
                .unwrap();
                mds.create(&PostParams::default(), &md).await.unwrap();
                let status = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
                    "metadata": {"name": name},
                    "status": {"phase": "Running", "message": "serving", "replicas": {"desired": 1, "ready": 1},
                               "provider": {"name": "dynamo"}, "engine": {"type": "vllm"},
                               "endpoint": {"service": name, "port": 8000}}});
                mds.patch_status(&name, &PatchParams::apply("bench-provider").force(), &Patch::Apply(status))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    eprintln!(
        "{n} ModelDeployments created in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let server = tokio::spawn(kubeairunway_cli::dashboard::api::serve(
        listener,
        client.clone(),
        std::future::pending(),
    ));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("browser/dashboard-load.mjs");
    let output = tokio::process::Command::new("node")
        .arg(&script)
        .arg(&url)
        .arg(n.to_string())
        .arg(loads.to_string())
        .env("PLAYWRIGHT_CORE", &core)
        .env("CHROMIUM", &chromium)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let loads: Vec<Value> = serde_json::from_str(stdout.lines().last().unwrap_or("[]"))
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr)));
    println!(
        "Deployments page with {n} ModelDeployments, {} loads (ms from navigation start, the browser's clock):",
        loads.len()
    );
    println!("| load | DOMContentLoaded | first row | all {n} rows |");
    println!("| --- | --- | --- | --- |");
    for (i, l) in loads.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} |",
            i + 1,
            l["domContentLoaded"].as_f64().unwrap_or_default(),
            l["firstRow"].as_f64().unwrap_or_default(),
            l["allRows"].as_f64().unwrap_or_default()
        );
    }
    let mut all: Vec<f64> = loads.iter().filter_map(|l| l["allRows"].as_f64()).collect();
    all.sort_by(f64::total_cmp);
    if let Some(median) = all.get(all.len() / 2) {
        println!("median, all rows shown: {median:.0} ms");
    }
    server.abort();
}
