//! The model-cache kind of `cache.kubeairunway.ai/v1alpha1`: `ModelCache` (model weights a
//! user wants on the nodes' disks), and what one node reports of each in its
//! `KernelCacheNode` ([`NodeModelCache`], in `status.modelCaches`). The condition types
//! and reasons every model-cache component writes are constants ([`conditions`],
//! [`reasons`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The source scheme of Hugging Face models (`hf://org/name`).
pub const HF_SCHEME: &str = "hf://";
/// The source scheme of OCI model artifacts (`oci://registry/repo@sha256:...`: a ModelPack
/// artifact or a KitOps ModelKit, pulled by digest into the Hugging Face layout).
pub const OCI_SCHEME: &str = "oci://";
/// The revision when none is given.
pub const DEFAULT_REVISION: &str = "main";
/// The key of the credentials Secret holding the hub token when none is given.
pub const DEFAULT_TOKEN_KEY: &str = "token";
/// The controller's finalizer on every ModelCache: its deletion waits while a
/// ModelDeployment uses it, then its volume and claim go before the object does.
pub const FINALIZER: &str = "cache.kubeairunway.ai/model-cache";

/// The condition types of a ModelCache.
pub mod conditions {
    /// The spec can be acted on (a source scheme that is implemented, a valid budget).
    pub const ACCEPTED: &str = "Accepted";
    /// At least one node holds the resolved commit.
    pub const READY: &str = "Ready";
    /// Deleted, and held: ModelDeployments still use it (reason `InUse`).
    pub const DELETING: &str = "Deleting";
    /// `oci://` sources: whether the nodes may pull the pinned digest (the controller's
    /// verdict under the cluster's `KernelCachePolicy`; `DigestOnly` without one).
    pub const VERIFIED: &str = "Verified";
}

/// The reasons of the conditions and of the per-node states.
pub mod reasons {
    /// `Accepted=True`.
    pub const ACCEPTED: &str = "Accepted";
    /// A layer media type of an `oci://` artifact the agents do not read (anything but
    /// the ModelPack and KitOps layer types: a `zip` packing, a `v2` type, a container
    /// image's layer).
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "UnsupportedMediaType";
    /// An `oci://` artifact whose manifest is not a model's (neither ModelPack nor KitOps)
    /// or whose layers cannot be laid out (a raw layer without a safe file path, two
    /// layers at one path, a digest that is not sha256).
    pub const INVALID_ARTIFACT: &str = "InvalidArtifact";
    /// An `oci://` source from a registry the agents' `--allowed-registry` list leaves out.
    pub const REGISTRY_NOT_ALLOWED: &str = "RegistryNotAllowed";
    /// A tar layer of an `oci://` artifact that extraction refused (absolute paths, `..`,
    /// links, special files, over the size caps).
    pub const UNSAFE_ARCHIVE: &str = "UnsafeArchive";
    /// A spec field that cannot be used (a repository id, a budget).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// `Ready=True`, and a node's `Ready` state.
    pub const READY: &str = "Ready";
    /// Nodes are downloading, none is ready yet.
    pub const DOWNLOADING: &str = "Downloading";
    /// A node's state `Downloading` while it waits for a download slot across nodes
    /// (`spec.download.maxNodes`): its files are incomplete, and the controller has not
    /// granted it a slot yet.
    pub const DOWNLOAD_QUEUED: &str = "DownloadQueued";
    /// A node's state `Ready` while its agent resolves a moving revision (a branch or a
    /// tag) again and downloads its new commit, if any, next to the commit in use.
    pub const REFRESHING: &str = "Refreshing";
    /// Every node that reports the cache failed.
    pub const FAILED: &str = "Failed";
    /// No node reports the cache (none matches the nodeSelector, or no agent runs there).
    pub const NO_NODES: &str = "NoNodes";
    /// The model does not fit the node's free space.
    pub const NO_SPACE: &str = "NoSpace";
    /// The model is larger than `spec.storageBudget`.
    pub const OVER_BUDGET: &str = "OverBudget";
    /// A gated repository and no token, or a token without access to it.
    pub const GATED: &str = "GatedRepo";
    /// The hub refused the token (`401`/`403`).
    pub const UNAUTHORIZED: &str = "Unauthorized";
    /// No such repository, revision or file (or a private one the token cannot see).
    pub const NOT_FOUND: &str = "NotFound";
    /// The credentials Secret (or its handed-over copy) is missing or has no token.
    pub const CREDENTIALS_MISSING: &str = "CredentialsMissing";
    /// The content did not match its digest or size (the hub's, or the registry's), or
    /// (`oci://`) no signature of the pinned digest satisfied the `KernelCachePolicy`.
    pub const VERIFICATION_FAILED: &str = "VerificationFailed";
    /// `Verified=True` of an `oci://` source: a signature satisfied the policy.
    pub const VERIFIED: &str = "Verified";
    /// `Verified=True` of an `oci://` source: the policy disables verification.
    pub const VERIFICATION_DISABLED: &str = "VerificationDisabled";
    /// `Verified=True` of an `oci://` source: no `KernelCachePolicy` applies, the nodes
    /// pull it by its digest only.
    pub const DIGEST_ONLY: &str = "DigestOnly";
    /// Any other failure (the hub unreachable, the disk): retried with backoff.
    pub const DOWNLOAD_FAILED: &str = "DownloadFailed";
    /// `Deleting=True`: ModelDeployments of its namespace still use it.
    pub const IN_USE: &str = "InUse";
}

