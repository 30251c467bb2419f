//! The kernel-cache controller: pins each `KernelCache` image to a digest, verifies its
//! cosign signature under the cluster's `KernelCachePolicy`, adds up what the node agents
//! report, and tells the ModelDeployments that use a cache whether it is ready
//! (`KernelCacheReady`).
//!
//! Two kube-runtime controllers share one process:
//! - over `KernelCache`s (also woken by node reports and policy changes): the status,
//!   written by server-side apply as `kernelcache-controller`;
//! - over ModelDeployments that name a cache (also woken by cache changes): their one
//!   condition `KernelCacheReady`, applied as `kernelcache-provider` so that every other
//!   writer's conditions stay.
//!
//! A pin is kept while the spec is unchanged: a tag that moves later is reported
//! (`Resolved=False`, `TagMoved`), never followed silently; editing the spec re-pins.
//! Verification runs again only when the digest or the policy changes; until a pin has
//! passed, `status.usable_image()` is `None` and no agent or pod uses it.

pub mod app;
pub mod decide;
pub mod handover;
pub mod labels;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::compact::Compact;
use kubeairunway_sdk::conditions::{self, KERNEL_CACHE_READY};
use kubeairunway_sdk::events::{Event, EventType, Recorder, Reporter};
use kubeairunway_sdk::process::Check;
use kubeairunway_sdk::reflect::{self, Cache};
use serde_json::json;
use tracing::{info, warn};

use crate::agent::secrets::{SecretApi, auth_for};
use crate::api::{
    KernelCache, KernelCacheNode, KernelCachePolicy, KernelCacheStatus, Verification,
    VerificationMode,
};
use crate::oci::{PullError, Puller, pin};
use crate::verify;
use decide::reasons;

/// Field manager of the KernelCache status.
pub const FIELD_MANAGER: &str = "kernelcache-controller";
/// Field manager of `KernelCacheReady` on ModelDeployments (and of the provider's
/// InferenceProviderConfig).
pub const PROVIDER_FIELD_MANAGER: &str = "kernelcache-provider";
/// The InferenceProviderConfig this capability provider registers.
pub const PROVIDER_NAME: &str = "kernelcache";

/// What the controller is told.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Name of the cluster-scoped `KernelCachePolicy` to verify with.
    pub policy: String,
    /// Registries spoken to over plain HTTP.
    pub plain_http: Vec<String>,
    /// How often a cache is looked at again without a change (tag moves, heartbeat).
    pub resync: Duration,
    /// This replica's name, for events.
    pub instance: Option<String>,
    /// Where registry credentials are handed over to the node agents
    /// ([`handover`]); none: caches with imagePullSecrets are pinned and verified, but no
    /// agent can pull them.
    pub credentials_namespace: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            policy: "default".into(),
            plain_http: Vec::new(),
            resync: Duration::from_secs(300),
            instance: None,
            credentials_namespace: None,
        }
    }
}

struct Ctx {
    client: Client,
    settings: Settings,
    secrets: Arc<dyn SecretApi>,
    nodes: Cache<KernelCacheNode>,
    caches: Cache<KernelCache>,
    policies: Cache<KernelCachePolicy>,
    recorder: Recorder,
    metrics: Arc<app::Metrics>,
    /// Failed verifications waiting for their retry, per cache.
    retries: Mutex<HashMap<(String, String), decide::Retry>>,
    /// When each cache's tag was last compared with its pin.
    pin_checked: Mutex<HashMap<(String, String), std::time::Instant>>,
    handover: Option<handover::Handover>,
}

impl Ctx {
    fn exists(&self, namespace: &str, name: &str) -> bool {
        self.caches
            .store
            .get(&ObjectRef::new(name).within(namespace))
            .is_some()
    }

    /// Forget what is kept per cache for caches that no longer exist, and take their
    /// handed-over credentials back.
    async fn prune(&self) {
        let exists = |(ns, name): &(String, String)| self.exists(ns, name);
        if let Ok(mut r) = self.retries.lock() {
            r.retain(|k, _| exists(k));
        }
        if let Ok(mut p) = self.pin_checked.lock() {
            p.retain(|k, _| exists(k));
        }
        if let Some(h) = &self.handover {
            h.prune(|ns, name| self.exists(ns, name), false).await;
        }
    }
}

/// How long a reconcile waits for the watch caches it reads to be filled once before it
/// tries again later: it never decides on a partial view.
const SYNC_WAIT: Duration = Duration::from_secs(30);

/// Controller failures worth a retry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A cached ModelDeployment did not read back.
    #[error("{0}")]
    Cache(#[from] kubeairunway_sdk::compact::Error),
}

