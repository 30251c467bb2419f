//! The model-cache loop's pure decisions: which ModelCaches this node holds (source and
//! nodeSelector against its labels), which downloads start (a bounded number at once;
//! failures wait for their retry), what each entry of the node's report says, whether a
//! resolved revision fits the storage budget, and which reason a hub or registry error is.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::ResourceExt as _;
use kubeairunway_kernelcache_api::model::{
    ModelCache, ModelCacheState, NodeModelCache, PullVerdict, Source, parse_source, pull_verdict,
    reasons,
};
use kubeairunway_kernelcache_api::selects;
use kubeairunway_kernelcache_artifact::extract::ExtractError;
use kubeairunway_kernelcache_artifact::modelpack::PlanError;
use kubeairunway_kernelcache_artifact::modelpack::pull::ModelError;
use kubeairunway_modelcache_hub::Error as HubError;
use tokio::time::Instant;

use crate::space::{Filesystem, Size};

/// A ModelCache: (namespace, name).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A ModelCache this node should hold, as the download needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// The cache.
    pub key: Key,
    /// Its generation (a new one downloads again).
    pub generation: i64,
    /// The model id (`org/name`): the hub repository of an `hf://` source, the id an
    /// `oci://` source is published as.
    pub repo: String,
    /// The pinned reference (`registry/repo@sha256:...`) of an `oci://` source.
    pub oci: Option<String>,
    /// The revision (of an `oci://` source: the ref written).
    pub revision: String,
    /// Include patterns.
    pub include: Vec<String>,
    /// The per-node budget in bytes.
    pub budget: Option<u64>,
    /// Whether credentials are to be read (the cache names a credentials Secret): the
    /// hub token of an `hf://` source, the registry credentials of an `oci://` one.
    pub token: bool,
    /// Why the spec cannot be acted on (`InvalidSpec`), when it cannot.
    pub invalid: Option<String>,
    /// Whether the controller lets the nodes pull it ([`pull_verdict`]: an `oci://`
    /// digest only once verified, or digest-only without a policy).
    pub verdict: PullVerdict,
    /// The bound across nodes on concurrent downloads (`spec.download.maxNodes`): with
    /// one, bytes are fetched only with a slot the controller granted ([`needs_slot`]).
    pub max_nodes: Option<u32>,
}

/// The ModelCaches this node holds: those whose nodeSelector its labels match (`hf://`
/// and `oci://` sources alike). Without its labels, only caches without a nodeSelector
/// (the others wait). A cache being deleted is still held (the controller's finalizer
/// keeps it while ModelDeployments use it): its files stay until the object is gone.
pub fn wanted<'a>(
    caches: impl IntoIterator<Item = &'a ModelCache>,
    labels: Option<&BTreeMap<String, String>>,
) -> Vec<Wanted> {
    let mut out: Vec<Wanted> = caches
        .into_iter()
        .filter(|c| match (labels, c.spec.node_selector.as_ref()) {
            (_, None) => true,
            (Some(labels), selector) => selects(selector, labels),
            (None, Some(_)) => false,
        })
        .map(wanted_one)
        .collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// One ModelCache this node holds, as its download needs it (a part of [`wanted`]).
fn wanted_one(c: &ModelCache) -> Wanted {
    let source = parse_source(&c.spec.source);
    let budget = c
        .spec
        .storage_budget
        .as_ref()
        .map(|q| match q.0.parse::<Size>() {
            Ok(Size::Bytes(b)) => Ok(b),
            _ => Err(format!(
                "storageBudget {:?}: expected bytes or a quantity without fraction (20Gi, 500M)",
                q.0
            )),
        })
        .transpose();
    let model = c.spec.model();
    let invalid = match (&model, &budget) {
        (Err(e), _) | (_, Err(e)) => Some(e.clone()),
        _ if c.spec.model_id.is_some() && !matches!(source, Ok(Source::Oci(_))) => {
            Some("modelId is for oci:// sources".into())
        }
        _ if c
            .spec
            .credentials_secret_ref
            .as_ref()
            .is_some_and(|r| r.key.is_some())
            && matches!(source, Ok(Source::Oci(_))) =>
        {
            Some(
                "credentialsSecretRef of an oci:// source names a kubernetes.io/dockerconfigjson Secret, without key"
                    .into(),
            )
        }
        _ if !c.spec.include.is_empty() && matches!(source, Ok(Source::Oci(_))) => {
            Some("include is for hf:// sources; an oci:// artifact is pulled whole".into())
        }
        _ => None,
    };
    Wanted {
        key: Key {
            namespace: c.namespace().unwrap_or_default(),
            name: c.name_any(),
        },
        generation: c.metadata.generation.unwrap_or_default(),
        repo: model.unwrap_or_default(),
        oci: match source {
            Ok(Source::Oci(reference)) => Some(reference),
            _ => None,
        },
        revision: c.spec.revision().to_string(),
        include: c.spec.include.clone(),
        budget: budget.ok().flatten(),
        token: c.spec.credentials_secret_ref.is_some(),
        invalid,
        verdict: pull_verdict(c),
        max_nodes: c.spec.max_nodes(),
    }
}

/// What the loop knows of one cache on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Known {
    /// A download of `generation` runs.
    Running {
        /// The generation it downloads.
        generation: i64,
    },
    /// `generation` is on disk at `commit`.
    Ready {
        /// The generation downloaded.
        generation: i64,
        /// The commit.
        commit: String,
        /// Its bytes.
        bytes: u64,
        /// When its revision was last resolved (a refresh is due `refresh_every` later:
        /// [`refresh_due`]).
        checked: Instant,
    },
    /// `generation` is on disk at `commit`, and its revision is due to be resolved again
    /// ([`due_refreshes`]): a refresh starts when a slot is free.
    RefreshDue {
        /// The generation downloaded.
        generation: i64,
        /// The commit in use.
        commit: String,
        /// Its bytes.
        bytes: u64,
    },
    /// `generation` is on disk at `commit`, and a refresh runs: the revision resolved
    /// again, a new commit downloaded next to it. `commit` stays in use (and on disk)
    /// until the new one is complete.
    Refreshing {
        /// The generation downloaded.
        generation: i64,
        /// The commit in use.
        commit: String,
        /// Its bytes.
        bytes: u64,
    },
    /// The download of `generation` failed; tried again at `retry_at`.
    Failed {
        /// The generation that failed.
        generation: i64,
        /// A constant of [`reasons`].
        reason: &'static str,
        /// The detail.
        message: String,
        /// The commit, when it was resolved.
        commit: Option<String>,
        /// When to try again.
        retry_at: Instant,
    },
}

