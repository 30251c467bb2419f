//! The controller over ModelCaches: hands each cache's hub token over to the node agents
//! (a Secret of its own in the credentials namespace, as registry credentials are), and
//! adds up what the agents report into the cache's status ([`crate::model_decide`]).
//! Woken by its own watch and by the node reports that mention a cache; reads the caches
//! and the reports from the watch caches (the user's Secret is read only when the cache's
//! generation changed or the resync interval passed), and writes the status only when it
//! changed. Once a node is ready, it applies the cache's local PersistentVolume and claim
//! ([`crate::model_volumes`]; again only when they changed) and deletes both when the cache
//! is gone (a cluster-scoped volume cannot have a namespaced owner).
//!
//! Lifecycle: its finalizer ([`FINALIZER`]) on every cache holds a deleted one while
//! ModelDeployments of its namespace use it (`Deleting=True`/`InUse` names them; their
//! watch events wake it), then the volume and claim go and the finalizer is removed. The
//! nodes are not waited for: each agent removes the files once the object is gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kubeairunway_kernelcache_api::model::{
    self, FINALIZER, ModelCache, ModelCacheStatus, Source, conditions, parse_source,
};
use kubeairunway_kernelcache_api::names::{self, MODEL_TOKEN_KEY, model_token_secret};
use kubeairunway_kernelcache_api::report::{Error, kube_error};
use kubeairunway_kernelcache_api::{KernelCacheNode, KernelCachePolicy};
use kubeairunway_kernelcache_artifact::allow::AllowedRegistries;
use kubeairunway_kernelcache_artifact::credentials::{handover_config, registry_auth, registry_of};
use kubeairunway_kernelcache_artifact::secrets::SecretApi;
use kubeairunway_kernelcache_signing::verify::{self, VerifyError};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::api::ModelSpec;
use kubeairunway_sdk::compact::Compact;
use kubeairunway_sdk::reflect::Cache;
use oci_client::secrets::RegistryAuth;
use serde_json::json;
use tracing::{info, warn};

use crate::decide;
use crate::handover::{self, Handover};
use crate::metrics::Metrics;
use crate::model_decide::{self, Deletion};
use crate::model_volumes::{self, VOLUME_LABEL, Volumes};
use crate::retries::Retries;
use crate::settings::{FIELD_MANAGER, SYNC_WAIT};

/// A ModelCache: (namespace, name).
type Key = (String, String);

/// What was handed over for one cache, and when.
struct Handed {
    /// `<uid>/<generation>` of the cache it was read for.
    version: String,
    at: Instant,
    /// Why it could not be handed over, when it could not.
    problem: Option<String>,
    /// The registry credentials read (an `oci://` source's; anonymous otherwise).
    auth: RegistryAuth,
}

/// What verifying `oci://` sources needs: the policies (the KernelCaches' watch cache),
/// the name of the one that applies, and the registry settings.
pub(crate) struct Verifying {
    /// Every `KernelCachePolicy`.
    pub(crate) policies: Cache<KernelCachePolicy>,
    /// The name of the policy that applies (`--policy`, the KernelCaches' too).
    pub(crate) policy: String,
    /// Registries spoken to over plain HTTP.
    pub(crate) plain_http: Vec<String>,
    /// The registries sources may come from.
    pub(crate) allowed: AllowedRegistries,
}

/// What the ModelCache controller shares between reconciles.
pub(crate) struct ModelCtx {
    client: Client,
    caches: Cache<ModelCache>,
    reports: Cache<KernelCacheNode>,
    secrets: Arc<dyn SecretApi>,
    metrics: Arc<Metrics>,
    resync: Duration,
    /// The sealed handover to the agents (none: tokens are not handed over).
    handover: Option<Arc<Handover>>,
    handed: Mutex<HashMap<Key, Handed>>,
    /// The agents' model-cache root (`HF_HOME` on every node); none: no volumes.
    model_root: Option<String>,
    /// The volumes applied, per cache: applied again only when they change.
    applied: Mutex<HashMap<Key, Volumes>>,
    /// Every ModelDeployment (compact): who holds a deleted cache.
    mds: Cache<Compact<ModelDeployment>>,
    /// Verifying `oci://` sources.
    verifying: Verifying,
    /// Failed verifications waiting for their retry, per cache.
    retries: Retries,
    /// The Nodes (metadata): a report left behind by a deleted Node holds no download
    /// slot.
    nodes: Cache<PartialObjectMeta<Node>>,
}

