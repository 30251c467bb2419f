//! The `Warmup` kind (`cache.kubeairunway.ai/v1alpha1`): warm a set of nodes before a
//! model runs there, and `spec.warmup` of a ModelDeployment, its inline form. This is the
//! one definition of the contract between the provider runtime (which holds a
//! ModelDeployment until its Warmup is `Completed`, and makes the Warmup of an inline
//! `spec.warmup`) and the warmup controller (`kernelcache-warmup`, which runs it): the
//! spec, the status and its phase, the condition types and the reasons.
//!
//! The shape follows RBG's `RoleBasedGroupWarmup` (upstream facts: docs/upstream.md#rbg-warmup):
//! one target (nodes, or where a ModelDeployment can run), actions, the same `policies`,
//! and a status counted per node; ours adds kernel caches as an action and names each
//! failed node with its reason.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LocalObjectReference, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a ModelDeployment's nodes are warmed before something new lands on them: either
/// the name of an existing `Warmup` in its namespace, or an inline warmup (the actions
/// and policies of a Warmup, its target being this ModelDeployment) that the provider
/// runtime creates as a Warmup of its own. `{}` is an inline warmup with every default:
/// preload the images the provider renders.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.name) || !(has(self.imagesPreload) || has(self.kernelCaches) || has(self.modelCaches) || has(self.customAction) || has(self.tolerations) || has(self.policies))",
        "message": "spec.warmup is either a reference to a Warmup (name) or an inline warmup (imagesPreload, kernelCaches, modelCaches, customAction, tolerations, policies), not both",
        "fieldPath": ".name",
        "reason": "FieldValueForbidden"
    },
    {
        "rule": "!has(self.policies) || !has(self.policies.ttlSecondsAfterFinished)",
        "message": "ttlSecondsAfterFinished is not allowed in spec.warmup: the Warmup made from it lives as long as the ModelDeployment, which deletes it; one deleted after a time to live, maybe before the provider saw it complete, would be made and run again",
        "fieldPath": ".policies.ttlSecondsAfterFinished",
        "reason": "FieldValueForbidden"
    }
]))]
pub struct DeploymentWarmup {
    /// The name of an existing Warmup in this namespace (exclusive with the inline
    /// fields). Without it, the warmup is inline: the provider creates a Warmup named
    /// after this ModelDeployment, owned by it, with targetModelDeployment set to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,
    /// Inline: pull these images on every node. Default: the images the provider
    /// renders (`status.provider.images`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images_preload: Option<ImagesPreload>,
    /// Inline: KernelCaches (in this namespace) the node agents must have staged on
    /// every node (`spec.kernelCache` is staged too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub kernel_caches: Option<Vec<String>>,
    /// Inline: ModelCaches (in this namespace) the node agents must have downloaded on
    /// every node (the ModelCache this ModelDeployment's pods mount is waited for too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub model_caches: Option<Vec<String>>,
    /// Inline: a pod of your own run on every node after the images are pulled (a model
    /// download, a kernel build): a Job pod template, restartPolicy Never (default) or
    /// OnFailure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_action: Option<CustomAction>,
    /// Inline: tolerations of the warmup pods (this ModelDeployment's tolerations are
    /// added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Inline: parallelism, retries, failure tolerance and timeout; not
    /// `ttlSecondsAfterFinished` (the Warmup lives as long as this ModelDeployment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<WarmupPolicies>,
}

impl DeploymentWarmup {
    /// The API group of the `Warmup` kind (the kernel-cache provider serves it).
    pub const GROUP: &'static str = "cache.kubeairunway.ai";
    /// The version of the `Warmup` kind the provider runtime reads and writes.
    pub const VERSION: &'static str = "v1alpha1";
    /// The kind.
    pub const KIND: &'static str = "Warmup";
    /// The kind's plural (its resource).
    pub const PLURAL: &'static str = "warmups";

