//! KAITO's status, read as ours, from the values KAITO's controllers really write
//! (docs/upstream.md#kaito-status).
//!
//! Workspace:
//! - `status.state` (KAITO >= v0.9): `Ready` is Running; `Pending` and `NotReady` are
//!   Deploying. Older Workspaces without `state`: `WorkspaceSucceeded=True` is Running.
//! - `WorkspaceSucceeded=False` with reason `workspacePending` is normal progress.
//! - Failed for `InferenceReady=False` with a hard reason (image pull, crash loop,
//!   OOM kill, container start error), with that condition's message; and for KAITO
//!   v0.12's terminal benchmark failure, `WorkspaceSucceeded` or `BenchmarkCompleted`
//!   False `BenchmarkFailed` (the inference is up, but KAITO holds the Workspace NotReady
//!   for good).
//! - Endpoint: KAITO's Service `<name>`, port 80 (targeting 5000 in the pods).
//!
//! InferenceSet: `status.readyReplicas` of `spec.replicas` Workspaces, and the condition
//! `InferenceSetReady` (True `inferencesetReady`; False `inferencesetNotReady`, or False
//! `inferencesetFailed` with the error of its Gateway API resources). The Workspaces' own
//! failures (image pull, crash loop) stay on those Workspaces. Endpoint: our Service
//! `<name>-iset`, port 80 (KAITO makes none for a set).

use kube::ResourceExt;
use kube::api::DynamicObject;
use kubeairunway_sdk::Observed;
use kubeairunway_sdk::api::ModelDeployment;
use serde_json::Value;

pub use crate::render::SERVICE_PORT;
use crate::render::inference_set_service_name;

/// The InferenceSet's readiness condition.
pub const INFERENCE_SET_READY: &str = "InferenceSetReady";
/// Its reason when KAITO could not build what the set needs.
pub const INFERENCE_SET_FAILED: &str = "inferencesetFailed";
/// The condition KAITO sets while deleting a set.
pub const INFERENCE_SET_DELETING: &str = "InferenceSetDeleting";

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

/// The reason with which KAITO v0.12 marks a post-load benchmark that failed for good.
pub const BENCHMARK_FAILED: &str = "BenchmarkFailed";

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

/// A hard failure: KAITO's reason and message.
fn hard_failure(condition: &Value) -> Option<(String, String)> {
    let reason = field(condition, "reason");
    (field(condition, "status") == "False" && HARD_REASONS.contains(&reason)).then(|| {
        let message = field(condition, "message");
        let message = if message.is_empty() {
            format!("{}: {reason}", field(condition, "type"))
        } else {
            message.to_string()
        };
        (reason.to_string(), message)
    })
}

/// KAITO's error when its post-load benchmark failed for good.
fn benchmark_failure(conditions: &[&Value]) -> Option<String> {
    ["WorkspaceSucceeded", "BenchmarkCompleted"]
        .iter()
        .filter_map(|t| find(conditions, t))
        .find(|c| field(c, "status") == "False" && field(c, "reason") == BENCHMARK_FAILED)
        .map(|c| {
            format!(
                "KAITO's post-load benchmark failed, so KAITO holds the Workspace NotReady \
                 (its inference server is up): {}",
                field(c, "message")
            )
        })
}

