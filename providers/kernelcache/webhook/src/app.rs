//! The `kernelcache-webhook` process: HTTPS with a certificate it manages itself
//! (`kubeairunway_sdk::tls`: a CA and serving certificate in a Secret shared by the
//! replicas, the CA bundle patched into the MutatingWebhookConfiguration, rotation, hot
//! reload), the admission route, metrics and health.
//!
//! Metrics: `kubeairunway_kernel_cache_injections_total{result}` (see
//! [`super::Outcome::as_str`]).

use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use clap::Parser;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kubeairunway_sdk::admission::{self, Configurations, WebhookOptions};
use kubeairunway_sdk::process::Runtime;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tracing::info;

use super::warmup::VALIDATE_WARMUP_PATH;
use kubeairunway_kernelcache_api::model::ModelCache;

use super::model_inject::ModelOutcome;
use super::{HostPaths, Lookup, Outcome, PATH, Settings, Stores, review_all};
use kubeairunway_kernelcache_api::names::DEFAULT_CACHE_ROOT;

type Labels = Vec<(&'static str, String)>;

/// The webhook's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    injections: Family<Labels, Counter>,
    model_mounts: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let injections = Family::<Labels, Counter>::default();
        let model_mounts = Family::<Labels, Counter>::default();
        let this = Self {
            registry: Registry::default(),
            injections,
            model_mounts,
        };
        this.register(&mut registry);
        Self { registry, ..this }
    }
}

impl Metrics {
    /// Count one pod.
    pub fn count(&self, outcome: Outcome) {
        self.injections
            .get_or_create(&vec![("result", outcome.as_str().to_string())])
            .inc();
    }

    /// Count one pod's model cache.
    pub fn count_model(&self, outcome: ModelOutcome) {
        self.model_mounts
            .get_or_create(&vec![("result", outcome.as_str().to_string())])
            .inc();
    }
}

impl Metrics {
    /// Register these metrics in the process's registry too (served on `/metrics`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubeairunway_kernel_cache_injections",
            "Pods seen by the kernel-cache webhook, by result",
            self.injections.clone(),
        );
        registry.register(
            "kubeairunway_model_cache_mounts",
            "Pods seen by the pod webhook, by what happened to their model cache",
            self.model_mounts.clone(),
        );
    }

    /// The text exposition of these metrics alone.
    pub fn encode(&self) -> String {
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
    /// Asks the API server whether the author of a Warmup's custom action may create pods
    /// (`None`: nobody is asked, as when answering offline).
    pub access: Option<Client>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The admission routes (`POST /mutate-pod`, `POST /validate-warmup`).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(PATH, post(handle))
        .route(VALIDATE_WARMUP_PATH, post(validate_warmup))
        .layer(axum::extract::DefaultBodyLimit::max(8 * 1024 * 1024))
        .with_state(state)
}

async fn handle(State(state): State<AppState>, body: Bytes) -> Response {
    let (resp, outcome, model) = review_all(&body, state.lookup.as_ref(), &state.settings);
    state.metrics.count(outcome);
    state.metrics.count_model(model);
    admission::respond(resp)
}

async fn validate_warmup(State(state): State<AppState>, body: Bytes) -> Response {
    admission::respond(super::warmup::validate(&body, state.access.as_ref()).await)
}