/// The reasons of a ModelDeployment's `ModelCacheReady` condition.
pub mod deployment_reasons {
    /// `True`: its serving pods mount a Ready cache.
    pub const READY: &str = "ModelCacheReady";
    /// The cache it names (`spec.model.cacheRef`) does not exist.
    pub const NOT_FOUND: &str = "ModelCacheNotFound";
    /// The cache it names, or one holding its model, is not Ready yet.
    pub const NOT_READY: &str = "ModelCacheNotReady";
}

/// Model weights downloaded onto the disks of the nodes a selector picks.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cache.kubeairunway.ai",
    version = "v1alpha1",
    kind = "ModelCache",
    plural = "modelcaches",
    shortname = "mc",
    namespaced,
    status = "ModelCacheStatus",
    doc = "Model weights (a Hugging Face repository at a revision, or an OCI model artifact pinned to a digest) downloaded by the node agents into the standard Hugging Face cache layout on the disks of the nodes a selector picks.",
    printcolumn = r#"{"name":"Source","type":"string","jsonPath":".spec.source"}"#,
    printcolumn = r#"{"name":"Commit","type":"string","jsonPath":".status.resolvedCommit"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyNodes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.source.startsWith('hf://') || self.source.startsWith('oci://')", "message": "source must be hf://org/name or oci://registry/repo@digest"},
    {"rule": "!self.source.startsWith('hf://') || self.source.matches('^hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$')", "message": "an hf:// source is hf://org/name"},
    {"rule": "!self.source.startsWith('oci://') || self.source.matches('^oci://[^@]+@sha256:[0-9a-f]{64}$')", "message": "an oci:// source is pinned to a digest: oci://registry/repo@sha256:<64 hex>"},
    {"rule": "!has(self.modelId) || self.source.startsWith('oci://')", "message": "modelId is for oci:// sources (an hf:// source's model id is its repository)"},
    {"rule": "!self.source.startsWith('oci://') || !has(self.credentialsSecretRef) || !has(self.credentialsSecretRef.key)", "message": "credentialsSecretRef of an oci:// source names a kubernetes.io/dockerconfigjson Secret, without key"},
    {"rule": "!self.source.startsWith('oci://') || !has(self.include)", "message": "include is for hf:// sources; an oci:// artifact is pulled whole"}
]))]
pub struct ModelCacheSpec {
    /// The model: `hf://org/name` (a Hugging Face repository), or
    /// `oci://registry/repo@sha256:...` (a ModelPack artifact or a KitOps ModelKit, pinned
    /// to its manifest digest).
    #[schemars(length(min = 1, max = 512))]
    pub source: String,
    /// The model id an `oci://` source is published as in the Hugging Face layout (what a
    /// ModelDeployment's `model.id` names and engines are given); unset: the last two
    /// segments of its repository (`oci://reg/models/acme/tiny@...` is `acme/tiny`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 193),
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
    )]
    pub model_id: Option<String>,
    /// The revision (branch, tag or commit) of an `hf://` source; `main` when unset. For
    /// an `oci://` source, the ref (`refs/<revision>`) that names its snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub revision: Option<String>,
    /// Only the files matching one of these patterns (fnmatch: `*` crosses `/`; a pattern
    /// ending in `/` means a folder's files); empty: every file of the revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// A Secret in this namespace holding the hub token (an `hf://` source: a gated or
    /// private repository), or the registry credentials (an `oci://` source: a
    /// `kubernetes.io/dockerconfigjson` Secret with an entry for its registry; no `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<CredentialsSecretRef>,
    /// Download only on nodes with these labels; unset: every node an agent runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// The most this model may take on each node's disk (a quantity in bytes, without
    /// fraction: `20Gi`, `500M`); a revision larger than this fails on every node with
    /// `OverBudget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "budget_schema")]
    pub storage_budget: Option<Quantity>,
    /// How the nodes download it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<DownloadSpec>,
}

