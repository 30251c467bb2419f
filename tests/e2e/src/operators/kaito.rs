//! KAITO's workspace operator as the tests play it: its validating webhooks on the fields
//! the KAITO provider renders, its defaulting, and the status its controllers write.
//! Read at KAITO v0.12.0 (`0894eb2b`, the release of the Workspace CRD fixture) and
//! v0.10.0 (`c673cadc`); `file:line` below is v0.12.0 unless marked.
//!
//! Admission (knative validation webhooks `validation.workspace.kaito.sh` and
//! `validation.inferenceset.kaito.sh`, pkg/workspace/webhooks/webhooks.go:60-98; they
//! validate CREATE and UPDATE). A refusal reads as the API server words a webhook denial:
//! `admission webhook "<name>" denied the request: validation failed: <message>: <path>`
//! (knative `FieldError` prints `message: paths`).
//!
//! Defaulting: `Workspace.SetDefaults` does nothing (api/v1beta1/workspace_default.go);
//! the API server applies the CRD defaults (`resource.count: 1`,
//! `inference.preset.accessMode: public`), which the test API server does itself.
//!
//! Status: [`workspace_pending`], [`workspace_ready`], [`workspace_failed`] and
//! [`inference_set_status`] are what the controllers write.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::{Value, json};

/// The Workspace webhook's name.
pub const WORKSPACE_WEBHOOK: &str = "validation.workspace.kaito.sh";
/// The InferenceSet webhook's name.
pub const INFERENCE_SET_WEBHOOK: &str = "validation.inferenceset.kaito.sh";
/// The label KAITO puts on an InferenceSet's Workspaces and their pods
/// (pkg/utils/consts/consts.go:205).
pub const CREATED_BY_INFERENCE_SET: &str = "inferenceset.kaito.sh/created-by";

/// How KAITO gets nodes: `--node-provisioner` (cmd/workspace/main.go:131,173-187), which
/// sets the `disableNodeAutoProvisioning` feature gate the Workspace webhook reads
/// (`byo` sets it true). KAITO v0.10 has only the gate (cmd/workspace/main.go:107@v0.10.0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeProvisioner {
    /// `azure-gpu-provisioner`, KAITO's default: node auto-provisioning.
    AzureGpu,
    /// `karpenter`: node auto-provisioning.
    Karpenter,
    /// `byo`: bring-your-own nodes.
    Byo,
}

impl NodeProvisioner {
    fn auto_provisioning(self) -> bool {
        self != NodeProvisioner::Byo
    }
}

/// What KAITO's webhook can see of the cluster when it judges an object.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// The operator's node provisioner.
    pub node_provisioner: NodeProvisioner,
    /// ConfigMaps by (namespace, name): their `data`.
    pub config_maps: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// The labels of each node (read with bring-your-own nodes).
    pub nodes: Vec<BTreeMap<String, String>>,
    /// `ModelTokenLimit` of presets KAITO knows, by lowercase preset name.
    pub token_limits: BTreeMap<String, i64>,
}

impl Cluster {
    /// A cluster with this node provisioner and nothing else.
    pub fn new(node_provisioner: NodeProvisioner) -> Self {
        Self {
            node_provisioner,
            config_maps: BTreeMap::new(),
            nodes: Vec::new(),
            token_limits: BTreeMap::new(),
        }
    }

    /// Record a ConfigMap as the webhook's client would see it.
    pub fn put_config_map(&mut self, ns: &str, name: &str, data: BTreeMap<String, String>) {
        self.config_maps
            .insert((ns.to_string(), name.to_string()), data);
    }
}

/// A webhook's refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The webhook's name.
    pub webhook: &'static str,
    /// `message: path` as knative prints a `FieldError`.
    pub message: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "admission webhook \"{}\" denied the request: validation failed: {}",
            self.webhook, self.message
        )
    }
}

fn refuse<T>(webhook: &'static str, message: &str, path: &str) -> Result<T, Refusal> {
    Err(Refusal {
        webhook,
        message: format!("{message}: {path}"),
    })
}

fn ws_refuse<T>(message: &str, path: &str) -> Result<T, Refusal> {
    refuse(WORKSPACE_WEBHOOK, message, path)
}

