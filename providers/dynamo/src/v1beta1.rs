//! The v1beta1 adapter (newer Dynamo, storage version): `spec.components` is a list keyed
//! by `name`, with a `type` (frontend, worker, prefill, decode) and a `podTemplate` whose
//! container named `main` carries image, command, args, env, `envFrom` (the Hugging Face
//! token Secret) and Kubernetes resources.

use serde_json::{Map, Value, json};

use crate::graph::{Component, Graph, Role};

/// The container Dynamo merges its defaults into.
pub const MAIN_CONTAINER: &str = "main";

/// The `spec` of a v1beta1 DynamoGraphDeployment.
pub fn spec(graph: &Graph) -> Value {
    let components: Vec<Value> = graph
        .components
        .iter()
        .map(|c| component(graph, c))
        .collect();
    json!({
        "backendFramework": graph.backend,
        "components": components,
    })
}

fn component(graph: &Graph, c: &Component) -> Value {
    let type_ = match c.role {
        Role::Frontend => "frontend",
        Role::Worker => "worker",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
    };
    let mut main = json!({"name": MAIN_CONTAINER, "image": graph.image});
    if !c.command.is_empty() {
        main["command"] = json!(c.command);
    }
    if !c.args.is_empty() {
        main["args"] = json!(c.args);
    }
    if !c.env.is_empty() {
        main["env"] = json!(c.env);
    }
    if let Some(secret) = &graph.hf_secret {
        main["envFrom"] = json!([{"secretRef": {"name": secret}}]);
    }
    let resources = resources(c);
    if !resources.is_empty() {
        main["resources"] = Value::Object(resources);
    }
    let mut pod = json!({"containers": [main]});
    if !graph.node_selector.is_empty() {
        pod["nodeSelector"] = json!(graph.node_selector);
    }
    if !graph.tolerations.is_empty() {
        pod["tolerations"] = json!(graph.tolerations);
    }
    json!({
        "name": c.name,
        "type": type_,
        "replicas": c.replicas,
        "podTemplate": {
            "metadata": {"labels": graph.labels, "annotations": graph.annotations},
            "spec": pod,
        },
    })
}

/// Kubernetes container resources: `cpu` and `memory` requested, `memory` and the GPU
/// resource (e.g. `nvidia.com/gpu`) limited.
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
        requests.insert(gpu.type_.clone(), json!(gpu.count.to_string()));
        limits.insert(gpu.type_.clone(), json!(gpu.count.to_string()));
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
