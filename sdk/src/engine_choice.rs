//! Engine auto-selection, as a pure function: core runs it on every ModelDeployment whose
//! `spec.engine.type` is empty (and records the result in `status.engine` with the
//! `EngineSelected` condition); previews (`kubeairunway render`, `kubeairunway explain`)
//! run it offline.
//!
//! 1. `spec.engine.type` set: that engine ([`EngineChoice::Explicit`]).
//! 2. A provider already selected and `status.engine.type` recorded: kept, so a running
//!    deployment never changes engine when providers come and go ([`EngineChoice::Kept`]).
//! 3. Candidates: a GGUF model ([`is_gguf`]) can only be llama.cpp; otherwise every engine
//!    in [`ENGINE_PREFERENCE`] order (AI Runway's: vLLM, SGLang, TensorRT-LLM, llama.cpp).
//! 4. The first candidate that gets a provider wins: with `spec.provider.name` (or a
//!    provider selected without an engine), the first that provider's capabilities fit;
//!    otherwise the first for which provider selection ([`crate::selection::select`]: ready providers
//!    whose per-engine capabilities fit the GPU or CPU request and serving mode, and whose
//!    rules choose them) selects a provider. Each candidate is tried as a spec naming it
//!    would be served ([`crate::defaults::spec_with_engine`]): a GPU engine served
//!    aggregated with no GPU request gets one GPU, as the mutating webhook gives a spec
//!    that names it. (AI Runway takes no GPU request as CPU-only and so picks llama.cpp,
//!    which cannot load a model that is not GGUF; `resources.gpu.count: 0` says CPU-only
//!    here.)

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::{Capabilities, EngineType, ModelDeploymentSpec};
use crate::selection::{Outcome, RuleCache, Settings, fits, select};
use crate::{InferenceProviderConfig, ModelDeployment};

/// The order in which engines are preferred when several can be served.
pub const ENGINE_PREFERENCE: [EngineType; 4] = [
    EngineType::Vllm,
    EngineType::Sglang,
    EngineType::Trtllm,
    EngineType::Llamacpp,
];

/// `status.engine.selectedReason` of an engine named in `spec.engine.type`.
pub const EXPLICIT_ENGINE_REASON: &str = "explicit engine selection";

/// The engine a ModelDeployment is served with, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineChoice {
    /// `spec.engine.type` names it.
    Explicit(EngineType),
    /// Chosen before a provider was selected, recorded in `status.engine`, and kept.
    Kept {
        /// The engine.
        engine: EngineType,
        /// The recorded reason.
        reason: String,
    },
    /// Chosen now.
    Auto {
        /// The engine.
        engine: EngineType,
        /// Why, for `status.engine.selectedReason` and the `EngineSelected` message.
        reason: String,
    },
    /// No engine can be served: why, per engine.
    NoneFits {
        /// The message for the user.
        message: String,
    },
}

impl EngineChoice {
    /// The engine, if one is chosen.
    pub fn engine(&self) -> Option<EngineType> {
        match self {
            EngineChoice::Explicit(engine)
            | EngineChoice::Kept { engine, .. }
            | EngineChoice::Auto { engine, .. } => Some(*engine),
            EngineChoice::NoneFits { .. } => None,
        }
    }

    /// The reason (or, for [`EngineChoice::NoneFits`], the message).
    pub fn reason(&self) -> &str {
        match self {
            EngineChoice::Explicit(_) => EXPLICIT_ENGINE_REASON,
            EngineChoice::Kept { reason, .. } | EngineChoice::Auto { reason, .. } => reason,
            EngineChoice::NoneFits { message } => message,
        }
    }
}

/// How previews say it: `vllm (explicit)`, `llamacpp (auto: <reason>)`, `sglang (kept:
/// <reason>)`, or the message when none fits.
impl std::fmt::Display for EngineChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineChoice::Explicit(engine) => write!(f, "{engine} (explicit)"),
            EngineChoice::Kept { engine, reason } => write!(f, "{engine} (kept: {reason})"),
            EngineChoice::Auto { engine, reason } => write!(f, "{engine} (auto: {reason})"),
            EngineChoice::NoneFits { message } => f.write_str(message),
        }
    }
}

/// Whether the model is in GGUF format, which only llama.cpp serves: the last segment of
/// `model.id` names a GGUF repository or file (contains `gguf`, in any case, as
/// `bartowski/Llama-3.2-1B-Instruct-GGUF` or `.../model-q8_0.gguf`).
pub fn is_gguf(spec: &ModelDeploymentSpec) -> bool {
    spec.model.id.as_deref().is_some_and(|id| {
        id.rsplit('/')
            .next()
            .unwrap_or(id)
            .to_ascii_lowercase()
            .contains("gguf")
    })
}

