//! The Warmup controller's decisions, as pure functions of what the caches hold: which
//! pods to create and delete, and the status. The state machine is RBG's
//! (`internal/controller/workloads/rolebasedgroupwarmup_controller.go@v0.8.0-alpha.5` of
//! sgl-project/rbg):
//!
//! - a node whose attempt failed is retried (after `process::backoff` of its failures)
//!   until it failed more than `backoffLimitPerNode` times, then it failed for good;
//!   without a limit it is retried until the warmup ends;
//! - more failed nodes than `maxFailedNodes` stop the rollout at once: the warmup fails
//!   and its running pods are deleted; so does `globalTimeoutSeconds` after the start;
//! - never more than `parallelism` warmup pods run (pods being deleted count too); nodes
//!   start in name order;
//! - every node done (failures within `maxFailedNodes`, or any without it): `Completed`;
//!   no node to warm: `Completed` at once;
//! - a finished warmup stays as it is (nodes that join later are not warmed); it is
//!   deleted `ttlSecondsAfterFinished` after it finished, with its pods.
//!
//! Unlike RBG, the record of a node's failed attempts is the status (`failures`), not the
//! failed pods, so an attempt that never leaves `Pending` (image pull back-off) can end
//! too; and a node is warm only once its kernel caches are staged.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kubeairunway_sdk::conditions;

use super::caches::OnNode;
use super::pod::{Actions, Attempt, Outcome};
use super::targets::Target;
use kubeairunway_sdk::api::warmup::{condition_types, reasons};
use kubeairunway_sdk::api::{NodeFailure, WarmupPhase, WarmupPolicies, WarmupStatus};

/// The longest wait before looking at a finished warmup again (its TTL), as RBG caps its
/// requeues (`MaxRequeueDelay`).
pub const MAX_REQUEUE: Duration = Duration::from_secs(600);

/// The longest failure message kept per node.
const MAX_MESSAGE: usize = 512;

/// What one reconcile of a running Warmup sees.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// The Warmup's generation.
    pub generation: Option<i64>,
    /// Its status as last written.
    pub status: &'a WarmupStatus,
    /// Its policies.
    pub policies: &'a WarmupPolicies,
    /// What each node gets.
    pub actions: &'a Actions,
    /// The nodes to warm.
    pub targets: &'a [Target],
    /// Its pods (from the cache, and those created but not yet seen there).
    pub attempts: &'a [Attempt],
    /// Per node, the state of each KernelCache of `actions`.
    pub caches: &'a BTreeMap<String, BTreeMap<String, OnNode>>,
    /// The time.
    pub now: Timestamp,
}

/// A node's outcome decided in this pass, for events and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeEvent {
    /// The node is warm.
    Succeeded(String),
    /// An attempt failed and will be retried: `(node, failures so far, reason, message)`.
    Retrying(String, i32, String, String),
    /// The node failed for good: `(node, reason, message)`.
    Failed(String, String, String),
}

/// What to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The new status.
    pub status: WarmupStatus,
    /// Pods to create: `(node, attempt)`.
    pub create: Vec<(String, i32)>,
    /// Pods to delete, by name.
    pub delete: Vec<String>,
    /// Node outcomes seen in this pass.
    pub events: Vec<NodeEvent>,
    /// Delete the Warmup itself (its TTL ran out).
    pub delete_warmup: bool,
    /// Look again after this long without any change (a retry or a deadline is due).
    pub requeue_after: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for a pod (first attempt, or a retry that is due).
    Pending,
    /// Being warmed.
    Active,
    Succeeded,
    Failed,
}

/// One node's evaluation.
struct NodeEval {
    state: State,
    /// The attempt to start, when `Pending`.
    attempt: i32,
    failure: Option<NodeFailure>,
    delete: Vec<String>,
    retry_at: Option<Timestamp>,
    event: Option<NodeEvent>,
}

