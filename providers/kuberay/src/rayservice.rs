//! The RayService: `serveConfigV2` and a Ray cluster of one head and a GPU worker group
//! per serving role, shaped after KubeRay's own Ray Serve LLM and autoscaling samples
//! (docs/upstream.md#kuberay-rayservice-shape).
//!
//! - Every group gets the image, env (the user's, then the storage caches'), the Hugging
//!   Face token Secret, volumes, pod labels and annotations, node selector and
//!   tolerations; `rayStartParams` is always set (required by the 1.3 CRD). The env, the
//!   Secret's `envFrom`, the volumes and a worker's GPUs are the SDK's building blocks
//!   ([`kubeairunway_sdk::engine`], [`kubeairunway_sdk::storage`],
//!   [`kubeairunway_sdk::gpu`]); the container is not the SDK's engine container,
//!   because Ray starts the engine itself from `serveConfigV2`.
//! - The head declares the container port `serve` (8000), which makes KubeRay create the
//!   serve Service, plus `gcs-server`, `dashboard` (KubeRay reaches the Ray dashboard
//!   through the head Service's port of that name) and `client`, named as KubeRay names
//!   its defaults. It keeps its CPUs for the Serve ingress (and the P/D proxy) but
//!   advertises no GPUs: the CUDA image could otherwise see a GPU node's devices it was
//!   never given.
//! - Workers: one pod per Serve replica, with the replica's GPUs as `num-gpus` (KubeRay
//!   would derive it from the limits, but not when `rayStartParams.resources` is set and
//!   fails its JSON parse); `num-cpus: "1"` when no CPU is given, because the Ray
//!   autoscaler must know each group's CPUs and a replica's actor needs one.
//! - Scaling: KubeRay never passes a RayService's worker replica counts to an existing
//!   RayCluster, so a fixed-size cluster would never follow `scaling.replicas`
//!   (docs/upstream.md#kuberay-scaling). The Ray autoscaler does: Serve's `num_replicas`
//!   (updated in place) asks for placement groups and the autoscaler adds or removes
//!   worker pods between `minReplicas: 0` and `maxReplicas` (the CRD's default), starting
//!   from `replicas` = the replicas asked for.
//! - Disaggregated: each role's group advertises a custom resource named after the role,
//!   one per GPU, which its LLMConfig's placement group asks for, so that prefill replicas
//!   land on prefill pods and decode replicas on decode pods (see `serve_config`).

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::DynamicObject;
use kubeairunway_sdk::RenderError;
use kubeairunway_sdk::api::{ModelDeployment, ServingMode};
use kubeairunway_sdk::engine::{self, VLLM};
use kubeairunway_sdk::gpu;
use kubeairunway_sdk::provider::object;
use kubeairunway_sdk::render::{pod_annotations, pod_labels};
use serde_json::{Map, Value, json};

use crate::overrides::KubeRayOverrides;
use crate::serve_config::{self, Role};
use crate::settings::KubeRayProvider;
use crate::storage;

/// The port Ray Serve's HTTP proxies listen on, and the serve Service's port.
pub const SERVE_PORT: i32 = 8000;
/// Default memory of a GPU worker.
pub const DEFAULT_WORKER_MEMORY: &str = "32Gi";
/// Name of the worker group in aggregated mode.
pub const AGGREGATED_GROUP: &str = "gpu-workers";

/// The serve Service KubeRay creates for a RayService named `name`: `<name>-serve-svc`
/// (`utils/util.go:349-351@v1.7.0`). KubeRay up to 1.3 (`kuberay_1_3`) passes it through
/// `CheckName` (`utils/util.go:292-294,184-206@v1.3.0`), which keeps only the last 50
/// characters and turns a leading digit or punctuation into `r`.
pub fn serve_service(name: &str, kuberay_1_3: bool) -> String {
    const CHECK_NAME_MAX: usize = 50;
    let full = format!("{name}-serve-svc");
    if !kuberay_1_3 {
        return full;
    }
    let mut cut = full[full.len().saturating_sub(CHECK_NAME_MAX)..].to_string();
    if cut
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c.is_ascii_punctuation())
    {
        cut.replace_range(0..1, "r");
    }
    cut
}

