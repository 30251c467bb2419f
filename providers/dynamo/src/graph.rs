//! The deployment graph both adapters render: a frontend and one worker group
//! (aggregated), or a frontend with prefill and decode workers (disaggregated). Built
//! once from the ModelDeployment, independent of the DynamoGraphDeployment version.
//!
//! The frontend is rendered with its image only, as in every upstream example: the
//! operator's frontend container already runs `python3 -m dynamo.frontend` and merges ours
//! over it, where an empty list keeps the default: a command `[python3, -m,
//! dynamo.frontend]` without arguments would run `python3 -m dynamo.frontend -m
//! dynamo.frontend`, which the frontend refuses (docs/upstream.md#dynamo-frontend).
//!
//! Node selector and tolerations go on the workers only: the frontend needs no GPU node,
//! and no upstream example places it on one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Toleration};
use kubeairunway_sdk::api::{EngineType, ServingMode};
use kubeairunway_sdk::engine;
use kubeairunway_sdk::gpu::{self, Gpus};
use kubeairunway_sdk::render::{pod_annotations, pod_labels};
use kubeairunway_sdk::{ModelDeployment, RenderError, Warning};

use crate::args::{self, EngineOptions, Mode};
use crate::overrides::Overrides;
use crate::storage::{self, Volume};

/// The key of the frontend component.
pub const FRONTEND: &str = "Frontend";
/// The port the frontend serves the OpenAI API on (`DynamoServicePort`,
/// `deploy/operator/internal/consts/consts.go:13@2a6da14c8`).
pub const FRONTEND_PORT: i32 = 8000;

/// The label the Dynamo operator puts on a graph's pods naming the graph
/// (`KubeLabelDynamoGraphDeploymentName`, deploy/operator/internal/consts/consts.go
/// @0367e40).
pub const GRAPH_LABEL: &str = "nvidia.com/dynamo-graph-deployment-name";
/// The label the Dynamo operator puts on a graph's pods naming the component's type
/// (`KubeLabelDynamoComponentType`, same file), `worker` on every worker, prefill and
/// decode ones included (their `subComponentType` tells them apart).
pub const COMPONENT_TYPE_LABEL: &str = "nvidia.com/dynamo-component-type";

/// The worker pods of `md`'s graph (named as `md`), by the two labels the operator puts
/// on a graph's pods (`GRAPH_LABEL`, `COMPONENT_TYPE_LABEL=worker`; the operator's own
/// controllers list worker pods by the same pair).
pub fn worker_pods(md: &ModelDeployment) -> kubeairunway_sdk::ServingPods {
    kubeairunway_sdk::ServingPods::labelled([
        (GRAPH_LABEL, md.metadata.name.as_deref().unwrap_or_default()),
        (COMPONENT_TYPE_LABEL, "worker"),
    ])
}

/// The role of a component in the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// HTTP frontend and router.
    Frontend,
    /// Aggregated worker (prefill and decode).
    Worker,
    /// Prefill worker.
    Prefill,
    /// Decode worker.
    Decode,
}

impl Role {
    /// The worker roles count for replicas.
    pub fn is_worker(self) -> bool {
        self != Role::Frontend
    }
}

/// One component of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Component {
    /// Component key (v1alpha1 service name, v1beta1 component name).
    pub name: String,
    /// Role.
    pub role: Role,
    /// Replicas.
    pub replicas: i32,
    /// Container command (empty: the operator's default).
    pub command: Vec<String>,
    /// Container arguments (empty: the operator's default).
    pub args: Vec<String>,
    /// Environment variables.
    pub env: Vec<EnvVar>,
    /// CPU request.
    pub cpu: Option<String>,
    /// Memory request and limit.
    pub memory: Option<String>,
    /// GPUs per replica ([`gpu::per_replica`]).
    pub gpu: Gpus,
}

