//! `InferenceProviderConfig`: how a provider registers itself.
//!
//! Cluster-scoped, one per provider, named after the provider. The provider writes the
//! spec on start-up and keeps the status (readiness, heartbeat, detected upstream API)
//! current; core reads both to select providers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::model_deployment::{EngineType, ServingMode};
use super::schema;

/// What a provider can serve and when it wants to be chosen.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "kubeairunway.ai",
    version = "v1alpha1",
    kind = "InferenceProviderConfig",
    plural = "inferenceproviderconfigs",
    singular = "inferenceproviderconfig",
    shortname = "ipc",
    status = "InferenceProviderConfigStatus",
    doc = "Registration of an inference provider: what it can serve, when it wants to be selected, and its health.",
    printcolumn = r#"{"name":"Ready","type":"boolean","description":"Provider ready","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Version","type":"string","description":"Provider version","jsonPath":".status.version"}"#,
    printcolumn = r#"{"name":"Upstream","type":"string","description":"Detected upstream API","jsonPath":".status.upstreamCRDVersion"}"#,
    printcolumn = r#"{"name":"Heartbeat","type":"date","description":"Last heartbeat","jsonPath":".status.lastHeartbeat"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceProviderConfigSpec {
    /// What the provider supports; core only considers providers whose capabilities fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    /// CEL rules over `spec` and `metadata` of a ModelDeployment; the highest priority
    /// among the true rules is the provider's score. At most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub selection_rules: Vec<SelectionRule>,
    /// Where to read about the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documentation: Option<String>,
    /// How to install the provider's components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installation: Option<Installation>,
}

/// Capabilities of a provider.
///
/// A serving provider lists engines and serving modes. A capability provider (such as the
/// kernel cache) lists no engines and only `features`, so it is never selected to serve.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// Supported engines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engines: Vec<EngineType>,
    /// Supported serving modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serving_modes: Vec<ServingMode>,
    /// Serves CPU-only deployments.
    #[serde(default)]
    pub cpu_support: bool,
    /// Serves GPU deployments.
    #[serde(default)]
    pub gpu_support: bool,
    /// Features a capability provider adds to deployments served by others (for example
    /// `kernelCache`, `warmup`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// One CEL selection rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectionRule {
    /// CEL expression over `spec` (defaults applied) and `metadata` (name, namespace,
    /// labels, annotations) of the ModelDeployment, e.g.
    /// `has(spec.resources) && has(spec.resources.gpu) && spec.resources.gpu.count > 0`.
    /// At most 4096 characters, 1000 syntax-tree nodes, two nested comprehensions, and
    /// an estimated 1,000,000 steps per evaluation (its nodes times the longest list,
    /// map or string of the ModelDeployment per nested comprehension): a rule over budget
    /// is reported and skipped.
    #[schemars(length(min = 1, max = 4096))]
    pub condition: String,
    /// Priority when the condition holds; higher wins.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub priority: i32,
}

/// Installation hints shown to users.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Installation {
    /// What gets installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Namespace the components go to by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_namespace: Option<String>,
    /// Helm repositories to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub helm_repos: Vec<HelmRepo>,
    /// Helm charts to install, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub helm_charts: Vec<HelmChart>,
    /// Manual steps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<InstallationStep>,
}

/// A Helm repository.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct HelmRepo {
    /// Repository name.
    pub name: String,
    /// Repository URL.
    pub url: String,
}

/// A Helm chart to install.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HelmChart {
    /// Release name.
    pub name: String,
    /// Chart reference (`repo/chart` or a URL).
    pub chart: String,
    /// Chart version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Namespace to install into.
    pub namespace: String,
    /// Create the namespace if missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_namespace: Option<bool>,
}

/// A manual installation step.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct InstallationStep {
    /// Step title.
    pub title: String,
    /// What the step does.
    pub description: String,
    /// Command to run, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

/// Provider health, written by the provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceProviderConfigStatus {
    /// The provider runs and its upstream CRD is installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Provider version, e.g. `kaito-provider:v0.1.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Refreshed periodically; core ignores providers whose heartbeat is stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Time>,
    /// The upstream `group/version` the provider renders for.
    #[serde(
        rename = "upstreamCRDVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub upstream_crd_version: Option<String>,
    /// Hash of the installed upstream schema the provider validated against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_schema_hash: Option<String>,
    /// Conditions (for example core's report of selection rules that fail to compile).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
}

impl InferenceProviderConfigSpec {
    /// Whether this config registers a serving provider (one that lists engines).
    pub fn serves(&self) -> bool {
        self.capabilities
            .as_ref()
            .is_some_and(|c| !c.engines.is_empty())
    }
}
