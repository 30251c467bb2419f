//! Reading a DynamoGraphDeployment's status (docs/upstream.md#dynamo-status):
//! `status.state` is one of initializing, pending, successful, failed; detail is in the
//! `Ready` condition's reason and message (`Resources not ready: <resource>: <why>; ...`
//! while pending, a crash-looping pod included); replicas per component are in
//! `status.services` (v1alpha1) or `status.components` (v1beta1), as `readyReplicas`, or
//! `availableReplicas` for a multinode PodCliqueScalingGroup.
//!
//! Dynamo sets `failed` on any reconcile error, so a failure counts only once it has
//! lasted `failed_after`.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kubeairunway_sdk::{ModelDeployment, Observed};
use serde_json::Value;

use crate::graph::{EPP, FRONTEND, FRONTEND_PORT};

/// What of the upstream status matters, read from the live object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Upstream {
    /// `status.state`.
    pub state: Option<String>,
    /// The `Ready` condition: status, reason, message, lastTransitionTime.
    pub ready: Option<ReadyCondition>,
    /// Per component: (name, replicas, ready: `readyReplicas`, else `availableReplicas`).
    pub replicas: Vec<(String, i64, i64)>,
}

/// The upstream `Ready` condition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadyCondition {
    /// "True", "False" or "Unknown".
    pub status: String,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
    /// When it last changed.
    pub since: Option<Timestamp>,
}

impl Upstream {
    /// Read the parts we use from a DynamoGraphDeployment's `status`.
    pub fn read(status: Option<&Value>) -> Self {
        let Some(status) = status else {
            return Self::default();
        };
        let text = |v: &Value, k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let ready = status
            .get("conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
            .map(|c| ReadyCondition {
                status: text(c, "status"),
                reason: text(c, "reason"),
                message: text(c, "message"),
                since: c
                    .get("lastTransitionTime")
                    .and_then(Value::as_str)
                    .and_then(|t| t.parse().ok()),
            });
        let per_component = status
            .get("components")
            .or_else(|| status.get("services"))
            .and_then(Value::as_object);
        let replicas = per_component
            .into_iter()
            .flatten()
            .map(|(name, s)| {
                let n = |k: &str| s.get(k).and_then(Value::as_i64);
                let ready = n("readyReplicas").or_else(|| n("availableReplicas"));
                (name.clone(), n("replicas").unwrap_or(0), ready.unwrap_or(0))
            })
            .collect();
        Self {
            state: status
                .get("state")
                .and_then(Value::as_str)
                .map(str::to_string),
            ready,
            replicas,
        }
    }
}

/// The frontend's Service: `<dgd>-<component lowercased>` with dots as dashes
/// (`GetDCDResourceName`, `NormalizeKubeResourceName`: `deploy/operator/internal/dynamo/
/// graph.go:745-758,940@2a6da14c8`; `graph.go:499-505,703@3e3b3b187`).
pub fn frontend_service(dgd: &str) -> String {
    format!("{dgd}-{}", FRONTEND.to_lowercase())
        .replace('.', "-")
        .to_lowercase()
}

/// Our status for `md` from `upstream`, at `now`. `failed_since` is when the provider
/// first saw the `failed` state (used when the `Ready` condition has no transition time).
pub fn observe(
    md: &ModelDeployment,
    upstream: &Upstream,
    failed_since: Option<Timestamp>,
    failed_after: Duration,
    now: Timestamp,
) -> Observed {
    let name = md.metadata.name.clone().unwrap_or_default();
    let detail = upstream
        .ready
        .as_ref()
        .filter(|r| !r.message.is_empty())
        .map(|r| r.message.clone());
    let observed = match upstream.state.as_deref() {
        Some("successful") => {
            Observed::running(detail.unwrap_or_else(|| "DynamoGraphDeployment is ready".into()))
        }
        Some("failed") => {
            // The later of the Ready condition's last transition and the first sighting
            // of `failed`: Ready may have been False long before (while pending), and a
            // failure must itself have lasted `failed_after`.
            let ready_since = upstream
                .ready
                .as_ref()
                .filter(|r| r.status != "True")
                .and_then(|r| r.since);
            let since = ready_since.max(failed_since).unwrap_or(now);
            let lasted = Duration::try_from(now.duration_since(since)).unwrap_or_default();
            let message = detail.unwrap_or_else(|| "DynamoGraphDeployment failed".into());
            if lasted >= failed_after {
                let reason = upstream
                    .ready
                    .as_ref()
                    .map(|r| r.reason.as_str())
                    .unwrap_or_default();
                Observed::failed(reason, message)
            } else {
                Observed::deploying(format!(
                    "Dynamo reports a failure, which may be transient (for {}s so far): {message}",
                    lasted.as_secs()
                ))
            }
        }
        Some("pending") => {
            Observed::deploying(detail.unwrap_or_else(|| "DynamoGraphDeployment is pending".into()))
        }
        Some("initializing") => Observed::deploying(
            detail.unwrap_or_else(|| "DynamoGraphDeployment is initializing".into()),
        ),
        _ => Observed::deploying("waiting for the Dynamo operator to report status"),
    };
    let workers: Vec<_> = upstream
        .replicas
        .iter()
        .filter(|(component, ..)| component != FRONTEND && component != EPP)
        .collect();
    // With the gateway there is no frontend: the workers' sidecars serve, in the pool the
    // operator makes.
    let observed = if md.spec.gateway_enabled() {
        observed.with_pool_endpoint()
    } else {
        observed.with_endpoint(frontend_service(&name), FRONTEND_PORT)
    };
    if workers.is_empty() {
        return observed;
    }
    let desired: i64 = workers.iter().map(|(_, r, _)| r).sum();
    let ready: i64 = workers.iter().map(|(_, _, r)| r).sum();
    observed.with_replicas(
        i32::try_from(desired).unwrap_or(i32::MAX),
        i32::try_from(ready).unwrap_or(i32::MAX),
    )
}
