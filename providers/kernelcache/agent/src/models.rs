//! The agent's model-cache loop, beside the kernel-cache loop in the same process: it
//! watches `ModelCache`s (all namespaces, through a reflector), decides which this node
//! holds and which downloads start ([`decide`]), runs each download in a task
//! ([`download`]: a Hugging Face revision, or an `oci://` model artifact by digest) into
//! `<root>/hub` (the `HF_HUB_CACHE` layout, `HF_HOME=<root>`), and
//! reports every cache in `status.modelCaches` of the node's `KernelCacheNode`, by
//! server-side apply under its own field manager ([`FIELD_MANAGER`]), so the kernel-cache
//! loop's fields stay its own. A change of state is written at once (with an Event on the
//! ModelCache: `Downloaded`, `DownloadFailed`); progress alone at most every
//! `progress_every`.
//!
//! Nothing is kept on disk beside the cache: after a restart each wanted cache downloads
//! again, which resumes from the partial files and finds the complete blobs in place (a
//! cache already complete costs one request to the hub's API).

pub mod decide;
pub mod download;
pub mod prune;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource as _};
use kubeairunway_kernelcache_api::KernelCacheNode;
use kubeairunway_kernelcache_api::model::{ModelCache, ModelCacheState, NodeModelCache, reasons};
use kubeairunway_kernelcache_api::report::kube_error;
use kubeairunway_kernelcache_artifact::allow::AllowedRegistries;
use kubeairunway_kernelcache_artifact::secrets::SecretApi;
use kubeairunway_sdk::events::{Recorder, Reporter};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::node::NodeApi;
use crate::space::Size;
use decide::{Entry, Key, Known};
use download::{Done, Failure, Grants, Job, Shared};

/// The field manager of `status.modelCaches`.
pub const FIELD_MANAGER: &str = "modelcache-agent";
/// Where model caches go on a node unless told otherwise (`HF_HOME`; the cache proper is
/// its `hub/`).
pub const DEFAULT_MODEL_CACHE_ROOT: &str = "/var/lib/kubeairunway/model-caches";

/// What the model-cache loop is told.
#[derive(Clone, Debug)]
pub struct ModelSettings {
    /// `HF_HOME` on the node: caches go to `<root>/hub`.
    pub root: PathBuf,
    /// The Hugging Face hub's endpoint.
    pub hf_endpoint: String,
    /// Caches downloaded at once on this node.
    pub parallel_downloads: usize,
    /// Files fetched at once within one download.
    pub parallel_files: usize,
    /// Free space on the root's filesystem no download goes below (`--min-free`, shared
    /// with kernel caches).
    pub min_free: Size,
    /// Registries spoken to over plain HTTP (`oci://` sources; shared with kernel caches).
    pub plain_http: Vec<String>,
    /// Registries `oci://` sources may come from (`--allowed-registry`, shared with kernel
    /// caches).
    pub allowed: AllowedRegistries,
    /// Progress alone is written at most this often.
    pub progress_every: Duration,
    /// Everything is looked at again this often without a change.
    pub resync: Duration,
    /// A Ready cache at a moving revision (a branch or a tag) is resolved again this
    /// often, and a new commit downloaded next to the one in use ([`decide::refresh_due`]);
    /// none: only on a spec change or a restart.
    pub refresh_every: Option<Duration>,
}

impl ModelSettings {
    /// The defaults, under `root`.
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            hf_endpoint: kubeairunway_modelcache_hub::client::DEFAULT_ENDPOINT.to_string(),
            parallel_downloads: 2,
            parallel_files: 4,
            min_free: Size::Percent(5),
            plain_http: Vec::new(),
            allowed: AllowedRegistries::default(),
            progress_every: Duration::from_secs(5),
            resync: Duration::from_secs(120),
            refresh_every: Some(Duration::from_secs(3600)),
        }
    }

    /// `HF_HUB_CACHE`: `<root>/hub`.
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("hub")
    }
}

