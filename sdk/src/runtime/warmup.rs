//! The warmup gate: a ModelDeployment with `spec.warmup` has nothing created for it until
//! the named `Warmup` (the kernel-cache provider's kind, `cache.kubeairunway.ai`) is
//! `Completed`. Every provider gets it from the runtime, with no code of its own.
//!
//! What "waits before scaling up" means here: the upstream objects are rendered as usual
//! (their images are reported in `status.provider.images`, which a Warmup targeting the
//! ModelDeployment preloads by default) but not applied, so nothing is scheduled on a
//! cold node. Holding the replica count at 0 instead would need to know where each
//! upstream keeps it (a Deployment's `spec.replicas`, a KAITO Workspace has none), which
//! no rule of the runtime can know. Once the objects exist the gate stays open for the
//! life of the ModelDeployment (the condition `WarmedUp=True` is kept while the primary
//! is recreated): a Warmup that fails, is deleted (its TTL) or runs again later takes
//! nothing back, and later spec changes are applied at once.
//!
//! The decision ([`decide`]) is a pure function of what the Warmup cache holds; the
//! Warmups come from one watch cache ([`Warmups`], cluster-wide, started when the first
//! ModelDeployment with `spec.warmup` is reconciled), whose events reconcile the
//! ModelDeployments waiting on them: no request per reconcile.

use std::collections::{BTreeSet, HashMap};
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
use crate::reflect;
use crate::upstream::UpstreamApi;

/// What the Warmup cache says of the Warmup a ModelDeployment names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Warmups cannot be read: the kind is not served, or the cache is not filled yet.
    Unavailable,
    /// No Warmup of that name in the ModelDeployment's namespace.
    Missing,
    /// The Warmup: its `status.phase` (absent before its controller wrote one) and the
    /// reason and message of its deciding condition (`Failed`, `Complete` or
    /// `Progressing`).
    Found {
        phase: Option<String>,
        reason: String,
        message: String,
    },
}

/// The gate's verdict for one ModelDeployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gate {
    /// Whether the upstream objects may be applied.
    pub open: bool,
    /// The reason of `WarmedUp` (and, while held, of `ResourceCreated` and `Ready`).
    pub reason: &'static str,
    /// Why, for the user.
    pub message: String,
    /// Held for good until the user acts (the Warmup failed): phase `Failed`.
    pub failed: bool,
}

impl Gate {
    fn open(reason: &'static str, message: String) -> Self {
        Self {
            open: true,
            reason,
            message,
            failed: false,
        }
    }

    fn held(reason: &'static str, message: String) -> Self {
        Self {
            open: false,
            reason,
            message,
            failed: reason == reasons::WARMUP_FAILED,
        }
    }
}

