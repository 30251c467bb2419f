//! Core, the built-in providers and the kernel-cache controller, run in this process as
//! their binaries run them: each through its crate's entry point on the SDK's process
//! runtime (`Runtime::with_client`: one client, one stop signal), without webhooks,
//! leader election or metrics servers. The only place that knows how each starts.

use std::time::Duration;

use clap::Parser as _;
use kube::Client;
use kubeairunway_kernelcache_controller::app as kernel_cache_app;
use kubeairunway_sdk::Provider;
use kubeairunway_sdk::process::{self, Runtime, Shutdown};
use kubeairunway_sdk::runtime;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::builtin::BuiltIns;

/// Name of core in [`Controllers::names`].
pub const CORE: &str = "core";
/// Name of the kernel-cache controller in [`Controllers::names`].
pub const KERNEL_CACHE: &str = "kernelcache";

/// How long [`Controllers::stop`] waits for the controllers to finish.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Process flags of every component run here: no metrics server, no leader election.
const PROCESS_FLAGS: [&str; 2] = ["--metrics-bind-address=", "--leader-elect=false"];

type Task = (String, anyhow::Result<()>);

/// The running controllers; stopped by [`Controllers::stop`] (or when dropped, abruptly).
#[derive(Debug)]
pub struct Controllers {
    stop: watch::Sender<bool>,
    tasks: JoinSet<Task>,
    names: Vec<String>,
}

impl Controllers {
    /// Start core, the providers of `builtins` named in `providers`, and the kernel-cache
    /// controller against `client`.
    pub fn start(client: &Client, builtins: BuiltIns, providers: &[&str]) -> anyhow::Result<Self> {
        if let Some(other) = providers
            .iter()
            .find(|p| !crate::builtin::NAMES.contains(p))
        {
            anyhow::bail!("no built-in provider named {other}");
        }
        let (stop, stopped) = watch::channel(false);
        let shutdown = Shutdown::on(async move {
            let mut rx = stopped;
            let _ = rx.wait_for(|s| *s).await;
        });
        let runtime = |component: &str, options: process::Options| {
            Runtime::with_client(component, options, client.clone(), shutdown.clone())
        };
        let mut tasks = JoinSet::new();
        let mut names = Vec::new();

        let core = kubeairunway_core::app::Cli::try_parse_from(
            ["kubeairunway-controller", "--enable-webhooks=false"]
                .into_iter()
                .chain(PROCESS_FLAGS),
        )?;
        let rt = runtime(kubeairunway_core::app::COMPONENT, core.process.clone());
        tasks.spawn(async move {
            (
                CORE.to_string(),
                kubeairunway_core::app::run(core, rt).await,
            )
        });
        names.push(CORE.to_string());

        let options = runtime::Options {
            process: process::Options {
                metrics_bind_address: String::new(),
                leader_elect: false,
                ..process::Options::default()
            },
            ..runtime::Options::default()
        };
        let BuiltIns {
            kaito,
            dynamo,
            kuberay,
            deployment,
        } = builtins;
        let wanted = |name: &str| providers.contains(&name);
        if wanted(kubeairunway_deployment_provider::NAME) {
            names.push(spawn(&mut tasks, deployment, &runtime, &options));
        }
        if wanted(kubeairunway_dynamo_provider::NAME) {
            names.push(spawn(&mut tasks, dynamo, &runtime, &options));
        }
        if wanted(kubeairunway_kaito_provider::NAME) {
            names.push(spawn(&mut tasks, kaito, &runtime, &options));
        }
        if wanted(kubeairunway_kuberay_provider::NAME) {
            names.push(spawn(&mut tasks, kuberay, &runtime, &options));
        }

        let kernel_cache = kernel_cache_app::Cli::try_parse_from(
            std::iter::once(kernel_cache_app::COMPONENT).chain(PROCESS_FLAGS),
        )?;
        let rt = runtime(kernel_cache_app::COMPONENT, kernel_cache.process.clone());
        tasks.spawn(async move {
            let r = kernel_cache_app::run(kernel_cache, rt).await;
            (KERNEL_CACHE.to_string(), r)
        });
        names.push(KERNEL_CACHE.to_string());
        Ok(Self { stop, tasks, names })
    }

    /// What runs, in start order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The first controller that ends by itself (an error, usually), if one does.
    pub async fn exited(&mut self) -> Option<Task> {
        match self.tasks.join_next().await? {
            Ok(r) => Some(r),
            Err(e) => Some(("a controller".into(), Err(anyhow::anyhow!("{e}")))),
        }
    }

    /// Ask every controller to stop and wait for them (nothing in the cluster is
    /// changed). A controller still running after [`STOP_TIMEOUT`] is aborted and
    /// reported as such.
    pub async fn stop(mut self) -> Vec<Task> {
        self.stop.send_replace(true);
        let mut results: Vec<Task> = Vec::new();
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

/// Run `provider` on the SDK runtime in a task; returns its name.
fn spawn<P: Provider>(
    tasks: &mut JoinSet<Task>,
    provider: P,
    runtime: &impl Fn(&str, process::Options) -> Runtime,
    options: &runtime::Options,
) -> String {
    let name = provider.name().to_string();
    let rt = runtime(&runtime::field_manager(&name), options.process.clone());
    let (options, task_name) = (options.clone(), name.clone());
    tasks.spawn(async move { (task_name, runtime::run(provider, rt, options).await) });
    name
}