impl ModelCtx {
    /// The shared state (a part of [`crate::run`]).
    #[allow(clippy::too_many_arguments)] // the controller's seams, each a watch cache or a setting
    pub(crate) fn new(
        client: &Client,
        caches: &Cache<ModelCache>,
        reports: &Cache<KernelCacheNode>,
        secrets: Arc<dyn SecretApi>,
        metrics: Arc<Metrics>,
        resync: Duration,
        handover: Option<Arc<Handover>>,
        model_root: Option<String>,
        mds: &Cache<Compact<ModelDeployment>>,
        verifying: Verifying,
        nodes: &Cache<PartialObjectMeta<Node>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client: client.clone(),
            caches: caches.clone(),
            reports: reports.clone(),
            secrets,
            metrics,
            resync,
            handover,
            handed: Mutex::default(),
            model_root,
            applied: Mutex::default(),
            mds: mds.clone(),
            verifying,
            retries: Retries::default(),
            nodes: nodes.clone(),
        })
    }

    fn exists(&self, (namespace, name): &Key) -> bool {
        self.caches
            .store
            .get(&ObjectRef::new(name).within(namespace))
            .is_some()
    }

    /// Forget what is kept of caches that no longer exist (their handed-over credentials
    /// are taken back by the handover's own loop).
    pub(crate) fn prune(&self) {
        self.retries.retain(|key| self.exists(key));
        if let Ok(mut handed) = self.handed.lock() {
            handed.retain(|key, _| self.exists(key));
        }
    }

    /// Delete the volumes and claims of caches that no longer exist: those this process
    /// applied, and (`sweep`, once the caches are synced) every model-cache volume of the
    /// cluster (one LIST at start) with its claim.
    pub(crate) async fn prune_volumes(&self, sweep: bool) {
        let mut gone: Vec<Key> = Vec::new();
        if let Ok(mut applied) = self.applied.lock() {
            applied.retain(|key, _| {
                let keep = self.exists(key);
                if !keep {
                    gone.push(key.clone());
                }
                keep
            });
        }
        if sweep && self.model_root.is_some() {
            let api: Api<PersistentVolume> = Api::all(self.client.clone());
            let selector = format!("{VOLUME_LABEL}=true");
            match api.list(&ListParams::default().labels(&selector)).await {
                Ok(list) => gone.extend(
                    list.into_iter()
                        .filter_map(|v| model_volumes::made_for(v.annotations()))
                        .filter(|k| !self.exists(k)),
                ),
                Err(e) => warn!(error = %kube_error(&e), "listing model-cache volumes"),
            }
        }
        gone.sort();
        gone.dedup();
        for (namespace, name) in gone {
            self.delete_volumes(&namespace, &name).await;
        }
    }

    /// Deletes the claim and the volume of the ModelCache `namespace/name` (absent ones
    /// are fine: the claim's owner reference may have taken it already).
    async fn delete_volumes(&self, namespace: &str, name: &str) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let claim = names::model_claim(namespace, name);
        match claims.delete(&claim, &DeleteParams::default()).await {
            Ok(_) => info!(namespace, claim = %claim, "claim of a deleted ModelCache removed"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => warn!(error = %kube_error(&e), "removing a model-cache claim"),
        }
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        let volume = names::model_volume(namespace, name);
        match volumes.delete(&volume, &DeleteParams::default()).await {
            Ok(_) => info!(volume = %volume, "volume of a deleted ModelCache removed"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => warn!(error = %kube_error(&e), "removing a model-cache volume"),
        }
    }

    /// Applies `volumes` of the cache `key` unless they are what was applied last (a
    /// phase of [`reconcile`]).
    async fn apply_volumes(&self, key: &Key, volumes: &Volumes) -> Result<(), String> {
        let unchanged = self
            .applied
            .lock()
            .ok()
            .is_some_and(|a| a.get(key) == Some(volumes));
        if unchanged {
            return Ok(());
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        pvs.patch(
            &volumes.volume_name,
            &params,
            &Patch::Apply(&volumes.volume),
        )
        .await
        .map_err(|e| {
            format!(
                "applying volume {}: {}",
                volumes.volume_name,
                kube_error(&e)
            )
        })?;
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &key.0);
        claims
            .patch(&volumes.claim_name, &params, &Patch::Apply(&volumes.claim))
            .await
            .map_err(|e| format!("applying claim {}: {}", volumes.claim_name, kube_error(&e)))?;
        info!(namespace = %key.0, cache = %key.1, volume = %volumes.volume_name, claim = %volumes.claim_name, "model-cache volume applied");
        if let Ok(mut a) = self.applied.lock() {
            a.insert(key.clone(), volumes.clone());
        }
        Ok(())
    }
}

