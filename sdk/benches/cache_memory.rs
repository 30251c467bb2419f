//! Heap held per cached ModelDeployment, parsed (`ModelDeployment`) against compact
//! (`kubeairunway_sdk::compact::Compact`): what every controller's watch cache holds for
//! each ModelDeployment of the cluster. Prints figures; asserts nothing.
//!
//! `cargo bench -p kubeairunway-sdk --bench cache_memory`
//!
//! The object is a ModelDeployment as the API server stores it once core and a provider
//! have reconciled it (defaults applied, status with five conditions), with what the
//! caches drop (`managedFields`, kubectl's last-applied annotation) already gone.

use std::sync::Arc;

use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::compact::Compact;
use serde_json::{Value, json};

/// Counts the bytes allocated (dhat's allocator, its statistics only).
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Bytes and blocks allocated now.
fn held() -> (usize, usize) {
    let stats = dhat::HeapStats::get();
    (stats.curr_bytes, stats.curr_blocks)
}

fn condition(type_: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": "True", "reason": reason, "message": message,
           "observedGeneration": 1, "lastTransitionTime": "2026-11-23T10:00:00Z"})
}

/// Core's own managedFields entry as core's cache keeps it: the outline of the status
/// fields it owns (core/src/reconciler.rs, `owned_status_outline`).
fn core_managed_fields() -> Value {
    json!([{"manager": "kubeairunway-controller", "operation": "Apply",
            "apiVersion": "kubeairunway.ai/v1alpha1", "time": "2026-11-23T10:00:00Z",
            "fieldsType": "FieldsV1", "subresource": "status",
            "fieldsV1": {"f:status": {
                "f:conditions": {"k:{\"type\":\"ProviderSelected\"}": {}, "k:{\"type\":\"Validated\"}": {}},
                "f:provider": {"f:name": {}}, "f:message": {}}}}])
}

fn stored(i: usize) -> Value {
    json!({
        "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {
            "name": format!("md-{i}"), "namespace": "scale", "generation": 1,
            "uid": format!("6f1c2b4e-0a7d-4c39-9e51-{i:012}"),
            "resourceVersion": format!("{}", 100_000 + i),
            "creationTimestamp": "2026-11-23T10:00:00Z",
            "finalizers": ["kubeairunway.ai/dynamo-provider"]
        },
        "spec": {
            "model": {"id": "Qwen/Qwen3-0.6B", "source": "huggingface"},
            "engine": {"type": "vllm"},
            "serving": {"mode": "aggregated"},
            "scaling": {"replicas": 1},
            "resources": {"gpu": {"count": 1, "type": "nvidia.com/gpu"}}
        },
        "status": {
            "phase": "Running", "message": "DynamoGraphDeployment is ready",
            "observedGeneration": 1,
            "provider": {"name": "dynamo", "selectedReason": "matched capabilities: engine=vllm, gpu=true, mode=aggregated",
                         "resourceName": format!("md-{i}"), "resourceKind": "DynamoGraphDeployment"},
            "replicas": {"desired": 1, "ready": 1, "available": 1},
            "endpoint": {"service": format!("md-{i}-frontend"), "port": 8000},
            "conditions": [
                condition("ProviderSelected", "AutoSelected", "matched capabilities: engine=vllm, gpu=true, mode=aggregated"),
                condition("Validated", "ValidationPassed", "spec is valid"),
                condition("ProviderCompatible", "Compatible", "dynamo serves this spec"),
                condition("ResourceCreated", "ResourceCreated", "DynamoGraphDeployment created"),
                condition("Ready", "DeploymentReady", "DynamoGraphDeployment is ready"),
            ]
        }
    })
}

/// Bytes and allocations held per object once `n` objects are read from their stored
/// JSON, with core's managedFields outline when `core`.
fn per_object<T: serde::de::DeserializeOwned>(
    n: usize,
    core: bool,
) -> Result<(usize, usize), serde_json::Error> {
    let texts: Vec<String> = (0..n)
        .map(|i| {
            let mut object = stored(i);
            if core {
                object["metadata"]["managedFields"] = core_managed_fields();
            }
            object.to_string()
        })
        .collect();
    let before = held();
    let objects = texts
        .iter()
        .map(|t| serde_json::from_str(t).map(Arc::<T>::new))
        .collect::<Result<Vec<_>, _>>()?;
    let after = held();
    let per = ((after.0 - before.0) / n, (after.1 - before.1) / n);
    drop(objects);
    Ok(per)
}

fn main() -> Result<(), serde_json::Error> {
    let _profiler = dhat::Profiler::builder().testing().build();
    let n = 10_000;
    let json_text = stored(0).to_string().len();
    // glibc's malloc rounds each block up to 16 bytes and adds 8 of its own (at least
    // 32 in all): an estimate of what the process's RSS holds beyond the bytes asked for.
    #[allow(clippy::cast_precision_loss)]
    let at_10k = |(bytes, blocks): (usize, usize)| (bytes + blocks * 16) as f64 * 1e4 / 1e6;
    println!("cached ModelDeployment, {n} objects, {json_text} bytes of JSON each");
    for (what, (bytes, blocks)) in [
        (
            "provider, parsed ModelDeployment         ",
            per_object::<ModelDeployment>(n, false)?,
        ),
        (
            "provider, Compact<ModelDeployment>       ",
            per_object::<Compact<ModelDeployment>>(n, false)?,
        ),
        (
            "core (managedFields outline), parsed     ",
            per_object::<ModelDeployment>(n, true)?,
        ),
        (
            "core (managedFields outline), Compact<..>",
            per_object::<Compact<ModelDeployment>>(n, true)?,
        ),
    ] {
        println!(
            "  {what}: {bytes:>5} bytes in {blocks:>3} allocations per object, about {:.1} MB at 10,000 with malloc's overhead",
            at_10k((bytes, blocks))
        );
    }
    Ok(())
}
