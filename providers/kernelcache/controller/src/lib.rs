//! The kernel-cache controller: pins each `KernelCache` image to a digest, verifies its
//! cosign signature under the cluster's `KernelCachePolicy`, adds up what the node agents
//! report, and tells the ModelDeployments that use a cache whether it is ready
//! (`KernelCacheReady`).
//!
//! Three kube-runtime controllers share one process (and a fourth sets the Nodes' ready
//! labels of kernel and model caches from the same reports):
//! - over `KernelCache`s (also woken by node reports and policy changes): the status,
//!   written by server-side apply as `kernelcache-controller`;
//! - over ModelDeployments that name a cache (also woken by cache changes): their one
//!   condition `KernelCacheReady`, applied as `kernelcache-provider` so that every other
//!   writer's conditions stay;
//! - over `ModelCache`s (also woken by node reports, and by ModelDeployments while a cache
//!   is being deleted): the hub token handed over to the agents, the status added up from
//!   the reports, the local PersistentVolume and claim serving pods mount it through, and
//!   its finalizer, holding its deletion while ModelDeployments use it ([`model_caches`],
//!   [`model_volumes`]).
//!
//! A pin is kept while the spec is unchanged: a tag that moves later is reported
//! (`Resolved=False`, `TagMoved`), never followed silently; editing the spec re-pins.
//! Verification runs again only when the digest or the policy changes; until a pin has
//! passed, `status.usable_image()` is `None` and no agent or pod uses it.

pub mod app;
mod caches;
pub mod decide;
pub mod handover;
pub mod in_use;
pub mod labels;
pub mod metrics;
pub mod model_caches;
pub mod model_decide;
mod model_deployments;
pub mod model_volumes;
mod nodes;
mod registration;
mod retries;
pub mod settings;

use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::compact::Compact;
use kubeairunway_sdk::process::Check;
use kubeairunway_sdk::reflect::{self, Cache};
use tracing::info;

use kubeairunway_kernelcache_api::model::ModelCache;
use kubeairunway_kernelcache_api::{KernelCache, KernelCacheNode, KernelCachePolicy};
use kubeairunway_kernelcache_artifact::secrets::SecretApi;

pub use settings::{FIELD_MANAGER, Settings};

/// Run the controllers and the registration until `shutdown`; `synced` is set once every
/// watch cache they read has been filled (readiness).
pub async fn run(
    client: Client,
    settings: Settings,
    secrets: Arc<dyn SecretApi>,
    metrics: Arc<metrics::Metrics>,
    synced: Check,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let (nodes, node_stream) = reflected::<KernelCacheNode>(&client);
    let (caches, cache_stream) = reflected::<KernelCache>(&client);
    let (policies, policy_stream) = reflected::<KernelCachePolicy>(&client);
    let (models, model_stream) = reflected::<ModelCache>(&client);
    // Every ModelDeployment of the cluster, kept compact; only those naming a cache are
    // parsed, when reconciled.
    let (mds, md_stream) = reflect::compact_cache(
        Api::<ModelDeployment>::all(client.clone()),
        watcher::Config::default(),
        (),
        reflect::strip,
    );
    // The ModelDeployment events go to two consumers: the KernelCacheReady controller and
    // the ModelCache controller (a deleted cache held by its users is released when the
    // last one goes).
    let (md_for_kernel, md_for_models, md_events) = fan_out(md_stream);
    let md_stream = md_for_kernel.map(Ok).applied_objects().predicate_filter(
        |md: &Compact<ModelDeployment>| Some(model_deployments::md_relevant(md)),
        kube::runtime::PredicateConfig::default(),
    );
    let (node_meta, node_meta_stream) = reflected::<PartialObjectMeta<Node>>(&client);
    // Serving pods (the webhook gives caches only to pods of a ModelDeployment), kept
    // slim: which caches are in use on which node.
    let (pods, pod_stream) = reflect::cache(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels(kubeairunway_sdk::labels::MODEL_DEPLOYMENT),
        (),
        in_use::slim,
    );
    let readiness = spawn_readiness(
        synced,
        vec![
            synced_of(&nodes),
            synced_of(&caches),
            synced_of(&policies),
            synced_of(&mds),
            synced_of(&node_meta),
            synced_of(&models),
            synced_of(&pods),
        ],
    );
    // The credentials handed over to the agents, sealed per node (both kinds of cache).
    let handover = settings
        .credentials_namespace
        .as_deref()
        .map(|ns| Arc::new(handover::Handover::new(client.clone(), ns)));
    let model_ctx = model_caches::ModelCtx::new(
        &client,
        &models,
        &nodes,
        Arc::clone(&secrets),
        Arc::clone(&metrics),
        settings.resync,
        handover.clone(),
        settings.model_cache_root.clone(),
        &mds,
        model_caches::Verifying {
            policies: policies.clone(),
            policy: settings.policy.clone(),
            plain_http: settings.plain_http.clone(),
            allowed: settings.allowed.clone(),
        },
        &node_meta,
    );
    let sealing = handover.clone().map(|h| {
        let (nodes, node_meta, caches, models) = (
            nodes.clone(),
            node_meta.clone(),
            caches.clone(),
            models.clone(),
        );
        tokio::spawn(async move {
            h.run(node_meta, nodes, || expected_handovers(&caches, &models))
                .await;
        })
    });
    let ctx = caches::new_ctx(
        &client, settings, secrets, metrics, &nodes, &caches, policies, handover,
    );
    let sweeper = spawn_sweeper(&model_ctx, &models);
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    let registration = tokio::spawn(registration::register(client.clone(), ctx.settings.resync));
    // The node reports wake two controllers, both reading the reports' store: each gets
    // the event of this one reflector, after the store has it (a watch of its own could
    // wake a controller before the store knows what woke it).
    let (reports_for_caches, reports_for_rest, reports) = fan_out(node_stream);
    let (reports_for_labels, reports_for_models, rest) =
        fan_out(reports_for_rest.map(Ok::<_, watcher::Error>));
    // The ModelCache events go to the ModelCache controller and wake the ModelDeployments
    // whose `ModelCacheReady` they change.
    let (models_for_caches, models_for_mds, model_events) = fan_out(model_stream);
    // A policy change wakes every KernelCache and every ModelCache (their verdicts).
    let (policies_for_caches, policies_for_models, policy_events) = fan_out(policy_stream);
    let reports = tokio::spawn(async move {
        tokio::join!(reports, rest, md_events, model_events, policy_events);
    });
    let caches_ctl = caches::cache_controller(
        &ctx,
        cache_stream,
        reports_for_caches.map(Ok),
        policies_for_caches.map(Ok),
        shutdown.clone(),
    );
    let mds_ctl = model_deployments::md_controller(
        &ctx,
        &mds,
        md_stream,
        &models,
        models_for_mds,
        shutdown.clone(),
    );
    let models_ctl = model_caches::model_controller(
        &model_ctx,
        models_for_caches.map(Ok),
        reports_for_models,
        md_for_models.map(Ok).touched_objects(),
        policies_for_models,
        shutdown.clone(),
    );
    let labels_ctl = nodes::label_controller(
        &ctx,
        (&node_meta, node_meta_stream),
        reports_for_labels,
        (&pods, pod_stream.touched_objects()),
        shutdown,
    );
    info!("kernel-cache controller running");
    tokio::join!(caches_ctl, mds_ctl, labels_ctl, models_ctl);
    registration.abort();
    reports.abort();
    for task in std::iter::once(sweeper).chain(sealing) {
        task.abort();
    }
    readiness.abort();
    Ok(())
}

