//! The [`Provider`] trait: everything a provider decides, as pure functions.
//!
//! A provider says what it is ([`Provider::name`], [`Provider::config`]), which upstream
//! CRD it targets and in which versions ([`Provider::upstream`]), whether it can serve a
//! ModelDeployment ([`Provider::check`]), what to apply for it ([`Provider::render`]) and
//! how the upstream status reads as ours ([`Provider::observe`]). None of these does I/O;
//! [`crate::runtime::run`] does all of it.

use std::collections::BTreeMap;

use kube::api::DynamicObject;

use crate::api::{
    EndpointStatus, InferenceProviderConfigSpec, ModelDeployment, Phase, ReplicaStatus,
};
use crate::upstream::UpstreamApi;

/// A provider: a translation from ModelDeployment to an upstream API, and back for status.
pub trait Provider: Send + Sync + 'static {
    /// The provider's name: the value of `status.provider.name` it serves, the name of its
    /// InferenceProviderConfig, and the stem of its field manager (`<name>-provider`) and
    /// finalizer (`kubeairunway.ai/<name>-provider`). Lowercase DNS label.
    fn name(&self) -> &str;

    /// The provider's version, shown in its InferenceProviderConfig status.
    fn version(&self) -> String {
        "unknown".to_string()
    }

    /// The provider's registration: capabilities and CEL selection rules.
    fn config(&self) -> InferenceProviderConfigSpec;

    /// The upstream CRD this provider renders, and the versions it has adapters for.
    fn upstream(&self) -> UpstreamRef;

    /// Whether this provider can serve `md` at all (004 §8 provider rules). The message
    /// becomes the `ProviderCompatible=False` condition and the phase is `Failed`.
    fn check(&self, md: &ModelDeployment) -> Result<(), Incompatible>;

    /// The objects to apply for `md`, for the detected upstream API. The first object is
    /// the primary one (observed for status, recreated on identity changes); the others
    /// (ConfigMaps, ...) are the objects it depends on: the runtime applies them first, in
    /// the order given, and the primary last, so that an upstream webhook that looks for
    /// them (KAITO's inference ConfigMap) finds them. Output must be deterministic: the
    /// same inputs give byte-identical objects.
    ///
    /// The runtime sets namespace, owner reference and the platform's labels on every
    /// object; the provider puts [`crate::render::pod_labels`] and
    /// [`crate::render::pod_annotations`] on every pod template it renders.
    fn render(&self, md: &ModelDeployment, upstream: &UpstreamApi)
    -> Result<Rendered, RenderError>;

    /// Our status for `md`, read from the live primary object (`None` before it exists).
    fn observe(&self, md: &ModelDeployment, upstream: Option<&DynamicObject>) -> Observed;

    /// Kinds this provider may render for some spec but not for others (another primary
    /// kind, an optional ConfigMap), besides the upstream kind. When the spec changes,
    /// objects of these kinds (and of the upstream kind and every kind rendered now) that
    /// the ModelDeployment owns but `render` no longer returns are deleted. Default: none.
    fn owned_kinds(&self) -> Vec<kube::discovery::ApiResource> {
        Vec::new()
    }

    /// Fields of a primary object of this `kind` that its upstream declares immutable
    /// (refuses to update), as dot paths (`"inference.preset"`). When the value rendered
    /// at any of them changes, the runtime deletes the primary object and creates it anew,
    /// as it does when an identity field of the ModelDeployment changes. Cite where the
    /// upstream declares each one. Default: none.
    fn immutable_fields(&self, kind: &str) -> &'static [&'static str] {
        let _ = kind;
        &[]
    }
}

/// The upstream CRD a provider targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamRef {
    /// API group, e.g. `kaito.sh`.
    pub group: String,
    /// Kind, e.g. `Workspace`.
    pub kind: String,
    /// Plural resource name, e.g. `workspaces`.
    pub plural: String,
    /// Versions the provider has adapters for, most preferred first. The runtime picks the
    /// first one the installed CRD serves.
    pub versions: Vec<String>,
}

impl UpstreamRef {
    /// `group`, `kind`, `plural`, and versions in order of preference.
    pub fn new(group: &str, kind: &str, plural: &str, versions: &[&str]) -> Self {
        Self {
            group: group.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
            versions: versions.iter().map(ToString::to_string).collect(),
        }
    }

    /// The CRD's name, `<plural>.<group>`.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }
}

/// The provider cannot serve this ModelDeployment (a terminal, user-facing reason).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Incompatible(pub String);

/// The ModelDeployment cannot be rendered as it stands: a wrong override type, a required
/// setting missing for this provider. Terminal until the spec changes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RenderError(pub String);

/// What [`Provider::render`] produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rendered {
    /// Objects to apply; the first is the primary upstream object.
    pub objects: Vec<DynamicObject>,
    /// Warnings for the user (unknown override keys, ignored settings); each becomes a
    /// Warning event once per spec generation.
    pub warnings: Vec<Warning>,
}