/// The controller over ModelCaches (a part of [`crate::run`]).
pub(crate) fn model_controller(
    ctx: &Arc<ModelCtx>,
    caches: impl futures::Stream<Item = Result<ModelCache, watcher::Error>> + Send + 'static,
    reports: impl futures::Stream<Item = KernelCacheNode> + Send + 'static,
    mds: impl futures::Stream<Item = Result<Compact<ModelDeployment>, watcher::Error>> + Send + 'static,
    policies: impl futures::Stream<Item = KernelCachePolicy> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl std::future::Future<Output = ()> {
    let mentioned = reports.flat_map(|n| {
        // And the caches it holds a download slot of: a slot goes when the entry does.
        let slots = n.spec.model_downloads.iter().flat_map(|g| g.keys());
        let mut refs: Vec<ObjectRef<ModelCache>> = n
            .status
            .iter()
            .flat_map(|s| s.model_caches.iter())
            .map(|c| ObjectRef::new(&c.name).within(&c.namespace))
            .chain(slots.filter_map(|k| {
                k.split_once('/')
                    .map(|(ns, name)| ObjectRef::new(name).within(ns))
            }))
            .collect();
        refs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        refs.dedup();
        futures::stream::iter(refs)
    });
    // A ModelDeployment's change (or its deletion) wakes the deleted caches of its
    // namespace: their users may have changed.
    let store = ctx.caches.store.clone();
    let deleting = mds.flat_map(move |md| {
        let refs: Vec<ObjectRef<ModelCache>> = md
            .ok()
            .map(|md| {
                let ns = md.namespace();
                store
                    .state()
                    .iter()
                    .filter(|c| c.metadata.deletion_timestamp.is_some() && c.namespace() == ns)
                    .map(|c| ObjectRef::from_obj(c.as_ref()))
                    .collect()
            })
            .unwrap_or_default();
        futures::stream::iter(refs)
    });
    // A cache gone from the store is never reconciled: what was made for it (left by a
    // deletion that did not pass the finalizer, e.g. no controller ran) goes when its
    // deletion comes through the watch (the store already without it).
    let pruning = Arc::clone(ctx);
    let caches = caches.then(move |event| {
        let ctx = Arc::clone(&pruning);
        async move {
            ctx.prune();
            ctx.prune_volumes(false).await;
            event
        }
    });
    Controller::for_stream(caches, ctx.caches.store.clone())
        .with_config(kubeairunway_sdk::process::controller_config())
        .reconcile_on(mentioned)
        .reconcile_on(deleting)
        .reconcile_all_on(policies.map(|_| ()))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::clone(ctx))
        .for_each(|_| async {})
}

