//! Provider finalizers core removes: those of providers that never served a
//! ModelDeployment (written at admission for the provider core was expected to select),
//! and, on deletion, that of a provider that is gone once it has waited the finalizer
//! timeout.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use kubeairunway_sdk::events::{Event, EventType};
use kubeairunway_sdk::{InferenceProviderConfig, ModelDeployment, finalizers};
use tracing::{debug, warn};

use crate::context::{Context, Error};

/// The providers whose finalizer a ModelDeployment carries (`kubeairunway.ai/<name>-provider`).
fn provider_finalizers(md: &ModelDeployment) -> Vec<(String, String)> {
    md.finalizers()
        .iter()
        .filter_map(|f| Some((f.clone(), finalizers::provider_of(f)?.to_string())))
        .collect()
}

/// Finalizers of providers that never served `md`. Core's mutating webhook writes the
/// finalizer of the provider it expects core to select; until core has selected one
/// (`status.provider.name` unset) no provider acts on `md`, so the finalizer of any
/// provider but `selecting` (the one selected now, if any) holds nothing.
pub(crate) fn unserved(md: &ModelDeployment, selecting: Option<&str>) -> Vec<String> {
    if md.selected_provider().is_some() {
        return Vec::new();
    }
    provider_finalizers(md)
        .into_iter()
        .filter(|(_, p)| Some(p.as_str()) != selecting)
        .map(|(f, _)| f)
        .collect()
}

/// Remove the finalizers [`unserved`] names (nothing when there are none); whether `md`
/// still exists.
pub(crate) async fn release_unserved(
    md: &ModelDeployment,
    ctx: &Context,
    selecting: Option<&str>,
) -> Result<bool, Error> {
    let unserved = unserved(md, selecting);
    if unserved.is_empty() {
        return Ok(true);
    }
    let keep = finalizers::without(md, |f| unserved.iter().any(|u| u == f));
    let api: Api<ModelDeployment> =
        Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default());
    debug!(name = %md.name_any(), namespace = ?md.namespace(), ?unserved, "removing the finalizers of providers that never served it");
    finalizers::replace(&api, md, &keep)
        .await
        .map_err(Error::Finalizer)
}

/// Whether `provider` is gone: its InferenceProviderConfig deleted, or its heartbeat
/// older than `max_age`.
fn provider_gone(
    providers: &Store<InferenceProviderConfig>,
    provider: &str,
    max_age: Duration,
    now: Timestamp,
) -> bool {
    let Some(config) = providers.get(&ObjectRef::new(provider)) else {
        return true;
    };
    let beat = config
        .status
        .as_ref()
        .and_then(|s| s.last_heartbeat.as_ref());
    beat.is_none_or(|t| Duration::try_from(now.duration_since(t.0)).is_ok_and(|age| age > max_age))
}

/// A deleted ModelDeployment held by the finalizer of a provider that is gone (uninstalled,
/// or silent for longer than the finalizer timeout) would wait forever: once it has waited
/// the finalizer timeout, core removes that finalizer with a warning event. What the
/// provider made is owned by the ModelDeployment, so the garbage collector still removes it.
pub(crate) async fn release_gone_providers(
    md: &ModelDeployment,
    ctx: &Context,
    now: Timestamp,
) -> Result<Action, Error> {
    if md.selected_provider().is_none() {
        release_unserved(md, ctx, None).await?;
        return Ok(Action::await_change());
    }
    let timeout = ctx.settings.finalizer_timeout;
    // Silent for longer than it may be to still be selected, and than the timeout.
    let silent = timeout.max(ctx.settings.selection.heartbeat_max_age);
    let gone: Vec<(String, String)> = provider_finalizers(md)
        .into_iter()
        .filter(|(_, p)| provider_gone(&ctx.providers, p, silent, now))
        .collect();
    if gone.is_empty() {
        return Ok(Action::await_change());
    }
    let since = md.metadata.deletion_timestamp.as_ref().map_or(now, |t| t.0);
    let waited = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    if waited < timeout {
        return Ok(Action::requeue(
            timeout.saturating_sub(waited) + Duration::from_secs(1),
        ));
    }
    let keep = finalizers::without(md, |f| gone.iter().any(|(g, _)| g == f));
    let api: Api<ModelDeployment> =
        Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default());
    if !finalizers::replace(&api, md, &keep)
        .await
        .map_err(Error::Finalizer)?
    {
        return Ok(Action::await_change());
    }
    for (finalizer, provider) in gone {
        let note = format!(
            "Removed finalizer {finalizer} after {}s: provider {provider} is not installed or not running; what it made is left to the garbage collector",
            timeout.as_secs()
        );
        warn!(name = %md.name_any(), namespace = ?md.namespace(), %provider, "removed the finalizer of a provider that is gone");
        let ev = Event {
            type_: EventType::Warning,
            reason: "FinalizerTimeout".into(),
            note: Some(note),
            action: "RemoveFinalizer".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&ev, &md.object_ref(&())).await {
            warn!(error = %e, "publishing event failed");
        }
    }
    Ok(Action::await_change())
}
