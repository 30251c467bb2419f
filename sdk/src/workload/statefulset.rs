//! A StatefulSet read as our status (`kubectl rollout status`'s judgement).

use kube::api::DynamicObject;
use serde_json::Value;

use super::read::{Live, int};
use crate::provider::Observed;

/// Our status from a live `apps/v1` StatefulSet, `kind` naming it in messages, as
/// `kubectl rollout status` judges one (`StatefulSetStatusViewer`):
///
/// - `Deploying` until the StatefulSet controller has observed the current generation,
///   then until every desired replica is ready;
/// - with a `RollingUpdate` partition, `Running` once the replicas above the partition
///   are updated; without one, once the current revision has reached the update revision;
/// - with the `OnDelete` strategy (no rollout to follow), `Running` once every desired
///   replica is ready.
///
/// A StatefulSet has no condition that declares a lasting failure: pods that cannot start
/// keep it `Deploying`, and the provider's stale-status check reports it.
pub fn statefulset(live: &DynamicObject, kind: &str) -> Observed {
    let l = Live::of(live);
    let desired = l.desired();
    let (ready, available, updated) = (
        l.count("readyReplicas"),
        l.count("availableReplicas"),
        l.count("updatedReplicas"),
    );
    let revision = |key: &str| {
        l.status
            .and_then(|s| s.get(key))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let partition = l
        .spec
        .and_then(|s| s.pointer("/updateStrategy/rollingUpdate"))
        .and_then(|r| int(Some(r), "partition"));
    let waiting =
        |what: String| Observed::deploying(format!("waiting for the {kind} to roll out: {what}"));
    let observed = if l.observed_generation() == 0 || l.unobserved() {
        Observed::deploying(format!(
            "waiting for the StatefulSet controller to roll out the {kind}"
        ))
    } else if ready < desired {
        waiting(format!("{ready} of {desired} replicas ready"))
    } else if l.update_strategy() != "RollingUpdate" {
        Observed::running(format!("{kind} ready: {ready} of {desired} replicas ready"))
    } else if let Some(partition) = partition {
        let wanted = desired.saturating_sub(partition).max(0);
        if updated < wanted {
            waiting(format!(
                "{updated} of {wanted} replicas above the partition updated"
            ))
        } else {
            Observed::running(format!(
                "{kind} ready: {ready} of {desired} replicas ready, {updated} updated"
            ))
        }
    } else if revision("updateRevision") != revision("currentRevision") {
        waiting(format!("{updated} of {desired} replicas updated"))
    } else {
        Observed::running(format!("{kind} ready: {ready} of {desired} replicas ready"))
    };
    observed
        .with_replicas(desired, ready)
        .with_available(available)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::needless_pass_by_value)] // JSON literals built in place
    use super::*;
    use crate::api::Phase;
    use serde_json::json;

    fn sts(generation: i64, spec: Value, status: Option<Value>) -> DynamicObject {
        let mut v = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                           "metadata": {"name": "s", "generation": generation}, "spec": spec});
        if let Some(s) = status {
            v["status"] = s;
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_statefulset_runs_once_its_replicas_are_ready_and_its_revision_current() {
        let spec = json!({"replicas": 3});
        let at = |status: Value| statefulset(&sts(2, spec.clone(), Some(status)), "server");
        assert_eq!(
            statefulset(&sts(1, spec.clone(), None), "server").phase,
            Phase::Deploying
        );
        let old = at(
            json!({"observedGeneration": 1, "readyReplicas": 3, "currentRevision": "a", "updateRevision": "a"}),
        );
        assert_eq!(old.phase, Phase::Deploying, "generation 2 not observed yet");
        let ready = at(
            json!({"observedGeneration": 2, "readyReplicas": 2, "currentRevision": "a", "updateRevision": "a"}),
        );
        assert_eq!(
            ready.message,
            "waiting for the server to roll out: 2 of 3 replicas ready"
        );
        let rolling = at(
            json!({"observedGeneration": 2, "readyReplicas": 3, "updatedReplicas": 1,
                                "currentRevision": "a", "updateRevision": "b"}),
        );
        assert_eq!(
            rolling.message,
            "waiting for the server to roll out: 1 of 3 replicas updated"
        );
        let done = at(
            json!({"observedGeneration": 2, "readyReplicas": 3, "availableReplicas": 3,
                             "updatedReplicas": 3, "currentRevision": "b", "updateRevision": "b"}),
        );
        assert_eq!(done.phase, Phase::Running);
        assert!(done.ready);
        let r = done.replicas.unwrap();
        assert_eq!(
            (r.desired, r.ready, r.available),
            (Some(3), Some(3), Some(3))
        );
    }

    #[test]
    fn a_partition_and_on_delete_change_what_finished_means() {
        let partitioned = json!({"replicas": 4, "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}});
        let at = |spec: &Value, updated: i64| {
            statefulset(
                &sts(
                    1,
                    spec.clone(),
                    Some(json!({"observedGeneration": 1, "readyReplicas": 4,
                    "updatedReplicas": updated, "currentRevision": "a", "updateRevision": "b"})),
                ),
                "server",
            )
        };
        assert_eq!(at(&partitioned, 1).phase, Phase::Deploying);
        assert_eq!(
            at(&partitioned, 2).phase,
            Phase::Running,
            "the two above the partition"
        );
        let on_delete = json!({"replicas": 4, "updateStrategy": {"type": "OnDelete"}});
        assert_eq!(
            at(&on_delete, 0).phase,
            Phase::Running,
            "nothing to roll out"
        );
    }
}
