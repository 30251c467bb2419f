//! A single reconcile step against a mock API (tower-test), the way provider authors can
//! unit-test theirs without a cluster: an incompatible spec gives exactly one status
//! write, `Failed` with the provider's message, and nothing else.

use std::sync::Arc;

use kube::runtime::controller::Action;
use kubeairunway_sdk::api::{EngineType, ModelDeployment};
use kubeairunway_sdk::runtime::{Context, reconcile_once};
use kubeairunway_sdk::testing::{ModelDeploymentBuilder, mock, test_options};
use serde_json::json;

use crate::chatserver::ChatServerProvider;

#[tokio::test]
async fn incompatible_spec_is_one_status_write() {
    let (client, mut server) = mock::pair();
    let (_tx, upstream) = tokio::sync::watch::channel(None);
    let ctx = Context::new(
        Arc::new(ChatServerProvider {
            name: "chat-mock".into(),
        }),
        client,
        test_options(),
        upstream,
    );

    let mut md: ModelDeployment = ModelDeploymentBuilder::new("m")
        .namespace("ns")
        .engine(EngineType::Sglang)
        .provider("chat-mock")
        .build();
    md.metadata.finalizers = Some(vec!["kubeairunway.ai/chat-mock-provider".into()]);
    md.status = Some(serde_json::from_value(json!({"provider": {"name": "chat-mock"}})).unwrap());
    let answered = serde_json::to_value(&md).unwrap();

    let reconcile =
        tokio::spawn(async move { reconcile_once(&md, &ctx).await.map_err(|e| e.to_string()) });
    server
        .answer(
            |method, uri, body| {
                assert_eq!(method, http::Method::PATCH);
                assert!(
                    uri.starts_with(
                        "/apis/kubeairunway.ai/v1alpha1/namespaces/ns/modeldeployments/m/status?"
                    ),
                    "{uri}"
                );
                assert!(
                    uri.contains("fieldManager=chat-mock-provider") && uri.contains("force=true"),
                    "{uri}"
                );
                assert_eq!(body["status"]["phase"], "Failed");
                assert_eq!(
                    body["status"]["message"],
                    "spec.engine.type is sglang, which provider chat-mock does not support: it serves the engines llamacpp"
                );
                let conditions = body["status"]["conditions"].as_array().unwrap();
                assert_eq!(conditions[0]["type"], "ProviderCompatible");
                assert_eq!(conditions[0]["status"], "False");
                assert!(
                    body["status"]["provider"].is_null(),
                    "never core's provider.name"
                );
            },
            200,
            answered,
        )
        .await
        .unwrap();
    assert_eq!(reconcile.await.unwrap().unwrap(), Action::await_change());
}

/// A provider whose primary object depends on a ConfigMap it also renders (as KAITO's
/// Workspace does on its inference ConfigMap).
struct WithConfigMap(ChatServerProvider);

impl kubeairunway_sdk::Provider for WithConfigMap {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn config(&self) -> kubeairunway_sdk::api::InferenceProviderConfigSpec {
        self.0.config()
    }
    fn upstream(&self) -> kubeairunway_sdk::UpstreamRef {
        self.0.upstream()
    }
    fn check(&self, md: &ModelDeployment) -> Result<(), kubeairunway_sdk::Incompatible> {
        self.0.check(md)
    }
    fn render(
        &self,
        md: &ModelDeployment,
        upstream: &kubeairunway_sdk::UpstreamApi,
    ) -> Result<kubeairunway_sdk::Rendered, kubeairunway_sdk::RenderError> {
        let mut rendered = self.0.render(md, upstream)?;
        rendered
            .objects
            .push(kubeairunway_sdk::provider::object(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "m-config"}, "data": {"k": "v"},
            }))?);
        Ok(rendered)
    }
    fn observe(
        &self,
        md: &ModelDeployment,
        live: &kubeairunway_sdk::Live,
    ) -> kubeairunway_sdk::Observed {
        self.0.observe(md, live)
    }
}

#[tokio::test]
async fn objects_the_primary_depends_on_are_applied_before_it() {
    use kube::CustomResourceExt;
    let (client, mut server) = mock::pair();
    let provider = WithConfigMap(ChatServerProvider {
        name: "chat-order".into(),
    });
    let api = kubeairunway_sdk::UpstreamApi::detect(
        &crate::chatserver::ChatServer::crd(),
        &kubeairunway_sdk::Provider::upstream(&provider),
    )
    .unwrap();
    let (_tx, upstream) = tokio::sync::watch::channel(Some(Ok(api)));
    let ctx = Context::new(Arc::new(provider), client, test_options(), upstream);
    let mut md: ModelDeployment = ModelDeploymentBuilder::new("m")
        .namespace("ns")
        .engine(EngineType::Llamacpp)
        .gpus(0)
        .image("example/llama:1")
        .provider("chat-order")
        .build();
    md.metadata.uid = Some("uid-1".into());
    md.metadata.finalizers = Some(vec!["kubeairunway.ai/chat-order-provider".into()]);
    md.status = Some(serde_json::from_value(json!({"provider": {"name": "chat-order"}})).unwrap());
    let answered = serde_json::to_value(&md).unwrap();

    let reconcile =
        tokio::spawn(async move { reconcile_once(&md, &ctx).await.map_err(|e| e.to_string()) });
    let mut applies = Vec::new();
    loop {
        let step = server
            .respond(|method, uri, body| {
                let path = uri.split('?').next().unwrap_or_default().to_string();
                match *method {
                    http::Method::GET => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "reason": "NotFound", "code": 404, "message": "not found"}),
                    ),
                    http::Method::PATCH if path.ends_with("/status") => (200, answered.clone()),
                    http::Method::PATCH => {
                        applies.push(path);
                        (200, body.clone())
                    }
                    _ => (201, body.clone()),
                }
            })
            .await;
        if step.is_err() {
            break;
        }
    }
    reconcile.await.unwrap().unwrap();
    assert_eq!(
        applies,
        [
            "/api/v1/namespaces/ns/configmaps/m-config",
            "/apis/example.kubeairunway.ai/v1/namespaces/ns/chatservers/m",
        ],
        "the ConfigMap first, the primary ChatServer last"
    );
}
