//! Registration: the provider's InferenceProviderConfig (spec on start-up, status with a
//! heartbeat), and detection of the upstream kind the API server serves.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::watch;

use super::context::{Options, field_manager};
use crate::api::{InferenceProviderConfig, InferenceProviderConfigStatus};
use crate::conditions::{self, reasons};
use crate::labels;
use crate::provider::{Provider, UpstreamRef};
use crate::upstream::UpstreamState;
use crate::upstream::{UpstreamApi, not_served_message};

/// Keep `tx` in step with the upstream kind as the API server serves it.
///
/// A kind defined by a CRD is read from the CRD, which is watched: installing, changing or
/// removing it is noticed at once. Any other kind (built-in, or from an aggregated API
/// server) is found by API discovery and its schema read from the cluster's OpenAPI v3
/// document; that is looked at again every `--resync-period`, and while the kind is
/// missing with the backoff of every retry (from 2 s), so a kind that appears later is
/// found. The first finding is always logged (a missing kind as a warning), and always
/// sent, so that the runtime knows detection has run once.
pub(super) async fn watch_upstream<P: Provider>(
    provider: Arc<P>,
    client: Client,
    options: Options,
    tx: watch::Sender<UpstreamState>,
) {
    let wanted = provider.upstream();
    let (crd_tx, mut crd_rx) = watch::channel(Crd::NotListed);
    let crd_watch = tokio::spawn(watch_crd(client.clone(), wanted.clone(), crd_tx));
    let mut first = true;
    let mut missing_for = 0u32;
    loop {
        let crd = crd_rx.borrow_and_update().clone();
        let recheck = match crd {
            Crd::NotListed => None,
            Crd::Installed(detected) => {
                publish(&tx, &wanted, Some(*detected), &mut first);
                missing_for = 0;
                None
            }
            Crd::Absent => match discover(&client, &wanted).await {
                Ok(state) => {
                    let missing = state.is_none();
                    publish(&tx, &wanted, state, &mut first);
                    if missing {
                        missing_for = missing_for.saturating_add(1);
                        Some(crate::process::backoff(missing_for).min(options.resync_period))
                    } else {
                        missing_for = 0;
                        Some(options.resync_period)
                    }
                }
                Err(e) => {
                    missing_for = missing_for.saturating_add(1);
                    tracing::warn!(kind = %wanted.kind, error = %e, "discovering the upstream API");
                    Some(crate::process::backoff(missing_for))
                }
            },
        };
        let changed = match recheck {
            Some(after) => tokio::select! {
                changed = crd_rx.changed() => changed,
                () = tokio::time::sleep(after) => Ok(()),
            },
            None => crd_rx.changed().await,
        };
        if changed.is_err() {
            break;
        }
    }
    crd_watch.abort();
}

/// Send `state` when it differs from the current one (always the first time), logging it.
fn publish(
    tx: &watch::Sender<UpstreamState>,
    wanted: &UpstreamRef,
    state: UpstreamState,
    first: &mut bool,
) {
    let always = std::mem::take(first);
    tx.send_if_modified(|current| {
        if *current == state && !always {
            return false;
        }
        let name = wanted.crd_name();
        match &state {
            Some(Ok(api)) => tracing::info!(upstream = %name, version = %api.version, source = ?api.source, schema = %api.schema_hash, "upstream API detected"),
            Some(Err(e)) => tracing::warn!(upstream = %name, error = %e, "no adapter for the served upstream API"),
            None => tracing::warn!(upstream = %name, "{}", not_served_message(wanted)),
        }
        *current = state;
        true
    });
}

/// The CRD that would define the upstream kind, as its watch sees it.
#[derive(Clone, Debug)]
enum Crd {
    /// Not listed yet.
    NotListed,
    /// Listed: there is none.
    Absent,
    /// Installed: what detection made of it. The CRD itself is not kept: an operator's CRD
    /// embeds whole pod specs, and Dynamo's, parsed, takes about 8 MB.
    Installed(Box<Result<UpstreamApi, String>>),
}

