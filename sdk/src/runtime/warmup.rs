//! The warmup gate: a ModelDeployment with `spec.warmup` gets nothing new on a node (it is
//! not created, scaled up or upgraded) until the named `Warmup` (the kernel-cache
//! provider's kind, `cache.kubeairunway.ai`) is `Completed`. Every provider gets it from
//! the runtime, with no code of its own.
//!
//! What a reconcile would bring onto nodes ([`Change`]) is told from what is rendered and
//! what the ModelDeployment owns live, the same way for every upstream:
//! - a creation: nothing of it exists yet;
//! - a scale-up: a role has more replicas than the live objects were rendered for (the
//!   primary object records them, [`labels::SCALE`]; objects from before that record are
//!   never taken for a scale-up), including a scale-up that moves to another upstream kind;
//! - an upgrade: a rendered container image that no live object names.
//!
//! While such a change waits, nothing is applied: a creation writes phase `Pending` (or
//! `Failed` for a failed Warmup) with `ResourceCreated=False`; a scale-up or an upgrade
//! keeps every live object exactly as it is (holding only the replica count would need to
//! know where each upstream keeps it, and a KAITO Workspace has none) and reports the live
//! deployment as usual, with `WarmedUp=False` saying why. Changes that bring nothing new
//! (fewer replicas, other fields) are applied at once with `WarmedUp=True`. The images the
//! rendered objects name are reported in `status.provider.images` in every case, which a
//! Warmup targeting the ModelDeployment preloads by default.
//!
//! A Warmup runs once (its controller never runs a finished Warmup again), so a
//! `Completed` Warmup opens a creation or a scale-up whenever it finished, while an
//! upgrade needs one that preloaded the new images: a Warmup that preloads images
//! (`status.images`) but not those the upgrade adds is outdated (`WarmupOutdated`); delete
//! it and create it again. Nodes that joined after the Warmup finished are not warm.
//!
//! The decision ([`change`], [`decide`]) is a pure function of what the caches hold; the
//! Warmups come from one watch cache ([`Warmups`], cluster-wide, started when the first
//! ModelDeployment with `spec.warmup` is reconciled), whose events reconcile the
//! ModelDeployments held by them ([`Waiting`]): no request per reconcile.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::Value;
use tokio::sync::mpsc;

use super::Context;
use super::reconcile::Error;
use super::status::{self, ProviderView};
use crate::api::{ModelDeployment, Phase, WarmupRef};
use crate::conditions::{self, PROVIDER_COMPATIBLE, READY, RESOURCE_CREATED, WARMED_UP, reasons};
use crate::provider::{Provider, Warning};
use crate::upstream::UpstreamApi;
use crate::{labels, reflect, render};

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
        phase: Option<String>,
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
}

impl Gate {
    fn open(reason: &'static str, message: String) -> Self {
        Self {
            open: true,
            create: false,
            reason,
            message,
            failed: false,
        }
    }

    fn held(change: &Change, reason: &'static str, message: String) -> Self {
        Self {
            open: false,
            create: change.create,
            reason,
            message,
            failed: change.create && reason == reasons::WARMUP_FAILED,
        }
    }
}

/// The gate of a ModelDeployment naming the Warmup `name`, which the cache shows as
/// `seen`, for `change`.
pub(crate) fn decide(name: &str, seen: &Seen, change: &Change) -> Gate {
    if let Seen::Found {
        phase: Some(phase),
        message,
        images: warmed,
        ..
    } = seen
        && phase == "Completed"
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
                WarmupRef::GROUP,
                WarmupRef::VERSION
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
        } if phase.as_deref() == Some("Failed") => Gate::held(
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
                    phase.as_deref().unwrap_or("not set yet")
                ),
            )
        }
    }
}

/// Whether the gate of `md` was opened before (its `WarmedUp` condition is `True`).
fn opened_before(md: &ModelDeployment) -> bool {
    md.status.as_ref().is_some_and(|s| {
        conditions::find(&s.conditions, WARMED_UP).is_some_and(|c| c.status == "True")
    })
}

