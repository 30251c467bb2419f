//! Condition types, reasons, and the one way every controller sets a condition.
//!
//! Each condition type has exactly one writer (the table "Who writes which status
//! fields" in the repository's docs/api.md): core writes [`VALIDATED`] and
//! [`PROVIDER_SELECTED`]; the serving provider writes [`PROVIDER_COMPATIBLE`],
//! [`RESOURCE_CREATED`], [`READY`], [`STALE_STATUS`] and (with `spec.warmup`)
//! [`WARMED_UP`]; the kernel-cache provider writes
//! [`KERNEL_CACHE_READY`] and [`MODEL_CACHE_READY`]. `status.conditions` is a list-map keyed by `type`, so each
//! writer server-side-applies only its own entries.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Core: the spec passed validation.
pub const VALIDATED: &str = "Validated";
/// Core: the engine is resolved (`spec.engine.type`, or chosen and recorded in
/// `status.engine`).
pub const ENGINE_SELECTED: &str = "EngineSelected";
/// Core (or a custom selector): a provider has been chosen.
pub const PROVIDER_SELECTED: &str = "ProviderSelected";
/// Provider: the provider can serve this spec with the installed upstream API.
pub const PROVIDER_COMPATIBLE: &str = "ProviderCompatible";
/// Provider: the upstream object exists.
pub const RESOURCE_CREATED: &str = "ResourceCreated";
/// Provider: the deployment serves requests.
pub const READY: &str = "Ready";
/// Provider: the upstream status has not moved for longer than expected.
pub const STALE_STATUS: &str = "StaleStatus";
/// Provider, on its InferenceProviderConfig: the upstream CRD is installed and an adapter
/// fits it.
pub const UPSTREAM_READY: &str = "UpstreamReady";
/// Kernel-cache provider: the requested kernel cache is staged and injectable.
pub const KERNEL_CACHE_READY: &str = "KernelCacheReady";
/// Kernel-cache provider: whether serving pods started now mount a model cache (`True`:
/// which one, at which commit), and why not when one is named or holds the model.
pub const MODEL_CACHE_READY: &str = "ModelCacheReady";
/// Provider, only with `spec.warmup`: its Warmup (named, or made for an inline one)
/// completed and the upstream objects may be created (`True`), or what creating them
/// waits for (`False`).
pub const WARMED_UP: &str = "WarmedUp";
/// The gateway (core) routes to the model through a Gateway (`spec.gateway.enabled`);
/// reasons in `kubeairunway_core::gateway::reasons`.
pub const GATEWAY_READY: &str = "GatewayReady";

