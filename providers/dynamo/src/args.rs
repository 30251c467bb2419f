//! The command line of a worker, per Dynamo backend: `python3 -m dynamo.<backend>`, the
//! model, the ModelDeployment's engine options, tensor parallelism from the worker's GPUs,
//! what its disaggregation role needs, then `engine.args` in key order.
//!
//! The operator adds no arguments to a single-node worker, so the engine runs exactly
//! what is rendered here (docs/upstream.md#dynamo-worker-command). Per backend:
//!
//! - vLLM and SGLang workers parse the engines' own flags, so their model, served name,
//!   tensor parallelism, context length and trust-remote-code flags, and the
//!   `engine.args` keys that set parallelism, are the SDK's table
//!   ([`kubeairunway_sdk::engine::Flags`]), shared with every provider.
//! - vLLM: both disaggregated roles get `--kv-transfer-config` with NixlConnector
//!   ([`VLLM_KV_TRANSFER_CONFIG`]): vLLM refuses a prefill worker without one; a
//!   `connector` is refused, as the worker stops on it since Dynamo 1.0
//!   ([`refuse_worker_settings`]); a NIXL worker advertises its pod IP ([`uses_nixl`])
//!   (docs/upstream.md#dynamo-vllm-flags).
//! - SGLang: both roles get `--disaggregation-transfer-backend nixl` and
//!   `--host 0.0.0.0`: the default backend is mooncake and the default bootstrap host
//!   127.0.0.1, which a decode pod cannot reach; the bootstrap port is Dynamo's own
//!   (docs/upstream.md#dynamo-sglang-flags).
//! - TensorRT-LLM: the worker has a parser of its own, so its flags are Dynamo's and stay
//!   here ([`TRTLLM_FLAGS`]): `--model` (not its obsolete alias `--model-path`), no data
//!   parallelism and no trust-remote-code flag, so `trust_remote_code` goes into the
//!   engine arguments. A role transfers no KV cache without `cache_transceiver_config`,
//!   so both roles get it, and prefill `disable_overlap_scheduler`, as Dynamo's examples
//!   set them: merged under the user's own into `--override-engine-args`, or rendered as
//!   `--trtllm.*` flags when the user uses those (the two are mutually exclusive, and an
//!   unknown flag stops the worker) (docs/upstream.md#dynamo-tensorrt-llm-flags).
//!
//! - Prefix caching and eager execution: vLLM's and SGLang's own flags, from the SDK's
//!   table ([`engine::toggle_flags`]); Dynamo's TensorRT-LLM worker has none
//!   ([`TRTLLM_FLAGS`]), so the fields are named as ignored there.
//! - `engine.extraArgs` go last, as given; their flags count as the user's setting.
//!
//! The user's own setting of any of these (in `engine.args` or `engine.extraArgs`) wins.

use std::collections::BTreeMap;

use kubeairunway_sdk::RenderError;
use kubeairunway_sdk::api::EngineType;
use kubeairunway_sdk::engine::{self, Flags, Parallelism, Toggle, arg_key};
use kubeairunway_sdk::provider::engine_flags;
use serde_json::{Map, Value, json};

/// vLLM's `--kv-transfer-config` for disaggregated roles (NIXL, both directions).
pub const VLLM_KV_TRANSFER_CONFIG: &str = r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#;

/// A worker's role for its command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Aggregated (prefill and decode).
    Aggregated,
    /// Prefill only.
    Prefill,
    /// Decode only.
    Decode,
}

impl Mode {
    fn disaggregation(self) -> Option<&'static str> {
        match self {
            Mode::Aggregated => None,
            Mode::Prefill => Some("prefill"),
            Mode::Decode => Some("decode"),
        }
    }
}

/// What a Dynamo backend calls things.
#[derive(Debug)]
pub struct Backend {
    /// `spec.backendFramework`.
    pub framework: &'static str,
    /// The Python module of the worker.
    pub module: &'static str,
    /// Component name prefix (`VllmWorker`, ...).
    pub prefix: &'static str,
    /// How the worker spells the engine's options.
    pub flags: &'static Flags,
}

