//! What the providers know about the inference engines, in one place: how each engine's
//! server spells the options a ModelDeployment sets ([`Flags`]), tensor parallelism from
//! a replica's GPUs ([`Parallelism::tensor_parallel`]), the Hugging Face token Secret
//! ([`hf_token_secret`], [`hf_token_env_from`]), the engines' cache variables
//! ([`Flags::cache_variables`]), `/dev/shm` ([`shm_volume`]), and, for providers that
//! render pods themselves (a plain Deployment, a pod template of their upstream), the
//! whole serving container of vLLM, SGLang, TensorRT-LLM and llama.cpp ([`container`])
//! with its GPU resources ([`gpu_resources`], the GPUs of a role from [`crate::gpu`]).
//! Everything here is pure: the same ModelDeployment gives the same JSON.
//!
//! | engine | server | model (Hugging Face / path) | served name | tensor parallel | context | trust remote code |
//! |---|---|---|---|---|---|---|
//! | vLLM | `python3 -m vllm.entrypoints.openai.api_server` | `--model` | `--served-model-name` | `--tensor-parallel-size` | `--max-model-len` | `--trust-remote-code` |
//! | SGLang | `python3 -m sglang.launch_server` | `--model-path` | `--served-model-name` | `--tp` | `--context-length` | `--trust-remote-code` |
//! | TensorRT-LLM | `trtllm-serve` | its argument / its argument | (none: served as [`served_as`]) | `--tp_size` | `--max_seq_len` | `--trust_remote_code` |
//! | llama.cpp | `llama-server` | `--hf-repo` / `--model` | `--alias` | (splits layers over all GPUs itself) | `--ctx-size` | (runs no model code) |
//!
//! | engine | prefix caching on / off | eager (no CUDA graphs) |
//! |---|---|---|
//! | vLLM | `--enable-prefix-caching` / `--no-enable-prefix-caching` | `--enforce-eager` |
//! | SGLang | (its default: the radix cache) / `--disable-radix-cache` | `--disable-cuda-graph` |
//! | TensorRT-LLM | (no option) | (no option) |
//! | llama.cpp | `--cache-prompt` / `--no-cache-prompt` | (no option) |
//!
//! `engine.enforceEager` asks for something only when true: false, like unset, leaves the
//! engine as it runs by default. What a server has no option for is named as ignored
//! ([`Toggle::flag`], [`toggle_flags`]). `engine.extraArgs` go last, as given
//! ([`extra_args`]), and count as the user's setting of their flags ([`user_flags`]);
//! a flag set both there and in `engine.args` is refused ([`args_conflict`]).
//!
//! `trtllm-serve` serves the model under its argument (a Hugging Face id whole, a
//! checkpoint directory by its last component) and has no served-name option, so a
//! `model.servedName` other than that is named as ignored. Dynamo's TensorRT-LLM worker
//! does not use this row: it has a parser of its own (the Dynamo provider's `args`
//! module). Where each server defines these flags: docs/upstream.md#engine-flags.
//!
//! Who uses what:
//! - [`Flags`] and [`Parallelism`]: [`container`]; the Dynamo provider for its vLLM and
//!   SGLang workers, which parse the engines' own flags; the KubeRay provider, whose Ray
//!   Serve LLM takes vLLM's engine arguments as keyword arguments (the same names in snake
//!   case); the KAITO provider, whose vLLM wrapper passes each key of its inference config
//!   as `--key value`.
//! - [`hf_token_secret`] / [`hf_token_env_from`]: [`container`], KubeRay (every Ray pod),
//!   Dynamo (`envFromSecret` in v1alpha1, `envFrom` in v1beta1), KAITO (the llama.cpp
//!   template's `envFrom`, the vLLM preset's `modelAccessSecret`).
//! - [`Flags::cache_variables`] with [`crate::storage::env_for`]: [`container`] and
//!   KubeRay (vLLM's). Dynamo sets `HF_HOME` itself and leaves `VLLM_CACHE_ROOT` to its
//!   operator's compilation cache.
//! - [`shm_volume`]: [`container`] only. KubeRay and Dynamo's operator mount their own
//!   `/dev/shm` in every pod, KAITO builds its preset pods itself, and its llama.cpp
//!   template runs one process that shares no tensors (docs/upstream.md#shared-memory).
//! - [`container`] and [`gpu_resources`]: the operator-free Deployment provider. The
//!   operators build their own containers, so the others take the pieces above.
//!
//! The container: each engine is started by its own OpenAI-compatible server, listening
//! on all addresses at [`PORT`] (or the port given), with the readiness probe on its
//! `/health`. Tensor parallelism is the replica's GPU count, divided by the pipeline and
//! data parallelism (TensorRT-LLM: pipeline and context parallelism) `engine.args` set,
//! unless `engine.args` sets it (with `_` or `-`: vLLM's parser takes both);
//! `engine.trustRemoteCode` adds the engine's flag
//! (llama.cpp runs no model code: named as ignored); llama.cpp offloads every layer to
//! the GPUs (`--n-gpu-layers 999`) when it has any, and loads a `source: custom` model
//! from its path with `--model`; the prefix caching and eager flags follow. `engine.args`
//! follow in key order ([`crate::provider::engine_flags`]), then `engine.extraArgs` as
//! given. The Hugging Face token Secret
//! (`secrets.huggingFaceToken`, key `HF_TOKEN`) is passed as `envFrom`, `spec.env` as
//! `env`, and `/dev/shm` is a memory-backed `emptyDir` (engines share tensors between
//! processes through it; the container runtime's default is 64 MiB). The storage volumes
//! of `model.storage` are mounted by the rules of [`crate::storage`] (defaults
//! `/model-cache` and `/compilation-cache`), with the engine's cache variables: vLLM
//! `HF_HOME` and `VLLM_CACHE_ROOT`, SGLang and TensorRT-LLM `HF_HOME`, llama.cpp
//! `LLAMA_CACHE` (where `--hf-repo` downloads go) for the model cache. The image is the
//! caller's (the spec names one with
//! [`crate::api::ModelDeploymentSpec::effective_image`]): the SDK knows no default for
//! any engine.

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
    /// Context parallelism (TensorRT-LLM's: it splits long sequences over GPUs).
    pub context: &'static [&'static str],
}

