//! The admission webhooks over real HTTPS (rustls, a certificate made by the controller's
//! own certificate manager, the client verifying it against the CA bundle), with real
//! AdmissionReview JSON: allowed, denied for a provider that is not registered or does not
//! serve, warned, mutated (the JSON patch applied gives the defaults), malformed input; and
//! certificate rotation with hot reload while requests keep succeeding.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kubeairunway_core::webhook::{self, MUTATE_PATH, VALIDATE_PATH, WebhookState};
use kubeairunway_sdk::tls::{CertManager, CertResolver, CertSettings, MemoryCertStore};
use kubeairunway_sdk::{InferenceProviderConfig, InferenceProviderConfigSpec};
use serde_json::{Value, json};

const HOST: &str = "kubeairunway-webhook.kubeairunway-system.svc";

fn cert_settings(validity: u64, rotate_before: u64) -> CertSettings {
    CertSettings {
        service_name: "kubeairunway-webhook".into(),
        namespace: "kubeairunway-system".into(),
        ca_validity: Duration::from_secs(86400),
        cert_validity: Duration::from_secs(validity),
        rotate_before: Duration::from_secs(rotate_before),
    }
}

struct Server {
    addr: SocketAddr,
    store: MemoryCertStore,
    resolver: Arc<CertResolver>,
    handle: axum_server::Handle<SocketAddr>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

/// A webhook server on a loopback port, with `kaito` registered as a provider.
async fn start(validity: u64, rotate_before: u64) -> Server {
    kubeairunway_testcluster::install_crypto_provider();
    let mut kaito = InferenceProviderConfig::new("kaito", InferenceProviderConfigSpec::default());
    kaito.spec.capabilities = Some(kubeairunway_sdk::api::Capabilities::serving([
        kubeairunway_sdk::api::EngineCapability::new(kubeairunway_sdk::api::EngineType::Llamacpp),
    ]));
    // A capability provider: registered, but serves no models.
    let mut kernelcache =
        InferenceProviderConfig::new("kernelcache", InferenceProviderConfigSpec::default());
    kernelcache.spec.capabilities = Some(kubeairunway_sdk::api::Capabilities {
        features: vec!["kernelCache".into()],
        ..Default::default()
    });
    let store = kubeairunway_sdk::reflect::Cache::fixed([kaito, kernelcache], ());

    let certs = MemoryCertStore::default();
    let resolver = Arc::new(CertResolver::default());
    let manager = CertManager::new(
        certs.clone(),
        cert_settings(validity, rotate_before),
        Arc::clone(&resolver),
    );
    manager.ensure().await.unwrap();
    tokio::spawn(manager.run(Duration::from_millis(200), std::future::pending()));

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = kubeairunway_sdk::tls::server_config(Arc::clone(&resolver)).unwrap();
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(
        listener,
        axum_server::tls_rustls::RustlsConfig::from_config(tls),
    )
    .unwrap()
    .handle(handle.clone());
    let app = webhook::router(WebhookState::new(Some(store)));
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    Server {
        addr,
        store: certs,
        resolver,
        handle,
    }
}

/// A client that trusts only the published CA bundle and reaches the server by its
/// Service DNS name; a new one per call makes a new TLS handshake.
fn client(server: &Server) -> reqwest::Client {
    let ca = server.store.published().last().cloned().unwrap();
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .tls_info(true)
        .pool_max_idle_per_host(0)
        .resolve(HOST, server.addr);
    for cert in reqwest::Certificate::from_pem_bundle(ca.as_bytes()).unwrap() {
        builder = builder.add_root_certificate(cert);
    }
    builder.build().unwrap()
}

fn url(server: &Server, path: &str) -> String {
    format!("https://{HOST}:{}{path}", server.addr.port())
}

fn review(operation: &str, object: &Value, old: Option<&Value>) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "kubeairunway.ai", "version": "v1alpha1", "kind": "ModelDeployment"},
            "resource": {"group": "kubeairunway.ai", "version": "v1alpha1", "resource": "modeldeployments"},
            "requestKind": {"group": "kubeairunway.ai", "version": "v1alpha1", "kind": "ModelDeployment"},
            "requestResource": {"group": "kubeairunway.ai", "version": "v1alpha1", "resource": "modeldeployments"},
            "name": object["metadata"]["name"],
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    })
}

