//! The warmup controller's I/O, thin around [`super::decide`]: a kube-runtime controller
//! over Warmups, reading only from watch caches (Warmups, their pods, Nodes, ModelDeployments,
//! KernelCaches and the agents' KernelCacheNodes). A reconcile in steady state makes no
//! request; it writes a status only when it changed.
//!
//! What the caches cannot know yet is remembered for one term of leadership: the status
//! last written (only this controller writes it, so it is never older than the cached
//! one) and the pods created but not yet seen (counted as running, so parallelism holds
//! while the pod watch catches up). Pods are named per node and attempt, so a create the
//! cache has not seen yet is refused as AlreadyExists, never doubled.
//!
//! Pods go with their Warmup: when a Warmup is deleted (or its TTL ran out) its pods are
//! deleted here, and any warmup pod whose Warmup is gone is deleted once the caches are
//! synced, so cleanup needs neither a finalizer nor the garbage collector (which also
//! removes them, through their owner reference).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::events::{Event, EventType, Recorder, Reporter};
use kubeairunway_sdk::reflect::{self, Cache};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::caches::{self, OnNode};
use super::decide::{self, Inputs, NodeEvent, Plan};
use super::metrics::Metrics;
use super::pod::{self, Attempt, Outcome, Owner, WARMUP_UID_LABEL};
use super::policy::Policy;
use super::resolve::{Resolved, resolve};
use super::targets;
use kubeairunway_kernelcache_api::model::ModelCache;
use kubeairunway_kernelcache_api::{KernelCache, KernelCacheNode};
use kubeairunway_sdk::api::warmup::reasons;
use kubeairunway_sdk::api::{Warmup, WarmupPhase, WarmupStatus};

/// What the controller is told.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The image holding `/kernelcache-noop` (this provider's image).
    pub tools_image: String,
    /// This replica's name, for events.
    pub instance: Option<String>,
    /// What custom actions may do beyond the Pod Security `baseline` rules.
    pub custom_actions: Policy,
}

/// How long a created pod counts as running before the pod cache shows it.
const EXPECTATION_TTL: Duration = Duration::from_secs(60);

pub use kubeairunway_kernelcache_api::report::Error;

/// How often a Warmup that waits or is under way is looked at again without a change: from
/// the watch caches, no request unless its status changes.
const WAITING_RECHECK: Duration = Duration::from_secs(10);

/// Field manager of the Warmup status.
pub const FIELD_MANAGER: &str = "kernelcache-warmup";

struct Ctx {
    client: Client,
    settings: Settings,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    warmups: Cache<Warmup>,
    pods: Cache<Pod>,
    nodes: Cache<Node>,
    mds: Cache<kubeairunway_sdk::compact::Compact<ModelDeployment>>,
    kernel_caches: Cache<KernelCache>,
    model_caches: Cache<ModelCache>,
    reports: Cache<KernelCacheNode>,
    /// The status last written, per Warmup UID.
    written: Mutex<HashMap<String, WarmupStatus>>,
    /// Pods created and not yet in the cache, per Warmup UID.
    expected: Mutex<HashMap<String, Vec<(Attempt, Instant)>>>,
    /// Node outcomes already published as events, per Warmup UID.
    announced: Mutex<HashMap<String, BTreeSet<String>>>,
    /// Consecutive failures per object, for backoff.
    failures: Mutex<HashMap<String, u32>>,
}

impl Ctx {
    async fn synced(&self) -> bool {
        self.warmups.synced().await
            && self.pods.synced().await
            && self.nodes.synced().await
            && self.mds.synced().await
            && self.kernel_caches.synced().await
            && self.model_caches.synced().await
            && self.reports.synced().await
    }

    fn is_synced(&self) -> bool {
        self.warmups.is_synced()
            && self.pods.is_synced()
            && self.nodes.is_synced()
            && self.mds.is_synced()
            && self.kernel_caches.is_synced()
            && self.model_caches.is_synced()
            && self.reports.is_synced()
    }

    /// The status of `w` as last written: ours when we wrote since the cache saw it.
    fn status_of(&self, w: &Warmup) -> WarmupStatus {
        let uid = w.uid().unwrap_or_default();
        self.written
            .lock()
            .ok()
            .and_then(|m| m.get(&uid).cloned())
            .or_else(|| w.status.clone())
            .unwrap_or_default()
    }

