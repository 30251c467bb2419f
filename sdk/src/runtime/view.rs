//! The provider's part of a ModelDeployment's status, as a reconcile decides it
//! ([`ProviderView`]), and the pieces every status is made of (pure).

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::{
    EndpointStatus, ModelDeployment, ModelDeploymentStatus, Phase, ProviderStatus, ReplicaStatus,
};
use crate::conditions::{
    self, PROVIDER_COMPATIBLE, READY, RESOURCE_CREATED, STALE_STATUS, Status, WARMED_UP, reasons,
};
use crate::provider::Warning;
use crate::serving::ServingPods;
use crate::upstream::UpstreamApi;

/// Condition types a provider owns.
pub(crate) const OWNED_CONDITIONS: [&str; 5] = [
    PROVIDER_COMPATIBLE,
    RESOURCE_CREATED,
    READY,
    STALE_STATUS,
    WARMED_UP,
];

/// The provider's fields of a ModelDeployment status. Conditions not listed are removed
/// (the provider stops owning them).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ProviderView {
    pub phase: Phase,
    pub message: String,
    pub resource: Option<(String, String)>,
    pub endpoint: Option<EndpointStatus>,
    pub replicas: Option<ReplicaStatus>,
    /// `status.provider.images`: the images of what is rendered.
    pub images: Option<Vec<String>>,
    pub conditions: Vec<(&'static str, Status, String, String)>,
    /// `status.url`, from the endpoint ([`ProviderView::addressed`]).
    pub url: Option<String>,
    /// `status.selector` ([`ProviderView::addressed`]).
    pub selector: Option<String>,
}

/// The in-cluster URL of the OpenAI-compatible API a provider's endpoint serves:
/// `http://<service>.<namespace>.svc.<cluster domain>[:<port>]/v1`.
pub fn endpoint_url(
    endpoint: &EndpointStatus,
    namespace: &str,
    cluster_domain: &str,
) -> Option<String> {
    let service = endpoint.service.as_deref().filter(|s| !s.is_empty())?;
    let port = endpoint.port.map(|p| format!(":{p}")).unwrap_or_default();
    let domain = cluster_domain.trim_matches('.');
    Some(format!(
        "http://{service}.{namespace}.svc.{domain}{port}/v1"
    ))
}

impl ProviderView {
    pub(crate) fn new(phase: Phase, message: impl Into<String>) -> Self {
        Self {
            phase,
            message: message.into(),
            resource: None,
            endpoint: None,
            replicas: None,
            images: None,
            conditions: Vec::new(),
            url: None,
            selector: None,
        }
    }

    /// With `status.url` (from the endpoint), and from `pods` (the provider's
    /// [`crate::Provider::serving_pods`] for `md`) `status.selector` and, once there is an
    /// endpoint, its `targetPort` and `inferencePool`.
    pub(crate) fn addressed(
        mut self,
        md: &ModelDeployment,
        cluster_domain: &str,
        pods: &ServingPods,
    ) -> Self {
        let namespace = md.namespace().unwrap_or_default();
        pods.fill(&mut self.selector, self.endpoint.as_mut());
        self.url = self
            .endpoint
            .as_ref()
            .and_then(|e| endpoint_url(e, &namespace, cluster_domain));
        self
    }

    pub(crate) fn condition(
        mut self,
        type_: &'static str,
        status: impl Into<Status>,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        self.conditions
            .push((type_, status.into(), reason.to_string(), message.into()));
        self
    }

    /// The status to apply, reusing transition times from `md`'s current conditions.
    pub(crate) fn to_status(&self, md: &ModelDeployment, now: Timestamp) -> ModelDeploymentStatus {
        let current = md
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let generation = md.metadata.generation;
        ModelDeploymentStatus {
            phase: Some(self.phase),
            message: Some(self.message.clone()),
            provider: (self.resource.is_some() || self.images.is_some()).then(|| ProviderStatus {
                resource_name: self.resource.as_ref().map(|(name, _)| name.clone()),
                resource_kind: self.resource.as_ref().map(|(_, kind)| kind.clone()),
                images: self.images.clone(),
                ..ProviderStatus::default()
            }),
            endpoint: self.endpoint.clone(),
            url: self.url.clone(),
            selector: self.selector.clone(),
            replicas: self.replicas.clone(),
            observed_generation: generation,
            conditions: self
                .conditions
                .iter()
                .map(|(t, s, r, m)| {
                    conditions::new(
                        conditions::find(current, t),
                        t,
                        *s,
                        r,
                        m.clone(),
                        generation,
                        now,
                    )
                })
                .collect(),
            ..ModelDeploymentStatus::default()
        }
    }

    /// Whether `md` already shows exactly this (ignoring transition times).
    pub(crate) fn is_current(&self, md: &ModelDeployment) -> bool {
        let Some(s) = md.status.as_ref() else {
            return false;
        };
        let provider = s.provider.as_ref();
        let resource =
            provider.and_then(|p| Some((p.resource_name.clone()?, p.resource_kind.clone()?)));
        let images = provider.and_then(|p| p.images.as_ref());
        let ours: Vec<_> = s
            .conditions
            .iter()
            .filter(|c| OWNED_CONDITIONS.contains(&c.type_.as_str()))
            .collect();
        s.phase == Some(self.phase)
            && s.message.as_deref() == Some(self.message.as_str())
            && resource == self.resource
            && images == self.images.as_ref()
            && s.endpoint == self.endpoint
            && s.url == self.url
            && s.selector == self.selector
            && s.replicas == self.replicas
            && s.observed_generation == md.metadata.generation
            && ours.len() == self.conditions.len()
            && self.conditions.iter().all(|(t, st, r, m)| {
                ours.iter().any(|c| {
                    c.type_ == *t
                        && c.status == st.as_str()
                        && &c.reason == r
                        && &c.message == m
                        && c.observed_generation == md.metadata.generation
                })
            })
    }
}