/// What the loop reads the world through.
pub struct Context {
    /// The API.
    pub client: Client,
    /// This node's name (its KernelCacheNode's).
    pub node_name: String,
    /// Where the controller hands hub tokens over.
    pub credentials_namespace: Option<String>,
    /// This node's labels.
    pub node: Arc<dyn NodeApi>,
    /// The handed-over tokens (opened with this node's key).
    pub secrets: Arc<dyn SecretApi>,
    /// The public half of that key (published with the node's report).
    pub credentials_key: String,
    /// The agent's metrics (model-cache downloads).
    pub metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("node_name", &self.node_name)
            .field("credentials_namespace", &self.credentials_namespace)
            .finish_non_exhaustive()
    }
}

struct Running {
    generation: i64,
    abort: AbortHandle,
    progress: Shared,
    /// The bytes to fetch while it waits for a slot across nodes.
    queued: Arc<std::sync::Mutex<Option<u64>>>,
    /// The cache's bound across nodes.
    max_nodes: Option<u32>,
}

type Outcome = (Key, i64, Result<Done, Failure>);

struct Loop {
    recorder: Recorder,
    ctx: Context,
    settings: ModelSettings,
    store: Store<ModelCache>,
    nodes: Api<KernelCacheNode>,
    known: BTreeMap<Key, Known>,
    running: BTreeMap<Key, Running>,
    attempts: BTreeMap<Key, u32>,
    tasks: JoinSet<Outcome>,
    /// The entries last planned (reported again with fresh progress).
    entries: Vec<Entry>,
    /// The report last written and when.
    written: Option<(Vec<NodeModelCache>, Instant)>,
    /// When to look again at caches with a nodeSelector, while this node's labels are
    /// unknown (its Node not read yet).
    labels_retry: Option<Instant>,
    /// The download slots across nodes granted to this node, for the downloads waiting.
    grants: watch::Sender<Grants>,
    /// Woken by a download that starts or stops waiting for a slot.
    wake: Arc<Notify>,
}

/// How often the slots granted to this node are read again while a download waits for
/// one (one GET of its KernelCacheNode).
const GRANTS_EVERY: Duration = Duration::from_secs(2);

/// How soon caches with a nodeSelector are looked at again while the node's labels are
/// unknown.
const LABELS_RETRY: Duration = Duration::from_secs(2);

