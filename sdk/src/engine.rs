//! What the providers know about the inference engines, in one place: how each engine's
//! server spells the options a ModelDeployment sets ([`Flags`]), tensor parallelism from
//! a replica's GPUs ([`Parallelism::tensor_parallel`]), the Hugging Face token Secret
//! ([`hf_token_secret`], [`hf_token_env_from`]), the engines' cache variables
//! ([`Flags::cache_variables`]), `/dev/shm` ([`shm_volume`]), and, for providers that
//! render pods themselves (a plain Deployment, a pod template of their upstream), the
//! whole serving container of vLLM, SGLang and llama.cpp ([`container`]) with its GPU
//! resources ([`gpu_resources`], the GPUs of a role from [`crate::gpu`]). Everything here
//! is pure: the same ModelDeployment gives the same JSON.
//!
//! | engine | server | model (Hugging Face / path) | served name | tensor parallel | context | trust remote code |
//! |---|---|---|---|---|---|---|
//! | vLLM | `python3 -m vllm.entrypoints.openai.api_server` | `--model` | `--served-model-name` | `--tensor-parallel-size` | `--max-model-len` | `--trust-remote-code` |
//! | SGLang | `python3 -m sglang.launch_server` | `--model-path` | `--served-model-name` | `--tp` | `--context-length` | `--trust-remote-code` |
//! | llama.cpp | `llama-server` | `--hf-repo` / `--model` | `--alias` | (splits layers over all GPUs itself) | `--ctx-size` | (runs no model code) |
//!
//! (The flags as each server documents them: vLLM's `vllm/engine/arg_utils.py` and
//! `vllm/entrypoints/openai/cli_args.py`, SGLang's `python/sglang/srt/server_args.py`
//! (`--tp` as SGLang's and Dynamo's examples spell it; it also accepts `--tp-size` and
//! `--tensor-parallel-size`), llama.cpp's `tools/server/README.md`.) TensorRT-LLM has no
//! entry: no provider starts its own server, and Dynamo's TensorRT-LLM worker has a
//! parser of its own (see the Dynamo provider's `args` module). Its server,
//! `trtllm-serve`, takes the model as its argument and serves it under that name (it has
//! no served-name option) and spells its options in snake case (`--tp_size`,
//! `--max_seq_len`, `--trust_remote_code`: `tensorrt_llm/commands/serve.py@00209af1`,
//! NVIDIA/TensorRT-LLM), so its row waits for its container.
//!
//! Who uses what:
//! - [`Flags`] and [`Parallelism`]: [`container`]; the Dynamo provider for its vLLM and
//!   SGLang workers, whose `python3 -m dynamo.vllm` and `python3 -m dynamo.sglang` parse
//!   the engines' own flags (`AsyncEngineArgs.add_cli_args` in
//!   `components/src/dynamo/vllm/args.py@000a36a7`, `ServerArgs.add_cli_args` in
//!   `components/src/dynamo/sglang/args.py@010ba752`, ai-dynamo/dynamo); the KubeRay
//!   provider, whose Ray Serve LLM takes vLLM's engine arguments as keyword arguments
//!   (the same names in snake case: `max_model_len`, `tensor_parallel_size`,
//!   `trust_remote_code`); the KAITO provider, whose vLLM wrapper passes each key of its
//!   inference config as `--key value` (`max-model-len`, `served-model-name`).
//! - [`hf_token_secret`] / [`hf_token_env_from`]: [`container`], KubeRay (every Ray pod),
//!   Dynamo (`envFromSecret` in v1alpha1, `envFrom` in v1beta1), KAITO (the llama.cpp
//!   template's `envFrom`, the vLLM preset's `modelAccessSecret`).
//! - [`Flags::cache_variables`] with [`crate::storage::env_for`]: [`container`] and
//!   KubeRay (vLLM's). Dynamo sets `HF_HOME` itself and leaves `VLLM_CACHE_ROOT` to its
//!   operator's compilation cache.
//! - [`shm_volume`]: [`container`] only. KubeRay mounts its own `/dev/shm` in every Ray
//!   pod (`ray-operator/controllers/ray/common/pod.go:26-31@v1.7.0`), Dynamo's operator
//!   gives every component an 8Gi one (`deploy/operator/docs/footer.md@20612125`, "Shared
//!   Memory"), KAITO builds its preset pods itself, and its llama.cpp template runs one
//!   process that shares no tensors.
//! - [`container`] and [`gpu_resources`]: the operator-free Deployment provider. The
//!   operators build their own containers, so the others take the pieces above.
//!
//! The container: each engine is started by its own OpenAI-compatible server, listening
//! on all addresses at [`PORT`] (or the port given), with the readiness probe on its
//! `/health`. Tensor parallelism is the replica's GPU count, divided by the pipeline and
//! data parallelism `engine.args` set, unless `engine.args` sets it (with `_` or `-`:
//! vLLM's parser takes both); `engine.trustRemoteCode` adds `--trust-remote-code`
//! (llama.cpp runs no model code: named as ignored); llama.cpp offloads every layer to
//! the GPUs (`--n-gpu-layers 999`) when it has any, and loads a `source: custom` model
//! from its path with `--model`. `engine.args` follow in key order
//! ([`crate::provider::engine_flags`]). The Hugging Face token Secret
//! (`secrets.huggingFaceToken`, key `HF_TOKEN`) is passed as `envFrom`, `spec.env` as
//! `env`, and `/dev/shm` is a memory-backed `emptyDir` (engines share tensors between
//! processes through it; the container runtime's default is 64 MiB). The storage volumes
//! of `model.storage` are mounted by the rules of [`crate::storage`] (defaults
//! `/model-cache` and `/compilation-cache`), with the engine's cache variables: vLLM
//! `HF_HOME` and `VLLM_CACHE_ROOT`, SGLang `HF_HOME`, llama.cpp `LLAMA_CACHE` (where
//! `--hf-repo` downloads go) for the model cache.
//! TensorRT-LLM is not built here yet ([`container`] returns a [`RenderError`]).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::api::{EngineType, ModelDeployment, ModelSource, VolumePurpose};
use crate::gpu::{self, Role};
use crate::provider::{RenderError, Warning, engine_flags};
use crate::storage;

