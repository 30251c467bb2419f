//! `ModelDeployment`: one LLM inference service, whichever provider serves it. Field
//! for field compatible with AI Runway's `kubeairunway.ai` ModelDeployment.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{EnvVar, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema;
use super::warmup::DeploymentWarmup;

/// Desired state of a ModelDeployment.
///
/// The API server itself enforces the validation rules that need no cluster knowledge
/// (CEL rules on this object), so an invalid spec is refused even when the admission
/// webhook is down.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "kubeairunway.ai",
    version = "v1alpha1",
    kind = "ModelDeployment",
    plural = "modeldeployments",
    singular = "modeldeployment",
    shortname = "md",
    namespaced,
    status = "ModelDeploymentStatus",
    selectable = ".status.provider.name",
    // `kubectl scale`, HPA and KEDA: spec.scaling.replicas (aggregated serving), the
    // ready replicas, and the serving pods' selector (a provider writes it).
    scale(
        spec_replicas_path = ".spec.scaling.replicas",
        status_replicas_path = ".status.replicas.ready",
        label_selector_path = ".status.selector"
    ),
    doc = "A model served as an OpenAI-compatible inference service by one of the installed providers.",
    printcolumn = r#"{"name":"Phase","type":"string","description":"Current phase","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","description":"Selected provider","jsonPath":".status.provider.name"}"#,
    printcolumn = r#"{"name":"Engine","type":"string","description":"Inference engine","jsonPath":".status.engine.type"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","description":"Ready replicas","jsonPath":".status.replicas.ready"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","description":"Service serving the model","jsonPath":".status.endpoint.service"}"#,
    printcolumn = r#"{"name":"URL","type":"string","description":"In-cluster URL of the OpenAI-compatible API","jsonPath":".status.url","priority":1}"#,
    printcolumn = r#"{"name":"Gateway URL","type":"string","description":"URL of the OpenAI-compatible API through the Gateway","jsonPath":".status.gateway.url","priority":1}"#,
    printcolumn = r#"{"name":"Model","type":"string","description":"Model name clients send through the Gateway","jsonPath":".status.gateway.modelName","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
// The rules read optional fields with `self.?a.?b.orValue(..)`, not `has(self.a) &&
// has(self.a.b) && self.a.b`: the API server evaluates every rule on each write of the
// object (status writes too), and each field it reads off the spec costs it a copy of the
// spec schema's properties; this way a rule reads each field once (docs/benchmarks.md).
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.model.?source.orValue('huggingface') != 'huggingface' || self.model.?id.orValue('') != ''",
        "message": "model.id is required when source is huggingface",
        "fieldPath": ".model.id",
        "reason": "FieldValueRequired"
    },
    {
        "rule": "self.?engine.?type.orValue('') != 'vllm' || self.?serving.?mode.orValue('') == 'disaggregated' || self.?resources.?gpu.?count.orValue(0) > 0",
        "message": "vLLM engine requires GPU (set resources.gpu.count > 0)",
        "fieldPath": ".resources.gpu.count"
    },
    {
        "rule": "self.?engine.?type.orValue('') != 'sglang' || self.?serving.?mode.orValue('') == 'disaggregated' || self.?resources.?gpu.?count.orValue(0) > 0",
        "message": "SGLang engine requires GPU (set resources.gpu.count > 0)",
        "fieldPath": ".resources.gpu.count"
    },
    {
        "rule": "self.?engine.?type.orValue('') != 'trtllm' || self.?serving.?mode.orValue('') == 'disaggregated' || self.?resources.?gpu.?count.orValue(0) > 0",
        "message": "TensorRT-LLM engine requires GPU (set resources.gpu.count > 0)",
        "fieldPath": ".resources.gpu.count"
    },
    {
        "rule": "!has(self.image) || size(self.image) == 0 || !has(self.engine) || !has(self.engine.image) || size(self.engine.image) == 0 || self.image == self.engine.image",
        "message": "spec.image and spec.engine.image name different images: they are the same setting, so set one of them (spec.engine.image is preferred) or both to the same image",
        "fieldPath": ".engine.image"
    },
    {
        "rule": "self.?serving.?mode.orValue('') != 'disaggregated' || !has(self.resources) || !has(self.resources.gpu)",
        "message": "Cannot specify both resources.gpu and scaling.prefill/decode",
        "fieldPath": ".resources.gpu",
        "reason": "FieldValueForbidden"
    },
    {
        "rule": "self.?serving.?mode.orValue('') != 'disaggregated' || (has(self.scaling) && has(self.scaling.prefill) && has(self.scaling.decode))",
        "message": "Disaggregated mode requires scaling.prefill and scaling.decode",
        "fieldPath": ".scaling",
        "reason": "FieldValueRequired"
    },
    {
        "rule": "self.?serving.?mode.orValue('') != 'disaggregated' || !has(self.scaling) || !has(self.scaling.prefill) || (has(self.scaling.prefill.gpu) && has(self.scaling.prefill.gpu.count) && self.scaling.prefill.gpu.count > 0)",
        "message": "Disaggregated mode requires scaling.prefill.gpu.count",
        "fieldPath": ".scaling.prefill.gpu.count",
        "reason": "FieldValueRequired"
    },
    {
        "rule": "self.?serving.?mode.orValue('') != 'disaggregated' || !has(self.scaling) || !has(self.scaling.decode) || (has(self.scaling.decode.gpu) && has(self.scaling.decode.gpu.count) && self.scaling.decode.gpu.count > 0)",
        "message": "Disaggregated mode requires scaling.decode.gpu.count",
        "fieldPath": ".scaling.decode.gpu.count",
        "reason": "FieldValueRequired"
    }
]))]
pub struct ModelDeploymentSpec {
    /// The model to serve.
    pub model: ModelSpec,

