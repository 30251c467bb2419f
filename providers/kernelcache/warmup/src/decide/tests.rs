#![allow(clippy::many_single_char_names)] // a case, its plan, its pods

use super::*;
use crate::pod::Outcome::{Active, Failed, Succeeded};

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

const T0: &str = "2026-03-01T10:00:00Z";

fn targets(names: &[&str]) -> Vec<Target> {
    names
        .iter()
        .map(|n| Target {
            node: (*n).into(),
            blocked: None,
        })
        .collect()
}

fn attempt(node: &str, n: i32, outcome: Outcome) -> Attempt {
    Attempt {
        pod: format!("w-{node}-{n}"),
        node: node.into(),
        attempt: n,
        running: outcome == Active,
        outcome,
    }
}

fn images() -> Actions {
    Actions {
        images: vec!["vllm:1".into()],
        ..Actions::default()
    }
}

struct Case {
    status: WarmupStatus,
    policies: WarmupPolicies,
    actions: Actions,
    targets: Vec<Target>,
    attempts: Vec<Attempt>,
    caches: BTreeMap<String, BTreeMap<String, OnNode>>,
    now: Timestamp,
}

impl Case {
    fn new(nodes: &[&str]) -> Self {
        Self {
            status: WarmupStatus::default(),
            policies: WarmupPolicies::default(),
            actions: images(),
            targets: targets(nodes),
            attempts: Vec::new(),
            caches: BTreeMap::new(),
            now: t(T0),
        }
    }

    fn plan(&self) -> Plan {
        progress(&Inputs {
            generation: Some(1),
            status: &self.status,
            policies: &self.policies,
            actions: &self.actions,
            targets: &self.targets,
            attempts: &self.attempts,
            caches: &self.caches,
            now: self.now,
        })
    }

    /// Take the plan's status and pods as what the cluster now holds.
    fn step(&mut self, plan: &Plan) {
        self.status = plan.status.clone();
        self.attempts.retain(|a| !plan.delete.contains(&a.pod));
        for (node, n) in &plan.create {
            self.attempts.push(attempt(node, *n, Active));
        }
    }

    fn finish(&mut self, node: &str, outcome: Outcome) {
        let a = self
            .attempts
            .iter_mut()
            .filter(|a| a.node == node)
            .max_by_key(|a| a.attempt)
            .unwrap();
        // Succeeded or Failed: the pod is over.
        a.running = outcome == Active;
        a.outcome = outcome;
    }

    /// The newest pod of `node` cannot pull its image: its attempt failed, and it stays
    /// `Pending` on the node.
    fn back_off(&mut self, node: &str) {
        self.finish(
            node,
            Failed("ImagePullBackOff".into(), "Back-off pulling image".into()),
        );
        if let Some(a) = self
            .attempts
            .iter_mut()
            .filter(|a| a.node == node)
            .max_by_key(|a| a.attempt)
        {
            a.running = true;
        }
    }
}

fn condition<'a>(s: &'a WarmupStatus, type_: &str) -> &'a Condition {
    s.conditions.iter().find(|c| c.type_ == type_).unwrap()
}

#[test]
fn parallelism_is_never_exceeded_and_nodes_start_in_name_order() {
    let mut c = Case::new(&["n1", "n2", "n3", "n4", "n5"]);
    c.policies.parallelism = Some(2);
    let p = c.plan();
    assert_eq!(p.create, [("n1".into(), 0), ("n2".into(), 0)]);
    assert_eq!(p.status.phase, Some(WarmupPhase::InProgress));
    assert_eq!((p.status.desired_nodes, p.status.active_nodes), (5, 2));
    assert_eq!(p.status.start_time, Some(Time(t(T0))));
    c.step(&p);
    assert!(c.plan().create.is_empty(), "both slots are taken");
    c.finish("n1", Succeeded);
    let p = c.plan();
    assert_eq!(p.create, [("n3".into(), 0)]);
    assert_eq!(p.events, [NodeEvent::Succeeded("n1".into())]);
    assert_eq!(p.status.succeeded_nodes, 1);
    c.step(&p);
    // A pod being deleted (of a node no longer targeted) still holds its slot.
    c.targets.retain(|t| t.node != "n2");
    let p = c.plan();
    assert_eq!(p.delete, ["w-n2-0"]);
    assert!(
        p.create.is_empty(),
        "the deleted pod still runs until it is gone"
    );
    c.step(&p);
    let p = c.plan();
    assert_eq!(p.create, [("n4".into(), 0)]);
}

