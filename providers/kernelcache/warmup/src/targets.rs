//! Which nodes a Warmup warms, from the cached Nodes: pure functions.
//!
//! - `targetNodes`: the nodes matching `nodeSelector`, and those named in `nodeNames`. A
//!   name without a Node, or a node whose scheduling taints the warmup pods do not
//!   tolerate, is a failed node (`NodeNotFound`, `UntoleratedTaint`): a pod there would
//!   wait forever.
//! - `targetModelDeployment`: the nodes where the ModelDeployment's pods can be scheduled:
//!   matching its `nodeSelector`, every scheduling taint tolerated by its `tolerations`
//!   (a cordoned node counts as tainted), and, when it asks for GPUs, with that GPU
//!   resource allocatable.
//!
//! Scheduling taints are those of effect `NoSchedule` and `NoExecute`, as kube-scheduler's
//! TaintToleration filter reads them (`DoNotScheduleTaintsFilterFunc`,
//! pkg/scheduler/framework/plugins/helper/taint.go in kubernetes); `spec.unschedulable`
//! is the taint `node.kubernetes.io/unschedulable:NoSchedule` (the NodeUnschedulable
//! filter). A toleration matches as `Toleration.ToleratesTaint` says
//! (`staging/src/k8s.io/api/core/v1/toleration.go@v0.36.4`).

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::gpu;

use kubeairunway_sdk::api::WarmupSpec;
use kubeairunway_sdk::api::warmup::reasons;

/// The taint kube-scheduler sees on a cordoned node.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// A node to warm, or why it cannot be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The node's name.
    pub node: String,
    /// Why no warmup pod can run there: `(reason, message)`.
    pub blocked: Option<(&'static str, String)>,
}

/// Whether `toleration` tolerates `taint` (`Toleration.ToleratesTaint` of k8s.io/api
/// v0.36.4, with the numeric `Lt`/`Gt` operators).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    let value = toleration.value.as_deref().unwrap_or_default();
    let taint_value = taint.value.as_deref().unwrap_or_default();
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => value == taint_value,
        "Exists" => true,
        op @ ("Lt" | "Gt") => match (value.parse::<i64>(), taint_value.parse::<i64>()) {
            (Ok(t), Ok(v)) => {
                if op == "Lt" {
                    v < t
                } else {
                    v > t
                }
            }
            _ => false,
        },
        _ => false,
    }
}

/// The first scheduling taint of `node` that none of `tolerations` tolerates.
pub fn untolerated_taint(node: &Node, tolerations: &[Toleration]) -> Option<Taint> {
    let spec = node.spec.as_ref();
    let mut taints: Vec<Taint> = spec
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .collect();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        taints.push(Taint {
            key: UNSCHEDULABLE_TAINT.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        });
    }
    taints
        .into_iter()
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

fn matches_selector(node: &Node, selector: &BTreeMap<String, String>) -> bool {
    let labels = node.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// Whether `node` has some of the extended resource `resource` allocatable (capacity when
/// the kubelet has not reported allocatable).
fn has_resource(node: &Node, resource: &str) -> bool {
    let status = node.status.as_ref();
    let quantity = status
        .and_then(|s| s.allocatable.as_ref())
        .or_else(|| status.and_then(|s| s.capacity.as_ref()))
        .and_then(|r| r.get(resource));
    quantity.is_some_and(|q| {
        let digits: String = q.0.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u64>().is_ok_and(|n| n > 0)
    })
}

/// The GPU resources a ModelDeployment's pods ask for (empty: CPU only), as every
/// provider renders them ([`gpu::per_replica`]).
pub fn gpu_resources(md: &ModelDeployment) -> BTreeSet<String> {
    gpu::Role::of(md.spec.serving.mode)
        .iter()
        .map(|role| gpu::per_replica(&md.spec, *role))
        .filter(|g| g.count > 0)
        .map(|g| g.resource)
        .collect()
}

/// The nodes where `md`'s pods can be scheduled, by name, sorted.
pub fn model_nodes<'a, N: Borrow<Node>>(md: &ModelDeployment, nodes: &'a [N]) -> Vec<&'a str> {
    let selector = md.spec.node_selector.clone().unwrap_or_default();
    let tolerations = md.spec.tolerations.clone().unwrap_or_default();
    let gpus = gpu_resources(md);
    let mut out: Vec<&str> = nodes
        .iter()
        .map(Borrow::borrow)
        .filter(|n| matches_selector(n, &selector))
        .filter(|n| untolerated_taint(n, &tolerations).is_none())
        .filter(|n| gpus.is_empty() || gpus.iter().any(|g| has_resource(n, g)))
        .map(name)
        .collect();
    out.sort_unstable();
    out
}