    /// The pods of the Warmup `uid` in `ns`: cached, and created but not yet cached.
    fn attempts(&self, uid: &str, ns: &str) -> Vec<Attempt> {
        let mut out: Vec<Attempt> = self
            .pods
            .store
            .state()
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(ns))
            .filter(|p| pod::made_for(p) == Some(uid))
            .filter_map(|p| pod::read(p))
            .collect();
        if let Ok(mut expected) = self.expected.lock()
            && let Some(list) = expected.get_mut(uid)
        {
            list.retain(|(a, at)| {
                at.elapsed() < EXPECTATION_TTL && !out.iter().any(|o| o.pod == a.pod)
            });
            out.extend(list.iter().map(|(a, _)| a.clone()));
        }
        out
    }

    fn expect(&self, uid: &str, attempt: Attempt) {
        if let Ok(mut expected) = self.expected.lock() {
            expected
                .entry(uid.to_string())
                .or_default()
                .push((attempt, Instant::now()));
        }
    }

    fn forget(&self, uid: &str) {
        for map in [&self.written] {
            if let Ok(mut m) = map.lock() {
                m.remove(uid);
            }
        }
        if let Ok(mut m) = self.expected.lock() {
            m.remove(uid);
        }
        if let Ok(mut m) = self.announced.lock() {
            m.remove(uid);
        }
    }

    /// Whether `key` of the Warmup `uid` is announced for the first time.
    fn first_time(&self, uid: &str, key: String) -> bool {
        self.announced
            .lock()
            .is_ok_and(|mut m| m.entry(uid.to_string()).or_default().insert(key))
    }

    /// Publish an event about a Warmup; `node`, for a node's outcome, is its related
    /// object (which also keeps the outcomes of different nodes apart: the recorder folds
    /// events of the same reason and objects into one series).
    async fn publish(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        node: Option<&str>,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1024).collect()),
            action: "Warmup".into(),
            secondary: node.map(|name| k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.into()),
                ..Default::default()
            }),
        };
        if let Err(e) = self.recorder.publish(&event, reference).await {
            warn!(error = %e, reason, "publishing an event");
        }
    }

    async fn delete_pods(&self, ns: &str, names: &[String]) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        for name in names {
            match api.delete(name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// Keep of a Node only what the warmup reads (labels, taints, cordon, resources): the
/// rest of its status (conditions, image lists) is large and changes on every heartbeat.
fn shape_node(node: &mut Node) {
    reflect::strip(node);
    node.status = node.status.take().map(|s| NodeStatus {
        allocatable: s.allocatable,
        capacity: s.capacity,
        ..NodeStatus::default()
    });
}

/// What of a Node changes where warmups go.
fn node_fingerprint(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.metadata.labels.hash(&mut h);
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.unschedulable).hash(&mut h);
    serde_json::to_string(&spec.and_then(|s| s.taints.clone()))
        .unwrap_or_default()
        .hash(&mut h);
    serde_json::to_string(&node.status)
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

fn receiver_stream<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The Warmups still running, to look at again when nodes or caches change.
/// What a watch event of a kind Warmups follow wakes. A watch that restarts lists again,
/// and what changed meanwhile arrives as `InitApply` (never as `Apply`), while what was
/// deleted meanwhile arrives as nothing: so an object listed wakes its Warmups as a change
/// does, and the end of a list (`InitDone`) wakes every running one.
#[derive(Debug, PartialEq, Eq)]
enum Wake<'a, K> {
    /// The Warmups this object concerns.
    For(&'a K),
    /// Every running Warmup that follows this kind.
    All,
    /// Nothing.
    None,
}

fn wake<K>(event: &Result<watcher::Event<K>, watcher::Error>) -> Wake<'_, K> {
    match event {
        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o)) => {
            Wake::For(o)
        }
        Ok(watcher::Event::InitDone) => Wake::All,
        Ok(watcher::Event::Init) | Err(_) => Wake::None,
    }
}

fn running(warmups: &Cache<Warmup>, filter: impl Fn(&Warmup) -> bool) -> Vec<ObjectRef<Warmup>> {
    warmups
        .store
        .state()
        .iter()
        .filter(|w| {
            !w.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(WarmupPhase::is_finished)
        })
        .filter(|w| filter(w))
        .map(|w| ObjectRef::from_obj(w.as_ref()))
        .collect()
}