/// The port the engine listens on unless the provider chooses another.
pub const PORT: i32 = 8000;
/// Name of the container port, for Services to target.
pub const PORT_NAME: &str = "http";
/// Name of the serving container.
pub const CONTAINER_NAME: &str = "engine";
/// The pod volume mounted at `/dev/shm`.
pub const SHM_VOLUME: &str = "dshm";
/// Where [`SHM_VOLUME`] is mounted.
pub const SHM_PATH: &str = "/dev/shm";

/// The `engine.args` keys that set each kind of parallelism, as [`arg_key`] spells them
/// (without dashes, `_` as `-`), the engine's long flag first.
#[derive(Debug, PartialEq, Eq)]
pub struct Parallelism {
    /// Tensor parallelism.
    pub tensor: &'static [&'static str],
    /// Pipeline parallelism.
    pub pipeline: &'static [&'static str],
    /// Data parallelism.
    pub data: &'static [&'static str],
}

impl Parallelism {
    /// Tensor parallelism for `gpus` GPUs per replica: all of them, divided by the
    /// pipeline and data parallelism `args` set; `None` when `args` set it, when there
    /// are no GPUs, or when the GPUs do not divide evenly (the engine's own default then
    /// applies, and its own error says why).
    pub fn tensor_parallel(
        &self,
        gpus: i32,
        args: Option<&BTreeMap<String, String>>,
    ) -> Option<i32> {
        if gpus < 1 || sets(args, self.tensor) {
            return None;
        }
        let per = int(args, self.pipeline)
            .unwrap_or(1)
            .checked_mul(int(args, self.data).unwrap_or(1))?;
        (per >= 1 && gpus % per == 0).then(|| gpus / per)
    }
}

