//! Spec validation (004 §8): the rules that need no cluster knowledge, with the exact
//! messages of §8. The admission webhook and the reconciler run the same code, so a
//! spec that slipped past a webhook that was down is still reported.

use kubeairunway_sdk::ModelDeploymentSpec;
use kubeairunway_sdk::api::{EngineType, ModelSource, ServingMode};

/// One refused field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.engine.type`.
    pub field: &'static str,
    /// The message of 004 §8.
    pub message: String,
}

/// What validation found: errors refuse the spec, warnings only inform.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Validation {
    /// Errors; empty when the spec is valid.
    pub errors: Vec<FieldError>,
    /// Warnings shown to the user (admission warnings, events).
    pub warnings: Vec<String>,
}

impl Validation {
    /// No errors.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }

    /// The error messages joined with `; `.
    pub fn message(&self) -> String {
        self.errors
            .iter()
            .map(|e| e.message.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Warning given when `servedName` is set for a custom source.
pub const SERVED_NAME_IGNORED: &str = "servedName is ignored for custom source";

/// The message for an explicitly named provider that has no InferenceProviderConfig.
pub fn provider_not_installed(name: &str) -> String {
    format!("Provider '{name}' CRD not installed in cluster")
}

/// The message for an explicitly named provider that registers only capabilities (such
/// as a kernel cache) and serves no model.
pub fn provider_does_not_serve(name: &str) -> String {
    format!("Provider '{name}' serves no models (it registers no engines)")
}

/// Validate a spec against the core rules of 004 §8.
pub fn validate(spec: &ModelDeploymentSpec) -> Validation {
    let mut v = Validation::default();
    let mut error = |field: &'static str, message: &str| {
        v.errors.push(FieldError {
            field,
            message: message.to_string(),
        });
    };

    if spec.engine.type_.is_none() {
        error("spec.engine.type", "engine.type is required");
    }
    if spec.model.source == ModelSource::Huggingface
        && spec.model.id.as_deref().is_none_or(str::is_empty)
    {
        error(
            "spec.model.id",
            "model.id is required when source is huggingface",
        );
    }
    match spec.serving.mode {
        ServingMode::Aggregated => {
            if spec.gpu_count() <= 0 {
                let needs_gpu = match spec.engine.type_ {
                    Some(EngineType::Vllm) => Some("vLLM"),
                    Some(EngineType::Sglang) => Some("SGLang"),
                    Some(EngineType::Trtllm) => Some("TensorRT-LLM"),
                    Some(EngineType::Llamacpp) | None => None,
                };
                if let Some(engine) = needs_gpu {
                    error(
                        "spec.resources.gpu.count",
                        &format!("{engine} engine requires GPU (set resources.gpu.count > 0)"),
                    );
                }
            }
        }
        ServingMode::Disaggregated => {
            if spec.resources.as_ref().is_some_and(|r| r.gpu.is_some()) {
                error(
                    "spec.resources.gpu",
                    "Cannot specify both resources.gpu and scaling.prefill/decode",
                );
            }
            let (prefill, decode) = (&spec.scaling.prefill, &spec.scaling.decode);
            if prefill.is_none() || decode.is_none() {
                error(
                    "spec.scaling",
                    "Disaggregated mode requires scaling.prefill and scaling.decode",
                );
            }
            let no_gpus = |c: &kubeairunway_sdk::api::ComponentScaling| {
                c.gpu.as_ref().is_none_or(|g| g.count <= 0)
            };
            if prefill.as_ref().is_some_and(no_gpus) {
                error(
                    "spec.scaling.prefill.gpu.count",
                    "Disaggregated mode requires scaling.prefill.gpu.count",
                );
            }
            if decode.as_ref().is_some_and(no_gpus) {
                error(
                    "spec.scaling.decode.gpu.count",
                    "Disaggregated mode requires scaling.decode.gpu.count",
                );
            }
        }
    }
    if spec.model.source == ModelSource::Custom
        && spec
            .model
            .served_name
            .as_deref()
            .is_some_and(|s| !s.is_empty())
    {
        v.warnings.push(SERVED_NAME_IGNORED.to_string());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> ModelDeploymentSpec {
        serde_json::from_value(v).unwrap()
    }

    fn messages(v: serde_json::Value) -> Vec<String> {
        validate(&spec(v))
            .errors
            .into_iter()
            .map(|e| e.message)
            .collect()
    }

    #[test]
    fn valid_specs_pass() {
        for s in [
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}),
            json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
            json!({"model": {"id": "a/b"}, "engine": {"type": "sglang"}, "serving": {"mode": "disaggregated"},
                   "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 2}}}}),
            json!({"model": {"source": "custom"}, "engine": {"type": "llamacpp"}}),
        ] {
            assert!(validate(&spec(s.clone())).is_valid(), "{s}");
        }
    }

    #[test]
    fn each_rule_has_its_exact_message() {
        let cases = [
            (json!({"model": {"id": "a/b"}}), "engine.type is required"),
            (
                json!({"model": {}, "engine": {"type": "llamacpp"}}),
                "model.id is required when source is huggingface",
            ),
            (
                json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}}),
                "vLLM engine requires GPU (set resources.gpu.count > 0)",
            ),
            (
                json!({"model": {"id": "a/b"}, "engine": {"type": "sglang"}, "resources": {"gpu": {"count": 0}}}),
                "SGLang engine requires GPU (set resources.gpu.count > 0)",
            ),
            (
                json!({"model": {"id": "a/b"}, "engine": {"type": "trtllm"}}),
                "TensorRT-LLM engine requires GPU (set resources.gpu.count > 0)",
            ),
            (
                json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
                       "resources": {"gpu": {"count": 1}},
                       "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 1}}}}),
                "Cannot specify both resources.gpu and scaling.prefill/decode",
            ),
            (
                json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
                       "scaling": {"prefill": {"gpu": {"count": 1}}}}),
                "Disaggregated mode requires scaling.prefill and scaling.decode",
            ),
            (
                json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
                       "scaling": {"prefill": {}, "decode": {"gpu": {"count": 1}}}}),
                "Disaggregated mode requires scaling.prefill.gpu.count",
            ),
            (
                json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
                       "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 0}}}}),
                "Disaggregated mode requires scaling.decode.gpu.count",
            ),
        ];
        for (s, want) in cases {
            assert_eq!(messages(s.clone()), vec![want.to_string()], "{s}");
        }
    }

    #[test]
    fn served_name_with_custom_source_warns() {
        let v = validate(&spec(json!({
            "model": {"source": "custom", "servedName": "x"}, "engine": {"type": "llamacpp"}
        })));
        assert!(v.is_valid());
        assert_eq!(v.warnings, vec![SERVED_NAME_IGNORED.to_string()]);
    }
}
