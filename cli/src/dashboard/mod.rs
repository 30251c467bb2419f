//! `kubeairunway dashboard`: a web UI over the cluster, served by this process on a
//! loopback address and acting with the caller's kubeconfig identity, or in the cluster
//! (`--in-cluster`) acting as each signed-in user with their own token (every request the
//! UI makes is the user's own, refused by the API server when the user may not make it).
//!
//! - [`rows`]: what the Deployments page shows of a ModelDeployment (pure);
//! - [`api`]: the JSON API and the live stream (server-sent events) the page reads;
//! - [`caches`]: kernel caches, model caches, nodes and warmups (the Caches page);
//! - [`models`]: the catalogue and its GPU-memory fit estimate (the Models page);
//! - [`serving`]: a ModelDeployment's pods, their logs, and chat through the service proxy;
//! - [`view`]: one identity's client and watch cache; [`session`]: the signed-in users of
//!   the dashboard in the cluster;
//! - [`guard`]: what keeps other web pages and hosts out: the Host must be this server's
//!   loopback address (DNS rebinding) and every change carries a header a cross-site form
//!   or `fetch` without CORS cannot send (cross-site request forgery);
//! - `assets/`: the UI, a dependency-free ES module and one stylesheet, embedded in the
//!   binary (docs/dashboard.md says why no framework).

pub mod api;
pub mod caches;
pub mod guard;
pub mod models;
pub mod rows;
pub mod serving;
pub mod session;
pub mod view;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::Terminal;
use crate::cluster;

/// `dashboard`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kubeconfig to act with (default: KUBECONFIG, the running local server, ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Address to serve on: a loopback address (the UI acts with your credentials).
    #[arg(long, default_value = "127.0.0.1:3001", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// The Hugging Face hub the Models page searches (a mirror, say).
    #[arg(long, env = "HF_ENDPOINT", default_value = kubeairunway_modelcache_hub::client::DEFAULT_ENDPOINT, value_name = "URL")]
    pub hf_endpoint: String,
    /// No Hugging Face search (the built-in catalogue only): for air-gapped clusters.
    #[arg(long)]
    pub offline: bool,
    #[command(flatten)]
    pub in_cluster: InCluster,
}

/// Running in the cluster, where each user signs in with their own token.
#[derive(Debug, clap::Args)]
pub struct InCluster {
    /// Serve every user as themselves: each signs in with their own Kubernetes bearer
    /// token (or an authenticating proxy passes it in `Authorization: Bearer`); the
    /// dashboard holds no credentials and may listen on any address.
    #[arg(long)]
    pub in_cluster: bool,
    /// With --in-cluster: the API server (default: from KUBERNETES_SERVICE_HOST/PORT).
    #[arg(long, value_name = "URL", requires = "in_cluster")]
    pub api_server: Option<String>,
    /// With --in-cluster: the CA bundle the API server's certificate is checked against
    /// (re-read as it rotates).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/var/run/kubeairunway/kube-root-ca.crt",
        requires = "in_cluster"
    )]
    pub api_ca_file: PathBuf,
    /// With --in-cluster: a Host the dashboard is reached by (its Service, its Ingress
    /// host), with any port unless one is given; repeat for each. Loopback is always served.
    #[arg(long = "allowed-host", value_name = "HOST", requires = "in_cluster")]
    pub allowed_hosts: Vec<String>,
    /// With --in-cluster: a session unused this long ends.
    #[arg(long, default_value = "1h", value_parser = kubeairunway_sdk::process::parse_duration, requires = "in_cluster")]
    pub session_idle: std::time::Duration,
    /// With --in-cluster: a session ends this long after sign-in.
    #[arg(long, default_value = "12h", value_parser = kubeairunway_sdk::process::parse_duration, requires = "in_cluster")]
    pub session_lifetime: std::time::Duration,
    /// With --in-cluster: sessions alive at once (one more ends the least recently used).
    #[arg(long, default_value_t = 256, requires = "in_cluster")]
    pub max_sessions: usize,
    /// With --in-cluster: a session cookie without `Secure`, for a dashboard reached over
    /// plain HTTP by a name other than localhost (not recommended).
    #[arg(long, requires = "in_cluster")]
    pub insecure_cookie: bool,
}

/// Serve the dashboard until Ctrl-C (SIGTERM too in the cluster).
pub async fn run(args: Args, state_dir: &Path, term: &mut Terminal) -> anyhow::Result<i32> {
    let hub = (!args.offline).then(|| kubeairunway_modelcache_hub::HubOptions {
        endpoint: args.hf_endpoint.trim_end_matches('/').to_string(),
        ..kubeairunway_modelcache_hub::HubOptions::default()
    });
    if args.in_cluster.in_cluster {
        return run_in_cluster(args.listen, &args.in_cluster, hub, term).await;
    }
    if !args.listen.ip().is_loopback() {
        anyhow::bail!(
            "--listen {}: the dashboard acts with your kubeconfig's credentials, so it serves only \
             on a loopback address (127.0.0.1, ::1); reach it remotely through `ssh -L` or \
             `kubectl port-forward`",
            args.listen
        );
    }
    let target = cluster::connect(args.kubeconfig.as_deref(), state_dir).await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let address = listener.local_addr()?;
    term.err(&format!(
        "dashboard: http://{address}/ acting as your kubeconfig's identity on {} (Ctrl-C stops)\n",
        target.server
    ));
    api::serve_with(listener, target.client, hub, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(0)
}

impl InCluster {
    /// The sessions' settings these flags give.
    pub fn session_settings(&self) -> session::Settings {
        session::Settings {
            idle: self.session_idle,
            lifetime: self.session_lifetime,
            max: self.max_sessions,
            secure_cookie: !self.insecure_cookie,
        }
    }
}

/// `--in-cluster`: sessions against the API server, no credentials of its own.
async fn run_in_cluster(
    listen: SocketAddr,
    flags: &InCluster,
    hub: Option<kubeairunway_modelcache_hub::HubOptions>,
    term: &mut Terminal,
) -> anyhow::Result<i32> {
    let config = api_server(flags)?;
    let server = config.cluster_url.to_string();
    let sessions = session::Sessions::new(config, flags.session_settings());
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    term.err(&format!(
        "dashboard: http://{}/ for users signed in with their own tokens on {server}\n",
        listener.local_addr()?
    ));
    api::serve_signed_in(
        listener,
        sessions,
        flags.allowed_hosts.clone(),
        hub,
        kubeairunway_sdk::process::terminated(),
    )
    .await?;
    Ok(0)
}

/// The API server's address and CA, without credentials: `--api-server` or the
/// `KUBERNETES_SERVICE_HOST`/`PORT` every pod is given, and `--api-ca-file`.
pub fn api_server(flags: &InCluster) -> anyhow::Result<kube::Config> {
    let url = if let Some(url) = &flags.api_server {
        url.clone()
    } else {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .context("--api-server not given and KUBERNETES_SERVICE_HOST not set")?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        if host.contains(':') {
            format!("https://[{host}]:{port}")
        } else {
            format!("https://{host}:{port}")
        }
    };
    anyhow::ensure!(
        flags.api_ca_file.is_file(),
        "--api-ca-file {}: no such file (the cluster's CA bundle, the kube-root-ca.crt ConfigMap)",
        flags.api_ca_file.display()
    );
    let mut config = kube::Config::new(url.parse().with_context(|| format!("--api-server {url}"))?);
    config.root_cert_file = Some(flags.api_ca_file.clone());
    Ok(config)
}
