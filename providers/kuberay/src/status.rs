//! The RayService status read as ours, from what KubeRay 1.3 and 1.7 write
//! (docs/upstream.md#kuberay-status; played by the e2e stand-in
//! `tests/e2e/src/operators/kuberay.rs`).
//!
//! A RayService has an *active* cluster (serving) and a *pending* one (the first
//! deployment, or a zero-downtime upgrade). KubeRay writes application statuses to the
//! slot of the cluster whose Serve it reconciled, and moves the pending slot to the active
//! one only once all its applications run. So a first deployment whose application fails
//! keeps that failure in `pendingServiceStatus`, with `Ready=False` `Initializing`, for
//! good: it is read there while no cluster is active.
//!
//! | RayService status | phase |
//! |---|---|
//! | `Ready=False` with reason `ValidationFailed` or `InitializingTimeout` | Failed, with the condition's message |
//! | an application of the active slot is `DEPLOY_FAILED` or `UNHEALTHY` | Failed, with Ray Serve's message |
//! | no active cluster yet and an application of the pending slot failed (a first deployment) | Failed, with Ray Serve's message |
//! | `UpgradeInProgress=True` | Deploying (naming a failed application of the new cluster, while the old one serves) |
//! | `Ready=True` | Running |
//! | `Ready=False` (`Initializing`, `ZeroServeEndpoints`, ...) or `Unknown` | Deploying |
//! | no conditions (KubeRay before 1.3): `serviceStatus: Running` | Running |
//! | no conditions, `serviceStatus` empty | Deploying |
//!
//! The endpoint is KubeRay's serve Service (see [`crate::rayservice::serve_service`]),
//! port 8000; replicas are the worker replicas of the active cluster, or of the pending
//! one while there is no active cluster.

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
/// `Ready` reasons that are terminal: KubeRay reconciles nothing more until the spec
/// changes (`ValidationFailed`, `rayservice_controller.go:156-171@v1.7.0`) or ever
/// (`InitializingTimeout`, `:184-195@v1.7.0`: delete and recreate).
pub const FAILED_REASONS: [&str; 2] = ["ValidationFailed", "InitializingTimeout"];
/// Application statuses that mean the model is not served (Ray Serve's
/// `ApplicationStatus`, `rayservice_types.go:34-50@v1.7.0`).
pub const FAILED_APPLICATION_STATUSES: [&str; 2] = ["DEPLOY_FAILED", "UNHEALTHY"];
/// Slot of the serving cluster.
pub const ACTIVE: &str = "activeServiceStatus";
/// Slot of the cluster being prepared.
pub const PENDING: &str = "pendingServiceStatus";

/// Our status for `md` from its RayService (`None` before it exists).
pub fn observe(md: &ModelDeployment, upstream: Option<&DynamicObject>) -> Observed {
    let Some(live) = upstream else {
        return Observed::deploying("waiting for the RayService to be created");
    };
    let name = live.name_any();
    let status = live.data.get("status").unwrap_or(&Value::Null);
    let observed = phase(status);
    // The cluster that is (or is becoming) the deployment: the active one, else the one
    // being prepared for the first time.
    let slot = if has_cluster(status, ACTIVE) {
        ACTIVE
    } else {
        PENDING
    };
    let cluster = &status[slot]["rayClusterStatus"];
    let count = |key: &str| {
        cluster
            .get(key)
            .and_then(Value::as_i64)
            .and_then(|n| i32::try_from(n).ok())
    };
    let desired = count("desiredWorkerReplicas").unwrap_or_else(|| desired_workers(md));
    let ready = count("readyWorkerReplicas").unwrap_or(0);
    observed
        .with_endpoint(serve_service(&name, kuberay_1_3(&name, status)), SERVE_PORT)
        .with_replicas(desired, ready)
}

fn desired_workers(md: &ModelDeployment) -> i32 {
    crate::serve_config::roles(md)
        .iter()
        .map(|(_, r)| r.replicas)
        .sum()
}

fn has_cluster(status: &Value, slot: &str) -> bool {
    status[slot]["rayClusterName"]
        .as_str()
        .is_some_and(|n| !n.is_empty())
}

/// Whether the status names its clusters the way KubeRay up to 1.3 does,
/// `<name>-raycluster-<5 random>` (`utils/util.go:311-314@v1.3.0`; from 1.4 on
/// `<name>-<5 random>`, `utils/util.go:369-371@v1.7.0`), which also shortens the serve
/// Service's name.
fn kuberay_1_3(name: &str, status: &Value) -> bool {
    let prefix = format!("{name}-raycluster-");
    [ACTIVE, PENDING].iter().any(|slot| {
        status[*slot]["rayClusterName"]
            .as_str()
            .and_then(|c| c.strip_prefix(&prefix))
            .is_some_and(|suffix| suffix.len() == 5)
    })
}

