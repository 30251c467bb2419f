//! Labels and annotations with a meaning across the platform.

/// Annotation that stops every controller from reconciling a ModelDeployment while it is
/// `"true"`.
pub const RECONCILE_PAUSED: &str = "kubeairunway.ai/reconcile-paused";

/// Label put on every object a kubeairunway controller creates.
pub const MANAGED_BY: &str = "kubeairunway.ai/managed-by";
/// Value of [`MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "kubeairunway";

/// Label put on every serving pod template, naming the ModelDeployment it serves. The
/// kernel-cache webhook selects pods by it.
pub const MODEL_DEPLOYMENT: &str = "kubeairunway.ai/model-deployment";

/// Label put on every upstream object, naming the provider that manages it.
pub const PROVIDER: &str = "kubeairunway.ai/provider";

/// Annotation on the primary upstream object: a hash of the ModelDeployment's identity
/// fields (`model.id`, `model.source`, `engine.type`, `provider.name`,
/// `serving.mode`). When it no longer matches, the object is deleted and recreated.
pub const IDENTITY: &str = "kubeairunway.ai/identity";

/// Annotation on the primary upstream object: a hash of the values it renders at the
/// paths its upstream declares immutable ([`crate::Provider::immutable_fields`]). When
/// it no longer matches, the object is deleted and recreated, since an update would be
/// refused.
pub const IMMUTABLE_HASH: &str = "kubeairunway.ai/immutable-hash";

/// Annotation on the primary upstream object: the replicas of each role of the
/// ModelDeployment it was rendered for ([`crate::render::scale`]: `replicas=2`, plus
/// `prefill=` and `decode=` when set). The warmup gate compares it with the spec to tell
/// a scale-up, whichever field the upstream keeps its replicas in.
pub const SCALE: &str = "kubeairunway.ai/scale";

/// Annotation on the primary upstream object: the container images of every object
/// rendered with it ([`crate::render::images`], comma-separated), as rendered, before an
/// admission webhook may rewrite them. The warmup gate compares them with a new rendering
/// to tell an upgrade.
pub const IMAGES: &str = "kubeairunway.ai/images";

/// Annotation on every applied object: a hash of the object as rendered. The runtime
/// applies an object again only when this changes or the live object drifted from it.
pub const RENDERED_HASH: &str = "kubeairunway.ai/rendered-hash";

/// Prefix of the ModelDeployment labels that providers copy onto the upstream object.
pub const PROPAGATED_PREFIX: &str = "kubeairunway.ai/";

/// Whether the object carrying these annotations asks controllers to stand still.
pub fn is_paused(annotations: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(RECONCILE_PAUSED))
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn paused_only_when_true() {
        let mut a = BTreeMap::new();
        assert!(!is_paused(None));
        assert!(!is_paused(Some(&a)));
        a.insert(RECONCILE_PAUSED.to_string(), "false".to_string());
        assert!(!is_paused(Some(&a)));
        a.insert(RECONCILE_PAUSED.to_string(), "True".to_string());
        assert!(is_paused(Some(&a)));
    }
}
