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
//!
//! With `spec.gateway.enabled` the graph is Dynamo's Gateway API Inference Extension
//! shape (`examples/backends/vllm/deploy/gaie/agg.yaml@2a6da14c8`, and AI Runway's
//! `providers/dynamo/transformer.go@b0d3fb7`): no standalone frontend; an endpoint picker
//! component (`Epp`, Dynamo's KV-aware picker, for which the operator makes the
//! InferencePool `<graph>-pool`); and a frontend sidecar on every worker, which serves
//! the OpenAI API on the worker pod itself for the pool to route to.

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

/// The key of the endpoint picker component (gateway mode).
pub const EPP: &str = "Epp";
/// The container the operator fills in as a worker's frontend sidecar
/// (`FrontendSidecarContainerName`, `deploy/operator/internal/consts/consts.go:237@2a6da14c8`).
pub const SIDECAR: &str = "sidecar-frontend";
/// The endpoint picker's image when the user names none: Dynamo's frontend image, which
/// carries the picker (AI Runway's `defaultFrontendImage`, transformer.go@b0d3fb7).
pub fn epp_image(version: &str) -> String {
    format!("nvcr.io/nvidia/ai-dynamo/dynamo-frontend:{version}")
}
/// vLLM's KV-cache block size when `--block-size` is not given: the block size the
/// picker's KV scorer must be told (`DYN_KV_CACHE_BLOCK_SIZE`), as AI Runway's
/// `DefaultKVCacheBlockSize` (transformer.go@b0d3fb7) says.
pub const DEFAULT_KV_BLOCK_SIZE: &str = "16";

/// The InferencePool the operator makes for a graph with an endpoint picker:
/// `<graph>-pool` in the graph's namespace (`GetPoolName`,
/// `deploy/operator/internal/dynamo/epp/inference_pool.go@2a6da14c8`, the same at
/// `3e3b3b187`).
pub fn pool_name(graph: &str) -> String {
    format!("{graph}-pool")
}

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
/// controllers list worker pods by the same pair). With the gateway they serve the API
/// through their frontend sidecars on [`FRONTEND_PORT`], in the pool the operator makes.
pub fn worker_pods(md: &ModelDeployment) -> kubeairunway_sdk::ServingPods {
    let name = md.metadata.name.as_deref().unwrap_or_default();
    let pods = kubeairunway_sdk::ServingPods::labelled([
        (GRAPH_LABEL, name),
        (COMPONENT_TYPE_LABEL, "worker"),
    ]);
    if md.spec.gateway_enabled() {
        pods.on_port(FRONTEND_PORT)
            .with_inference_pool(pool_name(name))
    } else {
        pods
    }
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
    /// Endpoint picker (gateway mode).
    Epp,
}

