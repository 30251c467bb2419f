//! The charts' ValidatingAdmissionPolicies, enforced by the test API server, which runs
//! k8s.io/apiserver's ValidatingAdmissionPolicy plugin as kube-apiserver does.
//!
//! A test applies a chart's rendered policies and bindings ([`apply`]), waits until the
//! plugin enforces them ([`until_denied`]: the plugin reads policies through informers and
//! recompiles what changed about once a second, `policyRefreshInterval` in
//! k8s.io/apiserver `pkg/admission/plugin/policy/generic/policy_source.go`@v0.36.4), then
//! shows what each policy refuses ([`denial`]) and admits.

use std::future::Future;

use kube::Client;
use serde_json::Value;

/// The kinds [`apply`] applies.
pub const KINDS: &[&str] = &[
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// Server-side apply the policies and bindings of the rendered chart `objects` as `admin`.
pub async fn apply(admin: &Client, objects: &[Value]) -> anyhow::Result<()> {
    crate::helm::apply_kinds(admin, objects, KINDS).await
}

/// The message of `result` when it is the API server's refusal by the policy `policy`.
/// The plugin refuses with the reason its validation gives, `Invalid` (422) when it gives
/// none, naming the policy and its binding (`validating/dispatcher.go`@v0.36.4).
pub fn denial<T>(result: &kube::Result<T>, policy: &str) -> Option<String> {
    match result {
        Err(kube::Error::Api(status))
            if status.message.contains(&format!(
                "ValidatingAdmissionPolicy '{policy}' with binding"
            )) =>
        {
            Some(status.message.clone())
        }
        _ => None,
    }
}

/// Retry `attempt`, a request the policy `policy` refuses, until the API server refuses it
/// by that policy (at most 30 s); the refusal's message. Make `attempt` a dry run: what
/// it sends before the policy is enforced must change nothing.
pub async fn until_denied<T, F, Fut>(policy: &str, attempt: F) -> anyhow::Result<String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = kube::Result<T>>,
{
    let mut attempt = attempt;
    crate::eventually(30, &format!("the policy {policy} enforced"), || {
        let sent = attempt();
        async move { denial(&sent.await, policy) }
    })
    .await
}

/// Apply the policies and bindings of the rendered chart `objects` as `admin`, then wait
/// until the policy whose name ends with `suffix` refuses `component` (its service
/// account's client) a ConfigMap named `probe` in `ns` without labels (a dry run): the
/// policy's name and the refusal's message.
pub async fn enforce_by_configmap(
    admin: &Client,
    component: &Client,
    objects: &[Value],
    suffix: &str,
    ns: &str,
    probe: &str,
) -> anyhow::Result<(String, String)> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};
    let name = crate::helm::of_kind(objects, "ValidatingAdmissionPolicy")
        .iter()
        .find_map(|p| {
            p["metadata"]["name"]
                .as_str()
                .filter(|n| n.ends_with(suffix))
        })
        .ok_or_else(|| anyhow::anyhow!("no ValidatingAdmissionPolicy named *{suffix}"))?
        .to_string();
    apply(admin, objects).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(component.clone(), ns);
    let probe: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": probe}}))?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let message = until_denied(&name, || configmaps.create(&dry_run, &probe)).await?;
    Ok((name, message))
}

/// Assert that `result` is the API server's refusal by the policy `policy` with a message
/// ending in `message` (the policy's message for the validation that failed).
#[track_caller]
pub fn assert_denied<T: std::fmt::Debug>(result: &kube::Result<T>, policy: &str, message: &str) {
    let Some(denial) = denial(result, policy) else {
        panic!("expected a refusal by {policy}: {result:?}")
    };
    assert!(
        denial.ends_with(message),
        "{policy} refused with another message: {denial}"
    );
}
