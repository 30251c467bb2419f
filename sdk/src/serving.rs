//! Which pods serve a ModelDeployment: the one home of that answer. A provider says it
//! ([`crate::Provider::serving_pods`]); the runtime writes it into the status
//! (`status.selector` for the scale subresource, `status.endpoint.targetPort` and
//! `status.endpoint.inferencePool`), and the gateway reads it back from there
//! ([`parse_selector`]) for the InferencePool it makes.

use std::collections::BTreeMap;

use kube::ResourceExt;

use crate::api::{EndpointStatus, ModelDeployment};
use crate::labels;

/// The pods that serve a ModelDeployment's API, as its upstream operator labels them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServingPods {
    /// Labels every serving pod carries and no other pod does (`status.selector`, the
    /// InferencePool's `selector.matchLabels`).
    pub labels: BTreeMap<String, String>,
    /// The container port the pods serve the OpenAI-compatible API on (the
    /// InferencePool's `targetPorts`). `None`: the pods serve no such port of their own
    /// (the gateway then makes no InferencePool for them).
    pub port: Option<i32>,
    /// The InferencePool the upstream operator makes for these pods itself, in the
    /// ModelDeployment's namespace: the gateway then makes neither pool nor endpoint
    /// picker, and routes to this one.
    pub inference_pool: Option<String>,
}

impl ServingPods {
    /// Pods labelled `kubeairunway.ai/model-deployment=<name>` (the label every pod
    /// template a provider renders carries: [`crate::render::pod_labels`]), with no port
    /// known yet.
    pub fn of(md: &ModelDeployment) -> Self {
        Self::default().label(labels::MODEL_DEPLOYMENT, &md.name_any())
    }

    /// Pods labelled only as given (replacing the default label).
    pub fn labelled<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        pairs
            .into_iter()
            .fold(Self::default(), |pods, (k, v)| pods.label(k, v))
    }

    /// With this label too.
    #[must_use]
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// Serving on this container port.
    #[must_use]
    pub fn on_port(mut self, port: i32) -> Self {
        self.port = Some(port);
        self
    }

    /// The upstream operator makes this InferencePool for the pods itself.
    #[must_use]
    pub fn with_inference_pool(mut self, name: impl Into<String>) -> Self {
        self.inference_pool = Some(name.into());
        self
    }

    /// Write these pods into a status as the provider's runtime does: `status.selector`,
    /// and on the endpoint (once there is one) `targetPort` and `inferencePool`.
    pub fn fill(&self, selector: &mut Option<String>, endpoint: Option<&mut EndpointStatus>) {
        *selector = Some(self.selector()).filter(|s| !s.is_empty());
        if let Some(endpoint) = endpoint {
            endpoint.target_port = self.port;
            endpoint.inference_pool.clone_from(&self.inference_pool);
        }
    }

    /// The labels as an equality-based label selector (`k=v,k2=v2`, sorted by key): the
    /// value of `status.selector`.
    pub fn selector(&self) -> String {
        self.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The labels of an equality-based label selector as [`ServingPods::selector`] writes it
/// (`k=v,k2=v2`; `k==v` is read too). `None` for anything else (set-based terms, `!=`,
/// an empty selector): it cannot be a `matchLabels`.
pub fn parse_selector(selector: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for term in selector.split(',') {
        let (key, value) = term.split_once('=')?;
        let value = value.strip_prefix('=').unwrap_or(value);
        let key = key.trim();
        if key.is_empty() || key.ends_with('!') || value.contains(['=', '!', '(', ')', ' ']) {
            return None;
        }
        out.insert(key.to_string(), value.trim().to_string());
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(name: &str) -> ModelDeployment {
        ModelDeployment::new(name, crate::api::ModelDeploymentSpec::default())
    }

    #[test]
    fn the_default_is_the_platform_label_without_a_port() {
        let pods = ServingPods::of(&md("llama"));
        assert_eq!(pods.selector(), "kubeairunway.ai/model-deployment=llama");
        assert_eq!((pods.port, pods.inference_pool), (None, None));
    }

    #[test]
    fn the_selector_is_sorted_and_reads_back() {
        let pods = ServingPods::of(&md("llama"))
            .label("ray.io/serve", "true")
            .on_port(8000);
        let selector = pods.selector();
        assert_eq!(
            selector,
            "kubeairunway.ai/model-deployment=llama,ray.io/serve=true"
        );
        assert_eq!(parse_selector(&selector), Some(pods.labels));
        assert_eq!(
            parse_selector("a==b"),
            Some([("a".into(), "b".into())].into())
        );
    }

    #[test]
    fn what_is_not_match_labels_does_not_parse() {
        for selector in ["", "a", "a!=b", "a in (b)", "a=b,c", "=b"] {
            assert_eq!(parse_selector(selector), None, "{selector:?}");
        }
    }
}
