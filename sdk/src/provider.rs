//! The [`Provider`] trait: everything a provider decides, as pure functions.
//!
//! A provider says what it is ([`Provider::name`], [`Provider::config`]), which upstream
//! kind it targets and in which versions ([`Provider::upstream`]: any kind the API server
//! serves, a CRD's or a built-in one such as `apps/v1` Deployment), whether it can serve a
//! ModelDeployment ([`Provider::check`]), what to apply for it ([`Provider::render`]) and
//! how the live objects read as our status ([`Provider::observe`], over [`Live`]). None of
//! these does I/O; [`crate::runtime::run`] does all of it.

use std::collections::BTreeMap;

use kube::api::DynamicObject;

use crate::api::{
    EndpointStatus, InferenceProviderConfigSpec, ModelDeployment, Phase, ReplicaStatus,
};
use crate::upstream::UpstreamApi;
pub use crate::upstream::UpstreamRef;

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

    /// The upstream kind this provider renders as its primary object, and the versions it
    /// has adapters for: a CRD's kind or a built-in one; see [`UpstreamRef`].
    fn upstream(&self) -> UpstreamRef;

    /// Whether this provider can serve `md`, beyond what its capabilities say (a name
    /// its upstream refuses, a replica count or a setting it cannot serve). The runtime
    /// calls it only for a spec that fits the capabilities of [`Provider::config`]
    /// (engine, GPU or CPU, serving mode: [`crate::runtime::fit`]), so it never repeats
    /// those. The message becomes the `ProviderCompatible=False` condition and the phase
    /// is `Failed`. Default: no further refusal.
    fn check(&self, md: &ModelDeployment) -> Result<(), Incompatible> {
        let _ = md;
        Ok(())
    }

    /// The top-level keys of `spec.provider.overrides` this provider reads itself in
    /// [`Provider::render`] (with [`crate::overrides::parse`]): its own typed settings,
    /// such as Dynamo's `routerMode`. Every other key is a merge patch of the primary
    /// object, which the runtime merges after `render`, checked against the installed
    /// upstream schema ([`crate::overrides`]). Default: none.
    fn typed_overrides(&self) -> &'static [&'static str] {
        &[]
    }

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

    /// Our status for `md`, read from the live objects: every object [`Provider::render`]
    /// returned that exists, by kind and name ([`Live::primary`] is the first one). The
    /// runtime watches each of those kinds and calls this again whenever any of them
    /// changes.
    fn observe(&self, md: &ModelDeployment, live: &Live) -> Observed;

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

    /// The pods that serve `md`, as the upstream operator labels them, the port they serve
    /// on and the InferencePool the operator makes for them, if any (the one answer to
    /// "which pods serve this ModelDeployment": `status.selector` for the scale
    /// subresource, and the gateway's InferencePool). Cite the operator code that puts
    /// each label. Default: pods labelled `kubeairunway.ai/model-deployment=<name>`, no
    /// port known (no InferencePool is made).
    fn serving_pods(&self, md: &ModelDeployment) -> crate::serving::ServingPods {
        crate::serving::ServingPods::of(md)
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
    /// Warnings for the user (ignored settings); each becomes a
    /// Warning event once per spec generation.
    pub warnings: Vec<Warning>,
}

/// A warning about the spec that does not stop the deployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// Event reason, PascalCase (e.g. `UnsupportedField`).
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

    /// The spec fields `warnings` name as ignored ([`Warning::unsupported_field`]), in
    /// their order.
    pub fn ignored_fields(warnings: &[Warning]) -> Vec<&str> {
        warnings
            .iter()
            .filter_map(|w| w.ignored_field.as_deref())
            .collect()
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

    /// `Failed`, not ready, with the upstream's reason (the `Ready` condition's reason,
    /// e.g. `ImagePullError`, `ProgressDeadlineExceeded`) and message. A reason that is
    /// not a valid condition reason (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`) is made
    /// one from its words (`"image pull error"` becomes `ImagePullError`); an empty one
    /// is `DeploymentFailed`.
    pub fn failed(reason: &str, message: impl Into<String>) -> Self {
        Self {
            phase: Phase::Failed,
            message: message.into(),
            ready: false,
            reason: condition_reason(reason),
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
            ..EndpointStatus::default()
        });
        self
    }

    /// With an endpoint that has no Service of its own: the serving pods are reached
    /// through the InferencePool their operator makes (the runtime writes `targetPort`
    /// and `inferencePool` from [`Provider::serving_pods`]).
    pub fn with_pool_endpoint(mut self) -> Self {
        self.endpoint = Some(EndpointStatus::default());
        self
    }

    /// Look again after `after` even if nothing changes.
    pub fn recheck_after(mut self, after: std::time::Duration) -> Self {
        self.recheck_after = Some(after);
        self
    }

    /// With these replica counts (`status.replicas.desired` and `ready`). Available
    /// replicas stay unset unless the upstream reports them ([`Observed::with_available`]):
    /// ready is not available (a Deployment counts a pod available only after
    /// `minReadySeconds`).
    pub fn with_replicas(mut self, desired: i32, ready: i32) -> Self {
        let replicas = self.replicas.get_or_insert_with(ReplicaStatus::default);
        replicas.desired = Some(desired);
        replicas.ready = Some(ready);
        self
    }

    /// With the available replicas the upstream reports (`status.replicas.available`).
    pub fn with_available(mut self, available: i32) -> Self {
        self.replicas
            .get_or_insert_with(ReplicaStatus::default)
            .available = Some(available);
        self
    }
}