impl Role {
    /// The worker roles count for replicas.
    pub fn is_worker(self) -> bool {
        !matches!(self, Role::Frontend | Role::Epp)
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
    /// The image of its main container, when not the graph's.
    pub image: Option<String>,
    /// A worker's frontend sidecar arguments (gateway mode).
    pub sidecar: Option<Vec<String>>,
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
    /// Components, frontend (or endpoint picker) first.
    pub components: Vec<Component>,
    /// The endpoint picker's `eppConfig.config` (gateway mode).
    pub epp_config: Option<serde_json::Value>,
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

/// What the Dynamo provider does not serve of `md` with these overrides: the frontend
/// overrides in gateway mode, which has no standalone frontend.
fn unsupported(md: &ModelDeployment, overrides: &Overrides) -> Vec<Warning> {
    let mut out = Vec::new();
    if md.spec.gateway_enabled() && overrides.frontend_asked {
        out.push(Warning::unsupported_field(
            "provider.overrides.routerMode/frontend",
            "with spec.gateway enabled there is no standalone frontend: Dynamo's endpoint \
             picker chooses the worker, and each worker's frontend sidecar serves it directly",
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
    let mut warnings = unsupported(md, overrides);
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
    let gateway = md.spec.gateway_enabled();
    let mut components = if gateway {
        vec![epp(md, dynamo_version, &user_flags)]
    } else {
        vec![frontend(overrides, &user_env)]
    };
    components.extend(workers(md, backend, &options, &user_flags)?);
    if gateway {
        let disaggregated = spec.serving.mode == ServingMode::Disaggregated;
        for c in components.iter_mut().filter(|c| c.role.is_worker()) {
            c.sidecar = Some(sidecar_args(disaggregated));
        }
    }
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
            epp_config: gateway.then(|| epp_config(spec.serving.mode)),
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
        image: None,
        sidecar: None,
    }
}

/// The endpoint picker: one replica (the operator's webhook refuses others,
/// `webhook/validation/shared_v1beta1.go:126-131@2a6da14c8`), Dynamo's frontend image,
/// and what its KV scorer reads at start: the model's served name and the workers' KV
/// block size (the upstream example's env), the decode fallback and disaggregation flags
/// (AI Runway's `buildEPP`, transformer.go@b0d3fb7; without them `create_routers` fails).
fn epp(md: &ModelDeployment, version: &str, user_flags: &BTreeMap<String, String>) -> Component {
    let spec = &md.spec;
    let disaggregated = spec.serving.mode == ServingMode::Disaggregated;
    let block_size = user_flags
        .iter()
        .find(|(k, _)| engine::arg_key(k) == "block-size")
        .map_or(DEFAULT_KV_BLOCK_SIZE, |(_, v)| v.as_str());
    let model = spec.served_model_name().unwrap_or_default();
    Component {
        name: EPP.to_string(),
        role: Role::Epp,
        replicas: 1,
        command: vec![],
        args: vec![],
        env: vec![
            env("DYN_MODEL_NAME", model),
            env("DYN_KV_CACHE_BLOCK_SIZE", block_size),
            env(
                "DYN_DECODE_FALLBACK",
                if disaggregated { "false" } else { "true" },
            ),
            env(
                "DYN_ENFORCE_DISAGG",
                if disaggregated { "true" } else { "false" },
            ),
        ],
        cpu: None,
        memory: None,
        gpu: Gpus::none(),
        image: Some(epp_image(version)),
        sidecar: None,
    }
}

/// A worker's frontend sidecar: `dynamo.frontend`, routing directly to its own engine
/// when aggregated (the picker chose the pod); disaggregated, Dynamo's default router
/// coordinates prefill and decode (AI Runway's `buildFrontendSidecar`,
/// transformer.go@b0d3fb7; the upstream example's sidecar args).
fn sidecar_args(disaggregated: bool) -> Vec<String> {
    let mut args = vec!["-m".to_string(), "dynamo.frontend".to_string()];
    if !disaggregated {
        args.extend(["--router-mode".to_string(), "direct".to_string()]);
    }
    args
}

/// The picker's plugins and scheduling profiles: Dynamo's label filter on the
/// sub-component type, its KV-aware decode (and prefill) scorers and a max-score picker
/// (`examples/backends/vllm/deploy/gaie/agg.yaml@2a6da14c8`; disaggregated as AI
/// Runway's `buildEPPPluginsAndProfiles`, transformer.go@b0d3fb7).
fn epp_config(mode: ServingMode) -> serde_json::Value {
    use serde_json::json;
    let filter = |name: &str, value: &str, no_label: bool| {
        json!({"name": name, "type": "label-filter", "parameters": {
            "label": "nvidia.com/dynamo-sub-component-type",
            "validValues": [value], "allowsNoLabel": no_label}})
    };
    let profile = |name: &str, filter: &str, scorer: &str| {
        json!({"name": name, "plugins": [
            {"pluginRef": filter, "weight": 1},
            {"pluginRef": scorer, "weight": 1},
            {"pluginRef": "picker", "weight": 1}]})
    };
    let handler = json!({"type": "disagg-profile-handler"});
    let picker = json!({"name": "picker", "type": "max-score-picker"});
    let decode = json!({"name": "dyn-decode", "type": "dyn-decode-scorer"});
    match mode {
        ServingMode::Aggregated => json!({
            "plugins": [handler, filter("decode-filter", "decode", true), picker, decode],
            "schedulingProfiles": [profile("decode", "decode-filter", "dyn-decode")],
        }),
        ServingMode::Disaggregated => json!({
            "plugins": [
                handler,
                filter("prefill-filter", "prefill", false),
                filter("decode-filter", "decode", false),
                picker,
                {"name": "dyn-prefill", "type": "dyn-prefill-scorer"},
                decode,
            ],
            "schedulingProfiles": [
                profile("prefill", "prefill-filter", "dyn-prefill"),
                profile("decode", "decode-filter", "dyn-decode"),
            ],
        }),
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
            image: None,
            sidecar: None,
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
