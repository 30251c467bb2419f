//! One ModelCache onto this node's disk, in phases: the hub token (handed over by the
//! controller in the credentials namespace), the revision resolved to a commit and its
//! files, the storage budget and the free space above `--min-free` checked against them
//! before a byte is written, then the pull (`kubeairunway-modelcache-hub`: resumes from
//! partial files, verifies each blob, publishes the snapshot at once). An `oci://` source
//! takes the same phases through the kernel caches' registry client instead of the hub
//! ([`run_oci`]: the allow-list, the manifest by digest, the budget and free space, then
//! [`Puller::pull_model`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, watch};

use kubeairunway_kernelcache_api::model::{reasons, slot_granted};
use kubeairunway_kernelcache_api::names::{MODEL_TOKEN_KEY, model_token_secret};
use kubeairunway_kernelcache_artifact::allow::AllowedRegistries;
use kubeairunway_kernelcache_artifact::credentials::{registry_auth, registry_of};
use kubeairunway_kernelcache_artifact::extract::Limits;
use kubeairunway_kernelcache_artifact::modelpack::pull::{
    self as oci, Inspected, ModelError, Target,
};
use kubeairunway_kernelcache_artifact::oci::Puller;
use kubeairunway_kernelcache_artifact::secrets::SecretApi;
use kubeairunway_modelcache_hub::client::HubOptions;
use kubeairunway_modelcache_hub::layout::{RepoLayout, check_revision};
use kubeairunway_modelcache_hub::pull::{missing_bytes, select, unique_bytes};
use kubeairunway_modelcache_hub::{Hub, HubFile, PullOptions, RepoId, pull_resolved};
use oci_client::secrets::RegistryAuth;

use crate::models::decide::{Wanted, check_budget, check_space, needs_slot, oci_reason, reason};
use crate::space::{Size, filesystem};

/// How far a download is, once its revision is resolved (read by the report).
#[derive(Clone, Debug)]
pub struct Progress {
    /// The commit.
    pub commit: String,
    /// Bytes of the files, each blob once.
    pub total: u64,
    layout: RepoLayout,
    files: Files,
}

/// What a download fetches, to measure what is on disk.
#[derive(Clone, Debug)]
enum Files {
    /// A hub revision's files.
    Hub(Vec<HubFile>),
    /// An OCI artifact's layers (counted as they complete).
    Oci(Box<Inspected>),
}

impl Progress {
    /// Bytes on disk of the files (complete blobs and partial downloads; of an OCI
    /// artifact, its complete raw layers).
    pub fn done(&self) -> u64 {
        let missing = match &self.files {
            Files::Hub(files) => {
                let files: Vec<&HubFile> = files.iter().collect();
                missing_bytes(&self.layout, &files)
            }
            Files::Oci(inspected) => oci::missing_bytes(&self.layout, inspected),
        };
        self.total.saturating_sub(missing)
    }
}

/// The registry settings of `oci://` sources (the kernel caches').
#[derive(Clone, Debug, Default)]
pub struct RegistrySettings {
    /// Registries spoken to over plain HTTP.
    pub plain_http: Vec<String>,
    /// Registries sources may come from.
    pub allowed: AllowedRegistries,
}

/// Where a running download reports its progress.
pub type Shared = Arc<Mutex<Option<Progress>>>;

/// The download slots across nodes the controller granted this node (its
/// KernelCacheNode's `spec.modelDownloads`; none until read).
pub type Grants = Option<BTreeMap<String, i64>>;

/// How a download waits for a slot across nodes (a cache with `download.maxNodes`).
#[derive(Clone, Debug)]
pub struct Slot {
    /// The slots granted to this node, as the loop last read them.
    pub grants: watch::Receiver<Grants>,
    /// The bytes still to fetch while the download waits for a slot (none otherwise), for
    /// the report.
    pub queued: Arc<Mutex<Option<u64>>>,
    /// Wakes the loop when the download starts or stops waiting.
    pub wake: Arc<Notify>,
}

/// One download to run.
pub struct Job {
    /// The cache.
    pub wanted: Wanted,
    /// `HF_HUB_CACHE` on this node.
    pub cache_dir: PathBuf,
    /// The hub.
    pub endpoint: String,
    /// Files fetched at once.
    pub parallel_files: usize,
    /// Free space no download goes below.
    pub min_free: Size,
    /// The registries of `oci://` sources.
    pub registry: RegistrySettings,
    /// Where the controller hands tokens over.
    pub credentials_namespace: Option<String>,
    /// Reading the handed-over token.
    pub secrets: Arc<dyn SecretApi>,
    /// Progress, for the report.
    pub progress: Shared,
    /// The wait for a slot across nodes.
    pub slot: Slot,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("wanted", &self.wanted)
            .field("cache_dir", &self.cache_dir)
            .finish_non_exhaustive()
    }
}

