//! The deployment graph both adapters render: a frontend and one worker group
//! (aggregated), or a frontend with prefill and decode workers (disaggregated). Built
//! once from the ModelDeployment, independent of the DynamoGraphDeployment version.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, Toleration};
use kubeairunway_sdk::api::{EngineType, GpuSpec, ServingMode};
use kubeairunway_sdk::provider::engine_flags;
use kubeairunway_sdk::render::{pod_annotations, pod_labels};
use kubeairunway_sdk::{ModelDeployment, RenderError, Warning};

use crate::overrides::Overrides;

/// The key of the frontend component; its Service is `<name>-frontend`.
pub const FRONTEND: &str = "Frontend";
/// The port the frontend serves the OpenAI API on.
pub const FRONTEND_PORT: i32 = 8000;

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
    /// Container command (empty: the image's default).
    pub command: Vec<String>,
    /// Container arguments.
    pub args: Vec<String>,
    /// Environment variables.
    pub env: Vec<EnvVar>,
    /// CPU request.
    pub cpu: Option<String>,
    /// Memory request and limit.
    pub memory: Option<String>,
    /// GPUs per replica.
    pub gpu: Option<GpuSpec>,
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
    /// Secret with `HF_TOKEN`, as `envFromSecret`.
    pub hf_secret: Option<String>,
    /// Pod labels.
    pub labels: BTreeMap<String, String>,
    /// Pod annotations.
    pub annotations: BTreeMap<String, String>,
    /// Node selector.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// Components, frontend first.
    pub components: Vec<Component>,
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

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        value_from: None,
    }
}

/// Build the graph of `md`.
pub fn build(
    md: &ModelDeployment,
    overrides: &Overrides,
    dynamo_version: &str,
) -> Result<(Graph, Vec<Warning>), RenderError> {
    let spec = &md.spec;
    let mut warnings = Vec::new();
    let engine = spec
        .engine
        .type_
        .ok_or_else(|| RenderError("engine.type is required".into()))?;
    let (backend, module, model_flag) = match engine {
        EngineType::Vllm => ("vllm", "dynamo.vllm", "--model"),
        EngineType::Sglang => ("sglang", "dynamo.sglang", "--model-path"),
        EngineType::Trtllm => ("trtllm", "dynamo.trtllm", "--model-path"),
        EngineType::Llamacpp => {
            return Err(RenderError(
                "Dynamo does not support llamacpp engine".into(),
            ));
        }
    };
    let model = spec
        .model
        .id
        .clone()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| RenderError("model.id is required for Dynamo".into()))?;
    let image = spec
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .or_else(|| default_image(engine, dynamo_version))
        .unwrap_or_default();

    let mut engine_args = vec![model_flag.to_string(), model];
    if let Some(served) = spec.served_model_name() {
        engine_args.extend(["--served-model-name".to_string(), served.to_string()]);
    }
    if let Some(len) = spec.engine.context_length {
        match engine {
            EngineType::Vllm => {
                engine_args.extend(["--max-model-len".to_string(), len.to_string()]);
            }
            EngineType::Sglang => {
                engine_args.extend(["--context-length".to_string(), len.to_string()]);
            }
            _ => warnings.push(Warning::new(
                "ContextLengthIgnored",
                format!(
                    "engine.contextLength {len} is ignored: Dynamo's TensorRT-LLM worker takes the context length from its engine configuration (set it with engine.args)"
                ),
            )),
        }
    }
    if spec.engine.trust_remote_code {
        match engine {
            EngineType::Vllm | EngineType::Sglang => {
                engine_args.push("--trust-remote-code".to_string());
            }
            _ => warnings.push(Warning::new(
                "TrustRemoteCodeIgnored",
                "engine.trustRemoteCode is ignored: Dynamo's TensorRT-LLM worker has no such flag",
            )),
        }
    }
    let volumes: Vec<&str> = spec
        .model
        .storage
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| v.name.as_str())
        .collect();
    if !volumes.is_empty() {
        warnings.push(Warning::new(
            "StorageIgnored",
            format!(
                "model.storage volumes [{}] are not mounted: the Dynamo provider does not render storage yet",
                volumes.join(", ")
            ),
        ));
    }
    let user_flags = engine_flags(spec.engine.args.as_ref());
    let user_env = spec.env.clone().unwrap_or_default();
    let prefix = match engine {
        EngineType::Vllm => "Vllm",
        EngineType::Sglang => "Sglang",
        _ => "Trtllm",
    };

    let mut frontend_env = vec![env("DYN_ROUTER_MODE", &overrides.router_mode)];
    frontend_env.extend(user_env.iter().cloned());
    let mut components = vec![Component {
        name: FRONTEND.to_string(),
        role: Role::Frontend,
        replicas: overrides.frontend_replicas,
        command: vec!["python3".into(), "-m".into(), "dynamo.frontend".into()],
        args: vec![],
        env: frontend_env,
        cpu: Some(overrides.frontend_cpu.clone()),
        memory: Some(overrides.frontend_memory.clone()),
        gpu: None,
    }];
    let worker = |name: String, role: Role, replicas, mode: Option<&str>, cpu, memory, gpu| {
        let mut args = engine_args.clone();
        if let Some(mode) = mode {
            args.extend(["--disaggregation-mode".to_string(), mode.to_string()]);
        }
        args.extend(user_flags.iter().cloned());
        Component {
            name,
            role,
            replicas,
            command: vec!["python3".into(), "-m".into(), module.into()],
            args,
            env: user_env.clone(),
            cpu,
            memory,
            gpu,
        }
    };
    match spec.serving.mode {
        ServingMode::Aggregated => {
            let resources = spec.resources.clone().unwrap_or_default();
            components.push(worker(
                format!("{prefix}Worker"),
                Role::Worker,
                spec.scaling.replicas,
                None,
                resources.cpu,
                resources.memory,
                resources.gpu,
            ));
        }
        ServingMode::Disaggregated => {
            for (role, mode, scaling) in [
                (Role::Prefill, "prefill", &spec.scaling.prefill),
                (Role::Decode, "decode", &spec.scaling.decode),
            ] {
                let scaling = scaling.clone().unwrap_or_default();
                let label = if role == Role::Prefill {
                    "Prefill"
                } else {
                    "Decode"
                };
                components.push(worker(
                    format!("{prefix}{label}Worker"),
                    role,
                    scaling.replicas,
                    Some(mode),
                    None,
                    scaling.memory,
                    scaling.gpu,
                ));
            }
        }
    }
    Ok((
        Graph {
            name: md.metadata.name.clone().unwrap_or_default(),
            backend,
            image,
            hf_secret: spec
                .secrets
                .as_ref()
                .and_then(|s| s.hugging_face_token.clone())
                .filter(|s| !s.is_empty()),
            labels: pod_labels(md),
            annotations: pod_annotations(md),
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            components,
        },
        warnings,
    ))
}
