//! Defaults of a ModelDeployment spec, from one source: the `default`s of the
//! ModelDeployment CRD's schema, which are generated from the API types (their serde
//! defaults, through schemars: `model.source` huggingface, `engine.trustRemoteCode`
//! false, `serving.mode` aggregated, `scaling.replicas` and each role's `replicas` 1, a
//! GPU request's `count` 0 and `type` [`crate::api::DEFAULT_GPU_TYPE`], a storage volume's
//! `purpose` custom and `readOnly` false, ...). The API server applies them to every
//! ModelDeployment; core's mutating webhook and selection (the `spec` CEL rules see)
//! apply the same ones with [`apply`], by the API server's own algorithm, so no default is
//! written twice.
//!
//! One default depends on other fields, which a schema `default` cannot say, so it is
//! only [`apply`]'s (core's mutating webhook writes it at admission; selection and
//! `kubeairunway render` see it): a GPU engine (vLLM, SGLang, TensorRT-LLM) served
//! aggregated with no GPU request (`resources.gpu` absent) gets one GPU,
//! `resources.gpu: {count: 1, type: nvidia.com/gpu}`, as AI Runway's webhook gives one
//! ([`GPU_ENGINES`]). An explicit `gpu.count: 0` is kept, and refused by the CRD's rule;
//! without the webhook the API server refuses a spec with no GPU request by the same rule.

use std::sync::LazyLock;

use serde_json::Value;

/// The schema of `spec` in the ModelDeployment CRD as it is installed
/// ([`crate::api::crds::schema`]).
static SPEC_SCHEMA: LazyLock<Value> = LazyLock::new(|| {
    crate::api::crds::schema("ModelDeployment")
        .and_then(|s| s.pointer("/properties/spec"))
        .cloned()
        .unwrap_or_default()
});

/// The schema of a ModelDeployment's `spec` that holds its defaults.
pub fn spec_schema() -> &'static Value {
    &SPEC_SCHEMA
}

/// Fill in the defaults of a spec (the `spec` object of a ModelDeployment) in place, as
/// the API server does. Anything that is not an object where an object belongs is left
/// alone (validation reports it).
pub fn apply(spec: &mut Value) {
    default(spec, &SPEC_SCHEMA);
    one_gpu(spec);
    // The new GPU request's own defaults (its `type`).
    default(spec, &SPEC_SCHEMA);
}

/// `spec` with `engine.type` set to `engine` and the defaults that depend on the engine
/// applied ([`apply`]: one GPU for a GPU engine served aggregated with no GPU request, as
/// the mutating webhook gives a spec that names it): the spec of an engine core chose, as
/// selection, its rules and the provider see it.
#[must_use]
pub fn spec_with_engine(
    spec: &crate::ModelDeploymentSpec,
    engine: crate::api::EngineType,
) -> crate::ModelDeploymentSpec {
    let mut spec = spec.clone();
    spec.engine.type_ = Some(engine);
    let Ok(mut value) = serde_json::to_value(&spec) else {
        return spec;
    };
    apply(&mut value);
    serde_json::from_value(value).unwrap_or(spec)
}

/// The engines that need a GPU (the CRD refuses them without one in aggregated mode), as
/// the API writes them.
pub const GPU_ENGINES: [&str; 3] = ["vllm", "sglang", "trtllm"];

/// One GPU for a GPU engine served aggregated that asks for none: `resources.gpu` absent
/// (a `gpu` with `count: 0` is the user's, and the CRD refuses it). Runs after the schema
/// defaults, so an absent `serving.mode` already reads aggregated. AI Runway's webhook
/// does the same when `resources` is absent (`controller/internal/webhook/v1alpha1/
/// modeldeployment_webhook.go`, `Default`, at b0d3fb7), except for a spec with its own
/// image, which it leaves without a GPU; here the CRD refuses these engines without one
/// whatever the image, so such a spec gets one too.
fn one_gpu(spec: &mut Value) {
    let engine = spec.pointer("/engine/type").and_then(Value::as_str);
    let mode = spec.pointer("/serving/mode").and_then(Value::as_str);
    if !engine.is_some_and(|e| GPU_ENGINES.contains(&e)) || mode != Some("aggregated") {
        return;
    }
    let Some(map) = spec.as_object_mut() else {
        return;
    };
    let resources = map
        .entry("resources")
        .and_modify(|r| {
            if r.is_null() {
                *r = Value::Object(serde_json::Map::new());
            }
        })
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Some(resources) = resources.as_object_mut()
        && resources.get("gpu").is_none_or(Value::is_null)
    {
        resources.insert("gpu".into(), serde_json::json!({"count": 1}));
    }
}

