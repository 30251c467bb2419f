//! `kubeairunway providers`: the registered providers (their InferenceProviderConfigs)
//! with ready, version, heartbeat age and detected upstream API, and how to install the
//! ones that are not ready or not registered (from `spec.installation`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kubeairunway_sdk::InferenceProviderConfig;
use kubeairunway_sdk::api::{Capabilities, Installation};
use serde::Serialize;

use crate::Terminal;
use crate::builtin::BuiltIns;
use crate::cluster;
use crate::output::{self, Format, Table, or_dash};

/// `providers`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kubeconfig of the cluster (default: KUBECONFIG, the local cluster of `up`, then
    /// ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Format,
}

/// One provider, registered or built in but missing.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Provider name.
    pub name: String,
    /// Whether it has an InferenceProviderConfig.
    pub registered: bool,
    /// `status.ready`.
    pub ready: bool,
    /// `status.version`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `status.lastHeartbeat`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<String>,
    /// Age of the heartbeat (`12s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_age: Option<String>,
    /// `status.upstreamCRDVersion`: the upstream API it renders for.
    #[serde(rename = "upstreamCRDVersion", skip_serializing_if = "Option::is_none")]
    pub upstream_crd_version: Option<String>,
    /// What it serves, per engine (`vllm on gpu (aggregated); llamacpp on gpu/cpu
    /// (aggregated)`), or adds (`features: kernelCache`).
    pub serves: String,
    /// How to install it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installation: Option<Installation>,
    /// Where to read about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub documentation: Option<String>,
}

/// What capabilities say a provider serves, in a few words.
pub fn serves(caps: Option<&Capabilities>) -> String {
    let Some(caps) = caps else {
        return "-".into();
    };
    if caps.engines.is_empty() {
        return format!("features: {}", caps.features.join(","));
    }
    let engines: Vec<String> = caps
        .engine_names()
        .into_iter()
        .filter_map(|name| caps.engine(name))
        .map(|e| {
            let hw: Vec<&str> = [(e.gpu_support, "gpu"), (e.cpu_support, "cpu")]
                .into_iter()
                .filter_map(|(on, hw)| on.then_some(hw))
                .collect();
            let modes: Vec<&str> = e.serving_modes.iter().map(|m| m.as_str()).collect();
            format!("{} on {} ({})", e.name, hw.join("/"), modes.join(", "))
        })
        .collect();
    engines.join("; ")
}

/// Installation hints as lines for a person: what to install, Helm repositories and
/// charts as commands, and manual steps.
pub fn install_lines(installation: &Installation) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(d) = &installation.description {
        lines.push(d.clone());
    }
    for repo in &installation.helm_repos {
        lines.push(format!("helm repo add {} {}", repo.name, repo.url));
    }
    for chart in &installation.helm_charts {
        let mut line = format!(
            "helm install {} {} -n {}",
            chart.name, chart.chart, chart.namespace
        );
        if chart.create_namespace == Some(true) {
            line.push_str(" --create-namespace");
        }
        if let Some(v) = &chart.version {
            let _ = write!(line, " --version {v}");
        }
        lines.push(line);
    }
    for step in &installation.steps {
        let mut line = format!("{}: {}", step.title, step.description);
        if let Some(c) = &step.command {
            let _ = write!(line, " ({c})");
        }
        lines.push(line);
    }
    lines
}

