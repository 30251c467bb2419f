#![allow(clippy::needless_pass_by_value)] // JSON literals built in place
use serde_json::json;

use super::*;
use crate::api::Phase;
use crate::runtime::fixtures::{cond, gated_md, object, warmup};
use crate::runtime::view::ProviderView;
#[test]
fn a_warmup_is_read_by_its_phase_and_deciding_condition() {
    let running = warmup(
        Some("InProgress"),
        json!([cond(
            "Progressing",
            "WarmupInProgress",
            "1 of 2 nodes warmed, 1 active, 0 failed"
        )]),
    );
    assert_eq!(
        read(&running),
        Seen::Found {
            phase: Some(WarmupPhase::InProgress),
            reason: "WarmupInProgress".into(),
            message: "1 of 2 nodes warmed, 1 active, 0 failed".into(),
            images: vec!["llama.cpp:b1".into()],
        }
    );
    let failed = warmup(
        Some("Failed"),
        json!([
            cond("Progressing", "Finished", "over"),
            cond("Failed", "MaxFailedNodesExceeded", "2 nodes failed")
        ]),
    );
    assert!(
        matches!(read(&failed), Seen::Found { reason, .. } if reason == "MaxFailedNodesExceeded")
    );
    assert_eq!(
        read(&warmup(None, json!([]))),
        Seen::Found {
            phase: None,
            reason: String::new(),
            message: String::new(),
            images: vec!["llama.cpp:b1".into()],
        }
    );
}
fn found(phase: &str, reason: &str, message: &str) -> Seen {
    Seen::Found {
        phase: Some(serde_json::from_value(json!(phase)).unwrap()),
        reason: reason.into(),
        message: message.into(),
        images: vec!["llama.cpp:b1".into()],
    }
}
fn creation() -> Change {
    Change {
        create: true,
        ..Change::default()
    }
}
#[test]
fn a_creation_waits_for_a_completed_warmup() {
    let completed = decide(
        "w",
        &found("Completed", "NodesWarmed", "2 of 2 nodes warmed"),
        &creation(),
    );
    assert!(completed.open);
    assert_eq!(completed.reason, reasons::WARMUP_COMPLETED);
    assert!(completed.message.contains("2 of 2 nodes warmed"));

    let running = decide(
        "w",
        &found("InProgress", "WarmupInProgress", "1 of 2 nodes warmed"),
        &creation(),
    );
    assert!(!running.open && running.create && !running.failed);
    assert_eq!(running.reason, reasons::AWAITING_WARMUP);
    assert!(
        running
            .message
            .contains("phase InProgress: 1 of 2 nodes warmed); nothing is created until then"),
        "{running:?}"
    );
    let pending = decide(
        "w",
        &found("Pending", "TargetNotFound", "no ModelDeployment"),
        &creation(),
    );
    assert_eq!(pending.reason, reasons::AWAITING_WARMUP);

    let failed = decide(
        "w",
        &found("Failed", "GlobalTimeoutExceeded", "did not finish"),
        &creation(),
    );
    assert!(!failed.open && failed.failed);
    assert_eq!(failed.reason, reasons::WARMUP_FAILED);
    assert!(
        failed
            .message
            .contains("GlobalTimeoutExceeded: did not finish"),
        "{failed:?}"
    );

    let missing = decide("w", &Seen::Missing, &creation());
    assert!(!missing.open && !missing.failed);
    assert_eq!(missing.reason, reasons::WARMUP_NOT_FOUND);
    let unavailable = decide("w", &Seen::Unavailable, &creation());
    assert_eq!(unavailable.reason, reasons::WARMUP_UNAVAILABLE);
    assert!(
        unavailable
            .message
            .contains("cache.kubeairunway.ai/v1alpha1")
    );
}
#[test]
fn a_scale_up_or_an_upgrade_waits_and_nothing_else_does() {
    let scale_up = Change {
        scale_up: vec!["replicas 2 to 3".into()],
        ..Change::default()
    };
    let upgrade = Change {
        new_images: vec!["llama.cpp:b2".into()],
        ..Change::default()
    };
    for seen in [
        Seen::Missing,
        Seen::Unavailable,
        found("InProgress", "WarmupInProgress", "0 of 1"),
        found("Failed", "X", "y"),
    ] {
        let nothing = decide("w", &seen, &Change::default());
        assert!(nothing.open, "{seen:?}");
        assert_eq!(nothing.reason, reasons::ALREADY_CREATED);
        for change in [&scale_up, &upgrade] {
            let g = decide("w", &seen, change);
            assert!(!g.open && !g.create && !g.failed, "{seen:?} {g:?}");
            assert!(
                g.message.contains("the live objects are kept as they are"),
                "{g:?}"
            );
        }
    }
    let held = decide("w", &Seen::Missing, &scale_up);
    assert_eq!(held.reason, reasons::WARMUP_NOT_FOUND);
    assert!(
        held.message
            .contains("the scale-up (replicas 2 to 3) is not applied"),
        "{held:?}"
    );
    assert_eq!(
        decide("w", &found("Failed", "X", "y"), &upgrade).reason,
        reasons::WARMUP_FAILED
    );

    // A completed Warmup opens a scale-up, and an upgrade to images it preloaded.
    let completed = found("Completed", "NodesWarmed", "done");
    assert!(decide("w", &completed, &scale_up).open);
    let covered = Change {
        new_images: vec!["llama.cpp:b1".into()],
        ..Change::default()
    };
    assert_eq!(
        decide("w", &completed, &covered).reason,
        reasons::WARMUP_COMPLETED
    );
    // It ran before the upgrade: it did not preload the new image.
    let outdated = decide("w", &completed, &upgrade);
    assert!(!outdated.open && !outdated.failed);
    assert_eq!(outdated.reason, reasons::WARMUP_OUTDATED);
    assert!(
        outdated.message.contains("llama.cpp:b1")
            && outdated.message.contains("adds llama.cpp:b2")
            && outdated
                .message
                .contains("delete the Warmup and create it again"),
        "{outdated:?}"
    );
    // A Warmup that preloads no image (kernel caches, a custom pod) opens any upgrade.
    let no_images = Seen::Found {
        phase: Some(WarmupPhase::Completed),
        reason: String::new(),
        message: String::new(),
        images: Vec::new(),
    };
    assert!(decide("w", &no_images, &upgrade).open);
}
#[test]
fn a_change_is_told_from_the_recorded_scale_and_the_live_images() {
    let live = |objects: Vec<DynamicObject>| -> Vec<Arc<DynamicObject>> {
        objects.into_iter().map(Arc::new).collect()
    };
    let rendered = vec![
        object("Server", "m", Some("replicas=3"), "engine:1"),
        object("Helper", "h", None, "sidecar:1"),
    ];
    let created = change(&rendered, &[], false);
    assert!(created.create && created.warms());
    assert!(
        !change(&rendered, &[], true).warms(),
        "recreated after the gate opened"
    );

    let same = live(vec![
        object("Server", "m", Some("replicas=3"), "engine:1"),
        object("Helper", "h", None, "sidecar:1"),
    ]);
    assert_eq!(change(&rendered, &same, false), Change::default());
    let fewer = live(vec![
        object("Server", "m", Some("replicas=2"), "engine:1"),
        object("Helper", "h", None, "sidecar:1"),
    ]);
    assert_eq!(
        change(&rendered, &fewer, false).scale_up,
        ["replicas 2 to 3"]
    );
    let more = live(vec![object("Server", "m", Some("replicas=5"), "engine:1")]);
    let down = change(&rendered, &more, false);
    assert!(down.scale_up.is_empty(), "scaling down waits for nothing");
    assert_eq!(down.new_images, ["sidecar:1"]);

    // More replicas move the primary to another kind: the old one's record counts.
    let moved = live(vec![object(
        "OldServer",
        "m",
        Some("replicas=1"),
        "engine:1",
    )]);
    assert_eq!(
        change(&rendered, &moved, false).scale_up,
        ["replicas 1 to 3"]
    );
    // A role that was not there counts from 0.
    let roles_rendered = vec![object(
        "Server",
        "m",
        Some("replicas=1,prefill=1,decode=2"),
        "engine:1",
    )];
    let roles_live = live(vec![object(
        "Server",
        "m",
        Some("replicas=1,prefill=2"),
        "engine:1",
    )]);
    assert_eq!(
        change(&roles_rendered, &roles_live, false).scale_up,
        ["decode 0 to 2"]
    );
    // Objects from before the record are never taken for a scale-up.
    let unrecorded = live(vec![object("Server", "m", None, "engine:1")]);
    assert!(change(&rendered, &unrecorded, false).scale_up.is_empty());

    let upgraded = live(vec![
        object("Server", "m", Some("replicas=3"), "engine:0"),
        object("Helper", "h", None, "sidecar:1"),
    ]);
    assert_eq!(change(&rendered, &upgraded, false).new_images, ["engine:1"]);
    // An admission webhook rewrote the live tag to a digest: the image recorded as
    // rendered is what runs.
    let mut rewritten = object("Server", "m", Some("replicas=3"), "engine@sha256:0");
    rewritten
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(labels::IMAGES.into(), "engine:1,sidecar:1".into());
    assert_eq!(
        change(&rendered, &live(vec![rewritten]), false),
        Change::default()
    );
}
fn ours(spec_hash: &str, images: &str) -> Made {
    Made {
        ours: true,
        deleting: false,
        spec_hash: Some(spec_hash.into()),
        images: Some(images.into()),
    }
}
fn wanted(spec_hash: &str, images: &str) -> Wanted {
    Wanted {
        spec_hash: spec_hash.into(),
        images: images.into(),
    }
}
#[test]
fn an_inline_warmup_is_made_when_something_is_to_land_and_none_is_there() {
    let want = wanted("h1", "llama.cpp:b1");
    let create = decide_inline("m", &Seen::Missing, None, &want, &creation());
    assert!(!create.open && create.create);
    assert_eq!(create.write, Write::Create);
    assert_eq!(create.reason, reasons::AWAITING_WARMUP);
    assert!(create.message.contains("creating Warmup 'm'"), "{create:?}");
    let scale_up = Change {
        scale_up: vec!["replicas 1 to 2".into()],
        ..Change::default()
    };
    assert_eq!(
        decide_inline("m", &Seen::Missing, None, &want, &scale_up).write,
        Write::Create
    );
    // Deleted after it completed, nothing new to land: done, not made again.
    let done = decide_inline("m", &Seen::Missing, None, &want, &Change::default());
    assert!(done.open);
    assert_eq!(done.write, Write::Nothing);
    assert_eq!(done.reason, reasons::ALREADY_CREATED);
    // Warmups unreadable: nothing is written, the gate holds.
    let unavailable = decide_inline("m", &Seen::Unavailable, None, &want, &creation());
    assert_eq!(
        (unavailable.open, unavailable.write),
        (false, Write::Nothing)
    );
    // Made already (the cache shows it): kept, and waited for.
    let running = found("InProgress", "WarmupInProgress", "0 of 1");
    let kept = decide_inline(
        "m",
        &running,
        Some(&ours("h1", "llama.cpp:b1")),
        &want,
        &creation(),
    );
    assert_eq!(
        (kept.open, kept.write, kept.reason),
        (false, Write::Nothing, reasons::AWAITING_WARMUP)
    );
    let completed = found("Completed", "NodesWarmed", "1 of 1");
    let open = decide_inline(
        "m",
        &completed,
        Some(&ours("h1", "llama.cpp:b1")),
        &want,
        &creation(),
    );
    assert_eq!((open.open, open.write), (true, Write::Nothing));
}
#[test]
fn an_inline_warmup_is_made_again_when_its_fields_change_or_an_upgrade_needs_it() {
    let completed = found("Completed", "NodesWarmed", "1 of 1");
    // The inline fields changed: deleted (to be made again), and a creation waits.
    let changed = decide_inline(
        "m",
        &completed,
        Some(&ours("h0", "llama.cpp:b1")),
        &wanted("h1", "llama.cpp:b1"),
        &creation(),
    );
    assert_eq!(
        (changed.open, changed.write, changed.reason),
        (false, Write::Delete, reasons::AWAITING_WARMUP)
    );
    // ... with nothing to land, the old one goes and nothing waits.
    let quiet = decide_inline(
        "m",
        &completed,
        Some(&ours("h0", "llama.cpp:b1")),
        &wanted("h1", "llama.cpp:b1"),
        &Change::default(),
    );
    assert_eq!((quiet.open, quiet.write), (true, Write::Delete));
    // An upgrade the completed Warmup did not preload: made again for the new images.
    let upgrade = Change {
        new_images: vec!["llama.cpp:b2".into()],
        ..Change::default()
    };
    let outdated = decide_inline(
        "m",
        &completed,
        Some(&ours("h1", "llama.cpp:b1")),
        &wanted("h1", "llama.cpp:b2"),
        &upgrade,
    );
    assert_eq!(
        (outdated.open, outdated.write, outdated.reason),
        (false, Write::Delete, reasons::WARMUP_OUTDATED)
    );
    assert!(
        outdated.message.contains("deleted and made again"),
        "{outdated:?}"
    );
    // Made for these very images already (imagesPreload names others): made again,
    // it would preload the same, so it is not; the message says what to change.
    let same = decide_inline(
        "m",
        &completed,
        Some(&ours("h1", "llama.cpp:b2")),
        &wanted("h1", "llama.cpp:b2"),
        &upgrade,
    );
    assert_eq!(
        (same.open, same.write, same.reason),
        (false, Write::Nothing, reasons::WARMUP_OUTDATED)
    );
    assert!(
        same.message.contains("spec.warmup.imagesPreload.items"),
        "{same:?}"
    );
    // Failed: made again only when the images changed since.
    let failed = found("Failed", "MaxFailedNodesExceeded", "1 node failed");
    let stuck = decide_inline(
        "m",
        &failed,
        Some(&ours("h1", "llama.cpp:b1")),
        &wanted("h1", "llama.cpp:b1"),
        &creation(),
    );
    assert_eq!((stuck.write, stuck.failed), (Write::Nothing, true));
    assert!(
        stuck
            .message
            .contains("MaxFailedNodesExceeded: 1 node failed")
            && stuck.message.contains("is deleted (it is made again then)"),
        "{stuck:?}"
    );
    let retried = decide_inline(
        "m",
        &failed,
        Some(&ours("h1", "llama.cpp:b0")),
        &wanted("h1", "llama.cpp:b1"),
        &creation(),
    );
    assert_eq!(
        (retried.open, retried.write, retried.failed),
        (false, Write::Delete, false)
    );
    // Being deleted: waited for, not made again yet.
    let deleting = Made {
        deleting: true,
        ..ours("h0", "llama.cpp:b1")
    };
    let gone = decide_inline(
        "m",
        &completed,
        Some(&deleting),
        &wanted("h1", "llama.cpp:b1"),
        &creation(),
    );
    assert_eq!((gone.open, gone.write), (false, Write::Nothing));
}
#[test]
fn a_warmup_of_that_name_someone_else_made_is_left_alone() {
    let theirs = Made {
        ours: false,
        ..Made::default()
    };
    let completed = found("Completed", "NodesWarmed", "1 of 1");
    let held = decide_inline(
        "m",
        &completed,
        Some(&theirs),
        &wanted("h1", "llama.cpp:b1"),
        &creation(),
    );
    assert_eq!(
        (held.open, held.write, held.reason),
        (false, Write::Nothing, reasons::WARMUP_CONFLICT)
    );
    assert!(held.message.contains("does not own"), "{held:?}");
    let quiet = decide_inline(
        "m",
        &completed,
        Some(&theirs),
        &wanted("h1", "llama.cpp:b1"),
        &Change::default(),
    );
    assert_eq!((quiet.open, quiet.write), (true, Write::Nothing));
}
#[test]
fn the_warmup_made_for_an_inline_spec_targets_and_is_owned_by_its_model() {
    let mut md = gated_md(false, None);
    md.metadata.uid = Some("u-1".into());
    let inline = DeploymentWarmup {
        policies: Some(crate::api::WarmupPolicies {
            parallelism: Some(2),
            ..Default::default()
        }),
        ..DeploymentWarmup::default()
    };
    let images = vec!["a:1".to_string(), "b:1".to_string()];
    let (object, want) = warmup_object(&md, &inline, "p", &images);
    let value = serde_json::to_value(&object).unwrap();
    assert_eq!(value["apiVersion"], "cache.kubeairunway.ai/v1alpha1");
    assert_eq!(value["kind"], "Warmup");
    assert_eq!(value["metadata"]["name"], "m");
    assert_eq!(value["metadata"]["namespace"], "ml");
    assert_eq!(
        value["spec"],
        json!({"targetModelDeployment": {"name": "m"}, "policies": {"parallelism": 2}})
    );
    assert_eq!(value["metadata"]["labels"][labels::PROVIDER], "p");
    assert_eq!(value["metadata"]["labels"][labels::MODEL_DEPLOYMENT], "m");
    let owner = &object.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.uid.as_str(), owner.controller), ("u-1", Some(true)));
    assert_eq!(want.images, "a:1,b:1");
    assert_eq!(object.annotations()[labels::RENDERED_HASH], want.spec_hash);
    let read = made_of(&object, &md);
    assert!(read.ours && !read.deleting);
    assert_eq!(read.spec_hash.as_deref(), Some(want.spec_hash.as_str()));
    // Other inline fields, another hash; other images, the same hash.
    let other = DeploymentWarmup::default();
    assert_ne!(
        warmup_object(&md, &other, "p", &images).1.spec_hash,
        want.spec_hash
    );
    assert_eq!(
        warmup_object(&md, &inline, "p", &[]).1.spec_hash,
        want.spec_hash
    );
    let mut someone = md.clone();
    someone.metadata.uid = Some("u-2".into());
    assert!(!made_of(&object, &someone).ours);
}
#[test]
fn an_open_gate_stays_open_through_statuses_that_do_not_speak_of_it() {
    let view = || ProviderView::new(Phase::Deploying, "recreating");
    let kept = keep_open(view(), &gated_md(true, Some("True")));
    assert_eq!(kept.conditions.len(), 1);
    assert_eq!(kept.conditions[0].0, WARMED_UP);
    assert_eq!(kept.conditions[0].2, reasons::WARMUP_COMPLETED);
    assert!(
        keep_open(view(), &gated_md(true, Some("False")))
            .conditions
            .is_empty()
    );
    assert!(
        keep_open(view(), &gated_md(false, Some("True")))
            .conditions
            .is_empty(),
        "without spec.warmup the condition goes"
    );
    let said = view().condition(WARMED_UP, false, reasons::AWAITING_WARMUP, "x");
    assert_eq!(
        keep_open(said, &gated_md(true, Some("True")))
            .conditions
            .len(),
        1
    );
}
