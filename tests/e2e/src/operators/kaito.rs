//! KAITO's workspace operator as the tests play it: its validating webhooks on the fields
//! the KAITO provider renders, its defaulting, the Workspaces its InferenceSet controller
//! creates, and the status its controllers write.
//! Read at KAITO v0.12.0 (`0894eb2b`, the release of the Workspace CRD fixture) and
//! v0.10.0 (`c673cadc`); `file:line` below is v0.12.0 unless marked.
//!
//! Admission (knative validation webhooks `validation.workspace.kaito.sh` and
//! `validation.inferenceset.kaito.sh`, pkg/workspace/webhooks/webhooks.go:60-98; they
//! validate CREATE and UPDATE). [`serve_webhooks`] serves the rules below to a test API
//! server, which calls them as it would call KAITO's, so a refusal comes back from the
//! apply as from a real cluster, in the words the API server gives a webhook denial:
//! `admission webhook "<name>" denied the request: validation failed: <message>: <path>`
//! (knative `FieldError` prints `message: paths`; knative gathers every error of an
//! object, the stand-in stops at the first).
//!
//! Defaulting: `Workspace.SetDefaults` does nothing (api/v1beta1/workspace_default.go);
//! the API server applies the CRD defaults (`resource.count: 1`,
//! `inference.preset.accessMode: public`), which the test API server does itself.
//!
//! Controllers: [`InferenceSetController`] creates the Workspaces of each InferenceSet as
//! KAITO's does (through the API server, so through the Workspace webhook);
//! [`workspace_pending`], [`workspace_ready`], [`workspace_failed`],
//! [`workspace_benchmark_failed`] and [`inference_set_status`] are the statuses the
//! controllers write, which the tests write in KAITO's order.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::admission::AdmissionRequest;
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::admission::{Registration, ValidatingWebhook, serve_validating_async};