impl Crd {
    fn installed(crd: &CustomResourceDefinition, wanted: &UpstreamRef) -> Self {
        Self::Installed(Box::new(
            UpstreamApi::detect(crd, wanted).map_err(|e| e.to_string()),
        ))
    }
}

/// Follow the CRD that would define `wanted`. The core group has no CRDs.
async fn watch_crd(client: Client, wanted: UpstreamRef, tx: watch::Sender<Crd>) {
    if wanted.group.is_empty() {
        let _ = tx.send(Crd::Absent);
        tx.closed().await;
        return;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let selector = format!("metadata.name={}", wanted.crd_name());
    let mut events = std::pin::pin!(
        watcher(crds, watcher::Config::default().fields(&selector)).default_backoff()
    );
    let mut seen = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => seen = None,
            Ok(watcher::Event::InitApply(crd)) => seen = Some(Crd::installed(&crd, &wanted)),
            Ok(watcher::Event::InitDone) => {
                let _ = tx.send(seen.take().unwrap_or(Crd::Absent));
            }
            Ok(watcher::Event::Apply(crd)) => {
                let _ = tx.send(Crd::installed(&crd, &wanted));
            }
            Ok(watcher::Event::Delete(_)) => {
                let _ = tx.send(Crd::Absent);
            }
            Err(e) => tracing::warn!(error = %e, "watching the upstream CRD"),
        }
    }
}

/// `wanted` by API discovery, with its schema from the OpenAPI v3 document of the chosen
/// version: `None` when no version of the kind is served.
async fn discover(client: &Client, wanted: &UpstreamRef) -> Result<UpstreamState, kube::Error> {
    let group = match kube::discovery::group(client, &wanted.group).await {
        Ok(group) => group,
        Err(kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(_))) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let served: Vec<String> = group
        .versions()
        .filter(|v| {
            group
                .versioned_resources(v)
                .iter()
                .any(|(r, _)| r.plural == wanted.plural && r.kind == wanted.kind)
        })
        .map(str::to_string)
        .collect();
    if served.is_empty() {
        return Ok(None);
    }
    let Some(version) = wanted.versions.iter().find(|v| served.contains(v)) else {
        return Ok(Some(Err(
            crate::upstream::DetectError::NoSupportedVersion {
                crd: wanted.crd_name(),
                served: served.join(", "),
                supported: wanted.versions.join(", "),
            }
            .to_string(),
        )));
    };
    let request = http::Request::get(wanted.openapi_path(version))
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let document: serde_json::Value = client.request(request).await?;
    Ok(Some(
        UpstreamApi::from_openapi(&document, wanted, version, served).map_err(|e| e.to_string()),
    ))
}