/// How an engine's server spells the options a ModelDeployment sets.
#[derive(Debug, PartialEq, Eq)]
pub struct Flags {
    /// The model as a Hugging Face id.
    pub model: &'static str,
    /// The model as a path (`model.source: custom`).
    pub model_path: &'static str,
    /// The name the API serves the model as.
    pub served_name: &'static str,
    /// Tensor parallelism; `None`: the engine spreads over its GPUs itself.
    pub tensor_parallel: Option<&'static str>,
    /// The `engine.args` keys of parallelism.
    pub parallelism: Parallelism,
    /// The longest context (prompt and output) in tokens.
    pub context_length: &'static str,
    /// Run the model's own code from its repository; `None`: the engine runs none.
    pub trust_remote_code: Option<&'static str>,
    /// The variables that point the engine at a storage volume of a purpose (the first
    /// volume of each), unless `spec.env` sets them.
    pub cache_variables: &'static [(VolumePurpose, &'static str)],
}

/// vLLM (`vllm/engine/arg_utils.py`, `vllm/entrypoints/openai/cli_args.py`).
pub const VLLM: Flags = Flags {
    model: "--model",
    model_path: "--model",
    served_name: "--served-model-name",
    tensor_parallel: Some("--tensor-parallel-size"),
    parallelism: Parallelism {
        tensor: &["tensor-parallel-size", "tp"],
        pipeline: &["pipeline-parallel-size", "pp"],
        data: &["data-parallel-size", "dp"],
    },
    context_length: "--max-model-len",
    trust_remote_code: Some("--trust-remote-code"),
    cache_variables: &[
        (VolumePurpose::ModelCache, "HF_HOME"),
        (VolumePurpose::CompilationCache, "VLLM_CACHE_ROOT"),
    ],
};

/// SGLang (`python/sglang/srt/server_args.py`).
pub const SGLANG: Flags = Flags {
    model: "--model-path",
    model_path: "--model-path",
    served_name: "--served-model-name",
    tensor_parallel: Some("--tp"),
    parallelism: Parallelism {
        tensor: &["tensor-parallel-size", "tp-size", "tp"],
        pipeline: &["pipeline-parallel-size", "pp-size", "pp"],
        data: &["data-parallel-size", "dp-size", "dp"],
    },
    context_length: "--context-length",
    trust_remote_code: Some("--trust-remote-code"),
    cache_variables: &[(VolumePurpose::ModelCache, "HF_HOME")],
};

/// llama.cpp's `llama-server` (`tools/server/README.md`): it splits a model's layers over
/// every GPU it sees, so it has no parallelism to set.
pub const LLAMACPP: Flags = Flags {
    model: "--hf-repo",
    model_path: "--model",
    served_name: "--alias",
    tensor_parallel: None,
    parallelism: Parallelism {
        tensor: &[],
        pipeline: &[],
        data: &[],
    },
    context_length: "--ctx-size",
    trust_remote_code: None,
    cache_variables: &[(VolumePurpose::ModelCache, "LLAMA_CACHE")],
};

impl Flags {
    /// The flags of `engine`'s own server; `None` for TensorRT-LLM (see the module doc).
    pub fn of(engine: EngineType) -> Option<&'static Flags> {
        match engine {
            EngineType::Vllm => Some(&VLLM),
            EngineType::Sglang => Some(&SGLANG),
            EngineType::Llamacpp => Some(&LLAMACPP),
            EngineType::Trtllm => None,
        }
    }

    /// The flag that names the model from `source`.
    pub fn model_flag(&self, source: ModelSource) -> &'static str {
        match source {
            ModelSource::Huggingface => self.model,
            ModelSource::Custom => self.model_path,
        }
    }
}

/// A flag or `engine.args` key as the engines' parsers compare them: without leading
/// dashes, `_` as `-` (`--tensor_parallel_size` is `tensor-parallel-size`).
pub fn arg_key(flag: &str) -> String {
    flag.trim_start_matches('-').replace('_', "-")
}

/// Whether `args` set any of `keys` (spelled as [`arg_key`] gives them).
pub fn sets(args: Option<&BTreeMap<String, String>>, keys: &[&str]) -> bool {
    args.into_iter()
        .flatten()
        .any(|(k, _)| keys.contains(&arg_key(k).as_str()))
}

/// The integer `args` give the first of `keys` they set.
fn int(args: Option<&BTreeMap<String, String>>, keys: &[&str]) -> Option<i32> {
    let args: BTreeMap<String, &str> = args
        .into_iter()
        .flatten()
        .map(|(k, v)| (arg_key(k), v.as_str()))
        .collect();
    keys.iter()
        .find_map(|k| args.get(*k))
        .and_then(|v| v.trim().parse().ok())
}

