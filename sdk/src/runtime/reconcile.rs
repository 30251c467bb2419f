//! One reconciliation of one ModelDeployment, read from the caches, writing only what
//! changed. The phases, each a function below:
//!
//! 1. [`prepare`]: `check`, the installed upstream API, `render`, the platform's metadata
//!    and the schema check (a problem of the spec ends here as a terminal status);
//! 2. [`replace_primary`]: delete the primary object when it must be created anew;
//! 3. [`apply_changed`]: supporting objects first, the primary last, each only when what
//!    is rendered differs from what is live (or the live object drifted);
//! 4. [`prune`] (when the spec changed) and [`report`]: observe and write our status,
//!    only when it differs.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::events::{Event, EventType};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::Context;
use super::status::{self, ProviderView};
use crate::api::{ModelDeployment, Phase};
use crate::conditions::{PROVIDER_COMPATIBLE, READY, RESOURCE_CREATED, STALE_STATUS, reasons};
use crate::labels;
use crate::provider::{Live, Observed, Provider, Warning};
use crate::render;
use crate::upstream::UpstreamApi;

/// A reconciliation failure that is worth retrying (API errors, conflicts). Terminal
/// problems of the spec are not errors: they become conditions, and the runtime waits for
/// the spec to change.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Anything else that may pass on retry.
    #[error("{0}")]
    Other(String),
}

/// How long to wait between looks while something is being deleted (the delete events
/// wake the reconciler sooner).
const DELETE_POLL: Duration = Duration::from_secs(2);

pub(crate) async fn reconcile<P: Provider>(
    cached: Arc<super::Cached>,
    ctx: Arc<Context<P>>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let md = cached.object().map_err(|e| Error::Other(e.to_string()))?;
    let result = reconcile_once(&md, &ctx).await;
    ctx.metrics.observe(
        if result.is_ok() { "ok" } else { "error" },
        started.elapsed(),
    );
    if result.is_ok() {
        ctx.memory.with(&md, |r| r.failures = 0);
    }
    result
}

