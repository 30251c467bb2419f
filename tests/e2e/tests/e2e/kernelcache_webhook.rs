//! The kernel-cache pod webhook over real HTTPS (a certificate it made itself), looking
//! ModelDeployments and KernelCaches up in reflector caches of a real API server: real
//! AdmissionReviews in, JSON patches out, applied to the pods they were made for.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kubeairunway_kernelcache_api::KernelCache;
use kubeairunway_kernelcache_webhook::app::{AppState, Metrics, router, stores};
use kubeairunway_kernelcache_webhook::{INJECTED_ANNOTATION, Lookup, PATH, Settings};
use kubeairunway_sdk::tls::{CertManager, CertResolver, CertSettings, MemoryCertStore};
use serde_json::{Value, json};

const NS: &str = "serving";
const HOST: &str = "kernelcache-webhook.kubeairunway-system.svc";

/// Label the namespace `ns` as its operator does to let caches come from the node's disk
/// (the pod webhook mounts no hostPath in a namespace that enforces no Pod Security level
/// without it).
async fn allow_host_paths(client: &Client, ns: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let body = json!({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": ns, "labels": {kubeairunway_kernelcache_webhook::HOST_PATH_LABEL: "allowed"}}});
    api.patch(
        ns,
        &PatchParams::apply("test-operator").force(),
        &Patch::Apply(&body),
    )
    .await
    .unwrap();
}

async fn apply(
    client: &Client,
    resource: &ApiResource,
    name: &str,
    body: Value,
    status: Option<Value>,
) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, resource);
    let mut object = json!({"apiVersion": resource.api_version, "kind": resource.kind, "metadata": {"name": name}});
    object
        .as_object_mut()
        .unwrap()
        .extend(body.as_object().unwrap().clone());
    api.patch(
        name,
        &PatchParams::apply("test").force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap();
    if let Some(status) = status {
        let body = json!({"apiVersion": resource.api_version, "kind": resource.kind, "metadata": {"name": name}, "status": status});
        api.patch_status(
            name,
            &PatchParams::apply("kernelcache-controller").force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    }
}

fn review(uid: &str, pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NS, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod, "oldObject": null, "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    })
}

fn pod(md: Option<&str>, container: Value) -> Value {
    let labels = md.map_or(
        json!({"app": "x"}),
        |m| json!({"kubeairunway.ai/model-deployment": m}),
    );
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-", "namespace": NS, "labels": labels},
           "spec": {"containers": Value::Array(vec![container])}})
}