/// The phase and message of a RayService `status`.
pub fn phase(status: &Value) -> Observed {
    let conditions = status
        .get("conditions")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty());
    let find = |t: &str| conditions.and_then(|c| c.iter().find(|c| text(c, "type") == t));
    let ready = find(READY);
    if let Some(c) = ready
        && text(c, "status") == "False"
        && FAILED_REASONS.contains(&text(c, "reason"))
    {
        return failed(
            text(c, "reason"),
            &with_reason(text(c, "reason"), text(c, "message")),
        );
    }
    let first_deployment = !has_cluster(status, ACTIVE);
    if let Some((reason, message)) = failed_application(status, ACTIVE).or_else(|| {
        first_deployment
            .then(|| failed_application(status, PENDING))
            .flatten()
    }) {
        return failed(&reason, &message);
    }
    if conditions.is_none() {
        // KubeRay before 1.3: `serviceStatus` is `Running` or empty.
        return match status.get("serviceStatus").and_then(Value::as_str) {
            Some("Running") => Observed::running("RayService is running"),
            _ => Observed::deploying("waiting for the RayService to serve"),
        };
    }
    if let Some(c) = find(UPGRADE_IN_PROGRESS)
        && text(c, "status") == "True"
    {
        let mut message = with_reason(UPGRADE_IN_PROGRESS, text(c, "message"));
        if let Some((_, failure)) = failed_application(status, PENDING) {
            message = format!(
                "{message}; the new cluster's {failure}; the previous cluster keeps serving"
            );
        }
        return Observed::deploying(message);
    }
    match ready {
        Some(c) if text(c, "status") == "True" => {
            let message = text(c, "message");
            Observed::running(if message.is_empty() {
                "RayService is ready"
            } else {
                message
            })
        }
        Some(c) => Observed::deploying(with_reason(text(c, "reason"), text(c, "message"))),
        None => Observed::deploying("waiting for the RayService to become ready"),
    }
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// `Failed` with this `Ready` reason.
fn failed(reason: &str, message: &str) -> Observed {
    Observed::failed(reason, message)
}