/// A finished download.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Done {
    /// The commit on disk.
    pub commit: String,
    /// Its bytes.
    pub bytes: u64,
    /// Bytes received from the hub for it (0 when it was complete on disk).
    pub received: u64,
}

/// A failed download.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// A constant of [`reasons`].
    pub reason: &'static str,
    /// The detail.
    pub message: String,
    /// The commit, when the revision was resolved.
    pub commit: Option<String>,
}

fn failure(reason: &'static str, message: impl Into<String>) -> Failure {
    Failure {
        reason,
        message: message.into(),
        commit: None,
    }
}

fn hub_failure(e: &kubeairunway_modelcache_hub::Error) -> Failure {
    failure(reason(e), e.to_string())
}

/// Downloads the job's cache (phases: [`token`], resolve and check, pull; an `oci://`
/// source: [`run_oci`]).
pub async fn run(job: Job) -> Result<Done, Failure> {
    let w = &job.wanted;
    if let Some(reference) = &w.oci {
        return run_oci(&job, reference).await;
    }
    let token = if w.token {
        Some(token(&job).await?)
    } else {
        None
    };
    let repo = RepoId::parse(&w.repo).map_err(|e| hub_failure(&e))?;
    check_revision(&w.revision).map_err(|e| hub_failure(&e))?;
    let hub = Hub::new(&HubOptions {
        endpoint: job.endpoint.clone(),
        token,
        ..HubOptions::default()
    })
    .map_err(|e| hub_failure(&e))?;
    let info = hub
        .revision(&repo, &w.revision)
        .await
        .map_err(|e| hub_failure(&e))?;
    let with_commit = |mut f: Failure| {
        f.commit = Some(info.commit.clone());
        f
    };
    let files = select(&info.files, &w.include).map_err(|e| with_commit(hub_failure(&e)))?;
    if files.is_empty() {
        return Err(with_commit(failure(
            reasons::INVALID_SPEC,
            format!(
                "the include patterns {:?} match no file of {}@{}",
                w.include, w.repo, info.commit
            ),
        )));
    }
    let total = unique_bytes(&files);
    check_budget(total, w.budget).map_err(|(r, m)| with_commit(failure(r, m)))?;
    let layout = RepoLayout::new(&job.cache_dir, &repo);
    let fs = filesystem(&job.cache_dir)
        .map_err(|e| with_commit(failure(reasons::DOWNLOAD_FAILED, e)))?;
    let missing = missing_bytes(&layout, &files);
    check_space(missing, fs, job.min_free).map_err(|(r, m)| with_commit(failure(r, m)))?;
    if let Ok(mut p) = job.progress.lock() {
        *p = Some(Progress {
            commit: info.commit.clone(),
            total,
            layout,
            files: Files::Hub(files.into_iter().cloned().collect()),
        });
    }
    wait_for_slot(&job, missing).await;
    let options = PullOptions {
        include: w.include.clone(),
        parallel: job.parallel_files.max(1),
        ..PullOptions::default()
    };
    let report = pull_resolved(&hub, &job.cache_dir, &repo, &w.revision, &info, &options)
        .await
        .map_err(|e| with_commit(hub_failure(&e)))?;
    Ok(Done {
        commit: report.commit,
        bytes: report.bytes_total,
        received: report.bytes_received,
    })
}

/// Waits, when the cache is bounded across nodes and `missing` bytes are to be fetched
/// ([`needs_slot`]), until the controller granted this node a slot for the cache's
/// generation (a phase of [`run`] and [`run_oci`], after the checks and before a byte is
/// fetched). While it waits the report says `Downloading`/`DownloadQueued`.
async fn wait_for_slot(job: &Job, missing: u64) {
    let w = &job.wanted;
    if !needs_slot(w.max_nodes, missing) {
        return;
    }
    let set = |queued: Option<u64>| {
        if let Ok(mut q) = job.slot.queued.lock() {
            *q = queued;
        }
        job.slot.wake.notify_one();
    };
    set(Some(missing));
    let mut grants = job.slot.grants.clone();
    let (namespace, name, generation) = (&w.key.namespace, &w.key.name, w.generation);
    // The sender goes only with the loop, which aborts its downloads first.
    let _ = grants
        .wait_for(|g| slot_granted(g.as_ref(), namespace, name, generation))
        .await;
    set(None);
}

fn oci_failure(e: &ModelError) -> Failure {
    failure(oci_reason(e), e.to_string())
}

