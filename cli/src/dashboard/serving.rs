//! A ModelDeployment's serving side for the Deployment page: its pods (by the selector its
//! provider reports), their logs, and a chat request to its endpoint through the API
//! server's service proxy, streamed back as the engine streams it.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, LogParams};
use kube::{Client, ResourceExt};
use kubeairunway_sdk::ModelDeployment;
use serde::Serialize;
use serde_json::{Value, json};

use crate::output::age;

/// One serving pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRow {
    /// Name.
    pub name: String,
    /// `status.phase`.
    pub phase: String,
    /// The node it runs on, `-` before it is scheduled.
    pub node: String,
    /// Ready containers of all.
    pub ready: String,
    /// Restarts of all containers.
    pub restarts: i32,
    /// Age.
    pub age: String,
    /// Container names (for their logs).
    pub containers: Vec<String>,
}

/// The row of `pod` at `now`.
pub fn pod_row(pod: &Pod, now: Timestamp) -> PodRow {
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let statuses = status.container_statuses.unwrap_or_default();
    PodRow {
        name: pod.name_any(),
        phase: status.phase.unwrap_or_else(|| "Pending".into()),
        node: spec.node_name.unwrap_or_else(|| "-".into()),
        ready: format!(
            "{}/{}",
            statuses.iter().filter(|c| c.ready).count(),
            spec.containers.len()
        ),
        restarts: statuses.iter().map(|c| c.restart_count).sum(),
        age: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or_else(|| "-".into(), |t| age(t.0, now)),
        containers: spec.containers.iter().map(|c| c.name.clone()).collect(),
    }
}

/// The pods serving `md`: those its provider's `status.selector` selects; none before the
/// provider reports one.
pub async fn pods(client: &Client, md: &ModelDeployment) -> Result<Vec<PodRow>, kube::Error> {
    let Some(selector) = md.status.as_ref().and_then(|s| s.selector.clone()) else {
        return Ok(Vec::new());
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), &md.namespace().unwrap_or_default());
    let list = api.list(&ListParams::default().labels(&selector)).await?;
    let now = Timestamp::now();
    Ok(list.items.iter().map(|p| pod_row(p, now)).collect())
}

/// The last 500 lines of a pod's (container's) log.
pub async fn logs(
    client: &Client,
    namespace: &str,
    pod: &str,
    container: Option<String>,
) -> Result<String, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = LogParams {
        container,
        tail_lines: Some(500),
        ..LogParams::default()
    };
    api.logs(pod, &params).await
}

/// The API server's service proxy path of the OpenAI chat API behind `service:port`.
pub fn chat_path(namespace: &str, service: &str, port: i32) -> String {
    format!("/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy/v1/chat/completions")
}

/// The chat request for `md`: its served model name, the conversation, streamed.
pub fn chat_body(md: &ModelDeployment, messages: &Value) -> Value {
    let model = md
        .spec
        .served_model_name()
        .map_or_else(|| md.name_any(), str::to_string);
    json!({ "model": model, "messages": messages, "stream": true })
}

/// Why `md` cannot be chatted with yet, if so.
pub fn chat_target(md: &ModelDeployment) -> Result<(String, i32), String> {
    let endpoint = md.status.as_ref().and_then(|s| s.endpoint.as_ref());
    match endpoint.and_then(|e| Some((e.service.clone()?, e.port?))) {
        Some(target) => Ok(target),
        None => Err(format!(
            "{} has no endpoint Service yet (status.endpoint): its provider reports one once the upstream object exists",
            md.name_any()
        )),
    }
}

/// Send the chat request through the service proxy; the response as the API server gives
/// it (the engine's own stream on success).
pub async fn chat(
    client: &Client,
    md: &ModelDeployment,
    messages: &Value,
) -> Result<http::Response<kube::client::Body>, String> {
    let (service, port) = chat_target(md)?;
    let path = chat_path(&md.namespace().unwrap_or_default(), &service, port);
    let body = serde_json::to_vec(&chat_body(md, messages)).map_err(|e| e.to_string())?;
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "text/event-stream")
        .body(kube::client::Body::from(body))
        .map_err(|e| e.to_string())?;
    client.send(request).await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn md() -> ModelDeployment {
        serde_json::from_value(
            json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "qwen", "namespace": "ml"},
            "spec": {"model": {"id": "Qwen/Qwen3-0.6B", "servedName": "qwen3"}},
            "status": {"endpoint": {"service": "qwen-frontend", "port": 8000}}}),
        )
        .unwrap()
    }

    /// The chat goes through the API server's service proxy to the endpoint's Service and
    /// port, with the served name, streamed, and comes back chunk by chunk. The API server
    /// is played by a loopback stand-in of its service proxy path.
    #[tokio::test]
    async fn a_chat_goes_through_the_service_proxy_and_streams_back() {
        use axum::routing::post;
        kubeairunway_sdk::process::install_crypto_provider();
        let app = axum::Router::new().route(
            "/api/v1/namespaces/ml/services/{svc}/proxy/v1/chat/completions",
            post(
                |axum::extract::Path(svc): axum::extract::Path<String>, body: String| async move {
                    let request: Value = serde_json::from_str(&body).unwrap();
                    let chunks = [
                        format!(
                            "data: {}\n\n",
                            json!({"choices": [{"delta": {"content": format!("{svc} ")}}]})
                        ),
                        format!(
                            "data: {}\n\n",
                            json!({"choices": [{"delta": {"content": request["model"]}}]})
                        ),
                        "data: [DONE]\n\n".to_string(),
                    ];
                    let stream =
                        futures::stream::iter(chunks.map(Ok::<_, std::convert::Infallible>));
                    axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(axum::body::Body::from_stream(stream))
                        .unwrap()
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();

        let messages = json!([{"role": "user", "content": "hi"}]);
        let response = chat(&client, &md(), &messages).await.unwrap();
        assert!(response.status().is_success());
        let mut body = axum::body::Body::new(response.into_body()).into_data_stream();
        let mut text = String::new();
        while let Some(chunk) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        }
        assert!(
            text.contains(r#""content":"qwen-frontend:8000 ""#),
            "{text}"
        );
        assert!(text.contains(r#""content":"qwen3""#), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }

    #[test]
    fn no_endpoint_no_chat() {
        let mut m = md();
        m.status = None;
        assert!(
            chat_target(&m)
                .unwrap_err()
                .starts_with("qwen has no endpoint Service yet")
        );
        assert_eq!(
            chat_body(&md(), &json!([]))["model"],
            "qwen3",
            "the served name, the one the engine knows"
        );
    }

    #[test]
    fn a_pod_row_says_where_and_how_it_runs() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"nodeName": "gpu-1", "containers": [{"name": "model"}, {"name": "sidecar"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "model", "ready": true, "restartCount": 2, "image": "i", "imageID": ""},
                {"name": "sidecar", "ready": false, "restartCount": 1, "image": "i", "imageID": ""}]}}))
        .unwrap();
        let r = pod_row(&pod, Timestamp::now());
        assert_eq!(
            (
                r.phase.as_str(),
                r.node.as_str(),
                r.ready.as_str(),
                r.restarts
            ),
            ("Running", "gpu-1", "1/2", 3)
        );
        assert_eq!(r.containers, ["model", "sidecar"]);
    }
}