/// A Warmup as the cache keeps it, read for [`decide`].
fn read(warmup: &DynamicObject) -> Seen {
    let status = warmup.data.get("status");
    let phase = status
        .and_then(|s| s.get("phase"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let conditions: Vec<&Value> = status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    let type_ = match phase.as_deref() {
        Some("Failed") => "Failed",
        Some("Completed") => "Complete",
        _ => "Progressing",
    };
    let deciding = conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_));
    let text = |key: &str| {
        deciding
            .and_then(|c| c.get(key))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let images = status
        .and_then(|s| s.get("images"))
        .and_then(Value::as_array)
        .map(|i| {
            i.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Seen::Found {
        phase,
        reason: text("reason"),
        message: text("message"),
        images,
    }
}

/// The API resource of Warmups.
fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(WarmupRef::GROUP, WarmupRef::VERSION, WarmupRef::KIND),
        WarmupRef::PLURAL,
    )
}

/// Keep of a Warmup only what the gate reads: its status.
fn shape(warmup: &mut DynamicObject) {
    reflect::strip(warmup);
    let status = warmup.data.get("status").cloned().unwrap_or(Value::Null);
    warmup.data = serde_json::json!({ "status": status });
}

/// `(namespace, Warmup name)`.
type WarmupKey = (String, String);

/// Which ModelDeployments a change of each Warmup must wake: those it holds. A
/// ModelDeployment leaves when its gate opens, its `spec.warmup` goes or names another
/// Warmup, or it is deleted or handed to another provider, so this holds no more entries
/// than there are held ModelDeployments.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    by_warmup: HashMap<WarmupKey, BTreeSet<String>>,
    /// `(namespace, ModelDeployment name)` to the name of the Warmup it waits on.
    by_md: HashMap<(String, String), String>,
}

impl Waiting {
    /// The ModelDeployment `md` of namespace `ns` waits on the Warmup `warmup` of its
    /// namespace, or on none.
    fn set(&mut self, ns: &str, md: &str, warmup: Option<&str>) {
        let key = (ns.to_string(), md.to_string());
        if let Some(old) = self.by_md.get(&key)
            && Some(old.as_str()) != warmup
        {
            let old_key = (ns.to_string(), old.clone());
            if let Some(mds) = self.by_warmup.get_mut(&old_key) {
                mds.remove(md);
                if mds.is_empty() {
                    self.by_warmup.remove(&old_key);
                }
            }
        }
        match warmup {
            Some(w) => {
                self.by_md.insert(key, w.to_string());
                self.by_warmup
                    .entry((ns.to_string(), w.to_string()))
                    .or_default()
                    .insert(md.to_string());
            }
            None => {
                self.by_md.remove(&key);
            }
        }
    }

    /// The ModelDeployments the Warmup `key` holds.
    fn on(&self, key: &WarmupKey) -> impl Iterator<Item = &String> {
        self.by_warmup.get(key).into_iter().flatten()
    }

    /// Every Warmup something waits on.
    fn warmups(&self) -> Vec<WarmupKey> {
        self.by_warmup.keys().cloned().collect()
    }
}

/// The Warmups the gate reads, from one cluster-wide watch cache started on first use,
/// and which ModelDeployments wait on each.
pub(crate) struct Warmups {
    client: Client,
    /// Reconcile requests; `None`: never watch (single reconcile steps in unit tests).
    trigger: Option<mpsc::UnboundedSender<ObjectRef<ModelDeployment>>>,
    cache: OnceLock<reflect::Cache<DynamicObject>>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    /// The ModelDeployments each Warmup holds.
    waiting: Arc<Mutex<Waiting>>,
}