impl Parallelism {
    /// Tensor parallelism for `gpus` GPUs per replica: all of them, divided by the
    /// pipeline, data and context parallelism `args` set; `None` when `args` set it, when
    /// there are no GPUs, or when the GPUs do not divide evenly (the engine's own default
    /// then applies, and its own error says why).
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
            .checked_mul(int(args, self.data).unwrap_or(1))?
            .checked_mul(int(args, self.context).unwrap_or(1))?;
        (per >= 1 && gpus % per == 0).then(|| gpus / per)
    }
}

/// How an engine's server turns a boolean option on and off.
#[derive(Debug, PartialEq, Eq)]
pub struct Toggle {
    /// The flag that turns it on; `None`: the server has none.
    pub on: Option<&'static str>,
    /// The flag that turns it off; `None`: the server has none.
    pub off: Option<&'static str>,
    /// The engine's own setting when neither flag is passed, where its source says so.
    pub default: Option<bool>,
    /// Why a value the server has no flag for (and that is not its default) cannot be
    /// passed.
    pub missing: &'static str,
}

impl Toggle {
    /// The flag that asks for `value`: `Ok(None)` when none is needed (the engine's
    /// default), `Err` with the reason when the server cannot be told.
    pub fn flag(&self, value: bool) -> Result<Option<&'static str>, &'static str> {
        match (if value { self.on } else { self.off }, self.default) {
            (Some(flag), _) => Ok(Some(flag)),
            (None, Some(default)) if default == value => Ok(None),
            (None, _) => Err(self.missing),
        }
    }

    /// Its flags as [`arg_key`] spells them.
    pub fn keys(&self) -> Vec<String> {
        [self.on, self.off]
            .into_iter()
            .flatten()
            .map(arg_key)
            .collect()
    }
}

/// How an engine's server spells the options a ModelDeployment sets.
#[derive(Debug, PartialEq, Eq)]
pub struct Flags {
    /// The model as a Hugging Face id; `None`: the server's positional argument.
    pub model: Option<&'static str>,
    /// The model as a path (`model.source: custom`); `None`: the server's positional
    /// argument.
    pub model_path: Option<&'static str>,
    /// The name the API serves the model as; `None`: the server has no such option and
    /// serves the model under a name of its own ([`served_as`]).
    pub served_name: Option<&'static str>,
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
    /// Prefix caching (`engine.enablePrefixCaching`).
    pub prefix_caching: Toggle,
    /// Eager execution without CUDA graphs (`engine.enforceEager`; only `true` is asked
    /// for).
    pub eager: Toggle,
}

