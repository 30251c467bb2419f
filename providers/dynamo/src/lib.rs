//! The Dynamo provider: ModelDeployment to NVIDIA Dynamo's DynamoGraphDeployment
//! (`nvidia.com`, v1beta1 preferred, v1alpha1 for Dynamo <= 1.1), aggregated and
//! disaggregated, with vLLM, SGLang and TensorRT-LLM workers.
//!
//! - [`graph`]: the frontend and worker components, from the ModelDeployment;
//! - [`args`]: each backend's worker command line;
//! - [`storage`]: `spec.model.storage` as PVC volumes and Dynamo's compilation cache;
//! - [`v1alpha1`], [`v1beta1`]: one adapter per upstream version;
//! - [`overrides`]: `provider.overrides` (`routerMode`, `frontend.*`, `runtimeVersion`);
//! - [`status`]: the upstream status as ours.
//!
//! The SDK's shared building blocks it uses: the vLLM and SGLang flag tables and tensor
//! parallelism ([`kubeairunway_sdk::engine::Flags`], in [`args`]), the GPUs of a replica
//! ([`kubeairunway_sdk::gpu::per_replica`]), the Hugging Face token Secret
//! ([`kubeairunway_sdk::engine::hf_token_secret`]), and the storage defaults, checks and
//! volume shapes ([`kubeairunway_sdk::storage`]). What it leaves to the operator instead,
//! because the operator adds it to every component itself
//! (docs/upstream.md#dynamo-operator-defaults): `/dev/shm` (an 8Gi memory-backed volume),
//! the probes (the workers' on Dynamo's system port 9090, not an engine port), and
//! `VLLM_CACHE_ROOT` for the compilation cache. Dynamo v1alpha1's resources are its own
//! shape (`gpu`, `gpuType`), so only the GPU count and resource name are shared.

pub mod args;
pub mod cli;
pub mod graph;
pub mod overrides;
pub mod status;
pub mod storage;
pub mod v1alpha1;
pub mod v1beta1;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kubeairunway_sdk::api::{
    Capabilities, EndpointPickerCapabilities, EngineCapability, EngineType, GatewayCapabilities,
    InferenceProviderConfigSpec, SelectionRule, ServingMode,
};
use kubeairunway_sdk::provider::object;
use kubeairunway_sdk::{
    Live, ModelDeployment, Observed, Provider, RenderError, Rendered, ServingPods, UpstreamApi,
    UpstreamRef,
};
use serde_json::json;

/// The provider's name.
pub const NAME: &str = "dynamo";
/// The Dynamo version whose runtime images are used by default.
pub const DEFAULT_DYNAMO_VERSION: &str = "1.1.0";

/// Settings from flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Tag of `nvcr.io/nvidia/ai-dynamo/*-runtime` images.
    pub dynamo_version: String,
    /// How long `failed` must last before the ModelDeployment is `Failed`.
    pub failed_after: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            dynamo_version: DEFAULT_DYNAMO_VERSION.to_string(),
            failed_after: Duration::from_secs(300),
        }
    }
}

/// The Dynamo provider.
#[derive(Debug, Default)]
pub struct Dynamo {
    settings: Settings,
    /// When each DynamoGraphDeployment (by uid) was first seen `failed`.
    failed_seen: Mutex<HashMap<String, Timestamp>>,
}

impl Dynamo {
    /// A provider with these settings.
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            failed_seen: Mutex::new(HashMap::new()),
        }
    }

    /// Remember when `live` was first seen failed; forget it once it is not.
    fn failed_since(&self, live: &DynamicObject, failed: bool) -> Option<Timestamp> {
        let key = live.metadata.uid.clone().unwrap_or_default();
        let mut seen = self
            .failed_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if failed {
            Some(*seen.entry(key).or_insert_with(Timestamp::now))
        } else {
            seen.remove(&key);
            None
        }
    }
}

impl Dynamo {
    /// With `spec.gateway` the operator makes the pool `<name>-pool` in the graph's
    /// namespace and runs Dynamo's own picker ([`graph::pool_name`], [`graph::epp_image`];
    /// AI Runway declares the same, `providers/dynamo/config.go@b0d3fb7`).
    fn gateway_capabilities(&self) -> GatewayCapabilities {
        GatewayCapabilities {
            manages_inference_pool: true,
            inference_pool_name_pattern: Some(graph::pool_name("{name}")),
            inference_pool_namespace: Some("{namespace}".into()),
            endpoint_picker: Some(EndpointPickerCapabilities {
                image: Some(graph::epp_image(&self.settings.dynamo_version)),
                config_data: None,
            }),
            ignores_served_name: false,
        }
    }
}