/// `maxReplicas` of every worker group: KubeRay's default (the CRD's `default`), so that
/// the autoscaler can follow any later `scaling.replicas`.
pub const MAX_WORKER_REPLICAS: i32 = i32::MAX;

/// The RayService for `md`.
pub fn render(
    provider: &KubeRayProvider,
    md: &ModelDeployment,
    api_version: &str,
    overrides: &KubeRayOverrides,
) -> Result<DynamicObject, RenderError> {
    let serve_config = serve_config::serve_config_yaml(md)?;
    let image = md
        .spec
        .effective_image()
        .map_or_else(|| provider.default_image(), str::to_string);
    let pod = PodParts::of(md, &image)?;
    let workers: Vec<Value> = serve_config::roles(md)
        .into_iter()
        .map(|(role_name, role)| worker_group(md, &pod, role_name, role))
        .collect();
    object(json!({
        "apiVersion": api_version,
        "kind": "RayService",
        "metadata": {"name": md.name_any()},
        "spec": {
            "serveConfigV2": serve_config,
            "rayClusterConfig": {
                "rayVersion": provider.cluster_ray_version(),
                "enableInTreeAutoscaling": true,
                "headGroupSpec": head_group(&pod, overrides),
                "workerGroupSpecs": workers,
            },
        },
    }))
}

fn head_group(pod: &PodParts, overrides: &KubeRayOverrides) -> Value {
    let mut params = BTreeMap::from([("num-gpus".to_string(), "0".to_string())]);
    params.extend(overrides.head_ray_start_params());
    let resources = json!({
        "requests": {"cpu": overrides.head_cpu(), "memory": overrides.head_memory()},
        "limits": {"cpu": overrides.head_cpu(), "memory": overrides.head_memory()},
    });
    let ports = json!([
        {"name": "gcs-server", "containerPort": 6379},
        {"name": "dashboard", "containerPort": 8265},
        {"name": "client", "containerPort": 10001},
        {"name": "serve", "containerPort": SERVE_PORT},
    ]);
    json!({
        "rayStartParams": params,
        "template": pod.template(container("ray-head", pod, resources, Some(ports))),
    })
}

/// What every pod of the cluster shares.
struct PodParts {
    image: String,
    labels: Value,
    annotations: Value,
    env: Option<Value>,
    env_from: Option<Value>,
    volumes: Option<Value>,
    volume_mounts: Option<Value>,
    node_selector: Option<Value>,
    tolerations: Option<Value>,
}

fn nonempty(values: Vec<Value>) -> Option<Value> {
    (!values.is_empty()).then_some(Value::Array(values))
}

impl PodParts {
    fn of(md: &ModelDeployment, image: &str) -> Result<Self, RenderError> {
        let spec = &md.spec;
        let to_value = |what: &str, v: Result<Value, serde_json::Error>| {
            v.map_err(|e| RenderError(format!("cannot render {what}: {e}")))
        };
        let mut env = engine::user_env(md)?;
        env.extend(storage::env_for(md, VLLM.cache_variables));
        let tolerations = match spec.tolerations.as_ref().filter(|t| !t.is_empty()) {
            Some(t) => Some(to_value("tolerations", serde_json::to_value(t))?),
            None => None,
        };
        let env_from = engine::hf_token_env_from(md);
        Ok(Self {
            image: image.to_string(),
            labels: json!(pod_labels(md)),
            annotations: json!(pod_annotations(md)),
            env: nonempty(env),
            env_from,
            volumes: nonempty(storage::pod_volumes(md)),
            volume_mounts: nonempty(storage::volume_mounts(md)),
            node_selector: spec
                .node_selector
                .as_ref()
                .filter(|n| !n.is_empty())
                .map(|n| json!(n)),
            tolerations,
        })
    }