#[allow(clippy::needless_pass_by_value)] // kube-runtime's error-policy signature
fn error_policy(_: Arc<ModelCache>, error: &Error, ctx: Arc<ModelCtx>) -> Action {
    warn!(%error, "reconciling a ModelCache");
    ctx.metrics.reconcile_error();
    Action::requeue(Duration::from_secs(10))
}

/// Hand the token over ([`hand_over`]), add up the reports and write the status when it
/// changed.
async fn reconcile(cache: Arc<ModelCache>, ctx: Arc<ModelCtx>) -> Result<Action, Error> {
    let _timing = ctx.metrics.reconciling("ModelCache");
    // Counting an empty store's reports would say no node holds anything; an empty
    // policy store would let an `oci://` digest through unverified.
    // An empty Node store would take every report for one left behind.
    if !(ctx.reports.synced_within(SYNC_WAIT).await
        && ctx.verifying.policies.synced_within(SYNC_WAIT).await
        && ctx.nodes.synced_within(SYNC_WAIT).await)
    {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    if cache.metadata.deletion_timestamp.is_some() {
        return finish_deletion(&ctx, &cache).await;
    }
    ensure_finalizer(&ctx, &cache).await?;
    let (credentials, auth) = hand_over(&ctx, &cache).await;
    let reports = ctx.reports.store.state();
    let reports: Vec<&KernelCacheNode> = reports.iter().map(AsRef::as_ref).collect();
    let mut status = model_decide::status(
        &cache,
        cache.status.as_ref(),
        &reports,
        credentials.as_deref(),
    );
    let accepted = model_decide::accepted(&cache, credentials.as_deref()).0;
    let mut retry_in = None;
    match (parse_source(&cache.spec.source), accepted) {
        (Ok(Source::Oci(reference)), true) => {
            let (verdict, retry) = verdict_phase(&ctx, &cache, &reference, &auth).await;
            model_decide::record_verdict(&mut status, &verdict, cache.metadata.generation);
            retry_in = retry;
        }
        // No verdict: nothing for the nodes to pull.
        _ => status
            .conditions
            .retain(|c| c.type_ != conditions::VERIFIED),
    }
    download_slots(&ctx, &cache, &reports, cache.spec.max_nodes()).await?;
    let volumes_ok = volumes(&ctx, &cache, &mut status).await;
    if cache.status.as_ref() != Some(&status) {
        let api: Api<ModelCache> =
            Api::namespaced(ctx.client.clone(), &cache.namespace().unwrap_or_default());
        kubeairunway_kernelcache_api::report::apply(
            &api,
            &cache.name_any(),
            FIELD_MANAGER,
            &status,
        )
        .await?;
    }
    ctx.prune();
    ctx.prune_volumes(false).await;
    let next = if volumes_ok {
        ctx.resync
    } else {
        Duration::from_secs(10)
    };
    Ok(Action::requeue(retry_in.map_or(next, |r| r.min(next))))
}

/// The verdict on an `oci://` cache's pinned digest `reference` (a phase of
/// [`reconcile`]), as KernelCaches get theirs: none applies without the policy (digest
/// only); under it, a passed verdict stands until the policy changes or a reverify is
/// asked ([`decide::verify_when`]), else the signature is checked now, and a failure is
/// retried with backoff ([`decide::next_retry`]). With when to look again.
async fn verdict_phase(
    ctx: &ModelCtx,
    cache: &ModelCache,
    reference: &str,
    auth: &RegistryAuth,
) -> (model_decide::OciVerdict, Option<Duration>) {
    let key = (cache.namespace().unwrap_or_default(), cache.name_any());
    let digest = reference
        .rsplit_once('@')
        .map(|(_, d)| d.to_string())
        .unwrap_or_default();
    let v = &ctx.verifying;
    let verdict = |policy_found, verification| model_decide::OciVerdict {
        digest: digest.clone(),
        policy_found,
        verification,
    };
    let Some(policy) = v.policies.store.get(&ObjectRef::new(&v.policy)) else {
        return (verdict(false, model_decide::digest_only(&v.policy)), None);
    };
    let status = cache.status.clone().unwrap_or_default();
    // A passed verdict counts only for the digest it passed; a refusal, for its retries.
    let previous = status
        .verification
        .filter(|p| !decide::passed(p) || status.verified_digest.as_deref() == Some(&digest));
    let policy_version = decide::policy_version(&policy);
    let request = cache
        .annotations()
        .get(decide::REVERIFY_ANNOTATION)
        .cloned();
    let retry = ctx.retries.pending(&key);
    let now = Instant::now();
    match decide::verify_when(
        previous.as_ref(),
        &digest,
        &policy_version,
        request.as_deref(),
        retry.as_ref(),
        now,
    ) {
        decide::VerifyWhen::Reuse => return (verdict(true, previous.unwrap_or_default()), None),
        decide::VerifyWhen::Later(wait) => {
            return (verdict(true, previous.unwrap_or_default()), Some(wait));
        }
        decide::VerifyWhen::Now => {}
    }
    let result = match v.allowed.check(reference) {
        Ok(()) => verify::verify(&policy.spec, reference, auth, v.plain_http.clone()).await,
        Err(e) => Err(VerifyError::Reference(reference.to_string(), e)),
    };
    let mut verification = model_decide::judge_oci(previous.as_ref(), policy.spec.mode, result);
    if previous.as_ref() != Some(&verification) {
        verification.policy_version = Some(policy_version.clone());
    }
    verification.reverify_request = request;
    ctx.metrics
        .verification(policy.spec.mode, verification.verified);
    let passed = decide::passed(&verification)
        && verification.policy_version.as_deref() == Some(policy_version.as_str());
    let retry_in = ctx.retries.schedule(
        key,
        passed,
        retry.as_ref(),
        (&digest, &policy_version),
        ctx.resync,
        now,
    );
    (verdict(true, verification), retry_in)
}

/// The finalizer put on `cache` when it lacks it (a phase of [`reconcile`]; no write
/// when it has it).
async fn ensure_finalizer(ctx: &ModelCtx, cache: &ModelCache) -> Result<(), Error> {
    if cache.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let mut finalizers = cache.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    set_finalizers(ctx, cache, finalizers).await
}

/// `cache`'s finalizers set to `finalizers`, provided it is unchanged since read (its
/// resourceVersion: a conflict is retried by the error policy).
async fn set_finalizers(
    ctx: &ModelCtx,
    cache: &ModelCache,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let api: Api<ModelCache> =
        Api::namespaced(ctx.client.clone(), &cache.namespace().unwrap_or_default());
    let body = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": cache.resource_version(),
    }});
    api.patch(
        &cache.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&body),
    )
    .await?;
    Ok(())
}

