//! ModelDeployment -> KAITO objects.
//!
//! - One replica: a `kaito.sh/v1beta1` Workspace. Its fields sit at the top level
//!   (`resource`, `inference`); there is no `spec`.
//! - Other replica counts (when the InferenceSet CRD is enabled): a `kaito.sh/v1alpha1`
//!   InferenceSet with `spec.replicas` and the same `resource`/`inference` as its template.
//!   `resource.count` is never used for replicas: it is deprecated and counts the GPU
//!   nodes of one instance.
//! - vLLM runs as a KAITO preset named after the Hugging Face model id; `contextLength`,
//!   `trustRemoteCode` and `engine.args` go into the inference config ConfigMap KAITO
//!   reads (`inference.config`, key `inference_config.yaml`, section `vllm`, each key
//!   passed to vLLM as `--key value`), rendered as a second object owned alongside.
//! - llama.cpp runs the user's image from `inference.template`, serving on port 5000 (the
//!   port KAITO's Service targets).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kube::ResourceExt;
use kubeairunway_sdk::api::{DEFAULT_GPU_TYPE, EngineType, ModelDeployment, ModelSource};
use kubeairunway_sdk::provider::{engine_flags, object};
use kubeairunway_sdk::render::{pod_annotations, pod_labels};
use kubeairunway_sdk::{RenderError, Rendered, UpstreamApi, Warning};
use serde_json::{Map, Value, json};

use crate::{GROUP, KaitoProvider, overrides};

/// The Workspace annotation that selects KAITO's inference runtime.
pub const RUNTIME_ANNOTATION: &str = "kaito.sh/runtime";
/// The ConfigMap key KAITO reads its inference config from.
pub const CONFIG_KEY: &str = "inference_config.yaml";
/// The port a llama.cpp image must serve on: KAITO's Service `<name>:80` targets it.
pub const PORT: i32 = 5000;
/// Name of the serving container in a llama.cpp template.
pub const CONTAINER: &str = "model";
/// `engine.args` key naming the GGUF file for llama.cpp instead of `huggingface://<id>`.
pub const GGUF_URL_ARG: &str = "ggufUrl";
/// Event reason of a setting KAITO cannot honour.
pub const IGNORED_SETTING: &str = "IgnoredSetting";
/// Version of the InferenceSet API rendered (served by every KAITO release that has it).
pub const INFERENCE_SET_VERSION: &str = "v1alpha1";
/// Node labels selected when `spec.nodeSelector` is empty.
pub const DEFAULT_NODE_LABEL: (&str, &str) = ("kubernetes.io/os", "linux");

/// The ConfigMap name for `md`'s inference config.
pub fn config_map_name(md: &ModelDeployment) -> String {
    format!("{}-inference-config", md.name_any())
}

/// Render the objects for `md`: the Workspace (or InferenceSet) first, then the inference
/// config ConfigMap when vLLM options need one.
pub fn render(
    provider: &KaitoProvider,
    md: &ModelDeployment,
    upstream: &UpstreamApi,
) -> Result<Rendered, RenderError> {
    let (_none, mut warnings) = overrides::parse(md)?;
    let name = md.name_any();
    let (inference, config_map) = match md.spec.engine.type_ {
        Some(EngineType::Vllm) => vllm(md, &mut warnings)?,
        Some(EngineType::Llamacpp) => (llamacpp(md, &mut warnings)?, None),
        other => {
            return Err(RenderError(format!(
                "KAITO does not support {} engine",
                other.map_or("unset", EngineType::as_str)
            )));
        }
    };
    let mut resource = Map::new();
    if let Some(instance_type) = provider.instance_type.as_ref().filter(|s| !s.is_empty()) {
        resource.insert("instanceType".into(), json!(instance_type));
    }
    let selector = json!({ "matchLabels": node_labels(md) });
    let mut annotations = BTreeMap::new();
    if md.spec.engine.type_ == Some(EngineType::Vllm) {
        annotations.insert(RUNTIME_ANNOTATION.to_string(), "vllm".to_string());
    }
    let mut metadata = json!({ "name": name });
    if !annotations.is_empty() {
        metadata["annotations"] = json!(annotations);
    }
    let primary = if md.spec.scaling.replicas == 1 || !provider.inference_set {
        resource.insert("labelSelector".into(), selector);
        object(json!({
            "apiVersion": upstream.api_version(),
            "kind": "Workspace",
            "metadata": metadata,
            "resource": resource,
            "inference": inference,
        }))?
    } else {
        let mut template = Map::new();
        template.insert("inference".into(), inference);
        if !resource.is_empty() {
            template.insert("resource".into(), Value::Object(resource));
        }
        object(json!({
            "apiVersion": format!("{GROUP}/{INFERENCE_SET_VERSION}"),
            "kind": "InferenceSet",
            "metadata": metadata,
            "spec": {
                "replicas": md.spec.scaling.replicas,
                "labelSelector": selector,
                "template": template,
            },
        }))?
    };
    let mut objects = vec![primary];
    objects.extend(config_map);
    Ok(Rendered { objects, warnings })
}

