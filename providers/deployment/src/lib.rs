//! The Deployment provider: serves vLLM, SGLang, TensorRT-LLM and llama.cpp
//! ModelDeployments with a plain `apps/v1` Deployment and a `v1` Service, so it needs no
//! operator and runs on any cluster. Its upstream is the built-in Deployment kind: the
//! Deployment controller plays the operator, and its status is ours
//! ([`kubeairunway_sdk::workload::deployment`]).
//!
//! It is built only on the SDK's public API, as a third party's provider would be, and is
//! the reference for one.
//!
//! - Selection: one rule at priority [`PRIORITY`], below every operator-backed provider
//!   (KAITO and Dynamo use 50 to 100; KubeRay is only chosen by name), so it serves what
//!   no operator's rule takes, and anything that names it (`spec.provider.name:
//!   deployment`).
//! - The serving container is the SDK's ([`kubeairunway_sdk::engine::container`]) with
//!   an image per engine ([`Images`]: the spec's own image wins, `spec.engine.image` or
//!   `spec.image`; SGLang has none unless given,
//!   TensorRT-LLM none at all, so its ModelDeployments name theirs); the pods get
//!   `spec.nodeSelector` and `spec.tolerations`; the Service (port [`SERVICE_PORT`])
//!   selects them by the ModelDeployment's label and is the endpoint.
//! - Scaling: `spec.scaling.replicas` is the Deployment's. A HorizontalPodAutoscaler or
//!   KEDA may target the ModelDeployment's scale subresource (which sets
//!   `spec.scaling.replicas`, applied here like any change). With
//!   `provider.overrides.autoscaled: true` the Deployment's replicas are left to an
//!   autoscaler that targets the Deployment itself: `spec.replicas` is not rendered, so an
//!   apply never resets its count. The ModelDeployment API has no autoscaling settings, so
//!   this provider renders no autoscaler of its own.
//! - The engine fields are the SDK container's: prefix caching and eager execution as the
//!   engine's flags, named as ignored where its server has none (TensorRT-LLM, llama.cpp's
//!   eager), and `engine.extraArgs` last on the command line.
//! - `spec.gateway` is core's gateway's (docs/gateway.md), from [`Provider::serving_pods`];
//!   the claim settings of `model.storage` (claims are mounted, never created). `spec.kernelCache`
//!   is served by the kernel-cache provider's pod webhook (the pods carry the
//!   ModelDeployment's label).
//! - `provider.overrides`: [`Overrides`].

pub mod cli;

use std::collections::BTreeMap;

use kubeairunway_sdk::api::{
    Capabilities, EngineCapability, EngineType, HelmChart, InferenceProviderConfigSpec,
    Installation, ModelDeployment, SelectionRule, ServingMode,
};
use kubeairunway_sdk::provider::object;
use kubeairunway_sdk::render::{pod_annotations, pod_labels};
use kubeairunway_sdk::{
    Incompatible, Live, Observed, Provider, RenderError, Rendered, ServingPods, UpstreamApi,
    UpstreamRef, Warning, engine, labels, overrides, storage, workload,
};
use serde::Deserialize;
use serde_json::json;

/// The provider's name (`spec.provider.name: deployment`).
pub const NAME: &str = "deployment";
/// The port the Service exposes.
pub const SERVICE_PORT: i32 = 80;
/// The priority of its selection rule: below every operator-backed provider's.
pub const PRIORITY: i32 = 1;
/// The vLLM image unless `spec.image` is set (`--vllm-image`).
pub const DEFAULT_VLLM_IMAGE: &str = "vllm/vllm-openai:v0.11.0";
/// The llama.cpp server image for CPU-only replicas (`--llamacpp-image`).
pub const DEFAULT_LLAMACPP_IMAGE: &str = "ghcr.io/ggml-org/llama.cpp:server";
/// The llama.cpp server image for replicas with GPUs (`--llamacpp-gpu-image`): the CUDA
/// build (llama.cpp's `docs/docker.md`); the CPU build ignores GPUs.
pub const DEFAULT_LLAMACPP_GPU_IMAGE: &str = "ghcr.io/ggml-org/llama.cpp:server-cuda";

/// The top-level override keys the provider reads itself (`Provider::typed_overrides`);
/// every other key is merged into the Deployment by the runtime.
pub const TYPED_OVERRIDES: [&str; 2] = ["progressDeadlineSeconds", "autoscaled"];