/// `validation.IsDNS1123Label`.
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, k| v.get(*k))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The Workspace webhook: `old` is `None` on CREATE.
pub fn admit_workspace(old: Option<&Value>, ws: &Value, cluster: &Cluster) -> Result<(), Refusal> {
    // workspace_validation.go:70-73
    let name = str_at(ws, &["metadata", "name"]);
    if !is_dns_label(name) {
        return ws_refuse(&format!("invalid value: {name}"), "name");
    }
    match old {
        None => admit_workspace_create(ws, cluster),
        Some(old) => admit_workspace_update(old, ws, cluster),
    }
}

/// `Workspace.ValidateCreate` (workspace_validation.go:105-134), in its order.
pub fn admit_workspace_create(ws: &Value, cluster: &Cluster) -> Result<(), Refusal> {
    let inference = ws.get("inference").filter(|v| !v.is_null());
    let tuning = ws.get("tuning").filter(|v| !v.is_null());
    // validateCreate, :164-184
    match (inference, tuning) {
        (None, None) => {
            return ws_refuse(
                "Either Inference or Tuning must be specified, not neither",
                "",
            );
        }
        (Some(_), Some(_)) => {
            return ws_refuse(
                "Either Inference or Tuning must be specified, but not both",
                "",
            );
        }
        _ => {}
    }
    let instance_type = str_at(ws, &["resource", "instanceType"]);
    if cluster.node_provisioner.auto_provisioning() {
        if instance_type.is_empty() {
            return ws_refuse(
                "missing field(s)",
                "spec.instanceType is required when node auto-provisioning is enabled, spec.resource.instanceType",
            );
        }
    } else if !instance_type.is_empty() {
        return ws_refuse(
            "invalid value: instanceType must be empty when node auto-provisioning is disabled (BYO scenario)",
            "spec.resource.instanceType",
        );
    }
    let Some(inference) = inference else {
        return Ok(());
    };
    resource_with_inference(ws, inference, cluster)?;
    inference_create(inference)?;
    inference_config(ws, cluster)
}

/// `ResourceSpec.validateCreateWithInference` (workspace_validation.go:474-629), the rules
/// that touch what the provider renders.
fn resource_with_inference(
    ws: &Value,
    inference: &Value,
    cluster: &Cluster,
) -> Result<(), Refusal> {
    let selector = &ws["resource"]["labelSelector"];
    let match_labels: BTreeMap<String, String> = selector
        .get("matchLabels")
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .unwrap_or_default();
    // :524-533: an all-reserved selector is refused (api/v1beta1/labels.go:218-230).
    let reserved = [
        "kaito.sh/workspace",
        "kaito.sh/ragengine",
        "kaito.sh/workspacenamespace",
        "kaito.sh/ragenginenamespace",
    ];
    let usable: BTreeMap<_, _> = match_labels
        .iter()
        .filter(|(k, _)| !reserved.contains(&k.as_str()))
        .collect();
    if !match_labels.is_empty() && usable.is_empty() {
        return ws_refuse(
            "invalid value: matchLabels must contain at least one non-reserved label",
            "resource.labelSelector.matchLabels",
        );
    }
    let preset = inference.get("preset").filter(|p| !p.is_null());
    if cluster.node_provisioner.auto_provisioning() {
        // :609-628: the SKU must be known; on Azure any Standard_N*/Standard_D* passes.
        let it = str_at(ws, &["resource", "instanceType"]);
        if !(it.starts_with("Standard_N") || it.starts_with("Standard_D")) {
            return ws_refuse(
                &format!("invalid value: Unsupported instance type {it}. Supported SKUs: ..."),
                "resource.instanceType",
            );
        }
    } else if preset.is_some() {
        // :550-602: the nodes the selector matches must exist and carry NVIDIA GPU
        // Feature Discovery labels (pkg/sku/helpers.go:75-82).
        let matching: Vec<_> = cluster
            .nodes
            .iter()
            .filter(|n| usable.iter().all(|(k, v)| n.get(*k) == Some(*v)))
            .collect();
        if matching.is_empty() {
            return ws_refuse("No nodes found matching the specified label selector", "");
        }
        for node in matching {
            let has = |k: &str| node.contains_key(k);
            if !(has("nvidia.com/gpu.product")
                && has("nvidia.com/gpu.count")
                && has("nvidia.com/gpu.memory"))
            {
                return ws_refuse(
                    "Failed to get GPU config from nvidia labels on node: missing required nvidia.com labels",
                    "",
                );
            }
        }
    }
    Ok(())
}