#[allow(clippy::needless_pass_by_value)] // reads better at the call sites
fn md(spec: Value) -> Value {
    json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "default"}, "spec": spec})
}

async fn post(server: &Server, path: &str, body: Vec<u8>) -> Value {
    let resp = client(server)
        .post(url(server, path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["kind"], "AdmissionReview", "{v}");
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1", "{v}");
    v["response"].clone()
}

async fn post_review(server: &Server, path: &str, review: &Value) -> Value {
    post(server, path, serde_json::to_vec(review).unwrap()).await
}

#[tokio::test]
async fn core_webhook_allows_denies_and_warns() {
    let server = start(86400, 3600).await;
    let valid = md(
        json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}}),
    );
    let r = post_review(&server, VALIDATE_PATH, &review("CREATE", &valid, None)).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");

    // The rules of the CRD have one home, the CRD: the API server refuses a spec that
    // breaks one before it calls any validating webhook (samples.rs; and
    // `core_chart_webhooks_are_called_by_the_api_server_through_rotation` below, with this
    // webhook registered), so the webhook does not repeat them and lets every refused
    // sample of config/samples/invalid through.
    let invalid: Vec<_> = kubeairunway_config::samples::all()
        .into_iter()
        .filter(|s| s.rejection.is_some())
        .collect();
    assert!(invalid.len() >= 9);
    for sample in invalid {
        let r = post_review(
            &server,
            VALIDATE_PATH,
            &review("CREATE", &sample.manifest, None),
        )
        .await;
        assert_eq!(r["allowed"], true, "{}: {r}", sample.name);
    }

    // An explicitly named provider must be registered.
    let named = |p: &str| {
        md(json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}, "provider": {"name": p}}))
    };
    let r = post_review(
        &server,
        VALIDATE_PATH,
        &review("CREATE", &named("nonesuch"), None),
    )
    .await;
    assert_eq!(r["allowed"], false);
    assert_eq!(
        r["status"]["message"],
        "Provider 'nonesuch' CRD not installed in cluster"
    );
    let r = post_review(
        &server,
        VALIDATE_PATH,
        &review("CREATE", &named("kaito"), None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let r = post_review(
        &server,
        VALIDATE_PATH,
        &review("CREATE", &named("kernelcache"), None),
    )
    .await;
    assert_eq!(r["allowed"], false, "{r}");
    assert_eq!(
        r["status"]["message"],
        "Provider 'kernelcache' serves no models (it registers no engines)"
    );
    // An update that keeps the provider is not re-checked (it may have been removed since).
    let r = post_review(
        &server,
        VALIDATE_PATH,
        &review("UPDATE", &named("gone"), Some(&named("gone"))),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");

    // Warnings.
    let custom = md(
        json!({"model": {"source": "custom", "servedName": "x"}, "engine": {"type": "llamacpp"}}),
    );
    let r = post_review(&server, VALIDATE_PATH, &review("CREATE", &custom, None)).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert_eq!(
        r["warnings"],
        json!(["servedName is ignored for custom source"])
    );

    // DELETE carries no object and is allowed.
    let mut del = review("DELETE", &valid, None);
    del["request"]["object"] = Value::Null;
    del["request"]["oldObject"] = valid.clone();
    let r = post_review(&server, VALIDATE_PATH, &del).await;
    assert_eq!(r["allowed"], true, "{r}");
}

#[tokio::test]
async fn core_webhook_mutates_with_defaults() {
    let server = start(86400, 3600).await;
    let object = md(json!({
        "model": {"id": "a/b"}, "engine": {"type": "vllm"},
        "resources": {"gpu": {"count": 1}},
        "scaling": {"prefill": {"gpu": {"count": 2}}}
    }));
    let r = post_review(&server, MUTATE_PATH, &review("CREATE", &object, None)).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert_eq!(r["patchType"], "JSONPatch");
    let patch_bytes = base64_decode(r["patch"].as_str().unwrap());
    let patch: json_patch::Patch = serde_json::from_slice(&patch_bytes).unwrap();
    let mut patched = object.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    assert_eq!(
        patched["spec"],
        json!({
            "model": {"id": "a/b", "source": "huggingface"},
            "engine": {"type": "vllm", "trustRemoteCode": false},
            "serving": {"mode": "aggregated"},
            "resources": {"gpu": {"count": 1, "type": "nvidia.com/gpu"}},
            "scaling": {"replicas": 1, "prefill": {"replicas": 1, "gpu": {"count": 2, "type": "nvidia.com/gpu"}}}
        })
    );
    // Already defaulted: no patch.
    let r = post_review(&server, MUTATE_PATH, &review("CREATE", &patched, None)).await;
    assert_eq!(r["allowed"], true);
    assert!(r.get("patch").is_none(), "{r}");
}

#[tokio::test]
async fn core_webhook_answers_malformed_requests() {
    let server = start(86400, 3600).await;
    for path in [VALIDATE_PATH, MUTATE_PATH] {
        for body in [
            b"not json".to_vec(),
            Vec::new(),
            b"[]".to_vec(),
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1"}}"#.to_vec(),
        ] {
            let r = post(&server, path, body.clone()).await;
            assert_eq!(r["allowed"], false, "{path} {}: {r}", String::from_utf8_lossy(&body));
            assert!(
                r["status"]["message"].as_str().unwrap().contains("AdmissionReview"),
                "{r}"
            );
        }
        // The uid survives when the rest does not parse.
        let r = post(
            &server,
            path,
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u2","kind":7}}"#.to_vec(),
        )
        .await;
        assert_eq!(r["uid"], "u2", "{r}");

        // Another kind is refused, not admitted by accident.
        let mut pod = review("CREATE", &md(json!({})), None);
        pod["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
        let r = post_review(&server, path, &pod).await;
        assert_eq!(r["allowed"], false, "{r}");
        assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    }
    // A spec of the wrong shape is denied with the reason, and does not break mutation.
    let odd = md(json!({"model": {"id": "a/b"}, "engine": {"type": "nonsense"}, "scaling": "x"}));
    let r = post_review(&server, VALIDATE_PATH, &review("CREATE", &odd, None)).await;
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid ModelDeployment"),
        "{r}"
    );
    let r = post_review(&server, MUTATE_PATH, &review("CREATE", &odd, None)).await;
    assert_eq!(r["allowed"], true, "{r}");
    // Not POST.
    let resp = client(&server)
        .get(url(&server, VALIDATE_PATH))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
}

#[tokio::test]
async fn core_webhook_certificate_rotates_without_restart() {
    // Certificates valid 4 s, rotated when less than 2 s remain, checked every 200 ms.
    let server = start(4, 2).await;
    let first = server.resolver.serving_pem().unwrap();
    let valid = md(json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}));
    let body = serde_json::to_vec(&review("CREATE", &valid, None)).unwrap();
    let mut seen = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(7);
    let mut requests = 0;
    while tokio::time::Instant::now() < deadline {
        // A fresh client each time: a new handshake sees the current certificate.
        let resp = client(&server)
            .post(url(&server, VALIDATE_PATH))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap_or_else(|e| panic!("request {requests} failed during rotation: {e:?}"));
        let tls = resp
            .extensions()
            .get::<reqwest::tls::TlsInfo>()
            .and_then(|t| t.peer_certificate().map(<[u8]>::to_vec))
            .unwrap();
        seen.insert(tls);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["response"]["allowed"], true);
        requests += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        seen.len() >= 2,
        "only {} certificate(s) served in {requests} requests",
        seen.len()
    );
    let last = server.resolver.serving_pem().unwrap();
    assert_ne!(first, last);
    assert_eq!(
        server.store.stored().unwrap().tls_crt,
        last,
        "serves what is stored"
    );
    // Same CA throughout: one CA bundle published.
    assert_eq!(server.store.published().len(), 1);
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