impl Known {
    /// Whether a download runs (a first one or a refresh).
    pub fn downloads(&self) -> bool {
        matches!(self, Self::Running { .. } | Self::Refreshing { .. })
    }

    fn generation(&self) -> i64 {
        match self {
            Self::Running { generation }
            | Self::Ready { generation, .. }
            | Self::RefreshDue { generation, .. }
            | Self::Refreshing { generation, .. }
            | Self::Failed { generation, .. } => *generation,
        }
    }
}

/// One entry of the node's report, before progress is added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The cache.
    pub key: Key,
    /// Its generation.
    pub generation: i64,
    /// The state.
    pub state: ModelCacheState,
    /// A constant of [`reasons`].
    pub reason: &'static str,
    /// The detail.
    pub message: Option<String>,
    /// The commit, when known.
    pub commit: Option<String>,
    /// Its bytes, when ready.
    pub bytes: Option<u64>,
}

/// What to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Downloads to start.
    pub start: Vec<Wanted>,
    /// Running downloads to stop (no longer wanted, or of an older generation).
    pub stop: Vec<Key>,
    /// The report, one entry per wanted cache.
    pub entries: Vec<Entry>,
}

/// The plan for `wanted` given what is `known`: at most `parallel` downloads run; a
/// failure waits for its `retry_at`; a new generation downloads again (a running
/// download of an older one is stopped).
pub fn plan(
    wanted: &[Wanted],
    known: &BTreeMap<Key, Known>,
    parallel: usize,
    now: Instant,
) -> Plan {
    let mut plan = Plan::default();
    let current: BTreeMap<&Key, &Wanted> = wanted.iter().map(|w| (&w.key, w)).collect();
    for (key, k) in known {
        // A download the controller no longer lets through stops too.
        let outdated = current
            .get(key)
            .is_none_or(|w| w.generation != k.generation() || w.verdict != PullVerdict::Allowed);
        if k.downloads() && outdated {
            plan.stop.push(key.clone());
        }
    }
    let mut running = known
        .iter()
        .filter(|(key, k)| k.downloads() && !plan.stop.contains(key))
        .count();
    for w in wanted {
        let same = known.get(&w.key).filter(|k| k.generation() == w.generation);
        let slot = running < parallel.max(1);
        let (entry, start) = one(w, same, slot, parallel.max(1), now);
        if start {
            running += 1;
            plan.start.push(w.clone());
        }
        plan.entries.push(entry);
    }
    plan
}