#[allow(clippy::needless_pass_by_value)] // the signature kube's Controller::run asks for
pub(crate) fn error_policy<P: Provider>(
    md: Arc<super::Cached>,
    error: &Error,
    ctx: Arc<Context<P>>,
) -> Action {
    ctx.metrics.error("transient");
    let attempts = ctx
        .memory
        .with(&*md, |r| {
            r.failures = r.failures.saturating_add(1);
            r.failures
        })
        .unwrap_or(1);
    let delay = crate::process::backoff(attempts);
    tracing::warn!(name = %md.name_any(), namespace = ?md.namespace(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Reconcile `md` once: what [`super::run`] does for each event. Public so that tests
/// can drive single steps, for example against a mock API.
pub async fn reconcile_once<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<Action, Error> {
    if md.selected_provider() != Some(ctx.name()) {
        ctx.warmups.forget(md);
        ctx.memory.forget(md);
        return Ok(Action::await_change());
    }
    if labels::is_paused(md.metadata.annotations.as_ref()) {
        tracing::debug!(name = %md.name_any(), "paused");
        return Ok(Action::await_change());
    }
    if md.metadata.deletion_timestamp.is_some() {
        ctx.warmups.forget(md);
        ctx.memory.forget(md);
        return cleanup(md, ctx).await;
    }
    ensure_finalizer(md, ctx).await?;
    let prepared = match prepare(md, ctx).await? {
        Ok(prepared) => prepared,
        Err(action) => return Ok(action),
    };
    let live = prepared.live(ctx).await;
    let (api, warnings, objects) = (&prepared.api, &prepared.warnings, &prepared.objects);
    let owned = if md.spec.warmup.is_some() {
        owned_live(md, ctx)
    } else {
        Vec::new()
    };
    let gate = ctx.warmups.gate(md, ctx.name(), objects, &owned);
    super::warmup::sync(md, ctx, gate.as_ref(), objects).await?;
    if let Some(action) =
        super::warmup::hold(md, ctx, api, warnings, objects, gate.as_ref()).await?
    {
        return Ok(action);
    }
    if gate.as_ref().is_some_and(|g| !g.open) {
        // A scale-up or an upgrade waits for its warmup: every live object stays as it is.
        let live = prepared.live_view(&live);
        return report(md, ctx, &prepared, &live, gate.as_ref()).await;
    }
    if let Some(action) = replace_primary(md, ctx, &prepared, live[0].as_deref()).await? {
        return Ok(action);
    }
    let created = live[0].is_none();
    let live = match apply_changed(md, ctx, &prepared, live).await? {
        Ok(live) => live,
        Err(action) => return Ok(action),
    };
    // The rendered set changes only with the spec (or the provider's flags): prune what
    // the ModelDeployment owns and no longer renders, e.g. the Workspace left behind when
    // more replicas move it to an InferenceSet.
    let status_generation = md.status.as_ref().and_then(|s| s.observed_generation);
    if status_generation != md.metadata.generation {
        prune(md, ctx, &prepared).await?;
    }
    if created {
        let message = format!(
            "Created {} '{}'",
            prepared.primary_kind(),
            prepared.objects[0].name_any()
        );
        event(
            ctx,
            md,
            EventType::Normal,
            reasons::RESOURCE_CREATED,
            &message,
        )
        .await;
    }
    report(
        md,
        ctx,
        &prepared,
        &prepared.live_view(&live),
        gate.as_ref(),
    )
    .await
}

/// Everything a reconcile applies, ready to compare with what is live.
struct Prepared {
    api: UpstreamApi,
    /// Finished objects (metadata, owner, labels, annotations); the primary first.
    objects: Vec<DynamicObject>,
    /// The API resource of each object.
    resources: Vec<ApiResource>,
    warnings: Vec<Warning>,
}

impl Prepared {
    fn primary_kind(&self) -> &str {
        &self.resources[0].kind
    }

    /// What [`Provider::observe`] sees: each rendered object that is live, by kind.
    fn live_view(&self, live: &[Option<Arc<DynamicObject>>]) -> Live {
        let mut view = Live::empty();
        for (i, (resource, object)) in self.resources.iter().zip(live).enumerate() {
            let object = object.as_deref().cloned();
            if i == 0 {
                view.set_primary(&resource.kind, object);
            } else if let Some(object) = object {
                view.insert(&resource.kind, object);
            }
        }
        view
    }

    /// The live object of each rendered one, from the caches.
    async fn live<P: Provider>(&self, ctx: &Context<P>) -> Vec<Option<Arc<DynamicObject>>> {
        let mut out = Vec::with_capacity(self.objects.len());
        for (object, resource) in self.objects.iter().zip(&self.resources) {
            ctx.owned.synced(resource).await;
            let ns = object.namespace().unwrap_or_default();
            out.push(ctx.owned.get(resource, &ns, &object.name_any()));
        }
        out
    }
}

/// Phase 1: whether the provider serves `md` with the installed upstream API, and what
/// to apply. `Err(action)` when a terminal status was written instead.
async fn prepare<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<Result<Prepared, Action>, Error> {
    let terminal_status = |phase, reason: &'static str, message: String| async move {
        status::apply(ctx, md, &terminal(phase, reason, &message)).await?;
        Ok::<_, Error>(Err(Action::await_change()))
    };
    if let Err(incompatible) = super::fit::check(ctx.provider.as_ref(), md) {
        return terminal_status(Phase::Failed, reasons::INCOMPATIBLE, incompatible.0).await;
    }
    let upstream = ctx.upstream.borrow().clone();
    let api = match upstream {
        Some(Ok(api)) => api,
        Some(Err(reason)) => {
            return terminal_status(Phase::Failed, reasons::UPSTREAM_SCHEMA_MISMATCH, reason).await;
        }
        None => {
            let message = format!(
                "{}; waiting for it",
                crate::upstream::not_served_message(&ctx.provider.upstream())
            );
            return terminal_status(Phase::Pending, reasons::UPSTREAM_CRD_MISSING, message).await;
        }
    };
    let rendered = match ctx.provider.render(md, &api) {
        Ok(r) => r,
        Err(e) => {
            return terminal_status(Phase::Failed, reasons::INVALID_CONFIGURATION, e.0).await;
        }
    };
    publish_warnings(md, ctx, &rendered.warnings).await;
    if rendered.objects.is_empty() {
        return Err(Error::Other(format!(
            "provider {} rendered no objects",
            ctx.name()
        )));
    }
    // Nothing is applied unless every field we set exists in the installed schema.
    let objects = match render::finalize(ctx.provider.as_ref(), md, &api, rendered.objects) {
        Ok(objects) => objects,
        Err(mismatch) => {
            let message = mismatch.to_string();
            event(
                ctx,
                md,
                EventType::Warning,
                reasons::UPSTREAM_SCHEMA_MISMATCH,
                &message,
            )
            .await;
            return terminal_status(Phase::Failed, reasons::UPSTREAM_SCHEMA_MISMATCH, message)
                .await;
        }
    };
    let resources = objects.iter().map(|o| api.resource_of(o)).collect();
    Ok(Ok(Prepared {
        api,
        objects,
        resources,
        warnings: rendered.warnings,
    }))
}

/// Phase 2: while the previous primary object is being deleted, wait; when it must be
/// created anew (an identity or immutable field changed), delete it. `Some(action)` when
/// the reconcile ends here.
async fn replace_primary<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    prepared: &Prepared,
    live: Option<&DynamicObject>,
) -> Result<Option<Action>, Error> {
    let Some(live) = live else {
        return Ok(None);
    };
    let (kind, name) = (prepared.primary_kind(), prepared.objects[0].name_any());
    let deleting = |message: String| {
        ProviderView::new(Phase::Deploying, message).condition(
            READY,
            false,
            reasons::DEPLOYMENT_PROGRESSING,
            "recreating",
        )
    };
    if live.metadata.deletion_timestamp.is_some() {
        let message = format!("waiting for the previous {kind} to be deleted");
        status::apply(ctx, md, &deleting(message)).await?;
        return Ok(Some(Action::requeue(DELETE_POLL)));
    }
    let Some(what) = recreate_reason(live, &prepared.objects[0]) else {
        return Ok(None);
    };
    let message = format!("{what}: deleting {kind} '{name}' to create it anew");
    event(ctx, md, EventType::Normal, "Recreating", &message).await;
    let api: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &md.namespace().unwrap_or_default(),
        &prepared.resources[0],
    );
    delete_as_read(&api, live).await?;
    status::apply(ctx, md, &deleting(message)).await?;
    Ok(Some(Action::requeue(DELETE_POLL)))
}

