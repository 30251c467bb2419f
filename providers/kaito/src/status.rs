//! KAITO's status, read as ours (design §5; not the seed's 004 §4.9 table).
//!
//! Workspace:
//! - `status.state` (KAITO >= v0.9): `Ready` is Running; `Pending` and `NotReady` are
//!   Deploying. Older Workspaces without `state`: `WorkspaceSucceeded=True` is Running.
//! - `WorkspaceSucceeded=False` with reason `workspacePending` is normal progress.
//! - Failed only for `InferenceReady=False` with a hard reason (image pull, crash loop,
//!   OOM kill, container start error), with that condition's message.
//! - Endpoint: KAITO's Service `<name>`, port 80 (targeting 5000 in the pods).
//!
//! InferenceSet: `status.readyReplicas` of `spec.replicas` Workspaces; a condition that is
//! False with a hard reason is a failure.

use kube::ResourceExt;
use kube::api::DynamicObject;
use kubeairunway_sdk::Observed;
use kubeairunway_sdk::api::ModelDeployment;
use serde_json::Value;

/// The port of KAITO's Service for a Workspace.
pub const SERVICE_PORT: i32 = 80;

/// Condition reasons of `InferenceReady=False` that mean the pods cannot run as they
/// stand (KAITO's names, and the kubelet's where KAITO passes them through).
pub const HARD_REASONS: &[&str] = &[
    "ImagePullError",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ContainerCrashLoopBackOff",
    "CrashLoopBackOff",
    "ContainerOOMKilled",
    "OOMKilled",
    "ContainerStartError",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Our status for `md` from the live Workspace or InferenceSet.
pub fn observe(md: &ModelDeployment, live: Option<&DynamicObject>) -> Observed {
    let Some(live) = live else {
        return Observed::deploying("waiting for the KAITO Workspace to be created");
    };
    let kind = live
        .types
        .as_ref()
        .map(|t| t.kind.as_str())
        .unwrap_or_default();
    if kind == "InferenceSet" {
        return inference_set(md, live);
    }
    workspace(live)
}

fn conditions(live: &DynamicObject) -> Vec<&Value> {
    live.data["status"]["conditions"]
        .as_array()
        .map(|c| c.iter().collect())
        .unwrap_or_default()
}

fn field<'a>(condition: &'a Value, key: &str) -> &'a str {
    condition[key].as_str().unwrap_or_default()
}

fn find<'a>(conditions: &[&'a Value], type_: &str) -> Option<&'a Value> {
    conditions
        .iter()
        .copied()
        .find(|c| field(c, "type") == type_)
}

fn hard_failure(condition: &Value) -> Option<String> {
    (field(condition, "status") == "False" && HARD_REASONS.contains(&field(condition, "reason")))
        .then(|| {
            let message = field(condition, "message");
            if message.is_empty() {
                format!(
                    "{}: {}",
                    field(condition, "type"),
                    field(condition, "reason")
                )
            } else {
                message.to_string()
            }
        })
}

fn workspace(live: &DynamicObject) -> Observed {
    let name = live.name_any();
    let conditions = conditions(live);
    let state = live.data["status"]["state"].as_str().unwrap_or_default();
    let inference = find(&conditions, "InferenceReady");
    let succeeded = find(&conditions, "WorkspaceSucceeded");

    let observed = if let Some(message) = inference.and_then(hard_failure) {
        Observed::failed(message)
    } else if state == "Ready"
        || (state.is_empty() && succeeded.is_some_and(|c| field(c, "status") == "True"))
    {
        Observed::running("KAITO Workspace is ready")
    } else {
        Observed::deploying(progress(state, &conditions))
    };
    let ready = i32::from(observed.ready);
    observed
        .with_endpoint(name, SERVICE_PORT)
        .with_replicas(1, ready)
}

/// The most telling detail of a Workspace on its way: the first condition not yet True,
/// in the order KAITO works through them.
fn progress(state: &str, conditions: &[&Value]) -> String {
    let pending = ["ResourceReady", "InferenceReady", "WorkspaceSucceeded"]
        .iter()
        .filter_map(|t| find(conditions, t))
        .find(|c| field(c, "status") != "True" && !field(c, "message").is_empty());
    match (pending, state) {
        (Some(c), "") => field(c, "message").to_string(),
        (Some(c), state) => format!("KAITO Workspace is {state}: {}", field(c, "message")),
        (None, "") => "waiting for KAITO to report the Workspace status".to_string(),
        (None, state) => format!("KAITO Workspace is {state}"),
    }
}

