//! Webhooks that answer the API server and nobody else: the API server presents a client
//! certificate (its admission configuration's `kubeConfigFile`, as kube-apiserver's
//! `--admission-control-config-file` gives it), the webhook requires one signed by the CA
//! it is given (`--webhook-client-ca-file`, the SDK's TLS configuration for webhooks), and
//! a forged AdmissionReview from anywhere else fails the TLS handshake before it is read.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use kube::discovery::ApiResource;
use kubeairunway_e2e::admission::{Registration, serve_validating_for_clients_of};
use kubeairunway_testcluster::{Authorization, Lifetime, TestCluster, pki};

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
}

/// An AdmissionReview posted straight to the webhook, as another pod could, with `identity`
/// (PEM certificate and key) when given: whether it got an answer.
async fn forged(port: u16, identity: Option<String>) -> Result<u16, String> {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        // The webhook's own certificate is not what is checked here: its client check is.
        .danger_accept_invalid_certs(true);
    if let Some(pem) = identity {
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    let review = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "forged", "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                    "resource": {"group": "", "version": "v1", "resource": "configmaps"},
                    "namespace": "kube-system", "operation": "CREATE",
                    "userInfo": {"username": "system:apiserver"},
                    "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}}});
    builder
        .build()
        .unwrap()
        .post(format!("https://127.0.0.1:{port}/validate"))
        .json(&review)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn the_api_server_authenticates_to_a_webhook_and_a_forged_review_gets_no_answer() {
    kubeairunway_testcluster::install_crypto_provider();
    let work = tempfile::tempdir().unwrap();
    // The API server's credential for webhooks, and a stranger's from another CA.
    let callers = pki::generate(&work.path().join("callers")).unwrap();
    let strangers = pki::generate(&work.path().join("strangers")).unwrap();
    let callers_dir = work.path().join("callers");
    let kubeconfig = work.path().join("webhook-kubeconfig.yaml");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: '*.svc'\n  user:\n    client-certificate: {}\n    client-key: {}\n",
            callers_dir.join("admin.crt").display(),
            callers_dir.join("admin.key").display()
        ),
    )
    .unwrap();
    let admission = work.path().join("admission.yaml");
    let plugin = |name: &str| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            kubeconfig.display()
        )
    };
    std::fs::write(
        &admission,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
            plugin("ValidatingAdmissionWebhook"),
            plugin("MutatingAdmissionWebhook")
        ),
    )
    .unwrap();
    let dir = kubeairunway_testcluster::cache_dir()
        .join("runs")
        .join(format!("{}-webhook-client-auth", std::process::id()));
    let extra = [format!(
        "--admission-control-config-file={}",
        admission.display()
    )];
    let cluster = tokio::task::spawn_blocking(move || {
        TestCluster::start_with_args(&dir, Lifetime::TiedToProcess, Authorization::Rbac, &extra)
    })
    .await
    .unwrap()
    .unwrap();
    let client = cluster.client().await.unwrap();
    let ns = cluster.namespace("client-auth");
    let resource = ApiResource::erase::<ConfigMap>(&());
    let webhook = serve_validating_for_clients_of(
        &cluster,
        &client,
        Registration {
            name: "configmaps.example.com",
            namespace: "webhooks",
            service: "guarded",
            resource: &resource,
        },
        Arc::new(|req| {
            if kubeairunway_e2e::admission::object_name(req) == "denied" {
                Err("denied by the guarded webhook".into())
            } else {
                Ok(())
            }
        }),
        &callers.ca_cert,
    )
    .await
    .unwrap();

    // The API server calls it with its certificate: the webhook's verdicts take effect.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let refusal = kubeairunway_e2e::eventually(30, "the webhook's refusal", || async {
        match config_maps
            .create(&PostParams::default(), &config_map("denied"))
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("denied by the guarded webhook") => {
                Some(s.message)
            }
            Ok(_) => {
                let _ = config_maps
                    .delete("denied", &kube::api::DeleteParams::default())
                    .await;
                None
            }
            Err(_) => None,
        }
    })
    .await
    .unwrap();
    assert!(refusal.contains("configmaps.example.com"), "{refusal}");
    config_maps
        .create(&PostParams::default(), &config_map("allowed"))
        .await
        .unwrap();

    // Straight to the webhook: no certificate, or one of another CA, gets no answer; the
    // API server's credential does (what is refused is the caller, not the request).
    let port = webhook.addr.port();
    let bare = forged(port, None).await;
    assert!(
        bare.is_err(),
        "answered without a client certificate: {bare:?}"
    );
    let stranger = forged(
        port,
        Some(format!("{}{}", strangers.admin_cert, strangers.admin_key)),
    )
    .await;
    assert!(
        stranger.is_err(),
        "answered another CA's client: {stranger:?}"
    );
    let caller = forged(
        port,
        Some(format!("{}{}", callers.admin_cert, callers.admin_key)),
    )
    .await;
    assert_eq!(caller, Ok(200));
}