/// Run the controllers and the registration until `shutdown`; `synced` is set once every
/// watch cache they read has been filled (readiness).
pub async fn run(
    client: Client,
    settings: Settings,
    secrets: Arc<dyn SecretApi>,
    metrics: Arc<app::Metrics>,
    synced: Check,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let (nodes, node_stream) = reflected::<KernelCacheNode>(&client);
    let (caches, cache_stream) = reflected::<KernelCache>(&client);
    let (policies, policy_stream) = reflected::<KernelCachePolicy>(&client);
    // Every ModelDeployment of the cluster, kept compact; only those naming a cache are
    // parsed, when reconciled.
    let (mds, md_stream) = reflect::compact_cache(
        Api::<ModelDeployment>::all(client.clone()),
        watcher::Config::default(),
        (),
        reflect::strip,
    );
    let md_stream = md_stream.applied_objects().predicate_filter(
        |md: &Compact<ModelDeployment>| Some(md_relevant(md)),
        kube::runtime::PredicateConfig::default(),
    );
    let (node_meta, node_meta_stream) = reflected::<PartialObjectMeta<Node>>(&client);
    let readiness = tokio::spawn({
        let (nodes, caches, policies, mds, node_meta) = (
            nodes.clone(),
            caches.clone(),
            policies.clone(),
            mds.clone(),
            node_meta.clone(),
        );
        async move {
            let all = futures::future::join5(
                nodes.synced(),
                caches.synced(),
                policies.synced(),
                mds.synced(),
                node_meta.synced(),
            )
            .await;
            if all == (true, true, true, true, true) {
                info!("watch caches synced");
                synced.set();
            }
        }
    });
    let ctx = new_ctx(
        &client, settings, secrets, metrics, &nodes, &caches, policies,
    );
    // Handed-over credentials of caches deleted while no controller ran.
    let sweeper = {
        let ctx = Arc::clone(&ctx);
        tokio::spawn(async move {
            if ctx.caches.synced().await
                && let Some(h) = &ctx.handover
            {
                h.prune(|ns, name| ctx.exists(ns, name), true).await;
            }
        })
    };
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    let registration = tokio::spawn(register(client.clone(), ctx.settings.resync));
    let caches_ctl = cache_controller(
        &ctx,
        cache_stream,
        node_stream,
        policy_stream,
        shutdown.clone(),
    );
    let mds_ctl = md_controller(&ctx, &mds, md_stream, shutdown.clone());
    let labels_ctl = label_controller(&ctx, &node_meta, node_meta_stream, shutdown);
    info!("kernel-cache controller running");
    tokio::join!(caches_ctl, mds_ctl, labels_ctl);
    registration.abort();
    sweeper.abort();
    readiness.abort();
    Ok(())
}

/// The shared state of the KernelCache controller (a part of [`run`]).
fn new_ctx(
    client: &Client,
    settings: Settings,
    secrets: Arc<dyn SecretApi>,
    metrics: Arc<app::Metrics>,
    nodes: &Cache<KernelCacheNode>,
    caches: &Cache<KernelCache>,
    policies: Cache<KernelCachePolicy>,
) -> Arc<Ctx> {
    let handover = settings
        .credentials_namespace
        .as_deref()
        .map(|ns| handover::Handover::new(client.clone(), ns));
    Arc::new(Ctx {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: settings.instance.clone(),
            },
        ),
        client: client.clone(),
        settings,
        secrets,
        nodes: nodes.clone(),
        caches: caches.clone(),
        policies,
        metrics,
        retries: Mutex::default(),
        pin_checked: Mutex::default(),
        handover,
    })
}

