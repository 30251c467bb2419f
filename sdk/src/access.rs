//! Whether the requester of an admission may itself create pods in a namespace, asked of
//! the API server's authorizer (a SubjectAccessReview): for what the platform then creates
//! with an identity of its own on that user's behalf (a warmup custom action's pods), so
//! that nobody gets a pod through the platform that they could not create directly. One
//! home for core's ModelDeployment webhook and the kernel-cache Warmup webhook.
//!
//! [`may_create_pods`] and [`refusal`] are pure; [`ask`] is the one request.

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::core::admission::AdmissionResponse;

/// The review of whether `user` (the admission request's userInfo: name, uid, groups and
/// extra, all of which the authorizer may use) may create pods in `namespace`.
pub fn may_create_pods(user: &UserInfo, namespace: Option<&str>) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: namespace.map(str::to_string),
                verb: Some("create".into()),
                group: Some(String::new()),
                version: Some("v1".into()),
                resource: Some("pods".into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// The refusal, naming `field` (what would run the pods), for the authorizer's answer
/// `status` to `review`; `None` when allowed. An explicit `denied` wins over `allowed`,
/// as the API defines them.
pub fn refusal(
    field: &str,
    review: &SubjectAccessReview,
    status: &SubjectAccessReviewStatus,
) -> Option<String> {
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
        "{field}: user {user:?} may not create pods in namespace {namespace:?}{why}, and a \
         custom action runs a pod on every node it warms: ask for that right, or warm up \
         without a custom action"
    ))
}

/// Ask the API server `review`; the refusal naming `field`, if any. A review that cannot
/// be asked is a refusal too (fail closed: a pod nobody checked is never admitted).
pub async fn ask(client: &Client, field: &str, review: &SubjectAccessReview) -> Option<String> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    match api.create(&PostParams::default(), review).await {
        Ok(answer) => refusal(field, review, &answer.status.unwrap_or_default()),
        Err(e) => Some(format!(
            "{field}: could not check that the requesting user may create pods here \
             (SubjectAccessReview: {e}); try again"
        )),
    }
}

/// `resp` denied with `refusal` as the API server's own authorizer answers: 403 Forbidden.
pub fn forbidden(resp: AdmissionResponse, refusal: impl ToString) -> AdmissionResponse {
    let mut resp = resp.deny(refusal);
    resp.result.code = 403;
    resp.result.reason = "Forbidden".into();
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn alice() -> UserInfo {
        UserInfo {
            username: Some("alice".into()),
            uid: Some("42".into()),
            groups: Some(vec!["devs".into(), "system:authenticated".into()]),
            extra: Some(BTreeMap::from([(
                "scopes".to_string(),
                vec!["a".to_string(), "b".to_string()],
            )])),
        }
    }

    #[test]
    fn the_review_asks_as_the_requester_with_every_attribute() {
        let spec = may_create_pods(&alice(), Some("team-a")).spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        assert_eq!(spec.uid.as_deref(), Some("42"));
        assert_eq!(spec.groups, alice().groups);
        assert_eq!(spec.extra, alice().extra);
        let attributes = spec.resource_attributes.unwrap();
        assert_eq!(
            (
                attributes.namespace.as_deref(),
                attributes.verb.as_deref(),
                attributes.group.as_deref(),
                attributes.resource.as_deref()
            ),
            (Some("team-a"), Some("create"), Some(""), Some("pods"))
        );
        assert!(spec.non_resource_attributes.is_none());
    }

    #[test]
    fn a_refusal_names_the_field_the_user_the_namespace_and_the_reason() {
        let review = may_create_pods(&alice(), Some("team-a"));
        let allowed = SubjectAccessReviewStatus {
            allowed: true,
            ..Default::default()
        };
        assert_eq!(refusal("spec.customAction", &review, &allowed), None);
        let denied = SubjectAccessReviewStatus {
            reason: Some("no RBAC policy matched".into()),
            ..Default::default()
        };
        let message = refusal("spec.customAction", &review, &denied).unwrap();
        for part in [
            "spec.customAction",
            "\"alice\"",
            "\"team-a\"",
            "no RBAC policy matched",
        ] {
            assert!(message.contains(part), "{part}: {message}");
        }
        let both = SubjectAccessReviewStatus {
            allowed: true,
            denied: Some(true),
            ..Default::default()
        };
        assert!(refusal("f", &review, &both).is_some());
    }
}
