//! The ModelDeployment reconciler: pause, re-validation, provider
//! selection, and core's own status fields, applied by server-side apply under
//! [`FIELD_MANAGER`](crate::FIELD_MANAGER).
//!
//! Core owns `status.provider.name`, `status.provider.selectedReason`, `status.engine`
//! (the engine of the spec, or the one core chose: [`engine_choice::choose_engine`]), the
//! conditions `Validated`, `EngineSelected` and `ProviderSelected`, and `status.phase`/`message` only
//! while no provider is selected. Every apply carries the whole set of fields core still
//! owns; a field left out is released (and removed unless another manager owns it), which
//! is how core gives the phase up once a provider is selected.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use kubeairunway_sdk::api::EngineType;
use kubeairunway_sdk::compact::Compact;
use kubeairunway_sdk::conditions::{self, ENGINE_SELECTED, PROVIDER_SELECTED, VALIDATED, reasons};
use kubeairunway_sdk::events::{Event, EventType};
use kubeairunway_sdk::{API_VERSION, InferenceProviderConfig, ModelDeployment, labels, reflect};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::FIELD_MANAGER;
use crate::metrics::Metrics;
use crate::selection::{self, Outcome, RuleCache};
use crate::validation::{self, validate};
use kubeairunway_sdk::engine_choice::{self, EngineChoice};

pub use crate::context::{Context, Error, Settings};
use crate::gone::{release_gone_providers, release_unserved};
use crate::rules::report_rule_errors;
pub use crate::rules::{INVALID_SELECTION_RULE, SELECTION_RULE_FAILED, SELECTION_RULES_VALID};
/// `selectedReason` of a provider named in `spec.provider.name`: the SDK's, so that
/// `kubeairunway_sdk::testing::select` writes what core writes.
pub use kubeairunway_sdk::selection::EXPLICIT_REASON;
/// Message while the built-in selector is off and nobody has selected yet.
pub const AWAITING_SELECTOR_MESSAGE: &str = "No provider specified and provider-selector not installed: a custom selector must set status.provider.name";

/// Keep only what core reads of a cached ModelDeployment's `managedFields`: of its own
/// entry, the status fields it owns ([`owned_status`]: top-level names, condition keys,
/// `provider.name` for [`core_owns_selection`]) with nothing below them; drop the
/// last-applied annotation. A field set as a JSON tree costs kilobytes per ModelDeployment
/// (a B-tree node per object that has a field), held for every ModelDeployment.
fn strip(md: &mut ModelDeployment) {
    if let Some(fields) = md.metadata.managed_fields.as_mut() {
        fields.retain(|f| f.manager.as_deref() == Some(FIELD_MANAGER));
        for entry in fields.iter_mut() {
            if let Some(f) = entry.fields_v1.as_mut() {
                f.0 = owned_status_outline(&f.0);
            }
        }
    }
    if let Some(a) = md.metadata.annotations.as_mut() {
        a.remove(reflect::LAST_APPLIED);
    }
}

/// A ModelDeployment as core caches it: metadata parsed, the rest as JSON text, parsed
/// when a reconcile reads it (`kubeairunway_sdk::compact`).
pub type Cached = Compact<ModelDeployment>;

/// The outline of a field set that [`owned_status`] and [`core_owns_selection`] read:
/// `f:status` with its fields, the keys of `f:conditions` and `f:name` of `f:provider`,
/// each with nothing below (an empty JSON object allocates nothing).
fn owned_status_outline(fields: &Value) -> Value {
    let Some(status) = fields.get("f:status").and_then(Value::as_object) else {
        return Value::Object(serde_json::Map::new());
    };
    let empty = || Value::Object(serde_json::Map::new());
    let outline: serde_json::Map<String, Value> = status
        .iter()
        .map(|(key, below)| {
            let kept = match key.as_str() {
                "f:conditions" => below
                    .as_object()
                    .map(|items| items.keys().map(|k| (k.clone(), empty())).collect())
                    .map_or_else(empty, Value::Object),
                "f:provider" if below.get("f:name").is_some() => json!({"f:name": {}}),
                _ => empty(),
            };
            (key.clone(), kept)
        })
        .collect();
    json!({ "f:status": outline })
}

/// What, of a ModelDeployment, can change core's decision: the spec (generation), its
/// deletion, labels and annotations (CEL sees them; pause), finalizers, and the selected
/// provider. A provider's status write changes none of it and wakes no reconcile.
#[allow(clippy::unnecessary_wraps)] // the signature kube's predicate filter asks for
fn relevant(md: &Cached) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let meta = md.meta();
    meta.generation.hash(&mut h);
    meta.deletion_timestamp.is_some().hash(&mut h);
    meta.labels.hash(&mut h);
    let (annotations, selected_provider) = md.annotations_and_selected_provider();
    annotations.hash(&mut h);
    meta.finalizers.hash(&mut h);
    selected_provider.hash(&mut h);
    meta.uid.hash(&mut h);
    Some(h.finish())
}

