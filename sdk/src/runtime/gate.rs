//! The warmup gate, decided (pure): a ModelDeployment with `spec.warmup` gets nothing new
//! on a node (it is not created, scaled up or upgraded) until its `Warmup` is `Completed`:
//! the one `spec.warmup.name` names, or the one the runtime makes for an inline
//! `spec.warmup`. Every provider gets it from the runtime, with no code of its own; the
//! I/O around it is `runtime/warmup.rs`, the Warmups' watch cache `runtime/warmups.rs`.
//!
//! What a reconcile would bring onto nodes ([`Change`]) is told from what is rendered and
//! what the ModelDeployment owns live: a creation (nothing exists), a scale-up (a role
//! has more replicas than the live objects were rendered for, [`labels::SCALE`]), or an
//! upgrade (a rendered image that no live object names). While such a change waits,
//! nothing is applied: a creation reports phase `Pending` (`Failed` for a failed Warmup);
//! a scale-up or an upgrade keeps every live object as it is, with `WarmedUp=False`
//! saying why. Changes that bring nothing new are applied at once.
//!
//! A Warmup runs once, so a `Completed` one opens a creation or a scale-up whenever it
//! finished, while an upgrade needs one that preloaded the new images
//! (`WarmupOutdated` otherwise). An inline `spec.warmup` becomes a Warmup named after the
//! ModelDeployment, owned by it, targeting it: made when something is to land on nodes
//! and none is there, made again when the inline fields changed or when it finished
//! without the images an upgrade adds (only if the rendered images changed since), and
//! deleted when `spec.warmup` stops being inline.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::DynamicObject;
use kube::{Resource, ResourceExt};

use super::view::ProviderView;
use crate::api::warmup::condition_types;
use crate::api::{
    DeploymentWarmup, ModelDeployment, TargetModelDeployment, Warmup, WarmupPhase, WarmupSpec,
};
use crate::conditions::{self, WARMED_UP, reasons};
use crate::{labels, render};

/// What the Warmup cache says of the Warmup a ModelDeployment names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Warmups cannot be read: the kind is not served, or the cache is not filled yet.
    Unavailable,
    /// No Warmup of that name in the ModelDeployment's namespace.
    Missing,
    /// The Warmup: its `status.phase` (absent before its controller wrote one), the
    /// reason and message of its deciding condition (`Failed`, `Complete` or
    /// `Progressing`), and the images it preloads (`status.images`).
    Found {
        phase: Option<WarmupPhase>,
        reason: String,
        message: String,
        images: Vec<String>,
    },
}

/// What applying the rendered objects would bring onto nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Change {
    /// Nothing of the ModelDeployment exists: it would be created.
    pub create: bool,
    /// The roles that would get more replicas, `role from to to` (empty: none).
    pub scale_up: Vec<String>,
    /// The rendered images that no live object names, sorted (all of them on creation).
    pub new_images: Vec<String>,
}

impl Change {
    /// Whether something new would land on a node.
    fn warms(&self) -> bool {
        self.create || !self.scale_up.is_empty() || !self.new_images.is_empty()
    }

    /// What waits, for the user.
    fn held(&self) -> String {
        if self.create {
            return "nothing is created".to_string();
        }
        let mut what = Vec::new();
        if !self.scale_up.is_empty() {
            what.push(format!("the scale-up ({})", self.scale_up.join(", ")));
        }
        if !self.new_images.is_empty() {
            what.push(format!("the upgrade to {}", self.new_images.join(", ")));
        }
        format!(
            "{} is not applied (the live objects are kept as they are)",
            what.join(" and ")
        )
    }
}

/// The replicas per role in a [`labels::SCALE`] annotation (`replicas=2,prefill=1`).
fn roles(text: &str) -> BTreeMap<&str, i64> {
    text.split(',')
        .filter_map(|pair| {
            let (role, n) = pair.split_once('=')?;
            Some((role.trim(), n.trim().parse().ok()?))
        })
        .collect()
}

