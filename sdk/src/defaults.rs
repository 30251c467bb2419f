//! Defaults of a ModelDeployment spec, applied by the mutating webhook and before CEL
//! selection rules are evaluated. They are the defaults of the API types (and of the
//! reference CRD), written out explicitly on the JSON form so that unknown fields and the
//! user's formatting of other fields stay untouched.

use serde_json::{Map, Value};

use crate::api::DEFAULT_GPU_TYPE;

fn object<'a>(parent: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    let v = parent
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    v.as_object_mut()
}

fn default(map: &mut Map<String, Value>, key: &str, value: Value) {
    if !map.contains_key(key) || map.get(key).is_some_and(Value::is_null) {
        map.insert(key.to_string(), value);
    }
}

fn gpu_type(parent: &mut Map<String, Value>) {
    if let Some(gpu) = parent.get_mut("gpu").and_then(Value::as_object_mut) {
        default(gpu, "type", Value::String(DEFAULT_GPU_TYPE.to_string()));
    }
}

/// Fill in the defaults of a spec (the `spec` object of a ModelDeployment) in place.
/// Anything that is not an object where an object belongs is left alone (validation
/// reports it).
pub fn apply(spec: &mut Value) {
    let Some(spec) = spec.as_object_mut() else {
        return;
    };
    if let Some(model) = object(spec, "model") {
        default(model, "source", Value::String("huggingface".into()));
    }
    if let Some(engine) = object(spec, "engine") {
        default(engine, "trustRemoteCode", Value::Bool(false));
    }
    if let Some(serving) = object(spec, "serving") {
        default(serving, "mode", Value::String("aggregated".into()));
    }
    if let Some(scaling) = object(spec, "scaling") {
        default(scaling, "replicas", Value::from(1));
        for role in ["prefill", "decode"] {
            if let Some(r) = scaling.get_mut(role).and_then(Value::as_object_mut) {
                default(r, "replicas", Value::from(1));
                gpu_type(r);
            }
        }
    }
    if let Some(resources) = spec.get_mut("resources").and_then(Value::as_object_mut) {
        gpu_type(resources);
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

    #[test]
    fn odd_shapes_do_not_panic() {
        for mut v in [
            json!(null),
            json!([]),
            json!({"model": 3, "scaling": "x", "resources": []}),
        ] {
            apply(&mut v);
        }
    }
}