    /// Provider selection; auto-selected by core when `name` is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderSpec>,

    /// The inference engine and its options. Without `engine.type`, core chooses the
    /// engine from the model and the ready providers' capabilities and records it in
    /// `status.engine`.
    #[serde(default)]
    pub engine: EngineSpec,

    /// Aggregated or disaggregated (prefill/decode) serving.
    #[serde(default)]
    pub serving: ServingSpec,

    /// Replica counts, and per-role settings for disaggregated serving.
    #[serde(default)]
    pub scaling: ScalingSpec,

    /// Resources of each serving replica. Not allowed with `resources.gpu` in
    /// disaggregated mode (use `scaling.prefill/decode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceSpec>,

    /// A custom serving image; providers pick their own default when empty. The same
    /// setting as `engine.image`: set one of them, or both to the same image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// Environment variables for the serving containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,

    /// Labels and annotations for the serving pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplate>,

    /// Secret references.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<SecretsSpec>,

    /// Node selector for the serving pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Tolerations for the serving pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// Gateway API integration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewaySpec>,

    /// A GPU kernel cache to mount into the serving pods (the kernel-cache provider's
    /// `KernelCache`, in this namespace). Optional: without it, or while the cache is not
    /// ready, the engine compiles its kernels as usual.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_cache: Option<KernelCacheRef>,

    /// Warm the nodes first: the provider applies nothing that brings something new onto
    /// a node (the creation, a scale-up, an upgrade to a new image) until the `Warmup`
    /// (the kernel-cache provider's, `cache.kubeairunway.ai`, in this namespace) is
    /// `Completed`, and for an upgrade has preloaded the new images; meanwhile what runs
    /// is kept as it is. Either the name of a Warmup of yours, or an inline warmup from
    /// which the provider makes a Warmup named after this ModelDeployment (made again when
    /// the inline fields change, or when an upgrade needs images it did not preload). The
    /// condition `WarmedUp` says what waits and why. Other changes (fewer replicas, other
    /// fields) are applied at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<DeploymentWarmup>,
}

/// A reference to a `KernelCache` (group `cache.kubeairunway.ai`) in the
/// ModelDeployment's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelCacheRef {
    /// The KernelCache's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The model to serve.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Model identifier (a Hugging Face model id); required when `source` is huggingface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The model name the API serves; defaults to the basename of `id`. Ignored for
    /// `source: custom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_name: Option<String>,
    /// Where the weights come from.
    #[serde(default)]
    pub source: ModelSource,
    /// Volumes for model weights and compilation caches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
    /// A `ModelCache` (group `cache.kubeairunway.ai`) in this namespace whose node-local
    /// copy the serving pods mount read-only (`HF_HUB_CACHE`, `HF_HUB_OFFLINE=1`). Unset:
    /// a Ready ModelCache of `hf://<id>` at revision `main` in this namespace is used when
    /// there is one. A named cache that does not exist or is not Ready is not mounted: the
    /// engine downloads the model as without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_ref: Option<ModelCacheRef>,
}