fn inference_set(md: &ModelDeployment, live: &DynamicObject) -> Observed {
    let conditions = conditions(live);
    let desired = live.data["spec"]["replicas"]
        .as_i64()
        .and_then(|r| i32::try_from(r).ok())
        .unwrap_or(md.spec.scaling.replicas);
    let ready = live.data["status"]["readyReplicas"]
        .as_i64()
        .and_then(|r| i32::try_from(r).ok())
        .unwrap_or(0);
    let failure = conditions.iter().find_map(|c| hard_failure(c));
    let observed = if let Some(message) = failure {
        Observed::failed(message)
    } else if ready >= desired {
        Observed::running(format!(
            "KAITO InferenceSet has {ready}/{desired} Workspaces ready"
        ))
    } else {
        Observed::deploying(format!(
            "KAITO InferenceSet has {ready}/{desired} Workspaces ready"
        ))
    };
    observed.with_replicas(desired, ready)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::needless_pass_by_value)]
    use super::*;
    use kubeairunway_sdk::api::Phase;
    use serde_json::json;

    fn md() -> ModelDeployment {
        serde_json::from_value(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"model": {"id": "a/b"}, "engine": {"type": "vllm"}},
        }))
        .unwrap()
    }

    fn ws(status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kaito.sh/v1beta1", "kind": "Workspace",
            "metadata": {"name": "m", "namespace": "ns"},
            "status": status,
        }))
        .unwrap()
    }

    fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    fn seen(status: Value) -> Observed {
        observe(&md(), Some(&ws(status)))
    }

    #[test]
    fn no_workspace_yet_is_deploying() {
        let o = observe(&md(), None);
        assert_eq!(o.phase, Phase::Deploying);
        assert!(o.endpoint.is_none());
    }

    #[test]
    fn ready_state_is_running_with_the_service_endpoint() {
        let o = seen(json!({"state": "Ready", "conditions": [
            cond("WorkspaceSucceeded", "True", "workspaceSucceeded", "workspace succeeds"),
            cond("InferenceReady", "True", "InferenceReady", "inference is ready"),
        ]}));
        assert_eq!(o.phase, Phase::Running);
        assert!(o.ready);
        let e = o.endpoint.unwrap();
        assert_eq!((e.service.as_deref(), e.port), (Some("m"), Some(80)));
        let r = o.replicas.unwrap();
        assert_eq!((r.desired, r.ready), (Some(1), Some(1)));
    }

    #[test]
    fn pending_and_not_ready_are_deploying_with_kaito_words() {
        let o = seen(json!({"state": "Pending"}));
        assert_eq!(
            (o.phase, o.message.as_str()),
            (Phase::Deploying, "KAITO Workspace is Pending")
        );
        let o = seen(json!({"state": "NotReady", "conditions": [
            cond("ResourceReady", "True", "ok", "nodes ready"),
            cond("InferenceReady", "False", "InferenceNotReady", "inference deployment is not ready: 0/1"),
        ]}));
        assert_eq!(o.phase, Phase::Deploying);
        assert_eq!(
            o.message,
            "KAITO Workspace is NotReady: inference deployment is not ready: 0/1"
        );
        assert_eq!(o.replicas.unwrap().ready, Some(0));
    }

    #[test]
    fn workspace_pending_is_progress_not_failure() {
        let o = seen(json!({"conditions": [
            cond("WorkspaceSucceeded", "False", "workspacePending", "workspace is pending"),
        ]}));
        assert_eq!(
            (o.phase, o.message.as_str()),
            (Phase::Deploying, "workspace is pending")
        );
    }

    #[test]
    fn hard_inference_failures_fail_with_the_condition_message() {
        for reason in [
            "ImagePullError",
            "ContainerCrashLoopBackOff",
            "ContainerOOMKilled",
            "ContainerStartError",
        ] {
            let o = seen(json!({"state": "NotReady", "conditions": [
                cond("InferenceReady", "False", reason, &format!("pod failed: {reason}")),
                cond("WorkspaceSucceeded", "False", "workspacePending", "pending"),
            ]}));
            assert_eq!(o.phase, Phase::Failed, "{reason}");
            assert_eq!(o.message, format!("pod failed: {reason}"));
            assert!(!o.ready);
        }
        // A soft InferenceReady=False is still progress.
        let o = seen(
            json!({"conditions": [cond("InferenceReady", "False", "InferenceNotReady", "0/1 ready")]}),
        );
        assert_eq!(o.phase, Phase::Deploying);
    }

    #[test]
    fn older_workspaces_without_state_use_workspace_succeeded() {
        let o = seen(
            json!({"conditions": [cond("WorkspaceSucceeded", "True", "workspaceSucceeded", "ok")]}),
        );
        assert_eq!(o.phase, Phase::Running);
        let o = seen(json!({}));
        assert_eq!(o.phase, Phase::Deploying);
        assert_eq!(
            o.message,
            "waiting for KAITO to report the Workspace status"
        );
    }

    #[test]
    fn inference_set_counts_ready_workspaces() {
        let iset = |status: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "kaito.sh/v1alpha1", "kind": "InferenceSet",
                "metadata": {"name": "m"}, "spec": {"replicas": 3}, "status": status,
            }))
            .unwrap()
        };
        let o = observe(
            &md(),
            Some(&iset(json!({"readyReplicas": 1, "replicas": 3}))),
        );
        assert_eq!(o.phase, Phase::Deploying);
        let r = o.replicas.unwrap();
        assert_eq!((r.desired, r.ready), (Some(3), Some(1)));
        let o = observe(&md(), Some(&iset(json!({"readyReplicas": 3}))));
        assert_eq!(o.phase, Phase::Running);
        assert!(o.endpoint.is_none());
        let o = observe(
            &md(),
            Some(&iset(
                json!({"conditions": [cond("InferenceReady", "False", "ImagePullError", "bad image")]}),
            )),
        );
        assert_eq!((o.phase, o.message.as_str()), (Phase::Failed, "bad image"));
    }
}
