//! The node agent (a DaemonSet): finds the node's GPUs, stages the verified kernel caches
//! that fit them under `<root>/<namespace>/<name>/<digest>`, reports everything in the
//! node's `KernelCacheNode` (from which the controller sets the node's ready labels), and
//! deletes what is no longer wanted. It reads its own Node (labels for `nodeSelector`s)
//! and the registry credentials the controller hands over, nothing else of the cluster's.
//!
//! The loop watches `KernelCache`s (all namespaces) and reconciles on every change, on a
//! resync interval and when registry work ends: [`plan::plan`] decides, the loop does the
//! I/O. Registry work (reading labels, staging) runs in tasks so that one large cache
//! never holds up the report of the others. Only `status.usable_image()` is ever pulled;
//! a cache's compatibility is decided from its labels before any download; a directory
//! already on disk is complete (extraction renames a checked directory into place) and
//! is Ready again after a restart without any download.
//!
//! With a model-cache root ([`Settings::models`]), a second loop in the same process
//! downloads `ModelCache`s onto the node ([`models`]) and reports them in the same
//! `KernelCacheNode` under its own field manager.

pub mod app;
pub mod disk;
pub mod evict;
pub mod gpu;
pub mod metrics;
pub mod models;
pub mod node;
pub mod owner;
pub mod plan;
pub mod report;
pub mod seed;
pub mod space;
pub mod stage;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use kubeairunway_sdk::events::{Recorder, Reporter};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{info, warn};

use gpu::{Detected, GpuSource};
use kubeairunway_kernelcache_api::{
    CacheState, KernelCache, KernelCacheNode, KernelCacheNodeStatus, NodeCache, NodeDisk,
    node_reasons,
};
use kubeairunway_kernelcache_artifact::allow::AllowedRegistries;
use kubeairunway_kernelcache_artifact::extract::Limits;
use kubeairunway_kernelcache_artifact::image::Target;
use kubeairunway_kernelcache_artifact::sealed::{NodeKey, Unsealing};
use kubeairunway_kernelcache_artifact::secrets::SecretApi;
use kubeairunway_kernelcache_artifact::triton;
use metrics::Metrics;
use node::NodeApi;
use plan::{Busy, Key, OnDisk, Wanted};
use stage::{Outcome, Stager};

/// The free space a stage leaves on the cache root's filesystem unless told otherwise.
pub const DEFAULT_MIN_FREE: space::Size = space::Size::Percent(5);

/// What the agent is told.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This node's name (and its KernelCacheNode's).
    pub node_name: String,
    /// Where caches are staged.
    pub cache_root: PathBuf,
    /// Caps on one cache layer.
    pub limits: Limits,
    /// Registries spoken to over plain HTTP (tests, air-gapped mirrors).
    pub plain_http: Vec<String>,
    /// The registries caches may come from (empty: any).
    pub allowed: AllowedRegistries,
    /// How often everything is reconciled without a change (GPUs detected again, failed
    /// caches retried when due).
    pub resync: Duration,
    /// How often the status is rewritten although nothing changed.
    pub status_refresh: Duration,
    /// Caches staged at the same time.
    pub parallel_stages: usize,
    /// What all staged caches together may take on this node (each digest counted once);
    /// none: no budget.
    pub disk_budget: Option<space::Size>,
    /// Free space on the cache root's filesystem that no stage goes below.
    pub min_free: space::Size,
    /// The namespace where the controller hands over registry credentials
    /// ([`kubeairunway_kernelcache_artifact::credentials::handover_name`]) and hub tokens;
    /// none: private registries and gated models are not reached.
    pub credentials_namespace: Option<String>,
    /// The model-cache loop's settings; none: no model caches on this node.
    pub models: Option<models::ModelSettings>,
}

