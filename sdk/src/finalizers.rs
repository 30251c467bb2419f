//! Finalizers changed the one way every controller of the platform changes them: the whole
//! list written by a merge patch guarded by the resourceVersion that was read. Another
//! writer's change in between (its own finalizer added or removed) makes the patch fail
//! with a conflict and the reconcile run again on the fresh object, so no writer ever
//! erases another's finalizer.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

/// The finalizer of the provider named `provider`: `kubeairunway.ai/<provider>-provider`.
/// It holds a ModelDeployment until that provider has deleted what it made for it. Core's
/// mutating webhook writes it at admission for the provider core will select; a provider
/// adds it itself before its first write when it is missing.
pub fn of_provider(provider: &str) -> String {
    format!("kubeairunway.ai/{provider}-provider")
}

/// The provider whose finalizer `finalizer` is, if it is a provider's.
pub fn provider_of(finalizer: &str) -> Option<&str> {
    finalizer
        .strip_prefix("kubeairunway.ai/")?
        .strip_suffix("-provider")
        .filter(|p| !p.is_empty())
}

/// The finalizers of `object` with `finalizer` added; `None` when it is there already.
pub fn with(object: &impl Resource, finalizer: &str) -> Option<Vec<String>> {
    let finalizers = object.finalizers();
    if finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    let mut list = finalizers.to_vec();
    list.push(finalizer.to_string());
    Some(list)
}

/// The finalizers of `object` without those `drop` picks.
pub fn without(object: &impl Resource, drop: impl Fn(&str) -> bool) -> Vec<String> {
    object
        .finalizers()
        .iter()
        .filter(|f| !drop(f))
        .cloned()
        .collect()
}

/// Write `finalizers` as the finalizers of `object`, as read (its resourceVersion).
/// Whether it was written: an object that is gone is not an error (there is nothing left
/// to hold), and answers `false`.
pub async fn replace<K>(api: &Api<K>, object: &K, finalizers: &[String]) -> kube::Result<bool>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": object.resource_version(),
    }});
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelDeployment;

    #[test]
    fn a_finalizer_is_added_once_and_others_are_kept_on_removal() {
        let md: ModelDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns", "finalizers": ["a", "ours"]},
            "spec": {"model": {"id": "a/b"}},
        }))
        .unwrap();
        assert_eq!(with(&md, "ours"), None);
        assert_eq!(
            with(&md, "b"),
            Some(vec!["a".into(), "ours".into(), "b".into()])
        );
        assert_eq!(without(&md, |f| f == "ours"), ["a"]);
        assert_eq!(without(&md, |_| false), ["a", "ours"]);
    }
}
