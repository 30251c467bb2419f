//! A DaemonSet read as our status (`kubectl rollout status`'s judgement).

use kube::api::DynamicObject;

use super::read::Live;
use crate::provider::Observed;

/// Our status from a live `apps/v1` DaemonSet, `kind` naming it in messages, as `kubectl
/// rollout status` judges one (`DaemonSetStatusViewer`): `Deploying` until the DaemonSet
/// controller has observed the current generation, then until every node it schedules
/// to has an updated pod, then until those are available; `Running` after. With the
/// `OnDelete` strategy (no rollout to follow), `Running` once every scheduled pod is
/// available. Replicas: desired and available are the nodes scheduled to and those
/// with an available pod.
pub fn daemonset(live: &DynamicObject, kind: &str) -> Observed {
    let l = Live::of(live);
    let desired = l.count("desiredNumberScheduled");
    let (updated, ready, available) = (
        l.count("updatedNumberScheduled"),
        l.count("numberReady"),
        l.count("numberAvailable"),
    );
    let waiting =
        |what: String| Observed::deploying(format!("waiting for the {kind} to roll out: {what}"));
    let observed = if l.unobserved() {
        Observed::deploying(format!(
            "waiting for the DaemonSet controller to roll out the {kind}"
        ))
    } else if l.update_strategy() == "RollingUpdate" && updated < desired {
        waiting(format!("{updated} of {desired} nodes updated"))
    } else if available < desired {
        waiting(format!("{available} of {desired} nodes available"))
    } else {
        Observed::running(format!(
            "{kind} ready: available on {available} of {desired} nodes"
        ))
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
    use serde_json::{Value, json};

    fn ds(generation: i64, strategy: &str, status: Value) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "d", "generation": generation},
            "spec": {"updateStrategy": {"type": strategy}}, "status": status}))
        .unwrap()
    }

    #[test]
    fn a_daemonset_runs_once_every_scheduled_node_has_an_updated_available_pod() {
        let status = |updated: i64, available: i64| {
            json!({"observedGeneration": 2, "desiredNumberScheduled": 3,
                   "updatedNumberScheduled": updated, "numberReady": available, "numberAvailable": available})
        };
        assert_eq!(
            daemonset(&ds(3, "RollingUpdate", status(3, 3)), "agent").phase,
            Phase::Deploying
        );
        let o = daemonset(&ds(2, "RollingUpdate", status(1, 3)), "agent");
        assert_eq!(
            o.message,
            "waiting for the agent to roll out: 1 of 3 nodes updated"
        );
        let o = daemonset(&ds(2, "RollingUpdate", status(3, 2)), "agent");
        assert_eq!(
            o.message,
            "waiting for the agent to roll out: 2 of 3 nodes available"
        );
        let o = daemonset(&ds(2, "RollingUpdate", status(3, 3)), "agent");
        assert_eq!(o.phase, Phase::Running);
        assert_eq!(o.replicas.unwrap().available, Some(3));
        assert_eq!(
            daemonset(&ds(2, "OnDelete", status(0, 3)), "agent").phase,
            Phase::Running
        );
    }
}
