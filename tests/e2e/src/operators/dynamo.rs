//! NVIDIA Dynamo's operator, as the e2e tests play it: what it does to a
//! DynamoGraphDeployment we render, as pure functions, and [`StandIn`], the loop that
//! applies them to the objects on a test API server.
//!
//! Read in ai-dynamo/dynamo at `3e3b3b187` (Dynamo 1.1, the v1alpha1-only CRD) and
//! `2a6da14c8` (the v1beta1 CRD), as docs/upstream.md#dynamo-versions says; paths are under
//! `deploy/operator/` unless they start with `components/`.
//!
//! - [`admit`]: the validating webhook `vdynamographdeployment.kb.io` on the fields we set,
//!   served to the test API server by [`serve_webhook`].
//! - [`main_container`]: the operator's default main container with ours merged over it
//!   (mergo `WithOverride`).
//! - [`start`]: whether the merged command line starts, and serves, as the Dynamo
//!   component's own argument checks decide.
//! - [`status`]: what the controller writes for the outcome.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// The Dynamo commit each DynamoGraphDeployment version is played at.
pub fn commit(version: &str) -> &'static str {
    if version == "v1beta1" {
        "2a6da14c8"
    } else {
        "3e3b3b187"
    }
}

/// The label that hands a DynamoGraphDeployment's status to the test itself (the
/// ModelDeployment's `kubeairunway.ai/*` labels propagate to it).
pub const MANUAL_STATUS_LABEL: &str = "kubeairunway.ai/e2e-upstream-status";

/// What a component is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `frontend`.
    Frontend,
    /// `worker` (aggregated).
    Worker,
    /// `prefill` (v1alpha1: worker/prefill).
    Prefill,
    /// `decode` (v1alpha1: worker/decode).
    Decode,
    /// `epp`: Dynamo's endpoint picker.
    Epp,
    /// Anything else (planner): not played.
    Other,
}

/// One component of a DynamoGraphDeployment, in either version.
#[derive(Clone, Debug, PartialEq)]
pub struct Component {
    /// Its key.
    pub name: String,
    /// Its kind.
    pub kind: Kind,
    /// Replicas (default 1).
    pub replicas: i64,
    /// Our main container, in Kubernetes' shape (`null` when absent).
    pub main: Value,
    /// v1alpha1 `envs`, merged after the main container's env.
    pub envs: Value,
    /// GPUs of the main container.
    pub gpus: i64,
}

fn text<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or_default()
}

/// The components of `dgd` (`spec.components[]` in v1beta1, `spec.services{}` in v1alpha1).
pub fn components(version: &str, dgd: &Value) -> Vec<Component> {
    let spec = &dgd["spec"];
    let kind_of = |t: &str, sub: &str| match (t, sub) {
        ("frontend", _) => Kind::Frontend,
        ("prefill", _) | ("worker", "prefill") => Kind::Prefill,
        ("decode", _) | ("worker", "decode") => Kind::Decode,
        ("worker", _) => Kind::Worker,
        ("epp", _) => Kind::Epp,
        _ => Kind::Other,
    };
    let gpus = |limits: &Value| {
        limits
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.as_str() == "gpu" || k.ends_with("/gpu"))
            .filter_map(|(_, v)| {
                v.as_i64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            })
            .sum()
    };
    if version == "v1beta1" {
        spec["components"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let main = c["podTemplate"]["spec"]["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| text(m, "name") == "main")
                    .cloned()
                    .unwrap_or(Value::Null);
                Component {
                    name: text(c, "name").to_string(),
                    kind: kind_of(text(c, "type"), ""),
                    replicas: c["replicas"].as_i64().unwrap_or(1),
                    gpus: gpus(&main["resources"]["limits"]),
                    main,
                    envs: Value::Null,
                }
            })
            .collect()
    } else {
        spec["services"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, s)| Component {
                name: name.clone(),
                kind: kind_of(text(s, "componentType"), text(s, "subComponentType")),
                replicas: s["replicas"].as_i64().unwrap_or(1),
                main: s["extraPodSpec"]["mainContainer"].clone(),
                envs: s["envs"].clone(),
                gpus: gpus(&s["resources"]["limits"]),
            })
            .collect()
    }
}

// ---- admission ----

/// The webhook's message for `errors`: at `2a6da14c8` a `field.ErrorList` as an Invalid
/// status (`webhook/validation/dynamographdeployment_helpers.go:53-61`); at `3e3b3b187`
/// the errors themselves (`dynamographdeployment.go:83-125`). The API server prefixes it
/// with `admission webhook "vdynamographdeployment.kb.io" denied the request: `.
pub fn denial(version: &str, name: &str, errors: &[String]) -> String {
    if version != "v1beta1" {
        return errors.join("\n");
    }
    let detail = if errors.len() == 1 {
        errors[0].clone()
    } else {
        format!("[{}]", errors.join(", "))
    };
    format!("DynamoGraphDeployment.nvidia.com \"{name}\" is invalid: {detail}")
}