    fn template(&self, container: Value) -> Value {
        let mut metadata = Map::new();
        metadata.insert("labels".into(), self.labels.clone());
        if self.annotations.as_object().is_some_and(|a| !a.is_empty()) {
            metadata.insert("annotations".into(), self.annotations.clone());
        }
        let mut spec = Map::new();
        spec.insert("containers".into(), Value::Array(vec![container]));
        for (key, value) in [
            ("nodeSelector", &self.node_selector),
            ("tolerations", &self.tolerations),
            ("volumes", &self.volumes),
        ] {
            if let Some(v) = value {
                spec.insert(key.into(), v.clone());
            }
        }
        json!({"metadata": metadata, "spec": spec})
    }
}

fn container(name: &str, pod: &PodParts, resources: Value, ports: Option<Value>) -> Value {
    let mut c = Map::new();
    c.insert("name".into(), json!(name));
    c.insert("image".into(), json!(pod.image));
    c.insert("resources".into(), resources);
    if let Some(ports) = ports {
        c.insert("ports".into(), ports);
    }
    for (key, value) in [
        ("env", &pod.env),
        ("envFrom", &pod.env_from),
        ("volumeMounts", &pod.volume_mounts),
    ] {
        if let Some(v) = value {
            c.insert(key.into(), v.clone());
        }
    }
    Value::Object(c)
}

/// A worker's memory, CPU and GPU resource name: the role's own (disaggregated), else
/// `spec.resources`, else the defaults; the GPUs are the SDK's ([`gpu::per_replica`]).
fn worker_resources(md: &ModelDeployment, role: gpu::Role) -> (String, Option<String>, String) {
    let spec = &md.spec;
    let r = spec.resources.as_ref();
    let component = match role {
        gpu::Role::Aggregated => None,
        gpu::Role::Prefill => spec.scaling.prefill.as_ref(),
        gpu::Role::Decode => spec.scaling.decode.as_ref(),
    };
    let memory = component
        .and_then(|c| c.memory.clone())
        .or_else(|| r.and_then(|r| r.memory.clone()))
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| DEFAULT_WORKER_MEMORY.to_string());
    let cpu = r.and_then(|r| r.cpu.clone()).filter(|c| !c.is_empty());
    (memory, cpu, gpu::per_replica(spec, role).resource)
}

fn worker_group(md: &ModelDeployment, pod: &PodParts, role_name: &str, role: Role) -> Value {
    let (memory, cpu, gpu_type) = worker_resources(md, role.kind);
    let mut requests = Map::new();
    let mut limits = Map::new();
    requests.insert("memory".into(), json!(memory));
    limits.insert("memory".into(), json!(memory));
    let mut params = BTreeMap::from([("num-gpus".to_string(), role.gpus.to_string())]);
    match cpu {
        Some(cpu) => {
            requests.insert("cpu".into(), json!(cpu));
            limits.insert("cpu".into(), json!(cpu));
        }
        None => {
            params.insert("num-cpus".into(), "1".into());
        }
    }
    limits.insert(gpu_type, json!(role.gpus));
    let group = match md.spec.serving.mode {
        ServingMode::Aggregated => AGGREGATED_GROUP,
        ServingMode::Disaggregated => {
            // KubeRay's own format for this parameter (`pod.go:1471@v1.7.0`), which it,
            // Ray and the autoscaler all parse (`autoscaling_config.py:509-515@ray-2.52.0`).
            params.insert(
                "resources".into(),
                format!("'{{\"{role_name}\":{}}}'", role.gpus),
            );
            role_name
        }
    };
    json!({
        "groupName": group,
        "replicas": role.replicas,
        "minReplicas": 0,
        "maxReplicas": MAX_WORKER_REPLICAS,
        "rayStartParams": params,
        "template": pod.template(container(
            "ray-worker",
            pod,
            json!({"requests": requests, "limits": limits}),
            None,
        )),
    })
}