/// The Secret holding the Hugging Face token (`secrets.huggingFaceToken`, key
/// `HF_TOKEN`), if one is named.
pub fn hf_token_secret(md: &ModelDeployment) -> Option<&str> {
    md.spec
        .secrets
        .as_ref()
        .and_then(|s| s.hugging_face_token.as_deref())
        .filter(|s| !s.is_empty())
}

/// A container's `envFrom` taking every key of `secret` as a variable.
pub fn env_from_secret(secret: &str) -> Value {
    json!([{"secretRef": {"name": secret}}])
}

/// The serving container's `envFrom` for the Hugging Face token Secret, if one is named.
pub fn hf_token_env_from(md: &ModelDeployment) -> Option<Value> {
    hf_token_secret(md).map(env_from_secret)
}

/// `spec.env` as container `env` entries.
pub fn user_env(md: &ModelDeployment) -> Result<Vec<Value>, RenderError> {
    md.spec
        .env
        .iter()
        .flatten()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()
        .map_err(|e| RenderError(format!("spec.env: {e}")))
}

/// The memory-backed pod volume for `/dev/shm` and its mount.
pub fn shm_volume() -> (Value, Value) {
    (
        json!({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}),
        json!({"name": SHM_VOLUME, "mountPath": SHM_PATH}),
    )
}

/// The serving container of `md` and the pod volumes it mounts.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineContainer {
    /// The container (`name`, `image`, `command`, `args`, `ports`, `readinessProbe`, ...).
    pub container: Value,
    /// Pod volumes the container mounts.
    pub volumes: Vec<Value>,
    /// Spec fields the engine cannot honour.
    pub warnings: Vec<Warning>,
}

/// The serving container for `md`, running `image`, listening on `port`.
///
/// Errors: no engine, TensorRT-LLM, no `model.id` (for `source: custom`, `model.id`
/// is the model's path inside the image), or a storage volume that cannot be mounted
/// ([`storage::check`]).
pub fn container(
    md: &ModelDeployment,
    image: &str,
    port: i32,
) -> Result<EngineContainer, RenderError> {
    let spec = &md.spec;
    let engine = spec
        .engine
        .type_
        .ok_or_else(|| RenderError("spec.engine.type is required".into()))?;
    let flags = Flags::of(engine).ok_or_else(|| {
        RenderError("the SDK's engine container does not build TensorRT-LLM yet".into())
    })?;
    let model = spec
        .model
        .id
        .as_deref()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            RenderError(match spec.model.source {
                ModelSource::Huggingface => {
                    "spec.model.id is required for a Hugging Face model".into()
                }
                ModelSource::Custom => {
                    "spec.model.id is required: the model's path inside the custom image".into()
                }
            })
        })?;
    let (command, args, warnings) = command_line(md, engine, flags, model, port);
    let mut container = json!({
        "name": CONTAINER_NAME,
        "image": image,
        "command": command,
        "args": args,
        "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": PORT_NAME},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "resources": gpu_resources(md),
    });
    storage::check(
        md,
        &storage::Reserved {
            by: "the engine container",
            pods: "the serving pods",
            names: &[SHM_VOLUME],
            paths: &[SHM_PATH],
        },
    )
    .map_err(RenderError)?;
    let (shm, shm_mount) = shm_volume();
    let mut mounts = vec![shm_mount];
    mounts.extend(storage::volume_mounts(md));
    container["volumeMounts"] = json!(mounts);
    let mut env = user_env(md)?;
    env.extend(storage::env_for(md, flags.cache_variables));
    if !env.is_empty() {
        container["env"] = json!(env);
    }
    if let Some(env_from) = hf_token_env_from(md) {
        container["envFrom"] = env_from;
    }
    let mut volumes = vec![shm];
    volumes.extend(storage::pod_volumes(md));
    Ok(EngineContainer {
        container,
        volumes,
        warnings,
    })
}