/// A deleted cache (a phase of [`reconcile`]): held while ModelDeployments of its
/// namespace use it (`Deleting=True`/`InUse` names them; their changes wake it), else its
/// volume and claim deleted and the finalizer removed. The nodes are not waited for: each
/// agent removes the files once the object is gone.
async fn finish_deletion(ctx: &ModelCtx, cache: &ModelCache) -> Result<Action, Error> {
    if !cache.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    if !ctx.mds.synced_within(SYNC_WAIT).await {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let mds = ctx.mds.store.state();
    let models: Vec<(String, String, ModelSpec)> = mds
        .iter()
        .filter_map(|md| {
            let model = md.peek::<ModelOf>()?.spec.model;
            Some((md.namespace().unwrap_or_default(), md.name_any(), model))
        })
        .collect();
    let users = model_decide::deletion(
        cache,
        models.iter().map(|(ns, n, m)| (ns.as_str(), n.as_str(), m)),
    );
    let namespace = cache.namespace().unwrap_or_default();
    let name = cache.name_any();
    match users {
        Deletion::Held(users) => {
            // The agents keep it while it is held, and may still be downloading it.
            let reports = ctx.reports.store.state();
            let reports: Vec<&KernelCacheNode> = reports.iter().map(AsRef::as_ref).collect();
            download_slots(ctx, cache, &reports, cache.spec.max_nodes()).await?;
            let previous = cache.status.clone().unwrap_or_default();
            let status = model_decide::held(previous.clone(), &users, cache.metadata.generation);
            if status != previous {
                let api: Api<ModelCache> = Api::namespaced(ctx.client.clone(), &namespace);
                kubeairunway_kernelcache_api::report::apply(&api, &name, FIELD_MANAGER, &status)
                    .await?;
                info!(%namespace, cache = %name, users = ?users, "ModelCache deletion held: in use");
            }
            Ok(Action::requeue(ctx.resync))
        }
        Deletion::Release => {
            let reports = ctx.reports.store.state();
            let reports: Vec<&KernelCacheNode> = reports.iter().map(AsRef::as_ref).collect();
            download_slots(ctx, cache, &reports, None).await?;
            ctx.delete_volumes(&namespace, &name).await;
            if let Ok(mut a) = ctx.applied.lock() {
                a.remove(&(namespace.clone(), name.clone()));
            }
            let rest: Vec<String> = cache
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .cloned()
                .collect();
            set_finalizers(ctx, cache, rest).await?;
            info!(%namespace, cache = %name, "ModelCache released: no ModelDeployment uses it");
            Ok(Action::await_change())
        }
    }
}

/// The field manager of the download slots in the nodes' `spec.modelDownloads` (merge
/// patches: each cache's reconcile changes its own key only).
pub const SLOTS_MANAGER: &str = "kernelcache-controller-downloads";

/// The download slots of `cache` granted and released on the nodes
/// ([`model_decide::download_slots`], bounded by `max_nodes`; none: every slot goes), a
/// phase of [`reconcile`]: one merge patch of `spec.modelDownloads` per node that
/// changes (a node whose report is gone is skipped).
async fn download_slots(
    ctx: &ModelCtx,
    cache: &ModelCache,
    reports: &[&KernelCacheNode],
    max_nodes: Option<u32>,
) -> Result<(), Error> {
    let namespace = cache.namespace().unwrap_or_default();
    let name = cache.name_any();
    let generation = cache.metadata.generation;
    let nodes: std::collections::BTreeSet<String> = ctx
        .nodes
        .store
        .state()
        .iter()
        .map(|n| n.name_any())
        .collect();
    let slots = model_decide::download_slots(
        &namespace,
        &name,
        generation,
        max_nodes,
        reports,
        Some(&nodes),
    );
    let key = model::slot_key(&namespace, &name);
    let api: Api<KernelCacheNode> = Api::all(ctx.client.clone());
    let params = PatchParams {
        field_manager: Some(SLOTS_MANAGER.into()),
        ..PatchParams::default()
    };
    let changes = slots
        .release
        .iter()
        .map(|n| (n, None))
        .chain(slots.grant.iter().map(|n| (n, generation)));
    for (node, granted) in changes {
        let patch = model_decide::slot_patch(&key, granted);
        match api.patch(node, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                if granted.is_some() {
                    info!(%namespace, cache = %name, %node, "download slot granted");
                } else {
                    info!(%namespace, cache = %name, %node, "download slot released");
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The part of a ModelDeployment that says which cache it uses.
#[derive(serde::Deserialize)]
struct ModelOf {
    spec: ModelOfSpec,
}

#[derive(serde::Deserialize)]
struct ModelOfSpec {
    #[serde(default)]
    model: ModelSpec,
}

/// The cache's volume and claim applied once a node is ready, and the claim named in
/// `status` (a phase of [`reconcile`]); the claim stays named once made (a cache with no
/// ready node left keeps its volume, whose node affinity then matches no node). `false`
/// when applying failed (logged; tried again soon).
async fn volumes(ctx: &ModelCtx, cache: &ModelCache, status: &mut ModelCacheStatus) -> bool {
    status.claim_name = cache.status.as_ref().and_then(|s| s.claim_name.clone());
    let Some(root) = ctx.model_root.as_deref() else {
        return true;
    };
    let Some(volumes) = model_volumes::desired(cache, status, root) else {
        return true;
    };
    let key = (cache.namespace().unwrap_or_default(), cache.name_any());
    match ctx.apply_volumes(&key, &volumes).await {
        Ok(()) => {
            status.claim_name = Some(volumes.claim_name);
            true
        }
        Err(e) => {
            warn!(namespace = %key.0, cache = %key.1, error = %e, "model-cache volume");
            false
        }
    }
}

/// The cache's hub token (`hf://`) or registry credentials (`oci://`) into
/// `<credentials namespace>/modelcache-token-<hash>` (a phase of [`reconcile`]); why not,
/// when it could not be, and the registry credentials (anonymous when none). The user's
/// Secret is read again only for a new generation of the cache or after the resync
/// interval.
async fn hand_over(ctx: &ModelCtx, cache: &ModelCache) -> (Option<String>, RegistryAuth) {
    let namespace = cache.namespace().unwrap_or_default();
    let name = cache.name_any();
    let Some(reference) = cache.spec.credentials_secret_ref.as_ref() else {
        // Nothing to hand over: the handover's loop takes back what was (a cache that
        // names no credentials Secret is not among those it keeps).
        return (None, RegistryAuth::Anonymous);
    };
    let key = (namespace.clone(), name.clone());
    let version = format!(
        "{}/{}",
        cache.metadata.uid.as_deref().unwrap_or_default(),
        cache.metadata.generation.unwrap_or_default()
    );
    if let Some(h) = ctx.handed.lock().ok().and_then(|h| {
        h.get(&key)
            .filter(|h| h.version == version && h.at.elapsed() < ctx.resync)
            .map(|h| (h.problem.clone(), h.auth.clone()))
    }) {
        return h;
    }
    let to = Recipient {
        namespace: &namespace,
        name: &name,
        selector: cache.spec.node_selector.as_ref(),
    };
    let copied = match parse_source(&cache.spec.source) {
        Ok(Source::Oci(image)) => copy_registry_auth(ctx, &to, &reference.name, &image).await,
        _ => copy_token(ctx, &to, &reference.name, reference.key())
            .await
            .map(|()| RegistryAuth::Anonymous),
    };
    if copied.is_err()
        && let Some(h) = &ctx.handover
    {
        h.tried(&(handover::Kind::Model, namespace.clone(), name.clone()));
    }
    let (problem, auth) = match copied {
        Ok(auth) => (None, auth),
        Err(e) => (Some(e), RegistryAuth::Anonymous),
    };
    if let Ok(mut h) = ctx.handed.lock() {
        h.insert(
            key,
            Handed {
                version,
                at: Instant::now(),
                problem: problem.clone(),
                auth: auth.clone(),
            },
        );
    }
    (problem, auth)
}

/// The cache a hand-over is for, and the nodes it is sealed for.
struct Recipient<'a> {
    namespace: &'a str,
    name: &'a str,
    selector: Option<&'a std::collections::BTreeMap<String, String>>,
}

/// Reads the registry credentials of `image`'s registry from the user's docker config
/// Secret (as KernelCaches' pull Secrets are read: [`registry_auth`]) and hands that
/// registry's entry over ([`handover_config`]), sealed for the nodes the cache selects.
async fn copy_registry_auth(
    ctx: &ModelCtx,
    to: &Recipient<'_>,
    secret: &str,
    image: &str,
) -> Result<RegistryAuth, String> {
    let data = user_secret(ctx, to.namespace, secret).await?;
    let registry = registry_of(image);
    let auth = credentials_for(&registry, secret, data)?;
    let config = handover_config(&registry, &auth).unwrap_or_default();
    hand(ctx, to, handover::docker_config(config))?;
    Ok(auth)
}

/// The credentials for `registry` in the docker config Secret `secret` (a part of
/// [`copy_registry_auth`]): one with no entry for it is refused, not taken for anonymous
/// access (the cache names it to pull with it).
pub fn credentials_for(
    registry: &str,
    secret: &str,
    data: kubeairunway_kernelcache_artifact::secrets::SecretData,
) -> Result<RegistryAuth, String> {
    match registry_auth(registry, &[(secret.to_string(), data)]) {
        Ok(RegistryAuth::Anonymous) => Err(format!(
            "Secret {secret} has no credentials for registry {registry}"
        )),
        Ok(auth) => Ok(auth),
        Err(e) => Err(e.to_string()),
    }
}

/// Hands `data` over for `to` (a part of [`hand_over`]).
fn hand(
    ctx: &ModelCtx,
    to: &Recipient<'_>,
    data: kubeairunway_kernelcache_artifact::secrets::SecretData,
) -> Result<(), String> {
    let Some(h) = &ctx.handover else {
        return Err(
            "the controller has no --credentials-namespace to hand the credentials over in".into(),
        );
    };
    let owner = (
        handover::Kind::Model,
        to.namespace.to_string(),
        to.name.to_string(),
    );
    let name = model_token_secret(to.namespace, to.name);
    let entry = handover::Entry {
        owner: owner.clone(),
        name: name.clone(),
        selector: to.selector.cloned(),
        data,
    };
    h.hand_over(&owner, &name, Some(entry));
    Ok(())
}

/// Reads the token from the user's Secret and hands it over.
async fn copy_token(
    ctx: &ModelCtx,
    to: &Recipient<'_>,
    secret: &str,
    key: &str,
) -> Result<(), String> {
    if ctx.handover.is_none() {
        return Err(
            "the controller has no --credentials-namespace to hand the hub token over in".into(),
        );
    }
    let data = user_secret(ctx, to.namespace, secret).await?;
    let token = data
        .get(key)
        .ok_or_else(|| format!("Secret {}/{secret} has no key {key:?}", to.namespace))?;
    hand(
        ctx,
        to,
        [(MODEL_TOKEN_KEY.to_string(), token.clone())].into(),
    )
}

/// The data of the user's Secret `namespace/secret` a cache names, or why it cannot be read.
async fn user_secret(
    ctx: &ModelCtx,
    namespace: &str,
    secret: &str,
) -> Result<kubeairunway_kernelcache_artifact::secrets::SecretData, String> {
    ctx.secrets
        .get(namespace, secret)
        .await
        .map_err(|e| format!("reading Secret {namespace}/{secret}: {e}"))?
        .ok_or_else(|| format!("Secret {namespace}/{secret} not found"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn docker_config(json: &str) -> kubeairunway_kernelcache_artifact::secrets::SecretData {
        [(
            ".dockerconfigjson".to_string(),
            ByteString(json.as_bytes().to_vec()),
        )]
        .into()
    }

    /// The registry credentials of an `oci://` cache: its registry's entry of the docker
    /// config Secret (a password pair or `auth`); a Secret without that entry, or that
    /// is not a docker config, is refused with a message, never taken for anonymous.
    #[test]
    fn the_sources_registry_entry_is_taken_and_a_missing_one_refused() {
        let config = docker_config(
            r#"{"auths":{"other.example":{"username":"o","password":"x"},"reg.example:5000":{"auth":"cm9ib3Q6cHc="}}}"#,
        );
        let registry = registry_of("reg.example:5000/models/acme/m@sha256:ab");
        assert_eq!(
            credentials_for(&registry, "regcred", config.clone()),
            Ok(RegistryAuth::Basic("robot".into(), "pw".into()))
        );
        let e = credentials_for("third.example", "regcred", config).unwrap_err();
        assert!(e.contains("regcred") && e.contains("third.example"), "{e}");
        let opaque = [("token".to_string(), ByteString(b"hf_x".to_vec()))].into();
        let e = credentials_for(&registry, "hf-token", opaque).unwrap_err();
        assert!(e.contains(".dockerconfigjson"), "{e}");
    }
}
