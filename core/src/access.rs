//! Whether the author of a ModelDeployment may do what it asks the platform to do on its
//! behalf. An inline warmup custom action (`spec.warmup.customAction`) becomes a pod on
//! every node the warmup targets, created by the warmup controller's identity, which
//! admission policies and audit keyed on the user do not see. So the validating webhook
//! admits one only from a user the API server's authorizer lets create pods in that
//! namespace ([`kubeairunway_sdk::access`]), on creation and whenever the action changes.

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::access::may_create_pods;
use kubeairunway_sdk::api::warmup::CustomAction;

/// The field whose author must be allowed to create pods.
pub const CUSTOM_ACTION_FIELD: &str = "spec.warmup.customAction";

/// The inline custom action of `md`, if it has one.
fn custom_action(md: &ModelDeployment) -> Option<&CustomAction> {
    let warmup = md.spec.warmup.as_ref().filter(|w| w.is_inline())?;
    warmup.custom_action.as_ref()
}

/// The SubjectAccessReview to ask before admitting `new` (the request's object, `old` its
/// previous version on update): whether the requesting user may create pods in the
/// namespace. `None` when nothing new would run: no inline custom action, or the same one
/// as before.
pub fn review_for(
    req: &AdmissionRequest<DynamicObject>,
    new: &ModelDeployment,
    old: Option<&ModelDeployment>,
) -> Option<SubjectAccessReview> {
    let action = custom_action(new)?;
    if req.operation == Operation::Update && old.and_then(custom_action) == Some(action) {
        return None;
    }
    Some(may_create_pods(&req.user_info, req.namespace.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn md(warmup: &Value) -> ModelDeployment {
        serde_json::from_value(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "team-a"},
            "spec": {"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}, "warmup": warmup},
        }))
        .unwrap()
    }

    fn request(
        operation: &str,
        object: &ModelDeployment,
        old: Option<&ModelDeployment>,
    ) -> AdmissionRequest<DynamicObject> {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "operation": operation, "name": "m", "namespace": "team-a",
                "kind": {"group": "kubeairunway.ai", "version": "v1alpha1", "kind": "ModelDeployment"},
                "resource": {"group": "kubeairunway.ai", "version": "v1alpha1", "resource": "modeldeployments"},
                "userInfo": {"username": "alice", "groups": ["devs"]},
                "object": object, "oldObject": old,
            },
        });
        let review: kube::core::admission::AdmissionReview<DynamicObject> =
            serde_json::from_value(review).unwrap();
        review.try_into().unwrap()
    }

    fn action(image: &str) -> Value {
        json!({"customAction": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": image}]}}}})
    }

    #[test]
    fn a_new_custom_action_is_checked_as_its_author_in_its_namespace() {
        let new = md(&action("dl:1"));
        let spec = review_for(&request("CREATE", &new, None), &new, None)
            .unwrap()
            .spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        let attributes = spec.resource_attributes.unwrap();
        assert_eq!(attributes.namespace.as_deref(), Some("team-a"));
        assert_eq!(attributes.resource.as_deref(), Some("pods"));
    }

    #[test]
    fn only_a_changed_inline_action_is_checked() {
        let (one, two) = (md(&action("dl:1")), md(&action("dl:2")));
        let update = |new: &ModelDeployment, old: &ModelDeployment| {
            review_for(&request("UPDATE", new, Some(old)), new, Some(old))
        };
        assert!(update(&one, &one).is_none(), "unchanged: already admitted");
        assert!(update(&two, &one).is_some(), "changed");
        let none = md(&json!({"imagesPreload": {"items": ["x"]}}));
        assert!(update(&one, &none).is_some(), "added");
        assert!(update(&none, &one).is_none(), "removed");
        let named = md(&json!({"name": "mine"}));
        assert!(
            review_for(&request("CREATE", &named, None), &named, None).is_none(),
            "a Warmup of the user's own: the Warmup's webhook checked its author"
        );
    }
}