/// Phase 3: apply, supporting objects first in the order rendered and the primary last
/// (an upstream webhook that checks what the primary refers to, KAITO's inference
/// ConfigMap, must find it), each only when it changed or drifted. Returns the live
/// objects afterwards (as the API server returned those applied); `Err(action)` when the
/// API server refused an object.
async fn apply_changed<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    prepared: &Prepared,
    mut live: Vec<Option<Arc<DynamicObject>>>,
) -> Result<Result<Vec<Option<Arc<DynamicObject>>>, Action>, Error> {
    let ns = md.namespace().unwrap_or_default();
    let pp = PatchParams::apply(&ctx.field_manager()).force();
    let order = (1..prepared.objects.len()).chain(std::iter::once(0));
    for i in order {
        let (object, resource) = (&prepared.objects[i], &prepared.resources[i]);
        if let Some(live) = &live[i] {
            let drift = drifted_paths(object, live);
            if drift.is_empty() && same_rendering(object, live) {
                continue;
            }
            if !drift.is_empty() {
                let message = format!(
                    "{} '{}' was modified directly ({}); restoring it from the ModelDeployment",
                    resource.kind,
                    object.name_any(),
                    drift.join(", ")
                );
                event(ctx, md, EventType::Warning, "DriftDetected", &message).await;
            }
        }
        let target: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, resource);
        if live[i].is_none()
            && let Some(owner) = foreign_owner(md, &target, &object.name_any()).await?
        {
            let message = format!(
                "{} '{}' already exists and is not owned by this ModelDeployment ({owner}); it is left alone: delete or rename it",
                resource.kind,
                object.name_any()
            );
            return conflict(md, ctx, &prepared.api, &message).await.map(Err);
        }
        ctx.owned.writing(resource, &ns, &object.name_any());
        let result = target
            .patch(&object.name_any(), &pp, &Patch::Apply(object))
            .await;
        if result.is_err() {
            ctx.owned
                .write_failed(resource, &ns, &object.name_any(), &md.name_any());
        }
        match result {
            Ok(result) => {
                ctx.owned.wrote(resource, &result);
                live[i] = Some(Arc::new(result));
            }
            Err(kube::Error::Api(s)) if is_refusal(s.code) => {
                let message = format!(
                    "the API server refused {} '{}': {}",
                    resource.kind,
                    object.name_any(),
                    s.message
                );
                return refused(md, ctx, &prepared.api, &message).await.map(Err);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Ok(live))
}

/// Who owns the object named `name` that this provider's caches do not hold, if it
/// exists and `md` does not own it: server-side apply with `force` would take it over (a
/// ConfigMap of someone else's with the name we render). One read per object this
/// provider creates, never in steady state.
async fn foreign_owner(
    md: &ModelDeployment,
    api: &Api<DynamicObject>,
    name: &str,
) -> Result<Option<String>, Error> {
    let Some(existing) = api.get_opt(name).await? else {
        return Ok(None);
    };
    if owned_by(&existing, md) {
        return Ok(None);
    }
    let owners = existing.owner_references();
    Ok(Some(if owners.is_empty() {
        "it has no owner".to_string()
    } else {
        format!(
            "it is owned by {}",
            owners
                .iter()
                .map(|o| format!("{} '{}'", o.kind, o.name))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }))
}

/// Whether `live` is the object as we rendered it last time we applied it.
fn same_rendering(rendered: &DynamicObject, live: &DynamicObject) -> bool {
    let hash = |o: &DynamicObject| o.annotations().get(labels::RENDERED_HASH).cloned();
    hash(rendered).is_some() && hash(rendered) == hash(live)
}

/// Phase 4: observe the upstream status and write ours (when it changed); when to look
/// again.
async fn report<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    prepared: &Prepared,
    live: &Live,
    gate: Option<&super::warmup::Gate>,
) -> Result<Action, Error> {
    let observed = ctx.provider.observe(md, live);
    let stale = stale_for(md, ctx, live, observed.phase);
    let (kind, name) = (
        prepared.primary_kind().to_string(),
        prepared.objects[0].name_any(),
    );
    let (compatible_reason, compatible) = compatibility(ctx, &prepared.api, &prepared.warnings);
    let mut view = ProviderView::new(observed.phase, observed.message.clone())
        .condition(PROVIDER_COMPATIBLE, true, compatible_reason, compatible)
        .condition(
            RESOURCE_CREATED,
            true,
            reasons::RESOURCE_CREATED,
            format!("{kind} '{name}' is applied"),
        )
        .condition(
            READY,
            observed.ready,
            &observed.reason,
            observed.message.clone(),
        );
    view.resource = Some((name, kind.clone()));
    view.endpoint = observed.endpoint.clone();
    view.replicas = observed.replicas.clone();
    let mut view = super::warmup::report(view, gate, &prepared.objects);
    let stale_after = ctx.options.stale_status_after;
    if let Some(still) = stale
        && still >= stale_after
    {
        let message = format!(
            "the {kind} status has not changed for {}s while the deployment is {}; is its operator running?",
            still.as_secs(),
            observed.phase
        );
        view = view.condition(STALE_STATUS, true, reasons::STATUS_NOT_UPDATED, message);
    }
    status::apply(ctx, md, &view).await?;
    Ok(Action::requeue(next_look(ctx, &observed, stale)))
}

/// When to look again without any change: the resync period, sooner when the status
/// would turn stale or the provider asked for it.
fn next_look<P: Provider>(
    ctx: &Context<P>,
    observed: &Observed,
    stale: Option<Duration>,
) -> Duration {
    let mut next = ctx.options.resync_period;
    if let Some(still) = stale
        && still < ctx.options.stale_status_after
    {
        let until_stale = ctx.options.stale_status_after.saturating_sub(still);
        next = next.min(until_stale + Duration::from_millis(100));
    }
    if let Some(after) = observed.recheck_after {
        next = next.min(after);
    }
    next.max(Duration::from_millis(100))
}

fn compatible_message<P: Provider>(ctx: &Context<P>, api: &UpstreamApi) -> String {
    format!(
        "{} serves this spec with {} {}",
        ctx.name(),
        api.api_version(),
        api.kind
    )
}

/// Reason and message of `ProviderCompatible=True`: the spec fields this provider ignores
/// are named there for as long as they are set, not only in an event that expires.
pub(super) fn compatibility<P: Provider>(
    ctx: &Context<P>,
    api: &UpstreamApi,
    warnings: &[Warning],
) -> (&'static str, String) {
    let ignored = Warning::ignored_fields(warnings);
    if ignored.is_empty() {
        return (
            reasons::COMPATIBILITY_VERIFIED,
            compatible_message(ctx, api),
        );
    }
    (
        reasons::COMPATIBLE_WITH_IGNORED_FIELDS,
        format!(
            "{}; {} ignores {}",
            compatible_message(ctx, api),
            ctx.name(),
            ignored.join(", ")
        ),
    )
}

/// Why the live primary object must be deleted and created anew, if it must: an identity
/// field of the ModelDeployment changed, or a value its upstream declares immutable. A
/// live object without the annotation (made by an older provider) is left alone.
fn recreate_reason(live: &DynamicObject, rendered: &DynamicObject) -> Option<&'static str> {
    let differs = |key: &str| {
        let live = live.annotations().get(key)?;
        (rendered.annotations().get(key) != Some(live)).then_some(())
    };
    if differs(labels::IDENTITY).is_some() {
        return Some("an identity field changed");
    }
    if differs(labels::IMMUTABLE_HASH).is_some() {
        return Some("a field the upstream cannot update changed");
    }
    None
}