/// `InferenceSpec.validateCreate` (workspace_validation.go:825-887): preset or template,
/// not both; a preset name KAITO knows (any Hugging Face id, `org/model`, is generated,
/// presets/workspace/models/vllm_model.go:129-149).
fn inference_create(inference: &Value) -> Result<(), Refusal> {
    let preset = inference.get("preset").filter(|p| !p.is_null());
    let template = inference.get("template").filter(|p| !p.is_null());
    match (preset, template) {
        (None, None) => ws_refuse(
            "missing field(s)",
            "inference.Preset or Template must be specified",
        ),
        (Some(_), Some(_)) => ws_refuse(
            "Preset and Template cannot be set at the same time",
            "inference",
        ),
        (Some(p), None) if !str_at(p, &["name"]).contains('/') => ws_refuse(
            &format!(
                "invalid value: Unsupported inference preset name {}",
                str_at(p, &["name"])
            ),
            "inference.presetName",
        ),
        _ => Ok(()),
    }
}

/// `GetWorkspaceRuntimeName` (api/v1beta1/labels.go:118-137): vLLM unless the annotation
/// says `transformers`.
fn runtime_is_vllm(ws: &Value) -> bool {
    str_at(ws, &["metadata", "annotations", "kaito.sh/runtime"]) != "transformers"
}

/// `validateInferenceConfig` (api/v1beta1/inference_config_validation.go:40-116): for
/// the vLLM runtime, the ConfigMap named by `inference.config` must exist in the
/// Workspace's namespace, hold `inference_config.yaml`, parse with its `vllm` section as
/// `map[string]string`, and any `max-model-len` must not exceed the preset's
/// `ModelTokenLimit`.
fn inference_config(ws: &Value, cluster: &Cluster) -> Result<(), Refusal> {
    if !runtime_is_vllm(ws) {
        return Ok(());
    }
    let name = str_at(ws, &["inference", "config"]);
    if name.is_empty() {
        return Ok(());
    }
    let ns = str_at(ws, &["metadata", "namespace"]);
    let Some(data) = cluster.config_maps.get(&(ns.to_string(), name.to_string())) else {
        return ws_refuse(
            &format!("ConfigMap '{name}' specified in 'config' not found in namespace '{ns}'"),
            "config",
        );
    };
    let Some(text) = data.get("inference_config.yaml") else {
        return ws_refuse("missing field(s)", "inference_config.yaml in ConfigMap");
    };
    let vllm = parse_vllm_section(text).or_else(|e| {
        ws_refuse(
            &format!("Failed to parse inference_config.yaml: {e}"),
            "inference_config.yaml",
        )
    })?;
    if let Some(raw) = vllm.get("max-model-len").filter(|v| !v.trim().is_empty()) {
        let preset = str_at(ws, &["inference", "preset", "name"]).to_lowercase();
        if let Some(limit) = cluster.token_limits.get(&preset) {
            let Ok(value) = raw.trim().parse::<i64>() else {
                return ws_refuse(
                    &format!("invalid value: max-model-len must be an integer: {raw}"),
                    "max-model-len",
                );
            };
            if value > *limit {
                return ws_refuse(
                    &format!(
                        "invalid value: max-model-len {value} exceeds model's maximum supported context window {limit} (ModelTokenLimit)"
                    ),
                    "max-model-len",
                );
            }
        }
    }
    Ok(())
}

/// The `vllm` section as gopkg.in/yaml.v2 fills `map[string]string`: every scalar reads
/// as its text; a mapping or sequence value fails.
pub fn parse_vllm_section(text: &str) -> Result<BTreeMap<String, String>, String> {
    let doc: Value = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    let section = match doc.get("vllm") {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Object(m)) => m,
        Some(other) => return Err(format!("vllm is not a mapping: {other}")),
    };
    for (key, value) in section {
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => String::new(),
            other => return Err(format!("cannot unmarshal {other} into string for {key}")),
        };
        out.insert(key.clone(), text);
    }
    Ok(out)
}

