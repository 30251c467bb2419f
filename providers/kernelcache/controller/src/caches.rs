//! The controller over KernelCaches: pins each image to a digest, verifies its signature
//! under the cluster's `KernelCachePolicy`, hands registry credentials over to the node
//! agents, and adds up what the agents report into the cache's status. Woken by its own
//! watch, by the node reports that mention a cache, and by any policy change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kubeairunway_sdk::conditions::{self};
use kubeairunway_sdk::events::{Event, EventType, Recorder, Reporter};
use kubeairunway_sdk::reflect::Cache;
use tracing::warn;

use crate::decide::reasons;
use kubeairunway_kernelcache_api::{
    KernelCache, KernelCacheNode, KernelCachePolicy, KernelCacheStatus, Verification,
    VerificationMode,
};
use kubeairunway_kernelcache_artifact::credentials::{handover_config, handover_name, registry_of};
use kubeairunway_kernelcache_artifact::oci::{PullError, Puller, pin};
use kubeairunway_kernelcache_artifact::secrets::{SecretApi, auth_for};
use kubeairunway_kernelcache_signing::verify;

use crate::decide;
use crate::handover;
use crate::metrics::Metrics;
use crate::retries::Retries;
use crate::settings::{FIELD_MANAGER, SYNC_WAIT, Settings};
use kubeairunway_kernelcache_api::report::Error;

/// What the KernelCache controller shares between reconciles (and the other
/// controllers read).
pub(crate) struct Ctx {
    pub(crate) client: Client,
    pub(crate) settings: Settings,
    secrets: Arc<dyn SecretApi>,
    pub(crate) nodes: Cache<KernelCacheNode>,
    pub(crate) caches: Cache<KernelCache>,
    policies: Cache<KernelCachePolicy>,
    recorder: Recorder,
    pub(crate) metrics: Arc<Metrics>,
    /// Failed verifications waiting for their retry, per cache.
    retries: Retries,
    /// When each cache's tag was last compared with its pin.
    pin_checked: Mutex<HashMap<(String, String), std::time::Instant>>,
    pub(crate) handover: Option<Arc<handover::Handover>>,
}

impl Ctx {
    pub(crate) fn exists(&self, namespace: &str, name: &str) -> bool {
        self.caches
            .store
            .get(&ObjectRef::new(name).within(namespace))
            .is_some()
    }

    /// Forget what is kept per cache for caches that no longer exist (their handed-over
    /// credentials are taken back by the handover's own loop).
    pub(crate) fn prune(&self) {
        let exists = |(ns, name): &(String, String)| self.exists(ns, name);
        self.retries.retain(exists);
        if let Ok(mut p) = self.pin_checked.lock() {
            p.retain(|k, _| exists(k));
        }
    }
}

/// The shared state of the KernelCache controller (a part of [`crate::run`]).
#[allow(clippy::too_many_arguments)] // the controller's seams, each a watch cache or a setting
pub(crate) fn new_ctx(
    client: &Client,
    settings: Settings,
    secrets: Arc<dyn SecretApi>,
    metrics: Arc<Metrics>,
    nodes: &Cache<KernelCacheNode>,
    caches: &Cache<KernelCache>,
    policies: Cache<KernelCachePolicy>,
    handover: Option<Arc<handover::Handover>>,
) -> Arc<Ctx> {
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
        retries: Retries::default(),
        pin_checked: Mutex::default(),
        handover,
    })
}

/// The controller over KernelCaches (a part of [`crate::run`]): woken by its own watch, by the
/// node reports that mention a cache, and by any policy change (every cache).
pub(crate) fn cache_controller(
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
    ctx.prune();
    let generation = cache.metadata.generation;
    let previous = cache.status.clone().unwrap_or_default();
    let mut status = previous.clone();
    status.observed_generation = generation;

    // Before any request for it: an image from a registry the operator does not allow is
    // never resolved, and a pin made before the list changed stops being usable.
    if let Err(e) = ctx.settings.allowed.check(&cache.spec.image) {
        for type_ in ["Resolved", "Verified", "Ready"] {
            set(
                &mut status,
                type_,
                false,
                reasons::REGISTRY_NOT_ALLOWED,
                &e,
                generation,
            );
        }
        status.pinned_image = None;
        status.resolved_digest = None;
        return write(&ctx, &cache, &previous, status).await;
    }
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
    let name = cache.name_any();
    let owner = (handover::Kind::Kernel, ns.clone(), name.clone());
    let image = &cache.spec.image;
    let auth = auth_for(
        ctx.secrets.as_ref(),
        &ns,
        &cache.spec.image_pull_secrets,
        image,
    )
    .await
    .inspect_err(|_| {
        if let Some(h) = &ctx.handover {
            h.tried(&owner);
        }
    })?;
    if let Some(h) = &ctx.handover {
        let entry_name = handover_name(&ns, &name);
        let entry = handover_config(&registry_of(image), &auth).map(|config| handover::Entry {
            owner: owner.clone(),
            name: entry_name.clone(),
            selector: cache.spec.node_selector.clone(),
            data: handover::docker_config(config),
        });
        h.hand_over(&owner, &entry_name, entry);
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
    let retry = ctx.retries.pending(&key);
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
    let retry_in = ctx.retries.schedule(
        key,
        passed_now,
        retry.as_ref(),
        (&digest, &policy_version),
        ctx.settings.resync,
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
    publish(
        ctx,
        cache,
        kubeairunway_sdk::events::event_type(warning),
        reason,
        note,
    )
    .await;
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
        kubeairunway_kernelcache_api::report::apply(
            &api,
            &cache.name_any(),
            FIELD_MANAGER,
            &status,
        )
        .await?;
    }
    Ok(Action::requeue(ctx.settings.resync))
}