/// HTTP codes with which the API server or an admission webhook refuses an object for
/// what it is (not for load or a conflict): invalid (400, 422), forbidden by a webhook or
/// policy (403), or a kind or namespace that does not exist (404).
pub(crate) fn is_refusal(code: u16) -> bool {
    [400, 403, 404, 422].contains(&code)
}

/// How long to wait before applying a refused object again, when the spec has not
/// changed: a webhook's verdict can depend on other objects (a Secret, a ConfigMap) that
/// may appear, and an upstream webhook may read them from a cache that has not seen the
/// supporting object just applied (KAITO's reads its ConfigMap through its manager's
/// cache, `cmd/workspace/main.go:236@v0.12.0`). From 2 s, growing with the time the
/// refusal has stood, up to 5 min.
const REFUSAL_RETRY_MIN: Duration = Duration::from_secs(2);
const REFUSAL_RETRY_MAX: Duration = Duration::from_secs(300);

fn refusal_retry(md: &ModelDeployment) -> Duration {
    let conditions = md
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let since = crate::conditions::find(conditions, RESOURCE_CREATED)
        .filter(|c| {
            c.reason == reasons::RESOURCE_REJECTED || c.reason == reasons::RESOURCE_CONFLICT
        })
        .and_then(|c| {
            Duration::try_from(Timestamp::now().duration_since(c.last_transition_time.0)).ok()
        })
        .unwrap_or_default();
    since.clamp(REFUSAL_RETRY_MIN, REFUSAL_RETRY_MAX)
}