/// vLLM (`vllm/engine/arg_utils.py`, `vllm/entrypoints/openai/cli_args.py`).
pub const VLLM: Flags = Flags {
    model: Some("--model"),
    model_path: Some("--model"),
    served_name: Some("--served-model-name"),
    tensor_parallel: Some("--tensor-parallel-size"),
    parallelism: Parallelism {
        tensor: &["tensor-parallel-size", "tp"],
        pipeline: &["pipeline-parallel-size", "pp"],
        data: &["data-parallel-size", "dp"],
        context: &[],
    },
    context_length: "--max-model-len",
    trust_remote_code: Some("--trust-remote-code"),
    cache_variables: &[
        (VolumePurpose::ModelCache, "HF_HOME"),
        (VolumePurpose::CompilationCache, "VLLM_CACHE_ROOT"),
    ],
    // A boolean option of vLLM's configs is an `argparse.BooleanOptionalAction`, so each
    // has a `--no-` spelling; prefix caching is on and eager off by default
    // (docs/upstream.md#engine-flags).
    prefix_caching: Toggle {
        on: Some("--enable-prefix-caching"),
        off: Some("--no-enable-prefix-caching"),
        default: Some(true),
        missing: "",
    },
    eager: Toggle {
        on: Some("--enforce-eager"),
        off: Some("--no-enforce-eager"),
        default: Some(false),
        missing: "",
    },
};

/// SGLang (`python/sglang/srt/server_args.py`).
pub const SGLANG: Flags = Flags {
    model: Some("--model-path"),
    model_path: Some("--model-path"),
    served_name: Some("--served-model-name"),
    tensor_parallel: Some("--tp"),
    parallelism: Parallelism {
        tensor: &["tensor-parallel-size", "tp-size", "tp"],
        pipeline: &["pipeline-parallel-size", "pp-size", "pp"],
        data: &["data-parallel-size", "dp-size", "dp"],
        context: &[],
    },
    context_length: "--context-length",
    trust_remote_code: Some("--trust-remote-code"),
    cache_variables: &[(VolumePurpose::ModelCache, "HF_HOME")],
    // Its prefix cache is the radix cache, on unless `--disable-radix-cache`; CUDA graphs
    // are on unless `--disable-cuda-graph`; both flags are `store_true`
    // (docs/upstream.md#engine-flags).
    prefix_caching: Toggle {
        on: None,
        off: Some("--disable-radix-cache"),
        default: Some(true),
        missing: "",
    },
    eager: Toggle {
        on: Some("--disable-cuda-graph"),
        off: None,
        default: Some(false),
        missing: "",
    },
};

/// llama.cpp's `llama-server` (`tools/server/README.md`): it splits a model's layers over
/// every GPU it sees, so it has no parallelism to set.
pub const LLAMACPP: Flags = Flags {
    model: Some("--hf-repo"),
    model_path: Some("--model"),
    served_name: Some("--alias"),
    tensor_parallel: None,
    parallelism: Parallelism {
        tensor: &[],
        pipeline: &[],
        data: &[],
        context: &[],
    },
    context_length: "--ctx-size",
    trust_remote_code: None,
    cache_variables: &[(VolumePurpose::ModelCache, "LLAMA_CACHE")],
    // Its prompt cache reuses the KV cache of a prompt's common prefix (on by default).
    prefix_caching: Toggle {
        on: Some("--cache-prompt"),
        off: Some("--no-cache-prompt"),
        default: Some(true),
        missing: "",
    },
    eager: Toggle {
        on: None,
        off: None,
        default: None,
        missing: "llama-server has no option for it",
    },
};

/// TensorRT-LLM's `trtllm-serve` (`tensorrt_llm/commands/serve.py@00209af1`,
/// NVIDIA/TensorRT-LLM): the model (a Hugging Face id or a checkpoint directory) is its
/// positional argument, it has no served-name option, and its options are spelled in
/// snake case (click takes them only as written: `--tp_size`, not `--tp-size`). Its
/// world size is tensor x pipeline x context parallelism (`--tp_size`, `--pp_size`,
/// `--cp_size`, each with a long `--*_parallel_size` spelling).
pub const TRTLLM: Flags = Flags {
    model: None,
    model_path: None,
    served_name: None,
    tensor_parallel: Some("--tp_size"),
    parallelism: Parallelism {
        tensor: &["tensor-parallel-size", "tp-size"],
        pipeline: &["pipeline-parallel-size", "pp-size"],
        data: &[],
        context: &["context-parallel-size", "cp-size"],
    },
    context_length: "--max_seq_len",
    trust_remote_code: Some("--trust_remote_code"),
    cache_variables: &[(VolumePurpose::ModelCache, "HF_HOME")],
    prefix_caching: Toggle {
        on: None,
        off: None,
        default: None,
        missing: "trtllm-serve has no option for it (KV cache block reuse is an engine \
                  argument, which only an --extra_llm_api_options file sets)",
    },
    eager: Toggle {
        on: None,
        off: None,
        default: None,
        missing: "trtllm-serve has no option for it (CUDA graphs are an engine argument, \
                  which only an --extra_llm_api_options file sets)",
    },
};