#[test]
fn a_failed_attempt_is_retried_after_a_backoff_until_the_limit() {
    let mut c = Case::new(&["a"]);
    c.policies.backoff_limit_per_node = Some(1);
    let p = c.plan();
    c.step(&p);
    c.finish(
        "a",
        Failed(
            "PodFailed".into(),
            "container fetch exited with code 1: boom".into(),
        ),
    );
    let p = c.plan();
    assert!(p.create.is_empty(), "not at once");
    assert_eq!(p.status.failures.len(), 1);
    let f = &p.status.failures[0];
    assert_eq!(
        (f.attempts, f.permanent, f.reason.as_str()),
        (1, false, "PodFailed")
    );
    assert_eq!(
        p.status.active_nodes, 1,
        "a node waiting for its retry is active"
    );
    assert_eq!(p.requeue_after, Some(Duration::from_secs(2)));
    assert!(
        matches!(&p.events[..], [NodeEvent::Retrying(n, 1, r, _)] if n == "a" && r == "PodFailed")
    );
    c.step(&p);
    assert!(c.plan().create.is_empty(), "still backing off");
    c.now = t("2026-03-01T10:00:02Z");
    let p = c.plan();
    assert_eq!(p.create, [("a".into(), 1)], "the second attempt");
    c.step(&p);
    c.finish(
        "a",
        Failed("ImagePullBackOff".into(), "pull access denied".into()),
    );
    let p = c.plan();
    let f = &p.status.failures[0];
    assert_eq!((f.attempts, f.permanent), (2, true));
    assert_eq!(p.status.failed_nodes, 1);
    assert_eq!(
        p.status.phase,
        Some(WarmupPhase::Completed),
        "without maxFailedNodes any failure is tolerated"
    );
    assert!(
        matches!(&p.events[..], [NodeEvent::Failed(n, r, _)] if n == "a" && r == "ImagePullBackOff")
    );
}

#[test]
fn without_a_limit_a_node_is_retried_and_its_record_survives_a_lost_status() {
    let mut c = Case::new(&["a"]);
    c.attempts = vec![
        attempt("a", 0, Failed("PodFailed".into(), "x".into())),
        attempt("a", 3, Active),
    ];
    // The status never recorded the earlier failures: the newest pod says three.
    let p = c.plan();
    assert!(p.create.is_empty());
    assert_eq!(p.status.active_nodes, 1);
    c.attempts.push(attempt("a", 2, Active));
    let p = c.plan();
    assert_eq!(
        p.delete,
        ["w-a-2"],
        "an older attempt still running is stopped"
    );
    c.finish("a", Succeeded);
    c.attempts.retain(|a| a.attempt != 2);
    let p = c.plan();
    assert_eq!(p.status.phase, Some(WarmupPhase::Completed));
    assert_eq!(p.status.succeeded_nodes, 1);
}

