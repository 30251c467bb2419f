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
use super::models::ModelSettings;
use super::node::KubeNode;
use super::space::Size;
use super::{Seams, Settings};
use kubeairunway_kernelcache_artifact::allow::RegistryOptions;
use kubeairunway_kernelcache_artifact::extract::Limits;
use kubeairunway_kernelcache_artifact::secrets::KubeSecrets;

pub use kubeairunway_kernelcache_api::names::DEFAULT_CACHE_ROOT;

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
    /// What all staged caches together may take on this node, each digest counted once
    /// (caches of one image share their files): bytes, a quantity (20Gi) or a share of the
    /// cache root's filesystem (20%). A cache that does not fit fails with the numbers.
    /// Unset: no budget (the free-space floor still holds).
    #[arg(long, env = "DISK_BUDGET")]
    pub disk_budget: Option<Size>,
    /// Free space no stage goes below on the cache root's filesystem (bytes, a quantity or
    /// a share: 10%), checked before a stage and bounding what it writes; also checked
    /// before each model-cache download, on the model-cache root's filesystem. Where the cache
    /// root shares the kubelet's filesystem, keep it at or above the kubelet's eviction
    /// threshold (nodefs.available, 10% by default).
    #[arg(long, env = "MIN_FREE", default_value = "5%")]
    pub min_free: Size,
    /// Most entries (files, directories, links) accepted in one cache layer.
    #[arg(long, env = "MAX_CACHE_FILES", default_value_t = Limits::default().max_entries)]
    pub max_cache_files: u64,
    /// Registries: plain HTTP, and those images may come from.
    #[command(flatten)]
    pub registries: RegistryOptions,
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
    /// Model caches (ModelCache) go here on the node, in the Hugging Face cache layout
    /// under <root>/hub (HF_HOME=<root>); unset: this agent downloads no model caches.
    #[arg(long, env = "MODEL_CACHE_ROOT")]
    pub model_cache_root: Option<PathBuf>,
    /// The Hugging Face hub model caches download from.
    #[arg(long, env = "HF_ENDPOINT", default_value = kubeairunway_modelcache_hub::client::DEFAULT_ENDPOINT)]
    pub hf_endpoint: String,
    /// Model caches downloaded at the same time on this node.
    #[arg(long, env = "PARALLEL_MODEL_DOWNLOADS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel_model_downloads: u16,
    /// Files fetched at the same time within one model-cache download.
    #[arg(long, env = "MODEL_DOWNLOAD_FILES", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub model_download_files: u16,
    /// Download progress alone is written to the KernelCacheNode at most this often (a
    /// change of state is written at once).
    #[arg(long, env = "MODEL_PROGRESS_EVERY", default_value = "5s", value_parser = parse_duration)]
    pub model_progress_every: Duration,
    /// A Ready model cache at a branch or tag is resolved again this often (one request
    /// to the hub per cache and node), and a new commit downloaded next to the one in
    /// use; `off`: only on a spec change or a restart.
    #[arg(long, env = "MODEL_REFRESH_EVERY", default_value = "1h", value_parser = parse_refresh)]
    pub model_refresh_every: Refresh,
    /// Flags every binary shares: metrics address, log format (leader election is
    /// meaningless for a per-node agent and stays off).
    #[command(flatten)]
    pub process: kubeairunway_sdk::process::Options,
}

/// `--model-refresh-every`: a duration, or none (`off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refresh(pub Option<Duration>);

/// Parses `--model-refresh-every`: `off` (or `0`), else a positive duration.
pub fn parse_refresh(s: &str) -> Result<Refresh, String> {
    match s.trim() {
        "off" | "0" => Ok(Refresh(None)),
        d => parse_duration(d).map(|d| Refresh(Some(d))),
    }
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
            plain_http: self.registries.plain_http_registries.clone(),
            allowed: self.registries.allowed(),
            resync: self.resync,
            status_refresh: self.status_refresh,
            parallel_stages: self.parallel_stages,
            credentials_namespace: self.credentials_namespace.clone(),
            disk_budget: self.disk_budget,
            min_free: self.min_free,
            models: self.model_cache_root.as_ref().map(|root| ModelSettings {
                root: root.clone(),
                hf_endpoint: self.hf_endpoint.trim_end_matches('/').to_string(),
                parallel_downloads: usize::from(self.parallel_model_downloads),
                parallel_files: usize::from(self.model_download_files),
                min_free: self.min_free,
                plain_http: self.registries.plain_http_registries.clone(),
                allowed: self.registries.allowed(),
                progress_every: self.model_progress_every,
                resync: self.resync,
                refresh_every: self.model_refresh_every.0,
            }),
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
    // Root is not refused: the chart runs the agent as a non-root owner of the cache
    // roots, and an operator who chose otherwise would only add an override flag.
    if rustix::process::geteuid().is_root() {
        tracing::warn!(
            "running as root while parsing untrusted image layers and JSON; run as the cache roots' non-root owner (docs/security.md)"
        );
    }
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
        assert!(s.allowed.is_any());
        assert!(s.models.is_none(), "no model caches without a root");
        let with_models = Cli::try_parse_from([
            "kernelcache-agent",
            "--node-name=gpu-1",
            "--model-cache-root=/var/lib/m",
            "--hf-endpoint=http://127.0.0.1:9/",
            "--parallel-model-downloads=3",
        ])
        .unwrap()
        .settings()
        .models
        .unwrap();
        assert_eq!(with_models.cache_dir(), PathBuf::from("/var/lib/m/hub"));
        assert_eq!(with_models.hf_endpoint, "http://127.0.0.1:9");
        assert_eq!(with_models.parallel_downloads, 3);
        assert_eq!(with_models.parallel_files, 4);
        assert_eq!(with_models.refresh_every, Some(Duration::from_secs(3600)));
        for (flag, refresh) in [
            ("--model-refresh-every=off", None),
            ("--model-refresh-every=0", None),
            ("--model-refresh-every=10m", Some(Duration::from_secs(600))),
        ] {
            let m = Cli::try_parse_from([
                "kernelcache-agent",
                "--node-name=n",
                "--model-cache-root=/m",
                flag,
            ])
            .unwrap()
            .settings()
            .models
            .unwrap();
            assert_eq!(m.refresh_every, refresh, "{flag}");
        }
        assert!(
            Cli::try_parse_from([
                "kernelcache-agent",
                "--node-name=n",
                "--model-refresh-every=soon"
            ])
            .is_err()
        );
        assert!(
            Cli::try_parse_from([
                "kernelcache-agent",
                "--node-name=n",
                "--parallel-model-downloads=0"
            ])
            .is_err()
        );
    }

    #[test]
    fn allowed_registries_are_checked_before_a_pull_and_bad_entries_refused_at_start() {
        let cli = Cli::try_parse_from([
            "kernelcache-agent",
            "--node-name=gpu-1",
            "--allowed-registry=ghcr.io/acme",
            "--allowed-registry=mirror:5000",
        ])
        .unwrap();
        let allowed = cli.settings().allowed;
        assert!(allowed.check("mirror:5000/any/cache:1").is_ok());
        assert!(allowed.check("ghcr.io/acme/cache:1").is_ok());
        assert!(allowed.check("ghcr.io/other/cache:1").is_err());
        let bad = Cli::try_parse_from([
            "kernelcache-agent",
            "--node-name=gpu-1",
            "--allowed-registry=https://ghcr.io",
        ])
        .unwrap_err();
        assert!(bad.to_string().contains("https://ghcr.io"), "{bad}");
    }
}
