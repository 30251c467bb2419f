//! `helm lint` and `helm template` for the chart tests. `scripts/test.sh` installs helm
//! (`scripts/install-helm.sh`) and exports `HELM`; without it, the cached binary is used.
//! In CI (`CI=true`) a missing helm fails the tests instead of skipping them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The helm binary: `$HELM`, else the one `scripts/install-helm.sh` caches.
pub fn binary() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HELM")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
    {
        return Some(h);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("kubeairunway/helm/helm")).filter(|p| p.is_file())
}

/// The helm binary, or `None` with a message when it is absent outside CI; panics in CI.
pub fn require() -> Option<PathBuf> {
    let found = binary();
    if found.is_none() {
        assert!(
            std::env::var("CI").is_err(),
            "helm is missing in CI: run scripts/install-helm.sh"
        );
        eprintln!("helm not found: skipping (run scripts/install-helm.sh)");
    }
    found
}

/// The chart directory `charts/<name>` of the repository.
pub fn chart(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts")
        .join(name)
}

/// `helm lint --strict` on a chart; its output on success.
pub fn lint(helm: &Path, chart: &Path) -> anyhow::Result<String> {
    let out = Command::new(helm)
        .arg("lint")
        .arg("--strict")
        .arg(chart)
        .output()
        .context("running helm lint")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("helm lint {} failed:\n{text}", chart.display());
    }
    Ok(text)
}

/// `helm template` with `--set` values; every rendered object.
pub fn template(
    helm: &Path,
    chart: &Path,
    set: &[(&str, &str)],
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut cmd = Command::new(helm);
    cmd.args([
        "template",
        "release",
        "--namespace",
        "kubeairunway-system",
        "--include-crds",
    ])
    .arg(chart);
    for (k, v) in set {
        cmd.arg("--set").arg(format!("{k}={v}"));
    }
    let out = cmd.output().context("running helm template")?;
    if !out.status.success() {
        bail!(
            "helm template {} failed:\n{}",
            chart.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).context("parsing helm template output")?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The rendered objects of `kind`.
pub fn of_kind<'a>(objects: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// Server-side apply the rendered objects of the kinds in `kinds` (for example the
/// Service, ServiceAccount and webhook configurations of a chart) as the user `helm`
/// installs with, into the namespace `helm template` rendered them for.
pub async fn apply_kinds(
    client: &kube::Client,
    objects: &[serde_json::Value],
    kinds: &[&str],
) -> anyhow::Result<()> {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kube::discovery::{ApiResource, Scope};
    let discovery = kube::Discovery::new(client.clone()).run().await?;
    for obj in objects
        .iter()
        .filter(|o| kinds.iter().any(|k| o["kind"] == *k))
    {
        let (group, version) = match obj["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .split_once('/')
        {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (
                String::new(),
                obj["apiVersion"].as_str().unwrap_or_default().to_string(),
            ),
        };
        let kind = obj["kind"].as_str().unwrap_or_default();
        let gvk = kube::core::GroupVersionKind::gvk(&group, &version, kind);
        let (ar, caps): (ApiResource, _) = discovery
            .resolve_gvk(&gvk)
            .with_context(|| format!("{kind} is not served"))?;
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj["metadata"]["namespace"].as_str().unwrap_or("default"),
                &ar,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            name,
            &PatchParams::apply("helm").force(),
            &Patch::Apply(obj),
        )
        .await
        .with_context(|| format!("applying {kind} {name}"))?;
    }
    Ok(())
}

/// The container `container` of the rendered workload (Deployment or DaemonSet) `name`.
pub fn container<'a>(
    objects: &'a [serde_json::Value],
    name: &str,
    container: &str,
) -> Option<&'a serde_json::Value> {
    objects
        .iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("Deployment" | "DaemonSet")))
        .find(|o| o["metadata"]["name"] == name)?["spec"]["template"]["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == container)
}

/// A container's `args`, each `--flag=value` whose flag is in `replace` given the new
/// value instead (loopback bind addresses for a process run by a test, say).
pub fn args_with(container: &serde_json::Value, replace: &[(&str, String)]) -> Vec<String> {
    container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str())
        .map(|a| {
            replace
                .iter()
                .find(|(flag, _)| a.starts_with(&format!("--{flag}=")))
                .map_or_else(|| a.to_string(), |(flag, v)| format!("--{flag}={v}"))
        })
        .collect()
}