    /// A reference to the existing Warmup `name`.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: Some(name.into()),
            ..Self::default()
        }
    }

    /// Whether this is an inline warmup (no `name`).
    pub fn is_inline(&self) -> bool {
        self.name.is_none()
    }
}

/// Images to pull.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImagesPreload {
    /// Image references (`registry/repo:tag` or `@sha256:...`).
    #[schemars(length(min = 1), inner(length(min = 1)))]
    pub items: Vec<String>,
    /// Secrets (in this namespace) to pull them with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pull_secrets: Vec<LocalObjectReference>,
}

/// A custom warmup pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomAction {
    /// A pod template (`metadata` and `spec`, as in a Job). Its containers run once the
    /// images are pulled; the node is warm when the pod succeeds. The warmup pins the pod
    /// to its node (node affinity) and adds its tolerations and pull secrets.
    #[schemars(schema_with = "pod_template_schema")]
    pub pod_template: serde_json::Value,
}

/// How a warmup runs (the policies of RBG's RoleBasedGroupWarmup,
/// `api/workloads/v1alpha2/rolebasedgroupwarmup_types.go@v0.8.0-alpha.5` of
/// sgl-project/rbg, with the same meaning).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.maxFailedNodes) || has(self.backoffLimitPerNode)",
        "message": "backoffLimitPerNode must be set when maxFailedNodes is specified (without it a node is retried forever and never counts as failed)",
        "fieldPath": ".backoffLimitPerNode",
        "reason": "FieldValueRequired"
    }
]))]
pub struct WarmupPolicies {
    /// Nodes warmed at the same time (warmup pods running at once). Default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parallelism: Option<i32>,
    /// Retries of a node's warmup pod before the node counts as failed. Default: retried
    /// until the warmup ends; 0: never retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub backoff_limit_per_node: Option<i32>,
    /// Failed nodes tolerated: one more stops the warmup (its running pods are deleted)
    /// and fails it. Default: any number (the warmup completes once every node is done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_failed_nodes: Option<i32>,
    /// The warmup fails when it has not finished this long after it started (its running
    /// pods are deleted). Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub global_timeout_seconds: Option<i64>,
    /// The warmup and its pods are deleted this long after it finished. Default: kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
}

fn pod_template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    // A full PodTemplateSpec schema would add hundreds of kilobytes to the CRD; the
    // warmup controller parses the template strictly instead (an unknown field is refused
    // with its path, never dropped).
    // The two rules a Job's pod template has that matter here are plain schema: a
    // `restartPolicy` of Never or OnFailure, and at least one container.
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "required": ["spec"],
        "properties": {
            "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "required": ["containers"],
                "properties": {
                    "restartPolicy": {"type": "string", "enum": ["Never", "OnFailure"]},
                    "containers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                },
            },
        },
    })
}

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
        "rule": "has(self.targetModelDeployment) || has(self.imagesPreload) || has(self.kernelCaches) || has(self.modelCaches) || has(self.customAction)",
        "message": "at least one of imagesPreload, kernelCaches, modelCaches or customAction must be set (a targetModelDeployment preloads the images its provider renders)"
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
        "rule": "has(self.modelCaches) == has(oldSelf.modelCaches) && (!has(self.modelCaches) || self.modelCaches == oldSelf.modelCaches)",
        "message": "modelCaches is immutable: create another Warmup"
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
    /// ModelCaches (in this namespace) the node agents must have downloaded on every
    /// node: a node is warm once its agent reports each of them Ready for the cache's
    /// current generation. For a targetModelDeployment, the ModelCache its pods mount (the
    /// one `spec.model.cacheRef` names, else one holding its model) is waited for too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub model_caches: Option<Vec<String>>,
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
    #[schemars(schema_with = "super::schema::conditions")]
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
    /// The phase as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::InProgress => "InProgress",
            Self::Completed => "Completed",
            Self::Failed => "Failed",
        }
    }

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