/// Everything the adapters need, computed once.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    /// DynamoGraphDeployment name (the ModelDeployment's).
    pub name: String,
    /// `backendFramework`: vllm, sglang or trtllm.
    pub backend: &'static str,
    /// Image of every container.
    pub image: String,
    /// `provider.overrides.runtimeVersion`.
    pub runtime_version: Option<String>,
    /// The provider's Dynamo version (`--dynamo-version`).
    pub dynamo_version: String,
    /// Secret with `HF_TOKEN`, as `envFromSecret`.
    pub hf_secret: Option<String>,
    /// Pod labels.
    pub labels: BTreeMap<String, String>,
    /// Pod annotations.
    pub annotations: BTreeMap<String, String>,
    /// Node selector of the workers.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the workers.
    pub tolerations: Vec<Toleration>,
    /// `spec.model.storage`, resolved.
    pub volumes: Vec<Volume>,
    /// Components, frontend first.
    pub components: Vec<Component>,
}

/// The environment of `c`: its own, and `HF_HOME` at the model cache unless the user set
/// it (as the upstream model-cache examples do on every component).
pub fn env_of(c: &Component, plan: &storage::Plan) -> Vec<EnvVar> {
    let mut out = c.env.clone();
    if let Some(home) = &plan.hf_home
        && !out.iter().any(|e| e.name == "HF_HOME")
    {
        out.push(env("HF_HOME", home));
    }
    out
}

/// The volumes mounted on `c`: model caches on every component, the others on workers.
pub fn mounts_of<'a>(c: &Component, plan: &'a storage::Plan) -> Vec<&'a Volume> {
    plan.mounts
        .iter()
        .filter(|v| c.role.is_worker() || v.on_frontend())
        .collect()
}

/// The runtime image of an engine at a Dynamo version.
pub fn default_image(engine: EngineType, version: &str) -> Option<String> {
    let runtime = match engine {
        EngineType::Vllm => "vllm-runtime",
        EngineType::Sglang => "sglang-runtime",
        EngineType::Trtllm => "tensorrtllm-runtime",
        EngineType::Llamacpp => return None,
    };
    Some(format!("nvcr.io/nvidia/ai-dynamo/{runtime}:{version}"))
}

/// An environment variable with a value.
pub fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        value_from: None,
    }
}

