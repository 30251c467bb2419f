//! One reconciliation of one ModelDeployment.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::Context;
use super::status::{self, ProviderView};
use crate::api::{ModelDeployment, Phase};
use crate::conditions::{PROVIDER_COMPATIBLE, READY, RESOURCE_CREATED, STALE_STATUS, reasons};
use crate::labels;
use crate::provider::{Provider, Warning};
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

/// How long to wait between polls while something is being deleted.
const DELETE_POLL: Duration = Duration::from_secs(2);
/// How often a deployment that is not Running is re-read.
const PROGRESS_POLL: Duration = Duration::from_secs(15);

pub(crate) async fn reconcile<P: Provider>(
    md: Arc<ModelDeployment>,
    ctx: Arc<Context<P>>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_once(&md, &ctx).await;
    ctx.metrics.observe(
        if result.is_ok() { "ok" } else { "error" },
        started.elapsed(),
    );
    if result.is_ok()
        && let Ok(mut failures) = ctx.failures.lock()
    {
        failures.remove(&ObjectRef::from(md.as_ref()));
    }
    result
}

#[allow(clippy::needless_pass_by_value)] // the signature kube's Controller::run asks for
pub(crate) fn error_policy<P: Provider>(
    md: Arc<ModelDeployment>,
    error: &Error,
    ctx: Arc<Context<P>>,
) -> Action {
    ctx.metrics.error("transient");
    let attempts = ctx.failures.lock().map_or(1, |mut f| {
        let n = f.entry(ObjectRef::from(md.as_ref())).or_insert(0);
        *n = n.saturating_add(1);
        *n
    });
    let delay = Duration::from_secs(2u64.saturating_pow(attempts.min(9)).min(300));
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
        return Ok(Action::await_change());
    }
    if labels::is_paused(md.metadata.annotations.as_ref()) {
        tracing::debug!(name = %md.name_any(), "paused");
        return Ok(Action::await_change());
    }
    if md.metadata.deletion_timestamp.is_some() {
        return cleanup(md, ctx).await;
    }
    ensure_finalizer(md, ctx).await?;

    if let Err(incompatible) = ctx.provider.check(md) {
        let view = terminal(Phase::Failed, reasons::INCOMPATIBLE, &incompatible.0);
        status::apply(ctx, md, &view).await?;
        return Ok(Action::await_change());
    }
    let crd = ctx.provider.upstream().crd_name();
    let upstream = ctx.upstream.borrow().clone();
    let api = match upstream {
        Some(Ok(api)) => api,
        Some(Err(reason)) => {
            status::apply(
                ctx,
                md,
                &terminal(Phase::Failed, reasons::UPSTREAM_SCHEMA_MISMATCH, &reason),
            )
            .await?;
            return Ok(Action::await_change());
        }
        None => {
            let message = format!("upstream CRD {crd} is not installed; waiting for it");
            status::apply(
                ctx,
                md,
                &terminal(Phase::Pending, reasons::UPSTREAM_CRD_MISSING, &message),
            )
            .await?;
            return Ok(Action::await_change());
        }
    };

    let rendered = match ctx.provider.render(md, &api) {
        Ok(r) => r,
        Err(e) => {
            status::apply(
                ctx,
                md,
                &terminal(Phase::Failed, reasons::INVALID_CONFIGURATION, &e.0),
            )
            .await?;
            return Ok(Action::await_change());
        }
    };
    publish_warnings(md, ctx, &rendered.warnings).await;
    let mut objects = rendered.objects;
    if objects.is_empty() {
        return Err(Error::Other(format!(
            "provider {} rendered no objects",
            ctx.name()
        )));
    }
    let primary_kind = kind_of(&objects[0]);
    for (i, object) in objects.iter_mut().enumerate() {
        let role = if i == 0 {
            render::Role::Primary {
                immutable_fields: ctx.provider.immutable_fields(&primary_kind),
            }
        } else {
            render::Role::Supporting
        };
        render::finish(object, md, ctx.name(), role);
    }

    // Nothing is applied unless every field we set exists in the installed schema.
    let mut missing = BTreeSet::new();
    for object in &objects {
        let value = serde_json::to_value(object).map_err(|e| Error::Other(e.to_string()))?;
        if api.is_upstream_object(&value) {
            missing.extend(api.missing_paths(&value));
        }
    }
    if !missing.is_empty() {
        let message = format!(
            "installed {crd} {} (schema {}) has no field {}; nothing was applied",
            api.version,
            api.schema_hash,
            missing.into_iter().collect::<Vec<_>>().join(", ")
        );
        event(
            ctx,
            md,
            EventType::Warning,
            reasons::UPSTREAM_SCHEMA_MISMATCH,
            &message,
        )
        .await;
        status::apply(
            ctx,
            md,
            &terminal(Phase::Failed, reasons::UPSTREAM_SCHEMA_MISMATCH, &message),
        )
        .await?;
        return Ok(Action::await_change());
    }

    let ns = md.namespace().unwrap_or_default();
    let primary = &objects[0];
    let primary_name = primary.name_any();
    let primary_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ns, &resource_of(primary, &api));
    let live = primary_api.get_opt(&primary_name).await?;
    if let Some(live) = &live {
        if live.metadata.deletion_timestamp.is_some() {
            let view = ProviderView::new(
                Phase::Deploying,
                format!("waiting for the previous {primary_kind} to be deleted"),
            )
            .condition(READY, false, reasons::DEPLOYMENT_PROGRESSING, "recreating");
            status::apply(ctx, md, &view).await?;
            return Ok(Action::requeue(DELETE_POLL));
        }
        if let Some(what) = recreate_reason(live, primary) {
            let message =
                format!("{what}: deleting {primary_kind} '{primary_name}' to create it anew");
            event(ctx, md, EventType::Normal, "Recreating", &message).await;
            match primary_api
                .delete(&primary_name, &DeleteParams::background())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            let view = ProviderView::new(Phase::Deploying, message).condition(
                READY,
                false,
                reasons::DEPLOYMENT_PROGRESSING,
                "recreating",
            );
            status::apply(ctx, md, &view).await?;
            return Ok(Action::requeue(DELETE_POLL));
        }
        let rendered = serde_json::to_value(primary).map_err(|e| Error::Other(e.to_string()))?;
        let live_value = serde_json::to_value(live).map_err(|e| Error::Other(e.to_string()))?;
        let drift = drifted_paths(&rendered, &live_value);
        if !drift.is_empty() {
            let message = format!(
                "{primary_kind} '{primary_name}' was modified directly ({}); restoring it from the ModelDeployment",
                drift.join(", ")
            );
            event(ctx, md, EventType::Warning, "DriftDetected", &message).await;
        }
    }

    // Supporting objects first, in the order rendered, the primary last: an upstream
    // webhook that checks what the primary refers to (KAITO's inference ConfigMap) must
    // find it.
    let pp = PatchParams::apply(&ctx.field_manager()).force();
    let mut applied = None;
    let order = (1..objects.len()).chain(std::iter::once(0));
    for i in order {
        let object = &objects[i];
        let target: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &ns, &resource_of(object, &api));
        match target
            .patch(&object.name_any(), &pp, &Patch::Apply(object))
            .await
        {
            Ok(result) if i == 0 => applied = Some(result),
            Ok(_) => {}
            Err(kube::Error::Api(s)) if is_refusal(s.code) => {
                let message = format!(
                    "the API server refused {} '{}': {}",
                    kind_of(object),
                    object.name_any(),
                    s.message
                );
                return refused(md, ctx, &api, &message).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    // The rendered set changes only with the spec (or the provider's flags): prune what
    // the ModelDeployment owns and no longer renders, e.g. the Workspace left behind when
    // more replicas move it to an InferenceSet.
    let status_generation = md.status.as_ref().and_then(|s| s.observed_generation);
    if status_generation != md.metadata.generation {
        prune(md, ctx, &objects, &api).await?;
    }
    if live.is_none() {
        event(
            ctx,
            md,
            EventType::Normal,
            reasons::RESOURCE_CREATED,
            &format!("Created {primary_kind} '{primary_name}'"),
        )
        .await;
    }

    let observed = ctx.provider.observe(md, applied.as_ref());
    let stale = stale_for(md, ctx, applied.as_ref(), observed.phase);
    let (compatible_reason, compatible) = compatibility(ctx, &api, &rendered.warnings);
    let mut view = ProviderView::new(observed.phase, observed.message.clone())
        .condition(PROVIDER_COMPATIBLE, true, compatible_reason, compatible)
        .condition(
            RESOURCE_CREATED,
            true,
            reasons::RESOURCE_CREATED,
            format!("{primary_kind} '{primary_name}' is applied"),
        )
        .condition(
            READY,
            observed.ready,
            &observed.reason,
            observed.message.clone(),
        );
    view.resource = Some((primary_name, primary_kind.clone()));
    view.endpoint = observed.endpoint;
    view.replicas = observed.replicas;
    let stale_after = ctx.options.stale_after();
    let requeue = match stale {
        _ if observed.phase == Phase::Running => {
            Duration::from_secs(ctx.options.resync_seconds.max(1))
        }
        Some(still) if still >= stale_after => {
            let message = format!(
                "the {primary_kind} status has not changed for {}s while the deployment is {}; is its operator running?",
                still.as_secs(),
                observed.phase
            );
            view = view.condition(STALE_STATUS, true, reasons::STATUS_NOT_UPDATED, message);
            PROGRESS_POLL
        }
        Some(still) => {
            PROGRESS_POLL.min(stale_after.saturating_sub(still) + Duration::from_millis(100))
        }
        None => PROGRESS_POLL,
    };
    status::apply(ctx, md, &view).await?;
    Ok(Action::requeue(requeue))
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
fn compatibility<P: Provider>(
    ctx: &Context<P>,
    api: &UpstreamApi,
    warnings: &[Warning],
) -> (&'static str, String) {
    let ignored: Vec<&str> = warnings
        .iter()
        .filter_map(|w| w.ignored_field.as_deref())
        .collect();
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
fn is_refusal(code: u16) -> bool {
    [400, 403, 404, 422].contains(&code)
}

/// How long to wait before applying a refused object again, when the spec has not
/// changed: a webhook's verdict can depend on other objects (a Secret, a ConfigMap) that
/// may appear. From 30 s, doubling with the time the refusal has stood, up to 5 min.
const REFUSAL_RETRY_MIN: Duration = Duration::from_secs(30);
const REFUSAL_RETRY_MAX: Duration = Duration::from_secs(300);

fn refusal_retry(md: &ModelDeployment) -> Duration {
    let conditions = md
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let since = crate::conditions::find(conditions, RESOURCE_CREATED)
        .filter(|c| c.reason == reasons::RESOURCE_REJECTED)
        .and_then(|c| {
            Duration::try_from(Timestamp::now().duration_since(c.last_transition_time.0)).ok()
        })
        .unwrap_or_default();
    since.clamp(REFUSAL_RETRY_MIN, REFUSAL_RETRY_MAX)
}

/// An object was refused: `Failed` with the server's own words (which name the webhook and
/// its reason), a warning event, and a retry after [`refusal_retry`] or on the next change.
async fn refused<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    api: &UpstreamApi,
    message: &str,
) -> Result<Action, Error> {
    event(
        ctx,
        md,
        EventType::Warning,
        reasons::RESOURCE_REJECTED,
        message,
    )
    .await;
    let view = ProviderView::new(Phase::Failed, message)
        .condition(
            PROVIDER_COMPATIBLE,
            true,
            reasons::COMPATIBILITY_VERIFIED,
            compatible_message(ctx, api),
        )
        .condition(RESOURCE_CREATED, false, reasons::RESOURCE_REJECTED, message)
        .condition(READY, false, reasons::RESOURCE_REJECTED, message);
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

fn kind_of(object: &DynamicObject) -> String {
    object
        .types
        .as_ref()
        .map(|t| t.kind.clone())
        .unwrap_or_default()
}

/// The API resource of a rendered object: the detected upstream one, or derived from its
/// `apiVersion` and `kind` for other kinds (ConfigMaps and the like).
fn resource_of(object: &DynamicObject, upstream: &UpstreamApi) -> ApiResource {
    let types = object.types.clone().unwrap_or_default();
    let (group, version) = types
        .api_version
        .rsplit_once('/')
        .unwrap_or(("", types.api_version.as_str()));
    if group == upstream.group && version == upstream.version && types.kind == upstream.kind {
        return upstream.api_resource();
    }
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind))
}

/// Paths whose live value differs from what we render (metadata and status aside).
fn drifted_paths(rendered: &Value, live: &Value) -> Vec<String> {
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

/// How long the upstream status has stood still, when it matters (not Running).
fn stale_for<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    live: Option<&DynamicObject>,
    phase: Phase,
) -> Option<Duration> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    live.and_then(|l| l.data.get("status"))
        .map(Value::to_string)
        .unwrap_or_default()
        .hash(&mut hasher);
    let fingerprint = hasher.finish();
    let mut seen = ctx.upstream_seen.lock().ok()?;
    let entry = seen
        .entry(ObjectRef::from(md))
        .or_insert((fingerprint, Instant::now()));
    if entry.0 != fingerprint {
        *entry = (fingerprint, Instant::now());
    }
    (phase != Phase::Running).then(|| entry.1.elapsed())
}