/// Run both controllers until `stop` completes; `synced` is set once every cache is
/// filled.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    synced: kubeairunway_sdk::process::Check,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let all = watcher::Config::default();
    let (warmups, wu_stream) = reflect::cache(
        Api::<Warmup>::all(client.clone()),
        all.clone(),
        (),
        reflect::strip,
    );
    let (pods, pod_stream) = reflect::cache(
        Api::<Pod>::all(client.clone()),
        all.clone().labels(WARMUP_UID_LABEL),
        (),
        reflect::strip,
    );
    let (nodes, node_stream) = reflect::cache(
        Api::<Node>::all(client.clone()),
        all.clone(),
        (),
        shape_node,
    );
    // Every ModelDeployment of the cluster, kept compact; one is parsed when a Warmup
    // targeting it is reconciled.
    let (mds, md_stream) = reflect::compact_cache(
        Api::<ModelDeployment>::all(client.clone()),
        all.clone(),
        (),
        reflect::strip,
    );
    let (kernel_caches, kc_stream) = reflect::cache(
        Api::<KernelCache>::all(client.clone()),
        all.clone(),
        (),
        reflect::strip,
    );
    let (model_caches, mc_stream) = reflect::cache(
        Api::<ModelCache>::all(client.clone()),
        all.clone(),
        (),
        reflect::strip,
    );
    let (reports, report_stream) = reflect::cache(
        Api::<KernelCacheNode>::all(client.clone()),
        all,
        (),
        reflect::strip,
    );

    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: settings.instance.clone(),
            },
        ),
        client: client.clone(),
        settings,
        metrics,
        warmups: warmups.clone(),
        pods: pods.clone(),
        nodes: nodes.clone(),
        mds: mds.clone(),
        kernel_caches: kernel_caches.clone(),
        model_caches: model_caches.clone(),
        reports: reports.clone(),
        written: Mutex::default(),
        expected: Mutex::default(),
        announced: Mutex::default(),
        failures: Mutex::default(),
    });
    let (wu_tx, wu_rx) = mpsc::unbounded_channel::<ObjectRef<Warmup>>();
    let (sweep_tx, sweep_rx) = mpsc::unbounded_channel::<(String, String)>();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(sweep(ctx.clone(), sweep_rx));
    tasks.spawn({
        let ctx = ctx.clone();
        async move {
            if ctx.synced().await {
                synced.set();
                info!("warmup caches synced");
            }
        }
    });

    // Pods wake their Warmup; a pod whose Warmup is gone is deleted.
    tasks.spawn(reflect::drive(
        "warmup pods",
        pod_stream.inspect({
            let (ctx, wu_tx, sweep_tx) = (ctx.clone(), wu_tx.clone(), sweep_tx.clone());
            move |event| {
                let p = match wake(event) {
                    Wake::For(p) => p,
                    Wake::All => {
                        if ctx.warmups.is_synced() {
                            for r in running(&ctx.warmups, |_| true) {
                                let _ = wu_tx.send(r);
                            }
                        }
                        return;
                    }
                    Wake::None => return,
                };
                if let (Some(owner), Some(ns)) = (
                    p.owner_references().iter().find(|o| o.kind == "Warmup"),
                    p.namespace(),
                ) {
                    let _ = wu_tx.send(ObjectRef::new(&owner.name).within(&ns));
                }
                let Some(uid) = pod::made_for(p) else {
                    return;
                };
                if ctx.is_synced()
                    && !ctx
                        .warmups
                        .store
                        .state()
                        .iter()
                        .any(|w| w.uid().as_deref() == Some(uid))
                    && let Some(ns) = p.namespace()
                {
                    let _ = sweep_tx.send((ns, p.name_any()));
                }
            }
        }),
    ));
    // Nodes that change where warmups go wake every running one.
    tasks.spawn(reflect::drive(
        "nodes",
        node_stream.inspect({
            let (warmups, wu_tx) = (warmups.clone(), wu_tx.clone());
            let mut seen: HashMap<String, u64> = HashMap::new();
            move |event| {
                let changed = match event {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        seen.insert(n.name_any(), node_fingerprint(n)) != Some(node_fingerprint(n))
                    }
                    Ok(watcher::Event::Delete(n)) => seen.remove(&n.name_any()).is_some(),
                    _ => false,
                };
                if changed && warmups.is_synced() {
                    for r in running(&warmups, |_| true) {
                        let _ = wu_tx.send(r);
                    }
                }
            }
        }),
    ));
    // Kernel and model caches and the agents' reports wake the warmups that may wait for
    // caches (their own, or their target ModelDeployment's).
    let wakes_cache_warmups = || {
        let (warmups, wu_tx) = (warmups.clone(), wu_tx.clone());
        move |ok: bool| {
            if ok && warmups.is_synced() {
                for r in running(&warmups, |w| {
                    w.spec.kernel_caches.is_some()
                        || w.spec.model_caches.is_some()
                        || w.spec.target_model_deployment.is_some()
                }) {
                    let _ = wu_tx.send(r);
                }
            }
        }
    };
    tasks.spawn(reflect::drive(
        "kernel caches",
        kc_stream.inspect({
            let wake_running = wakes_cache_warmups();
            move |e| wake_running(!matches!(wake(e), Wake::None))
        }),
    ));
    tasks.spawn(reflect::drive(
        "model caches",
        mc_stream.inspect({
            let wake_running = wakes_cache_warmups();
            move |e| wake_running(!matches!(wake(e), Wake::None))
        }),
    ));
    tasks.spawn(reflect::drive(
        "kernel cache nodes",
        report_stream.inspect({
            let wake_running = wakes_cache_warmups();
            move |e| wake_running(!matches!(wake(e), Wake::None))
        }),
    ));

    // A deleted Warmup takes its pods.
    let wu_stream = wu_stream.inspect({
        let (ctx, sweep_tx) = (ctx.clone(), sweep_tx.clone());
        move |event| {
            let Ok(watcher::Event::Delete(w)) = event else {
                return;
            };
            let ns = w.namespace().unwrap_or_default();
            let uid = w.uid().unwrap_or_default();
            for p in ctx
                .pods
                .store
                .state()
                .iter()
                .filter(|p| pod::made_for(p) == Some(uid.as_str()))
            {
                let _ = sweep_tx.send((ns.clone(), p.name_any()));
            }
            ctx.forget(&uid);
        }
    });
    // ModelDeployments wake the Warmups that target them.
    let md_stream = md_stream.inspect({
        let (warmups, wu_tx) = (warmups.clone(), wu_tx.clone());
        move |event| {
            let md = match wake(event) {
                Wake::For(md) => md,
                Wake::All => {
                    if warmups.is_synced() {
                        for r in running(&warmups, |w| w.spec.target_model_deployment.is_some()) {
                            let _ = wu_tx.send(r);
                        }
                    }
                    return;
                }
                Wake::None => return,
            };
            let ns = md.namespace();
            let name = md.name_any();
            for w in warmups.store.state().iter().filter(|w| {
                w.namespace() == ns
                    && w.spec
                        .target_model_deployment
                        .as_ref()
                        .map(|t| t.name.as_str())
                        == Some(name.as_str())
            }) {
                let _ = wu_tx.send(ObjectRef::from_obj(w.as_ref()));
            }
        }
    });

    tasks.spawn(reflect::drive("target model deployments", md_stream));
    info!("warmup controller running");
    Controller::for_stream(wu_stream.applied_objects(), warmups.store.clone())
        .with_config(kubeairunway_sdk::process::controller_config())
        .reconcile_on(receiver_stream(wu_rx))
        .graceful_shutdown_on(futures::FutureExt::shared(Box::pin(stop)))
        .run(reconcile_warmup, warmup_error, ctx.clone())
        .for_each(|_| async {})
        .await;
    tasks.abort_all();
    Ok(())
}

