//! What the Deployments page shows of each ModelDeployment (pure).

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kubeairunway_sdk::ModelDeployment;
use serde::Serialize;

use crate::output::age;

/// One ModelDeployment in the Deployments table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.model.id` (or source).
    pub model: String,
    /// `status.phase`, `Pending` before any.
    pub phase: String,
    /// `status.message`.
    pub message: String,
    /// The selected provider, `-` before selection.
    pub provider: String,
    /// The engine it is served with ([`ModelDeployment::resolved_engine`]), else `auto`.
    pub engine: String,
    /// `ready/desired` replicas, `-` before the provider reports them.
    pub replicas: String,
    /// Where to call it: the gateway URL, else `service:port`, else `-`.
    pub endpoint: String,
    /// Age, as kubectl prints it.
    pub age: String,
}

/// The row of `md` at `now`.
pub fn row(md: &ModelDeployment, now: Timestamp) -> Row {
    let status = md.status.clone().unwrap_or_default();
    let engine = md
        .resolved_engine()
        .map_or_else(|| "auto".to_string(), |e| e.as_str().to_string());
    let replicas = status.replicas.as_ref().map_or_else(
        || "-".to_string(),
        |r| format!("{}/{}", r.ready.unwrap_or(0), r.desired.unwrap_or(0)),
    );
    let endpoint = status
        .gateway
        .as_ref()
        .and_then(|g| g.url.clone())
        .or_else(|| {
            let e = status.endpoint.as_ref()?;
            Some(format!("{}:{}", e.service.as_deref()?, e.port?))
        })
        .unwrap_or_else(|| "-".to_string());
    Row {
        namespace: md.namespace().unwrap_or_default(),
        name: md.name_any(),
        model: md.spec.model.id.clone().unwrap_or_default(),
        phase: status
            .phase
            .map_or_else(|| "Pending".to_string(), |p| p.as_str().to_string()),
        message: status.message.clone().unwrap_or_default(),
        provider: md.selected_provider().unwrap_or("-").to_string(),
        engine,
        replicas,
        endpoint,
        age: md
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or_else(|| "-".to_string(), |t| age(t.0, now)),
    }
}

/// Every row, sorted by namespace and name, of those in `namespace` when given.
pub fn rows<'a>(
    mds: impl IntoIterator<Item = &'a ModelDeployment>,
    namespace: Option<&str>,
    now: Timestamp,
) -> Vec<Row> {
    let mut out: Vec<Row> = mds
        .into_iter()
        .filter(|m| namespace.is_none_or(|ns| m.namespace().as_deref() == Some(ns)))
        .map(|m| row(m, now))
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn md(value: serde_json::Value) -> ModelDeployment {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_row_reads_the_status_each_owner_writes() {
        let now: Timestamp = "2026-11-27T12:00:00Z".parse().unwrap();
        let fresh = md(
            json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "b", "namespace": "ml", "creationTimestamp": "2026-11-27T11:59:00Z"},
            "spec": {"model": {"id": "Qwen/Qwen3-0.6B"}}}),
        );
        let r = row(&fresh, now);
        assert_eq!(
            (
                r.phase.as_str(),
                r.provider.as_str(),
                r.engine.as_str(),
                r.replicas.as_str(),
                r.endpoint.as_str(),
                r.age.as_str()
            ),
            ("Pending", "-", "auto", "-", "-", "60s")
        );
        let running = md(
            json!({"apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "a", "namespace": "ml"},
            "spec": {"model": {"id": "m"}, "engine": {"type": "vllm"}},
            "status": {"phase": "Running", "provider": {"name": "dynamo"},
                "engine": {"type": "vllm", "selectedReason": "explicit"},
                "replicas": {"desired": 2, "ready": 1},
                "endpoint": {"service": "a-frontend", "port": 8000}}}),
        );
        let r = row(&running, now);
        assert_eq!(
            (
                r.phase.as_str(),
                r.provider.as_str(),
                r.engine.as_str(),
                r.replicas.as_str(),
                r.endpoint.as_str()
            ),
            ("Running", "dynamo", "vllm", "1/2", "a-frontend:8000")
        );
        let mut routed = running.clone();
        routed.metadata.namespace = Some("other".into());
        routed.status.as_mut().unwrap().gateway =
            serde_json::from_value(json!({"url": "http://10.0.0.7/v1"})).unwrap();
        assert_eq!(row(&routed, now).endpoint, "http://10.0.0.7/v1");
        let all = rows([&routed, &fresh, &running], None, now);
        let names: Vec<_> = all
            .iter()
            .map(|r| format!("{}/{}", r.namespace, r.name))
            .collect();
        assert_eq!(names, ["ml/a", "ml/b", "other/a"]);
        assert_eq!(
            rows([&routed, &fresh, &running], Some("other"), now).len(),
            1
        );
    }
}