/// The command and arguments of `engine`'s server for `md`, and the spec fields it
/// cannot honour.
fn command_line(
    md: &ModelDeployment,
    engine: EngineType,
    flags: &Flags,
    model: &str,
    port: i32,
) -> (Vec<&'static str>, Vec<String>, Vec<Warning>) {
    let spec = &md.spec;
    let served = spec.served_model_name().unwrap_or(model).to_string();
    let user_args = spec.engine.args.as_ref();
    let gpus = gpu::per_replica(spec, Role::Aggregated).count;
    let mut warnings = Vec::new();
    let command = match engine {
        EngineType::Vllm => vec!["python3", "-m", "vllm.entrypoints.openai.api_server"],
        EngineType::Sglang => vec!["python3", "-m", "sglang.launch_server"],
        _ => vec!["llama-server"],
    };
    let mut args = strings(&[
        flags.model_flag(spec.model.source),
        model,
        flags.served_name,
        &served,
        "--host",
        "0.0.0.0",
        "--port",
        &port.to_string(),
    ]);
    // Tensor parallelism 1 is every engine's default.
    let tp = flags.parallelism.tensor_parallel(gpus, user_args);
    if let (Some(flag), Some(tp)) = (flags.tensor_parallel, tp.filter(|tp| *tp > 1)) {
        args.extend(strings(&[flag, &tp.to_string()]));
    }
    if engine == EngineType::Llamacpp
        && gpus > 0
        && !sets(user_args, &["n-gpu-layers", "ngl", "gpu-layers"])
    {
        args.extend(strings(&["--n-gpu-layers", "999"]));
    }
    if let Some(len) = spec.engine.context_length {
        args.extend(strings(&[flags.context_length, &len.to_string()]));
    }
    if spec.engine.trust_remote_code {
        match flags.trust_remote_code {
            Some(flag) => args.push(flag.to_string()),
            None => warnings.push(Warning::unsupported_field(
                "spec.engine.trustRemoteCode",
                "llama.cpp runs no model code",
            )),
        }
    }
    args.extend(engine_flags(user_args));
    (command, args, warnings)
}

