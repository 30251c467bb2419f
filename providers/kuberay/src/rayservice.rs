//! The RayService: `serveConfigV2` and a Ray cluster of one head and a GPU worker group
//! per serving role.
//!
//! Every group gets the image, env, Hugging Face token, pod labels and annotations,
//! node selector and tolerations of the ModelDeployment; `rayStartParams` is always set
//! (KubeRay 1.3 requires it). The head declares the container port `serve` (8000), which
//! makes KubeRay create the `<name>-serve-svc` Service.

use kube::ResourceExt;
use kube::api::DynamicObject;
use kubeairunway_sdk::RenderError;
use kubeairunway_sdk::api::{DEFAULT_GPU_TYPE, ModelDeployment, ServingMode};
use kubeairunway_sdk::provider::object;
use kubeairunway_sdk::render::{pod_annotations, pod_labels};
use serde_json::{Map, Value, json};

use crate::KubeRayProvider;
use crate::overrides::KubeRayOverrides;
use crate::serve_config::{self, Role};

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
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| provider.default_image());
    let pod = PodParts::of(md, &image)?;

    let head = json!({
        "rayStartParams": overrides.head_ray_start_params(),
        "template": pod.template(container(
            "ray-head",
            &pod,
            json!({
                "requests": {"cpu": overrides.head_cpu(), "memory": overrides.head_memory()},
                "limits": {"cpu": overrides.head_cpu(), "memory": overrides.head_memory()},
            }),
            Some(json!([
                {"name": "gcs-server", "containerPort": 6379},
                {"name": "dashboard", "containerPort": 8265},
                {"name": "client", "containerPort": 10001},
                {"name": "serve", "containerPort": SERVE_PORT},
            ])),
        )),
    });

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
                "headGroupSpec": head,
                "workerGroupSpecs": workers,
            },
        },
    }))
}

/// What every pod of the cluster shares.
struct PodParts {
    image: String,
    labels: Value,
    annotations: Value,
    env: Option<Value>,
    env_from: Option<Value>,
    node_selector: Option<Value>,
    tolerations: Option<Value>,
}

impl PodParts {
    fn of(md: &ModelDeployment, image: &str) -> Result<Self, RenderError> {
        let spec = &md.spec;
        let to_value = |what: &str, v: Result<Value, serde_json::Error>| {
            v.map_err(|e| RenderError(format!("cannot render {what}: {e}")))
        };
        let env = match spec.env.as_ref().filter(|e| !e.is_empty()) {
            Some(env) => Some(to_value("env", serde_json::to_value(env))?),
            None => None,
        };
        let tolerations = match spec.tolerations.as_ref().filter(|t| !t.is_empty()) {
            Some(t) => Some(to_value("tolerations", serde_json::to_value(t))?),
            None => None,
        };
        let env_from = spec
            .secrets
            .as_ref()
            .and_then(|s| s.hugging_face_token.as_deref())
            .filter(|s| !s.is_empty())
            .map(|secret| json!([{"secretRef": {"name": secret}}]));
        Ok(Self {
            image: image.to_string(),
            labels: json!(pod_labels(md)),
            annotations: json!(pod_annotations(md)),
            env,
            env_from,
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
        if let Some(n) = &self.node_selector {
            spec.insert("nodeSelector".into(), n.clone());
        }
        if let Some(t) = &self.tolerations {
            spec.insert("tolerations".into(), t.clone());
        }
        json!({"metadata": metadata, "spec": spec})
    }
}

fn container(name: &str, pod: &PodParts, resources: Value, ports: Option<Value>) -> Value {
    let mut c = Map::new();
    c.insert("name".into(), json!(name));
    c.insert("image".into(), json!(pod.image));
    c.insert("resources".into(), resources);
    if let Some(p) = ports {
        c.insert("ports".into(), p);
    }
    if let Some(e) = &pod.env {
        c.insert("env".into(), e.clone());
    }
    if let Some(e) = &pod.env_from {
        c.insert("envFrom".into(), e.clone());
    }
    Value::Object(c)
}

fn worker_group(md: &ModelDeployment, pod: &PodParts, role_name: &str, role: Role) -> Value {
    let spec = &md.spec;
    let (group, memory, cpu, gpu_type) = match spec.serving.mode {
        ServingMode::Aggregated => {
            let r = spec.resources.as_ref();
            (
                AGGREGATED_GROUP.to_string(),
                r.and_then(|r| r.memory.clone()),
                r.and_then(|r| r.cpu.clone()),
                r.and_then(|r| r.gpu.as_ref()).map(|g| g.type_.clone()),
            )
        }
        ServingMode::Disaggregated => {
            let c = match role_name {
                "prefill" => spec.scaling.prefill.as_ref(),
                _ => spec.scaling.decode.as_ref(),
            };
            (
                role_name.to_string(),
                c.and_then(|c| c.memory.clone()),
                None,
                c.and_then(|c| c.gpu.as_ref()).map(|g| g.type_.clone()),
            )
        }
    };
    let memory = memory
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| DEFAULT_WORKER_MEMORY.to_string());
    let gpu_type = gpu_type
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| DEFAULT_GPU_TYPE.to_string());
    let mut requests = Map::new();
    let mut limits = Map::new();
    requests.insert("memory".into(), json!(memory));
    limits.insert("memory".into(), json!(memory));
    if let Some(cpu) = cpu.filter(|c| !c.is_empty()) {
        requests.insert("cpu".into(), json!(cpu));
        limits.insert("cpu".into(), json!(cpu));
    }
    limits.insert(gpu_type, json!(role.gpus));
    json!({
        "groupName": group,
        "replicas": role.replicas,
        "minReplicas": role.replicas,
        "maxReplicas": role.replicas,
        "rayStartParams": {},
        "template": pod.template(container(
            "ray-worker",
            pod,
            json!({"requests": requests, "limits": limits}),
            None,
        )),
    })
}