/// A cache of every InferenceProviderConfig and the future that keeps it current.
pub fn provider_cache(
    client: Client,
) -> (
    reflect::Cache<InferenceProviderConfig>,
    impl std::future::Future<Output = ()> + Send,
) {
    let (cache, stream) = reflect::cache(
        Api::all(client),
        watcher::Config::default(),
        (),
        reflect::strip,
    );
    (cache, reflect::drive("InferenceProviderConfig", stream))
}

/// Whether core's field manager owns `status.provider.name` (core selected the provider,
/// not a custom selector).
pub fn core_owns_selection(md: &ModelDeployment) -> bool {
    md.metadata.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() == Some(FIELD_MANAGER)
            && m.fields_v1.as_ref().is_some_and(|f| {
                f.0.get("f:status")
                    .and_then(|s| s.get("f:provider"))
                    .and_then(|p| p.get("f:name"))
                    .is_some()
            })
    })
}

fn condition_of<'a>(md: &'a ModelDeployment, type_: &str) -> Option<&'a Condition> {
    md.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, type_))
}

/// Core's status for one ModelDeployment, before it is applied.
#[derive(Debug, Default)]
pub(crate) struct Desired {
    phase_message: Option<String>,
    provider: Option<(String, String)>,
    /// `status.engine`: the engine and its `selectedReason`.
    engine: Option<(EngineType, String)>,
    conditions: Vec<Condition>,
    newly_selected: bool,
    requeue: Option<Duration>,
}

/// The watch cache of every ModelDeployment core and its gateway read (compact: one object
/// per ModelDeployment of the cluster), shared so that one watch feeds both, and the
/// stream that fills it (hand it to [`run`]).
pub fn model_deployments(
    client: &Client,
    namespace: Option<&str>,
) -> (
    reflect::Shared<Cached>,
    impl futures::Stream<Item = reflect::Events<Cached>> + Send + 'static,
) {
    let mds: Api<ModelDeployment> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (cache, stream) =
        reflect::compact_cache(mds, watcher::Config::default().any_semantic(), (), strip);
    // The gateway may fall this far behind a burst before it re-reads the whole cache.
    reflect::share(cache, stream, 4096)
}

/// Run the reconciler over `mds` (driving `events`, both from [`model_deployments`]) until
/// `shutdown` completes; `synced` is set once the cache is.
#[allow(clippy::too_many_arguments)] // the parts of one term, each from its own place
pub async fn run(
    client: Client,
    mds: reflect::Shared<Cached>,
    events: impl futures::Stream<Item = reflect::Events<Cached>> + Send + 'static,
    providers: Store<InferenceProviderConfig>,
    settings: Settings,
    metrics: Arc<Metrics>,
    synced: kubeairunway_sdk::process::Check,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ipcs: Api<InferenceProviderConfig> = Api::all(client.clone());
    let (mds, stream) = (mds.cache().clone(), events);
    let md_store = mds.store.clone();
    let stream = stream
        .applied_objects()
        .predicate_filter(relevant, kube::runtime::PredicateConfig::default());
    let controller = Controller::for_stream(stream, md_store.clone())
        .with_config(kubeairunway_sdk::process::controller_config());
    metrics.set_store(Some(md_store.clone()));
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    // A term that ends before the cache synced ends here (kube's graceful shutdown alone
    // would wait for the store forever: see `reflect::ended_unsynced`).
    let unsynced_end = {
        let (mds, shutdown) = (mds.clone(), shutdown.clone());
        async move { reflect::ended_unsynced(&mds, shutdown).await }
    };
    tokio::spawn(async move {
        if mds.synced().await {
            synced.set();
        }
    });
    let waiting = md_store.clone();
    let ctx = Arc::new(Context::new(
        client,
        providers,
        settings,
        Arc::clone(&metrics),
    ));
    let controller = controller
        // A provider registering or changing may unblock deployments that wait, and a
        // provider that is gone may hold deleted ones.
        .watches(ipcs, watcher::Config::default(), move |_ipc| {
            waiting
                .state()
                .into_iter()
                .filter(|md| {
                    md.meta().deletion_timestamp.is_some() || md.selected_provider().is_none()
                })
                .map(|md| ObjectRef::from_obj(md.as_ref()))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(name = %obj.name, namespace = ?obj.namespace, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile failed"),
            }
        });
    tokio::select! {
        () = controller => {}
        () = unsynced_end => {
            tracing::info!("the term ended before the ModelDeployment cache synced; its controller is dropped");
        }
    }
    metrics.set_store(None);
}

