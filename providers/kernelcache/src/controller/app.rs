//! The `kernelcache-controller` process: flags, logging, metrics and health, leader
//! election, and the controllers.
//!
//! Metrics:
//! - `kubeairunway_kernel_cache_verifications_total{mode,result="verified|refused"}`;
//! - `kubeairunway_kernel_cache_resolutions_total{result="success|failure"}`;
//! - `kubeairunway_kernel_cache_reconcile_errors_total`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use futures::FutureExt as _;
use kube::Client;
use kubeairunway_sdk::cli::{LogFormat, parse_duration};
use kubeairunway_sdk::leader::{LeaderElector, LeaseSettings};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::info;

use super::Settings;
use crate::agent::secrets::KubeSecrets;
use crate::api::VerificationMode;
use crate::ops;

type Labels = Vec<(&'static str, String)>;

/// The controller's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    verifications: Family<Labels, Counter>,
    resolutions: Family<Labels, Counter>,
    errors: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let verifications = Family::<Labels, Counter>::default();
        let resolutions = Family::<Labels, Counter>::default();
        let errors = Counter::default();
        registry.register(
            "kubeairunway_kernel_cache_verifications",
            "Signature verifications of pinned cache images, by policy mode and result",
            verifications.clone(),
        );
        registry.register(
            "kubeairunway_kernel_cache_resolutions",
            "Tag to digest resolutions, by result",
            resolutions.clone(),
        );
        registry.register(
            "kubeairunway_kernel_cache_reconcile_errors",
            "KernelCache reconciliations that failed and are retried",
            errors.clone(),
        );
        Self {
            registry,
            verifications,
            resolutions,
            errors,
        }
    }
}

impl Metrics {
    /// One verification.
    pub fn verification(&self, mode: VerificationMode, verified: bool) {
        let mode = format!("{mode:?}").to_lowercase();
        let result = if verified { "verified" } else { "refused" };
        self.verifications
            .get_or_create(&vec![("mode", mode), ("result", result.into())])
            .inc();
    }

    /// One tag resolution.
    pub fn resolution(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.resolutions
            .get_or_create(&vec![("result", result.into())])
            .inc();
    }

    /// One failed reconciliation.
    pub fn reconcile_error(&self) {
        self.errors.inc();
    }
}

impl ops::Encode for Metrics {
    fn encode(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

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
    /// A registry spoken to over plain HTTP (repeatable; air-gapped mirrors, tests).
    #[arg(
        long = "plain-http-registry",
        env = "PLAIN_HTTP_REGISTRIES",
        value_delimiter = ','
    )]
    pub plain_http_registries: Vec<String>,
    /// The namespace where registry credentials are handed over to the node agents (the
    /// agents read Secrets there only).
    #[arg(long, env = "CREDENTIALS_NAMESPACE")]
    pub credentials_namespace: Option<String>,
    /// How often each cache is looked at without a change (tag moves, heartbeat).
    #[arg(long, env = "RESYNC", default_value = "5m", value_parser = parse_duration)]
    pub resync: Duration,
    /// Address of /metrics and /healthz; empty to disable.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,
    /// Elect a leader among replicas (a Lease); only the leader reconciles.
    #[arg(long, env = "LEADER_ELECT", default_value_t = false, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "LEADER_ELECTION_LEASE",
        default_value = "kernelcache-controller"
    )]
    pub leader_election_lease: String,
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// This replica's identity.
    #[arg(long, env = "POD_NAME", default_value = "kernelcache-controller")]
    pub pod_name: String,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

impl Cli {
    /// The controller's settings.
    pub fn settings(&self) -> Settings {
        Settings {
            policy: self.policy.clone(),
            plain_http: self.plain_http_registries.clone(),
            resync: self.resync,
            instance: Some(self.pod_name.clone()),
            credentials_namespace: self.credentials_namespace.clone(),
        }
    }
}

/// The whole `main` of `kernelcache-controller`.
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    kubeairunway_sdk::cli::init_logging(cli.log_format);
    kubeairunway_sdk::runtime::install_crypto_provider();
    let client = Client::try_default()
        .await
        .context("connecting to the cluster")?;
    let metrics = Arc::new(Metrics::default());
    let stop = ops::terminated().shared();
    if !cli.metrics_addr.is_empty() {
        let addr: SocketAddr = cli
            .metrics_addr
            .parse()
            .with_context(|| format!("--metrics-addr {:?}", cli.metrics_addr))?;
        ops::serve(addr, metrics.clone(), stop.clone()).await?;
    }
    let secrets = Arc::new(KubeSecrets(client.clone()));
    if !cli.leader_elect {
        return super::run(client, cli.settings(), secrets, metrics, stop).await;
    }
    let elector = LeaderElector::new(
        client.clone(),
        LeaseSettings {
            namespace: cli.namespace.clone(),
            name: cli.leader_election_lease.clone(),
            identity: cli.pod_name.clone(),
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
        },
    );
    let (lead_tx, mut leading) = watch::channel(false);
    let election = tokio::spawn(elector.run(lead_tx, stop.clone()));
    loop {
        tokio::select! {
            () = stop.clone() => break,
            r = leading.wait_for(|l| *l) => if r.is_err() { break },
        }
        info!("leading: starting the controllers");
        let mut lost = leading.clone();
        let stop_or_lost = {
            let stop = stop.clone();
            async move {
                tokio::select! {
                    () = stop => {}
                    _ = lost.wait_for(|l| !*l) => {}
                }
            }
        };
        super::run(
            client.clone(),
            cli.settings(),
            secrets.clone(),
            metrics.clone(),
            stop_or_lost,
        )
        .await?;
    }
    let _ = election.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Encode as _;

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
    }
}