/// The documented `provider.overrides` keys.
#[derive(Debug, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct Overrides {
    /// How long the Deployment controller waits for progress before it declares the
    /// rollout failed (`spec.progressDeadlineSeconds`; Kubernetes' default is 600, short
    /// for a large model's first download).
    pub progress_deadline_seconds: Option<i32>,
    /// Leave the replica count to an autoscaler (a HorizontalPodAutoscaler or KEDA
    /// targeting the Deployment through its scale subresource): `spec.replicas` is not
    /// rendered, so an apply never resets what the autoscaler set.
    pub autoscaled: bool,
}

/// The serving image of each engine when `spec.image` is empty; `None`: `spec.image` is
/// required for that engine. TensorRT-LLM has no entry: `spec.image` is always required
/// for it (an image with `trtllm-serve`, such as NVIDIA's
/// `nvcr.io/nvidia/tensorrt-llm/release`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    /// vLLM.
    pub vllm: Option<String>,
    /// SGLang.
    pub sglang: Option<String>,
    /// llama.cpp without GPUs.
    pub llamacpp: Option<String>,
    /// llama.cpp with GPUs.
    pub llamacpp_gpu: Option<String>,
}

impl Default for Images {
    fn default() -> Self {
        Self {
            vllm: Some(DEFAULT_VLLM_IMAGE.into()),
            sglang: None,
            llamacpp: Some(DEFAULT_LLAMACPP_IMAGE.into()),
            llamacpp_gpu: Some(DEFAULT_LLAMACPP_GPU_IMAGE.into()),
        }
    }
}

impl Images {
    /// The images given as flags: an empty one is none (`spec.image` is then required).
    pub fn new(vllm: &str, sglang: &str, llamacpp: &str, llamacpp_gpu: &str) -> Self {
        let given = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        Self {
            vllm: given(vllm),
            sglang: given(sglang),
            llamacpp: given(llamacpp),
            llamacpp_gpu: given(llamacpp_gpu),
        }
    }

    /// The image for `md` (the spec's own first: `spec.engine.image`, or `spec.image`,
    /// one setting), or why there is none.
    pub fn for_spec(&self, md: &ModelDeployment) -> Result<String, String> {
        if let Some(image) = md.spec.effective_image() {
            return Ok(image.to_string());
        }
        let engine = md.spec.engine.type_;
        let default = match engine {
            Some(EngineType::Vllm) => self.vllm.as_ref(),
            Some(EngineType::Sglang) => self.sglang.as_ref(),
            Some(EngineType::Llamacpp) if md.spec.gpu_count() > 0 => self.llamacpp_gpu.as_ref(),
            Some(EngineType::Llamacpp) => self.llamacpp.as_ref(),
            Some(EngineType::Trtllm) | None => None,
        };
        default.filter(|i| !i.is_empty()).cloned().ok_or_else(|| {
            format!(
                "spec.engine.image (or spec.image) is required for the {} engine: the \
                 Deployment provider has no default image for it",
                engine.map_or("unset", EngineType::as_str)
            )
        })
    }
}

/// The provider; `name` is what `spec.provider.name` / `status.provider.name` say
/// ([`NAME`] unless tests run several side by side).
#[derive(Clone, Debug)]
pub struct DeploymentProvider {
    /// The provider's name.
    pub name: String,
    /// Default serving images.
    pub images: Images,
}

impl Default for DeploymentProvider {
    fn default() -> Self {
        Self {
            name: NAME.into(),
            images: Images::default(),
        }
    }
}

impl DeploymentProvider {
    /// The provider named `name` with the default images.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }
}

