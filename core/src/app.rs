//! The controller process: flags, the webhook server (every replica), the health and
//! metrics server, certificate management, leader election and the reconciler (leader
//! only).

use kubeairunway_sdk::cli::{LogFormat, parse_duration};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use clap::Parser;
use futures::FutureExt;
use kube::Client;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::Store;
use kubeairunway_sdk::InferenceProviderConfig;
use tokio::sync::watch;
use tracing::{error, info};

use crate::metrics::Metrics;
use crate::reconciler::{self, Settings};
use crate::{FIELD_MANAGER, selection, webhook};
use kubeairunway_sdk::leader::{LeaderElector, LeaseSettings};
use kubeairunway_sdk::tls::{CertManager, CertResolver, CertSettings, KubeCertStore};

/// Flags of `kubeairunway-controller` (each also from an environment variable).
#[derive(Clone, Debug, Parser)]
#[command(
    name = "kubeairunway-controller",
    version,
    about = "kubeairunway core controller: ModelDeployment webhooks and provider selection"
)]
pub struct Cli {
    /// Run the built-in provider selection; off when a custom selector sets status.provider.name.
    #[arg(long, env = "ENABLE_PROVIDER_SELECTOR", default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_provider_selector: bool,
    /// Providers whose heartbeat is older than this are not selected.
    #[arg(long, env = "PROVIDER_HEARTBEAT_MAX_AGE", default_value = "5m", value_parser = parse_duration)]
    pub provider_heartbeat_max_age: Duration,
    /// Only reconcile ModelDeployments of this namespace (default: all).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Namespace the controller runs in (Secret, Lease, webhook Service).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kubeairunway-system")]
    pub namespace: String,
    /// This replica's identity for leader election and events.
    #[arg(long, env = "POD_NAME", default_value = "kubeairunway-controller")]
    pub pod_name: String,
    /// Address of the webhook server (HTTPS).
    #[arg(long, env = "WEBHOOK_BIND_ADDRESS", default_value = "0.0.0.0:9443")]
    pub webhook_bind_address: SocketAddr,
    /// Address of the metrics and health server (HTTP: /metrics, /healthz, /readyz).
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: SocketAddr,
    /// Serve the admission webhooks (and manage their certificate).
    #[arg(long, env = "ENABLE_WEBHOOKS", default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_webhooks: bool,
    /// Name of the webhook Service (the certificate's DNS names derive from it).
    #[arg(
        long,
        env = "WEBHOOK_SERVICE_NAME",
        default_value = "kubeairunway-webhook"
    )]
    pub webhook_service_name: String,
    /// Name of the Secret holding the webhook CA and serving certificate.
    #[arg(
        long,
        env = "WEBHOOK_SECRET_NAME",
        default_value = "kubeairunway-webhook-tls"
    )]
    pub webhook_secret_name: String,
    /// Name of the ValidatingWebhookConfiguration to patch the CA bundle into.
    #[arg(
        long,
        env = "VALIDATING_WEBHOOK_CONFIGURATION",
        default_value = "kubeairunway-validating-webhook"
    )]
    pub validating_webhook_configuration: String,
    /// Name of the MutatingWebhookConfiguration to patch the CA bundle into.
    #[arg(
        long,
        env = "MUTATING_WEBHOOK_CONFIGURATION",
        default_value = "kubeairunway-mutating-webhook"
    )]
    pub mutating_webhook_configuration: String,
    /// Lifetime of a new CA.
    #[arg(long, env = "WEBHOOK_CA_VALIDITY", default_value = "3650d", value_parser = parse_duration)]
    pub webhook_ca_validity: Duration,
    /// Lifetime of a new serving certificate.
    #[arg(long, env = "WEBHOOK_CERT_VALIDITY", default_value = "365d", value_parser = parse_duration)]
    pub webhook_cert_validity: Duration,
    /// Rotate a certificate this long before it expires.
    #[arg(long, env = "WEBHOOK_CERT_ROTATE_BEFORE", default_value = "30d", value_parser = parse_duration)]
    pub webhook_cert_rotate_before: Duration,
    /// How often to check (and reload) the certificate.
    #[arg(long, env = "WEBHOOK_CERT_CHECK_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub webhook_cert_check_interval: Duration,
    /// Elect a leader among replicas; only the leader reconciles.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "LEADER_ELECTION_LEASE",
        default_value = "kubeairunway-controller"
    )]
    pub leader_election_lease: String,
    /// How long a Lease is valid without renewal.
    #[arg(long, env = "LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,
    /// How often the leader renews the Lease.
    #[arg(long, env = "LEADER_ELECTION_RENEW_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub leader_election_renew_interval: Duration,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

#[derive(Clone)]
struct OpsState {
    metrics: Arc<Metrics>,
    providers: Store<InferenceProviderConfig>,
    resolver: Option<Arc<CertResolver>>,
}