/// Whether `reason` is a valid condition reason (what the API server accepts in
/// `conditions[].reason`: `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, at most 1024
/// characters).
pub fn is_condition_reason(reason: &str) -> bool {
    let bytes = reason.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',' | b':');
    !bytes.is_empty()
        && bytes.len() <= 1024
        && bytes[0].is_ascii_alphabetic()
        && bytes.iter().all(inner)
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// `reason` as a valid condition reason: itself when valid, else its words in
/// PascalCase, else [`DEPLOYMENT_FAILED`](crate::conditions::reasons::DEPLOYMENT_FAILED).
fn condition_reason(reason: &str) -> String {
    if is_condition_reason(reason) {
        return reason.to_string();
    }
    let pascal: String = reason
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut chars = w.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect();
    let trimmed = pascal.trim_start_matches(|c: char| c.is_ascii_digit());
    if is_condition_reason(trimmed) {
        trimmed.chars().take(1024).collect()
    } else {
        crate::conditions::reasons::DEPLOYMENT_FAILED.to_string()
    }
}

/// The live objects of one ModelDeployment, as the runtime's watch caches hold them:
/// every object [`Provider::render`] returned that exists, by kind and name. The primary
/// object (the first rendered) is [`Live::primary`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Live {
    primary: Option<DynamicObject>,
    /// `(kind, object)` of the others, in the order rendered.
    others: Vec<(String, DynamicObject)>,
    primary_kind: String,
}

impl Live {
    /// Nothing exists yet.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The live primary object (`None` before it exists), and nothing else yet.
    pub fn new(primary: Option<DynamicObject>) -> Self {
        let primary_kind = primary.as_ref().map(kind_of).unwrap_or_default();
        Self {
            primary,
            others: Vec::new(),
            primary_kind,
        }
    }

    /// With `object`, which is not the primary, as live (its kind read from its `kind`).
    #[must_use]
    pub fn with(mut self, object: DynamicObject) -> Self {
        let kind = kind_of(&object);
        self.insert(&kind, object);
        self
    }

    /// Add `object` of `kind` (for objects whose `kind` field is not set, as in a list
    /// response), replacing one of that kind and name.
    pub fn insert(&mut self, kind: &str, object: DynamicObject) {
        let name = object.metadata.name.clone();
        self.others
            .retain(|(k, o)| !(k == kind && o.metadata.name == name));
        self.others.push((kind.to_string(), object));
    }

    /// Set the primary object and its kind.
    pub fn set_primary(&mut self, kind: &str, object: Option<DynamicObject>) {
        self.primary_kind = kind.to_string();
        self.primary = object;
    }

    /// The live primary object, `None` before it exists.
    pub fn primary(&self) -> Option<&DynamicObject> {
        self.primary.as_ref()
    }

    /// The live object of this kind (`Deployment`, `Service`) and name, the primary
    /// included.
    pub fn get(&self, kind: &str, name: &str) -> Option<&DynamicObject> {
        self.iter()
            .find(|(k, o)| *k == kind && o.metadata.name.as_deref() == Some(name))
            .map(|(_, o)| o)
    }

    /// Every live object with its kind, the primary first.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &DynamicObject)> {
        self.primary
            .iter()
            .map(|p| (self.primary_kind.as_str(), p))
            .chain(self.others.iter().map(|(k, o)| (k.as_str(), o)))
    }

    /// Whether no object exists.
    pub fn is_empty(&self) -> bool {
        self.primary.is_none() && self.others.is_empty()
    }
}

fn kind_of(object: &DynamicObject) -> String {
    object
        .types
        .as_ref()
        .map(|t| t.kind.clone())
        .unwrap_or_default()
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
    fn failed_keeps_a_valid_upstream_reason_and_mends_others() {
        assert_eq!(
            Observed::failed("ImagePullError", "m").reason,
            "ImagePullError"
        );
        assert_eq!(
            Observed::failed("DEPLOY_FAILED", "m").reason,
            "DEPLOY_FAILED"
        );
        assert_eq!(
            Observed::failed("image pull error", "m").reason,
            "ImagePullError"
        );
        assert_eq!(Observed::failed("", "m").reason, "DeploymentFailed");
        assert_eq!(Observed::failed("--", "m").reason, "DeploymentFailed");
        assert_eq!(Observed::failed("3 nodes", "m").reason, "Nodes");
        assert!(!is_condition_reason("Bad-"));
        assert!(is_condition_reason("a:b,c_d"));
    }

    #[test]
    fn replicas_leave_available_to_the_upstream() {
        let o = Observed::running("ok").with_replicas(3, 2);
        let r = o.replicas.clone().unwrap();
        assert_eq!((r.desired, r.ready, r.available), (Some(3), Some(2), None));
        let r = o.with_available(1).replicas.unwrap();
        assert_eq!(r.available, Some(1));
    }

    #[test]
    fn live_objects_by_kind_and_name() {
        let obj = |kind: &str, name: &str| -> DynamicObject {
            serde_json::from_value(
                serde_json::json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}),
            )
            .unwrap()
        };
        let mut live = Live::new(Some(obj("Deployment", "m"))).with(obj("Service", "m"));
        assert_eq!(
            live.primary().and_then(|p| p.metadata.name.as_deref()),
            Some("m")
        );
        assert!(live.get("Service", "m").is_some());
        assert!(live.get("Deployment", "m").is_some());
        assert!(live.get("Service", "other").is_none());
        live.insert("Service", obj("Service", "m"));
        assert_eq!(live.iter().count(), 2, "replaced, not added");
        assert!(Live::empty().is_empty());
        assert!(Live::empty().primary().is_none());
    }

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
