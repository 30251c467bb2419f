//! A Deployment read as our status (`kubectl rollout status`'s judgement).

use kube::api::DynamicObject;
use serde_json::Value;

use super::read::{Live, text};
use crate::provider::Observed;

/// The reason the Deployment controller gives `Progressing=False` when a rollout has made
/// no progress for `spec.progressDeadlineSeconds` (`TimedOutReason` in
/// `deployment_util.go@v1.36.0`). It stays until the next rollout makes progress.
pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

/// Our status from a live `apps/v1` Deployment, `kind` naming it in messages (`"vLLM
/// server"`).
///
/// - `Failed` (reason `ProgressDeadlineExceeded`, the controller's message) when the
///   rollout has exceeded its progress deadline: the one failure the Deployment
///   controller itself declares lasting;
/// - `Running` once the rollout is complete as `kubectl rollout status` judges it: the
///   controller has observed the current generation, every desired replica is updated, no
///   old replica is left and every updated one is available;
/// - `Deploying` otherwise, saying what it waits for (a `ReplicaFailure` condition, such
///   as pods refused by a quota, is quoted: the controller retries it).
///
/// Replicas: desired from `spec.replicas` (1 when unset, as the API server defaults it;
/// an autoscaler writes it through the scale subresource), ready and available from the
/// status. Nothing is read but the object.
pub fn deployment(live: &DynamicObject, kind: &str) -> Observed {
    let l = Live::of(live);
    let desired = l.desired();
    let (replicas, updated, ready, available) = (
        l.count("replicas"),
        l.count("updatedReplicas"),
        l.count("readyReplicas"),
        l.count("availableReplicas"),
    );
    let condition = |type_: &str| l.condition(type_);
    let observed = if l.unobserved() {
        Observed::deploying(format!(
            "waiting for the Deployment controller to roll out the {kind}"
        ))
    } else if let Some(progressing) = condition("Progressing")
        .filter(|c| c.get("reason").and_then(Value::as_str) == Some(PROGRESS_DEADLINE_EXCEEDED))
    {
        let message = text(progressing, "message");
        let message = if message.is_empty() {
            format!("the {kind}'s Deployment exceeded its progress deadline")
        } else {
            message
        };
        Observed::failed(PROGRESS_DEADLINE_EXCEEDED, message)
    } else if updated < desired {
        Observed::deploying(waiting(
            kind,
            &format!("{updated} of {desired} replicas updated"),
            condition("ReplicaFailure"),
        ))
    } else if replicas > updated {
        Observed::deploying(waiting(
            kind,
            &format!("{} old replicas pending termination", replicas - updated),
            condition("ReplicaFailure"),
        ))
    } else if available < updated {
        Observed::deploying(waiting(
            kind,
            &format!("{available} of {updated} updated replicas available"),
            condition("ReplicaFailure"),
        ))
    } else {
        Observed::running(format!(
            "{kind} ready: {available} of {desired} replicas available"
        ))
    };
    observed
        .with_replicas(desired, ready)
        .with_available(available)
}

/// "waiting for the <kind> to roll out: <what>", with a `ReplicaFailure=True` condition's
/// message when there is one.
fn waiting(kind: &str, what: &str, failure: Option<&Value>) -> String {
    let failure = failure
        .filter(|c| c.get("status").and_then(Value::as_str) == Some("True"))
        .and_then(|c| c.get("message").and_then(Value::as_str))
        .filter(|m| !m.is_empty());
    match failure {
        Some(m) => format!("waiting for the {kind} to roll out: {what}; {m}"),
        None => format!("waiting for the {kind} to roll out: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Phase;
    use serde_json::json;

    fn live(generation: i64, replicas: Option<i64>, status: Option<Value>) -> DynamicObject {
        let mut v = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "generation": generation},
            "spec": {},
        });
        if let Some(r) = replicas {
            v["spec"]["replicas"] = json!(r);
        }
        if let Some(s) = status {
            v["status"] = s;
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_new_deployment_is_deploying_until_observed() {
        let o = deployment(&live(1, Some(2), None), "server");
        assert_eq!(o.phase, Phase::Deploying);
        assert_eq!(
            o.message,
            "waiting for the Deployment controller to roll out the server"
        );
        let o = deployment(
            &live(
                2,
                Some(2),
                Some(
                    json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}),
                ),
            ),
            "server",
        );
        assert_eq!(
            o.phase,
            Phase::Deploying,
            "a newer generation is not rolled out yet"
        );
    }

    #[test]
    fn complete_rollout_is_running_with_replica_counts() {
        let status = json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2,
                            "readyReplicas": 2, "availableReplicas": 2,
                            "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}]});
        let o = deployment(&live(3, Some(2), Some(status)), "server");
        assert_eq!(o.phase, Phase::Running);
        assert!(o.ready);
        let r = o.replicas.unwrap();
        assert_eq!(
            (r.desired, r.ready, r.available),
            (Some(2), Some(2), Some(2))
        );
    }

    #[test]
    fn each_unfinished_step_says_what_it_waits_for() {
        let at = |status: Value| deployment(&live(1, None, Some(status)), "server");
        let o = at(
            json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 0,
                          "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                                          "message": "pods \"d-1\" is forbidden: exceeded quota"}]}),
        );
        assert_eq!(o.phase, Phase::Deploying);
        assert_eq!(
            o.message,
            "waiting for the server to roll out: 0 of 1 replicas updated; pods \"d-1\" is forbidden: exceeded quota"
        );
        let o = at(
            json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}),
        );
        assert_eq!(
            o.message,
            "waiting for the server to roll out: 1 old replicas pending termination"
        );
        let o = at(
            json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 0}),
        );
        assert_eq!(
            o.message,
            "waiting for the server to roll out: 0 of 1 updated replicas available"
        );
        let r = o.replicas.unwrap();
        assert_eq!(
            (r.desired, r.ready, r.available),
            (Some(1), Some(1), Some(0)),
            "ready is not available: minReadySeconds has not passed"
        );
    }

    #[test]
    fn progress_deadline_exceeded_fails_with_the_controllers_words() {
        let status = json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                            "message": "ReplicaSet \"d-5d8\" has timed out progressing."}]});
        let o = deployment(&live(1, Some(1), Some(status)), "server");
        assert_eq!(o.phase, Phase::Failed);
        assert_eq!(o.reason, PROGRESS_DEADLINE_EXCEEDED);
        assert_eq!(o.message, "ReplicaSet \"d-5d8\" has timed out progressing.");
    }

    #[test]
    fn scaled_to_zero_is_running() {
        let o = deployment(
            &live(1, Some(0), Some(json!({"observedGeneration": 1}))),
            "server",
        );
        assert_eq!(o.phase, Phase::Running);
        assert_eq!(o.replicas.unwrap().desired, Some(0));
    }
}