/// The name of Dynamo's validating webhook for DynamoGraphDeployments
/// (`deploy/helm/charts/platform/components/operator/templates/webhook-configuration.yaml`
/// at both commits).
pub const WEBHOOK: &str = "vdynamographdeployment.kb.io";

/// Serve [`admit`] as Dynamo's webhook for DynamoGraphDeployments of `resource` on
/// `cluster`, and wait until the API server calls it.
pub async fn serve_webhook(
    cluster: &kubeairunway_testcluster::TestCluster,
    client: &Client,
    resource: &ApiResource,
) -> anyhow::Result<crate::admission::ValidatingWebhook> {
    let version = resource.version.clone();
    let verdict_version = version.clone();
    let verdict = move |req: &kube::core::admission::AdmissionRequest<DynamicObject>| {
        let object = serde_json::to_value(&req.object).unwrap_or_default();
        let old = req
            .old_object
            .as_ref()
            .and_then(|o| serde_json::to_value(o).ok());
        let errors = admit(&verdict_version, &object, old.as_ref());
        if errors.is_empty() {
            Ok(())
        } else {
            Err(denial(
                &verdict_version,
                &crate::admission::object_name(req),
                &errors,
            ))
        }
    };
    let webhook = crate::admission::serve_validating(
        cluster,
        client,
        crate::admission::Registration {
            name: WEBHOOK,
            namespace: "dynamo-system",
            service: "dynamo-operator-webhook-service",
            resource,
        },
        Arc::new(verdict),
    )
    .await?;
    // A graph without components, which the webhook refuses, shows when it is called.
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "dynamo-system", resource);
    let list = if version == "v1beta1" {
        json!({"components": []})
    } else {
        json!({"services": {}})
    };
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": resource.api_version, "kind": resource.kind,
        "metadata": {"name": "webhook-probe"}, "spec": list,
    }))?;
    crate::eventually(30, "Dynamo's webhook to be called", || {
        let api = api.clone();
        let probe = probe.clone();
        async move {
            let pp = kube::api::PostParams {
                dry_run: true,
                ..Default::default()
            };
            match api.create(&pp, &probe).await {
                Err(kube::Error::Api(e)) if e.message.contains(WEBHOOK) => Some(()),
                _ => None,
            }
        }
    })
    .await?;
    Ok(webhook)
}

/// Whether Dynamo reads a runtime version from the image's tag: `[vV]?` and a semantic
/// version (`internal/runtimeversion/runtimeversion.go:15,55-71,91-102@2a6da14c8`).
pub fn image_has_runtime_version(image: &str) -> bool {
    let mut reference = image.trim();
    if let Some(at) = reference.find('@') {
        reference = &reference[..at];
    }
    let slash = reference.rfind('/');
    let Some(colon) = reference
        .rfind(':')
        .filter(|&c| slash.is_none_or(|s| c > s))
    else {
        return false;
    };
    let tag = reference[colon + 1..].trim();
    let tag = tag
        .strip_prefix('v')
        .or_else(|| tag.strip_prefix('V'))
        .unwrap_or(tag);
    let (tag, build) = tag
        .split_once('+')
        .map_or((tag, None), |(t, b)| (t, Some(b)));
    let (core, pre) = tag
        .split_once('-')
        .map_or((tag, None), |(c, p)| (c, Some(p)));
    let number = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_digit())
            && (s.len() == 1 || !s.starts_with('0'))
    };
    let word = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| number(p))
        && pre.is_none_or(|p| {
            p.split('.')
                .all(|i| word(i) && (number(i) || !i.chars().all(|c| c.is_ascii_digit())))
        })
        && build.is_none_or(|b| b.split('.').all(word))
}