fn workspace(live: &DynamicObject) -> Observed {
    let name = live.name_any();
    let conditions = conditions(live);
    let state = live.data["status"]["state"].as_str().unwrap_or_default();
    let inference = find(&conditions, "InferenceReady");
    let succeeded = find(&conditions, "WorkspaceSucceeded");

    let observed = if let Some((reason, message)) = inference.and_then(hard_failure) {
        Observed::failed(&reason, message)
    } else if let Some(message) = benchmark_failure(&conditions) {
        Observed::failed(BENCHMARK_FAILED, message)
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
    let counted = format!("KAITO InferenceSet has {ready}/{desired} Workspaces ready");
    let condition = find(&conditions, INFERENCE_SET_READY);
    let deleting =
        find(&conditions, INFERENCE_SET_DELETING).is_some_and(|c| field(c, "status") == "True");
    let observed = match condition {
        _ if deleting => Observed::deploying("KAITO is deleting the InferenceSet"),
        Some(c) if field(c, "status") == "False" && field(c, "reason") == INFERENCE_SET_FAILED => {
            Observed::failed(INFERENCE_SET_FAILED, field(c, "message"))
        }
        Some(c) if field(c, "status") == "True" => Observed::running(counted),
        Some(c) if !field(c, "message").is_empty() => {
            Observed::deploying(format!("KAITO InferenceSet: {}", field(c, "message")))
        }
        _ if ready >= desired && desired > 0 => Observed::running(counted),
        _ => Observed::deploying(counted),
    };
    observed
        .with_endpoint(inference_set_service_name(md), SERVICE_PORT)
        .with_replicas(desired, ready)
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

    /// KAITO v0.12 runs a benchmark once the inference is up; an error reading its result
    /// is terminal and holds the Workspace NotReady with `WorkspaceSucceeded=False`
    /// `BenchmarkFailed` (pkg/workspace/controllers/workspace_controller.go:1270-1280,
    /// 1319-1329@v0.12.0). Nothing will progress: Failed with KAITO's error, not
    /// Deploying forever; the endpoint stays (the server itself serves).
    #[test]
    fn a_terminal_benchmark_failure_fails_with_kaito_s_error() {
        let error =
            "pod ns/m-0: benchmark failed: TPM value -1 indicates a failed or incomplete run";
        let o = seen(json!({"state": "NotReady", "conditions": [
            cond("ResourceReady", "True", "workspaceResourceStatusSuccess", "workspace resource is ready"),
            cond("InferenceReady", "True", "WorkspaceInferenceStatusSuccess", "Inference has been deployed successfully"),
            cond("BenchmarkCompleted", "False", "BenchmarkFailed", error),
            cond("WorkspaceSucceeded", "False", "BenchmarkFailed", error),
        ]}));
        assert_eq!(o.phase, Phase::Failed);
        assert_eq!(
            o.message,
            format!(
                "KAITO's post-load benchmark failed, so KAITO holds the Workspace NotReady \
                 (its inference server is up): {error}"
            )
        );
        assert!(!o.ready);
        assert!(o.endpoint.is_some());
        // A benchmark still to run, or done, is not a failure.
        let o = seen(json!({"state": "Ready", "conditions": [
            cond("InferenceReady", "True", "WorkspaceInferenceStatusSuccess", "ok"),
            cond("BenchmarkCompleted", "True", "BenchmarkCompleted", "benchmark result has been recorded"),
            cond("WorkspaceSucceeded", "True", "workspaceSucceeded", "workspace succeeds"),
        ]}));
        assert_eq!(o.phase, Phase::Running);
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
        let e = o.endpoint.unwrap();
        assert_eq!((e.service.as_deref(), e.port), (Some("m-iset"), Some(80)));
    }

    /// The conditions KAITO writes, in the words of inferenceset_controller.go:485-522
    /// @v0.12.0.
    #[test]
    fn inference_set_conditions_are_kaito_s() {
        let iset = |status: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "kaito.sh/v1alpha1", "kind": "InferenceSet",
                "metadata": {"name": "m"}, "spec": {"replicas": 2}, "status": status,
            }))
            .unwrap()
        };
        let seen = |status: Value| observe(&md(), Some(&iset(status)));
        let o = seen(json!({"replicas": 2, "readyReplicas": 1, "conditions": [
            cond("InferenceSetReady", "False", "inferencesetNotReady", "inferenceset is not ready, 1/2 replicas are ready"),
        ]}));
        assert_eq!(
            (o.phase, o.message.as_str()),
            (
                Phase::Deploying,
                "KAITO InferenceSet: inferenceset is not ready, 1/2 replicas are ready"
            )
        );
        let o = seen(json!({"replicas": 2, "readyReplicas": 2, "conditions": [
            cond("InferenceSetReady", "False", "inferencesetFailed", "failed to create HelmRelease: forbidden"),
        ]}));
        assert_eq!(
            (o.phase, o.message.as_str()),
            (Phase::Failed, "failed to create HelmRelease: forbidden")
        );
        assert!(!o.ready);
        let o = seen(json!({"replicas": 2, "readyReplicas": 2, "conditions": [
            cond("InferenceSetReady", "True", "inferencesetReady", "inferenceset is ready"),
            cond("BenchmarkCompleted", "False", "BenchmarkPending", "0/2 replicas benchmarked"),
        ]}));
        assert_eq!(
            (o.phase, o.message.as_str()),
            (
                Phase::Running,
                "KAITO InferenceSet has 2/2 Workspaces ready"
            )
        );
        let o = seen(json!({"conditions": [
            cond("InferenceSetDeleting", "True", "inferencesetDeleted", "inferenceset is being deleted"),
            cond("InferenceSetReady", "True", "inferencesetReady", "inferenceset is ready"),
        ]}));
        assert_eq!(o.phase, Phase::Deploying);
        // A Workspace-style hard reason never appears on a set; it is not read there.
        let o = seen(
            json!({"conditions": [cond("InferenceReady", "False", "ImagePullError", "bad image")]}),
        );
        assert_eq!(o.phase, Phase::Deploying);
    }
}