/// `md` with its spec [`crate::defaults::spec_with_engine`] `engine` (one GPU by default
/// for a GPU engine): what provider selection, the CEL rules and the providers see once
/// the engine is resolved.
pub fn with_engine(md: &ModelDeployment, engine: EngineType) -> ModelDeployment {
    let mut md = md.clone();
    md.spec = crate::defaults::spec_with_engine(&md.spec, engine);
    md
}

/// `md` as a provider serves it: its spec with [`ModelDeployment::resolved_engine`] and
/// that engine's defaults ([`with_engine`]); borrowed unchanged when the spec names the
/// engine, or none is resolved yet.
pub fn with_resolved_engine(md: &ModelDeployment) -> std::borrow::Cow<'_, ModelDeployment> {
    match md.resolved_engine() {
        Some(engine) if md.spec.engine.type_.is_none() => {
            std::borrow::Cow::Owned(with_engine(md, engine))
        }
        _ => std::borrow::Cow::Borrowed(md),
    }
}

/// Choose the engine of `md` (see the module's steps).
pub fn choose_engine(
    md: &ModelDeployment,
    configs: &[Arc<InferenceProviderConfig>],
    cache: &RuleCache,
    settings: &Settings,
    now: Timestamp,
) -> EngineChoice {
    if let Some(engine) = md.spec.engine.type_ {
        return EngineChoice::Explicit(engine);
    }
    let recorded = md.status.as_ref().and_then(|s| s.engine.as_ref());
    if md.selected_provider().is_some()
        && let Some(engine) = recorded.and_then(|e| e.type_)
    {
        let reason = recorded
            .and_then(|e| e.selected_reason.clone())
            .unwrap_or_default();
        return EngineChoice::Kept { engine, reason };
    }
    let candidates: &[EngineType] = if is_gguf(&md.spec) {
        &[EngineType::Llamacpp]
    } else {
        &ENGINE_PREFERENCE
    };
    match md.spec.provider_name().or(md.selected_provider()) {
        Some(name) => from_provider(md, name, configs, candidates),
        None => from_selection(md, configs, cache, settings, now, candidates),
    }
}

/// What the spec asks of any engine, for messages: `GGUF model, mode=aggregated`.
fn basis(spec: &ModelDeploymentSpec) -> String {
    let gguf = if is_gguf(spec) { "GGUF model, " } else { "" };
    format!("{gguf}mode={}", spec.serving.mode)
}

/// Whether the spec asks for GPUs with `engine`: `gpu=true`, `gpu=false`, or `gpu=true
/// (one by default)` when the GPU comes from the engine's default.
fn gpu_with(spec: &ModelDeploymentSpec, resolved: &ModelDeploymentSpec) -> String {
    match (spec.uses_gpu(), resolved.uses_gpu()) {
        (false, true) => "gpu=true (one by default)".to_string(),
        (_, gpu) => format!("gpu={gpu}"),
    }
}

/// The reason of `engine`, chosen among `candidates` for `provider`.
fn chosen(
    md: &ModelDeployment,
    engine: EngineType,
    candidates: &[EngineType],
    provider: &str,
) -> EngineChoice {
    let gpu = gpu_with(
        &md.spec,
        &crate::defaults::spec_with_engine(&md.spec, engine),
    );
    let reason = if candidates.len() == 1 {
        format!(
            "only {engine} serves a GGUF model ({gpu}, mode={}): provider {provider}",
            md.spec.serving.mode
        )
    } else {
        let order: Vec<&str> = candidates.iter().map(|e| e.as_str()).collect();
        format!(
            "first of {} that a provider serves ({gpu}, {}): provider {provider}",
            order.join(", "),
            basis(&md.spec)
        )
    };
    EngineChoice::Auto { engine, reason }
}

/// The first candidate that the capabilities of provider `name` (named in the spec, or
/// already selected) fit.
fn from_provider(
    md: &ModelDeployment,
    name: &str,
    configs: &[Arc<InferenceProviderConfig>],
    candidates: &[EngineType],
) -> EngineChoice {
    let Some(config) = configs.iter().find(|c| c.name_any() == name) else {
        return EngineChoice::NoneFits {
            message: format!("No engine chosen: provider {name} is not registered"),
        };
    };
    let none = Capabilities::default();
    let caps = config.spec.capabilities.as_ref().unwrap_or(&none);
    let mut why = Vec::new();
    for &engine in candidates {
        match fits(caps, &with_engine(md, engine).spec) {
            Ok(()) => return chosen(md, engine, candidates, name),
            Err(misfit) => why.push(format!("{engine}: {misfit}")),
        }
    }
    EngineChoice::NoneFits {
        message: format!(
            "No engine of provider {name} fits ({}, {}): {}",
            gpu_with(&md.spec, &md.spec),
            basis(&md.spec),
            why.join("; ")
        ),
    }
}

