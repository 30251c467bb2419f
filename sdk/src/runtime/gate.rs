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
        model_caches: warmup.model_caches.clone(),
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
mod tests;
