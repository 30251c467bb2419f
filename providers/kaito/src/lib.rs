//! The KAITO provider: a ModelDeployment becomes a `kaito.sh/v1beta1` Workspace (one
//! replica) or a `kaito.sh/v1alpha1` InferenceSet (more replicas, when enabled), and the
//! Workspace's status becomes ours.
//!
//! - [`render`]: the translation (Workspace, InferenceSet, inference-config ConfigMap).
//! - [`status`]: KAITO's real status values read as ours.
//! - [`overrides`]: KAITO has no documented overrides; every key warns.
//!
//! Everything here is pure; `kubeairunway_sdk::runtime` does the I/O.

pub mod overrides;
pub mod render;
pub mod status;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DynamicObject;
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kubeairunway_sdk::api::{
    Capabilities, EngineType, InferenceProviderConfigSpec, Installation, ModelDeployment,
    SelectionRule, ServingMode,
};
use kubeairunway_sdk::{
    Incompatible, Observed, Provider, RenderError, Rendered, UpstreamApi, UpstreamRef,
};

/// The provider's name: `status.provider.name`, its InferenceProviderConfig, field manager
/// stem.
pub const NAME: &str = "kaito";
/// KAITO's API group.
pub const GROUP: &str = "kaito.sh";
/// The InferenceSet CRD, which serves more than one replica.
pub const INFERENCE_SET_CRD: &str = "inferencesets.kaito.sh";

/// Whether an installed InferenceSet CRD serves the version this provider renders: what
/// `--inference-set auto` decides at start.
pub fn inference_set_served(crd: Option<&CustomResourceDefinition>) -> bool {
    crd.is_some_and(|crd| {
        crd.spec
            .versions
            .iter()
            .any(|v| v.served && v.name == render::INFERENCE_SET_VERSION)
    })
}

/// The KAITO provider.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KaitoProvider {
    /// Whether KAITO's InferenceSet CRD is available: `scaling.replicas` other than 1 is
    /// served by an InferenceSet when true, and refused when false.
    pub inference_set: bool,
    /// `resource.instanceType` of every Workspace (the GPU node SKU KAITO provisions);
    /// empty leaves it unset (bring-your-own nodes).
    pub instance_type: Option<String>,
}

impl Provider for KaitoProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    fn config(&self) -> InferenceProviderConfigSpec {
        InferenceProviderConfigSpec {
            capabilities: Some(Capabilities {
                engines: vec![EngineType::Vllm, EngineType::Llamacpp],
                serving_modes: vec![ServingMode::Aggregated],
                cpu_support: true,
                gpu_support: true,
                ..Capabilities::default()
            }),
            selection_rules: vec![
                // `has()` guards only its last step, so each step is guarded in turn.
                SelectionRule {
                    condition: "!has(spec.resources) || !has(spec.resources.gpu) || spec.resources.gpu.count == 0".into(),
                    priority: 100,
                },
                SelectionRule {
                    condition: "spec.engine.type == 'llamacpp'".into(),
                    priority: 100,
                },
            ],
            documentation: Some("https://github.com/kaito-project/kaito".into()),
            installation: Some(Installation {
                description: Some(
                    "KAITO's workspace operator (v0.10 or newer), then the kaito-provider chart".into(),
                ),
                default_namespace: Some("kaito-workspace".into()),
                ..Installation::default()
            }),
        }
    }

    fn upstream(&self) -> UpstreamRef {
        UpstreamRef::new(GROUP, "Workspace", "workspaces", &["v1beta1"])
    }

    fn check(&self, md: &ModelDeployment) -> Result<(), Incompatible> {
        if md.spec.serving.mode == ServingMode::Disaggregated {
            return Err(Incompatible(
                "KAITO does not support disaggregated mode".into(),
            ));
        }
        match md.spec.engine.type_ {
            Some(EngineType::Vllm | EngineType::Llamacpp) => {}
            Some(other) => {
                return Err(Incompatible(format!(
                    "KAITO does not support {} engine",
                    other.as_str()
                )));
            }
            None => return Err(Incompatible("engine.type is required".into())),
        }
        let replicas = md.spec.scaling.replicas;
        if replicas != 1 && !self.inference_set {
            return Err(Incompatible(format!(
                "scaling.replicas is {replicas}: a KAITO Workspace serves exactly one replica \
                 (resource.count is GPU nodes of one instance, not replicas); more need KAITO's \
                 InferenceSet ({INFERENCE_SET_CRD}), which is not installed or not enabled \
                 (--inference-set)"
            )));
        }
        Ok(())
    }

    fn render(
        &self,
        md: &ModelDeployment,
        upstream: &UpstreamApi,
    ) -> Result<Rendered, RenderError> {
        render::render(self, md, upstream)
    }

    fn observe(&self, md: &ModelDeployment, upstream: Option<&DynamicObject>) -> Observed {
        status::observe(md, upstream)
    }

    /// A replica count change swaps the Workspace for an InferenceSet (and back), and the
    /// inference-config ConfigMap comes and goes with the vLLM options: the one left
    /// behind is pruned.
    fn owned_kinds(&self) -> Vec<ApiResource> {
        let inference_set = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, render::INFERENCE_SET_VERSION, "InferenceSet"),
            "inferencesets",
        );
        let config_map = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("", "v1", "ConfigMap"),
            "configmaps",
        );
        vec![inference_set, config_map]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(versions: &[(&str, bool)]) -> CustomResourceDefinition {
        let versions: Vec<_> = versions
            .iter()
            .map(|(name, served)| serde_json::json!({"name": name, "served": served, "storage": false}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": INFERENCE_SET_CRD},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"plural": "inferencesets", "kind": "InferenceSet"}, "versions": versions},
        }))
        .unwrap()
    }

    #[test]
    fn inference_set_is_used_only_when_its_crd_serves_our_version() {
        assert!(!inference_set_served(None));
        assert!(inference_set_served(Some(&crd(&[
            ("v1alpha1", true),
            ("v1beta1", true)
        ]))));
        assert!(!inference_set_served(Some(&crd(&[
            ("v1alpha1", false),
            ("v1beta1", true)
        ]))));
    }
}
