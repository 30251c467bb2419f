//! `spec.warmup` of a ModelDeployment, and the pieces of a `Warmup`'s spec
//! (`cache.kubeairunway.ai/v1alpha1`, the kernel-cache provider's kind) it shares with
//! the inline form: [`ImagesPreload`], [`CustomAction`] and [`WarmupPolicies`]. The
//! kernel-cache provider's `Warmup` is built from these same types, so the two never drift
//! apart.

use k8s_openapi::api::core::v1::{LocalObjectReference, Toleration};
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
        "rule": "!has(self.name) || !(has(self.imagesPreload) || has(self.kernelCaches) || has(self.customAction) || has(self.tolerations) || has(self.policies))",
        "message": "spec.warmup is either a reference to a Warmup (name) or an inline warmup (imagesPreload, kernelCaches, customAction, tolerations, policies), not both",
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