/// Delete the pods sent here; first, once every cache is filled, every warmup pod whose
/// Warmup is gone (deleted while no controller ran).
async fn sweep(ctx: Arc<Ctx>, mut rx: mpsc::UnboundedReceiver<(String, String)>) {
    if ctx.synced().await {
        let uids: BTreeSet<String> = ctx
            .warmups
            .store
            .state()
            .iter()
            .filter_map(|w| w.uid())
            .collect();
        let orphans: Vec<(String, String)> = ctx
            .pods
            .store
            .state()
            .iter()
            .filter(|p| pod::made_for(p).is_some_and(|u| !uids.contains(u)))
            .filter_map(|p| Some((p.namespace()?, p.name_any())))
            .collect();
        for (ns, name) in orphans {
            if let Err(e) = ctx.delete_pods(&ns, &[name]).await {
                warn!(error = %e, "deleting an orphaned warmup pod");
            }
        }
    }
    while let Some((ns, name)) = rx.recv().await {
        if let Err(e) = ctx.delete_pods(&ns, &[name]).await {
            warn!(error = %e, "deleting a warmup pod of a deleted Warmup");
        }
    }
}

fn backoff(ctx: &Ctx, key: String) -> Action {
    let attempts = ctx.failures.lock().map_or(1, |mut f| {
        let n = f.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    });
    Action::requeue(kubeairunway_sdk::process::backoff(attempts))
}