const VLLM: Backend = Backend {
    framework: "vllm",
    module: "dynamo.vllm",
    prefix: "Vllm",
    flags: &engine::VLLM,
};

const SGLANG: Backend = Backend {
    framework: "sglang",
    module: "dynamo.sglang",
    prefix: "Sglang",
    flags: &engine::SGLANG,
};

/// Dynamo's TensorRT-LLM worker's own flags (see the module doc).
pub const TRTLLM_FLAGS: Flags = Flags {
    model: Some("--model"),
    model_path: Some("--model"),
    served_name: Some("--served-model-name"),
    tensor_parallel: Some("--tensor-parallel-size"),
    parallelism: Parallelism {
        tensor: &["tensor-parallel-size"],
        pipeline: &["pipeline-parallel-size"],
        data: &[],
        context: &[],
    },
    context_length: "--max-seq-len",
    trust_remote_code: None,
    cache_variables: &[],
    prefix_caching: Toggle {
        on: None,
        off: None,
        default: None,
        missing: "Dynamo's TensorRT-LLM worker has no flag for it, and its \
                  --override-engine-args would replace the worker's own kv_cache_config whole",
    },
    eager: Toggle {
        on: None,
        off: None,
        default: None,
        missing: "Dynamo's TensorRT-LLM worker has no flag for it (its --enable-cuda-graph is \
                  for diffusion models)",
    },
};

const TRTLLM: Backend = Backend {
    framework: "trtllm",
    module: "dynamo.trtllm",
    prefix: "Trtllm",
    flags: &TRTLLM_FLAGS,
};

/// The Dynamo backend of an engine (`None` for llama.cpp, which Dynamo does not run).
pub fn backend(engine: EngineType) -> Option<&'static Backend> {
    match engine {
        EngineType::Vllm => Some(&VLLM),
        EngineType::Sglang => Some(&SGLANG),
        EngineType::Trtllm => Some(&TRTLLM),
        EngineType::Llamacpp => None,
    }
}

/// Refuse what a backend's worker refuses at start, before anything is applied: Dynamo's
/// vLLM worker stops on `--connector` (or `DYN_CONNECTOR`) since Dynamo 1.0, and takes
/// the KV connector from vLLM's own `--kv-transfer-config`
/// (docs/upstream.md#dynamo-vllm-flags). `user_flags` are those of `engine.args` and
/// `engine.extraArgs` ([`engine::user_flags`]), `env` the names of `spec.env`.
pub fn refuse_worker_settings<'a>(
    b: &Backend,
    user_flags: &BTreeMap<String, String>,
    mut env: impl Iterator<Item = &'a str>,
) -> Result<(), RenderError> {
    if b.framework != VLLM.framework {
        return Ok(());
    }
    let flag = user_flags.keys().any(|k| arg_key(k) == "connector");
    let variable = env.any(|name| name == "DYN_CONNECTOR");
    if !flag && !variable {
        return Ok(());
    }
    let field = if flag {
        "spec.engine.args.connector (--connector)"
    } else {
        "spec.env DYN_CONNECTOR"
    };
    Err(RenderError(format!(
        "{field} is refused: Dynamo's vLLM worker stops on it since Dynamo 1.0; set the KV \
         connector with engine.args.kv-transfer-config instead (disaggregated workers get \
         {VLLM_KV_TRANSFER_CONFIG} already, and no connector is the default)"
    )))
}

