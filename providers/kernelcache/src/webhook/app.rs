//! The `kernelcache-webhook` process: HTTPS with a certificate it manages itself
//! (`kubeairunway_sdk::tls`: a CA and serving certificate in a Secret shared by the
//! replicas, the CA bundle patched into the MutatingWebhookConfiguration, rotation, hot
//! reload), the admission route, metrics and health.
//!
//! Metrics: `kubeairunway_kernel_cache_injections_total{result}` (see
//! [`super::Outcome::as_str`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clap::Parser;
use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kubeairunway_sdk::cli::{LogFormat, parse_duration};
use kubeairunway_sdk::tls::{CertManager, CertResolver, CertSettings, KubeCertStore};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tracing::{error, info};

use super::{Lookup, Outcome, PATH, Settings, Stores, review};
use crate::agent::app::DEFAULT_CACHE_ROOT;
use crate::ops;

type Labels = Vec<(&'static str, String)>;

/// The webhook's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    injections: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let injections = Family::<Labels, Counter>::default();
        registry.register(
            "kubeairunway_kernel_cache_injections",
            "Pods seen by the kernel-cache webhook, by result",
            injections.clone(),
        );
        Self {
            registry,
            injections,
        }
    }
}

impl Metrics {
    /// Count one pod.
    pub fn count(&self, outcome: Outcome) {
        self.injections
            .get_or_create(&vec![("result", outcome.as_str().to_string())])
            .inc();
    }
}