/// Condition reasons used by the platform's own controllers.
pub mod reasons {
    /// `Validated=True`.
    pub const VALIDATION_PASSED: &str = "ValidationPassed";
    /// `Validated=False`.
    pub const VALIDATION_FAILED: &str = "ValidationFailed";
    /// `ProviderSelected=True`, chosen by the CEL selector; `EngineSelected=True`, chosen
    /// from the providers' capabilities.
    pub const AUTO_SELECTED: &str = "AutoSelected";
    /// `ProviderSelected=True`, named in `spec.provider.name`; `EngineSelected=True`,
    /// named in `spec.engine.type`.
    pub const EXPLICIT: &str = "ExplicitSelection";
    /// `EngineSelected=False`: no engine can be served for the spec (the message says
    /// why, per engine).
    pub const NO_ENGINE: &str = "NoSuitableEngine";
    /// `ProviderSelected=False`: no provider fits.
    pub const NO_PROVIDER: &str = "NoSuitableProvider";
    /// `ProviderSelected=False`: no provider is registered and healthy.
    pub const NO_HEALTHY_PROVIDERS: &str = "NoHealthyProviders";
    /// `ProviderSelected=False`: the built-in selector is off and nothing chose yet.
    pub const AWAITING_SELECTOR: &str = "AwaitingSelection";
    /// `ProviderSelected=False`: the provider named in `spec.provider.name` is not
    /// registered (no InferenceProviderConfig).
    pub const PROVIDER_NOT_INSTALLED: &str = "ProviderNotInstalled";
    /// `ProviderSelected=False`: the provider named in `spec.provider.name` registers only
    /// capabilities (such as a kernel cache) and serves no model.
    pub const PROVIDER_DOES_NOT_SERVE: &str = "ProviderDoesNotServe";
    /// `ProviderCompatible=True`.
    pub const COMPATIBILITY_VERIFIED: &str = "CompatibilityVerified";
    /// `ProviderCompatible=False`: the provider cannot serve this spec.
    pub const INCOMPATIBLE: &str = "IncompatibleConfiguration";
    /// `ProviderCompatible=False`: the installed upstream CRD lacks fields we render.
    pub const UPSTREAM_SCHEMA_MISMATCH: &str = "UpstreamSchemaMismatch";
    /// `ProviderCompatible=False`: the upstream CRD is not installed.
    pub const UPSTREAM_CRD_MISSING: &str = "UpstreamCRDMissing";
    /// `ProviderCompatible=False`: the upstream is a built-in kind the API server does not
    /// serve (no CRD can add it).
    pub const UPSTREAM_API_MISSING: &str = "UpstreamAPIMissing";
    /// `UpstreamReady=True`.
    pub const UPSTREAM_DETECTED: &str = "UpstreamDetected";
    /// `ProviderCompatible=False`: the spec has a value this provider cannot use.
    pub const INVALID_CONFIGURATION: &str = "InvalidConfiguration";
    /// `ProviderCompatible=False`: `spec.provider.overrides` sets a path the installed
    /// upstream schema lacks, or a value of another type, there (the message names each).
    pub const INVALID_OVERRIDE: &str = "InvalidOverride";
    /// `ProviderCompatible=False`: `spec.provider.overrides` touches a field the runtime
    /// owns on the upstream object (its name, namespace, owner references, the
    /// platform's labels and annotations).
    pub const RUNTIME_OWNED_OVERRIDE: &str = "RuntimeOwnedOverride";
    /// `ProviderCompatible=False`: `spec.provider.overrides` sets a pod field the Pod
    /// Security Standards' baseline keeps from tenants (host namespaces, privileged
    /// containers, host paths, another service account or node).
    pub const UNSAFE_OVERRIDE: &str = "UnsafeOverride";
    /// `ResourceCreated=True`.
    pub const RESOURCE_CREATED: &str = "ResourceCreated";
    /// `ResourceCreated=False`: the API server or an upstream admission webhook refused
    /// an object (the message quotes the refusal).
    pub const RESOURCE_REJECTED: &str = "ResourceRejected";
    /// `ResourceCreated=False`: an object of the name the provider renders exists and is
    /// not owned by the ModelDeployment; it is never taken over.
    pub const RESOURCE_CONFLICT: &str = "ResourceConflict";
    /// `ProviderCompatible=True`, but some spec fields are ignored by this provider (the
    /// message names them).
    pub const COMPATIBLE_WITH_IGNORED_FIELDS: &str = "CompatibleWithIgnoredFields";
    /// Warning event: a spec field this provider cannot honour is ignored.
    pub const UNSUPPORTED_FIELD: &str = "UnsupportedField";
    /// `Ready=True`.
    pub const DEPLOYMENT_READY: &str = "DeploymentReady";
    /// `Ready=False` while the upstream operator works.
    pub const DEPLOYMENT_PROGRESSING: &str = "DeploymentProgressing";
    /// `Ready=False` on a hard upstream failure.
    pub const DEPLOYMENT_FAILED: &str = "DeploymentFailed";
    /// `StaleStatus=True`.
    pub const STATUS_NOT_UPDATED: &str = "UpstreamStatusNotUpdated";
    /// `WarmedUp=True`: the Warmup of `spec.warmup` completed.
    pub const WARMUP_COMPLETED: &str = "WarmupCompleted";
    /// `WarmedUp=True`: the upstream objects exist and the spec brings nothing new onto
    /// a node (no more replicas, no new image), so the Warmup, whatever its state, holds
    /// nothing back.
    pub const ALREADY_CREATED: &str = "AlreadyCreated";
    /// `WarmedUp=False` (and, while nothing is created yet, `ResourceCreated` and
    /// `Ready`): the Warmup is pending or in progress; the creation, scale-up or upgrade
    /// waits for it.
    pub const AWAITING_WARMUP: &str = "AwaitingWarmup";
    /// `WarmedUp=False`: the Warmup completed, but did not preload the images an upgrade
    /// adds (a Warmup runs once); the upgrade waits until a Warmup of that name preloads
    /// them.
    pub const WARMUP_OUTDATED: &str = "WarmupOutdated";
    /// `WarmedUp=False`: an inline `spec.warmup` cannot be made: a Warmup of its name
    /// (the ModelDeployment's) exists that the ModelDeployment does not own.
    pub const WARMUP_CONFLICT: &str = "WarmupConflict";
    /// `WarmedUp=False`: the named Warmup does not exist.
    pub const WARMUP_NOT_FOUND: &str = "WarmupNotFound";
    /// `WarmedUp=False`: the Warmup failed; nothing is created until it is replaced by
    /// one that completes, or `spec.warmup` is removed.
    pub const WARMUP_FAILED: &str = "WarmupFailed";
    /// `WarmedUp=False`: Warmups cannot be read (the kind is not served: is the
    /// kernel-cache provider's warmup installed?).
    pub const WARMUP_UNAVAILABLE: &str = "WarmupUnavailable";
}