/// The Workspace webhook on UPDATE (workspace_validation.go:79-98): inference cannot be
/// toggled (:237-246); `resource` (:780-823): count, instanceType and labelSelector
/// immutable; `inference` (:889-915): preset immutable (compared whole), template cannot
/// be set or unset.
pub fn admit_workspace_update(old: &Value, ws: &Value, cluster: &Cluster) -> Result<(), Refusal> {
    let present = |v: &Value, k: &str| v.get(k).is_some_and(|x| !x.is_null());
    if present(old, "inference") != present(ws, "inference") {
        return ws_refuse(
            "Inference field cannot be toggled once set",
            "spec.inference",
        );
    }
    let (r, o) = (&ws["resource"], &old["resource"]);
    if !r["count"].is_null() && !o["count"].is_null() && r["count"] != o["count"] {
        return ws_refuse("field is immutable", "resource.count");
    }
    let (it, old_it) = (str_at(r, &["instanceType"]), str_at(o, &["instanceType"]));
    if cluster.node_provisioner.auto_provisioning() {
        if it.is_empty() {
            return ws_refuse(
                "missing field(s)",
                "resource.instanceType is required when node auto-provisioning is enabled, resource.instanceType",
            );
        }
        if !old_it.is_empty() && old_it != it {
            return ws_refuse(
                "instanceType cannot be changed once set when node auto-provisioning is enabled",
                "resource.instanceType",
            );
        }
    } else if old_it.is_empty() && !it.is_empty() {
        return ws_refuse(
            "invalid value: instanceType must be empty when node auto-provisioning is disabled (BYO scenario)",
            "resource.instanceType",
        );
    } else if !old_it.is_empty() && !it.is_empty() && old_it != it {
        return ws_refuse(
            "invalid value: instanceType cannot be changed once set",
            "resource.instanceType",
        );
    }
    if r["labelSelector"]["matchLabels"] != o["labelSelector"]["matchLabels"] {
        return ws_refuse("field is immutable", "resource.labelSelector");
    }
    let (i, oi) = (&ws["inference"], &old["inference"]);
    if i["preset"] != oi["preset"] {
        return ws_refuse("field is immutable", "inference.preset");
    }
    if present(i, "template") != present(oi, "template") {
        return ws_refuse(
            "field cannot be unset/set if it was set/unset",
            "inference.template",
        );
    }
    Ok(())
}

/// The InferenceSet webhook (api/v1alpha1/inferenceset_validation.go:37-112): a DNS-1123
/// label name; on CREATE non-negative replicas (v0.10.0: at least 1, :56@v0.10.0); on
/// both, `template.resource.instanceType` required with auto-provisioning and empty with
/// bring-your-own nodes (:92-112; not at v0.10.0).
pub fn admit_inference_set(
    old: Option<&Value>,
    is: &Value,
    cluster: &Cluster,
) -> Result<(), Refusal> {
    let name = str_at(is, &["metadata", "name"]);
    if !is_dns_label(name) {
        return refuse(
            INFERENCE_SET_WEBHOOK,
            &format!("invalid value: {name}"),
            "name",
        );
    }
    if old.is_none() && is["spec"]["replicas"].as_i64().is_some_and(|r| r < 0) {
        return refuse(
            INFERENCE_SET_WEBHOOK,
            "invalid value: must be non-negative",
            "spec.replicas",
        );
    }
    let it = str_at(is, &["spec", "template", "resource", "instanceType"]);
    match (cluster.node_provisioner.auto_provisioning(), it.is_empty()) {
        (true, true) => refuse(
            INFERENCE_SET_WEBHOOK,
            "missing field(s)",
            "spec.template.resource.instanceType",
        ),
        (false, false) => refuse(
            INFERENCE_SET_WEBHOOK,
            &format!("invalid value: {it}: instanceType must be empty when nodeProvisioner is byo"),
            "spec.template.resource.instanceType",
        ),
        _ => Ok(()),
    }
}

/// The Workspace an InferenceSet's controller creates for one replica
/// (`NewWorkspaceForInferenceSet`, pkg/utils/inferenceset/inferenceset.go:140-180): named
/// `<set>-<suffix>`, labelled `inferenceset.kaito.sh/created-by`, with the set's selector,
/// its template's inference, and its instance type unless nodes are bring-your-own.
pub fn workspace_for_inference_set(is: &Value, suffix: &str, cluster: &Cluster) -> Value {
    let name = str_at(is, &["metadata", "name"]);
    let mut resource = json!({"labelSelector": is["spec"]["labelSelector"]});
    let it = str_at(is, &["spec", "template", "resource", "instanceType"]);
    if cluster.node_provisioner.auto_provisioning() && !it.is_empty() {
        resource["instanceType"] = json!(it);
    }
    json!({
        "apiVersion": "kaito.sh/v1beta1", "kind": "Workspace",
        "metadata": {
            "name": format!("{name}-{suffix}"),
            "namespace": is["metadata"]["namespace"],
            "labels": {CREATED_BY_INFERENCE_SET: name},
            "annotations": is["metadata"].get("annotations").cloned().unwrap_or(json!({})),
        },
        "resource": resource,
        "inference": is["spec"]["template"]["inference"],
    })
}