#[test]
fn too_many_failed_nodes_stop_the_rollout() {
    let mut c = Case::new(&["a", "b", "c", "d"]);
    c.policies = WarmupPolicies {
        parallelism: Some(3),
        backoff_limit_per_node: Some(0),
        max_failed_nodes: Some(1),
        ..WarmupPolicies::default()
    };
    let p = c.plan();
    c.step(&p);
    c.finish("a", Failed("PodFailed".into(), "1".into()));
    let p = c.plan();
    assert_eq!(
        p.status.phase,
        Some(WarmupPhase::InProgress),
        "one failure is tolerated"
    );
    assert_eq!(p.create, [("d".into(), 0)]);
    c.step(&p);
    c.finish("b", Failed("PodFailed".into(), "2".into()));
    let p = c.plan();
    assert_eq!(p.status.phase, Some(WarmupPhase::Failed));
    assert_eq!(p.delete, ["w-c-0", "w-d-0"], "the running pods are stopped");
    assert!(p.create.is_empty());
    assert_eq!((p.status.failed_nodes, p.status.active_nodes), (2, 0));
    let failed = condition(&p.status, condition_types::FAILED);
    assert_eq!(failed.reason, reasons::MAX_FAILED_NODES_EXCEEDED);
    assert_eq!(
        condition(&p.status, condition_types::PROGRESSING).status,
        "False"
    );
    assert_eq!(p.status.completion_time, Some(Time(t(T0))));
}

#[test]
fn the_global_timeout_fails_the_warmup_from_its_start() {
    let mut c = Case::new(&["a", "b"]);
    c.policies.global_timeout_seconds = Some(60);
    c.policies.parallelism = Some(1);
    let p = c.plan();
    assert_eq!(
        p.requeue_after,
        Some(Duration::from_secs(60)),
        "woken at the deadline"
    );
    c.step(&p);
    c.now = t("2026-03-01T10:00:59Z");
    assert_eq!(c.plan().status.phase, Some(WarmupPhase::InProgress));
    c.now = t("2026-03-01T10:01:00Z");
    let p = c.plan();
    assert_eq!(p.status.phase, Some(WarmupPhase::Failed));
    assert_eq!(
        condition(&p.status, condition_types::FAILED).reason,
        reasons::GLOBAL_TIMEOUT_EXCEEDED
    );
    assert_eq!(p.delete, ["w-a-0"]);
}

#[test]
fn nothing_to_warm_completes_at_once_and_nodes_that_join_are_warmed() {
    let c = Case::new(&[]);
    let p = c.plan();
    assert_eq!(p.status.phase, Some(WarmupPhase::Completed));
    assert_eq!(
        condition(&p.status, condition_types::COMPLETE).reason,
        reasons::NO_NODES_MATCHED
    );

    let mut c = Case::new(&["a"]);
    let p = c.plan();
    c.step(&p);
    c.targets = targets(&["a", "b"]);
    let p = c.plan();
    assert_eq!(p.create, [("b".into(), 0)]);
    assert_eq!(p.status.desired_nodes, 2);
}

#[test]
fn blocked_nodes_fail_without_a_pod_and_start_once_unblocked() {
    let mut c = Case::new(&["a", "gone"]);
    c.targets[1].blocked = Some((reasons::NODE_NOT_FOUND, "there is no Node 'gone'".into()));
    let p = c.plan();
    assert_eq!(p.create, [("a".into(), 0)]);
    assert_eq!(p.status.failed_nodes, 1);
    let f = &p.status.failures[0];
    assert_eq!(
        (f.node_name.as_str(), f.reason.as_str(), f.permanent),
        ("gone", reasons::NODE_NOT_FOUND, true)
    );
    c.step(&p);
    c.targets[1].blocked = None;
    let p = c.plan();
    assert_eq!(
        p.create,
        [("gone".into(), 0)],
        "it appeared while the warmup runs"
    );
    assert!(
        p.status.failures.is_empty(),
        "no failed attempt to remember"
    );
    // A taint only keeps a node from starting; a running node goes on.
    c.step(&p);
    c.targets[1].blocked = Some((reasons::UNTOLERATED_TAINT, "t".into()));
    assert_eq!(c.plan().status.failed_nodes, 0);
}