/// The three values of a condition's `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `"True"`
    True,
    /// `"False"`
    False,
    /// `"Unknown"`
    Unknown,
}

impl Status {
    /// The string the API stores.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Status {
    fn from(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

/// Find a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of this type is present and `"True"`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Build a condition stamped with `observed_generation`, reusing the
/// `lastTransitionTime` of `previous` when the status did not flip.
pub fn new(
    previous: Option<&Condition>,
    type_: &str,
    status: impl Into<Status>,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let status = status.into();
    let last_transition_time = match previous {
        Some(p) if p.status == status.as_str() => p.last_transition_time.clone(),
        _ => Time(now),
    };
    Condition {
        type_: type_.to_string(),
        status: status.as_str().to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation,
        last_transition_time,
    }
}

/// Set (insert or replace) a condition in `conditions`, keeping its
/// `lastTransitionTime` unless the status flips. Returns whether anything but the time
/// changed, so callers can skip a no-op write.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: impl Into<Status>,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> bool {
    let idx = conditions.iter().position(|c| c.type_ == type_);
    let cond = new(
        idx.map(|i| &conditions[i]),
        type_,
        status,
        reason,
        message,
        observed_generation,
        Timestamp::now(),
    );
    match idx {
        Some(i) if conditions[i] == cond => false,
        Some(i) => {
            conditions[i] = cond;
            true
        }
        None => {
            conditions.push(cond);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn keeps_transition_time_when_status_unchanged() {
        let first = new(
            None,
            READY,
            false,
            "A",
            "m1",
            Some(1),
            ts("2026-01-01T00:00:00Z"),
        );
        let second = new(
            Some(&first),
            READY,
            false,
            "B",
            "m2",
            Some(2),
            ts("2026-01-02T00:00:00Z"),
        );
        assert_eq!(second.last_transition_time, first.last_transition_time);
        assert_eq!(second.reason, "B");
        assert_eq!(second.observed_generation, Some(2));
    }

    #[test]
    fn new_transition_time_when_status_flips() {
        let first = new(
            None,
            READY,
            false,
            "A",
            "m",
            Some(1),
            ts("2026-01-01T00:00:00Z"),
        );
        let second = new(
            Some(&first),
            READY,
            true,
            "A",
            "m",
            Some(1),
            ts("2026-01-02T00:00:00Z"),
        );
        assert_eq!(
            second.last_transition_time,
            Time(ts("2026-01-02T00:00:00Z"))
        );
        assert_eq!(second.status, "True");
    }

    #[test]
    fn set_inserts_replaces_and_reports_changes() {
        let mut conds = Vec::new();
        assert!(set(
            &mut conds,
            READY,
            false,
            "Progressing",
            "wait",
            Some(1)
        ));
        assert!(!set(
            &mut conds,
            READY,
            false,
            "Progressing",
            "wait",
            Some(1)
        ));
        assert!(set(
            &mut conds,
            READY,
            true,
            "DeploymentReady",
            "ok",
            Some(1)
        ));
        assert!(set(
            &mut conds,
            VALIDATED,
            true,
            "ValidationPassed",
            "",
            Some(1)
        ));
        assert_eq!(conds.len(), 2);
        assert!(is_true(&conds, READY));
        assert!(!is_true(&conds, STALE_STATUS));
    }
}
