//! A Job read as our status, from the conditions the Job controller writes.

use kube::api::DynamicObject;

use super::read::{Live, int, text};
use crate::provider::Observed;

/// Our status from a live `batch/v1` Job, `kind` naming it in messages:
///
/// - `Failed` once the Job controller declared it failed (`Failed=True`, with its reason:
///   `BackoffLimitExceeded`, `DeadlineExceeded`, ...), the failure it never retries;
/// - `Running` once it completed (`Complete=True`), and while as many of its pods are
///   ready as it runs at once (`status.ready` against `spec.parallelism`, 1 when unset);
/// - `Deploying` otherwise.
///
/// Replicas: desired is the parallelism, ready the ready pods.
pub fn job(live: &DynamicObject, kind: &str) -> Observed {
    let l = Live::of(live);
    let parallelism = int(l.spec, "parallelism").unwrap_or(1);
    let (ready, active, succeeded) = (l.count("ready"), l.count("active"), l.count("succeeded"));
    let observed = if let Some(failed) = l.true_condition("Failed") {
        let reason = text(failed, "reason");
        let message = match text(failed, "message") {
            m if m.is_empty() => format!("the {kind}'s Job failed"),
            m => m,
        };
        Observed::failed(
            if reason.is_empty() {
                "JobFailed"
            } else {
                &reason
            },
            message,
        )
    } else if l.true_condition("Complete").is_some() {
        Observed::running(format!("{kind} completed: {succeeded} pods succeeded"))
    } else if parallelism > 0 && ready >= parallelism {
        Observed::running(format!("{kind} ready: {ready} of {parallelism} pods ready"))
    } else {
        Observed::deploying(format!(
            "waiting for the {kind}'s pods: {ready} of {parallelism} ready, {active} active"
        ))
    };
    observed.with_replicas(parallelism, ready)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::needless_pass_by_value)] // JSON literals built in place
    use super::*;
    use crate::api::Phase;
    use serde_json::{Value, json};

    fn job_with(status: Value) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j", "generation": 1}, "spec": {"parallelism": 2}, "status": status}))
        .unwrap()
    }

    #[test]
    fn a_job_fails_on_its_failed_condition_and_runs_while_its_pods_are_ready() {
        let o = job(&job_with(json!({"active": 2, "ready": 1})), "batch");
        assert_eq!(o.phase, Phase::Deploying);
        assert_eq!(
            o.message,
            "waiting for the batch's pods: 1 of 2 ready, 2 active"
        );
        assert_eq!(
            job(&job_with(json!({"active": 2, "ready": 2})), "batch").phase,
            Phase::Running
        );
        let failed = job(
            &job_with(json!({"failed": 7, "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit"}]})),
            "batch",
        );
        assert_eq!(failed.phase, Phase::Failed);
        assert_eq!(failed.reason, "BackoffLimitExceeded");
        assert_eq!(
            failed.message,
            "Job has reached the specified backoff limit"
        );
        let done = job(
            &job_with(json!({"succeeded": 2, "conditions": [
            {"type": "Complete", "status": "True"}]})),
            "batch",
        );
        assert_eq!(done.phase, Phase::Running);
        let not_yet = job(
            &job_with(json!({"conditions": [{"type": "Failed", "status": "False"}]})),
            "batch",
        );
        assert_eq!(not_yet.phase, Phase::Deploying);
    }
}
