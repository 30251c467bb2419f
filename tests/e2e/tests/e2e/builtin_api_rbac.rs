//! RBAC in the test server (`tests/cluster/go/rbac.go`, `sar.go`), checked against what
//! kube-apiserver's RBAC mode does: a request is allowed when a rule of a Role or
//! ClusterRole bound to its user, a group of it or its service account allows it (verbs,
//! API groups, `resource/subresource`, resourceNames; a RoleBinding grants only in its
//! namespace, a ClusterRoleBinding everywhere), and refused with kube's 403 message
//! otherwise; `system:masters` and discovery are always allowed; SubjectAccessReviews are
//! answered by the same authorizer; and a user cannot write a Role or a binding that grants
//! what it does not hold, unless it may `escalate` or `bind`.

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Pod, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_e2e::{eventually, rbac};
use kubeairunway_testcluster::{TestCluster, shared};
use serde_json::{Value, json};

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: RBAC_GROUP.into(),
        version: "v1".into(),
        api_version: format!("{RBAC_GROUP}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Create an RBAC object (`kind`, from `body`) as `client`, in `ns` when namespaced.
async fn create(client: &Client, ns: Option<&str>, kind: &str, body: Value) -> kube::Result<()> {
    let plural = format!("{}s", kind.to_lowercase());
    let ar = resource(kind, &plural);
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let mut body = body;
    body["apiVersion"] = json!(format!("{RBAC_GROUP}/v1"));
    body["kind"] = json!(kind);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(body).unwrap(),
    )
    .await
    .map(|_| ())
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn role(name: &str, rules: &Value) -> Value {
    json!({"metadata": {"name": name}, "rules": rules})
}

fn binding(name: &str, role_kind: &str, role: &str, subjects: &Value) -> Value {
    json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": role_kind, "name": role},
        "subjects": subjects})
}

fn user(name: &str) -> Value {
    json!({"kind": "User", "name": name, "apiGroup": RBAC_GROUP})
}

fn group(name: &str) -> Value {
    json!({"kind": "Group", "name": name, "apiGroup": RBAC_GROUP})
}

fn status(result: kube::Result<impl Sized>) -> u16 {
    match result {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(other) => panic!("expected an answer of the API server, got {other}"),
    }
}

fn forbidden_message(result: kube::Result<impl Sized>) -> String {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message,
        Err(other) => panic!("expected 403 Forbidden, got {other}"),
        Ok(_) => panic!("expected 403 Forbidden, the request was allowed"),
    }
}