/// How the nodes download a ModelCache.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DownloadSpec {
    /// At most this many nodes download the cache at once (the controller grants the
    /// slots; a node whose files are complete needs none); unset: no bound across nodes,
    /// each node downloads as soon as its agent has a slot of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_nodes: Option<i32>,
}

/// A budget: a quantity string the agents parse exactly (no fractions or exponents).
fn budget_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "pattern": "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$",
    })
}

impl ModelCacheSpec {
    /// The bound across nodes on concurrent downloads (`download.maxNodes`), when there
    /// is one (a value below 1, which admission refuses, counts as 1).
    pub fn max_nodes(&self) -> Option<u32> {
        self.download
            .as_ref()
            .and_then(|d| d.max_nodes)
            .map(|n| u32::try_from(n).unwrap_or(0).max(1))
    }

    /// The revision asked for (`main` when unset).
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }

    /// The model id the cache provides: an `hf://` source's repository, an `oci://`
    /// source's `modelId` or [`oci_model_id`] of its reference.
    pub fn model(&self) -> Result<String, String> {
        match parse_source(&self.source)? {
            Source::Hf(repo) => Ok(repo),
            Source::Oci(reference) => Ok(self
                .model_id
                .clone()
                .unwrap_or_else(|| oci_model_id(&reference))),
        }
    }
}

/// The model id of an OCI reference (`registry/repo@digest`) that names none: the last
/// two segments of its repository (`reg/models/acme/tiny@...` is `acme/tiny`), or its
/// only one.
pub fn oci_model_id(reference: &str) -> String {
    let name = reference.split('@').next().unwrap_or(reference);
    let repository = name.split_once('/').map_or(name, |(_, repo)| repo);
    let mut parts: Vec<&str> = repository.split('/').collect();
    if let Some(last) = parts.last_mut() {
        *last = last.split(':').next().unwrap_or(last);
    }
    parts[parts.len().saturating_sub(2)..].join("/")
}

/// The Secret holding the hub token.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSecretRef {
    /// The Secret's name (in the ModelCache's namespace).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key holding the token; `token` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl CredentialsSecretRef {
    /// The key holding the token.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(DEFAULT_TOKEN_KEY)
    }
}

/// What the cluster knows about a ModelCache, added up from the nodes' reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheStatus {
    /// The commit the revision resolved to on the nodes that are ready (the most recent
    /// one the nodes report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_commit: Option<String>,
    /// Bytes of the files downloaded (each node downloads the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Nodes where the resolved commit is ready.
    #[serde(default)]
    pub ready_nodes: i32,
    /// Nodes downloading.
    #[serde(default)]
    pub downloading_nodes: i32,
    /// Nodes where the download failed.
    #[serde(default)]
    pub failed_nodes: i32,
    /// Node names per state (`Ready`, `Downloading`, `Failed`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nodes: BTreeMap<String, Vec<String>>,
    /// Conditions (`Accepted`, `Ready`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "kubeairunway_sdk::api::schema::conditions")]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The PersistentVolumeClaim in this namespace that serving pods mount (read-only),
    /// bound to a local PersistentVolume on the nodes where the cache is ready; set once
    /// a node is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// `oci://` sources: the verdict on the pinned digest's signature under the cluster's
    /// `KernelCachePolicy` (the KernelCache status's field; mode `disabled` and a message
    /// saying so when no policy applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<crate::verification::Verification>,
    /// `oci://` sources: the manifest digest the nodes may pull, set only once its verdict
    /// lets them (a signature satisfied the policy, the policy disables verification, or
    /// no policy applies: digest only). The agents pull nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_digest: Option<String>,
}

