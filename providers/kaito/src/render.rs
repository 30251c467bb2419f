//! ModelDeployment -> KAITO objects.
//!
//! - One replica: a `kaito.sh/v1beta1` Workspace. Its fields sit at the top level
//!   (`resource`, `inference`); there is no `spec`.
//! - Other replica counts (when the InferenceSet CRD is enabled): a `kaito.sh/v1alpha1`
//!   InferenceSet with `spec.replicas` and the same `resource`/`inference` as its template,
//!   and a Service in front of its Workspaces' pods (KAITO creates none for the set).
//!   `resource.count` is never used for replicas: it is deprecated and counts the GPU
//!   nodes of one instance.
//! - vLLM runs as a KAITO preset named after the Hugging Face model id. The served model
//!   name, `contextLength` and `engine.args` go into the inference config ConfigMap KAITO
//!   reads (`inference.config`, key `inference_config.yaml`, section `vllm`), rendered as
//!   a supporting object: the SDK runtime applies it before the Workspace, whose admission
//!   KAITO's webhook refuses while the ConfigMap does not exist
//!   (docs/upstream.md#kaito-inference-config).
//! - llama.cpp runs the user's image (`spec.engine.image` or `spec.image`) from
//!   `inference.template`, serving on port 5000 (the port KAITO's Service targets), with
//!   `engine.args` and then `engine.extraArgs` on its command line.
//!
//! Every spec field KAITO cannot honour gives a [`Warning::unsupported_field`] naming it.
//!
//! Shared with the other providers through the SDK: vLLM's option names in the inference
//! config ([`kubeairunway_sdk::engine::VLLM`]: `served-model-name`, `max-model-len`,
//! `trust-remote-code`), the Hugging Face token Secret
//! ([`kubeairunway_sdk::engine::hf_token_secret`]: the preset's `modelAccessSecret`, the
//! llama.cpp template's `envFrom`), `spec.env`, and the GPUs of a replica
//! ([`kubeairunway_sdk::gpu::per_replica`]). Not shared, because KAITO's format differs:
//! - the llama.cpp template runs the user's image, a runner that takes the model as its
//!   first argument (`huggingface://<id>` or a GGUF URL) and `--address=:5000`, not
//!   `llama-server`: the SDK's llama.cpp flags and engine container do not apply;
//! - its storage mounts only volumes with both `claimName` and `mountPath` and always
//!   renders `readOnly`: where such an image keeps its model is its own business, so the
//!   SDK's default `/model-cache` and `LLAMA_CACHE` would mean nothing to it;
//! - no `/dev/shm` volume: KAITO builds the vLLM preset's pod itself, and one llama.cpp
//!   process shares no tensors with another.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kube::ResourceExt;
use kubeairunway_sdk::api::{DEFAULT_GPU_TYPE, EngineType, ModelDeployment, ModelSource};
use kubeairunway_sdk::engine::{self, VLLM};
use kubeairunway_sdk::gpu::{self, Role};
use kubeairunway_sdk::provider::{engine_flags, object};
use kubeairunway_sdk::render::{pod_annotations, pod_labels};
use kubeairunway_sdk::{RenderError, Rendered, ServingPods, UpstreamApi, Warning};
use serde_json::{Map, Value, json};

use crate::settings::{GROUP, KaitoProvider};