async fn publish_warnings<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    warnings: &[Warning],
) {
    let generation = md.metadata.generation.unwrap_or_default();
    let key = ObjectRef::from(md);
    let already = ctx.warned.lock().ok().and_then(|w| w.get(&key).copied()) == Some(generation);
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
    for (reason, messages) in by_reason {
        event(ctx, md, EventType::Warning, reason, &messages.join("; ")).await;
    }
    if let Ok(mut warned) = ctx.warned.lock() {
        warned.insert(key, generation);
    }
}

/// Publish an event about `md`; failures are logged, never fatal.
pub(crate) async fn event<P: Provider>(
    ctx: &Context<P>,
    md: &ModelDeployment,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let ev = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.chars().take(1024).collect()),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &md.object_ref(&())).await {
        tracing::debug!(error = %e, reason, "could not publish event");
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

/// Deletion: delete our upstream objects, wait until they are gone, then release the
/// ModelDeployment; give up after the finalizer timeout.
async fn cleanup<P: Provider>(md: &ModelDeployment, ctx: &Context<P>) -> Result<Action, Error> {
    let finalizer = ctx.finalizer();
    if !md.finalizers().contains(&finalizer) {
        return Ok(Action::await_change());
    }
    let _ = status::apply(
        ctx,
        md,
        &ProviderView::new(Phase::Terminating, "deleting the provider's resources"),
    )
    .await;
    let remaining = delete_upstream_objects(md, ctx).await?;
    let release = |md: &ModelDeployment| {
        md.finalizers()
            .iter()
            .filter(|f| **f != finalizer)
            .cloned()
            .collect::<Vec<_>>()
    };
    if remaining.is_empty() {
        set_finalizers(md, ctx, release(md)).await?;
        return Ok(Action::await_change());
    }
    let deleting_since = md
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    let waited =
        Duration::try_from(Timestamp::now().duration_since(deleting_since)).unwrap_or_default();
    let timeout = ctx.options.finalizer_timeout();
    if waited >= timeout {
        let message = format!(
            "Finalizer removed after {}s, provider resource may be orphaned: {}",
            timeout.as_secs(),
            remaining.join(", ")
        );
        event(ctx, md, EventType::Warning, "FinalizerTimeout", &message).await;
        set_finalizers(md, ctx, release(md)).await?;
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(
        DELETE_POLL.min(timeout.saturating_sub(waited)),
    ))
}

/// The kinds `md`'s objects may have: the upstream kind and the kinds in `rendered`
/// (`true`: must be listable), then the provider's [`Provider::owned_kinds`] (`false`:
/// optional, skipped when the cluster does not serve them), without duplicates.
fn candidate_kinds<P: Provider>(
    ctx: &Context<P>,
    api: &UpstreamApi,
    rendered: &[DynamicObject],
) -> Vec<(ApiResource, bool)> {
    let mut kinds = vec![(api.api_resource(), true)];
    kinds.extend(rendered.iter().map(|o| (resource_of(o, api), true)));
    kinds.extend(ctx.provider.owned_kinds().into_iter().map(|k| (k, false)));
    let mut seen = BTreeSet::new();
    kinds.retain(|(k, _)| seen.insert((k.api_version.clone(), k.kind.clone())));
    kinds
}

/// Objects of `kinds` in `md`'s namespace that carry our labels for `md` and that `md`
/// owns (by UID). Kinds whose API is not served are skipped, and so are optional kinds
/// that cannot be listed (logged).
async fn owned_objects<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    kinds: &[(ApiResource, bool)],
) -> Result<Vec<(ApiResource, String)>, Error> {
    let ns = md.namespace().unwrap_or_default();
    let selector = format!(
        "{}={},{}={}",
        labels::MODEL_DEPLOYMENT,
        md.name_any(),
        labels::PROVIDER,
        ctx.name()
    );
    let uid = md.uid();
    let mut owned = Vec::new();
    for (kind, required) in kinds {
        let objects: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, kind);
        let list = match objects.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => list,
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) if !required => {
                tracing::debug!(kind = %kind.kind, error = %e, "cannot list an optional owned kind");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        owned.extend(
            list.items
                .iter()
                .filter(|o| {
                    o.owner_references()
                        .iter()
                        .any(|r| Some(&r.uid) == uid.as_ref())
                })
                .map(|o| (kind.clone(), o.name_any())),
        );
    }
    Ok(owned)
}