#[allow(clippy::needless_pass_by_value)] // the signature kube-runtime wants
fn error_policy(md: Arc<Cached>, error: &Error, ctx: Arc<Context>) -> Action {
    let provider = md.selected_provider();
    ctx.metrics
        .count_error(provider.as_deref().unwrap_or("none"), error.kind());
    let attempts = ctx.failures.lock().map_or(1, |mut f| {
        let mut key = ObjectRef::new(&md.name_any());
        key.namespace = md.namespace();
        let n = f.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    });
    let delay = kubeairunway_sdk::process::backoff(attempts);
    warn!(name = %md.name_any(), namespace = ?md.namespace(), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Reconcile one ModelDeployment.
pub async fn reconcile(cached: Arc<Cached>, ctx: Arc<Context>) -> Result<Action, Error> {
    let start = Instant::now();
    let md = Arc::new(cached.object()?);
    let result = reconcile_inner(&md, &ctx).await;
    if result.is_ok()
        && let Ok(mut failures) = ctx.failures.lock()
    {
        failures.remove(&ObjectRef::from_obj(md.as_ref()));
    }
    let provider = md.selected_provider().unwrap_or("none").to_string();
    ctx.metrics
        .observe_reconcile(&provider, start.elapsed().as_secs_f64());
    result
}

async fn reconcile_inner(md: &Arc<ModelDeployment>, ctx: &Arc<Context>) -> Result<Action, Error> {
    if labels::is_paused(md.metadata.annotations.as_ref()) {
        debug!(name = %md.name_any(), "paused");
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    if md.metadata.deletion_timestamp.is_some() {
        return release_gone_providers(md, ctx, now).await;
    }
    let configs = ctx.providers.state();
    let names: Vec<String> = configs.iter().map(|c| c.name_any()).collect();
    ctx.rules.retain(&names);
    // CEL evaluation runs on the blocking pool, never on the threads that serve the
    // webhooks and renew the Lease (each rule is bounded too: `selection::budget`).
    let (desired, rules) = {
        let (md, ctx, configs) = (Arc::clone(md), Arc::clone(ctx), configs.clone());
        tokio::task::spawn_blocking(move || decide(&md, &configs, &ctx.rules, &ctx.settings, now))
            .await
            .map_err(|e| Error::Decide(e.to_string()))?
    };
    if let Some(sel) = rules {
        report_rule_errors(ctx, &configs, &sel.rule_errors, &sel.clean_providers, now).await;
    }
    // Selected now: the finalizer written at admission for another provider holds nothing.
    if let Some((selecting, _)) = &desired.provider
        && !release_unserved(md, ctx, Some(selecting)).await?
    {
        return Ok(Action::await_change());
    }
    let body = status_body(md, &desired);
    if !is_current(md, &body) {
        apply_status(md, ctx, &body).await?;
    }
    publish_events(md, ctx, &desired).await;
    Ok(desired
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}

fn cond(
    md: &ModelDeployment,
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    now: Timestamp,
) -> Condition {
    conditions::new(
        condition_of(md, type_),
        type_,
        ok,
        reason,
        message,
        md.metadata.generation,
        now,
    )
}

/// Core's decision for `md`, a pure function of the ModelDeployment, the registered
/// providers and the settings: the status core wants, and (when the built-in selector
/// ran) what it found about each provider's selection rules.
pub(crate) fn decide(
    md: &ModelDeployment,
    configs: &[Arc<InferenceProviderConfig>],
    rules: &RuleCache,
    settings: &Settings,
    now: Timestamp,
) -> (Desired, Option<selection::Selection>) {
    let mut d = Desired::default();
    let v = validate(&md.spec);
    d.conditions.push(validated_condition(md, &v, now));

    let selected = md.selected_provider().map(str::to_string);
    let owns = core_owns_selection(md);
    let explicit = md.spec.provider_name().map(str::to_string);
    let explicit_change = explicit
        .as_ref()
        .is_some_and(|e| selected.as_ref() != Some(e) && (selected.is_none() || owns));

    if let Some(name) = selected.filter(|_| !explicit_change) {
        // Explicit, or kept from status.engine: no rule is evaluated.
        let choice = engine_choice::choose_engine(md, configs, rules, &settings.selection, now);
        record_engine(md, &choice, &mut d, now);
        keep_selection(md, name, owns, &mut d, now);
        return (d, None);
    }
    if !v.is_valid() {
        d.phase_message = Some(format!("Validation failed: {}", v.message()));
        return (d, None);
    }
    let choice = engine_choice::choose_engine(md, configs, rules, &settings.selection, now);
    record_engine(md, &choice, &mut d, now);
    let Some(engine) = choice.engine() else {
        d.phase_message = Some(choice.reason().to_string());
        d.requeue = Some(settings.pending_requeue);
        return (d, None);
    };
    // Provider selection, and its rules, see the resolved engine as `spec.engine.type`.
    let resolved = engine_choice::with_engine(md, engine);
    let md = &resolved;
    if let Some(name) = explicit {
        select_explicit(md, name, configs, settings, &mut d, now);
        return (d, None);
    }
    if !settings.enable_provider_selector {
        d.conditions.push(cond(
            md,
            PROVIDER_SELECTED,
            false,
            reasons::AWAITING_SELECTOR,
            AWAITING_SELECTOR_MESSAGE,
            now,
        ));
        d.phase_message = Some(AWAITING_SELECTOR_MESSAGE.to_string());
        return (d, None);
    }
    let sel = selection::select(md, configs, rules, &settings.selection, now);
    select_automatic(md, &sel.outcome, settings, &mut d, now);
    (d, Some(sel))
}

/// `EngineSelected` and `status.engine`, from the engine choice.
fn record_engine(md: &ModelDeployment, choice: &EngineChoice, d: &mut Desired, now: Timestamp) {
    let (ok, reason) = match choice {
        EngineChoice::Explicit(_) => (true, reasons::EXPLICIT),
        EngineChoice::Kept { .. } | EngineChoice::Auto { .. } => (true, reasons::AUTO_SELECTED),
        EngineChoice::NoneFits { .. } => (false, reasons::NO_ENGINE),
    };
    d.conditions
        .push(cond(md, ENGINE_SELECTED, ok, reason, choice.reason(), now));
    d.engine = choice.engine().map(|e| (e, choice.reason().to_string()));
}

/// `Validated`, from the spec validation.
fn validated_condition(
    md: &ModelDeployment,
    v: &validation::Validation,
    now: Timestamp,
) -> Condition {
    if v.is_valid() {
        cond(
            md,
            VALIDATED,
            true,
            reasons::VALIDATION_PASSED,
            "Spec validation passed",
            now,
        )
    } else {
        cond(
            md,
            VALIDATED,
            false,
            reasons::VALIDATION_FAILED,
            v.message(),
            now,
        )
    }
}

/// Selection is made once: keep `name`. When core made it, re-apply what core owns so
/// server-side apply keeps it; the phase is given up (a provider owns it now).
fn keep_selection(md: &ModelDeployment, name: String, owns: bool, d: &mut Desired, now: Timestamp) {
    if !owns {
        return;
    }
    let reason = md
        .status
        .as_ref()
        .and_then(|s| s.provider.as_ref())
        .and_then(|p| p.selected_reason.clone())
        .unwrap_or_default();
    let kind = if reason == EXPLICIT_REASON {
        reasons::EXPLICIT
    } else {
        reasons::AUTO_SELECTED
    };
    d.conditions
        .push(cond(md, PROVIDER_SELECTED, true, kind, reason.clone(), now));
    d.provider = Some((name, reason));
}

/// `spec.provider.name` names the provider: selected when it is registered and serves.
fn select_explicit(
    md: &ModelDeployment,
    name: String,
    configs: &[Arc<InferenceProviderConfig>],
    settings: &Settings,
    d: &mut Desired,
    now: Timestamp,
) {
    let serves = configs
        .iter()
        .find(|c| c.name_any() == name)
        .map(|c| c.spec.serves());
    let (reason, message) = match serves {
        Some(true) => {
            d.conditions.push(cond(
                md,
                PROVIDER_SELECTED,
                true,
                reasons::EXPLICIT,
                EXPLICIT_REASON,
                now,
            ));
            d.provider = Some((name, EXPLICIT_REASON.to_string()));
            d.newly_selected = true;
            return;
        }
        Some(false) => (
            reasons::PROVIDER_DOES_NOT_SERVE,
            validation::provider_does_not_serve(&name),
        ),
        None => (
            reasons::PROVIDER_NOT_INSTALLED,
            validation::provider_not_installed(&name),
        ),
    };
    d.conditions.push(cond(
        md,
        PROVIDER_SELECTED,
        false,
        reason,
        message.clone(),
        now,
    ));
    d.phase_message = Some(message);
    d.requeue = Some(settings.pending_requeue);
}

/// The built-in CEL selector's outcome as conditions, phase message and requeue.
fn select_automatic(
    md: &ModelDeployment,
    outcome: &Outcome,
    settings: &Settings,
    d: &mut Desired,
    now: Timestamp,
) {
    let (reason, message, phase_message) = match outcome {
        Outcome::Selected {
            provider, reason, ..
        } => {
            d.conditions.push(cond(
                md,
                PROVIDER_SELECTED,
                true,
                reasons::AUTO_SELECTED,
                reason.clone(),
                now,
            ));
            d.provider = Some((provider.clone(), reason.clone()));
            d.newly_selected = true;
            return;
        }
        Outcome::NoHealthyProviders { detail } => (
            reasons::NO_HEALTHY_PROVIDERS,
            format!("{}: {detail}", selection::NO_HEALTHY_PROVIDERS),
            selection::NO_HEALTHY_PROVIDERS.to_string(),
        ),
        Outcome::NoneFits { message } => (reasons::NO_PROVIDER, message.clone(), message.clone()),
    };
    d.conditions
        .push(cond(md, PROVIDER_SELECTED, false, reason, message, now));
    d.phase_message = Some(phase_message);
    d.requeue = Some(settings.pending_requeue);
}

/// The status object core applies.
fn status_body(md: &ModelDeployment, d: &Desired) -> Value {
    let mut status = serde_json::Map::new();
    if let Some(message) = &d.phase_message {
        status.insert("phase".into(), json!("Pending"));
        status.insert("message".into(), json!(message));
    }
    if let Some((name, reason)) = &d.provider {
        status.insert(
            "provider".into(),
            json!({"name": name, "selectedReason": reason}),
        );
    }
    if let Some((engine, reason)) = &d.engine {
        status.insert(
            "engine".into(),
            json!({"type": engine, "selectedReason": reason}),
        );
    }
    status.insert(
        "conditions".into(),
        serde_json::to_value(&d.conditions).unwrap_or_default(),
    );
    json!({
        "apiVersion": API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": md.name_any(), "namespace": md.namespace()},
        "status": status,
    })
}

/// The top-level status fields core owns now (from its own `managedFields` entry), and
/// the condition types among them.
fn owned_status(md: &ModelDeployment) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut fields = BTreeSet::new();
    let mut conditions = BTreeSet::new();
    let entries = md.metadata.managed_fields.iter().flatten();
    for entry in entries.filter(|m| m.manager.as_deref() == Some(FIELD_MANAGER)) {
        let Some(status) = entry
            .fields_v1
            .as_ref()
            .and_then(|f| f.0.get("f:status"))
            .and_then(Value::as_object)
        else {
            continue;
        };
        for (key, value) in status {
            let Some(field) = key.strip_prefix("f:") else {
                continue;
            };
            fields.insert(field.to_string());
            if field == "conditions" {
                for item in value.as_object().into_iter().flatten().map(|(k, _)| k) {
                    if let Some(t) = item
                        .strip_prefix("k:")
                        .and_then(|k| serde_json::from_str::<Value>(k).ok())
                        .and_then(|k| k.get("type").and_then(Value::as_str).map(str::to_string))
                    {
                        conditions.insert(t);
                    }
                }
            }
        }
    }
    (fields, conditions)
}

/// Whether every value in `want` is in `have` (objects compared key by key).
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| contains(hv, v))),
        _ => have == want,
    }
}