/// The Workspace annotation that selects KAITO's inference runtime.
pub const RUNTIME_ANNOTATION: &str = "kaito.sh/runtime";
/// The ConfigMap key KAITO reads its inference config from.
pub const CONFIG_KEY: &str = "inference_config.yaml";
/// The port a llama.cpp image must serve on: KAITO's Service `<name>:80` targets it
/// (`consts.PortInferenceServer`, pkg/workspace/manifests/manifests.go:77-86@v0.12.0).
pub const PORT: i32 = 5000;
/// The port of the Services in front of KAITO's pods (KAITO's own and ours).
pub const SERVICE_PORT: i32 = 80;
/// Name of the serving container in a llama.cpp template.
pub const CONTAINER: &str = "model";
/// `engine.args` key naming the GGUF file for llama.cpp instead of `huggingface://<id>`.
pub const GGUF_URL_ARG: &str = "ggufUrl";
/// Version of the InferenceSet API rendered (served by every KAITO release that has it).
pub const INFERENCE_SET_VERSION: &str = "v1alpha1";
/// Node labels selected when `spec.nodeSelector` is empty.
pub const DEFAULT_NODE_LABEL: (&str, &str) = ("kubernetes.io/os", "linux");
/// The label KAITO puts on the Workspaces of an InferenceSet and on their pods
/// (`consts.WorkspaceCreatedByInferenceSetLabel`, pkg/utils/consts/consts.go:205;
/// pkg/workspace/manifests/manifests.go:140-145 (presets) and 300-306 (templates)
/// @v0.12.0; the same at v0.10.0).
pub const CREATED_BY_INFERENCE_SET: &str = "inferenceset.kaito.sh/created-by";
/// The StatefulSet pod-index label (Kubernetes >= 1.28): the InferenceSet Service selects
/// the first pod of each Workspace, as KAITO's own Service selects `<workspace>-0`
/// (manifests.go:70-72@v0.12.0): in a multi-node Workspace only that pod serves.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// The ConfigMap name for `md`'s inference config.
pub fn config_map_name(md: &ModelDeployment) -> String {
    format!("{}-inference-config", md.name_any())
}

/// The Service in front of an InferenceSet's pods: `<name>-iset` (KAITO's own Service of a
/// Workspace is `<name>`, and a Workspace left from one replica may still hold it).
pub fn inference_set_service_name(md: &ModelDeployment) -> String {
    let name = md.name_any();
    let stem: String = name.chars().take(58).collect();
    format!("{}-iset", stem.trim_end_matches('-'))
}

/// A warning for a spec field KAITO cannot honour.
fn unsupported(field: &str, why: &str) -> Warning {
    Warning::unsupported_field(field, why)
}