/// What applying `rendered` (finished, the primary first) brings onto nodes, against
/// `live`: every object the ModelDeployment owns (of any kind, rendered or not, being
/// deleted or not). `opened_before`: the gate opened once already, so a ModelDeployment
/// with nothing live is being recreated, not created.
pub(crate) fn change(
    rendered: &[DynamicObject],
    live: &[Arc<DynamicObject>],
    opened_before: bool,
) -> Change {
    if live.is_empty() {
        return Change {
            create: !opened_before,
            ..Change::default()
        };
    }
    let recorded: Vec<BTreeMap<&str, i64>> = live
        .iter()
        .filter_map(|o| o.annotations().get(labels::SCALE))
        .map(|s| roles(s))
        .collect();
    let mut scale_up = Vec::new();
    if !recorded.is_empty()
        && let Some(want) = rendered
            .first()
            .and_then(|p| p.annotations().get(labels::SCALE))
    {
        for (role, n) in roles(want) {
            let have = recorded
                .iter()
                .filter_map(|r| r.get(role).copied())
                .max()
                .unwrap_or(0);
            if n > have {
                scale_up.push(format!("{role} {have} to {n}"));
            }
        }
    }
    // What runs: the images each primary was rendered with (an admission webhook may
    // have rewritten them in the live object, a tag to a digest) and those live.
    let mut running: BTreeSet<String> = live
        .iter()
        .filter_map(|o| o.annotations().get(labels::IMAGES))
        .flat_map(|i| i.split(',').filter(|i| !i.is_empty()).map(str::to_string))
        .collect();
    running.extend(render::images(live.iter().map(AsRef::as_ref)));
    Change {
        create: false,
        scale_up,
        new_images: render::images(rendered)
            .into_iter()
            .filter(|i| !running.contains(i))
            .collect(),
    }
}

/// The gate's verdict for one ModelDeployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gate {
    /// Whether the upstream objects may be applied.
    pub open: bool,
    /// Held, the change is a creation (nothing exists): the status says `Pending`.
    pub create: bool,
    /// The reason of `WarmedUp` (and, while a creation is held, of `ResourceCreated` and
    /// `Ready`).
    pub reason: &'static str,
    /// Why, for the user.
    pub message: String,
    /// A creation held for good until the user acts (the Warmup failed): phase `Failed`.
    pub failed: bool,
    /// What to do with the Warmup made for an inline `spec.warmup` (always
    /// [`Write::Nothing`] for a named one).
    pub write: Write,
}

/// What the runtime does with the Warmup it makes for an inline `spec.warmup`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Write {
    /// Leave it as it is (or absent).
    #[default]
    Nothing,
    /// Create it (server-side apply).
    Create,
    /// Delete it, to make it again once it is gone (a Warmup's spec cannot change and
    /// it runs once).
    Delete,
}

impl Gate {
    fn open(reason: &'static str, message: String) -> Self {
        Self {
            open: true,
            create: false,
            reason,
            message,
            failed: false,
            write: Write::Nothing,
        }
    }

    fn held(change: &Change, reason: &'static str, message: String) -> Self {
        Self {
            open: false,
            create: change.create,
            reason,
            message,
            failed: change.create && reason == reasons::WARMUP_FAILED,
            write: Write::Nothing,
        }
    }
}