/// Whether `md` already shows core's status `body` and core owns exactly its fields (so
/// applying it would change nothing): then no write is made.
fn is_current(md: &ModelDeployment, body: &Value) -> bool {
    let want = body.get("status").and_then(Value::as_object);
    let have = md
        .status
        .as_ref()
        .and_then(|s| serde_json::to_value(s).ok());
    let (Some(want), Some(have)) = (want, have) else {
        return false;
    };
    let (owned, owned_conditions) = owned_status(md);
    if owned != want.keys().cloned().collect::<BTreeSet<_>>() {
        return false;
    }
    let wanted_conditions = want
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let types: BTreeSet<String> = wanted_conditions
        .iter()
        .filter_map(|c| c.get("type").and_then(Value::as_str).map(str::to_string))
        .collect();
    if types != owned_conditions {
        return false;
    }
    let stored_conditions = have
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let same_condition = |w: &Value| {
        stored_conditions.iter().any(|h| {
            ["type", "status", "reason", "message", "observedGeneration"]
                .iter()
                .all(|k| h.get(*k) == w.get(*k))
        })
    };
    want.iter().all(|(k, v)| match k.as_str() {
        "conditions" => wanted_conditions.iter().all(same_condition),
        _ => have.get(k).is_some_and(|h| contains(h, v)),
    })
}

