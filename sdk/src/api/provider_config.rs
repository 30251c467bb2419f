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
/// A serving provider lists its engines, each with what it serves (AI Runway's shape since
/// its #214). A capability provider (such as the kernel cache) lists no engines and only
/// `features`, so it is never selected to serve.
///
/// `servingModes`, `cpuSupport` and `gpuSupport` here are the provider-wide lists of the
/// earlier shape, deprecated: an engine that does not set its own inherits them. A stored
/// config whose `engines` are bare names (`[vllm]`) still reads, each name an engine that
/// inherits everything; the API server refuses new ones of that shape.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// Supported engines, each once (so at most the four there are), with per-engine
    /// capabilities.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "engines_or_names"
    )]
    #[schemars(length(max = 4), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub engines: Vec<EngineCapability>,
    /// Deprecated: serving modes of every engine that lists none of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serving_modes: Vec<ServingMode>,
    /// Deprecated: CPU-only support of every engine that does not say.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cpu_support: bool,
    /// Deprecated: GPU support of every engine that does not say.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gpu_support: bool,
    /// Features a capability provider adds to deployments served by others (for example
    /// `kernelCache`, `warmup`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// What a provider serves with one engine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = native_api_formats_rule)]
pub struct EngineCapability {
    /// The engine.
    pub name: EngineType,
    /// Serving modes with this engine; empty: the provider-wide `servingModes`, else
    /// aggregated only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serving_modes: Vec<ServingMode>,
    /// API formats the engine serves here, among those its own server has; empty:
    /// `openai-chat` only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub api_formats: Vec<ApiFormat>,
    /// Serves GPU deployments with this engine; unset: the provider-wide `gpuSupport`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_support: Option<bool>,
    /// Serves CPU-only deployments with this engine; unset: the provider-wide
    /// `cpuSupport`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_support: Option<bool>,
    /// Gateway behaviour of this provider and engine, for users and tools to read in the
    /// InferenceProviderConfig. Core's gateway acts on what the provider reports per
    /// ModelDeployment instead (`status.endpoint.inferencePool`, `targetPort`,
    /// `status.selector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayCapabilities>,
}

/// An API format an engine serves.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum ApiFormat {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`).
    #[serde(rename = "openai-chat")]
    OpenaiChat,
    /// OpenAI Responses (`POST /v1/responses`).
    #[serde(rename = "openai-responses")]
    OpenaiResponses,
    /// Anthropic Messages (`POST /v1/messages`).
    #[serde(rename = "anthropic-messages")]
    AnthropicMessages,
}

/// Gateway capabilities of one engine of a provider (AI Runway's fields).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayCapabilities {
    /// The provider's operator creates the InferencePool (and endpoint picker).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub manages_inference_pool: bool,
    /// Name of the provider-created pool, with `{name}` and `{namespace}` placeholders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_pool_name_pattern: Option<String>,
    /// Namespace of the provider-created pool, with the same placeholders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_pool_namespace: Option<String>,
    /// The endpoint picker's image and plugin configuration, when the provider ships its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_picker: Option<EndpointPickerCapabilities>,
    /// Routing does not honour `spec.model.servedName` (route by `model.id`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignores_served_name: bool,
}

/// A provider's own endpoint picker.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPickerCapabilities {
    /// The picker's container image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The picker's `EndpointPickerConfig`, as YAML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_data: Option<String>,
}

/// One engine's capabilities with the deprecated provider-wide values filled in: what
/// selection and engine auto-selection read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedEngine {
    /// The engine.
    pub name: EngineType,
    /// Serving modes (never empty).
    pub serving_modes: Vec<ServingMode>,
    /// API formats (never empty).
    pub api_formats: Vec<ApiFormat>,
    /// Serves GPU deployments.
    pub gpu_support: bool,
    /// Serves CPU-only deployments.
    pub cpu_support: bool,
}

/// The CRD's rule that an engine declares only API formats its own server has
/// ([`ApiFormat::native`]), so a config that claims more is refused with the list.
fn native_api_formats_rule(schema: &mut schemars::Schema) {
    let engines = EngineType::ALL;
    let quoted = |e: EngineType| {
        let formats: Vec<String> = ApiFormat::native(e)
            .iter()
            .map(|f| format!("'{}'", f.as_str()))
            .collect();
        formats.join(", ")
    };
    let allowed: Vec<String> = engines
        .iter()
        .map(|&e| format!("(self.name == '{e}' && f in [{}])", quoted(e)))
        .collect();
    let listed: Vec<String> = engines
        .iter()
        .map(|&e| {
            let formats: Vec<&str> = ApiFormat::native(e).iter().map(|f| f.as_str()).collect();
            format!("{e}: {}", formats.join(", "))
        })
        .collect();
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": format!("!has(self.apiFormats) || self.apiFormats.all(f, {})", allowed.join(" || ")),
            "message": format!(
                "apiFormats names a format the engine's own server does not serve ({})",
                listed.join("; ")
            ),
            "fieldPath": ".apiFormats",
        }]),
    );
}

