//! The v1beta1 adapter (newer Dynamo, storage version): `spec.components` is a list keyed
//! by `name`, with a `type` (frontend, worker, prefill, decode) and a `podTemplate` whose
//! container named `main` carries image, command, args, env, `envFrom` (the Hugging Face
//! token Secret), Kubernetes resources and volume mounts; `compilationCache` and
//! `runtimeVersionOverride` per component.
//!
//! Dynamo's webhook requires the main container's image on every component and, when its
//! tag is not a semantic version, `runtimeVersionOverride`
//! (docs/upstream.md#dynamo-v1beta1-images). A custom image such as
//! `registry.example/dynamo:dev` gets the override from
//! `provider.overrides.runtimeVersion`, else from the provider's `--dynamo-version`.

use serde_json::{Map, Value, json};

use kubeairunway_sdk::Warning;

use crate::graph::{self, Component, Graph, Role};
use crate::overrides::is_runtime_version;
use crate::storage::{self, Plan};

/// The container Dynamo merges its defaults into.
pub const MAIN_CONTAINER: &str = "main";

/// The `spec` of a v1beta1 DynamoGraphDeployment, and what of the storage it cannot do.
pub fn spec(graph: &Graph) -> (Value, Vec<Warning>) {
    let (plan, warnings) = storage::plan(&graph.volumes, "v1beta1");
    let runtime_version = runtime_version_override(graph);
    let components: Vec<Value> = graph
        .components
        .iter()
        .map(|c| component(graph, &plan, runtime_version.as_deref(), c))
        .collect();
    (
        json!({
            "backendFramework": graph.backend,
            "components": components,
        }),
        warnings,
    )
}

/// `runtimeVersionOverride`: the user's, or, when the image tag is no semantic version,
/// the provider's Dynamo version (its `MAJOR.MINOR.PATCH`).
pub fn runtime_version_override(graph: &Graph) -> Option<String> {
    if let Some(v) = &graph.runtime_version {
        return Some(v.clone());
    }
    if image_runtime_version(&graph.image) {
        return None;
    }
    let version = graph.dynamo_version.trim_start_matches(['v', 'V']);
    let core = version.split(['-', '+']).next().unwrap_or_default();
    is_runtime_version(core).then(|| core.to_string())
}

/// Whether Dynamo reads a runtime version from the image's tag: a semantic version,
/// optionally prefixed `v` (`runtimeversion.ParseImageVersion@2a6da14c8`).
pub fn image_runtime_version(image: &str) -> bool {
    let reference = image.trim();
    let reference = reference.split('@').next().unwrap_or_default();
    let slash = reference.rfind('/');
    let tag = match reference.rfind(':') {
        Some(colon) if slash.is_none_or(|s| colon > s) => &reference[colon + 1..],
        _ => return false,
    };
    let tag = tag.trim();
    is_semver(tag.strip_prefix(['v', 'V']).unwrap_or(tag))
}

/// Strict semantic version 2.0: `MAJOR.MINOR.PATCH[-pre][+build]`.
fn is_semver(v: &str) -> bool {
    let (rest, build) = match v.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (v, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let numeric = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
    };
    let ident =
        |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| numeric(p))
        && pre.is_none_or(|p| {
            p.split('.')
                .all(|id| ident(id) && (!id.bytes().all(|b| b.is_ascii_digit()) || numeric(id)))
        })
        && build.is_none_or(|b| b.split('.').all(ident))
}

fn component(graph: &Graph, plan: &Plan, runtime_version: Option<&str>, c: &Component) -> Value {
    let type_ = match c.role {
        Role::Frontend => "frontend",
        Role::Worker => "worker",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
        Role::Epp => "epp",
    };
    let image = c.image.as_ref().unwrap_or(&graph.image);
    let mut main = json!({"name": MAIN_CONTAINER, "image": image});
    if !c.command.is_empty() {
        main["command"] = json!(c.command);
    }
    if !c.args.is_empty() {
        main["args"] = json!(c.args);
    }
    let env = graph::env_of(c, plan);
    if !env.is_empty() {
        main["env"] = json!(env);
    }
    if let Some(secret) = &graph.hf_secret {
        main["envFrom"] = kubeairunway_sdk::engine::env_from_secret(secret);
    }
    let resources = resources(c);
    if !resources.is_empty() {
        main["resources"] = Value::Object(resources);
    }
    let mounts = graph::mounts_of(c, plan);
    if !mounts.is_empty() {
        main["volumeMounts"] = mounts.iter().map(|v| storage::container_mount(v)).collect();
    }
    let mut containers = vec![main];
    // The sidecar is a container of ours the operator fills in by name
    // (`mergeFrontendSidecarDefaults`, internal/dynamo/graph.go:1976-2005@2a6da14c8).
    if let Some(args) = &c.sidecar {
        let mut sidecar = json!({"name": graph::SIDECAR, "image": graph.image, "args": args});
        if let Some(secret) = &graph.hf_secret {
            sidecar["envFrom"] = kubeairunway_sdk::engine::env_from_secret(secret);
        }
        containers.push(sidecar);
    }
    let mut pod = json!({"containers": containers});
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
    let mut out = json!({
        "name": c.name,
        "type": type_,
        "replicas": c.replicas,
        "podTemplate": {
            "metadata": {"labels": graph.labels, "annotations": graph.annotations},
            "spec": pod,
        },
    });
    if c.sidecar.is_some() {
        out["frontendSidecar"] = json!(graph::SIDECAR);
    }
    if c.role == Role::Epp
        && let Some(config) = &graph.epp_config
    {
        out["eppConfig"] = json!({ "config": config });
    }
    if let Some(cache) = plan
        .compilation_cache
        .as_ref()
        .filter(|_| c.role.is_worker())
    {
        out["compilationCache"] = json!({"pvcName": cache.claim, "mountPath": cache.path});
    }
    if let Some(v) = runtime_version {
        out["runtimeVersionOverride"] = json!(v);
    }
    out
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
    if c.gpu.count > 0 {
        requests.insert(c.gpu.resource.clone(), json!(c.gpu.count.to_string()));
        limits.insert(c.gpu.resource.clone(), json!(c.gpu.count.to_string()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_tags_dynamo_reads_a_version_from() {
        for ok in [
            "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.1.0",
            "registry:5000/x/y:v1.4.0",
            "r/x:1.4.0-rc.1+build.5",
            "x:V2.0.0@sha256:abcd",
        ] {
            assert!(image_runtime_version(ok), "{ok}");
        }
        for bad in [
            "registry.example/dynamo:dev",
            "registry:5000/x/y",
            "x:1.4",
            "x:01.4.0",
            "x:1.4.0-01",
            "x:latest",
            "x@sha256:abcd",
            "x:vv1.0.0",
        ] {
            assert!(!image_runtime_version(bad), "{bad}");
        }
    }
}