/// The entry of one wanted cache, and whether its download starts (a phase of
/// [`plan`]): `known` is what is known of its current generation, `slot` whether a
/// download may start.
fn one(
    w: &Wanted,
    known: Option<&Known>,
    slot: bool,
    parallel: usize,
    now: Instant,
) -> (Entry, bool) {
    let entry = |state, reason, message: Option<String>| Entry {
        key: w.key.clone(),
        generation: w.generation,
        state,
        reason,
        message,
        commit: None,
        bytes: None,
    };
    if let Some(why) = &w.invalid {
        let e = entry(
            ModelCacheState::Failed,
            reasons::INVALID_SPEC,
            Some(why.clone()),
        );
        return (e, false);
    }
    match &w.verdict {
        PullVerdict::Allowed => {}
        PullVerdict::Pending => {
            let e = entry(
                ModelCacheState::Downloading,
                reasons::DOWNLOADING,
                Some("waiting for the controller's signature verdict on the digest".into()),
            );
            return (e, false);
        }
        PullVerdict::Refused(why) => {
            let e = entry(
                ModelCacheState::Failed,
                reasons::VERIFICATION_FAILED,
                Some(format!("refused by the controller: {why}")),
            );
            return (e, false);
        }
    }
    match known {
        Some(Known::Running { .. }) => (
            entry(ModelCacheState::Downloading, reasons::DOWNLOADING, None),
            false,
        ),
        Some(Known::Ready { commit, bytes, .. }) => (
            Entry {
                commit: Some(commit.clone()),
                bytes: Some(*bytes),
                ..entry(ModelCacheState::Ready, reasons::READY, None)
            },
            false,
        ),
        // A refresh: the commit in use stays Ready while the revision is resolved again
        // (and a new commit downloaded); due and no slot: Ready as it is.
        Some(Known::RefreshDue { commit, bytes, .. } | Known::Refreshing { commit, bytes, .. }) => {
            let start = matches!(known, Some(Known::RefreshDue { .. })) && slot;
            let refreshing = start || matches!(known, Some(Known::Refreshing { .. }));
            let (reason, message) = if refreshing {
                (reasons::REFRESHING, Some(refreshing_message(w, commit)))
            } else {
                (reasons::READY, None)
            };
            (
                Entry {
                    commit: Some(commit.clone()),
                    bytes: Some(*bytes),
                    ..entry(ModelCacheState::Ready, reason, message)
                },
                start,
            )
        }
        Some(Known::Failed {
            reason,
            message,
            commit,
            retry_at,
            ..
        }) if *retry_at > now => (
            Entry {
                commit: commit.clone(),
                ..entry(ModelCacheState::Failed, reason, Some(message.clone()))
            },
            false,
        ),
        _ if slot => (
            entry(ModelCacheState::Downloading, reasons::DOWNLOADING, None),
            true,
        ),
        _ => (
            entry(
                ModelCacheState::Downloading,
                reasons::DOWNLOADING,
                Some(format!(
                    "waiting for a download slot ({parallel} at once on this node)"
                )),
            ),
            false,
        ),
    }
}

/// The message of a Ready entry being refreshed.
fn refreshing_message(w: &Wanted, commit: &str) -> String {
    format!(
        "resolving {} again: a new commit is downloaded next to {commit}, which stays in use until it is complete",
        w.revision
    )
}

/// Whether `revision` is a commit (40 hex digits), which never moves.
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether the revision of `w`, Ready since it was resolved at `checked`, is due to be
/// resolved again at `now` (`every`; none: never): an `hf://` source at a branch or tag
/// (a commit never moves, an `oci://` source is pinned to its digest).
pub fn refresh_due(w: &Wanted, checked: Instant, now: Instant, every: Option<Duration>) -> bool {
    let Some(every) = every.filter(|e| !e.is_zero()) else {
        return false;
    };
    w.oci.is_none() && w.invalid.is_none() && !is_commit(&w.revision) && now >= checked + every
}

/// The wanted caches Ready at their current generation whose revision is due to be
/// resolved again ([`refresh_due`]).
pub fn due_refreshes(
    wanted: &[Wanted],
    known: &BTreeMap<Key, Known>,
    now: Instant,
    every: Option<Duration>,
) -> Vec<Key> {
    wanted
        .iter()
        .filter(|w| match known.get(&w.key) {
            Some(Known::Ready {
                generation,
                checked,
                ..
            }) => *generation == w.generation && refresh_due(w, *checked, now, every),
            _ => false,
        })
        .map(|w| w.key.clone())
        .collect()
}

/// Whether a refresh that failed with `reason` keeps the commit in use `Ready`: yes,
/// unless the hub refused the cache's access (`GatedRepo`, `Unauthorized`,
/// `CredentialsMissing`): files already on the node are no pass (a first download checks
/// the token the same way), so the cache then fails on this node as a download does. An
/// outage, a revision gone upstream or a new commit over the budget or the free space
/// keep the commit in use.
pub fn refresh_keeps(reason: &str) -> bool {
    !matches!(
        reason,
        reasons::GATED | reasons::UNAUTHORIZED | reasons::CREDENTIALS_MISSING
    )
}

/// What a finished refresh of a cache Ready at `commit` (`bytes`) leaves: the new
/// commit Ready, or, when it failed, the commit in use still Ready (its files are on
/// disk; the next refresh tries again), checked at `now` either way.
pub fn after_refresh(
    generation: i64,
    (commit, bytes): (String, u64),
    result: Result<(String, u64), ()>,
    now: Instant,
) -> Known {
    let (commit, bytes) = result.unwrap_or((commit, bytes));
    Known::Ready {
        generation,
        commit,
        bytes,
        checked: now,
    }
}

