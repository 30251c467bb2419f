//! Registration: the provider's InferenceProviderConfig (spec on start-up, status with a
//! heartbeat), and detection of the installed upstream CRD.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::watch;

use super::{Options, UpstreamState, field_manager};
use crate::api::{InferenceProviderConfig, InferenceProviderConfigStatus};
use crate::conditions::{self, reasons};
use crate::labels;
use crate::provider::Provider;
use crate::upstream::UpstreamApi;

/// Keep `tx` in step with the installed upstream CRD.
pub(super) async fn watch_upstream_crd<P: Provider>(
    provider: Arc<P>,
    client: Client,
    tx: watch::Sender<UpstreamState>,
) {
    let wanted = provider.upstream();
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let selector = format!("metadata.name={}", wanted.crd_name());
    let mut events = std::pin::pin!(
        watcher(crds, watcher::Config::default().fields(&selector)).default_backoff()
    );
    let mut seen = false;
    let set = |state: UpstreamState| {
        tx.send_if_modified(|current| {
            if *current == state {
                return false;
            }
            match &state {
                Some(Ok(api)) => tracing::info!(crd = %wanted.crd_name(), version = %api.version, schema = %api.schema_hash, "upstream API detected"),
                Some(Err(e)) => tracing::warn!(crd = %wanted.crd_name(), error = %e, "no adapter for the installed upstream CRD"),
                None => tracing::warn!(crd = %wanted.crd_name(), "upstream CRD not installed"),
            }
            *current = state;
            true
        })
    };
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => seen = false,
            Ok(watcher::Event::InitApply(crd) | watcher::Event::Apply(crd)) => {
                seen = true;
                set(Some(
                    UpstreamApi::detect(&crd, &wanted).map_err(|e| e.to_string()),
                ));
            }
            Ok(watcher::Event::InitDone) => {
                if !seen {
                    set(None);
                }
            }
            Ok(watcher::Event::Delete(_)) => {
                set(None);
            }
            Err(e) => tracing::warn!(error = %e, "watching the upstream CRD"),
        }
    }
}

/// Apply the InferenceProviderConfig, then refresh its status every heartbeat and
/// whenever the detected upstream API changes.
pub(super) async fn heartbeat<P: Provider>(
    provider: Arc<P>,
    client: Client,
    options: Options,
    mut upstream: watch::Receiver<UpstreamState>,
) {
    let api: Api<InferenceProviderConfig> = Api::all(client);
    let name = provider.name().to_string();
    let pp = PatchParams::apply(&field_manager(&name)).force();
    let mut registered = false;
    loop {
        if !registered {
            let config = json!({
                "apiVersion": InferenceProviderConfig::api_version(&()),
                "kind": InferenceProviderConfig::kind(&()),
                "metadata": {"name": name, "labels": {labels::MANAGED_BY: labels::MANAGED_BY_VALUE}},
                "spec": provider.config(),
            });
            match api.patch(&name, &pp, &Patch::Apply(&config)).await {
                Ok(_) => {
                    registered = true;
                    tracing::info!(provider = %name, "registered InferenceProviderConfig");
                }
                Err(e) => tracing::warn!(error = %e, "registering the InferenceProviderConfig"),
            }
        }
        if registered {
            let state = upstream.borrow_and_update().clone();
            let previous = api
                .get_status(&name)
                .await
                .ok()
                .and_then(|c| c.status)
                .unwrap_or_default();
            let status = provider_status(provider.as_ref(), &state, &previous, Timestamp::now());
            let patch = json!({
                "apiVersion": InferenceProviderConfig::api_version(&()),
                "kind": InferenceProviderConfig::kind(&()),
                "status": status,
            });
            if let Err(e) = api.patch_status(&name, &pp, &Patch::Apply(&patch)).await {
                tracing::warn!(error = %e, "refreshing the InferenceProviderConfig status");
                registered = false; // it may have been deleted: register again
            }
        }
        tokio::select! {
            () = tokio::time::sleep(options.heartbeat_interval.max(Duration::from_millis(100))) => {}
            changed = upstream.changed() => if changed.is_err() { return },
        }
    }
}

/// The provider's status for its InferenceProviderConfig.
pub(crate) fn provider_status<P: Provider>(
    provider: &P,
    state: &UpstreamState,
    previous: &InferenceProviderConfigStatus,
    now: Timestamp,
) -> InferenceProviderConfigStatus {
    let crd = provider.upstream().crd_name();
    let (ready, reason, message) = match state {
        Some(Ok(api)) => (
            true,
            reasons::UPSTREAM_DETECTED,
            format!("{crd} serves {}; rendering for it", api.api_version()),
        ),
        Some(Err(e)) => (false, reasons::UPSTREAM_SCHEMA_MISMATCH, e.clone()),
        None => (
            false,
            reasons::UPSTREAM_CRD_MISSING,
            format!("upstream CRD {crd} is not installed"),
        ),
    };
    let api = state.as_ref().and_then(|s| s.as_ref().ok());
    InferenceProviderConfigStatus {
        ready: Some(ready),
        version: Some(provider.version()),
        last_heartbeat: Some(Time(now)),
        upstream_crd_version: api.map(UpstreamApi::api_version),
        upstream_schema_hash: api.map(|a| a.schema_hash.clone()),
        conditions: vec![conditions::new(
            conditions::find(&previous.conditions, conditions::UPSTREAM_READY),
            conditions::UPSTREAM_READY,
            ready,
            reason,
            message,
            None,
            now,
        )],
    }
}