/// Run the model-cache loop until `shutdown` completes.
pub async fn run(
    ctx: Context,
    settings: ModelSettings,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let cache_dir = settings.cache_dir();
    std::fs::create_dir_all(&cache_dir)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", cache_dir.display()))?;
    let (store, writer) = reflector::store::<ModelCache>();
    let mut changes = watcher(
        Api::<ModelCache>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .boxed();
    let mut this = Loop::new(ctx, settings, store);
    info!(root = %this.settings.root.display(), "model-cache loop starting");
    tokio::pin!(shutdown);
    let (mut synced, mut dirty) = (false, false);
    let mut next_resync = Instant::now() + this.settings.resync;
    loop {
        let wake = this.next_wake(next_resync);
        let queued_changed = Arc::clone(&this.wake);
        tokio::select! {
            () = &mut shutdown => break,
            // A download started or stopped waiting for a slot: reported at once, and
            // the slots read (one may be granted already).
            () = queued_changed.notified() => {
                if this.queued() {
                    this.read_grants().await;
                }
            }
            event = changes.next() => match event {
                Some(Ok(watcher::Event::InitDone)) => { synced = true; dirty = true; }
                Some(Ok(_)) => dirty = true,
                Some(Err(e)) => warn!(error = %e, "watching ModelCaches"),
                None => anyhow::bail!("the ModelCache watch ended"),
            },
            Some(done) = this.tasks.join_next() => {
                if let Ok((key, generation, result)) = done {
                    this.finished(key, generation, result);
                }
                dirty = true;
            }
            () = tokio::time::sleep_until(wake) => {
                if Instant::now() >= next_resync {
                    next_resync = Instant::now() + this.settings.resync;
                    dirty = true;
                }
                if this.queued() {
                    this.read_grants().await;
                }
                // Failures due for a retry, or the node's labels to read again.
                let now = Instant::now();
                let refresh_due = |checked: &Instant| {
                    this.settings.refresh_every.is_some_and(|e| !e.is_zero() && *checked + e <= now)
                };
                dirty |= this.known.values().any(|k| matches!(k, Known::Failed { retry_at, .. } if *retry_at <= now))
                    || this.known.values().any(|k| matches!(k, Known::Ready { checked, .. } if refresh_due(checked)))
                    || this.labels_retry.is_some_and(|at| at <= now);
            }
        }
        if !synced {
            continue;
        }
        if dirty {
            while let Some(Some(event)) = futures::FutureExt::now_or_never(changes.next()) {
                if let Err(e) = event {
                    warn!(error = %e, "watching ModelCaches");
                }
            }
            dirty = false;
            this.reconcile().await;
        }
        if let Err(e) = this.report().await {
            warn!(error = %e, "writing the model caches of this node's KernelCacheNode");
        }
    }
    this.tasks.abort_all();
    Ok(())
}

impl Loop {
    fn new(ctx: Context, settings: ModelSettings, store: Store<ModelCache>) -> Self {
        Self {
            recorder: Recorder::new(
                ctx.client.clone(),
                Reporter {
                    controller: FIELD_MANAGER.into(),
                    instance: Some(ctx.node_name.clone()),
                },
            ),
            nodes: Api::all(ctx.client.clone()),
            ctx,
            settings,
            store,
            known: BTreeMap::new(),
            running: BTreeMap::new(),
            attempts: BTreeMap::new(),
            tasks: JoinSet::new(),
            entries: Vec::new(),
            written: None,
            labels_retry: None,
            grants: watch::Sender::new(None),
            wake: Arc::new(Notify::new()),
        }
    }

    /// Whether a download waits for a slot across nodes.
    fn queued(&self) -> bool {
        self.running
            .values()
            .any(|r| r.queued.lock().is_ok_and(|q| q.is_some()))
    }

    /// Reads the slots granted to this node again (its KernelCacheNode's
    /// `spec.modelDownloads`), for the downloads waiting for one.
    async fn read_grants(&self) {
        match self.nodes.get_opt(&self.ctx.node_name).await {
            Ok(node) => {
                let grants = node.and_then(|n| n.spec.model_downloads);
                self.grants.send_if_modified(|g| {
                    let changed = *g != grants;
                    *g = grants;
                    changed
                });
            }
            Err(e) => {
                warn!(error = %kube_error(&e), "reading the download slots granted to this node");
            }
        }
    }

    /// The next resync, retry, or progress report (while downloads run).
    fn next_wake(&self, resync: Instant) -> Instant {
        let now = Instant::now();
        let retry = self
            .known
            .values()
            .filter_map(|k| match k {
                Known::Failed { retry_at, .. } if *retry_at > now => Some(*retry_at),
                _ => None,
            })
            .min();
        let progress = (!self.running.is_empty()).then(|| now + self.settings.progress_every);
        let grants = self.queued().then(|| now + GRANTS_EVERY);
        let every = self.settings.refresh_every.filter(|e| !e.is_zero());
        let refresh = every.and_then(|every| {
            self.known
                .values()
                .filter_map(|k| match k {
                    Known::Ready { checked, .. } => Some(*checked + every),
                    _ => None,
                })
                .min()
                .map(|at| at.max(now))
        });
        [
            Some(resync),
            retry,
            progress,
            self.labels_retry,
            grants,
            refresh,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(resync)
    }

    fn finished(&mut self, key: Key, generation: i64, result: Result<Done, Failure>) {
        // A download stopped (its cache deleted, unselected or changed) that finished
        // before its abort took effect says nothing about what is wanted now.
        if self
            .running
            .get(&key)
            .is_none_or(|r| r.generation != generation)
        {
            return;
        }
        self.running.remove(&key);
        // A refresh keeps the commit in use when it fails (its files are on disk), unless
        // the hub refused the cache's access: then it fails as a download does.
        let refreshing = match self.known.get(&key) {
            Some(Known::Refreshing { commit, bytes, .. }) => Some((commit.clone(), *bytes)),
            _ => None,
        };
        let kept = match (&refreshing, &result) {
            (Some(_), Err(f)) => decide::refresh_keeps(f.reason),
            (Some(_), Ok(_)) => true,
            (None, _) => false,
        };
        if let (Some((commit, bytes)), true) = (refreshing, kept) {
            let outcome = match result {
                Ok(done) => {
                    if done.commit != commit {
                        info!(cache = %key, from = %commit, to = %done.commit, received = done.received, "model cache refreshed: its revision moved");
                    }
                    self.ctx.metrics.model_download(Ok(done.received));
                    Ok((done.commit, done.bytes))
                }
                Err(f) => {
                    warn!(cache = %key, reason = f.reason, error = %f.message, %commit, "refreshing a model cache failed; the commit in use stays");
                    self.ctx.metrics.model_download(Err(f.reason));
                    Err(())
                }
            };
            let known = decide::after_refresh(generation, (commit, bytes), outcome, Instant::now());
            self.known.insert(key, known);
            return;
        }
        let known = match result {
            Ok(done) => {
                info!(cache = %key, commit = %done.commit, bytes = done.bytes, received = done.received, "model cache ready");
                self.ctx.metrics.model_download(Ok(done.received));
                self.attempts.remove(&key);
                Known::Ready {
                    generation,
                    commit: done.commit,
                    bytes: done.bytes,
                    checked: Instant::now(),
                }
            }
            Err(f) => {
                warn!(cache = %key, reason = f.reason, error = %f.message, "model cache download failed");
                self.ctx.metrics.model_download(Err(f.reason));
                let attempts = self.attempts.entry(key.clone()).or_default();
                *attempts += 1;
                Known::Failed {
                    generation,
                    reason: f.reason,
                    message: f.message,
                    commit: f.commit,
                    retry_at: Instant::now() + decide::backoff(*attempts),
                }
            }
        };
        self.known.insert(key, known);
    }

    /// One pass: this node's labels, [`decide::wanted`] and [`decide::plan`], then the
    /// downloads stopped and started.
    async fn reconcile(&mut self) {
        let labels = self.ctx.node.get().await.ok().map(|n| n.labels);
        self.labels_retry = labels.is_none().then(|| Instant::now() + LABELS_RETRY);
        let caches = self.store.state();
        let wanted = decide::wanted(caches.iter().map(AsRef::as_ref), labels.as_ref());
        let now = Instant::now();
        for key in decide::due_refreshes(&wanted, &self.known, now, self.settings.refresh_every) {
            if let Some(Known::Ready {
                generation,
                commit,
                bytes,
                ..
            }) = self.known.remove(&key)
            {
                self.known.insert(
                    key,
                    Known::RefreshDue {
                        generation,
                        commit,
                        bytes,
                    },
                );
            }
        }
        let plan = decide::plan(
            &wanted,
            &self.known,
            self.settings.parallel_downloads,
            Instant::now(),
        );
        for key in &plan.stop {
            if let Some(r) = self.running.remove(key) {
                info!(cache = %key, "model cache download stopped (deleted, unselected or changed)");
                r.abort.abort();
            }
            self.known.remove(key);
        }
        let keep: std::collections::BTreeSet<&Key> = wanted.iter().map(|w| &w.key).collect();
        self.known.retain(|k, _| keep.contains(k));
        self.attempts.retain(|k, _| keep.contains(k));
        for w in plan.start {
            info!(cache = %w.key, repo = %w.repo, revision = %w.revision, "downloading model cache");
            let progress = Shared::default();
            let queued = Arc::new(std::sync::Mutex::new(None));
            let job = Job {
                wanted: w.clone(),
                cache_dir: self.settings.cache_dir(),
                endpoint: self.settings.hf_endpoint.clone(),
                parallel_files: self.settings.parallel_files,
                min_free: self.settings.min_free,
                registry: download::RegistrySettings {
                    plain_http: self.settings.plain_http.clone(),
                    allowed: self.settings.allowed.clone(),
                },
                credentials_namespace: self.ctx.credentials_namespace.clone(),
                secrets: Arc::clone(&self.ctx.secrets),
                progress: Arc::clone(&progress),
                slot: download::Slot {
                    grants: self.grants.subscribe(),
                    queued: Arc::clone(&queued),
                    wake: Arc::clone(&self.wake),
                },
            };
            let (key, generation, max_nodes) = (w.key.clone(), w.generation, w.max_nodes);
            let abort = self.tasks.spawn(async move {
                let result = download::run(job).await;
                (key, generation, result)
            });
            let known = match self.known.remove(&w.key) {
                Some(Known::RefreshDue {
                    generation: refreshed,
                    commit,
                    bytes,
                }) if refreshed == generation => {
                    info!(cache = %w.key, %commit, "resolving a moving revision again");
                    Known::Refreshing {
                        generation,
                        commit,
                        bytes,
                    }
                }
                _ => Known::Running { generation },
            };
            self.known.insert(w.key.clone(), known);
            self.running.insert(
                w.key,
                Running {
                    generation,
                    abort,
                    progress,
                    queued,
                    max_nodes,
                },
            );
        }
        self.entries = plan.entries;
        // Without this node's labels, caches with a nodeSelector are not in `wanted`:
        // their files must not be taken for unwanted.
        if labels.is_some() {
            self.prune(&wanted).await;
        }
    }

    /// Removes from the hub cache what no wanted cache keeps ([`prune`]), off the async
    /// threads.
    async fn prune(&self, wanted: &[decide::Wanted]) {
        let keep = prune::keep(wanted, &self.entries);
        let hub = self.settings.cache_dir();
        let done = tokio::task::spawn_blocking(move || {
            let removals = prune::removals(&prune::scan(&hub), &keep);
            let errors = prune::remove(&hub, &removals);
            (removals, errors)
        })
        .await;
        let Ok((removals, errors)) = done else {
            return;
        };
        for r in &removals {
            info!(removed = ?r, "model cache files no ModelCache wants removed");
        }
        for (path, error) in errors {
            warn!(path, %error, "removing model cache files");
        }
    }

    /// The report: the planned entries with the running downloads' progress; the
    /// transition time kept while a state stays.
    fn entries(&self, now: &Time) -> Vec<NodeModelCache> {
        let previous = self
            .written
            .as_ref()
            .map(|(w, _)| w.as_slice())
            .unwrap_or_default();
        let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
        self.entries
            .iter()
            .map(|e| {
                let running = self.running.get(&e.key);
                let progress = running.and_then(|r| r.progress.lock().ok().and_then(|p| p.clone()));
                // A download waiting for a slot across nodes says so.
                let queued = running.and_then(|r| {
                    let missing = (*r.queued.lock().ok()?)?;
                    Some(decide::queued_message(r.max_nodes?, missing))
                });
                let (reason, message) = match (e.state, queued) {
                    (ModelCacheState::Downloading, Some(m)) => (reasons::DOWNLOAD_QUEUED, Some(m)),
                    // A refresh waiting for a slot stays Ready at the commit in use.
                    (ModelCacheState::Ready, Some(m)) if e.reason == reasons::REFRESHING => {
                        (reasons::DOWNLOAD_QUEUED, Some(m))
                    }
                    _ => (e.reason, e.message.clone()),
                };
                let before = previous
                    .iter()
                    .find(|p| p.namespace == e.key.namespace && p.name == e.key.name);
                let last_transition_time = before
                    .filter(|b| b.state == e.state)
                    .and_then(|b| b.last_transition_time.clone())
                    .or_else(|| Some(now.clone()));
                NodeModelCache {
                    namespace: e.key.namespace.clone(),
                    name: e.key.name.clone(),
                    observed_generation: Some(e.generation),
                    commit: e
                        .commit
                        .clone()
                        .or_else(|| progress.as_ref().map(|p| p.commit.clone())),
                    state: e.state,
                    reason: Some(reason.to_string()),
                    message,
                    bytes_done: e
                        .bytes
                        .or_else(|| progress.as_ref().map(download::Progress::done))
                        .map(bytes),
                    bytes_total: e
                        .bytes
                        .or_else(|| progress.as_ref().map(|p| p.total))
                        .map(bytes),
                    last_transition_time,
                }
            })
            .collect()
    }

    /// Writes the report when a state changed, or progress changed and the last write is
    /// `progress_every` old.
    async fn report(&mut self) -> anyhow::Result<()> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let entries = self.entries(&now);
        let strip = |list: &[NodeModelCache]| -> Vec<NodeModelCache> {
            list.iter()
                .map(|e| NodeModelCache {
                    bytes_done: None,
                    last_transition_time: None,
                    ..e.clone()
                })
                .collect()
        };
        let due = match &self.written {
            None => true,
            Some((w, at)) => {
                strip(w) != strip(&entries)
                    || (*w != entries && at.elapsed() >= self.settings.progress_every)
            }
        };
        if !due {
            return Ok(());
        }
        let status = json!({"modelCaches": entries});
        let node = &self.ctx.node_name;
        let written =
            kubeairunway_kernelcache_api::report::apply(&self.nodes, node, FIELD_MANAGER, &status)
                .await;
        match written {
            Ok(_) => {}
            // No KernelCacheNode yet (the kernel-cache loop creates it too): create it.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let uid = self.ctx.node.get().await.ok().and_then(|n| n.uid);
                crate::report::apply_node(
                    &self.nodes,
                    node,
                    uid.as_deref(),
                    &self.ctx.credentials_key,
                )
                .await?;
                kubeairunway_kernelcache_api::report::apply(
                    &self.nodes,
                    node,
                    FIELD_MANAGER,
                    &status,
                )
                .await
                .map_err(|e| anyhow::anyhow!(kube_error(&e)))?;
            }
            Err(e) => return Err(anyhow::anyhow!(kube_error(&e))),
        }
        self.publish_events(&entries).await;
        self.written = Some((entries, Instant::now()));
        Ok(())
    }

    /// Events on the ModelCaches for the transitions since the last report written
    /// ([`decide::event`]); a cache deleted meanwhile gets none.
    async fn publish_events(&self, entries: &[NodeModelCache]) {
        let previous = self
            .written
            .as_ref()
            .map(|(w, _)| w.as_slice())
            .unwrap_or_default();
        for e in entries {
            let before = previous
                .iter()
                .find(|p| p.namespace == e.namespace && p.name == e.name);
            let Some((reason, warning, note)) = decide::event(before, e, &self.ctx.node_name)
            else {
                continue;
            };
            let Some(object) = self
                .store
                .get(&ObjectRef::new(&e.name).within(&e.namespace))
            else {
                continue;
            };
            let event = kubeairunway_sdk::events::event(warning, reason, note, "Download");
            if let Err(err) = self.recorder.publish(&event, &object.object_ref(&())).await {
                warn!(error = %err, reason, "publishing an event");
            }
        }
    }
}