/// The webhook's verdict on creating (`old` = `None`) or updating `dgd`; the errors it
/// lists (field path, type, detail), empty when it admits.
pub fn admit(version: &str, dgd: &Value, old: Option<&Value>) -> Vec<String> {
    let mut errors = Vec::new();
    let spec = &dgd["spec"];
    let list = if version == "v1beta1" {
        "components"
    } else {
        "services"
    };
    let empty = match &spec[list] {
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => true,
    };
    if empty {
        errors.push(if version == "v1beta1" {
            // webhook/validation/dynamographdeployment.go:250-253@2a6da14c8
            "spec.components: Required value: must have at least one component".to_string()
        } else {
            // webhook/validation/dynamographdeployment.go:85-87@3e3b3b187
            "spec.services must have at least one service".to_string()
        });
    }
    if version == "v1beta1" {
        // Main image and runtime version: webhook/validation/shared_v1beta1.go:172-185 on
        // create, :830-845 (changed tuples only) on update, @2a6da14c8.
        let olds: HashMap<String, Value> = old
            .map(|o| {
                o["spec"]["components"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| (text(c, "name").to_string(), c.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for (i, c) in spec["components"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let containers = &c["podTemplate"]["spec"]["containers"];
            let main = containers
                .as_array()
                .into_iter()
                .flatten()
                .position(|m| text(m, "name") == "main");
            let image = main.map_or("", |j| text(&containers[j], "image"));
            let path = main.map_or(
                format!("spec.components[{i}].podTemplate.spec.containers"),
                |j| format!("spec.components[{i}].podTemplate.spec.containers[{j}].image"),
            );
            let override_ = text(c, "runtimeVersionOverride");
            let unchanged = olds.get(text(c, "name")).is_some_and(|o| {
                let old_main = o["podTemplate"]["spec"]["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| text(m, "name") == "main");
                old_main.map_or("", |m| text(m, "image")) == image
                    && text(o, "runtimeVersionOverride") == override_
            });
            if image.is_empty() {
                errors.push(format!("{path}: Required value: is required"));
            } else if override_.is_empty() && !image_has_runtime_version(image) && !unchanged {
                errors.push(format!(
                    "spec.components[{i}].runtimeVersionOverride: Required value: is required when the specified main container image has no parseable semantic-version tag"
                ));
            }
        }
    } else {
        // spec.pvcs: webhook/validation/dynamographdeployment.go:480-503@3e3b3b187
        for (i, pvc) in spec["pvcs"].as_array().into_iter().flatten().enumerate() {
            if text(pvc, "name").is_empty() {
                errors.push(format!("spec.pvcs[{i}].name is required"));
            }
            if pvc["create"] == json!(true) {
                for (field, what) in [
                    ("storageClass", "storageClass"),
                    ("size", "size"),
                    ("volumeAccessMode", "volumeAccessMode"),
                ] {
                    if pvc[field].is_null() || pvc[field] == json!("") {
                        errors.push(format!(
                            "spec.pvcs[{i}].{what} is required when create is true"
                        ));
                    }
                }
            }
        }
    }
    errors.extend(admit_gateway(version, dgd));
    if let Some(old) = old {
        // backendFramework: dynamographdeployment.go:164-168@3e3b3b187, :730-737@2a6da14c8.
        if spec["backendFramework"] != old["spec"]["backendFramework"] {
            errors.push(if version == "v1beta1" {
                format!(
                    "spec.backendFramework: Invalid value: {}: is immutable and cannot be changed after creation",
                    spec["backendFramework"]
                )
            } else {
                "spec.backendFramework is immutable and cannot be changed after creation".to_string()
            });
        }
        // Component names: dynamographdeployment.go:237-274@3e3b3b187, :687-704@2a6da14c8.
        let names = |v: &Value| -> BTreeSet<String> {
            components(version, v).into_iter().map(|c| c.name).collect()
        };
        let (new, was) = (names(dgd), names(old));
        if new != was {
            let added: Vec<_> = new.difference(&was).cloned().collect();
            let removed: Vec<_> = was.difference(&new).cloned().collect();
            errors.push(format!(
                "{} topology is immutable and cannot be modified after creation: added {added:?}, removed {removed:?}",
                if version == "v1beta1" { "spec.components: Forbidden: component" } else { "service" }
            ));
        }
    }
    errors
}

/// Each component's key and its object, in either version.
fn raw_components<'a>(version: &str, dgd: &'a Value) -> Vec<(String, &'a Value)> {
    if version == "v1beta1" {
        dgd["spec"]["components"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| (text(c, "name").to_string(), c))
            .collect()
    } else {
        dgd["spec"]["services"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, c)| (k.clone(), c))
            .collect()
    }
}

fn is_epp(version: &str, c: &Value) -> bool {
    text(
        c,
        if version == "v1beta1" {
            "type"
        } else {
            "componentType"
        },
    ) == "epp"
}

/// The endpoint picker and frontend sidecar rules of the webhook: one replica and an
/// `eppConfig` with exactly one of `config` and `configMapRef`
/// (`webhook/validation/shared_v1beta1.go:117-139@2a6da14c8`,
/// `webhook/validation/shared.go:183-220@3e3b3b187`); a v1beta1 `frontendSidecar` names a
/// container of the pod template (`shared_v1beta1.go:141-157@2a6da14c8`).
fn admit_gateway(version: &str, dgd: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    for (i, (name, c)) in raw_components(version, dgd).into_iter().enumerate() {
        let path = if version == "v1beta1" {
            format!("spec.components[{i}]")
        } else {
            format!("spec.services.{name}")
        };
        if is_epp(version, c) {
            let replicas = c["replicas"].as_i64().unwrap_or(1);
            if replicas != 1 {
                errors.push(format!(
                    "{path}: EPP component must have exactly 1 replica (found {replicas} replicas)"
                ));
            }
            let config = &c["eppConfig"];
            let (inline, by_ref) = (
                !config["config"].is_null(),
                !config["configMapRef"].is_null(),
            );
            if config.is_null() {
                errors.push(format!("{path}.eppConfig is required for EPP components"));
            } else if inline == by_ref {
                errors.push(format!(
                    "{path}.eppConfig: exactly one of configMapRef and config must be specified"
                ));
            }
        }
        if version == "v1beta1"
            && let Some(sidecar) = c["frontendSidecar"].as_str()
        {
            let named = c["podTemplate"]["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| text(m, "name") == sidecar);
            if !named {
                errors.push(format!(
                    "{path}.frontendSidecar: Invalid value: \"{sidecar}\": must match a podTemplate.spec.containers name"
                ));
            }
        }
    }
    errors
}

// ---- the gateway: the operator's InferencePool and its workers' labels ----

/// The Dynamo namespace of a graph: `<namespace>-<graph>`, dots made hyphens
/// (`ComputeDynamoNamespace`, `api/v1beta1/dynamocomponentdeployment_types.go:403-410
/// @2a6da14c8`, `api/v1alpha1/dynamocomponentdeployment_types.go:422-431@3e3b3b187`).
pub fn dynamo_namespace(namespace: &str, graph: &str) -> String {
    format!("{namespace}-{}", graph.replace('.', "-"))
}

/// The labels the operator puts on the pods of `component` of `dgd`
/// (`internal/dynamo/graph.go:2875-2925@2a6da14c8`: graph, component, type, the worker
/// class when the graph has an endpoint picker, Dynamo namespace;
/// `internal/dynamo/graph.go:1875-1910@3e3b3b187`: graph, component, type, sub-type,
/// Dynamo namespace).
pub fn pod_labels(version: &str, dgd: &Value, component: &str) -> BTreeMap<String, String> {
    let graph = text(&dgd["metadata"], "name");
    let namespace = text(&dgd["metadata"], "namespace");
    let all = raw_components(version, dgd);
    let has_epp = all.iter().any(|(_, c)| is_epp(version, c));
    let Some((_, c)) = all.iter().find(|(n, _)| n == component) else {
        return BTreeMap::new();
    };
    let type_ = text(
        c,
        if version == "v1beta1" {
            "type"
        } else {
            "componentType"
        },
    );
    let mut labels = BTreeMap::from([
        (
            "nvidia.com/dynamo-graph-deployment-name".to_string(),
            graph.to_string(),
        ),
        (
            "nvidia.com/dynamo-component".to_string(),
            component.to_string(),
        ),
        (
            "nvidia.com/dynamo-component-type".to_string(),
            type_.to_string(),
        ),
        (
            "nvidia.com/dynamo-namespace".to_string(),
            dynamo_namespace(namespace, graph),
        ),
    ]);
    if version == "v1beta1" && has_epp && ["worker", "prefill", "decode"].contains(&type_) {
        labels.insert("nvidia.com/dynamo-component-class".into(), "worker".into());
    }
    let sub = text(c, "subComponentType");
    if version != "v1beta1" && !sub.is_empty() {
        labels.insert("nvidia.com/dynamo-sub-component-type".into(), sub.into());
    }
    labels
}

/// The InferencePool the operator makes for a graph with an endpoint picker: `<graph>-pool`
/// over its workers on the frontend port 8000, picked by the `<graph>-<epp>` Service on
/// 9002 (`GenerateInferencePool`, `internal/dynamo/epp/inference_pool.go@2a6da14c8`, where
/// workers are selected by their class; `@3e3b3b187` by their type).
pub fn inference_pool(version: &str, dgd: &Value) -> Option<Value> {
    let (epp, _) = raw_components(version, dgd)
        .into_iter()
        .find(|(_, c)| is_epp(version, c))?;
    let graph = text(&dgd["metadata"], "name");
    let namespace = text(&dgd["metadata"], "namespace");
    let worker = if version == "v1beta1" {
        "nvidia.com/dynamo-component-class"
    } else {
        "nvidia.com/dynamo-component-type"
    };
    Some(json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {
            "name": format!("{graph}-pool"),
            "namespace": namespace,
            "labels": {
                "nvidia.com/dynamo-graph-deployment-name": graph,
                "nvidia.com/dynamo-component": epp,
                "nvidia.com/dynamo-component-type": "epp",
            },
            "ownerReferences": [{
                "apiVersion": text(dgd, "apiVersion"), "kind": "DynamoGraphDeployment",
                "name": graph, "uid": text(&dgd["metadata"], "uid"), "controller": true,
            }],
        },
        "spec": {
            "targetPorts": [{"number": 8000}],
            "selector": {"matchLabels": {
                worker: "worker",
                "nvidia.com/dynamo-namespace": dynamo_namespace(namespace, graph),
            }},
            "endpointPickerRef": {
                "kind": "Service",
                "name": resource_name(graph, &epp.to_lowercase()),
                "port": {"number": 9002},
            },
        },
    }))
}

// ---- the main container ----

/// The main container a component runs: command, arguments, image and environment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Container {
    /// Command.
    pub command: Vec<String>,
    /// Arguments.
    pub args: Vec<String>,
    /// Image.
    pub image: String,
    /// Environment by name (values; `valueFrom` as an empty string).
    pub env: BTreeMap<String, String>,
}

impl Container {
    /// Command and arguments.
    pub fn argv(&self) -> Vec<String> {
        self.command.iter().chain(&self.args).cloned().collect()
    }
}

/// The operator's default main container of a kind: every component starts from
/// `/bin/sh -c` (`internal/dynamo/component_common.go:87-94`, both commits); the frontend
/// runs `python3` `-m dynamo.frontend` (`component_frontend.go:30-31`, both commits);
/// workers keep the shell with no arguments (`component_worker.go`).
pub fn default_container(kind: Kind) -> Container {
    let (command, args): (&[&str], &[&str]) = match kind {
        Kind::Frontend => (&["python3"], &["-m", "dynamo.frontend"]),
        // The image's entrypoint with the pool's flags (`GetBaseContainer`,
        // internal/dynamo/component_epp.go:108-121@2a6da14c8).
        Kind::Epp => (&[], &["--pool-name", "--pool-namespace", "--config-file"]),
        _ => (&["/bin/sh", "-c"], &[]),
    };
    Container {
        command: command.iter().map(ToString::to_string).collect(),
        args: args.iter().map(ToString::to_string).collect(),
        ..Container::default()
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

fn merge_envs(env: &mut BTreeMap<String, String>, specific: &Value) {
    for e in specific.as_array().into_iter().flatten() {
        env.insert(text(e, "name").to_string(), text(e, "value").to_string());
    }
}

/// `c`'s main container as the pod runs it: ours merged over the default with mergo
/// `WithOverride` (github.com/imdario/mergo v0.3.16, `go.mod` at both commits), where a
/// string or list replaces the default only when it is not empty (`merge.go`
/// `deepMerge`: `!isEmptyValue(src) && overwrite`), and the environment merged by name
/// (`MergeEnvs`): `graph.go:1171-1189@3e3b3b187` (then the service's `envs`),
/// `graph.go:1668-1672,1826-1843@2a6da14c8`.
pub fn main_container(c: &Component) -> Container {
    let mut out = default_container(c.kind);
    let user = &c.main;
    if !text(user, "image").is_empty() {
        out.image = text(user, "image").to_string();
    }
    let command = strings(&user["command"]);
    if !command.is_empty() {
        out.command = command;
    }
    let args = strings(&user["args"]);
    if !args.is_empty() {
        out.args = args;
    }
    merge_envs(&mut out.env, &user["env"]);
    merge_envs(&mut out.env, &c.envs);
    out
}

// ---- the process ----

/// What becomes of a component's pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// They start and serve.
    Serves,
    /// The process exits at start (a crash loop); the log line.
    Exits(String),
    /// They run and look ready, but the graph cannot serve through them; why.
    Misserves(String),
}

/// A command line's flags: `--name value`, `--name=value` or a bare `--name`, in order;
/// and the tokens that are neither.
struct Flags {
    flags: Vec<(String, Option<String>)>,
    stray: Vec<String>,
}

impl Flags {
    fn parse(tokens: &[String]) -> Self {
        let mut flags = Vec::new();
        let mut stray = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            let t = &tokens[i];
            if let Some(name) = t.strip_prefix("--") {
                if let Some((n, v)) = name.split_once('=') {
                    flags.push((n.replace('_', "-"), Some(v.to_string())));
                } else if tokens.get(i + 1).is_some_and(|n| !n.starts_with("--")) {
                    flags.push((name.replace('_', "-"), Some(tokens[i + 1].clone())));
                    i += 1;
                } else {
                    flags.push((name.replace('_', "-"), None));
                }
            } else {
                stray.push(t.clone());
            }
            i += 1;
        }
        Self { flags, stray }
    }

    fn get(&self, names: &[&str]) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(n, _)| names.contains(&n.as_str()))
            .map(|(_, v)| v.as_deref().unwrap_or(""))
    }

    fn has(&self, names: &[&str]) -> bool {
        self.get(names).is_some()
    }

    fn int(&self, names: &[&str]) -> Option<i64> {
        self.get(names).and_then(|v| v.trim().parse().ok())
    }

    fn with_prefix(&self, prefix: &str) -> bool {
        self.flags.iter().any(|(n, _)| n.starts_with(prefix))
    }
}

