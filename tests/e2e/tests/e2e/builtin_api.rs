//! The built-in API of the test server (`tests/cluster`), checked against what
//! kube-apiserver does: status subresources of Pods, Nodes, Jobs, Deployments and
//! DaemonSets; strategic-merge patch and server-side apply merging containers and env by
//! name with two field managers; field selectors on lists and watches; a Lease renewed by
//! strategic-merge patch; NamespaceLifecycle; the admission webhook plugins calling a real
//! HTTPS webhook registered by webhook configurations with a CA bundle, for a Pod and for
//! a custom resource; failure policies; the audit log's users; and the compaction of the
//! store the benchmarks run between phases.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_e2e::{eventually, rbac};
use kubeairunway_sdk::tls::{CertBundle, CertResolver, CertSettings};
use kubeairunway_testcluster::AuditEvent;
use kubeairunway_testcluster::{TestCluster, install_crds, shared};
use serde_json::{Value, json};

async fn cluster() -> (&'static TestCluster, Client) {
    let cluster = shared();
    (cluster, cluster.client().await.unwrap())
}

fn pod(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "builtin-api"}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox:1"}]},
    })
}

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(e) => *e,
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_subresources_keep_status_apart() {
    let (cluster, client) = cluster().await;
    let ns = cluster.namespace("builtin-status");
    let pp = PostParams::default();

    // A Pod is created Pending whatever status it is sent with; a write of the main
    // resource never changes the status; the status subresource does, and nothing else.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut body = pod("p", "node-a");
    body["status"] = json!({"phase": "Running"});
    let created = pods
        .create(&pp, &serde_json::from_value(body).unwrap())
        .await
        .unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(created.metadata.generation, Some(1));
    let status = json!({"status": {"phase": "Running", "podIP": "10.0.0.7",
        "conditions": [{"type": "Ready", "status": "True"}]},
        "spec": {"nodeName": "elsewhere"}});
    let written = pods
        .patch_status("p", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(
        written.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    assert_eq!(
        written.spec.as_ref().unwrap().node_name.as_deref(),
        Some("node-a"),
        "the status subresource must not change the spec"
    );
    let relabelled = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Failed"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(relabelled.status.unwrap().phase.as_deref(), Some("Running"));

    // Nodes (cluster-scoped): the status is kept on create (a kubelet registers with it),
    // and written through the subresource as a kubelet does.
    let nodes: Api<Node> = Api::all(client.clone());
    let node_name = format!("{ns}-node");
    nodes
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": node_name},
                "status": {"capacity": {"nvidia.com/gpu": "8"}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let node = nodes
        .patch_status(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": {"nvidia.com/gpu": "7"}}})),
        )
        .await
        .unwrap();
    let st = node.status.unwrap();
    assert_eq!(st.capacity.unwrap()["nvidia.com/gpu"].0, "8");
    assert_eq!(st.allocatable.unwrap()["nvidia.com/gpu"].0, "7");
    nodes
        .delete(&node_name, &DeleteParams::default())
        .await
        .unwrap();

    // Workloads: the status sent on create is dropped; the subresource writes it.
    let template = json!({"metadata": {"labels": {"app": "w"}},
        "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}});
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let d = deployments
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "d"},
                "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": template},
                "status": {"readyReplicas": 3}}))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(d.status.and_then(|s| s.ready_replicas), None);
    let d = deployments
        .patch_status(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"readyReplicas": 1, "observedGeneration": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(d.status.unwrap().ready_replicas, Some(1));
    let d = deployments
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(
        d.metadata.generation,
        Some(2),
        "a spec change bumps the generation"
    );

    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    daemonsets
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "ds"},
                "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": template}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let ds = daemonsets
        .patch_status(
            "ds",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"desiredNumberScheduled": 2, "numberReady": 2,
                "currentNumberScheduled": 2, "numberMisscheduled": 0}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(ds.status.unwrap().number_ready, 2);

    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    jobs.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "j"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox:1"}]}}},
            "status": {"succeeded": 1}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let job = jobs
        .patch_status(
            "j",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"succeeded": 1,
                "conditions": [{"type": "Complete", "status": "True"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(job.status.unwrap().succeeded, Some(1));
    let done = jobs
        .list(&ListParams::default().fields("status.successful=1"))
        .await
        .unwrap();
    assert_eq!(done.items.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patches_merge_lists_by_key() {
    let (cluster, client) = cluster().await;
    let ns = cluster.namespace("builtin-merge");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // Server-side apply by two managers: containers and env merge by name, each manager
    // owns its entries, and a conflict on a shared field is reported.
    let mut first = pod("p", "node-a");
    first["spec"]["containers"][0]["env"] = json!([{"name": "A", "value": "1"}]);
    pods.patch("p", &PatchParams::apply("first"), &Patch::Apply(&first))
        .await
        .unwrap();
    let second = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [
            {"name": "main", "env": [{"name": "B", "value": "2"}]},
            {"name": "sidecar", "image": "busybox:1"},
        ]},
    });
    let merged = pods
        .patch("p", &PatchParams::apply("second"), &Patch::Apply(&second))
        .await
        .unwrap();
    let containers = merged.spec.unwrap().containers;
    let names: Vec<_> = containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["main", "sidecar"]);
    let env: Vec<_> = containers[0]
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    assert_eq!(
        env,
        [("A".to_string(), "1".to_string()), ("B".into(), "2".into())]
    );
    assert_eq!(
        containers[0].image.as_deref(),
        Some("busybox:1"),
        "second's apply must not drop first's image"
    );
    let managers: Vec<_> = merged
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.contains(&"first".to_string()) && managers.contains(&"second".to_string()));
    let mut conflicting = second.clone();
    conflicting["spec"]["containers"][0]["image"] = json!("busybox:2");
    let err = pods
        .patch(
            "p",
            &PatchParams::apply("second"),
            &Patch::Apply(&conflicting),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err).code, 409, "image is owned by `first`");

    // Dropping an env entry from first's apply removes only first's entry.
    let mut first_again = first.clone();
    first_again["spec"]["containers"][0]["env"] = json!([]);
    let after = pods
        .patch(
            "p",
            &PatchParams::apply("first"),
            &Patch::Apply(&first_again),
        )
        .await
        .unwrap();
    let env: Vec<_> = after.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(env, ["B"]);

    // Strategic-merge patch: a container and an env entry merge by name too.
    let smp = json!({"spec": {"containers": [
        {"name": "sidecar", "env": [{"name": "C", "value": "3"}]},
    ]}});
    let patched = pods
        .patch("p", &PatchParams::default(), &Patch::Strategic(smp))
        .await
        .unwrap();
    let containers = patched.spec.unwrap().containers;
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[1].name, "sidecar");
    assert_eq!(containers[1].image.as_deref(), Some("busybox:1"));
    assert_eq!(containers[1].env.as_ref().unwrap()[0].name, "C");
    assert_eq!(containers[0].env.as_ref().unwrap()[0].name, "B");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_selectors_and_watches() {
    let (cluster, client) = cluster().await;
    let ns = cluster.namespace("builtin-fields");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // A watch of one node's pods, opened before they exist.
    let rv = pods
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watch = pods
        .watch(&WatchParams::default().fields("spec.nodeName=node-b"), &rv)
        .await
        .unwrap()
        .boxed();
    for (name, node) in [("a1", "node-a"), ("b1", "node-b"), ("b2", "node-b")] {
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod(name, node)).unwrap(),
        )
        .await
        .unwrap();
    }
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(20), watch.try_next())
            .await
            .expect("watch event in time")
            .unwrap()
            .expect("watch open");
        if let WatchEvent::Added(p) = event {
            seen.push(p.metadata.name.unwrap());
        }
    }
    assert_eq!(seen, ["b1", "b2"]);

    let on_b = pods
        .list(&ListParams::default().fields("spec.nodeName=node-b"))
        .await
        .unwrap();
    let mut names: Vec<_> = on_b
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    assert_eq!(names, ["b1", "b2"]);
    let by_name = pods
        .list(&ListParams::default().fields("metadata.name=a1"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    assert_eq!(
        by_name.items[0].spec.as_ref().unwrap().node_name.as_deref(),
        Some("node-a")
    );
    let none = pods
        .list(&ListParams::default().fields("spec.nodeName=node-b,metadata.name=a1"))
        .await
        .unwrap();
    assert!(none.items.is_empty());
    let err = pods
        .list(&ListParams::default().fields("spec.image=busybox"))
        .await
        .unwrap_err();
    assert_eq!(api_error(err).code, 400, "unsupported field label");

    // A status change of a watched pod arrives as Modified.
    pods.patch_status(
        "b1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(20), watch.try_next())
        .await
        .expect("watch event in time")
        .unwrap()
        .expect("watch open");
    match event {
        WatchEvent::Modified(p) => {
            assert_eq!(p.status.unwrap().phase.as_deref(), Some("Running"));
        }
        other => panic!("expected Modified, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_renewed_by_strategic_merge_patch() {
    let (cluster, client) = cluster().await;
    let ns = cluster.namespace("builtin-lease");
    let leases: Api<Lease> = Api::namespaced(client, &ns);
    leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "leader"},
                "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 0}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let renewed = leases
        .patch(
            "leader",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"holderIdentity": "b",
                "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 1}})),
        )
        .await
        .unwrap();
    let spec = renewed.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(1));
    assert!(spec.renew_time.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_lifecycle() {
    let (cluster, client) = cluster().await;
    let ns = cluster.namespace("builtin-lifecycle");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    configmaps
        .create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();

    // A namespace that does not exist takes no objects.
    let missing: Api<ConfigMap> = Api::namespaced(client.clone(), &format!("{ns}-missing"));
    let err = missing
        .create(&PostParams::default(), &cm("x"))
        .await
        .unwrap_err();
    assert_eq!(api_error(err).code, 404);

    // Deleting marks the namespace Terminating (no namespace controller empties it), and
    // NamespaceLifecycle refuses new objects in it.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    let terminating = namespaces.get(&ns).await.unwrap();
    assert_eq!(
        terminating.status.as_ref().unwrap().phase.as_deref(),
        Some("Terminating")
    );
    assert!(terminating.metadata.deletion_timestamp.is_some());
    let err = configmaps
        .create(&PostParams::default(), &cm("after"))
        .await
        .unwrap_err();
    let err = api_error(err);
    assert_eq!(err.code, 403);
    assert!(
        err.message.contains("being terminated"),
        "message: {}",
        err.message
    );
    // Existing objects stay readable.
    configmaps.get("before").await.unwrap();

    // Playing the namespace controller: finalizing a terminating namespace removes it.
    let mut finalized = terminating.clone();
    finalized.spec.get_or_insert_default().finalizers = Some(Vec::new());
    namespaces
        .replace_subresource("finalize", &ns, &PostParams::default(), &finalized)
        .await
        .unwrap();
    eventually(20, "the namespace to be gone", || {
        let namespaces = namespaces.clone();
        let ns = ns.clone();
        async move { namespaces.get_opt(&ns).await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
}

/// What the test webhook saw: (operation, kind, namespace, user) per review.
type Seen = Arc<Mutex<Vec<(String, String, String, String)>>>;

/// A webhook served over HTTPS on loopback with a certificate for `<svc>.<ns>.svc`.
struct TestWebhook {
    addr: SocketAddr,
    ca_bundle: String,
    seen: Seen,
    handle: axum_server::Handle<SocketAddr>,
}

impl Drop for TestWebhook {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

/// `/mutate` adds the annotation `webhook.test/mutated: "true"`; `/validate` denies an
/// object labelled `deny: "true"` with a message naming it.
fn serve_webhook(service: &str, namespace: &str) -> TestWebhook {
    kubeairunway_testcluster::install_crypto_provider();
    let settings = CertSettings {
        service_name: service.into(),
        namespace: namespace.into(),
        ca_validity: Duration::from_secs(86400),
        cert_validity: Duration::from_secs(3600),
        rotate_before: Duration::from_secs(60),
    };
    let bundle = CertBundle::generate(&settings, std::time::SystemTime::now()).unwrap();
    let resolver = Arc::new(CertResolver::default());
    resolver.install(&bundle).unwrap();
    let tls = kubeairunway_sdk::tls::server_config(resolver).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .with_state(seen.clone());
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(
        listener,
        axum_server::tls_rustls::RustlsConfig::from_config(tls),
    )
    .unwrap()
    .handle(handle.clone());
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    TestWebhook {
        addr,
        ca_bundle: bundle.ca_crt,
        seen,
        handle,
    }
}

fn record(seen: &Seen, req: &AdmissionRequest<DynamicObject>) {
    seen.lock().unwrap().push((
        format!("{:?}", req.operation),
        req.kind.kind.clone(),
        req.namespace.clone().unwrap_or_default(),
        req.user_info.username.clone().unwrap_or_default(),
    ));
}

async fn mutate(
    State(seen): State<Seen>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<Value> {
    let req: AdmissionRequest<DynamicObject> = review.try_into().unwrap();
    record(&seen, &req);
    let has_annotations = req
        .object
        .as_ref()
        .is_some_and(|o| o.metadata.annotations.is_some());
    let mut ops = Vec::new();
    if !has_annotations {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }
    ops.push(json!({"op": "add", "path": "/metadata/annotations/webhook.test~1mutated", "value": "true"}));
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
    let resp = AdmissionResponse::from(&req).with_patch(patch).unwrap();
    Json(serde_json::to_value(resp.into_review()).unwrap())
}

async fn validate(
    State(seen): State<Seen>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<Value> {
    let req: AdmissionRequest<DynamicObject> = review.try_into().unwrap();
    record(&seen, &req);
    let obj = req.object.as_ref();
    let denied = obj
        .and_then(|o| o.metadata.labels.as_ref())
        .is_some_and(|l| l.get("deny").is_some_and(|v| v == "true"));
    let mut resp = AdmissionResponse::from(&req);
    if denied {
        let name = obj
            .and_then(|o| o.metadata.name.clone())
            .unwrap_or_default();
        resp = resp.deny(format!(
            "test webhook refuses {name}: it is labelled deny=true"
        ));
    }
    Json(serde_json::to_value(resp.into_review()).unwrap())
}

/// A webhook configuration entry for `resources` of `group/version`, calling `path` on the
/// Service `svc` in `ns`, only for objects in the namespace `ns` (namespaceSelector on
/// the kubernetes.io/metadata.name label), so that it leaves other tests alone.
fn webhook_entry(
    name: &str,
    ns: &str,
    svc: &str,
    path: &str,
    ca: &str,
    rules: &Value,
    failure_policy: &str,
) -> Value {
    use base64::Engine;
    json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "timeoutSeconds": 5,
        "clientConfig": {
            "service": {"namespace": ns, "name": svc, "path": path, "port": 443},
            "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
        },
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        "rules": rules,
    })
}

fn widget_crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.builtin-api.test.kubeairunway.ai"},
        "spec": {
            "group": "builtin-api.test.kubeairunway.ai", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }}}],
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_webhooks_are_called_by_the_api_server() {
    let (cluster, admin) = cluster().await;
    install_crds(&admin, &[widget_crd()]).await.unwrap();
    let ns = cluster.namespace("builtin-webhook");
    let user = format!("builtin-api-user-{ns}");
    let client = cluster
        .client_as(&user, Some("builtin-api-testers"))
        .await
        .unwrap();
    rbac::grant(
        &admin,
        &ns,
        "creates-pods-and-widgets",
        json!([{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]),
        json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]},
            {"apiGroups": ["builtin-api.test.kubeairunway.ai"], "resources": ["widgets"], "verbs": ["create"]},
        ]),
    )
    .await
    .unwrap();
    let hook = serve_webhook("test-webhook", &ns);
    cluster
        .route_service(&admin, &ns, "test-webhook", 443, hook.addr.port())
        .await
        .unwrap();

    let rules = json!([
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
        {"apiGroups": ["builtin-api.test.kubeairunway.ai"], "apiVersions": ["v1"],
         "operations": ["CREATE"], "resources": ["widgets"]},
    ]);
    let mutating: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &ApiResource::erase::<
            k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
        >(&()),
    );
    let validating: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &ApiResource::erase::<
            k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
        >(&()),
    );
    let mwc = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": ns},
        "webhooks": [webhook_entry("mutate.webhook.test", &ns, "test-webhook", "/mutate", &hook.ca_bundle, &rules, "Fail")]});
    let vwc = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": ns},
        "webhooks": [webhook_entry("validate.webhook.test", &ns, "test-webhook", "/validate", &hook.ca_bundle, &rules, "Fail")]});
    mutating
        .patch(
            &ns,
            &PatchParams::apply("builtin-api-test"),
            &Patch::Apply(&mwc),
        )
        .await
        .unwrap();
    validating
        .patch(
            &ns,
            &PatchParams::apply("builtin-api-test"),
            &Patch::Apply(&vwc),
        )
        .await
        .unwrap();

    // The plugins read configurations through informers: wait until a dry-run create
    // comes back mutated.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let probe: Pod = serde_json::from_value(pod("probe", "node-a")).unwrap();
    eventually(30, "the mutating webhook to be called", || {
        let pods = pods.clone();
        let probe = probe.clone();
        async move {
            let created = pods
                .create(
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    &probe,
                )
                .await
                .ok()?;
            created
                .annotations()
                .contains_key("webhook.test/mutated")
                .then_some(())
        }
    })
    .await
    .unwrap();

    // A Pod: mutated by the webhook's JSON patch; then one the validating webhook denies,
    // with its message surfaced to the client.
    let created = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(pod("served", "node-a")).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        created
            .annotations()
            .get("webhook.test/mutated")
            .map(String::as_str),
        Some("true")
    );
    let mut denied = pod("refused", "node-a");
    denied["metadata"]["labels"]["deny"] = json!("true");
    let err = api_error(
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(denied).unwrap(),
        )
        .await
        .unwrap_err(),
    );
    assert!(
        err.message
            .contains("test webhook refuses refused: it is labelled deny=true"),
        "message: {}",
        err.message
    );
    assert!(pods.get_opt("refused").await.unwrap().is_none());

    // A custom resource: the same, through the CRD handler's admission.
    let widget_ar = ApiResource {
        group: "builtin-api.test.kubeairunway.ai".into(),
        version: "v1".into(),
        api_version: "builtin-api.test.kubeairunway.ai/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &widget_ar);
    let widget = |name: &str, deny: bool| -> DynamicObject {
        let mut w = DynamicObject::new(name, &widget_ar).data(json!({"spec": {"size": 1}}));
        if deny {
            w.metadata.labels = Some([("deny".to_string(), "true".to_string())].into());
        }
        w
    };
    let created = widgets
        .create(&PostParams::default(), &widget("w1", false))
        .await
        .unwrap();
    assert_eq!(
        created
            .annotations()
            .get("webhook.test/mutated")
            .map(String::as_str),
        Some("true")
    );
    let err = api_error(
        widgets
            .create(&PostParams::default(), &widget("w2", true))
            .await
            .unwrap_err(),
    );
    assert!(
        err.message.contains("test webhook refuses w2"),
        "message: {}",
        err.message
    );

    // The webhook saw the requests as the API server sends them: the user who made them.
    let seen = hook.seen.lock().unwrap().clone();
    for kind in ["Pod", "Widget"] {
        assert!(
            seen.iter()
                .any(|(op, k, n, u)| op == "Create" && k == kind && n == &ns && u == &user),
            "no {kind} review from {user} in {seen:?}"
        );
    }

    // The webhook goes away. A Fail policy now refuses; an Ignore policy lets the create
    // through unmutated.
    drop(hook);
    let refused = eventually(20, "a create refused while the webhook is down", || {
        let pods = pods.clone();
        async move {
            let err = pods
                .create(
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    &serde_json::from_value(pod("down", "node-a")).unwrap(),
                )
                .await
                .err()?;
            Some(api_error(err))
        }
    })
    .await
    .unwrap();
    assert!(
        refused.message.contains("failed calling webhook"),
        "message: {}",
        refused.message
    );
    let mut ignoring = mwc.clone();
    ignoring["webhooks"][0]["failurePolicy"] = json!("Ignore");
    let mut ignoring_v = vwc.clone();
    ignoring_v["webhooks"][0]["failurePolicy"] = json!("Ignore");
    mutating
        .patch(
            &ns,
            &PatchParams::apply("builtin-api-test"),
            &Patch::Apply(&ignoring),
        )
        .await
        .unwrap();
    validating
        .patch(
            &ns,
            &PatchParams::apply("builtin-api-test"),
            &Patch::Apply(&ignoring_v),
        )
        .await
        .unwrap();
    let through = eventually(30, "a create let through by the Ignore policy", || {
        let pods = pods.clone();
        async move {
            pods.create(
                &PostParams::default(),
                &serde_json::from_value(pod("through", "node-a")).unwrap(),
            )
            .await
            .ok()
        }
    })
    .await
    .unwrap();
    assert!(!through.annotations().contains_key("webhook.test/mutated"));

    mutating
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    validating
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_log_records_each_identity() {
    let (cluster, admin) = cluster().await;
    let ns = cluster.namespace("builtin-audit");
    rbac::grant(
        &admin,
        &ns,
        "configmaps",
        json!([{"kind": "ServiceAccount", "name": "component", "namespace": ns}]),
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get"]}]),
    )
    .await
    .unwrap();
    let user = kubeairunway_testcluster::service_account_user(&ns, "component");
    let client = cluster
        .client_as_service_account(&ns, "component")
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &ns);
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "audited"}})).unwrap(),
        )
        .await
        .unwrap();
    configmaps.get("audited").await.unwrap();
    let _ = configmaps.get("absent").await.unwrap_err();

    let events = eventually(10, "the audit events of the component", || {
        let user = user.clone();
        async move {
            let events: Vec<_> = cluster
                .audit_events()
                .ok()?
                .into_iter()
                .filter(|e| e.user.username == user && e.stage == "ResponseComplete")
                .collect();
            (events.len() >= 3).then_some(events)
        }
    })
    .await
    .unwrap();
    let calls: Vec<_> = events
        .iter()
        .map(|e| {
            let r = e.object_ref.clone().unwrap_or_default();
            (
                e.verb.as_str().to_string(),
                e.resource_path().unwrap_or_default(),
                r.namespace.unwrap_or_default(),
                r.name.unwrap_or_default(),
                e.response_status.clone().unwrap_or_default().code,
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            (
                "create".to_string(),
                "configmaps".to_string(),
                ns.clone(),
                "audited".to_string(),
                201
            ),
            (
                "get".into(),
                "configmaps".into(),
                ns.clone(),
                "audited".into(),
                200
            ),
            (
                "get".into(),
                "configmaps".into(),
                ns.clone(),
                "absent".into(),
                404
            ),
        ]
    );
    assert!(
        events[0]
            .user
            .groups
            .contains(&"system:serviceaccounts".to_string())
    );
}