/// The first failed application of `slot` (in name order): its reason
/// (`ServeApplicationDeployFailed`, `ServeApplicationUnhealthy`) and
/// `Ray Serve application <name> is <STATUS>: <message>`.
fn failed_application(status: &Value, slot: &str) -> Option<(String, String)> {
    let apps = status[slot]["applicationStatuses"].as_object()?;
    apps.iter().find_map(|(name, app)| {
        let state = text(app, "status");
        if !FAILED_APPLICATION_STATUSES.contains(&state) {
            return None;
        }
        let reason = match state {
            "DEPLOY_FAILED" => "ServeApplicationDeployFailed",
            _ => "ServeApplicationUnhealthy",
        };
        let message = text(app, "message");
        let message = if message.is_empty() {
            format!("Ray Serve application {name} is {state}")
        } else {
            format!("Ray Serve application {name} is {state}: {message}")
        };
        Some((reason.to_string(), message))
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
                "rayClusterName": "llm-ab1cd",
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
                port: Some(8000),
                ..EndpointStatus::default()
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
                "activeServiceStatus": {"rayClusterName": "llm-ab1cd",
                    "applicationStatuses": {"llm": {"status": "RUNNING"}}},
            }));
            assert_eq!(o.phase, Phase::Failed, "{reason}");
            assert_eq!(o.message, format!("{reason}: the spec is invalid"));
            assert_eq!(o.reason, reason);
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

    /// During a first deployment KubeRay writes the application
    /// statuses to `pendingServiceStatus` and never promotes a cluster whose applications
    /// are not all RUNNING (ray-operator/controllers/ray/rayservice_controller.go:145-187,
    /// 242-244@v1.3.0 and :229-306,666-668@v1.7.0), so the failure is only there.
    #[test]
    fn first_deployment_failure_in_the_pending_slot_fails_rayservice_controller_go_243_v1_3_0() {
        let o = observe_status(json!({
            "conditions": [
                cond("Ready", "False", "Initializing", "RayService is initializing"),
                cond("UpgradeInProgress", "False", "Initializing", "RayService is initializing"),
            ],
            "activeServiceStatus": {"rayClusterStatus": {}},
            "pendingServiceStatus": {
                "rayClusterName": "llm-ab1cd",
                "applicationStatuses": {"llm": {"status": "DEPLOY_FAILED",
                                                "message": "Failed to download model: 401"}},
                "rayClusterStatus": {"desiredWorkerReplicas": 2, "readyWorkerReplicas": 1},
            },
        }));
        assert_eq!((o.phase, o.ready), (Phase::Failed, false));
        assert_eq!(
            o.message,
            "Ray Serve application llm is DEPLOY_FAILED: Failed to download model: 401"
        );
        assert_eq!(o.reason, "ServeApplicationDeployFailed");
        // Replicas of the cluster being brought up.
        let r = o.replicas.unwrap();
        assert_eq!((r.desired, r.ready), (Some(2), Some(1)));
    }

    #[test]
    fn a_first_deployment_in_progress_reads_the_pending_cluster() {
        let o = observe_status(json!({
            "conditions": [cond("Ready", "False", "Initializing", "RayService is initializing")],
            "pendingServiceStatus": {
                "rayClusterName": "llm-ab1cd",
                "applicationStatuses": {"llm": {"status": "DEPLOYING"}},
                "rayClusterStatus": {"desiredWorkerReplicas": 2, "readyWorkerReplicas": 2},
            },
        }));
        assert_eq!(o.phase, Phase::Deploying);
        assert_eq!(o.message, "Initializing: RayService is initializing");
        let r = o.replicas.unwrap();
        assert_eq!((r.desired, r.ready), (Some(2), Some(2)));
    }

    /// A failed upgrade: the old cluster keeps serving (KubeRay switches only to a ready
    /// cluster), so the deployment is not Failed, but the failure is named.
    #[test]
    fn a_failed_upgrade_is_named_while_the_old_cluster_serves() {
        let o = observe_status(json!({
            "conditions": [
                cond("Ready", "True", "NonZeroServeEndpoints", ""),
                cond("UpgradeInProgress", "True", "BothActivePendingClustersExist",
                     "Both active and pending Ray clusters exist"),
            ],
            "activeServiceStatus": {"rayClusterName": "llm-aaaaa",
                                    "rayClusterStatus": {"desiredWorkerReplicas": 1, "readyWorkerReplicas": 1}},
            "pendingServiceStatus": {"rayClusterName": "llm-bbbbb",
                                     "applicationStatuses": {"llm": {"status": "DEPLOY_FAILED", "message": "bad image"}}},
        }));
        assert_eq!(o.phase, Phase::Deploying);
        assert_eq!(
            o.message,
            "UpgradeInProgress: Both active and pending Ray clusters exist; the new cluster's Ray Serve application llm is DEPLOY_FAILED: bad image; the previous cluster keeps serving"
        );
        let r = o.replicas.unwrap();
        assert_eq!((r.desired, r.ready), (Some(1), Some(1)));
    }

    /// KubeRay 1.3 names clusters `<name>-raycluster-<5>` and shortens the serve Service
    /// with `CheckName` (ray-operator/controllers/ray/utils/util.go:184-206,292-294@v1.3.0);
    /// 1.4 and later name clusters `<name>-<5>` and never shorten (util.go:349-371@v1.7.0).
    #[test]
    fn the_serve_service_of_long_names_follows_the_kuberay_release_util_go_292_v1_3_0() {
        let name = "a-forty-seven-character-model-deployment-name-x";
        assert_eq!(name.len(), 47);
        let live = |cluster: &str| {
            let mut object = json!({
                "apiVersion": "ray.io/v1", "kind": "RayService",
                "metadata": {"name": name, "namespace": "ns"}, "spec": {},
            });
            object["status"] = json!({"pendingServiceStatus": {"rayClusterName": cluster}});
            serde_json::from_value::<DynamicObject>(object).unwrap()
        };
        let md = ModelDeploymentBuilder::new(name).build();
        let service = |o: Observed| o.endpoint.unwrap().service.unwrap();
        let old = observe(&md, Some(&live(&format!("{name}-raycluster-x1y2z"))));
        // The last 50 characters start with '-', which becomes 'r'.
        assert_eq!(
            service(old),
            "rseven-character-model-deployment-name-x-serve-svc"
        );
        let new = observe(&md, Some(&live(&format!("{name}-x1y2z"))));
        assert_eq!(service(new), format!("{name}-serve-svc"));
        // Short names are never shortened.
        assert_eq!(
            crate::rayservice::serve_service("llm", true),
            "llm-serve-svc"
        );
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