/// Wait until `check` returns `code` (a new binding reaches the authorizer's informers).
async fn until_status<F, Fut>(what: &str, code: u16, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = u16>,
{
    eventually(30, what, || async { (check().await == code).then_some(()) })
        .await
        .unwrap();
}

async fn cluster() -> (&'static TestCluster, Client) {
    let cluster = shared();
    (cluster, cluster.client().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_allowed_by_the_rules_bound_to_their_user_and_refused_otherwise() {
    let (cluster, admin) = cluster().await;
    let ns = cluster.namespace("rbac-allow");
    let other_ns = cluster.namespace("rbac-allow-other");
    let name = format!("rbac-user-{ns}");
    let team = format!("rbac-team-{ns}");
    let client = cluster.client_as(&name, Some(&team)).await.unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);

    // Nothing bound: refused with kube-apiserver's message, naming user, verb and resource.
    let message = forbidden_message(configmaps.list(&ListParams::default()).await);
    assert_eq!(
        message,
        format!(
            "configmaps is forbidden: User \"{name}\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"{ns}\""
        )
    );
    // Discovery and the version are every authenticated user's (system:discovery).
    client.apiserver_version().await.unwrap();
    kube::Discovery::new(client.clone()).run().await.unwrap();

    // A Role bound to the user's group: read, not write, and only in its namespace.
    create(
        &admin,
        Some(&ns),
        "Role",
        role(
            "reader",
            &json!([rule(&[""], &["configmaps"], &["get", "list", "watch"])]),
        ),
    )
    .await
    .unwrap();
    create(
        &admin,
        Some(&ns),
        "RoleBinding",
        binding("reader", "Role", "reader", &json!([group(&team)])),
    )
    .await
    .unwrap();
    until_status("the team's binding in effect", 200, || async {
        status(configmaps.list(&ListParams::default()).await)
    })
    .await;
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
    assert_eq!(
        status(configmaps.create(&PostParams::default(), &cm).await),
        403
    );
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), &other_ns);
    assert_eq!(status(elsewhere.list(&ListParams::default()).await), 403);

    // resourceNames: one Secret by name; a list is never allowed by a named rule.
    create(
        &admin,
        Some(&ns),
        "Role",
        role(
            "one-secret",
            &json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["allowed"], "verbs": ["get", "list"]}]),
        ),
    )
    .await
    .unwrap();
    create(
        &admin,
        Some(&ns),
        "RoleBinding",
        binding("one-secret", "Role", "one-secret", &json!([user(&name)])),
    )
    .await
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    until_status("the named Secret readable (not found)", 404, || async {
        status(secrets.get("allowed").await)
    })
    .await;
    assert_eq!(status(secrets.get("other").await), 403);
    assert_eq!(status(secrets.list(&ListParams::default()).await), 403);

    // A ClusterRole bound by a RoleBinding grants in that namespace only; by a
    // ClusterRoleBinding, everywhere and on cluster-scoped kinds.
    let pod_status = format!("rbac-pod-status-{ns}");
    create(
        &admin,
        None,
        "ClusterRole",
        role(
            &pod_status,
            &json!([rule(&[""], &["pods/status"], &["get", "patch"])]),
        ),
    )
    .await
    .unwrap();
    create(
        &admin,
        Some(&ns),
        "RoleBinding",
        binding(
            "pod-status",
            "ClusterRole",
            &pod_status,
            &json!([user(&name)]),
        ),
    )
    .await
    .unwrap();
    let admin_pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    admin_pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let running = Patch::Merge(json!({"status": {"phase": "Running"}}));
    until_status("pods/status writable", 200, || async {
        status(
            pods.patch_status("p", &PatchParams::default(), &running)
                .await,
        )
    })
    .await;
    // The subresource's rule grants nothing on the pod itself.
    assert_eq!(
        status(
            pods.patch(
                "p",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}))
            )
            .await
        ),
        403
    );
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    assert_eq!(status(pvs.list(&ListParams::default()).await), 403);
    let volume_reader = format!("rbac-volumes-{ns}");
    create(
        &admin,
        None,
        "ClusterRole",
        role(
            &volume_reader,
            &json!([rule(&[""], &["persistentvolumes"], &["list"])]),
        ),
    )
    .await
    .unwrap();
    create(
        &admin,
        None,
        "ClusterRoleBinding",
        binding(
            &volume_reader,
            "ClusterRole",
            &volume_reader,
            &json!([user(&name)]),
        ),
    )
    .await
    .unwrap();
    until_status("PersistentVolumes listable cluster-wide", 200, || async {
        status(pvs.list(&ListParams::default()).await)
    })
    .await;

    // A service account, named in a RoleBinding without a namespace (the binding's).
    let sa = cluster
        .client_as_service_account(&ns, "reader")
        .await
        .unwrap();
    let sa_configmaps: Api<ConfigMap> = Api::namespaced(sa, &ns);
    assert_eq!(
        status(sa_configmaps.list(&ListParams::default()).await),
        403
    );
    create(
        &admin,
        Some(&ns),
        "RoleBinding",
        binding(
            "sa-reader",
            "Role",
            "reader",
            &json!([{"kind": "ServiceAccount", "name": "reader"}]),
        ),
    )
    .await
    .unwrap();
    until_status("the service account's binding in effect", 200, || async {
        status(sa_configmaps.list(&ListParams::default()).await)
    })
    .await;

    // The audit log records each refusal with its user, verb and resource.
    let refused = rbac::refused(&cluster.audit_events().unwrap(), &name);
    let refused: Vec<String> = refused.iter().map(ToString::to_string).collect();
    for expected in [
        format!("list core/configmaps in {ns}"),
        format!("create core/configmaps in {ns}"),
        format!("list core/configmaps in {other_ns}"),
        format!("get core/secrets in {ns} named other"),
        format!("patch core/pods in {ns} named p"),
        "list core/persistentvolumes".to_string(),
    ] {
        assert!(refused.contains(&expected), "{expected} in {refused:#?}");
    }
}

fn review(kind: &str, spec: &Value) -> DynamicObject {
    serde_json::from_value(
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": kind, "spec": spec}),
    )
    .unwrap()
}