#[test]
fn a_node_is_warm_once_its_caches_are_staged() {
    let mut c = Case::new(&["a", "b"]);
    c.actions.kernel_caches = vec!["vadd".into()];
    let cache = |s: OnNode| BTreeMap::from([("vadd".to_string(), s)]);
    c.caches
        .insert("a".into(), cache(OnNode::Waiting("staging".into())));
    c.caches.insert(
        "b".into(),
        cache(OnNode::Failed(
            reasons::KERNEL_CACHE_INCOMPATIBLE,
            "arch 80".into(),
        )),
    );
    let p = c.plan();
    assert_eq!(p.create, [("a".into(), 0)], "b can never be warm");
    assert_eq!(
        p.status.failures[0].reason,
        reasons::KERNEL_CACHE_INCOMPATIBLE
    );
    c.step(&p);
    c.finish("a", Succeeded);
    let p = c.plan();
    assert_eq!(
        (p.status.active_nodes, p.status.succeeded_nodes),
        (1, 0),
        "the pod is done, the cache is not"
    );
    c.caches.insert("a".into(), cache(OnNode::Ready));
    let p = c.plan();
    assert_eq!(p.status.phase, Some(WarmupPhase::Completed));
    assert_eq!((p.status.succeeded_nodes, p.status.failed_nodes), (1, 1));

    // Caches only: no pod at all.
    let mut c = Case::new(&["a"]);
    c.actions = Actions {
        kernel_caches: vec!["vadd".into()],
        ..Actions::default()
    };
    c.caches.insert("a".into(), cache(OnNode::Ready));
    let p = c.plan();
    assert!(p.create.is_empty());
    assert_eq!(p.status.phase, Some(WarmupPhase::Completed));
}

#[test]
fn a_finished_warmup_stops_stray_pods_and_goes_after_its_ttl() {
    let status = WarmupStatus {
        phase: Some(WarmupPhase::Completed),
        completion_time: Some(Time(t(T0))),
        ..WarmupStatus::default()
    };
    let policies = WarmupPolicies {
        ttl_seconds_after_finished: Some(30),
        ..WarmupPolicies::default()
    };
    let attempts = [attempt("a", 0, Succeeded), attempt("b", 0, Active)];
    let p = finished(&status, &policies, &attempts, t("2026-03-01T10:00:10Z"));
    assert_eq!(p.delete, ["w-b-0"]);
    assert!(!p.delete_warmup);
    assert_eq!(p.requeue_after, Some(Duration::from_secs(20)));
    let p = finished(&status, &policies, &attempts, t("2026-03-01T10:00:30Z"));
    assert!(p.delete_warmup);
    let kept = finished(
        &status,
        &WarmupPolicies::default(),
        &[],
        t("2027-01-01T00:00:00Z"),
    );
    assert!(
        !kept.delete_warmup && kept.requeue_after.is_none(),
        "no TTL: kept"
    );
    let far = WarmupPolicies {
        ttl_seconds_after_finished: Some(86_400),
        ..WarmupPolicies::default()
    };
    assert_eq!(
        finished(&status, &far, &[], t(T0)).requeue_after,
        Some(MAX_REQUEUE)
    );
}

#[test]
fn waiting_and_invalid_warmups() {
    let s = waiting(
        &WarmupStatus::default(),
        Some(1),
        reasons::NOTHING_TO_WARM,
        "nothing to warm",
        t(T0),
    );
    assert_eq!(s.phase, Some(WarmupPhase::Pending));
    assert_eq!(
        condition(&s, condition_types::PROGRESSING).reason,
        reasons::NOTHING_TO_WARM
    );
    let running = WarmupStatus {
        phase: Some(WarmupPhase::InProgress),
        ..WarmupStatus::default()
    };
    let s = waiting(&running, Some(1), reasons::TARGET_NOT_FOUND, "gone", t(T0));
    assert_eq!(
        s.phase,
        Some(WarmupPhase::Failed),
        "its target went away while it ran"
    );
    assert_eq!(
        condition(&s, condition_types::FAILED).reason,
        reasons::TARGET_NOT_FOUND
    );
    let s = invalid(&WarmupStatus::default(), Some(1), "bad template", t(T0));
    assert_eq!(s.phase, Some(WarmupPhase::Failed));
    assert_eq!(
        condition(&s, condition_types::FAILED).reason,
        reasons::INVALID_SPEC
    );
}