async fn apply_status(md: &ModelDeployment, ctx: &Context, body: &Value) -> Result<(), Error> {
    let ns = md.namespace().unwrap_or_default();
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch_status(
        &md.name_any(),
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Apply(body),
    )
    .await
    .map_err(Error::Apply)?;
    Ok(())
}

async fn publish_events(md: &ModelDeployment, ctx: &Context, d: &Desired) {
    let mut events = Vec::new();
    if d.newly_selected
        && let Some((name, reason)) = &d.provider
    {
        info!(name = %md.name_any(), namespace = ?md.namespace(), provider = %name, reason = %reason, "provider selected");
        events.push(Event {
            type_: EventType::Normal,
            reason: "ProviderSelected".into(),
            note: Some(format!("Selected provider '{name}': {reason}")),
            action: "SelectProvider".into(),
            secondary: None,
        });
    }
    if let Some(v) = d.conditions.iter().find(|c| c.type_ == VALIDATED)
        && v.status == "False"
        && condition_of(md, VALIDATED).is_none_or(|p| p.status != "False" || p.message != v.message)
    {
        events.push(Event {
            type_: EventType::Warning,
            reason: "ValidationFailed".into(),
            note: Some(v.message.clone()),
            action: "Validate".into(),
            secondary: None,
        });
    }
    let reference = md.object_ref(&());
    for ev in events {
        if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
            warn!(error = %e, reason = %ev.reason, "publishing event failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::InferenceProviderConfigSpec;

    #[allow(clippy::needless_pass_by_value)] // reads better at the call sites
    fn md(spec: Value, status: Option<Value>) -> ModelDeployment {
        let mut v = json!({"apiVersion": API_VERSION, "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns", "generation": 1}, "spec": spec});
        if let Some(status) = status {
            v["status"] = status;
        }
        serde_json::from_value(v).unwrap()
    }

    fn config(name: &str, spec: Value, now: Timestamp) -> Arc<InferenceProviderConfig> {
        let spec: InferenceProviderConfigSpec = serde_json::from_value(spec).unwrap();
        let mut c = InferenceProviderConfig::new(name, spec);
        c.metadata.generation = Some(1);
        c.metadata.uid = Some(name.into());
        c.status = Some(
            serde_json::from_value(
                json!({"ready": true, "lastHeartbeat": now.to_string(), "version": "1"}),
            )
            .unwrap(),
        );
        Arc::new(c)
    }

    fn providers(now: Timestamp) -> Vec<Arc<InferenceProviderConfig>> {
        vec![
            config(
                "kaito",
                json!({"capabilities": {"engines": ["llamacpp"], "servingModes": ["aggregated"], "cpuSupport": true},
                       "selectionRules": [{"condition": "spec.engine.type == 'llamacpp'", "priority": 100}]}),
                now,
            ),
            config(
                "kernelcache",
                json!({"capabilities": {"features": ["kernelCache"]}}),
                now,
            ),
        ]
    }

    fn run(md: &ModelDeployment, settings: &Settings) -> (Desired, Option<selection::Selection>) {
        let now = Timestamp::now();
        decide(md, &providers(now), &RuleCache::default(), settings, now)
    }

    fn condition<'a>(d: &'a Desired, type_: &str) -> &'a Condition {
        d.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    const LLAMA: &str = "llamacpp";

    #[test]
    fn the_selector_chooses_by_the_rules_once() {
        let m = md(
            json!({"model": {"id": "a/b"}, "engine": {"type": LLAMA}}),
            None,
        );
        let (d, sel) = run(&m, &Settings::default());
        assert_eq!(d.provider.as_ref().unwrap().0, "kaito");
        assert!(d.newly_selected && d.phase_message.is_none());
        assert_eq!(
            condition(&d, PROVIDER_SELECTED).reason,
            reasons::AUTO_SELECTED
        );
        assert!(sel.is_some(), "rule reports come with an auto selection");
    }

    /// No engine in the spec: core chooses it (a GGUF model: llama.cpp), records it with
    /// `EngineSelected`, selects the provider over it, and keeps it once selected.
    #[test]
    fn an_engine_is_chosen_recorded_and_selected_for() {
        let m = md(json!({"model": {"id": "x/Qwen3-0.6B-GGUF"}}), None);
        let (d, _) = run(&m, &Settings::default());
        let engine = condition(&d, ENGINE_SELECTED);
        assert_eq!(
            (engine.status.as_str(), engine.reason.as_str()),
            ("True", reasons::AUTO_SELECTED)
        );
        let reason =
            "only llamacpp serves a GGUF model (gpu=false, mode=aggregated): provider kaito";
        assert_eq!(engine.message, reason);
        assert_eq!(d.provider.as_ref().unwrap().0, "kaito");
        let body = status_body(&m, &d);
        assert_eq!(
            body["status"]["engine"],
            json!({"type": "llamacpp", "selectedReason": reason})
        );

        // Selected: kept as recorded, whatever the providers say now.
        let stored = md(
            json!({"model": {"id": "x/Qwen3-0.6B-GGUF"}}),
            Some(body["status"].clone()),
        );
        let kept = decide(
            &stored,
            &[],
            &RuleCache::default(),
            &Settings::default(),
            Timestamp::now(),
        )
        .0;
        assert_eq!(condition(&kept, ENGINE_SELECTED).message, reason);
        assert_eq!(
            status_body(&stored, &kept)["status"]["engine"],
            body["status"]["engine"]
        );

        // Named in the spec: explicit.
        let explicit = md(
            json!({"model": {"id": "a/b"}, "engine": {"type": LLAMA}}),
            None,
        );
        let (d, _) = run(&explicit, &Settings::default());
        assert_eq!(condition(&d, ENGINE_SELECTED).reason, reasons::EXPLICIT);
        assert_eq!(
            status_body(&explicit, &d)["status"]["engine"],
            json!({"type": "llamacpp", "selectedReason": engine_choice::EXPLICIT_ENGINE_REASON})
        );
    }

    #[test]
    fn no_engine_that_fits_is_a_condition_and_no_selection() {
        let m = md(
            json!({"model": {"id": "a/b"}, "serving": {"mode": "disaggregated"},
                   "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 1}}}}),
            None,
        );
        let (d, sel) = run(&m, &Settings::default());
        let engine = condition(&d, ENGINE_SELECTED);
        assert_eq!(
            (engine.status.as_str(), engine.reason.as_str()),
            ("False", reasons::NO_ENGINE)
        );
        assert!(
            engine.message.starts_with("No engine is served (mode=disaggregated): vllm (gpu=true): kaito: engine vllm not supported;"),
            "{}",
            engine.message
        );
        assert_eq!(d.phase_message.as_deref(), Some(engine.message.as_str()));
        assert!(d.provider.is_none() && sel.is_none() && d.requeue.is_some());
        assert!(status_body(&m, &d)["status"].get("engine").is_none());
    }

    #[test]
    fn an_explicit_provider_must_be_registered_and_serve() {
        for (name, reason) in [
            ("kaito", reasons::EXPLICIT),
            ("ghost", reasons::PROVIDER_NOT_INSTALLED),
            ("kernelcache", reasons::PROVIDER_DOES_NOT_SERVE),
        ] {
            let m = md(
                json!({"model": {"id": "a/b"}, "engine": {"type": LLAMA}, "provider": {"name": name}}),
                None,
            );
            let (d, sel) = run(&m, &Settings::default());
            assert_eq!(condition(&d, PROVIDER_SELECTED).reason, reason, "{name}");
            assert_eq!(d.provider.is_some(), name == "kaito", "{name}");
            assert_eq!(d.requeue.is_some(), name != "kaito", "{name} waits");
            assert!(sel.is_none());
        }
    }

    /// A term that ends while the API server has been unreachable since it began (the
    /// ModelDeployment cache never synced) ends `run`. Time is paused: were `run` still
    /// waiting, the runtime would advance to the timeout.
    #[tokio::test(start_paused = true)]
    async fn a_term_that_ends_before_its_cache_synced_ends_the_controller() {
        // An API server that never answers: the cache never syncs.
        let (service, _never_answered) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = kube::Client::new(service, "default");
        let providers =
            kubeairunway_sdk::reflect::Cache::<InferenceProviderConfig>::fixed([], ()).store;
        let metrics = Arc::new(Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        ));
        let (mds, events) = super::model_deployments(&client, None);
        let running = tokio::spawn(super::run(
            client,
            mds,
            events,
            providers,
            Settings::default(),
            metrics,
            kubeairunway_sdk::process::Check::default(),
            tokio::time::sleep(Duration::from_secs(1)),
        ));
        let returned = tokio::time::timeout(
            Duration::from_secs(1) + kubeairunway_sdk::process::TERM_GRACE,
            running,
        )
        .await;
        assert!(matches!(returned, Ok(Ok(()))), "{returned:?}");
    }

    /// A spec the API server stored before a rule of the CRD existed (or kept through
    /// validation ratcheting) is reported with the CRD's own message and not selected for.
    #[test]
    fn a_spec_that_breaks_a_rule_of_the_crd_is_reported_and_not_selected_for() {
        let m = md(
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 0}}}),
            None,
        );
        let (d, sel) = run(&m, &Settings::default());
        let validated = condition(&d, VALIDATED);
        assert_eq!(validated.status, "False");
        assert_eq!(validated.reason, reasons::VALIDATION_FAILED);
        assert_eq!(
            validated.message,
            "vLLM engine requires GPU (set resources.gpu.count > 0)"
        );
        assert_eq!(
            d.phase_message.as_deref(),
            Some("Validation failed: vLLM engine requires GPU (set resources.gpu.count > 0)")
        );
        assert!(d.provider.is_none() && sel.is_none());
    }

    #[test]
    fn without_the_selector_nothing_is_chosen_and_the_message_says_why() {
        let m = md(
            json!({"model": {"id": "a/b"}, "engine": {"type": LLAMA}}),
            None,
        );
        let settings = Settings {
            enable_provider_selector: false,
            ..Settings::default()
        };
        let (d, _) = run(&m, &settings);
        assert!(d.provider.is_none());
        assert_eq!(d.phase_message.as_deref(), Some(AWAITING_SELECTOR_MESSAGE));
        assert_eq!(
            condition(&d, PROVIDER_SELECTED).reason,
            reasons::AWAITING_SELECTOR
        );
    }

    #[test]
    fn no_provider_fits_a_vllm_spec_here() {
        let m = md(
            json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}),
            None,
        );
        let (d, _) = run(&m, &Settings::default());
        assert!(d.provider.is_none());
        assert_eq!(
            condition(&d, PROVIDER_SELECTED).reason,
            reasons::NO_PROVIDER
        );
        assert!(d.requeue.is_some());
    }

    #[test]
    fn a_selection_made_by_someone_else_is_left_alone() {
        let m = md(
            json!({"model": {"id": "a/b"}, "engine": {"type": LLAMA}}),
            Some(json!({"provider": {"name": "custom", "selectedReason": "my selector"}})),
        );
        let (d, sel) = run(&m, &Settings::default());
        assert!(
            d.provider.is_none(),
            "core does not own it: nothing re-applied"
        );
        assert!(sel.is_none());
        assert!(d.conditions.iter().all(|c| c.type_ != PROVIDER_SELECTED));
    }

    #[test]
    fn an_unchanged_status_is_not_written_again() {
        let m = md(
            json!({"model": {"id": "a/b"}, "engine": {"type": LLAMA}}),
            None,
        );
        let (d, _) = run(&m, &Settings::default());
        let body = status_body(&m, &d);
        assert!(!is_current(&m, &body), "nothing stored yet");
        // As the API server stores it: the status, and core's managed fields.
        let mut stored = m.clone();
        stored.status = Some(serde_json::from_value(body["status"].clone()).unwrap());
        stored.metadata.managed_fields = Some(vec![serde_json::from_value(json!({
            "manager": FIELD_MANAGER, "operation": "Apply", "subresource": "status",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:provider": {"f:name": {}, "f:selectedReason": {}},
                         "f:engine": {"f:type": {}, "f:selectedReason": {}},
                         "f:conditions": {"k:{\"type\":\"Validated\"}": {}, "k:{\"type\":\"EngineSelected\"}": {}, "k:{\"type\":\"ProviderSelected\"}": {}}}}
        }))
        .unwrap()]);
        assert!(is_current(&stored, &body));
        // Core owning a field it no longer sets must apply again, to release it.
        let mut owns_more = stored.clone();
        owns_more.metadata.managed_fields.as_mut().unwrap()[0]
            .fields_v1
            .as_mut()
            .unwrap()
            .0["f:status"]["f:phase"] = json!({});
        assert!(!is_current(&owns_more, &body));
    }

    #[test]
    fn the_cache_keeps_of_core_s_managed_fields_exactly_what_core_reads() {
        let entry = |manager: &str, fields: Value| {
            serde_json::from_value(json!({"manager": manager, "operation": "Apply",
                "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": fields}))
            .unwrap()
        };
        let full = json!({"f:status": {
            "f:provider": {"f:name": {}, "f:selectedReason": {}},
            "f:engine": {"f:type": {}},
            "f:conditions": {
                "k:{\"type\":\"Validated\"}": {".": {}, "f:message": {}, "f:status": {}, "f:type": {}},
                "k:{\"type\":\"ProviderSelected\"}": {".": {}, "f:reason": {}}
            }
        }});
        let mut both = md(json!({"model": {"id": "m"}}), None);
        both.metadata.managed_fields = Some(vec![
            entry(FIELD_MANAGER, full),
            entry("dynamo-provider", json!({"f:status": {"f:phase": {}}})),
        ]);
        let before = (owned_status(&both), core_owns_selection(&both));
        assert!(before.1 && before.0.1.len() == 2, "{before:?}");
        strip(&mut both);
        assert_eq!((owned_status(&both), core_owns_selection(&both)), before);
        let kept = both.metadata.managed_fields.as_ref().unwrap();
        assert_eq!(kept.len(), 1, "only core's entry");
        assert_eq!(
            kept[0].fields_v1.as_ref().unwrap().0,
            json!({"f:status": {
                "f:provider": {"f:name": {}},
                "f:engine": {},
                "f:conditions": {"k:{\"type\":\"Validated\"}": {}, "k:{\"type\":\"ProviderSelected\"}": {}}
            }})
        );
        // Without provider.name (a custom selector owns it), none is made up.
        let mut custom = md(json!({"model": {"id": "m"}}), None);
        custom.metadata.managed_fields = Some(vec![entry(
            FIELD_MANAGER,
            json!({"f:status": {"f:provider": {"f:selectedReason": {}}}}),
        )]);
        strip(&mut custom);
        assert!(!core_owns_selection(&custom));
    }
}