fn audit_event(
    verb: &str,
    group: &str,
    resource: &str,
    sub: Option<&str>,
    ns: &str,
    name: &str,
) -> AuditEvent {
    serde_json::from_value(json!({
        "stage": "ResponseComplete", "verb": verb, "requestURI": "/x",
        "user": {"username": "sa", "groups": []},
        "objectRef": {"resource": resource, "apiGroup": group, "namespace": ns, "name": name, "subresource": sub},
    }))
    .unwrap()
}

/// The RBAC measurement the chart tests use (`kubeairunway_e2e::rbac`), on audit events
/// of known shape.
#[test]
fn rbac_measurement_matches_requests_to_rules() {
    let objects = vec![
        json!({"kind": "Role", "metadata": {"name": "r", "namespace": "sys"}, "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["tls"], "verbs": ["get", "update"]},
        ]}),
        json!({"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "sys"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "core", "namespace": "sys"}]}),
        json!({"kind": "ClusterRole", "metadata": {"name": "c"}, "rules": [
            {"apiGroups": ["kubeairunway.ai"], "resources": ["modeldeployments/status"], "verbs": ["patch"]},
        ]}),
        json!({"kind": "ClusterRoleBinding", "metadata": {"name": "c"},
            "roleRef": {"kind": "ClusterRole", "name": "c"},
            "subjects": [{"kind": "ServiceAccount", "name": "other", "namespace": "sys"}]}),
    ];
    let rules = rbac::granted_rules(&objects, "sys", "core");
    assert_eq!(
        rules.len(),
        2,
        "the ClusterRole is bound to another account"
    );
    let events = [
        audit_event("create", "", "secrets", None, "sys", "tls"),
        audit_event("get", "", "secrets", None, "sys", "tls"),
        audit_event("get", "", "secrets", None, "sys", "other"),
        audit_event("get", "", "secrets", None, "elsewhere", "tls"),
        audit_event(
            "patch",
            "kubeairunway.ai",
            "modeldeployments",
            Some("status"),
            "ml",
            "m",
        ),
    ];
    let m = rbac::measure(&rules, &events, "sa");
    let denied: Vec<String> = m.denied.iter().map(ToString::to_string).collect();
    assert_eq!(
        denied,
        [
            "get core/secrets in elsewhere named tls",
            "get core/secrets in sys named other",
            "patch kubeairunway.ai/modeldeployments/status in ml named m",
        ]
    );
    assert_eq!(m.unused.len(), 1, "{:?}", m.unused);
    assert!(m.unused.iter().next().unwrap().contains("update"));
    assert!(!m.is_least_privilege());

    // A server-side apply that created its object (201) is authorized as a create of
    // that name as well; one that changed an existing object (200) is not.
    let applied = |code: u16| {
        let mut e = audit_event("patch", "", "secrets", None, "sys", "tls");
        e.response_status = Some(kubeairunway_testcluster::audit::AuditResponse { code });
        e
    };
    let as_create = |code: u16| {
        rbac::authorizations(&applied(code))
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        as_create(201),
        [
            "patch core/secrets in sys named tls",
            "create core/secrets in sys named tls"
        ]
    );
    assert_eq!(as_create(200), ["patch core/secrets in sys named tls"]);
    let named_create = vec![
        json!({"kind": "Role", "metadata": {"name": "r", "namespace": "sys"}, "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["tls"], "verbs": ["create", "patch"]},
        ]}),
        json!({"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "sys"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "core", "namespace": "sys"}]}),
    ];
    let rules = rbac::granted_rules(&named_create, "sys", "core");
    assert!(rbac::measure(&rules, &[applied(201)], "sa").is_least_privilege());
    assert!(!rbac::measure(&rules, &[applied(200)], "sa").is_least_privilege());
}

/// `TestCluster::compact_store` (which the scale benchmark runs between its phases) drops
/// the store's history and keeps its present: etcd refuses to read at a revision from
/// before it, and the API server still lists every object. (The API server's own
/// answers at old revisions come from its watch cache's snapshots, not from etcd, so the
/// history is checked in etcd itself.)
#[tokio::test]
async fn compacting_the_store_drops_its_history_and_keeps_the_objects() {
    // A cluster of its own: the shared one's watches would have to start over.
    let dir = kubeairunway_testcluster::cache_dir()
        .join("runs")
        .join(format!("{}-compact", std::process::id()));
    let cluster = tokio::task::spawn_blocking(move || {
        TestCluster::start(&dir, kubeairunway_testcluster::Lifetime::TiedToProcess)
    })
    .await
    .unwrap()
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client().await.unwrap(), "default");
    let named = |name: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
    };
    let before = cms
        .create(&PostParams::default(), &named("before"))
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    cms.delete("before", &DeleteParams::default())
        .await
        .unwrap();
    cms.create(&PostParams::default(), &named("after"))
        .await
        .unwrap();
    // The whole store ("\0" to the end), counted in etcd as it was at the deleted
    // ConfigMap's creation.
    let http = reqwest::Client::new();
    let read_at_before = || {
        http.post(format!("{}/v3/kv/range", cluster.etcd_url()))
            .json(&serde_json::json!({"key": "AA==", "range_end": "AA==",
                "revision": before, "count_only": true}))
            .send()
    };
    let then: serde_json::Value = read_at_before().await.unwrap().json().await.unwrap();
    assert!(
        then["count"]
            .as_str()
            .and_then(|c| c.parse::<u64>().ok())
            .is_some_and(|c| c > 0),
        "{then}"
    );

    // Blocking, but brief (the store holds a few objects).
    cluster.compact_store().unwrap();
    let now: serde_json::Value = read_at_before().await.unwrap().json().await.unwrap();
    assert!(
        now["message"]
            .as_str()
            .is_some_and(|m| m.contains("compacted")),
        "etcd still reads a revision from before the compaction: {now}"
    );
    let listed: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(listed, ["after"]);
}