impl std::fmt::Debug for Warmups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warmups")
            .field("started", &self.cache.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Warmups {
    pub(crate) fn new(
        client: Client,
        trigger: Option<mpsc::UnboundedSender<ObjectRef<ModelDeployment>>>,
    ) -> Self {
        Self {
            client,
            trigger,
            cache: OnceLock::new(),
            task: Mutex::new(None),
            waiting: Arc::default(),
        }
    }

    /// Hold exactly `warmups`, with no watch behind them (unit tests).
    pub(crate) fn fixed(&self, warmups: Vec<DynamicObject>) {
        let mut warmups = warmups;
        warmups.iter_mut().for_each(shape);
        let _ = self.cache.set(reflect::Cache::fixed(warmups, resource()));
    }

    /// The cache, its watch started on first use (none without a trigger).
    fn cache(&self) -> Option<reflect::Cache<DynamicObject>> {
        if let Some(cache) = self.cache.get() {
            return Some(cache.clone());
        }
        let trigger = self.trigger.clone()?;
        let cache = self.cache.get_or_init(|| {
            let (cache, stream) = reflect::cache(
                Api::<DynamicObject>::all_with(self.client.clone(), &resource()),
                watcher::Config::default(),
                resource(),
                shape,
            );
            let waiting = self.waiting.clone();
            let task = tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    let wake: Vec<WarmupKey> = match &event {
                        Ok(watcher::Event::InitDone) => {
                            waiting.lock().map(|w| w.warmups()).unwrap_or_default()
                        }
                        Ok(watcher::Event::Apply(w) | watcher::Event::Delete(w)) => {
                            vec![(w.namespace().unwrap_or_default(), w.name_any())]
                        }
                        Ok(_) => Vec::new(),
                        Err(e) => {
                            tracing::warn!(error = %e, "watching Warmups failed; retrying");
                            Vec::new()
                        }
                    };
                    let Ok(waiting) = waiting.lock() else {
                        continue;
                    };
                    for key in wake {
                        for md in waiting.on(&key) {
                            let _ = trigger.send(ObjectRef::new(md).within(&key.0));
                        }
                    }
                }
            });
            if let Ok(mut t) = self.task.lock() {
                *t = Some(task.abort_handle());
            }
            cache
        });
        Some(cache.clone())
    }

    /// The Warmup `name` of `md`'s namespace as the cache shows it. `md` is registered as
    /// waiting on it first, so that a change after this look wakes it.
    fn seen(&self, md: &ModelDeployment, name: &str) -> Seen {
        let ns = md.namespace().unwrap_or_default();
        self.wait(md, Some(name));
        let Some(cache) = self.cache() else {
            return Seen::Unavailable;
        };
        if !cache.is_synced() {
            return Seen::Unavailable;
        }
        cache
            .store
            .get(&ObjectRef::new_with(name, resource()).within(&ns))
            .map_or(Seen::Missing, |w| read(&w))
    }

    /// `md` waits on the Warmup `warmup`, or on none.
    fn wait(&self, md: &ModelDeployment, warmup: Option<&str>) {
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.set(&md.namespace().unwrap_or_default(), &md.name_any(), warmup);
        }
    }

    /// `md` waits on no Warmup any more (deleted, or handed to another provider).
    pub(crate) fn forget(&self, md: &ModelDeployment) {
        self.wait(md, None);
    }

    /// The gate of `md` (`None` without `spec.warmup`) for applying `rendered` over
    /// `live` (every object it owns, see [`change`]).
    pub(crate) fn gate(
        &self,
        md: &ModelDeployment,
        rendered: &[DynamicObject],
        live: &[Arc<DynamicObject>],
    ) -> Option<Gate> {
        let Some(warmup) = &md.spec.warmup else {
            self.forget(md);
            return None;
        };
        let seen = self.seen(md, &warmup.name);
        let gate = decide(
            &warmup.name,
            &seen,
            &change(rendered, live, opened_before(md)),
        );
        if gate.open {
            self.forget(md);
        }
        Some(gate)
    }
}

impl Drop for Warmups {
    fn drop(&mut self) {
        if let Ok(Some(task)) = self.task.lock().map(|mut t| t.take()) {
            task.abort();
        }
    }
}

