//! The kernel-cache kinds of `cache.kubeairunway.ai/v1alpha1`: `KernelCache` (what a
//! user wants staged), `KernelCacheNode` (what one node has, written by its agent), and
//! `KernelCachePolicy` (how cache images are verified, cluster-wide); the `Warmup` kind
//! is the SDK's (`kubeairunway_sdk::api::warmup`), shared with the provider runtime.
//!
//! The same group holds `ModelCache` ([`model`]): model weights downloaded onto the nodes'
//! disks, reported per node in the same `KernelCacheNode` (`status.modelCaches`).
//!
//! Besides the kinds: the names every cache component agrees on ([`names`]) and
//! how each reports what it saw ([`report`]).

pub mod model;
pub mod names;
pub mod report;
pub mod verification;

pub use verification::{Verification, VerificationMode};

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the kernel-cache kinds.
pub const GROUP: &str = "cache.kubeairunway.ai";

/// A GPU kernel cache image to stage on the nodes whose GPUs it fits.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cache.kubeairunway.ai",
    version = "v1alpha1",
    kind = "KernelCache",
    plural = "kernelcaches",
    shortname = "kc",
    namespaced,
    status = "KernelCacheStatus",
    doc = "A GPU kernel cache (Triton or vLLM torch.compile) packaged as an OCI image, pinned to a digest, verified, and staged on the nodes whose GPUs it fits.",
    printcolumn = r#"{"name":"Digest","type":"string","jsonPath":".status.resolvedDigest"}"#,
    printcolumn = r#"{"name":"Verified","type":"string","jsonPath":".status.verification.verified"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyNodes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheSpec {
    /// The cache image, by tag or digest (`registry/repo:tag` or `registry/repo@sha256:...`).
    #[schemars(length(min = 1))]
    pub image: String,
    /// Stage only on nodes with these labels (in addition to having a compatible GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Image pull Secrets (in this namespace) for a private registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// How serving pods get the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<MountSpec>,
}

/// How the cache reaches serving pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MountSpec {
    /// `hostPath` (the agent's directory; default) or `imageVolume` (a Kubernetes image
    /// volume, where the cluster supports it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<MountSource>,
    /// Where the cache is mounted in the serving container; defaults by cache type
    /// (`/var/cache/kubeairunway/<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Schedule serving pods only onto nodes where the cache is ready (node affinity).
    #[serde(default)]
    pub require_ready_node: bool,
}

/// Where a mounted cache comes from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum MountSource {
    /// The directory the node agent extracted the cache to.
    #[default]
    HostPath,
    /// A Kubernetes image volume of the pinned digest.
    ImageVolume,
}

/// What the cluster knows about a KernelCache.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheStatus {
    /// The digest the image resolved to; agents pull only this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_digest: Option<String>,
    /// The image pinned to that digest (`registry/repo@sha256:...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_image: Option<String>,
    /// Cache type read from the image labels (`triton` or `vllm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type: Option<String>,
    /// Bytes of cache content, as the image's `cache-size-bytes` label says (the size
    /// limit of a pod's copy is twice this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Signature verification of the pinned digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
    /// Nodes where the cache is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_nodes: Option<i32>,
    /// Node names per state (`Ready`, `Staging`, `Incompatible`, `Failed`, `Evicted`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nodes: BTreeMap<String, Vec<String>>,
    /// Conditions (`Resolved`, `Verified`, `Ready`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "kubeairunway_sdk::api::schema::conditions")]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl KernelCacheStatus {
    /// The pinned image nodes may stage and pods may use: set only when the pinned digest
    /// passed verification (or verification is `disabled` by policy), never otherwise.
    pub fn usable_image(&self) -> Option<&str> {
        let verification = self.verification.as_ref()?;
        let usable = verification.verified || verification.mode == VerificationMode::Disabled;
        let pinned = self.pinned_image.as_deref()?;
        let digest = self.resolved_digest.as_deref()?;
        (usable && pinned.ends_with(&format!("@{digest}"))).then_some(pinned)
    }
}