/// A terminal state: the phase, `ProviderCompatible=False` and `Ready=False` with
/// `reason` and `message`.
pub(crate) fn terminal(phase: Phase, reason: &str, message: &str) -> ProviderView {
    ProviderView::new(phase, message)
        .condition(PROVIDER_COMPATIBLE, false, reason, message)
        .condition(READY, false, reason, message)
}

/// The message of `ProviderCompatible=True`: which upstream API `provider` serves the
/// spec with.
pub(crate) fn compatible_message(provider: &str, api: &UpstreamApi) -> String {
    format!(
        "{provider} serves this spec with {} {}",
        api.api_version(),
        api.kind
    )
}

/// Reason and message of `ProviderCompatible=True`: the spec fields `provider` ignores
/// are named there for as long as they are set, not only in an event that expires.
pub(crate) fn compatibility(
    provider: &str,
    api: &UpstreamApi,
    warnings: &[Warning],
) -> (&'static str, String) {
    let ignored = Warning::ignored_fields(warnings);
    if ignored.is_empty() {
        return (
            reasons::COMPATIBILITY_VERIFIED,
            compatible_message(provider, api),
        );
    }
    (
        reasons::COMPATIBLE_WITH_IGNORED_FIELDS,
        format!(
            "{}; {provider} ignores {}",
            compatible_message(provider, api),
            ignored.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::conditions::reasons;

    fn md() -> ModelDeployment {
        serde_json::from_value(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns", "generation": 3},
            "spec": {"model": {"id": "a/b"}},
            "status": {
                "provider": {"name": "x", "selectedReason": "explicit provider selection"},
                "conditions": [{"type": "ProviderSelected", "status": "True", "reason": "ExplicitSelection", "message": "",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn status_carries_only_provider_fields() {
        let view = ProviderView::new(Phase::Deploying, "creating").condition(
            READY,
            false,
            reasons::DEPLOYMENT_PROGRESSING,
            "creating",
        );
        let status = serde_json::to_value(view.to_status(&md(), Timestamp::now())).unwrap();
        assert_eq!(status["phase"], "Deploying");
        assert_eq!(status["observedGeneration"], 3);
        assert!(
            status.get("provider").is_none(),
            "no resource yet, and never core's provider.name"
        );
        assert_eq!(status["conditions"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn current_view_is_not_rewritten() {
        let view = ProviderView::new(Phase::Running, "ok").condition(
            READY,
            true,
            reasons::DEPLOYMENT_READY,
            "ok",
        );
        let mut m = md();
        assert!(!view.is_current(&m));
        let status = view.to_status(&m, Timestamp::now());
        let s = m.status.get_or_insert_with(Default::default);
        s.phase = status.phase;
        s.message = status.message;
        s.observed_generation = status.observed_generation;
        s.conditions.extend(status.conditions);
        assert!(view.is_current(&m));
        let changed = ProviderView::new(Phase::Running, "ok").condition(
            READY,
            true,
            reasons::DEPLOYMENT_READY,
            "other",
        );
        assert!(!changed.is_current(&m));
    }

    #[test]
    fn url_and_selector_come_from_the_endpoint_and_the_name() {
        let endpoint = EndpointStatus {
            service: Some("llama-frontend".into()),
            port: Some(8000),
            ..EndpointStatus::default()
        };
        assert_eq!(
            endpoint_url(&endpoint, "ml", "cluster.local").as_deref(),
            Some("http://llama-frontend.ml.svc.cluster.local:8000/v1")
        );
        assert_eq!(
            endpoint_url(
                &EndpointStatus {
                    port: None,
                    ..endpoint.clone()
                },
                "ml",
                "corp.example."
            )
            .as_deref(),
            Some("http://llama-frontend.ml.svc.corp.example/v1")
        );
        assert_eq!(
            endpoint_url(&EndpointStatus::default(), "ml", "cluster.local"),
            None
        );
        let pods = ServingPods::of(&md())
            .label("role", "worker")
            .on_port(8080)
            .with_inference_pool("m-pool");
        let view = ProviderView {
            endpoint: Some(endpoint),
            ..ProviderView::new(Phase::Running, "ok")
        }
        .addressed(&md(), "cluster.local", &pods);
        let status = view.to_status(&md(), Timestamp::now());
        assert_eq!(
            status.url.as_deref(),
            Some("http://llama-frontend.ns.svc.cluster.local:8000/v1")
        );
        assert_eq!(
            status.selector.as_deref(),
            Some("kubeairunway.ai/model-deployment=m,role=worker")
        );
        let endpoint = status.endpoint.unwrap();
        assert_eq!(endpoint.target_port, Some(8080));
        assert_eq!(endpoint.inference_pool.as_deref(), Some("m-pool"));
        // Before there is an endpoint: the selector, and nothing about the endpoint.
        let view =
            ProviderView::new(Phase::Deploying, "wait").addressed(&md(), "cluster.local", &pods);
        assert_eq!((view.endpoint, view.url), (None, None));
        assert!(view.selector.is_some());
    }
}
