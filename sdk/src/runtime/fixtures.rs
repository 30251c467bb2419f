//! The objects the runtime's unit tests are made of.
#![allow(clippy::unwrap_used)]

use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::api::{ModelDeployment, Warmup};
use crate::conditions::{WARMED_UP, reasons};
use crate::labels;

/// ModelDeployment `ns/m` (uid `u`, generation 1, resourceVersion 1) with `extra` merged
/// in.
pub(crate) fn md_with(extra: &Value) -> ModelDeployment {
    let mut md = json!({
        "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1,
                     "resourceVersion": "1"},
        "spec": {"model": {"id": "a/b"}},
    });
    json_patch::merge(&mut md, extra);
    serde_json::from_value(md).unwrap()
}

/// ModelDeployment `ml/m`, naming Warmup `w` when `warmup`, with `WarmedUp` of that
/// status when given.
pub(crate) fn gated_md(warmup: bool, warmed_up: Option<&str>) -> ModelDeployment {
    let mut v = json!({
        "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "ml", "generation": 2},
        "spec": {"model": {"id": "a/b"}},
    });
    if warmup {
        v["spec"]["warmup"] = json!({"name": "w"});
    }
    if let Some(status) = warmed_up {
        v["status"] = json!({"conditions": [{"type": WARMED_UP, "status": status,
            "reason": reasons::WARMUP_COMPLETED, "message": "Warmup 'w' completed",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    }
    serde_json::from_value(v).unwrap()
}

/// Warmup `ml/w` of `phase` with `conditions`, preloading `llama.cpp:b1`.
#[allow(clippy::needless_pass_by_value)] // JSON literals built in place
pub(crate) fn warmup(phase: Option<&str>, conditions: Value) -> Warmup {
    let mut status = json!({"conditions": conditions, "images": ["llama.cpp:b1"]});
    if let Some(p) = phase {
        status["phase"] = json!(p);
    }
    serde_json::from_value(json!({
        "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "Warmup",
        "metadata": {"name": "w", "namespace": "ml"},
        "spec": {"targetModelDeployment": {"name": "m"}},
        "status": status,
    }))
    .unwrap()
}

/// A condition of `type_`, `True`.
pub(crate) fn cond(type_: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": "True", "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// A rendered (or live) object of `kind` with a scale record and one container image.
pub(crate) fn object(kind: &str, name: &str, scale: Option<&str>, image: &str) -> DynamicObject {
    let mut v = json!({"apiVersion": "example.com/v1", "kind": kind,
        "metadata": {"name": name, "annotations": {}},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}});
    if let Some(s) = scale {
        v["metadata"]["annotations"][labels::SCALE] = json!(s);
    }
    serde_json::from_value(v).unwrap()
}
