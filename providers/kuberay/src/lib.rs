//! The KubeRay provider: a ModelDeployment becomes a `ray.io/v1` RayService that runs a
//! Ray Serve LLM OpenAI app (vLLM) on a Ray cluster of one head and GPU workers.
//!
//! - [`check`]: what KubeRay can serve (messages for the user, KubeRay's name rules, what its
//!   validation or Ray Serve LLM would refuse);
//! - [`overrides`]: the typed `provider.overrides` (`head.*`);
//! - [`serve_config`]: the `serveConfigV2` YAML (Ray Serve LLM application);
//! - [`storage`]: `spec.model.storage` as volumes of every Ray pod;
//! - [`rayservice`]: the RayService object with its head and worker groups;
//! - [`status`]: the RayService status read as ours.
//!
//! Every spec field is served (`spec.gateway` by core's gateway, from
//! [`Provider::serving_pods`]) except the claim-creation settings of storage volumes; those are reported with
//! `Warning::unsupported_field`. `spec.kernelCache` is served by the kernel-cache
//! provider's pod webhook (Ray pods carry the ModelDeployment label). A RayService has no
//! field its CRD declares immutable that we render (the CRD's `self == oldSelf` rules are
//! on `managedBy` and `gcsFaultToleranceOptions.backend` only), so
//! `Provider::immutable_fields` keeps its default.

pub mod check;
pub mod cli;
pub mod overrides;
pub mod rayservice;
pub mod serve_config;
pub mod settings;
pub mod status;
pub mod storage;

#[cfg(test)]
mod render_tests;

use kubeairunway_sdk::api::{
    ApiFormat, Capabilities, EngineCapability, EngineType, HelmChart, HelmRepo,
    InferenceProviderConfigSpec, Installation, ModelDeployment, ServingMode,
};
use kubeairunway_sdk::{
    Incompatible, Live, Observed, Provider, RenderError, Rendered, ServingPods, UpstreamApi,
    UpstreamRef, Warning,
};

pub use settings::{DEFAULT_RAY_IMAGE, DEFAULT_RAY_VERSION, KubeRayProvider, NAME};

impl Provider for KubeRayProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    fn config(&self) -> InferenceProviderConfigSpec {
        InferenceProviderConfigSpec {
            // Ray Serve LLM runs vLLM on GPUs, aggregated or prefill/decode; its OpenAI
            // app serves chat completions, not `/v1/responses` or `/v1/messages`.
            capabilities: Some(Capabilities::serving([EngineCapability::gpu_only(
                EngineType::Vllm,
            )
            .serving_modes([ServingMode::Aggregated, ServingMode::Disaggregated])
            .api_formats([ApiFormat::OpenaiChat])])),
            // No selection rules: KubeRay is never auto-selected, only when named.
            selection_rules: Vec::new(),
            documentation: Some("https://docs.ray.io/en/latest/serve/llm/".to_string()),
            installation: Some(Installation {
                helm_repos: vec![HelmRepo {
                    name: "kuberay".to_string(),
                    url: "https://ray-project.github.io/kuberay-helm/".to_string(),
                }],
                helm_charts: vec![HelmChart {
                    name: "kuberay-operator".to_string(),
                    chart: "kuberay/kuberay-operator".to_string(),
                    version: Some("1.3.0".to_string()),
                    namespace: "ray-system".to_string(),
                    create_namespace: Some(true),
                }],
                steps: Vec::new(),
                description: Some(
                    "KubeRay operator (1.3 or newer) for RayService; serving images are rayproject/ray-llm"
                        .to_string(),
                ),
                default_namespace: Some("ray-system".to_string()),
            }),
        }
    }

    fn upstream(&self) -> UpstreamRef {
        UpstreamRef::new("ray.io", "RayService", "rayservices", &["v1"])
    }

    fn check(&self, md: &ModelDeployment) -> Result<(), Incompatible> {
        check::check(md)
    }

    fn typed_overrides(&self) -> &'static [&'static str] {
        &overrides::TYPED
    }

    fn render(
        &self,
        md: &ModelDeployment,
        upstream: &UpstreamApi,
    ) -> Result<Rendered, RenderError> {
        let o = kubeairunway_sdk::overrides::parse::<overrides::KubeRayOverrides>(
            md,
            &overrides::TYPED,
        )?;
        o.check()?;
        let mut warnings = storage::warnings(md);
        if md
            .spec
            .engine
            .extra_args
            .as_ref()
            .is_some_and(|a| !a.is_empty())
        {
            warnings.push(Warning::unsupported_field(
                "spec.engine.extraArgs",
                "Ray Serve LLM takes vLLM's engine arguments as typed keywords \
                 (engine_kwargs), not a command line, and raw arguments cannot be read as \
                 keywords faithfully (bare and --no- flags, repeated flags); set them in \
                 spec.engine.args",
            ));
        }
        let object = rayservice::render(self, md, &upstream.api_version(), &o)?;
        Ok(Rendered {
            objects: vec![object],
            warnings,
        })
    }

    fn observe(&self, md: &ModelDeployment, live: &Live) -> Observed {
        status::observe(md, live.primary())
    }

    /// The pods the Serve Service selects: KubeRay copies the template's labels (ours
    /// among them) onto every pod (`labelPod`, ray-operator/controllers/ray/common/pod.go
    /// :1167-1186) and labels a RayService's serving pods `ray.io/serve=true` (`BuildPod`,
    /// :836-843; the Service selects it, common/service.go:197-205), all @v1.7.0; the
    /// cluster name (`ray.io/cluster`) is generated, so our label stands in for it.
    /// Serve's HTTP proxy listens on [`rayservice::SERVE_PORT`].
    fn serving_pods(&self, md: &ModelDeployment) -> ServingPods {
        ServingPods::of(md)
            .label(SERVE_LABEL, "true")
            .on_port(rayservice::SERVE_PORT)
    }
}

/// The label KubeRay puts on a RayService's pods that take Serve traffic
/// (`RayClusterServingServiceLabelKey`, ray-operator/controllers/ray/utils/constant.go:24
/// @v1.7.0).
pub const SERVE_LABEL: &str = "ray.io/serve";

#[cfg(test)]
mod tests {
    use kubeairunway_sdk::testing::ModelDeploymentBuilder;

    use super::*;

    /// Engines other than vLLM and CPU-only specs are refused by the runtime from
    /// KubeRay's registered capabilities, before `check` runs.
    #[test]
    fn what_the_capabilities_exclude_is_refused_by_the_runtime() {
        let provider = KubeRayProvider::default();
        let refused = |md: &ModelDeployment| {
            kubeairunway_sdk::runtime::fit::check(&provider, md)
                .unwrap_err()
                .0
        };
        let sglang = ModelDeploymentBuilder::new("m")
            .engine(kubeairunway_sdk::api::EngineType::Sglang)
            .build();
        assert_eq!(
            refused(&sglang),
            "spec.engine.type is sglang, which provider kuberay does not support: it serves the engines vllm"
        );
        assert_eq!(
            refused(&ModelDeploymentBuilder::new("m").gpus(0).build()),
            "spec.resources.gpu.count is 0 (CPU only), but provider kuberay requires GPU for vllm (set resources.gpu.count > 0)"
        );
        assert_eq!(
            kubeairunway_sdk::runtime::fit::check(
                &provider,
                &ModelDeploymentBuilder::new("m").build()
            ),
            Ok(())
        );
    }
}
