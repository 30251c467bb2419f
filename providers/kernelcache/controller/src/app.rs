//! The `kernelcache-controller` process: its flags, and the controllers on the SDK's
//! process runtime (logging, endpoints, leader election); metrics in [`crate::metrics`].

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use kubeairunway_sdk::process::Runtime;
use tracing::info;

use crate::metrics::Metrics;
use crate::settings::Settings;
use kubeairunway_kernelcache_artifact::allow::RegistryOptions;
use kubeairunway_kernelcache_artifact::secrets::KubeSecrets;

/// Flags of `kernelcache-controller` (each also from an environment variable).
#[derive(Clone, Debug, Parser)]
#[command(
    name = "kernelcache-controller",
    version,
    about = "kubeairunway kernel-cache controller: pins and verifies cache images, aggregates node status"
)]
pub struct Cli {
    /// The cluster-scoped KernelCachePolicy to verify with.
    #[arg(long, env = "POLICY", default_value = "default")]
    pub policy: String,
    /// Registries: plain HTTP, and those images may come from.
    #[command(flatten)]
    pub registries: RegistryOptions,
    /// The namespace where registry credentials are handed over to the node agents (the
    /// agents read Secrets there only).
    #[arg(long, env = "CREDENTIALS_NAMESPACE")]
    pub credentials_namespace: Option<String>,
    /// The node agents' `--model-cache-root` (the same on every node): ready ModelCaches
    /// get a local PersistentVolume below it and a claim serving pods mount. Unset: none.
    #[arg(long, env = "MODEL_CACHE_ROOT")]
    pub model_cache_root: Option<String>,
    /// How often each cache is looked at without a change (tag moves, heartbeat).
    #[arg(long, env = "RESYNC", default_value = "5m", value_parser = kubeairunway_sdk::process::parse_duration)]
    pub resync: Duration,
    /// Flags every binary shares: metrics address, log format, leader election.
    #[command(flatten)]
    pub process: kubeairunway_sdk::process::Options,
}

/// The component's name: its Lease, its events' reporter.
pub const COMPONENT: &str = "kernelcache-controller";

impl Cli {
    /// The controller's settings.
    pub fn settings(&self) -> Settings {
        Settings {
            policy: self.policy.clone(),
            plain_http: self.registries.plain_http_registries.clone(),
            allowed: self.registries.allowed(),
            resync: self.resync,
            instance: Some(self.process.identity(COMPONENT)),
            credentials_namespace: self.credentials_namespace.clone(),
            model_cache_root: self.model_cache_root.clone(),
        }
    }
}

/// The whole `main` of `kernelcache-controller`: the process runtime (flags, logging,
/// endpoints, leader election) around [`run`].
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = Runtime::start(COMPONENT, cli.process.clone()).await?;
    run(cli, rt).await
}

/// Run the controller in `rt` (its metrics, readiness and leader terms) as `cli` says:
/// the binary's `main` and `kubeairunway up` both run it this way.
pub async fn run(cli: Cli, mut rt: Runtime) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    metrics.register(rt.registry());
    let client = rt.client();
    let secrets = Arc::new(KubeSecrets(client.clone()));
    let settings = cli.settings();
    // Ready while leading once the leader's watch caches are filled (cleared each term).
    let synced = rt.readiness().term_check("kernel-cache watch caches");
    rt.run(|term| {
        info!("leading: starting the controllers");
        super::run(
            client.clone(),
            settings.clone(),
            secrets.clone(),
            metrics.clone(),
            synced.clone(),
            async move {
                term.ended().await;
            },
        )
    })
    .await
}

#[cfg(test)]
mod tests {
    use kubeairunway_kernelcache_api::VerificationMode;

    use super::*;

    #[test]
    fn flags_and_metrics() {
        let cli = Cli::try_parse_from([
            "kernelcache-controller",
            "--plain-http-registry=127.0.0.1:5000",
            "--resync=30s",
        ])
        .unwrap();
        let s = cli.settings();
        assert_eq!(s.policy, "default");
        assert_eq!(s.plain_http, ["127.0.0.1:5000"]);
        assert_eq!(s.resync, Duration::from_secs(30));
        let m = Metrics::default();
        m.verification(VerificationMode::Key, true);
        m.verification(VerificationMode::Key, false);
        m.resolution(true);
        drop(m.reconciling("ModelDeployment"));
        let text = m.encode();
        assert!(
            text.contains(
                r#"kubeairunway_kernel_cache_verifications_total{mode="key",result="verified"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"kubeairunway_kernel_cache_resolutions_total{result="success"} 1"#)
        );
        assert!(
            text.contains(
                r#"kubeairunway_reconciliation_duration_seconds_count{provider="kernelcache",kind="ModelDeployment"} 1"#
            ),
            "{text}"
        );
    }
}
