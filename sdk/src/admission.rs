//! Helpers for admission webhooks speaking `admission.k8s.io/v1` with kube's types.

use kube::core::admission::AdmissionResponse;
use serde_json::Value;

/// The AdmissionReview JSON for a response. kube serialises `patch` (Go `[]byte`) as an
/// array of numbers; the API server's Go JSON reads that too, but the canonical form (what
/// Go writes and every other consumer expects) is a base64 string, so write that.
pub fn review_json(resp: AdmissionResponse) -> Result<Value, serde_json::Error> {
    use base64::Engine as _;
    let mut v = serde_json::to_value(resp.into_review())?;
    if let Some(patch) = v.pointer_mut("/response/patch")
        && let Value::Array(items) = patch
    {
        let bytes: Vec<u8> = items
            .iter()
            .filter_map(Value::as_u64)
            .filter_map(|b| u8::try_from(b).ok())
            .collect();
        *patch = Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    Ok(v)
}

/// The HTTP answer to an AdmissionReview: the review JSON, or a 500 naming what failed.
pub fn respond(resp: AdmissionResponse) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    match review_json(resp).and_then(|v| serde_json::to_vec(&v)) {
        Ok(body) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Flags of a component that serves admission webhooks over HTTPS with a certificate it
/// manages itself ([`crate::tls`]: a CA in one Secret and the serving certificate in
/// another, shared by the replicas, the CA bundle patched into its webhook configurations, rotated before expiry
/// and reloaded without a restart).
#[derive(Clone, Debug, clap::Args)]
pub struct WebhookOptions {
    /// Address of the webhook server (HTTPS).
    #[arg(long, env = "WEBHOOK_BIND_ADDRESS", default_value = "0.0.0.0:9443")]
    pub webhook_bind_address: std::net::SocketAddr,
    /// Name of the webhook Service (the certificate's DNS names derive from it; default:
    /// the component's name).
    #[arg(long, env = "WEBHOOK_SERVICE_NAME")]
    pub webhook_service_name: Option<String>,
    /// Name of the Secret holding the serving certificate, its key and the CA bundle
    /// (default: `<service>-tls`).
    #[arg(long, env = "WEBHOOK_SECRET_NAME")]
    pub webhook_secret_name: Option<String>,
    /// Name of the Secret holding the CA's certificate and key (default: `<service>-ca`).
    /// While it is empty, a CA key found in the serving Secret (the layout of earlier
    /// releases) is used and moved here.
    #[arg(long, env = "WEBHOOK_CA_SECRET_NAME")]
    pub webhook_ca_secret_name: Option<String>,
    /// Lifetime of a new CA (a new one is made, and the old one kept in the CA bundle
    /// while it is valid, when less than a serving certificate's lifetime plus the
    /// rotation margin is left).
    #[arg(long, env = "WEBHOOK_CA_VALIDITY", default_value = "365d", value_parser = crate::process::parse_duration)]
    pub webhook_ca_validity: std::time::Duration,
    /// Lifetime of a new serving certificate (never past its CA's).
    #[arg(long, env = "WEBHOOK_CERT_VALIDITY", default_value = "90d", value_parser = crate::process::parse_duration)]
    pub webhook_cert_validity: std::time::Duration,
    /// Rotate a certificate this long before it expires.
    #[arg(long, env = "WEBHOOK_CERT_ROTATE_BEFORE", default_value = "30d", value_parser = crate::process::parse_duration)]
    pub webhook_cert_rotate_before: std::time::Duration,
    /// How often to check (and reload) the certificate.
    #[arg(long, env = "WEBHOOK_CERT_CHECK_INTERVAL", default_value = "5m", value_parser = crate::process::parse_duration)]
    pub webhook_cert_check_interval: std::time::Duration,
    /// Require callers to present a client certificate signed by this CA (a PEM file):
    /// the API server, given one by its admission configuration's `kubeConfigFile`. No
    /// other pod can then ask the webhook about anything (docs/security.md).
    #[arg(long, env = "WEBHOOK_CLIENT_CA_FILE", value_name = "PATH")]
    pub webhook_client_ca_file: Option<std::path::PathBuf>,
}

impl Default for WebhookOptions {
    fn default() -> Self {
        Self {
            webhook_bind_address: std::net::SocketAddr::from(([0, 0, 0, 0], 9443)),
            webhook_service_name: None,
            webhook_secret_name: None,
            webhook_ca_secret_name: None,
            webhook_ca_validity: std::time::Duration::from_secs(365 * 86_400),
            webhook_cert_validity: std::time::Duration::from_secs(90 * 86_400),
            webhook_cert_rotate_before: std::time::Duration::from_secs(30 * 86_400),
            webhook_cert_check_interval: std::time::Duration::from_secs(300),
            webhook_client_ca_file: None,
        }
    }
}

impl WebhookOptions {
    /// Refuse lifetimes that would make a new CA at every check: a CA must live longer
    /// than the rotation margin.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.webhook_ca_validity > self.webhook_cert_rotate_before,
            "--webhook-ca-validity ({:?}) must exceed --webhook-cert-rotate-before ({:?}), or every check makes a new CA",
            self.webhook_ca_validity,
            self.webhook_cert_rotate_before
        );
        Ok(())
    }
}