/// Admission as the webhook sees a stream of objects: the first sight of an object (by
/// UID) is its CREATE, a later change of its spec an UPDATE against the last admitted.
#[derive(Debug, Default)]
pub struct Admission {
    admitted: HashMap<String, Value>,
}

impl Admission {
    /// Judge `object` (a Workspace or an InferenceSet) as the webhook would have.
    pub fn judge(&mut self, object: &Value, cluster: &Cluster) -> Result<(), Refusal> {
        let uid = str_at(object, &["metadata", "uid"]).to_string();
        let old = self.admitted.get(&uid);
        if old.is_some_and(|o| spec_of(o) == spec_of(object)) {
            return Ok(());
        }
        let verdict = match str_at(object, &["kind"]) {
            "InferenceSet" => admit_inference_set(old, object, cluster),
            _ => admit_workspace(old, object, cluster),
        };
        if verdict.is_ok() {
            self.admitted.insert(uid, object.clone());
        }
        verdict
    }
}

fn spec_of(v: &Value) -> Value {
    json!([
        v["resource"],
        v["inference"],
        v["spec"],
        v["metadata"]["annotations"]
    ])
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// A Workspace waiting for its inference workload: `applyInferenceWorkspaceStatus`
/// (workspace_controller.go:1290-1304) before the workload was ever ready.
pub fn workspace_pending() -> Value {
    json!({"state": "Pending", "conditions": [
        condition("InferenceReady", "False", "WorkspaceInferenceStatusPending", "Inference workload is not ready"),
        condition("WorkspaceSucceeded", "False", "workspacePending", "workspace is waiting for inference workload readiness"),
    ]})
}

/// A ready Workspace (workspace_controller.go:1270-1287).
pub fn workspace_ready() -> Value {
    json!({"state": "Ready", "conditions": [
        condition("ResourceReady", "True", "workspaceResourceStatusSuccess", "workspace resource is ready"),
        condition("InferenceReady", "True", "WorkspaceInferenceStatusSuccess", "Inference has been deployed successfully"),
        condition("WorkspaceSucceeded", "True", "workspaceSucceeded", "workspace succeeds"),
    ]})
}

/// A Workspace whose pods cannot run: the pod failure KAITO classified
/// (`classifyInferencePodFailure`, workspace_controller.go:882-905: `ImagePullError`,
/// `ContainerCrashLoopBackOff`, `ContainerOOMKilled`, `ContainerStartError`, ...) as the
/// `InferenceReady` reason; `state` stays Pending until the workload was once ready.
pub fn workspace_failed(reason: &str, message: &str) -> Value {
    json!({"state": "Pending", "conditions": [
        condition("InferenceReady", "False", reason, message),
        condition("WorkspaceSucceeded", "False", "workspacePending", "workspace is waiting for inference workload readiness"),
    ]})
}

/// An InferenceSet's status with `ready` of `desired` Workspaces ready
/// (pkg/inferenceset/inferenceset_controller.go:431-497): `InferenceSetReady` True when
/// all are, else False `inferencesetNotReady`; `failed` is the error of its Gateway API
/// resources, which turns it False `inferencesetFailed` (:516-522).
pub fn inference_set_status(desired: i64, ready: i64, failed: Option<&str>) -> Value {
    let ready_condition = match failed {
        Some(err) => condition("InferenceSetReady", "False", "inferencesetFailed", err),
        None if ready == desired => condition(
            "InferenceSetReady",
            "True",
            "inferencesetReady",
            "inferenceset is ready",
        ),
        None => condition(
            "InferenceSetReady",
            "False",
            "inferencesetNotReady",
            &format!("inferenceset is not ready, {ready}/{desired} replicas are ready"),
        ),
    };
    json!({"replicas": desired, "readyReplicas": ready, "conditions": [ready_condition]})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(instance_type: Option<&str>, config: Option<&str>) -> Value {
        let mut v = json!({
            "apiVersion": "kaito.sh/v1beta1", "kind": "Workspace",
            "metadata": {"name": "qwen", "namespace": "ns", "uid": "u1",
                         "annotations": {"kaito.sh/runtime": "vllm"}},
            "resource": {"labelSelector": {"matchLabels": {"pool": "gpu"}}, "count": 1},
            "inference": {"preset": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "accessMode": "public"}},
        });
        if let Some(it) = instance_type {
            v["resource"]["instanceType"] = json!(it);
        }
        if let Some(c) = config {
            v["inference"]["config"] = json!(c);
        }
        v
    }

    fn config(text: &str) -> BTreeMap<String, String> {
        [("inference_config.yaml".to_string(), text.to_string())].into()
    }

    #[test]
    fn instance_type_follows_node_provisioning() {
        let nap = Cluster::new(NodeProvisioner::AzureGpu);
        let err = admit_workspace(None, &ws(None, None), &nap).unwrap_err();
        assert!(err.message.contains("instanceType is required"), "{err}");
        assert!(admit_workspace(None, &ws(Some("Standard_NC6s_v3"), None), &nap).is_ok());
        let err = admit_workspace(None, &ws(Some("p3.2xlarge"), None), &nap).unwrap_err();
        assert!(err.message.contains("Unsupported instance type"), "{err}");
        let mut byo = Cluster::new(NodeProvisioner::Byo);
        byo.nodes.push(
            [
                ("pool", "gpu"),
                ("nvidia.com/gpu.product", "NVIDIA-A100"),
                ("nvidia.com/gpu.count", "1"),
                ("nvidia.com/gpu.memory", "81920"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        );
        let err = admit_workspace(None, &ws(Some("Standard_NC6s_v3"), None), &byo).unwrap_err();
        assert!(
            err.message
                .contains("must be empty when node auto-provisioning is disabled")
        );
        assert!(admit_workspace(None, &ws(None, None), &byo).is_ok());
        let err = admit_inference_set(
            None,
            &json!({"kind": "InferenceSet", "metadata": {"name": "s"}, "spec": {"replicas": 2, "template": {}}}),
            &nap,
        )
        .unwrap_err();
        assert!(err.to_string().contains(INFERENCE_SET_WEBHOOK), "{err}");
    }

    #[test]
    fn byo_presets_need_gpu_feature_discovery_labels_on_the_selected_nodes() {
        let mut byo = Cluster::new(NodeProvisioner::Byo);
        let err = admit_workspace(None, &ws(None, None), &byo).unwrap_err();
        assert!(err.message.contains("No nodes found"), "{err}");
        byo.nodes
            .push([("pool".to_string(), "gpu".to_string())].into());
        let err = admit_workspace(None, &ws(None, None), &byo).unwrap_err();
        assert!(
            err.message.contains("missing required nvidia.com labels"),
            "{err}"
        );
    }

    #[test]
    fn the_inference_config_map_must_exist_and_parse() {
        let mut c = Cluster::new(NodeProvisioner::AzureGpu);
        let w = ws(Some("Standard_NC6s_v3"), Some("qwen-inference-config"));
        let err = admit_workspace(None, &w, &c).unwrap_err();
        assert_eq!(
            err.to_string(),
            "admission webhook \"validation.workspace.kaito.sh\" denied the request: validation \
             failed: ConfigMap 'qwen-inference-config' specified in 'config' not found in \
             namespace 'ns': config"
        );
        c.put_config_map("ns", "qwen-inference-config", BTreeMap::new());
        let err = admit_workspace(None, &w, &c).unwrap_err();
        assert!(
            err.message.contains("inference_config.yaml in ConfigMap"),
            "{err}"
        );
        c.put_config_map(
            "ns",
            "qwen-inference-config",
            config("vllm:\n  compilation-config:\n    level: 3\n"),
        );
        let err = admit_workspace(None, &w, &c).unwrap_err();
        assert!(err.message.contains("Failed to parse"), "{err}");
        c.put_config_map(
            "ns",
            "qwen-inference-config",
            config("vllm:\n  max-model-len: 8192\n  gpu-memory-utilization: \"0.9\"\n  enforce-eager: true\n"),
        );
        assert!(admit_workspace(None, &w, &c).is_ok());
        // The token limit of the preset (inference_config_validation.go:88-112).
        c.token_limits
            .insert("qwen/qwen2.5-0.5b-instruct".into(), 4096);
        let err = admit_workspace(None, &w, &c).unwrap_err();
        assert!(
            err.message.contains(
                "max-model-len 8192 exceeds model's maximum supported context window 4096"
            ),
            "{err}"
        );
        // llama.cpp templates are not vLLM presets: no ConfigMap rule without a config.
        let mut t = ws(Some("Standard_D8s_v3"), None);
        t["inference"] = json!({"template": {"spec": {"containers": []}}});
        assert!(admit_workspace(None, &t, &c).is_ok());
    }

    #[test]
    fn preset_selector_and_instance_type_are_immutable() {
        let c = Cluster::new(NodeProvisioner::AzureGpu);
        let old = ws(Some("Standard_NC6s_v3"), None);
        let mut new = old.clone();
        new["inference"]["preset"]["presetOptions"] = json!({"modelAccessSecret": "hf2"});
        let err = admit_workspace(Some(&old), &new, &c).unwrap_err();
        assert_eq!(err.message, "field is immutable: inference.preset");
        let mut new = old.clone();
        new["resource"]["labelSelector"]["matchLabels"]["pool"] = json!("a100");
        let err = admit_workspace(Some(&old), &new, &c).unwrap_err();
        assert_eq!(err.message, "field is immutable: resource.labelSelector");
        let mut new = old.clone();
        new["resource"]["instanceType"] = json!("Standard_NC24ads_A100_v4");
        assert!(admit_workspace(Some(&old), &new, &c).is_err());
        // What may change: the config reference, annotations.
        let mut new = old.clone();
        new["inference"]["config"] = json!("other");
        assert!(admit_workspace(Some(&old), &new, &c).is_ok());
    }

    #[test]
    fn admission_tells_create_from_update_by_uid() {
        let c = Cluster::new(NodeProvisioner::AzureGpu);
        let mut a = Admission::default();
        let first = ws(Some("Standard_NC6s_v3"), None);
        assert!(a.judge(&first, &c).is_ok());
        let mut changed = first.clone();
        changed["inference"]["preset"]["presetOptions"] = json!({"modelAccessSecret": "hf2"});
        assert!(a.judge(&changed, &c).is_err(), "an in-place preset change");
        changed["metadata"]["uid"] = json!("u2");
        assert!(a.judge(&changed, &c).is_ok(), "a recreated Workspace");
    }

    #[test]
    fn names_must_be_dns_labels() {
        let c = Cluster::new(NodeProvisioner::AzureGpu);
        let mut w = ws(Some("Standard_NC6s_v3"), None);
        w["metadata"]["name"] = json!("qwen.small");
        assert!(admit_workspace(None, &w, &c).is_err());
    }

    #[test]
    fn inference_set_workspaces_carry_the_created_by_label() {
        let c = Cluster::new(NodeProvisioner::Byo);
        let is = json!({"metadata": {"name": "s", "namespace": "ns"},
            "spec": {"labelSelector": {"matchLabels": {"a": "b"}},
                     "template": {"resource": {"instanceType": "X"}, "inference": {"preset": {"name": "a/b"}}}}});
        let w = workspace_for_inference_set(&is, "abcde", &c);
        assert_eq!(w["metadata"]["name"], "s-abcde");
        assert_eq!(w["metadata"]["labels"][CREATED_BY_INFERENCE_SET], "s");
        assert!(w["resource"].get("instanceType").is_none(), "BYO drops it");
    }

    #[test]
    fn status_sequences_are_kaito_s() {
        assert_eq!(
            workspace_pending()["conditions"][1]["reason"],
            "workspacePending"
        );
        assert_eq!(workspace_ready()["state"], "Ready");
        assert_eq!(
            inference_set_status(3, 1, None)["conditions"][0]["message"],
            "inferenceset is not ready, 1/3 replicas are ready"
        );
        assert_eq!(
            inference_set_status(3, 3, None)["conditions"][0]["reason"],
            "inferencesetReady"
        );
        assert_eq!(
            inference_set_status(3, 3, Some("boom"))["conditions"][0]["reason"],
            "inferencesetFailed"
        );
    }
}