/// Reflector stores of ModelDeployments, KernelCaches and ModelCaches, kept current in the background.
pub fn stores(client: &Client) -> Stores {
    // Every ModelDeployment of the cluster, kept compact (a pod names one at most).
    let (model_deployments, md_stream) = kubeairunway_sdk::reflect::compact_cache(
        Api::<kubeairunway_sdk::ModelDeployment>::all(client.clone()),
        watcher::Config::default(),
        (),
        kubeairunway_sdk::reflect::strip,
    );
    let model_deployments = model_deployments.store;
    let mds = kubeairunway_sdk::reflect::drive("ModelDeployment", md_stream);
    let (kernel_caches, w2) = reflector::store();
    let caches = reflector(
        w2,
        watcher(Api::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .applied_objects()
    .for_each(|_| async {});
    let (model_caches, w4) = reflector::store();
    let model_watch = reflector(
        w4,
        watcher(
            Api::<ModelCache>::all(client.clone()),
            watcher::Config::default(),
        ),
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
    tokio::spawn(model_watch);
    Stores {
        model_deployments,
        kernel_caches,
        model_caches,
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
    /// The node directory the agents stage caches in (mounted read-only as the source).
    #[arg(long, env = "CACHE_ROOT", default_value = DEFAULT_CACHE_ROOT)]
    pub cache_root: String,
    /// Image of the init container that copies a staged cache (this provider's image).
    #[arg(long, env = "SEED_IMAGE")]
    pub seed_image: String,
    /// The cluster serves Kubernetes image volumes (beta in 1.33): caches reach pods in
    /// namespaces enforcing the `baseline` Pod Security level through them.
    #[arg(long, env = "IMAGE_VOLUMES", default_value_t = false, action = clap::ArgAction::Set)]
    pub image_volumes: bool,
    /// Where caches may come from the node's disk (hostPath) in namespaces that enforce
    /// no Pod Security level: `labelled` (namespaces labelled
    /// cache.kubeairunway.ai/host-path=allowed), or `everywhere` when no other policy of
    /// the cluster refuses hostPath volumes.
    #[arg(long, env = "HOST_PATHS", value_enum, default_value_t = HostPaths::Labelled)]
    pub host_paths: HostPaths,
    /// Name of the MutatingWebhookConfiguration to patch the CA bundle into.
    #[arg(
        long,
        env = "WEBHOOK_CONFIGURATION",
        default_value = "kernelcache-webhook"
    )]
    pub webhook_configuration: String,
    /// Name of the ValidatingWebhookConfiguration (Warmups) to patch the CA bundle into.
    #[arg(
        long,
        env = "VALIDATING_WEBHOOK_CONFIGURATION",
        default_value = "kernelcache-webhook"
    )]
    pub validating_webhook_configuration: String,
    /// The webhook server and its certificate.
    #[command(flatten)]
    pub webhook: WebhookOptions,
    /// Flags every binary shares: metrics address, log format.
    #[command(flatten)]
    pub process: kubeairunway_sdk::process::Options,
}

/// The component's name (and the webhook Service's default name).
pub const COMPONENT: &str = "kernelcache-webhook";

/// The whole `main` of `kernelcache-webhook`.
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut options = cli.process.clone();
    options.leader_elect = false; // every replica serves; nothing to lead
    let rt = Runtime::start(COMPONENT, options).await?;
    run(cli, rt).await
}

/// Serve the webhook on `rt` until the process stops.
pub async fn run(cli: Cli, mut rt: Runtime) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    metrics.register(rt.registry());
    // Serve only once both caches are synced, so that no pod is admitted against an
    // empty cache (the Service routes to ready replicas only).
    let lookup = stores(&rt.client());
    let synced = rt.readiness().process_check("caches");
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
    synced.set();
    let state = AppState {
        lookup: Arc::new(lookup),
        settings: Settings {
            cache_root: cli.cache_root.clone(),
            seed_image: cli.seed_image.clone(),
            image_volumes: cli.image_volumes,
            host_paths: cli.host_paths,
        },
        metrics,
        access: Some(rt.client()),
    };
    let configurations = Configurations {
        validating: Some(cli.validating_webhook_configuration.clone()),
        mutating: Some(cli.webhook_configuration.clone()),
    };
    admission::serve(&rt, &cli.webhook, &configurations, router(state)).await?;
    info!(address = %cli.webhook.webhook_bind_address, "serving the pod-injection webhook");
    rt.run(|term| async move {
        term.ended().await;
        Ok(())
    })
    .await
}
