//! Helpers for the end-to-end tests: fixtures, the shared cluster with the core CRDs
//! installed, and small API conveniences.

pub mod admission;
pub mod browser;
pub mod cache_images;
pub mod cli;
pub mod helm;
pub mod mcv;
pub mod operators;
pub mod outage;
pub mod policy;
pub mod rbac;

use std::path::{Path, PathBuf};

use anyhow::Context;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_testcluster::{TestCluster, install_crds, shared};

/// `tests/fixtures` of the repository.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// Read a CRD from a YAML file.
pub fn read_crd(path: &Path) -> anyhow::Result<CustomResourceDefinition> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The real upstream CRDs shipped as fixtures, by file name.
pub fn upstream_crds() -> anyhow::Result<Vec<(String, CustomResourceDefinition)>> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(fixtures_dir().join("crds/upstream"))?
        .flatten()
        .collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            out.push((
                entry.file_name().to_string_lossy().into_owned(),
                read_crd(&path)?,
            ));
        }
    }
    Ok(out)
}

/// A test API server of the calling test's own (not the process's shared one), in
/// `runs/<pid>-<tag>` of the test cluster cache, stopped when the test process exits:
/// for tests that need a bare cluster or hand its kubeconfig to other programs.
pub async fn private_cluster(tag: &str) -> anyhow::Result<TestCluster> {
    let dir = kubeairunway_testcluster::cache_dir()
        .join("runs")
        .join(format!("{}-{tag}", std::process::id()));
    tokio::task::spawn_blocking(move || {
        TestCluster::start(&dir, kubeairunway_testcluster::Lifetime::TiedToProcess)
    })
    .await?
}

/// The shared cluster of this test process, with the core CRDs installed, and a fresh
/// client for the calling test.
pub async fn core_cluster() -> anyhow::Result<(&'static TestCluster, Client)> {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let cluster = shared();
    INSTALLED
        .get_or_try_init(|| async {
            // A client of its own: the caller's runtime may end before other tests run.
            let client = cluster.client().await?;
            install_crds(&client, &kubeairunway_sdk::api::crds::all()).await
        })
        .await?;
    Ok((cluster, cluster.client().await?))
}

/// Server-side apply a ModelDeployment manifest (JSON) as `manager` into `namespace`.
pub async fn apply_md(
    client: &Client,
    namespace: &str,
    manager: &str,
    manifest: &serde_json::Value,
) -> kube::Result<DynamicObject> {
    let ar = ApiResource::erase::<ModelDeployment>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    let mut obj = manifest.clone();
    obj["metadata"]["namespace"] = serde_json::Value::String(namespace.to_string());
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    api.patch(&name, &PatchParams::apply(manager), &Patch::Apply(&obj))
        .await
}

/// Poll `check` every 100 ms until it returns `Some`, or fail after `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("timed out after {secs}s waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Wait until the process serving health on `metrics` answers `/readyz` with 200, or fail
/// after `secs` seconds naming its last answer. Tests that route a Service to a process
/// wait for this first: the endpoints controller lists a pod only once its readiness probe
/// passes, and the charts probe `/readyz`.
pub async fn ready(metrics: std::net::SocketAddr, secs: u64) -> anyhow::Result<()> {
    let url = format!("http://{metrics}/readyz");
    let last = std::sync::Mutex::new(String::from("no answer yet"));
    eventually(secs, &format!("{url} to answer 200"), || async {
        let answer = match reqwest::get(&url).await {
            Ok(resp) => {
                let status = resp.status();
                let body = resp.text().await.unwrap_or_default();
                if status.is_success() {
                    return Some(());
                }
                format!("{status}: {body}")
            }
            Err(e) => e.to_string(),
        };
        if let Ok(mut last) = last.lock() {
            *last = answer;
        }
        None
    })
    .await
    .map_err(|e| {
        let last = last.lock().map(|l| l.clone()).unwrap_or_default();
        anyhow::anyhow!("{e}; last answer: {last}")
    })
}

/// `object` as the API server stores it after structural defaulting by `crd`'s schema for
/// `version`: every absent property whose schema has a `default` gets it, at any depth of
/// what is present (apiextensions-apiserver's `structuraldefaulting`). For comparing a
/// stored custom resource with what was rendered.
pub fn with_crd_defaults(
    crd: &CustomResourceDefinition,
    version: &str,
    object: &serde_json::Value,
) -> serde_json::Value {
    let schema = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == version)
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_default();
    let mut out = object.clone();
    default_in(&schema, &mut out);
    out
}

fn default_in(schema: &serde_json::Value, value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
                for (key, sub) in props {
                    match map.get_mut(key) {
                        Some(v) => default_in(sub, v),
                        None => {
                            if let Some(d) = sub.get("default") {
                                let mut d = d.clone();
                                default_in(sub, &mut d);
                                map.insert(key.clone(), d);
                            }
                        }
                    }
                }
            } else if let Some(sub) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                for v in map.values_mut() {
                    default_in(sub, v);
                }
            }
        }
        serde_json::Value::Array(items) => {
            if let Some(sub) = schema.get("items") {
                for v in items {
                    default_in(sub, v);
                }
            }
        }
        _ => {}
    }
}