/// The CA bundle goes into every webhook of both configurations, and only when it changed.
#[tokio::test]
async fn core_webhook_ca_bundle_is_patched_into_the_configurations() {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    use kube::api::{Api, PostParams};
    use kubeairunway_sdk::tls::{CertBundle, CertStore, KubeCertStore};

    let (cluster, client) = kubeairunway_e2e::core_cluster().await.unwrap();
    let suffix = cluster.namespace("cab");
    let (vname, mname) = (format!("v-{suffix}"), format!("m-{suffix}"));
    let hook = |name: &str| {
        json!({"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"service": {"name": "kubeairunway-webhook", "namespace": "kubeairunway-system", "path": "/x"}}})
    };
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": vname}, "webhooks": [hook("a.kubeairunway.ai"), hook("b.kubeairunway.ai")]}))
    .unwrap();
    let mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": mname}, "webhooks": [hook("c.kubeairunway.ai")]}))
    .unwrap();
    let vapi: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mapi: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    vapi.create(&PostParams::default(), &vwc).await.unwrap();
    mapi.create(&PostParams::default(), &mwc).await.unwrap();

    let store = KubeCertStore::new(
        client.clone(),
        "kubeairunway-system",
        "unused",
        "unused-ca",
        &vname,
        &mname,
    );
    let bundle =
        CertBundle::generate(&cert_settings(3600, 60), std::time::SystemTime::now()).unwrap();
    store.publish_ca_bundle(&bundle.ca_crt).await.unwrap();
    let v = vapi.get(&vname).await.unwrap();
    for w in v.webhooks.unwrap() {
        assert_eq!(
            w.client_config.ca_bundle.unwrap().0,
            bundle.ca_crt.as_bytes()
        );
    }
    let m = mapi.get(&mname).await.unwrap();
    let rv = m.metadata.resource_version.clone();
    assert_eq!(
        m.webhooks.unwrap()[0]
            .client_config
            .ca_bundle
            .as_ref()
            .unwrap()
            .0,
        bundle.ca_crt.as_bytes()
    );
    // Unchanged bundle: no write.
    store.publish_ca_bundle(&bundle.ca_crt).await.unwrap();
    assert_eq!(
        mapi.get(&mname).await.unwrap().metadata.resource_version,
        rv
    );
}

/// Upgrading from the single-Secret layout: the serving Secret holds the CA's key too and
/// the chart's new CA Secret is empty. On the API server, the same CA and serving pair are
/// kept (the webhook configurations need no new CA bundle) and the key is moved: into the
/// CA Secret, out of the serving one (emptied there).
#[tokio::test]
async fn the_ca_key_moves_out_of_a_single_secret_of_an_earlier_release() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, PostParams};
    use kubeairunway_sdk::tls::{CertBundle, KubeCertStore};

    let (cluster, client) = kubeairunway_e2e::core_cluster().await.unwrap();
    let ns = cluster.namespace("ca-move");
    let settings = CertSettings {
        namespace: ns.clone(),
        ..cert_settings(3600, 60)
    };
    let old = CertBundle::generate(&settings, std::time::SystemTime::now()).unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let pem = |v: &str| k8s_openapi::ByteString(v.as_bytes().to_vec());
    let single: Secret = serde_json::from_value(json!({
        "metadata": {"name": "hook-tls"}, "type": "kubernetes.io/tls"}))
    .unwrap();
    let single = Secret {
        data: Some(
            [
                ("ca.crt".to_string(), pem(&old.ca_crt)),
                ("ca.key".to_string(), pem(&old.ca_key)),
                ("tls.crt".to_string(), pem(&old.tls_crt)),
                ("tls.key".to_string(), pem(&old.tls_key)),
            ]
            .into(),
        ),
        ..single
    };
    secrets
        .create(&PostParams::default(), &single)
        .await
        .unwrap();
    let empty: Secret = serde_json::from_value(json!({
        "metadata": {"name": "hook-ca"}, "type": "Opaque"}))
    .unwrap();
    secrets
        .create(&PostParams::default(), &empty)
        .await
        .unwrap();

    let store = KubeCertStore::new(client.clone(), &ns, "hook-tls", "hook-ca", "", "");
    let resolver = Arc::new(CertResolver::default());
    let kept = CertManager::new(store, settings, Arc::clone(&resolver))
        .ensure()
        .await
        .unwrap();
    assert_eq!(kept, old, "the same CA and serving pair");
    let serving = secrets.get("hook-tls").await.unwrap().data.unwrap();
    // Emptied, not removed: a replica of the earlier release still running reads the four
    // files it knows and keeps its certificate.
    assert_eq!(
        serving.keys().collect::<Vec<_>>(),
        ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    );
    assert!(serving["ca.key"].0.is_empty(), "no CA key left");
    assert_eq!(serving["tls.crt"], pem(&old.tls_crt));
    let ca = secrets.get("hook-ca").await.unwrap().data.unwrap();
    assert_eq!(ca["ca.key"], pem(&old.ca_key));
    assert_eq!(ca["ca.crt"], pem(&old.ca_crt));
}