/// Render the objects for `md`: the Workspace (or InferenceSet) first, then what it
/// depends on: the inference config ConfigMap (vLLM), the InferenceSet's Service.
pub fn render(
    provider: &KaitoProvider,
    md: &ModelDeployment,
    upstream: &UpstreamApi,
) -> Result<Rendered, RenderError> {
    let mut warnings = unsupported_everywhere(md);
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
    if let Some(instance_type) = provider.nodes.instance_type(md).map_err(RenderError)? {
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
    let mut objects = Vec::new();
    let workspace = !uses_inference_set(provider, md);
    if workspace {
        resource.insert("labelSelector".into(), selector);
        objects.push(object(json!({
            "apiVersion": upstream.api_version(),
            "kind": "Workspace",
            "metadata": metadata,
            "resource": resource,
            "inference": inference,
        }))?);
        objects.extend(config_map);
    } else {
        let mut template = Map::new();
        template.insert("inference".into(), inference);
        if !resource.is_empty() {
            template.insert("resource".into(), Value::Object(resource));
        }
        objects.push(object(json!({
            "apiVersion": format!("{GROUP}/{INFERENCE_SET_VERSION}"),
            "kind": "InferenceSet",
            "metadata": metadata,
            "spec": {
                "replicas": md.spec.scaling.replicas,
                "labelSelector": selector,
                "template": template,
            },
        }))?);
        objects.extend(config_map);
        objects.push(inference_set_service(md)?);
    }
    Ok(Rendered { objects, warnings })
}

/// Whether `md` is rendered as an InferenceSet (more than one replica, when enabled)
/// rather than a Workspace.
pub fn uses_inference_set(provider: &KaitoProvider, md: &ModelDeployment) -> bool {
    md.spec.scaling.replicas != 1 && provider.inference_set
}

/// The pods that serve `md`, on [`PORT`]: the first pod of each Workspace, as the Services
/// in front of them select (the InferenceSet's below; KAITO's own of a Workspace selects
/// `kaito.sh/workspace` and pod `<workspace>-0`, pkg/workspace/manifests/manifests.go
/// :64-72). A vLLM preset runs as a StatefulSet (pkg/workspace/inference/
/// preset_inferences.go:256), whose pods carry the pod-index label; a llama.cpp template
/// as a Deployment of one pod, labelled `kaito.sh/workspace` (manifests.go:293), all
/// @v0.12.0.
pub fn serving_pods(provider: &KaitoProvider, md: &ModelDeployment) -> ServingPods {
    let name = md.name_any();
    let pods = if uses_inference_set(provider, md) {
        ServingPods::labelled([(CREATED_BY_INFERENCE_SET, name.as_str())])
    } else {
        ServingPods::labelled([(WORKSPACE_LABEL, name.as_str())])
    };
    let first_pod_only =
        uses_inference_set(provider, md) || md.spec.engine.type_ != Some(EngineType::Llamacpp);
    let pods = if first_pod_only {
        pods.label(POD_INDEX_LABEL, "0")
    } else {
        pods
    };
    pods.on_port(PORT)
}

/// The label KAITO puts on a Workspace's pods (`LabelWorkspaceName`,
/// api/v1beta1/labels.go:38@v0.12.0).
pub const WORKSPACE_LABEL: &str = "kaito.sh/workspace";

/// The Service `<name>-iset`, port 80 to 5000, in front of the first pod of every
/// Workspace of the InferenceSet: KAITO gives each Workspace a Service of its own
/// (generated names) and none to the set (pkg/inferenceset/inferenceset_controller.go
/// @v0.12.0 creates only Workspaces, and Gateway API resources behind a feature gate).
fn inference_set_service(md: &ModelDeployment) -> Result<kube::api::DynamicObject, RenderError> {
    object(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": inference_set_service_name(md)},
        "spec": {
            "type": "ClusterIP",
            "selector": {
                CREATED_BY_INFERENCE_SET: md.name_any(),
                POD_INDEX_LABEL: "0",
            },
            "ports": [{"name": "http", "protocol": "TCP", "port": SERVICE_PORT, "targetPort": PORT}],
        },
    }))
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

/// Fields no KAITO rendering serves, whatever the engine.
fn unsupported_everywhere(md: &ModelDeployment) -> Vec<Warning> {
    let spec = &md.spec;
    let mut out = Vec::new();
    if spec.serving.mode == kubeairunway_sdk::api::ServingMode::Aggregated {
        for (field, set) in [
            ("spec.scaling.prefill", spec.scaling.prefill.is_some()),
            ("spec.scaling.decode", spec.scaling.decode.is_some()),
        ] {
            if set {
                out.push(unsupported(
                    field,
                    "it applies to disaggregated serving only, and KAITO serves aggregated",
                ));
            }
        }
    }
    out
}

/// vLLM: the preset named after the model id, and the inference config it reads.
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
    warnings.extend(vllm_unsupported(md));
    warnings.extend(vllm_engine_fields(md));
    let mut preset = json!({ "name": id });
    if let Some(secret) = engine::hf_token_secret(md) {
        preset["presetOptions"] = json!({ "modelAccessSecret": secret });
    }
    let cm_name = config_map_name(md);
    let config_map = object(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": cm_name},
        "data": { CONFIG_KEY: inference_config(md, warnings) },
    }))?;
    Ok((
        json!({ "preset": preset, "config": cm_name }),
        Some(config_map),
    ))
}

