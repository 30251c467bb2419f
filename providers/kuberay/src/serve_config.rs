//! `serveConfigV2`: the Ray Serve config (a YAML string) holding one Ray Serve LLM
//! application.
//!
//! Aggregated: `ray.serve.llm:build_openai_app` with `args.llm_configs: [LLMConfig]`.
//! Disaggregated: `ray.serve.llm:build_pd_openai_app` with `args.prefill_config` and
//! `args.decode_config` (two LLMConfigs with the same model whose engines exchange the KV
//! cache through vLLM's NIXL connector, `kv_role: kv_both`).
//!
//! An `LLMConfig` here sets `model_loading_config{model_id, model_source}` (the served
//! name and the Hugging Face id or path), `engine_kwargs` (vLLM engine arguments:
//! `max_model_len` from `engine.contextLength`, `trust_remote_code`,
//! `enable_prefix_caching` and `enforce_eager` from `engine.enablePrefixCaching` and
//! `engine.enforceEager`, `tensor_parallel_size` from the GPUs per replica, then
//! `engine.args` with their keys in snake case and their values typed) and
//! `deployment_config.num_replicas`. `engine.extraArgs` are no keywords: the provider
//! names them as ignored. The keywords
//! are vLLM's flags in snake case (`AsyncEngineArgs` fields), named once in the SDK's
//! table ([`kubeairunway_sdk::engine::VLLM`]); the GPUs of a role are the SDK's
//! ([`kubeairunway_sdk::gpu::per_replica`]).
//!
//! What Ray Serve LLM accepts (docs/upstream.md#ray-serve-llm-config): no unknown keys in
//! an `LLMConfig`; `engine_kwargs` only of vLLM's engine and frontend arguments, never
//! `model` or `served_model_name` (refused by `check`); `disable_log_stats` only with
//! `log_engine_metrics: false`. A replica's placement group is one GPU bundle per tensor
//! x pipeline parallel rank; disaggregated roles ask for their role's custom resource in
//! each bundle, `STRICT_PACK`, so that a prefill replica never takes a decode pod's GPUs
//! (and the reverse) and a replica's GPUs stay on one pod.

use kubeairunway_sdk::RenderError;
use kubeairunway_sdk::api::{ModelDeployment, ModelSource, ServingMode};
use kubeairunway_sdk::engine::VLLM;
use kubeairunway_sdk::gpu;
use serde_json::{Map, Value, json};

/// Name of the Serve application.
pub const APP_NAME: &str = "llm";
/// Import path of the aggregated OpenAI app builder.
pub const OPENAI_APP: &str = "ray.serve.llm:build_openai_app";
/// Import path of the prefill/decode OpenAI app builder.
pub const PD_OPENAI_APP: &str = "ray.serve.llm:build_pd_openai_app";
/// The KV connector of disaggregated serving.
pub const KV_CONNECTOR: &str = "NixlConnector";

/// GPUs per replica and replicas of one serving role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Role {
    /// Which role.
    pub kind: gpu::Role,
    /// Serve replicas (one engine each).
    pub replicas: i32,
    /// GPUs per replica (the tensor-parallel size; [`gpu::per_replica`]).
    pub gpus: i32,
}

/// The serving roles of `md`: one for aggregated, prefill then decode for disaggregated.
pub fn roles(md: &ModelDeployment) -> Vec<(&'static str, Role)> {
    let spec = &md.spec;
    gpu::Role::of(spec.serving.mode)
        .iter()
        .map(|&kind| {
            let replicas = match kind {
                gpu::Role::Aggregated => spec.scaling.replicas,
                gpu::Role::Prefill => spec.scaling.prefill.as_ref().map_or(1, |c| c.replicas),
                gpu::Role::Decode => spec.scaling.decode.as_ref().map_or(1, |c| c.replicas),
            };
            let gpus = gpu::per_replica(spec, kind).count;
            (
                kind.as_str(),
                Role {
                    kind,
                    replicas,
                    gpus,
                },
            )
        })
        .collect()
}