/// Whether a worker's vLLM uses NIXL to move the KV cache: the provider's
/// `--kv-transfer-config` of a disaggregated role ([`VLLM_KV_TRANSFER_CONFIG`]), or the
/// user's naming `NixlConnector`. Such a worker must advertise an address the other role's
/// pods reach, [`NIXL_SIDE_CHANNEL_HOST`] (docs/upstream.md#dynamo-vllm-flags).
pub fn uses_nixl(b: &Backend, user_flags: &BTreeMap<String, String>, mode: Mode) -> bool {
    if b.framework != VLLM.framework {
        return false;
    }
    match user_flags
        .iter()
        .find(|(k, _)| arg_key(k) == "kv-transfer-config")
    {
        Some((_, config)) => config.contains("NixlConnector"),
        None => mode != Mode::Aggregated,
    }
}

/// The address vLLM's NIXL connector advertises to the other role's workers; set from the
/// pod's IP (`status.podIP`) on every worker that [`uses_nixl`].
pub const NIXL_SIDE_CHANNEL_HOST: &str = "VLLM_NIXL_SIDE_CHANNEL_HOST";

/// The user's `engine.args`, by normalized key.
struct UserArgs<'a> {
    args: BTreeMap<String, &'a str>,
}

impl<'a> UserArgs<'a> {
    fn new(args: Option<&'a BTreeMap<String, String>>) -> Self {
        Self {
            args: args
                .into_iter()
                .flatten()
                .map(|(k, v)| (arg_key(k), v.as_str()))
                .collect(),
        }
    }

    fn has(&self, keys: &[&str]) -> bool {
        keys.iter().any(|k| self.args.contains_key(*k))
    }

    /// TensorRT-LLM's dynamic `--trtllm.<path>` flags.
    fn trtllm_dynamic(&self) -> bool {
        self.args.keys().any(|k| k.starts_with("trtllm."))
    }
}

/// Tensor parallelism for `gpus` GPUs, as the SDK computes it for every engine
/// ([`Parallelism::tensor_parallel`]) with the backend's spellings.
pub fn tensor_parallel(
    b: &Backend,
    gpus: i32,
    user: Option<&BTreeMap<String, String>>,
) -> Option<i32> {
    b.flags.parallelism.tensor_parallel(gpus, user)
}

/// The engine options of the ModelDeployment that go on every worker of a graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineOptions {
    /// Model id or path.
    pub model: String,
    /// `--served-model-name`.
    pub served_name: Option<String>,
    /// `engine.contextLength`.
    pub context_length: Option<i32>,
    /// `engine.trustRemoteCode`.
    pub trust_remote_code: bool,
    /// `engine.args`.
    pub args: Option<BTreeMap<String, String>>,
    /// `engine.enablePrefixCaching`.
    pub enable_prefix_caching: Option<bool>,
    /// `engine.enforceEager`.
    pub enforce_eager: Option<bool>,
    /// `engine.extraArgs`, passed last as given.
    pub extra_args: Vec<String>,
}

impl EngineOptions {
    /// Every flag the user sets: `engine.args` and the flags of `engine.extraArgs`
    /// ([`engine::extra_arg_flags`]).
    fn user_flags(&self) -> BTreeMap<String, String> {
        let mut out = self.args.clone().unwrap_or_default();
        out.extend(engine::extra_arg_flags(&self.extra_args));
        out
    }
}

