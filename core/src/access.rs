//! Whether the author of a ModelDeployment may do what it asks the platform to do on its
//! behalf. An inline warmup custom action (`spec.warmup.customAction`) becomes a pod on
//! every node the warmup targets, created by the warmup controller's identity, which
//! admission policies and audit keyed on the user do not see. So the validating webhook
//! admits one only from a user the API server's authorizer lets create pods in that
//! namespace (a SubjectAccessReview), on creation and whenever the action changes.
//!
//! [`review_for`] and [`decide`] are pure; [`ask`] is the one request.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::api::{Api, PostParams};
use kube::core::admission::{AdmissionRequest, Operation};
use kube::{Client, api::DynamicObject};
use kubeairunway_sdk::ModelDeployment;
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
    let user = &req.user_info;
    Some(SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: req.namespace.clone(),
                verb: Some("create".into()),
                group: Some(String::new()),
                version: Some("v1".into()),
                resource: Some("pods".into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    })
}

/// The refusal for the API server's answer `status` to `review`, `None` when allowed.
pub fn decide(review: &SubjectAccessReview, status: &SubjectAccessReviewStatus) -> Option<String> {
    if status.allowed && !status.denied.unwrap_or(false) {
        return None;
    }
    let user = review.spec.user.as_deref().unwrap_or("(anonymous)");
    let namespace = review
        .spec
        .resource_attributes
        .as_ref()
        .and_then(|a| a.namespace.as_deref())
        .unwrap_or_default();
    let why = match status.reason.as_deref().filter(|r| !r.is_empty()) {
        Some(reason) => format!(" ({reason})"),
        None => String::new(),
    };
    Some(format!(
        "{CUSTOM_ACTION_FIELD}: user {user:?} may not create pods in namespace {namespace:?}{why}, \
         and a custom action runs a pod on every node it warms: ask for that right, or warm up \
         without a custom action"
    ))
}

/// Ask the API server `review`; the refusal, if any. A review that cannot be asked is a
/// refusal too (the webhook fails closed: a pod nobody checked is never admitted).
pub async fn ask(client: &Client, review: &SubjectAccessReview) -> Option<String> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    match api.create(&PostParams::default(), review).await {
        Ok(answer) => decide(review, &answer.status.unwrap_or_default()),
        Err(e) => Some(format!(
            "{CUSTOM_ACTION_FIELD}: could not check that the requesting user may create pods \
             here (SubjectAccessReview: {e}); try again"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    /// `extra` of a user as the review carries it.
    fn extra(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(ToString::to_string).collect()))
            .collect()
    }

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
                "userInfo": {"username": "alice", "uid": "42", "groups": ["devs", "system:authenticated"],
                             "extra": {"scopes": ["a", "b"]}},
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
    fn a_new_custom_action_is_checked_as_its_author_with_every_attribute() {
        let new = md(&action("dl:1"));
        let review = review_for(&request("CREATE", &new, None), &new, None).unwrap();
        let spec = review.spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        assert_eq!(spec.uid.as_deref(), Some("42"));
        assert_eq!(
            spec.groups,
            Some(vec!["devs".to_string(), "system:authenticated".to_string()])
        );
        assert_eq!(spec.extra, Some(extra(&[("scopes", &["a", "b"])])));
        let attributes = spec.resource_attributes.unwrap();
        assert_eq!(attributes.namespace.as_deref(), Some("team-a"));
        assert_eq!(attributes.verb.as_deref(), Some("create"));
        assert_eq!(attributes.resource.as_deref(), Some("pods"));
        assert_eq!(attributes.group.as_deref(), Some(""));
        assert!(spec.non_resource_attributes.is_none());
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
            "a Warmup of the user's own: its author wrote it"
        );
    }

    #[test]
    fn a_refusal_names_the_field_the_user_the_namespace_and_the_reason() {
        let new = md(&action("dl:1"));
        let review = review_for(&request("CREATE", &new, None), &new, None).unwrap();
        let allowed = SubjectAccessReviewStatus {
            allowed: true,
            ..Default::default()
        };
        assert_eq!(decide(&review, &allowed), None);
        let denied = SubjectAccessReviewStatus {
            allowed: false,
            reason: Some("no RBAC policy matched".into()),
            ..Default::default()
        };
        let message = decide(&review, &denied).unwrap();
        for part in [
            CUSTOM_ACTION_FIELD,
            "\"alice\"",
            "\"team-a\"",
            "no RBAC policy matched",
        ] {
            assert!(message.contains(part), "{part}: {message}");
        }
        // An explicit deny wins over allowed (the API's contract for `denied`).
        let both = SubjectAccessReviewStatus {
            allowed: true,
            denied: Some(true),
            ..Default::default()
        };
        assert!(decide(&review, &both).is_some());
    }
}