/// The gate of a ModelDeployment naming the Warmup `name`, which the cache shows as
/// `seen`; `created`: its upstream objects exist, or the gate was open before.
pub(crate) fn decide(name: &str, seen: &Seen, created: bool) -> Gate {
    if let Seen::Found {
        phase: Some(phase),
        message,
        ..
    } = seen
        && phase == "Completed"
    {
        return Gate::open(
            reasons::WARMUP_COMPLETED,
            format!("Warmup '{name}' completed: {message}"),
        );
    }
    if created {
        return Gate::open(
            reasons::ALREADY_CREATED,
            format!(
                "the upstream objects were created already; Warmup '{name}' holds only their creation"
            ),
        );
    }
    match seen {
        Seen::Unavailable => Gate::held(
            reasons::WARMUP_UNAVAILABLE,
            format!(
                "Warmup '{name}' cannot be read: the API server does not serve {}/{} Warmups (is the kernel-cache provider's warmup installed?) or they are not listed yet; nothing is created until it completes",
                WarmupRef::GROUP,
                WarmupRef::VERSION
            ),
        ),
        Seen::Missing => Gate::held(
            reasons::WARMUP_NOT_FOUND,
            format!(
                "there is no Warmup '{name}' in this namespace; nothing is created until it exists and completes"
            ),
        ),
        Seen::Found {
            phase,
            reason,
            message,
        } if phase.as_deref() == Some("Failed") => Gate::held(
            reasons::WARMUP_FAILED,
            format!(
                "Warmup '{name}' failed ({reason}: {message}); nothing is created until a Warmup of that name completes or spec.warmup is removed"
            ),
        ),
        Seen::Found { phase, message, .. } => {
            let progress = if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            };
            Gate::held(
                reasons::AWAITING_WARMUP,
                format!(
                    "waiting for Warmup '{name}' to complete (phase {}{progress}); nothing is created until then",
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
    Seen::Found {
        phase,
        reason: text("reason"),
        message: text("message"),
    }
}

/// Every container image the objects name: each non-empty string under a key `image` in
/// their specs (pod templates' containers and init containers, an upstream's own image
/// field), never in a ConfigMap's or Secret's data; sorted, each once.
pub(crate) fn images(objects: &[DynamicObject]) -> Vec<String> {
    fn walk(value: &Value, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    match v {
                        Value::String(s) if key == "image" && !s.trim().is_empty() => {
                            out.insert(s.trim().to_string());
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for object in objects {
        if let Value::Object(map) = &object.data {
            map.iter()
                .filter(|(key, _)| {
                    !["data", "stringData", "binaryData", "status"].contains(&key.as_str())
                })
                .for_each(|(_, v)| walk(v, &mut out));
        }
    }
    out.into_iter().collect()
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

/// The Warmups the gate reads, from one cluster-wide watch cache started on first use,
/// and which ModelDeployments wait on each.
pub(crate) struct Warmups {
    client: Client,
    /// Reconcile requests; `None`: never watch (single reconcile steps in unit tests).
    trigger: Option<mpsc::UnboundedSender<ObjectRef<ModelDeployment>>>,
    cache: OnceLock<reflect::Cache<DynamicObject>>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    /// ModelDeployment names (in the Warmup's namespace) that named each Warmup.
    waiting: Arc<Mutex<HashMap<WarmupKey, BTreeSet<String>>>>,
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
                        Ok(watcher::Event::InitDone) => waiting
                            .lock()
                            .map(|w| w.keys().cloned().collect())
                            .unwrap_or_default(),
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
                        for md in waiting.get(&key).into_iter().flatten() {
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

    /// The Warmup `name` of `md`'s namespace as the cache shows it; `md` is woken when it
    /// changes.
    fn seen(&self, md: &ModelDeployment, name: &str) -> Seen {
        let ns = md.namespace().unwrap_or_default();
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting
                .entry((ns.clone(), name.to_string()))
                .or_default()
                .insert(md.name_any());
        }
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

    /// The gate of `md` (`None` without `spec.warmup`); `primary_live`: its primary
    /// upstream object exists.
    pub(crate) fn gate(&self, md: &ModelDeployment, primary_live: bool) -> Option<Gate> {
        let name = &md.spec.warmup.as_ref()?.name;
        let seen = self.seen(md, name);
        Some(decide(name, &seen, primary_live || opened_before(md)))
    }
}

impl Drop for Warmups {
    fn drop(&mut self) {
        if let Ok(Some(task)) = self.task.lock().map(|mut t| t.take()) {
            task.abort();
        }
    }
}

/// The hook before anything is applied: while the gate is held, write a status that says
/// why (phase `Pending`, or `Failed` for a failed Warmup; `ResourceCreated`, `Ready` and
/// `WarmedUp` false; the rendered images) and apply nothing. `Some(action)` when held.
pub(crate) async fn hold<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    api: &UpstreamApi,
    warnings: &[Warning],
    objects: &[DynamicObject],
    primary_live: bool,
) -> Result<Option<Action>, Error> {
    let Some(gate) = ctx.warmups.gate(md, primary_live).filter(|g| !g.open) else {
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
    view.images = Some(images(objects));
    status::apply(ctx, md, &view).await?;
    Ok(Some(Action::requeue(ctx.options.resync_period)))
}

/// The status of an applied ModelDeployment: the images it renders and, with
/// `spec.warmup`, `WarmedUp=True`.
pub(crate) fn report<P: Provider>(
    mut view: ProviderView,
    md: &ModelDeployment,
    ctx: &Context<P>,
    objects: &[DynamicObject],
) -> ProviderView {
    view.images = Some(images(objects));
    match ctx.warmups.gate(md, true) {
        Some(gate) => view.condition(WARMED_UP, true, gate.reason, gate.message),
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
        let mut status = json!({"conditions": conditions});
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
                message: "1 of 2 nodes warmed, 1 active, 0 failed".into()
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
                message: String::new()
            }
        );
    }

    #[test]
    fn the_gate_opens_only_for_a_completed_warmup_or_what_exists() {
        let found = |phase: &str, reason: &str, message: &str| Seen::Found {
            phase: Some(phase.into()),
            reason: reason.into(),
            message: message.into(),
        };
        let completed = decide(
            "w",
            &found("Completed", "NodesWarmed", "2 of 2 nodes warmed"),
            false,
        );
        assert!(completed.open);
        assert_eq!(completed.reason, reasons::WARMUP_COMPLETED);
        assert!(completed.message.contains("2 of 2 nodes warmed"));

        let running = decide(
            "w",
            &found("InProgress", "WarmupInProgress", "1 of 2 nodes warmed"),
            false,
        );
        assert!(!running.open && !running.failed);
        assert_eq!(running.reason, reasons::AWAITING_WARMUP);
        assert!(
            running
                .message
                .contains("phase InProgress: 1 of 2 nodes warmed"),
            "{running:?}"
        );
        let pending = decide(
            "w",
            &found("Pending", "TargetNotFound", "no ModelDeployment"),
            false,
        );
        assert_eq!(pending.reason, reasons::AWAITING_WARMUP);

        let failed = decide(
            "w",
            &found("Failed", "GlobalTimeoutExceeded", "did not finish"),
            false,
        );
        assert!(!failed.open && failed.failed);
        assert_eq!(failed.reason, reasons::WARMUP_FAILED);
        assert!(
            failed
                .message
                .contains("GlobalTimeoutExceeded: did not finish"),
            "{failed:?}"
        );

        let missing = decide("w", &Seen::Missing, false);
        assert!(!missing.open && !missing.failed);
        assert_eq!(missing.reason, reasons::WARMUP_NOT_FOUND);
        let unavailable = decide("w", &Seen::Unavailable, false);
        assert_eq!(unavailable.reason, reasons::WARMUP_UNAVAILABLE);
        assert!(
            unavailable
                .message
                .contains("cache.kubeairunway.ai/v1alpha1")
        );

        // What exists is never held back, whatever became of the Warmup.
        for seen in [Seen::Missing, Seen::Unavailable, found("Failed", "X", "y")] {
            let g = decide("w", &seen, true);
            assert!(g.open, "{seen:?}");
            assert_eq!(g.reason, reasons::ALREADY_CREATED);
        }
        assert_eq!(
            decide("w", &found("Completed", "NodesWarmed", "done"), true).reason,
            reasons::WARMUP_COMPLETED
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
        assert_eq!(
            warmups.gate(&md(false, None), false),
            None,
            "no spec.warmup, no gate"
        );
        assert_eq!(
            warmups.gate(&md(true, None), false).unwrap().reason,
            reasons::WARMUP_UNAVAILABLE,
            "no cache"
        );
        warmups.fixed(vec![warmup(Some("InProgress"), json!([]))]);
        assert_eq!(
            warmups.gate(&md(true, None), false).unwrap().reason,
            reasons::AWAITING_WARMUP
        );
        assert!(
            warmups.gate(&md(true, Some("True")), false).unwrap().open,
            "opened before: a primary being recreated is not held"
        );
        assert!(!warmups.gate(&md(true, Some("False")), false).unwrap().open);
        assert!(warmups.gate(&md(true, None), true).unwrap().open);
        assert_eq!(
            warmups.waiting.lock().unwrap()[&("ml".to_string(), "w".to_string())],
            BTreeSet::from(["m".to_string()])
        );
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

    #[test]
    fn images_are_every_image_in_the_specs_sorted_once() {
        let objects: Vec<DynamicObject> = [
            json!({"apiVersion": "example.com/v1", "kind": "Server", "metadata": {"name": "a"},
                   "spec": {"image": "llama.cpp:b1", "template": {"spec": {
                       "initContainers": [{"name": "i", "image": "busybox:1"}],
                       "containers": [{"name": "c", "image": "llama.cpp:b1"}, {"name": "s", "image": " "}]}}}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}, "data": {"image": "not-an-image"}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "c"},
                   "spec": {"template": {"spec": {"containers": [{"name": "v", "image": "vllm/vllm-openai:v0.11.0"}]}}},
                   "status": {"image": "not-rendered"}}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
        assert_eq!(
            images(&objects),
            ["busybox:1", "llama.cpp:b1", "vllm/vllm-openai:v0.11.0"]
        );
    }
}