/// The entries for `configs`, and for the built-in providers that are not registered.
pub fn entries(configs: &[InferenceProviderConfig], now: Timestamp) -> Vec<Entry> {
    let mut entries: Vec<Entry> = configs
        .iter()
        .map(|c| {
            let status = c.status.clone().unwrap_or_default();
            Entry {
                name: c.name_any(),
                registered: true,
                ready: status.ready == Some(true),
                version: status.version,
                last_heartbeat: status.last_heartbeat.as_ref().map(|t| t.0.to_string()),
                heartbeat_age: status.last_heartbeat.map(|t| output::age(t.0, now)),
                upstream_crd_version: status.upstream_crd_version,
                serves: serves(c.spec.capabilities.as_ref()),
                installation: c.spec.installation.clone(),
                documentation: c.spec.documentation.clone(),
            }
        })
        .collect();
    let builtins = BuiltIns::defaults();
    for p in builtins.all() {
        if entries.iter().any(|e| e.name == p.name()) {
            continue;
        }
        let config = p.config();
        entries.push(Entry {
            name: p.name().to_string(),
            registered: false,
            ready: false,
            version: None,
            last_heartbeat: None,
            heartbeat_age: None,
            upstream_crd_version: None,
            serves: serves(config.capabilities.as_ref()),
            installation: config.installation,
            documentation: config.documentation,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

/// The table and the installation hints of the providers that need action.
pub fn table(entries: &[Entry]) -> String {
    let mut table = Table::new(&[
        "NAME",
        "READY",
        "VERSION",
        "HEARTBEAT",
        "UPSTREAM",
        "SERVES",
    ]);
    for e in entries {
        table.row(vec![
            e.name.clone(),
            if e.registered {
                e.ready.to_string()
            } else {
                "not registered".into()
            },
            or_dash(e.version.as_ref()),
            e.heartbeat_age
                .as_ref()
                .map_or_else(|| "-".into(), |a| format!("{a} ago")),
            or_dash(e.upstream_crd_version.as_ref()),
            e.serves.clone(),
        ]);
    }
    let mut out = table.render();
    for e in entries.iter().filter(|e| !e.ready) {
        let _ = writeln!(
            out,
            "\n{} is {}. To install it:",
            e.name,
            if e.registered {
                "registered but not ready (its upstream CRD missing, or its controller stopped)"
            } else {
                "not registered"
            }
        );
        let lines = e
            .installation
            .as_ref()
            .map(install_lines)
            .unwrap_or_default();
        if lines.is_empty() {
            out.push_str("  (its registration gives no installation hints)\n");
        }
        for line in lines {
            let _ = writeln!(out, "  {line}");
        }
        if let Some(doc) = &e.documentation {
            let _ = writeln!(out, "  see {doc}");
        }
    }
    out
}

/// Read every InferenceProviderConfig, with an actionable error when the CRD is missing.
pub async fn list(client: &kube::Client) -> anyhow::Result<Vec<InferenceProviderConfig>> {
    let api: Api<InferenceProviderConfig> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(s)) if s.code == 404 => anyhow::bail!(
            "this cluster has no InferenceProviderConfig CRD (inferenceproviderconfigs.kubeairunway.ai): kubeairunway is not installed; run `kubeairunway up --kubeconfig PATH` or install charts/kubeairunway"
        ),
        Err(e) => Err(e).context("listing InferenceProviderConfigs"),
    }
}

/// Run `providers`.
pub async fn run(args: Args, state_dir: &Path, term: &mut Terminal) -> anyhow::Result<i32> {
    let target = cluster::connect(args.kubeconfig.as_deref(), state_dir).await?;
    let configs = list(&target.client).await?;
    let entries = entries(&configs, Timestamp::now());
    term.out(&match args.output {
        Format::Table => table(&entries),
        Format::Yaml => output::yaml(&entries)?,
        Format::Json => output::json(&entries)?,
    });
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kubeairunway_sdk::InferenceProviderConfigStatus;
    use kubeairunway_sdk::Provider as _;

    #[test]
    fn missing_built_ins_are_listed_with_how_to_install_them() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let builtins = BuiltIns::defaults();
        let mut kaito = InferenceProviderConfig::new("kaito", builtins.kaito.config());
        kaito.status = Some(InferenceProviderConfigStatus {
            ready: Some(true),
            version: Some("0.1.0".into()),
            last_heartbeat: Some(Time("2026-01-01T00:00:48Z".parse().unwrap())),
            upstream_crd_version: Some("kaito.sh/v1beta1".into()),
            ..Default::default()
        });
        let entries = entries(&[kaito], now);
        let names: Vec<(&str, bool)> = entries
            .iter()
            .map(|e| (e.name.as_str(), e.registered))
            .collect();
        assert_eq!(
            names,
            [
                ("deployment", false),
                ("dynamo", false),
                ("kaito", true),
                ("kuberay", false)
            ]
        );
        let text = table(&entries);
        assert!(
            text.contains("kaito        true             0.1.0     12s ago     kaito.sh/v1beta1   vllm on gpu (aggregated); llamacpp on gpu/cpu (aggregated)"),
            "{text}"
        );
        assert!(
            text.contains("\nkuberay is not registered. To install it:\n"),
            "{text}"
        );
        assert!(!text.contains("kaito is"), "{text}");
        for p in [
            &builtins.kuberay as &dyn kubeairunway_sdk::Provider,
            &builtins.deployment,
        ] {
            for line in install_lines(&p.config().installation.unwrap()) {
                assert!(text.contains(&line), "{line} in {text}");
            }
        }
        // The Deployment provider needs no operator: its own chart is the installation.
        assert!(
            text.contains("helm install deployment-provider oci://ghcr.io/kubeairunway/charts/deployment-provider -n kubeairunway-system --version "),
            "{text}"
        );
    }
}