/// A tenant allowed to write ModelDeployments but not pods is refused an inline custom
/// action, with core's words, and nothing is stored; once allowed pods, it is admitted.
async fn custom_action_needs_the_right_to_create_pods(
    cluster: &kubeairunway_testcluster::TestCluster,
    admin: &kube::Client,
    ns: &str,
) {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kubeairunway_e2e::rbac;
    use kubeairunway_sdk::ModelDeployment;

    let tenant =
        json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]);
    rbac::grant(
        admin,
        ns,
        "alice-modeldeployments",
        tenant.clone(),
        json!([{"apiGroups": ["kubeairunway.ai"], "resources": ["modeldeployments"],
                "verbs": ["create", "patch", "get"]}]),
    )
    .await
    .unwrap();
    let alice = cluster.client_as("alice", None).await.unwrap();
    let mds: Api<DynamicObject> = Api::namespaced_with(
        alice,
        ns,
        &kube::discovery::ApiResource::erase::<ModelDeployment>(&()),
    );
    let apply = |replicas: i32| {
        let body = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "warmed"},
            "spec": {"model": {"id": "a/b"}, "engine": {"type": "llamacpp"},
                     "scaling": {"replicas": replicas},
                     "warmup": {"customAction": {"podTemplate": {"spec": {
                         "containers": [{"name": "fetch", "image": "busybox:1"}]}}}}}});
        let mds = mds.clone();
        async move {
            mds.patch("warmed", &PatchParams::apply("alice"), &Patch::Apply(&body))
                .await
        }
    };
    let refused = apply(1).await.unwrap_err();
    let kube::Error::Api(refused) = refused else {
        panic!("not an API error: {refused}");
    };
    assert_eq!(refused.code, 403, "{refused:?}");
    for part in [
        "spec.warmup.customAction",
        r#"user "alice" may not create pods"#,
        &format!("namespace {ns:?}"),
    ] {
        assert!(
            refused.message.contains(part),
            "{part}: {}",
            refused.message
        );
    }
    // Nothing was stored.
    let as_admin: Api<ModelDeployment> = Api::namespaced(admin.clone(), ns);
    assert!(as_admin.get_opt("warmed").await.unwrap().is_none());

    rbac::grant(
        admin,
        ns,
        "alice-pods",
        tenant,
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]),
    )
    .await
    .unwrap();
    apply(1).await.expect("admitted once alice may create pods");
    assert!(as_admin.get_opt("warmed").await.unwrap().is_some());
}