/// The metrics and health routes.
fn ops_router(state: OpsState) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(s): State<OpsState>| async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    s.metrics.encode(),
                )
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<OpsState>| async move {
                let providers = s
                    .providers
                    .wait_until_ready()
                    .now_or_never()
                    .is_some_and(|r| r.is_ok());
                let cert = s.resolver.as_ref().is_none_or(|r| r.is_loaded());
                if providers && cert {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .with_state(state)
}

async fn wait_false(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|l| !*l).await;
}

/// Run the controller until `shutdown` completes.
pub async fn run(
    cli: Cli,
    client: Client,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let metrics = Arc::new(Metrics::new());
    let (providers, reflector) = reconciler::provider_cache(client.clone());
    tokio::spawn(reflector);

    let resolver = if cli.enable_webhooks {
        let resolver = Arc::new(CertResolver::default());
        let store = KubeCertStore::new(
            client.clone(),
            &cli.namespace,
            &cli.webhook_secret_name,
            &cli.validating_webhook_configuration,
            &cli.mutating_webhook_configuration,
        );
        let certs = CertManager::new(
            store,
            CertSettings {
                service_name: cli.webhook_service_name.clone(),
                namespace: cli.namespace.clone(),
                ca_validity: cli.webhook_ca_validity,
                cert_validity: cli.webhook_cert_validity,
                rotate_before: cli.webhook_cert_rotate_before,
            },
            Arc::clone(&resolver),
        );
        tokio::spawn(certs.run(cli.webhook_cert_check_interval, stopped()));
        let tls = kubeairunway_sdk::tls::server_config(Arc::clone(&resolver))?;
        let app = webhook::router(webhook::WebhookState::new(Some(providers.clone())));
        let handle = axum_server::Handle::new();
        let h = handle.clone();
        let stop = stopped();
        tokio::spawn(async move {
            stop.await;
            h.graceful_shutdown(Some(Duration::from_secs(10)));
        });
        let addr = cli.webhook_bind_address;
        tokio::spawn(async move {
            let server = axum_server::bind_rustls(
                addr,
                axum_server::tls_rustls::RustlsConfig::from_config(tls),
            )
            .handle(handle);
            if let Err(e) = server.serve(app.into_make_service()).await {
                error!(error = %e, "webhook server failed");
            }
        });
        info!(address = %addr, "serving admission webhooks");
        Some(resolver)
    } else {
        None
    };

    let ops = ops_router(OpsState {
        metrics: Arc::clone(&metrics),
        providers: providers.clone(),
        resolver,
    });
    let listener = tokio::net::TcpListener::bind(cli.metrics_bind_address)
        .await
        .with_context(|| format!("binding {}", cli.metrics_bind_address))?;
    let stop = stopped();
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, ops)
            .with_graceful_shutdown(stop)
            .await
        {
            error!(error = %e, "metrics server failed");
        }
    });

    providers
        .wait_until_ready()
        .await
        .context("InferenceProviderConfig cache")?;
    let settings = Settings {
        enable_provider_selector: cli.enable_provider_selector,
        selection: selection::Settings {
            heartbeat_max_age: cli.provider_heartbeat_max_age,
        },
        namespace: cli.watch_namespace.clone(),
        reporter: Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(cli.pod_name.clone()),
        },
        ..Settings::default()
    };

    if !cli.leader_elect {
        reconciler::run(client, providers, settings, metrics, stopped()).await;
        return Ok(());
    }
    let elector = LeaderElector::new(
        client.clone(),
        LeaseSettings {
            namespace: cli.namespace.clone(),
            name: cli.leader_election_lease.clone(),
            identity: cli.pod_name.clone(),
            lease_duration: cli.leader_election_lease_duration,
            renew_interval: cli.leader_election_renew_interval,
        },
    );
    let (lead_tx, mut lead_rx) = watch::channel(false);
    let election = tokio::spawn(elector.run(lead_tx, stopped()));
    let stop_rx = stopped().boxed().shared();
    loop {
        tokio::select! {
            () = stop_rx.clone() => break,
            r = lead_rx.wait_for(|l| *l) => if r.is_err() { break },
        }
        let mut rx = lead_rx.clone();
        let stop = stop_rx.clone();
        let lost = async move {
            tokio::select! {
                () = wait_false(&mut rx) => {}
                () = stop => {}
            }
        };
        reconciler::run(
            client.clone(),
            providers.clone(),
            settings.clone(),
            Arc::clone(&metrics),
            lost,
        )
        .await;
    }
    let _ = election.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_with_defaults_and_selector_off() {
        let cli = Cli::try_parse_from(["c", "--enable-provider-selector=false"]).unwrap();
        assert!(!cli.enable_provider_selector);
        assert!(cli.leader_elect);
        assert_eq!(cli.webhook_bind_address.port(), 9443);
    }
}