/// A reference to a `ModelCache` (group `cache.kubeairunway.ai`) in the ModelDeployment's
/// namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheRef {
    /// The ModelCache's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Where the model weights come from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelSource {
    /// Downloaded from Hugging Face by the engine.
    #[default]
    Huggingface,
    /// Already inside the serving image.
    Custom,
}

/// Persistent storage mounted into the serving containers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// The volumes, keyed by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub volumes: Option<Vec<StorageVolume>>,
}

/// One volume for model storage.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageVolume {
    /// Volume name (a DNS label).
    #[schemars(length(max = 63), regex(pattern = r"^[a-z0-9]([a-z0-9\-]*[a-z0-9])?$"))]
    pub name: String,
    /// An existing PersistentVolumeClaim in the same namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Absolute mount path; defaults by purpose, required for `custom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
    /// What the volume holds.
    #[serde(default)]
    pub purpose: VolumePurpose,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Requested size of a controller-created claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,
    /// StorageClass of a controller-created claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Access mode of a controller-created claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<VolumeAccessMode>,
}

/// What a storage volume holds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum VolumePurpose {
    /// Model weights.
    ModelCache,
    /// Compilation caches.
    CompilationCache,
    /// Anything else; `mountPath` is required.
    #[default]
    Custom,
}

/// PersistentVolumeClaim access modes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum VolumeAccessMode {
    /// `ReadWriteOnce`
    ReadWriteOnce,
    /// `ReadWriteMany`
    ReadWriteMany,
    /// `ReadOnlyMany`
    ReadOnlyMany,
    /// `ReadWriteOncePod`
    ReadWriteOncePod,
}

/// Provider selection and provider-specific overrides.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    /// Provider name (`kaito`, `dynamo`, `kuberay`, or a third party's). Empty: core
    /// selects one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Provider-specific settings: the keys a provider documents it reads itself, and any
    /// other key as a JSON merge patch of its upstream object (objects merge, null
    /// deletes, lists replace), checked against the upstream schema; the object's
    /// name, namespace, owner and the platform's labels are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::free_form_object")]
    pub overrides: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The inference engine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineSpec {
    /// Engine type; empty: chosen by core (`status.engine`).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<EngineType>,
    /// The engine container's image: the same setting as `spec.image`, under the name AI
    /// Runway prefers. Set one of the two, or both to the same image; empty: the
    /// provider's default image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Maximum context length (vLLM `--max-model-len`, SGLang `--context-length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<i32>,
    /// Allow remote code from Hugging Face (vLLM and SGLang).
    #[serde(default)]
    pub trust_remote_code: bool,
    /// Prefix caching: reuse the KV cache already computed for a prompt's prefix. Unset:
    /// the engine's default. vLLM `--enable-prefix-caching` / `--no-enable-prefix-caching`;
    /// SGLang's radix cache (on by default, off with `--disable-radix-cache`); llama.cpp
    /// `--cache-prompt` / `--no-cache-prompt`. A provider that cannot pass it (TensorRT-LLM
    /// has no such option) names it as ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_prefix_caching: Option<bool>,
    /// Eager execution, without CUDA graphs: vLLM `--enforce-eager`, SGLang
    /// `--disable-cuda-graph`. Unset or false: the engine runs as it does by default. A
    /// provider that cannot pass it names it as ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforce_eager: Option<bool>,
    /// Engine flags passed through as `--key value`, in key order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<BTreeMap<String, String>>,
    /// Raw arguments for the engine's command line, passed as given after the rendered
    /// flags and `args` (for what a map cannot say: repeated flags, values of their own).
    /// A flag may not be set both here and in `args`. A provider whose engine takes no
    /// command line names them as ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_args: Option<Vec<String>>,
}

/// Inference engines.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum EngineType {
    /// vLLM
    Vllm,
    /// SGLang
    Sglang,
    /// TensorRT-LLM
    Trtllm,
    /// llama.cpp
    Llamacpp,
}

impl EngineType {
    /// Every engine, in the order the API lists them.
    pub const ALL: [EngineType; 4] = [
        EngineType::Vllm,
        EngineType::Sglang,
        EngineType::Trtllm,
        EngineType::Llamacpp,
    ];