/// Structural defaulting: a property with a `default` that is absent (or null: our
/// schema has no nullable fields) gets it, then every value present, defaulted ones
/// included, is defaulted by its own schema; array items by `items`. As
/// `k8s.io/apiextensions-apiserver` does it, `pkg/apiserver/schema/defaulting/algorithm.go:34-69@v0.36.4`
/// (the version the test API server is built from).
fn default(x: &mut Value, schema: &Value) {
    match x {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            for (key, property) in properties.into_iter().flatten() {
                let Some(value) = property.get("default") else {
                    continue;
                };
                if map.get(key).is_none_or(Value::is_null) {
                    map.insert(key.clone(), value.clone());
                }
            }
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, value) in map.iter_mut() {
                match properties.and_then(|p| p.get(key)) {
                    Some(property) => default(value, property),
                    None => {
                        if let Some(additional) = additional {
                            if value.is_null()
                                && let Some(d) = additional.get("default")
                            {
                                *value = d.clone();
                            }
                            default(value, additional);
                        }
                    }
                }
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = schema.get("items") else {
                return;
            };
            for item in items {
                if item.is_null()
                    && let Some(d) = item_schema.get("default")
                {
                    *item = d.clone();
                }
                default(item, item_schema);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fills_every_default_and_keeps_the_rest() {
        let mut spec = json!({
            "model": {"id": "a/b"}, "engine": {"type": "vllm", "args": {"x": "1"}},
            "resources": {"gpu": {"count": 1}, "memory": "1Gi"},
            "scaling": {"prefill": {"gpu": {"count": 1}}}
        });
        apply(&mut spec);
        assert_eq!(
            spec,
            json!({
                "model": {"id": "a/b", "source": "huggingface"},
                "engine": {"type": "vllm", "args": {"x": "1"}, "trustRemoteCode": false},
                "serving": {"mode": "aggregated"},
                "resources": {"gpu": {"count": 1, "type": "nvidia.com/gpu"}, "memory": "1Gi"},
                "scaling": {"replicas": 1, "prefill": {"replicas": 1, "gpu": {"count": 1, "type": "nvidia.com/gpu"}}}
            })
        );
        let again = spec.clone();
        apply(&mut spec);
        assert_eq!(spec, again, "idempotent");
    }

    #[test]
    fn keeps_user_values() {
        let mut spec = json!({"model": {"source": "custom"}, "serving": {"mode": "disaggregated"}, "scaling": {"replicas": 0}});
        apply(&mut spec);
        assert_eq!(spec["model"]["source"], "custom");
        assert_eq!(spec["serving"]["mode"], "disaggregated");
        assert_eq!(spec["scaling"]["replicas"], 0);
    }

    /// The defaults the webhook and selection fill in are those of the API types: a spec
    /// with every defaulted field left out, once defaulted, is what the typed API reads
    /// and writes back. A `#[serde(default)]` whose schema `default` says otherwise (or
    /// is missing) fails here.
    #[test]
    fn the_schema_s_defaults_are_the_api_types_defaults() {
        let sparse = json!({
            "model": {"id": "a/b", "storage": {"volumes": [{"name": "w", "mountPath": "/w"}]}},
            "engine": {"type": "vllm"},
            "resources": {"gpu": {}},
            "scaling": {"prefill": {"gpu": {}}, "decode": {}},
        });
        let mut defaulted = sparse.clone();
        apply(&mut defaulted);
        let typed: crate::ModelDeploymentSpec = serde_json::from_value(sparse).unwrap();
        assert_eq!(defaulted, serde_json::to_value(&typed).unwrap());
    }

    /// A GPU engine served aggregated with no GPU request gets one GPU, whether it has no
    /// `resources` or `resources` without `gpu`; an explicit count (0 included), llama.cpp,
    /// and disaggregated serving (GPUs per role) are left alone.
    #[test]
    fn a_gpu_engine_without_a_gpu_request_gets_one_gpu() {
        let one = json!({"count": 1, "type": "nvidia.com/gpu"});
        for engine in GPU_ENGINES {
            let mut spec = json!({"model": {"id": "a/b"}, "engine": {"type": engine}});
            apply(&mut spec);
            assert_eq!(spec["resources"], json!({"gpu": one}), "{engine}");
            let mut memory_only = json!({"model": {"id": "a/b"}, "engine": {"type": engine},
                "resources": {"memory": "32Gi"}});
            apply(&mut memory_only);
            assert_eq!(
                memory_only["resources"],
                json!({"memory": "32Gi", "gpu": one}),
                "{engine}"
            );
            let again = memory_only.clone();
            apply(&mut memory_only);
            assert_eq!(memory_only, again, "idempotent");
        }
        let kept = |spec: Value| {
            let mut defaulted = spec.clone();
            apply(&mut defaulted);
            defaulted.get("resources").cloned()
        };
        assert_eq!(
            kept(json!({"engine": {"type": "vllm"}, "resources": {"gpu": {"count": 0}}})),
            Some(json!({"gpu": {"count": 0, "type": "nvidia.com/gpu"}})),
            "an explicit 0 stays, for the CRD to refuse"
        );
        assert_eq!(
            kept(
                json!({"engine": {"type": "sglang"}, "resources": {"gpu": {"count": 2, "type": "amd.com/gpu"}}})
            ),
            Some(json!({"gpu": {"count": 2, "type": "amd.com/gpu"}}))
        );
        assert_eq!(kept(json!({"engine": {"type": "llamacpp"}})), None);
        assert_eq!(kept(json!({"model": {"id": "a/b"}})), None, "no engine");
        assert_eq!(
            kept(json!({"engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"}})),
            None,
            "disaggregated roles carry their own GPUs"
        );
        let mut with_image = json!({"engine": {"type": "trtllm"}, "image": "my/trtllm:1"});
        apply(&mut with_image);
        assert_eq!(with_image["resources"]["gpu"]["count"], 1);
    }

    #[test]
    fn odd_shapes_do_not_panic() {
        for mut v in [
            json!(null),
            json!([]),
            json!({"model": 3, "scaling": "x", "resources": []}),
            json!({"engine": {"type": "vllm"}, "serving": {"mode": "aggregated"}, "resources": 3}),
            json!({"engine": {"type": "vllm"}, "resources": null}),
        ] {
            apply(&mut v);
        }
    }
}