/// The first candidate for which provider selection selects a provider.
fn from_selection(
    md: &ModelDeployment,
    configs: &[Arc<InferenceProviderConfig>],
    cache: &RuleCache,
    settings: &Settings,
    now: Timestamp,
    candidates: &[EngineType],
) -> EngineChoice {
    let mut why = Vec::new();
    for &engine in candidates {
        let resolved = with_engine(md, engine);
        match select(&resolved, configs, cache, settings, now).outcome {
            Outcome::Selected { provider, .. } => {
                return chosen(md, engine, candidates, &provider);
            }
            // Health does not depend on the engine: no other candidate fares better.
            Outcome::NoHealthyProviders { detail } => {
                return EngineChoice::NoneFits {
                    message: format!(
                        "No engine chosen: {}: {detail}",
                        crate::selection::NO_HEALTHY_PROVIDERS
                    ),
                };
            }
            Outcome::NoneFits { message } => {
                let prefix = crate::selection::none_fits_prefix(&resolved.spec);
                let per_provider = message.strip_prefix(&prefix).unwrap_or(&message);
                let gpu = gpu_with(&md.spec, &resolved.spec);
                why.push(format!("{engine} ({gpu}): {per_provider}"));
            }
        }
    }
    EngineChoice::NoneFits {
        message: format!(
            "No engine is served ({}): {}",
            basis(&md.spec),
            why.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EngineCapability, SelectionRule, ServingMode};
    use crate::{InferenceProviderConfigSpec, InferenceProviderConfigStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn now() -> Timestamp {
        "2026-06-01T12:00:00Z".parse().unwrap()
    }

    /// A ready provider serving `engines`, chosen by one rule that is always true.
    fn provider(name: &str, engines: Vec<EngineCapability>) -> Arc<InferenceProviderConfig> {
        let mut c = InferenceProviderConfig::new(
            name,
            InferenceProviderConfigSpec {
                capabilities: Some(Capabilities::serving(engines)),
                selection_rules: vec![SelectionRule {
                    condition: "true".into(),
                    priority: 1,
                }],
                ..Default::default()
            },
        );
        c.status = Some(InferenceProviderConfigStatus {
            ready: Some(true),
            last_heartbeat: Some(Time(now())),
            ..Default::default()
        });
        Arc::new(c)
    }

    fn gpu(e: EngineType, modes: &[ServingMode]) -> EngineCapability {
        EngineCapability::new(e)
            .gpu(true)
            .serving_modes(modes.iter().copied())
    }

    const AGG: &[ServingMode] = &[ServingMode::Aggregated];
    const BOTH: &[ServingMode] = &[ServingMode::Aggregated, ServingMode::Disaggregated];

    /// A KAITO-like provider (vLLM on GPU; llama.cpp on GPU or CPU), an SGLang provider
    /// that also serves disaggregated, and a TensorRT-LLM one.
    fn providers() -> Vec<Arc<InferenceProviderConfig>> {
        vec![
            provider(
                "kaito",
                vec![
                    gpu(EngineType::Vllm, AGG),
                    gpu(EngineType::Llamacpp, AGG).cpu(true),
                ],
            ),
            provider("sg", vec![gpu(EngineType::Sglang, BOTH)]),
            provider("trt", vec![gpu(EngineType::Trtllm, AGG)]),
        ]
    }

    fn md(spec: serde_json::Value) -> ModelDeployment {
        let mut md = ModelDeployment::new("m", serde_json::from_value(spec).unwrap());
        md.metadata.namespace = Some("ns".into());
        md
    }

    fn choose(md: &ModelDeployment, configs: &[Arc<InferenceProviderConfig>]) -> EngineChoice {
        choose_engine(
            md,
            configs,
            &RuleCache::default(),
            &Settings::default(),
            now(),
        )
    }

    const DISAGGREGATED: &str = r#"{"model": {"id": "a/b"}, "serving": {"mode": "disaggregated"},
        "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 1}}}}"#;

    #[test]
    fn a_gpu_request_gets_the_first_engine_in_preference_order() {
        let m = md(json!({"model": {"id": "Qwen/Qwen3-0.6B"}, "resources": {"gpu": {"count": 1}}}));
        assert_eq!(
            choose(&m, &providers()),
            EngineChoice::Auto {
                engine: EngineType::Vllm,
                reason: "first of vllm, sglang, trtllm, llamacpp that a provider serves \
                         (gpu=true, mode=aggregated): provider kaito"
                    .into()
            }
        );
    }

    #[test]
    fn a_gguf_model_gets_llamacpp() {
        for id in [
            "bartowski/Llama-3.2-1B-Instruct-GGUF",
            "a/b/model-q8_0.gguf",
        ] {
            let m = md(json!({"model": {"id": id}, "resources": {"gpu": {"count": 1}}}));
            let choice = choose(&m, &providers());
            assert_eq!(choice.engine(), Some(EngineType::Llamacpp), "{id}");
            assert_eq!(
                choice.reason(),
                "only llamacpp serves a GGUF model (gpu=true, mode=aggregated): provider kaito"
            );
        }
        assert!(!is_gguf(
            &md(json!({"model": {"id": "gguf-org/Qwen3"}})).spec
        ));
    }

    #[test]
    fn cpu_only_gets_an_engine_with_cpu_support() {
        let m = md(json!({"model": {"id": "Qwen/Qwen3-0.6B"}, "resources": {"gpu": {"count": 0}}}));
        assert_eq!(
            choose(&m, &providers()).engine(),
            Some(EngineType::Llamacpp)
        );
    }

    /// AI Runway's README example: no GPU request, so a GPU engine gets its one GPU.
    #[test]
    fn no_gpu_request_gets_a_gpu_engine_with_its_default_gpu() {
        let m = md(json!({"model": {"id": "Qwen/Qwen3-0.6B"}}));
        assert_eq!(
            choose(&m, &providers()).reason(),
            "first of vllm, sglang, trtllm, llamacpp that a provider serves \
             (gpu=true (one by default), mode=aggregated): provider kaito"
        );
        let served = with_engine(&m, EngineType::Vllm);
        assert_eq!(served.spec.gpu_count(), 1);
        assert_eq!(with_engine(&m, EngineType::Llamacpp).spec.gpu_count(), 0);
    }

    #[test]
    fn disaggregated_gets_only_an_engine_serving_it() {
        let m = md(serde_json::from_str(DISAGGREGATED).unwrap());
        assert_eq!(choose(&m, &providers()).engine(), Some(EngineType::Sglang));
    }

    #[test]
    fn none_fits_is_explained_per_engine() {
        let m = md(serde_json::from_str(DISAGGREGATED).unwrap());
        let only = [provider("kaito", vec![gpu(EngineType::Vllm, AGG)])];
        assert_eq!(
            choose(&m, &only),
            EngineChoice::NoneFits {
                message: "No engine is served (mode=disaggregated): \
                          vllm (gpu=true): kaito: serving mode disaggregated not supported with vllm; \
                          sglang (gpu=true): kaito: engine sglang not supported; \
                          trtllm (gpu=true): kaito: engine trtllm not supported; \
                          llamacpp (gpu=true): kaito: engine llamacpp not supported"
                    .into()
            }
        );
        let gguf_on_gpu_only = md(json!({"model": {"id": "x/y-GGUF"}}));
        assert_eq!(
            choose(&gguf_on_gpu_only, &only).reason(),
            "No engine is served (GGUF model, mode=aggregated): \
             llamacpp (gpu=false): kaito: engine llamacpp not supported"
        );
        assert_eq!(
            choose(&m, &[]).reason(),
            "No engine chosen: No healthy providers available: no serving provider is registered"
        );
    }

    #[test]
    fn a_named_provider_limits_the_engines_to_its_own() {
        let m = md(json!({"model": {"id": "a/b"}, "provider": {"name": "trt"},
            "resources": {"gpu": {"count": 1}}}));
        let choice = choose(&m, &providers());
        assert_eq!(choice.engine(), Some(EngineType::Trtllm));
        let m = md(json!({"model": {"id": "a/b"}, "provider": {"name": "trt"},
            "resources": {"gpu": {"count": 0}}}));
        assert_eq!(
            choose(&m, &providers()).reason(),
            "No engine of provider trt fits (gpu=false, mode=aggregated): \
             vllm: engine vllm not supported; sglang: engine sglang not supported; \
             trtllm: CPU-only not supported with trtllm; llamacpp: engine llamacpp not supported"
        );
        let m = md(json!({"model": {"id": "a/b"}, "provider": {"name": "gone"}}));
        assert_eq!(
            choose(&m, &providers()).reason(),
            "No engine chosen: provider gone is not registered"
        );
    }

    #[test]
    fn explicit_and_recorded_engines_are_kept() {
        let m = md(json!({"model": {"id": "a/b-GGUF"}, "engine": {"type": "vllm"}}));
        assert_eq!(choose(&m, &[]), EngineChoice::Explicit(EngineType::Vllm));
        let mut m = md(json!({"model": {"id": "a/b"}}));
        m.status = Some(
            serde_json::from_value(json!({"provider": {"name": "sg"},
                "engine": {"type": "sglang", "selectedReason": "earlier"}}))
            .unwrap(),
        );
        assert_eq!(
            choose(&m, &[]),
            EngineChoice::Kept {
                engine: EngineType::Sglang,
                reason: "earlier".into()
            }
        );
    }
}
