//! The RayService status read as ours (design §5, KubeRay >= 1.3 and before):
//!
//! | RayService status | phase |
//! |---|---|
//! | an application of `activeServiceStatus.applicationStatuses` is `DEPLOY_FAILED` or `UNHEALTHY` | Failed, with its message |
//! | condition `Ready=False` with reason `ValidationFailed` or `InitializingTimeout` | Failed, with the condition's message |
//! | condition `UpgradeInProgress=True` | Deploying |
//! | condition `Ready=True` | Running |
//! | condition `Ready=False` (`Initializing`, `ZeroServeEndpoints`, ...) or `Unknown` | Deploying |
//! | no conditions (KubeRay before 1.3): `serviceStatus: Running` | Running |
//! | no conditions, `serviceStatus` empty | Deploying |
//!
//! The endpoint is KubeRay's serve Service `<name>-serve-svc`, port 8000; replicas are the
//! active cluster's worker replicas.

use kube::ResourceExt;
use kube::api::DynamicObject;
use kubeairunway_sdk::Observed;
use kubeairunway_sdk::api::ModelDeployment;
use serde_json::Value;

use crate::rayservice::{SERVE_PORT, serve_service};

/// Condition type of a serving RayService (KubeRay >= 1.3).
pub const READY: &str = "Ready";
/// Condition type of a zero-downtime upgrade in progress.
pub const UPGRADE_IN_PROGRESS: &str = "UpgradeInProgress";
/// `Ready` reasons that are terminal.
pub const FAILED_REASONS: [&str; 2] = ["ValidationFailed", "InitializingTimeout"];
/// Application statuses that mean the model is not served.
pub const FAILED_APPLICATION_STATUSES: [&str; 2] = ["DEPLOY_FAILED", "UNHEALTHY"];

/// Our status for `md` from its RayService (`None` before it exists).
pub fn observe(md: &ModelDeployment, upstream: Option<&DynamicObject>) -> Observed {
    let Some(live) = upstream else {
        return Observed::deploying("waiting for the RayService to be created");
    };
    let status = live.data.get("status").unwrap_or(&Value::Null);
    let observed = phase(status);
    let cluster = &status["activeServiceStatus"]["rayClusterStatus"];
    let count = |key: &str| {
        cluster
            .get(key)
            .and_then(Value::as_i64)
            .and_then(|n| i32::try_from(n).ok())
    };
    let desired = count("desiredWorkerReplicas").unwrap_or_else(|| desired_workers(md));
    let ready = count("readyWorkerReplicas").unwrap_or(0);
    observed
        .with_endpoint(serve_service(&live.name_any()), SERVE_PORT)
        .with_replicas(desired, ready)
}

fn desired_workers(md: &ModelDeployment) -> i32 {
    crate::serve_config::roles(md)
        .iter()
        .map(|(_, r)| r.replicas)
        .sum()
}

/// The phase and message of a RayService `status`.
pub fn phase(status: &Value) -> Observed {
    if let Some(failure) = failed_application(status) {
        return Observed::failed(failure);
    }
    let conditions = status
        .get("conditions")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty());
    let Some(conditions) = conditions else {
        // KubeRay before 1.3: `serviceStatus` is `Running` or empty.
        return match status.get("serviceStatus").and_then(Value::as_str) {
            Some("Running") => Observed::running("RayService is running"),
            _ => Observed::deploying("waiting for the RayService to serve"),
        };
    };
    let find = |t: &str| {
        conditions
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(t))
    };
    let text = |c: &Value, k: &str| {
        c.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let ready = find(READY);
    if let Some(c) = ready
        && text(c, "status") == "False"
        && FAILED_REASONS.contains(&text(c, "reason").as_str())
    {
        return Observed::failed(with_reason(&text(c, "reason"), &text(c, "message")));
    }
    if let Some(c) = find(UPGRADE_IN_PROGRESS)
        && text(c, "status") == "True"
    {
        return Observed::deploying(with_reason("UpgradeInProgress", &text(c, "message")));
    }
    match ready {
        Some(c) if text(c, "status") == "True" => {
            let message = text(c, "message");
            Observed::running(if message.is_empty() {
                "RayService is ready".to_string()
            } else {
                message
            })
        }
        Some(c) => Observed::deploying(with_reason(&text(c, "reason"), &text(c, "message"))),
        None => Observed::deploying("waiting for the RayService to become ready"),
    }
}

/// The first failed application (in name order), as `application <name> <STATUS>: <message>`.
fn failed_application(status: &Value) -> Option<String> {
    let apps = status["activeServiceStatus"]["applicationStatuses"].as_object()?;
    apps.iter().find_map(|(name, app)| {
        let state = app.get("status").and_then(Value::as_str)?;
        if !FAILED_APPLICATION_STATUSES.contains(&state) {
            return None;
        }
        let message = app
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default();
        Some(if message.is_empty() {
            format!("Ray Serve application {name} is {state}")
        } else {
            format!("Ray Serve application {name} is {state}: {message}")
        })
    })
}