/// `resource.labelSelector.matchLabels`: the node selector, else Linux nodes.
fn node_labels(md: &ModelDeployment) -> BTreeMap<String, String> {
    match md.spec.node_selector.as_ref().filter(|s| !s.is_empty()) {
        Some(selector) => selector.clone(),
        None => [(
            DEFAULT_NODE_LABEL.0.to_string(),
            DEFAULT_NODE_LABEL.1.to_string(),
        )]
        .into(),
    }
}

fn ignored(warnings: &mut Vec<Warning>, message: String) {
    warnings.push(Warning::new(IGNORED_SETTING, message));
}

/// vLLM: the preset named after the model id, and the inference config when needed.
fn vllm(
    md: &ModelDeployment,
    warnings: &mut Vec<Warning>,
) -> Result<(Value, Option<kube::api::DynamicObject>), RenderError> {
    let spec = &md.spec;
    if spec.model.source == ModelSource::Custom {
        return Err(RenderError(
            "KAITO serves vLLM as a preset that downloads model.id from Hugging Face; \
             model.source custom needs engine llamacpp with an image that holds the model"
                .into(),
        ));
    }
    let id = spec
        .model
        .id
        .as_deref()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| RenderError("model.id is required: it names KAITO's vLLM preset".into()))?;
    if spec.image.is_some() {
        ignored(
            warnings,
            "spec.image is ignored: KAITO runs vLLM from its own preset image".into(),
        );
    }
    if spec.env.as_ref().is_some_and(|e| !e.is_empty()) {
        ignored(
            warnings,
            "spec.env is ignored: KAITO's vLLM preset takes no environment variables".into(),
        );
    }
    if spec.tolerations.as_ref().is_some_and(|t| !t.is_empty()) {
        ignored(
            warnings,
            "spec.tolerations is ignored: KAITO's vLLM preset pods take no tolerations (nodes are chosen by spec.nodeSelector)".into(),
        );
    }
    if spec
        .pod_template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .is_some()
    {
        ignored(
            warnings,
            "spec.podTemplate.metadata is ignored: KAITO's vLLM preset has no pod template".into(),
        );
    }
    let mut preset = json!({ "name": id });
    if let Some(secret) = spec
        .secrets
        .as_ref()
        .and_then(|s| s.hugging_face_token.as_deref())
        .filter(|s| !s.is_empty())
    {
        preset["presetOptions"] = json!({ "modelAccessSecret": secret });
    }
    let mut inference = json!({ "preset": preset });
    let config = inference_config(md);
    let config_map = match config {
        Some(text) => {
            let cm_name = config_map_name(md);
            inference["config"] = json!(cm_name);
            Some(object(json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": cm_name},
                "data": { CONFIG_KEY: text },
            }))?)
        }
        None => None,
    };
    Ok((inference, config_map))
}