/// The Workspace webhook's name.
pub const WORKSPACE_WEBHOOK: &str = "validation.workspace.kaito.sh";
/// A model of KAITO's catalog, with a token limit the webhook enforces.
pub const PHI_4: &str = "microsoft/phi-4";
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

    /// With the token limits of KAITO's model catalog for the models the tests deploy
    /// (presets/workspace/models/model_catalog.yaml, embedded and read before any
    /// Hugging Face lookup, presets/workspace/generator/generator.go:782-810):
    /// `microsoft/phi-4` 16384 (model_catalog.yaml:3-10, the same at v0.10.0).
    #[must_use]
    pub fn with_catalog(mut self) -> Self {
        self.token_limits.insert(PHI_4.to_lowercase(), 16384);
        self
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

impl Refusal {
    /// The message of the webhook's denial (knative's `validation failed: <error>`,
    /// webhook/resourcesemantics/validation/validation_admit.go of knative.dev/pkg
    /// 20240910170930-fdbc0b5adde7, the version go.mod@v0.12.0 pins); the API server
    /// prefixes it with the webhook's name.
    pub fn denial(&self) -> String {
        format!("validation failed: {}", self.message)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "admission webhook \"{}\" denied the request: {}",
            self.webhook,
            self.denial()
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
/// (`NewWorkspaceForInferenceSet`, pkg/utils/inferenceset/inferenceset.go:133-180; created
/// by pkg/inferenceset/inferenceset_controller.go:365-380): `generateName: <set>-`,
/// owned by the set, labelled `inferenceset.kaito.sh/created-by`, with the labels and
/// annotations of `spec.template.metadata` (not the set's own: a runtime annotation on
/// the set does not reach its Workspaces, whose runtime defaults to vLLM,
/// api/v1beta1/labels.go:118-137 and pkg/featuregates/featuregates.go:28), the set's
/// selector, its template's inference, and its instance type unless nodes are
/// bring-your-own.
pub fn workspace_for_inference_set(is: &Value, cluster: &Cluster) -> Value {
    let name = str_at(is, &["metadata", "name"]);
    let template = &is["spec"]["template"];
    let mut resource = json!({"labelSelector": is["spec"]["labelSelector"]});
    let it = str_at(template, &["resource", "instanceType"]);
    if cluster.node_provisioner.auto_provisioning() && !it.is_empty() {
        resource["instanceType"] = json!(it);
    }
    let mut labels = template["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    labels.insert(CREATED_BY_INFERENCE_SET.into(), json!(name));
    let mut metadata = json!({
        "generateName": format!("{name}-"),
        "namespace": is["metadata"]["namespace"],
        "labels": labels,
        "ownerReferences": [{
            "apiVersion": is["apiVersion"], "kind": "InferenceSet", "name": name,
            "uid": is["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
        }],
    });
    if let Some(annotations) = template["metadata"]["annotations"].as_object() {
        metadata["annotations"] = json!(annotations);
    }
    json!({
        "apiVersion": "kaito.sh/v1beta1", "kind": "Workspace",
        "metadata": metadata,
        "resource": resource,
        "inference": template["inference"],
    })
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

/// A Workspace whose inference is up but whose post-load benchmark failed for good
/// (`applyInferenceWorkspaceStatus` and `applyBenchmarkStatus`,
/// workspace_controller.go:1270-1280,1319-1329: "These errors are terminal"):
/// `BenchmarkCompleted` and `WorkspaceSucceeded` False `BenchmarkFailed` with the error,
/// state NotReady. Not at v0.10.0, which has no benchmark status.
pub fn workspace_benchmark_failed(error: &str) -> Value {
    json!({"state": "NotReady", "conditions": [
        condition("ResourceReady", "True", "workspaceResourceStatusSuccess", "workspace resource is ready"),
        condition("InferenceReady", "True", "WorkspaceInferenceStatusSuccess", "Inference has been deployed successfully"),
        condition("BenchmarkCompleted", "False", "BenchmarkFailed", error),
        condition("WorkspaceSucceeded", "False", "BenchmarkFailed", error),
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

// ---- served to a test API server ----

/// KAITO's Workspaces, as the provider renders them.
pub fn workspace_resource() -> ApiResource {
    ApiResource {
        group: "kaito.sh".into(),
        version: "v1beta1".into(),
        api_version: "kaito.sh/v1beta1".into(),
        kind: "Workspace".into(),
        plural: "workspaces".into(),
    }
}

/// KAITO's InferenceSets, as the provider renders them.
pub fn inference_set_resource() -> ApiResource {
    ApiResource {
        group: "kaito.sh".into(),
        version: "v1alpha1".into(),
        api_version: "kaito.sh/v1alpha1".into(),
        kind: "InferenceSet".into(),
        plural: "inferencesets".into(),
    }
}

/// The namespace KAITO is installed into (its documented `helm install ... --namespace
/// kaito-workspace`), where its webhook Services live.
pub const WEBHOOK_NAMESPACE: &str = "kaito-workspace";

/// What the Workspace webhook reads of the cluster to judge `ws`: the ConfigMap its
/// `inference.config` names (inference_config_validation.go:56-70) and, with
/// bring-your-own nodes, the nodes (workspace_validation.go:550-602). KAITO reads both
/// through its manager's cached client (cmd/workspace/main.go:236), which can lag a
/// ConfigMap created a moment before; the stand-in reads the API server itself, the
/// cache at its best.
async fn look_up(client: &Client, settings: &Cluster, ws: &Value) -> Result<Cluster, String> {
    let mut cluster = settings.clone();
    let ns = str_at(ws, &["metadata", "namespace"]);
    let name = str_at(ws, &["inference", "config"]);
    if !name.is_empty() {
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        match config_maps.get_opt(name).await {
            Ok(Some(cm)) => cluster.put_config_map(ns, name, cm.data.unwrap_or_default()),
            Ok(None) => {}
            Err(e) => {
                return Err(format!(
                    "validation failed: Failed to get ConfigMap '{name}' in namespace '{ns}': {e}: config"
                ));
            }
        }
    }
    if !cluster.node_provisioner.auto_provisioning() {
        let nodes: Api<Node> = Api::all(client.clone());
        let list = nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        cluster.nodes = list.items.iter().map(|n| n.labels().clone()).collect();
    }
    Ok(cluster)
}

/// The object of an admission request as JSON, in the request's namespace, and the old
/// object of an update.
fn request_object(req: &AdmissionRequest<DynamicObject>) -> (Value, Option<Value>) {
    let mut object = serde_json::to_value(&req.object).unwrap_or_default();
    if str_at(&object, &["metadata", "namespace"]).is_empty() {
        object["metadata"]["namespace"] = json!(req.namespace);
    }
    let old = req
        .old_object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok());
    (object, old)
}

/// KAITO's webhooks while they are served; they stop when this is dropped.
#[derive(Debug)]
pub struct Webhooks {
    _served: Vec<ValidatingWebhook>,
}

/// Serve KAITO's Workspace webhook (and, with `inference_sets`, its InferenceSet webhook)
/// to `test_cluster`'s API server, judging as a KAITO with `settings` (its node
/// provisioner, the token limits of the presets it knows), and wait until the API server
/// calls them. KAITO serves both from one Service (charts/kaito/workspace/templates/
/// service.yaml) at two paths; here each has a Service of its own.
pub async fn serve_webhooks(
    test_cluster: &kubeairunway_testcluster::TestCluster,
    client: &Client,
    settings: Cluster,
    inference_sets: bool,
) -> anyhow::Result<Webhooks> {
    let settings = Arc::new(settings);
    let (reader, judged) = (client.clone(), settings.clone());
    let workspace_verdict =
        move |req: AdmissionRequest<DynamicObject>| -> BoxFuture<'static, Result<(), String>> {
            let (client, settings) = (reader.clone(), judged.clone());
            Box::pin(async move {
                let (ws, old) = request_object(&req);
                let cluster = look_up(&client, &settings, &ws).await?;
                admit_workspace(old.as_ref(), &ws, &cluster).map_err(|r| r.denial())
            })
        };
    let mut served = vec![
        serve_validating_async(
            test_cluster,
            client,
            Registration {
                name: WORKSPACE_WEBHOOK,
                namespace: WEBHOOK_NAMESPACE,
                service: "kaito-workspace-webhook",
                resource: &workspace_resource(),
            },
            Arc::new(workspace_verdict),
        )
        .await?,
    ];
    let mut probes = vec![(workspace_resource(), WORKSPACE_WEBHOOK)];
    if inference_sets {
        let judged = settings.clone();
        let verdict =
            move |req: AdmissionRequest<DynamicObject>| -> BoxFuture<'static, Result<(), String>> {
                let (is, old) = request_object(&req);
                let answer =
                    admit_inference_set(old.as_ref(), &is, &judged).map_err(|r| r.denial());
                Box::pin(async move { answer })
            };
        served.push(
            serve_validating_async(
                test_cluster,
                client,
                Registration {
                    name: INFERENCE_SET_WEBHOOK,
                    namespace: WEBHOOK_NAMESPACE,
                    service: "kaito-inferenceset-webhook",
                    resource: &inference_set_resource(),
                },
                Arc::new(verdict),
            )
            .await?,
        );
        probes.push((inference_set_resource(), INFERENCE_SET_WEBHOOK));
    }
    for (resource, webhook) in probes {
        wait_until_called(client, &resource, webhook).await?;
    }
    Ok(Webhooks { _served: served })
}

/// Wait until the API server calls `webhook`: a dry run of an object named with a dot
/// (a DNS subdomain the API server takes, not the DNS label KAITO wants) is refused by it.
async fn wait_until_called(
    client: &Client,
    resource: &ApiResource,
    webhook: &str,
) -> anyhow::Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), WEBHOOK_NAMESPACE, resource);
    let inference = json!({"preset": {"name": "a/b"}});
    let mut probe = json!({"apiVersion": resource.api_version, "kind": resource.kind,
                           "metadata": {"name": "webhook.probe"}});
    if resource.kind == "Workspace" {
        probe["resource"] = json!({"labelSelector": {"matchLabels": {"a": "b"}}});
        probe["inference"] = inference;
    } else {
        probe["spec"] = json!({"replicas": 1, "labelSelector": {"matchLabels": {"a": "b"}},
                               "template": {"inference": inference}});
    }
    let probe: DynamicObject = serde_json::from_value(probe)?;
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    crate::eventually(
        30,
        &format!("KAITO's webhook {webhook} to be called"),
        || {
            let (api, probe, pp) = (api.clone(), probe.clone(), pp.clone());
            async move {
                match api.create(&pp, &probe).await {
                    Err(kube::Error::Api(e)) if e.message.contains(webhook) => Some(()),
                    _ => None,
                }
            }
        },
    )
    .await
}

/// KAITO's InferenceSet controller as far as it acts on what we render: it keeps
/// `spec.replicas` Workspaces per InferenceSet, creating the missing ones
/// ([`workspace_for_inference_set`]) through the API server, so KAITO's Workspace webhook
/// judges them as it judges the controller's real requests. A Workspace the webhook
/// refuses is recorded in [`InferenceSetController::problems`] (the real controller
/// would retry forever and the set never get ready). It writes no status: the tests
/// write KAITO's status sequences themselves.
#[derive(Debug)]
pub struct InferenceSetController {
    problems: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl InferenceSetController {
    /// Start playing the controller of a KAITO with `settings` on `client`'s cluster.
    pub fn spawn(client: Client, settings: Cluster) -> Self {
        let problems = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(run_inference_sets(client, settings, problems.clone()));
        Self { problems, task }
    }

    /// The Workspaces KAITO's webhook refused the controller so far.
    pub fn problems(&self) -> Vec<String> {
        self.problems
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for InferenceSetController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run_inference_sets(client: Client, settings: Cluster, problems: Arc<Mutex<Vec<String>>>) {
    let sets: Api<DynamicObject> = Api::all_with(client.clone(), &inference_set_resource());
    let workspaces: Api<DynamicObject> = Api::all_with(client.clone(), &workspace_resource());
    let record = |line: String| {
        let mut all = problems
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !all.contains(&line) {
            all.push(line);
        }
    };
    loop {
        let listed = (
            sets.list(&ListParams::default()).await,
            workspaces
                .list(&ListParams::default().labels(CREATED_BY_INFERENCE_SET))
                .await,
        );
        if let (Ok(sets), Ok(children)) = listed {
            for set in sets.items {
                if set.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let (ns, name) = (set.namespace().unwrap_or_default(), set.name_any());
                let have = children
                    .items
                    .iter()
                    .filter(|w| {
                        w.namespace().as_deref() == Some(ns.as_str())
                            && w.labels().get(CREATED_BY_INFERENCE_SET) == Some(&name)
                    })
                    .count();
                let value = serde_json::to_value(&set).unwrap_or_default();
                let want = value["spec"]["replicas"]
                    .as_u64()
                    .and_then(|r| usize::try_from(r).ok())
                    .unwrap_or(1);
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &ns, &workspace_resource());
                for _ in have..want {
                    let child = workspace_for_inference_set(&value, &settings);
                    let Ok(child) = serde_json::from_value::<DynamicObject>(child) else {
                        break;
                    };
                    if let Err(kube::Error::Api(e)) =
                        api.create(&PostParams::default(), &child).await
                    {
                        record(format!(
                            "{ns}/{name}: a Workspace of the set is refused: {}",
                            e.message
                        ));
                        break;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
        let w = workspace_for_inference_set(&is, &c);
        assert_eq!(w["metadata"]["generateName"], "s-");
        assert_eq!(w["metadata"]["labels"][CREATED_BY_INFERENCE_SET], "s");
        assert!(w["resource"].get("instanceType").is_none(), "BYO drops it");
        assert!(w["metadata"].get("annotations").is_none());
        let nap = Cluster::new(NodeProvisioner::AzureGpu);
        let mut is = is;
        is["metadata"]["annotations"] = json!({"kaito.sh/runtime": "vllm"});
        is["spec"]["template"]["metadata"] = json!({"annotations": {"team": "a"}});
        let w = workspace_for_inference_set(&is, &nap);
        assert_eq!(w["resource"]["instanceType"], "X");
        assert_eq!(
            w["metadata"]["annotations"],
            json!({"team": "a"}),
            "the template's annotations, not the set's"
        );
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
