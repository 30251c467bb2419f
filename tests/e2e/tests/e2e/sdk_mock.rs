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
                    "ChatServer does not support sglang engine"
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