#[test]
fn an_unchanged_world_gives_an_unchanged_status() {
    let mut c = Case::new(&["a", "b"]);
    c.policies.parallelism = Some(1);
    let p = c.plan();
    c.step(&p);
    c.now = t("2026-03-01T10:05:00Z");
    let again = c.plan();
    assert_eq!(again.status, c.status, "nothing to write");
    assert!(again.create.is_empty() && again.delete.is_empty());
}

#[test]
fn a_pod_backing_off_its_image_pull_fails_its_attempt_and_is_deleted() {
    let mut c = Case::new(&["a", "b"]);
    c.policies.parallelism = Some(1);
    c.policies.backoff_limit_per_node = Some(1);
    let p = c.plan();
    c.step(&p);
    c.back_off("a");
    let p = c.plan();
    assert_eq!(
        p.delete,
        ["w-a-0"],
        "it would hold the node and the slot forever"
    );
    assert_eq!(
        p.events,
        [NodeEvent::Retrying(
            "a".into(),
            1,
            "ImagePullBackOff".into(),
            "Back-off pulling image".into()
        )]
    );
    assert!(
        p.create.is_empty(),
        "the slot is free only once the pod is gone"
    );
    c.step(&p);
    let p = c.plan();
    assert_eq!(
        p.create,
        [("b".into(), 0)],
        "a waits for its retry, b starts"
    );
    let failure = &p.status.failures[0];
    assert_eq!((failure.attempts, failure.permanent), (1, false));
}

#[test]
fn missing_nodes_fail_at_once_and_count_against_max_failed_nodes() {
    let missing = |c: &mut Case| {
        for t in c.targets.iter_mut().filter(|t| t.node.starts_with("gone")) {
            t.blocked = Some((
                reasons::NODE_NOT_FOUND,
                format!("there is no Node '{}'", t.node),
            ));
        }
    };
    // Within the tolerance: the other nodes go on; the warmup completes once they are
    // done, with no deadline involved.
    let mut c = Case::new(&["a", "gone-1"]);
    c.policies.max_failed_nodes = Some(1);
    c.policies.backoff_limit_per_node = Some(0);
    missing(&mut c);
    let p = c.plan();
    assert_eq!(p.status.phase, Some(WarmupPhase::InProgress));
    assert_eq!((p.status.failed_nodes, p.status.active_nodes), (1, 1));
    assert_eq!(p.requeue_after, None, "no deadline waited for");
    c.step(&p);
    c.attempts[0].outcome = Succeeded;
    c.attempts[0].running = false;
    let p = c.plan();
    assert_eq!(p.status.phase, Some(WarmupPhase::Completed));
    assert_eq!((p.status.succeeded_nodes, p.status.failed_nodes), (1, 1));

    // One more than tolerated: failed on the first look, nothing started.
    let mut c = Case::new(&["a", "gone-1", "gone-2"]);
    c.policies.max_failed_nodes = Some(1);
    c.policies.backoff_limit_per_node = Some(0);
    missing(&mut c);
    let p = c.plan();
    assert_eq!(p.status.phase, Some(WarmupPhase::Failed));
    assert!(p.create.is_empty(), "{p:?}");
    let failed = p
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition_types::FAILED)
        .unwrap();
    assert_eq!(failed.reason, reasons::MAX_FAILED_NODES_EXCEEDED);
    assert!(
        p.status
            .failures
            .iter()
            .all(|f| f.reason == reasons::NODE_NOT_FOUND && f.permanent),
        "{:?}",
        p.status.failures
    );
}