/// Python's repr of a list of strings, as the frontend logs its unknown arguments.
fn py_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("'{s}'")).collect();
    format!("[{}]", quoted.join(", "))
}

/// Whether `c`'s pods start and serve, for a graph of `backend` (`spec.backendFramework`).
pub fn start(backend: &str, c: &Component) -> Outcome {
    let argv = main_container(c).argv();
    if c.kind == Kind::Epp {
        // The picker is the image's entrypoint, told its pool by the operator's flags.
        return if main_container(c).command.is_empty() {
            Outcome::Serves
        } else {
            Outcome::Misserves(format!(
                "the endpoint picker's entrypoint is replaced by {argv:?}"
            ))
        };
    }
    if argv == ["/bin/sh", "-c"] {
        return Outcome::Exits("/bin/sh: -c: option requires an argument".into());
    }
    // The operator treats python, python3, python3.11 and paths to them as Python
    // (`isPythonCommand`, internal/dynamo/backend_sglang.go:18-26@3e3b3b187).
    let python = argv.first().is_some_and(|p| {
        let base = p.rsplit('/').next().unwrap_or(p);
        base.strip_prefix("python")
            .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
    });
    if !python || argv.get(1).map(String::as_str) != Some("-m") {
        return Outcome::Misserves(format!(
            "the stand-in plays only `python -m dynamo.<component>` command lines, not {argv:?}"
        ));
    }
    let module = argv.get(2).cloned().unwrap_or_default();
    let expected = match c.kind {
        Kind::Frontend => "dynamo.frontend".to_string(),
        Kind::Other => return Outcome::Serves,
        _ => format!("dynamo.{backend}"),
    };
    if module != expected {
        return Outcome::Misserves(format!("{} runs {module}, not {expected}", c.name));
    }
    let flags = Flags::parse(&argv[3..]);
    match c.kind {
        Kind::Frontend => frontend(&flags),
        _ => worker(backend, c, &flags),
    }
}

