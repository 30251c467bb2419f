//! An upstream operator's validating admission webhook, played by the test: served over
//! HTTPS on loopback with a certificate for its Service, routed to by the test server
//! (`TestCluster::route_service`) and registered in a ValidatingWebhookConfiguration with
//! the CA bundle, so that the API server itself calls it on create and update and refuses
//! what it denies, as it would call the real operator's webhook.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Json;
use axum::extract::State;
use axum::routing::post;
use base64::Engine;
use futures::future::BoxFuture;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubeairunway_sdk::tls::{CertBundle, CertResolver, CertSettings};
use kubeairunway_testcluster::TestCluster;
use serde_json::{Value, json};

/// The verdict on one request: `Err(message)` denies it with that message.
pub type Verdict = dyn Fn(&AdmissionRequest<DynamicObject>) -> Result<(), String> + Send + Sync;

/// A verdict that reads the cluster before it judges, as a webhook that looks up the
/// objects a request refers to (KAITO's reads the ConfigMap a Workspace names).
pub type AsyncVerdict =
    dyn Fn(AdmissionRequest<DynamicObject>) -> BoxFuture<'static, Result<(), String>> + Send + Sync;

/// A validating webhook being served; stops serving when dropped.
#[derive(Debug)]
pub struct ValidatingWebhook {
    /// Where it listens.
    pub addr: SocketAddr,
    handle: axum_server::Handle<SocketAddr>,
}

impl Drop for ValidatingWebhook {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

/// What the webhook registers for.
#[derive(Clone, Debug)]
pub struct Registration<'a> {
    /// The webhook's name in the configuration (the upstream one, e.g.
    /// `vdynamographdeployment.kb.io`); the API server names it in refusals.
    pub name: &'a str,
    /// Namespace and name of its Service (created by the test).
    pub namespace: &'a str,
    /// Service name; also the configuration's name.
    pub service: &'a str,
    /// The resources it validates, on create and update.
    pub resource: &'a ApiResource,
}

/// Serve `verdict` for `registration` and register it with `cluster`'s API server
/// (failure policy `Fail`). The API server picks the configuration up through an
/// informer, a moment later: callers wait until a request they know is denied is.
pub async fn serve_validating(
    cluster: &TestCluster,
    client: &Client,
    registration: Registration<'_>,
    verdict: Arc<Verdict>,
) -> anyhow::Result<ValidatingWebhook> {
    let verdict: Arc<AsyncVerdict> = Arc::new(move |req| {
        let answer = verdict(&req);
        Box::pin(async move { answer })
    });
    serve_validating_async(cluster, client, registration, verdict).await
}

/// [`serve_validating`] with a verdict that may read the cluster.
pub async fn serve_validating_async(
    cluster: &TestCluster,
    client: &Client,
    registration: Registration<'_>,
    verdict: Arc<AsyncVerdict>,
) -> anyhow::Result<ValidatingWebhook> {
    serve(cluster, client, registration, verdict, None).await
}

/// [`serve_validating`], answering only callers that present a client certificate signed
/// by `client_ca` (PEM), through the SDK's TLS configuration for webhooks.
pub async fn serve_validating_for_clients_of(
    cluster: &TestCluster,
    client: &Client,
    registration: Registration<'_>,
    verdict: Arc<Verdict>,
    client_ca: &str,
) -> anyhow::Result<ValidatingWebhook> {
    let verdict: Arc<AsyncVerdict> = Arc::new(move |req| {
        let answer = verdict(&req);
        Box::pin(async move { answer })
    });
    serve(cluster, client, registration, verdict, Some(client_ca)).await
}

async fn serve(
    cluster: &TestCluster,
    client: &Client,
    registration: Registration<'_>,
    verdict: Arc<AsyncVerdict>,
    client_ca: Option<&str>,
) -> anyhow::Result<ValidatingWebhook> {
    kubeairunway_testcluster::install_crypto_provider();
    kubeairunway_testcluster::ensure_namespace(client, registration.namespace).await?;
    let settings = CertSettings {
        service_name: registration.service.into(),
        namespace: registration.namespace.into(),
        ca_validity: Duration::from_secs(86400),
        cert_validity: Duration::from_secs(86400),
        rotate_before: Duration::from_secs(60),
    };
    let bundle = CertBundle::generate(&settings, std::time::SystemTime::now())?;
    let resolver = Arc::new(CertResolver::default());
    resolver.install(&bundle)?;
    let tls = kubeairunway_sdk::tls::server_config_with_clients(resolver, client_ca)?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new()
        .route("/validate", post(validate))
        .with_state(verdict);
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(
        listener,
        axum_server::tls_rustls::RustlsConfig::from_config(tls),
    )?
    .handle(handle.clone());
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    let webhook = ValidatingWebhook { addr, handle };

    cluster
        .route_service(
            client,
            registration.namespace,
            registration.service,
            443,
            addr.port(),
        )
        .await?;
    let r = registration.resource;
    let configuration = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": registration.service},
        "webhooks": [{
            "name": registration.name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {
                "service": {"namespace": registration.namespace, "name": registration.service, "path": "/validate", "port": 443},
                "caBundle": base64::engine::general_purpose::STANDARD.encode(&bundle.ca_crt),
            },
            "rules": [{"apiGroups": [r.group], "apiVersions": [r.version],
                       "operations": ["CREATE", "UPDATE"], "resources": [r.plural]}],
        }],
    });
    let configurations: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<
            k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
        >(&()),
    );
    configurations
        .patch(
            registration.service,
            &PatchParams::apply("e2e-upstream-operator").force(),
            &Patch::Apply(&configuration),
        )
        .await
        .with_context(|| format!("registering webhook {}", registration.name))?;
    Ok(webhook)
}

async fn validate(
    State(verdict): State<Arc<AsyncVerdict>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<Value> {
    let request: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
    let response = match request {
        Ok(req) => match verdict(req.clone()).await {
            Ok(()) => AdmissionResponse::from(&req),
            Err(message) => AdmissionResponse::from(&req).deny(message),
        },
        Err(e) => AdmissionResponse::invalid(e.to_string()),
    };
    Json(serde_json::to_value(response.into_review()).unwrap_or_default())
}

/// The name of an admission request's object (for messages).
pub fn object_name(req: &AdmissionRequest<DynamicObject>) -> String {
    req.object
        .as_ref()
        .map_or_else(|| req.name.clone(), ResourceExt::name_any)
}