/// A warning about the spec that does not stop the deployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// Event reason, PascalCase (e.g. `UnknownOverride`).
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// The spec field this provider ignores, for [`Warning::unsupported_field`]: the
    /// runtime names every such field in the `ProviderCompatible` condition too, so that
    /// it stays visible after the event has expired.
    pub ignored_field: Option<String>,
}

impl Warning {
    /// A warning with this reason and message.
    pub fn new(reason: &str, message: impl Into<String>) -> Self {
        Self {
            reason: reason.to_string(),
            message: message.into(),
            ignored_field: None,
        }
    }

    /// `field` (a path such as `spec.model.storage`) is set but this provider cannot
    /// honour it, because `why`; the deployment goes ahead without it. Every spec field a
    /// provider does not serve must be reported this way, never silently dropped.
    pub fn unsupported_field(field: &str, why: impl std::fmt::Display) -> Self {
        Self {
            reason: crate::conditions::reasons::UNSUPPORTED_FIELD.to_string(),
            message: format!("{field} is ignored: {why}"),
            ignored_field: Some(field.to_string()),
        }
    }
}

/// The provider's reading of the upstream status.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// Our phase.
    pub phase: Phase,
    /// Detail for `status.message` (the upstream's own words where it has them).
    pub message: String,
    /// Whether the deployment serves requests (`Ready` condition).
    pub ready: bool,
    /// Reason of the `Ready` condition (PascalCase).
    pub reason: String,
    /// The Service that serves the model.
    pub endpoint: Option<EndpointStatus>,
    /// Replica counts, as the upstream reports them.
    pub replicas: Option<ReplicaStatus>,
    /// Look again after this long even if nothing changes (a decision that depends on
    /// time, such as "failed for longer than a threshold"). The runtime does not poll
    /// otherwise: it reconciles when the ModelDeployment or an owned object changes.
    pub recheck_after: Option<std::time::Duration>,
}

impl Observed {
    /// `Deploying`, not ready, with this message.
    pub fn deploying(message: impl Into<String>) -> Self {
        Self {
            phase: Phase::Deploying,
            message: message.into(),
            ready: false,
            reason: crate::conditions::reasons::DEPLOYMENT_PROGRESSING.to_string(),
            endpoint: None,
            replicas: None,
            recheck_after: None,
        }
    }

    /// `Running` and ready.
    pub fn running(message: impl Into<String>) -> Self {
        Self {
            phase: Phase::Running,
            message: message.into(),
            ready: true,
            reason: crate::conditions::reasons::DEPLOYMENT_READY.to_string(),
            endpoint: None,
            replicas: None,
            recheck_after: None,
        }
    }

    /// `Failed`, not ready, with the upstream's reason and message.
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            phase: Phase::Failed,
            message: message.into(),
            ready: false,
            reason: crate::conditions::reasons::DEPLOYMENT_FAILED.to_string(),
            endpoint: None,
            replicas: None,
            recheck_after: None,
        }
    }

    /// With this endpoint.
    pub fn with_endpoint(mut self, service: impl Into<String>, port: i32) -> Self {
        self.endpoint = Some(EndpointStatus {
            service: Some(service.into()),
            port: Some(port),
        });
        self
    }

    /// Look again after `after` even if nothing changes.
    pub fn recheck_after(mut self, after: std::time::Duration) -> Self {
        self.recheck_after = Some(after);
        self
    }

    /// With these replica counts.
    pub fn with_replicas(mut self, desired: i32, ready: i32) -> Self {
        self.replicas = Some(ReplicaStatus {
            desired: Some(desired),
            ready: Some(ready),
            available: Some(ready),
        });
        self
    }
}

/// Build a [`DynamicObject`] from JSON (`apiVersion`, `kind`, `metadata.name` and the
/// rest). Keys come out sorted, so equal inputs give equal objects.
pub fn object(value: serde_json::Value) -> Result<DynamicObject, RenderError> {
    serde_json::from_value(value)
        .map_err(|e| RenderError(format!("rendered object is malformed: {e}")))
}

/// Flags for an engine in a stable order (sorted by key), as `--key value` pairs; a value
/// of `"true"` gives a bare `--key` flag. Keys may be given with or without `--`.
pub fn engine_flags(args: Option<&BTreeMap<String, String>>) -> Vec<String> {
    let mut out = Vec::new();
    for (key, value) in args.into_iter().flatten() {
        let flag = if key.starts_with("--") {
            key.clone()
        } else {
            format!("--{key}")
        };
        out.push(flag);
        if value != "true" {
            out.push(value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_flags_are_sorted_and_bare_for_true() {
        let args: BTreeMap<String, String> = [
            ("quantization".to_string(), "awq".to_string()),
            ("--enforce-eager".to_string(), "true".to_string()),
            ("gpu-memory-utilization".to_string(), "0.9".to_string()),
        ]
        .into();
        assert_eq!(
            engine_flags(Some(&args)),
            [
                "--enforce-eager",
                "--gpu-memory-utilization",
                "0.9",
                "--quantization",
                "awq"
            ]
        );
        assert!(engine_flags(None).is_empty());
    }
}