/// The frontend parses its own flags and exits on anything else, unless a chat processor
/// takes the rest (`components/src/dynamo/frontend/main.py:95-152@3e3b3b187`, default
/// `--dyn-chat-processor dynamo`, `frontend_args.py:425-437`). A single-dash token other
/// than its `-i` is unknown, and so is a value that follows no flag.
fn frontend(flags: &Flags) -> Outcome {
    let unknown: Vec<String> = flags
        .stray
        .iter()
        .filter(|t| t.as_str() != "-i")
        .cloned()
        .collect();
    if unknown.is_empty()
        || flags
            .get(&["dyn-chat-processor"])
            .is_some_and(|p| p != "dynamo")
    {
        Outcome::Serves
    } else {
        Outcome::Exits(format!(
            "Unknown arguments specified: {}",
            py_list(&unknown)
        ))
    }
}

fn worker(backend: &str, c: &Component, flags: &Flags) -> Outcome {
    let mode = flags.get(&["disaggregation-mode"]).unwrap_or("");
    let disaggregated = matches!(mode, "prefill" | "decode");
    match backend {
        // components/src/dynamo/vllm/args.py:192-207@3e3b3b187, :230-245@2a6da14c8
        "vllm" if mode == "prefill" && !flags.has(&["kv-transfer-config"]) => {
            return Outcome::Exits(
                "ValueError: --connector is deprecated and the default is no longer nixl. When using --disaggregation-mode prefill, you must explicitly provide --kv-transfer-config. Example:\n  --kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'".into(),
            );
        }
        // SGLang's prefill bootstrap server binds --host (default 127.0.0.1):
        // sgl-project/sglang python/sglang/srt/managers/disagg_service.py@0351c1fa,
        // server_args.py; the upstream examples pass --host 0.0.0.0
        // (examples/backends/sglang/deploy/disagg.yaml at both commits).
        "sglang"
            if mode == "prefill"
                && flags
                    .get(&["host"])
                    .is_none_or(|h| h.starts_with("127.") || h == "localhost") =>
        {
            return Outcome::Misserves(
                "SGLang's prefill bootstrap server listens on 127.0.0.1 (--host), out of the decode workers' reach".into(),
            );
        }
        // TensorRT-LLM transfers no KV cache without cache_transceiver_config
        // (docs/.../tensorrt-llm-details/kv-cache-transfer.md@2a6da14c8; "workers ...
        // assert on the first request", release notes 1.2.0, PR #8954).
        "trtllm" if disaggregated && !trtllm_transceiver(flags) => {
            return Outcome::Misserves(format!(
                "TensorRT-LLM {mode} worker without cache_transceiver_config: KV cache transfer is disabled and the worker asserts on its first request"
            ));
        }
        _ => {}
    }
    parallelism(backend, c, flags)
}