/// Condition types of a Warmup (those of a Job, as RBG writes them, plus `Progressing`).
pub mod condition_types {
    /// `True` while nodes are being warmed; `False` with why while it waits, or once it
    /// finished.
    pub const PROGRESSING: &str = "Progressing";
    /// `True` once it completed.
    pub const COMPLETE: &str = "Complete";
    /// `True` once it failed.
    pub const FAILED: &str = "Failed";
}

/// Condition reasons of the warmup controller (on Warmups, on `WarmedUp`) and reasons of
/// a node's failure.
pub mod reasons {
    /// `Progressing=True`.
    pub const WARMUP_IN_PROGRESS: &str = "WarmupInProgress";
    /// `Progressing=False`: the warmup is over.
    pub const FINISHED: &str = "Finished";
    /// Waiting: the target ModelDeployment does not exist (failed, if it went away while
    /// the warmup ran).
    pub const TARGET_NOT_FOUND: &str = "TargetNotFound";
    /// Waiting: the provider of a targetModelDeployment (without imagesPreload) has not
    /// reported the images it renders for the current generation.
    pub const IMAGES_NOT_REPORTED: &str = "ImagesNotReported";
    /// Waiting: a targetModelDeployment gives nothing to do (no imagesPreload,
    /// kernelCaches or customAction, and the ModelDeployment names no image or kernel
    /// cache).
    pub const NOTHING_TO_WARM: &str = "NothingToWarm";
    /// `Complete=True`: every node is done.
    pub const NODES_WARMED: &str = "NodesWarmed";
    /// `Complete=True`: no node matches the target.
    pub const NO_NODES_MATCHED: &str = "NoNodesMatched";
    /// `Failed=True`: more nodes failed than `maxFailedNodes`.
    pub const MAX_FAILED_NODES_EXCEEDED: &str = "MaxFailedNodesExceeded";
    /// `Failed=True`: `globalTimeoutSeconds` ran out.
    pub const GLOBAL_TIMEOUT_EXCEEDED: &str = "GlobalTimeoutExceeded";
    /// `Failed=True`: the spec cannot run (a pod template the API server refuses).
    pub const INVALID_SPEC: &str = "InvalidSpec";

    /// Node: a warmup pod failed (a container exited non-zero).
    pub const POD_FAILED: &str = "PodFailed";
    /// Node: no Node of that name.
    pub const NODE_NOT_FOUND: &str = "NodeNotFound";
    /// Node: the warmup pods do not tolerate one of its scheduling taints.
    pub const UNTOLERATED_TAINT: &str = "UntoleratedTaint";
    /// Node: a KernelCache of the warmup does not select the node.
    pub const KERNEL_CACHE_NOT_TARGETED: &str = "KernelCacheNotTargeted";
    /// Node: the agent failed to stage a KernelCache.
    pub const KERNEL_CACHE_FAILED: &str = "KernelCacheFailed";
    /// Node: a KernelCache fits none of its GPUs.
    pub const KERNEL_CACHE_INCOMPATIBLE: &str = "KernelCacheIncompatible";
    /// Node outcome: a ModelCache to wait for does not select this node (its nodeSelector).
    pub const MODEL_CACHE_NOT_TARGETED: &str = "ModelCacheNotTargeted";
    /// Node outcome: the agent failed to download a ModelCache on this node.
    pub const MODEL_CACHE_FAILED: &str = "ModelCacheFailed";

    /// Events: a node is warm; an attempt failed and is retried; a node failed for good.
    pub const NODE_WARMED: &str = "NodeWarmed";
    /// See [`NODE_WARMED`].
    pub const NODE_RETRYING: &str = "NodeRetrying";
    /// See [`NODE_WARMED`].
    pub const NODE_FAILED: &str = "NodeFailed";
    /// Event: the warmup started.
    pub const STARTED: &str = "WarmupStarted";
    /// Event: the TTL ran out; the Warmup is deleted.
    pub const TTL_EXPIRED: &str = "TTLExpired";
}
