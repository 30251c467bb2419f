//! One reconciliation of one ModelDeployment, read from the caches, writing only what
//! changed. The phases, each a function below:
//!
//! 1. [`prepare`]: `check`, the installed upstream API, `render`, the platform's metadata
//!    and the schema check (a problem of the spec ends here as a terminal status);
//! 2. [`replace_primary`]: delete the primary object when it must be created anew;
//! 3. [`apply_changed`]: supporting objects first, the primary last, each only when what
//!    is rendered differs from what is live (or the live object drifted);
//! 4. `prune` (when the spec changed) and [`report`]: observe and write our status,
//!    only when it differs.
//!
//! Before phase 2, the warmup gate ([`warmup::pass`]) may hold what would land on nodes.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::controller::Action;
use serde_json::Value;

use super::cleanup::{cleanup, ensure_finalizer, prune};
use super::context::{Cached, Context};
use super::delete::{DELETE_POLL, delete_as_read};
use super::drift::{drifted_paths, recreate_reason, same_rendering};
use super::error::is_refusal;
use super::fit;
use super::gate::{Gate, with_gate};
use super::status;
use super::view::{ProviderView, compatibility, compatible_message, terminal};
use super::warmup::{self, Pass};
use crate::api::{ModelDeployment, Phase};
use crate::conditions::{PROVIDER_COMPATIBLE, READY, RESOURCE_CREATED, STALE_STATUS, reasons};
use crate::events::EventType;
use crate::labels;
use crate::provider::{Live, Observed, Provider, Warning};
use crate::render;
use crate::upstream::UpstreamApi;

pub use super::error::Error;