fn trtllm_transceiver(flags: &Flags) -> bool {
    if flags.has(&["extra-engine-args"]) || flags.with_prefix("trtllm.cache-transceiver-config") {
        // An engine configuration file the stand-in cannot read is taken on trust.
        return true;
    }
    flags
        .get(&["override-engine-args"])
        .and_then(|j| serde_json::from_str::<Value>(j).ok())
        .is_some_and(|v| v["cache_transceiver_config"]["backend"].is_string())
}

/// The engine's ranks (tensor x pipeline x data parallel, each 1 unless set) against the
/// pod's GPUs: more ranks than GPUs cannot start; fewer leave GPUs idle, so a model sized
/// for all of them does not fit. Flag spellings: vLLM
/// `--tensor-parallel-size`/`--pipeline-parallel-size`/`--data-parallel-size`; SGLang also
/// `--tp`/`--tp-size`, `--pp-size`, `--dp-size`; TensorRT-LLM
/// `--tensor-parallel-size`/`--pipeline-parallel-size`
/// (components/src/dynamo/trtllm/backend_args.py:47-62@3e3b3b187), overridden by
/// `--override-engine-args` (llm_worker.py:289-299).
fn parallelism(backend: &str, c: &Component, flags: &Flags) -> Outcome {
    if c.gpus < 1 {
        return Outcome::Serves;
    }
    let (tp, pp, dp): (&[&str], &[&str], &[&str]) = match backend {
        "sglang" => (
            &["tensor-parallel-size", "tp-size", "tp"],
            &["pipeline-parallel-size", "pp-size"],
            &["data-parallel-size", "dp-size"],
        ),
        "trtllm" => (&["tensor-parallel-size"], &["pipeline-parallel-size"], &[]),
        _ => (
            &["tensor-parallel-size"],
            &["pipeline-parallel-size"],
            &["data-parallel-size"],
        ),
    };
    if backend == "trtllm" && flags.has(&["extra-engine-args"]) {
        return Outcome::Serves;
    }
    let engine = flags
        .get(&["override-engine-args"])
        .and_then(|j| serde_json::from_str::<Value>(j).ok())
        .unwrap_or(Value::Null);
    let ranks = engine["tensor_parallel_size"]
        .as_i64()
        .or(flags.int(tp))
        .unwrap_or(1)
        * engine["pipeline_parallel_size"]
            .as_i64()
            .or(flags.int(pp))
            .unwrap_or(1)
        * flags.int(dp).unwrap_or(1);
    match ranks.cmp(&c.gpus) {
        std::cmp::Ordering::Greater => Outcome::Exits(format!(
            "{ranks} ranks (tensor x pipeline x data parallel) exceed the {} GPUs of the pod",
            c.gpus
        )),
        std::cmp::Ordering::Less => Outcome::Misserves(format!(
            "{} uses {ranks} of its {} GPUs (tensor parallelism not set from the GPU count)",
            c.name, c.gpus
        )),
        std::cmp::Ordering::Equal => Outcome::Serves,
    }
}

