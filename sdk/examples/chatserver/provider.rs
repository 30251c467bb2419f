//! A complete third-party provider: it serves llama.cpp ModelDeployments as `ChatServer`
//! objects, a CRD of its own (`example.kubeairunway.ai/v1`), for an operator of yours
//! that runs them.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use kubeairunway_sdk::api::{
    Capabilities, EngineCapability, EngineType, InferenceProviderConfigSpec, ModelDeployment,
    SelectionRule, ServingMode,
};
use kubeairunway_sdk::provider::{engine_flags, object};
use kubeairunway_sdk::render::{pod_annotations, pod_labels};
use kubeairunway_sdk::{
    Live, Observed, Provider, RenderError, Rendered, UpstreamApi, UpstreamRef, Warning, overrides,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The upstream kind this provider targets. Like many real operators' CRDs, it has rules
/// of its own that the API server enforces: the port of a server cannot change (the
/// provider declares it in [`Provider::immutable_fields`], so the runtime recreates the
/// server instead), and the port is not an engine argument.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug)]
#[kube(
    group = "example.kubeairunway.ai",
    version = "v1",
    kind = "ChatServer",
    namespaced,
    status = "ChatServerStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct ChatServerSpec {
    pub model: String,
    pub served_name: String,
    pub replicas: i32,
    pub image: String,
    #[x_kube(validation = Rule::new("self == oldSelf").message("port is immutable"))]
    pub port: i32,
    #[x_kube(validation = Rule::new("!self.exists(a, a == '--port')").message("set the port with provider.overrides.port, not as an engine argument"))]
    pub args: Vec<String>,
    pub pod_labels: BTreeMap<String, String>,
    pub pod_annotations: BTreeMap<String, String>,
}

/// What the ChatServer operator reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatServerStatus {
    pub phase: Option<String>,
    pub ready_replicas: Option<i32>,
    pub message: Option<String>,
}

/// The `provider.overrides` keys ChatServer reads itself; every other key is merged into
/// the ChatServer by the runtime, checked against its CRD.
const TYPED_OVERRIDES: [&str; 1] = ["port"];

/// Documented `provider.overrides` keys.
#[derive(Deserialize, Default)]
#[serde(default)]
struct ChatOverrides {
    port: Option<i32>,
}

/// The provider; `name` is what `spec.provider.name` / `status.provider.name` say.
pub struct ChatServerProvider {
    pub name: String,
}

impl Provider for ChatServerProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn config(&self) -> InferenceProviderConfigSpec {
        InferenceProviderConfigSpec {
            capabilities: Some(Capabilities::serving([EngineCapability::new(
                EngineType::Llamacpp,
            )
            .serving_modes([ServingMode::Aggregated])
            .cpu(true)
            .gpu(false)
            .native_api_formats()])),
            selection_rules: vec![SelectionRule {
                condition: "spec.engine.type == 'llamacpp'".into(),
                priority: 10,
            }],
            documentation: Some("https://example.com/chatserver".into()),
            installation: None,
        }
    }

    fn upstream(&self) -> UpstreamRef {
        UpstreamRef::new(
            "example.kubeairunway.ai",
            "ChatServer",
            "chatservers",
            &["v1"],
        )
    }

    fn typed_overrides(&self) -> &'static [&'static str] {
        &TYPED_OVERRIDES
    }

    fn render(
        &self,
        md: &ModelDeployment,
        upstream: &UpstreamApi,
    ) -> Result<Rendered, RenderError> {
        let o = overrides::parse::<ChatOverrides>(md, &TYPED_OVERRIDES)?;
        let mut warnings = Vec::new();
        // Every spec field ChatServer cannot serve is named, never dropped in silence.
        if md.spec.node_selector.is_some() {
            warnings.push(Warning::unsupported_field(
                "spec.nodeSelector",
                "a ChatServer has no node selector",
            ));
        }
        if md.spec.tolerations.is_some() {
            warnings.push(Warning::unsupported_field(
                "spec.tolerations",
                "a ChatServer has no tolerations",
            ));
        }
        let image = md
            .spec
            .effective_image()
            .map(str::to_string)
            .ok_or_else(|| {
                RenderError(
                "spec.engine.image (or spec.image) is required: ChatServer runs your llama.cpp \
                 image"
                    .into(),
            )
            })?;
        let server = object(serde_json::json!({
            "apiVersion": upstream.api_version(),
            "kind": "ChatServer",
            "metadata": {"name": md.metadata.name},
            "spec": {
                "model": md.spec.model.id,
                "servedName": md.spec.served_model_name(),
                "replicas": md.spec.scaling.replicas,
                "image": image,
                "port": o.port.unwrap_or(8080),
                "args": engine_flags(md.spec.engine.args.as_ref()),
                "podLabels": pod_labels(md),
                "podAnnotations": pod_annotations(md),
            },
        }))?;
        Ok(Rendered {
            objects: vec![server],
            warnings,
        })
    }

    fn immutable_fields(&self, kind: &str) -> &'static [&'static str] {
        match kind {
            "ChatServer" => &["spec.port"], // the CRD's `self == oldSelf` rule above
            _ => &[],
        }
    }

    fn observe(&self, md: &ModelDeployment, live: &Live) -> Observed {
        let upstream = live.primary();
        let status = upstream.and_then(|u| u.data.get("status"));
        let text = |k: &str| {
            status
                .and_then(|s| s.get(k))
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let ready = status
            .and_then(|s| s.get("readyReplicas"))
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0);
        let port = upstream
            .and_then(|u| u.data["spec"]["port"].as_i64())
            .unwrap_or(8080);
        let name = md.metadata.name.clone().unwrap_or_default();
        let observed = match text("phase").as_str() {
            "Ready" => Observed::running("ChatServer is ready"),
            "Failed" => Observed::failed("ChatServerFailed", text("message")),
            _ => Observed::deploying("waiting for the ChatServer to become ready"),
        };
        observed
            .with_endpoint(name, i32::try_from(port).unwrap_or(8080))
            .with_replicas(md.spec.scaling.replicas, i32::try_from(ready).unwrap_or(0))
    }
}