/// The cluster's verification policy for cache images and `oci://` model caches (one,
/// named `default`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cache.kubeairunway.ai",
    version = "v1alpha1",
    kind = "KernelCachePolicy",
    plural = "kernelcachepolicies",
    doc = "How kernel cache images, and the artifacts of oci:// model caches, are verified before any node uses them."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.mode != 'key' || (has(self.publicKeys) && size(self.publicKeys) > 0)", "message": "mode key needs publicKeys"},
    {"rule": "self.mode != 'keyless' || (has(self.keyless) && has(self.trustRoot))", "message": "mode keyless needs keyless.issuer, keyless.subject and trustRoot"},
    {"rule": "self.mode != 'certificate' || has(self.certificate)", "message": "mode certificate needs certificate.caBundle and certificate.subjectPattern"}
]))]
pub struct KernelCachePolicySpec {
    /// Verification mode.
    pub mode: VerificationMode,
    /// PEM public keys (mode `key`); a signature by any of them passes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub public_keys: Vec<String>,
    /// Pinned identity (mode `keyless`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless: Option<KeylessIdentity>,
    /// Trusted root material for offline keyless verification (Fulcio CA certificates and
    /// Rekor public keys, PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_root: Option<TrustRoot>,
    /// CA bundle and subject pattern (mode `certificate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<CertificatePolicy>,
}

/// A keyless signer identity.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeylessIdentity {
    /// OIDC issuer, exactly.
    pub issuer: String,
    /// Certificate subject (SAN), exactly.
    pub subject: String,
}

/// Offline trust root for keyless verification.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrustRoot {
    /// Fulcio CA certificates (PEM).
    pub fulcio_certificates: Vec<String>,
    /// Rekor public keys (PEM).
    pub rekor_keys: Vec<String>,
}

/// Certificate-based verification.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificatePolicy {
    /// CA certificates (PEM) the signing certificate must chain to.
    pub ca_bundle: String,
    /// Regular expression the certificate's subject (SAN) must match in full.
    pub subject_pattern: String,
}

/// One node's GPUs and caches (kernel and model caches), written by the node agent (named
/// after the node).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cache.kubeairunway.ai",
    version = "v1alpha1",
    kind = "KernelCacheNode",
    plural = "kernelcachenodes",
    shortname = "kcn",
    status = "KernelCacheNodeStatus",
    doc = "The GPUs of one node and the state of each kernel cache and model cache on it, written by that node's agent.",
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".status.gpuCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheNodeSpec {
    /// The node this object describes.
    pub node_name: String,
    /// The kernel caches pods on this node use (`<namespace>/<name>@<digest>`, sorted),
    /// written by the controller (field manager `kernelcache-controller`) from the serving
    /// pods it watches, so the agent never reads pods. Absent until the controller first
    /// writes it: then the agent evicts nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use: Option<Vec<String>>,
    /// The public half (X25519, base64) of the key the node's agent made at its start,
    /// written by that agent: the controller seals the credentials of the caches this node
    /// pulls to it, in the node's own Secret of the credentials namespace; the private half
    /// never leaves the agent's memory (a restarted agent publishes a new one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_key: Option<String>,
    /// The download slots the controller granted this node, for ModelCaches bounded
    /// across nodes (`spec.download.maxNodes`): `<namespace>/<name>` to the cache's
    /// generation the slot is for. Written by the controller (field
    /// manager `kernelcache-controller-downloads`), read by the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_downloads: Option<BTreeMap<String, i64>>,
}

/// GPUs found and caches staged on a node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheNodeStatus {
    /// Number of GPUs found.
    #[serde(default)]
    pub gpu_count: i32,
    /// Why no GPUs were found (no driver library, no devices), when none were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_detection: Option<String>,
    /// The GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuInfo>,
    /// Per cache and digest, what this node has.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<NodeCache>,
    /// The cache root's disk as the agent accounts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<NodeDisk>,
    /// Per ModelCache, what this node has (written by the agent's model-cache loop under
    /// its own field manager, `modelcache-agent`; an additive field: objects written
    /// before it existed simply lack it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_caches: Vec<model::NodeModelCache>,
    /// When the agent last wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<Time>,
}

/// What the staged caches take of a node's disk.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDisk {
    /// Bytes all caches together may take (the agent's `--disk-budget`), when there is a
    /// budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_bytes: Option<i64>,
    /// Bytes the staged caches take (each digest once) and the stages under way reserve.
    pub used_bytes: i64,
    /// Free space no stage goes below (`--min-free`).
    pub min_free_bytes: i64,
}