    /// The value as written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineType::Vllm => "vllm",
            EngineType::Sglang => "sglang",
            EngineType::Trtllm => "trtllm",
            EngineType::Llamacpp => "llamacpp",
        }
    }
}

impl fmt::Display for EngineType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Serving mode.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingSpec {
    /// Aggregated (default) or disaggregated prefill/decode.
    #[serde(default)]
    pub mode: ServingMode,
}

/// Aggregated or disaggregated serving.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ServingMode {
    /// Prefill and decode in the same workers.
    #[default]
    Aggregated,
    /// Separate prefill and decode workers.
    Disaggregated,
}

impl ServingMode {
    /// The value as written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ServingMode::Aggregated => "aggregated",
            ServingMode::Disaggregated => "disaggregated",
        }
    }
}

impl fmt::Display for ServingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Replica counts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingSpec {
    /// Serving replicas in aggregated mode (0 scales to zero).
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Prefill workers (disaggregated mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<ComponentScaling>,
    /// Decode workers (disaggregated mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<ComponentScaling>,
}

impl Default for ScalingSpec {
    fn default() -> Self {
        Self {
            replicas: 1,
            prefill: None,
            decode: None,
        }
    }
}

/// One role of a disaggregated deployment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentScaling {
    /// Replicas of this role.
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// GPUs per replica; `count` is required in disaggregated mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSpec>,
    /// Memory per replica (e.g. `64Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

impl Default for ComponentScaling {
    fn default() -> Self {
        Self {
            replicas: 1,
            gpu: None,
            memory: None,
        }
    }
}

fn one() -> i32 {
    1
}

/// Resources of one serving replica.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSpec {
    /// GPUs; absent means CPU-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSpec>,
    /// Memory (e.g. `32Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// CPU (e.g. `4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
}

/// GPU request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuSpec {
    /// Number of GPUs.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub count: i32,
    /// Extended resource name of the GPU (AMD and Intel use their own).
    #[serde(rename = "type", default = "default_gpu_type")]
    pub type_: String,
}

impl Default for GpuSpec {
    fn default() -> Self {
        Self {
            count: 0,
            type_: default_gpu_type(),
        }
    }
}

/// `nvidia.com/gpu`, the default GPU resource name.
pub const DEFAULT_GPU_TYPE: &str = "nvidia.com/gpu";

fn default_gpu_type() -> String {
    DEFAULT_GPU_TYPE.to_string()
}

/// Pod template settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// Labels and annotations added to every serving pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PodMetadata>,
}

/// Pod labels and annotations.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodMetadata {
    /// Pod labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Pod annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Secret references (names only; no controller reads secret contents).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretsSpec {
    /// Name of the Secret holding `HF_TOKEN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugging_face_token: Option<String>,
}

/// Gateway API integration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// Create an InferencePool and HTTPRoute for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Use this existing HTTPRoute instead of creating one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_route_ref: Option<String>,
    /// Model name used for routing; defaults to `servedName` or `model.id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
}

impl GatewaySpec {
    /// Whether this `spec.gateway` asks for the gateway (`enabled: true`; absent means no).
    pub fn asked(gateway: Option<&Self>) -> bool {
        gateway.is_some_and(|g| g.enabled == Some(true))
    }
}

/// Observed state, written by several field managers, each owning its own fields.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentStatus {
    /// Lifecycle phase: core's while no provider is selected, the provider's after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Human-readable detail of the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The selected provider and what it created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderStatus>,
    /// The resolved engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineStatus>,
    /// Replica counts reported by the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaStatus>,
    /// The Service serving the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<EndpointStatus>,
    /// In-cluster URL of the OpenAI-compatible API served at the endpoint
    /// (http://<service>.<namespace>.svc.<cluster domain>:<port>/v1), written by the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Label selector of the serving pods, as the provider's upstream operator labels them
    /// (`kubeairunway.ai/model-deployment=<name>` for the Deployment provider), for the
    /// scale subresource (HPA, KEDA) and the gateway's InferencePool; written by the
    /// provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Gateway integration status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayStatus>,
    /// Conditions, each type owned by one writer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
    /// The generation the provider last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Lifecycle phase.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Waiting for validation or provider selection.
    Pending,
    /// The provider created the upstream object; it is not serving yet.
    Deploying,
    /// Serving.
    Running,
    /// A hard failure; see `message` and the conditions.
    Failed,
    /// Being deleted.
    Terminating,
}