/// Whether the agents may pull an `oci://` cache, from the controller's verdict in its
/// status ([`pull_verdict`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullVerdict {
    /// The pinned digest passed (or the source is not `oci://`: nothing to verify).
    Allowed,
    /// No verdict on the pinned digest yet: wait for the controller.
    Pending,
    /// The controller refused the pinned digest (the `Verified` condition's message).
    Refused(String),
}

/// Whether the agents may pull `cache`: an `oci://` source only once the controller
/// recorded its pinned digest in `status.verifiedDigest`; refused when the `Verified`
/// condition of the current generation is `False`; else pending. The one rule the agents
/// pull by.
pub fn pull_verdict(cache: &ModelCache) -> PullVerdict {
    let Ok(Source::Oci(reference)) = parse_source(&cache.spec.source) else {
        return PullVerdict::Allowed;
    };
    let digest = reference.rsplit_once('@').map(|(_, d)| d);
    let Some(status) = &cache.status else {
        return PullVerdict::Pending;
    };
    if digest.is_some() && status.verified_digest.as_deref() == digest {
        return PullVerdict::Allowed;
    }
    let refused = status.conditions.iter().find(|c| {
        c.type_ == conditions::VERIFIED
            && c.status == "False"
            && c.observed_generation.is_some()
            && c.observed_generation == cache.metadata.generation
    });
    match refused {
        Some(c) => PullVerdict::Refused(c.message.clone()),
        None => PullVerdict::Pending,
    }
}

/// The state of one model cache on one node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ModelCacheState {
    /// Being resolved, checked and downloaded (or waiting for a download slot).
    #[default]
    Downloading,
    /// The snapshot of `commit` is complete on the node's disk.
    Ready,
    /// The download failed (see the reason); retried with backoff.
    Failed,
}

impl ModelCacheState {
    /// The state's name, as in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Downloading => "Downloading",
            Self::Ready => "Ready",
            Self::Failed => "Failed",
        }
    }
}

/// One model cache on one node, as its agent reports it (`status.modelCaches` of the
/// node's KernelCacheNode, owned by the field manager `modelcache-agent`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeModelCache {
    /// Namespace of the ModelCache.
    pub namespace: String,
    /// Name of the ModelCache.
    pub name: String,
    /// The ModelCache's generation this entry is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The commit the revision resolved to, once resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// `Downloading`, `Ready` or `Failed`.
    pub state: ModelCacheState,
    /// Why (a constant of the model-cache reasons: `NoSpace`, `OverBudget`, `GatedRepo`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Detail of the state (the failure, for `Failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Bytes on disk of the files to download (complete and partial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_done: Option<i64>,
    /// Bytes of the files to download, once resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<i64>,
    /// When the state last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// A ModelCache source, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A Hugging Face repository (`org/name`).
    Hf(String),
    /// An OCI model artifact (`registry/repo@sha256:...`).
    Oci(String),
}

/// Parses `source` (the CRD's validation refuses the rest at admission; this is the same
/// check for objects that bypassed it). The error is a message for `InvalidSpec`.
pub fn parse_source(source: &str) -> Result<Source, String> {
    if let Some(repo) = source.strip_prefix(HF_SCHEME) {
        let valid_part = |p: &str| {
            !p.is_empty()
                && p.starts_with(|c: char| c.is_ascii_alphanumeric())
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        return match repo.split_once('/') {
            Some((org, name)) if valid_part(org) && valid_part(name) => {
                Ok(Source::Hf(repo.to_string()))
            }
            _ => Err(format!(
                "source {source:?}: an hf:// source is hf://org/name"
            )),
        };
    }
    if let Some(reference) = source.strip_prefix(OCI_SCHEME) {
        return Ok(Source::Oci(reference.to_string()));
    }
    Err(format!(
        "source {source:?}: expected hf://org/name or oci://registry/repo@digest"
    ))
}

/// Whether a ModelDeployment whose model is `model` may use `cache` (of its namespace):
/// it names the cache in `cacheRef`, or names none and serves the cache's model (an
/// `hf://` repository, an `oci://` source's model id) at revision `main` (the revision the
/// engines load). The one rule the pod webhook mounts
/// by and the controller holds a cache's deletion by.
pub fn model_uses(
    model: &kubeairunway_sdk::api::ModelSpec,
    cache_name: &str,
    cache: &ModelCacheSpec,
) -> bool {
    if let Some(named) = &model.cache_ref {
        return named.name == cache_name;
    }
    if model.source != kubeairunway_sdk::api::ModelSource::Huggingface {
        return false;
    }
    let Some(id) = model.id.as_deref() else {
        return false;
    };
    cache.model().is_ok_and(|m| m == id) && cache.revision() == DEFAULT_REVISION
}

/// A Ready cache a ModelDeployment's pods mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    /// The ModelCache's name.
    pub name: String,
    /// Its claim in the ModelDeployment's namespace.
    pub claim: String,
    /// The model id it provides in the Hugging Face layout (`org/name`).
    pub repo: String,
    /// The commit its ready nodes hold.
    pub commit: String,
    /// Nodes where it is ready.
    pub ready_nodes: i32,
    /// The one GGUF file its `include` names ([`single_gguf`]), for llama.cpp.
    pub gguf: Option<String>,
}