/// Core as the chart installs it, with the API server calling its webhooks: the chart's
/// Service and webhook configurations applied, the controller run with the chart's flags
/// under the chart's service account, the Service routed to it on loopback. A
/// ModelDeployment naming an unregistered provider is denied with the webhook's message,
/// one that also breaks a rule of the CRD is refused by the API server first; a valid one passes the mutating webhook (its call recorded by the API server) and is
/// stored with the defaults; while the serving certificate rotates every few seconds, a
/// client applying ModelDeployments in a loop sees no failed request and no webhook call
/// fails open. Finally every request core made is checked against the chart's RBAC, and
/// every rule of it must have been used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_chart_webhooks_are_called_by_the_api_server_through_rotation() {
    use kube::ResourceExt as _;
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kubeairunway_e2e::{helm, rbac};
    use kubeairunway_sdk::ModelDeployment;

    let Some(helm_bin) = helm::require() else {
        return;
    };
    let objects = helm::template(
        &helm_bin,
        &helm::chart("kubeairunway"),
        &[
            ("webhook.certValidity", "8s"),
            ("webhook.rotateBefore", "5s"),
            ("webhook.checkInterval", "1s"),
            // The gateway's grants are measured by gateway::the_gateway_needs_exactly_what_the_core_chart_grants.
            ("gateway.enabled", "false"),
        ],
    )
    .unwrap();
    let system = "kubeairunway-system";
    // Cluster-wide webhooks without a namespace selector: a cluster of the test's own.
    let (cluster, admin) = kubeairunway_sdk::testing::private_cluster("core-chart", &[])
        .await
        .unwrap();
    cluster.ensure_namespace(system);
    crate::core_selection::register_providers(&admin).await;
    helm::apply_kinds(
        &admin,
        &objects,
        &[
            "ServiceAccount",
            "Secret",
            "Service",
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
        ],
    )
    .await
    .unwrap();
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let deployment_name = deployment["metadata"]["name"].as_str().unwrap();
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let service = objects.iter().find(|o| o["kind"] == "Service").unwrap()["metadata"]["name"]
        .as_str()
        .unwrap();
    let container = helm::container(&objects, deployment_name, "controller").unwrap();
    let webhook_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let metrics_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut args = vec!["kubeairunway-controller".to_string()];
    args.extend(helm::args_with(
        container,
        &[
            ("webhook-bind-address", webhook_addr.to_string()),
            ("metrics-bind-address", metrics_addr.to_string()),
        ],
    ));
    // The Downward API values of the chart's env.
    args.push(format!("--namespace={system}"));
    args.push("--pod-name=core-0".into());
    let cli = <kubeairunway_core::app::Cli as clap::Parser>::try_parse_from(&args).unwrap();
    // Core runs as its chart's service account, under the RBAC the chart grants it.
    let identity = rbac::ChartIdentity::apply(&cluster, &admin, &objects, "core", system, account)
        .await
        .unwrap();
    let core_client = identity.client(&cluster).await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let rt = kubeairunway_sdk::process::Runtime::with_client(
        kubeairunway_core::app::COMPONENT,
        cli.process.clone(),
        core_client,
        kubeairunway_sdk::process::Shutdown::on(async {
            let _ = stop_rx.await;
        }),
    );
    let core = tokio::spawn(kubeairunway_core::app::run(cli, rt));
    // Routed once ready, as the endpoints controller would: before its provider cache has
    // synced the webhook cannot tell an unregistered provider and admits with a warning
    // (the object stored then is never checked again, its provider name being unchanged).
    kubeairunway_e2e::ready(metrics_addr, 60).await.unwrap();
    cluster
        .route_service(&admin, system, service, 443, webhook_addr.port())
        .await
        .unwrap();

    let ns = cluster.namespace("core-chart");
    let mds: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        &ns,
        &kube::discovery::ApiResource::erase::<ModelDeployment>(&()),
    );
    let apply = |name: &str, spec: Value| {
        let mds = mds.clone();
        let body = json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name}, "spec": spec});
        let name = name.to_string();
        async move {
            mds.patch(&name, &PatchParams::apply("user"), &Patch::Apply(&body))
                .await
        }
    };
    // The controller publishes its CA bundle, and the API server's informers see it.
    // The last answer is kept: if the webhook never denies, the failure says what the API
    // server answered instead.
    let last = std::sync::Mutex::new(String::from("no answer yet"));
    let denied = kubeairunway_e2e::eventually(60, "the validating webhook to deny", || async {
        let answer = apply(
            "unknown-provider",
            json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}, "provider": {"name": "nonesuch"}}),
        )
        .await;
        match answer {
            Err(kube::Error::Api(s)) if s.message.contains("nonesuch") => Some(*s),
            other => {
                *last.lock().unwrap() = format!("{other:?}");
                None
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; the API server's last answer: {}", last.lock().unwrap()));
    assert!(
        denied
            .message
            .contains("Provider 'nonesuch' CRD not installed in cluster"),
        "{}",
        denied.message
    );
    // A creation is validated by the mutating webhook (one call to core per create).
    assert!(
        denied
            .message
            .contains("default.modeldeployments.kubeairunway.ai"),
        "the API server names the webhook: {}",
        denied.message
    );
    // The certificates went into the chart's Secrets by patches of their data: the chart's
    // own labels (and so Helm's ownership of them) stay. The serving Secret holds the
    // serving pair and the CA bundle, not the CA's key; the CA Secret holds that key.
    let chart_secret = |t: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == "Secret" && o["type"] == t)
            .unwrap()["metadata"]["name"]
            .as_str()
            .unwrap()
    };
    let secrets_api = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), system);
    let serving = secrets_api
        .get(chart_secret("kubernetes.io/tls"))
        .await
        .unwrap();
    let ca = secrets_api.get(chart_secret("Opaque")).await.unwrap();
    for secret in [&serving, &ca] {
        let labels = secret.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("app.kubernetes.io/part-of").map(String::as_str),
            Some("kubeairunway"),
            "{labels:?}"
        );
    }
    let serving_data = serving.data.unwrap_or_default();
    assert_eq!(
        serving_data
            .iter()
            .filter(|(_, v)| !v.0.is_empty())
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>(),
        ["ca.crt", "tls.crt", "tls.key"],
        "no CA key in the serving Secret"
    );
    assert!(
        serving_data["tls.crt"]
            .0
            .starts_with(b"-----BEGIN CERTIFICATE-----")
    );
    let ca_data = ca.data.unwrap_or_default();
    assert!(
        ca_data["ca.key"]
            .0
            .starts_with(b"-----BEGIN PRIVATE KEY-----")
    );
    assert_eq!(ca_data["ca.crt"], serving_data["ca.crt"]);

    // A spec that breaks a rule of the CRD and names the same unregistered provider: the
    // API server refuses it with the CRD's message before it calls the validating webhook
    // (which is why the webhook does not repeat the CRD's rules). An explicit count of 0 is
    // kept by the mutating webhook, so the rule still sees it.
    let refused = apply(
        "no-gpu-and-unknown-provider",
        json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 0}},
               "provider": {"name": "nonesuch"}}),
    )
    .await
    .unwrap_err();
    let kube::Error::Api(refused) = refused else {
        panic!("not an API error: {refused}");
    };
    assert_eq!(refused.code, 422, "{refused:?}");
    assert!(
        refused
            .message
            .contains("vLLM engine requires GPU (set resources.gpu.count > 0)")
            && !refused.message.contains("nonesuch"),
        "refused by the CRD's rule, not the webhook: {}",
        refused.message
    );

    let stored = apply(
        "valid",
        json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
    )
    .await
    .unwrap();
    assert_eq!(stored.data["spec"]["serving"]["mode"], "aggregated");
    assert_eq!(stored.data["spec"]["scaling"]["replicas"], 1);
    assert_eq!(stored.data["spec"]["model"]["source"], "huggingface");

    // A vLLM spec without resources: the mutating webhook runs before the CRD's rules, and
    // gives it the one GPU the rule asks for, so it is stored with one GPU.
    let one_gpu = apply(
        "vllm-without-resources",
        json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"}}),
    )
    .await
    .unwrap();
    assert_eq!(
        one_gpu.data["spec"]["resources"],
        json!({"gpu": {"count": 1, "type": "nvidia.com/gpu"}})
    );
    // Each is stored with the finalizer of the provider core then selects, so that the
    // provider need not add it.
    for (name, stored, provider) in [
        ("valid", &stored, "kaito"),
        ("vllm-without-resources", &one_gpu, "dynamo"),
    ] {
        assert_eq!(
            stored.finalizers(),
            [format!("kubeairunway.ai/{provider}-provider")],
            "{name}"
        );
        let typed: Api<ModelDeployment> = Api::namespaced(admin.clone(), &ns);
        let selected = kubeairunway_e2e::eventually(60, &format!("{name} selected"), || async {
            let md = typed.get(name).await.ok()?;
            md.selected_provider().map(str::to_string)
        })
        .await
        .unwrap();
        assert_eq!(selected, provider, "{name}");
        assert_eq!(
            typed.get(name).await.unwrap().finalizers(),
            [format!("kubeairunway.ai/{provider}-provider")],
            "{name}: the finalizer is kept"
        );
    }

    // An inline warmup custom action runs a pod as the warmup controller: it is admitted
    // only from a user the API server lets create pods in the namespace, as core asks it.
    custom_action_needs_the_right_to_create_pods(&cluster, &admin, &ns).await;

    // Rotation under load.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), system);
    let secret_name = chart_secret("kubernetes.io/tls").to_string();
    let serving_cert = |s: k8s_openapi::api::core::v1::Secret| {
        s.data.unwrap_or_default().get("tls.crt").cloned().unwrap()
    };
    let first_cert = serving_cert(secrets.get(&secret_name).await.unwrap());
    let mut applied = 0;
    let mut failures = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while tokio::time::Instant::now() < deadline {
        let name = format!("loop-{applied}");
        if let Err(e) = apply(
            &name,
            json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
        )
        .await
        {
            failures.push(format!("{name}: {e}"));
        }
        applied += 1;
    }
    let last_cert = serving_cert(secrets.get(&secret_name).await.unwrap());
    assert_ne!(first_cert, last_cert, "the serving certificate rotated");
    assert!(applied > 10, "only {applied} requests");
    assert!(failures.is_empty(), "{failures:?}");

    // The API server called the webhooks for each of them and none failed open.
    let events = cluster.audit_events().unwrap();
    let creates: Vec<_> = events
        .iter()
        .filter(|e| {
            e.stage == "ResponseComplete"
                && e.verb == "patch"
                && e.user.username == "testcluster-admin"
                && e.object_ref.as_ref().is_some_and(|r| {
                    r.resource == "modeldeployments"
                        && r.subresource.is_none()
                        && r.name.as_deref().is_some_and(|n| n.starts_with("loop-"))
                })
        })
        .collect();
    assert_eq!(creates.len(), applied);
    for e in &creates {
        let mutation = e
            .annotations
            .get("mutation.webhook.admission.k8s.io/round_0_index_0")
            .unwrap_or_else(|| panic!("no mutating webhook call recorded: {e:?}"));
        assert!(
            mutation.contains("default.modeldeployments.kubeairunway.ai"),
            "{mutation}"
        );
        assert!(
            !e.annotations.keys().any(|k| k.starts_with("failed-open.")),
            "a webhook call failed open: {e:?}"
        );
    }

    // Let core reconcile what was created (selection, status, events), then stop it.
    let typed: Api<ModelDeployment> = Api::namespaced(admin.clone(), &ns);
    kubeairunway_e2e::eventually(30, "selection of the valid ModelDeployment", || async {
        typed
            .get("valid")
            .await
            .ok()
            .filter(|m| m.selected_provider() == Some("kaito"))
    })
    .await
    .unwrap();
    // A ModelDeployment some other controller holds with a finalizer, to be deleted once
    // core is down.
    let held = apply(
        "held",
        json!({"model": {"id": "a/b"}, "engine": {"type": "llamacpp"}}),
    );
    held.await.unwrap();
    mds.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
    )
    .await
    .unwrap();
    let _ = stop_tx.send(());
    core.await.unwrap().unwrap();

    // Core is down and its webhooks fail closed (the mutating one, called first, too):
    // changes of the spec are refused...
    let refused = mds
        .patch(
            "valid",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"model": {"id": "other/model"}}})),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.message.contains("default.modeldeployments.kubeairunway.ai")),
        "{refused:?}"
    );
    // ...not those of labels or annotations, which the webhooks never look at (the chart's
    // matchConditions): pausing a ModelDeployment does not wait for core.
    mds.patch(
        "valid",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"},
            "annotations": {"kubeairunway.ai/reconcile-paused": "true"}}})),
    )
    .await
    .unwrap();
    // ...but not those of an object being deleted: its finalizer goes, and so does it.
    mds.delete("held", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    mds.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    kubeairunway_e2e::eventually(30, "the deleted ModelDeployment gone", || async {
        matches!(mds.get("held").await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await
    .unwrap();

    let measured = rbac::measure_chart_account(&cluster, &objects, system, account).unwrap();
    // The one grant no test reaches: kube's event recorder patches an Event when the same
    // event repeats (kube-runtime events.rs@5.0.0, Recorder::publish), and core publishes
    // an event only on a transition (selection, a validation failure the API server
    // itself refuses to store).
    // It is used when a retried reconcile publishes the same event again (under load).
    // And core patches a provider's InferenceProviderConfig status only to report a
    // selection rule that fails to compile or evaluate (`SelectionRulesValid=False`, in
    // core/src/reconciler.rs; core_selection tests it), which no provider here has.
    let reached_elsewhere = [
        ": patch [\"events.k8s.io\"]/[\"events\"] names []",
        ": patch [\"kubeairunway.ai\"]/[\"inferenceproviderconfigs/status\"] names []",
        // Finalizers of providers that never served or are gone: core_selection runs core
        // under this chart's RBAC and removes them.
        ": patch [\"kubeairunway.ai\"]/[\"modeldeployments\"] names []",
    ];
    let unused: Vec<_> = measured
        .unused
        .iter()
        .filter(|r| !reached_elsewhere.iter().any(|e| r.ends_with(e)))
        .collect();
    assert!(unused.is_empty(), "rules no request used: {unused:#?}");
}