fn cut(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_string();
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

fn after(t: Timestamp, d: Duration) -> Timestamp {
    let span = k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or_default();
    t.checked_add(span).unwrap_or(t)
}

fn until(now: Timestamp, t: Timestamp) -> Duration {
    Duration::try_from(t.duration_since(now)).unwrap_or_default()
}

/// The evaluation of `target`'s warmup pod: what its attempts say.
fn eval_pod(
    target: &Target,
    previous: Option<&NodeFailure>,
    attempts: &[&Attempt],
    policies: &WarmupPolicies,
    now: Timestamp,
) -> NodeEval {
    let recorded = previous.map_or(0, |f| f.attempts);
    let newest = attempts.iter().map(|a| a.attempt).max();
    // Attempts before the newest pod all failed, even if the status never said so.
    let failures = newest.map_or(recorded, |n| n.max(recorded));
    let exhausted = |n: i32| policies.backoff_limit_per_node.is_some_and(|l| n > l);
    let mut eval = NodeEval {
        state: State::Active,
        attempt: failures,
        // Only failed attempts carry over (a node that was missing or tainted starts
        // afresh).
        failure: previous.filter(|f| f.attempts > 0).map(|f| NodeFailure {
            permanent: exhausted(f.attempts),
            ..f.clone()
        }),
        delete: attempts
            .iter()
            .filter(|a| a.attempt < failures && a.running)
            .map(|a| a.pod.clone())
            .collect(),
        retry_at: None,
        event: None,
    };
    let current = attempts.iter().find(|a| a.attempt == failures);
    match current.map(|a| &a.outcome) {
        Some(Outcome::Succeeded) => eval.state = State::Succeeded,
        Some(Outcome::Active) => eval.state = State::Active,
        Some(Outcome::Failed(reason, message)) => {
            // A pod that failed its attempt but still holds the node (an image pull
            // backing off) goes; a finished one stays for its logs.
            eval.delete
                .extend(current.filter(|a| a.running).map(|a| a.pod.clone()));
            let n = failures + 1;
            let permanent = exhausted(n);
            eval.failure = Some(NodeFailure {
                node_name: target.node.clone(),
                reason: reason.clone(),
                message: cut(message),
                attempts: n,
                permanent,
                last_failure_time: Some(Time(now)),
            });
            if permanent {
                eval.state = State::Failed;
                eval.event = Some(NodeEvent::Failed(
                    target.node.clone(),
                    reason.clone(),
                    cut(message),
                ));
            } else {
                eval.retry_at = Some(after(
                    now,
                    kubeairunway_sdk::process::backoff(n.unsigned_abs()),
                ));
                eval.event = Some(NodeEvent::Retrying(
                    target.node.clone(),
                    n,
                    reason.clone(),
                    cut(message),
                ));
            }
        }
        None if failures == 0 => eval.state = State::Pending,
        None if exhausted(failures) => eval.state = State::Failed,
        None => {
            let last = previous
                .and_then(|f| f.last_failure_time.as_ref())
                .map_or(now, |t| t.0);
            let due = after(
                last,
                kubeairunway_sdk::process::backoff(failures.unsigned_abs()),
            );
            if now >= due {
                eval.state = State::Pending;
            } else {
                eval.retry_at = Some(due);
            }
        }
    }
    eval
}

/// The evaluation of one node: its pod, its caches, what blocks it.
fn eval_node(
    target: &Target,
    previous: Option<&NodeFailure>,
    attempts: &[&Attempt],
    caches: Option<&BTreeMap<String, OnNode>>,
    inputs: &Inputs<'_>,
) -> NodeEval {
    let now = inputs.now;
    let fail = |reason: &str, message: &str, delete: Vec<String>| NodeEval {
        state: State::Failed,
        attempt: 0,
        failure: Some(NodeFailure {
            node_name: target.node.clone(),
            reason: reason.to_string(),
            message: cut(message),
            attempts: previous.map_or(0, |f| f.attempts),
            permanent: true,
            last_failure_time: Some(
                previous
                    .filter(|f| f.permanent && f.reason == reason)
                    .and_then(|f| f.last_failure_time.clone())
                    .unwrap_or(Time(now)),
            ),
        }),
        delete,
        retry_at: None,
        event: Some(NodeEvent::Failed(
            target.node.clone(),
            reason.to_string(),
            cut(message),
        )),
    };
    let running: Vec<String> = attempts
        .iter()
        .filter(|a| a.running)
        .map(|a| a.pod.clone())
        .collect();
    // A taint only keeps a node from starting; a node that is gone ends its warmup.
    if let Some((reason, message)) = &target.blocked
        && (attempts.is_empty() || *reason == reasons::NODE_NOT_FOUND)
    {
        return fail(reason, message, running);
    }
    if let Some((reason, message)) = caches.into_iter().flatten().find_map(|(_, s)| match s {
        OnNode::Failed(r, m) => Some((*r, m.clone())),
        _ => None,
    }) {
        return fail(reason, &message, running);
    }
    let mut eval = if inputs.actions.needs_pod() {
        eval_pod(target, previous, attempts, inputs.policies, now)
    } else {
        NodeEval {
            state: State::Succeeded,
            attempt: 0,
            failure: None,
            delete: running,
            retry_at: None,
            event: None,
        }
    };
    let caches_ready = caches
        .into_iter()
        .flatten()
        .all(|(_, s)| *s == OnNode::Ready);
    if eval.state == State::Succeeded && !caches_ready {
        eval.state = State::Active;
    }
    if eval.state == State::Succeeded {
        eval.event = Some(NodeEvent::Succeeded(target.node.clone()));
    }
    eval
}

/// One reconcile of a Warmup that runs (or starts now).
pub fn progress(inputs: &Inputs<'_>) -> Plan {
    let now = inputs.now;
    let at = Stamp {
        generation: inputs.generation,
        now,
    };
    let previous: BTreeMap<&str, &NodeFailure> = inputs
        .status
        .failures
        .iter()
        .map(|f| (f.node_name.as_str(), f))
        .collect();
    let mut by_node: BTreeMap<&str, Vec<&Attempt>> = BTreeMap::new();
    for a in inputs.attempts {
        by_node.entry(a.node.as_str()).or_default().push(a);
    }
    let mut plan = Plan::default();
    let mut evals = Vec::with_capacity(inputs.targets.len());
    for target in inputs.targets {
        let attempts = by_node.remove(target.node.as_str()).unwrap_or_default();
        let eval = eval_node(
            target,
            previous.get(target.node.as_str()).copied(),
            &attempts,
            inputs.caches.get(&target.node),
            inputs,
        );
        evals.push((target, eval));
    }
    // Pods of nodes no longer targeted (a node relabelled or gone) stop.
    plan.delete.extend(
        by_node
            .values()
            .flatten()
            .filter(|a| a.running)
            .map(|a| a.pod.clone()),
    );
    let count = |s: State| evals.iter().filter(|(_, e)| e.state == s).count();
    let failed = count(State::Failed);
    let waiting = count(State::Pending) + count(State::Active);
    let running_pods = inputs.attempts.iter().filter(|a| a.running).count();

    let mut status = inputs.status.clone();
    status.observed_generation = inputs.generation;
    status.images.clone_from(&inputs.actions.images);
    status.start_time = status.start_time.or(Some(Time(now)));
    status.failures = evals
        .iter()
        .filter_map(|(_, e)| e.failure.clone())
        .collect();
    let started = status.start_time.as_ref().map_or(now, |t| t.0);
    let deadline = inputs
        .policies
        .global_timeout_seconds
        .map(|s| after(started, Duration::from_secs(s.unsigned_abs())));
    let too_many = inputs
        .policies
        .max_failed_nodes
        .is_some_and(|max| i64::try_from(failed).unwrap_or(i64::MAX) > i64::from(max));

    let stop = if deadline.is_some_and(|d| now >= d) {
        Some((
            reasons::GLOBAL_TIMEOUT_EXCEEDED,
            format!(
                "the warmup did not finish within {}s",
                inputs.policies.global_timeout_seconds.unwrap_or_default()
            ),
        ))
    } else if too_many {
        Some((
            reasons::MAX_FAILED_NODES_EXCEEDED,
            format!(
                "{failed} nodes failed, more than maxFailedNodes {}",
                inputs.policies.max_failed_nodes.unwrap_or_default()
            ),
        ))
    } else {
        None
    };
    plan.events = evals.iter().filter_map(|(_, e)| e.event.clone()).collect();
    for (_, e) in &mut evals {
        plan.delete.append(&mut e.delete);
    }
    if let Some((reason, message)) = stop {
        // Stop the rollout: every running pod goes, nothing new starts.
        plan.delete.extend(
            inputs
                .attempts
                .iter()
                .filter(|a| a.running)
                .map(|a| a.pod.clone()),
        );
        plan.delete.sort();
        plan.delete.dedup();
        fill_counts(&mut status, inputs.targets.len(), &evals, 0);
        status.active_nodes = 0;
        finish(&mut status, WarmupPhase::Failed, reason, &message, at);
        plan.requeue_after = ttl_requeue(&status, inputs.policies, now);
        plan.status = status;
        return plan;
    }

    let free = inputs.policies.parallelism.map_or(usize::MAX, |p| {
        usize::try_from(p).unwrap_or(0).saturating_sub(running_pods)
    });
    plan.create = evals
        .iter()
        .filter(|(_, e)| e.state == State::Pending)
        .take(free)
        .map(|(t, e)| (t.node.clone(), e.attempt))
        .collect();
    plan.delete.sort();
    plan.delete.dedup();
    fill_counts(&mut status, inputs.targets.len(), &evals, plan.create.len());

    if waiting == 0 {
        let (reason, message) = if inputs.targets.is_empty() {
            (
                reasons::NO_NODES_MATCHED,
                "no node matches the target".to_string(),
            )
        } else {
            (
                reasons::NODES_WARMED,
                format!(
                    "{} of {} nodes warmed, {failed} failed",
                    status.succeeded_nodes, status.desired_nodes
                ),
            )
        };
        finish(&mut status, WarmupPhase::Completed, reason, &message, at);
        plan.requeue_after = ttl_requeue(&status, inputs.policies, now);
    } else {
        status.phase = Some(WarmupPhase::InProgress);
        let message = format!(
            "{} of {} nodes warmed, {} active, {failed} failed",
            status.succeeded_nodes, status.desired_nodes, status.active_nodes
        );
        set(
            &mut status.conditions,
            condition_types::PROGRESSING,
            true,
            reasons::WARMUP_IN_PROGRESS,
            &message,
            at,
        );
        let next = evals
            .iter()
            .filter_map(|(_, e)| e.retry_at)
            .chain(deadline)
            .min();
        plan.requeue_after = next.map(|t| until(now, t).max(Duration::from_millis(100)));
    }
    plan.status = status;
    plan
}

fn fill_counts(
    status: &mut WarmupStatus,
    desired: usize,
    evals: &[(&Target, NodeEval)],
    started: usize,
) {
    let n = |x: usize| i32::try_from(x).unwrap_or(i32::MAX);
    let count = |s: State| evals.iter().filter(|(_, e)| e.state == s).count();
    status.desired_nodes = n(desired);
    status.succeeded_nodes = n(count(State::Succeeded));
    status.failed_nodes = n(count(State::Failed));
    status.active_nodes = n(count(State::Active) + started);
}

/// When and for which generation a condition is written.
#[derive(Clone, Copy)]
struct Stamp {
    generation: Option<i64>,
    now: Timestamp,
}

fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    at: Stamp,
) {
    let idx = conditions.iter().position(|c| c.type_ == type_);
    let c = conditions::new(
        idx.map(|i| &conditions[i]),
        type_,
        ok,
        reason,
        message,
        at.generation,
        at.now,
    );
    match idx {
        Some(i) => conditions[i] = c,
        None => conditions.push(c),
    }
}

