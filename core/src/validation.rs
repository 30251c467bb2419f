//! Spec validation for core's reconciler and `kubeairunway render`: the CRD's own rules
//! (one home, the CEL rules on the API type, evaluated here by
//! [`kubeairunway_sdk::validation::check`]), the warning for a field that is ignored, and
//! the messages for an explicitly named provider that cannot serve.
//!
//! The admission webhook does not evaluate the CRD's rules: the API server runs them
//! before it calls any validating webhook, so a copy there would never refuse anything.
//! The reconciler still reports them (`Validated`), for objects the API server stored
//! before a rule existed or kept through validation ratcheting.

use kubeairunway_sdk::ModelDeploymentSpec;
use kubeairunway_sdk::api::ModelSource;

/// One refused field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.engine.type`.
    pub field: String,
    /// The message of the CRD's rule.
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

/// The warnings for a spec the API server accepts but partly ignores. A CRD cannot warn,
/// so these have their home here (the admission webhook gives them).
pub fn warnings(spec: &ModelDeploymentSpec) -> Vec<String> {
    let custom_with_served_name = spec.model.source == ModelSource::Custom
        && spec
            .model
            .served_name
            .as_deref()
            .is_some_and(|s| !s.is_empty());
    if custom_with_served_name {
        vec![SERVED_NAME_IGNORED.to_string()]
    } else {
        Vec::new()
    }
}

/// The refusals a CRD rule cannot state, which core's validating webhook gives (and the
/// reconciler reports for an object stored while the webhook was down): a flag set both
/// in `engine.args` and in `engine.extraArgs`
/// ([`kubeairunway_sdk::engine::args_conflict`]).
pub fn webhook_errors(spec: &ModelDeploymentSpec) -> Vec<FieldError> {
    kubeairunway_sdk::engine::args_conflict(spec)
        .map(|message| FieldError {
            field: "spec.engine.extraArgs".to_string(),
            message,
        })
        .into_iter()
        .collect()
}

/// Validate a spec: the rules of the ModelDeployment CRD it breaks, and its warnings.
pub fn validate(spec: &ModelDeploymentSpec) -> Validation {
    let errors = match serde_json::to_value(spec) {
        Ok(value) => kubeairunway_sdk::validation::check(&value)
            .into_iter()
            .map(|v| FieldError {
                field: v.field,
                message: v.message,
            })
            .collect(),
        Err(e) => vec![FieldError {
            field: "spec".to_string(),
            message: format!("the spec cannot be read: {e}"),
        }],
    };
    let mut errors = errors;
    errors.extend(webhook_errors(spec));
    Validation {
        errors,
        warnings: warnings(spec),
    }
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
            // No engine: core chooses one.
            json!({"model": {"id": "Qwen/Qwen3-0.6B"}}),
        ] {
            assert!(validate(&spec(s.clone())).is_valid(), "{s}");
        }
    }

    #[test]
    fn each_rule_has_its_exact_message() {
        let cases = [
            (
                json!({"model": {}, "engine": {"type": "llamacpp"}}),
                "model.id is required when source is huggingface",
            ),
            (
                json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 0}}}),
                "vLLM engine requires GPU (set resources.gpu.count > 0)",
            ),
            (
                json!({"model": {"id": "a/b"}, "engine": {"type": "sglang"}, "resources": {"gpu": {"count": 0}}}),
                "SGLang engine requires GPU (set resources.gpu.count > 0)",
            ),
            (
                json!({"model": {"id": "a/b"}, "engine": {"type": "trtllm"}, "resources": {"gpu": {"count": 0}, "memory": "32Gi"}}),
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

    /// A GPU engine with no GPU request is valid as stored: core's mutating webhook (and
    /// this validation, which reads the spec defaulted) gives it one GPU.
    #[test]
    fn a_gpu_engine_without_a_gpu_request_is_valid_once_defaulted() {
        for engine in ["vllm", "sglang", "trtllm"] {
            assert!(
                validate(&spec(
                    json!({"model": {"id": "a/b"}, "engine": {"type": engine}})
                ))
                .is_valid(),
                "{engine}"
            );
        }
    }

    /// The image rule of the CRD, and the webhook's refusal of a flag set in both
    /// `engine.args` and `engine.extraArgs`.
    #[test]
    fn engine_image_and_extra_args_refusals() {
        let base = |engine: serde_json::Value, image: Option<&str>| {
            let mut v = json!({"model": {"id": "a/b"}, "engine": engine, "resources": {"gpu": {"count": 1}}});
            if let Some(image) = image {
                v["image"] = json!(image);
            }
            validate(&spec(v)).errors
        };
        let image_conflict = base(json!({"type": "vllm", "image": "a:1"}), Some("b:1"));
        assert_eq!(image_conflict.len(), 1);
        assert_eq!(image_conflict[0].field, "spec.engine.image");
        assert!(
            image_conflict[0]
                .message
                .starts_with("spec.image and spec.engine.image name different images"),
            "{image_conflict:?}"
        );
        assert!(base(json!({"type": "vllm", "image": "a:1"}), Some("a:1")).is_empty());
        assert!(base(json!({"type": "vllm", "image": "a:1"}), Some("")).is_empty());
        assert!(base(json!({"type": "vllm"}), Some("a:1")).is_empty());

        let both = base(
            json!({"type": "vllm", "args": {"max-model-len": "1"}, "extraArgs": ["--max-model-len", "2"]}),
            None,
        );
        assert_eq!(both.len(), 1);
        assert_eq!(both[0].field, "spec.engine.extraArgs");
        assert!(
            both[0]
                .message
                .starts_with("the flag --max-model-len is set both"),
            "{both:?}"
        );
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
