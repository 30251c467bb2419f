//! The v1alpha1 adapter (Dynamo <= 1.1): `spec.services` is a map of services with
//! `componentType`, `subComponentType`, `envFromSecret`, `envs`, Dynamo's own
//! `resources{requests,limits{cpu,memory,gpu}}`, `volumeMounts` (Dynamo's: the
//! compilation cache), `extraPodMetadata` and `extraPodSpec` (pod fields, PVC volumes, and
//! `mainContainer`); the claims at the top in `spec.pvcs`. The deprecated
//! `dynamoNamespace` is never written.

use serde_json::{Map, Value, json};

use kubeairunway_sdk::Warning;

use crate::graph::{self, Component, Graph, Role};
use crate::storage::{self, Plan};

/// The `spec` of a v1alpha1 DynamoGraphDeployment, and what of the storage it cannot do.
pub fn spec(graph: &Graph) -> (Value, Vec<Warning>) {
    let (plan, warnings) = storage::plan(&graph.volumes, "v1alpha1");
    let services: Map<String, Value> = graph
        .components
        .iter()
        .map(|c| (c.name.clone(), service(graph, &plan, c)))
        .collect();
    let mut spec = json!({
        "backendFramework": graph.backend,
        "services": services,
    });
    let pvcs = pvcs(&plan);
    if !pvcs.is_empty() {
        spec["pvcs"] = Value::Array(pvcs);
    }
    (spec, warnings)
}

/// `spec.pvcs`: every claim mounted, created by Dynamo when asked for (`create: true`
/// with size, class and access mode), else `create: false` so that Dynamo reports a
/// missing one (`dynamographdeployment_controller.go:1234-1330@3e3b3b187`).
fn pvcs(plan: &Plan) -> Vec<Value> {
    let mut seen = std::collections::BTreeSet::new();
    plan.claims
        .iter()
        .filter(|v| seen.insert(v.claim.clone()))
        .map(|v| match &v.create {
            Some(new) => json!({
                "name": v.claim,
                "create": true,
                "size": new.size,
                "storageClass": new.storage_class,
                "volumeAccessMode": new.access_mode(),
            }),
            None => json!({"name": v.claim, "create": false}),
        })
        .collect()
}

fn service(graph: &Graph, plan: &Plan, c: &Component) -> Value {
    let (component_type, sub) = match c.role {
        Role::Frontend => ("frontend", None),
        Role::Worker => ("worker", None),
        Role::Prefill => ("worker", Some("prefill")),
        Role::Decode => ("worker", Some("decode")),
        Role::Epp => ("epp", None),
    };
    let mut s = json!({
        "componentType": component_type,
        "replicas": c.replicas,
        "extraPodMetadata": {"labels": graph.labels, "annotations": graph.annotations},
        "extraPodSpec": pod_spec(graph, plan, c),
    });
    if let Some(sub) = sub {
        s["subComponentType"] = json!(sub);
    }
    if let Some(secret) = &graph.hf_secret {
        s["envFromSecret"] = json!(secret);
    }
    if c.role == Role::Epp
        && let Some(config) = &graph.epp_config
    {
        s["eppConfig"] = json!({ "config": config });
    }
    // The operator makes the sidecar container from this (`generateFrontendSidecar`,
    // internal/dynamo/graph.go:1331-1345@3e3b3b187).
    if let Some(args) = &c.sidecar {
        let mut sidecar = json!({"image": graph.image, "args": args});
        if let Some(secret) = &graph.hf_secret {
            sidecar["envFromSecret"] = json!(secret);
        }
        s["frontendSidecar"] = sidecar;
    }
    let env = graph::env_of(c, plan);
    if !env.is_empty() {
        s["envs"] = json!(env);
    }
    let resources = resources(c);
    if !resources.is_empty() {
        s["resources"] = Value::Object(resources);
    }
    if let Some(cache) = plan
        .compilation_cache
        .as_ref()
        .filter(|_| c.role.is_worker())
    {
        s["volumeMounts"] = json!([{
            "name": cache.claim,
            "mountPoint": cache.path,
            "useAsCompilationCache": true,
        }]);
    }
    s
}

fn pod_spec(graph: &Graph, plan: &Plan, c: &Component) -> Value {
    let mut main = json!({"image": c.image.as_ref().unwrap_or(&graph.image)});
    if !c.command.is_empty() {
        main["command"] = json!(c.command);
    }
    if !c.args.is_empty() {
        main["args"] = json!(c.args);
    }
    let mounts = graph::mounts_of(c, plan);
    if !mounts.is_empty() {
        main["volumeMounts"] = mounts.iter().map(|v| storage::container_mount(v)).collect();
    }
    let mut pod = json!({"mainContainer": main});
    if !mounts.is_empty() {
        pod["volumes"] = mounts.iter().map(|v| storage::pod_volume(v)).collect();
    }
    if c.role.is_worker() {
        if !graph.node_selector.is_empty() {
            pod["nodeSelector"] = json!(graph.node_selector);
        }
        if !graph.tolerations.is_empty() {
            pod["tolerations"] = json!(graph.tolerations);
        }
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
    if c.gpu.count > 0 {
        let count = json!(c.gpu.count.to_string());
        requests.insert("gpu".into(), count.clone());
        limits.insert("gpu".into(), count);
        if c.gpu.resource != kubeairunway_sdk::api::DEFAULT_GPU_TYPE {
            requests.insert("gpuType".into(), json!(c.gpu.resource));
            limits.insert("gpuType".into(), json!(c.gpu.resource));
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