// ---- status ----

/// The resource the controller names a component by: `<dgd>-<component lowercased>`
/// (`GetDCDResourceName`, internal/dynamo/graph.go:499-505@3e3b3b187, :745-751@2a6da14c8).
pub fn resource_name(dgd: &str, component: &str) -> String {
    format!("{dgd}-{}", component.to_lowercase())
}

/// One component's replica status as the controller writes it (v1alpha1 requires
/// `componentName`, both require `updatedReplicas`; see the CRDs).
pub fn replica_status(version: &str, resource: &str, replicas: i64, ready: i64) -> Value {
    let mut s = json!({
        "componentKind": "Deployment", "componentNames": [resource],
        "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": ready,
        "availableReplicas": ready,
    });
    if version == "v1alpha1" {
        s["componentName"] = json!(resource);
    }
    s
}

/// A multinode component's replica status (Grove's PodCliqueScalingGroup): no
/// `readyReplicas`, `availableReplicas` instead (the CRDs' descriptions of
/// `status.{services,components}.*.readyReplicas`).
pub fn scaling_group_status(version: &str, resource: &str, replicas: i64, available: i64) -> Value {
    let mut s = replica_status(version, resource, replicas, available);
    s["componentKind"] = json!("PodCliqueScalingGroup");
    if let Some(o) = s.as_object_mut() {
        o.remove("readyReplicas");
    }
    s
}

fn ready(status: &str, reason: &str, message: &str) -> Value {
    json!({
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    })
}

/// The status the controller writes once every component's pods have come up as
/// `outcomes` say (`None`: still starting): `successful` when all serve; else `pending`
/// naming each resource not available, sorted
/// (`controller/dynamographdeployment_controller.go:1098-1134@3e3b3b187`,
/// `controller/dgd_workload_result.go:48-80@2a6da14c8`; a component is available when its
/// Deployment is, `DynamoComponentDeployment.IsReady`). Pods that run but misserve are
/// ready as far as the operator can tell.
pub fn status(version: &str, dgd: &str, outcomes: &[(Component, Option<Outcome>)]) -> Value {
    let per = if version == "v1beta1" {
        "components"
    } else {
        "services"
    };
    let mut replicas = serde_json::Map::new();
    let mut not_ready = Vec::new();
    for (c, outcome) in outcomes {
        let resource = resource_name(dgd, &c.name);
        let up = matches!(outcome, Some(Outcome::Serves | Outcome::Misserves(_)));
        if !up {
            not_ready.push(format!(
                "{resource}: Component deployment not ready - Available condition not true"
            ));
        }
        replicas.insert(
            c.name.clone(),
            replica_status(
                version,
                &resource,
                c.replicas,
                if up { c.replicas } else { 0 },
            ),
        );
    }
    not_ready.sort();
    if not_ready.is_empty() {
        json!({
            "state": "successful",
            "conditions": [ready("True", "all_resources_are_ready", "All resources are ready")],
            per: replicas,
        })
    } else {
        json!({
            "state": "pending",
            "conditions": [ready("False", "some_resources_are_not_ready", &format!("Resources not ready: {}", not_ready.join("; ")))],
            per: replicas,
        })
    }
}

/// The status of a reconcile error: `failed`, with the reason and the error
/// (`dynamographdeployment_controller.go:124-150,212-217@3e3b3b187`,
/// `dgd_workload_program.go:128-137@2a6da14c8`).
pub fn failed(reason: &str, message: &str) -> Value {
    json!({"state": "failed", "conditions": [ready("False", reason, message)]})
}