/// The command and arguments of one worker.
pub fn worker(
    b: &Backend,
    opts: &EngineOptions,
    mode: Mode,
    gpus: i32,
) -> Result<(Vec<String>, Vec<String>), RenderError> {
    let all_user_flags = opts.user_flags();
    let user = UserArgs::new(Some(&all_user_flags));
    let flags = b.flags;
    // vLLM, SGLang and Dynamo's TensorRT-LLM take an id or a path with the same flag,
    // and each has a served-name option.
    let mut args: Vec<String> = flags.model.iter().map(ToString::to_string).collect();
    args.push(opts.model.clone());
    let mut push = |flag: &str, value: Option<String>| {
        args.push(flag.to_string());
        args.extend(value);
    };
    if let (Some(served), Some(flag)) = (&opts.served_name, flags.served_name) {
        push(flag, Some(served.clone()));
    }
    if let Some(len) = opts.context_length {
        push(flags.context_length, Some(len.to_string()));
    }
    if opts.trust_remote_code
        && let Some(flag) = flags.trust_remote_code
    {
        push(flag, None);
    }
    // The warnings are the graph's, given once (`graph::build`).
    let (toggles, _warnings) = engine::toggle_flags(
        flags,
        opts.enable_prefix_caching,
        opts.enforce_eager,
        &all_user_flags,
    );
    for toggle in toggles {
        push(&toggle, None);
    }
    if let (Some(flag), Some(tp)) = (
        flags.tensor_parallel,
        tensor_parallel(b, gpus, Some(&all_user_flags)),
    ) {
        push(flag, Some(tp.to_string()));
    }
    if let Some(role) = mode.disaggregation() {
        push("--disaggregation-mode", Some(role.to_string()));
    }
    let mut user_args = opts.args.clone().unwrap_or_default();
    match b.framework {
        "vllm" if mode != Mode::Aggregated && !user.has(&["kv-transfer-config"]) => {
            push(
                "--kv-transfer-config",
                Some(VLLM_KV_TRANSFER_CONFIG.to_string()),
            );
        }
        "sglang" if mode != Mode::Aggregated => {
            if !user.has(&["disaggregation-transfer-backend"]) {
                push(
                    "--disaggregation-transfer-backend",
                    Some("nixl".to_string()),
                );
            }
            if !user.has(&["host"]) {
                push("--host", Some("0.0.0.0".to_string()));
            }
        }
        "trtllm" => {
            let engine = trtllm_engine_overrides(opts, mode);
            let in_extra_args = user.has(&["override-engine-args"])
                && !user_args
                    .keys()
                    .any(|k| arg_key(k) == "override-engine-args");
            if user.trtllm_dynamic() {
                for (path, value) in flatten("trtllm", &engine) {
                    if !user.args.contains_key(&arg_key(&path)) {
                        push(&format!("--{path}"), Some(value));
                    }
                }
            } else if in_extra_args {
                // The user's own --override-engine-args, in engine.extraArgs, comes last
                // and replaces any of ours: theirs wins.
            } else if let Some(merged) = merge_override_engine_args(&engine, &mut user_args)? {
                push("--override-engine-args", Some(merged));
            }
        }
        _ => {}
    }
    args.extend(engine_flags(Some(&user_args)));
    args.extend(opts.extra_args.iter().cloned());
    Ok((vec!["python3".into(), "-m".into(), b.module.into()], args))
}

/// The TensorRT-LLM engine arguments a worker needs besides its flags.
fn trtllm_engine_overrides(opts: &EngineOptions, mode: Mode) -> Map<String, Value> {
    let mut engine = Map::new();
    if mode != Mode::Aggregated {
        engine.insert(
            "cache_transceiver_config".into(),
            json!({"backend": "DEFAULT"}),
        );
    }
    if mode == Mode::Prefill {
        engine.insert("disable_overlap_scheduler".into(), json!(true));
    }
    if opts.trust_remote_code {
        engine.insert("trust_remote_code".into(), json!(true));
    }
    engine
}

/// `ours` with the user's `--override-engine-args` (a JSON object) deep-merged over it;
/// the user's entry is taken out of `user_args`. `None` when there is nothing to pass.
fn merge_override_engine_args(
    ours: &Map<String, Value>,
    user_args: &mut BTreeMap<String, String>,
) -> Result<Option<String>, RenderError> {
    let user_key = user_args
        .keys()
        .find(|k| arg_key(k) == "override-engine-args")
        .cloned();
    let mut merged = Value::Object(ours.clone());
    if let Some(k) = user_key {
        let text = user_args.remove(&k).unwrap_or_default();
        let theirs: Value = serde_json::from_str(&text).map_err(|e| {
            RenderError(format!(
                "engine.args.{k} must be a JSON object for Dynamo's TensorRT-LLM worker: {e}"
            ))
        })?;
        if !theirs.is_object() {
            return Err(RenderError(format!(
                "engine.args.{k} must be a JSON object for Dynamo's TensorRT-LLM worker"
            )));
        }
        deep_update(&mut merged, theirs);
    }
    Ok(merged
        .as_object()
        .filter(|m| !m.is_empty())
        .map(|_| merged.to_string()))
}