/// An environment variable from a field of the pod (the downward API).
pub fn env_from_field(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: field_path.to_string(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// Fields of the ModelDeployment the Dynamo provider does not serve.
fn unsupported(md: &ModelDeployment) -> Vec<Warning> {
    let mut out = Vec::new();
    if md.spec.gateway.is_some() {
        out.push(Warning::unsupported_field(
            "spec.gateway",
            "Dynamo's workers serve no HTTP port of their own (its frontend does) and Dynamo's \
             own endpoint picker is not rendered yet, so core's gateway makes no InferencePool \
             for them; use the frontend Service",
        ));
    }
    out
}

/// Build the graph of `md`: its engine options, the frontend, then the workers.
pub fn build(
    md: &ModelDeployment,
    overrides: &Overrides,
    dynamo_version: &str,
) -> Result<(Graph, Vec<Warning>), RenderError> {
    let spec = &md.spec;
    let mut warnings = unsupported(md);
    let engine = spec
        .engine
        .type_
        .ok_or_else(|| RenderError("engine.type is required".into()))?;
    let backend = args::backend(engine)
        .ok_or_else(|| RenderError("Dynamo does not support llamacpp engine".into()))?;
    let model = spec
        .model
        .id
        .clone()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| RenderError("model.id is required for Dynamo".into()))?;
    let image = spec
        .effective_image()
        .map(str::to_string)
        .or_else(|| default_image(engine, dynamo_version))
        .unwrap_or_default();
    let options = EngineOptions {
        model,
        served_name: spec.served_model_name().map(str::to_string),
        context_length: spec.engine.context_length,
        trust_remote_code: spec.engine.trust_remote_code,
        args: spec.engine.args.clone(),
        enable_prefix_caching: spec.engine.enable_prefix_caching,
        enforce_eager: spec.engine.enforce_eager,
        extra_args: engine::extra_args(md)?,
    };
    let user_flags = engine::user_flags(spec);
    // What the backend's workers cannot be told, once for the graph.
    let (_, toggle_warnings) = engine::toggle_flags(
        backend.flags,
        spec.engine.enable_prefix_caching,
        spec.engine.enforce_eager,
        &user_flags,
    );
    warnings.extend(toggle_warnings);
    let user_env = spec.env.clone().unwrap_or_default();
    args::refuse_worker_settings(
        backend,
        &user_flags,
        user_env.iter().map(|e| e.name.as_str()),
    )?;
    let mut components = vec![frontend(overrides, &user_env)];
    components.extend(workers(md, backend, &options, &user_flags)?);
    Ok((
        Graph {
            name: md.metadata.name.clone().unwrap_or_default(),
            backend: backend.framework,
            image,
            runtime_version: overrides.runtime_version.clone(),
            dynamo_version: dynamo_version.to_string(),
            hf_secret: engine::hf_token_secret(md).map(str::to_string),
            labels: pod_labels(md),
            annotations: pod_annotations(md),
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            volumes: storage::volumes(md)?,
            components,
        },
        warnings,
    ))
}

/// The frontend: the router mode, replicas and resources of the overrides, the user's env.
fn frontend(overrides: &Overrides, user_env: &[EnvVar]) -> Component {
    let mut env = vec![env("DYN_ROUTER_MODE", &overrides.router_mode)];
    env.extend(user_env.iter().cloned());
    Component {
        name: FRONTEND.to_string(),
        role: Role::Frontend,
        replicas: overrides.frontend_replicas,
        command: vec![],
        args: vec![],
        env,
        cpu: Some(overrides.frontend_cpu.clone()),
        memory: Some(overrides.frontend_memory.clone()),
        gpu: Gpus::none(),
    }
}

/// The workers of `md`'s serving mode, each with its command line and environment: the
/// user's, and the pod IP as the NIXL side-channel host where its vLLM uses NIXL.
fn workers(
    md: &ModelDeployment,
    backend: &args::Backend,
    options: &EngineOptions,
    user_flags: &BTreeMap<String, String>,
) -> Result<Vec<Component>, RenderError> {
    let spec = &md.spec;
    let user_env = spec.env.clone().unwrap_or_default();
    let resources = spec.resources.clone().unwrap_or_default();
    let worker = |name: String, role: Role, mode: Mode, replicas, memory, gpu_role| {
        let gpu = gpu::per_replica(spec, gpu_role);
        let (command, args) = args::worker(backend, options, mode, gpu.count)?;
        let mut env = user_env.clone();
        if args::uses_nixl(backend, user_flags, mode)
            && !env.iter().any(|e| e.name == args::NIXL_SIDE_CHANNEL_HOST)
        {
            env.push(env_from_field(args::NIXL_SIDE_CHANNEL_HOST, "status.podIP"));
        }
        Ok::<_, RenderError>(Component {
            name,
            role,
            replicas,
            command,
            args,
            env,
            cpu: resources.cpu.clone(),
            memory,
            gpu,
        })
    };
    let prefix = backend.prefix;
    match spec.serving.mode {
        ServingMode::Aggregated => Ok(vec![worker(
            format!("{prefix}Worker"),
            Role::Worker,
            Mode::Aggregated,
            spec.scaling.replicas,
            resources.memory.clone(),
            gpu::Role::Aggregated,
        )?]),
        ServingMode::Disaggregated => [
            (
                Role::Prefill,
                Mode::Prefill,
                "Prefill",
                &spec.scaling.prefill,
                gpu::Role::Prefill,
            ),
            (
                Role::Decode,
                Mode::Decode,
                "Decode",
                &spec.scaling.decode,
                gpu::Role::Decode,
            ),
        ]
        .into_iter()
        .map(|(role, mode, label, scaling, gpu_role)| {
            let scaling = scaling.clone().unwrap_or_default();
            worker(
                format!("{prefix}{label}Worker"),
                role,
                mode,
                scaling.replicas,
                scaling.memory.or_else(|| resources.memory.clone()),
                gpu_role,
            )
        })
        .collect(),
    }
}