/// The hook before anything is applied: while the creation of `md` is held (`gate`),
/// write a status that says why (phase `Pending`, or `Failed` for a failed Warmup;
/// `ResourceCreated`, `Ready` and `WarmedUp` false; the rendered images) and apply
/// nothing. `Some(action)` when held.
pub(crate) async fn hold<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    api: &UpstreamApi,
    warnings: &[Warning],
    objects: &[DynamicObject],
    gate: Option<&Gate>,
) -> Result<Option<Action>, Error> {
    let Some(gate) = gate.filter(|g| !g.open && g.create) else {
        return Ok(None);
    };
    let (reason, message) = super::reconcile::compatibility(ctx, api, warnings);
    let phase = if gate.failed {
        Phase::Failed
    } else {
        Phase::Pending
    };
    let mut view = ProviderView::new(phase, gate.message.clone())
        .condition(PROVIDER_COMPATIBLE, true, reason, message)
        .condition(RESOURCE_CREATED, false, gate.reason, gate.message.clone())
        .condition(READY, false, gate.reason, gate.message.clone())
        .condition(WARMED_UP, false, gate.reason, gate.message.clone());
    view.images = Some(render::images(objects));
    status::apply(ctx, md, &view).await?;
    Ok(Some(Action::requeue(ctx.options.resync_period)))
}