impl Phase {
    /// The value as written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Deploying => "Deploying",
            Phase::Running => "Running",
            Phase::Failed => "Failed",
            Phase::Terminating => "Terminating",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The selected provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    /// Selected provider (core or a custom selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Name of the upstream object (the provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
    /// Kind of the upstream object (the provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_kind: Option<String>,
    /// Why this provider was selected (core or a custom selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_reason: Option<String>,
    /// The container images of the objects the provider renders for the spec at
    /// `status.observedGeneration`, sorted, each once (the provider; written also while
    /// a warmup holds the objects back, so the warmup can preload them). Empty: the
    /// rendered objects name no image (the upstream operator picks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<String>>,
}

/// The resolved engine: `spec.engine.type`, or the one core chose (written by core).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineStatus {
    /// Engine type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<EngineType>,
    /// Why this engine was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_reason: Option<String>,
}

/// Replica counts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// Desired replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<i32>,
    /// Ready replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<i32>,
    /// Available replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<i32>,
}

/// The Service serving the model's API.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatus {
    /// Service name, in the ModelDeployment's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Service port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Container port the serving pods (status.selector) serve the API on: the
    /// InferencePool's targetPorts; written by the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<i32>,
    /// InferencePool the upstream operator makes for the serving pods itself, in this
    /// namespace (the gateway then makes none); written by the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_pool: Option<String>,
}

/// Gateway integration status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// The Gateway's address (its first status.addresses value), as AI Runway reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Model name to use in API requests (the request's model, matched on the
    /// X-Gateway-Model-Name header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    /// URL of the OpenAI-compatible API through the Gateway
    /// (<scheme>://<address>[:<port>]/v1, from its first HTTP or HTTPS listener).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The Gateway routing to this model, as <namespace>/<name>.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The HTTPRoute in this namespace that routes to the model (the gateway's own, or
    /// spec.gateway.httpRouteRef).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_route: Option<String>,
}

impl ModelDeploymentSpec {
    /// Whether the deployment asks for the gateway (`spec.gateway.enabled: true`; absent
    /// means no).
    pub fn gateway_enabled(&self) -> bool {
        GatewaySpec::asked(self.gateway.as_ref())
    }

    /// GPUs per replica in aggregated mode (absent `resources.gpu` counts as 0, as
    /// provider selection sees it).
    pub fn gpu_count(&self) -> i32 {
        self.resources
            .as_ref()
            .and_then(|r| r.gpu.as_ref())
            .map_or(0, |g| g.count)
    }

    /// Whether the deployment asks for GPUs, in either serving mode.
    pub fn uses_gpu(&self) -> bool {
        match self.serving.mode {
            ServingMode::Aggregated => self.gpu_count() > 0,
            ServingMode::Disaggregated => [&self.scaling.prefill, &self.scaling.decode]
                .into_iter()
                .flatten()
                .any(|c| c.gpu.as_ref().is_some_and(|g| g.count > 0)),
        }
    }

    /// The engine container's image the user names: `engine.image`, else `image` (the
    /// two are one setting; the CRD refuses them set to different images). `None`: the
    /// provider's default. Every provider reads the image through this.
    pub fn effective_image(&self) -> Option<&str> {
        self.engine
            .image
            .as_deref()
            .filter(|i| !i.is_empty())
            .or_else(|| self.image.as_deref().filter(|i| !i.is_empty()))
    }

    /// The field that names the image [`Self::effective_image`] returns, for messages:
    /// `spec.engine.image` or `spec.image`.
    pub fn image_field(&self) -> &'static str {
        if self.engine.image.as_deref().is_some_and(|i| !i.is_empty()) {
            "spec.engine.image"
        } else {
            "spec.image"
        }
    }

    /// The provider named in the spec, if any (an empty name counts as none).
    pub fn provider_name(&self) -> Option<&str> {
        self.provider
            .as_ref()
            .and_then(|p| p.name.as_deref())
            .filter(|n| !n.is_empty())
    }

    /// The model name the API serves: `servedName`, else the basename of `model.id`.
    pub fn served_model_name(&self) -> Option<&str> {
        self.model
            .served_name
            .as_deref()
            .filter(|s| !s.is_empty())
            .or_else(|| {
                self.model
                    .id
                    .as_deref()
                    .map(|id| id.rsplit('/').next().unwrap_or(id))
            })
    }
}