pub(crate) async fn reconcile<P: Provider>(
    cached: Arc<Cached>,
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
    md: Arc<Cached>,
    error: &Error,
    ctx: Arc<Context<P>>,
) -> Action {
    if matches!(error, Error::TermEnded) {
        tracing::debug!(name = %md.name_any(), "{error}");
        return Action::await_change();
    }
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
    // The provider serves the engine core resolved when the spec names none.
    let md = &*crate::engine_choice::with_resolved_engine(md);
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
    let live = prepared.live(ctx).await?;
    let pass = warmup::pass(
        md,
        ctx,
        &prepared.api,
        &prepared.warnings,
        &prepared.objects,
    )
    .await?;
    let gate = match pass {
        Pass::Held(action) => return Ok(action),
        Pass::KeepLive(gate) => {
            let live = prepared.live_view(&live);
            return report(md, ctx, &prepared, &live, Some(&gate)).await;
        }
        Pass::Apply(gate) => gate,
    };
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
        prune(md, ctx, &prepared.objects, &prepared.resources).await?;
    }
    if created {
        let message = format!(
            "Created {} '{}'",
            prepared.primary_kind(),
            prepared.objects[0].name_any()
        );
        ctx.event(md, EventType::Normal, reasons::RESOURCE_CREATED, &message)
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
    async fn live<P: Provider>(
        &self,
        ctx: &Context<P>,
    ) -> Result<Vec<Option<Arc<DynamicObject>>>, Error> {
        let mut out = Vec::with_capacity(self.objects.len());
        for (object, resource) in self.objects.iter().zip(&self.resources) {
            ctx.owned.synced(resource).await?;
            let ns = object.namespace().unwrap_or_default();
            out.push(ctx.owned.get(resource, &ns, &object.name_any()));
        }
        Ok(out)
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
    if let Err(incompatible) = fit::check(ctx.provider.as_ref(), md) {
        return terminal_status(Phase::Failed, reasons::INCOMPATIBLE, incompatible.0).await;
    }
    let upstream = ctx.upstream.borrow().clone();
    let api = match upstream {
        Some(Ok(api)) => api,
        Some(Err(reason)) => {
            return terminal_status(Phase::Failed, reasons::UPSTREAM_SCHEMA_MISMATCH, reason).await;
        }
        None => {
            let wanted = ctx.provider.upstream();
            let message = format!(
                "{}; waiting for it",
                crate::upstream::not_served_message(&wanted)
            );
            let reason = crate::upstream::not_served_reason(&wanted);
            return terminal_status(Phase::Pending, reason, message).await;
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
    // Nothing is applied unless the overrides are accepted and every field we set exists
    // in the installed schema.
    let objects = match render::finalize(ctx.provider.as_ref(), md, &api, rendered.objects) {
        Ok(objects) => objects,
        Err(unappliable) => {
            let (reason, message) = (unappliable.reason(), unappliable.to_string());
            ctx.event(md, EventType::Warning, reason, &message).await;
            return terminal_status(Phase::Failed, reason, message).await;
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
    ctx.event(md, EventType::Normal, "Recreating", &message)
        .await;
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
                ctx.event(md, EventType::Warning, "DriftDetected", &message)
                    .await;
            }
        }
        let target: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, resource);
        ctx.owned.writing(resource, &ns, &object.name_any());
        let result = if live[i].is_some() {
            target
                .patch(&object.name_any(), &pp, &Patch::Apply(object))
                .await
        } else {
            match first_write(md, &target, &pp, object).await? {
                FirstWrite::Done(result) => *result,
                FirstWrite::Foreign(owner) => {
                    ctx.owned
                        .write_failed(resource, &ns, &object.name_any(), &md.name_any());
                    let message = format!(
                        "{} '{}' already exists and is not owned by this ModelDeployment ({owner}); it is left alone: delete or rename it",
                        resource.kind,
                        object.name_any()
                    );
                    return conflict(md, ctx, &prepared.api, &message).await.map(Err);
                }
            }
        };
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

/// A resourceVersion no stored object has (etcd's first write is revision 2): applied
/// with it, server-side apply creates the object or fails with 409 Conflict.
const CREATE_ONLY: &str = "1";

/// How the first write of an object went.
enum FirstWrite {
    /// Applied (created, or ours and not yet in the cache), or failed.
    Done(Box<Result<DynamicObject, kube::Error>>),
    /// An object of that name exists and is not `md`'s: who owns it.
    Foreign(String),
}

/// The first write of an object this provider's caches do not hold. Server-side apply
/// with `force` would take over an object of the same name that is someone else's (a
/// ConfigMap of theirs with the name we render), so the apply only creates
/// ([`CREATE_ONLY`]); only when the name is taken is the object read, to tell one of
/// ours the cache has not seen yet from someone else's. One request per object created.
async fn first_write(
    md: &ModelDeployment,
    api: &Api<DynamicObject>,
    pp: &PatchParams,
    object: &DynamicObject,
) -> Result<FirstWrite, Error> {
    let name = object.name_any();
    let mut create = object.clone();
    create.metadata.resource_version = Some(CREATE_ONLY.to_string());
    match api.patch(&name, pp, &Patch::Apply(&create)).await {
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        done => return Ok(FirstWrite::Done(Box::new(done))),
    }
    if let Some(owner) = foreign_owner(md, api, &name).await? {
        return Ok(FirstWrite::Foreign(owner));
    }
    Ok(FirstWrite::Done(Box::new(
        api.patch(&name, pp, &Patch::Apply(object)).await,
    )))
}

/// Who owns the object named `name`, if it exists and `md` does not own it.
async fn foreign_owner(
    md: &ModelDeployment,
    api: &Api<DynamicObject>,
    name: &str,
) -> Result<Option<String>, Error> {
    let Some(existing) = api.get_opt(name).await? else {
        return Ok(None);
    };
    if render::owned_by(&existing, md) {
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

/// Phase 4: observe the upstream status and write ours (when it changed); when to look
/// again.
async fn report<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    prepared: &Prepared,
    live: &Live,
    gate: Option<&Gate>,
) -> Result<Action, Error> {
    let observed = ctx.provider.observe(md, live);
    let stale = stale_for(md, ctx, live, observed.phase);
    let (kind, name) = (
        prepared.primary_kind().to_string(),
        prepared.objects[0].name_any(),
    );
    let (compatible_reason, compatible) =
        compatibility(ctx.name(), &prepared.api, &prepared.warnings);
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
    let mut view = with_gate(view, gate, &prepared.objects);
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
    ctx.event(md, EventType::Warning, reason, message).await;
    let view = ProviderView::new(Phase::Failed, message)
        .condition(
            PROVIDER_COMPATIBLE,
            true,
            reasons::COMPATIBILITY_VERIFIED,
            compatible_message(ctx.name(), api),
        )
        .condition(RESOURCE_CREATED, false, reason, message)
        .condition(READY, false, reason, message);
    status::apply(ctx, md, &view).await?;
    Ok(Action::requeue(refusal_retry(md)))
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
        published &= ctx
            .event(md, EventType::Warning, reason, &messages.join("; "))
            .await;
    }
    // Marked published only when every event was written: a failed write is tried again
    // on the next reconcile of this generation.
    if published {
        ctx.memory.with(md, |r| r.warned = Some(generation));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::runtime::fixtures::md_with;
    use crate::runtime::testing::{context, failure, requests_of};

    fn paths(sent: Vec<(String, Value)>) -> Vec<String> {
        sent.into_iter().map(|(what, _)| what).collect()
    }

    /// A spec warning whose event the API server refused is published again on the next
    /// reconcile of the same generation; once written, it is not published again.
    #[tokio::test]
    async fn warnings_are_marked_published_only_once_their_event_is_written() {
        let (ctx, mut server) = context(Vec::new());
        let md = Arc::new(md_with(&json!({})));
        let warnings = Arc::new(vec![Warning::new(
            "UnsupportedField",
            "spec.x is ignored: not served",
        )]);
        let publish = || {
            let (ctx, md, warnings) = (ctx.clone(), md.clone(), warnings.clone());
            tokio::spawn(async move { publish_warnings(&md, &ctx, &warnings).await })
        };
        let event = "POST /apis/events.k8s.io/v1/namespaces/ns/events".to_string();

        let refused = paths(
            requests_of(&mut server, publish(), |_, _, body| {
                assert_eq!(body["reason"], "UnsupportedField");
                (500, failure(500, "InternalError"))
            })
            .await,
        );
        assert_eq!(refused, std::slice::from_ref(&event));
        let written =
            paths(requests_of(&mut server, publish(), |_, _, body| (201, body.clone())).await);
        assert_eq!(written, [event], "the refused event is published again");
        let again =
            paths(requests_of(&mut server, publish(), |_, _, body| (201, body.clone())).await);
        assert!(
            again.is_empty(),
            "a written warning is not published again for the same generation: {again:?}"
        );
    }
}