impl Settings {
    /// Defaults for `node_name` and `cache_root`.
    pub fn new(node_name: &str, cache_root: PathBuf) -> Self {
        Self {
            node_name: node_name.to_string(),
            cache_root,
            limits: Limits::default(),
            plain_http: Vec::new(),
            allowed: AllowedRegistries::default(),
            resync: Duration::from_secs(120),
            status_refresh: Duration::from_secs(600),
            parallel_stages: 2,
            credentials_namespace: None,
            disk_budget: None,
            min_free: DEFAULT_MIN_FREE,
            models: None,
        }
    }
}

/// The agent's ties to the world that tests replace.
pub struct Seams {
    /// GPU detection.
    pub gpus: Arc<dyn GpuSource>,
    /// This node's uid and labels.
    pub node: Arc<dyn NodeApi>,
    /// The registry credentials the controller hands over.
    pub secrets: Arc<dyn SecretApi>,
}

impl std::fmt::Debug for Seams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seams").finish_non_exhaustive()
    }
}

/// A failure and when to try again.
#[derive(Clone, Debug)]
struct Failure {
    message: String,
    attempts: u32,
    retry_at: Instant,
}

/// Retry after 10 s, doubling per attempt, at most 10 minutes.
fn backoff(attempts: u32) -> Duration {
    Duration::from_secs(10u64.saturating_mul(1 << attempts.saturating_sub(1).min(6)))
        .min(Duration::from_secs(600))
}

struct Agent {
    settings: Settings,
    seams: Seams,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    nodes: Api<KernelCacheNode>,
    store: Store<KernelCache>,
    stager: Stager,
    detected: Detected,
    node_uid: Option<String>,
    /// Why the Node could not be read, as last logged.
    node_error: Option<String>,
    node_applied: bool,
    /// The public half of the key the controller seals this node's credentials to
    /// (published in the KernelCacheNode's spec).
    credentials_key: String,
    /// Targets from image labels, by pinned reference (immutable: digests).
    images: BTreeMap<String, Vec<Target>>,
    /// Sizes image labels declare, by pinned reference.
    sizes: BTreeMap<String, u64>,
    /// Declared sizes of the stages under way (counted against the disk budget).
    staging_sizes: BTreeMap<Key, u64>,
    /// What was read of each directory on disk.
    disk: BTreeMap<Key, Result<OnDisk, String>>,
    busy: BTreeMap<Key, Busy>,
    failures: BTreeMap<Key, Failure>,
    /// The caches as last reported.
    reported: BTreeMap<Key, NodeCache>,
    /// The status last written (without `lastUpdated`) and when.
    written: Option<(KernelCacheNodeStatus, Instant)>,
    /// Digests whose compatibility was counted.
    checked: BTreeSet<Key>,
    /// The Triton mount path group files on disk were last rewritten to.
    rewritten: BTreeMap<Key, String>,
    /// Wanted caches evicted from the disk, with the message reported for them (kept
    /// until one is on disk again or no longer wanted; read back from the status after a
    /// restart).
    evicted: BTreeMap<Key, String>,
    tasks: JoinSet<(Wanted, Outcome)>,
}

/// Run the agent until `shutdown` completes: the kernel-cache loop and, when configured,
/// the model-cache loop ([`models::run`]); the first to fail ends both.
pub async fn run(
    client: Client,
    settings: Settings,
    seams: Seams,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    // The key the controller seals this node's credentials to (published with the
    // node's report): every read of a handed-over Secret goes through it.
    let key = Arc::new(NodeKey::generate());
    let seams = Seams {
        secrets: Arc::new(Unsealing::new(
            seams.secrets,
            &settings.node_name,
            Arc::clone(&key),
        )),
        ..seams
    };
    let model_loop = {
        let ctx = models::Context {
            client: client.clone(),
            node_name: settings.node_name.clone(),
            credentials_namespace: settings.credentials_namespace.clone(),
            node: Arc::clone(&seams.node),
            secrets: Arc::clone(&seams.secrets),
            credentials_key: key.public(),
            metrics: Arc::clone(&metrics),
        };
        let shutdown = shutdown.clone();
        let model_settings = settings.models.clone();
        async move {
            match model_settings {
                // Boxed: its state (watch, recorder, downloads) would double the agent's
                // future.
                Some(m) => Box::pin(models::run(ctx, m, shutdown)).await,
                None => Ok(()),
            }
        }
    };
    tokio::try_join!(
        run_kernel_caches(client, settings, seams, key.public(), metrics, shutdown),
        model_loop
    )?;
    Ok(())
}