/// The gate of a ModelDeployment naming the Warmup `name`, which the cache shows as
/// `seen`, for `change`.
pub(crate) fn decide(name: &str, seen: &Seen, change: &Change) -> Gate {
    if let Seen::Found {
        phase: Some(WarmupPhase::Completed),
        message,
        images: warmed,
        ..
    } = seen
    {
        let missing: Vec<&str> = change
            .new_images
            .iter()
            .filter(|i| !warmed.contains(i))
            .map(String::as_str)
            .collect();
        if change.create || warmed.is_empty() || missing.is_empty() {
            return Gate::open(
                reasons::WARMUP_COMPLETED,
                format!("Warmup '{name}' completed: {message}"),
            );
        }
        return Gate::held(
            change,
            reasons::WARMUP_OUTDATED,
            format!(
                "Warmup '{name}' completed for the images {} but this spec adds {}, and a Warmup runs only once: {}; delete the Warmup and create it again to preload them (with targetModelDeployment and no imagesPreload it preloads the images in status.provider.images), or remove spec.warmup",
                warmed.join(", "),
                missing.join(", "),
                change.held()
            ),
        );
    }
    if !change.warms() {
        return Gate::open(
            reasons::ALREADY_CREATED,
            format!(
                "the upstream objects exist and this spec adds no replica and no image; Warmup '{name}' holds only their creation, scale-ups and upgrades"
            ),
        );
    }
    let held = change.held();
    match seen {
        Seen::Unavailable => Gate::held(
            change,
            reasons::WARMUP_UNAVAILABLE,
            format!(
                "Warmup '{name}' cannot be read: the API server does not serve {}/{} Warmups (is the kernel-cache provider's warmup installed?) or they are not listed yet; {held} until it completes",
                Warmup::group(&()),
                Warmup::version(&())
            ),
        ),
        Seen::Missing => Gate::held(
            change,
            reasons::WARMUP_NOT_FOUND,
            format!(
                "there is no Warmup '{name}' in this namespace; {held} until it exists and completes"
            ),
        ),
        Seen::Found {
            phase,
            reason,
            message,
            ..
        } if *phase == Some(WarmupPhase::Failed) => Gate::held(
            change,
            reasons::WARMUP_FAILED,
            format!(
                "Warmup '{name}' failed ({reason}: {message}); {held} until a Warmup of that name completes or spec.warmup is removed"
            ),
        ),
        Seen::Found { phase, message, .. } => {
            let progress = if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            };
            Gate::held(
                change,
                reasons::AWAITING_WARMUP,
                format!(
                    "waiting for Warmup '{name}' to complete (phase {}{progress}); {held} until then",
                    phase.map_or("not set yet", WarmupPhase::as_str)
                ),
            )
        }
    }
}

/// The Warmup of the name an inline `spec.warmup` uses, as the cache shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Made {
    /// Owned by this ModelDeployment (an owner reference with its uid): the runtime made
    /// it. Otherwise it is someone else's, and left alone.
    pub ours: bool,
    /// Being deleted.
    pub deleting: bool,
    /// The hash of the spec it was made with ([`labels::RENDERED_HASH`]).
    pub spec_hash: Option<String>,
    /// The images the provider rendered when it was made ([`labels::IMAGES`]).
    pub images: Option<String>,
}

/// What an inline `spec.warmup` asks for now: the hash of the Warmup's spec made from it
/// and the images the provider renders (comma-separated).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub spec_hash: String,
    pub images: String,
}

/// The gate of a ModelDeployment with an inline `spec.warmup`, whose Warmup `name` the
/// cache shows as `seen` and `made`, and what to do with that Warmup. The runtime makes a
/// Warmup only when something is to land on nodes (a creation, a scale-up, an upgrade)
/// and none is there; it deletes its Warmup (to make it again) when the inline fields
/// changed, or when it finished (completed without the images an upgrade adds, or
/// failed) and the rendered images changed since it was made: one made again would
/// preload them. A Warmup deleted after it completed is not made again until something
/// new is to land on nodes.
pub(crate) fn decide_inline(
    name: &str,
    seen: &Seen,
    made: Option<&Made>,
    wanted: &Wanted,
    change: &Change,
) -> Gate {
    let held = change.held();
    let Some(made) = made else {
        let mut gate = decide(name, seen, change);
        if !gate.open && *seen == Seen::Missing {
            gate.reason = reasons::AWAITING_WARMUP;
            gate.message = format!(
                "creating Warmup '{name}' from the inline spec.warmup; {held} until it completes"
            );
            gate.write = Write::Create;
        }
        return gate;
    };
    if !made.ours {
        if !change.warms() {
            return decide(name, seen, change);
        }
        return Gate::held(
            change,
            reasons::WARMUP_CONFLICT,
            format!(
                "a Warmup '{name}' exists in this namespace and this ModelDeployment does not own it, so the inline spec.warmup cannot be made under that name; {held} until it is deleted, or name it in spec.warmup.name instead"
            ),
        );
    }
    if made.deleting {
        if !change.warms() {
            return decide(name, seen, change);
        }
        return Gate::held(
            change,
            reasons::AWAITING_WARMUP,
            format!(
                "Warmup '{name}' is being deleted, to be made again from the inline spec.warmup; {held} until the new one completes"
            ),
        );
    }
    if made.spec_hash.as_deref() != Some(wanted.spec_hash.as_str()) {
        let mut gate = decide(name, seen, change);
        gate.write = Write::Delete;
        if change.warms() {
            gate = Gate {
                write: Write::Delete,
                ..Gate::held(
                    change,
                    reasons::AWAITING_WARMUP,
                    format!(
                        "the inline spec.warmup changed and a Warmup's spec cannot: Warmup '{name}' is deleted and made again; {held} until it completes"
                    ),
                )
            };
        }
        return gate;
    }
    let images_changed = made.images.as_deref() != Some(wanted.images.as_str());
    made_again(
        name,
        seen,
        decide(name, seen, change),
        images_changed,
        change,
    )
}