impl Flags {
    /// The flags of `engine`'s own server.
    pub fn of(engine: EngineType) -> &'static Flags {
        match engine {
            EngineType::Vllm => &VLLM,
            EngineType::Sglang => &SGLANG,
            EngineType::Llamacpp => &LLAMACPP,
            EngineType::Trtllm => &TRTLLM,
        }
    }

    /// The flag that names the model from `source`; `None`: the model is the server's
    /// positional argument.
    pub fn model_flag(&self, source: ModelSource) -> Option<&'static str> {
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

/// The long flags of `engine.extraArgs`, read as the engines' parsers read them: each
/// `--key=value`, `--key value` (the next token, when it is no long flag), or a bare
/// `--key` (`"true"`, as `engine.args` writes a bare flag). Keys are without their dashes
/// (compare them with [`arg_key`]); other tokens are values or positional arguments.
pub fn extra_arg_flags(extra: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut tokens = extra.iter().peekable();
    while let Some(token) = tokens.next() {
        let Some(key) = long_flag(token) else {
            continue;
        };
        let value = match token.split_once('=') {
            Some((_, value)) => value.to_string(),
            None => match tokens.peek() {
                Some(next) if long_flag(next).is_none() => {
                    tokens.next().cloned().unwrap_or_default()
                }
                _ => "true".to_string(),
            },
        };
        out.insert(key, value);
    }
    out
}

/// The key of a long flag token (`--key` or `--key=value`, without the dashes), `None`
/// for anything else (a value, a short flag, `--`, `---x`).
fn long_flag(token: &str) -> Option<String> {
    let body = token.strip_prefix("--")?;
    if body.starts_with('-') {
        return None;
    }
    let key = body.split_once('=').map_or(body, |(k, _)| k).trim();
    (!key.is_empty()).then(|| key.to_string())
}

/// Every flag the user sets: `engine.args`, and the long flags of `engine.extraArgs`
/// ([`extra_arg_flags`]). What the providers check before adding a flag of their own
/// (the user's setting wins) and count parallelism from.
pub fn user_flags(spec: &crate::api::ModelDeploymentSpec) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = spec.engine.args.clone().unwrap_or_default();
    out.extend(extra_arg_flags(
        spec.engine.extra_args.as_deref().unwrap_or_default(),
    ));
    out
}

/// The refusal of a flag set both in `engine.args` and in `engine.extraArgs` (compared as
/// [`arg_key`] spells them: the engine would get it twice, and one value would silently
/// win), as AI Runway refuses it (`ValidateEngineArgs` in
/// `controller/api/v1alpha1/modeldeployment_validation.go`, at b0d3fb7). Core's
/// validating webhook refuses such a spec; a provider that renders `extraArgs` refuses
/// to render it ([`extra_args`]).
pub fn args_conflict(spec: &crate::api::ModelDeploymentSpec) -> Option<String> {
    let args = spec.engine.args.as_ref()?;
    spec.engine.extra_args.iter().flatten().find_map(|token| {
        let key = arg_key(&long_flag(token)?);
        let (given, _) = args.iter().find(|(k, _)| arg_key(k) == key)?;
        Some(format!(
            "the flag --{key} is set both in spec.engine.args (\"{given}\") and in \
             spec.engine.extraArgs (\"{token}\"): set it in one of them only, so that the \
             engine does not get two values"
        ))
    })
}

/// `engine.extraArgs`, to pass as given after the rendered flags and `engine.args`; an
/// error for a flag set in both ([`args_conflict`]).
pub fn extra_args(md: &ModelDeployment) -> Result<Vec<String>, RenderError> {
    if let Some(conflict) = args_conflict(&md.spec) {
        return Err(RenderError(conflict));
    }
    Ok(md.spec.engine.extra_args.clone().unwrap_or_default())
}

