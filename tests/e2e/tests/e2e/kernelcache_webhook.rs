//! The kernel-cache pod webhook over real HTTPS (a certificate it made itself), looking
//! ModelDeployments and KernelCaches up in reflector caches of a real API server: real
//! AdmissionReviews in, JSON patches out, applied to the pods they were made for.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kubeairunway_kernelcache::api::KernelCache;
use kubeairunway_kernelcache::webhook::app::{AppState, Metrics, router, stores};
use kubeairunway_kernelcache::webhook::{INJECTED_ANNOTATION, Lookup, PATH, Settings};
use kubeairunway_sdk::tls::{CertManager, CertResolver, CertSettings, MemoryCertStore};
use serde_json::{Value, json};

const NS: &str = "serving";
const HOST: &str = "kernelcache-webhook.kubeairunway-system.svc";

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
        &kubeairunway_kernelcache::api::crds(),
    )
    .await
    .unwrap();
    cluster.ensure_namespace("serving");
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
        },
        metrics: metrics.clone(),
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
        json!({"path": "/var/lib/kubeairunway/kernel-caches", "type": "DirectoryOrCreate"})
    );
    assert_eq!(
        spec["volumes"][1],
        json!({"name": "kernel-cache-vllm-h100", "emptyDir": {}})
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
            "/kernel-cache-src/serving/vllm-h100/sha256-aa/io.vllm.cache/torch_compile_cache",
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
        "/kernel-cache-src/serving/triton-h100/sha256-bb/io.triton.cache"
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

    let text = kubeairunway_kernelcache::ops::Encode::encode(metrics.as_ref());
    for line in [
        r#"kubeairunway_kernel_cache_injections_total{result="injected"} 2"#,
        r#"kubeairunway_kernel_cache_injections_total{result="cache-not-usable"} 1"#,
        r#"kubeairunway_kernel_cache_injections_total{result="cache-not-found"} 1"#,
        r#"kubeairunway_kernel_cache_injections_total{result="no-label"} 1"#,
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}