/// Whether `cache` gets filled, as a task-owned future.
fn synced_of<K>(cache: &Cache<K>) -> futures::future::BoxFuture<'static, bool>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let cache = cache.clone();
    Box::pin(async move { cache.synced().await })
}

/// Sets `synced` (readiness) once every one of `caches` is filled (a part of [`run`]).
fn spawn_readiness(
    synced: Check,
    caches: Vec<futures::future::BoxFuture<'static, bool>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if futures::future::join_all(caches)
            .await
            .into_iter()
            .all(|s| s)
        {
            info!("watch caches synced");
            synced.set();
        }
    })
}

/// Deletes what earlier runs left of deleted model caches, once they are synced (a part
/// of [`run`]).
fn spawn_sweeper(
    model_ctx: &Arc<model_caches::ModelCtx>,
    models: &Cache<ModelCache>,
) -> tokio::task::JoinHandle<()> {
    let model_ctx = Arc::clone(model_ctx);
    let models = models.clone();
    tokio::spawn(async move {
        if models.synced().await {
            model_ctx.prune();
            model_ctx.prune_volumes(true).await;
        }
    })
}

/// The caches that hand credentials over (a part of [`run`]): KernelCaches naming pull
/// Secrets, ModelCaches naming a credentials Secret.
fn expected_handovers(
    caches: &Cache<KernelCache>,
    models: &Cache<ModelCache>,
) -> std::collections::BTreeSet<handover::Owner> {
    use kube::ResourceExt as _;
    let kernel = caches
        .store
        .state()
        .into_iter()
        .filter(|c| !c.spec.image_pull_secrets.is_empty())
        .map(|c| {
            (
                handover::Kind::Kernel,
                c.namespace().unwrap_or_default(),
                c.name_any(),
            )
        });
    let model = models
        .store
        .state()
        .into_iter()
        .filter(|c| c.spec.credentials_secret_ref.is_some())
        .map(|c| {
            (
                handover::Kind::Model,
                c.namespace().unwrap_or_default(),
                c.name_any(),
            )
        });
    kernel.chain(model).collect()
}

/// Every object `stream` yields, to two consumers (each of its own pace: unbounded, as a
/// watch of a cluster's objects is), and the future that drives `stream` (errors are
/// dropped: the watcher retries with backoff).
fn fan_out<K: Clone + Send + 'static>(
    stream: impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
) -> (
    futures::channel::mpsc::UnboundedReceiver<K>,
    futures::channel::mpsc::UnboundedReceiver<K>,
    impl std::future::Future<Output = ()> + Send,
) {
    let (first, first_rx) = futures::channel::mpsc::unbounded();
    let (second, second_rx) = futures::channel::mpsc::unbounded();
    let forward = stream.for_each(move |item| {
        if let Ok(object) = item {
            let _ = first.unbounded_send(object.clone());
            let _ = second.unbounded_send(object);
        }
        futures::future::ready(())
    });
    (first_rx, second_rx, forward)
}

/// A watch cache of every `K` (without managed fields) and the stream that keeps it
/// current.
pub(crate) fn reflected<K>(
    client: &Client,
) -> (
    Cache<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + use<K>,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (cache, stream) = reflect::cache(
        Api::<K>::all(client.clone()),
        watcher::Config::default(),
        (),
        reflect::strip,
    );
    (cache, stream.touched_objects())
}