/// What KAITO's vLLM preset cannot take: it has no pod template (the operator builds the
/// pod, pkg/workspace/inference/preset_inferences.go@v0.12.0), no volumes for the model
/// (`inference.preset` has only `name`, `accessMode` and `presetOptions` in the v1beta1
/// CRD@v0.12.0), and it sizes the pod from the node's GPUs.
fn vllm_unsupported(md: &ModelDeployment) -> Vec<Warning> {
    let spec = &md.spec;
    let no_pod = "KAITO builds the vLLM preset's pod itself and takes no pod settings";
    let mut out = Vec::new();
    let mut warn = |field: &str, set: bool, why: &str| {
        if set {
            out.push(unsupported(field, why));
        }
    };
    // One setting under two names: each name set is named.
    for (field, image) in [
        ("spec.image", &spec.image),
        ("spec.engine.image", &spec.engine.image),
    ] {
        warn(
            field,
            image.is_some(),
            "KAITO runs vLLM from its own preset image",
        );
    }
    warn(
        "spec.env",
        spec.env.as_ref().is_some_and(|e| !e.is_empty()),
        no_pod,
    );
    warn(
        "spec.tolerations",
        spec.tolerations.as_ref().is_some_and(|t| !t.is_empty()),
        "KAITO's vLLM preset pods take no tolerations (nodes are chosen by spec.nodeSelector)",
    );
    warn(
        "spec.podTemplate.metadata",
        spec.pod_template
            .as_ref()
            .and_then(|t| t.metadata.as_ref())
            .is_some(),
        no_pod,
    );
    warn(
        "spec.model.storage",
        spec.model.storage.is_some(),
        "a KAITO preset downloads the model into its own volume and mounts none of ours",
    );
    warn(
        "spec.kernelCache",
        spec.kernel_cache.is_some(),
        "KAITO's preset pods do not carry the kubeairunway.ai/model-deployment label the \
         kernel-cache webhook finds serving pods by",
    );
    let resources = spec.resources.as_ref();
    warn(
        "spec.resources.memory",
        resources.and_then(|r| r.memory.as_ref()).is_some(),
        "KAITO sizes the vLLM preset's pod from its node",
    );
    warn(
        "spec.resources.cpu",
        resources.and_then(|r| r.cpu.as_ref()).is_some(),
        "KAITO sizes the vLLM preset's pod from its node",
    );
    warn(
        "spec.resources.gpu.type",
        gpu::spec_of(spec, Role::Aggregated)
            .is_some_and(|g| gpu::resource_name(g) != DEFAULT_GPU_TYPE),
        "KAITO's vLLM presets request nvidia.com/gpu",
    );
    out
}

/// The engine fields KAITO's vLLM cannot be given: its inference config passes each key
/// as `--key value` (see [`inference_config`]), so vLLM's boolean flags
/// (`--enable-prefix-caching`, `--no-enable-prefix-caching`, `--enforce-eager`) cannot be
/// passed, nor can raw arguments. What vLLM does by default is honoured without a flag:
/// prefix caching on, eager off ([`VLLM`]'s toggles; KAITO v0.12.0 pins vLLM 0.25.1,
/// `presets/workspace/dependencies/requirements.txt:4`, whose defaults are
/// `vllm/config/cache.py:93` and `vllm/config/model.py:215@v0.25.1`, and its presets pass
/// neither flag, `presets/workspace/models/vllm_model.go:178-225@v0.12.0`).
fn vllm_engine_fields(md: &ModelDeployment) -> Vec<Warning> {
    let engine = &md.spec.engine;
    let no_bare = "KAITO passes each vLLM option as `--key value` and cannot pass vLLM's \
                   boolean flag for it";
    let mut out = Vec::new();
    for (field, toggle, value) in [
        (
            "spec.engine.enablePrefixCaching",
            &VLLM.prefix_caching,
            engine.enable_prefix_caching,
        ),
        (
            "spec.engine.enforceEager",
            &VLLM.eager,
            engine.enforce_eager.filter(|eager| *eager),
        ),
    ] {
        if value.is_some_and(|v| toggle.default != Some(v)) {
            out.push(unsupported(field, no_bare));
        }
    }
    if engine.extra_args.as_ref().is_some_and(|a| !a.is_empty()) {
        out.push(unsupported(
            "spec.engine.extraArgs",
            "KAITO passes vLLM options from its inference config, a map of `--key value` \
             pairs, which cannot carry raw arguments faithfully (bare, repeated or \
             positional ones); set them in spec.engine.args",
        ));
    }
    out
}