/// The gate `decide` gave for the Warmup made from the current inline fields, with what
/// to do when it finished without covering the change: when it completed without the
/// images an upgrade adds, or failed, it is made again only if the rendered images
/// changed since it was made (`images_changed`); one made again otherwise would do the
/// same, and the message says what to change.
fn made_again(
    name: &str,
    seen: &Seen,
    mut gate: Gate,
    images_changed: bool,
    change: &Change,
) -> Gate {
    let held = change.held();
    match gate.reason {
        reasons::WARMUP_OUTDATED if images_changed => {
            gate.write = Write::Delete;
            gate.message = format!(
                "Warmup '{name}' completed without the images this spec adds ({}), and a Warmup runs only once: it is deleted and made again to preload them; {held} until it completes",
                change.new_images.join(", ")
            );
        }
        reasons::WARMUP_OUTDATED => {
            gate.message = format!(
                "Warmup '{name}' completed without the images this spec adds ({}) and one made again would preload the same: add them to spec.warmup.imagesPreload.items (or leave imagesPreload out to preload what the provider renders); {held} until then",
                change.new_images.join(", ")
            );
        }
        reasons::WARMUP_FAILED => {
            let why = match seen {
                Seen::Found {
                    reason, message, ..
                } => format!(" ({reason}: {message})"),
                _ => String::new(),
            };
            gate.message = if images_changed {
                gate.write = Write::Delete;
                gate.failed = false;
                format!(
                    "Warmup '{name}' failed{why} and the rendered images changed since it was made: it is deleted and made again; {held} until it completes"
                )
            } else {
                format!(
                    "Warmup '{name}' failed{why}; {held} until spec.warmup or the rendered images change, Warmup '{name}' is deleted (it is made again then), or spec.warmup is removed"
                )
            };
        }
        _ => {}
    }
    gate
}

/// What the cache shows of the Warmup `warmup` for `md`'s inline `spec.warmup`.
pub(crate) fn made_of(warmup: &Warmup, md: &ModelDeployment) -> Made {
    let annotation = |key: &str| warmup.annotations().get(key).cloned();
    Made {
        ours: render::owned_by(warmup, md),
        deleting: warmup.metadata.deletion_timestamp.is_some(),
        spec_hash: annotation(labels::RENDERED_HASH),
        images: annotation(labels::IMAGES),
    }
}

/// The name of the Warmup `md`'s `spec.warmup` names or (inline) makes: the
/// ModelDeployment's own name (a valid Warmup name, whatever its length).
pub(crate) fn warmup_name(md: &ModelDeployment, warmup: &DeploymentWarmup) -> String {
    warmup.name.clone().unwrap_or_else(|| md.name_any())
}

