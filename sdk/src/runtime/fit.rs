//! Capability fit, the runtime's first word on a ModelDeployment: a provider is asked to
//! [`Provider::check`] only what its registered capabilities ([`Provider::config`]) cover.
//! The rule is selection's own ([`selection::fits`]), so a provider never repeats it in
//! `check`, and a ModelDeployment that names a provider core would never have chosen for
//! it gets the same answer as one that fits no provider.

use crate::api::ModelDeployment;
use crate::provider::{Incompatible, Provider};
use crate::selection;

/// Whether `provider`'s registered capabilities cover `md`, then whether its own
/// [`Provider::check`] accepts it: the refusal, with the message for the user, that
/// becomes `ProviderCompatible=False` (reason `IncompatibleConfiguration`), phase `Failed`.
pub fn check<P: Provider + ?Sized>(provider: &P, md: &ModelDeployment) -> Result<(), Incompatible> {
    fits(provider.name(), &provider.config(), md)?;
    provider.check(md)
}

/// Whether the capabilities in `config` cover `md`'s spec; the refusal names the field,
/// its value and what provider `name` serves. A provider that registers no capabilities
/// serves nothing (as selection sees it).
pub fn fits(
    name: &str,
    config: &crate::InferenceProviderConfigSpec,
    md: &ModelDeployment,
) -> Result<(), Incompatible> {
    let caps = config.capabilities.clone().unwrap_or_default();
    selection::fits(&caps, &md.spec).map_err(|misfit| Incompatible(misfit.explain(name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        Capabilities, EngineCapability, EngineType, InferenceProviderConfigSpec, ServingMode,
    };
    use serde_json::json;

    fn config(
        engines: &[EngineType],
        modes: &[ServingMode],
        cpu: bool,
        gpu: bool,
    ) -> InferenceProviderConfigSpec {
        InferenceProviderConfigSpec {
            capabilities: Some(Capabilities {
                engines: engines.iter().copied().map(EngineCapability::new).collect(),
                serving_modes: modes.to_vec(),
                cpu_support: cpu,
                gpu_support: gpu,
                features: Vec::new(),
            }),
            ..InferenceProviderConfigSpec::default()
        }
    }

    /// A ModelDeployment of `spec` (the model is set).
    fn md(mut spec: serde_json::Value) -> ModelDeployment {
        spec["model"] = json!({"id": "a/b"});
        ModelDeployment::new("m", serde_json::from_value(spec).unwrap())
    }

    fn refusal(config: &InferenceProviderConfigSpec, md: &ModelDeployment) -> String {
        fits("p", config, md).unwrap_err().0
    }

    const AGG: &[ServingMode] = &[ServingMode::Aggregated];
    const BOTH: &[ServingMode] = &[ServingMode::Aggregated, ServingMode::Disaggregated];
    const VLLM_LLAMA: &[EngineType] = &[EngineType::Vllm, EngineType::Llamacpp];

    #[test]
    fn what_fits_is_accepted() {
        let gpu_vllm = config(&[EngineType::Vllm], BOTH, false, true);
        let vllm = md(json!({"engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}));
        assert_eq!(fits("p", &gpu_vllm, &vllm), Ok(()));
        let cpu = config(&[EngineType::Llamacpp], &[], true, false);
        let llama = md(json!({"engine": {"type": "llamacpp"}}));
        assert_eq!(
            fits("p", &cpu, &llama),
            Ok(()),
            "no modes listed: aggregated"
        );
    }

    #[test]
    fn a_misfit_names_the_field_its_value_and_what_the_provider_serves() {
        let kaito_like = config(VLLM_LLAMA, AGG, true, true);
        let sglang = md(json!({"engine": {"type": "sglang"}, "resources": {"gpu": {"count": 1}}}));
        assert_eq!(
            refusal(&kaito_like, &sglang),
            "spec.engine.type is sglang, which provider p does not support: it serves the engines vllm, llamacpp"
        );
        assert_eq!(
            refusal(&kaito_like, &md(json!({}))),
            "spec.engine.type is not set and core recorded no engine in status.engine: provider p serves the engines vllm, llamacpp"
        );
        let disaggregated = md(
            json!({"engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
            "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 2}}}}),
        );
        assert_eq!(
            refusal(&kaito_like, &disaggregated),
            "spec.serving.mode is disaggregated, which provider p does not support with vllm: it serves the serving modes aggregated"
        );

        let gpu_only = config(VLLM_LLAMA, BOTH, false, true);
        let cpu = md(json!({"engine": {"type": "vllm"}, "resources": {"gpu": {"count": 0}}}));
        assert_eq!(
            refusal(&gpu_only, &cpu),
            "spec.resources.gpu.count is 0 (CPU only), but provider p requires GPU for vllm (set resources.gpu.count > 0)"
        );
        let no_resources = md(json!({"engine": {"type": "llamacpp"}}));
        assert_eq!(
            refusal(&gpu_only, &no_resources),
            "spec.resources.gpu is not set (CPU only), but provider p requires GPU for llamacpp (set resources.gpu.count > 0)"
        );
        let cpu_roles = md(
            json!({"engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
            "scaling": {"prefill": {"gpu": {"count": 0}}, "decode": {}}}),
        );
        assert_eq!(
            refusal(&gpu_only, &cpu_roles),
            "spec.scaling.prefill.gpu.count is 0 and spec.scaling.decode.gpu.count is 0 (CPU only), but provider p requires GPU for vllm (set scaling.prefill.gpu.count and scaling.decode.gpu.count > 0)"
        );

        let cpu_only = config(&[EngineType::Llamacpp], AGG, true, false);
        let gpus = md(json!({"engine": {"type": "llamacpp"}, "resources": {"gpu": {"count": 2}}}));
        assert_eq!(
            refusal(&cpu_only, &gpus),
            "spec.resources.gpu.count is 2, but provider p does not support GPUs with llamacpp: it serves CPU-only deployments (remove the GPU request)"
        );
    }

    /// Each engine fits by its own capabilities; what an engine leaves unset comes from
    /// the deprecated provider-wide values, and a stored list of bare engine names reads.
    #[test]
    fn capabilities_are_per_engine() {
        let per_engine: InferenceProviderConfigSpec = serde_json::from_value(json!({
            "capabilities": {"servingModes": ["aggregated", "disaggregated"], "gpuSupport": true,
                "engines": [{"name": "vllm"}, {"name": "llamacpp", "cpuSupport": true,
                    "gpuSupport": false, "servingModes": ["aggregated"]}]}
        }))
        .unwrap();
        let disaggregated_vllm = md(
            json!({"engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
            "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 1}}}}),
        );
        assert_eq!(fits("p", &per_engine, &disaggregated_vllm), Ok(()));
        assert_eq!(
            fits(
                "p",
                &per_engine,
                &md(json!({"engine": {"type": "llamacpp"}}))
            ),
            Ok(())
        );
        let gpu_llama =
            md(json!({"engine": {"type": "llamacpp"}, "resources": {"gpu": {"count": 1}}}));
        assert_eq!(
            refusal(&per_engine, &gpu_llama),
            "spec.resources.gpu.count is 1, but provider p does not support GPUs with llamacpp: it serves CPU-only deployments (remove the GPU request)"
        );
        let cpu_vllm = md(json!({"engine": {"type": "vllm"}, "resources": {"gpu": {"count": 0}}}));
        assert!(refusal(&per_engine, &cpu_vllm).contains("requires GPU for vllm"));

        let legacy: InferenceProviderConfigSpec = serde_json::from_value(json!({
            "capabilities": {"engines": ["vllm"], "servingModes": ["aggregated"], "gpuSupport": true}
        }))
        .unwrap();
        assert_eq!(
            legacy.capabilities.as_ref().unwrap().engines,
            [EngineCapability::new(EngineType::Vllm)]
        );
        let vllm = md(json!({"engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}));
        assert_eq!(fits("p", &legacy, &vllm), Ok(()));
    }

    #[test]
    fn a_provider_without_capabilities_serves_nothing() {
        let none = InferenceProviderConfigSpec::default();
        let vllm = md(json!({"engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}));
        assert_eq!(
            refusal(&none, &vllm),
            "spec.engine.type is vllm, which provider p does not support: it serves no engine"
        );
    }
}