/// `dst` updated with `src`, recursively for objects (as Dynamo's `deep_update`).
fn deep_update(dst: &mut Value, src: Value) {
    match (dst, src) {
        (Value::Object(d), Value::Object(s)) => {
            for (k, v) in s {
                match d.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        deep_update(existing, v);
                    }
                    _ => {
                        d.insert(k, v);
                    }
                }
            }
        }
        (d, s) => *d = s,
    }
}

/// `trtllm.a.b` paths and values of a nested object, in key order.
fn flatten(prefix: &str, object: &Map<String, Value>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in object {
        let path = format!("{prefix}.{k}");
        match v {
            Value::Object(inner) => out.extend(flatten(&path, inner)),
            Value::String(s) => out.push((path, s.clone())),
            other => out.push((path, other.to_string())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[(&str, &str)]) -> EngineOptions {
        EngineOptions {
            model: "m/x".into(),
            args: Some(
                args.iter()
                    .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                    .collect(),
            ),
            ..EngineOptions::default()
        }
    }

    fn args_of(b: &Backend, o: &EngineOptions, mode: Mode, gpus: i32) -> Vec<String> {
        worker(b, o, mode, gpus).unwrap().1
    }

    #[test]
    fn tensor_parallelism_follows_the_gpus_unless_the_user_sets_it() {
        assert_eq!(tensor_parallel(&VLLM, 4, None), Some(4));
        assert_eq!(tensor_parallel(&VLLM, 0, None), None);
        let user = |k: &str, v: &str| Some([(k.to_string(), v.to_string())].into());
        assert_eq!(
            tensor_parallel(&VLLM, 4, user("tensor_parallel_size", "2").as_ref()),
            None
        );
        assert_eq!(
            tensor_parallel(&SGLANG, 4, user("tp-size", "2").as_ref()),
            None
        );
        assert_eq!(
            tensor_parallel(&VLLM, 4, user("pipeline-parallel-size", "2").as_ref()),
            Some(2)
        );
        assert_eq!(
            tensor_parallel(&SGLANG, 8, user("dp-size", "2").as_ref()),
            Some(4)
        );
        assert_eq!(
            tensor_parallel(&VLLM, 3, user("pp", "2").as_ref()),
            None,
            "uneven"
        );
        assert_eq!(
            tensor_parallel(&TRTLLM, 2, user("dp", "2").as_ref()),
            Some(2),
            "no dp flag"
        );
    }

    #[test]
    fn each_backend_spells_its_own_flags() {
        let o = EngineOptions {
            context_length: Some(4096),
            trust_remote_code: true,
            ..opts(&[])
        };
        assert_eq!(
            args_of(&VLLM, &o, Mode::Aggregated, 2),
            [
                "--model",
                "m/x",
                "--max-model-len",
                "4096",
                "--trust-remote-code",
                "--tensor-parallel-size",
                "2"
            ]
        );
        assert_eq!(
            args_of(&SGLANG, &o, Mode::Aggregated, 2),
            [
                "--model-path",
                "m/x",
                "--context-length",
                "4096",
                "--trust-remote-code",
                "--tp",
                "2"
            ]
        );
        assert_eq!(
            args_of(&TRTLLM, &o, Mode::Aggregated, 2),
            [
                "--model",
                "m/x",
                "--max-seq-len",
                "4096",
                "--tensor-parallel-size",
                "2",
                "--override-engine-args",
                r#"{"trust_remote_code":true}"#
            ]
        );
    }

    /// Dynamo 1.1's TensorRT-LLM worker names the model `--model`; `--model-path` is only
    /// its obsolete alias ("deprecating flag" in the help), and Dynamo's planner finds a
    /// worker's model by `--served-model-name` or `--model` alone.
    #[test]
    fn trtllm_names_the_model_with_model_not_its_obsolete_alias() {
        assert_eq!(TRTLLM_FLAGS.model, Some("--model"));
        assert_eq!(TRTLLM_FLAGS.model_path, Some("--model"));
        let o = EngineOptions {
            served_name: Some("served".into()),
            ..opts(&[])
        };
        for mode in [Mode::Aggregated, Mode::Prefill, Mode::Decode] {
            let a = args_of(&TRTLLM, &o, mode, 1);
            assert_eq!(
                a[..4],
                ["--model", "m/x", "--served-model-name", "served"],
                "{mode:?}"
            );
            assert!(!a.contains(&"--model-path".to_string()), "{a:?}");
        }
    }

    #[test]
    fn disaggregated_roles_get_their_kv_transfer() {
        let o = opts(&[]);
        for mode in [Mode::Prefill, Mode::Decode] {
            let a = args_of(&VLLM, &o, mode, 1);
            assert!(
                a.windows(2)
                    .any(|w| w == ["--kv-transfer-config", VLLM_KV_TRANSFER_CONFIG]),
                "{a:?}"
            );
            let a = args_of(&SGLANG, &o, mode, 1);
            assert!(
                a.windows(2)
                    .any(|w| w == ["--disaggregation-transfer-backend", "nixl"]),
                "{a:?}"
            );
            assert!(a.windows(2).any(|w| w == ["--host", "0.0.0.0"]), "{a:?}");
        }
        assert_eq!(
            args_of(&TRTLLM, &o, Mode::Prefill, 1)[4..],
            [
                "--disaggregation-mode",
                "prefill",
                "--override-engine-args",
                r#"{"cache_transceiver_config":{"backend":"DEFAULT"},"disable_overlap_scheduler":true}"#
            ]
        );
        assert!(
            !args_of(&VLLM, &o, Mode::Aggregated, 1).contains(&"--kv-transfer-config".to_string())
        );
    }

    #[test]
    fn the_users_own_settings_win() {
        let o = opts(&[(
            "kv-transfer-config",
            "{\"kv_connector\":\"LMCacheConnectorV1\"}",
        )]);
        let a = args_of(&VLLM, &o, Mode::Prefill, 1);
        assert_eq!(a.iter().filter(|x| *x == "--kv-transfer-config").count(), 1);
        assert_eq!(
            a.last().unwrap(),
            "{\"kv_connector\":\"LMCacheConnectorV1\"}"
        );

        let o = opts(&[(
            "override-engine-args",
            r#"{"cache_transceiver_config":{"max_tokens_in_buffer":65536},"disable_overlap_scheduler":false}"#,
        )]);
        let a = args_of(&TRTLLM, &o, Mode::Prefill, 1);
        assert_eq!(
            a.iter().filter(|x| *x == "--override-engine-args").count(),
            1
        );
        assert_eq!(
            a.last().unwrap(),
            r#"{"cache_transceiver_config":{"backend":"DEFAULT","max_tokens_in_buffer":65536},"disable_overlap_scheduler":false}"#
        );

        let o = opts(&[("trtllm.cache_transceiver_config.backend", "UCX")]);
        let a = args_of(&TRTLLM, &o, Mode::Prefill, 1);
        assert!(
            !a.contains(&"--override-engine-args".to_string()),
            "exclusive with --trtllm.*: {a:?}"
        );
        assert_eq!(
            a[4..],
            [
                "--disaggregation-mode",
                "prefill",
                "--trtllm.disable_overlap_scheduler",
                "true",
                "--trtllm.cache_transceiver_config.backend",
                "UCX"
            ]
        );

        let err = worker(
            &TRTLLM,
            &opts(&[("override-engine-args", "[1]")]),
            Mode::Decode,
            1,
        )
        .unwrap_err();
        assert!(err.0.contains("must be a JSON object"), "{}", err.0);
    }
}
