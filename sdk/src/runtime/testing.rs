//! What the runtime's unit tests share: a provider that renders nothing, and a context
//! whose client a mock API server answers (the objects tests are made of: `fixtures`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

use super::context::{Context, Options};
use crate::api::Warmup;

/// A provider that renders nothing, for unit tests that drive single steps of the
/// runtime.
pub(crate) struct Nothing;

impl crate::Provider for Nothing {
    fn name(&self) -> &'static str {
        "nothing"
    }
    fn config(&self) -> crate::InferenceProviderConfigSpec {
        crate::InferenceProviderConfigSpec::default()
    }
    fn upstream(&self) -> crate::provider::UpstreamRef {
        crate::provider::UpstreamRef::new("example.com", "Widget", "widgets", &["v1"])
    }
    fn render(
        &self,
        _: &crate::ModelDeployment,
        _: &crate::UpstreamApi,
    ) -> Result<crate::Rendered, crate::RenderError> {
        Ok(crate::Rendered::default())
    }
    fn observe(&self, _: &crate::ModelDeployment, _: &crate::Live) -> crate::Observed {
        crate::Observed::deploying("")
    }
}

/// The mock API server of a unit test's client.
pub(crate) type ApiServer = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A context for [`Nothing`] whose client the returned mock API server answers (no
/// upstream detected, no caches started), with `warmups` as the Warmups it sees.
pub(crate) fn context(warmups: Vec<Warmup>) -> (Arc<Context<Nothing>>, ApiServer) {
    let (service, server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (_, upstream) = tokio::sync::watch::channel(None);
    let ctx = Context::new(
        Arc::new(Nothing),
        Client::new(service, "ml"),
        Options::default(),
        upstream,
    )
    .with_warmups(warmups);
    (Arc::new(ctx), server)
}

/// Take the next request and answer it with what `reply` makes of its method, path
/// and body.
pub(crate) async fn respond(
    server: &mut ApiServer,
    reply: impl FnOnce(&str, &str, &Value) -> (u16, Value),
) {
    let (request, send) = server.next_request().await.expect("a request");
    answer(request, send, reply).await;
}

/// Answer `request` with what `reply` makes of its method, path and body.
async fn answer(
    request: Request<Body>,
    send: tower_test::mock::SendResponse<Response<Body>>,
    reply: impl FnOnce(&str, &str, &Value) -> (u16, Value),
) {
    let (method, path) = (
        request.method().to_string(),
        request.uri().path().to_string(),
    );
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let (status, reply) = reply(&method, &path, &body);
    send.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
            .unwrap(),
    );
}

pub(crate) fn failure(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
           "reason": reason, "message": reason})
}

/// Run `step` to its end, answering each request it sends with `reply`; the requests as
/// `METHOD path`, with their bodies. A step cannot end while its request waits for an
/// answer, so this tells for certain whether it sent one.
pub(crate) async fn requests_of(
    server: &mut ApiServer,
    step: tokio::task::JoinHandle<()>,
    reply: impl Fn(&str, &str, &Value) -> (u16, Value),
) -> Vec<(String, Value)> {
    let mut sent = Vec::new();
    tokio::pin!(step);
    loop {
        tokio::select! {
            done = &mut step => {
                done.unwrap();
                return sent;
            }
            Some((request, send)) = server.next_request() => {
                answer(request, send, |method, path, body| {
                    sent.push((format!("{method} {path}"), body.clone()));
                    reply(method, path, body)
                })
                .await;
            }
        }
    }
}

/// Every request answered with 200: a write with its own body, a deletion with a
/// `Status` of success (as the API server answers one).
pub(crate) fn echo(method: &str, _: &str, body: &Value) -> (u16, Value) {
    if method == "DELETE" {
        return (
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        );
    }
    (200, body.clone())
}