/// The Serve config of `md` as a value (`applications: [...]`).
pub fn serve_config(md: &ModelDeployment) -> Result<Value, RenderError> {
    let roles = roles(md);
    let (import_path, args) = match md.spec.serving.mode {
        ServingMode::Aggregated => {
            let role = roles
                .first()
                .map(|(_, r)| *r)
                .ok_or_else(|| RenderError("no serving role".into()))?;
            let config = llm_config(md, role, None, None)?;
            (OPENAI_APP, json!({ "llm_configs": [config] }))
        }
        ServingMode::Disaggregated => {
            let kv = json!({"kv_connector": KV_CONNECTOR, "kv_role": "kv_both"});
            let mut args = Map::new();
            for (name, role) in roles {
                args.insert(
                    format!("{name}_config"),
                    llm_config(md, role, Some(kv.clone()), Some(name))?,
                );
            }
            (PD_OPENAI_APP, Value::Object(args))
        }
    };
    Ok(json!({
        "applications": [{
            "name": APP_NAME,
            "route_prefix": "/",
            "import_path": import_path,
            "args": args,
        }],
    }))
}

/// The Serve config of `md` as the YAML string `serveConfigV2` holds. Strings a YAML 1.1
/// reader would take for booleans or numbers (`on`, `yes`, `1e3`) are quoted.
pub fn serve_config_yaml(md: &ModelDeployment) -> Result<String, RenderError> {
    serde_saphyr::to_string(&serve_config(md)?)
        .map_err(|e| RenderError(format!("cannot write serveConfigV2: {e}")))
}

/// One `LLMConfig`; `placement_resource` is the custom resource of the role's worker
/// group (disaggregated).
fn llm_config(
    md: &ModelDeployment,
    role: Role,
    kv_transfer: Option<Value>,
    placement_resource: Option<&str>,
) -> Result<Value, RenderError> {
    let source = md
        .spec
        .model
        .id
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            RenderError(
            "KubeRay needs spec.model.id: the Hugging Face id, or the model's path inside the image"
                .into(),
        )
        })?;
    // `servedName` is ignored for a custom source (the API's contract, which core warns
    // about): the served name is then the basename of the path.
    let served = match md.spec.model.source {
        ModelSource::Custom => source.rsplit('/').find(|s| !s.is_empty()).unwrap_or(source),
        ModelSource::Huggingface => md.spec.served_model_name().unwrap_or(source),
    };
    let mut kwargs = Map::new();
    if let Some(len) = md.spec.engine.context_length {
        kwargs.insert(kwarg_key(VLLM.context_length), json!(len));
    }
    if md.spec.engine.trust_remote_code
        && let Some(flag) = VLLM.trust_remote_code
    {
        kwargs.insert(kwarg_key(flag), json!(true));
    }
    // Prefix caching either way, eager only when asked for (false is vLLM's default): the
    // fields of vLLM's `AsyncEngineArgs` its flags name (docs/upstream.md#engine-flags).
    if let (Some(on), Some(flag)) = (md.spec.engine.enable_prefix_caching, VLLM.prefix_caching.on) {
        kwargs.insert(kwarg_key(flag), json!(on));
    }
    if let (Some(true), Some(flag)) = (md.spec.engine.enforce_eager, VLLM.eager.on) {
        kwargs.insert(kwarg_key(flag), json!(true));
    }
    kwargs.insert(TENSOR_PARALLEL_KWARG.into(), json!(role.gpus));
    if let Some(kv) = kv_transfer {
        kwargs.insert("kv_transfer_config".into(), kv);
    }
    for (key, value) in md.spec.engine.args.iter().flatten() {
        kwargs.insert(kwarg_key(key), typed(value));
    }
    let mut config = json!({
        "model_loading_config": {"model_id": served, "model_source": source},
        "deployment_config": {"num_replicas": role.replicas},
    });
    if kwargs.get("disable_log_stats") == Some(&json!(true)) {
        config["log_engine_metrics"] = json!(false);
    }
    config["engine_kwargs"] = Value::Object(kwargs);
    if let Some(resource) = placement_resource {
        let mut bundle = Map::new();
        bundle.insert("GPU".into(), json!(1));
        bundle.insert(resource.into(), json!(1));
        let bundle = Value::Object(bundle);
        config["placement_group_config"] = json!({
            "bundles": vec![bundle; usize::try_from(role.gpus).unwrap_or(0)],
            "strategy": "STRICT_PACK",
        });
    }
    Ok(config)
}