/// The Warmup the runtime makes for `md`'s inline `warmup`, as applied: named after
/// `md`, in its namespace, owned by it (so the garbage collector removes it with it),
/// labelled as every object `provider` makes for it, targeting it, with the inline
/// fields as its spec; annotated with the hash of that spec and the rendered `images`,
/// which tell when it must be made again. Also what it asks for now ([`Wanted`]).
pub(crate) fn warmup_object(
    md: &ModelDeployment,
    warmup: &DeploymentWarmup,
    provider: &str,
    images: &[String],
) -> (Warmup, Wanted) {
    let spec = WarmupSpec {
        target_model_deployment: Some(TargetModelDeployment {
            name: md.name_any(),
        }),
        images_preload: warmup.images_preload.clone(),
        kernel_caches: warmup.kernel_caches.clone(),
        custom_action: warmup.custom_action.clone(),
        tolerations: warmup.tolerations.clone(),
        policies: warmup.policies.clone(),
        target_nodes: None,
    };
    let wanted = Wanted {
        spec_hash: crate::upstream::short_hash(
            serde_json::to_value(&spec)
                .unwrap_or_default()
                .to_string()
                .as_bytes(),
        ),
        images: images.join(","),
    };
    let mut object = Warmup::new(&md.name_any(), spec);
    object.metadata.namespace = md.namespace();
    object.metadata.owner_references = render::owner_reference(md).map(|o| vec![o]);
    object.metadata.labels = Some(render::object_labels(md, provider));
    object.metadata.annotations = Some(
        [
            (labels::RENDERED_HASH.to_string(), wanted.spec_hash.clone()),
            (labels::IMAGES.to_string(), wanted.images.clone()),
        ]
        .into(),
    );
    (object, wanted)
}

/// Whether the gate of `md` was opened before (its `WarmedUp` condition is `True`).
pub(crate) fn opened_before(md: &ModelDeployment) -> bool {
    md.status.as_ref().is_some_and(|s| {
        conditions::find(&s.conditions, WARMED_UP).is_some_and(|c| c.status == "True")
    })
}

/// A Warmup as the cache keeps it, read for [`decide`]: its phase, the reason and message
/// of its deciding condition (`Failed`, `Complete` or `Progressing`), the images it
/// preloads.
pub(crate) fn read(warmup: &Warmup) -> Seen {
    let Some(status) = &warmup.status else {
        return Seen::Found {
            phase: None,
            reason: String::new(),
            message: String::new(),
            images: Vec::new(),
        };
    };
    let type_ = match status.phase {
        Some(WarmupPhase::Failed) => condition_types::FAILED,
        Some(WarmupPhase::Completed) => condition_types::COMPLETE,
        _ => condition_types::PROGRESSING,
    };
    let deciding = status.conditions.iter().find(|c| c.type_ == type_);
    Seen::Found {
        phase: status.phase,
        reason: deciding.map(|c| c.reason.clone()).unwrap_or_default(),
        message: deciding.map(|c| c.message.clone()).unwrap_or_default(),
        images: status.images.clone(),
    }
}

/// The status of a ModelDeployment whose objects exist: the images it renders and, with
/// `spec.warmup`, `WarmedUp` as the gate decided (`False` while a scale-up or an upgrade
/// waits).
pub(crate) fn with_gate(
    mut view: ProviderView,
    gate: Option<&Gate>,
    objects: &[DynamicObject],
) -> ProviderView {
    view.images = Some(render::images(objects));
    match gate {
        Some(gate) => view.condition(WARMED_UP, gate.open, gate.reason, gate.message.clone()),
        None => view,
    }
}

/// A status written without a word on the gate (a recreation in progress, a refusal)
/// keeps an open gate open: `WarmedUp=True` stays as it is while `spec.warmup` is set.
pub(crate) fn keep_open(mut view: ProviderView, md: &ModelDeployment) -> ProviderView {
    if md.spec.warmup.is_none() || view.conditions.iter().any(|(t, ..)| *t == WARMED_UP) {
        return view;
    }
    let current = md
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, WARMED_UP))
        .filter(|c| c.status == "True");
    if let Some(c) = current {
        let reason = if c.reason == reasons::WARMUP_COMPLETED {
            reasons::WARMUP_COMPLETED
        } else {
            reasons::ALREADY_CREATED
        };
        view = view.condition(WARMED_UP, true, reason, c.message.clone());
    }
    view
}

#[cfg(test)]
mod tests {
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
}