/// POST a review; return (allowed, the pod with the returned patch applied, had a patch).
async fn admit(
    http: &reqwest::Client,
    addr: std::net::SocketAddr,
    body: Vec<u8>,
    pod: &Value,
) -> (bool, Value, bool) {
    let resp = http
        .post(format!("https://{HOST}:{}{PATH}", addr.port()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let review: Value = resp.json().await.unwrap();
    let response = &review["response"];
    let mut patched = pod.clone();
    let had_patch = if let Some(patch) = response["patch"].as_str() {
        assert_eq!(response["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut patched, &patch).unwrap();
        true
    } else {
        false
    };
    (response["allowed"] == true, patched, had_patch)
}

#[tokio::test]
async fn serving_pods_get_usable_caches_and_nothing_else_is_touched() {
    let (cluster, client) = kubeairunway_sdk::testing::private_cluster(
        "kc-webhook",
        &kubeairunway_kernelcache_api::crds(),
    )
    .await
    .unwrap();
    cluster.ensure_namespace("serving");
    allow_host_paths(&client, "serving").await;
    let mds = ApiResource::erase::<kubeairunway_sdk::ModelDeployment>(&());
    let caches = ApiResource::erase::<KernelCache>(&());
    let usable = |cache_type: &str, digest: &str| {
        json!({"resolvedDigest": digest, "pinnedImage": format!("registry.example/caches@{digest}"),
               "cacheType": cache_type, "verification": {"mode": "key", "verified": true, "signer": "SHA256:x"}})
    };
    apply(
        &client,
        &caches,
        "vllm-h100",
        json!({"spec": {"image": "registry.example/caches:vllm"}}),
        Some(usable("vllm", "sha256:aa")),
    )
    .await;
    apply(&client, &caches, "triton-h100", json!({"spec": {"image": "registry.example/caches:triton", "mount": {"requireReadyNode": true, "path": "/triton"}}}), Some(usable("triton", "sha256:bb"))).await;
    apply(&client, &caches, "unsigned", json!({"spec": {"image": "registry.example/caches:bad"}}),
        Some(json!({"resolvedDigest": "sha256:cc", "pinnedImage": "registry.example/caches@sha256:cc", "cacheType": "vllm",
                    "verification": {"mode": "key", "verified": false, "message": "no signature found"}}))).await;
    let md = |cache: &str| json!({"spec": {"model": {"id": "m/m"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}, "kernelCache": {"name": cache}}});
    apply(&client, &mds, "llama", md("vllm-h100"), None).await;
    apply(&client, &mds, "kernels", md("triton-h100"), None).await;
    apply(&client, &mds, "missing", md("nope"), None).await;
    apply(&client, &mds, "untrusted", md("unsigned"), None).await;

    let lookup = stores(&client);
    // Wait until the caches have seen everything.
    for _ in 0..200 {
        if lookup.kernel_cache(NS, "unsigned").is_some()
            && lookup.model_deployment(NS, "untrusted").is_some()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let certs = MemoryCertStore::default();
    let resolver = Arc::new(CertResolver::default());
    let manager = CertManager::new(
        certs.clone(),
        CertSettings {
            service_name: "kernelcache-webhook".into(),
            namespace: "kubeairunway-system".into(),
            ca_validity: Duration::from_secs(86400),
            cert_validity: Duration::from_secs(3600),
            rotate_before: Duration::from_secs(60),
        },
        Arc::clone(&resolver),
    );
    manager.ensure().await.unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = kubeairunway_sdk::tls::server_config(resolver).unwrap();
    let metrics = Arc::new(Metrics::default());
    let app = router(AppState {
        lookup: Arc::new(lookup),
        settings: Settings {
            cache_root: "/var/lib/kubeairunway/kernel-caches".into(),
            seed_image: "ghcr.io/kubeairunway/kernelcache-provider:v1".into(),
            image_volumes: false,
            host_paths: kubeairunway_kernelcache_webhook::HostPaths::Labelled,
        },
        metrics: metrics.clone(),
        access: None,
    });
    let server = axum_server::from_tcp_rustls(
        listener,
        axum_server::tls_rustls::RustlsConfig::from_config(tls),
    )
    .unwrap();
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    let ca = certs.published().last().cloned().unwrap();
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .resolve(HOST, addr);
    for cert in reqwest::Certificate::from_pem_bundle(ca.as_bytes()).unwrap() {
        builder = builder.add_root_certificate(cert);
    }
    let http = builder.build().unwrap();

    // A vLLM serving pod: seeded copy under its VLLM_CACHE_ROOT, preferred affinity.
    let vllm = pod(
        Some("llama"),
        json!({"name": "vllm", "image": "vllm/vllm-openai:v0.11", "env": [{"name": "VLLM_CACHE_ROOT", "value": "/cache"}]}),
    );
    let (allowed, patched, had) = admit(
        &http,
        addr,
        serde_json::to_vec(&review("u1", &vllm)).unwrap(),
        &vllm,
    )
    .await;
    assert!(allowed && had);
    assert_eq!(
        patched["metadata"]["annotations"][INJECTED_ANNOTATION],
        "serving/vllm-h100@sha256:aa"
    );
    let spec = &patched["spec"];
    assert_eq!(
        spec["volumes"][0]["hostPath"],
        json!({"path": "/var/lib/kubeairunway/kernel-caches/serving/vllm-h100", "type": "DirectoryOrCreate"})
    );
    assert_eq!(
        spec["volumes"][1],
        json!({"name": "kernel-cache-vllm-h100", "emptyDir": {"sizeLimit": (1u64 << 30).to_string()}})
    );
    let seed = &spec["initContainers"][0];
    assert_eq!(
        seed["image"],
        "ghcr.io/kubeairunway/kernelcache-provider:v1"
    );
    assert_eq!(
        seed["command"],
        json!([
            "/kernelcache-seed",
            "--from",
            "/kernel-cache-src/sha256-aa/io.vllm.cache/torch_compile_cache",
            "--to",
            "/kernel-cache"
        ])
    );
    assert_eq!(
        spec["containers"][0]["volumeMounts"][0],
        json!({"name": "kernel-cache-vllm-h100", "mountPath": "/cache/torch_compile_cache"})
    );
    assert_eq!(
        spec["containers"][0]["env"].as_array().unwrap().len(),
        1,
        "its own VLLM_CACHE_ROOT is kept"
    );
    assert_eq!(
        spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]
            ["matchExpressions"][0]["key"],
        "kernelcache.kubeairunway.ai/serving.vllm-h100"
    );

    // A Triton pod whose cache requires a ready node.
    let triton = pod(Some("kernels"), json!({"name": "main", "image": "pytorch"}));
    let (allowed, patched, had) = admit(
        &http,
        addr,
        serde_json::to_vec(&review("u2", &triton)).unwrap(),
        &triton,
    )
    .await;
    assert!(allowed && had);
    let main = &patched["spec"]["containers"][0];
    assert_eq!(
        main["env"][0],
        json!({"name": "TRITON_CACHE_DIR", "value": "/triton"})
    );
    assert_eq!(main["volumeMounts"][0]["mountPath"], "/triton");
    assert_eq!(
        patched["spec"]["initContainers"][0]["command"][2],
        "/kernel-cache-src/sha256-bb/io.triton.cache"
    );
    assert!(patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].is_object());

    // Untouched: no label, a missing cache, an unverified cache, a malformed body.
    for (uid, p) in [
        ("u3", pod(None, json!({"name": "web", "image": "nginx"}))),
        (
            "u4",
            pod(Some("missing"), json!({"name": "vllm", "image": "vllm"})),
        ),
        (
            "u5",
            pod(Some("untrusted"), json!({"name": "vllm", "image": "vllm"})),
        ),
        (
            "u6",
            pod(Some("no-such-md"), json!({"name": "vllm", "image": "vllm"})),
        ),
    ] {
        let (allowed, patched, had) = admit(
            &http,
            addr,
            serde_json::to_vec(&review(uid, &p)).unwrap(),
            &p,
        )
        .await;
        assert!(allowed, "{uid}");
        assert!(!had, "{uid}: {patched}");
    }
    let (allowed, _, had) = admit(&http, addr, b"{not json".to_vec(), &json!({})).await;
    assert!(allowed && !had);

    let text = metrics.encode();
    for line in [
        r#"kubeairunway_kernel_cache_injections_total{result="injected"} 2"#,
        r#"kubeairunway_kernel_cache_injections_total{result="cache-not-usable"} 1"#,
        r#"kubeairunway_kernel_cache_injections_total{result="cache-not-found"} 1"#,
        r#"kubeairunway_kernel_cache_injections_total{result="no-label"} 1"#,
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

/// The pod webhook as the chart installs it, called by the API server: its Service and
/// MutatingWebhookConfiguration from `helm template`, the webhook run with the chart's
/// flags under the chart's service account (its certificate rotating every few seconds),
/// the Service routed to it on loopback. Pods created through the API server: a vLLM and
/// a Triton serving pod come back patched, a pod of no ModelDeployment and one whose cache
/// is missing are untouched; with the webhook down a serving pod is still created
/// (failurePolicy Ignore, recorded as failed open). Every request the webhook made is
/// checked against the chart's RBAC, and every rule must have been used.
async fn warmups_with_a_custom_action_need_the_right_to_create_pods(
    cluster: &kubeairunway_testcluster::TestCluster,
    admin: &Client,
) {
    use kubeairunway_e2e::rbac;
    let tenant =
        json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]);
    rbac::grant(
        admin,
        NS,
        "alice-warmups",
        tenant.clone(),
        json!([{"apiGroups": ["cache.kubeairunway.ai"], "resources": ["warmups"],
                "verbs": ["create", "get", "patch"]}]),
    )
    .await
    .unwrap();
    let alice = cluster.client_as("alice", None).await.unwrap();
    let warmups: Api<DynamicObject> = Api::namespaced_with(
        alice,
        NS,
        &ApiResource::erase::<kubeairunway_sdk::api::warmup::Warmup>(&()),
    );
    let apply = |name: &str, custom: bool| {
        let mut spec = json!({"targetNodes": {"nodeNames": ["gpu-1"]}, "imagesPreload": {"items": ["busybox:1.36"]}});
        if custom {
            spec["customAction"] = json!({"podTemplate": {"spec": {
                "containers": [{"name": "fetch", "image": "busybox:1.36"}]}}});
        }
        let body = json!({"apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "Warmup",
                          "metadata": {"name": name}, "spec": spec});
        let (warmups, name) = (warmups.clone(), name.to_string());
        async move {
            warmups
                .patch(&name, &PatchParams::apply("alice"), &Patch::Apply(&body))
                .await
        }
    };
    apply("images-only", false)
        .await
        .expect("a Warmup without a custom action never reaches the webhook");
    let refused = apply("downloader", true).await.unwrap_err();
    let kube::Error::Api(refused) = refused else {
        panic!("not an API error: {refused}");
    };
    assert_eq!(refused.code, 403, "{refused:?}");
    for part in [
        "spec.customAction",
        r#"user "alice" may not create pods"#,
        &format!("namespace {NS:?}"),
        "warmups.cache.kubeairunway.ai",
    ] {
        assert!(
            refused.message.contains(part),
            "{part}: {}",
            refused.message
        );
    }
    rbac::grant(
        admin,
        NS,
        "alice-pods",
        tenant,
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]),
    )
    .await
    .unwrap();
    apply("downloader", true)
        .await
        .expect("admitted once alice may create pods");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_calls_the_pod_webhook_installed_from_the_chart() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;
    use kubeairunway_e2e::{eventually, helm, rbac};

    let Some(helm_bin) = helm::require() else {
        return;
    };
    let objects = helm::template(&helm_bin, &helm::chart("kernelcache-provider"), &[]).unwrap();
    let system = "kubeairunway-system";
    // A cluster-wide pod webhook: a cluster of the test's own.
    let (cluster, admin) = kubeairunway_sdk::testing::private_cluster(
        "kc-webhook-installed",
        &kubeairunway_kernelcache_api::crds(),
    )
    .await
    .unwrap();
    cluster.ensure_namespace(system);
    cluster.ensure_namespace(NS);
    allow_host_paths(&admin, NS).await;
    helm::apply_kinds(
        &admin,
        &objects,
        &[
            "ServiceAccount",
            "Secret",
            "Service",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ],
    )
    .await
    .unwrap();
    let webhook = objects
        .iter()
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .unwrap();
    let service = webhook["webhooks"][0]["clientConfig"]["service"]["name"]
        .as_str()
        .unwrap();
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == service)
        .unwrap();
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();

    let mds = ApiResource::erase::<kubeairunway_sdk::ModelDeployment>(&());
    let caches = ApiResource::erase::<KernelCache>(&());
    let usable = |cache_type: &str, digest: &str| {
        json!({"resolvedDigest": digest, "pinnedImage": format!("registry.example/caches@{digest}"),
               "cacheType": cache_type, "verification": {"mode": "key", "verified": true, "signer": "SHA256:x"}})
    };
    apply(
        &admin,
        &caches,
        "vllm-h100",
        json!({"spec": {"image": "registry.example/caches:vllm"}}),
        Some(usable("vllm", "sha256:aa")),
    )
    .await;
    apply(
        &admin,
        &caches,
        "triton-h100",
        json!({"spec": {"image": "registry.example/caches:triton"}}),
        Some(usable("triton", "sha256:bb")),
    )
    .await;
    let md = |cache: &str| json!({"spec": {"model": {"id": "m/m"}, "engine": {"type": "vllm"}, "resources": {"gpu": {"count": 1}}, "kernelCache": {"name": cache}}});
    apply(&admin, &mds, "llama", md("vllm-h100"), None).await;
    apply(&admin, &mds, "kernels", md("triton-h100"), None).await;
    apply(&admin, &mds, "missing", md("nope"), None).await;

    let bind = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut args = vec!["kernelcache-webhook".to_string()];
    args.extend(helm::args_with(
        helm::container(&objects, service, "webhook").unwrap(),
        &[
            ("webhook-bind-address", bind.to_string()),
            ("metrics-bind-address", String::new()),
        ],
    ));
    args.extend([
        format!("--namespace={system}"),
        // Rotations while pods are admitted.
        "--webhook-cert-validity=7s".into(),
        "--webhook-cert-rotate-before=4s".into(),
        "--webhook-cert-check-interval=1s".into(),
    ]);
    let cli = <kubeairunway_kernelcache_webhook::app::Cli as clap::Parser>::try_parse_from(&args)
        .unwrap();
    // The webhook runs as its chart's service account, under the RBAC the chart grants it.
    let identity = rbac::ChartIdentity::apply(
        &cluster,
        &admin,
        &objects,
        "the kernel-cache pod webhook",
        system,
        account,
    )
    .await
    .unwrap();
    let client = identity.client(&cluster).await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let rt = kubeairunway_sdk::process::Runtime::with_client(
        kubeairunway_kernelcache_webhook::app::COMPONENT,
        cli.process.clone(),
        client,
        kubeairunway_sdk::process::Shutdown::on(async {
            let _ = stop_rx.await;
        }),
    );
    let running = tokio::spawn(kubeairunway_kernelcache_webhook::app::run(cli, rt));
    cluster
        .route_service(&admin, system, service, 443, bind.port())
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let create = |p: Value| {
        let pods = pods.clone();
        async move {
            pods.create(&PostParams::default(), &serde_json::from_value(p).unwrap())
                .await
        }
    };
    let vllm = || {
        pod(
            Some("llama"),
            json!({"name": "vllm", "image": "vllm/vllm-openai:v0.11", "env": [{"name": "VLLM_CACHE_ROOT", "value": "/cache"}]}),
        )
    };
    // The webhook's CA bundle and the configuration reach the API server's informers.
    let injected = eventually(60, "a vLLM pod patched by the webhook", || async {
        let p = create(vllm()).await.ok()?;
        p.metadata
            .annotations
            .as_ref()?
            .contains_key(INJECTED_ANNOTATION)
            .then_some(p)
    })
    .await
    .unwrap();
    assert_eq!(
        injected.metadata.annotations.unwrap()[INJECTED_ANNOTATION],
        "serving/vllm-h100@sha256:aa"
    );
    let spec = injected.spec.unwrap();
    assert_eq!(spec.init_containers.unwrap()[0].name, "kernel-cache-seed");
    assert_eq!(
        spec.containers[0].volume_mounts.as_ref().unwrap()[0].mount_path,
        "/cache/torch_compile_cache"
    );

    // Pods keep being admitted while the serving certificate rotates.
    let tls_secret = format!("{service}-tls");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), system);
    let cert =
        |s: k8s_openapi::api::core::v1::Secret| s.data.unwrap_or_default().get("tls.crt").cloned();
    let first = cert(secrets.get(&tls_secret).await.unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    let mut admitted = 0;
    while tokio::time::Instant::now() < deadline {
        let triton = create(pod(
            Some("kernels"),
            json!({"name": "main", "image": "pytorch"}),
        ))
        .await
        .unwrap();
        let env = triton.spec.unwrap().containers[0]
            .env
            .clone()
            .unwrap_or_default();
        assert_eq!(
            env[0].name, "TRITON_CACHE_DIR",
            "every Triton pod is patched"
        );
        admitted += 1;
    }
    assert!(admitted > 5, "{admitted}");
    assert_ne!(
        first,
        cert(secrets.get(&tls_secret).await.unwrap()),
        "rotated"
    );
    // The serving Secret holds the serving pair and the CA bundle; the CA's key is in the
    // CA Secret alone.
    let keys = |s: k8s_openapi::api::core::v1::Secret| {
        s.data
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, v)| !v.0.is_empty())
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        keys(secrets.get(&tls_secret).await.unwrap()),
        ["ca.crt", "tls.crt", "tls.key"]
    );
    assert_eq!(
        keys(secrets.get(&format!("{service}-ca")).await.unwrap()),
        ["ca.crt", "ca.key"]
    );

    // Untouched: not a serving pod (not even sent: objectSelector), a missing cache.
    for p in [
        pod(None, json!({"name": "web", "image": "nginx"})),
        pod(Some("missing"), json!({"name": "vllm", "image": "vllm"})),
    ] {
        let created = create(p.clone()).await.unwrap();
        assert!(
            created.metadata.annotations.unwrap_or_default().is_empty(),
            "{p}"
        );
        assert!(created.spec.unwrap().init_containers.is_none());
    }

    // A Warmup's custom action runs pods as the warmup controller: a tenant who may write
    // Warmups but not create pods is refused one (and only one with a custom action), with
    // the webhook's words; once allowed pods, it is admitted.
    warmups_with_a_custom_action_need_the_right_to_create_pods(&cluster, &admin).await;

    // The webhook goes away: a serving pod is still created, without the cache.
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    let plain = create(vllm()).await.unwrap();
    assert!(plain.metadata.annotations.unwrap_or_default().is_empty());
    let events = cluster.audit_events().unwrap();
    // The last pod create (named by generateName, so the audit log has no name for it).
    let failed_open = events.iter().rev().find(|e| {
        e.verb == "create"
            && e.stage == "ResponseComplete"
            && e.object_ref
                .as_ref()
                .is_some_and(|r| r.resource == "pods" && r.namespace.as_deref() == Some(NS))
    });
    assert!(
        failed_open.is_some_and(|e| e
            .annotations
            .keys()
            .any(|k| k.starts_with("failed-open.mutation.webhook.admission.k8s.io/"))),
        "{failed_open:?}"
    );

    let measured = rbac::measure(
        &rbac::granted_rules(&objects, system, account),
        &events,
        &kubeairunway_testcluster::service_account_user(system, account),
    );
    assert!(
        measured.is_least_privilege(),
        "requests the chart does not allow: {:#?}\nrules no request used: {:#?}",
        measured.denied,
        measured.unused
    );
}