/// An object of the name we render belongs to someone else: `Failed`, naming it, with a
/// warning event; looked at again like a refusal (it may be deleted or renamed).
async fn conflict<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    api: &UpstreamApi,
    message: &str,
) -> Result<Action, Error> {
    not_created(md, ctx, api, reasons::RESOURCE_CONFLICT, message).await
}

/// An object was refused: `Failed` with the server's own words (which name the webhook and
/// its reason), a warning event, and a retry after [`refusal_retry`] or on the next change.
async fn refused<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    api: &UpstreamApi,
    message: &str,
) -> Result<Action, Error> {
    not_created(md, ctx, api, reasons::RESOURCE_REJECTED, message).await
}

/// A compatible ModelDeployment whose objects could not be created (`reason`): `Failed`,
/// a warning event, `ResourceCreated=False` and `Ready=False`, and a retry after
/// [`refusal_retry`] or on the next change.
async fn not_created<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    api: &UpstreamApi,
    reason: &str,
    message: &str,
) -> Result<Action, Error> {
    event(ctx, md, EventType::Warning, reason, message).await;
    let view = ProviderView::new(Phase::Failed, message)
        .condition(
            PROVIDER_COMPATIBLE,
            true,
            reasons::COMPATIBILITY_VERIFIED,
            compatible_message(ctx, api),
        )
        .condition(RESOURCE_CREATED, false, reason, message)
        .condition(READY, false, reason, message);
    status::apply(ctx, md, &view).await?;
    Ok(Action::requeue(refusal_retry(md)))
}

/// A terminal state: the phase, `ProviderCompatible=False` and `Ready=False` with
/// `reason` and `message`.
fn terminal(phase: Phase, reason: &str, message: &str) -> ProviderView {
    ProviderView::new(phase, message)
        .condition(PROVIDER_COMPATIBLE, false, reason, message)
        .condition(READY, false, reason, message)
}

/// Paths whose live value differs from what we render (metadata and status aside).
fn drifted_paths(rendered: &DynamicObject, live: &DynamicObject) -> Vec<String> {
    match (serde_json::to_value(rendered), serde_json::to_value(live)) {
        (Ok(r), Ok(l)) => drifted_value_paths(&r, &l),
        _ => Vec::new(),
    }
}

fn drifted_value_paths(rendered: &Value, live: &Value) -> Vec<String> {
    fn walk(path: &str, want: &Value, have: Option<&Value>, out: &mut Vec<String>) {
        match (want, have) {
            (Value::Object(w), Some(Value::Object(h))) => {
                for (k, v) in w {
                    if path.is_empty()
                        && (k == "metadata" || k == "status" || k == "apiVersion" || k == "kind")
                    {
                        continue;
                    }
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(&p, v, h.get(k), out);
                }
            }
            (Value::Array(w), Some(Value::Array(h))) if w.len() == h.len() => {
                for (i, (a, b)) in w.iter().zip(h).enumerate() {
                    walk(&format!("{path}[{i}]"), a, Some(b), out);
                }
            }
            (Value::Number(a), Some(Value::Number(b))) if a.as_f64() == b.as_f64() => {}
            (w, Some(h)) if w == h => {}
            _ => out.push(path.to_string()),
        }
    }
    let mut out = Vec::new();
    walk("", rendered, Some(live), &mut out);
    out
}

/// How long the upstream status (of every live object) has stood still, when it matters
/// (not Running).
fn stale_for<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    live: &Live,
    phase: Phase,
) -> Option<Duration> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for (kind, object) in live.iter() {
        kind.hash(&mut hasher);
        object
            .data
            .get("status")
            .map(Value::to_string)
            .unwrap_or_default()
            .hash(&mut hasher);
    }
    let fingerprint = hasher.finish();
    let since = ctx.memory.with(md, |r| match r.upstream {
        Some((seen, since)) if seen == fingerprint => since,
        _ => {
            let now = Instant::now();
            r.upstream = Some((fingerprint, now));
            now
        }
    })?;
    (phase != Phase::Running).then(|| since.elapsed())
}

async fn publish_warnings<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    warnings: &[Warning],
) {
    let generation = md.metadata.generation.unwrap_or_default();
    let already = ctx.memory.with(md, |r| r.warned).flatten() == Some(generation);
    if already {
        return;
    }
    // One event per reason: events with the same reason and object are merged into one
    // series, so separate notes would be lost.
    let mut by_reason: std::collections::BTreeMap<&str, Vec<&str>> =
        std::collections::BTreeMap::new();
    for w in warnings {
        tracing::info!(name = %md.name_any(), reason = %w.reason, message = %w.message, "spec warning");
        by_reason
            .entry(w.reason.as_str())
            .or_default()
            .push(w.message.as_str());
    }
    let mut published = true;
    for (reason, messages) in by_reason {
        published &= event(ctx, md, EventType::Warning, reason, &messages.join("; ")).await;
    }
    // Marked published only when every event was written: a failed write is tried again
    // on the next reconcile of this generation.
    if published {
        ctx.memory.with(md, |r| r.warned = Some(generation));
    }
}