/// The kernel-cache loop (a part of [`run`]).
async fn run_kernel_caches(
    client: Client,
    settings: Settings,
    seams: Seams,
    credentials_key: String,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&settings.cache_root)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", settings.cache_root.display()))?;
    match disk::clean_leftovers(&settings.cache_root) {
        Ok(0) => {}
        Ok(n) => info!(removed = n, "removed leftovers of interrupted staging"),
        Err(e) => warn!(error = %e, "removing leftovers of interrupted staging"),
    }
    let (store, writer) = reflector::store::<KernelCache>();
    let mut changes = watcher(
        Api::<KernelCache>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .boxed();
    let mut agent = Agent::new(client, settings, seams, metrics, store).await;
    agent.credentials_key = credentials_key;
    agent.detect_gpus().await;

    tokio::pin!(shutdown);
    let mut synced = false;
    let mut dirty = false;
    let mut next_resync = Instant::now() + agent.settings.resync;
    loop {
        let wake = agent
            .next_retry()
            .map_or(next_resync, |r| r.min(next_resync));
        tokio::select! {
            () = &mut shutdown => break,
            event = changes.next() => match event {
                Some(Ok(watcher::Event::InitDone)) => { synced = true; dirty = true; }
                Some(Ok(_)) => dirty = true,
                Some(Err(e)) => warn!(error = %e, "watching KernelCaches"),
                None => anyhow::bail!("the KernelCache watch ended"),
            },
            Some(done) = agent.tasks.join_next() => {
                match done {
                    Ok((wanted, outcome)) => agent.finished(&wanted, outcome),
                    Err(e) => warn!(error = %e, "a staging task failed"),
                }
                dirty = true;
            }
            () = tokio::time::sleep_until(wake) => {
                if Instant::now() >= next_resync {
                    agent.detect_gpus().await;
                    next_resync = Instant::now() + agent.settings.resync;
                }
                dirty = true;
            }
        }
        // Never act on a partial view: before the first full list, every cache on disk
        // would look unwanted.
        if dirty && synced {
            // Let a burst of watch events settle.
            while let Some(Some(event)) = futures::FutureExt::now_or_never(changes.next()) {
                if let Err(e) = event {
                    warn!(error = %e, "watching KernelCaches");
                }
            }
            dirty = false;
            if let Err(e) = agent.reconcile().await {
                warn!(error = %e, "reconciling; retrying at the next resync");
            }
        }
    }
    // Staging in flight finishes or is dropped with the process; a half-extracted
    // directory never becomes visible.
    agent.tasks.abort_all();
    Ok(())
}