/// The controller over KernelCaches (a part of [`run`]): woken by its own watch, by the
/// node reports that mention a cache, and by any policy change (every cache).
fn cache_controller(
    ctx: &Arc<Ctx>,
    caches: impl futures::Stream<Item = Result<KernelCache, watcher::Error>> + Send + 'static,
    nodes: impl futures::Stream<Item = Result<KernelCacheNode, watcher::Error>> + Send + 'static,
    policies: impl futures::Stream<Item = Result<KernelCachePolicy, watcher::Error>> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl std::future::Future<Output = ()> {
    let node_caches = nodes.filter_map(|n| async move {
        let node = n.ok()?;
        let refs: Vec<ObjectRef<KernelCache>> = node
            .status
            .iter()
            .flat_map(|s| s.caches.iter())
            .map(|c| ObjectRef::new(&c.name).within(&c.namespace))
            .collect();
        Some(futures::stream::iter(refs))
    });
    Controller::for_stream(caches, ctx.caches.store.clone())
        .with_config(kubeairunway_sdk::process::controller_config())
        .reconcile_on(node_caches.flatten())
        .reconcile_all_on(policies.map(|_| ()))
        .graceful_shutdown_on(shutdown)
        .run(reconcile_cache, cache_error, Arc::clone(ctx))
        .for_each(|_| async {})
}

/// The controller of `KernelCacheReady` on ModelDeployments (a part of [`run`]): cache
/// changes wake the ModelDeployments in their namespace that name them.
fn md_controller(
    ctx: &Ctx,
    mds: &Cache<Compact<ModelDeployment>>,
    md_stream: impl futures::Stream<Item = Result<Compact<ModelDeployment>, watcher::Error>>
    + Send
    + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl std::future::Future<Output = ()> {
    let md_store = mds.store.clone();
    let cache_mds = move |cache: KernelCache| {
        let (ns, name) = (cache.namespace().unwrap_or_default(), cache.name_any());
        md_store
            .state()
            .iter()
            .filter(|md| md.namespace().as_deref() == Some(ns.as_str()))
            .filter(|md| md.kernel_cache_name().as_deref() == Some(name.as_str()))
            .map(|md| ObjectRef::from_obj(md.as_ref()))
            .collect::<Vec<_>>()
    };
    let md_ctx = Arc::new(MdCtx {
        client: ctx.client.clone(),
        caches: ctx.caches.clone(),
        metrics: Arc::clone(&ctx.metrics),
    });
    Controller::for_stream(md_stream, mds.store.clone())
        .with_config(kubeairunway_sdk::process::controller_config())
        .watches(
            Api::<KernelCache>::all(ctx.client.clone()),
            watcher::Config::default(),
            cache_mds,
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile_md, md_error, md_ctx)
        .for_each(|_| async {})
}

/// What [`reconcile_md`] reads of a ModelDeployment, hashed: its identity and the
/// KernelCache it names, and for one naming a cache, its generation and its
/// `KernelCacheReady` condition. Its other changes (core's and the serving provider's
/// status, their finalizers) never change what it decides, so they wake nothing: one
/// reconcile per ModelDeployment naming no cache, not one per write to it. Cache changes
/// wake the ModelDeployments naming them through the KernelCache watch.
fn md_relevant(md: &Compact<ModelDeployment>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    md.meta().uid.hash(&mut h);
    let cache = md.kernel_cache_name();
    cache.hash(&mut h);
    if cache.is_some() {
        md.meta().generation.hash(&mut h);
        let condition = md
            .status()
            .and_then(|s| conditions::find(&s.conditions, KERNEL_CACHE_READY).cloned());
        serde_json::to_string(&condition).ok().hash(&mut h);
    }
    h.finish()
}

/// The controller of Nodes' ready labels from the agents' reports (a part of [`run`];
/// the agents never write Nodes).
fn label_controller(
    ctx: &Ctx,
    node_meta: &Cache<PartialObjectMeta<Node>>,
    node_meta_stream: impl futures::Stream<Item = Result<PartialObjectMeta<Node>, watcher::Error>>
    + Send
    + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl std::future::Future<Output = ()> {
    let report_nodes = watcher(
        Api::<KernelCacheNode>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .touched_objects()
    .filter_map(|r| async move { r.ok().map(|n| ObjectRef::new(&n.name_any())) });
    let label_ctx = Arc::new(LabelCtx {
        client: ctx.client.clone(),
        reports: ctx.nodes.clone(),
        metrics: Arc::clone(&ctx.metrics),
    });
    Controller::for_stream(node_meta_stream, node_meta.store.clone())
        .with_config(kubeairunway_sdk::process::controller_config())
        .reconcile_on(report_nodes)
        .graceful_shutdown_on(shutdown)
        .run(reconcile_node_labels, label_error, label_ctx)
        .for_each(|_| async {})
}

/// A watch cache of every `K` (without managed fields) and the stream that keeps it
/// current.
fn reflected<K>(
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

#[allow(clippy::needless_pass_by_value)] // kube-runtime's error-policy signature
fn cache_error(_: Arc<KernelCache>, error: &Error, ctx: Arc<Ctx>) -> Action {
    warn!(%error, "reconciling a KernelCache");
    ctx.metrics.reconcile_error();
    Action::requeue(Duration::from_secs(10))
}

async fn publish(ctx: &Ctx, cache: &KernelCache, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &cache.object_ref(&())).await {
        warn!(error = %e, "publishing an event");
    }
}

/// Pin, verify, aggregate and write one KernelCache's status, in phases:
/// [`registry_phase`], [`pin_phase`], [`verification_phase`] (recorded by
/// [`record_verdict`]) and the nodes' reports ([`nodes_phase`]).
async fn reconcile_cache(cache: Arc<KernelCache>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timing = ctx.metrics.reconciling("KernelCache");
    // Never decide on a partial view: an empty policy store would refuse every cache
    // (and the agents would drop them), an empty node store would report nothing ready.
    if !(ctx.policies.synced_within(SYNC_WAIT).await && ctx.nodes.synced_within(SYNC_WAIT).await) {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    ctx.prune().await;
    let generation = cache.metadata.generation;
    let previous = cache.status.clone().unwrap_or_default();
    let mut status = previous.clone();
    status.observed_generation = generation;

    let (puller, auth) = match registry_phase(&ctx, &cache).await {
        Ok(registry) => registry,
        Err(e) => {
            set(
                &mut status,
                "Resolved",
                false,
                reasons::RESOLVE_FAILED,
                &e,
                generation,
            );
            return write(&ctx, &cache, &previous, status).await;
        }
    };
    let pinned = match pin_phase(&ctx, &cache, &previous, &mut status, &puller).await {
        Pinned::Yes(pinned) => pinned,
        Pinned::Failed => {
            write(&ctx, &cache, &previous, status).await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };
    // Verify: a passed verdict stands until the policy changes or a reverify is asked;
    // a failed one is retried with backoff; an unreachable registry takes nothing away.
    let policy = ctx
        .policies
        .store
        .get(&ObjectRef::new(&ctx.settings.policy));
    let checked = verification_phase(
        &ctx,
        &cache,
        &status,
        policy.as_deref(),
        (&puller, &auth),
        &pinned,
    )
    .await;
    let retry_in = checked.retry_in;
    record_verdict(&mut status, policy.is_some(), checked, &pinned, generation);
    nodes_phase(&ctx, &cache, &mut status);
    write(&ctx, &cache, &previous, status).await?;
    Ok(Action::requeue(retry_in.map_or(ctx.settings.resync, |r| {
        r.min(ctx.settings.resync)
    })))
}

/// The cache's registry credentials, handed over to the agents, and a client using them
/// (a phase of [`reconcile_cache`]); why not, when its pull Secrets cannot be read.
async fn registry_phase(
    ctx: &Ctx,
    cache: &KernelCache,
) -> Result<(Puller, oci_client::secrets::RegistryAuth), String> {
    let ns = cache.namespace().unwrap_or_default();
    let image = &cache.spec.image;
    let auth = auth_for(
        ctx.secrets.as_ref(),
        &ns,
        &cache.spec.image_pull_secrets,
        image,
    )
    .await?;
    if let Some(h) = &ctx.handover
        && let Err(e) = h.sync(&ns, &cache.name_any(), image, &auth).await
    {
        warn!(cache = %cache.name_any(), error = %e, "handing registry credentials over to the agents");
    }
    let puller = Puller::new(auth.clone(), ctx.settings.plain_http.clone());
    Ok((puller, auth))
}

/// The `Verified` condition and what the status shows of the verdict (a phase of
/// [`reconcile_cache`]): a refused pin never looks usable.
fn record_verdict(
    status: &mut KernelCacheStatus,
    policy_found: bool,
    checked: Checked,
    pinned: &str,
    generation: Option<i64>,
) {
    let Checked {
        verification,
        cache_type,
        size_bytes,
        ..
    } = checked;
    let disabled = verification.mode == VerificationMode::Disabled && !verification.verified;
    let decide::Verdict {
        usable: ok,
        reason,
        message,
    } = decide::verdict(policy_found, cache_type.is_some(), &verification);
    set(status, "Verified", ok, reason, &message, generation);
    status.verification = Some(if ok {
        verification
    } else {
        Verification {
            verified: false,
            ..verification
        }
    });
    // Mode `disabled` makes any pin usable; one that is refused anyway (not a cache
    // image) is not published at all.
    status.pinned_image = (ok || !disabled).then(|| pinned.to_string());
    status.cache_type = cache_type;
    status.size_bytes = size_bytes.and_then(|b| i64::try_from(b).ok());
}

/// What the nodes report about the pinned digest: `Ready`, `nodes` and `readyNodes` (a
/// phase of [`reconcile_cache`]).
fn nodes_phase(ctx: &Ctx, cache: &KernelCache, status: &mut KernelCacheStatus) {
    let nodes: Vec<KernelCacheNode> = ctx
        .nodes
        .store
        .state()
        .iter()
        .map(|n| (**n).clone())
        .collect();
    let digest = status.resolved_digest.clone().unwrap_or_default();
    let agg = decide::aggregate(
        &cache.namespace().unwrap_or_default(),
        &cache.name_any(),
        &digest,
        &nodes,
    );
    let (ready, reason, message) = decide::ready_condition(status.usable_image().is_some(), &agg);
    set(
        status,
        "Ready",
        ready,
        reason,
        &message,
        cache.metadata.generation,
    );
    status.nodes = agg.nodes;
    status.ready_nodes = Some(agg.ready);
}

/// What [`pin_phase`] left.
enum Pinned {
    /// The image is pinned to this reference (`image@digest`).
    Yes(String),
    /// Resolving the tag failed: write the status and try again later.
    Failed,
}

/// The pin (a phase of [`reconcile_cache`]): kept while the spec is unchanged (a tag that
/// moved since is reported, never followed), resolved again when the spec changed.
async fn pin_phase(
    ctx: &Ctx,
    cache: &KernelCache,
    previous: &KernelCacheStatus,
    status: &mut KernelCacheStatus,
    puller: &Puller,
) -> Pinned {
    let generation = cache.metadata.generation;
    let image = &cache.spec.image;
    let spec_changed = previous.observed_generation != generation;
    let kept = previous.pinned_image.clone().filter(|_| !spec_changed);
    let Some(pinned) = kept else {
        status.resolved_digest = None;
        status.pinned_image = None;
        status.verification = None;
        status.cache_type = None;
        return resolve_pin(ctx, cache, status, puller).await;
    };
    let Some(digest) = &previous.resolved_digest else {
        return Pinned::Yes(pinned);
    };
    if !pin_check_due(
        ctx,
        &cache.namespace().unwrap_or_default(),
        &cache.name_any(),
    ) {
        return Pinned::Yes(pinned);
    }
    match puller.check_pin(image, digest).await {
        Ok(()) => set(
            status,
            "Resolved",
            true,
            reasons::PINNED,
            &format!("pinned to {digest}"),
            generation,
        ),
        Err(e @ PullError::TagMoved { .. }) => {
            let message = format!(
                "{e}; still using the verified pin {pinned} (edit the KernelCache to re-pin)"
            );
            if conditions::find(&previous.conditions, "Resolved")
                .is_none_or(|c| c.reason != reasons::TAG_MOVED)
            {
                publish(
                    ctx,
                    cache,
                    EventType::Warning,
                    reasons::TAG_MOVED,
                    message.clone(),
                )
                .await;
            }
            set(
                status,
                "Resolved",
                false,
                reasons::TAG_MOVED,
                &message,
                generation,
            );
        }
        // A registry outage does not un-pin: the pinned digest stays what it was.
        Err(e) => warn!(cache = %cache.name_any(), error = %e, "checking the pin"),
    }
    Pinned::Yes(pinned)
}

/// Resolve the cache's tag to a digest and pin it (part of [`pin_phase`]).
async fn resolve_pin(
    ctx: &Ctx,
    cache: &KernelCache,
    status: &mut KernelCacheStatus,
    puller: &Puller,
) -> Pinned {
    let generation = cache.metadata.generation;
    let image = &cache.spec.image;
    match puller
        .resolve(image)
        .await
        .and_then(|d| Ok((pin(image, &d)?, d)))
    {
        Ok((pinned, digest)) => {
            ctx.metrics.resolution(true);
            publish(
                ctx,
                cache,
                EventType::Normal,
                "Pinned",
                format!("{image} pinned to {digest}"),
            )
            .await;
            set(
                status,
                "Resolved",
                true,
                reasons::PINNED,
                &format!("pinned to {digest}"),
                generation,
            );
            status.resolved_digest = Some(digest);
            status.pinned_image = Some(pinned.clone());
            Pinned::Yes(pinned)
        }
        Err(e) => {
            ctx.metrics.resolution(false);
            set(
                status,
                "Resolved",
                false,
                reasons::RESOLVE_FAILED,
                &e.to_string(),
                generation,
            );
            set(
                status,
                "Ready",
                false,
                reasons::NOT_VERIFIED,
                "not pinned",
                generation,
            );
            Pinned::Failed
        }
    }
}

/// What [`verification_phase`] reached about the pinned digest.
struct Checked {
    /// The verdict.
    verification: Verification,
    /// The cache type (none when the image is not a cache).
    cache_type: Option<String>,
    /// When to look again, if a retry is pending.
    retry_in: Option<Duration>,
    /// The cache's size from its labels.
    size_bytes: Option<u64>,
}

/// The verdict on the pinned digest (a phase of [`reconcile_cache`]): the one in the
/// status when it stands ([`decide::verify_when`]), else reached now
/// ([`verify_now`]), with failures retried with backoff and an unreachable registry
/// taking nothing away.
async fn verification_phase(
    ctx: &Ctx,
    cache: &KernelCache,
    status: &KernelCacheStatus,
    policy: Option<&KernelCachePolicy>,
    registry: (&Puller, &oci_client::secrets::RegistryAuth),
    pinned: &str,
) -> Checked {
    let key = (cache.namespace().unwrap_or_default(), cache.name_any());
    let known_size = status.size_bytes.and_then(|b| u64::try_from(b).ok());
    let Some(policy) = policy else {
        return Checked {
            verification: decide::no_policy(&ctx.settings.policy),
            cache_type: None,
            retry_in: None,
            size_bytes: None,
        };
    };
    let digest = status.resolved_digest.clone().unwrap_or_default();
    let previous = status.verification.as_ref();
    let policy_version = decide::policy_version(policy);
    let request = cache
        .annotations()
        .get(decide::REVERIFY_ANNOTATION)
        .cloned();
    let retry = ctx.retries.lock().ok().and_then(|r| r.get(&key).cloned());
    let now = std::time::Instant::now();
    let kept = |retry_in| Checked {
        verification: previous.cloned().unwrap_or_default(),
        cache_type: status.cache_type.clone(),
        retry_in,
        size_bytes: known_size,
    };
    match decide::verify_when(
        previous,
        &digest,
        &policy_version,
        request.as_deref(),
        retry.as_ref(),
        now,
    ) {
        decide::VerifyWhen::Reuse => return kept(None),
        decide::VerifyWhen::Later(wait) => return kept(Some(wait)),
        decide::VerifyWhen::Now => {}
    }
    let (mut verification, cache_type, size) =
        verify_now(ctx, status, policy, registry, pinned).await;
    // A verdict kept through an outage keeps the policy it was reached under.
    if previous != Some(&verification) {
        verification.policy_version = Some(policy_version.clone());
    }
    verification.reverify_request = request;
    ctx.metrics
        .verification(policy.spec.mode, verification.verified);
    let passed_now = decide::passed(&verification)
        && cache_type.is_some()
        && verification.policy_version.as_deref() == Some(policy_version.as_str());
    let retry_in = schedule_retry(
        ctx,
        key,
        passed_now,
        retry.as_ref(),
        (&digest, &policy_version),
        now,
    );
    announce(
        ctx,
        cache,
        pinned,
        previous,
        &verification,
        cache_type.is_some(),
    )
    .await;
    Checked {
        verification,
        cache_type,
        retry_in,
        size_bytes: size,
    }
}

/// Keep the retry of `key` that [`decide::next_retry`] gives after a verification of
/// `digest` under `policy_version` (none: forget it); how long until it is due.
fn schedule_retry(
    ctx: &Ctx,
    key: (String, String),
    passed: bool,
    pending: Option<&decide::Retry>,
    (digest, policy_version): (&str, &str),
    now: std::time::Instant,
) -> Option<Duration> {
    let next = decide::next_retry(
        passed,
        pending,
        digest,
        policy_version,
        ctx.settings.resync,
        now,
    );
    let retry_in = next.as_ref().map(|r| r.at - now);
    if let Ok(mut retries) = ctx.retries.lock() {
        match next {
            Some(r) => retries.insert(key, r),
            None => retries.remove(&key),
        };
    }
    retry_in
}

/// An event when the verdict changed from `previous` ([`decide::verification_event`]).
async fn announce(
    ctx: &Ctx,
    cache: &KernelCache,
    pinned: &str,
    previous: Option<&Verification>,
    verification: &Verification,
    is_cache: bool,
) {
    if previous
        .is_some_and(|p| p.verified == verification.verified && p.message == verification.message)
    {
        return;
    }
    let (warning, reason, note) = decide::verification_event(pinned, verification, is_cache);
    let type_ = if warning {
        EventType::Warning
    } else {
        EventType::Normal
    };
    publish(ctx, cache, type_, reason, note).await;
}

/// Verify the signature of the pinned digest and read its labels (part of
/// [`verification_phase`]): the verdict ([`decide::judge`]), the cache type and the
/// cache's size.
async fn verify_now(
    ctx: &Ctx,
    status: &KernelCacheStatus,
    policy: &KernelCachePolicy,
    (puller, auth): (&Puller, &oci_client::secrets::RegistryAuth),
    pinned: &str,
) -> (Verification, Option<String>, Option<u64>) {
    let known_size = status.size_bytes.and_then(|b| u64::try_from(b).ok());
    let result = verify::verify(&policy.spec, pinned, auth, ctx.settings.plain_http.clone()).await;
    let inspected = puller.inspect(pinned).await.map(|(_, image)| image);
    let size = inspected
        .as_ref()
        .ok()
        .and_then(|image| image.size_bytes)
        .or(known_size);
    let (verification, cache_type) = decide::judge(
        status.verification.as_ref(),
        policy.spec.mode,
        status.cache_type.as_ref(),
        result,
        inspected,
    );
    (verification, cache_type, size)
}

/// Whether the tag of `namespace/name` is due for comparison with its pin: at most once
/// per resync interval, however often node reports wake the cache (registries rate-limit).
fn pin_check_due(ctx: &Ctx, namespace: &str, name: &str) -> bool {
    let Ok(mut checked) = ctx.pin_checked.lock() else {
        return true;
    };
    let now = std::time::Instant::now();
    let key = (namespace.to_string(), name.to_string());
    let due = checked
        .get(&key)
        .is_none_or(|last| now.duration_since(*last) >= ctx.settings.resync);
    if due {
        checked.insert(key, now);
    }
    due
}

fn set(
    status: &mut KernelCacheStatus,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    conditions::set(
        &mut status.conditions,
        type_,
        ok,
        reason,
        message,
        generation,
    );
}

async fn write(
    ctx: &Ctx,
    cache: &KernelCache,
    previous: &KernelCacheStatus,
    status: KernelCacheStatus,
) -> Result<Action, Error> {
    if *previous != status {
        let api: Api<KernelCache> =
            Api::namespaced(ctx.client.clone(), &cache.namespace().unwrap_or_default());
        crate::status::apply(&api, &cache.name_any(), FIELD_MANAGER, &status).await?;
    }
    Ok(Action::requeue(ctx.settings.resync))
}

struct LabelCtx {
    client: Client,
    reports: Cache<KernelCacheNode>,
    metrics: Arc<app::Metrics>,
}

#[allow(clippy::needless_pass_by_value)] // kube-runtime's error-policy signature
fn label_error(_: Arc<PartialObjectMeta<Node>>, error: &Error, _: Arc<LabelCtx>) -> Action {
    warn!(%error, "setting a node's kernel-cache labels");
    Action::requeue(Duration::from_secs(10))
}

/// Make a Node's ready labels match its KernelCacheNode report ([`labels`]).
async fn reconcile_node_labels(
    node: Arc<PartialObjectMeta<Node>>,
    ctx: Arc<LabelCtx>,
) -> Result<Action, Error> {
    let _timing = ctx.metrics.reconciling("Node");
    // An empty store would take every label away after a restart.
    if !ctx.reports.synced_within(SYNC_WAIT).await {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let name = node.name_any();
    let report = ctx.reports.store.get(&ObjectRef::new(&name));
    let ready = labels::ready_labels(report.as_deref());
    let changes = labels::label_changes(node.labels(), &ready);
    if !changes.is_empty() {
        info!(node = %name, set = ?changes.set, remove = ?changes.remove, "labelling the node");
        Api::<Node>::all(ctx.client.clone())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(changes.merge_patch()),
            )
            .await?;
    }
    Ok(Action::await_change())
}

struct MdCtx {
    client: Client,
    caches: Cache<KernelCache>,
    metrics: Arc<app::Metrics>,
}

#[allow(clippy::needless_pass_by_value)] // kube-runtime's error-policy signature
fn md_error(_: Arc<Compact<ModelDeployment>>, error: &Error, _: Arc<MdCtx>) -> Action {
    warn!(%error, "writing KernelCacheReady");
    Action::requeue(Duration::from_secs(10))
}

/// `KernelCacheReady` on one ModelDeployment that names a cache.
async fn reconcile_md(
    cached: Arc<Compact<ModelDeployment>>,
    ctx: Arc<MdCtx>,
) -> Result<Action, Error> {
    let _timing = ctx.metrics.reconciling("ModelDeployment");
    let Some(name) = cached.kernel_cache_name() else {
        return Ok(Action::await_change());
    };
    let name = name.as_str();
    let md = cached.object()?;
    // An empty cache store would report every cache missing after a restart.
    if !ctx.caches.synced_within(SYNC_WAIT).await {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let ns = md.namespace().unwrap_or_default();
    let cache = ctx.caches.store.get(&ObjectRef::new(name).within(&ns));
    let (ok, reason, message) = decide::model_deployment_condition(name, cache.as_deref());
    let current = md
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let previous = conditions::find(current, KERNEL_CACHE_READY);
    let condition: Condition = conditions::new(
        previous,
        KERNEL_CACHE_READY,
        ok,
        reason,
        message,
        md.metadata.generation,
        k8s_openapi::jiff::Timestamp::now(),
    );
    if previous == Some(&condition) {
        return Ok(Action::await_change());
    }
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let status = json!({"conditions": [condition]});
    crate::status::apply(&api, &md.name_any(), PROVIDER_FIELD_MANAGER, &status).await?;
    Ok(Action::await_change())
}

/// Register the `kernelcache` InferenceProviderConfig (a capability, never selected to
/// serve: no engines) and keep its heartbeat fresh: its spec is applied once (again only
/// if the object is gone), its status every heartbeat.
async fn register(client: Client, every: Duration) {
    use kubeairunway_sdk::InferenceProviderConfig;
    let api: Api<InferenceProviderConfig> = Api::all(client);
    let pp = PatchParams::apply(PROVIDER_FIELD_MANAGER).force();
    let spec = json!({
        "apiVersion": "kubeairunway.ai/v1alpha1",
        "kind": "InferenceProviderConfig",
        "metadata": {"name": PROVIDER_NAME},
        "spec": {
            "capabilities": {"features": ["kernelCache"]},
            "documentation": "Verified GPU kernel caches staged on nodes and mounted into serving pods (KernelCache, cache.kubeairunway.ai).",
        },
    });
    let mut registered = false;
    loop {
        if !registered {
            match api.patch(PROVIDER_NAME, &pp, &Patch::Apply(&spec)).await {
                Ok(_) => registered = true,
                Err(e) => warn!(error = %e, "registering the kernelcache InferenceProviderConfig"),
            }
        }
        if registered {
            let status = json!({
                "apiVersion": "kubeairunway.ai/v1alpha1",
                "kind": "InferenceProviderConfig",
                "metadata": {"name": PROVIDER_NAME},
                "status": {
                    "ready": true,
                    "version": env!("CARGO_PKG_VERSION"),
                    "lastHeartbeat": k8s_openapi::jiff::Timestamp::now().to_string(),
                },
            });
            match api
                .patch_status(PROVIDER_NAME, &pp, &Patch::Apply(&status))
                .await
            {
                Ok(_) => {}
                // Deleted since: registered again at once.
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    registered = false;
                    continue;
                }
                Err(e) => warn!(error = %e, "heartbeat of the kernelcache InferenceProviderConfig"),
            }
        }
        tokio::time::sleep(every.min(Duration::from_secs(30))).await;
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use kubeairunway_sdk::api::{KernelCacheRef, ModelDeploymentStatus};
    use kubeairunway_sdk::testing::ModelDeploymentBuilder;

    use super::*;

    fn relevant(md: &ModelDeployment) -> u64 {
        md_relevant(&Compact::new(md.clone()).unwrap())
    }

    fn with_condition(md: &ModelDeployment, type_: &str, ok: bool) -> ModelDeployment {
        let mut md = md.clone();
        let status = md.status.get_or_insert_with(ModelDeploymentStatus::default);
        status.conditions.push(conditions::new(
            None,
            type_,
            ok,
            "Reason",
            "message",
            Some(1),
            Timestamp::UNIX_EPOCH,
        ));
        md
    }

    /// Others' writes (core's and the serving provider's status, finalizers) wake nothing;
    /// what the condition is decided from, and the condition itself, do.
    #[test]
    fn only_what_decides_kernel_cache_ready_wakes_a_model_deployment() {
        let mut plain = ModelDeploymentBuilder::new("m").namespace("ns").build();
        plain.metadata.uid = Some("u1".into());
        plain.metadata.generation = Some(1);
        let mut written_by_others = with_condition(&plain, "Ready", false);
        written_by_others.metadata.finalizers = Some(vec!["kubeairunway.ai/x".into()]);
        written_by_others.metadata.generation = Some(2);
        // Naming no cache: nothing but its identity and a cache's name count.
        assert_eq!(relevant(&plain), relevant(&written_by_others));
        let mut recreated = plain.clone();
        recreated.metadata.uid = Some("u2".into());
        assert_ne!(relevant(&plain), relevant(&recreated));

        let mut named = plain.clone();
        named.spec.kernel_cache = Some(KernelCacheRef { name: "c".into() });
        assert_ne!(relevant(&plain), relevant(&named));
        assert_eq!(
            relevant(&named),
            relevant(&with_condition(&named, "Ready", true))
        );
        let mut edited = named.clone();
        edited.metadata.generation = Some(2);
        assert_ne!(relevant(&named), relevant(&edited));
        let ours = with_condition(&named, KERNEL_CACHE_READY, true);
        assert_ne!(relevant(&named), relevant(&ours));
        assert_ne!(
            relevant(&ours),
            relevant(&with_condition(&named, KERNEL_CACHE_READY, false))
        );
    }
}
