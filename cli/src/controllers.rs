//! Core, the built-in providers and the kernel-cache controller, run in this process as
//! their binaries run them (each through its crate's own entry point), without webhooks,
//! leader election or metrics servers. The only place that knows how each starts.

use std::sync::Arc;

use clap::Parser as _;
use kube::Client;
use kubeairunway_sdk::Provider;
use kubeairunway_sdk::runtime::{self, Options};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::builtin::BuiltIns;

/// Name of core in [`Controllers::names`].
pub const CORE: &str = "core";
/// Name of the kernel-cache controller in [`Controllers::names`].
pub const KERNEL_CACHE: &str = "kernelcache";

/// The running controllers; stopped by [`Controllers::stop`] (or when dropped, abruptly).
#[derive(Debug)]
pub struct Controllers {
    stop: watch::Sender<bool>,
    tasks: JoinSet<(String, anyhow::Result<()>)>,
    names: Vec<String>,
}

impl Controllers {
    /// Start core, the providers of `builtins` named in `providers`, and the kernel-cache
    /// controller against `client`.
    pub fn start(client: &Client, builtins: BuiltIns, providers: &[&str]) -> anyhow::Result<Self> {
        let (stop, stopped) = watch::channel(false);
        let until = move || {
            let mut rx = stopped.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let mut tasks = JoinSet::new();
        let mut names = vec![CORE.to_string()];

        let core = kubeairunway_core::app::Cli::try_parse_from([
            "kubeairunway-controller",
            "--enable-webhooks=false",
            "--leader-elect=false",
            "--metrics-bind-address=127.0.0.1:0",
        ])?;
        tasks.spawn({
            let (client, stop) = (client.clone(), until());
            async move {
                let r = kubeairunway_core::app::run(core, client, stop).await;
                (CORE.to_string(), r)
            }
        });

        if let Some(other) = providers
            .iter()
            .find(|p| !crate::builtin::NAMES.contains(p))
        {
            anyhow::bail!("no built-in provider named {other}");
        }
        let BuiltIns {
            kaito,
            dynamo,
            kuberay,
        } = builtins;
        let wanted = |name: &str| providers.contains(&name);
        if wanted(kubeairunway_dynamo_provider::NAME) {
            names.push(spawn(&mut tasks, dynamo, client, until()));
        }
        if wanted(kubeairunway_kaito_provider::NAME) {
            names.push(spawn(&mut tasks, kaito, client, until()));
        }
        if wanted(kubeairunway_kuberay_provider::NAME) {
            names.push(spawn(&mut tasks, kuberay, client, until()));
        }

        tasks.spawn({
            let (client, stop) = (client.clone(), until());
            async move {
                let controller = kubeairunway_kernelcache::controller::run(
                    client.clone(),
                    kubeairunway_kernelcache::controller::Settings {
                        instance: Some("kubeairunway-up".into()),
                        ..Default::default()
                    },
                    Arc::new(kubeairunway_kernelcache::agent::secrets::KubeSecrets(
                        client,
                    )),
                    Arc::new(kubeairunway_kernelcache::controller::app::Metrics::default()),
                    stop,
                );
                (KERNEL_CACHE.to_string(), controller.await)
            }
        });
        names.push(KERNEL_CACHE.to_string());
        Ok(Self { stop, tasks, names })
    }

    /// What runs, in start order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The first controller that ends by itself (an error, usually), if one does.
    pub async fn exited(&mut self) -> Option<(String, anyhow::Result<()>)> {
        match self.tasks.join_next().await? {
            Ok(r) => Some(r),
            Err(e) => Some(("a controller".into(), Err(anyhow::anyhow!("{e}")))),
        }
    }

    /// Ask every controller to stop and wait for them (providers release their
    /// ModelDeployments' watches; nothing in the cluster is changed). A controller still
    /// running after [`STOP_TIMEOUT`] is aborted and reported as such.
    pub async fn stop(mut self) -> Vec<(String, anyhow::Result<()>)> {
        self.stop.send_replace(true);
        let mut results = Vec::new();
        let deadline = tokio::time::Instant::now() + STOP_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.tasks.join_next()).await {
                Ok(Some(r)) => results.push(
                    r.unwrap_or_else(|e| ("a controller".into(), Err(anyhow::anyhow!("{e}")))),
                ),
                Ok(None) => break,
                Err(_) => {
                    self.tasks.abort_all();
                    let stopped: Vec<String> = results.iter().map(|(n, _)| n.clone()).collect();
                    for name in self.names.iter().filter(|n| !stopped.contains(n)) {
                        results.push((
                            name.clone(),
                            Err(anyhow::anyhow!(
                                "did not stop within {}s; aborted",
                                STOP_TIMEOUT.as_secs()
                            )),
                        ));
                    }
                    break;
                }
            }
        }
        results
    }
}

/// How long [`Controllers::stop`] waits for the controllers to finish.
pub const STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Runtime options of a provider run by `up`: the defaults of its binary, without a
/// metrics server.
pub fn provider_options() -> Options {
    Options {
        metrics_addr: String::new(),
        ..Options::default()
    }
}

/// Run `provider` on the SDK runtime in a task; returns its name.
fn spawn<P: Provider>(
    tasks: &mut JoinSet<(String, anyhow::Result<()>)>,
    provider: P,
    client: &Client,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> String {
    let name = provider.name().to_string();
    let client = client.clone();
    let task_name = name.clone();
    tasks.spawn(async move {
        let stop = async move {
            stop.await;
            anyhow::Ok(())
        };
        let r = runtime::run_until(provider, client, provider_options(), stop).await;
        (task_name, r)
    });
    name
}