/// The webhook configurations whose CA bundle the server keeps current (`None`: the
/// component has none of that kind).
#[derive(Clone, Debug, Default)]
pub struct Configurations {
    /// Name of the ValidatingWebhookConfiguration.
    pub validating: Option<String>,
    /// Name of the MutatingWebhookConfiguration.
    pub mutating: Option<String>,
}

/// Serve `router` over HTTPS on every replica until the process stops: make sure a
/// certificate exists (creating or rotating it, publishing the CA bundle), keep it
/// current, and count as ready ([`crate::process::Readiness`]) once one is loaded.
pub async fn serve(
    rt: &crate::process::Runtime,
    options: &WebhookOptions,
    configurations: &Configurations,
    router: axum::Router,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::sync::Arc;

    use crate::tls::{CertManager, CertResolver, CertSettings, KubeCertStore};

    options.check()?;
    let namespace = rt.options().namespace.clone();
    let service = options
        .webhook_service_name
        .clone()
        .unwrap_or_else(|| rt.component().to_string());
    let secret = options
        .webhook_secret_name
        .clone()
        .unwrap_or_else(|| format!("{service}-tls"));
    let ca_secret = options
        .webhook_ca_secret_name
        .clone()
        .unwrap_or_else(|| format!("{service}-ca"));
    let resolver = Arc::new(CertResolver::default());
    let store = KubeCertStore::new(
        rt.client(),
        &namespace,
        &secret,
        &ca_secret,
        configurations.validating.as_deref().unwrap_or_default(),
        configurations.mutating.as_deref().unwrap_or_default(),
    );
    let certs = CertManager::new(
        store,
        CertSettings {
            service_name: service,
            namespace,
            ca_validity: options.webhook_ca_validity,
            cert_validity: options.webhook_cert_validity,
            rotate_before: options.webhook_cert_rotate_before,
        },
        Arc::clone(&resolver),
    );
    let loaded = rt.readiness().process_check("webhook certificate");
    // A certificate problem at start is retried by the manager; the server serves once
    // one is loaded, and reports ready only then.
    if let Err(e) = certs.ensure().await {
        tracing::warn!(error = %e, "no webhook certificate yet; retrying");
    }
    let shutdown = rt.shutdown();
    {
        let (resolver, loaded, stop) = (Arc::clone(&resolver), loaded.clone(), shutdown.clone());
        tokio::spawn(async move {
            while !resolver.is_loaded() {
                tokio::select! {
                    () = stop.wait() => return,
                    () = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
                }
            }
            loaded.set();
        });
    }
    let stop = shutdown.clone();
    tokio::spawn(certs.run(options.webhook_cert_check_interval, async move {
        stop.wait().await;
    }));
    let client_ca = options
        .webhook_client_ca_file
        .as_ref()
        .map(|path| {
            std::fs::read_to_string(path)
                .with_context(|| format!("--webhook-client-ca-file {}", path.display()))
        })
        .transpose()?;
    let tls = crate::tls::server_config_with_clients(resolver, client_ca.as_deref())
        .context("webhook TLS configuration")?;
    let handle = axum_server::Handle::new();
    {
        let (handle, stop) = (handle.clone(), shutdown.clone());
        tokio::spawn(async move {
            stop.wait().await;
            handle.graceful_shutdown(Some(std::time::Duration::from_secs(10)));
        });
    }
    let addr = options.webhook_bind_address;
    tokio::spawn(async move {
        let server = axum_server::bind_rustls(
            addr,
            axum_server::tls_rustls::RustlsConfig::from_config(tls),
        )
        .handle(handle);
        if let Err(e) = server.serve(router.into_make_service()).await {
            tracing::error!(error = %e, "webhook server failed");
        }
    });
    tracing::info!(address = %addr, "serving admission webhooks");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        webhook: WebhookOptions,
    }

    const DAY: u64 = 86_400;

    /// A year for the CA, not ten; its serving certificates 90 days, rotated 30 days
    /// before they end: the flags' defaults and `Default` agree.
    #[test]
    fn the_ca_lives_a_year_by_default() {
        let parsed = Cli::try_parse_from(["x"]).unwrap().webhook;
        for o in [&parsed, &WebhookOptions::default()] {
            assert_eq!(o.webhook_ca_validity.as_secs(), 365 * DAY);
            assert_eq!(o.webhook_cert_validity.as_secs(), 90 * DAY);
            assert_eq!(o.webhook_cert_rotate_before.as_secs(), 30 * DAY);
            o.check().unwrap();
        }
        let churn = Cli::try_parse_from(["x", "--webhook-ca-validity=30d"])
            .unwrap()
            .webhook;
        assert!(churn.check().is_err());
    }
}