fn reviews(client: &Client, kind: &str, plural: &str, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "authorization.k8s.io".into(),
        version: "v1".into(),
        api_version: "authorization.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subject_access_reviews_are_answered_by_the_authorizer() {
    let (cluster, admin) = cluster().await;
    let ns = cluster.namespace("rbac-sar");
    let name = format!("rbac-reviewed-{ns}");
    create(
        &admin,
        Some(&ns),
        "Role",
        role("reader", &json!([rule(&[""], &["configmaps"], &["get"])])),
    )
    .await
    .unwrap();
    create(
        &admin,
        Some(&ns),
        "RoleBinding",
        binding("reader", "Role", "reader", &json!([user(&name)])),
    )
    .await
    .unwrap();
    let sars = reviews(&admin, "SubjectAccessReview", "subjectaccessreviews", None);
    let ask = |verb: &str, resource: &str| {
        review(
            "SubjectAccessReview",
            &json!({"user": name, "groups": ["system:authenticated"],
                "resourceAttributes": {"namespace": ns, "verb": verb, "resource": resource}}),
        )
    };
    let allowed = eventually(30, "the review allowed", || async {
        let answer = sars
            .create(&PostParams::default(), &ask("get", "configmaps"))
            .await
            .ok()?;
        (answer.data["status"]["allowed"] == true).then_some(answer)
    })
    .await
    .unwrap();
    assert_eq!(
        allowed.data["status"]["reason"],
        format!(
            "RBAC: allowed by RoleBinding \"reader/{ns}\" of Role \"reader\" to User \"{name}\""
        )
    );
    let denied = sars
        .create(&PostParams::default(), &ask("delete", "configmaps"))
        .await
        .unwrap();
    assert_eq!(denied.data["status"]["allowed"], false);
    assert_ne!(denied.data["status"]["denied"], true, "RBAC has no opinion");
    // A group of the reviewed user is what a rule binds, as for a request.
    let masters = sars
        .create(
            &PostParams::default(),
            &review(
                "SubjectAccessReview",
                &json!({"user": "anyone", "groups": ["system:masters"],
                    "resourceAttributes": {"verb": "delete", "resource": "nodes"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(masters.data["status"]["allowed"], true);
    let discovery = sars
        .create(
            &PostParams::default(),
            &review(
                "SubjectAccessReview",
                &json!({"user": name, "groups": ["system:authenticated"],
                    "nonResourceAttributes": {"verb": "get", "path": "/apis/apps"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(discovery.data["status"]["allowed"], true);

    // Invalid reviews: both or neither attribute kind, no subject.
    for spec in [
        json!({"user": name}),
        json!({"groups": [], "resourceAttributes": {"verb": "get", "resource": "pods"}}),
        json!({"user": name, "resourceAttributes": {"verb": "get", "resource": "pods"},
            "nonResourceAttributes": {"verb": "get", "path": "/"}}),
    ] {
        let code = status(
            sars.create(
                &PostParams::default(),
                &review("SubjectAccessReview", &spec),
            )
            .await,
        );
        assert_eq!(code, 422, "{spec}");
    }

    // Asking about others needs a grant; asking about oneself does not (system:basic-user).
    let client = cluster.client_as(&name, None).await.unwrap();
    let own = reviews(&client, "SubjectAccessReview", "subjectaccessreviews", None);
    assert_eq!(
        status(
            own.create(&PostParams::default(), &ask("get", "configmaps"))
                .await
        ),
        403
    );
    let selves = reviews(
        &client,
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        None,
    );
    let me = |verb: &str| {
        review(
            "SelfSubjectAccessReview",
            &json!({"resourceAttributes": {"namespace": ns, "verb": verb, "resource": "configmaps"}}),
        )
    };
    let can = selves
        .create(&PostParams::default(), &me("get"))
        .await
        .unwrap();
    assert_eq!(can.data["status"]["allowed"], true);
    let cannot = selves
        .create(&PostParams::default(), &me("list"))
        .await
        .unwrap();
    assert_eq!(cannot.data["status"]["allowed"], false);

    // A LocalSubjectAccessReview asks about its own namespace only.
    let locals = reviews(
        &admin,
        "LocalSubjectAccessReview",
        "localsubjectaccessreviews",
        Some(&ns),
    );
    let local = |in_ns: &str| {
        let mut r = review(
            "LocalSubjectAccessReview",
            &json!({"user": name, "resourceAttributes": {"namespace": in_ns, "verb": "get", "resource": "configmaps"}}),
        );
        r.metadata.namespace = Some(ns.clone());
        r
    };
    let answer = locals
        .create(&PostParams::default(), &local(&ns))
        .await
        .unwrap();
    assert_eq!(answer.data["status"]["allowed"], true);
    assert_eq!(
        status(
            locals
                .create(&PostParams::default(), &local("elsewhere"))
                .await
        ),
        400
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_and_bindings_cannot_grant_what_their_author_does_not_hold() {
    let (cluster, admin) = cluster().await;
    let ns = cluster.namespace("rbac-escalate");
    let name = format!("rbac-writer-{ns}");
    // The author may write Roles and RoleBindings, and read ConfigMaps; nothing else.
    create(
        &admin,
        Some(&ns),
        "Role",
        role(
            "rbac-writer",
            &json!([
                rule(
                    &[RBAC_GROUP],
                    &["roles", "rolebindings"],
                    &["create", "get", "update", "patch"]
                ),
                rule(&[""], &["configmaps"], &["get"]),
            ]),
        ),
    )
    .await
    .unwrap();
    create(
        &admin,
        Some(&ns),
        "RoleBinding",
        binding("rbac-writer", "Role", "rbac-writer", &json!([user(&name)])),
    )
    .await
    .unwrap();
    let client = cluster.client_as(&name, None).await.unwrap();

    // What it holds it may grant.
    let held = role(
        "configmap-reader",
        &json!([rule(&[""], &["configmaps"], &["get"])]),
    );
    eventually(30, "the writer's binding in effect", || {
        let held = held.clone();
        let client = client.clone();
        let ns = ns.clone();
        async move { create(&client, Some(&ns), "Role", held).await.ok() }
    })
    .await
    .unwrap();
    create(
        &client,
        Some(&ns),
        "RoleBinding",
        binding(
            "configmap-reader",
            "Role",
            "configmap-reader",
            &json!([user("someone")]),
        ),
    )
    .await
    .unwrap();

    // What it does not hold it may not grant, by a Role or by binding a role.
    let secrets = role(
        "secret-reader",
        &json!([rule(&[""], &["secrets"], &["get"])]),
    );
    let message = forbidden_message(create(&client, Some(&ns), "Role", secrets.clone()).await);
    assert!(
        message.contains(&format!(
            "user \"{name}\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:"
        )) && message.contains("{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\"]}"),
        "{message}"
    );
    create(&admin, Some(&ns), "Role", secrets.clone())
        .await
        .unwrap();
    let bind_secrets = binding(
        "secret-reader",
        "Role",
        "secret-reader",
        &json!([user("someone")]),
    );
    let message =
        forbidden_message(create(&client, Some(&ns), "RoleBinding", bind_secrets.clone()).await);
    assert!(
        message.contains("is attempting to grant RBAC permissions not currently held"),
        "{message}"
    );
    // Nor sneak it in by updating a Role it wrote.
    let roles: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &resource("Role", "roles"));
    let widened =
        Patch::Merge(json!({"rules": [rule(&[""], &["configmaps", "secrets"], &["get"])]}));
    let message = forbidden_message(
        roles
            .patch("configmap-reader", &PatchParams::default(), &widened)
            .await,
    );
    assert!(message.contains("secrets"), "{message}");

    // The escalate verb lets it write Roles beyond its own rights; bind, bind that role.
    create(
        &admin,
        Some(&ns),
        "Role",
        role(
            "delegate",
            &json!([
                rule(&[RBAC_GROUP], &["roles"], &["escalate"]),
                {"apiGroups": [RBAC_GROUP], "resources": ["roles"], "resourceNames": ["secret-reader"], "verbs": ["bind"]},
            ]),
        ),
    )
    .await
    .unwrap();
    create(
        &admin,
        Some(&ns),
        "RoleBinding",
        binding("delegate", "Role", "delegate", &json!([user(&name)])),
    )
    .await
    .unwrap();
    eventually(30, "escalate in effect", || {
        let client = client.clone();
        let ns = ns.clone();
        let widened = role(
            "wide",
            &json!([rule(&[""], &["configmaps", "secrets"], &["get"])]),
        );
        async move { create(&client, Some(&ns), "Role", widened).await.ok() }
    })
    .await
    .unwrap();
    create(&client, Some(&ns), "RoleBinding", bind_secrets)
        .await
        .unwrap();
    // bind names one role: binding another it does not hold is still refused.
    let message = forbidden_message(
        create(
            &client,
            Some(&ns),
            "RoleBinding",
            binding("wide", "Role", "wide", &json!([user("someone")])),
        )
        .await,
    );
    assert!(message.contains("not currently held"), "{message}");
    let bindings: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), &ns, &resource("RoleBinding", "rolebindings"));
    assert!(bindings.get_opt("wide").await.unwrap().is_none());
    let written: Vec<String> = bindings
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert!(
        written.contains(&"secret-reader".to_string()),
        "{written:?}"
    );
}
