//! The metrics and health endpoints every kernel-cache binary serves (`/metrics` in the
//! OpenMetrics text format, `/healthz`), and the process's stop signal.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use tracing::{error, info};

/// Metrics that can be rendered in the text exposition format.
pub trait Encode: Send + Sync + 'static {
    /// The text exposition.
    fn encode(&self) -> String;
}

/// The metrics and health routes.
pub fn router(metrics: Arc<dyn Encode>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<dyn Encode>>| async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.encode(),
                )
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(metrics)
}

/// Serve [`router`] on `addr` until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<dyn Encode>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    info!(address = %addr, "serving /metrics and /healthz");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(metrics))
            .with_graceful_shutdown(shutdown)
            .await
        {
            error!(error = %e, "metrics server failed");
        }
    });
    Ok(())
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn terminated() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}