impl Agent {
    /// An agent that knows what its KernelCacheNode reported before a restart (so that
    /// events are only published for changes).
    async fn new(
        client: Client,
        settings: Settings,
        seams: Seams,
        metrics: Arc<Metrics>,
        store: Store<KernelCache>,
    ) -> Self {
        let nodes: Api<KernelCacheNode> = Api::all(client.clone());
        let reported = match nodes.get_opt(&settings.node_name).await {
            Ok(found) => found
                .and_then(|n| n.status)
                .map(|s| report::by_key(&s))
                .unwrap_or_default(),
            Err(e) => {
                warn!(error = %e, "reading the previous KernelCacheNode");
                BTreeMap::new()
            }
        };
        let evicted = reported
            .iter()
            .filter(|(_, c)| c.state == CacheState::Evicted)
            .map(|(k, c)| (k.clone(), c.message.clone().unwrap_or_default()))
            .collect();
        Agent {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: report::FIELD_MANAGER.into(),
                    instance: Some(settings.node_name.clone()),
                },
            ),
            stager: Stager {
                root: settings.cache_root.clone(),
                limits: settings.limits,
                min_free: settings.min_free,
                plain_http: settings.plain_http.clone(),
                allowed: settings.allowed.clone(),
                secrets: Arc::clone(&seams.secrets),
                credentials_namespace: settings.credentials_namespace.clone(),
            },
            detected: Detected::default(),
            node_uid: None,
            node_error: None,
            node_applied: false,
            credentials_key: String::new(),
            images: BTreeMap::new(),
            sizes: BTreeMap::new(),
            staging_sizes: BTreeMap::new(),
            disk: BTreeMap::new(),
            busy: BTreeMap::new(),
            failures: BTreeMap::new(),
            reported,
            written: None,
            checked: BTreeSet::new(),
            rewritten: BTreeMap::new(),
            evicted,
            tasks: JoinSet::new(),
            settings,
            seams,
            metrics,
            nodes,
            store,
        }
    }

    async fn detect_gpus(&mut self) {
        let source = Arc::clone(&self.seams.gpus);
        let detected = tokio::task::spawn_blocking(move || source.detect())
            .await
            .unwrap_or_else(|e| Detected {
                gpus: Vec::new(),
                message: Some(format!("GPU detection failed: {e}")),
            });
        if detected != self.detected {
            info!(gpus = detected.gpus.len(), message = ?detected.message, "GPUs detected");
        }
        self.metrics.gpus(detected.gpus.len());
        self.detected = detected;
    }

    /// The next failure due for a retry (those already due are being retried).
    fn next_retry(&self) -> Option<Instant> {
        let now = Instant::now();
        self.failures
            .values()
            .map(|f| f.retry_at)
            .filter(|at| *at > now)
            .min()
    }

    fn fail(&mut self, key: &Key, message: String) {
        warn!(cache = %key, error = %message, "kernel cache failed");
        let attempts = self.failures.get(key).map_or(0, |f| f.attempts) + 1;
        self.failures.insert(
            key.clone(),
            Failure {
                message,
                attempts,
                retry_at: Instant::now() + backoff(attempts),
            },
        );
    }

    /// The room a new stage has: the disk budget less the caches on disk (each digest
    /// once: copies of a digest are hard links) and the stages under way.
    fn room(&self) -> stage::Room {
        let Some(budget) = self.settings.disk_budget else {
            return stage::Room::Unlimited;
        };
        let budget = match (budget, space::filesystem(&self.settings.cache_root)) {
            (space::Size::Bytes(b), _) => b,
            (share, Ok(fs)) => share.bytes(fs.total),
            // The stage reads the filesystem again and fails with the reason.
            (_, Err(_)) => 0,
        };
        let used = self.used_bytes();
        stage::Room::Budget { budget, used }
    }

    /// Bytes the caches on disk take (each digest once: copies of a digest are hard links)
    /// and the stages under way reserve.
    fn used_bytes(&self) -> u64 {
        let mut by_digest: BTreeMap<&str, u64> = BTreeMap::new();
        for (key, disk) in &self.disk {
            if let Ok(d) = disk {
                let e = by_digest.entry(key.digest.as_str()).or_default();
                *e = (*e).max(d.size_bytes);
            }
        }
        by_digest.values().sum::<u64>() + self.staging_sizes.values().sum::<u64>()
    }

    /// What the caches take of the disk, for the node's status (none when the filesystem
    /// cannot be read: each stage then fails with the reason).
    fn disk_report(&self) -> Option<NodeDisk> {
        let fs = space::filesystem(&self.settings.cache_root).ok()?;
        let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
        let (budget, used) = match self.room() {
            stage::Room::Budget { budget, used } => (Some(budget), used),
            stage::Room::Unlimited => (None, self.used_bytes()),
        };
        Some(NodeDisk {
            budget_bytes: budget.map(bytes),
            used_bytes: bytes(used),
            min_free_bytes: bytes(self.settings.min_free.bytes(fs.total)),
        })
    }

    fn finished(&mut self, wanted: &Wanted, outcome: Outcome) {
        let key = &wanted.key;
        self.busy.remove(key);
        self.staging_sizes.remove(key);
        match outcome {
            Outcome::Inspected(Ok((targets, size))) => {
                self.failures.remove(key);
                self.images.insert(wanted.pinned.clone(), targets);
                if let Some(size) = size {
                    self.sizes.insert(wanted.pinned.clone(), size);
                }
            }
            Outcome::Inspected(Err(message)) => self.fail(key, message),
            Outcome::Staged { result, took } => match result {
                Ok(extracted) => {
                    info!(cache = %key, files = extracted.files, bytes = extracted.bytes, seconds = took.as_secs_f64(), "kernel cache staged");
                    // Neither a cache found complete nor one linked from another cache
                    // of its digest is a download.
                    if !extracted.already_present && extracted.bytes > 0 {
                        self.metrics.download(true, took, extracted.bytes);
                    }
                    self.failures.remove(key);
                    self.rewritten
                        .insert(key.clone(), wanted.triton_mount.clone());
                }
                Err(message) => {
                    self.metrics.download(false, took, 0);
                    self.fail(key, message);
                }
            },
        }
    }

    /// One pass, in phases: read the Node ([`Agent::read_node`]), the caches in use on it
    /// ([`Agent::read_in_use`]) and the disk ([`Agent::read_disk`]), forget what is no
    /// longer wanted, [`plan::plan`], remove directories, make room for the stages
    /// ([`Agent::make_room`]), start the registry work ([`Agent::start_work`]), point
    /// Triton group files at their mount paths ([`Agent::rewrite_ready`]), and report.
    async fn reconcile(&mut self) -> anyhow::Result<()> {
        let node = self.read_node().await;
        let in_use = self.read_in_use().await;
        let caches = self.store.state();
        let wanted = plan::wanted(
            caches.iter().map(AsRef::as_ref),
            node.as_ref().map(|n| &n.labels),
        );
        let root = self.settings.cache_root.clone();
        let (on_disk, damaged) = self.read_disk(&root)?;
        let failed = self.forget_unwanted(&wanted);
        let plan::Plan {
            inspect,
            stage,
            remove,
            mut entries,
        } = plan::plan(
            &wanted,
            plan::Inputs {
                gpus: &self.detected.gpus,
                gpu_detection: self.detected.message.as_deref(),
                images: &self.images,
                on_disk: &on_disk,
                busy: &self.busy,
                failed: &failed,
            },
        );
        self.remove_dirs(&root, remove.iter().chain(&damaged));
        let stage = self.make_room(&root, stage, in_use.as_ref(), &mut entries);
        self.start_work(inspect, stage, &mut entries);
        self.report_evicted(&mut entries);
        self.rewrite_ready(&wanted, &entries, &root);
        self.count_checks(&entries);
        self.metrics.cache_sizes(
            &entries
                .iter()
                .filter_map(|e| {
                    e.size_bytes
                        .map(|b| (e.key.namespace.clone(), e.key.name.clone(), b))
                })
                .collect::<Vec<_>>(),
        );
        self.write_status(&entries).await
    }

    /// Remove the directories of `keys` (a phase of [`Agent::reconcile`]); the keys
    /// removed.
    fn remove_dirs<'a>(
        &mut self,
        root: &Path,
        keys: impl IntoIterator<Item = &'a Key>,
    ) -> Vec<Key> {
        let mut removed = Vec::new();
        for key in keys {
            info!(cache = %key, "removing kernel cache directory");
            match disk::remove(root, key) {
                Ok(()) => {
                    self.disk.remove(key);
                    self.rewritten.remove(key);
                    removed.push(key.clone());
                }
                Err(e) => warn!(cache = %key, error = %e, "removing kernel cache directory"),
            }
        }
        removed
    }

    /// The caches pods on this node use, as the controller recorded them in this node's
    /// KernelCacheNode (a phase of [`Agent::reconcile`]); none while unknown (nothing is
    /// evicted then).
    async fn read_in_use(&self) -> Option<BTreeSet<Key>> {
        match self.nodes.get_opt(&self.settings.node_name).await {
            Ok(found) => found?
                .spec
                .in_use
                .map(|keys| keys.iter().filter_map(|k| Key::parse(k)).collect()),
            Err(e) => {
                warn!(error = %e, "reading the caches in use on this node; evicting none");
                None
            }
        }
    }

    /// Evict what [`evict::decide`] chooses so that `stage` fits, after marking the caches
    /// in use as used now (a phase of [`Agent::reconcile`]); the stages to start (those
    /// evicted before that still have no room wait).
    fn make_room(
        &mut self,
        root: &Path,
        stage: Vec<Wanted>,
        in_use: Option<&BTreeSet<Key>>,
        entries: &mut [plan::Entry],
    ) -> Vec<Wanted> {
        let now = std::time::SystemTime::now();
        for key in in_use.into_iter().flatten() {
            if matches!(self.disk.get(key), Some(Ok(_)))
                && let Err(e) = disk::mark_used(root, key, now)
            {
                warn!(cache = %key, error = %e, "recording the use of a kernel cache");
            }
        }
        let held: Vec<evict::Held> = entries
            .iter()
            .filter(|e| e.state == CacheState::Ready && !self.busy.contains_key(&e.key))
            .filter_map(|e| {
                let size_bytes = self.disk.get(&e.key)?.as_ref().ok()?.size_bytes;
                let last_used = disk::last_used(root, &e.key).ok()?;
                Some(evict::Held {
                    key: e.key.clone(),
                    size_bytes,
                    last_used,
                })
            })
            .collect();
        let to_stage: Vec<evict::ToStage> = stage
            .iter()
            .map(|w| evict::ToStage {
                key: w.key.clone(),
                declared: self.sizes.get(&w.pinned).copied(),
                evicted_before: self.evicted.contains_key(&w.key),
            })
            .collect();
        let decision = evict::decide(&to_stage, &held, in_use, self.space());
        for e in &decision.evict {
            if !self.remove_dirs(root, [&e.key]).is_empty() {
                let message = format!(
                    "evicted from this node to make room for {} under its disk budget: no pod here used it, and it was the least recently used",
                    e.made_room_for
                );
                info!(cache = %e.key, room_for = %e.made_room_for, "evicted kernel cache");
                self.evicted.insert(e.key.clone(), message);
            }
        }
        // Reported Evicted by [`Agent::report_evicted`].
        for entry in entries.iter_mut() {
            let gone = decision.evict.iter().any(|e| e.key == entry.key)
                && !self.disk.contains_key(&entry.key);
            if gone || decision.hold.contains(&entry.key) {
                entry.state = CacheState::Pending;
            }
        }
        stage
            .into_iter()
            .filter(|w| !decision.hold.contains(&w.key))
            .collect()
    }

    /// The room a stage has now, for [`evict::decide`]: what the budget and the free-space
    /// floor leave (none when the filesystem cannot be read).
    fn space(&self) -> evict::Space {
        let Ok(fs) = space::filesystem(&self.settings.cache_root) else {
            return evict::Space {
                left: 0,
                layer_limit: 0,
            };
        };
        let floor = self.settings.min_free.bytes(fs.total);
        let (left, _) = space::allowance(u64::MAX, self.room().budget(), fs, floor);
        evict::Space {
            left,
            layer_limit: self.settings.limits.max_bytes,
        }
    }

    /// Report the evicted caches not on disk again and not being staged as `Evicted`
    /// (a phase of [`Agent::reconcile`]); those on disk again are no longer evicted.
    fn report_evicted(&mut self, entries: &mut [plan::Entry]) {
        for e in entries.iter_mut() {
            match e.state {
                CacheState::Ready | CacheState::Incompatible => {
                    self.evicted.remove(&e.key);
                }
                CacheState::Pending => {
                    if let Some(message) = self.evicted.get(&e.key) {
                        e.state = CacheState::Evicted;
                        e.message = Some(message.clone());
                        e.reason = Some(node_reasons::EVICTED_FOR_SPACE.to_string());
                        e.size_bytes = None;
                    }
                }
                _ => {}
            }
        }
    }

    /// This node's uid and labels (a phase of [`Agent::reconcile`]). Without its Node the
    /// agent still reports; caches with a nodeSelector wait.
    async fn read_node(&mut self) -> Result<node::NodeInfo, String> {
        let node = self.seams.node.get().await;
        if let Err(e) = &node
            && self.node_error.as_ref() != Some(e)
        {
            warn!(error = %e, "this node's labels are unknown; caches with a nodeSelector wait");
        }
        self.node_error = node.as_ref().err().cloned();
        let uid = node.as_ref().ok().and_then(|n| n.uid.clone());
        if uid.is_some() && uid != self.node_uid {
            self.node_uid = uid;
            self.node_applied = false;
        }
        node
    }

    /// The complete cache directories on disk, and the damaged ones to remove (a phase of
    /// [`Agent::reconcile`]).
    fn read_disk(&mut self, root: &Path) -> anyhow::Result<(BTreeMap<Key, OnDisk>, Vec<Key>)> {
        let keys = disk::scan(root)?;
        disk::read_new(root, &keys, &mut self.disk);
        let mut damaged = Vec::new();
        let on_disk = self
            .disk
            .iter()
            .filter_map(|(k, d)| match d {
                Ok(d) => Some((k.clone(), d.clone())),
                Err(e) => {
                    warn!(cache = %k, error = %e, "damaged cache directory; removing it");
                    damaged.push(k.clone());
                    None
                }
            })
            .collect();
        Ok((on_disk, damaged))
    }

    /// Forget failures and image labels of caches no longer wanted (a phase of
    /// [`Agent::reconcile`]); the failures still waiting for their retry.
    fn forget_unwanted(&mut self, wanted: &[Wanted]) -> BTreeMap<Key, String> {
        let wanted_keys: BTreeSet<&Key> = wanted.iter().map(|w| &w.key).collect();
        let wanted_images: BTreeSet<&str> = wanted.iter().map(|w| w.pinned.as_str()).collect();
        self.failures.retain(|k, _| wanted_keys.contains(k));
        self.evicted.retain(|k, _| wanted_keys.contains(k));
        self.images
            .retain(|p, _| wanted_images.contains(p.as_str()));
        self.sizes.retain(|p, _| wanted_images.contains(p.as_str()));
        let now = Instant::now();
        self.failures
            .iter()
            .filter(|(_, f)| f.retry_at > now)
            .map(|(k, f)| (k.clone(), f.message.clone()))
            .collect()
    }

    /// Registry work in tasks (a phase of [`Agent::reconcile`]): every inspection, and the
    /// stages [`plan::stage_wait`] lets start; the others are reported `Pending` with why.
    fn start_work(
        &mut self,
        inspect: Vec<Wanted>,
        stage: Vec<Wanted>,
        entries: &mut [plan::Entry],
    ) {
        for w in inspect {
            self.busy.insert(w.key.clone(), Busy::Inspecting);
            let stager = self.stager.clone();
            self.tasks.spawn(async move {
                let outcome = stager.inspect(&w).await;
                (w, outcome)
            });
        }
        for w in stage {
            if let Some(why) = plan::stage_wait(&self.busy, &w.key, self.settings.parallel_stages) {
                if let Some(e) = entries.iter_mut().find(|e| e.key == w.key) {
                    e.state = CacheState::Pending;
                    e.message = Some(why);
                }
                continue;
            }
            let room = self.room();
            let declared = self.sizes.get(&w.pinned).copied();
            info!(cache = %w.key, image = %w.pinned, "staging kernel cache");
            self.busy.insert(w.key.clone(), Busy::Staging);
            self.staging_sizes
                .insert(w.key.clone(), declared.unwrap_or(0));
            let stager = self.stager.clone();
            self.tasks.spawn(async move {
                let outcome = stager.stage(&w, room, declared).await;
                (w, outcome)
            });
        }
    }

    /// Triton group files of the caches found ready on disk point at the current mount
    /// path (a phase of [`Agent::reconcile`]).
    fn rewrite_ready(&mut self, wanted: &[Wanted], entries: &[plan::Entry], root: &Path) {
        let by_key: BTreeMap<&Key, &Wanted> = wanted.iter().map(|w| (&w.key, w)).collect();
        for e in entries.iter().filter(|e| e.state == CacheState::Ready) {
            let Some(w) = by_key.get(&e.key) else {
                continue;
            };
            if self.rewritten.get(&e.key) == Some(&w.triton_mount) {
                continue;
            }
            let cache_dir = e
                .key
                .dir(root)
                .join(kubeairunway_kernelcache_artifact::image::CacheType::Triton.cache_dir());
            if cache_dir.is_dir()
                && let Err(err) = triton::rewrite_group_files(&cache_dir, &w.triton_mount)
            {
                warn!(cache = %e.key, error = %err, "rewriting Triton group files");
                continue;
            }
            self.rewritten.insert(e.key.clone(), w.triton_mount.clone());
        }
    }

    fn count_checks(&mut self, entries: &[plan::Entry]) {
        for e in entries {
            let decided = !e.compatible.is_empty() || e.state == CacheState::Incompatible;
            if decided && !self.detected.gpus.is_empty() && self.checked.insert(e.key.clone()) {
                self.metrics.compatibility_check(!e.compatible.is_empty());
            }
        }
        self.checked.retain(|k| entries.iter().any(|e| &e.key == k));
    }

    async fn write_status(&mut self, entries: &[plan::Entry]) -> anyhow::Result<()> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut status = report::status(&self.detected, entries, &self.reported, &now);
        status.disk = self.disk_report();
        let node = self.settings.node_name.clone();
        for cache in &status.caches {
            let key = Key {
                namespace: cache.namespace.clone(),
                name: cache.name.clone(),
                digest: cache.digest.clone(),
            };
            if let Some((reason, warning, note)) =
                report::event(self.reported.get(&key), cache, &node)
            {
                self.publish(cache, reason, warning, note).await;
            }
        }
        let unchanged = self
            .written
            .as_ref()
            .is_some_and(|(s, at)| *s == status && at.elapsed() < self.settings.status_refresh);
        if unchanged && self.node_applied {
            return Ok(());
        }
        if !self.node_applied {
            report::apply_node(
                &self.nodes,
                &node,
                self.node_uid.as_deref(),
                &self.credentials_key,
            )
            .await?;
            self.node_applied = true;
        }
        let mut stamped = status.clone();
        stamped.last_updated = Some(now);
        if let Err(e) = report::apply_status(&self.nodes, &node, &stamped).await {
            // Someone deleted the KernelCacheNode: create it again next time.
            self.node_applied = false;
            return Err(e.into());
        }
        self.reported = report::by_key(&status);
        self.written = Some((status, Instant::now()));
        Ok(())
    }

    async fn publish(&self, cache: &NodeCache, reason: &str, warning: bool, note: String) {
        // Events go on the KernelCache; one deleted meanwhile gets none.
        let Some(object) = self
            .store
            .get(&ObjectRef::new(&cache.name).within(&cache.namespace))
        else {
            return;
        };
        let event = kubeairunway_sdk::events::event(warning, reason, note, "Stage");
        if let Err(e) = self.recorder.publish(&event, &object.object_ref(&())).await {
            warn!(error = %e, reason, "publishing an event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_ten_minutes() {
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(2), Duration::from_secs(20));
        assert_eq!(backoff(4), Duration::from_secs(80));
        assert_eq!(backoff(30), Duration::from_secs(600));
    }
}