/// vLLM's `--tensor-parallel-size` as an engine keyword ([`VLLM`]).
pub const TENSOR_PARALLEL_KWARG: &str = "tensor_parallel_size";
/// vLLM's `--pipeline-parallel-size` as an engine keyword ([`VLLM`]).
pub const PIPELINE_PARALLEL_KWARG: &str = "pipeline_parallel_size";

/// `--gpu-memory-utilization` and `gpu-memory-utilization` as the engine keyword
/// `gpu_memory_utilization`.
pub fn kwarg_key(flag: &str) -> String {
    flag.trim_start_matches('-').replace('-', "_")
}

/// An `engine.args` value (always a string) as the typed value vLLM's engine arguments
/// expect: `true`/`false` as booleans, integers and decimals as numbers, the rest as
/// strings.
pub fn typed(value: &str) -> Value {
    match value {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    let numeric = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E'))
        && value.chars().any(|c| c.is_ascii_digit());
    if numeric {
        if let Ok(i) = value.parse::<i64>() {
            return json!(i);
        }
        if let Ok(f) = value.parse::<f64>()
            && let Some(n) = serde_json::Number::from_f64(f)
        {
            return Value::Number(n);
        }
    }
    Value::String(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keywords are the SDK's vLLM flags in snake case.
    #[test]
    fn parallelism_keywords_are_vllms_flags() {
        assert_eq!(
            kwarg_key(VLLM.tensor_parallel.unwrap()),
            TENSOR_PARALLEL_KWARG
        );
        assert_eq!(
            kwarg_key(VLLM.parallelism.pipeline[0]),
            PIPELINE_PARALLEL_KWARG
        );
        assert_eq!(kwarg_key(VLLM.context_length), "max_model_len");
    }

    /// `engine.enablePrefixCaching` and `engine.enforceEager` as the `AsyncEngineArgs`
    /// fields vLLM's flags set (`enable_prefix_caching`, `enforce_eager`:
    /// `vllm/engine/arg_utils.py:350,377@v0.11.0`, the lowest vLLM `ray[llm]==2.52.0`
    /// takes); the user's `engine.args` win.
    #[test]
    fn prefix_caching_and_eager_are_engine_keywords() {
        let kwargs = |engine: Value| {
            let md: ModelDeployment = serde_json::from_value(json!({
                "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
                "metadata": {"name": "m", "namespace": "ns"},
                "spec": {"model": {"id": "a/b"}, "engine": engine, "resources": {"gpu": {"count": 1}}},
            }))
            .unwrap();
            serve_config(&md).unwrap()["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]
                .clone()
        };
        let k = kwargs(json!({"type": "vllm", "enablePrefixCaching": false, "enforceEager": true}));
        assert_eq!(k["enable_prefix_caching"], json!(false));
        assert_eq!(k["enforce_eager"], json!(true));
        let k = kwargs(json!({"type": "vllm", "enablePrefixCaching": true, "enforceEager": false}));
        assert_eq!(k["enable_prefix_caching"], json!(true));
        assert!(k.get("enforce_eager").is_none(), "{k}");
        let k = kwargs(json!({"type": "vllm"}));
        assert!(k.get("enable_prefix_caching").is_none(), "{k}");
        let k = kwargs(
            json!({"type": "vllm", "enforceEager": true, "args": {"enforce-eager": "false"}}),
        );
        assert_eq!(
            k["enforce_eager"],
            json!(false),
            "the user's engine.args win"
        );
    }

    #[test]
    fn engine_arg_keys_become_snake_case() {
        assert_eq!(
            kwarg_key("--gpu-memory-utilization"),
            "gpu_memory_utilization"
        );
        assert_eq!(kwarg_key("enforce-eager"), "enforce_eager");
        assert_eq!(kwarg_key("max_num_seqs"), "max_num_seqs");
    }

    #[test]
    fn engine_arg_values_are_typed() {
        assert_eq!(typed("true"), json!(true));
        assert_eq!(typed("false"), json!(false));
        assert_eq!(typed("256"), json!(256));
        assert_eq!(typed("-1"), json!(-1));
        assert_eq!(typed("0.9"), json!(0.9));
        assert_eq!(typed("awq"), json!("awq"));
        assert_eq!(typed("on"), json!("on"));
        assert_eq!(typed("e"), json!("e"));
        assert_eq!(typed("1-2"), json!("1-2"));
        assert_eq!(typed(""), json!(""));
        assert_eq!(typed("NaN"), json!("NaN"));
    }
}