impl ops::Encode for Metrics {
    fn encode(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// What the admission route needs.
#[derive(Clone)]
pub struct AppState {
    /// Where ModelDeployments and KernelCaches are looked up.
    pub lookup: Arc<dyn Lookup>,
    /// Injection settings.
    pub settings: Settings,
    /// Counters.
    pub metrics: Arc<Metrics>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The admission route (`POST /mutate-pod`).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(PATH, post(handle))
        .layer(axum::extract::DefaultBodyLimit::max(8 * 1024 * 1024))
        .with_state(state)
}

async fn handle(State(state): State<AppState>, body: Bytes) -> Response {
    let (resp, outcome) = review(&body, state.lookup.as_ref(), &state.settings);
    state.metrics.count(outcome);
    match kubeairunway_sdk::admission::review_json(resp).and_then(|v| serde_json::to_vec(&v)) {
        Ok(body) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Reflector stores of ModelDeployments and KernelCaches, kept current in the background.
pub fn stores(client: &Client) -> Stores {
    let (model_deployments, w1) = reflector::store();
    let (kernel_caches, w2) = reflector::store();
    let mds = reflector(
        w1,
        watcher(Api::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .applied_objects()
    .for_each(|_| async {});
    let caches = reflector(
        w2,
        watcher(Api::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .applied_objects()
    .for_each(|_| async {});
    let (namespaces, w3) = reflector::store();
    let ns_watch = reflector(
        w3,
        watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .applied_objects()
    .for_each(|_| async {});
    tokio::spawn(mds);
    tokio::spawn(caches);
    tokio::spawn(ns_watch);
    Stores {
        model_deployments,
        kernel_caches,
        namespaces,
    }
}

/// Flags of `kernelcache-webhook` (each also from an environment variable).
#[derive(Clone, Debug, Parser)]
#[command(
    name = "kernelcache-webhook",
    version,
    about = "kubeairunway kernel-cache webhook: gives serving pods their staged kernel cache"
)]
pub struct Cli {
    /// HTTPS address of the webhook.
    #[arg(long, env = "BIND_ADDRESS", default_value = "0.0.0.0:9443")]
    pub bind_address: SocketAddr,
    /// Address of /metrics and /healthz; empty to disable.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,
    /// The agents' cache root on the nodes.
    #[arg(long, env = "CACHE_ROOT", default_value = DEFAULT_CACHE_ROOT)]
    pub cache_root: String,
    /// The image with /kernelcache-seed (this provider's image).
    #[arg(long, env = "SEED_IMAGE")]
    pub seed_image: String,
    /// The cluster serves Kubernetes image volumes (beta in 1.33): caches reach pods in
    /// namespaces enforcing the `baseline` Pod Security level through them.
    #[arg(long, env = "IMAGE_VOLUMES", default_value_t = false, action = clap::ArgAction::Set)]
    pub image_volumes: bool,
    /// The webhook Service's name (the certificate's DNS names derive from it).
    #[arg(long, env = "SERVICE_NAME", default_value = "kernelcache-webhook")]
    pub service_name: String,
    /// The Secret holding the CA and serving certificate.
    #[arg(long, env = "SECRET_NAME", default_value = "kernelcache-webhook-tls")]
    pub secret_name: String,
    /// The MutatingWebhookConfiguration to patch the CA bundle into.
    #[arg(
        long,
        env = "WEBHOOK_CONFIGURATION",
        default_value = "kernelcache-webhook"
    )]
    pub webhook_configuration: String,
    /// Namespace of the Service and the Secret.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// Lifetime of a new CA.
    #[arg(long, default_value = "3650d", value_parser = parse_duration)]
    pub ca_validity: Duration,
    /// Lifetime of a new serving certificate.
    #[arg(long, default_value = "365d", value_parser = parse_duration)]
    pub cert_validity: Duration,
    /// Rotate a certificate this long before it expires.
    #[arg(long, default_value = "30d", value_parser = parse_duration)]
    pub rotate_before: Duration,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

/// The whole `main` of `kernelcache-webhook`.
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    kubeairunway_sdk::cli::init_logging(cli.log_format);
    kubeairunway_sdk::runtime::install_crypto_provider();
    let client = Client::try_default()
        .await
        .context("connecting to the cluster")?;
    let stop = ops::terminated().shared();
    let metrics = Arc::new(Metrics::default());
    let resolver = Arc::new(CertResolver::default());
    let store = KubeCertStore::new(
        client.clone(),
        &cli.namespace,
        &cli.secret_name,
        "",
        &cli.webhook_configuration,
    );
    let certs = CertManager::new(
        store,
        CertSettings {
            service_name: cli.service_name.clone(),
            namespace: cli.namespace.clone(),
            ca_validity: cli.ca_validity,
            cert_validity: cli.cert_validity,
            rotate_before: cli.rotate_before,
        },
        Arc::clone(&resolver),
    );
    certs.ensure().await.context("the webhook certificate")?;
    tokio::spawn(certs.run(Duration::from_secs(300), stop.clone()));
    let tls = kubeairunway_sdk::tls::server_config(resolver)?;
    // Serve only once both caches are synced, so that no pod is admitted against an
    // empty cache (the Service routes to ready replicas only).
    let lookup = stores(&client);
    lookup
        .model_deployments
        .wait_until_ready()
        .await
        .context("ModelDeployment cache")?;
    lookup
        .kernel_caches
        .wait_until_ready()
        .await
        .context("KernelCache cache")?;
    lookup
        .namespaces
        .wait_until_ready()
        .await
        .context("Namespace cache")?;
    // Health (and so readiness) only from here on.
    if !cli.metrics_addr.is_empty() {
        let addr: SocketAddr = cli.metrics_addr.parse().context("--metrics-addr")?;
        ops::serve(addr, metrics.clone(), stop.clone()).await?;
    }
    let state = AppState {
        lookup: Arc::new(lookup),
        settings: Settings {
            cache_root: cli.cache_root.clone(),
            seed_image: cli.seed_image.clone(),
            image_volumes: cli.image_volumes,
        },
        metrics,
    };
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    tokio::spawn(async move {
        stop.await;
        h.graceful_shutdown(Some(Duration::from_secs(10)));
    });
    info!(address = %cli.bind_address, "serving the pod-injection webhook");
    if let Err(e) = axum_server::bind_rustls(
        cli.bind_address,
        axum_server::tls_rustls::RustlsConfig::from_config(tls),
    )
    .handle(handle)
    .serve(router(state).into_make_service())
    .await
    {
        error!(error = %e, "webhook server failed");
        return Err(e.into());
    }
    Ok(())
}