/// The flags for `engine.enablePrefixCaching` and `engine.enforceEager` (only `true`
/// asks for something) as `flags` spells them, and a warning naming each field the server
/// cannot be told. A toggle whose flag `user` ([`user_flags`]) sets is the user's: nothing
/// is added for it.
pub fn toggle_flags(
    flags: &Flags,
    prefix_caching: Option<bool>,
    enforce_eager: Option<bool>,
    user: &BTreeMap<String, String>,
) -> (Vec<String>, Vec<Warning>) {
    let mut args = Vec::new();
    let mut warnings = Vec::new();
    let set_by_user = |toggle: &Toggle| {
        let keys = toggle.keys();
        user.keys().any(|k| keys.contains(&arg_key(k)))
    };
    for (field, toggle, value) in [
        (
            "spec.engine.enablePrefixCaching",
            &flags.prefix_caching,
            prefix_caching,
        ),
        (
            "spec.engine.enforceEager",
            &flags.eager,
            enforce_eager.filter(|eager| *eager),
        ),
    ] {
        let Some(value) = value else {
            continue;
        };
        if set_by_user(toggle) {
            continue;
        }
        match toggle.flag(value) {
            Ok(flag) => args.extend(flag.map(str::to_string)),
            Err(why) => warnings.push(Warning::unsupported_field(field, why)),
        }
    }
    (args, warnings)
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
/// Errors: no engine, no `model.id` (for `source: custom`, `model.id` is the model's
/// path inside the image), or a storage volume that cannot be mounted
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
    let flags = Flags::of(engine);
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
    let extra = extra_args(md)?;
    let (command, mut args, warnings) = command_line(md, engine, flags, model, port);
    args.extend(extra);
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

/// The name a server without a served-name option ([`Flags::served_name`] `None`:
/// `trtllm-serve`) serves `model` under: a checkpoint directory's last component (a
/// `source: custom` path), else the model argument as given, a Hugging Face id whole
/// (`OpenAIServer.__init__` in `tensorrt_llm/serve/openai_server.py@00057725`,
/// NVIDIA/TensorRT-LLM).
pub fn served_as(model: &str, source: ModelSource) -> &str {
    match source {
        ModelSource::Huggingface => model,
        ModelSource::Custom => {
            let path = model.trim_end_matches('/');
            path.rsplit('/')
                .next()
                .filter(|name| !name.is_empty())
                .unwrap_or(model)
        }
    }
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
    let user = user_flags(spec);
    let gpus = gpu::per_replica(spec, Role::Aggregated).count;
    let mut warnings = Vec::new();
    let command = match engine {
        EngineType::Vllm => vec!["python3", "-m", "vllm.entrypoints.openai.api_server"],
        EngineType::Sglang => vec!["python3", "-m", "sglang.launch_server"],
        EngineType::Trtllm => vec!["trtllm-serve"],
        EngineType::Llamacpp => vec!["llama-server"],
    };
    let mut args = match flags.model_flag(spec.model.source) {
        Some(flag) => strings(&[flag, model]),
        None => strings(&[model]),
    };
    match flags.served_name {
        Some(flag) => {
            let served = spec.served_model_name().unwrap_or(model);
            args.extend(strings(&[flag, served]));
        }
        None => warnings.extend(served_name_ignored(md, model)),
    }
    args.extend(strings(&["--host", "0.0.0.0", "--port", &port.to_string()]));
    // Tensor parallelism 1 is every engine's default.
    let tp = flags.parallelism.tensor_parallel(gpus, Some(&user));
    if let (Some(flag), Some(tp)) = (flags.tensor_parallel, tp.filter(|tp| *tp > 1)) {
        args.extend(strings(&[flag, &tp.to_string()]));
    }
    if engine == EngineType::Llamacpp
        && gpus > 0
        && !sets(Some(&user), &["n-gpu-layers", "ngl", "gpu-layers"])
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
    let (toggles, more) = toggle_flags(
        flags,
        spec.engine.enable_prefix_caching,
        spec.engine.enforce_eager,
        &user,
    );
    args.extend(toggles);
    warnings.extend(more);
    args.extend(engine_flags(spec.engine.args.as_ref()));
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

/// `spec.model.servedName` named as ignored when it is set and the server, which has no
/// served-name option, serves `model` under another name ([`served_as`]).
fn served_name_ignored(md: &ModelDeployment, model: &str) -> Option<Warning> {
    let served = served_as(model, md.spec.model.source);
    md.spec
        .model
        .served_name
        .as_deref()
        .filter(|name| !name.is_empty() && *name != served)
        .map(|_| {
            Warning::unsupported_field(
                "spec.model.servedName",
                format!(
                    "trtllm-serve has no served-name option; it serves the model as \"{served}\""
                ),
            )
        })
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
        assert_eq!(
            Warning::ignored_fields(&c.warnings),
            ["spec.engine.trustRemoteCode"]
        );
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
    fn missing_model_and_unmountable_volumes_are_errors() {
        let no_model = md(json!({"model": {}, "engine": {"type": "vllm"}}));
        assert!(
            container(&no_model, "i", PORT)
                .unwrap_err()
                .0
                .contains("spec.model.id")
        );
        let no_engine = md(json!({"model": {"id": "a/b"}}));
        assert!(
            container(&no_engine, "i", PORT)
                .unwrap_err()
                .0
                .contains("spec.engine.type")
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
        assert_eq!(Flags::of(EngineType::Vllm), &VLLM);
        assert_eq!(Flags::of(EngineType::Sglang).tensor_parallel, Some("--tp"));
        assert_eq!(Flags::of(EngineType::Llamacpp).trust_remote_code, None);
        assert_eq!(Flags::of(EngineType::Trtllm), &TRTLLM);
        assert_eq!(TRTLLM.model_flag(ModelSource::Custom), None);
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

    /// `trtllm-serve MODEL --host --port --tp_size --max_seq_len --trust_remote_code`
    /// (`tensorrt_llm/commands/serve.py@00209af1`, NVIDIA/TensorRT-LLM): the model is
    /// the positional argument, the options are snake case, and `/health` is its
    /// readiness (`register_routes` in `tensorrt_llm/serve/openai_server.py@00057725`).
    #[test]
    fn trtllm_serve_takes_the_model_as_its_argument_and_snake_case_options() {
        let md = md(json!({
            "model": {"id": "Qwen/Qwen3-0.6B", "storage": {"volumes": [
                {"name": "hf", "claimName": "hf", "purpose": "modelCache"}]}},
            "engine": {"type": "trtllm", "contextLength": 4096, "trustRemoteCode": true,
                       "args": {"kv_cache_free_gpu_memory_fraction": "0.8"}},
            "resources": {"gpu": {"count": 2}},
            "secrets": {"huggingFaceToken": "hf"},
        }));
        let c = container(&md, "nvcr.io/nvidia/tensorrt-llm/release:1.0.0", PORT).unwrap();
        assert_eq!(c.container["command"], json!(["trtllm-serve"]));
        assert_eq!(
            c.container["args"],
            json!([
                "Qwen/Qwen3-0.6B",
                "--host",
                "0.0.0.0",
                "--port",
                "8000",
                "--tp_size",
                "2",
                "--max_seq_len",
                "4096",
                "--trust_remote_code",
                "--kv_cache_free_gpu_memory_fraction",
                "0.8"
            ])
        );
        assert_eq!(
            c.container["readinessProbe"]["httpGet"],
            json!({"path": "/health", "port": PORT_NAME})
        );
        assert_eq!(
            c.container["env"],
            json!([{"name": "HF_HOME", "value": "/model-cache"}])
        );
        assert_eq!(
            c.container["envFrom"],
            json!([{"secretRef": {"name": "hf"}}])
        );
        assert_eq!(c.container["resources"]["limits"]["nvidia.com/gpu"], "2");
        assert_eq!(c.volumes[0]["emptyDir"]["medium"], "Memory");
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    /// TensorRT-LLM's world size is tensor x pipeline x context parallelism; its
    /// `engine.args` set tensor parallelism in either spelling.
    #[test]
    fn trtllm_tensor_parallelism_is_the_gpus_left_by_the_users() {
        let gpus = |args: &[(&str, &str)]| {
            let args: BTreeMap<String, String> = args
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect();
            TRTLLM.parallelism.tensor_parallel(8, Some(&args))
        };
        assert_eq!(gpus(&[]), Some(8));
        assert_eq!(gpus(&[("pp_size", "2")]), Some(4));
        assert_eq!(gpus(&[("cp_size", "2"), ("pp_size", "2")]), Some(2));
        assert_eq!(gpus(&[("tp_size", "4")]), None);
        assert_eq!(gpus(&[("tensor_parallel_size", "4")]), None);
        let md = md(json!({
            "model": {"id": "a/b"},
            "engine": {"type": "trtllm", "args": {"tp_size": "4"}},
            "resources": {"gpu": {"count": 8}},
        }));
        let args = args_of(&container(&md, "img", PORT).unwrap()).join(" ");
        assert_eq!(args, "a/b --host 0.0.0.0 --port 8000 --tp_size 4");
    }

    /// `trtllm-serve` has no served-name option: a `servedName` other than the name it
    /// serves is named as ignored, never dropped silently; one equal to it is honoured.
    #[test]
    fn trtllm_names_a_served_name_it_cannot_serve() {
        let ignored = |md: &ModelDeployment| -> Vec<String> {
            let c = container(md, "img", PORT).unwrap();
            Warning::ignored_fields(&c.warnings)
                .into_iter()
                .map(String::from)
                .collect()
        };
        let renamed = md(json!({
            "model": {"id": "Qwen/Qwen3-0.6B", "servedName": "qwen"},
            "engine": {"type": "trtllm"}, "resources": {"gpu": {"count": 1}},
        }));
        assert_eq!(ignored(&renamed), ["spec.model.servedName"]);
        let c = container(&renamed, "img", PORT).unwrap();
        assert!(
            c.warnings[0].message.contains("\"Qwen/Qwen3-0.6B\""),
            "{:?}",
            c.warnings
        );
        assert!(!args_of(&c).contains(&"qwen"));
        let same = md(json!({
            "model": {"id": "Qwen/Qwen3-0.6B", "servedName": "Qwen/Qwen3-0.6B"},
            "engine": {"type": "trtllm"}, "resources": {"gpu": {"count": 1}},
        }));
        assert!(ignored(&same).is_empty());
        // A checkpoint directory is served under its last component.
        let custom = md(json!({
            "model": {"id": "/models/llama/", "source": "custom", "servedName": "llama"},
            "engine": {"type": "trtllm"}, "resources": {"gpu": {"count": 1}},
        }));
        assert!(ignored(&custom).is_empty());
        assert_eq!(
            args_of(&container(&custom, "img", PORT).unwrap())[0],
            "/models/llama/"
        );
        assert_eq!(served_as("/models/llama", ModelSource::Custom), "llama");
        assert_eq!(served_as("a/b", ModelSource::Huggingface), "a/b");
    }

    /// `engine.enablePrefixCaching` and `engine.enforceEager` as each server's parser
    /// defines them (docs/upstream.md#engine-flags): vLLM's are
    /// `argparse.BooleanOptionalAction`s with a `--no-` spelling
    /// (`vllm/engine/arg_utils.py:207-208,550-551,773-774@v0.11.0`,
    /// `:309-310,720,996-1001@v0.19.1`); SGLang's radix cache and CUDA graphs are on unless
    /// `--disable-radix-cache` / `--disable-cuda-graph`
    /// (`python/sglang/srt/server_args.py:609,612,5335-5356@0.5.10.post1`); llama-server
    /// has `--cache-prompt, --no-cache-prompt` and no eager option
    /// (`tools/server/README.md@00dc8057`, ggml-org/llama.cpp); `trtllm-serve` has neither
    /// (`tensorrt_llm/commands/serve.py@00209af1`, NVIDIA/TensorRT-LLM).
    #[test]
    fn prefix_caching_and_eager_are_spelled_as_each_engine_parses_them() {
        let render = |engine: &str, prefix: Option<bool>, eager: Option<bool>| {
            let md = md(json!({
                "model": {"id": "a/b"},
                "engine": {"type": engine, "enablePrefixCaching": prefix, "enforceEager": eager},
                "resources": {"gpu": {"count": 1}},
            }));
            let c = container(&md, "img", PORT).unwrap();
            let all = args_of(&c);
            let start = all.iter().position(|a| *a == "8000").unwrap() + 1;
            let args: Vec<String> = all[start..]
                .iter()
                .filter(|a| !["--n-gpu-layers", "999"].contains(a))
                .map(|a| (*a).to_string())
                .collect();
            let ignored: Vec<String> = Warning::ignored_fields(&c.warnings)
                .iter()
                .map(|f| (*f).to_string())
                .collect();
            (args, ignored)
        };
        let none: Vec<String> = Vec::new();
        let strs = |a: &[&str]| a.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        // vLLM: both values of prefix caching, eager when true.
        assert_eq!(
            render("vllm", Some(true), Some(true)),
            (
                strs(&["--enable-prefix-caching", "--enforce-eager"]),
                none.clone()
            )
        );
        assert_eq!(
            render("vllm", Some(false), Some(false)),
            (strs(&["--no-enable-prefix-caching"]), none.clone())
        );
        // SGLang: on is its default; eager turns CUDA graphs off.
        assert_eq!(
            render("sglang", Some(true), Some(true)),
            (strs(&["--disable-cuda-graph"]), none.clone())
        );
        assert_eq!(
            render("sglang", Some(false), None),
            (strs(&["--disable-radix-cache"]), none.clone())
        );
        // llama.cpp: its prompt cache; no eager option.
        assert_eq!(
            render("llamacpp", Some(false), Some(true)),
            (
                strs(&["--no-cache-prompt"]),
                strs(&["spec.engine.enforceEager"])
            )
        );
        assert_eq!(
            render("llamacpp", Some(true), Some(false)),
            (strs(&["--cache-prompt"]), none.clone())
        );
        // TensorRT-LLM: neither; false eager asks for nothing.
        assert_eq!(
            render("trtllm", Some(true), Some(true)),
            (
                none.clone(),
                strs(&[
                    "spec.engine.enablePrefixCaching",
                    "spec.engine.enforceEager"
                ])
            )
        );
        assert_eq!(
            render("trtllm", None, Some(false)),
            (none.clone(), none.clone())
        );
        // Unset: nothing, for every engine.
        for engine in ["vllm", "sglang", "trtllm", "llamacpp"] {
            assert_eq!(
                render(engine, None, None),
                (none.clone(), none.clone()),
                "{engine}"
            );
        }
    }

    /// A toggle the user sets in `engine.args` or `engine.extraArgs` (either spelling) is
    /// theirs: no flag of ours is added for it.
    #[test]
    fn the_user_s_own_prefix_caching_flag_wins() {
        let md = md(json!({
            "model": {"id": "a/b"},
            "engine": {"type": "vllm", "enablePrefixCaching": true, "enforceEager": true,
                       "extraArgs": ["--no-enable-prefix-caching"], "args": {"enforce_eager": "true"}},
            "resources": {"gpu": {"count": 1}},
        }));
        let c = container(&md, "img", PORT).unwrap();
        let args = args_of(&c);
        assert_eq!(
            args[args.len() - 2..],
            ["--enforce_eager", "--no-enable-prefix-caching"]
        );
        assert!(!args.contains(&"--enable-prefix-caching"), "{args:?}");
        assert_eq!(
            args.iter().filter(|a| a.contains("eager")).count(),
            1,
            "{args:?}"
        );
    }

    /// `engine.extraArgs` go last, as given; their flags count as the user's (here
    /// pipeline parallelism, which tensor parallelism leaves room for).
    #[test]
    fn extra_args_go_last_as_given_and_count_as_the_user_s_flags() {
        let md = md(json!({
            "model": {"id": "a/b"},
            "engine": {"type": "vllm", "args": {"max-num-seqs": "8"},
                       "extraArgs": ["--pipeline-parallel-size=2", "--allowed-origins", "[\"a\", \"b\"]", "--enable-auto-tool-choice"]},
            "resources": {"gpu": {"count": 4}},
        }));
        let c = container(&md, "img", PORT).unwrap();
        let args = args_of(&c).join(" ");
        assert!(
            args.ends_with(
                "--tensor-parallel-size 2 --max-num-seqs 8 --pipeline-parallel-size=2 \
                 --allowed-origins [\"a\", \"b\"] --enable-auto-tool-choice"
            ),
            "{args}"
        );
        let flags = extra_arg_flags(md.spec.engine.extra_args.as_deref().unwrap());
        assert_eq!(flags["pipeline-parallel-size"], "2");
        assert_eq!(flags["allowed-origins"], "[\"a\", \"b\"]");
        assert_eq!(flags["enable-auto-tool-choice"], "true");
        assert_eq!(
            extra_arg_flags(&[
                "-x".to_string(),
                "--".to_string(),
                "---y".to_string(),
                "value".to_string()
            ]),
            BTreeMap::new()
        );
    }

    /// A flag in both `engine.args` and `engine.extraArgs` is refused, whatever its
    /// spelling in each, with a message naming both; distinct flags pass.
    #[test]
    fn a_flag_in_both_args_and_extra_args_is_refused() {
        let md = md(json!({
            "model": {"id": "a/b"},
            "engine": {"type": "vllm", "args": {"max_model_len": "4096", "dtype": "half"},
                       "extraArgs": ["--served-model-name", "x", "--max-model-len=8192"]},
            "resources": {"gpu": {"count": 1}},
        }));
        let conflict = args_conflict(&md.spec).unwrap();
        assert_eq!(
            conflict,
            "the flag --max-model-len is set both in spec.engine.args (\"max_model_len\") and \
             in spec.engine.extraArgs (\"--max-model-len=8192\"): set it in one of them only, \
             so that the engine does not get two values"
        );
        assert_eq!(container(&md, "img", PORT).unwrap_err().0, conflict);
        let fine = md_with(
            &json!({"type": "vllm", "args": {"dtype": "half"}, "extraArgs": ["--max-model-len", "dtype"]}),
        );
        assert_eq!(args_conflict(&fine.spec), None, "a value is no flag");
    }

    fn md_with(engine: &Value) -> ModelDeployment {
        md(json!({"model": {"id": "a/b"}, "engine": engine, "resources": {"gpu": {"count": 1}}}))
    }
}