/// Delete the objects `md` owns that are not among `rendered`.
async fn prune<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
    rendered: &[DynamicObject],
    api: &UpstreamApi,
) -> Result<(), Error> {
    let wanted: BTreeSet<(String, String, String)> = rendered
        .iter()
        .map(|o| {
            let r = resource_of(o, api);
            (r.api_version, r.kind, o.name_any())
        })
        .collect();
    let ns = md.namespace().unwrap_or_default();
    for (resource, name) in owned_objects(md, ctx, &candidate_kinds(ctx, api, rendered)).await? {
        if wanted.contains(&(
            resource.api_version.clone(),
            resource.kind.clone(),
            name.clone(),
        )) {
            continue;
        }
        let objects: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &resource);
        match objects.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {
                let message = format!(
                    "Deleted {} '{name}': the ModelDeployment no longer needs it",
                    resource.kind
                );
                event(ctx, md, EventType::Normal, "Pruned", &message).await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Ask for the deletion of every upstream object this provider made for `md`; return
/// those that still exist (`Kind/name`).
async fn delete_upstream_objects<P: Provider>(
    md: &ModelDeployment,
    ctx: &Context<P>,
) -> Result<Vec<String>, Error> {
    let Some(Ok(api)) = ctx.upstream.borrow().clone() else {
        return Ok(Vec::new()); // no upstream CRD: nothing of ours can exist
    };
    let ns = md.namespace().unwrap_or_default();
    let mut targets: Vec<(ApiResource, String)> = Vec::new();
    let rendered = ctx
        .provider
        .render(md, &api)
        .map(|r| r.objects)
        .unwrap_or_default();
    targets.extend(
        rendered
            .iter()
            .map(|o| (resource_of(o, &api), o.name_any())),
    );
    targets.extend(owned_objects(md, ctx, &candidate_kinds(ctx, &api, &rendered)).await?);
    targets.sort_by(|a, b| {
        (&a.0.api_version, &a.0.kind, &a.1).cmp(&(&b.0.api_version, &b.0.kind, &b.1))
    });
    targets.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);

    let uid = md.uid();
    let mut remaining = Vec::new();
    for (resource, name) in targets {
        let objects: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &resource);
        let live = match objects.get_opt(&name).await {
            Ok(live) => live,
            Err(kube::Error::Api(s)) if s.code == 404 => None,
            Err(e) => return Err(e.into()),
        };
        let Some(live) = live else { continue };
        let ours = live
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == uid.as_ref());
        if !ours {
            continue; // never delete what another owner made under the same name
        }
        if live.metadata.deletion_timestamp.is_none() {
            match objects.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        if objects.get_opt(&name).await?.is_some() {
            remaining.push(format!("{}/{name}", resource.kind));
        }
    }
    Ok(remaining)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_a_changed_value_we_set() {
        let rendered = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a"},
                              "spec": {"replicas": 2, "containers": [{"name": "c", "args": ["--a"]}]}});
        let same_plus_defaults = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a", "uid": "x"},
                                        "spec": {"replicas": 2.0, "extra": true, "containers": [{"name": "c", "args": ["--a"], "image": "i"}]},
                                        "status": {"ready": true}});
        assert!(drifted_paths(&rendered, &same_plus_defaults).is_empty());
        let edited = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a"},
                            "spec": {"replicas": 5, "containers": [{"name": "c", "args": ["--b"]}]}});
        assert_eq!(
            drifted_paths(&rendered, &edited),
            ["spec.containers[0].args[0]", "spec.replicas"]
        );
        let removed = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a"}, "spec": {"replicas": 2}});
        assert_eq!(drifted_paths(&rendered, &removed), ["spec.containers"]);
    }
}