/// `engines` of either shape: objects, or (stored by an earlier version) bare names.
fn engines_or_names<'de, D>(de: D) -> Result<Vec<EngineCapability>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Entry {
        Name(EngineType),
        Full(EngineCapability),
    }
    let entries = Option::<Vec<Entry>>::deserialize(de)?.unwrap_or_default();
    Ok(entries
        .into_iter()
        .map(|e| match e {
            Entry::Name(name) => EngineCapability::new(name),
            Entry::Full(full) => full,
        })
        .collect())
}

impl EngineCapability {
    /// An engine that inherits everything from the provider-wide values; declare what it
    /// serves with the methods below.
    pub fn new(name: EngineType) -> Self {
        Self {
            name,
            serving_modes: Vec::new(),
            api_formats: Vec::new(),
            gpu_support: None,
            cpu_support: None,
            gateway: None,
        }
    }

    /// Serves these modes.
    #[must_use]
    pub fn serving_modes(mut self, modes: impl IntoIterator<Item = ServingMode>) -> Self {
        self.serving_modes = modes.into_iter().collect();
        self
    }

    /// An engine served on GPUs only.
    pub fn gpu_only(name: EngineType) -> Self {
        Self::new(name).gpu(true).cpu(false)
    }

    /// Serves every API format its engine's own server has ([`ApiFormat::native`]).
    #[must_use]
    pub fn native_api_formats(self) -> Self {
        let name = self.name;
        self.api_formats(ApiFormat::native(name).iter().copied())
    }

    /// Serves these API formats.
    #[must_use]
    pub fn api_formats(mut self, formats: impl IntoIterator<Item = ApiFormat>) -> Self {
        self.api_formats = formats.into_iter().collect();
        self
    }

    /// Serves on GPUs (`true`) or not.
    #[must_use]
    pub fn gpu(mut self, supported: bool) -> Self {
        self.gpu_support = Some(supported);
        self
    }

    /// Serves CPU-only deployments (`true`) or not.
    #[must_use]
    pub fn cpu(mut self, supported: bool) -> Self {
        self.cpu_support = Some(supported);
        self
    }

    /// Its gateway capabilities.
    #[must_use]
    pub fn gateway(mut self, gateway: GatewayCapabilities) -> Self {
        self.gateway = Some(gateway);
        self
    }
}

impl Capabilities {
    /// A serving provider's capabilities: these engines, nothing provider-wide.
    pub fn serving(engines: impl IntoIterator<Item = EngineCapability>) -> Self {
        Self {
            engines: engines.into_iter().collect(),
            ..Self::default()
        }
    }

    /// The engines, in the order listed.
    pub fn engine_names(&self) -> Vec<EngineType> {
        self.engines.iter().map(|e| e.name).collect()
    }

    /// What the provider serves with `engine` (provider-wide values filled in), if it
    /// lists it.
    pub fn engine(&self, engine: EngineType) -> Option<ResolvedEngine> {
        let e = self.engines.iter().find(|e| e.name == engine)?;
        let serving_modes = match (e.serving_modes.is_empty(), self.serving_modes.is_empty()) {
            (false, _) => e.serving_modes.clone(),
            (true, false) => self.serving_modes.clone(),
            (true, true) => vec![ServingMode::Aggregated],
        };
        let api_formats = if e.api_formats.is_empty() {
            vec![ApiFormat::OpenaiChat]
        } else {
            e.api_formats.clone()
        };
        Some(ResolvedEngine {
            name: e.name,
            serving_modes,
            api_formats,
            gpu_support: e.gpu_support.unwrap_or(self.gpu_support),
            cpu_support: e.cpu_support.unwrap_or(self.cpu_support),
        })
    }
}

impl ApiFormat {
    /// The API formats an engine's own server has (AI Runway's `ValidAPIFormatsForEngine`):
    /// the most a provider can declare for it.
    pub fn native(engine: EngineType) -> &'static [ApiFormat] {
        use ApiFormat::{AnthropicMessages, OpenaiChat, OpenaiResponses};
        match engine {
            EngineType::Vllm => &[OpenaiChat, OpenaiResponses, AnthropicMessages],
            EngineType::Sglang => &[OpenaiChat, AnthropicMessages],
            EngineType::Trtllm => &[OpenaiChat, OpenaiResponses],
            EngineType::Llamacpp => &[OpenaiChat],
        }
    }

    /// The value as written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiFormat::OpenaiChat => "openai-chat",
            ApiFormat::OpenaiResponses => "openai-responses",
            ApiFormat::AnthropicMessages => "anthropic-messages",
        }
    }
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