#[allow(clippy::needless_pass_by_value)] // kube-runtime's error-policy signature
fn warmup_error(w: Arc<Warmup>, error: &Error, ctx: Arc<Ctx>) -> Action {
    warn!(%error, warmup = %w.name_any(), "reconciling a Warmup");
    ctx.metrics.reconcile_error();
    backoff(&ctx, format!("w/{}", w.uid().unwrap_or_default()))
}

#[allow(clippy::unnecessary_wraps)] // the last step of a reconcile
fn ok(ctx: &Ctx, key: &str, action: Action) -> Result<Action, Error> {
    if let Ok(mut f) = ctx.failures.lock() {
        f.remove(key);
    }
    Ok(action)
}

/// One Warmup: decide from the caches, then write the status, delete and create pods.
async fn reconcile_warmup(w: Arc<Warmup>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timing = ctx.metrics.reconciling();
    ctx.synced().await;
    if w.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let uid = w.uid().unwrap_or_default();
    let ns = w.namespace().unwrap_or_default();
    let previous = ctx.status_of(&w);
    let attempts = ctx.attempts(&uid, &ns);
    let policies = w.spec.policies.clone().unwrap_or_default();
    let now = Timestamp::now();
    if previous.phase.is_some_and(WarmupPhase::is_finished) {
        let plan = decide::finished(&previous, &policies, &attempts, now);
        ctx.delete_pods(&ns, &plan.delete).await?;
        if plan.delete_warmup {
            let note = format!(
                "ttlSecondsAfterFinished ({}s) ran out: deleting the Warmup and its pods",
                policies.ttl_seconds_after_finished.unwrap_or_default()
            );
            ctx.publish(
                &w.object_ref(&()),
                None,
                EventType::Normal,
                reasons::TTL_EXPIRED,
                &note,
            )
            .await;
            let all: Vec<String> = attempts.iter().map(|a| a.pod.clone()).collect();
            ctx.delete_pods(&ns, &all).await?;
            match Api::<Warmup>::namespaced(ctx.client.clone(), &ns)
                .delete(&w.name_any(), &DeleteParams::background())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            return ok(&ctx, &format!("w/{uid}"), Action::await_change());
        }
        let action = plan
            .requeue_after
            .map_or_else(Action::await_change, Action::requeue);
        return ok(&ctx, &format!("w/{uid}"), action);
    }
    let mut current = (*w).clone();
    current.status = Some(previous.clone());
    let md = w
        .spec
        .target_model_deployment
        .as_ref()
        .and_then(|t| ctx.mds.store.get(&ObjectRef::new(&t.name).within(&ns)))
        .map(|cached| cached.object())
        .transpose()?;
    let generation = w.metadata.generation;
    let running_pods = || {
        attempts
            .iter()
            .filter(|a| a.running)
            .map(|a| a.pod.clone())
            .collect::<Vec<_>>()
    };
    let namespace_models: Vec<Arc<ModelCache>> = ctx
        .model_caches
        .store
        .state()
        .into_iter()
        .filter(|c| c.namespace().as_deref() == Some(ns.as_str()))
        .collect();
    let plan = match resolve(
        &current,
        md.as_ref(),
        &ctx.settings.custom_actions,
        &namespace_models,
    ) {
        Resolved::Invalid(message) => Plan {
            status: decide::invalid(&previous, generation, &message, now),
            delete: running_pods(),
            ..Plan::default()
        },
        Resolved::Waiting(reason, message) => {
            let status = decide::waiting(&previous, generation, reason, &message, now);
            let stopped = status.phase == Some(WarmupPhase::Failed);
            Plan {
                status,
                delete: if stopped { running_pods() } else { Vec::new() },
                ..Plan::default()
            }
        }
        Resolved::Ready(actions) => {
            let nodes = ctx.nodes.store.state();
            let targets = targets::targets(&w.spec, md.as_ref(), &nodes, &actions.tolerations);
            let by_name: HashMap<String, &Arc<Node>> =
                nodes.iter().map(|n| (n.name_any(), n)).collect();
            let cache_states = cache_states(&ctx, &ns, &actions, &targets, &by_name);
            let plan = decide::progress(&Inputs {
                generation,
                status: &previous,
                policies: &policies,
                actions: &actions,
                targets: &targets,
                attempts: &attempts,
                caches: &cache_states,
                now,
            });
            return execute(&ctx, &w, &previous, plan, &actions).await;
        }
    };
    execute(&ctx, &w, &previous, plan, &pod::Actions::default()).await
}

