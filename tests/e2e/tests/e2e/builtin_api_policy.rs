//! ValidatingAdmissionPolicy in the test server, checked against what kube-apiserver does:
//! policies and bindings are served (a policy's status cleared on create and kept apart by
//! its status subresource, `metadata.generation` counting spec changes, kube's defaults
//! filled in), and k8s.io/apiserver's ValidatingAdmissionPolicy plugin enforces them:
//! CEL validations over the request and the object refuse what they reject, with the
//! policy's message, and the `authorizer` variable asks the server's RBAC authorizer.
//! The charts' own policies are exercised where their components run (`gateway`,
//! `modelcache_mount`, `kaito`).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kubeairunway_e2e::{policy, rbac};
use kubeairunway_testcluster::shared;
use serde_json::{Value, json};

fn config_map(name: &str, labels: &Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_policies_are_served_and_enforced() {
    let cluster = shared();
    let admin = cluster.client().await.unwrap();
    let ns = cluster.namespace("builtin-policy");
    let name = format!("{ns}-configmaps");
    // Only this test's namespace: the cluster is shared with other tests.
    let body = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}],
            },
            "validations": [
                {"expression": "!has(object.metadata.labels) || !('forbidden' in object.metadata.labels)",
                 "message": "no forbidden ConfigMaps"},
                {"expression": "authorizer.group('').resource('secrets').namespace(request.namespace).check('get').allowed()",
                 "messageExpression": "request.userInfo.username + ' may not read Secrets here'"},
            ],
        },
        "status": {"observedGeneration": 7},
    });
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let created = policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(body.clone()).unwrap(),
        )
        .await
        .unwrap();
    // Stored as kube-apiserver stores it: generation 1, no status, the defaults in.
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.status.unwrap_or_default().observed_generation, None);
    let spec = serde_json::to_value(created.spec.unwrap()).unwrap();
    assert_eq!(spec["failurePolicy"], "Fail");
    let match_constraints = &spec["matchConstraints"];
    assert_eq!(match_constraints["matchPolicy"], "Equivalent");
    assert_eq!(match_constraints["objectSelector"], json!({}));
    assert_eq!(match_constraints["resourceRules"][0]["scope"], "*");
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    let binding = bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"policyName": name, "validationActions": ["Deny"]},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(binding.metadata.generation, Some(1));

    // Enforced: a forbidden ConfigMap is refused (a dry run until the plugin has the policy).
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let forbidden = config_map("forbidden", &json!({"forbidden": "yes"}));
    let message = policy::until_denied(&name, || configmaps.create(&dry_run, &forbidden))
        .await
        .unwrap();
    assert!(
        message.ends_with("denied request: no forbidden ConfigMaps"),
        "{message}"
    );
    let refused = configmaps.create(&PostParams::default(), &forbidden).await;
    assert!(policy::denial(&refused, &name).is_some(), "{refused:?}");
    let kube::Error::Api(status) = refused.unwrap_err() else {
        unreachable!()
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(configmaps.get_opt("forbidden").await.unwrap().is_none());
    configmaps
        .create(&PostParams::default(), &config_map("fine", &json!({})))
        .await
        .unwrap();
    // An update is judged by the object it would store.
    let relabel = configmaps
        .patch(
            "fine",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"forbidden": "now"}}})),
        )
        .await;
    assert!(policy::denial(&relabel, &name).is_some(), "{relabel:?}");

    // The `authorizer` variable asks the server's RBAC: a writer that may create
    // ConfigMaps but not read Secrets is refused with the policy's message expression;
    // granted the read, admitted.
    let user = kubeairunway_testcluster::service_account_user(&ns, "writer");
    let writer = json!([{"kind": "ServiceAccount", "name": "writer", "namespace": ns}]);
    rbac::grant(
        &admin,
        &ns,
        "writer",
        writer.clone(),
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]),
    )
    .await
    .unwrap();
    let as_writer: Api<ConfigMap> = Api::namespaced(
        cluster
            .client_as_service_account(&ns, "writer")
            .await
            .unwrap(),
        &ns,
    );
    let unread = as_writer
        .create(&PostParams::default(), &config_map("by-writer", &json!({})))
        .await;
    let message = policy::denial(&unread, &name).unwrap_or_else(|| panic!("{unread:?}"));
    assert!(
        message.ends_with(&format!("denied request: {user} may not read Secrets here")),
        "{message}"
    );
    rbac::grant(
        &admin,
        &ns,
        "writer-reads",
        writer,
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
    )
    .await
    .unwrap();
    as_writer
        .create(&PostParams::default(), &config_map("by-writer", &json!({})))
        .await
        .unwrap();

    // A spec change counts in the generation; the status subresource writes the status
    // alone.
    let mut changed = body.clone();
    changed["spec"]["validations"][0]["message"] = json!("still no forbidden ConfigMaps");
    let updated = policies
        .patch(
            &name,
            &PatchParams::apply("builtin-policy").force(),
            &Patch::Apply(changed),
        )
        .await
        .unwrap();
    assert_eq!(updated.metadata.generation, Some(2));
    assert_eq!(updated.status.unwrap_or_default().observed_generation, None);
    let status = policies
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observedGeneration": 2},
                "spec": {"failurePolicy": "Ignore"}})),
        )
        .await
        .unwrap();
    assert_eq!(status.status.unwrap().observed_generation, Some(2));
    assert_eq!(status.spec.unwrap().failure_policy.as_deref(), Some("Fail"));
    assert_eq!(status.metadata.generation, Some(2));

    // Unbound, no longer enforced.
    bindings
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    kubeairunway_e2e::eventually(30, "the unbound policy no longer enforced", || async {
        configmaps.create(&dry_run, &forbidden).await.ok()
    })
    .await
    .unwrap();
    policies
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}
