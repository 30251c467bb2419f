//! The `kernelcache-warmup` process: its flags, and the controllers on the SDK's process
//! runtime (logging, `/metrics` `/healthz` `/readyz`, leader election); metrics in
//! [`crate::metrics`].

use std::sync::Arc;

use clap::Parser;
use kubeairunway_sdk::process::Runtime;
use tracing::info;

use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::reconcile::Settings;

/// The component's name: its Lease, its events' reporter.
pub const COMPONENT: &str = "kernelcache-warmup";

/// Flags of `kernelcache-warmup` (each also from an environment variable).
#[derive(Clone, Debug, Parser)]
#[command(
    name = "kernelcache-warmup",
    version,
    about = "kubeairunway warmup controller: warms nodes (images, kernel caches, custom pods) before models run there"
)]
pub struct Cli {
    /// The image holding `/kernelcache-noop` (this provider's image): warmup pods copy the
    /// static no-op from it to run any image without a shell.
    #[arg(long, env = "TOOLS_IMAGE")]
    pub tools_image: String,
    /// Let custom actions run privileged pods: the node's namespaces, privileged
    /// containers, any capability, any hostPath. Off: a custom action's pod keeps to the
    /// Pod Security baseline rules.
    #[arg(long, env = "ALLOW_PRIVILEGED_CUSTOM_ACTIONS", default_value_t = false, action = clap::ArgAction::Set)]
    pub allow_privileged_custom_actions: bool,
    /// A host path (and what is below it) custom actions may mount; repeatable (the
    /// environment variable takes a comma-separated list).
    #[arg(
        long = "custom-action-host-path",
        env = "CUSTOM_ACTION_HOST_PATHS",
        value_name = "PATH",
        value_delimiter = ','
    )]
    pub custom_action_host_paths: Vec<String>,
    /// A service account custom actions may run as besides their namespace's default;
    /// repeatable (the environment variable takes a comma-separated list).
    #[arg(
        long = "custom-action-service-account",
        env = "CUSTOM_ACTION_SERVICE_ACCOUNTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub custom_action_service_accounts: Vec<String>,
    /// Flags every binary shares: metrics address, log format, leader election.
    #[command(flatten)]
    pub process: kubeairunway_sdk::process::Options,
}

impl Cli {
    /// The controller's settings.
    pub fn settings(&self) -> Settings {
        Settings {
            tools_image: self.tools_image.clone(),
            instance: Some(self.process.identity(COMPONENT)),
            custom_actions: Policy {
                privileged: self.allow_privileged_custom_actions,
                host_paths: self.custom_action_host_paths.clone(),
                service_accounts: self.custom_action_service_accounts.clone(),
            },
        }
    }
}

/// Run the controllers on `rt` until the process stops: only while this replica leads;
/// ready once its caches are filled.
pub async fn run(cli: Cli, mut rt: Runtime, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    metrics.register(rt.registry());
    let client = rt.client();
    let settings = cli.settings();
    let readiness = rt.readiness();
    rt.run(move |term| {
        info!("leading: starting the warmup controller");
        let synced = readiness.term_check("caches");
        crate::reconcile::run(
            client.clone(),
            settings.clone(),
            metrics.clone(),
            synced,
            async move { term.ended().await },
        )
    })
    .await
}

/// The whole `main` of `kernelcache-warmup`.
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = Runtime::start(COMPONENT, cli.process.clone()).await?;
    run(cli, rt, Arc::new(Metrics::default())).await
}

#[cfg(test)]
mod tests {
    use kubeairunway_sdk::api::WarmupPhase;

    use super::*;

    #[test]
    fn flags_and_metrics() {
        assert!(
            Cli::try_parse_from(["kernelcache-warmup"]).is_err(),
            "the tools image is required"
        );
        let cli = Cli::try_parse_from([
            "kernelcache-warmup",
            "--tools-image=ghcr.io/x/kc:1",
            "--leader-elect=true",
        ])
        .unwrap();
        assert_eq!(cli.settings().tools_image, "ghcr.io/x/kc:1");
        assert!(cli.process.leader_elect);
        let m = Metrics::default();
        m.finished(WarmupPhase::Completed, 42.0);
        m.node("succeeded");
        m.node("succeeded");
        m.node("retried");
        m.pod_created();
        let text = m.encode();
        assert!(
            text.contains(r#"kubeairunway_warmup_duration_seconds_count{result="completed"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"kubeairunway_warmup_duration_seconds_bucket{le="60.0",result="completed"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"kubeairunway_warmup_nodes_total{outcome="succeeded"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kubeairunway_warmup_nodes_total{outcome="retried"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("kubeairunway_warmup_pods_created_total 1"),
            "{text}"
        );
    }
}