/// One GPU.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// Device index.
    pub index: i32,
    /// Product name (e.g. `NVIDIA H100 80GB HBM3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Compiler backend (`cuda`, `hip`).
    pub backend: String,
    /// Architecture as caches name it: CUDA `major*10+minor` (`90`), HIP `gfx90a`.
    pub arch: String,
    /// Threads per warp/wavefront.
    pub warp_size: i32,
    /// Driver version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
}

/// The state of one cache on one node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCache {
    /// Namespace of the KernelCache.
    pub namespace: String,
    /// Name of the KernelCache.
    pub name: String,
    /// Digest staged (or being staged).
    pub digest: String,
    /// `Pending`, `Staging`, `Ready`, `Incompatible`, `Failed` or `Evicted`.
    pub state: CacheState,
    /// GPUs the cache fits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compatible_gpus: Vec<i32>,
    /// GPUs it does not fit, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incompatible_gpus: Vec<IncompatibleGpu>,
    /// Bytes on disk once extracted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Detail of the state (the failure, for `Failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Machine-readable reason of the state, where there is one (`EvictedForSpace` for
    /// `Evicted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the state last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// A GPU a cache does not fit.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IncompatibleGpu {
    /// Device index.
    pub index: i32,
    /// Machine-readable reason (`BackendMismatch`, `ArchMismatch`, `WarpSizeMismatch`).
    pub reason: String,
    /// Human-readable detail.
    pub message: String,
}

/// State of a cache on a node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CacheState {
    /// Wanted, not started.
    #[default]
    Pending,
    /// Being pulled, verified and extracted.
    Staging,
    /// Extracted and usable by pods on this node.
    Ready,
    /// No GPU on this node fits the cache.
    Incompatible,
    /// Staging failed (see the message).
    Failed,
    /// Removed to make room for another cache under the node's disk budget (see the
    /// message); staged again once it fits without evicting another.
    Evicted,
}

/// Reasons of a cache's state on a node (`NodeCache::reason`).
pub mod node_reasons {
    /// `Evicted`: the least recently used cache no pod on the node used, removed so that
    /// another wanted cache fits the node's disk budget.
    pub const EVICTED_FOR_SPACE: &str = "EvictedForSpace";
}

/// Whether a cache's `nodeSelector` (all pairs must match; none selects every node)
/// selects a node with `labels`: where its agent stages it, the warmup waits for it and the
/// controller seals its credentials.
pub fn selects(
    selector: Option<&BTreeMap<String, String>>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.is_none_or(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The CRDs of the group (kernel and model caches), ready to apply.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    use kubeairunway_sdk::api::crds::without_nullable;
    vec![
        without_nullable(KernelCache::crd()),
        without_nullable(KernelCacheNode::crd()),
        without_nullable(KernelCachePolicy::crd()),
        without_nullable(model::ModelCache::crd()),
        without_nullable(kubeairunway_sdk::api::warmup::Warmup::crd()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(mode: VerificationMode, verified: bool) -> KernelCacheStatus {
        KernelCacheStatus {
            resolved_digest: Some("sha256:ab".into()),
            pinned_image: Some("r.example/c@sha256:ab".into()),
            verification: Some(Verification {
                mode,
                verified,
                ..Verification::default()
            }),
            ..KernelCacheStatus::default()
        }
    }

    #[test]
    fn only_verified_or_policy_disabled_digests_are_usable() {
        let pinned = Some("r.example/c@sha256:ab");
        assert_eq!(status(VerificationMode::Key, true).usable_image(), pinned);
        assert_eq!(
            status(VerificationMode::Disabled, false).usable_image(),
            pinned
        );
        assert_eq!(status(VerificationMode::Key, false).usable_image(), None);
        assert_eq!(
            status(VerificationMode::Certificate, false).usable_image(),
            None
        );
        let mut other = status(VerificationMode::Key, true);
        other.resolved_digest = Some("sha256:cd".into());
        assert_eq!(other.usable_image(), None, "pinned image of another digest");
        let mut unverified = status(VerificationMode::Key, true);
        unverified.verification = None;
        assert_eq!(unverified.usable_image(), None);
    }
}