/// Whether `bytes` (a revision's files, each blob once) fit `budget`: `OverBudget` with
/// the numbers when not.
pub fn check_budget(bytes: u64, budget: Option<u64>) -> Result<(), (&'static str, String)> {
    match budget {
        Some(b) if bytes > b => Err((
            reasons::OVER_BUDGET,
            format!("the model takes {bytes} bytes, more than the storageBudget of {b} bytes"),
        )),
        _ => Ok(()),
    }
}

/// Whether `missing` bytes (still to download) fit the filesystem's free space above the
/// floor no download goes below (`--min-free`): `NoSpace` with the numbers when not.
pub fn check_space(
    missing: u64,
    fs: Filesystem,
    floor: Size,
) -> Result<(), (&'static str, String)> {
    let floor = floor.bytes(fs.total);
    let room = fs.free.saturating_sub(floor);
    if missing > room {
        return Err((
            reasons::NO_SPACE,
            format!(
                "{missing} bytes still to download, {room} available: {} free on the model-cache root's filesystem, {floor} kept free (--min-free)",
                fs.free
            ),
        ));
    }
    Ok(())
}

/// Whether a download must wait for a slot across nodes before fetching: only when the
/// cache is bounded (`max_nodes`) and bytes are `missing` on this node. A node whose
/// files are complete (an agent restarted, a revision already there) never waits.
pub fn needs_slot(max_nodes: Option<u32>, missing: u64) -> bool {
    max_nodes.is_some() && missing > 0
}

/// The message of an entry `Downloading`/`DownloadQueued`: waiting for one of the
/// `max_nodes` slots across nodes, with `missing` bytes to fetch.
pub fn queued_message(max_nodes: u32, missing: u64) -> String {
    format!(
        "waiting for a download slot across nodes: at most {max_nodes} node(s) download this cache at once (spec.download.maxNodes), the controller grants the slots; {missing} bytes to fetch"
    )
}

/// The reason of a hub error (the message is the error's own text).
pub fn reason(error: &HubError) -> &'static str {
    match error {
        HubError::Gated { .. } => reasons::GATED,
        HubError::Unauthorized { .. } => reasons::UNAUTHORIZED,
        HubError::RepoNotFound { .. }
        | HubError::RevisionNotFound { .. }
        | HubError::EntryNotFound { .. } => reasons::NOT_FOUND,
        HubError::NoSpace { .. } => reasons::NO_SPACE,
        HubError::Size { .. } | HubError::Digest { .. } => reasons::VERIFICATION_FAILED,
        HubError::Invalid { .. } => reasons::INVALID_SPEC,
        HubError::Status { .. }
        | HubError::Transport { .. }
        | HubError::Protocol { .. }
        | HubError::Io { .. } => reasons::DOWNLOAD_FAILED,
    }
}

/// The reason of an `oci://` pull error (the message is the error's own text).
pub fn oci_reason(error: &ModelError) -> &'static str {
    match error {
        ModelError::Reference(_) => reasons::INVALID_SPEC,
        ModelError::Plan(PlanError::UnsupportedMediaType { .. }) => reasons::UNSUPPORTED_MEDIA_TYPE,
        ModelError::Plan(_) => reasons::INVALID_ARTIFACT,
        ModelError::Registry(e) if e.is_digest_mismatch() => reasons::VERIFICATION_FAILED,
        ModelError::Registry(e) if e.not_found => reasons::NOT_FOUND,
        ModelError::Extract(ExtractError::Io { .. })
        | ModelError::Registry(_)
        | ModelError::Io(_) => reasons::DOWNLOAD_FAILED,
        ModelError::Extract(_) => reasons::UNSAFE_ARCHIVE,
        ModelError::Layout(e) => reason(e),
    }
}

/// The Event reasons the agent publishes on a ModelCache.
pub mod events {
    /// The cache became ready on a node.
    pub const DOWNLOADED: &str = "Downloaded";
    /// A download failed on a node (or failed again, differently).
    pub const DOWNLOAD_FAILED: &str = "DownloadFailed";
}

/// An Event worth publishing on the ModelCache for an entry of the report that was
/// `before` and is `now`: (reason, warning, note). Only transitions: to `Ready`, and to a
/// failure (or a failure with another message).
pub fn event(
    before: Option<&NodeModelCache>,
    now: &NodeModelCache,
    node: &str,
) -> Option<(&'static str, bool, String)> {
    let same_state = before.is_some_and(|b| b.state == now.state);
    // A refresh that brought a new commit is a download too.
    let new_commit = before.is_some_and(|b| b.commit != now.commit);
    match now.state {
        ModelCacheState::Ready if !same_state || new_commit => Some((
            events::DOWNLOADED,
            false,
            format!(
                "{} ready on node {node} ({} bytes)",
                now.commit.as_deref().unwrap_or("?"),
                now.bytes_total.unwrap_or_default()
            ),
        )),
        ModelCacheState::Failed
            if !same_state || before.is_some_and(|b| b.message != now.message) =>
        {
            Some((
                events::DOWNLOAD_FAILED,
                true,
                format!(
                    "on node {node}: {}: {}",
                    now.reason.as_deref().unwrap_or(reasons::FAILED),
                    now.message.as_deref().unwrap_or_default()
                ),
            ))
        }
        _ => None,
    }
}