/// The `inference_config.yaml` text for vLLM. KAITO's vLLM wrapper appends each key of
/// the `vllm` section to the command line it builds as `--key str(value)`
/// (presets/workspace/inference/vllm/inference_api.py:143-145@v0.12.0), after its own
/// flags, so these win over KAITO's defaults (its own test overrides `max-model-len` and
/// `served-model-name` this way, tests/test_vllm_inference_api.py:70-88@v0.12.0).
///
/// - `served-model-name`: `model.servedName`, else an `engine.args` value, else the
///   basename of `model.id` (the platform's served name; KAITO's own default is the
///   preset name, or the InferenceSet's name, pkg/model/interface.go:403-413@v0.12.0).
/// - `max-model-len`: `engine.contextLength`, as a bare integer (KAITO's node estimator
///   parses it with `strconv.Atoi`, pkg/utils/config_parser.go:23-50@v0.12.0; its webhook
///   refuses more than the model's token limit).
/// - `engine.args` as given, except bare flags (value `"true"`): `--key True` would leave
///   a stray `True` for vLLM's positional `model_tag` (a boolean flag takes no value), and
///   two of them fail vLLM's argument parser, so they are refused with a warning. Among
///   them `trust-remote-code`: KAITO's presets pass `--trust-remote-code` already
///   (presets/workspace/models/vllm_model.go:196-199@v0.12.0, :197-199@v0.10.0), which is
///   also why `engine.trustRemoteCode` renders nothing.
///
/// Values are YAML scalars the webhook can read as strings (`map[string]string`,
/// inference_config_validation.go:35-37@v0.12.0).
pub fn inference_config(md: &ModelDeployment, warnings: &mut Vec<Warning>) -> String {
    let engine = &md.spec.engine;
    let key_of = |flag: &str| flag.trim_start_matches("--").to_string();
    let (context_key, served_key) = (key_of(VLLM.context_length), VLLM.served_name.map(key_of));
    let trust_key = VLLM.trust_remote_code.map(key_of);
    let mut entries: BTreeMap<String, Value> = BTreeMap::new();
    for (key, value) in engine.args.iter().flatten() {
        let key = key_of(key);
        if value == "true" {
            let why = if trust_key.as_ref() == Some(&key) {
                "KAITO's vLLM presets always pass --trust-remote-code"
            } else {
                "KAITO passes each vLLM option as `--key value` and cannot pass a bare flag"
            };
            warnings.push(unsupported(&format!("spec.engine.args.{key}"), why));
            continue;
        }
        entries.insert(key, Value::String(value.clone()));
    }
    if let Some(len) = engine.context_length {
        entries.insert(context_key, json!(len));
    }
    let explicit = md
        .spec
        .model
        .served_name
        .as_deref()
        .filter(|s| !s.is_empty());
    if let Some(served_key) = served_key
        && (explicit.is_some() || !entries.contains_key(&served_key))
        && let Some(served) = md.spec.served_model_name()
    {
        entries.insert(served_key, json!(served));
    }
    let mut text = format!(
        "# Written by kubeairunway for ModelDeployment {}; KAITO passes each vllm key to vLLM as --key value.\nvllm:\n",
        md.name_any()
    );
    for (key, value) in entries {
        // JSON scalars are YAML scalars: strings come out quoted, numbers bare.
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
    text
}

/// llama.cpp: the user's image in `inference.template`, serving on port 5000. KAITO
/// replaces the template's affinity with one from `resource.labelSelector` and appends
/// its own tolerations (pkg/workspace/manifests/manifests.go:277-342@v0.12.0).
fn llamacpp(md: &ModelDeployment, warnings: &mut Vec<Warning>) -> Result<Value, RenderError> {
    let spec = &md.spec;
    let image = spec.effective_image().ok_or_else(|| {
        RenderError(
            "spec.engine.image (or spec.image) is required for llamacpp on KAITO: a llama.cpp server image that serves on port 5000 \
             (for example ghcr.io/sozercan/llama-cpp-runner:latest)"
                .into(),
        )
    })?;
    let extra_args = engine::extra_args(md)?;
    let image_flags = "a llama.cpp image's own flags are not known to the provider; set the \
                       image's flag in spec.engine.args or spec.engine.extraArgs";
    if spec.engine.enable_prefix_caching.is_some() {
        warnings.push(unsupported("spec.engine.enablePrefixCaching", image_flags));
    }
    if spec.engine.enforce_eager == Some(true) {
        warnings.push(unsupported("spec.engine.enforceEager", image_flags));
    }
    if spec.engine.context_length.is_some() {
        warnings.push(unsupported(
            "spec.engine.contextLength",
            "llama.cpp images take no common context-length flag; set the image's own flag in engine.args",
        ));
    }
    if spec.engine.trust_remote_code {
        warnings.push(unsupported(
            "spec.engine.trustRemoteCode",
            "it has no meaning for llama.cpp",
        ));
    }
    if spec
        .model
        .served_name
        .as_deref()
        .is_some_and(|s| !s.is_empty())
    {
        warnings.push(unsupported(
            "spec.model.servedName",
            "llama.cpp images name the served model themselves",
        ));
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
    args.extend(extra_args);

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
    let env = engine::user_env(md)?;
    if !env.is_empty() {
        container["env"] = Value::Array(env);
    }
    if let Some(env_from) = engine::hf_token_env_from(md) {
        container["envFrom"] = env_from;
    }
    let (volumes, mounts) = storage(md, warnings);
    if !mounts.is_empty() {
        container["volumeMounts"] = Value::Array(mounts);
    }
    let mut pod_spec = json!({ "containers": [container] });
    if !volumes.is_empty() {
        pod_spec["volumes"] = Value::Array(volumes);
    }
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

/// `model.storage` for a llama.cpp template: each volume with an existing claim
/// (`claimName`) and a `mountPath` is mounted into the container. A volume without a
/// claim (one the controller would create) or without a mount path (where a llama.cpp
/// image keeps its model is the image's own business) is ignored with a warning.
fn storage(md: &ModelDeployment, warnings: &mut Vec<Warning>) -> (Vec<Value>, Vec<Value>) {
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let all = md
        .spec
        .model
        .storage
        .as_ref()
        .and_then(|s| s.volumes.as_ref());
    for v in all.into_iter().flatten() {
        let field = format!("spec.model.storage.volumes[{}]", v.name);
        let claim = v.claim_name.as_deref().filter(|c| !c.is_empty());
        let path = v.mount_path.as_deref().filter(|p| !p.is_empty());
        match (claim, path) {
            (Some(claim), Some(path)) => {
                volumes.push(json!({
                    "name": v.name,
                    "persistentVolumeClaim": {"claimName": claim, "readOnly": v.read_only},
                }));
                mounts.push(json!({"name": v.name, "mountPath": path, "readOnly": v.read_only}));
            }
            (None, _) => warnings.push(unsupported(
                &field,
                "the KAITO provider mounts existing claims (claimName) and creates none",
            )),
            (Some(_), None) => warnings.push(unsupported(
                &field,
                "a llama.cpp image's model directory is its own: set mountPath",
            )),
        }
    }
    (volumes, mounts)
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
    let gpus = gpu::per_replica(&md.spec, Role::Aggregated);
    if gpus.count > 0 {
        requests.insert(gpus.resource.clone(), json!(gpus.count));
        out.insert("limits".into(), json!({ gpus.resource: gpus.count }));
    }
    if !requests.is_empty() {
        out.insert("requests".into(), Value::Object(requests));
    }
    out
}

#[cfg(test)]
mod tests;