/// The `inference_config.yaml` text for vLLM, or `None` when nothing needs passing.
/// KAITO hands each key of the `vllm` section to vLLM as `--key value`.
pub fn inference_config(md: &ModelDeployment) -> Option<String> {
    let engine = &md.spec.engine;
    let mut entries: BTreeMap<String, Value> = BTreeMap::new();
    for (key, value) in engine.args.iter().flatten() {
        let key = key.trim_start_matches("--").to_string();
        let value = if value == "true" {
            Value::Bool(true)
        } else {
            Value::String(value.clone())
        };
        entries.insert(key, value);
    }
    if let Some(len) = engine.context_length {
        entries.insert("max-model-len".into(), json!(len));
    }
    if engine.trust_remote_code {
        entries.insert("trust-remote-code".into(), Value::Bool(true));
    }
    if entries.is_empty() {
        return None;
    }
    let mut text = format!(
        "# Written by kubeairunway for ModelDeployment {}; KAITO passes each vllm key to vLLM as --key value.\nvllm:\n",
        md.name_any()
    );
    for (key, value) in entries {
        // JSON scalars are YAML scalars: strings come out quoted, numbers and booleans bare.
        let plain = key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && key.starts_with(|c: char| c.is_ascii_alphanumeric());
        let key = if plain {
            key
        } else {
            Value::String(key).to_string()
        };
        let _ = writeln!(text, "  {key}: {value}");
    }
    Some(text)
}

/// llama.cpp: the user's image in `inference.template`, serving on port 5000.
fn llamacpp(md: &ModelDeployment, warnings: &mut Vec<Warning>) -> Result<Value, RenderError> {
    let spec = &md.spec;
    let image = spec.image.as_deref().filter(|i| !i.is_empty()).ok_or_else(|| {
        RenderError(
            "spec.image is required for llamacpp on KAITO: a llama.cpp server image that serves on port 5000 \
             (for example ghcr.io/sozercan/llama-cpp-runner:latest)"
                .into(),
        )
    })?;
    if spec.engine.context_length.is_some() {
        ignored(
            warnings,
            "engine.contextLength is not passed to llama.cpp images; set the image's own flag in engine.args".into(),
        );
    }
    if spec.engine.trust_remote_code {
        ignored(
            warnings,
            "engine.trustRemoteCode has no meaning for llama.cpp".into(),
        );
    }
    let mut args = Vec::new();
    let flags: BTreeMap<String, String> = spec
        .engine
        .args
        .iter()
        .flatten()
        .filter(|(k, _)| k.trim_start_matches("--") != GGUF_URL_ARG)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if spec.model.source == ModelSource::Huggingface {
        let gguf = spec
            .engine
            .args
            .as_ref()
            .and_then(|a| {
                a.get(GGUF_URL_ARG)
                    .or_else(|| a.get(&format!("--{GGUF_URL_ARG}")))
            })
            .filter(|u| !u.is_empty());
        match (gguf, spec.model.id.as_deref().filter(|i| !i.is_empty())) {
            (Some(url), _) => args.push(url.clone()),
            (None, Some(id)) => args.push(format!("huggingface://{id}")),
            (None, None) => {
                return Err(RenderError(
                    "model.id is required when model.source is huggingface".into(),
                ));
            }
        }
    }
    args.push(format!("--address=:{PORT}"));
    args.extend(engine_flags(Some(&flags)));

    let mut container = json!({
        "name": CONTAINER,
        "image": image,
        "args": args,
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
    });
    let resources = container_resources(md);
    if !resources.is_empty() {
        container["resources"] = Value::Object(resources);
    }
    if let Some(env) = spec.env.as_ref().filter(|e| !e.is_empty()) {
        container["env"] = serde_json::to_value(env)
            .map_err(|e| RenderError(format!("spec.env cannot be rendered: {e}")))?;
    }
    if let Some(secret) = spec
        .secrets
        .as_ref()
        .and_then(|s| s.hugging_face_token.as_deref())
        .filter(|s| !s.is_empty())
    {
        container["envFrom"] = json!([{ "secretRef": { "name": secret } }]);
    }
    let mut pod_spec = json!({ "containers": [container] });
    if let Some(selector) = spec.node_selector.as_ref().filter(|s| !s.is_empty()) {
        pod_spec["nodeSelector"] = json!(selector);
    }
    if let Some(tolerations) = spec.tolerations.as_ref().filter(|t| !t.is_empty()) {
        pod_spec["tolerations"] = serde_json::to_value(tolerations)
            .map_err(|e| RenderError(format!("spec.tolerations cannot be rendered: {e}")))?;
    }
    let mut metadata = json!({ "labels": pod_labels(md) });
    let annotations = pod_annotations(md);
    if !annotations.is_empty() {
        metadata["annotations"] = json!(annotations);
    }
    Ok(json!({ "template": { "metadata": metadata, "spec": pod_spec } }))
}