/// What the controller makes of `dgd` in a cluster where `claims` exist: a reconcile
/// error (v1alpha1 `spec.pvcs` naming a missing claim with `create: false`,
/// `dynamographdeployment_controller.go:300-305,1234-1330@3e3b3b187`), else the status of
/// its components' outcomes.
pub fn reconcile(
    version: &str,
    dgd: &Value,
    claims: &BTreeSet<String>,
) -> (Value, Vec<(Component, Outcome)>) {
    let name = text(&dgd["metadata"], "name");
    if version == "v1alpha1" {
        for pvc in dgd["spec"]["pvcs"].as_array().into_iter().flatten() {
            let claim = text(pvc, "name");
            if pvc["create"] != json!(true) && !claims.contains(claim) {
                return (
                    failed(
                        "failed_to_reconcile_the_resources",
                        &format!(
                            "failed to reconcile top-level PVCs: persistentvolumeclaims \"{claim}\" not found"
                        ),
                    ),
                    Vec::new(),
                );
            }
        }
    }
    let backend = text(&dgd["spec"], "backendFramework");
    let outcomes: Vec<(Component, Outcome)> = components(version, dgd)
        .into_iter()
        .map(|c| {
            let o = start(backend, &c);
            (c, o)
        })
        .collect();
    let with: Vec<(Component, Option<Outcome>)> = outcomes
        .iter()
        .map(|(c, o)| (c.clone(), Some(o.clone())))
        .collect();
    (status(version, name, &with), outcomes)
}

// ---- the loop ----

/// The stand-in controller running against a test API server (the API server calls the
/// webhook itself, see [`serve_webhook`]): for every DynamoGraphDeployment of its version
/// (but those labelled [`MANUAL_STATUS_LABEL`]) it writes `pending` with every component
/// starting, then on its next pass the status [`reconcile`] gives. Components that would
/// crash or misserve it records in [`StandIn::problems`] (the test asserts there are
/// none).
#[derive(Debug)]
pub struct StandIn {
    problems: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StandIn {
    /// Start playing Dynamo at `version` on `client`'s cluster, where `claims` exist.
    pub fn spawn(
        client: Client,
        resource: ApiResource,
        version: &'static str,
        claims: BTreeSet<String>,
    ) -> Self {
        let problems = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(run(client, resource, version, claims, problems.clone()));
        Self { problems, task }
    }

    /// What the real operator and engines would have refused or failed to serve so far.
    pub fn problems(&self) -> Vec<String> {
        self.problems
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Per object (by uid): the generation played, and whether its final status is written.
type Seen = HashMap<String, (i64, bool)>;

async fn run(
    client: Client,
    resource: ApiResource,
    version: &'static str,
    claims: BTreeSet<String>,
    problems: Arc<Mutex<Vec<String>>>,
) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut seen = Seen::new();
    let record = |p: String| {
        problems
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(p);
    };
    loop {
        if let Ok(list) = api.list(&ListParams::default()).await {
            for dgd in list.items {
                if dgd.labels().contains_key(MANUAL_STATUS_LABEL)
                    || dgd.metadata.deletion_timestamp.is_some()
                {
                    continue;
                }
                let uid = dgd.uid().unwrap_or_default();
                let generation = dgd.metadata.generation.unwrap_or(0);
                let value = serde_json::to_value(&dgd).unwrap_or_default();
                let ns = dgd.namespace().unwrap_or_default();
                let name = dgd.name_any();
                let next = match seen.get(&uid) {
                    Some(&(g, true)) if g == generation => continue,
                    Some(&(g, false)) if g == generation => {
                        let (next, outcomes) = reconcile(version, &value, &claims);
                        for (c, o) in outcomes {
                            match o {
                                Outcome::Serves => {}
                                Outcome::Exits(why) | Outcome::Misserves(why) => {
                                    record(format!("{ns}/{name} {}: {why}", c.name));
                                }
                            }
                        }
                        seen.insert(uid, (generation, true));
                        next
                    }
                    _ => {
                        seen.insert(uid, (generation, false));
                        let starting: Vec<(Component, Option<Outcome>)> =
                            components(version, &value)
                                .into_iter()
                                .map(|c| (c, None))
                                .collect();
                        status(version, &name, &starting)
                    }
                };
                if let Some(pool) = inference_pool(version, &value) {
                    let pools = ApiResource {
                        group: "inference.networking.k8s.io".into(),
                        version: "v1".into(),
                        api_version: "inference.networking.k8s.io/v1".into(),
                        kind: "InferencePool".into(),
                        plural: "inferencepools".into(),
                    };
                    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &pools);
                    let params = kube::api::PatchParams::apply("dynamo-operator-stand-in").force();
                    if let Err(e) = api
                        .patch(
                            &format!("{name}-pool"),
                            &params,
                            &kube::api::Patch::Apply(&pool),
                        )
                        .await
                    {
                        record(format!("{ns}/{name}: the InferencePool: {e}"));
                    }
                }
                let _ = kubeairunway_sdk::testing::write_upstream_status(
                    &client, &resource, &ns, &name, next,
                )
                .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