/// Pulls the job's `oci://` artifact `reference` (pinned): the allow-list, the manifest
/// and config by digest, the budget and the free space above `--min-free` against its
/// layers, then the layers (each verified, tar layers extracted under caps no larger
/// than the budget and the room left) and the snapshot published under the model id.
pub async fn run_oci(job: &Job, reference: &str) -> Result<Done, Failure> {
    let w = &job.wanted;
    let repo = RepoId::parse(&w.repo).map_err(|e| hub_failure(&e))?;
    check_revision(&w.revision).map_err(|e| hub_failure(&e))?;
    job.registry
        .allowed
        .check(reference)
        .map_err(|m| failure(reasons::REGISTRY_NOT_ALLOWED, m))?;
    let auth = if w.token {
        registry_credentials(job, reference).await?
    } else {
        RegistryAuth::Anonymous
    };
    let puller = Puller::new(auth, job.registry.plain_http.clone());
    let inspected = puller
        .inspect_model(reference)
        .await
        .map_err(|e| oci_failure(&e))?;
    let commit = inspected.snapshot.clone();
    let with_commit = |mut f: Failure| {
        f.commit = Some(commit.clone());
        f
    };
    let total = inspected.plan.total();
    check_budget(total, w.budget).map_err(|(r, m)| with_commit(failure(r, m)))?;
    let layout = RepoLayout::new(&job.cache_dir, &repo);
    let fs = filesystem(&job.cache_dir)
        .map_err(|e| with_commit(failure(reasons::DOWNLOAD_FAILED, e)))?;
    let missing = oci::missing_bytes(&layout, &inspected);
    check_space(missing, fs, job.min_free).map_err(|(r, m)| with_commit(failure(r, m)))?;
    // A tar layer may not expand past the budget nor the room left above the floor.
    let room = fs.free.saturating_sub(job.min_free.bytes(fs.total));
    let limits = Limits {
        max_bytes: w.budget.unwrap_or(u64::MAX).min(room),
        ..Limits::default()
    };
    if let Ok(mut p) = job.progress.lock() {
        *p = Some(Progress {
            commit: commit.clone(),
            total,
            layout,
            files: Files::Oci(Box::new(inspected.clone())),
        });
    }
    wait_for_slot(job, missing).await;
    let target = Target {
        cache_dir: &job.cache_dir,
        model_id: &repo,
        revision: &w.revision,
        limits,
        check_space: false,
    };
    let report = puller
        .pull_model(&inspected, &target)
        .await
        .map_err(|e| with_commit(oci_failure(&e)))?;
    Ok(Done {
        commit: report.commit,
        bytes: report.bytes_total,
        received: report.bytes_received,
    })
}

/// The handed-over Secret of this cache (the controller's copy, in the credentials
/// namespace): its data, or why it cannot be read (`CredentialsMissing`).
async fn handed_over(
    job: &Job,
) -> Result<
    (
        String,
        kubeairunway_kernelcache_artifact::secrets::SecretData,
    ),
    Failure,
> {
    let w = &job.wanted;
    let Some(namespace) = job.credentials_namespace.as_deref() else {
        return Err(failure(
            reasons::CREDENTIALS_MISSING,
            "the cache names a credentials Secret, and this agent has no --credentials-namespace to read it from",
        ));
    };
    let secret = model_token_secret(&w.key.namespace, &w.key.name);
    let data = job
        .secrets
        .get(namespace, &secret)
        .await
        .map_err(|e| {
            failure(
                reasons::CREDENTIALS_MISSING,
                format!("reading the handed-over credentials {namespace}/{secret}: {e}"),
            )
        })?
        .ok_or_else(|| {
            failure(
                reasons::CREDENTIALS_MISSING,
                format!(
                    "the credentials are not handed over yet ({namespace}/{secret}; the controller copies them from the cache's credentialsSecretRef)"
                ),
            )
        })?;
    Ok((format!("{namespace}/{secret}"), data))
}

/// The registry credentials of `reference`'s registry the controller handed over for
/// this cache (a phase of [`run_oci`]), read as the kernel caches' are
/// ([`registry_auth`]): a copy without them is `CredentialsMissing`.
async fn registry_credentials(job: &Job, reference: &str) -> Result<RegistryAuth, Failure> {
    let (secret, data) = handed_over(job).await?;
    let registry = registry_of(reference);
    match registry_auth(&registry, &[(secret.clone(), data)]) {
        Ok(RegistryAuth::Anonymous) => Err(failure(
            reasons::CREDENTIALS_MISSING,
            format!("{secret} holds no credentials for registry {registry}"),
        )),
        Ok(auth) => Ok(auth),
        Err(e) => Err(failure(reasons::CREDENTIALS_MISSING, e.to_string())),
    }
}

/// The hub token the controller handed over for this cache (a phase of [`run`]).
async fn token(job: &Job) -> Result<String, Failure> {
    let (secret, data) = handed_over(job).await?;
    data.get(MODEL_TOKEN_KEY)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            failure(
                reasons::CREDENTIALS_MISSING,
                format!("{secret} has no {MODEL_TOKEN_KEY:?} key"),
            )
        })
}