/// Requests for CPU and memory, and GPUs as a limit of their extended resource.
fn container_resources(md: &ModelDeployment) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(r) = md.spec.resources.as_ref() else {
        return out;
    };
    let mut requests = Map::new();
    if let Some(cpu) = r.cpu.as_ref().filter(|c| !c.is_empty()) {
        requests.insert("cpu".into(), json!(cpu));
    }
    if let Some(memory) = r.memory.as_ref().filter(|m| !m.is_empty()) {
        requests.insert("memory".into(), json!(memory));
    }
    if let Some(gpu) = r.gpu.as_ref().filter(|g| g.count > 0) {
        let kind = if gpu.type_.is_empty() {
            DEFAULT_GPU_TYPE
        } else {
            gpu.type_.as_str()
        };
        requests.insert(kind.into(), json!(gpu.count));
        out.insert("limits".into(), json!({ kind: gpu.count }));
    }
    if !requests.is_empty() {
        out.insert("requests".into(), Value::Object(requests));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kubeairunway_sdk::{Provider, UpstreamRef};

    fn crd(file: &str) -> CustomResourceDefinition {
        let path = format!(
            "{}/../../tests/fixtures/crds/upstream/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn api(file: &str) -> UpstreamApi {
        let wanted: UpstreamRef = KaitoProvider::default().upstream();
        UpstreamApi::detect(&crd(file), &wanted).unwrap()
    }

    fn md(value: Value) -> ModelDeployment {
        serde_json::from_value(value).unwrap()
    }

    /// The seed's CPU llama.cpp example (004 §4.2 example 2), as the generated sample.
    fn cpu_llamacpp() -> ModelDeployment {
        let text = std::fs::read_to_string(format!(
            "{}/../../config/samples/cpu-llamacpp.yaml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        serde_saphyr::from_str(&text).unwrap()
    }

    fn gpu_vllm() -> ModelDeployment {
        md(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "llama-8b", "namespace": "default"},
            "spec": {
                "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "source": "huggingface"},
                "engine": {"type": "vllm", "contextLength": 8192, "trustRemoteCode": true,
                           "args": {"gpu-memory-utilization": "0.9", "--enforce-eager": "true", "quantization": "fp8"}},
                "resources": {"gpu": {"count": 1}, "memory": "32Gi"},
                "secrets": {"huggingFaceToken": "hf-token"},
                "nodeSelector": {"kaito.sh/pool": "gpu"},
            },
        }))
    }

    fn render_with(p: &KaitoProvider, m: &ModelDeployment) -> Rendered {
        p.render(m, &api("kaito.sh_workspaces.yaml")).unwrap()
    }

    fn objects(r: &Rendered) -> Vec<Value> {
        r.objects
            .iter()
            .map(|o| serde_json::to_value(o).unwrap())
            .collect()
    }

    #[test]
    fn cpu_llamacpp_example() {
        let m = cpu_llamacpp();
        let p = KaitoProvider::default();
        assert!(p.check(&m).is_ok());
        let r = render_with(&p, &m);
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        insta::assert_yaml_snapshot!(objects(&r));
    }

    #[test]
    fn gpu_vllm_with_context_length_and_args() {
        let p = KaitoProvider::default();
        let r = render_with(&p, &gpu_vllm());
        assert_eq!(r.objects.len(), 2);
        insta::assert_yaml_snapshot!(objects(&r));
    }

    #[test]
    fn vllm_without_options_needs_no_config_map() {
        let mut m = gpu_vllm();
        m.spec.engine.context_length = None;
        m.spec.engine.trust_remote_code = false;
        m.spec.engine.args = None;
        let o = objects(&render_with(&KaitoProvider::default(), &m));
        assert_eq!(o.len(), 1);
        assert!(o[0]["inference"].get("config").is_none());
    }

    #[test]
    fn replicas_use_an_inference_set_when_enabled_and_are_refused_otherwise() {
        let mut m = gpu_vllm();
        m.spec.scaling.replicas = 3;
        let refused = KaitoProvider::default().check(&m).unwrap_err();
        assert!(refused.0.contains("scaling.replicas is 3"), "{refused}");
        assert!(refused.0.contains("inferencesets.kaito.sh"), "{refused}");
        let p = KaitoProvider {
            inference_set: true,
            instance_type: Some("Standard_NC24ads_A100_v4".into()),
        };
        assert!(p.check(&m).is_ok());
        let r = render_with(&p, &m);
        let o = objects(&r);
        assert_eq!(o[0]["kind"], "InferenceSet");
        assert_eq!(o[0]["spec"]["replicas"], 3);
        insta::assert_yaml_snapshot!(o);
    }

    #[test]
    fn every_override_key_warns() {
        let mut m = cpu_llamacpp();
        m.spec.provider = Some(
            serde_json::from_value(json!({
                "name": "kaito",
                "overrides": {"instanceType": "Standard_NC6", "resource": {"count": 2}},
            }))
            .unwrap(),
        );
        let r = render_with(&KaitoProvider::default(), &m);
        let messages: Vec<_> = r
            .warnings
            .iter()
            .map(|w| (w.reason.as_str(), w.message.as_str()))
            .collect();
        assert_eq!(
            messages,
            [
                (
                    "UnknownOverride",
                    "unknown override provider.overrides.instanceType is ignored"
                ),
                (
                    "UnknownOverride",
                    "unknown override provider.overrides.resource is ignored"
                ),
            ]
        );
        // Overrides change nothing in the objects.
        assert_eq!(
            objects(&r),
            objects(&render_with(&KaitoProvider::default(), &cpu_llamacpp()))
        );
        insta::assert_yaml_snapshot!(objects(&r));
    }

    #[test]
    fn llamacpp_needs_an_image() {
        let mut m = cpu_llamacpp();
        m.spec.image = None;
        let err = KaitoProvider::default()
            .render(&m, &api("kaito.sh_workspaces.yaml"))
            .unwrap_err();
        assert!(
            err.0
                .starts_with("spec.image is required for llamacpp on KAITO"),
            "{err}"
        );
    }

    #[test]
    fn llamacpp_pods_carry_metadata_env_tolerations_and_node_selector() {
        let mut m = cpu_llamacpp();
        m.metadata.uid = Some("u".into());
        m.spec = serde_json::from_value(json!({
            "model": {"id": "google/gemma-3-1b-it-qat-q8_0-gguf"},
            "engine": {"type": "llamacpp", "args": {"ggufUrl": "huggingface://google/gemma-3-1b-it-qat-q8_0-gguf/gemma-3-1b-it-q8_0.gguf", "threads": "4"}},
            "image": "ghcr.io/sozercan/llama-cpp-runner:latest",
            "resources": {"gpu": {"count": 1}},
            "env": [{"name": "A", "value": "1"}],
            "secrets": {"huggingFaceToken": "hf"},
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
            "podTemplate": {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "n"}}},
        })).unwrap();
        let o = objects(&render_with(&KaitoProvider::default(), &m));
        let t = &o[0]["inference"]["template"];
        assert_eq!(t["metadata"]["labels"]["team"], "a");
        assert_eq!(
            t["metadata"]["labels"]["kubeairunway.ai/model-deployment"],
            "gemma-cpu"
        );
        assert_eq!(t["metadata"]["annotations"]["note"], "n");
        assert_eq!(t["spec"]["nodeSelector"]["pool"], "gpu");
        assert_eq!(
            o[0]["resource"]["labelSelector"]["matchLabels"]["pool"],
            "gpu"
        );
        assert_eq!(t["spec"]["tolerations"][0]["key"], "sku");
        let c = &t["spec"]["containers"][0];
        assert_eq!(
            c["args"],
            json!([
                "huggingface://google/gemma-3-1b-it-qat-q8_0-gguf/gemma-3-1b-it-q8_0.gguf",
                "--address=:5000",
                "--threads",
                "4"
            ])
        );
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], 1);
        assert_eq!(c["env"][0]["name"], "A");
        assert_eq!(c["envFrom"][0]["secretRef"]["name"], "hf");
    }

    #[test]
    fn vllm_ignored_settings_warn() {
        let mut m = gpu_vllm();
        m.spec.image = Some("x".into());
        m.spec.tolerations = Some(vec![k8s_openapi::api::core::v1::Toleration::default()]);
        let r = render_with(&KaitoProvider::default(), &m);
        assert_eq!(r.warnings.len(), 2);
        assert!(r.warnings.iter().all(|w| w.reason == IGNORED_SETTING));
    }

    #[test]
    fn compatibility_messages_are_exact() {
        let p = KaitoProvider::default();
        let with = |spec: Value| {
            let mut v = serde_json::to_value(cpu_llamacpp()).unwrap();
            for (k, val) in spec.as_object().unwrap() {
                v["spec"][k] = val.clone();
            }
            p.check(&md(v)).map_err(|e| e.0)
        };
        assert_eq!(
            with(json!({"engine": {"type": "sglang"}})).unwrap_err(),
            "KAITO does not support sglang engine"
        );
        assert_eq!(
            with(json!({"engine": {"type": "trtllm"}})).unwrap_err(),
            "KAITO does not support trtllm engine"
        );
        assert_eq!(
            with(json!({"serving": {"mode": "disaggregated"}})).unwrap_err(),
            "KAITO does not support disaggregated mode"
        );
    }

    #[test]
    fn rendering_is_deterministic_and_fits_both_schemas() {
        let p = KaitoProvider {
            inference_set: false,
            instance_type: Some("Standard_NC6s_v3".into()),
        };
        for m in [cpu_llamacpp(), gpu_vllm()] {
            let a = serde_json::to_string(&objects(&render_with(&p, &m))).unwrap();
            let b = serde_json::to_string(&objects(&render_with(&p, &m))).unwrap();
            assert_eq!(a, b);
            for file in [
                "kaito.sh_workspaces.yaml",
                "kaito.sh_workspaces.v0.10.0.yaml",
            ] {
                let api = api(file);
                for o in objects(&p.render(&m, &api).unwrap()) {
                    if api.is_upstream_object(&o) {
                        assert!(
                            api.missing_paths(&o).is_empty(),
                            "{file}: {:?}",
                            api.missing_paths(&o)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn selection_rules_are_the_issue_s() {
        let c = KaitoProvider::default().config();
        let rules: Vec<_> = c
            .selection_rules
            .iter()
            .map(|r| (r.condition.as_str(), r.priority))
            .collect();
        assert_eq!(
            rules,
            [
                (
                    "!has(spec.resources) || !has(spec.resources.gpu) || spec.resources.gpu.count == 0",
                    100
                ),
                ("spec.engine.type == 'llamacpp'", 100),
            ]
        );
    }
}