/// The status of a ModelDeployment whose objects exist: the images it renders and, with
/// `spec.warmup`, `WarmedUp` as the gate decided (`False` while a scale-up or an upgrade
/// waits).
pub(crate) fn report(
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
    use super::*;
    use serde_json::json;

    fn warmup(phase: Option<&str>, conditions: Value) -> DynamicObject {
        let mut status = json!({"conditions": conditions, "images": ["llama.cpp:b1"]});
        if let Some(p) = phase {
            status["phase"] = json!(p);
        }
        serde_json::from_value(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "Warmup",
            "metadata": {"name": "w", "namespace": "ml"},
            "spec": {"targetModelDeployment": {"name": "m"}},
            "status": status,
        }))
        .unwrap()
    }

    fn cond(type_: &str, reason: &str, message: &str) -> Value {
        json!({"type": type_, "status": "True", "reason": reason, "message": message,
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

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
                phase: Some("InProgress".into()),
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
            phase: Some(phase.into()),
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
            phase: Some("Completed".into()),
            reason: String::new(),
            message: String::new(),
            images: Vec::new(),
        };
        assert!(decide("w", &no_images, &upgrade).open);
    }

    fn object(kind: &str, name: &str, scale: Option<&str>, image: &str) -> DynamicObject {
        let mut v = json!({"apiVersion": "example.com/v1", "kind": kind,
            "metadata": {"name": name, "annotations": {}},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}});
        if let Some(s) = scale {
            v["metadata"]["annotations"][labels::SCALE] = json!(s);
        }
        serde_json::from_value(v).unwrap()
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

    fn md(warmup: bool, warmed_up: Option<&str>) -> ModelDeployment {
        let mut v = json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ml", "generation": 2},
            "spec": {"model": {"id": "a/b"}},
        });
        if warmup {
            v["spec"]["warmup"] = json!({"name": "w"});
        }
        if let Some(status) = warmed_up {
            v["status"] = json!({"conditions": [{"type": WARMED_UP, "status": status,
                "reason": reasons::WARMUP_COMPLETED, "message": "Warmup 'w' completed",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        }
        serde_json::from_value(v).unwrap()
    }

    #[tokio::test]
    async fn the_gate_reads_the_cache_and_remembers_it_opened() {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let warmups = Warmups::new(Client::new(service, "ml"), None);
        let rendered = vec![object("Server", "m", Some("replicas=1"), "llama.cpp:b1")];
        assert_eq!(
            warmups.gate(&md(false, None), &rendered, &[]),
            None,
            "no spec.warmup, no gate"
        );
        assert_eq!(
            warmups
                .gate(&md(true, None), &rendered, &[])
                .unwrap()
                .reason,
            reasons::WARMUP_UNAVAILABLE,
            "no cache"
        );
        warmups.fixed(vec![warmup(Some("InProgress"), json!([]))]);
        assert_eq!(
            warmups
                .gate(&md(true, None), &rendered, &[])
                .unwrap()
                .reason,
            reasons::AWAITING_WARMUP
        );
        assert!(
            warmups
                .gate(&md(true, Some("True")), &rendered, &[])
                .unwrap()
                .open,
            "opened before: a primary being recreated is not held"
        );
        assert!(
            !warmups
                .gate(&md(true, Some("False")), &rendered, &[])
                .unwrap()
                .open
        );
        let live = vec![Arc::new(rendered[0].clone())];
        assert!(
            warmups
                .gate(&md(true, None), &rendered, &live)
                .unwrap()
                .open
        );
    }

    fn waiting_on(warmups: &Warmups, warmup: &str) -> Vec<String> {
        let waiting = warmups.waiting.lock().unwrap();
        waiting
            .on(&("ml".to_string(), warmup.to_string()))
            .cloned()
            .collect()
    }

    #[tokio::test]
    async fn only_held_model_deployments_wait_on_a_warmup() {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let warmups = Warmups::new(Client::new(service, "ml"), None);
        warmups.fixed(vec![warmup(Some("InProgress"), json!([]))]);
        let rendered = vec![object("Server", "m", Some("replicas=1"), "llama.cpp:b1")];
        let live = vec![Arc::new(rendered[0].clone())];
        let held = md(true, None);
        assert!(!warmups.gate(&held, &rendered, &[]).unwrap().open);
        assert_eq!(waiting_on(&warmups, "w"), ["m"]);

        // The gate opens (nothing new to warm): it waits no more.
        assert!(warmups.gate(&held, &rendered, &live).unwrap().open);
        assert!(waiting_on(&warmups, "w").is_empty());
        assert!(warmups.waiting.lock().unwrap().by_md.is_empty());

        // spec.warmup names another Warmup: it moves there.
        warmups.gate(&held, &rendered, &[]);
        let mut renamed = held.clone();
        renamed.spec.warmup = Some(WarmupRef { name: "v".into() });
        assert!(!warmups.gate(&renamed, &rendered, &[]).unwrap().open);
        assert!(waiting_on(&warmups, "w").is_empty());
        assert_eq!(waiting_on(&warmups, "v"), ["m"]);

        // spec.warmup removed.
        assert_eq!(warmups.gate(&md(false, None), &rendered, &[]), None);
        assert!(waiting_on(&warmups, "v").is_empty());

        // Deleted (or handed to another provider).
        warmups.gate(&held, &rendered, &[]);
        warmups.forget(&held);
        let waiting = warmups.waiting.lock().unwrap();
        assert!(waiting.by_warmup.is_empty() && waiting.by_md.is_empty());
    }

    #[test]
    fn an_open_gate_stays_open_through_statuses_that_do_not_speak_of_it() {
        let view = || ProviderView::new(Phase::Deploying, "recreating");
        let kept = keep_open(view(), &md(true, Some("True")));
        assert_eq!(kept.conditions.len(), 1);
        assert_eq!(kept.conditions[0].0, WARMED_UP);
        assert_eq!(kept.conditions[0].2, reasons::WARMUP_COMPLETED);
        assert!(
            keep_open(view(), &md(true, Some("False")))
                .conditions
                .is_empty()
        );
        assert!(
            keep_open(view(), &md(false, Some("True")))
                .conditions
                .is_empty(),
            "without spec.warmup the condition goes"
        );
        let said = view().condition(WARMED_UP, false, reasons::AWAITING_WARMUP, "x");
        assert_eq!(keep_open(said, &md(true, Some("True"))).conditions.len(), 1);
    }
}