/// Why a ModelDeployment's pods mount no model cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotChosen {
    /// The cache it names does not exist.
    NotFound(String),
    /// The cache it names, or the first that holds its model, is not Ready (its name).
    NotReady(String),
    /// It names none and no cache holds its model.
    NoCache,
}

/// The cache's claim, repository and commit when it is Ready for its current generation
/// with at least one ready node and its claim made.
pub fn ready(cache: &ModelCache) -> Option<Chosen> {
    let status = cache.status.as_ref()?;
    let current = status.observed_generation == cache.metadata.generation;
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::READY && c.status == "True");
    if !current || !ready || status.ready_nodes < 1 {
        return None;
    }
    let Ok(repo) = cache.spec.model() else {
        return None;
    };
    Some(Chosen {
        name: cache.metadata.name.clone().unwrap_or_default(),
        claim: status.claim_name.clone()?,
        repo,
        commit: status.resolved_commit.clone().unwrap_or_default(),
        ready_nodes: status.ready_nodes,
        gguf: single_gguf(&cache.spec.include),
    })
}

/// The one GGUF file `include` names, when it names exactly one and no pattern could
/// select another: one pattern that is a literal path ending in `.gguf` (no `*`, `?`,
/// `[`), and every other pattern ending in a literal that is not `.gguf` (`*.json`,
/// `tokenizer.model`). A wildcard GGUF pattern (`*Q4_K_M.gguf`), a folder (`sub/`), a
/// pattern ending in a wildcard, or no `include` at all (every file) name none: which
/// file is on the nodes is then not known from the spec.
pub fn single_gguf(include: &[String]) -> Option<String> {
    let is_gguf = |p: &str| p.to_ascii_lowercase().ends_with(".gguf");
    let wild = |p: &str| p.contains(['*', '?', '[']);
    let mut found = None;
    for p in include {
        let last = p.chars().last()?;
        if is_gguf(p) && !wild(p) {
            if found.replace(p.clone()).is_some() {
                return None;
            }
        } else if is_gguf(p) || matches!(last, '*' | '?' | ']' | '/') {
            return None;
        }
    }
    found
}

/// The cache the pods of a ModelDeployment whose model is `model` mount, among `caches`
/// (those of its namespace): the one it names, else the first Ready one by name of those
/// it [`model_uses`]. The one rule the pod webhook mounts by and the controller reports
/// (`ModelCacheReady`) by.
pub fn choose<C: std::borrow::Borrow<ModelCache>>(
    model: &kubeairunway_sdk::api::ModelSpec,
    caches: &[C],
) -> Result<Chosen, NotChosen> {
    let name = |c: &ModelCache| c.metadata.name.clone().unwrap_or_default();
    if let Some(named) = &model.cache_ref {
        let cache = caches
            .iter()
            .map(std::borrow::Borrow::borrow)
            .find(|c| name(c) == named.name)
            .ok_or_else(|| NotChosen::NotFound(named.name.clone()))?;
        return ready(cache).ok_or_else(|| NotChosen::NotReady(named.name.clone()));
    }
    let mut matching: Vec<&ModelCache> = caches
        .iter()
        .map(std::borrow::Borrow::borrow)
        .filter(|c| model_uses(model, &name(c), &c.spec))
        .collect();
    matching.sort_by_key(|c| name(c));
    if let Some(chosen) = matching.iter().find_map(|c| ready(c)) {
        return Ok(chosen);
    }
    Err(matching
        .first()
        .map_or(NotChosen::NoCache, |c| NotChosen::NotReady(name(c))))
}