impl Provider for DeploymentProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    fn config(&self) -> InferenceProviderConfigSpec {
        InferenceProviderConfigSpec {
            // Each engine's own OpenAI-compatible server in one Deployment, aggregated:
            // vLLM, SGLang and TensorRT-LLM on GPUs (the CRD refuses them without one),
            // llama.cpp on CPUs or GPUs (its two images). API formats: what each
            // engine's server exposes.
            capabilities: Some(Capabilities::serving(
                [
                    EngineType::Vllm,
                    EngineType::Sglang,
                    EngineType::Trtllm,
                    EngineType::Llamacpp,
                ]
                .map(|engine| {
                    EngineCapability::gpu_only(engine)
                        .cpu(engine == EngineType::Llamacpp)
                        .serving_modes([ServingMode::Aggregated])
                        .native_api_formats()
                }),
            )),
            // The fallback: true for everything it serves, at the lowest priority, so an
            // operator-backed provider whose rule holds always wins.
            selection_rules: vec![SelectionRule {
                condition: "spec.engine.type in ['vllm', 'sglang', 'trtllm', 'llamacpp'] && \
                            spec.serving.mode == 'aggregated'"
                    .into(),
                priority: PRIORITY,
            }],
            documentation: Some(
                "https://github.com/kubeairunway/kubeairunway/tree/main/providers/deployment"
                    .into(),
            ),
            // No operator: only this provider's own chart.
            installation: Some(Installation {
                description: Some(
                    "no operator needed: the Deployment provider's chart alone".into(),
                ),
                helm_charts: vec![HelmChart {
                    name: "deployment-provider".into(),
                    chart: "oci://ghcr.io/kubeairunway/charts/deployment-provider".into(),
                    version: Some(env!("CARGO_PKG_VERSION").into()),
                    namespace: "kubeairunway-system".into(),
                    create_namespace: None,
                }],
                ..Installation::default()
            }),
        }
    }

    fn upstream(&self) -> UpstreamRef {
        UpstreamRef::new("apps", "Deployment", "deployments", &["v1"])
    }

    /// Engines and the serving mode are the runtime's capability fit (the config above);
    /// what is left is whether the engine has an image.
    fn check(&self, md: &ModelDeployment) -> Result<(), Incompatible> {
        self.images.for_spec(md).map(drop).map_err(Incompatible)
    }

    fn typed_overrides(&self) -> &'static [&'static str] {
        &TYPED_OVERRIDES
    }

    fn render(
        &self,
        md: &ModelDeployment,
        upstream: &UpstreamApi,
    ) -> Result<Rendered, RenderError> {
        let o = overrides::parse::<Overrides>(md, &TYPED_OVERRIDES)?;
        let spec = &md.spec;
        let image = self.images.for_spec(md).map_err(RenderError)?;
        let engine = engine::container(md, &image, engine::PORT)?;
        let mut warnings = engine.warnings;
        // The claims of `model.storage` are mounted; this provider creates none.
        warnings.extend(storage::unmanaged_claim_warnings(
            md,
            "the Deployment provider",
        ));
        let name = md.metadata.name.clone().unwrap_or_default();
        // The selector is immutable in apps/v1 (see immutable_fields): only the one label
        // that never changes for this ModelDeployment.
        let selector: BTreeMap<&str, &str> = [(labels::MODEL_DEPLOYMENT, name.as_str())].into();
        let mut pod_spec = json!({
            "containers": [engine.container],
            "volumes": engine.volumes,
        });
        if let Some(n) = spec.node_selector.as_ref().filter(|n| !n.is_empty()) {
            pod_spec["nodeSelector"] = json!(n);
        }
        if let Some(t) = spec.tolerations.as_ref().filter(|t| !t.is_empty()) {
            pod_spec["tolerations"] = json!(t);
        }
        let mut deployment_spec = json!({
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels(md), "annotations": pod_annotations(md)},
                "spec": pod_spec,
            },
        });
        if !o.autoscaled {
            deployment_spec["replicas"] = json!(spec.scaling.replicas);
        } else if spec.scaling.replicas != 1 {
            warnings.push(Warning::unsupported_field(
                "spec.scaling.replicas",
                "provider.overrides.autoscaled leaves the replicas to the autoscaler (the \
                 Deployment starts with one)",
            ));
        }
        if let Some(seconds) = o.progress_deadline_seconds {
            deployment_spec["progressDeadlineSeconds"] = json!(seconds);
        }
        let deployment = object(json!({
            "apiVersion": upstream.api_version(),
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": deployment_spec,
        }))?;
        let service = object(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {
                "selector": selector,
                "ports": [{"name": engine::PORT_NAME, "port": SERVICE_PORT,
                           "targetPort": engine::PORT_NAME, "protocol": "TCP"}],
            },
        }))?;
        Ok(Rendered {
            objects: vec![deployment, service],
            warnings,
        })
    }

    /// The Deployment's pods: the one label its selector names, on the engine's port.
    fn serving_pods(&self, md: &ModelDeployment) -> ServingPods {
        ServingPods::of(md).on_port(engine::PORT)
    }

    /// A Deployment's selector cannot change
    /// (`pkg/apis/apps/validation/validation.go@v1.36.0`, `ValidateDeploymentUpdate`).
    fn immutable_fields(&self, kind: &str) -> &'static [&'static str] {
        match kind {
            "Deployment" => &["spec.selector"],
            _ => &[],
        }
    }

    fn observe(&self, md: &ModelDeployment, live: &Live) -> Observed {
        let name = md.metadata.name.clone().unwrap_or_default();
        let Some(deployment) = live.primary() else {
            return Observed::deploying("creating the Deployment");
        };
        let observed = workload::deployment(deployment, "model server");
        // The endpoint is the Service, once it exists.
        match live.get("Service", &name) {
            Some(_) => observed.with_endpoint(name, SERVICE_PORT),
            None => observed,
        }
    }
}

#[cfg(test)]
mod tests;