impl Provider for Dynamo {
    fn name(&self) -> &str {
        NAME
    }

    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    fn config(&self) -> InferenceProviderConfigSpec {
        let rule = |condition: &str, priority| SelectionRule {
            condition: condition.to_string(),
            priority,
        };
        InferenceProviderConfigSpec {
            // Each backend's workers on GPUs behind Dynamo's frontend, aggregated or
            // prefill/decode (`graph.rs` renders both for all three).
            capabilities: Some(Capabilities::serving(
                [EngineType::Vllm, EngineType::Sglang, EngineType::Trtllm].map(|engine| {
                    EngineCapability::gpu_only(engine)
                        .serving_modes([ServingMode::Aggregated, ServingMode::Disaggregated])
                        .native_api_formats()
                        .gateway(self.gateway_capabilities())
                }),
            )),
            selection_rules: vec![
                rule("spec.engine.type == 'trtllm'", 100),
                rule("spec.engine.type == 'sglang'", 100),
                rule("spec.serving.mode == 'disaggregated'", 90),
                rule(
                    "spec.engine.type == 'vllm' && has(spec.resources) && has(spec.resources.gpu) && spec.resources.gpu.count > 0",
                    50,
                ),
            ],
            documentation: Some("https://github.com/ai-dynamo/dynamo".to_string()),
            installation: None,
        }
    }

    fn upstream(&self) -> UpstreamRef {
        UpstreamRef::new(
            "nvidia.com",
            "DynamoGraphDeployment",
            "dynamographdeployments",
            &["v1beta1", "v1alpha1"],
        )
    }

    fn render(
        &self,
        md: &ModelDeployment,
        upstream: &UpstreamApi,
    ) -> Result<Rendered, RenderError> {
        let o = overrides::parse(md)?;
        let (graph, mut warnings) = graph::build(md, &o, &self.settings.dynamo_version)?;
        let (spec, more) = match upstream.version.as_str() {
            "v1beta1" => v1beta1::spec(&graph),
            "v1alpha1" => v1alpha1::spec(&graph),
            other => {
                return Err(RenderError(format!(
                    "no adapter for DynamoGraphDeployment {other}"
                )));
            }
        };
        warnings.extend(more);
        let dgd = object(json!({
            "apiVersion": upstream.api_version(),
            "kind": upstream.kind,
            "metadata": {"name": graph.name},
            "spec": spec,
        }))?;
        Ok(Rendered {
            objects: vec![dgd],
            warnings,
        })
    }

    fn typed_overrides(&self) -> &'static [&'static str] {
        &overrides::TYPED
    }

    /// `spec.backendFramework` may not change (`webhook/validation/dynamographdeployment.go:
    /// 164-168@3e3b3b187`, `:730-737@2a6da14c8`). Neither may the set of component names
    /// (`:237-274@3e3b3b187`, `:687-704@2a6da14c8`), but those follow `engine.type` and
    /// `serving.mode`, which recreate the object anyway.
    fn immutable_fields(&self, kind: &str) -> &'static [&'static str] {
        if kind == "DynamoGraphDeployment" {
            &["spec.backendFramework"]
        } else {
            &[]
        }
    }

    /// The workers, as the Dynamo operator labels their pods and lists them itself
    /// ([`graph::worker_pods`]); no port: the workers serve no HTTP API of their own (the
    /// frontend does, and routes to them).
    fn serving_pods(&self, md: &ModelDeployment) -> ServingPods {
        graph::worker_pods(md)
    }

    fn observe(&self, md: &ModelDeployment, live: &Live) -> Observed {
        let live = live.primary();
        let upstream = status::Upstream::read(live.and_then(|l| l.data.get("status")));
        let failed_since =
            live.and_then(|l| self.failed_since(l, upstream.state.as_deref() == Some("failed")));
        status::observe(
            md,
            &upstream,
            failed_since,
            self.settings.failed_after,
            Timestamp::now(),
        )
    }
}

#[cfg(test)]
mod tests;
