//! The serving container of an inference engine, for providers that render pods
//! themselves (a plain Deployment, a pod template of their upstream): one home for how
//! vLLM, SGLang and llama.cpp are started from a ModelDeployment.
//!
//! [`container`] gives the container and the pod volumes it needs; [`gpu_resources`] the
//! resources of one replica. Everything here is pure: the same ModelDeployment gives the
//! same JSON.
//!
//! Each engine is started by its own OpenAI-compatible server, listening on all
//! addresses at [`PORT`] (or the port given), with the readiness probe on its `/health`:
//!
//! | engine | command | model | served name | tensor parallel | context |
//! |---|---|---|---|---|---|
//! | vLLM | `python3 -m vllm.entrypoints.openai.api_server` | `--model` | `--served-model-name` | `--tensor-parallel-size` | `--max-model-len` |
//! | SGLang | `python3 -m sglang.launch_server` | `--model-path` | `--served-model-name` | `--tp` | `--context-length` |
//! | llama.cpp | `llama-server` | `--hf-repo` | `--alias` | (splits layers over all GPUs itself) | `--ctx-size` |
//!
//! (The flags as each server documents them: vLLM's `vllm/engine/arg_utils.py` and
//! `vllm/entrypoints/openai/cli_args.py`, SGLang's `python/sglang/srt/server_args.py`,
//! llama.cpp's `tools/server/README.md`; the same flags the Dynamo provider renders for
//! vLLM and SGLang.) Tensor parallelism is the replica's GPU count unless
//! `engine.args` sets it; `engine.trustRemoteCode` adds `--trust-remote-code` (llama.cpp
//! runs no model code: named as ignored); llama.cpp offloads every layer to the GPUs
//! (`--n-gpu-layers 999`) when it has any. `engine.args` follow in key order
//! ([`crate::provider::engine_flags`]). The Hugging Face token Secret
//! (`secrets.huggingFaceToken`, key `HF_TOKEN`) is passed as `envFrom`, `spec.env` as
//! `env`, and `/dev/shm` is a memory-backed `emptyDir` (engines share tensors between
//! processes through it; the container runtime's default is 64 MiB). The storage volumes
//! of `model.storage` are mounted by the rules of [`crate::storage`], with the engine's
//! cache variables: vLLM `HF_HOME` and `VLLM_CACHE_ROOT`, SGLang `HF_HOME`, llama.cpp
//! `LLAMA_CACHE` (where `--hf-repo` downloads go) for the model cache.
//! TensorRT-LLM is not built here yet ([`container`] returns a [`RenderError`]).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::api::{EngineType, ModelDeployment, ModelSource, VolumePurpose};
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
    let served = spec.served_model_name().unwrap_or(model).to_string();
    let user_args = spec.engine.args.as_ref();
    let user_sets = |keys: &[&str]| {
        user_args.is_some_and(|a| a.keys().any(|k| keys.contains(&k.trim_start_matches('-'))))
    };
    let gpus = spec.gpu_count();
    let mut warnings = Vec::new();
    let port_text = port.to_string();
    let (command, mut args): (Vec<&str>, Vec<String>) = match engine {
        EngineType::Vllm => (
            vec!["python3", "-m", "vllm.entrypoints.openai.api_server"],
            strings(&["--model", model, "--served-model-name", &served]),
        ),
        EngineType::Sglang => (
            vec!["python3", "-m", "sglang.launch_server"],
            strings(&["--model-path", model, "--served-model-name", &served]),
        ),
        EngineType::Llamacpp => (
            vec!["llama-server"],
            strings(&["--hf-repo", model, "--alias", &served]),
        ),
        EngineType::Trtllm => {
            return Err(RenderError(
                "the SDK's engine container does not build TensorRT-LLM yet".into(),
            ));
        }
    };
    args.extend(strings(&["--host", "0.0.0.0", "--port", &port_text]));
    match engine {
        EngineType::Vllm | EngineType::Sglang => {
            let (flag, keys): (&str, &[&str]) = if engine == EngineType::Vllm {
                ("--tensor-parallel-size", &["tensor-parallel-size", "tp"])
            } else {
                ("--tp", &["tp", "tp-size", "tensor-parallel-size"])
            };
            if gpus > 1 && !user_sets(keys) {
                args.extend(strings(&[flag, &gpus.to_string()]));
            }
            if let Some(len) = spec.engine.context_length {
                let flag = if engine == EngineType::Vllm {
                    "--max-model-len"
                } else {
                    "--context-length"
                };
                args.extend(strings(&[flag, &len.to_string()]));
            }
            if spec.engine.trust_remote_code {
                args.push("--trust-remote-code".into());
            }
        }
        _ => {
            if gpus > 0 && !user_sets(&["n-gpu-layers", "ngl", "gpu-layers"]) {
                args.extend(strings(&["--n-gpu-layers", "999"]));
            }
            if let Some(len) = spec.engine.context_length {
                args.extend(strings(&["--ctx-size", &len.to_string()]));
            }
            if spec.engine.trust_remote_code {
                warnings.push(Warning::unsupported_field(
                    "spec.engine.trustRemoteCode",
                    "llama.cpp runs no model code",
                ));
            }
        }
    }
    args.extend(engine_flags(user_args));

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
            paths: &["/dev/shm"],
        },
    )
    .map_err(RenderError)?;
    let mut mounts = vec![json!({"name": SHM_VOLUME, "mountPath": "/dev/shm"})];
    mounts.extend(storage::volume_mounts(md));
    container["volumeMounts"] = json!(mounts);
    let mut env: Vec<Value> = match spec.env.as_ref() {
        Some(e) => e
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()
            .map_err(|e| RenderError(format!("spec.env: {e}")))?,
        None => Vec::new(),
    };
    env.extend(match engine {
        EngineType::Vllm => storage::env(md),
        EngineType::Sglang => storage::env_for(md, &[(VolumePurpose::ModelCache, "HF_HOME")]),
        _ => storage::env_for(md, &[(VolumePurpose::ModelCache, "LLAMA_CACHE")]),
    });
    if !env.is_empty() {
        container["env"] = json!(env);
    }
    if let Some(secret) = spec
        .secrets
        .as_ref()
        .and_then(|s| s.hugging_face_token.as_deref())
        .filter(|s| !s.is_empty())
    {
        container["envFrom"] = json!([{"secretRef": {"name": secret}}]);
    }
    let mut volumes = vec![json!({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}})];
    volumes.extend(storage::pod_volumes(md));
    Ok(EngineContainer {
        container,
        volumes,
        warnings,
    })
}

/// The resources of one serving replica: `resources.gpu.count` of the GPU resource
/// `resources.gpu.type` (`nvidia.com/gpu` by default; AMD and Intel name their own) as
/// limits (an extended resource cannot be overcommitted, so the request equals it), and
/// `resources.cpu` and `resources.memory` as requests and limits.
pub fn gpu_resources(md: &ModelDeployment) -> Value {
    let mut limits = BTreeMap::new();
    let mut requests = BTreeMap::new();
    if let Some(r) = md.spec.resources.as_ref() {
        if let Some(gpu) = r.gpu.as_ref().filter(|g| g.count > 0) {
            limits.insert(gpu.type_.clone(), json!(gpu.count.to_string()));
        }
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
}
