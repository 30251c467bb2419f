//! The `kernelcache-agent` process: flags, logging, the metrics and health server, and
//! the agent loop with the real seams (NVML or an inventory file, the Node, Secrets).

use kubeairunway_sdk::process::{Runtime, parse_duration};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tracing::info;

use super::gpu::{GpuSource, Nvml, Static};
use super::metrics::Metrics;
use super::node::KubeNode;
use super::secrets::KubeSecrets;
use super::{Seams, Settings};
use crate::extract::Limits;

/// Where caches are staged unless told otherwise (the webhook mounts from the same root).
pub const DEFAULT_CACHE_ROOT: &str = "/var/lib/kubeairunway/kernel-caches";

/// Flags of `kernelcache-agent` (each also from an environment variable).
#[derive(Clone, Debug, Parser)]
#[command(
    name = "kernelcache-agent",
    version,
    about = "kubeairunway kernel-cache node agent: detects GPUs and stages verified kernel caches that fit them"
)]
pub struct Cli {
    /// This node's name (the KernelCacheNode and the Node labelled).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Where caches are staged: <root>/<namespace>/<name>/<digest>.
    #[arg(long, env = "CACHE_ROOT", default_value = DEFAULT_CACHE_ROOT)]
    pub cache_root: PathBuf,
    /// A GPU inventory file (YAML or JSON) used instead of NVML: for tests and for GPUs
    /// NVML cannot see (e.g. AMD: `[{backend: hip, arch: gfx90a}]`).
    #[arg(long, env = "GPU_INVENTORY")]
    pub gpu_inventory: Option<PathBuf>,
    /// Largest cache content accepted, in bytes.
    #[arg(long, env = "MAX_CACHE_BYTES", default_value_t = Limits::default().max_bytes)]
    pub max_cache_bytes: u64,
    /// Bytes all staged caches together may take on this node, each digest counted once
    /// (caches of one image share their files); a cache that does not fit fails with the
    /// numbers. Unset: no budget (the free space is still checked before each stage).
    #[arg(long, env = "DISK_BUDGET")]
    pub disk_budget: Option<u64>,
    /// Most entries (files, directories, links) accepted in one cache layer.
    #[arg(long, env = "MAX_CACHE_FILES", default_value_t = Limits::default().max_entries)]
    pub max_cache_files: u64,
    /// A registry (`host:port`) spoken to over plain HTTP; repeatable (the environment
    /// variable takes a comma-separated list). For tests and local mirrors only.
    #[arg(
        long = "plain-http-registry",
        env = "PLAIN_HTTP_REGISTRIES",
        value_name = "HOST:PORT",
        value_delimiter = ','
    )]
    pub plain_http_registries: Vec<String>,
    /// The namespace where the controller hands over the registry credentials of caches
    /// that name imagePullSecrets (the agent reads Secrets there only).
    #[arg(long, env = "CREDENTIALS_NAMESPACE")]
    pub credentials_namespace: Option<String>,
    /// How often to reconcile without a change (GPUs detected again, failures retried).
    #[arg(long, env = "RESYNC", default_value = "2m", value_parser = parse_duration)]
    pub resync: Duration,
    /// How often the KernelCacheNode status is rewritten although nothing changed.
    #[arg(long, env = "STATUS_REFRESH", default_value = "10m", value_parser = parse_duration)]
    pub status_refresh: Duration,
    /// Caches pulled and extracted at the same time.
    #[arg(long, env = "PARALLEL_STAGES", default_value_t = 2)]
    pub parallel_stages: usize,
    /// Flags every binary shares: metrics address, log format (leader election is
    /// meaningless for a per-node agent and stays off).
    #[command(flatten)]
    pub process: kubeairunway_sdk::process::Options,
}

/// The component's name.
pub const COMPONENT: &str = "kernelcache-agent";