fn with_reason(reason: &str, message: &str) -> String {
    match (reason.is_empty(), message.is_empty()) {
        (true, true) => "waiting for the RayService to become ready".to_string(),
        (false, true) => reason.to_string(),
        (true, false) => message.to_string(),
        (false, false) => format!("{reason}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::api::{EndpointStatus, Phase};
    use kubeairunway_sdk::testing::ModelDeploymentBuilder;
    use serde_json::json;

    fn live(status: Value) -> DynamicObject {
        let mut object = json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "llm", "namespace": "ns"},
            "spec": {},
        });
        object["status"] = status;
        serde_json::from_value(object).unwrap()
    }

    fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    fn observe_status(status: Value) -> Observed {
        observe(
            &ModelDeploymentBuilder::new("llm").replicas(2).build(),
            Some(&live(status)),
        )
    }

    #[test]
    fn before_the_object_exists_it_is_deploying() {
        let o = observe(&ModelDeploymentBuilder::new("llm").build(), None);
        assert_eq!(o.phase, Phase::Deploying);
        assert!(o.endpoint.is_none());
    }

    #[test]
    fn ready_true_is_running_with_the_serve_service() {
        let o = observe_status(json!({
            "conditions": [cond("Ready", "True", "NonZeroServeEndpoints", "Number of serve endpoints is greater than 0")],
            "serviceStatus": "Running",
            "activeServiceStatus": {
                "applicationStatuses": {"llm": {"status": "RUNNING"}},
                "rayClusterStatus": {"desiredWorkerReplicas": 2, "readyWorkerReplicas": 2},
            },
        }));
        assert_eq!((o.phase, o.ready), (Phase::Running, true));
        assert_eq!(o.message, "Number of serve endpoints is greater than 0");
        assert_eq!(
            o.endpoint,
            Some(EndpointStatus {
                service: Some("llm-serve-svc".into()),
                port: Some(8000)
            })
        );
        let r = o.replicas.unwrap();
        assert_eq!((r.desired, r.ready), (Some(2), Some(2)));
    }

    #[test]
    fn ready_false_while_starting_is_deploying() {
        for reason in ["Initializing", "ZeroServeEndpoints"] {
            let o = observe_status(json!({
                "conditions": [cond("Ready", "False", reason, "still starting")],
            }));
            assert_eq!((o.phase, o.ready), (Phase::Deploying, false), "{reason}");
            assert_eq!(o.message, format!("{reason}: still starting"));
            let r = o.replicas.unwrap();
            assert_eq!((r.desired, r.ready), (Some(2), Some(0)));
        }
    }

    #[test]
    fn upgrade_in_progress_is_deploying() {
        let o = observe_status(json!({
            "conditions": [
                cond("Ready", "True", "NonZeroServeEndpoints", ""),
                cond("UpgradeInProgress", "True", "BothActivePendingClustersExist", "upgrading"),
            ],
        }));
        assert_eq!(o.phase, Phase::Deploying);
        assert_eq!(o.message, "UpgradeInProgress: upgrading");
        let done = observe_status(json!({
            "conditions": [
                cond("Ready", "True", "NonZeroServeEndpoints", ""),
                cond("UpgradeInProgress", "False", "NoPendingCluster", ""),
            ],
        }));
        assert_eq!(done.phase, Phase::Running);
        assert_eq!(done.message, "RayService is ready");
    }

    #[test]
    fn terminal_ready_reasons_fail_with_the_message() {
        for reason in FAILED_REASONS {
            let o = observe_status(json!({
                "conditions": [cond("Ready", "False", reason, "the spec is invalid")],
            }));
            assert_eq!(o.phase, Phase::Failed, "{reason}");
            assert_eq!(o.message, format!("{reason}: the spec is invalid"));
        }
    }

    #[test]
    fn failed_applications_fail_with_their_message() {
        for state in FAILED_APPLICATION_STATUSES {
            let o = observe_status(json!({
                "conditions": [cond("Ready", "False", "ZeroServeEndpoints", "")],
                "activeServiceStatus": {"applicationStatuses": {
                    "llm": {"status": state, "message": "vLLM engine died: CUDA out of memory"},
                }},
            }));
            assert_eq!(o.phase, Phase::Failed, "{state}");
            assert_eq!(
                o.message,
                format!(
                    "Ray Serve application llm is {state}: vLLM engine died: CUDA out of memory"
                )
            );
        }
        let deploying = observe_status(json!({
            "activeServiceStatus": {"applicationStatuses": {"llm": {"status": "DEPLOYING"}}},
        }));
        assert_eq!(deploying.phase, Phase::Deploying);
    }

    #[test]
    fn the_old_condition_name_is_not_read() {
        let o = observe_status(json!({
            "conditions": [cond("RayServiceReady", "True", "Whatever", "")],
        }));
        assert_eq!(o.phase, Phase::Deploying);
    }

    #[test]
    fn before_1_3_service_status_decides() {
        let running = observe_status(json!({"serviceStatus": "Running"}));
        assert_eq!((running.phase, running.ready), (Phase::Running, true));
        for status in [json!({"serviceStatus": ""}), json!({}), Value::Null] {
            let o = observe_status(status.clone());
            assert_eq!(o.phase, Phase::Deploying, "{status}");
            assert_eq!(
                o.endpoint.unwrap().service.as_deref(),
                Some("llm-serve-svc")
            );
        }
    }
}
