//! The v1alpha1 adapter (Dynamo <= 1.1): `spec.services` is a map of services with
//! `componentType`, `subComponentType`, `envFromSecret`, `envs`, Dynamo's own
//! `resources{requests,limits{cpu,memory,gpu}}`, `extraPodMetadata` and
//! `extraPodSpec.mainContainer`. The deprecated `dynamoNamespace` is never written.

use serde_json::{Map, Value, json};

use crate::graph::{Component, Graph, Role};

/// The `spec` of a v1alpha1 DynamoGraphDeployment.
pub fn spec(graph: &Graph) -> Value {
    let services: Map<String, Value> = graph
        .components
        .iter()
        .map(|c| (c.name.clone(), service(graph, c)))
        .collect();
    json!({
        "backendFramework": graph.backend,
        "services": services,
    })
}

fn service(graph: &Graph, c: &Component) -> Value {
    let (component_type, sub) = match c.role {
        Role::Frontend => ("frontend", None),
        Role::Worker => ("worker", None),
        Role::Prefill => ("worker", Some("prefill")),
        Role::Decode => ("worker", Some("decode")),
    };
    let mut s = json!({
        "componentType": component_type,
        "replicas": c.replicas,
        "extraPodMetadata": {"labels": graph.labels, "annotations": graph.annotations},
        "extraPodSpec": pod_spec(graph, c),
    });
    if let Some(sub) = sub {
        s["subComponentType"] = json!(sub);
    }
    if let Some(secret) = &graph.hf_secret {
        s["envFromSecret"] = json!(secret);
    }
    if !c.env.is_empty() {
        s["envs"] = json!(c.env);
    }
    let resources = resources(c);
    if !resources.is_empty() {
        s["resources"] = Value::Object(resources);
    }
    s
}

fn pod_spec(graph: &Graph, c: &Component) -> Value {
    let mut main = json!({"image": graph.image});
    if !c.command.is_empty() {
        main["command"] = json!(c.command);
    }
    if !c.args.is_empty() {
        main["args"] = json!(c.args);
    }
    let mut pod = json!({"mainContainer": main});
    if !graph.node_selector.is_empty() {
        pod["nodeSelector"] = json!(graph.node_selector);
    }
    if !graph.tolerations.is_empty() {
        pod["tolerations"] = json!(graph.tolerations);
    }
    pod
}

/// Dynamo's own resource shape: `requests` and `limits` of `cpu`, `memory`, `gpu` (a
/// string), `gpuType` for GPUs other than `nvidia.com/gpu`.
fn resources(c: &Component) -> Map<String, Value> {
    let mut requests = Map::new();
    let mut limits = Map::new();
    if let Some(cpu) = &c.cpu {
        requests.insert("cpu".into(), json!(cpu));
    }
    if let Some(memory) = &c.memory {
        requests.insert("memory".into(), json!(memory));
        limits.insert("memory".into(), json!(memory));
    }
    if let Some(gpu) = c.gpu.as_ref().filter(|g| g.count > 0) {
        let count = json!(gpu.count.to_string());
        requests.insert("gpu".into(), count.clone());
        limits.insert("gpu".into(), count);
        if gpu.type_ != kubeairunway_sdk::api::DEFAULT_GPU_TYPE {
            requests.insert("gpuType".into(), json!(gpu.type_));
            limits.insert("gpuType".into(), json!(gpu.type_));
        }
    }
    let mut out = Map::new();
    if !requests.is_empty() {
        out.insert("requests".into(), Value::Object(requests));
    }
    if !limits.is_empty() {
        out.insert("limits".into(), Value::Object(limits));
    }
    out
}
