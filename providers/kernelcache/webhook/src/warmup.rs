//! The Warmup validating webhook (`POST /validate-warmup`). A Warmup's custom action
//! (`spec.customAction`) becomes a pod on every node it targets, created by the warmup
//! controller's identity; so a Warmup with one is admitted only from a user the API
//! server's authorizer lets create pods in its namespace (`kubeairunway_sdk::access`), on
//! creation and whenever the action changes. Other Warmups, and other changes, are
//! admitted as they are.
//!
//! [`review_for`] is pure; [`validate`] asks the API server once at most.

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::Client;
use kube::Resource as _;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kubeairunway_sdk::access;
use kubeairunway_sdk::api::warmup::Warmup;

/// Path of the Warmup validating webhook.
pub const VALIDATE_WARMUP_PATH: &str = "/validate-warmup";
/// The field whose author must be allowed to create pods.
pub const CUSTOM_ACTION_FIELD: &str = "spec.customAction";

fn custom_action(object: Option<&DynamicObject>) -> Option<&serde_json::Value> {
    object?
        .data
        .pointer("/spec/customAction")
        .filter(|v| !v.is_null())
}

/// The SubjectAccessReview to ask before admitting `req`: whether its user may create pods
/// in the Warmup's namespace. `None` when nothing new would run: no custom action, the
/// same one as before, or not a create or update.
pub fn review_for(req: &AdmissionRequest<DynamicObject>) -> Option<SubjectAccessReview> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return None;
    }
    let action = custom_action(req.object.as_ref())?;
    if req.operation == Operation::Update && custom_action(req.old_object.as_ref()) == Some(action)
    {
        return None;
    }
    Some(access::may_create_pods(
        &req.user_info,
        req.namespace.as_deref(),
    ))
}

/// Answer a request body: with `client`, ask the API server the review [`review_for`]
/// names (a refusal is 403 Forbidden; a review that cannot be asked refuses); without one,
/// admit. A body that is not a Warmup's AdmissionReview is refused with the reason.
pub async fn validate(body: &[u8], client: Option<&Client>) -> AdmissionResponse {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(e) => return AdmissionResponse::invalid(format!("malformed AdmissionReview: {e}")),
    };
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(req) => req,
        Err(_) => return AdmissionResponse::invalid("AdmissionReview without a request"),
    };
    let resp = AdmissionResponse::from(&req);
    if req.kind.group != Warmup::group(&()) || req.kind.kind != Warmup::kind(&()) {
        let what = format!("{}/{} {}", req.kind.group, req.kind.version, req.kind.kind);
        return resp.deny(format!("this webhook admits Warmups, not {what}"));
    }
    match (review_for(&req), client) {
        (Some(review), Some(client)) => {
            match access::ask(client, CUSTOM_ACTION_FIELD, &review).await {
                Some(refusal) => access::forbidden(resp, refusal),
                None => resp,
            }
        }
        _ => resp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[allow(clippy::needless_pass_by_value)] // reads better at the call sites
    fn review(operation: &str, object: Value, old: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "operation": operation, "name": "w", "namespace": "team-a",
                "kind": {"group": "cache.kubeairunway.ai", "version": "v1alpha1", "kind": "Warmup"},
                "resource": {"group": "cache.kubeairunway.ai", "version": "v1alpha1", "resource": "warmups"},
                "userInfo": {"username": "alice", "groups": ["devs"]},
                "object": object, "oldObject": old,
            },
        }))
        .unwrap()
    }

    fn warmup(action: Option<&str>) -> Value {
        let mut spec = json!({"imagesPreload": {"items": ["x"]}});
        if let Some(image) = action {
            spec["customAction"] =
                json!({"podTemplate": {"spec": {"containers": [{"name": "c", "image": image}]}}});
        }
        json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "Warmup",
               "metadata": {"name": "w", "namespace": "team-a"}, "spec": spec})
    }

    fn request(body: &[u8]) -> AdmissionRequest<DynamicObject> {
        serde_json::from_slice::<AdmissionReview<DynamicObject>>(body)
            .unwrap()
            .try_into()
            .unwrap()
    }

    #[test]
    fn only_a_new_or_changed_custom_action_is_checked_as_its_author() {
        let asks = |op: &str, new: Option<&str>, old: Option<&str>| {
            let old = if op == "UPDATE" {
                warmup(old)
            } else {
                Value::Null
            };
            review_for(&request(&review(op, warmup(new), old)))
        };
        let spec = asks("CREATE", Some("dl:1"), None).unwrap().spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        let attributes = spec.resource_attributes.unwrap();
        assert_eq!(attributes.namespace.as_deref(), Some("team-a"));
        assert_eq!(attributes.resource.as_deref(), Some("pods"));
        assert!(asks("CREATE", None, None).is_none(), "no custom action");
        assert!(
            asks("UPDATE", Some("dl:1"), Some("dl:1")).is_none(),
            "unchanged"
        );
        assert!(
            asks("UPDATE", Some("dl:2"), Some("dl:1")).is_some(),
            "changed"
        );
        assert!(asks("UPDATE", Some("dl:1"), None).is_some(), "added");
        assert!(asks("UPDATE", None, Some("dl:1")).is_none(), "removed");
    }

    #[tokio::test]
    async fn anything_but_a_warmups_review_is_refused_with_the_reason() {
        let not_json = validate(b"{", None).await;
        assert!(!not_json.allowed && not_json.result.message.contains("malformed"));
        let mut pod =
            serde_json::from_slice::<Value>(&review("CREATE", warmup(None), Value::Null)).unwrap();
        pod["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
        let pod = validate(&serde_json::to_vec(&pod).unwrap(), None).await;
        assert!(
            !pod.allowed && pod.result.message.contains("not /v1 Pod"),
            "{:?}",
            pod.result
        );
        let plain = validate(&review("CREATE", warmup(None), Value::Null), None).await;
        assert!(plain.allowed);
    }
}