/// Publish an event about `md`; failures are logged, never fatal. Whether it was written.
pub(crate) async fn event<P: Provider>(
    ctx: &Context<P>,
    md: &ModelDeployment,
    type_: EventType,
    reason: &str,
    note: &str,
) -> bool {
    let ev = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.chars().take(1024).collect()),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    match ctx.recorder.publish(&ev, &md.object_ref(&())).await {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, reason, "could not publish event");
            false
        }
    }
}

async fn ensure_finalizer<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<(), Error> {
    let finalizer = ctx.finalizer();
    if md.finalizers().contains(&finalizer) {
        return Ok(());
    }
    let mut finalizers = md.finalizers().to_vec();
    finalizers.push(finalizer);
    set_finalizers(md, ctx, finalizers).await
}

/// Replace the finalizer list, guarded by the resourceVersion we read.
async fn set_finalizers<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let api: Api<ModelDeployment> =
        Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default());
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": md.resource_version()}});
    match api
        .patch(
            &md.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Delete `live` as it was read: only if it is still that version (its resourceVersion
/// and uid), so that an object another writer took over meanwhile (the provider now
/// serving the ModelDeployment) is never deleted by a stale decision. `Ok(false)` when it
/// is gone or changed.
async fn delete_as_read(
    api: &Api<DynamicObject>,
    live: &DynamicObject,
) -> Result<bool, kube::Error> {
    delete_if(api, live, live.resource_version()).await
}

/// Delete `object` only if the API server still holds that object (its uid) and, when
/// `resource_version` is given, at that version. `Ok(false)` when it is gone or the
/// precondition failed.
pub(super) async fn delete_if(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    resource_version: Option<String>,
) -> Result<bool, kube::Error> {
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version,
            uid: object.uid(),
        }),
        ..DeleteParams::background()
    };
    match api.delete(&object.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletion: delete our objects, wait until they are gone, then release the
/// ModelDeployment; give up after the finalizer timeout.
async fn cleanup<P: Provider>(md: &ModelDeployment, ctx: &Context<P>) -> Result<Action, Error> {
    let finalizer = ctx.finalizer();
    if !md.finalizers().contains(&finalizer) {
        return Ok(Action::await_change());
    }
    // The status write changes the resourceVersion that guards the finalizer patch: go
    // on with the object it returned, or the patch would fail with a conflict.
    let written = status::apply(
        ctx,
        md,
        &ProviderView::new(Phase::Terminating, "deleting the provider's resources"),
    )
    .await
    .ok()
    .flatten();
    let md = written.as_ref().unwrap_or(md);
    let mut remaining = delete_owned(md, ctx).await?;
    remaining.extend(super::warmup::release(md, ctx).await?);
    if remaining.is_empty() {
        release_finalizer(md, ctx).await?;
        return Ok(Action::await_change());
    }
    let deleting_since = md
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    let waited =
        Duration::try_from(Timestamp::now().duration_since(deleting_since)).unwrap_or_default();
    let timeout = ctx.options.finalizer_timeout;
    if waited >= timeout {
        let message = format!(
            "Finalizer removed after {}s, provider resource may be orphaned: {}",
            timeout.as_secs(),
            remaining.join(", ")
        );
        event(ctx, md, EventType::Warning, "FinalizerTimeout", &message).await;
        release_finalizer(md, ctx).await?;
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(
        DELETE_POLL.min(timeout.saturating_sub(waited)),
    ))
}

/// Remove this provider's finalizer from `md`.
pub(crate) async fn release_finalizer<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<(), Error> {
    let finalizer = ctx.finalizer();
    let rest = md
        .finalizers()
        .iter()
        .filter(|f| **f != finalizer)
        .cloned()
        .collect();
    set_finalizers(md, ctx, rest).await
}

/// Every object `md` owns that the caches hold, of every kind the provider renders or
/// owns (being deleted or not): what runs for it, for the warmup gate.
fn owned_live<P: Provider>(md: &ModelDeployment, ctx: &Context<P>) -> Vec<Arc<DynamicObject>> {
    let (ns, name) = (md.namespace().unwrap_or_default(), md.name_any());
    let upstream = ctx.upstream.borrow().clone();
    let mut kinds = super::owned_kinds(ctx, upstream.as_ref());
    kinds.extend(ctx.owned.kinds());
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for kind in kinds {
        if !seen.insert((kind.api_version.clone(), kind.kind.clone())) {
            continue;
        }
        for object in ctx.owned.names_for(&kind, &ns, &name) {
            if let Some(live) = ctx.owned.get(&kind, &ns, &object)
                && owned_by(&live, md)
            {
                out.push(live);
            }
        }
    }
    out
}

/// Whether `object` is owned by `md` (an owner reference with its uid).
pub(crate) fn owned_by(object: &DynamicObject, md: &ModelDeployment) -> bool {
    let uid = md.uid();
    object
        .owner_references()
        .iter()
        .any(|o| Some(&o.uid) == uid.as_ref())
}

/// Every object of `md` this provider may own: by kind, the names it renders now and the
/// names the caches hold labelled for `md`.
fn owned_candidates<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Vec<(ApiResource, String)> {
    let (ns, name) = (md.namespace().unwrap_or_default(), md.name_any());
    let upstream = ctx.upstream.borrow().clone();
    let mut targets: Vec<(ApiResource, String)> = Vec::new();
    if let Some(Ok(api)) = &upstream
        && let Ok(rendered) = ctx.provider.render(md, api)
    {
        targets.extend(
            rendered
                .objects
                .iter()
                .map(|o| (api.resource_of(o), o.name_any())),
        );
    }
    let mut kinds = super::owned_kinds(ctx, upstream.as_ref());
    kinds.extend(targets.iter().map(|(r, _)| r.clone()));
    kinds.extend(ctx.owned.kinds());
    for kind in kinds {
        for object in ctx.owned.names_for(&kind, &ns, &name) {
            targets.push((kind.clone(), object));
        }
    }
    targets.sort_by(|a, b| {
        (&a.0.api_version, &a.0.kind, &a.1).cmp(&(&b.0.api_version, &b.0.kind, &b.1))
    });
    targets.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    targets
}

/// Ask for the deletion of every object this provider made for `md` (never one another
/// owner made under the same name); return those that still exist (`Kind/name`).
pub(crate) async fn delete_owned<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<Vec<String>, Error> {
    let ns = md.namespace().unwrap_or_default();
    let mut remaining = Vec::new();
    for (resource, name) in owned_candidates(md, ctx) {
        ctx.owned.synced(&resource).await;
        let Some(live) = ctx.owned.get(&resource, &ns, &name) else {
            continue;
        };
        if !owned_by(&live, md) {
            continue;
        }
        if live.metadata.deletion_timestamp.is_none() {
            let objects: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), &ns, &resource);
            if !delete_as_read(&objects, &live).await? {
                ctx.owned.forget(&resource, &ns, &name);
                continue;
            }
        }
        remaining.push(format!("{}/{name}", resource.kind));
    }
    Ok(remaining)
}