/// Retry after 10 s, doubling per attempt, at most 10 minutes.
pub fn backoff(attempts: u32) -> Duration {
    Duration::from_secs(10u64.saturating_mul(1 << attempts.saturating_sub(1).min(6)))
        .min(Duration::from_secs(600))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kubeairunway_kernelcache_api::model::{CredentialsSecretRef, ModelCacheSpec};

    fn cache(name: &str, source: &str, selector: Option<(&str, &str)>) -> ModelCache {
        let mut c = ModelCache::new(
            name,
            ModelCacheSpec {
                source: source.into(),
                node_selector: selector.map(|(k, v)| BTreeMap::from([(k.into(), v.into())])),
                ..ModelCacheSpec::default()
            },
        );
        c.metadata.namespace = Some("ml".into());
        c.metadata.generation = Some(1);
        c
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn the_node_holds_the_caches_its_labels_select() {
        let caches = [
            cache("all", "hf://o/all", None),
            cache("gpu", "hf://o/gpu", Some(("pool", "gpu"))),
            cache("cpu", "hf://o/cpu", Some(("pool", "cpu"))),
            cache("oci", "oci://r.example/acme/m@sha256:ab", None),
        ];
        let names = |w: Vec<Wanted>| w.into_iter().map(|w| w.key.name).collect::<Vec<_>>();
        assert_eq!(
            names(wanted(&caches, Some(&labels(&[("pool", "gpu")])))),
            ["all", "gpu", "oci"]
        );
        assert_eq!(
            names(wanted(&caches, None)),
            ["all", "oci"],
            "selectors wait for labels"
        );
        let w = &wanted(&caches, None)[0];
        assert_eq!((w.repo.as_str(), w.revision.as_str()), ("o/all", "main"));
        assert!(!w.token && w.invalid.is_none() && w.oci.is_none());
        let oci = &wanted(&caches, None)[1];
        assert_eq!(oci.repo, "acme/m", "the model id from the repository");
        assert_eq!(oci.oci.as_deref(), Some("r.example/acme/m@sha256:ab"));
        assert!(oci.invalid.is_none());
    }

    #[test]
    fn model_ids_and_tokens_are_refused_where_they_do_not_apply() {
        let mut hf_with_id = cache("a", "hf://o/m", None);
        hf_with_id.spec.model_id = Some("o/m".into());
        let mut oci_with_key = cache("b", "oci://r.example/m@sha256:ab", None);
        oci_with_key.spec.credentials_secret_ref = Some(CredentialsSecretRef {
            name: "regcred".into(),
            key: Some("token".into()),
        });
        let mut oci_with_id = cache("c", "oci://r.example/m@sha256:ab", None);
        oci_with_id.spec.model_id = Some("Qwen/Qwen3-0.6B".into());
        let mut oci_with_secret = cache("d", "oci://r.example/m@sha256:ab", None);
        oci_with_secret.spec.credentials_secret_ref = Some(CredentialsSecretRef {
            name: "regcred".into(),
            key: None,
        });
        let w = wanted(
            &[hf_with_id, oci_with_key, oci_with_id, oci_with_secret],
            None,
        );
        assert!(w[0].invalid.as_deref().unwrap().contains("modelId"));
        assert!(
            w[1].invalid
                .as_deref()
                .unwrap()
                .contains("credentialsSecretRef")
        );
        assert_eq!(
            (w[2].repo.as_str(), w[2].invalid.as_ref()),
            ("Qwen/Qwen3-0.6B", None)
        );
        assert_eq!(
            (w[3].token, w[3].invalid.as_ref()),
            (true, None),
            "registry credentials"
        );
    }

    #[test]
    fn bad_specs_are_reported_invalid_without_a_download() {
        let mut bad_budget = cache("budget", "hf://o/m", None);
        bad_budget.spec.storage_budget = Some(Quantity("1.5Gi".into()));
        let mut good_budget = cache("good", "hf://o/m", None);
        good_budget.spec.storage_budget = Some(Quantity("2Mi".into()));
        good_budget.spec.credentials_secret_ref = Some(CredentialsSecretRef::default());
        let caches = [
            cache("repo", "hf://only-org", None),
            bad_budget,
            good_budget,
        ];
        let w = wanted(&caches, None);
        assert!(w[0].invalid.as_deref().unwrap().contains("storageBudget"));
        assert_eq!(w[1].budget, Some(2 << 20));
        assert!(w[1].token);
        assert!(w[2].invalid.as_deref().unwrap().contains("hf://org/name"));
        let p = plan(&w, &BTreeMap::new(), 2, Instant::now());
        assert_eq!(p.start.len(), 1, "only the valid one downloads");
        assert_eq!(p.entries[0].reason, reasons::INVALID_SPEC);
        assert_eq!(p.entries[0].state, ModelCacheState::Failed);
    }

    /// An `oci://` cache downloads only once the controller let its digest through; a
    /// refusal is reported `VerificationFailed` without a download, and stops one that
    /// runs; without a verdict it waits.
    #[test]
    fn oci_downloads_wait_for_the_controllers_verdict() {
        use kubeairunway_kernelcache_api::model::ModelCacheStatus;
        let digest = format!("sha256:{}", "a".repeat(64));
        let mut c = cache("m", &format!("oci://r.example/acme/m@{digest}"), None);
        c.metadata.generation = Some(1);
        let now = Instant::now();
        let running = BTreeMap::from([(key("m"), Known::Running { generation: 1 })]);
        let w = wanted(std::slice::from_ref(&c), None);
        let p = plan(&w, &BTreeMap::new(), 2, now);
        assert!(p.start.is_empty(), "no verdict: no download");
        assert_eq!(p.entries[0].state, ModelCacheState::Downloading);
        assert!(p.entries[0].message.as_deref().unwrap().contains("verdict"));
        assert_eq!(plan(&w, &running, 2, now).stop, [key("m")]);

        c.status = Some(ModelCacheStatus {
            verified_digest: Some(digest.clone()),
            ..ModelCacheStatus::default()
        });
        let w = wanted(std::slice::from_ref(&c), None);
        assert_eq!(plan(&w, &BTreeMap::new(), 2, now).start.len(), 1);
        assert!(plan(&w, &running, 2, now).stop.is_empty());

        c.status = Some(ModelCacheStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Verified".into(),
                status: "False".into(),
                reason: reasons::VERIFICATION_FAILED.into(),
                message: "no signature found".into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: Some(1),
            }],
            ..ModelCacheStatus::default()
        });
        let w = wanted(std::slice::from_ref(&c), None);
        let p = plan(&w, &BTreeMap::new(), 2, now);
        assert!(p.start.is_empty());
        assert_eq!(
            (p.entries[0].state, p.entries[0].reason),
            (ModelCacheState::Failed, reasons::VERIFICATION_FAILED)
        );
        assert!(
            p.entries[0]
                .message
                .as_deref()
                .unwrap()
                .contains("no signature found")
        );
        assert_eq!(plan(&w, &running, 2, now).stop, [key("m")], "stopped");
    }

    fn want(name: &str, generation: i64) -> Wanted {
        let mut c = cache(name, &format!("hf://o/{name}"), None);
        c.metadata.generation = Some(generation);
        wanted(&[c], None).remove(0)
    }

    fn key(name: &str) -> Key {
        Key {
            namespace: "ml".into(),
            name: name.into(),
        }
    }

    #[test]
    fn downloads_are_bounded_failures_wait_and_new_generations_download_again() {
        let now = Instant::now();
        let wanted = [want("a", 1), want("b", 1), want("c", 2), want("d", 1)];
        let known = BTreeMap::from([
            (key("a"), Known::Running { generation: 1 }),
            (
                key("b"),
                Known::Failed {
                    generation: 1,
                    reason: reasons::GATED,
                    message: "gated".into(),
                    commit: None,
                    retry_at: now + Duration::from_secs(10),
                },
            ),
            (key("c"), Known::Running { generation: 1 }),
            (key("gone"), Known::Running { generation: 1 }),
        ]);
        let p = plan(&wanted, &known, 2, now);
        assert_eq!(p.stop, [key("c"), key("gone")]);
        assert_eq!(
            p.start
                .iter()
                .map(|w| w.key.name.as_str())
                .collect::<Vec<_>>(),
            ["c"],
            "one slot left beside a"
        );
        let by_name = |n: &str| p.entries.iter().find(|e| e.key.name == n).unwrap();
        assert_eq!(by_name("b").reason, reasons::GATED);
        assert_eq!(by_name("b").state, ModelCacheState::Failed);
        assert!(by_name("d").message.as_deref().unwrap().contains("slot"));
        assert_eq!(by_name("d").state, ModelCacheState::Downloading);

        // The retry is due: downloaded again.
        let later = now + Duration::from_secs(11);
        let p = plan(&wanted[1..2], &known, 2, later);
        assert_eq!(p.start.len(), 1);

        let ready = BTreeMap::from([(
            key("a"),
            Known::Ready {
                generation: 1,
                commit: "c0".into(),
                bytes: 7,
                checked: now,
            },
        )]);
        let p = plan(&wanted[..1], &ready, 1, now);
        assert!(p.start.is_empty() && p.stop.is_empty());
        assert_eq!(p.entries[0].state, ModelCacheState::Ready);
        assert_eq!(p.entries[0].commit.as_deref(), Some("c0"));
        assert_eq!(p.entries[0].bytes, Some(7));
    }

    #[test]
    fn events_are_published_for_transitions_only() {
        let at = |state, message: &str| NodeModelCache {
            namespace: "ml".into(),
            name: "qwen".into(),
            state,
            reason: Some(reasons::GATED.into()),
            message: Some(message.into()),
            commit: Some("c1".into()),
            bytes_total: Some(9),
            ..NodeModelCache::default()
        };
        let downloading = at(ModelCacheState::Downloading, "");
        let ready = at(ModelCacheState::Ready, "");
        let failed = at(ModelCacheState::Failed, "no token");
        assert_eq!(event(None, &downloading, "n"), None);
        let (reason, warning, note) = event(Some(&downloading), &ready, "n").unwrap();
        assert_eq!((reason, warning), (events::DOWNLOADED, false));
        assert_eq!(note, "c1 ready on node n (9 bytes)");
        assert_eq!(event(Some(&ready), &ready, "n"), None);
        let (reason, warning, note) = event(None, &failed, "n").unwrap();
        assert_eq!((reason, warning), (events::DOWNLOAD_FAILED, true));
        assert_eq!(note, "on node n: GatedRepo: no token");
        assert_eq!(event(Some(&failed), &failed, "n"), None);
        assert!(event(Some(&failed), &at(ModelCacheState::Failed, "other"), "n").is_some());
    }

    #[test]
    fn oci_errors_have_their_reasons() {
        use kubeairunway_kernelcache_artifact::registry::RegistryError;
        let registry = |message: &str, not_found| {
            ModelError::Registry(RegistryError {
                transient: false,
                not_found,
                message: message.into(),
            })
        };
        let cases = [
            (
                registry(
                    "layer sha256:a: content digest is sha256:b, expected sha256:a (digest mismatch)",
                    false,
                ),
                reasons::VERIFICATION_FAILED,
            ),
            (registry("manifest: 404", true), reasons::NOT_FOUND),
            (
                registry("connection refused", false),
                reasons::DOWNLOAD_FAILED,
            ),
            (
                ModelError::Plan(PlanError::UnsupportedMediaType {
                    digest: "d".into(),
                    media_type: "application/zip".into(),
                    why: String::new(),
                }),
                reasons::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                ModelError::Plan(PlanError::NotAModel {
                    artifact_type: String::new(),
                    config: "application/vnd.oci.image.config.v1+json".into(),
                }),
                reasons::INVALID_ARTIFACT,
            ),
            (
                ModelError::Extract(ExtractError::ParentDir("../x".into())),
                reasons::UNSAFE_ARCHIVE,
            ),
            (
                ModelError::Extract(ExtractError::TooLarge { limit: 1 }),
                reasons::UNSAFE_ARCHIVE,
            ),
            (ModelError::Io("disk".into()), reasons::DOWNLOAD_FAILED),
        ];
        for (error, expected) in cases {
            assert_eq!(oci_reason(&error), expected, "{error}");
        }
    }

    #[test]
    fn budgets_and_hub_errors_have_their_reasons() {
        assert!(check_budget(10, None).is_ok());
        assert!(check_budget(10, Some(10)).is_ok());
        let (why, message) = check_budget(11, Some(10)).unwrap_err();
        assert_eq!(why, reasons::OVER_BUDGET);
        assert!(
            message.contains("11") && message.contains("10"),
            "{message}"
        );
        let gated = HubError::Gated {
            repo: "o/m".into(),
            with_token: true,
        };
        assert_eq!(reason(&gated), reasons::GATED);
        let space = HubError::NoSpace {
            dir: "/x".into(),
            needed: 2,
            available: 1,
        };
        assert_eq!(reason(&space), reasons::NO_SPACE);
        let gone = HubError::RepoNotFound { repo: "o/m".into() };
        assert_eq!(reason(&gone), reasons::NOT_FOUND);
        let fs = Filesystem {
            total: 1000,
            free: 300,
        };
        assert!(check_space(250, fs, Size::Percent(5)).is_ok());
        let (why, message) = check_space(251, fs, Size::Percent(5)).unwrap_err();
        assert_eq!(why, reasons::NO_SPACE);
        assert!(
            message.contains("250 available") && message.contains("50 kept free"),
            "{message}"
        );
        assert!(check_space(1, fs, Size::Percent(100)).is_err());
        assert!(
            check_space(0, fs, Size::Percent(100)).is_ok(),
            "nothing missing: no check"
        );
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(30), Duration::from_secs(600));
    }

    #[test]
    fn only_a_bounded_cache_with_bytes_missing_waits_for_a_slot() {
        assert!(needs_slot(Some(1), 1));
        // Complete on disk (a restarted agent): no slot needed.
        assert!(!needs_slot(Some(1), 0));
        // Not bounded across nodes.
        assert!(!needs_slot(None, 1 << 30));
        let m = queued_message(2, 42);
        assert!(
            m.contains("at most 2 node(s)") && m.contains("maxNodes") && m.contains("42 bytes"),
            "{m}"
        );
        let mut c = cache("q", "hf://o/q", None);
        assert_eq!(wanted(&[c.clone()], None)[0].max_nodes, None);
        c.spec.download =
            Some(kubeairunway_kernelcache_api::model::DownloadSpec { max_nodes: Some(3) });
        assert_eq!(wanted(&[c], None)[0].max_nodes, Some(3));
    }

    #[test]
    fn a_moving_revision_is_resolved_again_when_due_and_stays_ready_meanwhile() {
        let now = Instant::now();
        let hour = Some(Duration::from_secs(3600));
        let w = want("a", 1);
        let ready = |checked| {
            BTreeMap::from([(
                key("a"),
                Known::Ready {
                    generation: 1,
                    commit: "c0".into(),
                    bytes: 7,
                    checked,
                },
            )])
        };
        assert!(due_refreshes(std::slice::from_ref(&w), &ready(now), now, hour).is_empty());
        let later = now + Duration::from_secs(3601);
        assert_eq!(
            due_refreshes(std::slice::from_ref(&w), &ready(now), later, hour),
            [key("a")]
        );
        // Off, a commit, an oci:// digest, another generation: never.
        assert!(due_refreshes(std::slice::from_ref(&w), &ready(now), later, None).is_empty());
        assert!(
            due_refreshes(
                std::slice::from_ref(&w),
                &ready(now),
                later,
                Some(Duration::ZERO)
            )
            .is_empty()
        );
        let pinned = Wanted {
            revision: "0123456789abcdef0123456789abcdef01234567".into(),
            ..w.clone()
        };
        assert!(is_commit(&pinned.revision) && !is_commit("main"));
        assert!(due_refreshes(&[pinned], &ready(now), later, hour).is_empty());
        let oci = Wanted {
            oci: Some("r/m@sha256:ab".into()),
            ..w.clone()
        };
        assert!(due_refreshes(&[oci], &ready(now), later, hour).is_empty());
        assert!(due_refreshes(&[want("a", 2)], &ready(now), later, hour).is_empty());

        // Due with a slot: a refresh starts, the entry stays Ready at the commit in use.
        let due = BTreeMap::from([(
            key("a"),
            Known::RefreshDue {
                generation: 1,
                commit: "c0".into(),
                bytes: 7,
            },
        )]);
        let p = plan(std::slice::from_ref(&w), &due, 1, later);
        assert_eq!(p.start.len(), 1);
        let e = &p.entries[0];
        assert_eq!(
            (e.state, e.reason, e.commit.as_deref(), e.bytes),
            (
                ModelCacheState::Ready,
                reasons::REFRESHING,
                Some("c0"),
                Some(7)
            )
        );
        assert!(e.message.as_deref().unwrap().contains("stays in use"));
        // Due, no slot: Ready as it is, nothing started.
        let busy = BTreeMap::from([
            (key("a"), due[&key("a")].clone()),
            (key("b"), Known::Running { generation: 1 }),
        ]);
        let p = plan(&[w.clone(), want("b", 1)], &busy, 1, later);
        assert!(p.start.is_empty());
        assert_eq!(
            (p.entries[0].state, p.entries[0].reason),
            (ModelCacheState::Ready, reasons::READY)
        );
        // Running: Ready/Refreshing, counted as a download, stopped on a new generation.
        let refreshing = BTreeMap::from([(
            key("a"),
            Known::Refreshing {
                generation: 1,
                commit: "c0".into(),
                bytes: 7,
            },
        )]);
        let p = plan(&[w.clone(), want("b", 1)], &refreshing, 1, later);
        assert_eq!(p.entries[0].reason, reasons::REFRESHING);
        assert!(p.start.is_empty(), "the refresh takes the one slot");
        assert_eq!(
            plan(&[want("a", 2)], &refreshing, 1, later).stop,
            [key("a")]
        );

        // A refused access fails the cache; anything else keeps the commit in use.
        for refused in [
            reasons::GATED,
            reasons::UNAUTHORIZED,
            reasons::CREDENTIALS_MISSING,
        ] {
            assert!(!refresh_keeps(refused), "{refused}");
        }
        for kept in [
            reasons::DOWNLOAD_FAILED,
            reasons::NOT_FOUND,
            reasons::OVER_BUDGET,
            reasons::NO_SPACE,
        ] {
            assert!(refresh_keeps(kept), "{kept}");
        }
        // Done: the new commit; failed: the commit in use, checked again either way.
        assert_eq!(
            after_refresh(1, ("c0".into(), 7), Ok(("c1".into(), 9)), later),
            Known::Ready {
                generation: 1,
                commit: "c1".into(),
                bytes: 9,
                checked: later
            }
        );
        assert_eq!(
            after_refresh(1, ("c0".into(), 7), Err(()), later),
            Known::Ready {
                generation: 1,
                commit: "c0".into(),
                bytes: 7,
                checked: later
            }
        );
    }

    #[test]
    fn a_refresh_to_a_new_commit_is_published_as_a_download() {
        let at = |commit: &str| NodeModelCache {
            namespace: "ml".into(),
            name: "qwen".into(),
            state: ModelCacheState::Ready,
            commit: Some(commit.into()),
            ..NodeModelCache::default()
        };
        assert!(event(Some(&at("c0")), &at("c0"), "n").is_none());
        let (reason, warning, note) = event(Some(&at("c0")), &at("c1"), "n").unwrap();
        assert_eq!((reason, warning), (events::DOWNLOADED, false));
        assert!(note.contains("c1"), "{note}");
    }
}
