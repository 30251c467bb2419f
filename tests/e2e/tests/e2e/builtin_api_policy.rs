//! ValidatingAdmissionPolicy in the test server, checked against what kube-apiserver does:
//! policies and bindings are served (a policy's status cleared on create and kept apart by
//! its status subresource, `metadata.generation` counting spec changes, kube's defaults
//! filled in), and k8s.io/apiserver's ValidatingAdmissionPolicy plugin enforces them:
//! CEL validations over the request and the object refuse what they reject, with the
//! policy's message, and the `authorizer` variable asks the server's RBAC authorizer; a
//! pod's bound service-account token (the server's stand-in) carries its node to them;
//! the access reviews are kept off them.
//! The charts' own policies are exercised where their components run (`gateway`,
//! `modelcache_mount`, `kaito`).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
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

/// A pod's service-account token bound to its pod and node (the server's stand-in for
/// bound tokens, `tests/cluster/go/tokens.go`): the API server authenticates it as the
/// service account with the node in the user's extra, which a policy reads to let a pod
/// change only its own Node, as a node-binding policy on an agent would. The same service
/// account by client certificate carries no node and is refused; an unknown token is
/// refused with 401, not taken as anonymous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_token_carries_its_node_to_the_policies() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    let cluster = kubeairunway_e2e::private_cluster("bound-token")
        .await
        .unwrap();
    let admin = cluster.client().await.unwrap();
    let ns = cluster.namespace("bound-token");
    let user = kubeairunway_testcluster::service_account_user(&ns, "agent");
    let node_name = "authentication.kubernetes.io/node-name";
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": "own-node"},
        "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["nodes"]}]},
            "matchConditions": [{"name": "the-agent", "expression": format!("request.userInfo.username == '{user}'")}],
            "validations": [
                {"expression": format!("'{node_name}' in request.userInfo.extra"),
                 "message": "no node in the credential"},
                {"expression": format!("request.userInfo.extra['{node_name}'][0] == object.metadata.name"),
                 "messageExpression": format!("'a pod on ' + request.userInfo.extra['{node_name}'][0] + ' may not change the Node ' + object.metadata.name")},
            ],
        },
    }))
    .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "own-node"},
                "spec": {"policyName": "own-node", "validationActions": ["Deny"]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    for (kind, plural, body) in [
        (
            "ClusterRole",
            "clusterroles",
            json!({"rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]}),
        ),
        (
            "ClusterRoleBinding",
            "clusterrolebindings",
            json!({
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "agent"},
            "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": ns}]}),
        ),
    ] {
        let mut object = body;
        object["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
        object["kind"] = json!(kind);
        object["metadata"] = json!({"name": "agent"});
        let ar = kube::discovery::ApiResource {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        Api::<kube::api::DynamicObject>::all_with(admin.clone(), &ar)
            .create(
                &PostParams::default(),
                &serde_json::from_value(object).unwrap(),
            )
            .await
            .unwrap();
    }
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let mut on = Vec::new();
    for node in ["node-a", "node-b"] {
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": node}})).unwrap(),
            )
            .await
            .unwrap();
        let pod = pods
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("agent-{node}")},
                    "spec": {"serviceAccountName": "agent", "nodeName": node,
                        "containers": [{"name": "agent", "image": "agent:1"}]}}))
                .unwrap(),
            )
            .await
            .unwrap();
        on.push(Api::<Node>::all(
            cluster.client_for_pod(&pod).await.unwrap(),
        ));
    }
    let label = |value: &str| Patch::Merge(json!({"metadata": {"labels": {"agent": value}}}));
    let pp = PatchParams::default();
    // The pod on node-a may not change node-b (waiting for the policy and RBAC to reach
    // the server's informers); it changes node-a; the pod on node-b changes node-b.
    let to_a = label("a");
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let message = policy::until_denied("own-node", || on[0].patch("node-b", &dry_run, &to_a))
        .await
        .unwrap();
    assert!(
        message.ends_with("a pod on node-a may not change the Node node-b"),
        "{message}"
    );
    on[0].patch("node-a", &pp, &label("a")).await.unwrap();
    on[1].patch("node-b", &pp, &label("b")).await.unwrap();
    // The same service account by client certificate: no node.
    let by_certificate: Api<Node> = Api::all(
        cluster
            .client_as_service_account(&ns, "agent")
            .await
            .unwrap(),
    );
    let refused = by_certificate.patch("node-a", &pp, &label("c")).await;
    let denial = policy::denial(&refused, "own-node").unwrap_or_else(|| panic!("{refused:?}"));
    assert!(denial.contains("no node in the credential"), "{denial}");
    policy::assert_denied(
        &on[0].patch("node-b", &pp, &to_a).await,
        "own-node",
        "a pod on node-a may not change the Node node-b",
    );
    // An unknown token: 401; no token: anonymous, which RBAC refuses (403).
    let ca = std::fs::read(cluster.dir().join("pki/ca.crt")).unwrap();
    kubeairunway_testcluster::install_crypto_provider();
    let http = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let url = format!("{}/api/v1/nodes", cluster.server());
    let unknown = http
        .get(&url)
        .bearer_auth("not-a-token")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 401);
    let anonymous = http.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), 403);
    assert_eq!(
        nodes
            .get("node-b")
            .await
            .unwrap()
            .labels()
            .get("agent")
            .map(String::as_str),
        Some("b")
    );
}

/// The access reviews, which are never stored, are kept off the policies as kube-apiserver
/// keeps them (its `exclusion.Excluded`): a policy that refuses every ConfigMap and every
/// SubjectAccessReview refuses the ConfigMap, and the review is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_reviews_are_not_subject_to_policies() {
    let cluster = kubeairunway_e2e::private_cluster("policy-reviews")
        .await
        .unwrap();
    let admin = cluster.client().await.unwrap();
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": "refuse-all"},
        "spec": {
            "matchConstraints": {"resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]},
                {"apiGroups": ["authorization.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                 "resources": ["subjectaccessreviews"]},
            ]},
            "validations": [{"expression": "false", "message": "refused"}],
        },
    }))
    .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "refuse-all"},
                "spec": {"policyName": "refuse-all", "validationActions": ["Deny"]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let any = config_map("any", &json!({}));
    policy::until_denied("refuse-all", || configmaps.create(&dry_run, &any))
        .await
        .unwrap();
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "someone", "resourceAttributes": {"verb": "get", "resource": "pods"}},
    });
    assert!(!rbac::subject_access_review(&admin, &review).await.unwrap());
}