impl Cli {
    /// The agent's settings.
    pub fn settings(&self) -> Settings {
        Settings {
            node_name: self.node_name.clone(),
            cache_root: self.cache_root.clone(),
            limits: Limits {
                max_bytes: self.max_cache_bytes,
                max_entries: self.max_cache_files,
            },
            plain_http: self.plain_http_registries.clone(),
            resync: self.resync,
            status_refresh: self.status_refresh,
            parallel_stages: self.parallel_stages,
            credentials_namespace: self.credentials_namespace.clone(),
            disk_budget: self.disk_budget,
        }
    }

    /// The GPU source: the inventory file when given, else NVML.
    pub fn gpu_source(&self) -> anyhow::Result<Arc<dyn GpuSource>> {
        Ok(match &self.gpu_inventory {
            Some(path) => Arc::new(Static::from_file(path).map_err(anyhow::Error::msg)?),
            None => Arc::new(Nvml),
        })
    }
}

/// The whole `main` of `kernelcache-agent`.
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let gpus = cli.gpu_source()?;
    let mut options = cli.process.clone();
    options.leader_elect = false;
    let mut rt = Runtime::start(COMPONENT, options).await?;
    let settings = cli.settings();
    let metrics = Arc::new(Metrics::new(&settings.node_name));
    metrics.register(rt.registry());
    let client = rt.client();
    let seams = Seams {
        gpus,
        node: Arc::new(KubeNode::watch(client.clone(), &settings.node_name)),
        secrets: Arc::new(KubeSecrets(client.clone())),
    };
    info!(node = %settings.node_name, root = %settings.cache_root.display(), "kernel-cache agent starting");
    let mut seams = Some(seams);
    rt.run(|term| {
        let (client, settings, metrics) = (client.clone(), settings.clone(), metrics.clone());
        let seams = seams.take();
        async move {
            let Some(seams) = seams else {
                return Ok(());
            };
            super::run(client, settings, seams, metrics, async move {
                term.ended().await;
            })
            .await
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_with_defaults() {
        let cli = Cli::try_parse_from([
            "kernelcache-agent",
            "--node-name=gpu-1",
            "--plain-http-registry=127.0.0.1:5000",
            "--plain-http-registry=mirror:80",
            "--resync=30s",
        ])
        .unwrap();
        let s = cli.settings();
        assert_eq!(s.node_name, "gpu-1");
        assert_eq!(s.cache_root, PathBuf::from(DEFAULT_CACHE_ROOT));
        assert_eq!(s.plain_http, ["127.0.0.1:5000", "mirror:80"]);
        assert_eq!(s.resync, Duration::from_secs(30));
        assert_eq!(s.limits, Limits::default());
        assert!(cli.gpu_inventory.is_none());
        assert!(Cli::try_parse_from(["kernelcache-agent", "--node-name=n", "--resync=0"]).is_err());
    }

    #[test]
    fn every_flag_has_one_environment_variable_shared_with_the_controller_and_named_in_the_readme()
    {
        use clap::CommandFactory;
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/kernelcache.md"),
        )
        .unwrap()
        .replace('\n', " ");
        // long flag -> (environment variable, value delimiter), across both binaries.
        let mut seen: std::collections::BTreeMap<String, (String, Option<char>)> =
            std::collections::BTreeMap::new();
        for cmd in [Cli::command(), crate::controller::app::Cli::command()] {
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if ["help", "version"].contains(&long) {
                    continue;
                }
                let env = arg
                    .get_env()
                    .and_then(|e| e.to_str())
                    .unwrap_or_else(|| {
                        panic!("{} --{long} has no environment variable", cmd.get_name())
                    })
                    .to_string();
                let named = format!("`--{long}` (`{env}`");
                assert!(readme.contains(&named), "the README does not name {named})");
                let this = (env, arg.get_value_delimiter());
                if let Some(other) = seen.insert(long.to_string(), this.clone()) {
                    assert_eq!(other, this, "--{long} differs between the binaries");
                }
            }
        }
        assert_eq!(
            seen["plain-http-registry"],
            ("PLAIN_HTTP_REGISTRIES".to_string(), Some(','))
        );
    }
}