/// Delete the objects `md` owns that are not among those rendered now.
async fn prune<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    prepared: &Prepared,
) -> Result<(), Error> {
    let wanted: BTreeSet<(String, String, String)> = prepared
        .objects
        .iter()
        .zip(&prepared.resources)
        .map(|(o, r)| (r.api_version.clone(), r.kind.clone(), o.name_any()))
        .collect();
    let ns = md.namespace().unwrap_or_default();
    for (resource, name) in owned_candidates(md, ctx) {
        if wanted.contains(&(
            resource.api_version.clone(),
            resource.kind.clone(),
            name.clone(),
        )) {
            continue;
        }
        let Some(live) = ctx.owned.get(&resource, &ns, &name) else {
            continue;
        };
        if !owned_by(&live, md) || live.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let objects: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &resource);
        if delete_as_read(&objects, &live).await? {
            let message = format!(
                "Deleted {} '{name}': the ModelDeployment no longer needs it",
                resource.kind
            );
            event(ctx, md, EventType::Normal, "Pruned", &message).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;

    type ApiServer = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    use super::super::Nothing;

    /// A context whose client is answered by the returned mock API server (no upstream
    /// detected, no caches started).
    fn context() -> (Arc<Context<Nothing>>, ApiServer) {
        let (service, server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (_, upstream) = tokio::sync::watch::channel(None);
        let ctx = Context::new(
            Arc::new(Nothing),
            kube::Client::new(service, "default"),
            super::super::Options::default(),
            upstream,
        );
        (Arc::new(ctx), server)
    }

    fn md(extra: &Value) -> ModelDeployment {
        let mut md = json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1,
                         "resourceVersion": "1"},
            "spec": {"model": {"id": "a/b"}},
        });
        json_patch::merge(&mut md, extra);
        serde_json::from_value(md).unwrap()
    }

    /// Take the next request and answer it with what `reply` makes of its method, path
    /// and body.
    async fn respond(
        server: &mut ApiServer,
        reply: impl FnOnce(&str, &str, &Value) -> (u16, Value),
    ) {
        let (request, send) = server.next_request().await.expect("a request");
        let (method, path) = (
            request.method().to_string(),
            request.uri().path().to_string(),
        );
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let (status, reply) = reply(&method, &path, &body);
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap(),
        );
    }

    fn failure(code: u16, reason: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
               "reason": reason, "message": reason})
    }

    /// Run `step` to its end, answering each request it sends with `reply`; the requests'
    /// methods and paths. A step cannot end while its request waits for an answer, so
    /// this tells for certain whether it sent one.
    async fn requests_of(
        server: &mut ApiServer,
        step: tokio::task::JoinHandle<()>,
        reply: impl Fn(&str, &str, &Value) -> (u16, Value),
    ) -> Vec<String> {
        let mut sent = Vec::new();
        tokio::pin!(step);
        loop {
            tokio::select! {
                done = &mut step => {
                    done.unwrap();
                    return sent;
                }
                () = respond(server, |method, path, body| {
                    sent.push(format!("{method} {path}"));
                    reply(method, path, body)
                }) => {}
            }
        }
    }

    /// A spec warning whose event the API server refused is published again on the next
    /// reconcile of the same generation; once written, it is not published again.
    #[tokio::test]
    async fn warnings_are_marked_published_only_once_their_event_is_written() {
        let (ctx, mut server) = context();
        let md = Arc::new(md(&json!({})));
        let warnings = Arc::new(vec![Warning::new(
            "UnknownOverride",
            "x is not a known key",
        )]);
        let publish = || {
            let (ctx, md, warnings) = (ctx.clone(), md.clone(), warnings.clone());
            tokio::spawn(async move { publish_warnings(&md, &ctx, &warnings).await })
        };
        let event = "POST /apis/events.k8s.io/v1/namespaces/ns/events".to_string();

        let refused = requests_of(&mut server, publish(), |_, _, body| {
            assert_eq!(body["reason"], "UnknownOverride");
            (500, failure(500, "InternalError"))
        })
        .await;
        assert_eq!(refused, std::slice::from_ref(&event));
        let written = requests_of(&mut server, publish(), |_, _, body| (201, body.clone())).await;
        assert_eq!(written, [event], "the refused event is published again");
        let again = requests_of(&mut server, publish(), |_, _, body| (201, body.clone())).await;
        assert!(
            again.is_empty(),
            "a written warning is not published again for the same generation: {again:?}"
        );
    }

    /// Deletion writes the `Terminating` status, then releases the finalizer with a patch
    /// guarded by the resourceVersion: the one the status write returned, as the API
    /// server answers a stale one with a conflict.
    #[tokio::test]
    async fn deletion_releases_the_finalizer_with_the_version_its_status_write_returned() {
        let (ctx, mut server) = context();
        let md = md(&json!({"metadata": {
            "finalizers": [super::super::finalizer("nothing"), "other.example/keep"],
            "deletionTimestamp": "2026-01-01T00:00:00Z",
        }}));
        let written = {
            let mut written = md.clone();
            written.metadata.resource_version = Some("2".into());
            written
        };
        let deleting = {
            let (md, ctx) = (md.clone(), ctx.clone());
            tokio::spawn(async move { cleanup(&md, &ctx).await.map_err(|e| e.to_string()) })
        };
        respond(&mut server, |method, path, body| {
            assert_eq!(
                (method, path),
                (
                    "PATCH",
                    "/apis/kubeairunway.ai/v1alpha1/namespaces/ns/modeldeployments/m/status"
                )
            );
            assert_eq!(body["status"]["phase"], "Terminating");
            (200, serde_json::to_value(&written).unwrap())
        })
        .await;
        respond(&mut server, |method, path, body| {
            assert_eq!(
                (method, path),
                (
                    "PATCH",
                    "/apis/kubeairunway.ai/v1alpha1/namespaces/ns/modeldeployments/m"
                )
            );
            assert_eq!(
                body["metadata"]["finalizers"],
                json!(["other.example/keep"])
            );
            if body["metadata"]["resourceVersion"] == "2" {
                (200, serde_json::to_value(&written).unwrap())
            } else {
                (409, failure(409, "Conflict"))
            }
        })
        .await;
        assert_eq!(deleting.await.unwrap(), Ok(Action::await_change()));
    }

    #[test]
    fn drift_is_a_changed_value_we_set() {
        let rendered = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a"},
                              "spec": {"replicas": 2, "containers": [{"name": "c", "args": ["--a"]}]}});
        let same_plus_defaults = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a", "uid": "x"},
                                        "spec": {"replicas": 2.0, "extra": true, "containers": [{"name": "c", "args": ["--a"], "image": "i"}]},
                                        "status": {"ready": true}});
        assert!(drifted_value_paths(&rendered, &same_plus_defaults).is_empty());
        let edited = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a"},
                            "spec": {"replicas": 5, "containers": [{"name": "c", "args": ["--b"]}]}});
        assert_eq!(
            drifted_value_paths(&rendered, &edited),
            ["spec.containers[0].args[0]", "spec.replicas"]
        );
        let removed = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a"}, "spec": {"replicas": 2}});
        assert_eq!(
            drifted_value_paths(&rendered, &removed),
            ["spec.containers"]
        );
    }
}