/// End the warmup: phase, completion time, conditions.
fn finish(status: &mut WarmupStatus, phase: WarmupPhase, reason: &str, message: &str, at: Stamp) {
    status.phase = Some(phase);
    status.completion_time = Some(Time(at.now));
    set(
        &mut status.conditions,
        condition_types::PROGRESSING,
        false,
        reasons::FINISHED,
        message,
        at,
    );
    let type_ = if phase == WarmupPhase::Completed {
        condition_types::COMPLETE
    } else {
        condition_types::FAILED
    };
    set(&mut status.conditions, type_, true, reason, message, at);
}

/// A Warmup that cannot start yet (its target or its images are not there): `Pending`
/// with why; or, when it had started, `Failed`.
pub fn waiting(
    status: &WarmupStatus,
    generation: Option<i64>,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> WarmupStatus {
    let mut status = status.clone();
    status.observed_generation = generation;
    let at = Stamp { generation, now };
    if status.phase == Some(WarmupPhase::InProgress) {
        status.active_nodes = 0;
        finish(&mut status, WarmupPhase::Failed, reason, message, at);
    } else {
        status.phase = Some(WarmupPhase::Pending);
        set(
            &mut status.conditions,
            condition_types::PROGRESSING,
            false,
            reason,
            message,
            at,
        );
    }
    status
}

/// A Warmup whose spec cannot run at all: `Failed`, reason `InvalidSpec`.
pub fn invalid(
    status: &WarmupStatus,
    generation: Option<i64>,
    message: &str,
    now: Timestamp,
) -> WarmupStatus {
    let mut status = status.clone();
    status.observed_generation = generation;
    status.active_nodes = 0;
    finish(
        &mut status,
        WarmupPhase::Failed,
        reasons::INVALID_SPEC,
        message,
        Stamp { generation, now },
    );
    status
}

fn ttl_requeue(
    status: &WarmupStatus,
    policies: &WarmupPolicies,
    now: Timestamp,
) -> Option<Duration> {
    let ttl = policies.ttl_seconds_after_finished?;
    let finished = status.completion_time.as_ref()?.0;
    let expiry = after(finished, Duration::from_secs(u64::from(ttl.unsigned_abs())));
    Some(until(now, expiry).clamp(Duration::from_millis(100), MAX_REQUEUE))
}

/// A finished Warmup: pods still running are deleted (a warmup stopped while they ran);
/// after `ttlSecondsAfterFinished` the Warmup goes, and its pods with it.
pub fn finished(
    status: &WarmupStatus,
    policies: &WarmupPolicies,
    attempts: &[Attempt],
    now: Timestamp,
) -> Plan {
    let mut plan = Plan {
        status: status.clone(),
        delete: attempts
            .iter()
            .filter(|a| a.running)
            .map(|a| a.pod.clone())
            .collect(),
        ..Plan::default()
    };
    if let (Some(ttl), Some(done)) = (
        policies.ttl_seconds_after_finished,
        status.completion_time.as_ref(),
    ) {
        let expiry = after(done.0, Duration::from_secs(u64::from(ttl.unsigned_abs())));
        if now >= expiry {
            plan.delete_warmup = true;
        } else {
            plan.requeue_after = ttl_requeue(status, policies, now);
        }
    }
    plan
}

#[cfg(test)]
mod tests;