impl ModelDeployment {
    /// The engine it is served with: `spec.engine.type`, else the one core chose and
    /// recorded in `status.engine.type`.
    pub fn resolved_engine(&self) -> Option<EngineType> {
        self.spec.engine.type_.or_else(|| {
            self.status
                .as_ref()
                .and_then(|s| s.engine.as_ref())
                .and_then(|e| e.type_)
        })
    }

    /// The field selector of the ModelDeployments whose `status.provider.name` is
    /// `provider` (the CRD's selectable field): what a provider watches.
    pub fn selected_for(provider: &str) -> String {
        format!("status.provider.name={provider}")
    }

    /// The provider that owns this ModelDeployment: `status.provider.name`.
    pub fn selected_provider(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.provider.as_ref())
            .and_then(|p| p.name.as_deref())
            .filter(|n| !n.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_selector_names_the_crds_selectable_field() {
        use kube::CustomResourceExt as _;
        let crd = ModelDeployment::crd();
        let selectable: Vec<String> = crd.spec.versions[0]
            .selectable_fields
            .iter()
            .flatten()
            .map(|f| f.json_path.clone())
            .collect();
        let selector = ModelDeployment::selected_for("dynamo");
        let (field, value) = selector.split_once('=').unwrap();
        assert_eq!(value, "dynamo");
        assert_eq!(selectable, vec![format!(".{field}")]);
    }

    #[test]
    fn defaults_match_the_reference_crd() {
        let spec: ModelDeploymentSpec =
            serde_json::from_value(serde_json::json!({"model": {"id": "a/b"}})).unwrap();
        assert_eq!(spec.model.source, ModelSource::Huggingface);
        assert_eq!(spec.serving.mode, ServingMode::Aggregated);
        assert_eq!(spec.scaling.replicas, 1);
        assert!(!spec.engine.trust_remote_code);
        let gpu: GpuSpec = serde_json::from_value(serde_json::json!({"count": 2})).unwrap();
        assert_eq!(gpu.type_, "nvidia.com/gpu");
    }

    #[test]
    fn gpu_use_per_mode() {
        let mut spec: ModelDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"id": "a/b"}, "resources": {"gpu": {"count": 1}}
        }))
        .unwrap();
        assert!(spec.uses_gpu());
        spec.serving.mode = ServingMode::Disaggregated;
        assert!(!spec.uses_gpu());
        spec.scaling.decode = Some(ComponentScaling {
            gpu: Some(GpuSpec {
                count: 2,
                ..GpuSpec::default()
            }),
            ..ComponentScaling::default()
        });
        assert!(spec.uses_gpu());
    }

    #[test]
    fn the_effective_image_is_engine_image_else_image() {
        let mut spec = ModelDeploymentSpec::default();
        assert_eq!(spec.effective_image(), None);
        spec.image = Some("legacy:1".into());
        assert_eq!(spec.effective_image(), Some("legacy:1"));
        assert_eq!(spec.image_field(), "spec.image");
        spec.engine.image = Some("engine:2".into());
        assert_eq!(spec.effective_image(), Some("engine:2"));
        assert_eq!(spec.image_field(), "spec.engine.image");
        spec.engine.image = Some(String::new());
        assert_eq!(spec.effective_image(), Some("legacy:1"), "empty is unset");
        spec.image = None;
        assert_eq!(spec.effective_image(), None);
    }

    #[test]
    fn served_name_falls_back_to_id_basename() {
        let mut spec = ModelDeploymentSpec::default();
        spec.model.id = Some("meta-llama/Llama-3.1-8B-Instruct".into());
        assert_eq!(spec.served_model_name(), Some("Llama-3.1-8B-Instruct"));
        spec.model.served_name = Some("llama".into());
        assert_eq!(spec.served_model_name(), Some("llama"));
    }

    #[test]
    fn absent_optionals_are_not_serialized() {
        let status = ModelDeploymentStatus {
            provider: Some(ProviderStatus {
                name: Some("kaito".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            serde_json::json!({"provider": {"name": "kaito"}})
        );
    }
}