/// The resources of one serving replica: `resources.gpu.count` of the GPU resource
/// ([`gpu::per_replica`]: `resources.gpu.type`, `nvidia.com/gpu` unless set; AMD and
/// Intel name their own) as limits (an extended resource cannot be overcommitted, so the
/// request equals it), and `resources.cpu` and `resources.memory` as requests and limits.
pub fn gpu_resources(md: &ModelDeployment) -> Value {
    let mut limits = BTreeMap::new();
    let mut requests = BTreeMap::new();
    let gpus = gpu::per_replica(&md.spec, Role::Aggregated);
    if gpus.count > 0 {
        limits.insert(gpus.resource, json!(gpus.count.to_string()));
    }
    if let Some(r) = md.spec.resources.as_ref() {
        for (name, value) in [("cpu", &r.cpu), ("memory", &r.memory)] {
            if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
                limits.insert(name.to_string(), json!(v));
                requests.insert(name.to_string(), json!(v));
            }
        }
    }
    let mut out = serde_json::Map::new();
    if !limits.is_empty() {
        out.insert("limits".into(), json!(limits));
    }
    if !requests.is_empty() {
        out.insert("requests".into(), json!(requests));
    }
    Value::Object(out)
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(spec: Value) -> ModelDeployment {
        let mut md = json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns"},
        });
        md["spec"] = spec;
        serde_json::from_value(md).unwrap()
    }

    #[test]
    fn vllm_with_gpus_context_and_remote_code() {
        let md = md(json!({
            "model": {"id": "Qwen/Qwen3-0.6B", "servedName": "qwen"},
            "engine": {"type": "vllm", "contextLength": 4096, "trustRemoteCode": true,
                       "args": {"enforce-eager": "true"}},
            "resources": {"gpu": {"count": 2}, "memory": "32Gi"},
            "secrets": {"huggingFaceToken": "hf"},
        }));
        let c = container(&md, "vllm/vllm-openai:v0.11.0", PORT).unwrap();
        assert_eq!(
            c.container["args"],
            json!([
                "--model",
                "Qwen/Qwen3-0.6B",
                "--served-model-name",
                "qwen",
                "--host",
                "0.0.0.0",
                "--port",
                "8000",
                "--tensor-parallel-size",
                "2",
                "--max-model-len",
                "4096",
                "--trust-remote-code",
                "--enforce-eager"
            ])
        );
        assert_eq!(
            c.container["resources"],
            json!({"limits": {"memory": "32Gi", "nvidia.com/gpu": "2"}, "requests": {"memory": "32Gi"}})
        );
        assert_eq!(
            c.container["envFrom"],
            json!([{"secretRef": {"name": "hf"}}])
        );
        assert_eq!(c.container["readinessProbe"]["httpGet"]["port"], PORT_NAME);
        assert_eq!(c.volumes[0]["emptyDir"]["medium"], "Memory");
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn tensor_parallelism_set_by_the_user_is_not_doubled() {
        let md = md(json!({
            "model": {"id": "a/b"},
            "engine": {"type": "sglang", "args": {"tp": "4"}},
            "resources": {"gpu": {"count": 8, "type": "amd.com/gpu"}},
        }));
        let c = container(&md, "img", 9000).unwrap();
        let args: Vec<&str> = c.container["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            args,
            [
                "--model-path",
                "a/b",
                "--served-model-name",
                "b",
                "--host",
                "0.0.0.0",
                "--port",
                "9000",
                "--tp",
                "4"
            ]
        );
        assert_eq!(c.container["resources"]["limits"]["amd.com/gpu"], "8");
    }

    #[test]
    fn llama_cpp_offloads_to_gpus_and_names_what_it_ignores() {
        let md = md(json!({
            "model": {"id": "ggml-org/gemma-3-1b-it-GGUF", "storage": {"volumes": [
                {"name": "weights", "claimName": "gguf", "purpose": "modelCache", "readOnly": true}]}},
            "engine": {"type": "llamacpp", "contextLength": 8192, "trustRemoteCode": true},
            "resources": {"gpu": {"count": 1}},
        }));
        let c = container(&md, "ghcr.io/ggml-org/llama.cpp:server", PORT).unwrap();
        assert_eq!(c.container["command"], json!(["llama-server"]));
        assert_eq!(
            c.container["args"],
            json!([
                "--hf-repo",
                "ggml-org/gemma-3-1b-it-GGUF",
                "--alias",
                "gemma-3-1b-it-GGUF",
                "--host",
                "0.0.0.0",
                "--port",
                "8000",
                "--n-gpu-layers",
                "999",
                "--ctx-size",
                "8192"
            ])
        );
        let ignored: Vec<_> = c
            .warnings
            .iter()
            .filter_map(|w| w.ignored_field.as_deref())
            .collect();
        assert_eq!(ignored, ["spec.engine.trustRemoteCode"]);
        assert_eq!(
            c.container["volumeMounts"][1],
            json!({"name": "weights", "mountPath": "/model-cache", "readOnly": true})
        );
        assert_eq!(
            c.container["env"],
            json!([{"name": "LLAMA_CACHE", "value": "/model-cache"}])
        );
        assert_eq!(
            c.volumes[1],
            json!({"name": "weights", "persistentVolumeClaim": {"claimName": "gguf", "readOnly": true}})
        );
    }

    #[test]
    fn missing_model_and_unbuilt_engines_are_errors() {
        let no_model = md(json!({"model": {}, "engine": {"type": "vllm"}}));
        assert!(
            container(&no_model, "i", PORT)
                .unwrap_err()
                .0
                .contains("spec.model.id")
        );
        let trt = md(json!({"model": {"id": "a/b"}, "engine": {"type": "trtllm"}}));
        assert!(
            container(&trt, "i", PORT)
                .unwrap_err()
                .0
                .contains("TensorRT-LLM")
        );
        let shm = md(json!({"model": {"id": "a/b", "storage": {"volumes": [
            {"name": "x", "claimName": "c", "mountPath": "/dev/shm"}]}}, "engine": {"type": "vllm"}}));
        assert!(
            container(&shm, "i", PORT)
                .unwrap_err()
                .0
                .contains("/dev/shm")
        );
        let cpu = md(json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}}));
        assert_eq!(gpu_resources(&cpu), json!({}));
    }

    fn args_of(c: &EngineContainer) -> Vec<&str> {
        c.container["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect()
    }

    /// vLLM's parser takes `_` for `-`: a user's `tensor_parallel_size` sets
    /// tensor parallelism as well (it used to be doubled with ours).
    #[test]
    fn tensor_parallelism_in_snake_case_is_the_users() {
        let md = md(json!({
            "model": {"id": "a/b"},
            "engine": {"type": "vllm", "args": {"tensor_parallel_size": "2"}},
            "resources": {"gpu": {"count": 4}},
        }));
        let c = container(&md, "img", PORT).unwrap();
        let args = args_of(&c);
        assert!(!args.contains(&"--tensor-parallel-size"), "{args:?}");
        assert_eq!(args[args.len() - 2..], ["--tensor_parallel_size", "2"]);
    }

    /// Pipeline and data parallelism share a replica's GPUs with tensor parallelism: 4
    /// GPUs with 2 pipeline stages are 2-way tensor parallel (it used to ask for 4 x 2).
    #[test]
    fn tensor_parallelism_leaves_room_for_pipeline_and_data_parallelism() {
        let md = md(json!({
            "model": {"id": "a/b"},
            "engine": {"type": "vllm", "args": {"pipeline-parallel-size": "2"}},
            "resources": {"gpu": {"count": 4}},
        }));
        let args = args_of(&container(&md, "img", PORT).unwrap()).join(" ");
        assert!(
            args.contains("--tensor-parallel-size 2 --pipeline-parallel-size 2"),
            "{args}"
        );
        assert_eq!(VLLM.parallelism.tensor_parallel(8, None), Some(8));
        assert_eq!(VLLM.parallelism.tensor_parallel(0, None), None);
        let dp = BTreeMap::from([("dp-size".to_string(), "2".to_string())]);
        assert_eq!(SGLANG.parallelism.tensor_parallel(8, Some(&dp)), Some(4));
        let uneven = BTreeMap::from([("pp".to_string(), "2".to_string())]);
        assert_eq!(VLLM.parallelism.tensor_parallel(3, Some(&uneven)), None);
    }

    /// `source: custom` names a path inside the image, which `llama-server` loads with
    /// `--model` (`--hf-repo` would look it up on Hugging Face).
    #[test]
    fn llama_cpp_loads_a_custom_model_from_its_path() {
        let md = md(json!({
            "model": {"id": "/models/gemma.gguf", "source": "custom"},
            "engine": {"type": "llamacpp"},
        }));
        let c = container(&md, "img", PORT).unwrap();
        assert_eq!(
            args_of(&c)[..4],
            ["--model", "/models/gemma.gguf", "--alias", "gemma.gguf"]
        );
        let vllm = md_with_engine("vllm", "custom");
        assert_eq!(
            args_of(&container(&vllm, "img", PORT).unwrap())[0],
            "--model"
        );
    }

    fn md_with_engine(engine: &str, source: &str) -> ModelDeployment {
        md(json!({"model": {"id": "/m", "source": source}, "engine": {"type": engine}}))
    }

    #[test]
    fn one_table_of_flags_per_engine() {
        assert_eq!(Flags::of(EngineType::Vllm), Some(&VLLM));
        assert_eq!(
            Flags::of(EngineType::Sglang).unwrap().tensor_parallel,
            Some("--tp")
        );
        assert_eq!(
            Flags::of(EngineType::Llamacpp).unwrap().trust_remote_code,
            None
        );
        assert_eq!(Flags::of(EngineType::Trtllm), None);
        assert_eq!(arg_key("--tensor_parallel_size"), "tensor-parallel-size");
        let args = BTreeMap::from([("--TP".to_string(), "2".to_string())]);
        assert!(
            !sets(Some(&args), VLLM.parallelism.tensor),
            "keys are case-sensitive"
        );
    }

    #[test]
    fn the_hugging_face_token_secret_is_named_once() {
        let with = md(json!({"model": {"id": "a/b"}, "secrets": {"huggingFaceToken": "hf"}}));
        assert_eq!(hf_token_secret(&with), Some("hf"));
        assert_eq!(
            hf_token_env_from(&with),
            Some(json!([{"secretRef": {"name": "hf"}}]))
        );
        let empty = md(json!({"model": {"id": "a/b"}, "secrets": {"huggingFaceToken": ""}}));
        assert_eq!(hf_token_secret(&empty), None);
        assert_eq!(hf_token_env_from(&md(json!({"model": {}}))), None);
    }
}