/// The nodes `spec` targets, sorted by name; `md` is its targetModelDeployment (absent:
/// no node). `tolerations` are those the warmup pods carry.
pub fn targets<N: Borrow<Node>>(
    spec: &WarmupSpec,
    md: Option<&ModelDeployment>,
    nodes: &[N],
    tolerations: &[Toleration],
) -> Vec<Target> {
    let by_name: BTreeMap<&str, &Node> = nodes
        .iter()
        .map(|n| (name(n.borrow()), n.borrow()))
        .collect();
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    if let Some(t) = &spec.target_nodes {
        if let Some(selector) = &t.node_selector {
            wanted.extend(
                by_name
                    .values()
                    .filter(|n| matches_selector(n, selector))
                    .map(|n| name(n).to_string()),
            );
        }
        wanted.extend(t.node_names.iter().flatten().cloned());
    } else if let Some(md) = md {
        wanted.extend(model_nodes(md, nodes).into_iter().map(str::to_string));
    }
    wanted
        .into_iter()
        .map(|node| {
            let blocked = match by_name.get(node.as_str()) {
                None => Some((
                    reasons::NODE_NOT_FOUND,
                    format!("there is no Node '{node}'"),
                )),
                Some(n) => untolerated_taint(n, tolerations).map(|t| {
                    (
                        reasons::UNTOLERATED_TAINT,
                        format!(
                            "the warmup pods do not tolerate the taint {}={}:{} (add it to spec.tolerations)",
                            t.key,
                            t.value.unwrap_or_default(),
                            t.effect
                        ),
                    )
                }),
            };
            Target { node, blocked }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::needless_pass_by_value)] // JSON literals built in place
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: serde_json::Value, spec: serde_json::Value, gpus: u32) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
            "status": {"allocatable": {"nvidia.com/gpu": gpus.to_string(), "cpu": "8"}},
        }))
        .unwrap()
    }

    fn toleration(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).unwrap()
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            ..Taint::default()
        }
    }

    #[test]
    fn tolerations_match_as_kubernetes_does() {
        let gpu = taint("nvidia.com/gpu", "present", "NoSchedule");
        assert!(tolerates(
            &toleration(json!({"key": "nvidia.com/gpu", "operator": "Exists"})),
            &gpu
        ));
        assert!(tolerates(
            &toleration(json!({"key": "nvidia.com/gpu", "value": "present"})),
            &gpu
        ));
        assert!(!tolerates(
            &toleration(json!({"key": "nvidia.com/gpu", "value": "absent"})),
            &gpu
        ));
        assert!(!tolerates(
            &toleration(
                json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"})
            ),
            &gpu
        ));
        assert!(
            tolerates(&toleration(json!({"operator": "Exists"})), &gpu),
            "an empty key with Exists tolerates everything"
        );
        let level = taint("level", "5", "NoSchedule");
        assert!(tolerates(
            &toleration(json!({"key": "level", "operator": "Gt", "value": "3"})),
            &level
        ));
        assert!(!tolerates(
            &toleration(json!({"key": "level", "operator": "Lt", "value": "3"})),
            &level
        ));
        assert!(!tolerates(
            &toleration(json!({"key": "level", "operator": "Lt", "value": "x"})),
            &level
        ));
    }

    #[test]
    fn only_scheduling_taints_and_cordons_keep_pods_away() {
        let soft = node(
            "a",
            json!({}),
            json!({"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}),
            0,
        );
        assert!(untolerated_taint(&soft, &[]).is_none());
        let cordoned = node("b", json!({}), json!({"unschedulable": true}), 0);
        assert_eq!(
            untolerated_taint(&cordoned, &[]).unwrap().key,
            UNSCHEDULABLE_TAINT
        );
        let tolerated = [toleration(
            json!({"key": UNSCHEDULABLE_TAINT, "operator": "Exists"}),
        )];
        assert!(untolerated_taint(&cordoned, &tolerated).is_none());
    }

    fn md(spec: serde_json::Value) -> ModelDeployment {
        serde_json::from_value(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "llama", "namespace": "ml"},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn a_model_runs_where_its_selector_taints_and_gpu_allow() {
        let gpu_taint = json!({"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]});
        let nodes = [
            node("gpu-b", json!({"pool": "h100"}), gpu_taint.clone(), 8),
            node("gpu-a", json!({"pool": "h100"}), gpu_taint.clone(), 8),
            node("gpu-none", json!({"pool": "h100"}), gpu_taint, 0),
            node("gpu-untainted", json!({"pool": "h100"}), json!({}), 4),
            node("cpu", json!({"pool": "cpu"}), json!({}), 0),
            node(
                "gpu-cordoned",
                json!({"pool": "h100"}),
                json!({"unschedulable": true}),
                8,
            ),
        ];
        let gpu_model = md(json!({
            "model": {"id": "a/b"}, "engine": {"type": "vllm"},
            "resources": {"gpu": {"count": 1}},
            "nodeSelector": {"pool": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        }));
        assert_eq!(
            model_nodes(&gpu_model, &nodes),
            ["gpu-a", "gpu-b", "gpu-untainted"]
        );
        let untolerant = md(json!({
            "model": {"id": "a/b"}, "engine": {"type": "vllm"},
            "resources": {"gpu": {"count": 1}},
        }));
        assert_eq!(model_nodes(&untolerant, &nodes), ["gpu-untainted"]);
        let cpu_model = md(json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}));
        assert_eq!(model_nodes(&cpu_model, &nodes), ["cpu", "gpu-untainted"]);
        let amd = md(json!({
            "model": {"id": "a/b"}, "engine": {"type": "vllm"},
            "resources": {"gpu": {"count": 1, "type": "amd.com/gpu"}},
        }));
        assert!(model_nodes(&amd, &nodes).is_empty());
        // `type: ""` (which the CRD accepts) is the default GPU, as the providers render it.
        let empty_type = md(json!({
            "model": {"id": "a/b"}, "engine": {"type": "vllm"},
            "resources": {"gpu": {"count": 1, "type": ""}},
        }));
        assert_eq!(model_nodes(&empty_type, &nodes), ["gpu-untainted"]);
        let disaggregated = md(json!({
            "model": {"id": "a/b"}, "engine": {"type": "vllm"}, "serving": {"mode": "disaggregated"},
            "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 2, "type": "amd.com/gpu"}}},
        }));
        assert_eq!(
            gpu_resources(&disaggregated)
                .into_iter()
                .collect::<Vec<_>>(),
            ["amd.com/gpu", "nvidia.com/gpu"]
        );
    }

    #[test]
    fn target_nodes_by_selector_and_name_with_what_blocks_them() {
        let nodes = [
            node("a", json!({"pool": "x"}), json!({}), 0),
            node(
                "b",
                json!({"pool": "x"}),
                json!({"taints": [{"key": "dedicated", "value": "infer", "effect": "NoExecute"}]}),
                0,
            ),
            node("c", json!({"pool": "y"}), json!({}), 0),
        ];
        let spec: WarmupSpec = serde_json::from_value(json!({
            "targetNodes": {"nodeSelector": {"pool": "x"}, "nodeNames": ["c", "gone", "a"]},
            "imagesPreload": {"items": ["i"]},
        }))
        .unwrap();
        let t = targets(&spec, None, &nodes, &[]);
        let names: Vec<_> = t.iter().map(|t| t.node.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "gone"]);
        assert_eq!(t[0].blocked, None);
        assert_eq!(t[1].blocked.as_ref().unwrap().0, reasons::UNTOLERATED_TAINT);
        assert!(
            t[1].blocked
                .as_ref()
                .unwrap()
                .1
                .contains("dedicated=infer:NoExecute"),
            "{:?}",
            t[1]
        );
        assert_eq!(t[3].blocked.as_ref().unwrap().0, reasons::NODE_NOT_FOUND);
        let tolerant = [toleration(
            json!({"key": "dedicated", "operator": "Exists"}),
        )];
        assert_eq!(targets(&spec, None, &nodes, &tolerant)[1].blocked, None);
        let by_model: WarmupSpec = serde_json::from_value(json!({
            "targetModelDeployment": {"name": "llama"},
        }))
        .unwrap();
        assert!(
            targets(&by_model, None, &nodes, &[]).is_empty(),
            "no model, no nodes"
        );
        let cpu_model = md(
            json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}, "nodeSelector": {"pool": "x"}}),
        );
        let t = targets(&by_model, Some(&cpu_model), &nodes, &[]);
        assert_eq!(
            t,
            [Target {
                node: "a".into(),
                blocked: None
            }]
        );
    }
}