/// Apply the InferenceProviderConfig, then refresh its status every heartbeat and
/// whenever the detected upstream API changes.
pub(super) async fn heartbeat<P: Provider>(
    provider: Arc<P>,
    client: Client,
    options: Options,
    mut upstream: watch::Receiver<UpstreamState>,
) {
    let raw: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<InferenceProviderConfig>(&()),
    );
    let api: Api<InferenceProviderConfig> = Api::all(client);
    let name = provider.name().to_string();
    let pp = PatchParams::apply(&field_manager(&name)).force();
    let mut registered = false;
    // The status as last written (or read back at registration): the previous condition's
    // transition time comes from it, with no read per heartbeat.
    let mut previous = InferenceProviderConfigStatus::default();
    loop {
        if !registered {
            let config = json!({
                "apiVersion": InferenceProviderConfig::api_version(&()),
                "kind": InferenceProviderConfig::kind(&()),
                "metadata": {"name": name, "labels": {labels::MANAGED_BY: labels::MANAGED_BY_VALUE}},
                "spec": provider.config(),
            });
            match api.patch(&name, &pp, &Patch::Apply(&config)).await {
                Ok(config) => {
                    registered = true;
                    previous = config.status.unwrap_or_default();
                    tracing::info!(provider = %name, "registered InferenceProviderConfig");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "registering the InferenceProviderConfig");
                    if replace_earlier_shape(&raw, &name, &config["spec"]).await {
                        continue; // apply again at once
                    }
                }
            }
        }
        if registered {
            let state = upstream.borrow_and_update().clone();
            let status = provider_status(provider.as_ref(), &state, &previous, Timestamp::now());
            let patch = json!({
                "apiVersion": InferenceProviderConfig::api_version(&()),
                "kind": InferenceProviderConfig::kind(&()),
                "status": status,
            });
            match api.patch_status(&name, &pp, &Patch::Apply(&patch)).await {
                Ok(config) => previous = config.status.unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(error = %e, "refreshing the InferenceProviderConfig status");
                    registered = false; // it may have been deleted: register again
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(options.heartbeat_interval.max(Duration::from_millis(100))) => {}
            changed = upstream.changed() => if changed.is_err() { return },
        }
    }
}

/// Whether a stored config's spec has the earlier shape of `capabilities.engines` (bare
/// engine names), which server-side apply cannot merge into today's list of objects keyed
/// by name (the API server refuses the apply: it cannot type the stored object).
pub(crate) fn has_earlier_shape(spec: &serde_json::Value) -> bool {
    spec.pointer("/capabilities/engines")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|engines| engines.iter().any(serde_json::Value::is_string))
}

/// When the stored config has the earlier shape, replace its spec with `spec` by a JSON
/// patch (an update, which the API server applies over an object it cannot type), so that
/// the next apply succeeds and owns it again. Whether it was replaced.
async fn replace_earlier_shape(
    api: &Api<DynamicObject>,
    name: &str,
    spec: &serde_json::Value,
) -> bool {
    let stored = match api.get_opt(name).await {
        Ok(Some(stored)) => stored,
        Ok(None) => return false,
        Err(e) => {
            tracing::warn!(error = %e, "reading the InferenceProviderConfig");
            return false;
        }
    };
    if !stored.data.get("spec").is_some_and(has_earlier_shape) {
        return false;
    }
    let patch: json_patch::Patch =
        match serde_json::from_value(json!([{"op": "replace", "path": "/spec", "value": spec}])) {
            Ok(patch) => patch,
            Err(e) => {
                tracing::warn!(error = %e, "building the InferenceProviderConfig's replacement");
                return false;
            }
        };
    match api
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => {
            tracing::info!(
                provider = %name,
                "replaced an InferenceProviderConfig stored with bare engine names by the per-engine shape"
            );
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "replacing the InferenceProviderConfig's spec");
            false
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
    let wanted = provider.upstream();
    let (ready, reason, message) = match state {
        Some(Ok(api)) => (
            true,
            reasons::UPSTREAM_DETECTED,
            format!(
                "{} serves {}; rendering for it",
                wanted.crd_name(),
                api.api_version()
            ),
        ),
        Some(Err(e)) => (false, reasons::UPSTREAM_SCHEMA_MISMATCH, e.clone()),
        None => (
            false,
            crate::upstream::not_served_reason(&wanted),
            not_served_message(&wanted),
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

#[cfg(test)]
mod tests {
    use super::has_earlier_shape;
    use serde_json::json;

    #[test]
    fn bare_engine_names_are_the_earlier_shape() {
        assert!(has_earlier_shape(
            &json!({"capabilities": {"engines": ["vllm", {"name": "sglang"}]}})
        ));
        assert!(!has_earlier_shape(
            &json!({"capabilities": {"engines": [{"name": "vllm"}]}})
        ));
        assert!(!has_earlier_shape(
            &json!({"capabilities": {"features": ["kernelCache"]}})
        ));
    }
}
