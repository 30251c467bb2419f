//! `kubeairunway dashboard`: a web UI over the cluster, served by this process on a
//! loopback address and acting with the caller's kubeconfig identity (every request the UI
//! makes is the user's own, refused by the API server when the user may not make it).
//!
//! - [`rows`]: what the Deployments page shows of a ModelDeployment (pure);
//! - [`api`]: the JSON API and the live stream (server-sent events) the page reads;
//! - [`caches`]: kernel caches, model caches, nodes and warmups (the Caches page);
//! - [`models`]: the catalogue and its GPU-memory fit estimate (the Models page);
//! - [`serving`]: a ModelDeployment's pods, their logs, and chat through the service proxy;
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
}

/// Serve the dashboard until Ctrl-C.
pub async fn run(args: Args, state_dir: &Path, term: &mut Terminal) -> anyhow::Result<i32> {
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
    let hub = (!args.offline).then(|| kubeairunway_modelcache_hub::HubOptions {
        endpoint: args.hf_endpoint.trim_end_matches('/').to_string(),
        ..kubeairunway_modelcache_hub::HubOptions::default()
    });
    api::serve_with(listener, target.client, hub, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(0)
}