/// The key of a ModelCache's download slot in `KernelCacheNode.spec.modelDownloads`:
/// `<namespace>/<name>`.
pub fn slot_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Whether `grants` (a node's `spec.modelDownloads`) hold a download slot for the cache
/// `namespace/name` at `generation`: a slot granted for another generation is not one.
pub fn slot_granted(
    grants: Option<&BTreeMap<String, i64>>,
    namespace: &str,
    name: &str,
    generation: i64,
) -> bool {
    grants
        .and_then(|g| g.get(&slot_key(namespace, name)))
        .is_some_and(|g| *g == generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(name: &str, source: &str, ready_nodes: i32) -> ModelCache {
        let mut c = ModelCache::new(
            name,
            ModelCacheSpec {
                source: source.into(),
                ..ModelCacheSpec::default()
            },
        );
        c.metadata.generation = Some(1);
        c.status = Some(ModelCacheStatus {
            claim_name: Some(format!("modelcache-{name}")),
            resolved_commit: Some("abc".into()),
            ready_nodes,
            observed_generation: Some(1),
            conditions: vec![Condition {
                type_: conditions::READY.into(),
                status: if ready_nodes > 0 { "True" } else { "False" }.into(),
                reason: reasons::DOWNLOADING.into(),
                message: String::new(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: Some(1),
            }],
            ..ModelCacheStatus::default()
        });
        c
    }

    /// The named cache, else the first Ready one of the model by name; a cache that holds
    /// the model but is not Ready is named in the refusal, so a user learns why.
    #[test]
    fn choose_names_the_cache_and_why_it_is_not_used() {
        use kubeairunway_sdk::api::{ModelCacheRef, ModelSpec};
        let model = |id: &str, named: Option<&str>| ModelSpec {
            id: Some(id.into()),
            cache_ref: named.map(|n| ModelCacheRef { name: n.into() }),
            ..ModelSpec::default()
        };
        let caches = [
            cache("a-qwen", "hf://Qwen/Qwen3", 0),
            cache("b-qwen", "hf://Qwen/Qwen3", 2),
            cache("c-llama", "hf://meta/llama", 0),
        ];
        let chosen = choose(&model("Qwen/Qwen3", None), &caches).unwrap();
        assert_eq!(
            chosen,
            Chosen {
                name: "b-qwen".into(),
                claim: "modelcache-b-qwen".into(),
                repo: "Qwen/Qwen3".into(),
                commit: "abc".into(),
                ready_nodes: 2,
                gguf: None,
            }
        );
        assert_eq!(
            choose(&model("meta/llama", None), &caches),
            Err(NotChosen::NotReady("c-llama".into()))
        );
        assert_eq!(
            choose(&model("x/y", None), &caches),
            Err(NotChosen::NoCache)
        );
        assert_eq!(
            choose(&model("Qwen/Qwen3", Some("a-qwen")), &caches),
            Err(NotChosen::NotReady("a-qwen".into()))
        );
        assert_eq!(
            choose(&model("Qwen/Qwen3", Some("gone")), &caches),
            Err(NotChosen::NotFound("gone".into()))
        );
        assert_eq!(
            choose(&model("x/y", Some("b-qwen")), &caches).unwrap().name,
            "b-qwen",
            "a named cache is used whatever the model id"
        );
        // Another revision than the engines load holds no model of an unnamed cache; a
        // status of an older generation is not Ready.
        let mut pinned = cache("c", "hf://Qwen/Qwen3", 1);
        pinned.spec.revision = Some("v2".into());
        assert_eq!(
            choose(&model("Qwen/Qwen3", None), &[pinned]),
            Err(NotChosen::NoCache)
        );
        let mut stale = cache("c", "hf://Qwen/Qwen3", 1);
        stale.metadata.generation = Some(2);
        assert_eq!(
            choose(&model("Qwen/Qwen3", Some("c")), &[stale]),
            Err(NotChosen::NotReady("c".into()))
        );
    }

    /// A named cache is used by name only; else an `hf://` cache of the model's id at
    /// `main` is; another revision, another model or `source: custom` is not.
    #[test]
    fn a_model_deployment_uses_the_cache_it_names_or_its_model_at_main() {
        use kubeairunway_sdk::api::{ModelCacheRef, ModelSource, ModelSpec};
        let spec = |source: &str, revision: Option<&str>| ModelCacheSpec {
            source: source.into(),
            revision: revision.map(Into::into),
            ..ModelCacheSpec::default()
        };
        let by_id = ModelSpec {
            id: Some("acme/tiny".into()),
            source: ModelSource::Huggingface,
            ..ModelSpec::default()
        };
        assert!(model_uses(&by_id, "a", &spec("hf://acme/tiny", None)));
        assert!(model_uses(
            &by_id,
            "a",
            &spec("hf://acme/tiny", Some("main"))
        ));
        assert!(!model_uses(
            &by_id,
            "a",
            &spec("hf://acme/tiny", Some("v2"))
        ));
        assert!(!model_uses(&by_id, "a", &spec("hf://acme/other", None)));
        let custom = ModelSpec {
            source: ModelSource::Custom,
            ..by_id.clone()
        };
        assert!(!model_uses(&custom, "a", &spec("hf://acme/tiny", None)));
        let named = ModelSpec {
            cache_ref: Some(ModelCacheRef { name: "b".into() }),
            ..by_id
        };
        assert!(model_uses(
            &named,
            "b",
            &spec("hf://acme/other", Some("v2"))
        ));
        assert!(!model_uses(&named, "a", &spec("hf://acme/tiny", None)));
    }

    #[test]
    fn sources_parse_by_scheme_and_bad_ones_are_refused() {
        assert_eq!(
            parse_source("hf://Qwen/Qwen3-0.6B"),
            Ok(Source::Hf("Qwen/Qwen3-0.6B".into()))
        );
        assert_eq!(
            parse_source("oci://r.example/m@sha256:ab"),
            Ok(Source::Oci("r.example/m@sha256:ab".into()))
        );
        for bad in [
            "hf://Qwen",
            "hf://Qwen/a/b",
            "hf://../x",
            "hf://o/..",
            "s3://b/k",
            "Qwen/Qwen3",
            "",
        ] {
            assert!(parse_source(bad).is_err(), "{bad}");
        }
    }

    /// An `oci://` cache provides its `modelId`, else its repository's last two segments;
    /// a ModelDeployment of that id uses it (at `main`), and its Ready cache mounts it
    /// under that id.
    #[test]
    fn an_oci_cache_provides_its_model_id() {
        use kubeairunway_sdk::api::{ModelSource, ModelSpec};
        let digest = "0".repeat(64);
        assert_eq!(
            oci_model_id(&format!("reg:5000/models/acme/tiny@sha256:{digest}")),
            "acme/tiny"
        );
        assert_eq!(oci_model_id(&format!("reg/tiny@sha256:{digest}")), "tiny");
        assert_eq!(oci_model_id("reg/acme/tiny:v1"), "acme/tiny");
        let source = format!("oci://reg:5000/models/acme/tiny@sha256:{digest}");
        let mut spec = ModelCacheSpec {
            source: source.clone(),
            ..ModelCacheSpec::default()
        };
        assert_eq!(spec.model().unwrap(), "acme/tiny");
        let by_id = |id: &str| ModelSpec {
            id: Some(id.into()),
            source: ModelSource::Huggingface,
            ..ModelSpec::default()
        };
        assert!(model_uses(&by_id("acme/tiny"), "a", &spec));
        spec.model_id = Some("Qwen/Qwen3-0.6B".into());
        assert!(!model_uses(&by_id("acme/tiny"), "a", &spec));
        assert!(model_uses(&by_id("Qwen/Qwen3-0.6B"), "a", &spec));
        let mut c = cache("oci", &source, 1);
        c.spec.model_id = Some("Qwen/Qwen3-0.6B".into());
        let chosen = choose(&by_id("Qwen/Qwen3-0.6B"), &[c]).unwrap();
        assert_eq!(
            (chosen.name.as_str(), chosen.repo.as_str()),
            ("oci", "Qwen/Qwen3-0.6B")
        );
    }

    /// The agents pull an `oci://` digest only once the controller recorded it as
    /// verified; a refusal of the current generation says why; anything else waits (an
    /// older verdict, another digest's).
    #[test]
    fn agents_pull_an_oci_digest_only_once_the_controller_let_it_through() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let mut c = cache("m", &format!("oci://reg/acme/m@{digest}"), 0);
        c.status = None;
        assert_eq!(pull_verdict(&c), PullVerdict::Pending, "no status yet");
        let mut status = ModelCacheStatus::default();
        c.status = Some(status.clone());
        assert_eq!(pull_verdict(&c), PullVerdict::Pending, "no verdict yet");
        status.verified_digest = Some(format!("sha256:{}", "b".repeat(64)));
        c.status = Some(status.clone());
        assert_eq!(pull_verdict(&c), PullVerdict::Pending, "another digest's");
        status.verified_digest = Some(digest.clone());
        c.status = Some(status.clone());
        assert_eq!(pull_verdict(&c), PullVerdict::Allowed);
        status.verified_digest = None;
        let refused = |generation| Condition {
            type_: conditions::VERIFIED.into(),
            status: "False".into(),
            reason: reasons::VERIFICATION_FAILED.into(),
            message: "no signature found".into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: Some(generation),
        };
        status.conditions = vec![refused(1)];
        c.status = Some(status.clone());
        assert_eq!(
            pull_verdict(&c),
            PullVerdict::Refused("no signature found".into())
        );
        c.metadata.generation = Some(2);
        assert_eq!(
            pull_verdict(&c),
            PullVerdict::Pending,
            "a refusal of an older generation"
        );
        let hf = cache("h", "hf://Qwen/Qwen3", 0);
        assert_eq!(pull_verdict(&hf), PullVerdict::Allowed, "nothing to verify");
    }

    #[test]
    fn defaults_are_main_and_token() {
        let spec = ModelCacheSpec::default();
        assert_eq!(spec.revision(), "main");
        assert_eq!(CredentialsSecretRef::default().key(), "token");
    }

    #[test]
    fn a_slot_counts_for_its_cache_and_generation_only() {
        let grants = BTreeMap::from([(slot_key("ml", "qwen"), 3)]);
        assert!(slot_granted(Some(&grants), "ml", "qwen", 3));
        assert!(!slot_granted(Some(&grants), "ml", "qwen", 4));
        assert!(!slot_granted(Some(&grants), "ml", "other", 3));
        assert!(!slot_granted(Some(&grants), "other", "qwen", 3));
        assert!(!slot_granted(None, "ml", "qwen", 3));
    }

    #[test]
    fn the_bound_across_nodes_is_at_least_one_and_unset_by_default() {
        let mut spec = ModelCacheSpec::default();
        assert_eq!(spec.max_nodes(), None);
        spec.download = Some(DownloadSpec { max_nodes: None });
        assert_eq!(spec.max_nodes(), None);
        spec.download = Some(DownloadSpec { max_nodes: Some(2) });
        assert_eq!(spec.max_nodes(), Some(2));
        spec.download = Some(DownloadSpec { max_nodes: Some(0) });
        assert_eq!(spec.max_nodes(), Some(1));
    }

    #[test]
    fn a_gguf_file_is_known_only_when_include_names_exactly_one() {
        let of = |patterns: &[&str]| {
            single_gguf(
                &patterns
                    .iter()
                    .map(|p| (*p).to_string())
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(
            of(&["gemma-3-1b-it-q8_0.gguf"]),
            Some("gemma-3-1b-it-q8_0.gguf".into())
        );
        assert_eq!(
            of(&["*.json", "sub/Model-Q4_K_M.GGUF", "tokenizer.model"]),
            Some("sub/Model-Q4_K_M.GGUF".into())
        );
        // Two files, a wildcard, a folder, a pattern that may match any name: unknown.
        assert_eq!(of(&["a.gguf", "b.gguf"]), None);
        assert_eq!(of(&["*Q4_K_M.gguf"]), None);
        assert_eq!(of(&["a.gguf", "*"]), None);
        assert_eq!(of(&["a.gguf", "sub/"]), None);
        assert_eq!(of(&["a.gguf", "model-0000?"]), None);
        assert_eq!(of(&["a.gguf", "[ab].bin", "x.gguf"]), None);
        assert_eq!(of(&["*.json"]), None);
        assert_eq!(of(&[]), None);
    }
}