/// Per target node, the state of each cache the warmup waits for (kernel caches by
/// name, model caches as `model/<name>`: the names may be the same), from the caches and
/// the agents' reports.
fn cache_states(
    ctx: &Ctx,
    ns: &str,
    actions: &pod::Actions,
    targets: &[targets::Target],
    by_name: &HashMap<String, &Arc<Node>>,
) -> BTreeMap<String, BTreeMap<String, OnNode>> {
    let mut out = BTreeMap::new();
    if actions.kernel_caches.is_empty() && actions.model_caches.is_empty() {
        return out;
    }
    for t in targets {
        let Some(node) = by_name.get(&t.node) else {
            continue;
        };
        let report = ctx.reports.store.get(&ObjectRef::new(&t.node));
        let kernel = actions.kernel_caches.iter().map(|name| {
            let cache = ctx
                .kernel_caches
                .store
                .get(&ObjectRef::new(name).within(ns));
            (
                name.clone(),
                caches::on_node(name, cache.as_deref(), node, report.as_deref()),
            )
        });
        let models = actions.model_caches.iter().map(|name| {
            let cache = ctx.model_caches.store.get(&ObjectRef::new(name).within(ns));
            (
                format!("model/{name}"),
                caches::model_on_node(name, cache.as_deref(), node, report.as_deref()),
            )
        });
        out.insert(t.node.clone(), kernel.chain(models).collect());
    }
    out
}

/// Write the status, delete and create pods, publish what happened.
async fn execute(
    ctx: &Ctx,
    w: &Warmup,
    previous: &WarmupStatus,
    mut plan: Plan,
    actions: &pod::Actions,
) -> Result<Action, Error> {
    let uid = w.uid().unwrap_or_default();
    let ns = w.namespace().unwrap_or_default();
    let owner = Owner {
        name: w.name_any(),
        namespace: ns.clone(),
        uid: uid.clone(),
    };
    write_status(ctx, w, previous, &plan.status).await?;
    ctx.delete_pods(&ns, &plan.delete).await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for (node, attempt) in std::mem::take(&mut plan.create) {
        let body = pod::build(&owner, &node, attempt, actions, &ctx.settings.tools_image);
        match pods.create(&PostParams::default(), &body).await {
            Ok(_) => ctx.metrics.pod_created(),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => {
                // The API server refuses the pod for what it is: no node can run it.
                let message = format!("the API server refused the warmup pod: {}", s.message);
                let status = decide::invalid(
                    &plan.status,
                    w.metadata.generation,
                    &message,
                    Timestamp::now(),
                );
                write_status(ctx, w, &plan.status, &status).await?;
                plan.status = status;
                break;
            }
            Err(e) => return Err(e.into()),
        }
        ctx.expect(
            &uid,
            Attempt {
                pod: pod::pod_name(&owner, &node, attempt),
                node,
                attempt,
                outcome: Outcome::Active,
                running: true,
            },
        );
    }
    announce(ctx, w, previous, &plan).await;
    // A warmup under way is woken by its pods' and caches' changes; a look now and then
    // from the caches bounds a wake-up missed (seen under load: pods done, the status not
    // following).
    let requeue_after = if plan.status.phase.is_some_and(WarmupPhase::is_finished) {
        plan.requeue_after
    } else {
        Some(
            plan.requeue_after
                .map_or(WAITING_RECHECK, |d| d.min(WAITING_RECHECK)),
        )
    };
    let action = requeue_after.map_or_else(Action::await_change, Action::requeue);
    ok(ctx, &format!("w/{uid}"), action)
}

