//! A complete third-party provider that needs no operator: it serves vLLM, SGLang and
//! llama.cpp ModelDeployments with a plain `apps/v1` Deployment and a `v1` Service, built
//! only on the SDK's public API. Its upstream is the built-in Deployment kind; the
//! Deployment controller plays the operator, and its status is ours
//! ([`kubeairunway_sdk::workload::deployment`]).

use std::collections::BTreeMap;

use kubeairunway_sdk::api::{
    Capabilities, EngineType, InferenceProviderConfigSpec, ModelDeployment, SelectionRule,
    ServingMode,
};
use kubeairunway_sdk::provider::object;
use kubeairunway_sdk::render::{pod_annotations, pod_labels};
use kubeairunway_sdk::{
    Live, Observed, Provider, RenderError, Rendered, UpstreamApi, UpstreamRef, Warning, engine,
    labels, overrides, storage, workload,
};
use serde::Deserialize;
use serde_json::json;

/// The port the Service exposes.
pub const SERVICE_PORT: i32 = 80;

/// Documented `provider.overrides` keys.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct DeploymentOverrides {
    /// How long the Deployment controller waits for progress before it declares the
    /// rollout failed (`spec.progressDeadlineSeconds`; Kubernetes' default is 600, too
    /// short for a large model's first download).
    progress_deadline_seconds: Option<i32>,
    /// Leave the replica count to an autoscaler (a HorizontalPodAutoscaler or KEDA
    /// targeting the Deployment through its scale subresource): `spec.replicas` is not
    /// rendered, so an apply never resets what the autoscaler set.
    autoscaled: bool,
}

/// The provider; `name` is what `spec.provider.name` / `status.provider.name` say.
pub struct DeploymentProvider {
    pub name: String,
}

impl DeploymentProvider {
    /// The image of `engine` when the spec names none.
    fn default_image(engine: EngineType) -> Option<&'static str> {
        match engine {
            EngineType::Vllm => Some("vllm/vllm-openai:v0.11.0"),
            EngineType::Llamacpp => Some("ghcr.io/ggml-org/llama.cpp:server"),
            EngineType::Sglang | EngineType::Trtllm => None,
        }
    }
}

impl Provider for DeploymentProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn config(&self) -> InferenceProviderConfigSpec {
        InferenceProviderConfigSpec {
            capabilities: Some(Capabilities {
                engines: vec![EngineType::Vllm, EngineType::Sglang, EngineType::Llamacpp],
                serving_modes: vec![ServingMode::Aggregated],
                cpu_support: true,
                gpu_support: true,
                ..Capabilities::default()
            }),
            // Never outranks an operator-backed provider unless asked for by name: the
            // lowest priority, for the engines it serves.
            selection_rules: vec![SelectionRule {
                condition: "spec.engine.type in ['vllm', 'sglang', 'llamacpp'] && \
                            spec.serving.mode == 'aggregated'"
                    .into(),
                priority: 1,
            }],
            documentation: Some("https://example.com/deployment-provider".into()),
            installation: None,
        }
    }

    fn upstream(&self) -> UpstreamRef {
        UpstreamRef::new("apps", "Deployment", "deployments", &["v1"])
    }

    fn render(
        &self,
        md: &ModelDeployment,
        upstream: &UpstreamApi,
    ) -> Result<Rendered, RenderError> {
        let (o, mut warnings) = overrides::parse::<DeploymentOverrides>(md)?;
        let spec = &md.spec;
        let engine_type = spec
            .engine
            .type_
            .ok_or_else(|| RenderError("spec.engine.type is required".into()))?;
        let image = spec
            .image
            .clone()
            .filter(|i| !i.is_empty())
            .or_else(|| Self::default_image(engine_type).map(str::to_string))
            .ok_or_else(|| {
                RenderError(format!(
                    "spec.image is required for the {engine_type} engine: this provider has no \
                     default image for it"
                ))
            })?;
        let engine = engine::container(md, &image, engine::PORT)?;
        warnings.extend(engine.warnings);
        // The claims of `model.storage` are mounted; this provider creates none.
        warnings.extend(storage::unmanaged_claim_warnings(
            md,
            "the Deployment provider",
        ));
        if spec.gateway.is_some() {
            warnings.push(Warning::unsupported_field(
                "spec.gateway",
                "this provider makes no HTTPRoute; route to the Service yourself",
            ));
        }
        let name = md.metadata.name.clone().unwrap_or_default();
        // The selector is immutable in apps/v1 (see immutable_fields): only the one label
        // that never changes for this ModelDeployment.
        let selector: BTreeMap<&str, &str> = [(labels::MODEL_DEPLOYMENT, name.as_str())].into();
        let mut pod_spec = json!({
            "containers": [engine.container],
            "volumes": engine.volumes,
        });
        if let Some(n) = spec.node_selector.as_ref().filter(|n| !n.is_empty()) {
            pod_spec["nodeSelector"] = json!(n);
        }
        if let Some(t) = spec.tolerations.as_ref().filter(|t| !t.is_empty()) {
            pod_spec["tolerations"] = json!(t);
        }
        let mut deployment_spec = json!({
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels(md), "annotations": pod_annotations(md)},
                "spec": pod_spec,
            },
        });
        if !o.autoscaled {
            deployment_spec["replicas"] = json!(spec.scaling.replicas);
        } else if spec.scaling.replicas != 1 {
            warnings.push(Warning::unsupported_field(
                "spec.scaling.replicas",
                "provider.overrides.autoscaled leaves the replicas to the autoscaler (the \
                 Deployment starts with one)",
            ));
        }
        if let Some(seconds) = o.progress_deadline_seconds {
            deployment_spec["progressDeadlineSeconds"] = json!(seconds);
        }
        let deployment = object(json!({
            "apiVersion": upstream.api_version(),
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": deployment_spec,
        }))?;
        let service = object(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {
                "selector": selector,
                "ports": [{"name": engine::PORT_NAME, "port": SERVICE_PORT,
                           "targetPort": engine::PORT_NAME, "protocol": "TCP"}],
            },
        }))?;
        Ok(Rendered {
            objects: vec![deployment, service],
            warnings,
        })
    }

    /// A Deployment's selector cannot change
    /// (`pkg/apis/apps/validation/validation.go@v1.36.0`, `ValidateDeploymentUpdate`).
    fn immutable_fields(&self, kind: &str) -> &'static [&'static str] {
        match kind {
            "Deployment" => &["spec.selector"],
            _ => &[],
        }
    }

    fn observe(&self, md: &ModelDeployment, live: &Live) -> Observed {
        let name = md.metadata.name.clone().unwrap_or_default();
        let Some(deployment) = live.primary() else {
            return Observed::deploying("creating the Deployment");
        };
        let observed = workload::deployment(deployment, "model server");
        // The endpoint is the Service, once it exists.
        match live.get("Service", &name) {
            Some(_) => observed.with_endpoint(name, SERVICE_PORT),
            None => observed,
        }
    }
}
