//! `Warmup` (`cache.kubeairunway.ai/v1alpha1`, namespaced): warm a set of nodes before a
//! model runs there. The shape follows RBG's `RoleBasedGroupWarmup`
//! (`api/workloads/v1alpha2/rolebasedgroupwarmup_types.go@v0.8.0-alpha.5` of
//! sgl-project/rbg): one target (nodes, or where a ModelDeployment can run instead of
//! RBG's running RoleBasedGroup), actions, the same `policies`, and a status counted per
//! node. Ours adds kernel caches as an action and names each failed node with its reason.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The action and policy pieces of a Warmup's spec, shared with a ModelDeployment's inline
/// `spec.warmup` (defined in the SDK).
pub use kubeairunway_sdk::api::{CustomAction, ImagesPreload, WarmupPolicies};

/// Warm nodes: preload images, stage kernel caches, run a custom pod, once per node.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cache.kubeairunway.ai",
    version = "v1alpha1",
    kind = "Warmup",
    plural = "warmups",
    shortname = "wu",
    namespaced,
    status = "WarmupStatus",
    doc = "Warms a set of nodes before a model runs there: preloads container images, stages kernel caches and runs a custom pod, one pod per node, under parallelism, retry, failure and time limits.",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".status.desiredNodes"}"#,
    printcolumn = r#"{"name":"Active","type":"integer","jsonPath":".status.activeNodes"}"#,
    printcolumn = r#"{"name":"Succeeded","type":"integer","jsonPath":".status.succeededNodes"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.failedNodes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.targetNodes) != has(self.targetModelDeployment)",
        "message": "exactly one of targetNodes or targetModelDeployment must be set"
    },
    {
        "rule": "has(self.targetModelDeployment) || has(self.imagesPreload) || has(self.kernelCaches) || has(self.customAction)",
        "message": "at least one of imagesPreload, kernelCaches or customAction must be set (a targetModelDeployment preloads the images its provider renders)"
    },
    {
        "rule": "!has(oldSelf.targetNodes) || (has(self.targetNodes) && self.targetNodes == oldSelf.targetNodes)",
        "message": "targetNodes is immutable: create another Warmup"
    },
    {
        "rule": "!has(oldSelf.targetModelDeployment) || (has(self.targetModelDeployment) && self.targetModelDeployment == oldSelf.targetModelDeployment)",
        "message": "targetModelDeployment is immutable: create another Warmup"
    },
    {
        "rule": "has(self.imagesPreload) == has(oldSelf.imagesPreload) && (!has(self.imagesPreload) || self.imagesPreload == oldSelf.imagesPreload)",
        "message": "imagesPreload is immutable: create another Warmup"
    },
    {
        "rule": "has(self.kernelCaches) == has(oldSelf.kernelCaches) && (!has(self.kernelCaches) || self.kernelCaches == oldSelf.kernelCaches)",
        "message": "kernelCaches is immutable: create another Warmup"
    },
    {
        "rule": "has(self.customAction) == has(oldSelf.customAction) && (!has(self.customAction) || self.customAction == oldSelf.customAction)",
        "message": "customAction is immutable: create another Warmup"
    }
]))]
pub struct WarmupSpec {
    /// Warm these nodes (exclusive with targetModelDeployment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_nodes: Option<TargetNodes>,
    /// Warm the nodes where this ModelDeployment can run: those matching its nodeSelector,
    /// whose scheduling taints its tolerations tolerate, with its GPU resource
    /// (exclusive with targetNodes). Nodes that join while the warmup runs are warmed too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_model_deployment: Option<TargetModelDeployment>,
    /// Pull these images on every node. For a targetModelDeployment, default: the images
    /// its provider renders (`status.provider.images`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images_preload: Option<ImagesPreload>,
    /// KernelCaches (in this namespace) the node agents must have staged on every node:
    /// a node is warm once its agent reports each of them Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub kernel_caches: Option<Vec<String>>,
    /// A pod of your own run on every node after the images are pulled (a model
    /// download, a kernel build): a Job pod template, restartPolicy Never (default) or
    /// OnFailure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_action: Option<CustomAction>,
    /// Tolerations of the warmup pods, for tainted nodes (with a targetModelDeployment,
    /// its tolerations are added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Parallelism, retries, failure tolerance, timeout and time to live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<WarmupPolicies>,
}

/// Nodes by label and/or by name (the union).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.nodeSelector) || has(self.nodeNames)", "message": "targetNodes needs nodeSelector and/or nodeNames"}
]))]
pub struct TargetNodes {
    /// Nodes with all of these labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minProperties" = 1))]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Nodes by name (a name with no Node counts as a failed node, NodeNotFound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub node_names: Option<Vec<String>>,
}

/// A ModelDeployment in the Warmup's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetModelDeployment {
    /// Its name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A Warmup's progress.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmupStatus {
    /// `Pending` (not started: waiting for its target), `InProgress`, `Completed` or
    /// `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<WarmupPhase>,
    /// Nodes to warm.
    #[serde(default)]
    pub desired_nodes: i32,
    /// Nodes being warmed (a pod running or due to be retried, caches still staging).
    #[serde(default)]
    pub active_nodes: i32,
    /// Nodes warmed.
    #[serde(default)]
    pub succeeded_nodes: i32,
    /// Nodes that failed for good (see `failures`).
    #[serde(default)]
    pub failed_nodes: i32,
    /// Nodes whose warmup failed at least once, with why: the failed nodes and those
    /// being retried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["nodeName"]))]
    pub failures: Vec<NodeFailure>,
    /// The images preloaded on every node (fixed when the warmup starts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
    /// When the warmup started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// `Progressing`, `Complete`, `Failed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::api::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Phases of a Warmup.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum WarmupPhase {
    /// Not started: the target or its images are not there yet.
    Pending,
    /// Warming nodes.
    InProgress,
    /// Every node is done, and no more failed than `maxFailedNodes` allows.
    Completed,
    /// Too many nodes failed, the time ran out, or the spec is invalid.
    Failed,
}

impl WarmupPhase {
    /// Whether the warmup is over.
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Completed | Self::Failed)
    }
}

/// A node whose warmup failed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeFailure {
    /// The node.
    pub node_name: String,
    /// Why, in one word (`PodFailed`, `ImagePullBackOff`, `NodeNotFound`,
    /// `KernelCacheFailed`, ...).
    pub reason: String,
    /// The detail (the container's message, the agent's report).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Warmup pods of this node that failed.
    #[serde(default)]
    pub attempts: i32,
    /// Whether the node failed for good (no more retries).
    #[serde(default)]
    pub permanent: bool,
    /// When it last failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<Time>,
}