async fn write_status(
    ctx: &Ctx,
    w: &Warmup,
    previous: &WarmupStatus,
    status: &WarmupStatus,
) -> Result<(), Error> {
    if previous == status {
        return Ok(());
    }
    let api: Api<Warmup> = Api::namespaced(ctx.client.clone(), &w.namespace().unwrap_or_default());
    kubeairunway_kernelcache_api::report::apply(&api, &w.name_any(), FIELD_MANAGER, status).await?;
    if let Ok(mut m) = ctx.written.lock() {
        m.insert(w.uid().unwrap_or_default(), status.clone());
    }
    Ok(())
}

/// Events (each node outcome once) and metrics.
async fn announce(ctx: &Ctx, w: &Warmup, previous: &WarmupStatus, plan: &Plan) {
    let uid = w.uid().unwrap_or_default();
    let reference = w.object_ref(&());
    for event in &plan.events {
        let node = match event {
            NodeEvent::Succeeded(n) | NodeEvent::Retrying(n, ..) | NodeEvent::Failed(n, ..) => n,
        };
        let (key, type_, reason, note, outcome) = match event {
            NodeEvent::Succeeded(node) => (
                format!("ok/{node}"),
                EventType::Normal,
                reasons::NODE_WARMED,
                format!("node {node} is warm"),
                "succeeded",
            ),
            NodeEvent::Retrying(node, n, reason, message) => (
                format!("retry/{node}/{n}"),
                EventType::Warning,
                reasons::NODE_RETRYING,
                format!("node {node}: attempt {n} failed ({reason}): {message}; retrying"),
                "retried",
            ),
            NodeEvent::Failed(node, reason, message) => (
                format!("failed/{node}"),
                EventType::Warning,
                reasons::NODE_FAILED,
                format!("node {node} failed ({reason}): {message}"),
                "failed",
            ),
        };
        if ctx.first_time(&uid, key) {
            ctx.metrics.node(outcome);
            ctx.publish(&reference, Some(node), type_, reason, &note)
                .await;
        }
    }
    let (before, after) = (previous.phase, plan.status.phase);
    if before == after {
        return;
    }
    match after {
        Some(WarmupPhase::InProgress) => {
            let note = format!("warming {} nodes", plan.status.desired_nodes);
            ctx.publish(&reference, None, EventType::Normal, reasons::STARTED, &note)
                .await;
        }
        Some(phase @ (WarmupPhase::Completed | WarmupPhase::Failed)) => {
            let (kind, event_type) = if phase == WarmupPhase::Completed {
                (
                    kubeairunway_sdk::api::warmup::condition_types::COMPLETE,
                    EventType::Normal,
                )
            } else {
                (
                    kubeairunway_sdk::api::warmup::condition_types::FAILED,
                    EventType::Warning,
                )
            };
            let condition = plan.status.conditions.iter().find(|c| c.type_ == kind);
            let (reason, message) =
                condition.map_or(("", ""), |c| (c.reason.as_str(), c.message.as_str()));
            ctx.publish(&reference, None, event_type, reason, message)
                .await;
            if let (Some(start), Some(end)) =
                (&plan.status.start_time, &plan.status.completion_time)
            {
                let seconds = end.0.duration_since(start.0).as_secs_f64().max(0.0);
                ctx.metrics.finished(phase, seconds);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_seen_by_a_relist_wakes_as_a_change_does() {
        let pod = Pod::default();
        for event in [
            watcher::Event::Apply(pod.clone()),
            watcher::Event::InitApply(pod.clone()),
            watcher::Event::Delete(pod.clone()),
        ] {
            assert_eq!(wake(&Ok(event.clone())), Wake::For(&pod), "{event:?}");
        }
        // Deletions during a relist arrive as nothing: its end wakes every running Warmup.
        assert_eq!(wake::<Pod>(&Ok(watcher::Event::InitDone)), Wake::All);
        assert_eq!(wake::<Pod>(&Ok(watcher::Event::Init)), Wake::None);
    }
}
